//! Strided 4-D views over caller-owned slices.
//!
//! Logical dims are always `[batch, seq, heads, dim]`; strides are in elements, one per logical
//! dim. BSHD (FlashAttention, KV caches) and BHSD (PyTorch) storage are both just strides, so no
//! layout ever needs a copy. A stride of 0 broadcasts a dimension (read-only views only).

use crate::element::{Element, Slice, SliceMut};
use crate::error::Error;
use half::{bf16, f16};

/// The largest element index a view with these dims and strides can reach, plus one
/// (0 for an empty view), or `LayoutOverflow`.
fn required_len(dims: [usize; 4], strides: [usize; 4]) -> Result<usize, Error> {
    if dims.contains(&0) {
        return Ok(0);
    }
    let overflow = Error::LayoutOverflow { dims, strides };
    let mut last = 0usize;
    for (&n, &s) in dims.iter().zip(&strides) {
        let span = (n - 1).checked_mul(s).ok_or(overflow.clone())?;
        last = last.checked_add(span).ok_or(overflow.clone())?;
    }
    last.checked_add(1).ok_or(overflow)
}

/// Whether distinct logical indices always land on distinct elements.
///
/// Sufficient test (the one BLAS-style libraries use): ordering the dims of size > 1 by stride,
/// each stride must be at least the extent reached by all smaller-stride dims together. Views
/// that interleave dims in exotic but injective ways are rejected; no ordinary layout is.
fn is_injective(dims: [usize; 4], strides: [usize; 4]) -> bool {
    if dims.contains(&0) {
        return true; // no elements, nothing to overlap
    }
    // The dims of more than one element by stride, in an array: an output view is made per
    // call, and its check must not allocate (a serving loop's steps allocate nothing).
    let mut order = [0usize, 1, 2, 3];
    order.sort_unstable_by_key(|&i| strides[i]);
    let mut extent = 1usize; // elements spanned by the dims placed so far
    for &i in order.iter().filter(|&&i| dims[i] > 1) {
        if strides[i] < extent {
            return false;
        }
        // Cannot overflow: `required_len` already checked the full span of this non-empty view.
        extent += strides[i] * (dims[i] - 1);
    }
    true
}

/// Contiguous strides for logical dims `[b, s, h, d]` stored as B, S, H, D (row-major).
fn bshd_strides(dims: [usize; 4]) -> Result<[usize; 4], Error> {
    let [_, s, h, d] = dims;
    let overflow = || Error::LayoutOverflow {
        dims,
        strides: [0; 4],
    };
    let hd = h.checked_mul(d).ok_or_else(overflow)?;
    let shd = s.checked_mul(hd).ok_or_else(overflow)?;
    Ok([shd, hd, d, 1])
}

/// Contiguous strides for logical dims `[b, s, h, d]` stored as B, H, S, D (PyTorch's layout).
fn bhsd_strides(dims: [usize; 4]) -> Result<[usize; 4], Error> {
    let [_, s, h, d] = dims;
    let overflow = || Error::LayoutOverflow {
        dims,
        strides: [0; 4],
    };
    let sd = s.checked_mul(d).ok_or_else(overflow)?;
    let hsd = h.checked_mul(sd).ok_or_else(overflow)?;
    Ok([hsd, d, sd, 1])
}

/// A read-only 4-D strided view, logical dims `[batch, seq, heads, dim]`.
///
/// Every constructor validates the view: the strides cannot overflow and the slice is long
/// enough for the largest reachable index, so element access through a valid view never goes
/// out of bounds.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a, T> {
    data: &'a [T],
    dims: [usize; 4],
    strides: [usize; 4],
}

impl<'a, T> Tensor<'a, T> {
    /// A view with explicit element strides (stride 0 broadcasts that dimension).
    ///
    /// # Errors
    /// [`Error::LayoutOverflow`] if the reachable span overflows `usize`;
    /// [`Error::SliceTooShort`] if `data` is shorter than the largest reachable index + 1.
    pub fn new(data: &'a [T], dims: [usize; 4], strides: [usize; 4]) -> Result<Self, Error> {
        let needed = required_len(dims, strides)?;
        if data.len() < needed {
            return Err(Error::SliceTooShort {
                needed,
                got: data.len(),
            });
        }
        Ok(Self {
            data,
            dims,
            strides,
        })
    }

    /// A contiguous view of `data` stored batch, seq, heads, dim (row-major `[b, s, h, d]`).
    ///
    /// # Errors
    /// As [`Tensor::new`].
    pub fn bshd(data: &'a [T], dims: [usize; 4]) -> Result<Self, Error> {
        Self::new(data, dims, bshd_strides(dims)?)
    }

    /// A contiguous view of `data` stored batch, heads, seq, dim (PyTorch's `[b, h, s, d]`).
    /// `shape` is given in storage order `[b, h, s, d]`; the logical dims become `[b, s, h, d]`.
    ///
    /// # Errors
    /// As [`Tensor::new`].
    pub fn bhsd(data: &'a [T], shape: [usize; 4]) -> Result<Self, Error> {
        let [b, h, s, d] = shape;
        let dims = [b, s, h, d];
        Self::new(data, dims, bhsd_strides(dims)?)
    }

    /// Logical dims `[batch, seq, heads, dim]`.
    pub fn dims(&self) -> [usize; 4] {
        self.dims
    }

    /// Element strides, one per logical dim.
    pub fn strides(&self) -> [usize; 4] {
        self.strides
    }

    /// The underlying slice.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// The same dims and strides over `data`: the same memory seen as another element type
    /// of the same size (so the view stays valid), or a slice at least as long.
    pub(crate) fn with_data<U>(&self, data: &'a [U]) -> Tensor<'a, U> {
        debug_assert!(data.len() >= self.data.len());
        Tensor {
            data,
            dims: self.dims,
            strides: self.strides,
        }
    }

    /// The element at `[b, s, h, d]`, or `None` if an index is out of range.
    pub fn get(&self, index: [usize; 4]) -> Option<&'a T> {
        if index.iter().zip(&self.dims).any(|(i, n)| i >= n) {
            return None;
        }
        self.data.get(offset(index, self.strides))
    }
}

/// A writable 4-D strided view, logical dims `[batch, seq, heads, dim]`.
///
/// Besides the checks of [`Tensor`], a writable view must be injective (no two logical indices
/// share an element), so that rows written in parallel never race.
#[derive(Debug)]
pub struct TensorMut<'a, T> {
    data: &'a mut [T],
    dims: [usize; 4],
    strides: [usize; 4],
}

impl<'a, T> TensorMut<'a, T> {
    /// A writable view with explicit element strides.
    ///
    /// # Errors
    /// As [`Tensor::new`], plus [`Error::OverlappingOutput`] if two logical indices would share
    /// one element (a zero stride on a dimension larger than 1, or interleaved strides).
    pub fn new(data: &'a mut [T], dims: [usize; 4], strides: [usize; 4]) -> Result<Self, Error> {
        let needed = required_len(dims, strides)?;
        if data.len() < needed {
            return Err(Error::SliceTooShort {
                needed,
                got: data.len(),
            });
        }
        if !is_injective(dims, strides) {
            return Err(Error::OverlappingOutput { dims, strides });
        }
        Ok(Self {
            data,
            dims,
            strides,
        })
    }

    /// A contiguous writable view stored batch, seq, heads, dim.
    ///
    /// # Errors
    /// As [`TensorMut::new`].
    pub fn bshd(data: &'a mut [T], dims: [usize; 4]) -> Result<Self, Error> {
        let strides = bshd_strides(dims)?;
        Self::new(data, dims, strides)
    }

    /// A contiguous writable view stored batch, heads, seq, dim; `shape` in storage order
    /// `[b, h, s, d]`, logical dims `[b, s, h, d]`.
    ///
    /// # Errors
    /// As [`TensorMut::new`].
    pub fn bhsd(data: &'a mut [T], shape: [usize; 4]) -> Result<Self, Error> {
        let [b, h, s, d] = shape;
        let dims = [b, s, h, d];
        let strides = bhsd_strides(dims)?;
        Self::new(data, dims, strides)
    }

    /// Logical dims `[batch, seq, heads, dim]`.
    pub fn dims(&self) -> [usize; 4] {
        self.dims
    }

    /// Element strides, one per logical dim.
    pub fn strides(&self) -> [usize; 4] {
        self.strides
    }

    /// A read-only view of the same elements.
    pub fn as_tensor(&self) -> Tensor<'_, T> {
        Tensor {
            data: self.data,
            dims: self.dims,
            strides: self.strides,
        }
    }

    /// The element at `[b, s, h, d]`, or `None` if an index is out of range.
    pub fn get_mut(&mut self, index: [usize; 4]) -> Option<&mut T> {
        if index.iter().zip(&self.dims).any(|(i, n)| i >= n) {
            return None;
        }
        self.data.get_mut(offset(index, self.strides))
    }

    /// The underlying slice and the layout, for the kernels' row writers.
    pub(crate) fn raw_parts(&mut self) -> (&mut [T], [usize; 4], [usize; 4]) {
        (self.data, self.dims, self.strides)
    }
}

/// A [`Tensor`] of a generic element type, named by its concrete type: the kernel's entry
/// point takes Q this way, so that it is compiled once for every element type, not once per
/// type.
#[derive(Clone, Copy)]
pub(crate) enum AnyTensor<'a> {
    F32(Tensor<'a, f32>),
    F16(Tensor<'a, f16>),
    Bf16(Tensor<'a, bf16>),
}

impl<'a, T: Element> Tensor<'a, T> {
    /// The same view, its element type named.
    pub(crate) fn erase(self) -> AnyTensor<'a> {
        match T::slice(self.data) {
            Slice::F32(data) => AnyTensor::F32(self.with_data(data)),
            Slice::F16(data) => AnyTensor::F16(self.with_data(data)),
            Slice::Bf16(data) => AnyTensor::Bf16(self.with_data(data)),
        }
    }
}

/// A [`TensorMut`] of a generic element type, named by its concrete type (the output's).
pub(crate) enum AnyTensorMut<'a> {
    F32(TensorMut<'a, f32>),
    F16(TensorMut<'a, f16>),
    Bf16(TensorMut<'a, bf16>),
}

impl<T: Element> TensorMut<'_, T> {
    /// The same view, borrowed, its element type named.
    pub(crate) fn erase(&mut self) -> AnyTensorMut<'_> {
        let (dims, strides) = (self.dims, self.strides);
        match T::slice_mut(self.data) {
            SliceMut::F32(data) => AnyTensorMut::F32(TensorMut {
                data,
                dims,
                strides,
            }),
            SliceMut::F16(data) => AnyTensorMut::F16(TensorMut {
                data,
                dims,
                strides,
            }),
            SliceMut::Bf16(data) => AnyTensorMut::Bf16(TensorMut {
                data,
                dims,
                strides,
            }),
        }
    }
}

/// Element offset of a logical index; callers guarantee the index is in range, so the sum
/// cannot overflow (it is at most the span checked by `required_len`).
#[inline]
pub(crate) fn offset(index: [usize; 4], strides: [usize; 4]) -> usize {
    index[0] * strides[0] + index[1] * strides[1] + index[2] * strides[2] + index[3] * strides[3]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_layouts_have_expected_strides() {
        let data = vec![0.0f32; 2 * 3 * 4 * 5];
        let t = Tensor::bshd(&data, [2, 3, 4, 5]).unwrap();
        assert_eq!(t.strides(), [60, 20, 5, 1]);
        let t = Tensor::bhsd(&data, [2, 4, 3, 5]).unwrap();
        assert_eq!(t.dims(), [2, 3, 4, 5]);
        assert_eq!(t.strides(), [60, 5, 15, 1]);
    }

    #[test]
    fn short_slices_and_overflow_are_errors() {
        let data = vec![0.0f32; 10];
        assert_eq!(
            Tensor::bshd(&data, [1, 2, 1, 6]).unwrap_err(),
            Error::SliceTooShort {
                needed: 12,
                got: 10
            }
        );
        assert!(matches!(
            Tensor::new(&data, [2, 2, 1, 1], [usize::MAX, 1, 1, 1]),
            Err(Error::LayoutOverflow { .. })
        ));
        assert!(matches!(
            Tensor::bshd(&data, [usize::MAX, 2, 2, 2]),
            Err(Error::LayoutOverflow { .. })
        ));
        // Empty views need nothing.
        assert!(Tensor::bshd(&data[..0], [4, 0, 3, 2]).is_ok());
    }

    #[test]
    fn broadcast_reads_are_allowed_but_overlapping_writes_are_not() {
        let mut data = vec![0.0f32; 8];
        assert!(Tensor::new(&data, [1, 8, 4, 1], [0, 1, 0, 0]).is_ok());
        assert!(matches!(
            TensorMut::new(&mut data, [1, 8, 4, 1], [0, 1, 0, 0]),
            Err(Error::OverlappingOutput { .. })
        ));
        assert!(matches!(
            TensorMut::new(&mut data, [1, 2, 1, 4], [0, 2, 0, 1]),
            Err(Error::OverlappingOutput { .. })
        ));
        assert!(TensorMut::new(&mut data, [1, 2, 1, 4], [0, 4, 0, 1]).is_ok());
    }

    #[test]
    fn injectivity_accepts_padded_and_permuted_layouts() {
        assert!(is_injective([2, 3, 4, 5], [100, 7, 21, 1]));
        assert!(is_injective([2, 3, 4, 5], [60, 5, 15, 1]));
        assert!(!is_injective([2, 3, 4, 5], [60, 4, 15, 1]));
    }
}
