//! Strided storage for the differential cases: which layout each operand uses, and the buffers
//! built from it.
//!
//! Every operand is stored in a slice larger than its view where the layout has gaps (padding
//! between rows, heads or batches, a head-dim stride > 1, a tail). Gaps of inputs hold a NaN
//! with the payload [`POISON`], so a kernel that reads outside the view produces NaN where the
//! reference does not; gaps of outputs hold [`SENTINEL`] and must still hold it afterwards.

use super::bytes::{urange, variant, Writer};
use arbitrary::{Arbitrary, Result, Unstructured};

/// Bits of the NaN stored in the gaps of input slices.
pub const POISON: u32 = 0x7fc0_0bad;
/// Bits stored in every element of output slices before a call (a NaN no arithmetic makes).
pub const SENTINEL: u32 = 0x7fa5_5a5a;

/// How the logical dims `[batch, seq, heads, dim]` of one operand are laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum LayoutKind {
    /// Contiguous batch, seq, heads, dim (FlashAttention, KV caches).
    Bshd,
    /// Contiguous batch, heads, seq, dim (PyTorch).
    Bhsd,
    /// Contiguous in one of the 24 dim orders.
    Permuted,
    /// One of the 24 orders, each dim's stride padded by 0–3 elements, plus a tail.
    Padded,
    /// BSHD with a head-dim stride of 2–4 (Q/K/V read by column gathers).
    HeadDimStrided,
    /// BSHD with stride 0 on some dims (read-only operands only; BSHD for outputs).
    Broadcast,
}

/// One operand's layout, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Which family.
    pub kind: LayoutKind,
    /// Dim order outer → inner, as an index into the 24 permutations (Permuted, Padded).
    pub perm: u8,
    /// Extra elements added to each dim's stride (Padded; `pad[3]` for HeadDimStrided).
    pub pad: [u8; 4],
    /// Unused elements after the view (Padded).
    pub tail: u8,
    /// Bit `d` set: stride 0 on dim `d` (Broadcast).
    pub broadcast: u8,
    /// Elements of the slice before the view's first element (hand-made layouts; the decoded
    /// ones start at 0).
    pub offset: u8,
}

impl Layout {
    /// Contiguous BSHD.
    pub const BSHD: Layout = Layout {
        kind: LayoutKind::Bshd,
        perm: 0,
        pad: [0; 4],
        tail: 0,
        broadcast: 0,
        offset: 0,
    };

    /// Contiguous BHSD.
    pub const BHSD: Layout = Layout {
        kind: LayoutKind::Bhsd,
        ..Layout::BSHD
    };

    /// `order` (outer → inner) with each dim's stride padded by `pad` and `tail` extra elements.
    pub fn padded(order: [usize; 4], pad: [u8; 4], tail: u8) -> Layout {
        let perm = (0..24u8)
            .find(|&p| permutation(p) == order)
            .expect("a permutation of 0..4");
        Layout {
            kind: LayoutKind::Padded,
            perm,
            pad,
            tail,
            broadcast: 0,
            offset: 0,
        }
    }

    /// Storage order batch, seq, heads, dim.
    pub const BSHD_ORDER: [usize; 4] = [0, 1, 2, 3];
    /// Storage order batch, heads, seq, dim.
    pub const BHSD_ORDER: [usize; 4] = [0, 2, 1, 3];
    /// Storage order seq, batch, heads, dim ("time-major").
    pub const SBHD_ORDER: [usize; 4] = [1, 0, 2, 3];

    /// Logical dims stored in `order` (outermost first): the innermost one at stride `step`,
    /// each further level `pad` elements wider than it needs, `pad` more elements after the
    /// view, the view starting `offset` elements into the slice.
    pub fn strided(order: [usize; 4], step: usize, pad: usize, offset: usize) -> Layout {
        let byte = |x: usize| u8::try_from(x).expect("a small layout parameter");
        let mut pads = [byte(pad); 4];
        pads[order[3]] = byte(step - 1);
        Layout {
            offset: byte(offset),
            ..Layout::padded(order, pads, byte(pad))
        }
    }

    /// BSHD with every row and level padded, head-size elements `step` apart, 5 elements in.
    pub fn padded_bshd(step: usize, pad: usize) -> Layout {
        Layout::strided(Self::BSHD_ORDER, step, pad, 5)
    }

    /// BHSD with every row and level padded, head-size elements `step` apart, 3 elements in.
    pub fn padded_bhsd(step: usize, pad: usize) -> Layout {
        Layout::strided(Self::BHSD_ORDER, step, pad, 3)
    }

    /// BSHD with head-dim stride `stride` (2–4).
    pub fn head_dim_strided(stride: u8) -> Layout {
        Layout {
            kind: LayoutKind::HeadDimStrided,
            pad: [0, 0, 0, stride - 1],
            ..Layout::BSHD
        }
    }

    /// BSHD with stride 0 on the dims whose bit is set in `mask`.
    pub fn broadcast(mask: u8) -> Layout {
        Layout {
            kind: LayoutKind::Broadcast,
            broadcast: mask & 0xf,
            ..Layout::BSHD
        }
    }

    /// Reads a layout.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<Layout> {
        let kind: LayoutKind = variant(u)?;
        let mut l = Layout {
            kind,
            ..Layout::BSHD
        };
        match kind {
            LayoutKind::Bshd | LayoutKind::Bhsd => {}
            LayoutKind::Permuted => l.perm = urange(u, 0, 23)? as u8,
            LayoutKind::Padded => {
                l.perm = urange(u, 0, 23)? as u8;
                for p in &mut l.pad {
                    *p = urange(u, 0, 3)? as u8;
                }
                l.tail = urange(u, 0, 3)? as u8;
            }
            LayoutKind::HeadDimStrided => l.pad[3] = urange(u, 1, 3)? as u8,
            LayoutKind::Broadcast => l.broadcast = urange(u, 1, 15)? as u8,
        }
        Ok(l)
    }

    /// Inverse of [`Layout::decode`].
    pub fn encode(&self, w: &mut Writer) {
        w.variant(&self.kind);
        match self.kind {
            LayoutKind::Bshd | LayoutKind::Bhsd => {}
            LayoutKind::Permuted => {
                w.urange(self.perm.into(), 0, 23);
            }
            LayoutKind::Padded => {
                w.urange(self.perm.into(), 0, 23);
                for &p in &self.pad {
                    w.urange(p.into(), 0, 3);
                }
                w.urange(self.tail.into(), 0, 3);
            }
            LayoutKind::HeadDimStrided => {
                w.urange(self.pad[3].into(), 1, 3);
            }
            LayoutKind::Broadcast => {
                w.urange(self.broadcast.into(), 1, 15);
            }
        }
    }

    /// Strides and slice length (offset included) for logical `dims`; `writable` ignores
    /// broadcasting.
    pub fn storage(&self, dims: [usize; 4], writable: bool) -> ([usize; 4], usize) {
        let (order, pad, tail) = match self.kind {
            LayoutKind::Bshd | LayoutKind::Broadcast => ([0, 1, 2, 3], [0; 4], 0),
            LayoutKind::Bhsd => ([0, 2, 1, 3], [0; 4], 0),
            LayoutKind::Permuted => (permutation(self.perm), [0; 4], 0),
            LayoutKind::Padded => (permutation(self.perm), self.pad, self.tail),
            LayoutKind::HeadDimStrided => ([0, 1, 2, 3], self.pad, 0),
        };
        let mut strides = [0usize; 4];
        let mut next = 1usize; // stride of the next dim outwards, before its padding
        for (pos, &d) in order.iter().enumerate().rev() {
            strides[d] = if pos == 3 {
                1 + usize::from(pad[d])
            } else {
                next + usize::from(pad[d])
            };
            next = strides[d] * dims[d].max(1);
        }
        if !writable && self.kind == LayoutKind::Broadcast {
            for (d, s) in strides.iter_mut().enumerate() {
                if self.broadcast & (1 << d) != 0 {
                    *s = 0;
                }
            }
        }
        let len = if dims.contains(&0) {
            0
        } else {
            dims.iter()
                .zip(&strides)
                .map(|(&n, &s)| (n - 1) * s)
                .sum::<usize>()
                + 1
        };
        (strides, usize::from(self.offset) + len + usize::from(tail))
    }
}

/// The `p`-th permutation of `[0, 1, 2, 3]` (lexicographic order; 0 is the identity).
pub fn permutation(p: u8) -> [usize; 4] {
    let mut left = vec![0usize, 1, 2, 3];
    let mut p = usize::from(p) % 24;
    let mut out = [0; 4];
    for (k, slot) in out.iter_mut().enumerate() {
        let f = [6, 2, 1, 1][k];
        *slot = left.remove(p / f);
        p %= f;
    }
    out
}

/// Element offset of a logical index.
pub fn offset(index: [usize; 4], strides: [usize; 4]) -> usize {
    index.iter().zip(&strides).map(|(i, s)| i * s).sum()
}

/// Every logical index of `dims`, row-major.
pub fn indices(dims: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    // An empty view has no index, however large its other dims (do not loop over them).
    let [b, s, h, d] = if dims.contains(&0) { [0; 4] } else { dims };
    (0..b).flat_map(move |bi| {
        (0..s).flat_map(move |si| (0..h).flat_map(move |hi| (0..d).map(move |di| [bi, si, hi, di])))
    })
}

/// One operand's storage: the slice, where the view starts in it, its logical dims and strides.
/// Elements are `f32` for Q, K, V and outputs, `bool` for masks.
#[derive(Debug, Clone)]
pub struct Buffer<T = f32> {
    /// The whole slice, gaps included.
    pub data: Vec<T>,
    /// Index in `data` of the view's first element.
    pub start: usize,
    /// Logical dims `[batch, seq, heads, dim]`.
    pub dims: [usize; 4],
    /// Element strides.
    pub strides: [usize; 4],
}

impl Buffer<f32> {
    /// A slice for `dims` in `layout`, every element set to the NaN with bits `fill`.
    pub fn new(dims: [usize; 4], layout: &Layout, writable: bool, fill: u32) -> Buffer {
        Buffer::filled(dims, layout, writable, f32::from_bits(fill))
    }

    /// Largest magnitude of the logical elements.
    pub fn max_abs(&self) -> f64 {
        indices(self.dims).fold(0.0f64, |m, i| m.max(f64::from(self.at(i)).abs()))
    }
}

impl<T: Copy> Buffer<T> {
    /// A slice for `dims` in `layout`, every element `fill`.
    pub fn filled(dims: [usize; 4], layout: &Layout, writable: bool, fill: T) -> Buffer<T> {
        let (strides, len) = layout.storage(dims, writable);
        Buffer {
            data: vec![fill; len],
            start: layout.offset.into(),
            dims,
            strides,
        }
    }

    /// Logical element `index` is `f(index)` (in row-major order), every other element `pad`.
    pub fn from_fn(
        dims: [usize; 4],
        layout: Layout,
        pad: T,
        mut f: impl FnMut([usize; 4]) -> T,
    ) -> Buffer<T> {
        let mut buf = Buffer::filled(dims, &layout, true, pad);
        for i in indices(dims) {
            let x = f(i);
            buf.set(i, x);
        }
        buf
    }

    /// Contiguous BSHD holding `values` in logical order.
    pub fn bshd(dims: [usize; 4], values: &[T]) -> Buffer<T> {
        assert_eq!(values.len(), dims.iter().product::<usize>());
        Buffer {
            data: values.to_vec(),
            start: 0,
            dims,
            strides: Layout::BSHD.storage(dims, true).0,
        }
    }

    /// Position in `data` of a logical index.
    pub fn position(&self, index: [usize; 4]) -> usize {
        self.start + offset(index, self.strides)
    }

    /// The element at a logical index.
    pub fn at(&self, index: [usize; 4]) -> T {
        self.data[self.position(index)]
    }

    /// Element `index` of the view broadcast to a larger shape (dims of size 1 repeat).
    pub fn at_broadcast(&self, index: [usize; 4]) -> T {
        self.at(std::array::from_fn(|a| {
            if self.dims[a] == 1 {
                0
            } else {
                index[a]
            }
        }))
    }

    /// Sets the element at a logical index.
    pub fn set(&mut self, index: [usize; 4], x: T) {
        let p = self.position(index);
        self.data[p] = x;
    }

    /// The logical elements in row-major (BSHD) order.
    pub fn logical(&self) -> Vec<T> {
        indices(self.dims).map(|i| self.at(i)).collect()
    }

    /// Which elements of the slice the view reaches.
    pub fn in_view(&self) -> Vec<bool> {
        let mut mask = vec![false; self.data.len()];
        for i in indices(self.dims) {
            mask[self.position(i)] = true;
        }
        mask
    }

    /// A read-only view.
    pub fn view(&self) -> sdpa::Tensor<'_, T> {
        sdpa::Tensor::new(&self.data[self.start..], self.dims, self.strides).expect("valid layout")
    }

    /// A writable view.
    pub fn view_mut(&mut self) -> sdpa::TensorMut<'_, T> {
        sdpa::TensorMut::new(&mut self.data[self.start..], self.dims, self.strides)
            .expect("valid layout")
    }
}

impl<T: Copy> Buffer<T> {
    /// The same layout with every element (padding included) converted by `f`.
    pub fn map<U>(&self, f: impl Fn(T) -> U) -> Buffer<U> {
        Buffer {
            data: self.data.iter().map(|&x| f(x)).collect(),
            start: self.start,
            dims: self.dims,
            strides: self.strides,
        }
    }
}
