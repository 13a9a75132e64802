//! How fuzz inputs are read from bytes, and written back for the seed corpora.
//!
//! Everything is read through [`arbitrary::Unstructured`], one byte at a time with
//! `u8::arbitrary` (which yields 0 once the data runs out), so that the decoding is defined here
//! and nowhere else: integers are little-endian, ranges are `lo + raw % (hi − lo + 1)`, and a
//! fieldless `#[derive(Arbitrary)]` enum is read by its derive. [`Writer`] produces bytes that
//! decode to chosen values; [`Writer::variant`] finds the bytes of an enum value by decoding
//! candidates, so it does not depend on how the derive encodes variants (the round-trip test in
//! `tests/fuzz_stable.rs` checks every seed).
//!
//! Exhausted input decodes as zeros: the smallest value of every range, the first variant of
//! every enum. Fields appended at the end of a struct therefore decode to their "off" value from
//! old corpus files, which is why new options go last.

use arbitrary::{Arbitrary, Result, Unstructured};

/// Bytes needed to hold `span`.
fn width(span: u64) -> usize {
    match span {
        0 => 0,
        1..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    }
}

/// `n ≤ 8` bytes, little-endian.
pub fn uint(u: &mut Unstructured<'_>, n: usize) -> Result<u64> {
    let mut x = 0u64;
    for i in 0..n {
        x |= u64::from(u8::arbitrary(u)?) << (8 * i);
    }
    Ok(x)
}

/// An integer in `lo..=hi`.
pub fn range(u: &mut Unstructured<'_>, lo: u64, hi: u64) -> Result<u64> {
    assert!(lo <= hi);
    let span = hi - lo;
    let raw = uint(u, width(span))?;
    Ok(lo
        + if span == u64::MAX {
            raw
        } else {
            raw % (span + 1)
        })
}

/// A `usize` in `lo..=hi`.
pub fn urange(u: &mut Unstructured<'_>, lo: usize, hi: usize) -> Result<usize> {
    Ok(range(u, lo as u64, hi as u64)? as usize)
}

/// One of `items`.
pub fn pick<T: Copy>(u: &mut Unstructured<'_>, items: &[T]) -> Result<T> {
    Ok(items[urange(u, 0, items.len() - 1)?])
}

/// A fieldless enum through its `#[derive(Arbitrary)]`.
pub fn variant<'a, T: Arbitrary<'a>>(u: &mut Unstructured<'a>) -> Result<T> {
    T::arbitrary(u)
}

/// Bytes that [`uint`], [`range`], [`pick`] and [`variant`] read back as the values written.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    /// The encoded input.
    pub bytes: Vec<u8>,
}

impl Writer {
    /// An empty input.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inverse of [`uint`].
    pub fn uint(&mut self, x: u64, n: usize) -> &mut Self {
        self.bytes.extend_from_slice(&x.to_le_bytes()[..n]);
        self
    }

    /// Inverse of [`range`]; panics if `x` is outside `lo..=hi`.
    pub fn range(&mut self, x: u64, lo: u64, hi: u64) -> &mut Self {
        assert!((lo..=hi).contains(&x), "{x} not in {lo}..={hi}");
        self.uint(x - lo, width(hi - lo))
    }

    /// Inverse of [`urange`].
    pub fn urange(&mut self, x: usize, lo: usize, hi: usize) -> &mut Self {
        self.range(x as u64, lo as u64, hi as u64)
    }

    /// Inverse of [`pick`]: writes the index of the first item equal to `x`.
    pub fn pick<T: PartialEq + std::fmt::Debug>(&mut self, x: T, items: &[T]) -> &mut Self {
        let i = items
            .iter()
            .position(|y| *y == x)
            .unwrap_or_else(|| panic!("{x:?} not in {items:?}"));
        self.urange(i, 0, items.len() - 1)
    }

    /// Inverse of [`variant`]: the shortest prefix of a byte pattern `[b; 8]` that decodes to `x`.
    pub fn variant<T>(&mut self, x: &T) -> &mut Self
    where
        T: for<'a> Arbitrary<'a> + PartialEq + std::fmt::Debug,
    {
        for b in 0..=255u8 {
            let pattern = [b; 8];
            let mut u = Unstructured::new(&pattern);
            if let Ok(y) = T::arbitrary(&mut u) {
                if y == *x {
                    let used = pattern.len() - u.len();
                    self.bytes.extend_from_slice(&pattern[..used]);
                    return self;
                }
            }
        }
        panic!("no byte pattern decodes to {x:?}")
    }
}
