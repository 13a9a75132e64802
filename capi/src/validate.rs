//! Validation of raw inputs: the elements a view reaches, null, alignment and address-space
//! checks of pointers, the byte spans of the buffers a call reads and writes and their
//! disjointness, tensors and arrays built from raw pointers, versioned struct reads, element
//! type and alignment values, compact copies of views (a byte mask as `bool`s), and sequence
//! offsets.

use sdpa::{Alignment, Operand, Tensor, TensorMut};

use crate::abi::{
    SdpaStatus, SdpaTensor, SdpaTensorMut, SDPA_ALIGN_BOTTOM_RIGHT, SDPA_ALIGN_NONE,
    SDPA_ALIGN_TOP_LEFT, SDPA_DTYPE_BF16, SDPA_DTYPE_F16, SDPA_DTYPE_F32, SDPA_DTYPE_I8,
};
use crate::status::Failure;

pub(crate) fn operand_name(operand: Operand) -> String {
    operand.to_string()
}

/// Elements a view reaches (largest index + 1, 0 if empty), as `sdpa::Tensor::new` computes it.
fn reach(dims: [usize; 4], strides: [usize; 4]) -> Result<usize, Failure> {
    if dims.contains(&0) {
        return Ok(0);
    }
    let overflow = || Failure::from(sdpa::Error::LayoutOverflow { dims, strides });
    let mut last = 0usize;
    for (&n, &s) in dims.iter().zip(&strides) {
        let span = (n - 1).checked_mul(s).ok_or_else(overflow)?;
        last = last.checked_add(span).ok_or_else(overflow)?;
    }
    last.checked_add(1).ok_or_else(overflow)
}

/// A byte range `[start, end)` some call reads or writes, for the overlap check.
#[derive(Clone, Copy)]
pub(crate) struct Span {
    start: usize,
    end: usize,
}

impl Span {
    /// The bytes of `s`.
    pub(crate) fn of<T>(s: &[T]) -> Span {
        let start = s.as_ptr() as usize;
        Span {
            start,
            end: start + std::mem::size_of_val(s),
        }
    }

    fn overlaps(self, other: Span) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// Checks a raw array of `len` elements of `T` and returns its byte span. `what` names it in
/// messages.
fn check_array<T>(ptr: *const T, len: usize, what: &str) -> Result<Span, Failure> {
    if ptr.is_null() {
        return Err(Failure::new(
            SdpaStatus::NullPointer,
            format!("{what}: pointer is NULL"),
        ));
    }
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Failure::new(
            SdpaStatus::Misaligned,
            format!(
                "{what}: pointer {ptr:p} is not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        ));
    }
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Failure::new(
                SdpaStatus::LayoutOverflow,
                format!("{what}: {len} elements do not fit in the address space"),
            )
        })?;
    let start = ptr as usize;
    let end = start.checked_add(bytes).ok_or_else(|| {
        Failure::new(
            SdpaStatus::LayoutOverflow,
            format!("{what}: {len} elements from {ptr:p} wrap around the address space"),
        )
    })?;
    Ok(Span { start, end })
}

/// A validated tensor: its elements as a slice, and the span for overlap checks.
struct Raw<'a, T> {
    slice: &'a [T],
    dims: [usize; 4],
    strides: [usize; 4],
    span: Span,
}

/// # Safety
/// `t.data`, when it passes the checks, must be valid for reads of the elements the view
/// reaches, for `'a`.
unsafe fn raw_tensor<'a, T>(t: &SdpaTensor, what: &str) -> Result<Raw<'a, T>, Failure> {
    let len = reach(t.dims, t.strides)?;
    let ptr = t.data as *const T;
    let span = check_array(ptr, len, what)?;
    // SAFETY: non-null, aligned, `len · size_of::<T>() ≤ isize::MAX` without wrapping (checked
    // above); validity for reads is the caller's contract.
    let slice = unsafe { std::slice::from_raw_parts(ptr, len) };
    Ok(Raw {
        slice,
        dims: t.dims,
        strides: t.strides,
        span,
    })
}

/// An input tensor of elements `T` (alignment and byte span from `T`'s size).
///
/// # Safety
/// As [`raw_tensor`].
pub(crate) unsafe fn input<'a, T>(
    t: &SdpaTensor,
    operand: Operand,
) -> Result<(Tensor<'a, T>, Span), Failure> {
    // SAFETY: forwarded.
    let raw = unsafe { raw_tensor::<T>(t, &format!("{} tensor", operand_name(operand))) }?;
    Ok((Tensor::new(raw.slice, raw.dims, raw.strides)?, raw.span))
}

/// An output tensor of elements `T`, checked against the read spans.
///
/// # Safety
/// `t.data` must be valid for reads and writes of the elements the view reaches, for `'a`, and
/// nothing else may access them meanwhile.
pub(crate) unsafe fn output<'a, T>(
    t: &SdpaTensorMut,
    reads: &[Span],
) -> Result<(TensorMut<'a, T>, Span), Failure> {
    let len = reach(t.dims, t.strides)?;
    let ptr = t.data as *mut T;
    let span = check_array(ptr.cast_const(), len, "output tensor")?;
    check_disjoint(span, reads, "output tensor")?;
    // SAFETY: as in `raw_tensor`; exclusive access is the caller's contract, and the output is
    // disjoint from every input the call reads (checked above).
    let slice = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
    Ok((TensorMut::new(slice, t.dims, t.strides)?, span))
}

/// An optional output array of `len` elements (NULL with length 0: none; NULL with a nonzero
/// length: [`SdpaStatus::NullPointer`], as every array of the ABI), checked against `reads`.
///
/// # Safety
/// `ptr`, if not NULL, must be valid for reads and writes of `len` elements, exclusively.
pub(crate) unsafe fn output_array<'a, T>(
    ptr: *mut T,
    len: usize,
    reads: &[Span],
    what: &str,
) -> Result<Option<&'a mut [T]>, Failure> {
    if ptr.is_null() {
        return absent(len, what);
    }
    let span = check_array(ptr.cast_const(), len, what)?;
    check_disjoint(span, reads, what)?;
    // SAFETY: checked above; validity and exclusivity are the caller's contract.
    Ok(Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) }))
}

/// An optional input array of `len` elements (NULL with length 0: none; NULL with a nonzero
/// length: [`SdpaStatus::NullPointer`]).
///
/// # Safety
/// `ptr`, if not NULL, must be valid for reads of `len` elements.
pub(crate) unsafe fn input_array<'a, T>(
    ptr: *const T,
    len: usize,
    what: &str,
    spans: &mut Vec<Span>,
) -> Result<Option<&'a [T]>, Failure> {
    if ptr.is_null() {
        return absent(len, what);
    }
    spans.push(check_array(ptr, len, what)?);
    // SAFETY: checked above; validity is the caller's contract.
    Ok(Some(unsafe { std::slice::from_raw_parts(ptr, len) }))
}

/// A NULL array: none if its length is 0, else a NULL pointer error (a caller that counted
/// elements meant to pass them).
fn absent<T>(len: usize, what: &str) -> Result<Option<T>, Failure> {
    match len {
        0 => Ok(None),
        n => Err(Failure::new(
            SdpaStatus::NullPointer,
            format!("{what}: pointer is NULL with length {n}"),
        )),
    }
}

fn check_disjoint(span: Span, others: &[Span], what: &str) -> Result<(), Failure> {
    if span.start == span.end {
        return Ok(());
    }
    if others.iter().any(|&o| o.start != o.end && span.overlaps(o)) {
        return Err(Failure::new(
            SdpaStatus::AliasedBuffers,
            format!("{what} overlaps an input or another output of the call"),
        ));
    }
    Ok(())
}

/// Reads a versioned struct of which the caller knows `size` bytes (fields past them stay zero,
/// which every struct here reads as "absent / off"). `size` must be one of `versions`, the
/// sizes of the struct's earlier versions (a size between two versions is not a struct); the
/// current one, `sizeof(T)`, is always accepted.
///
/// Returns the struct and the caller's `size`.
///
/// # Safety
/// `ptr`, if not NULL, must be valid for reads of `*ptr.size` bytes.
pub(crate) unsafe fn read_versioned<T: Copy>(
    ptr: *const T,
    versions: &[usize],
    what: &str,
) -> Result<(T, usize), Failure> {
    if ptr.is_null() {
        return Err(Failure::new(
            SdpaStatus::NullPointer,
            format!("{what}: pointer is NULL"),
        ));
    }
    // Every versioned struct starts with `size_t size`; read it alone first.
    // SAFETY: the caller's struct has at least that field.
    let size = unsafe { (ptr as *const usize).read_unaligned() };
    let full = std::mem::size_of::<T>();
    if size != full && !versions.contains(&size) {
        let earlier: String = versions.iter().map(|v| format!(" or {v}")).collect();
        return Err(Failure::new(
            SdpaStatus::InvalidStructSize,
            format!(
                "{what}: size is {size}, expected {full} (sizeof the struct in this ABI){earlier}"
            ),
        ));
    }
    // SAFETY: all-zero bytes are a valid `T` (integers, floats, raw pointers), and the caller's
    // struct holds `size` readable bytes.
    unsafe {
        let mut value = std::mem::MaybeUninit::<T>::zeroed();
        std::ptr::copy_nonoverlapping(ptr as *const u8, value.as_mut_ptr() as *mut u8, size);
        Ok((value.assume_init(), size))
    }
}

/// An element type the attention calls take (`I8` for K/V only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtype {
    F32,
    F16,
    Bf16,
    I8,
}

pub(crate) fn dtype(value: u32, what: &str) -> Result<Dtype, Failure> {
    match value {
        SDPA_DTYPE_F32 => Ok(Dtype::F32),
        SDPA_DTYPE_F16 => Ok(Dtype::F16),
        SDPA_DTYPE_BF16 => Ok(Dtype::Bf16),
        SDPA_DTYPE_I8 => Ok(Dtype::I8),
        other => Err(Failure::new(
            SdpaStatus::UnsupportedType,
            format!("{what}: unknown element type {other} (not an SDPA_DTYPE_* value)"),
        )),
    }
}

pub(crate) fn alignment(value: u32, what: &str) -> Result<Option<Alignment>, Failure> {
    match value {
        SDPA_ALIGN_NONE => Ok(None),
        SDPA_ALIGN_TOP_LEFT => Ok(Some(Alignment::TopLeft)),
        SDPA_ALIGN_BOTTOM_RIGHT => Ok(Some(Alignment::BottomRight)),
        other => Err(Failure::new(
            SdpaStatus::InvalidArgument,
            format!("{what}: {other} is not an SDPA_ALIGN_* value"),
        )),
    }
}

/// A compact copy of a view's distinct elements: what a mask becomes (bytes to `bool`) and
/// what a plan keeps of the options' tensors.
pub(crate) struct Copied<T> {
    pub(crate) data: Vec<T>,
    pub(crate) dims: [usize; 4],
    pub(crate) strides: [usize; 4],
}

impl<T> Copied<T> {
    /// The copy as a tensor of the original's dims.
    pub(crate) fn tensor(&self) -> Result<Tensor<'_, T>, Failure> {
        Ok(Tensor::new(&self.data, self.dims, self.strides)?)
    }
}

/// The mask converted to `bool` (nonzero = visible).
pub(crate) type MaskCopy = Copied<bool>;

/// Copies the elements of `x` through `f`, keeping broadcast dims (size 1 or stride 0)
/// broadcast, so the copy is no larger than the distinct elements the view holds.
pub(crate) fn compact<S: Copy, T>(
    x: Tensor<'_, S>,
    f: impl Fn(S) -> T,
) -> Result<Copied<T>, Failure> {
    let (dims, strides, slice) = (x.dims(), x.strides(), x.data());
    let kept: [usize; 4] = std::array::from_fn(|i| if strides[i] == 0 { 1 } else { dims[i] });
    let count = kept.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
    let count =
        count.ok_or_else(|| Failure::from(sdpa::Error::LayoutOverflow { dims, strides }))?;
    let mut data = Vec::new();
    data.try_reserve_exact(count).map_err(|_| {
        Failure::from(sdpa::Error::OutOfMemory {
            bytes: count.saturating_mul(std::mem::size_of::<T>()),
        })
    })?;
    for b in 0..kept[0] {
        for s in 0..kept[1] {
            for h in 0..kept[2] {
                for d in 0..kept[3] {
                    let at = b * strides[0] + s * strides[1] + h * strides[2] + d * strides[3];
                    data.push(f(slice[at]));
                }
            }
        }
    }
    // Contiguous strides over the kept dims; broadcast dims get stride 0.
    let mut copy_strides = [0usize; 4];
    let mut step = 1usize;
    for i in (0..4).rev() {
        copy_strides[i] = if kept[i] == 1 { 0 } else { step };
        step *= kept[i];
    }
    Ok(Copied {
        data,
        dims,
        strides: copy_strides,
    })
}

/// Copies a byte mask into `bool`s (nonzero = visible), as [`compact`].
///
/// # Safety
/// As [`raw_tensor`].
pub(crate) unsafe fn copy_mask(t: &SdpaTensor, spans: &mut Vec<Span>) -> Result<MaskCopy, Failure> {
    // SAFETY: forwarded.
    let raw = unsafe { raw_tensor::<u8>(t, "mask tensor") }?;
    spans.push(raw.span);
    // Validate the view as sdpa would (same errors), then copy it.
    let view = Tensor::new(raw.slice, raw.dims, raw.strides)?;
    compact(view, |m| m != 0)
}

/// A required input array: NULL is accepted only for an empty one (the call then reports a
/// wrong length as the Rust API does).
///
/// # Safety
/// As [`input_array`].
pub(crate) unsafe fn required_array<'a, T>(
    ptr: *const T,
    len: usize,
    what: &str,
    spans: &mut Vec<Span>,
) -> Result<&'a [T], Failure> {
    if ptr.is_null() && len == 0 {
        return Ok(&[]);
    }
    // SAFETY: forwarded.
    unsafe { input_array(ptr, len, what, spans) }?.ok_or_else(|| {
        Failure::new(
            SdpaStatus::NullPointer,
            format!("{what}: pointer is NULL (with {len} entries)"),
        )
    })
}

/// `int32_t` sequence offsets converted to the Rust API's `usize` ones; a negative entry is
/// `InvalidValue` for `operand`, as the Rust API reports offsets it rejects.
///
/// # Safety
/// As [`input_array`].
pub(crate) unsafe fn offsets(
    ptr: *const i32,
    len: usize,
    operand: Operand,
    spans: &mut Vec<Span>,
) -> Result<Vec<usize>, Failure> {
    // SAFETY: forwarded.
    let raw = unsafe { required_array(ptr, len, &operand_name(operand), spans) }?;
    let mut converted = Vec::new();
    converted.try_reserve_exact(raw.len()).map_err(|_| {
        Failure::from(sdpa::Error::OutOfMemory {
            bytes: raw.len().saturating_mul(std::mem::size_of::<usize>()),
        })
    })?;
    for (index, &x) in raw.iter().enumerate() {
        let x = usize::try_from(x).map_err(|_| sdpa::Error::InvalidValue {
            operand,
            index,
            reason: "offset is negative",
        })?;
        converted.push(x);
    }
    Ok(converted)
}
