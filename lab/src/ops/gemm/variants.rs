//! The gemm ladder: the only place a gemm variant is named. Each row's `Config` holds the facts
//! the launcher, the sweep and the record need (the kind of kernel, its block tile, threads and
//! dynamic shared memory), as each kernel's line in kernels/gemm/ states them.

use super::tma::wg;
use super::{Dims, FAMILY, SLOW_MAX_MACS};
use crate::kernels::DType;
use crate::ops::variant::{self, Requires, Variant};
use crate::Result;
use cudarc::driver::LaunchConfig;

/// What a variant's kernel takes and how it is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Pointers to A, B and C with their leading dimensions: the SIMT rungs and the mma.sync rungs
    /// fed by loads or cp.async.
    Direct,
    /// Direct, plus an fp32 workspace and per-tile counters; grid.y is the K slices
    /// ([`super::plan::splitk_slices`]).
    SplitK,
    /// A and B through TMA tensor maps (B as 3D boxes where [`wg::tma_b_3d`] offers them, its rank
    /// passed to the kernel), computed by mma.sync.
    MmaTma,
    /// MmaTma whose last partial wave is split along K ([`super::plan::TailPlan`]): a workspace
    /// and counters as SplitK.
    TailSplit,
    /// wgmma fed by TMA, on this tile and ring.
    Wgmma(wg::Tile),
    /// The CPU backend's [`super::reference::cpu_blocked`].
    Cpu,
}

/// How the blocks of a launch cover C.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// grid (ceil(N / bn), ceil(M / bm)).
    Xy,
    /// One block index over all tiles, unpacked by the kernel (grouped order for L2 reuse).
    Linear,
}

/// A gemm variant's launch facts.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub kind: Kind,
    /// The C tile one block owns: (rows, columns).
    pub tile: (usize, usize),
    pub grid: Grid,
    /// Threads per block, (x, y).
    pub block: (u32, u32),
    /// Dynamic shared memory in bytes: stages x (A slab + B slab), as `Pipe::SMEM` and
    /// `W64::SMEM` state it; the kernel traps when launched with less.
    pub smem: usize,
    /// Runs in the sweep only up to [`SLOW_MAX_MACS`] (the operation itself takes any size).
    pub slow: bool,
    /// The block's tile and pipeline in words, for the record's `extra.tile`.
    pub shape: &'static str,
}

const fn direct(tile: (usize, usize), grid: Grid, block: (u32, u32), smem: usize, shape: &'static str) -> Config {
    Config { kind: Kind::Direct, tile, grid, block, smem, slow: false, shape }
}

const fn wgmma(t: wg::Tile, shape: &'static str) -> Config {
    Config { kind: Kind::Wgmma(t), tile: (wg::BM, t.bn), grid: Grid::Linear, block: (t.threads(), 1), smem: t.smem(), slow: false, shape }
}

/// Dynamic shared memory of a cp.async ring: stages x (BM x BK + BK x BN) halves.
const fn ring(stages: usize, bm: usize, bn: usize, bk: usize) -> usize {
    stages * (bm * bk + bk * bn) * 2
}

const F32: &[DType] = &[DType::F32];
const HALF: &[DType] = &[DType::F16, DType::Bf16];
const ALL: &[DType] = &[DType::F32, DType::F16, DType::Bf16];

/// The ladder in the order the sweep measures it: fp32 SIMT, then fp16/bf16 tensor cores (the
/// TMA rungs on compute capability 9.0 only), then the CPU backend's variant.
pub const VARIANTS: &[Variant<Config>] = &[
    Variant {
        name: "naive",
        dtypes: F32,
        requires: Requires::Gpu,
        what: "one thread per output, K straight from global memory: the baseline",
        config: Config { slow: true, ..direct((8, 32), Grid::Xy, (32, 8), 0, "1 output/thread, block 32x8") },
    },
    Variant {
        name: "smem_tiled",
        dtypes: F32,
        requires: Requires::Gpu,
        what: "32x32 tiles of A and B staged in shared memory: global traffic / 32",
        config: Config { slow: true, ..direct((32, 32), Grid::Xy, (32, 32), 0, "32x32x32, 1024 threads") },
    },
    Variant {
        name: "blocktile_1d",
        dtypes: F32,
        requires: Requires::Gpu,
        what: "8 outputs per thread in a column: one B value from shared memory feeds 8 FMAs",
        config: direct((64, 64), Grid::Xy, (512, 1), 0, "64x64x8, 512 threads, 8x1 per thread"),
    },
    Variant {
        name: "blocktile_2d",
        dtypes: F32,
        requires: Requires::Gpu,
        what: "an 8x8 outer product per thread in registers: 16 shared loads feed 64 FMAs",
        config: direct((128, 128), Grid::Xy, (256, 1), 0, "128x128x8, 256 threads, 8x8 per thread"),
    },
    Variant {
        name: "vectorized",
        dtypes: F32,
        requires: Requires::Gpu,
        what: "blocktile_2d with float4 loads and A transposed in shared memory",
        config: direct((128, 128), Grid::Xy, (256, 1), 0, "128x128x8, 256 threads, 8x8 per thread, float4"),
    },
    Variant {
        name: "warptiled",
        dtypes: F32,
        requires: Requires::Gpu,
        what: "64x64 warp tiles and two shared buffers: warp-local reads, one barrier per slab",
        config: direct((128, 128), Grid::Xy, (128, 1), 0, "128x128x16, 4 warps of 64x64, 8x16 per thread, 2 smem buffers"),
    },
    Variant {
        name: "mma_ldmatrix",
        dtypes: HALF,
        requires: Requires::Gpu,
        what: "tensor cores: mma.sync m16n8k16 fed by ldmatrix from padded shared memory",
        config: direct((128, 128), Grid::Xy, (256, 1), 0, "128x128x32, 8 warps of 64x32, padded smem, 2 buffers"),
    },
    Variant {
        name: "mma_pipelined",
        dtypes: HALF,
        requires: Requires::Gpu,
        what: "a 4-stage cp.async ring into an XOR-swizzled layout, grouped block order",
        config: direct((128, 128), Grid::Linear, (256, 1), ring(4, 128, 128, 64), "128x128x64, 8 warps of 64x32, 4-stage cp.async, XOR swizzle"),
    },
    Variant {
        name: "mma_pipelined_wide",
        dtypes: HALF,
        requires: Requires::Gpu,
        what: "mma_pipelined on 128x256 tiles: twice the reuse per fragment",
        config: direct((128, 256), Grid::Linear, (256, 1), ring(4, 128, 256, 64), "128x256x64, 8 warps of 64x64, 4-stage cp.async, XOR swizzle"),
    },
    Variant {
        name: "mma_warp64",
        dtypes: HALF,
        requires: Requires::Gpu,
        what: "64x64 warp tiles and one barrier per slab: fewer instructions issued per mma",
        config: direct(
            (128, 128),
            Grid::Linear,
            (128, 1),
            ring(4, 128, 128, 32),
            "128x128x32, 4 warps of 64x64, 4-stage cp.async, 2 blocks/SM, one barrier per slab",
        ),
    },
    Variant {
        name: "mma_warp64_wide",
        dtypes: HALF,
        requires: Requires::Gpu,
        what: "mma_warp64's loop on 128x256 tiles, 5 stages: a third less L2 traffic per flop",
        config: direct((128, 256), Grid::Linear, (256, 1), ring(5, 128, 256, 32), "128x256x32, 8 warps of 64x64, 5-stage cp.async, one barrier per slab"),
    },
    Variant {
        name: "mma_warp64_k64",
        dtypes: HALF,
        requires: Requires::Gpu,
        what: "the wide loop on 64-deep slabs: half the barriers and waits per mma",
        config: direct((128, 256), Grid::Linear, (256, 1), ring(4, 128, 256, 64), "128x256x64, 8 warps of 64x64, 4-stage cp.async, one barrier per 64-deep slab"),
    },
    Variant {
        name: "mma_warp64_tma",
        dtypes: HALF,
        requires: Requires::Sm90a,
        what: "mma_warp64_k64's warps and loop, its slabs copied by TMA into an mbarrier ring",
        config: Config {
            kind: Kind::MmaTma,
            // wgmma_tma's ring and stage layout (full barriers only).
            smem: wg::WIDE.smem(),
            ..direct(
                (128, 256),
                Grid::Linear,
                (256, 1),
                0,
                "128x256x64, 8 warps of 64x64, 4-stage TMA ring (128B swizzle) issued by one lane of warp 0 after the one barrier per slab",
            )
        },
    },
    Variant {
        name: "mma_warp64_tail_split",
        dtypes: HALF,
        requires: Requires::Sm90a,
        what: "mma_warp64_tma with the tiles of the last partial wave split along K",
        config: Config {
            kind: Kind::TailSplit,
            smem: wg::WIDE.smem(),
            ..direct(
                (128, 256),
                Grid::Linear,
                (256, 1),
                0,
                "mma_warp64_tma's 128x256x64 blocks; the tiles of the last partial wave split along K, fp32 partials summed in slice order",
            )
        },
    },
    Variant {
        name: "mma_splitk",
        dtypes: HALF,
        requires: Requires::Gpu,
        what: "for decode shapes: 16-row tiles, K split over grid.y, partials summed in slice order",
        config: Config {
            kind: Kind::SplitK,
            ..direct(
                (16, 128),
                Grid::Linear,
                (256, 1),
                ring(4, 16, 128, 64),
                "16x128x64, 8 warps of 16x16, 4-stage cp.async, K split over grid.y, fp32 partials summed in slice order",
            )
        },
    },
    Variant {
        name: "wgmma_tma",
        dtypes: HALF,
        requires: Requires::Sm90a,
        what: "Hopper's data path: TMA into a 4-stage mbarrier ring, wgmma from shared memory",
        config: wgmma(wg::WIDE, "128x256x64, 3 warpgroups (1 TMA producer, 2 wgmma consumers of 64x256), 4-stage mbarrier ring, 128B swizzle"),
    },
    Variant {
        name: "wgmma_n128",
        dtypes: HALF,
        requires: Requires::Sm90a,
        what: "wgmma_tma's loop on 128x128 tiles, two blocks per SM: for shapes that idle SMs",
        config: wgmma(wg::N128, "128x128x64, 2 wgmma consumer warpgroups of 64x128 + 1 TMA producer warp, 3-stage mbarrier ring, 2 blocks/SM"),
    },
    Variant {
        name: "wgmma_n128_deep",
        dtypes: HALF,
        requires: Requires::Sm90a,
        what: "128x128 tiles with a producer warpgroup and 7 stages: more bytes in flight per SM",
        config: wgmma(wg::N128_DEEP, "128x128x64, 3 warpgroups (1 TMA producer, 2 wgmma consumers of 64x128), 7-stage mbarrier ring, 1 block/SM"),
    },
    Variant {
        name: "wgmma_n64_deep",
        dtypes: HALF,
        requires: Requires::Sm90a,
        what: "128x64 tiles, 9 stages: twice the blocks again, for M <= 128",
        config: wgmma(wg::N64_DEEP, "128x64x64, 3 warpgroups (1 TMA producer, 2 wgmma consumers of 64x64), 9-stage mbarrier ring, 1 block/SM"),
    },
    Variant {
        name: "cpu_blocked",
        dtypes: ALL,
        requires: Requires::Cpu,
        what: "f32 arithmetic, 64-row blocks in parallel over 512x256 panels of B kept in L2",
        config: Config { kind: Kind::Cpu, tile: (64, 512), grid: Grid::Xy, block: (1, 1), smem: 0, slow: false, shape: "" },
    },
];

/// The row called `name`, or an error listing the ladder.
pub fn find(name: &str) -> Result<&'static Variant<Config>> {
    variant::find(FAMILY, VARIANTS, name)
}

/// The GPU rungs of `dtype`, in ladder order.
pub fn gpu_ladder(dtype: DType) -> impl Iterator<Item = &'static Variant<Config>> {
    VARIANTS.iter().filter(move |v| v.requires.on_gpu() && v.dtypes.contains(&dtype))
}

impl Config {
    /// Takes A and B through TMA tensor maps (the sm_90a rungs).
    pub fn uses_tma(&self) -> bool {
        matches!(self.kind, Kind::MmaTma | Kind::TailSplit | Kind::Wgmma(_))
    }

    /// Grid, block and dynamic shared memory for an M x N output (mma_splitk: grid.y is set from
    /// the split; mma_warp64_tail_split: a block per tile here, the split blocks added at launch).
    pub fn launch_config(&self, m: usize, n: usize) -> LaunchConfig {
        let (bm, bn) = self.tile;
        let grid_dim = match self.grid {
            Grid::Xy => (n.div_ceil(bn) as u32, m.div_ceil(bm) as u32, 1),
            Grid::Linear => ((m.div_ceil(bm) * n.div_ceil(bn)) as u32, 1, 1),
        };
        LaunchConfig { grid_dim, block_dim: (self.block.0, self.block.1, 1), shared_mem_bytes: self.smem as u32 }
    }
}

/// Does the sweep run `v` on this shape and device (compute capability `arch`, 90 for 9.0)? Slow
/// rungs only up to 2048^3; the dynamic shared memory must fit the device; sm_90a rungs only on
/// 9.0. These skips are silent; [`not_applicable`] names the rest.
pub fn applies(v: &Variant<Config>, d: Dims, max_smem_optin: usize, arch: u32) -> bool {
    if v.requires == Requires::Sm90a && arch != 90 {
        return false;
    }
    if v.config.slow {
        return d.macs() <= SLOW_MAX_MACS;
    }
    v.config.smem <= max_smem_optin
}

/// Why `v` cannot take this shape, said once per case and kept in the record's `extra`: TMA (the
/// sm_90a rungs) reads rows whose stride is a multiple of 16 bytes, i.e. lda and ldb multiples of
/// 8 elements (K and N for dense operands). `None` when it can.
pub fn not_applicable(v: &Variant<Config>, d: Dims) -> Option<String> {
    if !v.config.uses_tma() {
        return None;
    }
    let bad: Vec<String> = [("lda", d.lda, "K", d.k), ("ldb", d.ldb, "N", d.n)]
        .iter()
        .filter(|t| !t.1.is_multiple_of(8))
        .map(|&(name, ld, dim, size)| if ld == size { format!("{dim} = {ld}") } else { format!("{name} = {ld}") })
        .collect();
    let verb = if bad.len() == 1 { "is" } else { "are" };
    (!bad.is_empty()).then(|| format!("TMA needs row strides that are multiples of 16 bytes (8 elements); {} {verb} not", bad.join(" and ")))
}

/// Why `v` cannot run this shape on a device allowing `max_smem_optin` bytes of shared memory per
/// block: its ring does not fit, or TMA cannot read the operands. `None` when it can.
pub fn refusal(v: &Variant<Config>, d: Dims, max_smem_optin: usize) -> Option<String> {
    if v.config.smem > max_smem_optin {
        return Some(format!("it needs {} bytes of shared memory per block; this device allows {max_smem_optin}", v.config.smem));
    }
    not_applicable(v, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(name: &str) -> &'static Variant<Config> {
        find(name).unwrap()
    }

    #[test]
    fn launch_shapes_cover_every_output() {
        for (m, n) in [(1, 1), (1, 4097), (4097, 513), (1000, 1000), (8192, 8192), (16, 14336)] {
            for var in VARIANTS.iter().filter(|v| v.requires.on_gpu()) {
                let cfg = var.config.launch_config(m, n);
                // The wgmma rungs' producer (a warpgroup or a warp) owns no outputs.
                let producer = match var.config.kind {
                    Kind::Wgmma(t) => t.threads() - 256,
                    _ => 0,
                };
                let threads = cfg.block_dim.0 * cfg.block_dim.1 - producer;
                let (bm, bn) = match var.name {
                    "naive" => (8, 32),
                    "smem_tiled" => (32, 32),
                    "blocktile_1d" => (64, 64),
                    "mma_pipelined_wide" | "mma_warp64_wide" | "mma_warp64_k64" | "mma_warp64_tma" | "mma_warp64_tail_split" | "wgmma_tma" => (128, 256),
                    "wgmma_n128" | "wgmma_n128_deep" => (128, 128),
                    "wgmma_n64_deep" => (128, 64),
                    "mma_splitk" => (16, 128),
                    _ => (128, 128),
                };
                let blocks = (cfg.grid_dim.0 * cfg.grid_dim.1) as usize;
                assert_eq!(blocks, m.div_ceil(bm) * n.div_ceil(bn), "{} {m}x{n}", var.name);
                let per_thread = match var.name {
                    "naive" | "smem_tiled" => 1,
                    "blocktile_1d" => 8,
                    "blocktile_2d" | "vectorized" => 64,
                    "warptiled" => 128,
                    "mma_ldmatrix" | "mma_pipelined" => 64,
                    "mma_splitk" => 8,
                    "wgmma_n128" | "wgmma_n128_deep" => 64,
                    "wgmma_n64_deep" => 32,
                    _ => 128,
                };
                assert_eq!(threads as usize * per_thread, bm * bn, "{}: threads x outputs per thread != tile", var.name);
                assert!(cfg.grid_dim.1 < 65536);
            }
        }
    }

    /// The figures the table states, as the kernels' rings and the earlier launcher had them.
    #[test]
    fn shared_memory_matches_the_kernels() {
        let smem = |name| v(name).config.smem;
        assert_eq!([smem("mma_pipelined"), smem("mma_pipelined_wide"), smem("mma_splitk")], [131072, 196608, 73728]);
        assert_eq!([smem("mma_warp64"), smem("mma_warp64_wide"), smem("mma_warp64_k64")], [65536, 122880, 196608]);
        assert_eq!([smem("wgmma_tma"), smem("wgmma_n128"), smem("wgmma_n128_deep"), smem("wgmma_n64_deep")], [197696, 99376, 230512, 222352]);
        assert_eq!(smem("mma_warp64_tma"), smem("wgmma_tma"));
        assert_eq!(smem("mma_warp64_tail_split"), smem("wgmma_tma"));
        for var in VARIANTS {
            assert_eq!(var.config.smem > 0, !matches!(var.config.kind, Kind::Cpu) && var.config.grid == Grid::Linear, "{}", var.name);
            assert!(var.config.smem <= 227 * 1024, "{} must fit H100's 227 KiB per block", var.name);
            assert_eq!(var.config.uses_tma(), var.requires == Requires::Sm90a, "{}", var.name);
        }
    }

    #[test]
    fn the_sweep_skips_what_the_device_cannot_hold() {
        assert!(!applies(v("mma_pipelined_wide"), Dims::dense(64, 64, 64), 163 * 1024, 90));
        assert!(!applies(v("naive"), Dims::dense(4096, 4096, 4096), 1 << 20, 90) && applies(v("naive"), Dims::dense(2048, 2048, 2048), 0, 90));
        let why = refusal(v("mma_pipelined_wide"), Dims::dense(64, 64, 64), 163 * 1024).unwrap();
        assert!(why.contains("needs 196608 bytes"), "{why}");
        assert_eq!(refusal(v("mma_warp64"), Dims::dense(4097, 513, 777), 163 * 1024), None);
        let names: Vec<_> = gpu_ladder(DType::F32).map(|v| v.name).collect();
        assert_eq!(names, ["naive", "smem_tiled", "blocktile_1d", "blocktile_2d", "vectorized", "warptiled"]);
        assert_eq!(gpu_ladder(DType::Bf16).count(), 13);
    }
}
