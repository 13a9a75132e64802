//! One layer's paged K/V cache, owned ([`KvPool`]): the pools a [`PagedKv`] reads, written
//! only through [`KvPool::append`], so that the `i8` scales it holds are valid by
//! construction and a plan's run reads them without checking them every layer
//! ([`Plan::run_pool`](crate::Plan::run_pool)).
//!
//! An engine that keeps its caches elsewhere (one buffer for all layers, shared memory) uses
//! the views instead: [`crate::append`] into them, [`Layer::kv_scales`](crate::Layer::kv_scales)
//! for a run, whose scales are then checked where the lengths reach.

use crate::append::append;
use crate::element::{store_kv, Element, KvElement};
use crate::error::Error;
use crate::kv_cache::PagedKv;
use crate::options::Options;
use crate::rope::Rope;
use crate::tensor::{Tensor, TensorMut};

/// One layer's paged cache: K `[num_pages, page_size, H_kv, d_k]` and V `[num_pages,
/// page_size, H_kv, d_v]` of `T` (slot `s` is row `s % page_size` of page `s / page_size`)
/// and, for `i8`, a scale per (slot, kv head) for each, `[num_pages, page_size, H_kv, 1]`
/// (the per-token scales of [`crate::append`]). Zero when made; written only by
/// [`KvPool::append`].
///
/// ```
/// use sdpa::{KvPool, Tensor};
/// // 4 pages of 16 tokens, 2 kv heads of 8 channels, int8 with per-token scales.
/// let mut pool = KvPool::<i8>::new(4, 16, 2, 8, 8)?;
/// let (k, v) = (vec![0.5f32; 3 * 2 * 8], vec![-0.25f32; 3 * 2 * 8]);
/// let rows = |x| Tensor::bshd(x, [1, 3, 2, 8]);
/// pool.append(&rows(&k)?, &rows(&v)?, &[16, 17, 40], None)?; // page 1 slots 0–1, page 2 slot 8
/// let (k_scales, _) = pool.scales().expect("i8 pools have scales");
/// assert_eq!(k_scales.get([1, 0, 0, 0]), Some(&(0.5 / 127.0)));
/// # Ok::<(), sdpa::Error>(())
/// ```
#[derive(Clone)]
pub struct KvPool<T> {
    k: Vec<T>,
    v: Vec<T>,
    /// `i8`: the K and V scales; empty for other types.
    k_scales: Vec<f32>,
    v_scales: Vec<f32>,
    /// `[num_pages, page_size, H_kv, d_k]`, and `d_v`.
    dims: [usize; 4],
    d_v: usize,
}

impl<T: KvElement> std::fmt::Debug for KvPool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The shape, not the values (a pool is megabytes).
        f.debug_struct("KvPool")
            .field("type", &T::NAME)
            .field("dims", &self.dims)
            .field("d_v", &self.d_v)
            .finish_non_exhaustive()
    }
}

/// `n` copies of `x`, or [`Error::OutOfMemory`] (`n` saturated at `usize::MAX` when it
/// overflowed).
fn filled<T: Copy>(n: Option<usize>, x: T) -> Result<Vec<T>, Error> {
    let n = n.unwrap_or(usize::MAX);
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::OutOfMemory { bytes })?;
    v.resize(n, x);
    Ok(v)
}

impl<T: KvElement> KvPool<T> {
    /// A pool of `num_pages` pages of `page_size` slots, `kv_heads` heads of `d_k` (K) and
    /// `d_v` (V) channels, all zero (scales too).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the pools cannot be allocated (or their sizes overflow).
    pub fn new(
        num_pages: usize,
        page_size: usize,
        kv_heads: usize,
        d_k: usize,
        d_v: usize,
    ) -> Result<Self, Error> {
        let slots = num_pages
            .checked_mul(page_size)
            .and_then(|x| x.checked_mul(kv_heads));
        let zero = store_kv::<T>(0.0);
        let scale_slots = if T::QUANTIZED { slots } else { Some(0) };
        let pool = Self {
            k: filled(slots.and_then(|x| x.checked_mul(d_k)), zero)?,
            v: filled(slots.and_then(|x| x.checked_mul(d_v)), zero)?,
            k_scales: filled(scale_slots, 0.0)?,
            v_scales: filled(scale_slots, 0.0)?,
            dims: [num_pages, page_size, kv_heads, d_k],
            d_v,
        };
        // The views' strides fit: each pool's length is the product of its dims.
        pool.views()?;
        Ok(pool)
    }

    /// The four views, or the error of one (none after [`KvPool::new`] checked them).
    #[allow(clippy::type_complexity)]
    pub(crate) fn views(
        &self,
    ) -> Result<(Tensor<'_, T>, Tensor<'_, T>, [Tensor<'_, f32>; 2]), Error> {
        let [p, s, h, _] = self.dims;
        let scales = |x| Tensor::bshd(x, [p, s, h, usize::from(T::QUANTIZED)]);
        Ok((
            Tensor::bshd(&self.k, self.dims)?,
            Tensor::bshd(&self.v, [p, s, h, self.d_v])?,
            [scales(&self.k_scales)?, scales(&self.v_scales)?],
        ))
    }

    /// `[num_pages, page_size, H_kv, d_k]`.
    pub fn dims(&self) -> [usize; 4] {
        self.dims
    }

    /// The K pool, `[num_pages, page_size, H_kv, d_k]`.
    pub fn k(&self) -> Tensor<'_, T> {
        self.views().expect("checked in KvPool::new").0
    }

    /// The V pool, `[num_pages, page_size, H_kv, d_v]`.
    pub fn v(&self) -> Tensor<'_, T> {
        self.views().expect("checked in KvPool::new").1
    }

    /// The K and V scales of an `i8` pool, `[num_pages, page_size, H_kv, 1]` (`None` for
    /// other types).
    pub fn scales(&self) -> Option<(Tensor<'_, f32>, Tensor<'_, f32>)> {
        let [k, v] = self.views().expect("checked in KvPool::new").2;
        T::QUANTIZED.then_some((k, v))
    }

    /// [`crate::append`] into this pool: the rows of `k` and `v` (`[B, S, H_kv, d]`) at
    /// `slots` (token `b · S + s`), K rotated first by `rope` at the tokens' positions if
    /// given; `i8` rows with their per-token scales. Nothing written on error.
    ///
    /// # Errors
    /// As [`crate::append`].
    pub fn append<S: Element>(
        &mut self,
        k: &Tensor<'_, S>,
        v: &Tensor<'_, S>,
        slots: &[usize],
        rope: Option<(&Rope<'_>, &[u32])>,
    ) -> Result<(), Error> {
        let [p, s, h, _] = self.dims;
        let mut kc = TensorMut::bshd(&mut self.k, self.dims)?;
        let mut vc = TensorMut::bshd(&mut self.v, [p, s, h, self.d_v])?;
        if !T::QUANTIZED {
            return append(k, v, &mut kc, &mut vc, slots, None, rope);
        }
        let mut ks = TensorMut::bshd(&mut self.k_scales, [p, s, h, 1])?;
        let mut vs = TensorMut::bshd(&mut self.v_scales, [p, s, h, 1])?;
        append(
            k,
            v,
            &mut kc,
            &mut vc,
            slots,
            Some((&mut ks, &mut vs)),
            rope,
        )
    }

    /// The pool as the paged calls read it, through `block_table` (`[B][pages_per_seq]`).
    ///
    /// # Errors
    /// As [`PagedKv::new`].
    pub fn paged<'a>(
        &'a self,
        block_table: &'a [u32],
        pages_per_seq: usize,
    ) -> Result<PagedKv<'a, T>, Error> {
        PagedKv::new(self.k(), self.v(), block_table, pages_per_seq)
    }

    /// `opts` with this pool's scales ([`Options::kv_scales`]) for an `i8` pool, unchanged
    /// otherwise: the options of a paged call, or of the reference, on this pool.
    pub fn options<'a>(&'a self, opts: Options<'a>) -> Options<'a> {
        match self.scales() {
            Some((k, v)) => opts.kv_scales(k, v),
            None => opts,
        }
    }
}
