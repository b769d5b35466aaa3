//! The CPU models of the quant products: what each kernel computes, replayed in Rust (its
//! decode, which thread sums which weights in which order, where it rounds).
//!
//! - [`w4a16_cuda_cores`] and [`w8a16_blocks`]: the CUDA-core kernels (kernels/quant/w4a16.cu,
//!   w8a16.cu). They are also the CPU variants `cpu_w4a16` and `cpu_w8a16`: f32 FMAs with the
//!   codes decoded inside the dot products, summed in the kernel's order, which is not the f64
//!   reference they are checked against.
//! - [`w4a16_model`]: any W4A16 design through its [`Model`], the tensor-core ones by
//!   [`crate::quant::w4a16_mma_model`].
//!
//! Their index math lives inside the kernels' bodies and their decode in byte permutes, which
//! NVRTC does not fold to constants, so no probe reads them: the GPU quick run compares each
//! design's output with its model on integer data, where every product and partial sum is exact
//! and any difference is a decode or an index (the record's `model` field).

use super::variants::{pipelined_grid, splitk_slices, Layout, Model, W4Design, W8_ROWS};
use crate::quant::group::{GroupQuant, Scheme};
use crate::quant::{tiles, w4a16_mma_model};
use half::f16;
use rayon::prelude::*;

/// W4_WARPS of kernels/quant/w4a16.cu: a block's threads split K in 4-byte code words.
pub const W4_WARPS: usize = 4;
const W4_THREADS: usize = 32 * W4_WARPS;

/// codes8 in w4a16.cu: the 8 codes of a word (nibble t is weight t of the word) minus `bias`,
/// exact in f32 (the kernel's 2^23 + q minus 2^23 + bias).
pub fn codes8(w: u32, bias: f32) -> [f32; 8] {
    std::array::from_fn(|t| ((w >> (4 * t)) & 15) as f32 - bias)
}

/// warp_reduce_sum (kernels/common.cuh): the butterfly over lane offsets 16, 8, 4, 2, 1 (every
/// lane ends with the same bits; lane 0's is returned).
pub fn warp_reduce_sum(v: &[f32]) -> f32 {
    let mut v: [f32; 32] = v.try_into().expect("a warp is 32 lanes");
    for o in [16, 8, 4, 2, 1] {
        v = std::array::from_fn(|l| v[l] + v[l ^ o]);
    }
    v[0]
}

/// quant_w4a16_{sym,asym}_b{B}_f16 on the CPU, for any batch: Y (batch x rows) for X (batch x
/// cols). Thread t of a row's block takes code words t, t + 128, ...; per word and row of X an
/// f32 FMA chain over its 8 weights, scaled once (sym: acc = fma(dot, d, acc); asym:
/// acc = fma(d, dot, fma(m, sum x, acc))); each warp's butterfly, then the 4 warps in order, one
/// f16 rounding. Rows in parallel (the kernel's 4 rows per block share no sums).
pub fn w4a16_cuda_cores(q: &GroupQuant, x: &[f16], batch: usize) -> Vec<f16> {
    let bias = if q.scheme == Scheme::Sym { 8.0 } else { 0.0 };
    w4a16_cuda_cores_decoding(q, x, batch, |_, _, w| Some(codes8(w, bias)))
}

/// [`w4a16_cuda_cores`] with each code word decoded by `decode(row, word, bits)` (None: the
/// word left out).
pub(super) fn w4a16_cuda_cores_decoding(q: &GroupQuant, x: &[f16], batch: usize, decode: impl Fn(usize, usize, u32) -> Option<[f32; 8]> + Sync) -> Vec<f16> {
    let (n, k) = (q.rows, q.cols);
    let (nw, wpg, gpr) = (k / 8, q.group / 8, k / q.group);
    let asym = q.scheme == Scheme::Asym;
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let rows: Vec<Vec<f16>> = (0..n)
        .into_par_iter()
        .map(|r| {
            let codes = &q.packed[r * k / 2..(r + 1) * k / 2];
            // acc[b][thread]
            let mut acc = vec![[0f32; W4_THREADS]; batch];
            for t in 0..W4_THREADS {
                for w in (t..nw).step_by(W4_THREADS) {
                    let Some(wf) = decode(r, w, u32::from_le_bytes(codes[4 * w..4 * w + 4].try_into().expect("4 bytes"))) else { continue };
                    let (d, m) = (q.scales[r * gpr + w / wpg].to_f32(), if asym { q.mins[r * gpr + w / wpg].to_f32() } else { 0.0 });
                    for (b, acc) in acc.iter_mut().enumerate() {
                        let xs = &xf[b * k + 8 * w..b * k + 8 * w + 8];
                        let dot = xs.iter().zip(&wf).fold(0f32, |s, (&x, &w)| x.mul_add(w, s));
                        acc[t] = if asym {
                            let sx = xs.iter().fold(0f32, |s, &x| s + x);
                            d.mul_add(dot, m.mul_add(sx, acc[t]))
                        } else {
                            dot.mul_add(d, acc[t])
                        };
                    }
                }
            }
            acc.iter().map(|lanes| f16::from_f32(lanes.chunks_exact(32).fold(0f32, |s, warp| s + warp_reduce_sum(warp)))).collect()
        })
        .collect();
    (0..batch * n).map(|i| rows[i % n][i / n]).collect()
}

/// One Q8_0 block's 32 codes as f32 and its d (s8x4 and q8_block in w8a16.cu: exact).
pub fn q8_block(block: &[u8]) -> ([f32; 32], f32) {
    (std::array::from_fn(|e| block[2 + e] as i8 as f32), f16::from_le_bytes([block[0], block[1]]).to_f32())
}

/// quant_w8a16_b{B}_f16 on the CPU with `rows_per_warp` rows per warp, any batch: Y (f32, batch
/// x n) for Q8_0 blocks of an n x k matrix. A warp's rows are one stream of blocks taken 32 at a
/// time, lane l the run's block l: per row of X an f32 FMA chain over its 32 codes, times d; a
/// shuffle-down sum within each run of lanes on the same row (offsets 1, 2, .., 16, a lane adding
/// its neighbour's value when both are on one row); the row's first lane of the run adds the
/// result to the row's f32 accumulator. Warps in parallel.
pub fn w8a16_blocks(blocks: &[u8], (n, k): (usize, usize), x: &[f16], batch: usize, rows_per_warp: usize) -> Vec<f32> {
    w8a16_decoding(blocks, (n, k), x, batch, rows_per_warp, |_, _, block| q8_block(block))
}

/// [`w8a16_blocks`] with each block decoded by `decode(row, block of the row, bytes)`.
pub(super) fn w8a16_decoding(
    blocks: &[u8],
    (n, k): (usize, usize),
    x: &[f16],
    batch: usize,
    rows_per_warp: usize,
    decode: impl Fn(usize, usize, &[u8]) -> ([f32; 32], f32) + Sync,
) -> Vec<f32> {
    let kb = k / 32;
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    // acc[row within the warp][b] per warp
    let warps: Vec<Vec<Vec<f32>>> = (0..n.div_ceil(rows_per_warp))
        .into_par_iter()
        .map(|warp| {
            let row0 = warp * rows_per_warp;
            let rows = rows_per_warp.min(n - row0);
            let mut acc = vec![vec![0f32; batch]; rows];
            for run in (0..rows * kb).step_by(32) {
                // (row within the warp, or rows past them for an idle lane; partial sums per batch row)
                let mut lanes: Vec<(usize, Vec<f32>)> = (0..32)
                    .map(|l| {
                        let blk = run + l;
                        if blk >= rows * kb {
                            return (W8_ROWS, vec![0f32; batch]);
                        }
                        let (r, c) = (blk / kb, blk % kb);
                        let off = 34 * ((row0 + r) * kb + c);
                        let (codes, d) = decode(row0 + r, c, &blocks[off..off + 34]);
                        let part = (0..batch)
                            .map(|b| codes.iter().zip(&xf[b * k + 32 * c..b * k + 32 * c + 32]).fold(0f32, |s, (&w, &x)| x.mul_add(w, s)) * d)
                            .collect();
                        (r, part)
                    })
                    .collect();
                for o in [1, 2, 4, 8, 16] {
                    let before = lanes.clone();
                    for l in 0..32 - o {
                        if before[l + o].0 == before[l].0 {
                            for (p, q) in lanes[l].1.iter_mut().zip(&before[l + o].1) {
                                *p += q;
                            }
                        }
                    }
                }
                for l in 0..32 {
                    let row = lanes[l].0;
                    if row < rows && (l == 0 || lanes[l - 1].0 != row) {
                        for (a, p) in acc[row].iter_mut().zip(&lanes[l].1) {
                            *a += p;
                        }
                    }
                }
            }
            acc
        })
        .collect();
    let mut y = vec![0f32; batch * n];
    for (warp, acc) in warps.iter().enumerate() {
        for (r, row) in acc.iter().enumerate() {
            for (b, &v) in row.iter().enumerate() {
                y[b * n + warp * rows_per_warp + r] = v;
            }
        }
    }
    y
}

/// What `design` computes for group-wise weights `q` (in rows; the tile layouts are made here)
/// and `batch` rows of X, launched on a GPU of `sms` SMs (the pipelined design's grid).
pub fn w4a16_model(design: &W4Design, q: &GroupQuant, x: &[f16], batch: usize, sms: usize) -> Vec<f16> {
    match design.model {
        Model::CudaCores => w4a16_cuda_cores(q, x, batch),
        Model::Mma { post } => {
            let t = (design.layout != Layout::Rows).then(|| tiles::tile(q));
            w4a16_mma_model::w4a16_mma(q, t.as_ref(), (post, design.layout == Layout::StepMajor), x, batch, design.warps)
        }
        Model::SplitK => w4a16_mma_model::w4a16_mma_splitk(q, x, batch, splitk_slices(q.cols, batch)),
        Model::Pipelined => w4a16_mma_model::w4a16_mma_pipelined(q, x, batch, pipelined_grid(q.rows, sms)),
    }
}

/// Integer weights and activations for comparing a design with its model: random codes, scales
/// of 1/2, 1 or 2, mins of -8..-1 and X in -3..3, so every decoded weight, product and partial
/// sum is exact in f16 and f32 and the output is the exact product rounded once.
pub fn integer_problem(n: usize, k: usize, scheme: Scheme, group: usize, batch: usize, seed: u64) -> (GroupQuant, Vec<f16>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let groups = n * k / group;
    let q = GroupQuant {
        scheme,
        group,
        rows: n,
        cols: k,
        packed: (0..n * k / 2).map(|_| rng.random::<u8>()).collect(),
        scales: (0..groups).map(|_| f16::from_f32([0.5, 1.0, 2.0][rng.random_range(0..3)])).collect(),
        mins: if scheme == Scheme::Asym { (0..groups).map(|_| f16::from_f32(rng.random_range(-8i32..0) as f32)).collect() } else { vec![] },
    };
    let x = (0..batch * k).map(|_| f16::from_f32(rng.random_range(-3i32..=3) as f32)).collect();
    (q, x)
}

/// Integer Q8_0 blocks (codes -127..127, d of 1/2, 1 or 2) of an n x k matrix and X in -3..3:
/// every product and partial sum exact in f32, as [`integer_problem`].
pub fn integer_q8(n: usize, k: usize, batch: usize, seed: u64) -> (Vec<u8>, Vec<f16>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let blocks = (0..n * k / 32)
        .flat_map(|_| {
            let d = f16::from_f32([0.5, 1.0, 2.0][rng.random_range(0..3)]).to_le_bytes();
            d.into_iter().chain((0..32).map(|_| rng.random_range(-127i8..=127) as u8)).collect::<Vec<_>>()
        })
        .collect();
    let x = (0..batch * k).map(|_| f16::from_f32(rng.random_range(-3i32..=3) as f32)).collect();
    (blocks, x)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::quant::reference::{check_w4a16, reference_magnitudes, reference_w4a16, w4a16_bound, Quantized};
    use crate::ops::quant::variants::{w4_designs, BATCHES};
    use crate::quant::group;
    use rand::{Rng, SeedableRng};

    pub(crate) fn random_quant(rng: &mut impl Rng, n: usize, k: usize, scheme: Scheme, group: usize) -> GroupQuant {
        let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0) / (k as f32).sqrt()).collect();
        group::quantize(&w, n, k, scheme, group).unwrap()
    }

    /// Every design's output by its model (on a GPU of 132 SMs), then split-K with more and
    /// fewer slices than one load round asks for (warps with no step, several rounds per warp)
    /// and pipelined grids that give a block several tiles (the ring across tile boundaries).
    fn outputs(q: &GroupQuant, x: &[f16], b: usize) -> Vec<(String, Vec<f16>)> {
        let mut out: Vec<_> = w4_designs().map(|(name, d)| (name.to_string(), w4a16_model(&d, q, x, b, 132))).collect();
        out.extend([1, 2, 3, 7].map(|s| (format!("split-K over {s}"), w4a16_mma_model::w4a16_mma_splitk(q, x, b, s))));
        out.extend([1, 2, 3].map(|g| (format!("pipelined on {g} blocks"), w4a16_mma_model::w4a16_mma_pipelined(q, x, b, g))));
        out
    }

    /// Odd shapes (a partial tile, partial steps, warps with no step, several load rounds per
    /// warp, groups of 32 to 256 including 96, which advances the group index unevenly, K not a
    /// multiple of 128, post-scaled steps at sym g128 and g256) at every batch: every design's
    /// model passes the experiment's own check.
    #[test]
    fn every_design_model_passes_the_w4a16_check_on_odd_shapes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let shapes = [
            (37, 992, Scheme::Asym, 32),
            (37, 992, Scheme::Sym, 32),
            (40, 576, Scheme::Sym, 64),
            (21, 1408, Scheme::Asym, 128),
            (24, 4096, Scheme::Sym, 128),
            (9, 1536, Scheme::Sym, 96),
            (7, 2048, Scheme::Asym, 256),
            (11, 2560, Scheme::Sym, 256),
            (5, 96, Scheme::Sym, 96),
            (37, 4064, Scheme::Sym, 32),
            (19, 11008, Scheme::Asym, 128),
        ];
        for (n, k, scheme, group) in shapes {
            let q = random_quant(&mut rng, n, k, scheme, group);
            let quantized = Quantized::Group(q.clone());
            let (wd, mags) = (q.dequantize(), reference_magnitudes(&quantized));
            for &b in BATCHES {
                let x: Vec<f16> = (0..b * k).map(|_| f16::from_f32(rng.random_range(-2.0f32..2.0))).collect();
                let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
                let expected = reference_w4a16(&xf, &wd, b, n, k);
                let scale = reference_w4a16(&xf.iter().map(|v| v.abs()).collect::<Vec<_>>(), &mags, b, n, k);
                for (name, y) in outputs(&q, &x, b) {
                    let e = check_w4a16(&y, &expected, &scale, w4a16_bound(k));
                    assert!(e.passed(), "{name}: N={n} K={k} {scheme:?} g{group} batch {b}: {e:?}");
                }
            }
        }
    }

    /// On integer weights and activations ([`integer_problem`]) every product and partial sum is
    /// exact, so every design's model must give the exact product rounded once to f16, bit for
    /// bit: what the GPU quick run holds the kernels to.
    #[test]
    fn every_design_model_is_exact_on_integer_data() {
        for (i, (n, k, scheme, group)) in [(37, 992, Scheme::Asym, 32), (19, 640, Scheme::Sym, 128), (9, 1536, Scheme::Asym, 96), (7, 2048, Scheme::Sym, 256), (21, 4064, Scheme::Asym, 32)].into_iter().enumerate() {
            for &b in BATCHES {
                let (q, x) = integer_problem(n, k, scheme, group, b, i as u64);
                let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
                let expected: Vec<u16> = reference_w4a16(&xf, &q.dequantize(), b, n, k).iter().map(|&v| f16::from_f64(v).to_bits()).collect();
                for (name, y) in outputs(&q, &x, b) {
                    let first = y.iter().zip(&expected).position(|(g, e)| g.to_bits() != *e);
                    assert!(first.is_none(), "{name}: N={n} K={k} {scheme:?} g{group} batch {b}: first difference at {first:?}");
                }
            }
        }
    }

    /// The CUDA-core model's own pieces: codes8 puts nibble t at weight t, exactly q - bias; the
    /// butterfly adds lanes pairwise (2^24 and 31 ones: the one beside 2^24 is lost, the other
    /// 30 meet in pairs first and survive; summed in order, all 31 are lost).
    #[test]
    fn the_cuda_core_decode_and_butterfly_are_the_kernels() {
        assert_eq!(codes8(0x7654_3210, 8.0), [-8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0]);
        assert_eq!(codes8(0xFEDC_BA98, 0.0), [8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]);
        let mut v = [1f32; 32];
        v[0] = 16_777_216.0;
        assert_eq!(warp_reduce_sum(&v), 16_777_246.0);
        assert_eq!(v.iter().fold(0f32, |s, &x| s + x), 16_777_216.0);
    }

    /// The W8A16 model on integer data at every rows-per-warp a launch picks, on shapes whose
    /// runs of 32 blocks start and end inside rows: the exact product, bit for bit.
    #[test]
    fn the_w8a16_model_is_exact_on_integer_data() {
        use crate::ops::quant::reference::reference_dequantize_blocks;
        use crate::quant::ggml::Block;
        for (n, k) in [(37, 96), (70, 576), (5, 1152)] {
            for batch in [1, 3, 16] {
                let (blocks, x) = integer_q8(n, k, batch, 7);
                let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
                let want: Vec<u32> = reference_w4a16(&xf, &reference_dequantize_blocks(Block::Q8_0, &blocks), batch, n, k).iter().map(|&v| (v as f32).to_bits()).collect();
                for rows_per_warp in [1, 2, 4, 8, 16] {
                    let got: Vec<u32> = w8a16_blocks(&blocks, (n, k), &x, batch, rows_per_warp).iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{n} x {k} batch {batch}, {rows_per_warp} rows per warp");
                }
            }
        }
    }
}
