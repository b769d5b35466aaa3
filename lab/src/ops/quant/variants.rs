//! The quant table: every kernel of kernels/quant/ and every CPU path, named once and without
//! parameters. Scheme, batch and format are case parameters; [`kernel_symbol`] builds the
//! kernel symbol from (variant, scheme, batch) or (variant, format), [`q8_symbol`] those of the
//! Q8_0 ops.

use crate::kernels::{symbol, DType};
use crate::ops::variant::{self, Requires, Variant, VariantInfo};
use crate::quant::group::{Format, Scheme};
use crate::{LabError, Result};

pub const FAMILY: &str = "quant";

/// Batches (rows of X) the W4A16 kernels are instantiated for (W4A16_RUNG in kernels/quant/).
pub const BATCHES: &[usize] = &[1, 2, 4, 8, 16];

/// How a variant runs.
#[derive(Clone, Copy, Debug)]
pub enum Kernel {
    /// `pack_int4` / `unpack_int4`: codes <-> two per byte, grid-stride.
    PackInt4,
    UnpackInt4,
    /// Dequantize to f16; `cp_async` stages GGUF blocks with cp.async (Q4_0 / Q4_1 only).
    Dequant { cp_async: bool },
    /// The read floor: `loads` 16 B loads in flight per thread, `blocks_per_sm` blocks of 256.
    StreamRead { loads: usize, blocks_per_sm: usize },
    /// A W4A16 GEMV/GEMM design.
    W4(W4Design),
    /// Q8_0 weights as stored: the W8A16 product ([`w8a16_shape`]) and the row gather.
    W8a16,
    Embed,
    /// The CPU paths.
    CpuPack,
    CpuUnpack,
    CpuQuantize,
    CpuDequantize,
    CpuW4a16,
    CpuW8a16,
    CpuEmbed,
}

/// One W4A16 design: kernels `<name>_{sym,asym}_b{B}` with the same arguments, each block of
/// `warps` warps owning `rows` rows of W (a grid of N / rows blocks). A split-K design also
/// splits K over [`splitk_slices`] blocks per tile (grid.y) and takes an fp32 workspace
/// (slices x B x N) and a zeroed u32 counter per tile after Y. A pipelined design runs a
/// persistent grid ([`pipelined_grid`]) with a dynamic shared-memory ring ([`pipelined_smem`]).
/// A tiled design reads W (codes, scales, mins) in a tile layout of [`crate::quant::tiles`]
/// ([`Layout`]); one with a [`Ring`] stages its loads in per-warp shared-memory rings.
/// `model` says what it computes ([`Model`], replayed by [`super::models::w4a16_model`]).
#[derive(Clone, Copy, Debug)]
pub struct W4Design {
    pub rows: usize,
    pub warps: usize,
    pub model: Model,
    pub layout: Layout,
    pub ring: Ring,
}

/// What a W4A16 design computes, as its CPU model replays it: the decode, which warp sums which
/// steps in which order, where it rounds. Designs that differ only in how they load (rolling
/// loads, cp.async or TMA rings, L2 prefetches) compute the same sums and share a model: the
/// table gives them the same value rather than a model each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// kernels/quant/w4a16.cu: f32 FMAs over 8-weight code words, a warp's butterfly, then its 4
    /// warps in order ([`super::models::w4a16_cuda_cores`], which `cpu_w4a16` runs too).
    CudaCores,
    /// The tensor-core warp step ([`crate::quant::w4a16_mma_model::w4a16_mma`]) with the
    /// design's warps, each over a contiguous slice of K's steps, or (step-major layout) taking
    /// the tile's steps in turn; `post`: the scales applied after the MMAs where the kernel can
    /// (symmetric codes, group % 128 == 0).
    Mma { post: bool },
    /// w4a16_mma with K split over blocks too, partials summed by the tile's last block.
    SplitK,
    /// The warp step decoding from a shared-memory ring, persistent grid.
    Pipelined,
}

/// Where a design reads W's codes: row-major (as quantized), in the tile layout
/// ([`crate::quant::tiles::tile`]: one 1 KB block per (tile, step), tile after tile), or in its
/// step-major order ([`crate::quant::tiles::step_major`]); the tiled layouts share their scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Rows,
    Tiles,
    StepMajor,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Rows => "rows",
            Layout::Tiles => "tiles",
            Layout::StepMajor => "step-major tiles",
        }
    }
}

/// How a design stages its loads in shared memory: not at all, per lane with cp.async
/// (w4a16_mma_tiled_async), or per step with one TMA bulk copy (w4a16_mma_tiled_bulk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    None,
    Async,
    Bulk,
}

/// RING_STEPS: steps in a w4a16_mma_tiled_async warp's ring.
pub const RING_STEPS: usize = 4;
/// BULK_STEPS: 1 KB slots in a w4a16_mma_tiled_bulk warp's ring.
pub const BULK_STEPS: usize = 4;
/// RingSlot<ASYM>::BYTES: codes [2][32] x 16 B, then the lanes' scale (and min) pair words.
pub fn ring_slot_bytes(scheme: Scheme) -> usize {
    if scheme == Scheme::Asym { 1280 } else { 1152 }
}

impl Ring {
    /// Dynamic shared memory per block of 8 warps: RING_STEPS slots per warp (async),
    /// BULK_STEPS x 1 KB (bulk).
    pub fn smem(self, scheme: Scheme) -> usize {
        match self {
            Ring::None => 0,
            Ring::Async => 8 * RING_STEPS * ring_slot_bytes(scheme),
            Ring::Bulk => 8 * BULK_STEPS * 1024,
        }
    }
}

/// PIPE_CHUNKS, PIPE_STAGES, PIPE_SVECS and PIPE_BLOCKS_PER_SM: 16 B code chunks per row per
/// stage, stages in the ring, 16 B scale vectors per row per stage, blocks per SM.
pub const PIPE_CHUNKS: usize = 32;
pub const PIPE_STAGES: usize = 8;
pub const PIPE_SVECS: usize = 5;
pub const PIPE_BLOCKS_PER_SM: usize = 2;
/// GGML_SEGS: 32-block segments per warp step of the cp.async GGUF dequantize.
pub const GGML_SEGS: usize = 2;

/// W8_WARPS, W8_ROWS and W8_RUN_VECS: warps per w8a16 block, rows a warp owns at most, 16 B
/// vectors of a warp's staged run.
pub const W8_WARPS: usize = 8;
pub const W8_ROWS: usize = 16;
pub const W8_RUN_VECS: usize = 72;
/// Batches (rows of X) the w8a16 kernels are instantiated for; a launch takes any batch up to
/// its instantiation.
pub const W8_BATCHES: &[usize] = &[1, 2, 4, 8, 16];
/// The most dynamic shared memory a w8a16 launch gives its copy of X (two blocks still fit an SM).
pub const W8_X_SMEM_MAX: usize = 96 * 1024;

/// The instantiation a w8a16 launch of `batch` rows of X (1..=16) runs.
pub fn w8a16_instance(batch: usize) -> usize {
    W8_BATCHES.iter().copied().find(|&b| b >= batch).unwrap_or(16)
}

/// Shared memory of a w8a16 launch of instantiation `b` on `batch` rows of X of length K: the
/// static stage and accumulators, and the dynamic copy of X (each 32 halves padded to 40).
pub fn w8a16_smem(b: usize, batch: usize, k: usize) -> (usize, usize) {
    (W8_WARPS * (16 * W8_RUN_VECS + 4 * W8_ROWS * b), 80 * batch * (k / 32))
}

/// Rows of X one w8a16 launch takes for K: the largest instantiation whose copy of X fits in
/// [`W8_X_SMEM_MAX`] (larger batches run in launches of that many rows, each reading all of W);
/// None when not even one row fits (K above 39,000 or so).
pub fn w8a16_chunk(k: usize) -> Option<usize> {
    W8_BATCHES.iter().rev().copied().find(|&b| w8a16_smem(b, b, k).1 <= W8_X_SMEM_MAX)
}

/// (grid, rows per warp) of a w8a16 launch over N rows: the most rows per warp (up to 16) that
/// still give every SM two blocks of W8_WARPS warps, else one row per warp. A warp's rows are
/// one run of blocks, so more rows per warp keep its lanes busy when K / 32 is not a multiple
/// of 32 (SmolLM2's LM head: N = 49152, K = 576, 16 rows = 9 runs of 32 blocks, 384 blocks).
pub fn w8a16_shape(n: usize, sms: usize) -> (usize, usize) {
    let blocks = |rows: usize| n.div_ceil(W8_WARPS * rows);
    let rows = [16, 8, 4, 2].into_iter().find(|&r| blocks(r) >= 2 * sms).unwrap_or(1);
    (blocks(rows), rows)
}

/// Dynamic shared memory of w4a16_mma_pipelined: PIPE_STAGES x PipeStage<ASYM>::VECS x 16 B.
pub fn pipelined_smem(scheme: Scheme) -> usize {
    PIPE_STAGES * 16 * pipe_stage_vecs(scheme)
}

/// PipeStage<ASYM>::VECS: 16 B vectors of one stage (codes, then scales and mins per row).
pub fn pipe_stage_vecs(scheme: Scheme) -> usize {
    let tables = if scheme == Scheme::Asym { 2 } else { 1 };
    16 * PIPE_CHUNKS + tables * 16 * PIPE_SVECS
}

/// The persistent grid of w4a16_mma_pipelined: tiles per block ceil(tiles / slots), then as
/// few blocks as give every block that many tiles (the last may have fewer).
pub fn pipelined_grid(n: usize, sms: usize) -> usize {
    let tiles = n.div_ceil(16);
    let tpb = tiles.div_ceil(sms * PIPE_BLOCKS_PER_SM);
    tiles.div_ceil(tpb)
}

/// Steps (128 weights of a row) a w4a16_mma warp keeps in flight: MmaSteps<B>::U.
pub fn mma_steps_in_flight(batch: usize) -> usize {
    if batch > 8 { 3 } else { 4 }
}

/// Blocks per 16-row tile of w4a16_mma_splitk: enough that each of their 4 warps owns at most
/// the steps it keeps in flight (one load round).
pub fn splitk_slices(k: usize, batch: usize) -> usize {
    (k / 32).div_ceil(4).div_ceil(4 * mma_steps_in_flight(batch)).max(1)
}

impl W4Design {
    /// Blocks along K per tile (1 unless split-K).
    pub fn slices(&self, k: usize, batch: usize) -> usize {
        if self.split_k() { splitk_slices(k, batch) } else { 1 }
    }
    pub fn split_k(&self) -> bool {
        self.model == Model::SplitK
    }
    pub fn pipelined(&self) -> bool {
        self.model == Model::Pipelined
    }
    /// Blocks per SM the design is built for (its __launch_bounds__ minimum).
    pub fn blocks_per_sm(&self) -> usize {
        if self.pipelined() { PIPE_BLOCKS_PER_SM } else { 4 }
    }
    /// (grid, block, dynamic shared memory) of a launch.
    pub fn launch_shape(&self, n: usize, k: usize, batch: usize, scheme: Scheme, sms: usize) -> ((usize, usize), usize, usize) {
        let block = 32 * self.warps;
        if self.pipelined() {
            return ((pipelined_grid(n, sms), 1), block, pipelined_smem(scheme));
        }
        ((n.div_ceil(self.rows), self.slices(k, batch)), block, self.ring.smem(scheme))
    }
}

const F16: &[DType] = &[DType::F16];

const fn w4(rows: usize, warps: usize, model: Model, layout: Layout, ring: Ring) -> Kernel {
    Kernel::W4(W4Design { rows, warps, model, layout, ring })
}

/// The tensor-core step with the scales inside the decode, and after the MMAs where it can.
const MMA: Model = Model::Mma { post: false };
const POST: Model = Model::Mma { post: true };

const fn gpu(name: &'static str, requires: Requires, what: &'static str, config: Kernel) -> Variant<Kernel> {
    Variant { name, dtypes: F16, requires, what, config }
}

/// The table, in the order the experiment measures: the only place a quant variant is named.
/// Every kernel's symbol ends in _f16, the family's activation and dequantized-output type.
pub const VARIANTS: &[Variant<Kernel>] = &[
    gpu("pack_int4", Requires::Gpu, "codes (one per byte) -> two per byte, low nibble first, 16 B loads and stores", Kernel::PackInt4),
    gpu("unpack_int4", Requires::Gpu, "the inverse, staged per warp: coalesced 16 B loads and stores", Kernel::UnpackInt4),
    gpu("dequant", Requires::Gpu, "4-bit weights (group-wise or GGUF blocks) or Q8_0 -> f16, bit-exact with the CPU", Kernel::Dequant { cp_async: false }),
    gpu("dequant_cp_async", Requires::Gpu, "GGUF blocks only: 64 blocks per warp step staged with cp.async, every copy in flight at once", Kernel::Dequant { cp_async: true }),
    gpu("stream_read", Requires::Gpu, "the floor: reads a W4A16 design's bytes once and decodes nothing", Kernel::StreamRead { loads: 1, blocks_per_sm: 32 }),
    gpu("stream_read_x4", Requires::Gpu, "the floor with 4 loads in flight per thread", Kernel::StreamRead { loads: 4, blocks_per_sm: 8 }),
    gpu("stream_read_x8", Requires::Gpu, "the floor with 8 loads in flight per thread", Kernel::StreamRead { loads: 8, blocks_per_sm: 8 }),
    // CUDA cores: 4 rows per block, K split across 128 threads in 4-byte code words.
    gpu("w4a16", Requires::Gpu, "CUDA cores: 4 rows per block, K across 128 threads in 4 B code words", w4(4, 4, Model::CudaCores, Layout::Rows, Ring::None)),
    gpu("w4a16_mma", Requires::Gpu, "tensor cores: 16-row tiles, K over 4 warps, 16 B streaming loads, 4 steps in flight", w4(16, 4, MMA, Layout::Rows, Ring::None)),
    gpu(
        "w4a16_mma_splitk",
        Requires::Gpu,
        "w4a16_mma with K split over blocks too: one load round per warp, partials summed by the tile's last block",
        w4(16, 4, Model::SplitK, Layout::Rows, Ring::None),
    ),
    gpu(
        "w4a16_mma_pipelined",
        Requires::Gpu,
        "the warp step decoding from shared memory: an 8-stage cp.async ring, persistent grid of 8-warp blocks",
        w4(16, 8, Model::Pipelined, Layout::Rows, Ring::None),
    ),
    gpu("w4a16_mma_occ8", Requires::Gpu, "w4a16_mma with K over 8 warps, 2 steps in flight, 64 registers: twice the warps per SM", w4(16, 8, MMA, Layout::Rows, Ring::None)),
    gpu("w4a16_mma_tiled", Requires::Gpu, "occ8 on weights in the tile layout: every warp load is 512 contiguous bytes", w4(16, 8, MMA, Layout::Tiles, Ring::None)),
    gpu("w4a16_mma_tiled_rolling", Requires::Gpu, "tiled with rolling loads: a slot refilled as soon as its step is decoded (tiled's sums)", w4(16, 8, MMA, Layout::Tiles, Ring::None)),
    gpu("w4a16_mma_tiled_async", Requires::Gpu, "tiled with each lane's loads staged by cp.async through a per-warp shared-memory ring (tiled's sums)", w4(16, 8, MMA, Layout::Tiles, Ring::Async)),
    gpu("w4a16_mma_tiled_prefetch", Requires::Gpu, "tiled with each warp's next round bulk-prefetched into L2 (tiled's sums)", w4(16, 8, MMA, Layout::Tiles, Ring::None)),
    gpu("w4a16_mma_tiled_post", Requires::Gpu, "tiled with the scales applied after the MMAs where a step is one group (sym, group % 128 == 0)", w4(16, 8, POST, Layout::Tiles, Ring::None)),
    gpu("w4a16_mma_tiled_sweep", Requires::Gpu, "tiled_post with the block's warps taking its tile's steps in turn (step-major layout)", w4(16, 8, POST, Layout::StepMajor, Ring::None)),
    gpu("w4a16_mma_tiled_sweep4", Requires::Gpu, "tiled_sweep on 4 warps at 128 registers, 3-4 steps per warp rolling", w4(16, 4, POST, Layout::StepMajor, Ring::None)),
    gpu("w4a16_mma_tiled_bulk", Requires::Gpu, "tiled_sweep with each warp's steps copied by TMA into a 4-slot ring (sm_90; tiled_sweep before; sweep's sums)", w4(16, 8, POST, Layout::StepMajor, Ring::Bulk)),
    gpu("w8a16", Requires::Gpu, "Q8_0 as stored, f32 out: a warp stages runs of 32 blocks with 16 B loads, one block per lane", Kernel::W8a16),
    Variant { name: "embed", dtypes: &[DType::F32], requires: Requires::Gpu, what: "Q8_0 rows at token ids -> f32, a warp per row", config: Kernel::Embed },
    Variant { name: "cpu_pack", dtypes: F16, requires: Requires::Cpu, what: "INT4 packing, eight codes per u64 (SWAR), chunks in parallel", config: Kernel::CpuPack },
    Variant { name: "cpu_unpack", dtypes: F16, requires: Requires::Cpu, what: "the inverse", config: Kernel::CpuUnpack },
    Variant { name: "cpu_quantize", dtypes: F16, requires: Requires::Cpu, what: "group-wise or GGUF-block quantization of an f32 matrix, rows in parallel", config: Kernel::CpuQuantize },
    Variant {
        name: "cpu_dequantize",
        dtypes: &[DType::F32, DType::F16],
        requires: Requires::Cpu,
        what: "dequantization, rows in parallel (f32 product then f32 sum, as the GPU)",
        config: Kernel::CpuDequantize,
    },
    Variant { name: "cpu_w4a16", dtypes: F16, requires: Requires::Cpu, what: "w4a16's arithmetic: codes decoded inside f32 FMAs per 8-weight word, summed in the kernel's order, rows in parallel", config: Kernel::CpuW4a16 },
    Variant { name: "cpu_w8a16", dtypes: F16, requires: Requires::Cpu, what: "w8a16's arithmetic: f32 FMAs per block times d, runs of 32 blocks summed in the kernel's order, f32 out", config: Kernel::CpuW8a16 },
    Variant { name: "cpu_embed", dtypes: &[DType::F32], requires: Requires::Cpu, what: "Q8_0 rows at token ids -> f32", config: Kernel::CpuEmbed },
];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// The row called `name`, or an error listing the table.
pub fn find(name: &str) -> Result<&'static Variant<Kernel>> {
    variant::find(FAMILY, VARIANTS, name)
}

/// The W4A16 designs, in table order.
pub fn w4_designs() -> impl Iterator<Item = (&'static str, W4Design)> {
    VARIANTS.iter().filter_map(|v| match v.config {
        Kernel::W4(d) => Some((v.name, d)),
        _ => None,
    })
}

/// The stream reads, in table order: (name, loads per thread, blocks of 256 per SM).
pub fn stream_reads() -> impl Iterator<Item = (&'static str, usize, usize)> {
    VARIANTS.iter().filter_map(|v| match v.config {
        Kernel::StreamRead { loads, blocks_per_sm } => Some((v.name, loads, blocks_per_sm)),
        _ => None,
    })
}

/// The kernel a W4A16 design runs for a scheme and batch: `<design>_<scheme>_b<batch>`.
pub fn w4_kernel(design: &str, scheme: Scheme, batch: usize) -> String {
    format!("{design}_{}_b{batch}", scheme.name())
}

/// The kernel a dequantize variant runs for a format: one per group scheme (the group size is
/// an argument), one per GGUF block type (`_cp_async` too); None where the variant does not
/// take the format.
pub fn dequant_kernel(variant: &str, format: Format) -> Option<String> {
    match (variant, format) {
        ("dequant", Format::Group { scheme, .. }) => Some(format!("dequant_{}", scheme.name())),
        ("dequant", Format::Q4_0 | Format::Q4_1) => Some(format!("dequant_{}", format.name())),
        ("dequant_cp_async", Format::Q4_0 | Format::Q4_1) => Some(format!("dequant_{}_cp_async", format.name())),
        _ => None,
    }
}

/// The one place a quant kernel symbol is spelled: `quant_<kernel>_f16`, the kernel from the
/// variant and (for W4A16) scheme and batch, or (for dequantize) the format.
pub fn kernel_symbol(variant: &str, scheme: Scheme, batch: usize, format: Format) -> Result<String> {
    let v = find(variant)?;
    let kernel = match v.config {
        Kernel::W4(_) => w4_kernel(v.name, scheme, batch),
        Kernel::Dequant { .. } => dequant_kernel(v.name, format)
            .ok_or_else(|| LabError::Invalid(format!("quant variant `{variant}` does not take the {} format", format.name())))?,
        Kernel::PackInt4 | Kernel::UnpackInt4 | Kernel::StreamRead { .. } => v.name.to_string(),
        Kernel::W8a16 | Kernel::Embed => return q8_symbol(variant, batch),
        _ => return Err(LabError::Invalid(format!("quant variant `{variant}` runs on the CPU: it has no kernel"))),
    };
    Ok(symbol(FAMILY, &kernel, DType::F16))
}

/// The kernel a variant runs on Q8_0 weights: `quant_w8a16_b<B>_f16` (B the instantiation for
/// `batch`, f16 activations), `quant_embed_q8_0_f32` or `quant_dequant_q8_0_f16`.
pub fn q8_symbol(variant: &str, batch: usize) -> Result<String> {
    let v = find(variant)?;
    Ok(match v.config {
        Kernel::W8a16 => symbol(FAMILY, &format!("w8a16_b{}", w8a16_instance(batch)), DType::F16),
        Kernel::Embed => symbol(FAMILY, "embed_q8_0", DType::F32),
        Kernel::Dequant { cp_async: false } => symbol(FAMILY, "dequant_q8_0", DType::F16),
        _ => return Err(LabError::Invalid(format!("quant variant `{variant}` does not take Q8_0 weights on the GPU"))),
    })
}

/// Every kernel symbol the table runs: what kernels/quant/ must export.
pub fn gpu_kernels() -> Vec<String> {
    let formats = [Format::Group { scheme: Scheme::Sym, group: 128 }, Format::Group { scheme: Scheme::Asym, group: 128 }, Format::Q4_0, Format::Q4_1];
    let f16 = |kernel: String| symbol(FAMILY, &kernel, DType::F16);
    let mut out = Vec::new();
    for v in VARIANTS.iter().filter(|v| v.requires.on_gpu()) {
        match v.config {
            Kernel::W4(_) => {
                for scheme in [Scheme::Sym, Scheme::Asym] {
                    out.extend(BATCHES.iter().map(|&b| f16(w4_kernel(v.name, scheme, b))));
                }
            }
            Kernel::Dequant { .. } => out.extend(formats.iter().filter_map(|&f| dequant_kernel(v.name, f)).map(f16).chain(q8_symbol(v.name, 1).ok())),
            Kernel::W8a16 => out.extend(W8_BATCHES.iter().map(|&b| q8_symbol(v.name, b).expect("a Q8_0 kernel"))),
            Kernel::Embed => out.push(q8_symbol(v.name, 1).expect("a Q8_0 kernel")),
            _ => out.push(f16(v.name.to_string())),
        }
    }
    out
}

/// Records written before the table named variants with their parameters: `<design>_<scheme>_b<batch>`
/// (W4A16), `dequant_<sym|asym|q4_0|q4_1>[_cp_async]`, `cpu_quantize_<format>`,
/// `cpu_dequantize_<format>` and, in the SmolLM2 table, the bare format name. The current name
/// and the params the old name carried (scheme, batch, format), for reading old records beside
/// new ones; None for a current name. The old records' params already hold these values.
pub fn legacy_name(variant: &str, params: &serde_json::Value) -> Option<(&'static str, serde_json::Map<String, serde_json::Value>)> {
    use serde_json::json;
    if VARIANTS.iter().any(|v| v.name == variant) {
        return None;
    }
    let mut extra = serde_json::Map::new();
    // <design>_<scheme>_b<batch>
    if let Some((head, batch)) = variant.rsplit_once("_b") {
        if let Ok(batch) = batch.parse::<u64>() {
            for scheme in [Scheme::Sym, Scheme::Asym] {
                if let Some(design) = head.strip_suffix(&format!("_{}", scheme.name())) {
                    if let Some((name, _)) = w4_designs().find(|(n, _)| *n == design) {
                        extra.insert("scheme".into(), json!(scheme.name()));
                        extra.insert("batch".into(), json!(batch));
                        return Some((name, extra));
                    }
                }
            }
        }
    }
    let format_name = |s: &str| Format::all().into_iter().map(|f| f.name()).find(|f| f == s);
    if let Some(rest) = variant.strip_prefix("dequant_") {
        let (kind, name) = match rest.strip_suffix("_cp_async") {
            Some(r) => (r, "dequant_cp_async"),
            None => (rest, "dequant"),
        };
        // dequant_sym / dequant_asym: the group size lives in the params' format already.
        if matches!(kind, "sym" | "asym" | "q4_0" | "q4_1") {
            if matches!(kind, "q4_0" | "q4_1") {
                extra.insert("format".into(), json!(kind));
            }
            return Some((name, extra));
        }
    }
    for (prefix, name) in [("cpu_quantize_", "cpu_quantize"), ("cpu_dequantize_", "cpu_dequantize")] {
        if let Some(f) = variant.strip_prefix(prefix).and_then(format_name) {
            extra.insert("format".into(), json!(f));
            return Some((name, extra));
        }
    }
    if params.get("op").and_then(|o| o.as_str()) == Some("smollm2") {
        if let Some(f) = format_name(variant) {
            extra.insert("format".into(), json!(f));
            return Some(("cpu_quantize", extra));
        }
    }
    None
}

/// A quant record's variant and params as the table names them now (old names normalized with
/// [`legacy_name`]; params the old name carried are added where missing). Other experiments'
/// records come back unchanged.
pub fn current_name(experiment: &str, variant: &str, params: &serde_json::Value) -> (String, serde_json::Value) {
    if experiment != FAMILY {
        return (variant.to_string(), params.clone());
    }
    match legacy_name(variant, params) {
        Some((name, extra)) => {
            let mut p = params.clone();
            if let Some(map) = p.as_object_mut() {
                for (k, v) in extra {
                    map.entry(k).or_insert(v);
                }
            }
            (name.to_string(), p)
        }
        None => (variant.to_string(), params.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_carry_no_parameters_and_symbols_are_built_in_one_place() {
        for v in VARIANTS {
            assert!(!v.name.contains("_sym") && !v.name.contains("_asym") && !v.name.contains("_g") && !v.name.ends_with("_b1"), "{}", v.name);
        }
        let asym = Format::Group { scheme: Scheme::Asym, group: 32 };
        assert_eq!(kernel_symbol("w4a16_mma_pipelined", Scheme::Asym, 16, asym).unwrap(), "quant_w4a16_mma_pipelined_asym_b16_f16");
        assert_eq!(kernel_symbol("dequant", Scheme::Sym, 1, asym).unwrap(), "quant_dequant_asym_f16");
        assert_eq!(kernel_symbol("dequant_cp_async", Scheme::Sym, 1, Format::Q4_1).unwrap(), "quant_dequant_q4_1_cp_async_f16");
        assert!(kernel_symbol("dequant_cp_async", Scheme::Sym, 1, asym).unwrap_err().to_string().contains("does not take the asym_g32 format"));
        assert!(kernel_symbol("cpu_pack", Scheme::Sym, 1, asym).unwrap_err().to_string().contains("runs on the CPU"));
        assert_eq!(kernel_symbol("w8a16", Scheme::Sym, 3, asym).unwrap(), "quant_w8a16_b4_f16");
        assert_eq!(q8_symbol("embed", 1).unwrap(), "quant_embed_q8_0_f32");
        assert_eq!(q8_symbol("dequant", 1).unwrap(), "quant_dequant_q8_0_f16");
        assert!(q8_symbol("dequant_cp_async", 1).unwrap_err().to_string().contains("does not take Q8_0"));
        // 13 designs x 2 schemes x 5 batches, 6 + 1 dequantize kernels, pack, unpack, 3 stream
        // reads, 5 W8A16 batches and the embedding gather.
        assert_eq!(w4_designs().count(), 13);
        assert_eq!(gpu_kernels().len(), 13 * 2 * BATCHES.len() + 7 + 2 + 3 + W8_BATCHES.len() + 1);
        assert_eq!(gpu_kernels().into_iter().collect::<std::collections::BTreeSet<_>>().len(), gpu_kernels().len());
    }

    /// A w8a16 grid covers every row with at most W8_ROWS rows per warp, and batches map to the
    /// smallest instantiation that holds them.
    #[test]
    fn w8a16_launches_cover_every_row() {
        assert_eq!(w8a16_shape(49152, 132), (384, 16));
        for (n, sms) in [(1, 132), (37, 132), (576, 132), (49152, 132), (49153, 16), (100_000, 1)] {
            let (grid, rows) = w8a16_shape(n, sms);
            assert!(grid * W8_WARPS * rows >= n && (grid - 1) * W8_WARPS * rows < n && (1..=W8_ROWS).contains(&rows), "N={n}");
        }
        assert_eq!((1..=16).map(w8a16_instance).collect::<Vec<_>>(), [1, 2, 4, 4, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16]);
        // SmolLM2's K = 576 takes 16 rows of X in 23 KB; K = 4096 8 rows; K = 65536 none.
        assert_eq!((w8a16_chunk(576), w8a16_chunk(4096), w8a16_chunk(65536)), (Some(16), Some(8), None));
        assert_eq!(w8a16_smem(16, 16, 576), (8 * (1152 + 1024), 23040));
    }

    #[test]
    fn old_names_map_to_the_table_and_the_params_they_carried() {
        // A real line of reports/records/2026-11-23T02-11-08Z-h100-4ad7b7b.jsonl.gz, trimmed to
        // the fields the reader looks at.
        let line = r#"{"experiment":"quant","variant":"w4a16_mma_tiled_sweep4_sym_b16","provider":"lab","params":{"batch":16,"group":128,"k":8192,"n":8192,"op":"w4a16","scheme":"sym"}}"#;
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let (name, params) = current_name("quant", r["variant"].as_str().unwrap(), &r["params"]);
        assert_eq!((name.as_str(), &params), ("w4a16_mma_tiled_sweep4", &r["params"]));
        // The scheme and batch come back from the name where params lack them.
        let (name, params) = current_name("quant", "w4a16_asym_b2", &json!({"op": "w4a16"}));
        assert_eq!((name.as_str(), params), ("w4a16", json!({"op": "w4a16", "scheme": "asym", "batch": 2})));
        // w4a16_mma_tiled_sym_b1 is tiled, not w4a16_mma with a stray suffix.
        assert_eq!(legacy_name("w4a16_mma_tiled_sym_b1", &json!({})).unwrap().0, "w4a16_mma_tiled");
        let fmt = json!({"op": "format", "format": "q4_0"});
        assert_eq!(current_name("quant", "dequant_q4_0_cp_async", &fmt).0, "dequant_cp_async");
        assert_eq!(current_name("quant", "dequant_sym", &json!({"format": "sym_g128"})), ("dequant".into(), json!({"format": "sym_g128"})));
        assert_eq!(current_name("quant", "cpu_quantize_asym_g64", &json!({})), ("cpu_quantize".into(), json!({"format": "asym_g64"})));
        assert_eq!(current_name("quant", "cpu_dequantize_q4_1", &json!({})).0, "cpu_dequantize");
        assert_eq!(current_name("quant", "sym_g32", &json!({"op": "smollm2", "format": "sym_g32"})).0, "cpu_quantize");
        // Current names, other experiments and unknown names pass through.
        for (e, v) in [("quant", "w4a16_mma"), ("quant", "stream_read"), ("softmax", "w4a16_sym_b1"), ("quant", "w4a16_mma_sym_b3x")] {
            assert_eq!(current_name(e, v, &json!({})).0, v);
        }
    }
}
