//! The CPU replays' index math against the kernels' own (tests only): each Rust mirror in
//! `sim_*` is compared, point by point, with what NVRTC makes of the kernel's function called
//! with the same constant arguments ([`probe_source_u32`]), so an edit to a swizzle, the block
//! order, a descriptor or a tile's shared-memory size in `kernels/` fails here until its mirror
//! follows; the sims' properties (bijection, no bank conflicts, no ring hazards) then hold for
//! the kernels' functions, not only for a transcription of them.

use super::sim_mma_sync::{grouped_tile, ldmatrix_x4_lane, ldmatrix_x4_lane_nk, swz, swz64, swz_a};
use super::tma::wg;
use super::variants::find;
use crate::gpu::compile::{probe_source_u32, Target};

/// Expressions and what the Rust mirrors say each one is.
type Probes = Vec<(String, u32)>;

fn index_probes() -> Probes {
    let mut p = Probes::new();
    // ldmatrix's lane addresses (kernels/mma.cuh), every lane: so every 8x8 matrix, the register
    // that receives it, and the fragment it becomes (sim_mma_sync::ldmatrix_lanes_deliver_the_mma_fragments).
    for lane in 0..32 {
        for (f, (row, col)) in [("ldmatrix_x4_lane", ldmatrix_x4_lane(lane)), ("ldmatrix_x4_lane_nk", ldmatrix_x4_lane_nk(lane))] {
            p.push((format!("{f}({lane}).x"), row as u32));
            p.push((format!("{f}({lane}).y"), col as u32));
        }
    }
    for cpr in [8, 16, 32] {
        for row in 0..16 {
            for chunk in 0..cpr {
                p.push((format!("swz({row}, {chunk}, {cpr})"), swz(row, chunk, cpr) as u32));
            }
        }
    }
    for row in 0..32 {
        for chunk in 0..4 {
            p.push((format!("swz64({row}, {chunk})"), swz64(row, chunk) as u32));
            p.push((format!("swz_a<32>({row}, {chunk})"), swz_a(32, row, chunk) as u32));
        }
        for chunk in 0..8 {
            p.push((format!("swz_a<64>({row}, {chunk})"), swz_a(64, row, chunk) as u32));
        }
    }
    for (m, n, bm, bn) in [(4097usize, 513usize, 128usize, 128usize), (1000, 1000, 128, 256), (1, 1, 128, 128), (2100, 2040, 128, 256)] {
        for pid in 0..m.div_ceil(bm) * n.div_ceil(bn) {
            let (r, c) = grouped_tile(pid, m, n, bm, bn);
            p.push((format!("grouped_tile({pid}, {m}, {n}, {bm}, {bn}).x"), r as u32));
            p.push((format!("grouped_tile({pid}, {m}, {n}, {bm}, {bn}).y"), c as u32));
        }
    }
    // The warp64 rungs' tiles, as the launcher sizes their shared memory.
    for (v, tile) in [("mma_warp64", "128, 128, 32, 2, 2, 4"), ("mma_warp64_wide", "128, 256, 32, 2, 4, 5"), ("mma_warp64_k64", "128, 256, 64, 2, 4, 4")] {
        p.push((format!("W64<__half, {tile}>::SMEM"), find(v).unwrap().config.smem as u32));
    }
    p
}

/// The wgmma descriptors and tiles exist for sm_90a only.
fn wgmma_probes() -> Probes {
    let mut p = Probes::new();
    for (addr, lbo, sbo) in [(0x1_2340, wg::B_LBO, wg::B_SBO), (0x3_FFF0, wg::A_LBO, wg::A_SBO), (0, 0, 0), (0x2_0400, wg::A_LBO, wg::B_SBO)] {
        let d = wg::desc(addr, lbo, sbo);
        p.push((format!("wg_desc({addr}u, {lbo}u, {sbo}u) & 0xffffffffull"), d as u32));
        p.push((format!("wg_desc({addr}u, {lbo}u, {sbo}u) >> 32"), (d >> 32) as u32));
    }
    for (name, value) in [("WG_A_LBO", wg::A_LBO), ("WG_A_SBO", wg::A_SBO), ("WG_B_LBO", wg::B_LBO), ("WG_B_SBO", wg::B_SBO)] {
        p.push((name.to_string(), value));
    }
    for (v, tile) in [("wgmma_tma", "WgWide"), ("wgmma_n128", "WgN128"), ("wgmma_n128_deep", "WgN128Deep"), ("wgmma_n64_deep", "WgN64Deep")] {
        let t = wg::Tile::of(v).unwrap();
        p.push((format!("{tile}::SMEM"), t.smem() as u32));
        p.push((format!("{tile}::THREADS"), t.threads()));
        p.push((format!("{tile}::STAGE_BYTES"), t.stage_bytes() as u32));
    }
    p
}

/// The probes whose kernel value differs from the mirror's: (expression, kernel, mirror).
fn mismatches(source: &str, probes: &Probes, target: Target) -> Vec<(String, u32, u32)> {
    let exprs: Vec<&str> = probes.iter().map(|(e, _)| e.as_str()).collect();
    let cache = tempfile::tempdir().unwrap();
    let got = probe_source_u32(Some(cache.path()), "gemm_mirrors", source, &exprs, target).unwrap_or_else(|e| panic!("{e}"));
    probes.iter().zip(got).filter(|((_, want), got)| got != want).map(|((e, want), got)| (e.clone(), got, *want)).collect()
}

#[test]
fn the_sims_index_math_is_the_kernels() {
    let source = crate::kernels::source("gemm").unwrap();
    let bad = mismatches(&source, &index_probes(), 90.into());
    assert!(bad.is_empty(), "{} of the kernels' values differ from their mirrors', e.g. {:?}", bad.len(), &bad[..bad.len().min(5)]);
    let bad = mismatches(&source, &wgmma_probes(), "90a".parse().unwrap());
    assert!(bad.is_empty(), "{bad:?}");
}

/// A kernel edited under its mirror is caught: the swizzle XORed with 3 bits of the row instead of
/// 7, a block order of 4 rows instead of 8, ldmatrix lanes 8..15 pointing at rows 0..7 again
/// (lane % 8 for lane % 16), and a descriptor with the swizzle mode in another bit.
#[test]
fn an_edited_kernel_fails_its_mirror() {
    let source = crate::kernels::source("gemm").unwrap();
    let edits = [
        ("(chunk ^ (row & 7))", "(chunk ^ (row & 3))", "swz("),
        ("constexpr int GROUP = 8;", "constexpr int GROUP = 4;", "grouped_tile("),
        ("make_int2(lane % 16, lane / 16)", "make_int2(lane % 8, lane / 16)", "ldmatrix_x4_lane("),
    ];
    for (from, to, expect) in edits {
        assert!(source.contains(from), "{from}");
        let bad = mismatches(&source.replacen(from, to, 1), &index_probes(), 90.into());
        assert!(bad.iter().any(|(e, _, _)| e.starts_with(expect)), "{to}: {:?}", &bad[..bad.len().min(3)]);
    }
    let from = "(1ull << 62)";
    assert!(source.contains(from));
    let bad = mismatches(&source.replacen(from, "(1ull << 63)", 1), &wgmma_probes(), "90a".parse().unwrap());
    assert!(bad.iter().any(|(e, _, _)| e.starts_with("wg_desc(")), "{bad:?}");
}
