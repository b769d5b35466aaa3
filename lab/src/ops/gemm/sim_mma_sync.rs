//! CPU replays of the mma.sync rungs (kernels/gemm/mma_sync.cu and warp64.cu), tests only: the
//! XOR swizzles, ldmatrix's lane addresses (kernels/mma.cuh) and the fragments they deliver, the
//! ldmatrix/mma fragment addressing of a whole block, the cp.async rings'
//! schedules, the loaders and the grouped block order.

use super::variants::find;

// ---- CPU simulations of the tensor-core index math (mirrors of the expressions in kernels/gemm/) ----

/// swz() of kernels/gemm/mma_sync.cu: byte offset of 16-byte chunk `chunk` of row `row`.
pub(super) fn swz(row: usize, chunk: usize, cpr: usize) -> usize {
    (row * cpr + (chunk ^ (row & 7))) * 16
}

#[test]
fn swizzle_is_a_bijection_and_ldmatrix_phases_are_conflict_free() {
    for (rows, cpr) in [(128, 8), (64, 16), (64, 32)] {
        let mut seen = vec![false; rows * cpr];
        for r in 0..rows {
            for c in 0..cpr {
                let off = swz(r, c, cpr);
                assert_eq!(off / 16 / cpr, r, "a chunk left its row");
                assert!(!std::mem::replace(&mut seen[off / 16], true), "two chunks at one place");
            }
        }
        // One ldmatrix phase: 8 consecutive rows (from a multiple of 8) at one logical chunk.
        // Each 16-byte slot covers 4 banks; 8 distinct slots modulo 128 bytes cover all 32.
        for r0 in (0..rows).step_by(8) {
            for c in 0..cpr {
                let mut slots: Vec<usize> = (r0..r0 + 8).map(|r| (swz(r, c, cpr) % 128) / 16).collect();
                slots.sort();
                slots.dedup();
                assert_eq!(slots.len(), 8, "bank conflict at rows {r0}.., chunk {c}, {cpr} chunks/row");
            }
        }
    }
    // The padded layout of mma_ldmatrix: rows of 40 and 136 halves.
    for stride_bytes in [80, 272] {
        let mut slots: Vec<usize> = (0..8).map(|r| (r * stride_bytes % 128) / 16).collect();
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len(), 8, "padded stride {stride_bytes} conflicts");
    }
}

/// ldmatrix_x4_lane() of kernels/mma.cuh: (row, 16-byte column) of the 16x16 block of 16-bit
/// elements whose address lane `lane` gives ldmatrix.x4, for A fragments and .trans B pairs.
pub(super) fn ldmatrix_x4_lane(lane: usize) -> (usize, usize) {
    (lane % 16, lane / 16)
}

/// ldmatrix_x4_lane_nk() of kernels/mma.cuh: the same for a B tile held n x k, read without .trans.
pub(super) fn ldmatrix_x4_lane_nk(lane: usize) -> (usize, usize) {
    (lane % 8 + (lane / 16) * 8, (lane / 8) % 2)
}

/// What ldmatrix.x4 hands each lane from a 16x16 block whose lanes point at `addr(lane)` (row,
/// 16-byte column): `[lane][register][half]` = (row, column) of the element. Lanes 8q..8q+7 give
/// the rows of matrix q and register q receives it: at (row l/4, columns 2(l%4)..+1) of the
/// matrix, or with .trans at (rows 2(l%4)..+1, column l/4).
fn ldmatrix_x4(addr: fn(usize) -> (usize, usize), trans: bool) -> [[[(usize, usize); 2]; 4]; 32] {
    let mut out = [[[(0, 0); 2]; 4]; 32];
    for (lane, regs) in out.iter_mut().enumerate() {
        for (q, halves) in regs.iter_mut().enumerate() {
            for (h, e) in halves.iter_mut().enumerate() {
                *e = if trans {
                    let (r, c) = addr(8 * q + 2 * (lane % 4) + h);
                    (r, 8 * c + lane / 4)
                } else {
                    let (r, c) = addr(8 * q + lane / 4);
                    (r, 8 * c + 2 * (lane % 4) + h)
                };
            }
        }
    }
    out
}

/// The (lane, register, half) whose element differs from the m16n8k16 fragment layouts (PTX ISA,
/// g = lane / 4, t = lane % 4) for each use of ldmatrix.x4 in the kernels: A (m x k) with
/// `x4`, B held k x n with `x4_trans` and B held n x k with `nk`; registers 2 and 3 of a B load
/// are the second n8 tile's b0 and b1. Elements are (row, column) of the block as held.
fn fragment_mismatches(x4: fn(usize) -> (usize, usize), x4_trans: fn(usize) -> (usize, usize), nk: fn(usize) -> (usize, usize)) -> Vec<(&'static str, usize, usize, usize)> {
    let (a, b, b_nk) = (ldmatrix_x4(x4, false), ldmatrix_x4(x4_trans, true), ldmatrix_x4(nk, false));
    let mut bad = Vec::new();
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        for q in 0..4 {
            for h in 0..2 {
                // A: a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8).
                let want_a = (g + 8 * (q % 2), 2 * t + 8 * (q / 2) + h);
                // B: n8 tile q / 2; b0 at (k 2t, n g), b1 at (k 2t + 8, n g).
                let (k, n) = (2 * t + 8 * (q % 2) + h, g + 8 * (q / 2));
                for (form, got, want) in [("x4 A", a, want_a), ("x4.trans B (k x n)", b, (k, n)), ("x4 B (n x k)", b_nk, (n, k))] {
                    if got[lane][q][h] != want {
                        bad.push((form, lane, q, h));
                    }
                }
            }
        }
    }
    bad
}

/// Every lane and every fragment register of each ldmatrix form the kernels use receives the
/// element the mma expects; the lane maps swapped, the check fails.
#[test]
fn ldmatrix_lanes_deliver_the_mma_fragments() {
    let bad = fragment_mismatches(ldmatrix_x4_lane, ldmatrix_x4_lane, ldmatrix_x4_lane_nk);
    assert!(bad.is_empty(), "{bad:?}");
    let bad = fragment_mismatches(ldmatrix_x4_lane_nk, ldmatrix_x4_lane, ldmatrix_x4_lane);
    assert!(bad.iter().any(|b| b.0 == "x4 A") && bad.iter().any(|b| b.0 == "x4 B (n x k)") && !bad.iter().any(|b| b.0.starts_with("x4.trans")), "{bad:?}");
}

/// Simulates one block of a tensor-core kernel on the CPU: tiles written into a byte-addressed
/// "shared memory" through `a_off` / `b_off` (element offsets of (row, col) in the A and B
/// tiles), read back by per-lane ldmatrix addresses, combined by the m16n8k16 fragment
/// layouts, and stored by the accumulator layout. Values are small integers: exact in f64.
#[allow(clippy::too_many_arguments)]
fn simulate_block(
    (bm_tiles, bn_tiles, bk): (usize, usize, usize),
    (wm, wn): (usize, usize),
    a_off: &dyn Fn(usize, usize) -> usize,
    b_off: &dyn Fn(usize, usize) -> usize,
    a: &dyn Fn(usize, usize) -> f64,
    b: &dyn Fn(usize, usize) -> f64,
    smem_elems: usize,
) -> Vec<f64> {
    let (tile_m, tile_n) = (bm_tiles, bn_tiles);
    let (mut sa, mut sb) = (vec![f64::NAN; smem_elems], vec![f64::NAN; smem_elems]);
    for r in 0..tile_m {
        for c in 0..bk {
            sa[a_off(r, c)] = a(r, c);
        }
    }
    for r in 0..bk {
        for c in 0..tile_n {
            sb[b_off(r, c)] = b(r, c);
        }
    }
    let mut out = vec![0.0; tile_m * tile_n];
    let warps_n = tile_n / wn;
    for warp in 0..(tile_m / wm) * warps_n {
        let (wm0, wn0) = ((warp / warps_n) * wm, (warp % warps_n) * wn);
        for ks in 0..bk / 16 {
            // ldmatrix.x4: lane l's register q holds matrix q at (row l/4, cols 2(l%4)..+1),
            // matrix q's rows addressed by lanes 8q..8q+7. Addresses as in the kernel.
            for i in 0..wm / 16 {
                let addr = |lane: usize| {
                    let (r, c) = ldmatrix_x4_lane(lane);
                    a_off(wm0 + i * 16 + r, ks * 16 + 8 * c)
                };
                let frag = |lane: usize, q: usize, h: usize| sa[addr(8 * q + lane / 4) + 2 * (lane % 4) + h];
                for jp in (0..wn / 8).step_by(2) {
                    let baddr = |lane: usize| {
                        let (r, c) = ldmatrix_x4_lane(lane);
                        b_off(ks * 16 + r, wn0 + jp * 8 + 8 * c)
                    };
                    // .trans: lane l's register q holds matrix q at (rows 2(l%4)..+1, col l/4).
                    let bfrag = |lane: usize, q: usize, h: usize| sb[baddr(8 * q + 2 * (lane % 4) + h) + lane / 4];
                    for (jt, q0) in [(jp, 0), (jp + 1, 2)] {
                        // Rebuild A (16x16) and B (16x8) from the fragment layouts and check
                        // they are the intended sub-matrices, then accumulate C by its layout.
                        let mut am = [[f64::NAN; 16]; 16];
                        let mut bmat = [[f64::NAN; 8]; 16];
                        for lane in 0..32 {
                            let (g, t) = (lane / 4, lane % 4);
                            for h in 0..2 {
                                am[g][2 * t + h] = frag(lane, 0, h);
                                am[g + 8][2 * t + h] = frag(lane, 1, h);
                                am[g][2 * t + 8 + h] = frag(lane, 2, h);
                                am[g + 8][2 * t + 8 + h] = frag(lane, 3, h);
                                bmat[2 * t + h][g] = bfrag(lane, q0, h);
                                bmat[2 * t + 8 + h][g] = bfrag(lane, q0 + 1, h);
                            }
                        }
                        for lane in 0..32 {
                            let (g, t) = (lane / 4, lane % 4);
                            for (row, col) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)] {
                                let v: f64 = (0..16).map(|kk| am[row][kk] * bmat[kk][col]).sum();
                                out[(wm0 + i * 16 + row) * tile_n + wn0 + jt * 8 + col] += v;
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

pub(super) fn check_simulation(name: &str, tile: (usize, usize, usize), warp: (usize, usize), a_off: &dyn Fn(usize, usize) -> usize, b_off: &dyn Fn(usize, usize) -> usize, smem: usize) {
    let (tm, tn, bk) = tile;
    let a = |r: usize, c: usize| ((r * 7 + c * 3) % 11) as f64 - 5.0;
    let b = |r: usize, c: usize| ((r * 5 + c * 2) % 13) as f64 - 6.0;
    let got = simulate_block(tile, warp, a_off, b_off, &a, &b, smem);
    for r in 0..tm {
        for c in 0..tn {
            let want: f64 = (0..bk).map(|kk| a(r, kk) * b(kk, c)).sum();
            // Each output belongs to one lane of one warp: a gap or an overlap shows here.
            assert_eq!(got[r * tn + c], want, "{name}: ({r}, {c})");
        }
    }
}

#[test]
fn tensor_core_fragment_addressing_reproduces_the_tile_product() {
    // mma_ldmatrix: padded rows of BK + 8 and BN + 8 halves.
    let (lda_s, ldb_s) = (32 + 8, 128 + 8);
    check_simulation("mma_ldmatrix", (128, 128, 32), (64, 32), &|r, c| r * lda_s + c, &|r, c| r * ldb_s + c, 128 * ldb_s.max(lda_s));
    // mma_pipelined(_wide): swizzled 16-byte chunks, offsets in halves.
    let sw = |cpr: usize| move |r: usize, c: usize| swz(r, c / 8, cpr) / 2 + c % 8;
    check_simulation("mma_pipelined", (128, 128, 64), (64, 32), &sw(8), &sw(16), 128 * 64);
    check_simulation("mma_pipelined_wide", (128, 256, 64), (64, 64), &sw(8), &sw(32), 256 * 64);
}

/// The cp.async ring of mma_pipelined, replayed on the CPU with the kernel's schedule: one
/// commit group per prologue step and per iteration, `wait_group STAGES - 2` then a barrier at
/// the top of each iteration. At every compute, the slab read must have landed, sit in the slot
/// read, and no copy still in flight may target that slot; each prefetch must target a slot
/// whose last reader finished before the barrier (iteration kt - 1 or earlier).
#[test]
fn cp_async_ring_schedule_has_no_hazards() {
    for stages in [2usize, 3, 4] {
        for nk in [1usize, 2, 3, 5, 13] {
            let mut groups: Vec<Option<(usize, usize)>> = Vec::new(); // (slot, slab) per group
            let mut slot_of = vec![usize::MAX; stages]; // slab held (or arriving) per slot
            let mut last_read = vec![None::<usize>; stages];
            let load = |g: &mut Vec<Option<(usize, usize)>>, slot: usize, slab: usize, kt: Option<usize>, slot_of: &mut Vec<usize>, last_read: &[Option<usize>]| {
                if let (Some(kt), Some(r)) = (kt, last_read[slot]) {
                    assert!(r < kt, "S={stages} nk={nk}: slot {slot} overwritten in iteration {kt} while read in {r}");
                }
                slot_of[slot] = slab;
                g.push(Some((slot, slab)));
            };
            for st in 0..stages - 1 {
                if st < nk {
                    load(&mut groups, st, st, None, &mut slot_of, &last_read);
                } else {
                    groups.push(None);
                }
            }
            for kt in 0..nk {
                // wait_group(S - 2): all but the newest S - 2 groups are complete.
                let complete = groups.len().saturating_sub(stages - 2);
                let next = kt + stages - 1;
                if next < nk {
                    load(&mut groups, next % stages, next, Some(kt), &mut slot_of, &last_read);
                } else {
                    groups.push(None);
                }
                let slot = kt % stages;
                assert_eq!(slot_of[slot], kt, "S={stages} nk={nk}: slot {slot} holds the wrong slab at {kt}");
                let landed = groups[..complete].contains(&Some((slot, kt)));
                assert!(landed, "S={stages} nk={nk}: slab {kt} read before its copy completed");
                let in_flight = groups[complete..].iter().flatten().any(|&(s, _)| s == slot);
                assert!(!in_flight, "S={stages} nk={nk}: slot {slot} read while a copy into it is in flight");
                last_read[slot] = Some(kt);
            }
        }
    }
}


// ---- mma_warp64(_wide, _k64): 64-byte A rows (swz64) or 128-byte ones (swz), precomputed
// lane and loader offsets ----

/// swz64() of kernels/gemm/warp64.cu: byte offset of chunk `chunk` (0..3) of row `row`, 64-byte rows.
pub(super) fn swz64(row: usize, chunk: usize) -> usize {
    let line = row >> 1;
    (line * 8 + ((((row & 1) << 2) | chunk) ^ (line & 7))) * 16
}

/// swz_a<BK>() of kernels/gemm/warp64.cu: the A slab layout for BK = 32 (64-byte rows) or 64 (128-byte rows).
pub(super) fn swz_a(bk: usize, row: usize, chunk: usize) -> usize {
    if bk == 32 { swz64(row, chunk) } else { swz(row, chunk, bk / 8) }
}

/// The tile shapes: (BM, BN, BK, warps along M, warps along N, stages), as the kernels instantiate them.
const W64_SHAPES: [(usize, usize, usize, usize, usize, usize); 3] = [(128, 128, 32, 2, 2, 4), (128, 256, 32, 2, 4, 5), (128, 256, 64, 2, 4, 4)];

#[test]
fn warp64_shared_memory_matches_the_launcher() {
    for ((bm, bn, bk, _, _, stages), v) in W64_SHAPES.into_iter().zip(["mma_warp64", "mma_warp64_wide", "mma_warp64_k64"]) {
        assert_eq!(find(v).unwrap().config.smem, stages * (bm * bk + bk * bn) * 2, "{v}");
        assert!(find(v).unwrap().config.smem <= 227 * 1024, "{v} must fit H100's 227 KiB per block");
    }
    assert_eq!(find("mma_warp64_k64").unwrap().config.smem, 196608);
}

#[test]
fn swz64_is_a_bijection_and_conflict_free_for_ldmatrix_and_cp_async() {
    let rows = 128;
    let mut seen = vec![false; rows * 4];
    for r in 0..rows {
        for c in 0..4 {
            let off = swz64(r, c);
            // Rows 2l and 2l + 1 share 128-byte line l and nothing leaves it.
            assert_eq!(off / 128, r / 2, "row {r} chunk {c} left its line");
            assert!(!std::mem::replace(&mut seen[off / 16], true), "two chunks at one place");
        }
    }
    // 16-byte slots modulo 128 bytes: 8 distinct slots cover all 32 banks once.
    let distinct = |offs: &[usize]| -> usize {
        let mut s: Vec<usize> = offs.iter().map(|o| (o % 128) / 16).collect();
        s.sort();
        s.dedup();
        s.len()
    };
    for r0 in (0..rows).step_by(8) {
        for c in 0..4 {
            // One ldmatrix phase: 8 consecutive rows from a multiple of 8, one logical chunk.
            let phase: Vec<usize> = (r0..r0 + 8).map(|r| swz64(r, c)).collect();
            assert_eq!(distinct(&phase), 8, "ldmatrix phase at rows {r0}.., chunk {c} conflicts");
        }
        // One warp of cp.async writes: 32 consecutive chunks = 8 rows x 4 chunks = 4 lines,
        // each line written whole (one 128-byte wavefront per line).
        let mut per_line = std::collections::BTreeMap::<usize, Vec<usize>>::new();
        for r in r0..r0 + 8 {
            for c in 0..4 {
                per_line.entry(swz64(r, c) / 128).or_default().push(swz64(r, c));
            }
        }
        assert_eq!(per_line.len(), 4);
        assert!(per_line.values().all(|offs| distinct(offs) == 8));
    }
    // Without the XOR, 8 rows of 64 bytes fall on 2 slots (a 4-way conflict): the test can tell.
    let plain: Vec<usize> = (0..8).map(|r: usize| r * 64).collect();
    assert_eq!(distinct(&plain), 2);
}

#[test]
fn warp64_fragment_addressing_reproduces_the_tile_product() {
    for (bm, bn, bk, _, _, _) in W64_SHAPES {
        let b_cpr = bn / 8;
        let a_off = move |r: usize, c: usize| swz_a(bk, r, c / 8) / 2 + c % 8;
        let b_off = move |r: usize, c: usize| swz(r, c / 8, b_cpr) / 2 + c % 8;
        check_simulation("mma_warp64", (bm, bn, bk), (64, 64), &a_off, &b_off, (bm * bk).max(bk * bn));
    }
}

/// The kernel does not call swz64()/swz() per ldmatrix or per cp.async: it keeps one lane (or
/// thread) offset and derives the rest by XOR and constant strides. Every derived offset must
/// equal the direct formula, and the loader must write each chunk of a slab exactly once.
#[test]
fn warp64_precomputed_offsets_match_the_swizzle() {
    for (bm, bn, bk, warps_m, warps_n, _) in W64_SHAPES {
        let threads = 32 * warps_m * warps_n;
        let (a_cpr, b_cpr) = (bk / 8, bn / 8);
        let (a_row_bytes, a_bytes) = (bk * 2, bm * bk * 2);
        let (a_rows_step, b_rows_step) = (threads / a_cpr, threads / b_cpr);
        let a_period = if bk == 32 { 16 } else { 8 };
        assert!(a_rows_step % a_period == 0 && b_rows_step % 8 == 0);
        for warp in 0..warps_m * warps_n {
            let (wm, wn) = ((warp / warps_n) * 64, (warp % warps_n) * 64);
            for lane in 0..32 {
                let (lr, lc) = ldmatrix_x4_lane(lane);
                let a_lane = swz_a(bk, wm + lr, lc);
                let b_lane = a_bytes + swz(lr, wn / 8 + lc, b_cpr);
                for ks in 0..bk / 16 {
                    for i in 0..4 {
                        let direct = swz_a(bk, wm + i * 16 + lr, ks * 2 + lc);
                        assert_eq!((a_lane ^ (ks * 32)) + i * 16 * a_row_bytes, direct, "A {bm}x{bn}x{bk} warp {warp} lane {lane} ks {ks} i {i}");
                    }
                    for jp in (0..8).step_by(2) {
                        let direct = a_bytes + swz(ks * 16 + lr, (wn + jp * 8) / 8 + lc, b_cpr);
                        assert_eq!((b_lane ^ (jp * 16)) + ks * 16 * bn * 2, direct, "B {bm}x{bn}x{bk} warp {warp} lane {lane} ks {ks} jp {jp}");
                    }
                }
            }
        }
        let mut a_seen = vec![0; bm * a_cpr];
        let mut b_seen = vec![0; bk * b_cpr];
        for tid in 0..threads {
            let (a_row, a_ch, b_row, b_ch) = (tid / a_cpr, tid % a_cpr, tid / b_cpr, tid % b_cpr);
            for i in 0..bm / a_rows_step {
                let off = swz_a(bk, a_row, a_ch) + i * a_rows_step * a_row_bytes;
                assert_eq!(off, swz_a(bk, a_row + i * a_rows_step, a_ch));
                a_seen[off / 16] += 1;
            }
            for i in 0..bk / b_rows_step {
                let off = swz(b_row, b_ch, b_cpr) + i * b_rows_step * bn * 2;
                assert_eq!(off, swz(b_row + i * b_rows_step, b_ch, b_cpr));
                b_seen[off / 16] += 1;
            }
        }
        assert!(a_seen.iter().chain(&b_seen).all(|&x| x == 1), "{bm}x{bn}x{bk}: a slab chunk written twice or never");
        // The serpentine mma order still visits every (i, j) accumulator once per step.
        let mut hits = [[0; 8]; 4];
        for (i, row) in hits.iter_mut().enumerate() {
            for jj in 0..8 {
                row[if i & 1 == 1 { 7 - jj } else { jj }] += 1;
            }
        }
        assert!(hits.iter().flatten().all(|&x| x == 1));
    }
}

/// mma_warp64's ring, replayed with its schedule. Prologue: slabs 0..S-1 into slots 0..S-1, one
/// group each; wait_group(S-1), barrier, ldmatrix step 0 of slab 0. Iteration kt: ldmatrix
/// steps 1..KS-1 of slab kt (KS = BK / 16: 2, or 4 for mma_warp64_k64); wait_group(S-2);
/// barrier; cp.async slab kt+S into slot kt % S, commit; ldmatrix step 0 of slab kt+1. Every
/// ldmatrix must read a slab whose copy completed before a barrier that precedes the read, from
/// the slot that holds it, with no copy into that slot in flight; every copy into a slot must
/// follow a barrier that follows every read of its previous slab.
#[test]
fn warp64_ring_schedule_has_no_hazards() {
    for (stages, steps) in [2usize, 3, 4, 5].into_iter().flat_map(|s| [(s, 2usize), (s, 4)]) {
        for nk in [1usize, 2, 3, 4, 5, 6, 7, 13] {
            let mut groups: Vec<Option<(usize, usize)>> = Vec::new(); // (slot, slab) per commit
            let mut slot_of = vec![usize::MAX; stages];
            let mut barriers = 0usize; // barriers so far
            let mut visible = 0usize; // groups[..visible] completed before the latest barrier
            let mut last_read_epoch = vec![None::<usize>; stages]; // barrier count at the last read
            let mut reads = vec![0usize; nk];
            let mut read = |slab: usize, groups: &[Option<(usize, usize)>], slot_of: &[usize], visible: usize, barriers: usize, lr: &mut Vec<Option<usize>>| {
                let slot = slab % stages;
                assert_eq!(slot_of[slot], slab, "S={stages} nk={nk}: slot {slot} does not hold slab {slab}");
                assert!(groups[..visible].contains(&Some((slot, slab))), "S={stages} nk={nk}: slab {slab} read before it is visible");
                assert!(!groups[visible..].iter().flatten().any(|&(s, _)| s == slot), "S={stages} nk={nk}: slot {slot} read while a copy into it is in flight");
                lr[slot] = Some(barriers);
                reads[slab] += 1;
            };
            let copy = |slot: usize, slab: usize, groups: &mut Vec<Option<(usize, usize)>>, slot_of: &mut Vec<usize>, barriers: usize, lr: &[Option<usize>]| {
                if let Some(e) = lr[slot] {
                    assert!(e < barriers, "S={stages} nk={nk}: slot {slot} overwritten before a barrier after its last read");
                }
                slot_of[slot] = slab;
                groups.push(Some((slot, slab)));
            };
            for s in 0..stages {
                if s < nk {
                    copy(s, s, &mut groups, &mut slot_of, barriers, &last_read_epoch);
                } else {
                    groups.push(None);
                }
            }
            // wait_group(n): all but the newest n groups complete; the barrier publishes them.
            let wait_and_barrier = |groups: &[Option<(usize, usize)>], n: usize, barriers: &mut usize, visible: &mut usize| {
                *visible = groups.len().saturating_sub(n);
                *barriers += 1;
            };
            wait_and_barrier(&groups, stages - 1, &mut barriers, &mut visible);
            read(0, &groups, &slot_of, visible, barriers, &mut last_read_epoch); // step 0 of slab 0
            for kt in 0..nk {
                for _step in 1..steps {
                    read(kt, &groups, &slot_of, visible, barriers, &mut last_read_epoch); // steps 1..KS-1 of slab kt
                }
                wait_and_barrier(&groups, stages - 2, &mut barriers, &mut visible);
                if kt + stages < nk {
                    copy(kt % stages, kt + stages, &mut groups, &mut slot_of, barriers, &last_read_epoch);
                } else {
                    groups.push(None);
                }
                if kt + 1 < nk {
                    read(kt + 1, &groups, &slot_of, visible, barriers, &mut last_read_epoch); // step 0 of slab kt+1
                }
            }
            assert!(reads.iter().all(|&r| r == steps), "S={stages} nk={nk}: each slab is read at all {steps} k16 steps: {reads:?}");
        }
    }
}


/// grouped_tile() of kernels/gemm/mma_sync.cu: the origin (row, column) of block `pid`'s BM x BN
/// tile, 8 block rows sweeping the block columns together.
pub(super) fn grouped_tile(pid: usize, m: usize, n: usize, bm: usize, bn: usize) -> (usize, usize) {
    let (gm, gn) = (m.div_ceil(bm), n.div_ceil(bn));
    let per_group = 8 * gn;
    let first = (pid / per_group) * 8;
    let rows = (gm - first).min(8);
    ((first + (pid % per_group) % rows) * bm, ((pid % per_group) / rows) * bn)
}

/// The tile loaders of the pipelined kernel write every chunk of a stage exactly once, and the
/// grouped block order visits every (row, column) tile exactly once.
#[test]
fn pipelined_loads_and_block_order_cover_everything_once() {
    for (bm, bn) in [(128, 128), (128, 256)] {
        let (a_cpr, b_cpr) = (8, bn / 8);
        let mut a_seen = vec![0; bm * a_cpr];
        let mut b_seen = vec![0; 64 * b_cpr];
        for tid in 0..256 {
            for i in 0..bm * a_cpr / 256 {
                let c = tid + i * 256;
                a_seen[swz(c / a_cpr, c % a_cpr, a_cpr) / 16] += 1;
            }
            for i in 0..64 * b_cpr / 256 {
                let c = tid + i * 256;
                b_seen[swz(c / b_cpr, c % b_cpr, b_cpr) / 16] += 1;
            }
        }
        assert!(a_seen.iter().chain(&b_seen).all(|&x| x == 1));
        for (m, n) in [(1usize, 1usize), (4097, 513), (1000, 1000), (8192, 8192), (16, 14336)] {
            let (gm, gn) = (m.div_ceil(bm), n.div_ceil(bn));
            let mut seen = vec![0; gm * gn];
            for pid in 0..gm * gn {
                let (r, c) = grouped_tile(pid, m, n, bm, bn);
                let (r, c) = (r / bm, c / bn);
                assert!(r < gm && c < gn, "{m}x{n}: pid {pid} -> ({r}, {c})");
                seen[r * gn + c] += 1;
            }
            assert!(seen.iter().all(|&x| x == 1), "{m}x{n} ({bm}x{bn})");
        }
    }
}
