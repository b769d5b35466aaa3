//! The index math of kernels/moe.cu replayed on the CPU, statement by statement: the chunked
//! counting sort (moe_chunk_counts, moe_scan, moe_scatter) against `cpu::permute`, and the
//! grouped_mma schedule (moe_schedule and the blocks' binary search) covering every tile of
//! every expert exactly once; the launcher's block sizes and shared memory against the kernels'
//! own. Tests only:
//! the kernels cannot run here.

use super::cpu;
use super::gpu::{BM, BN, CHUNK, ROUTE_TOKENS};
use crate::gpu::compile::probe_source_u32;

/// The block sizes the launcher and these replays use, as NVRTC evaluates them in `source`:
/// (expression, kernel, Rust) where they differ.
fn block_size_mismatches(source: &str) -> Vec<(&'static str, u32, usize)> {
    use crate::ops::gemm::wg::{N128, WIDE};
    let want = [
        ("MOE_ROUTE_TOKENS", ROUTE_TOKENS),
        ("MOE_CHUNK", CHUNK),
        ("tc1::BM", BM),
        ("tc1::BN", BN),
        // grouped_wgmma's blocks search the same schedule of BM-row tiles; their ring and threads
        // are what the launcher gives (gemm's wg tiles).
        ("MoeWgWide::BM", BM),
        ("MoeWgWide::SMEM", WIDE.smem()),
        ("MoeWgWide::THREADS", WIDE.threads() as usize),
        ("MoeWgN128::SMEM", N128.smem()),
        ("MoeWgN128::THREADS", N128.threads() as usize),
    ];
    let exprs: Vec<&str> = want.iter().map(|w| w.0).collect();
    let cache = tempfile::tempdir().unwrap();
    let got = probe_source_u32(Some(cache.path()), "moe_mirrors", source, &exprs, 90.into()).unwrap_or_else(|e| panic!("{e}"));
    want.into_iter().zip(got).filter(|((_, w), g)| *g as usize != *w).map(|((e, w), g)| (e, g, w)).collect()
}

/// The launcher's grid and these replays take the kernels' tile and block sizes; a tile of 64
/// rows planted in kernels/mma.cuh is caught.
#[test]
fn block_sizes_are_the_kernels() {
    let source = crate::kernels::source("moe").unwrap();
    let bad = block_size_mismatches(&source);
    assert!(bad.is_empty(), "{bad:?}");
    let from = "constexpr int BM = 128, BN = 128, BK = 32";
    assert!(source.contains(from));
    let bad = block_size_mismatches(&source.replacen(from, "constexpr int BM = 64, BN = 128, BK = 32", 1));
    assert_eq!(bad, vec![("tc1::BM", 64u32, 128usize)]);
}

/// moe_chunk_counts + moe_scan + moe_scatter, as the kernels index.
fn replay_permute(experts: &[i32], t: usize, k: usize, e: usize, cap: usize) -> cpu::PermuteOut {
    let n = t * k;
    let chunks = n.div_ceil(CHUNK);
    let expert_of = |a: usize| experts[(a % t) * k + a / t];
    let mut hist = vec![0i32; chunks * e];
    for a in 0..n {
        let x = expert_of(a);
        if x >= 0 && (x as usize) < e {
            hist[(a / CHUNK) * e + x as usize] += 1;
        }
    }
    let mut offsets = vec![0i32; e + 1];
    let mut kept_total = 0;
    for x in 0..e {
        let mut run = 0;
        for c in 0..chunks {
            let v = hist[c * e + x];
            hist[c * e + x] = run;
            run += v;
        }
        offsets[x] = kept_total;
        kept_total += run.min(cap as i32);
    }
    offsets[e] = kept_total;
    let (mut slot, mut rows) = (vec![-1i32; n], vec![-1i32; n]);
    for a in 0..n {
        let c = a / CHUNK;
        let x = expert_of(a);
        if x < 0 || x as usize >= e {
            continue;
        }
        let rank = (c * CHUNK..a).filter(|&b| expert_of(b) == x).count() as i32;
        let pos = hist[c * e + x as usize] + rank;
        if pos < cap as i32 {
            let s = offsets[x as usize] + pos;
            slot[(a % t) * k + a / t] = s;
            rows[s as usize] = (a % t) as i32;
        }
    }
    cpu::PermuteOut { slot, rows, offsets }
}

/// moe_schedule, then the block at m-tile y: (expert, first row of its tile), or None past the end.
fn replay_schedule(offsets: &[i32], rows: usize) -> (Vec<i32>, impl Fn(usize) -> Option<(usize, usize)> + '_) {
    let e = offsets.len() - 1;
    let clamp = |v: i32| (v as usize).min(rows);
    let mut start = vec![0i32; e + 1];
    for x in 0..e {
        let m = clamp(offsets[x + 1]) - clamp(offsets[x]);
        start[x + 1] = start[x] + m.div_ceil(BM) as i32;
    }
    let s2 = start.clone();
    let block = move |y: usize| {
        if y as i32 >= s2[e] {
            return None;
        }
        let (mut lo, mut hi) = (0usize, e - 1);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if s2[mid] <= y as i32 { lo = mid } else { hi = mid - 1 }
        }
        Some((lo, (y - s2[lo] as usize) * BM))
    };
    (start, block)
}

fn lcg_experts(n: usize, e: usize, seed: u64, skew: bool) -> Vec<i32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let r = (s >> 33) as usize;
            // Skewed: half the assignments on expert 0 and none on the upper half of the experts.
            (if skew && r.is_multiple_of(2) { 0 } else if skew { r % (e / 2).max(1) } else { r % e }) as i32
        })
        .collect()
}

#[test]
fn the_chunked_counting_sort_is_the_stable_permutation() {
    for (t, k, e, skew) in [(1, 1, 1, false), (3, 2, 8, false), (300, 1, 4, true), (1000, 4, 16, true), (129, 8, 128, false), (33, 8, 256, true), (2049, 2, 8, false)] {
        // A token's choices are distinct experts, as top-k makes them.
        let mut ex = lcg_experts(t * k, e, (t * 31 + k) as u64, skew);
        for row in ex.chunks_mut(k) {
            for j in 0..row.len() {
                while row[..j].contains(&row[j]) {
                    row[j] = (row[j] + 1) % e as i32;
                }
            }
        }
        for cap in [t, super::Capacity::Factor(1.0).slots(t, e), 1] {
            let (want, got) = (cpu::permute(&ex, t, k, e, cap), replay_permute(&ex, t, k, e, cap));
            assert_eq!(got.offsets, want.offsets, "{t} tokens top-{k} of {e}, capacity {cap}");
            assert_eq!(got.slot, want.slot, "{t} tokens top-{k} of {e}, capacity {cap}");
            assert_eq!(got.rows, want.rows, "{t} tokens top-{k} of {e}, capacity {cap}");
        }
    }
}

#[test]
fn the_schedule_covers_every_tile_of_every_expert_once() {
    // Offsets with empty experts, a partial tile, a segment of exact tiles, one past A's rows.
    for (offsets, rows) in [(vec![0, 0, 1, 1], 1), (vec![0, 300, 300, 556, 557], 557), (vec![0, 128, 256], 256), (vec![0, 10, 400], 300), (vec![0, 0, 0], 5)] {
        let e = offsets.len() - 1;
        let (start, block) = replay_schedule(&offsets, rows);
        let bound = rows / BM + e; // the launcher's grid.y
        let mut seen = vec![vec![]; e];
        for y in 0..bound {
            if let Some((x, m0)) = block(y) {
                let m = (offsets[x + 1] as usize).min(rows) - (offsets[x] as usize).min(rows);
                assert!(m0 < m, "block {y}: tile at {m0} past expert {x}'s {m} rows");
                seen[x].push(m0);
            }
        }
        assert!(start[e] as usize <= bound, "the grid bounds the tiles: {} > {bound}", start[e]);
        for x in 0..e {
            let m = (offsets[x + 1] as usize).min(rows) - (offsets[x] as usize).min(rows);
            assert_eq!(seen[x], (0..m.div_ceil(BM)).map(|i| i * BM).collect::<Vec<_>>(), "expert {x} of {offsets:?}");
        }
    }
}

/// grouped_wgmma's block order (groups of MOE_WG_GROUP n-tiles, every m-tile inside a group), as
/// the kernel computes it from its 1D block index.
fn wgmma_block(id: usize, n_tiles: usize, m_bound: usize, group_width: usize) -> (usize, usize) {
    let per_group = m_bound * group_width;
    let (group, in_group) = (id / per_group, id % per_group);
    let width = group_width.min(n_tiles - group * group_width);
    (in_group / width, group * group_width + in_group % width)
}

#[test]
fn the_wgmma_block_order_visits_every_tile_pair_once() {
    let source = crate::kernels::source("moe").unwrap();
    assert!(source.contains("#define MOE_WG_GROUP 8"));
    // Fewer n-tiles than a group, a multiple of it, and a last narrow group.
    for (n_tiles, m_bound) in [(3, 5), (16, 7), (19, 4), (1, 1)] {
        let mut seen = vec![0; n_tiles * m_bound];
        for id in 0..n_tiles * m_bound {
            let (y, nt) = wgmma_block(id, n_tiles, m_bound, 8);
            assert!(y < m_bound && nt < n_tiles, "block {id}: ({y}, {nt})");
            seen[y * n_tiles + nt] += 1;
        }
        assert!(seen.iter().all(|&c| c == 1), "{n_tiles} x {m_bound}: {seen:?}");
    }
    // Blocks resident together share n-tiles: the first 8 m_bound blocks touch 8 of them.
    let first: std::collections::BTreeSet<usize> = (0..8 * 7).map(|id| wgmma_block(id, 16, 7, 8).1).collect();
    assert_eq!(first.len(), 8);
}
