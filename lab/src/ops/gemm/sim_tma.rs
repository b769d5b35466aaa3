//! CPU replays of the TMA rungs (kernels/gemm/wgmma.cu and mma_tma.cu), tests only: the 128-byte
//! swizzle, wgmma descriptors and a whole block's product, the tensor maps, and the mbarrier
//! rings under random interleavings.

use super::sim_mma_sync::{check_simulation, ldmatrix_x4_lane, swz};
use super::tma::{wg, TensorMap};
use super::variants::{applies, find, not_applicable};
use super::Dims;
use rand::Rng;

// ---- the wgmma rungs: swizzle, descriptors, tensor maps, the mbarrier ring (mirrors of kernels/gemm/) ----

#[test]
fn swizzle128_matches_the_xor_swizzle_of_the_mma_rungs_and_stays_in_its_atom() {
    // Rows of 128 bytes from a 1024-aligned base: TMA's 128-byte swizzle is swz(row, chunk, 8).
    for base in [0u32, 1024, 0x1_0400] {
        let mut seen = std::collections::BTreeSet::new();
        for row in 0..64usize {
            for chunk in 0..8usize {
                let a = wg::swizzle128(base + (row * 128 + chunk * 16) as u32);
                assert_eq!(a - base, swz(row, chunk, 8) as u32, "base {base} row {row} chunk {chunk}");
                assert_eq!((a - base) / 1024, (row / 8) as u32, "left its 1024-byte atom");
                assert!(seen.insert(a));
            }
        }
    }
    // Bytes inside a 16-byte chunk keep their order; a 512-aligned but not 1024-aligned base
    // would give a different pattern (why the ring is aligned to 1024).
    assert_eq!(wg::swizzle128(128 + 5), 128 + 16 + 5);
    assert_ne!(wg::swizzle128(512) - 512, wg::swizzle128(0));
}

#[test]
fn wgmma_descriptor_bit_fields() {
    let field = |d: u64, lo: u32, bits: u32| (d >> lo) & ((1u64 << bits) - 1);
    let d = wg::desc(0x1_2340, wg::B_LBO, wg::B_SBO);
    assert_eq!(field(d, 0, 14), 0x1_2340 >> 4);
    assert_eq!(field(d, 16, 14), 8192 >> 4);
    assert_eq!(field(d, 32, 14), 1024 >> 4);
    assert_eq!(field(d, 49, 3), 0, "base offset: the ring is 1024-aligned");
    assert_eq!(field(d, 62, 2), 1, "swizzle mode 1 = 128 bytes");
    assert_eq!(d & !(0x3FFF | (0x3FFF << 16) | (0x3FFF << 32) | (3u64 << 62)), 0, "reserved bits set");
    let a = wg::desc(0x3_FFF0, wg::A_LBO, wg::A_SBO);
    assert_eq!((field(a, 0, 14), field(a, 16, 14), field(a, 32, 14)), (0x3FFF, 1, 64));
    assert_eq!(wg::desc(0, 0, 0), 1u64 << 62);
    // Every address of the 227 KiB window and every offset used fits its 14-bit field.
    assert!((wg::WIDE.smem() as u32 + 1024) >> 4 < 1 << 14 && wg::B_LBO >> 4 < 1 << 14);
    // Exactly the kernel's constants: 1024-byte atoms, 8 KiB B boxes.
    assert_eq!((wg::A_SBO, wg::B_SBO, wg::B_LBO, wg::A_K16_STEP, wg::B_K16_STEP), (1024, 1024, 8192, 32, 2048));
}

/// Decodes a descriptor and reads element (r, c) of the operand it describes as the PTX ISA's
/// canonical 128-byte-swizzled layouts define them (in 16-byte units T):
///   K-major  ((8, m), (T, 2k)) : ((8T, SBO), (1, T))  rows of 128 bytes, 8-row groups SBO apart
///   MN-major ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))  64-element atoms LBO apart along MN,
///            8-row groups of K SBO apart
/// `k_major`: (r, c) = (m, k) of A; else (k, n) of B.
fn wgmma_operand_addr(desc: u64, k_major: bool, r: usize, c: usize) -> u32 {
    let start = ((desc & 0x3FFF) << 4) as u32;
    let lbo = (((desc >> 16) & 0x3FFF) << 4) as u32;
    let sbo = (((desc >> 32) & 0x3FFF) << 4) as u32;
    assert_eq!(desc >> 62, 1, "only the 128-byte swizzle is modelled");
    let (r, c) = (r as u32, c as u32);
    let addr = if k_major {
        assert!(c < 16);
        start + (r % 8) * 128 + (r / 8) * sbo + c * 2
    } else {
        assert!(r < 16);
        start + (c % 64) * 2 + (c / 64) * lbo + (r % 8) * 128 + (r / 8) * sbo
    };
    wg::swizzle128(addr)
}

/// One block of each wgmma rung on the CPU: TMA boxes written through the swizzle into a ring that
/// starts at a 1024-aligned address (not 0), each consumer's four k16 wgmmas read through its
/// descriptors, the accumulators stored through the m64nNk16 fragment layout. Every output must
/// equal the tile product, and each must be stored by exactly one (consumer, thread, register).
#[test]
fn wgmma_blocks_reproduce_the_tile_product() {
    use wg::*;
    // The three tile widths (wgmma_n128_deep lays out its stages as wgmma_n128 does).
    for tile in [WIDE, N128, N64_DEEP] {
        let (bn, stage_bytes) = (tile.bn, tile.stage_bytes());
        let a = |r: usize, c: usize| ((r * 7 + c * 3) % 11) as f64 - 5.0;
        let b = |r: usize, c: usize| ((r * 5 + c * 2) % 13) as f64 - 6.0;
        let ring = 0x400u32 + 2 * stage_bytes as u32; // stage 2 of a ring at 1 KiB
        assert_eq!(0x400 % 1024, 0);
        let mut smem = vec![f64::NAN; (ring as usize + stage_bytes) / 2];
        let mut put = |addr: u32, v: f64| {
            assert_eq!(addr % 2, 0);
            let slot = &mut smem[(addr / 2) as usize];
            assert!(slot.is_nan(), "two elements at byte {addr}");
            *slot = v;
        };
        // TMA: A box (BK x BM), box row r = A row r, 128 bytes; B boxes j (B_BOX_N x BK) after A.
        for r in 0..BM {
            for c in 0..BK {
                put(swizzle128(ring + (r * 128 + c * 2) as u32), a(r, c));
            }
        }
        let b0 = ring + (BM * BK * 2) as u32;
        for j in 0..bn / B_BOX_N {
            for r in 0..BK {
                for c in 0..B_BOX_N {
                    put(swizzle128(b0 + (j * BK * B_BOX_N * 2 + r * 128 + c * 2) as u32), b(r, j * B_BOX_N + c));
                }
            }
        }
        let at = |addr: u32| smem[(addr / 2) as usize];
        let mut out = vec![f64::NAN; BM * bn];
        for consumer in 0..2usize {
            let a_rows = ring + (consumer * 64 * BK * 2) as u32;
            let mut d = vec![0.0f64; 64 * bn]; // the warpgroup's 64 x BN accumulator, row-major
            for ks in 0..BK / 16 {
                let da = desc(a_rows + A_K16_STEP * ks as u32, A_LBO, A_SBO);
                let db = desc(b0 + B_K16_STEP * ks as u32, B_LBO, B_SBO);
                for m in 0..64 {
                    for n in 0..bn {
                        let dot: f64 = (0..16).map(|k| at(wgmma_operand_addr(da, true, m, k)) * at(wgmma_operand_addr(db, false, k, n))).sum();
                        d[m * bn + n] += dot;
                    }
                }
            }
            // Registers of thread (warp w, lane l): d[4j + h] at row 16w + l/4 + 8 (h / 2), column 8j + 2 (l % 4) + h % 2.
            for tid in 0..128 {
                let (warp, lane) = (tid / 32, tid % 32);
                for j in 0..bn / 8 {
                    for h in 0..4 {
                        let (row, col) = (warp * 16 + lane / 4 + 8 * (h / 2), 8 * j + 2 * (lane % 4) + h % 2);
                        let o = &mut out[(consumer * 64 + row) * bn + col];
                        assert!(o.is_nan(), "output ({row}, {col}) stored twice");
                        *o = d[row * bn + col];
                    }
                }
            }
        }
        for r in 0..BM {
            for c in 0..bn {
                let want: f64 = (0..BK).map(|k| a(r, k) * b(k, c)).sum();
                assert_eq!(out[r * bn + c], want, "({r}, {c})");
            }
        }
    }
}

#[test]
fn wgmma_tma_tensor_maps_and_shared_memory() {
    use wg::*;
    let (ta, tb) = tma_boxes(Dims::dense(1000, 1032, 776), 2);
    assert_eq!(ta, TmaBox { rank: 2, dims: [776, 1000, 1, 1], strides_bytes: [1552, 0, 0], boxes: [64, 128, 1, 1] });
    assert_eq!(tb, TmaBox { rank: 2, dims: [1032, 776, 1, 1], strides_bytes: [2064, 0, 0], boxes: [64, 64, 1, 1] });
    // Padded leading dimensions are strides, never sizes.
    let (ta, tb) = tma_boxes(Dims { m: 3, n: 5, k: 7, lda: 16, ldb: 24, ldc: 5 }, 2);
    assert_eq!((ta.dims, ta.row_stride_bytes(), tb.dims, tb.row_stride_bytes()), ([7, 3, 1, 1], 32, [5, 7, 1, 1], 48));
    for t in [ta, tb] {
        assert_eq!(t.boxes[0] as usize * 2, 128, "a 128-byte swizzle takes boxes of at most 128 bytes along the row");
        assert!(t.boxes.iter().all(|&x| (1..=256).contains(&x)));
    }
    // The transaction bytes the producer expects per stage are the boxes it issues.
    let box_bytes = |t: TmaBox| t.boxes[0] as usize * t.boxes[1] as usize * 2;
    for tile in [WIDE, N128, N128_DEEP, N64_DEEP] {
        let bn = tile.bn;
        assert_eq!(box_bytes(ta) + (bn / B_BOX_N) * box_bytes(tb), tile.stage_bytes());
        // At the N edge the producer issues only the B boxes that reach inside N (kernels/gemm/wgmma.cu:
        // b_boxes = min(BN / 64, ceil((N - bn) / 64))) and expects their bytes alone: every
        // column < N of the tile is loaded, and no box starts at or past N.
        for n in [1usize, 8, 64, 65, 128, 136, 256, 264, 520, 1000, 1032, 4096] {
            for b0 in (0..n).step_by(bn) {
                let boxes = (bn / B_BOX_N).min((n - b0).div_ceil(B_BOX_N));
                assert!(b0 + boxes * B_BOX_N >= n.min(b0 + bn), "BN={bn} N={n} bn={b0}: columns left unloaded");
                assert!(b0 + (boxes - 1) * B_BOX_N < n, "BN={bn} N={n} bn={b0}: a box wholly outside N");
                assert!(box_bytes(ta) + boxes * box_bytes(tb) <= tile.stage_bytes());
            }
        }
        // The blocks an SM holds fit its 228 KiB (each block also costs 1 KiB the system
        // reserves), and one more stage would not.
        let per_sm = |stages: usize| tile.blocks_per_sm * (Tile { stages, ..tile }.smem() + 1024);
        assert!(per_sm(tile.stages) <= 228 * 1024 && per_sm(tile.stages + 1) > 228 * 1024, "{tile:?}");
        // Registers: ptxas's limit for the launch shape leaves room for the BN / 2 accumulators.
        assert!(65536 / (tile.threads() as usize * tile.blocks_per_sm) >= bn / 2 + 24, "{tile:?}");
    }
    assert_eq!((WIDE.stage_bytes(), N128.stage_bytes()), (49152, 32768));
    assert_eq!((find("wgmma_tma").unwrap().config.smem, find("wgmma_n128").unwrap().config.smem), (197696, 99376));
    // Which of the experiment's odd shapes it takes: K and N multiples of 8.
    for ((m, n, k), takes) in [((1000, 1000, 1000), true), ((4097, 513, 777), false), ((130, 260, 72), false), ((300, 520, 96), true), ((300, 520, 320), true), ((1, 4097, 777), false), ((130, 264, 72), true), ((1, 1032, 776), true), ((8192, 8192, 8192), true)] {
        let why = not_applicable(find("wgmma_tma").unwrap(), Dims::dense(m, n, k));
        assert_eq!(why.is_none(), takes, "{m}x{n}x{k}: {why:?}");
        let (ta, tb) = tma_boxes(Dims::dense(m, n, k), 2);
        assert_eq!(ta.row_stride_bytes().is_multiple_of(16) && tb.row_stride_bytes().is_multiple_of(16), takes, "{m}x{n}x{k}");
    }
    assert_eq!(not_applicable(find("wgmma_tma").unwrap(), Dims::dense(4097, 513, 777)).unwrap(), "TMA needs row strides that are multiples of 16 bytes (8 elements); K = 777 and N = 513 are not");
    assert_eq!(not_applicable(find("wgmma_tma").unwrap(), Dims { m: 2, n: 8, k: 8, lda: 12, ldb: 8, ldc: 8 }).unwrap(), "TMA needs row strides that are multiples of 16 bytes (8 elements); lda = 12 is not");
    assert_eq!(not_applicable(find("mma_warp64").unwrap(), Dims::dense(4097, 513, 777)), None);
    // Offered on compute capability 9.0 only: not 8.x, not 10.x.
    for (arch, offered) in [(80, false), (89, false), (90, true), (100, false), (120, false)] {
        assert_eq!(applies(find("wgmma_tma").unwrap(), Dims::dense(1024, 1024, 1024), 227 * 1024, arch), offered, "sm_{arch}");
    }
    assert!(applies(find("mma_warp64_wide").unwrap(), Dims::dense(1024, 1024, 1024), 227 * 1024, 80));
    assert_eq!(crate::gpu::compile::Target::for_device(90).gpu_architecture(), "compute_90a");
    assert_eq!(crate::gpu::compile::Target::for_device(80).gpu_architecture(), "compute_80");
    assert_eq!(crate::gpu::compile::Target::for_device(100).gpu_architecture(), "compute_100");
    assert_eq!("90a".parse::<crate::gpu::compile::Target>().unwrap(), crate::gpu::compile::Target { arch: 90, specific: true });
    assert!("sm90".parse::<crate::gpu::compile::Target>().is_err());
    assert_eq!(std::mem::size_of::<TensorMap>(), 128);
    assert_eq!(std::mem::align_of::<TensorMap>() % 64, 0);
}

/// wgmma_tma's ring under random interleavings of the producer, the TMA engine and the eight
/// consumer warps, with mbarrier semantics: a phase completes when its arrivals (and, for
/// full[s], its transaction bytes) are in; try_wait.parity(p) succeeds when the number of
/// completed phases n has n % 2 != p. Every read must find its tile landed in its slot, no
/// TMA may overwrite a slot a warp may still read (wgmma groups in flight included).
#[test]
fn wgmma_tma_mbarrier_ring_has_no_hazards() {
    use rand::SeedableRng;
    const WARPS: usize = 8;
    for stages in [2usize, 3, 4] {
        for nk in [1usize, 2, 3, 4, 5, 7, 9, 13] {
            for seed in 0..60u64 {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + nk as u64 * 10 + stages as u64);
                // (completed phases, arrivals in the current phase)
                let mut full = vec![(0usize, 0usize); stages];
                let mut empty = vec![(0usize, 0usize); stages];
                let mut slot: Vec<Option<(usize, bool)>> = vec![None; stages]; // (tile, landed)
                let mut in_flight: Vec<usize> = Vec::new(); // slots with a TMA under way
                let mut producer = 0usize;
                let mut warp_kt = [0usize; WARPS];
                let mut reading: Vec<Vec<usize>> = vec![Vec::new(); WARPS]; // tiles whose wgmma may still read
                let wait_ok = |b: (usize, usize), parity: usize| b.0 % 2 != parity;
                let mut steps = 0;
                while producer < nk || warp_kt.iter().any(|&k| k < nk) || !in_flight.is_empty() {
                    steps += 1;
                    assert!(steps < 100_000, "S={stages} nk={nk}: deadlock");
                    match rng.random_range(0..WARPS + 2) {
                        0 if producer < nk => {
                            let kt = producer;
                            let s = kt % stages;
                            if wait_ok(empty[s], ((kt / stages) & 1) ^ 1) {
                                for (w, r) in reading.iter().enumerate() {
                                    assert!(!r.iter().any(|&t| t % stages == s), "S={stages} nk={nk}: tile {kt} overwrites slot {s} while warp {w} may read it");
                                }
                                slot[s] = Some((kt, false));
                                full[s].1 += 1; // arrive.expect_tx: the arrival is in, the bytes are not
                                in_flight.push(s);
                                producer += 1;
                            }
                        }
                        1 if !in_flight.is_empty() => {
                            let s = in_flight.remove(rng.random_range(0..in_flight.len()));
                            slot[s].as_mut().unwrap().1 = true;
                            assert_eq!(full[s].1, 1);
                            full[s] = (full[s].0 + 1, 0); // bytes landed: the phase completes
                        }
                        w if w >= 2 => {
                            let w = w - 2;
                            let kt = warp_kt[w];
                            if kt < nk {
                                let s = kt % stages;
                                if wait_ok(full[s], (kt / stages) & 1) {
                                    assert_eq!(slot[s], Some((kt, true)), "S={stages} nk={nk}: warp {w} reads tile {kt} from slot {s}");
                                    reading[w].push(kt);
                                    // wait_group 1: tile kt - 1's group is done; arrive on its empty barrier.
                                    if kt > 0 {
                                        reading[w].retain(|&t| t != kt - 1);
                                        let e = &mut empty[(kt - 1) % stages];
                                        e.1 += 1;
                                        if e.1 == WARPS {
                                            *e = (e.0 + 1, 0);
                                        }
                                    }
                                    warp_kt[w] += 1;
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}


// ---- mma_warp64_tma: k64's warps and loop on wgmma_tma's TMA stage layout ----

/// The TMA stage as the kernel reads it: A one box of 128 rows x 128 bytes, B four boxes of 64
/// k-rows x 128 bytes, each 128-byte swizzled from its own start (swz(row, chunk, 8)). The
/// lane offsets and strides of mma_warp64_tma_body must address the same bytes as the direct
/// formula, and the fragments read through them must give the tile product.
#[test]
fn warp64_tma_fragment_addressing_reproduces_the_tile_product() {
    let a_bytes = wg::BM * wg::BK * 2;
    let box_bytes = wg::BK * wg::B_BOX_N * 2;
    assert_eq!(a_bytes + 4 * box_bytes, wg::WIDE.stage_bytes());
    let a_off = |r: usize, c: usize| swz(r, c / 8, 8) / 2 + c % 8;
    let b_off = |r: usize, c: usize| (c / 64) * box_bytes / 2 + swz(r, (c % 64) / 8, 8) / 2 + c % 8;
    check_simulation("mma_warp64_tma", (128, 256, 64), (64, 64), &a_off, &b_off, 256 * 64);
    for warp in 0..8 {
        let (wm, wn) = ((warp / 4) * 64, (warp % 4) * 64);
        for lane in 0..32 {
            let (lr, lc) = ldmatrix_x4_lane(lane);
            let a_lane = swz(wm + lr, lc, 8);
            let b_lane = a_bytes + (wn / 64) * box_bytes + swz(lr, lc, 8);
            for ks in 0..4 {
                for i in 0..4 {
                    let (row, col) = (wm + i * 16 + lr, ks * 16 + lc * 8);
                    assert_eq!((a_lane ^ (ks * 32)) + i * 16 * 128, 2 * a_off(row, col), "A warp {warp} lane {lane} ks {ks} i {i}");
                }
                for jp in (0..8).step_by(2) {
                    let (row, col) = (ks * 16 + lr, wn + jp * 8 + lc * 8);
                    assert_eq!((b_lane ^ (jp * 16)) + ks * 16 * 128, a_bytes + 2 * b_off(row, col), "B warp {warp} lane {lane} ks {ks} jp {jp}");
                }
            }
        }
    }
    assert_eq!(find("mma_warp64_tma").unwrap().config.smem, find("wgmma_tma").unwrap().config.smem);
    // B as one 3D box per slab: element (column c, row k, block j) of the box at coordinates
    // (0, k0, bn / 64) is B[k0 + k][bn + 64 j + c] in global memory (the strides), and lands
    // where the 2D box j puts B[k0 + k][bn + 64 j + c] in shared memory (the box order:
    // innermost first).
    let d = Dims { m: 256, n: 1000, k: 320, lda: 320, ldb: 1024, ldc: 1000 };
    let b3 = wg::tma_b_3d(d, 2).expect("ceil(1000 / 64) * 64 = 1024 <= ldb");
    assert_eq!((b3.rank, b3.dims, b3.strides_bytes, b3.boxes), (3, [64, 320, 16, 1], [2048, 128, 0], [64, 64, 4, 1]));
    let (k0, bn) = (128usize, 512usize);
    for (c, k, j) in [(0usize, 0usize, 0usize), (5, 7, 1), (63, 63, 3), (17, 40, 2)] {
        let global = (k0 + k) as u64 * b3.strides_bytes[0] + (bn / 64 + j) as u64 * b3.strides_bytes[1] + 2 * c as u64;
        assert_eq!(global, 2 * ((k0 + k) * d.ldb + bn + 64 * j + c) as u64);
        let smem_3d = ((j * b3.boxes[1] as usize + k) * b3.boxes[0] as usize + c) * 2;
        assert_eq!(smem_3d, j * box_bytes + k * 128 + 2 * c, "not the 2D boxes' layout");
    }
    // Dense B with N % 64 != 0: a partial last block would read past the rows, so 2D boxes.
    assert!(wg::tma_b_3d(Dims::dense(256, 1000, 320), 2).is_none());
    assert!(wg::tma_b_3d(Dims::dense(8192, 8192, 8192), 2).is_some());
    assert!(wg::tma_b_3d(Dims::dense(130, 320, 104), 2).is_some(), "the gate that puts the 3D boxes' edges under the check");
    for (arch, offered) in [(80, false), (90, true), (100, false)] {
        assert_eq!(applies(find("mma_warp64_tma").unwrap(), Dims::dense(1024, 1024, 1024), 227 * 1024, arch), offered, "sm_{arch}");
    }
    assert!(not_applicable(find("mma_warp64_tma").unwrap(), Dims::dense(4097, 513, 777)).is_some());
}

/// mma_warp64_tma's ring, replayed with its schedule. Prologue: warp 0 issues slabs 0..S-1
/// into slots 0..S-1; every thread waits on full[0] (parity 0), reads step 0 of slab 0.
/// Iteration kt: steps 1..3 of slab kt; wait on full[kt + 1] with parity ((kt + 1) / S) & 1;
/// barrier; warp 0 issues slab kt + S into slot kt % S; step 0 of slab kt + 1. The copy
/// engine completes copies at any later time, in any order. A wait passes only once the
/// slot's phase of that parity has completed (try_wait.parity: the barrier's completed-phase
/// count has the other parity), and must then find its own slab there, never one a lap
/// ahead; no copy may land in a slot a warp read after the latest barrier.
#[test]
fn warp64_tma_ring_schedule_has_no_hazards() {
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    const S: usize = 4;
    /// Slots' completed phases and slabs, the copies issued and not landed, and which slots a
    /// warp read since the latest barrier.
    struct Ring {
        phases: [usize; S],
        slab_in: [usize; S],
        pending: Vec<(usize, usize)>,
        read_since_barrier: [bool; S],
    }
    impl Ring {
        fn land(&mut self, rng: &mut StdRng, all: bool) {
            while !self.pending.is_empty() && (all || rng.random_bool(0.5)) {
                let (slot, slab) = self.pending.remove(rng.random_range(0..self.pending.len()));
                assert!(!self.read_since_barrier[slot], "slab {slab} landed in slot {slot} while a warp may read it");
                self.slab_in[slot] = slab;
                self.phases[slot] += 1;
            }
        }
        // Polls until the phase completes, the copy engine progressing meanwhile.
        fn wait(&mut self, rng: &mut StdRng, slab: usize) {
            let (slot, parity) = (slab % S, (slab / S) & 1);
            while self.phases[slot] & 1 == parity {
                assert!(self.pending.iter().any(|&(s, _)| s == slot), "waiting on slab {slab}, never issued");
                self.land(rng, false);
            }
            assert_eq!(self.slab_in[slot], slab, "the wait for slab {slab} passed on another slab");
        }
        fn read(&mut self, slab: usize) {
            assert_eq!(self.slab_in[slab % S], slab, "slab {slab} is not in its slot");
            self.read_since_barrier[slab % S] = true;
        }
    }
    for nk in [1usize, 2, 3, 4, 5, 6, 9, 13] {
        for seed in 0..50u64 {
            let mut rng = StdRng::seed_from_u64(seed * 100 + nk as u64);
            let mut r = Ring { phases: [0; S], slab_in: [usize::MAX; S], pending: (0..nk.min(S)).map(|kt| (kt, kt)).collect(), read_since_barrier: [false; S] };
            r.wait(&mut rng, 0);
            r.read(0); // step 0 of slab 0
            for kt in 0..nk {
                r.read(kt); // steps 1..3
                if kt + 1 < nk {
                    r.wait(&mut rng, kt + 1);
                }
                r.read_since_barrier = [false; S]; // the block barrier
                if kt + S < nk {
                    r.pending.push(((kt + S) % S, kt + S));
                }
                r.land(&mut rng, false);
                if kt + 1 < nk {
                    r.read(kt + 1); // step 0 of slab kt + 1
                }
            }
            r.land(&mut rng, true);
            assert_eq!(r.phases.iter().sum::<usize>(), nk, "nk={nk}: every slab copied once");
        }
    }
}
