//! The tile instructions on the CPU (AMX-TILE, AMX-BF16), through `asm!` (the intrinsics are
//! nightly-only), and the detection that proves they may run: CPUID, XCR0, and Linux's
//! permission for the tile data state.

use super::unit::{TileConfig, TileOps};
use core::arch::asm;

/// Proof that the CPU has AMX-TILE and AMX-BF16 with palette 1 as [`TileConfig`] assumes it
/// (8 tiles of 16 rows × 64 bytes), that the OS saves the tile state (XCR0), and that this
/// process has Linux's permission to use it: the only constructor is [`Amx::detect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Amx {
    _proof: (),
}

/// `arch_prctl` (Linux x86-64 system call number).
const SYS_ARCH_PRCTL: usize = 158;
/// `arch_prctl` code: request permission for an extended state component.
const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
/// The tile data state component (XCR0 bit 18).
const XFEATURE_XTILEDATA: usize = 18;

impl Amx {
    /// The token, if the CPU, the OS and the process allow the tiles. Asks Linux for the tile
    /// data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, granted once per
    /// process); where it refuses, or off Linux, `None`. Not cached: the caller caches it.
    // (CPUID's intrinsics are safe functions from Rust 1.94, unsafe before: the blocks stay for
    // the crate's minimum Rust.)
    #[allow(unused_unsafe)]
    pub fn detect() -> Option<Self> {
        use core::arch::x86_64::{__cpuid, __cpuid_count};
        // SAFETY: CPUID is available on every x86-64 CPU; leaves above the maximum are not
        // read (checked first).
        let max_leaf = unsafe { __cpuid(0) }.eax;
        if max_leaf < 0x1e {
            return None;
        }
        // SAFETY: as above.
        let leaf7 = unsafe { __cpuid_count(7, 0) };
        let (amx_bf16, amx_tile) = (leaf7.edx >> 22 & 1 == 1, leaf7.edx >> 24 & 1 == 1);
        // SAFETY: as above.
        let osxsave = unsafe { __cpuid(1) }.ecx >> 27 & 1 == 1;
        if !(amx_bf16 && amx_tile && osxsave) {
            return None;
        }
        // Palette 1: total bytes, bytes per tile, bytes per row, tiles, rows.
        // SAFETY: as above (leaf 0x1d ≤ max_leaf).
        let palette = unsafe { __cpuid_count(0x1d, 1) };
        let (bytes_per_row, tiles, rows) =
            (palette.ebx >> 16, palette.ecx & 0xffff, palette.ecx >> 16);
        if bytes_per_row < 64 || tiles < 8 || rows < 16 {
            return None;
        }
        // XCR0 bits 17 and 18: the OS saves the tile configuration and data.
        // SAFETY: OSXSAVE is set (checked above), so XGETBV with ECX = 0 is allowed.
        let xcr0 = unsafe { xgetbv0() };
        if xcr0 >> 17 & 3 != 3 {
            return None;
        }
        request_tile_permission().then_some(Amx { _proof: () })
    }
}

/// XCR0. Safety: CPUID.1:ECX.OSXSAVE is set.
unsafe fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller's contract; XGETBV reads a register, touches no memory.
    unsafe {
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    };
    u64::from(hi) << 32 | u64::from(lo)
}

/// Linux's permission for the tile data state, for the whole process (idempotent).
#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    let ret: isize;
    // SAFETY: the `arch_prctl` system call with a code and an integer argument: it reads and
    // writes no memory of the process; `syscall` clobbers rcx and r11, declared.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL as isize => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack, nomem)
        )
    };
    ret == 0
}

/// Off Linux the permission is not asked for: no tiles.
#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false
}

/// The instructions themselves, for a thread of a process that holds an [`Amx`] token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hardware(pub Amx);

impl TileOps for Hardware {
    unsafe fn configure(&mut self, cfg: &TileConfig) {
        // SAFETY: the token proves the CPU and OS support; `cfg` is a valid 64-byte palette-1
        // configuration (the caller's contract), read by the instruction.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) cfg, options(nostack, readonly, preserves_flags)) }
    }

    fn release(&mut self) {
        // SAFETY: the token proves the CPU support; TILERELEASE touches no memory.
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) }
    }

    unsafe fn zero<const T: u8>(&mut self) {
        // SAFETY: the caller's contract: configured, tile T has a shape.
        unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, nomem, preserves_flags)) }
    }

    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize) {
        // SAFETY: the caller's contract: configured, and every row the shape reads lies in
        // memory valid for reads.
        unsafe {
            asm!(
                "tileloadd tmm{t}, [{src} + {stride} * 1]",
                t = const T,
                src = in(reg) src,
                stride = in(reg) stride,
                options(nostack, readonly, preserves_flags)
            )
        }
    }

    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize) {
        // SAFETY: the caller's contract: configured, and every row the shape writes lies in
        // memory valid for writes (that nothing else references meanwhile: `&mut`).
        unsafe {
            asm!(
                "tilestored [{dst} + {stride} * 1], tmm{t}",
                t = const T,
                dst = in(reg) dst,
                stride = in(reg) stride,
                options(nostack, preserves_flags)
            )
        }
    }

    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: the caller's contract: configured, distinct tiles of compatible shapes;
        // the instruction touches registers only.
        unsafe {
            asm!(
                "tdpbf16ps tmm{c}, tmm{a}, tmm{b}",
                c = const C,
                a = const A,
                b = const B,
                options(nostack, nomem, preserves_flags)
            )
        }
    }
}
