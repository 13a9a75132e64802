//! Off x86-64 the token is uninhabited ([`Bf16Dot::detect`] always answers `None`): these
//! methods exist for the code that names them, and can never run.

use super::operands::{KeyRows, PairKeys};
use crate::simd::{Bf16Dot, RowStream};

#[allow(clippy::too_many_arguments, clippy::unused_self)]
impl Bf16Dot {
    pub fn interleave(self, _: &[f32], _: Option<&[f32]>, _: &mut [f32]) {
        match self {}
    }
    pub fn pair_row(self, _: &[f32], _: &mut [f32]) {
        match self {}
    }
    pub fn pair_bf16_row(self, _: &[half::bf16], _: &mut [f32]) {
        match self {}
    }
    pub fn interleave_bf16(self, _: &[half::bf16], _: Option<&[half::bf16]>, _: &mut [f32]) {
        match self {}
    }
    pub fn scores_panel(
        self,
        _: PairKeys<'_>,
        _: (usize, usize),
        _: &[f32],
        _: usize,
        _: &mut [f32],
        _: usize,
        _: usize,
        _: [f32; 2],
        _: &mut [f32],
    ) -> u64 {
        match self {}
    }
    pub fn output_tile(
        self,
        _: &[f32],
        _: usize,
        _: (usize, usize),
        _: &[f32],
        _: usize,
        _: (usize, usize),
        _: &[f32],
        _: &mut [f32],
        _: usize,
    ) {
        match self {}
    }
    pub fn dots(
        self,
        _: impl KeyRows,
        _: (usize, usize),
        _: &[f32],
        _: (usize, usize, usize),
        _: &mut [f32],
        _: usize,
        _: Option<RowStream>,
    ) -> u64 {
        match self {}
    }
    pub fn output_in_place(
        self,
        _: &[f32],
        _: usize,
        _: (usize, usize),
        _: impl KeyRows,
        _: (usize, usize),
        _: &[f32],
        _: &mut [f32],
        _: usize,
        _: Option<RowStream>,
    ) {
        match self {}
    }
}
