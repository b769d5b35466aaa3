//! The W4A16 tile layout: a [`GroupQuant`] rearranged, once and offline, so that the tensor-core
//! GEMV (`w4a16_mma_tiled` in kernels/quant/w4a16_mma_tiled.cu) reads its weights in 512-byte contiguous warp
//! loads. Marlin (Frantar et al., 2024) and TensorRT-LLM's weight-only kernels repack their
//! weights for the same reason.
//!
//! In the row-major layout a 16-row tile's step of 128 weights is 16 pieces of 64 bytes, one
//! per row, 4 KB apart (K = 8192), and the mma.sync fragments give each lane `(g, c)`
//! (`g = lane / 4`, `c = lane % 4`) the 16-byte chunk `4t + c` of rows `g` and `g + 8`. Here
//! each (tile, step) is one 1 KB block: the 32 lanes' chunks of row `g`, lanes in order, then
//! their chunks of row `g + 8`. Blocks run step by step within a tile, tiles one after another.
//! Scales (and mins) are stored 16 per (tile, group), as 8 pairs (row r, row r + 8), so that a
//! lane reads the two it needs in one 4-byte load.
//!
//! Rows past the matrix (the last tile) and chunks past K (the last step, when K is not a
//! multiple of 128) are zero codes with zero scales.

use super::group::GroupQuant;
use half::f16;
use rayon::prelude::*;

/// Rows per tile (one mma.sync M tile) and weights per step (4 lanes x 32).
pub const TILE_ROWS: usize = 16;
pub const STEP_WEIGHTS: usize = 128;
/// Bytes per (tile, step) block: 16 rows x 128 weights / 2.
pub const BLOCK_BYTES: usize = TILE_ROWS * STEP_WEIGHTS / 2;

/// A [`GroupQuant`] in the tile layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Tiles {
    pub tiles: usize,
    pub steps: usize,
    /// `tiles * steps * BLOCK_BYTES` bytes.
    pub codes: Vec<u8>,
    /// `tiles * groups_per_row * TILE_ROWS` scales.
    pub scales: Vec<f16>,
    /// Asymmetric only, like `scales` (empty for symmetric).
    pub mins: Vec<f16>,
}

/// Offset in a tile's block of lane `lane`'s 16 bytes of its row `g` (`half` 0) or `g + 8` (1).
pub fn lane_offset(half: usize, lane: usize) -> usize {
    (half * 32 + lane) * 16
}

/// Position of row `r` (within the tile) among its tile's 16 scales of one group: pairs
/// (r, r + 8).
pub fn scale_slot(r: usize) -> usize {
    2 * (r % 8) + r / 8
}

/// The row (within the tile) and the 16-byte chunk of that row that block byte `offset` of step
/// `step` holds, with the byte within the chunk.
pub fn source_of(step: usize, offset: usize) -> (usize, usize, usize) {
    let (slot, byte) = (offset / 16, offset % 16);
    let (half, lane) = (slot / 32, slot % 32);
    (lane / 4 + 8 * half, 4 * step + lane % 4, byte)
}

/// Rearranges `q` into the tile layout (the matrix needs `cols % 32 == 0`, as every group
/// format has).
pub fn tile(q: &GroupQuant) -> Tiles {
    let (rows, cols) = (q.rows, q.cols);
    let (tiles, steps, gpr) = (rows.div_ceil(TILE_ROWS), cols.div_ceil(STEP_WEIGHTS), cols / q.group);
    let (row_bytes, chunks) = (cols / 2, cols / 32);
    let mut codes = vec![0u8; tiles * steps * BLOCK_BYTES];
    codes.par_chunks_mut(steps * BLOCK_BYTES).enumerate().for_each(|(t, tile)| {
        for (s, block) in tile.chunks_mut(BLOCK_BYTES).enumerate() {
            for slot in 0..BLOCK_BYTES / 16 {
                let (r, j, _) = source_of(s, 16 * slot);
                let row = t * TILE_ROWS + r;
                if row < rows && j < chunks {
                    let src = row * row_bytes + 16 * j;
                    block[16 * slot..16 * slot + 16].copy_from_slice(&q.packed[src..src + 16]);
                }
            }
        }
    });
    let regroup = |v: &[f16]| -> Vec<f16> {
        if v.is_empty() {
            return Vec::new();
        }
        let mut out = vec![f16::ZERO; tiles * gpr * TILE_ROWS];
        for row in 0..rows {
            let (t, r) = (row / TILE_ROWS, row % TILE_ROWS);
            for grp in 0..gpr {
                out[(t * gpr + grp) * TILE_ROWS + scale_slot(r)] = v[row * gpr + grp];
            }
        }
        out
    };
    Tiles { tiles, steps, codes, scales: regroup(&q.scales), mins: regroup(&q.mins) }
}

/// The codes of `t` in the step-major order that `w4a16_mma_tiled_sweep` reads: block (tile,
/// step) at `(step * tiles + tile) * BLOCK_BYTES`, so that a grid whose blocks (one per tile)
/// take their steps in order reads W from end to end.
pub fn step_major(t: &Tiles) -> Vec<u8> {
    let mut out = vec![0u8; t.codes.len()];
    out.par_chunks_mut(BLOCK_BYTES).enumerate().for_each(|(i, block)| {
        let (step, tile) = (i / t.tiles, i % t.tiles);
        let at = (tile * t.steps + step) * BLOCK_BYTES;
        block.copy_from_slice(&t.codes[at..at + BLOCK_BYTES]);
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::group::{quantize, Scheme};
    use rand::{Rng, SeedableRng};

    /// Every byte of the layout is the row-major byte the kernel's lane expects, found by
    /// walking the lanes as the kernel does (not through `source_of`), and padding is zero.
    #[test]
    fn every_lane_finds_its_chunks_and_the_padding_is_zero() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for (rows, cols, scheme, group) in [(37, 992, Scheme::Asym, 32), (16, 128, Scheme::Sym, 128), (5, 96, Scheme::Sym, 96), (33, 4064, Scheme::Asym, 32)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let q = quantize(&w, rows, cols, scheme, group).unwrap();
            let t = tile(&q);
            let gpr = cols / group;
            assert_eq!((t.tiles, t.steps), (rows.div_ceil(16), cols.div_ceil(128)));
            assert_eq!(t.codes.len(), t.tiles * t.steps * BLOCK_BYTES);
            for tile in 0..t.tiles {
                for step in 0..t.steps {
                    for lane in 0..32 {
                        for half in 0..2 {
                            let (row, j) = (16 * tile + lane / 4 + 8 * half, 4 * step + lane % 4);
                            let at = (tile * t.steps + step) * BLOCK_BYTES + lane_offset(half, lane);
                            let got = &t.codes[at..at + 16];
                            if row < rows && j < cols / 32 {
                                assert_eq!(got, &q.packed[row * cols / 2 + 16 * j..][..16], "tile {tile} step {step} lane {lane} half {half}");
                            } else {
                                assert!(got.iter().all(|&b| b == 0), "padding at tile {tile} step {step} lane {lane} half {half}");
                            }
                        }
                    }
                }
                for grp in 0..gpr {
                    for r in 0..16 {
                        // Pairs: (r, r + 8) at positions 2r, 2r + 1 for r < 8.
                        let (row, at) = (16 * tile + r, (tile * gpr + grp) * 16 + if r < 8 { 2 * r } else { 2 * (r - 8) + 1 });
                        let want = |v: &[f16]| if row < rows { v[row * gpr + grp] } else { f16::ZERO };
                        assert_eq!(t.scales[at], want(&q.scales), "scale of row {row} group {grp}");
                        if scheme == Scheme::Asym {
                            assert_eq!(t.mins[at], want(&q.mins), "min of row {row} group {grp}");
                        }
                    }
                }
            }
            assert!(scheme == Scheme::Asym || t.mins.is_empty());
            // The step-major order holds the same blocks, step after step.
            let sm = step_major(&t);
            assert_eq!(sm.len(), t.codes.len());
            for tile in 0..t.tiles {
                for step in 0..t.steps {
                    let (a, b) = ((step * t.tiles + tile) * BLOCK_BYTES, (tile * t.steps + step) * BLOCK_BYTES);
                    assert_eq!(sm[a..a + BLOCK_BYTES], t.codes[b..b + BLOCK_BYTES], "tile {tile} step {step}");
                }
            }
        }
    }
}
