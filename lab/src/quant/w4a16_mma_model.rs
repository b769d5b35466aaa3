//! Over 600 lines on purpose: one CPU mirror of the W4A16 tensor-core kernels' index math, read
//! top to bottom beside the CUDA it follows (kernels/quant/w4a16_mma*.cu).
//!
//! A CPU model of kernels/quant/'s `w4a16_mma`, `w4a16_mma_splitk` and `w4a16_mma_pipelined` kernels, written step
//! by step after the CUDA: the warps' (and split-K blocks') slices of K, the workspace of
//! per-slice partials and the order they are added in, which lane loads which 16-byte chunk and scale, the f16 decode of the
//! code words, the byte permutes that pair X, the two accumulator chains and the reduction over
//! warps in warp order. `mma.sync.m16n8k16` itself is computed from the PTX ISA's fragment
//! layouts, independently of the kernel's K order, so a lane or nibble that feeds the wrong k
//! gives a wrong sum. There is no GPU in the test suite; this is what checks the index math.

// Lanes and registers are indexed as the kernel indexes them.
#![allow(clippy::needless_range_loop)]

use super::group::{GroupQuant, Scheme};
use super::tiles::Tiles;
use half::f16;

/// MMA_WARPS and MMA_ROWS of the kernels.
pub const MMA_WARPS: usize = 4;
pub const MMA_ROWS: usize = 16;
/// PIPE_WARPS of the kernels; the other PIPE_ constants live beside the launcher.
pub const PIPE_WARPS: usize = 8;
use crate::ops::quant::variants::{PIPE_CHUNKS, PIPE_STAGES, PIPE_SVECS};

fn half(v: u32, i: u32) -> f64 {
    f16::from_bits((v >> (16 * i)) as u16).to_f64()
}

/// fma.rn.f16x2: each half a * b + c, rounded once (exact in f64 for the values used here).
pub fn fma_f16x2(a: u32, b: u32, c: u32) -> u32 {
    let r = |i| f16::from_f64(half(a, i) * half(b, i) + half(c, i)).to_bits() as u32;
    r(0) | (r(1) << 16)
}

/// CUDA's __byte_perm(a, b, s): byte i of the result is byte (s >> 4i) & 7 of b:a.
pub fn byte_perm(a: u32, b: u32, s: u32) -> u32 {
    let ab = a as u64 | ((b as u64) << 32);
    (0..4).map(|i| (((ab >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) as u32) << (8 * i)).fold(0, |acc, v| acc | v)
}

/// w2_f16x2<HI, ASYM>(w, d2, m2).
pub fn w2_f16x2(hi: bool, asym: bool, w: u32, d2: u32, m2: u32) -> u32 {
    let v = (w & if hi { 0x00F0_00F0 } else { 0x000F_000F }) | 0x6400_6400;
    let mul = if hi { 0x2C00_2C00 } else { 0x3C00_3C00 };
    let off = match (hi, asym) {
        (true, true) => 0xD400_D400,
        (true, false) => 0xD480_D480,
        (false, true) => 0xE400_E400,
        (false, false) => 0xE408_E408,
    };
    fma_f16x2(fma_f16x2(v, mul, off), d2, m2)
}

/// One warp's mma.sync.m16n8k16.row.col.f32.f16.f16.f32 from the PTX ISA fragment layouts
/// (g = lane / 4, c = lane % 4; halves low first): A a_i at row g + 8 ((i / 2) % 2), col
/// 2c + i % 2 + 8 (i / 4); B b_i at row (k) 2c + i % 2 + 8 (i / 2), col g; C c_i at row
/// g + 8 (i / 2), col 2c + i % 2. Sums in f32, k in order.
pub fn mma_16816(acc: &mut [[f32; 4]; 32], a: &[[u32; 4]; 32], b: &[[u32; 2]; 32]) {
    let mut am = [[0f32; 16]; 16];
    let mut bm = [[0f32; 8]; 16];
    for lane in 0..32 {
        let (g, c) = (lane / 4, lane % 4);
        for i in 0..8 {
            am[g + 8 * ((i / 2) % 2)][2 * c + i % 2 + 8 * (i / 4)] = half(a[lane][i / 2], (i % 2) as u32) as f32;
        }
        for i in 0..4 {
            bm[2 * c + i % 2 + 8 * (i / 2)][g] = half(b[lane][i / 2], (i % 2) as u32) as f32;
        }
    }
    for lane in 0..32 {
        let (g, c) = (lane / 4, lane % 4);
        for i in 0..4 {
            let (r, col) = (g + 8 * (i / 2), 2 * c + i % 2);
            acc[lane][i] += (0..16).map(|k| am[r][k] * bm[k][col]).sum::<f32>();
        }
    }
}

/// MmaSteps<B>::U in the kernels: steps a warp keeps in flight.
pub fn steps_in_flight(batch: usize) -> usize {
    if batch > 8 {
        3
    } else {
        4
    }
}

/// One lane's registers for a warp step: code chunks of rows g and g + 8, scale (min) splats,
/// chunk index.
struct Lanes<'a> {
    cg: &'a [[u32; 4]; 32],
    ch: &'a [[u32; 4]; 32],
    dg: &'a [u32; 32],
    dh: &'a [u32; 32],
    mg: &'a [u32; 32],
    mh: &'a [u32; 32],
    j: &'a [usize; 32],
}

/// Accumulators acc[nh][chain][lane][i] of a warp.
type Acc = Vec<Vec<[[f32; 4]; 32]>>;

fn new_acc(batch: usize) -> Acc {
    let nh_count = if batch > 8 { 2 } else { 1 };
    vec![vec![[[0f32; 4]; 32]; if nh_count == 1 { 2 } else { 1 }]; nh_count]
}

/// xv[nh][lane]: 16 words of X (the 32 halves of the lane's chunk; zeros past the batch or K).
fn x_words(r: &Lanes, x: &[f16], batch: usize, k: usize, nh_count: usize) -> Vec<Vec<[u32; 16]>> {
    let nchunks = k / 32;
    (0..nh_count)
        .map(|nh| {
            (0..32)
                .map(|l| {
                    let b = l / 4 + 8 * nh;
                    let ok = b < batch && r.j[l] < nchunks;
                    std::array::from_fn(|w| {
                        let e = b * k + 32 * r.j[l] + 2 * w;
                        if ok { x[e].to_bits() as u32 | ((x[e + 1].to_bits() as u32) << 16) } else { 0 }
                    })
                })
                .collect()
        })
        .collect()
}

/// w4a16_mma_step in the kernels: X of each lane's chunk, the decode and the MMAs of one step.
fn mma_step(acc: &mut Acc, r: &Lanes, x: &[f16], batch: usize, k: usize, asym: bool) {
    let nh_count = acc.len();
    let chains = acc[0].len();
    let xv = x_words(r, x, batch, k, nh_count);
    for i in 0..4 {
        for h in 0..2 {
            let mut a = [[0u32; 4]; 32];
            for l in 0..32 {
                let wg = r.cg[l][i] >> (8 * h);
                let wh = r.ch[l][i] >> (8 * h);
                a[l] = [
                    w2_f16x2(false, asym, wg, r.dg[l], r.mg[l]),
                    w2_f16x2(false, asym, wh, r.dh[l], r.mh[l]),
                    w2_f16x2(true, asym, wg, r.dg[l], r.mg[l]),
                    w2_f16x2(true, asym, wh, r.dh[l], r.mh[l]),
                ];
            }
            for (nh, acc_nh) in acc.iter_mut().enumerate() {
                let b: [[u32; 2]; 32] = std::array::from_fn(|l| {
                    let xa = xv[nh][l][4 * i + h];
                    let xb = xv[nh][l][4 * i + h + 2];
                    [byte_perm(xa, xb, 0x5410), byte_perm(xa, xb, 0x7632)]
                });
                mma_16816(&mut acc_nh[h % chains], &a, &b);
            }
        }
    }
}

/// w4a16_mma_step_post in the kernels (symmetric, one group per step): the codes as the LOP3 makes
/// them (1024 + q, 1024 + 16q), X's k 8..15 half times 1/16, a second MMA on the constant A
/// (1032 | 1152), and acc += d (S - C) with d from the lane's scale pair (r.dg).
fn mma_step_post(acc: &mut Acc, r: &Lanes, x: &[f16], batch: usize, k: usize) {
    let nh_count = acc.len();
    let xv = x_words(r, x, batch, k, nh_count);
    let lop = |w: u32, hi: bool| (w & if hi { 0x00F0_00F0 } else { 0x000F_000F }) | 0x6400_6400;
    let constant: [[u32; 4]; 32] = [[0x6408_6408, 0x6408_6408, 0x6480_6480, 0x6480_6480]; 32];
    let mut sum = vec![[[0f32; 4]; 32]; nh_count];
    let mut cor = sum.clone();
    for i in 0..4 {
        for h in 0..2 {
            let a: [[u32; 4]; 32] = std::array::from_fn(|l| {
                let (wg, wh) = (r.cg[l][i] >> (8 * h), r.ch[l][i] >> (8 * h));
                [lop(wg, false), lop(wh, false), lop(wg, true), lop(wh, true)]
            });
            for nh in 0..nh_count {
                let b: [[u32; 2]; 32] = std::array::from_fn(|l| {
                    let (xa, xb) = (xv[nh][l][4 * i + h], xv[nh][l][4 * i + h + 2]);
                    [byte_perm(xa, xb, 0x5410), fma_f16x2(byte_perm(xa, xb, 0x7632), 0x2C00_2C00, 0)]
                });
                mma_16816(&mut sum[nh], &a, &b);
                mma_16816(&mut cor[nh], &constant, &b);
            }
        }
    }
    for nh in 0..nh_count {
        for l in 0..32 {
            let (dg, dh) = (half(r.dg[l], 0) as f32, half(r.dg[l], 1) as f32);
            for i in 0..4 {
                let d = if i < 2 { dg } else { dh };
                acc[nh][0][l][i] = d.mul_add(sum[nh][l][i] - cor[nh][l][i], acc[nh][0][l][i]);
            }
        }
    }
}

/// mma_store_part in the kernels: the C fragments as part[batch][row], the chains added.
fn store_part(acc: &Acc, part_w: &mut [[f32; MMA_ROWS]], batch: usize) {
    let chains = acc[0].len();
    for (nh, acc_nh) in acc.iter().enumerate() {
        for l in 0..32 {
            let (g, c) = (l / 4, l % 4);
            for i in 0..4 {
                let b = 8 * nh + 2 * c + (i & 1);
                if b < batch {
                    part_w[b][g + 8 * (i >> 1)] = if chains == 2 { acc_nh[0][l][i] + acc_nh[chains - 1][l][i] } else { acc_nh[0][l][i] };
                }
            }
        }
    }
}

/// w4a16_mma_warp in the kernels: one warp's products over steps [t0, t1) of the tile at row0, as
/// part[batch][row] (the C fragment after the two chains are added).
/// With `tiles`, the codes and scales are read from the tile layout at the kernel's TILED offsets.
/// With `post` (tiled, symmetric, group % 128 == 0), the step is w4a16_mma_step_post's.
/// The warp's steps are t0, t0 + stride, ... below t1.
#[allow(clippy::too_many_arguments)]
fn mma_warp(q: &GroupQuant, tiles: Option<&Tiles>, post: bool, x: &[f16], batch: usize, row0: usize, (t0, t1, stride): (usize, usize, usize)) -> Vec<[f32; MMA_ROWS]> {
    let (n_rows, k, group) = (q.rows, q.cols, q.group);
    let asym = q.scheme == Scheme::Asym;
    let mins = if asym { &q.mins } else { &q.scales };
    let u_steps = steps_in_flight(batch);
    let (nchunks, cpg, gpr) = (k / 32, group / 32, k / group);
    let (gstep, rstep) = (4 * stride / cpg, 4 * stride % cpg);
    let chunk = |row: usize, j: usize| -> [u32; 4] {
        let base = row * (k / 2) + 16 * j;
        std::array::from_fn(|i| u32::from_le_bytes(q.packed[base + 4 * i..base + 4 * i + 4].try_into().unwrap()))
    };
    let tile = row0 / MMA_ROWS;
    // the kernel's qt + 64 (t + u) (+ 32), in bytes, for lane l.
    let tiled_chunk = |t: &Tiles, step: usize, half: usize, l: usize| -> [u32; 4] {
        let base = ((tile * t.steps + step) * 64 + 32 * half + l) * 16;
        std::array::from_fn(|i| u32::from_le_bytes(t.codes[base + 4 * i..base + 4 * i + 4].try_into().unwrap()))
    };
    let splat = |v: &[f16], row: usize, grp: usize, ok: bool| -> u32 {
        let s = if ok { v[row * gpr + grp].to_bits() as u32 } else { 0 };
        s | (s << 16)
    };
    // the kernel's sp (mp) + 8 grp in the tile layout: the pair word of rows g and g + 8, as
    // (dg, dh) splats (__byte_perm 0x1010 and 0x3232).
    let tiled_pair = |v: &[f16], g: usize, grp: usize, ok: bool| -> (u32, u32) {
        let w = if ok { u32::from_le_bytes(std::array::from_fn(|i| v[tile * gpr * MMA_ROWS + 16 * grp + 2 * g + i / 2].to_bits().to_le_bytes()[i % 2])) } else { 0 };
        (byte_perm(w, 0, 0x1010), byte_perm(w, 0, 0x3232))
    };
    let mut part_w = vec![[0f32; MMA_ROWS]; batch];
    // Per-lane registers.
    let rg: [usize; 32] = std::array::from_fn(|l| (row0 + l / 4).min(n_rows - 1));
    let rh: [usize; 32] = std::array::from_fn(|l| (row0 + l / 4 + 8).min(n_rows - 1));
    let mut j: [usize; 32] = std::array::from_fn(|l| 4 * t0 + l % 4);
    let mut grp: [usize; 32] = std::array::from_fn(|l| j[l] / cpg);
    let mut rem: [usize; 32] = std::array::from_fn(|l| j[l] % cpg);
    let mut acc = new_acc(batch);
    let mut t = t0;
    while t < t1 {
        let mut jj = vec![[0usize; 32]; u_steps];
        let mut cg = vec![[[0u32; 4]; 32]; u_steps];
        let mut ch = cg.clone();
        let (mut dg, mut dh, mut mg, mut mh) = (vec![[0u32; 32]; u_steps], vec![[0u32; 32]; u_steps], vec![[0u32; 32]; u_steps], vec![[0u32; 32]; u_steps]);
        for u in 0..u_steps {
            let step = t + u * stride;
            for l in 0..32 {
                jj[u][l] = j[l];
                let ok = step < t1 && j[l] < nchunks;
                if let Some(tl) = tiles {
                    let g = l / 4;
                    if ok {
                        cg[u][l] = tiled_chunk(tl, step, 0, l);
                        ch[u][l] = tiled_chunk(tl, step, 1, l);
                    }
                    (dg[u][l], dh[u][l]) = tiled_pair(&tl.scales, g, grp[l], ok);
                    if post {
                        // The raw pair: the low half of each splat, joined.
                        dg[u][l] = (dg[u][l] & 0xFFFF) | (dh[u][l] << 16);
                    }
                    (mg[u][l], mh[u][l]) = if asym { tiled_pair(&tl.mins, g, grp[l], ok) } else { (0, 0) };
                } else {
                    if ok {
                        cg[u][l] = chunk(rg[l], j[l]);
                        ch[u][l] = chunk(rh[l], j[l]);
                    }
                    dg[u][l] = splat(&q.scales, rg[l], grp[l], ok);
                    dh[u][l] = splat(&q.scales, rh[l], grp[l], ok);
                    mg[u][l] = if asym { splat(mins, rg[l], grp[l], ok) } else { 0 };
                    mh[u][l] = if asym { splat(mins, rh[l], grp[l], ok) } else { 0 };
                }
                j[l] += 4 * stride;
                grp[l] += gstep;
                rem[l] += rstep;
                if rem[l] >= cpg {
                    rem[l] -= cpg;
                    grp[l] += 1;
                }
            }
        }
        for u in 0..u_steps {
            if t + u * stride >= t1 {
                break;
            }
            let lanes = Lanes { cg: &cg[u], ch: &ch[u], dg: &dg[u], dh: &dh[u], mg: &mg[u], mh: &mh[u], j: &jj[u] };
            if post {
                mma_step_post(&mut acc, &lanes, x, batch, k);
            } else {
                mma_step(&mut acc, &lanes, x, batch, k, asym);
            }
        }
        t += u_steps * stride;
    }
    store_part(&acc, &mut part_w, batch);
    part_w
}

/// mma_block_sum in the kernels: a block's 4 warps summed in warp order, for each (batch, row).
fn block_sum(part: &[Vec<[f32; MMA_ROWS]>], b: usize, r: usize) -> f32 {
    let mut s = 0f32;
    for p in part {
        s += p[b][r];
    }
    s
}

/// quant_w4a16_mma_{sym,asym}_b{batch}_f16 on the CPU: Y (batch x rows) for X (batch x cols),
/// K split over `warps` warps per tile (4; 8 in w4a16_mma_occ8 and w4a16_mma_tiled(_rolling),
/// which read `tiles`). The steps a warp keeps in flight, in rounds or rolling, change when it
/// loads, not what it sums.
/// With `post`, w4a16_mma_tiled_post: the post-scaled step where the kernel takes it (tiled,
/// symmetric, group % 128 == 0), w4a16_mma_tiled's elsewhere. With `sweep` too,
/// w4a16_mma_tiled_sweep (and w4a16_mma_tiled_bulk, which sums the same steps in the same
/// order): warp w takes steps w, w + warps, ... instead of a contiguous slice.
pub fn w4a16_mma(q: &GroupQuant, tiles: Option<&Tiles>, (post, sweep): (bool, bool), x: &[f16], batch: usize, warps: usize) -> Vec<f16> {
    let post = post && tiles.is_some() && q.scheme == Scheme::Sym && q.group.is_multiple_of(128);
    let (n_rows, k) = (q.rows, q.cols);
    let nsteps = (k / 32).div_ceil(4);
    let per = nsteps.div_ceil(warps);
    let mut y = vec![f16::ZERO; batch * n_rows];
    for block in 0..n_rows.div_ceil(MMA_ROWS) {
        let row0 = block * MMA_ROWS;
        let part: Vec<_> = (0..warps)
            .map(|warp| {
                let slice = if sweep { (warp, nsteps, warps) } else { (warp * per, (warp * per + per).min(nsteps), 1) };
                mma_warp(q, tiles, post, x, batch, row0, slice)
            })
            .collect();
        for i in 0..batch * MMA_ROWS {
            let (b, r) = (i / MMA_ROWS, i % MMA_ROWS);
            if row0 + r < n_rows {
                y[b * n_rows + row0 + r] = f16::from_f32(block_sum(&part, b, r));
            }
        }
    }
    y
}

/// quant_w4a16_mma_splitk_{sym,asym}_b{batch}_f16 on the CPU with `slices` blocks per tile
/// (grid.y): block (tile, s), warp w owns steps [(4s + w) per, + per), per = ceil(nsteps / 4S);
/// each block's warp-order sum goes to the workspace ws[s][b][row]; the tile's last block adds
/// the slices in slice order (one slice: the block writes Y itself). Every workspace entry must
/// be written exactly once before it is read.
pub fn w4a16_mma_splitk(q: &GroupQuant, x: &[f16], batch: usize, slices: usize) -> Vec<f16> {
    let (n_rows, k) = (q.rows, q.cols);
    let nsteps = (k / 32).div_ceil(4);
    let per = nsteps.div_ceil(MMA_WARPS * slices);
    let mut y = vec![f16::ZERO; batch * n_rows];
    let mut ws = vec![f32::NAN; slices * batch * n_rows];
    for block in 0..n_rows.div_ceil(MMA_ROWS) {
        let row0 = block * MMA_ROWS;
        for s in 0..slices {
            let part: Vec<_> = (0..MMA_WARPS)
                .map(|warp| {
                    let t0 = (s * MMA_WARPS + warp) * per;
                    mma_warp(q, None, false, x, batch, row0, (t0, (t0 + per).min(nsteps), 1))
                })
                .collect();
            for i in 0..batch * MMA_ROWS {
                let (b, r) = (i / MMA_ROWS, i % MMA_ROWS);
                if row0 + r < n_rows {
                    if slices == 1 {
                        y[b * n_rows + row0 + r] = f16::from_f32(block_sum(&part, b, r));
                    } else {
                        let e = &mut ws[(s * batch + b) * n_rows + row0 + r];
                        assert!(e.is_nan(), "slice {s} batch {b} row {} written twice", row0 + r);
                        *e = block_sum(&part, b, r);
                    }
                }
            }
        }
        if slices > 1 {
            for i in 0..batch * MMA_ROWS {
                let (b, r) = (i / MMA_ROWS, i % MMA_ROWS);
                if row0 + r < n_rows {
                    let mut acc = 0f32;
                    for v in 0..slices {
                        acc += ws[(v * batch + b) * n_rows + row0 + r];
                    }
                    y[b * n_rows + row0 + r] = f16::from_f32(acc);
                }
            }
        }
    }
    y
}

/// pipe_code_slot in the kernels: row r's chunk jl of a stage, XOR-swizzled by the row's parity.
pub fn pipe_code_slot(r: usize, jl: usize) -> usize {
    r * PIPE_CHUNKS + (jl ^ ((r & 1) << 2))
}

/// pipe_scale_base in the kernels: the first half of the 16 B vector holding row's group g0.
pub fn pipe_scale_base(row: usize, gpr: usize, g0: usize) -> usize {
    (row * gpr + g0) / 8 * 8
}

/// quant_w4a16_mma_pipelined_{sym,asym}_b{batch}_f16 on the CPU with `grid` blocks: each block
/// walks the stages of its contiguous tiles through a ring of PIPE_STAGES slots, issuing stage
/// p + PIPE_STAGES - 1 into its slot before decoding stage p (the slot freed by stage p - 1),
/// with the copies' zero fill, the swizzled code slots and the per-row scale windows; warp w
/// decodes steps w, w + PIPE_WARPS, .. of each stage; the warps meet in warp order at a tile's
/// last stage. A slot read before it was written, or a scale outside its window, panics.
pub fn w4a16_mma_pipelined(q: &GroupQuant, x: &[f16], batch: usize, grid: usize) -> Vec<f16> {
    let (n_rows, k, group) = (q.rows, q.cols, q.group);
    let asym = q.scheme == Scheme::Asym;
    let (nchunks, cpg, gpr) = (k / 32, group / 32, k / group);
    let nst = nchunks.div_ceil(PIPE_CHUNKS);
    let tiles = n_rows.div_ceil(MMA_ROWS);
    let tpb = tiles.div_ceil(grid);
    let tables = if asym { 2 } else { 1 };
    let codes = MMA_ROWS * PIPE_CHUNKS;
    let vecs = codes + tables * MMA_ROWS * PIPE_SVECS;
    let scale_bytes = |v: &[f16]| -> Vec<u8> { v.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect() };
    let tables_b = [scale_bytes(&q.scales), scale_bytes(if asym { &q.mins } else { &q.scales })];
    let mut y = vec![f16::ZERO; batch * n_rows];
    let mut written = vec![false; batch * n_rows];
    for block in 0..grid {
        let tile0 = block * tpb;
        let ntiles = tpb.min(tiles.saturating_sub(tile0));
        let total = ntiles * nst;
        // The ring: None until a copy lands (every copy lands before its stage is read here).
        let mut ring: Vec<Option<[u8; 16]>> = vec![None; PIPE_STAGES * vecs];
        let issue = |ring: &mut Vec<Option<[u8; 16]>>, p: usize| {
            let (row0, s0) = ((tile0 + p / nst) * MMA_ROWS, p % nst * PIPE_CHUNKS);
            let st = p % PIPE_STAGES * vecs;
            for i in 0..codes {
                let (r, jl) = (i / PIPE_CHUNKS, i % PIPE_CHUNKS);
                let (j, row) = (s0 + jl, (row0 + r).min(n_rows - 1));
                let mut v = [0u8; 16];
                if j < nchunks {
                    let base = row * (k / 2) + 16 * j;
                    v.copy_from_slice(&q.packed[base..base + 16]);
                }
                ring[st + pipe_code_slot(r, jl)] = Some(v);
            }
            let g0 = s0 / cpg;
            for i in 0..vecs - codes {
                let (which, r, v) = (i / (MMA_ROWS * PIPE_SVECS), i / PIPE_SVECS % MMA_ROWS, i % PIPE_SVECS);
                let row = (row0 + r).min(n_rows - 1);
                let off = 2 * pipe_scale_base(row, gpr, g0) + 16 * v;
                let src = &tables_b[which];
                let mut out = [0u8; 16];
                for (b, o) in out.iter_mut().enumerate() {
                    if off + b < src.len() {
                        *o = src[off + b];
                    }
                }
                ring[st + codes + i] = Some(out);
            }
        };
        for p in 0..(PIPE_STAGES - 1).min(total) {
            issue(&mut ring, p);
        }
        let mut accs: Vec<Acc> = (0..PIPE_WARPS).map(|_| new_acc(batch)).collect();
        for p in 0..total {
            let qn = p + PIPE_STAGES - 1;
            if qn < total {
                issue(&mut ring, qn);
            }
            let st = p % PIPE_STAGES * vecs;
            let (row0, s0) = ((tile0 + p / nst) * MMA_ROWS, p % nst * PIPE_CHUNKS);
            let g0 = s0 / cpg;
            let read = |slot: usize| -> [u32; 4] {
                let v = ring[st + slot].unwrap_or_else(|| panic!("stage {p}: slot {slot} read before it was written"));
                std::array::from_fn(|i| u32::from_le_bytes(v[4 * i..4 * i + 4].try_into().unwrap()))
            };
            let splat = |which: usize, r: usize, row: usize, grp: usize, ok: bool| -> u32 {
                if !ok {
                    return 0;
                }
                let h = row * gpr + grp - pipe_scale_base(row, gpr, g0);
                assert!(h < 8 * PIPE_SVECS, "scale {h} outside the window of row {row}, stage {p}");
                let v = read(codes + which * MMA_ROWS * PIPE_SVECS + r * PIPE_SVECS + h / 8);
                let s = (v[h % 8 / 2] >> (16 * (h % 2))) & 0xFFFF;
                s | (s << 16)
            };
            for (warp, acc) in accs.iter_mut().enumerate() {
                let mut tl = warp;
                while tl < PIPE_CHUNKS / 4 && s0 + 4 * tl < nchunks {
                    let mut l = (Box::new([[0u32; 4]; 32]), Box::new([[0u32; 4]; 32]), [0u32; 32], [0u32; 32], [0u32; 32], [0u32; 32], [0usize; 32]);
                    for lane in 0..32 {
                        let (g, c) = (lane / 4, lane % 4);
                        let (rg, rh) = ((row0 + g).min(n_rows - 1), (row0 + g + 8).min(n_rows - 1));
                        let jl = 4 * tl + c;
                        let j = s0 + jl;
                        let (grp, ok) = (j / cpg, j < nchunks);
                        l.0[lane] = read(pipe_code_slot(g, jl));
                        l.1[lane] = read(pipe_code_slot(g + 8, jl));
                        l.2[lane] = splat(0, g, rg, grp, ok);
                        l.3[lane] = splat(0, g + 8, rh, grp, ok);
                        l.4[lane] = if asym { splat(1, g, rg, grp, ok) } else { 0 };
                        l.5[lane] = if asym { splat(1, g + 8, rh, grp, ok) } else { 0 };
                        l.6[lane] = j;
                    }
                    let lanes = Lanes { cg: &l.0, ch: &l.1, dg: &l.2, dh: &l.3, mg: &l.4, mh: &l.5, j: &l.6 };
                    mma_step(acc, &lanes, x, batch, k, asym);
                    tl += PIPE_WARPS;
                }
            }
            if p % nst == nst - 1 {
                let mut part = vec![vec![[0f32; MMA_ROWS]; batch]; PIPE_WARPS];
                for (w, acc) in accs.iter_mut().enumerate() {
                    store_part(acc, &mut part[w], batch);
                    *acc = new_acc(batch);
                }
                for b in 0..batch {
                    for r in 0..MMA_ROWS {
                        if row0 + r < n_rows {
                            let e = b * n_rows + row0 + r;
                            assert!(!written[e], "batch {b} row {} written twice", row0 + r);
                            written[e] = true;
                            y[e] = f16::from_f32(block_sum(&part, b, r));
                        }
                    }
                }
            }
        }
    }
    assert!(written.iter().all(|&w| w), "an output was never written");
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::quant::variants::{mma_steps_in_flight, splitk_slices, BATCHES};
    use crate::ops::quant::models::tests::random_quant;
    use crate::quant::tiles::tile;
    use rand::SeedableRng;

    #[test]
    fn the_helpers_do_what_the_cuda_intrinsics_do() {
        assert_eq!(byte_perm(0x3322_1100, 0x7766_5544, 0x5410), 0x5544_1100);
        assert_eq!(byte_perm(0x3322_1100, 0x7766_5544, 0x7632), 0x7766_3322);
        for (bits, v) in [(0x3C00u16, 1.0), (0x2C00, 1.0 / 16.0), (0xE408, -1032.0), (0xE400, -1024.0), (0xD480, -72.0), (0xD400, -64.0), (0x6400, 1024.0)] {
            assert_eq!(f16::from_bits(bits).to_f64(), v, "{bits:#x}");
        }
        // Every code in every nibble decodes to q - 8 (sym) or q (asym) exactly, d = 1, m = 0.
        let one = 0x3C00_3C00;
        for q in 0..16u32 {
            let w = q * 0x1111_1111;
            for asym in [false, true] {
                let want = if asym { q as f64 } else { q as f64 - 8.0 };
                for (hi, shift) in [(false, 0), (true, 0), (false, 8), (true, 8)] {
                    let p = w2_f16x2(hi, asym, w >> shift, one, 0);
                    assert_eq!((half(p, 0), half(p, 1)), (want, want), "q {q} asym {asym} hi {hi} shift {shift}");
                }
            }
        }
        // Pairs: word nibbles n0..n7 = 0..7 give (n0, n4), (n1, n5) and, shifted by 8, (n2, n6), (n3, n7).
        let w: u32 = 0x7654_3210;
        let pair = |hi, shift: u32| {
            let p = w2_f16x2(hi, true, w >> shift, one, 0);
            (half(p, 0), half(p, 1))
        };
        assert_eq!([pair(false, 0), pair(true, 0), pair(false, 8), pair(true, 8)], [(0.0, 4.0), (1.0, 5.0), (2.0, 6.0), (3.0, 7.0)]);
    }

    /// w4a16_mma_tiled_async copies each lane's scale (min) pair word with cp.async and splits
    /// it as the register rungs do; the word holds the tile layout's scales of rows g and g + 8.
    #[test]
    fn the_async_ring_scale_words_hold_the_lanes_scales() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let q = random_quant(&mut rng, 37, 992, Scheme::Asym, 32);
        let t = tile(&q);
        let gpr = q.cols / q.group;
        for tl in 0..t.tiles {
            // The tile's scales as the little-endian words the kernel's sw points into.
            let words: Vec<u32> = t.scales[tl * gpr * 16..(tl + 1) * gpr * 16].chunks(2).map(|p| p[0].to_bits() as u32 | (p[1].to_bits() as u32) << 16).collect();
            for grp in 0..gpr {
                for g in 0..8 {
                    let w = words[8 * grp + g];
                    for (row, half) in [(16 * tl + g, byte_perm(w, 0, 0x1010)), (16 * tl + g + 8, byte_perm(w, 0, 0x3232))] {
                        let want = if row < q.rows { q.scales[row * gpr + grp].to_bits() as u32 } else { 0 };
                        assert_eq!(half, want | (want << 16), "tile {tl} group {grp} row {row}");
                    }
                }
            }
        }
    }

    /// The launcher's slice count gives every split-K warp one load round, and the split covers
    /// each step of K exactly once, slices in order.
    #[test]
    fn the_split_k_slices_give_one_round_per_warp() {
        for k in (32usize..=12288).step_by(32) {
            for &b in BATCHES {
                assert_eq!(steps_in_flight(b), mma_steps_in_flight(b));
                let (nsteps, slices) = ((k / 32).div_ceil(4), splitk_slices(k, b));
                let per = nsteps.div_ceil(MMA_WARPS * slices);
                assert!(per <= steps_in_flight(b), "K={k} batch {b}: {per} steps per warp");
                assert!(slices == 1 || nsteps > MMA_WARPS * steps_in_flight(b) * (slices - 1), "K={k} batch {b}: a slice too many");
            }
        }
    }
}
