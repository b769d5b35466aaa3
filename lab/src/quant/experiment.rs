//! The `quant` experiment (kernels/quant.cu on the GPU, the `quant` modules on the CPU).
//!
//! Cases, by `op`:
//! - `int4`: pack / unpack `n` codes (bytes moved: `n` codes + `n/2` packed).
//! - `format`: quantize and dequantize a `rows x cols` matrix in one [`Format`]; on the GPU the
//!   dequantize kernel (bytes: the quantized form read + f16 written), checked to the bit.
//! - `w4a16`: Y = X W^T with 4-bit W (group-wise, f16 scales), f16 X and Y, batches 1..16, every
//!   design of [`W4_DESIGNS`] beside cuBLAS fp16 GEMM on the dequantized weights (GPU only). Bytes: everything the
//!   kernel must read and write (codes, scales, X, Y); flops `2 B N K`.
//! - `smollm2`: the per-tensor requantization table of SmolLM2-135M (`LAB_SMOLLM2_GGUF`): each
//!   Q4_1 tensor dequantized, requantized in every format, and measured (untimed).

use super::ggml::{self, Block};
use super::group::{self, check_finite, footprint, Format, GroupQuant, Scheme};
use super::int4;
use super::tiles;
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Measurement, Session};
use crate::gpu::{timing::time_gpu, Gpu};
use crate::kernels::{symbol, DType};
use crate::ops::compare::{compare, compare_bits, first_failure};
use crate::profile::{cpu_time, Work};
use crate::record::{ErrorStats, Tolerance};
use crate::{LabError, Result};
use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use half::f16;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct Quant;

const FAMILY: &str = "quant";
/// The environment variable naming SmolLM2-135M-Instruct.Q4_1.gguf.
pub const SMOLLM2_ENV: &str = "LAB_SMOLLM2_GGUF";
pub const BATCHES: &[usize] = &[1, 2, 4, 8, 16];
/// The W4A16 relative tolerance against the f64 product of the dequantized weights.
const W4_REL: f64 = 1e-2;

/// One W4A16 design: kernels `<name>_{sym,asym}_b{B}` with the same arguments, each block of
/// `warps` warps owning `rows` rows of W (a grid of N / rows blocks). A split-K design also
/// splits K over `splitk_slices` blocks per tile (grid.y) and takes an fp32 workspace
/// (slices x B x N) and a zeroed u32 counter per tile after Y. A pipelined design runs a
/// persistent grid ([`pipelined_grid`]) with a dynamic shared-memory ring ([`pipelined_smem`]).
/// A tiled design reads W (codes, scales, mins) in a tile layout of [`super::tiles`] ([`Layout`]);
/// one with a [`Ring`] stages its loads in per-warp shared-memory rings ([`Ring::smem`]).
#[derive(Clone, Copy, Debug)]
pub struct W4Design {
    pub name: &'static str,
    pub rows: usize,
    pub warps: usize,
    pub split_k: bool,
    pub pipelined: bool,
    pub layout: Layout,
    pub ring: Ring,
}

/// The W4A16 rungs, measured side by side on every case (quant.cu's W4A16 and W4A16_MMA).
pub const W4_DESIGNS: &[W4Design] = &[
    // CUDA cores: 4 rows per block, K split across 128 threads in 4-byte code words.
    W4Design { name: "w4a16", rows: 4, warps: 4, split_k: false, pipelined: false, layout: Layout::Rows, ring: Ring::None },
    // Tensor cores: 16-row tiles, K split across 4 warps, 16-byte streaming loads, 4 steps in flight.
    W4Design { name: "w4a16_mma", rows: 16, warps: 4, split_k: false, pipelined: false, layout: Layout::Rows, ring: Ring::None },
    // The same warp step, K split over blocks too so that a warp owns at most the steps it keeps
    // in flight: one load round per warp, partials summed by the tile's last block.
    W4Design { name: "w4a16_mma_splitk", rows: 16, warps: 4, split_k: true, pipelined: false, layout: Layout::Rows, ring: Ring::None },
    // The same warp step decoding from shared memory: 16-row tiles streamed through an 8-stage
    // cp.async ring by a persistent grid of 8-warp blocks, 2 per SM.
    W4Design { name: "w4a16_mma_pipelined", rows: 16, warps: 8, split_k: false, pipelined: true, layout: Layout::Rows, ring: Ring::None },
    // w4a16_mma with K over 8 warps, 2 steps in flight per warp and 64 registers: twice the
    // warps per SM.
    W4Design { name: "w4a16_mma_occ8", rows: 16, warps: 8, split_k: false, pipelined: false, layout: Layout::Rows, ring: Ring::None },
    // w4a16_mma_occ8 on weights in the tile layout: every warp load is 512 contiguous bytes.
    W4Design { name: "w4a16_mma_tiled", rows: 16, warps: 8, split_k: false, pipelined: false, layout: Layout::Tiles, ring: Ring::None },
    // w4a16_mma_tiled with rolling loads: a slot is refilled as soon as its step is decoded.
    W4Design { name: "w4a16_mma_tiled_rolling", rows: 16, warps: 8, split_k: false, pipelined: false, layout: Layout::Tiles, ring: Ring::None },
    // w4a16_mma_tiled with each lane's loads staged by cp.async through a per-warp ring of
    // RING_STEPS steps in shared memory: bytes in flight without registers.
    W4Design { name: "w4a16_mma_tiled_async", rows: 16, warps: 8, split_k: false, pipelined: false, layout: Layout::Tiles, ring: Ring::Async },
    // w4a16_mma_tiled with each warp's slice bulk-prefetched into L2, 8 steps ahead of its loads.
    W4Design { name: "w4a16_mma_tiled_prefetch", rows: 16, warps: 8, split_k: false, pipelined: false, layout: Layout::Tiles, ring: Ring::None },
    // w4a16_mma_tiled with the scales applied after the MMAs where a step is one group (sym,
    // group % 128 == 0): the decode is one LOP3 per pair of weights.
    W4Design { name: "w4a16_mma_tiled_post", rows: 16, warps: 8, split_k: false, pipelined: false, layout: Layout::Tiles, ring: Ring::None },
    // w4a16_mma_tiled_post with the block's warps taking its tile's steps in turn, so that they
    // read one moving window of the tile instead of 8 slices.
    W4Design { name: "w4a16_mma_tiled_sweep", rows: 16, warps: 8, split_k: false, pipelined: false, layout: Layout::StepMajor, ring: Ring::None },
    // w4a16_mma_tiled_sweep on 4 warps at 128 registers, 3-4 steps per warp rolling: bytes in
    // flight at all times rather than in rounds.
    W4Design { name: "w4a16_mma_tiled_sweep4", rows: 16, warps: 4, split_k: false, pipelined: false, layout: Layout::StepMajor, ring: Ring::None },
    // w4a16_mma_tiled_sweep with each warp's steps copied by TMA, one 1 KB bulk copy per step,
    // into a ring of BULK_STEPS slots: 3-4 steps in flight per warp at no register cost.
    W4Design { name: "w4a16_mma_tiled_bulk", rows: 16, warps: 8, split_k: false, pipelined: false, layout: Layout::StepMajor, ring: Ring::Bulk },
];

/// Where a design reads W's codes: row-major (as quantized), in the tile layout
/// ([`tiles::tile`]: one 1 KB block per (tile, step), tile after tile), or in its step-major
/// order ([`tiles::step_major`]); the tiled layouts share their scales (and mins).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Rows,
    Tiles,
    StepMajor,
}

/// How a design stages its loads in shared memory: not at all, per lane with cp.async
/// (w4a16_mma_tiled_async), or per step with one TMA bulk copy (w4a16_mma_tiled_bulk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    None,
    Async,
    Bulk,
}

/// quant.cu's RING_STEPS: steps in a w4a16_mma_tiled_async warp's ring.
pub const RING_STEPS: usize = 4;

/// quant.cu's BULK_STEPS: 1 KB slots in a w4a16_mma_tiled_bulk warp's ring.
pub const BULK_STEPS: usize = 4;

impl Ring {
    /// Dynamic shared memory per block of 8 warps: RING_STEPS x RingSlot<ASYM>::BYTES per warp
    /// (async), BULK_STEPS x 1 KB (bulk).
    pub fn smem(self, scheme: Scheme) -> usize {
        match self {
            Ring::None => 0,
            Ring::Async => 8 * RING_STEPS * if scheme == Scheme::Asym { 1280 } else { 1152 },
            Ring::Bulk => 8 * BULK_STEPS * 1024,
        }
    }
}

/// quant.cu's PIPE_CHUNKS, PIPE_STAGES, PIPE_SVECS and PIPE_BLOCKS_PER_SM: 16 B code chunks
/// per row per stage, stages in the ring, 16 B scale vectors per row per stage, blocks per SM.
pub const PIPE_CHUNKS: usize = 32;
pub const PIPE_STAGES: usize = 8;
pub const PIPE_SVECS: usize = 5;
pub const PIPE_BLOCKS_PER_SM: usize = 2;

/// Dynamic shared memory of w4a16_mma_pipelined: PIPE_STAGES x PipeStage<ASYM>::VECS x 16 B.
pub fn pipelined_smem(scheme: Scheme) -> usize {
    let tables = if scheme == Scheme::Asym { 2 } else { 1 };
    PIPE_STAGES * 16 * (16 * PIPE_CHUNKS + tables * 16 * PIPE_SVECS)
}

/// The persistent grid of w4a16_mma_pipelined: tiles per block ceil(tiles / slots), then as
/// few blocks as give every block that many tiles (the last may have fewer).
pub fn pipelined_grid(n: usize, sms: usize) -> usize {
    let tiles = n.div_ceil(16);
    let tpb = tiles.div_ceil(sms * PIPE_BLOCKS_PER_SM);
    tiles.div_ceil(tpb)
}

/// Steps (128 weights of a row) a w4a16_mma warp keeps in flight: quant.cu's MmaSteps<B>::U.
pub fn mma_steps_in_flight(batch: usize) -> usize {
    if batch > 8 {
        3
    } else {
        4
    }
}

/// Blocks per 16-row tile of w4a16_mma_splitk: enough that each of their 4 warps owns at most
/// the steps it keeps in flight (one load round).
pub fn splitk_slices(k: usize, batch: usize) -> usize {
    (k / 32).div_ceil(4).div_ceil(4 * mma_steps_in_flight(batch)).max(1)
}

impl W4Design {
    pub fn variant(&self, scheme: Scheme, batch: usize) -> String {
        format!("{}_{}_b{batch}", self.name, scheme.name())
    }
    /// Blocks along K per tile (1 unless split-K).
    pub fn slices(&self, k: usize, batch: usize) -> usize {
        if self.split_k {
            splitk_slices(k, batch)
        } else {
            1
        }
    }
    /// Blocks per SM a design with shared memory is built for (its __launch_bounds__ minimum).
    fn blocks_per_sm(&self) -> usize {
        if self.pipelined {
            PIPE_BLOCKS_PER_SM
        } else {
            4
        }
    }
    fn launch(&self, n: usize, k: usize, batch: usize, scheme: Scheme, sms: usize) -> LaunchConfig {
        if self.pipelined {
            return LaunchConfig { grid_dim: (pipelined_grid(n, sms) as u32, 1, 1), block_dim: (32 * self.warps as u32, 1, 1), shared_mem_bytes: pipelined_smem(scheme) as u32 };
        }
        let smem = self.ring.smem(scheme) as u32;
        LaunchConfig { grid_dim: (n.div_ceil(self.rows) as u32, self.slices(k, batch) as u32, 1), block_dim: (32 * self.warps as u32, 1, 1), shared_mem_bytes: smem }
    }
}

/// The GPU dequantize kernels of a format: one per group scheme (the group size is an argument);
/// GGUF blocks also as `_cp_async`, 64 blocks per warp step copied global -> shared with cp.async.
pub fn dequant_variants(format: Format) -> Vec<String> {
    match format {
        Format::Group { scheme, .. } => vec![format!("dequant_{}", scheme.name())],
        Format::Q4_0 | Format::Q4_1 => {
            let v = format!("dequant_{}", format.name());
            vec![v.clone(), format!("{v}_cp_async")]
        }
    }
}

/// Every kernel variant of quant.cu (symbols are `quant_<variant>_f16`).
pub fn gpu_variants() -> Vec<String> {
    let mut v: Vec<String> = ["pack_int4", "unpack_int4"].map(String::from).to_vec();
    v.extend(STREAM_READS.iter().map(|r| r.0.to_string()));
    for format in [Format::Group { scheme: Scheme::Sym, group: 128 }, Format::Group { scheme: Scheme::Asym, group: 128 }, Format::Q4_0, Format::Q4_1] {
        v.extend(dequant_variants(format));
    }
    for d in W4_DESIGNS {
        for scheme in [Scheme::Sym, Scheme::Asym] {
            v.extend(BATCHES.iter().map(|&b| d.variant(scheme, b)));
        }
    }
    v
}

/// Every quant.cu symbol carries the family's activation type, f16 (pack/unpack included).
fn kernel(gpu: &Gpu, variant: &str) -> Result<cudarc::driver::CudaFunction> {
    gpu.function(FAMILY, &symbol(FAMILY, variant, DType::F16))
}

pub fn parse_format(name: &str) -> Result<Format> {
    Format::all().into_iter().find(|f| f.name() == name).ok_or_else(|| LabError::Invalid(format!("unknown 4-bit format `{name}` (sym_g32 .. asym_g128, q4_0, q4_1)")))
}

/// A matrix in any of the formats.
pub enum Quantized {
    Group(GroupQuant),
    Blocks(Block, Vec<u8>),
}

impl Quantized {
    /// Quantizes a `rows x cols` matrix (Q4_0 / Q4_1: blocks of 32 along each row).
    pub fn new(format: Format, x: &[f32], rows: usize, cols: usize) -> Result<Self> {
        match format {
            Format::Group { scheme, group } => group::quantize(x, rows, cols, scheme, group).map(Quantized::Group),
            Format::Q4_0 | Format::Q4_1 => {
                group::validate(x.len(), rows, cols, ggml::QK)?;
                let b = if format == Format::Q4_0 { Block::Q4_0 } else { Block::Q4_1 };
                ggml::quantize(b, x).map(|q| Quantized::Blocks(b, q))
            }
        }
    }
    pub fn dequantize(&self) -> Vec<f32> {
        match self {
            Quantized::Group(q) => q.dequantize(),
            Quantized::Blocks(b, q) => ggml::dequantize(*b, q).expect("whole blocks by construction"),
        }
    }
    pub fn bytes(&self) -> u64 {
        match self {
            Quantized::Group(q) => q.bytes(),
            Quantized::Blocks(_, q) => q.len() as u64,
        }
    }
    /// The quantization step of each group, in order (|d|).
    fn steps(&self) -> Vec<f32> {
        match self {
            Quantized::Group(q) => q.scales.iter().map(|d| d.to_f32().abs()).collect(),
            Quantized::Blocks(b, q) => q.chunks_exact(b.bytes()).map(|blk| ggml::parts(*b, blk).0.abs()).collect(),
        }
    }
}

/// Checks a reconstruction element by element: no value may be further from its original than
/// one quantization step of its group (round to nearest gives half a step; Q4_0's clamped
/// extreme and rounding the scale and min to f16 can add up to the other half), plus 1e-3 of
/// the group's largest magnitude for f16 rounding of the min. Reports the measured error.
pub fn step_check(original: &[f32], approx: &[f32], q: &Quantized, group: usize) -> ErrorStats {
    let steps = q.steps();
    let (worst, mismatches, max_abs, idx) = original
        .par_chunks(group)
        .zip(approx.par_chunks(group))
        .zip(steps.par_iter())
        .enumerate()
        .map(|(g, ((xs, ys), &d))| {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
            let bound = d as f64 * (1.0 + 1e-3) + 1e-3 * amax + f64::MIN_POSITIVE;
            let mut acc = (0f64, 0u64, 0f64, 0usize);
            for (i, (&x, &y)) in xs.iter().zip(ys).enumerate() {
                let e = (x as f64 - y as f64).abs();
                let f = if y.is_finite() { e / bound } else { f64::INFINITY };
                acc.1 += u64::from(f > 1.0);
                acc.2 = acc.2.max(e);
                if f > acc.0 || (i == 0 && g == 0) {
                    (acc.0, acc.3) = (f, g * group + i);
                }
            }
            acc
        })
        .reduce(|| (0.0, 0, 0.0, 0), |a, b| (if b.0 > a.0 { b.0 } else { a.0 }, a.1 + b.1, a.2.max(b.2), if b.0 > a.0 { b.3 } else { a.3 }));
    let max_rel = original.par_iter().zip(approx).filter(|(x, _)| **x != 0.0).map(|(&x, &y)| ((x - y) as f64 / x as f64).abs()).reduce(|| 0.0, f64::max);
    ErrorStats {
        max_abs,
        max_rel,
        worst_fraction_of_tolerance: worst,
        worst_index: Some(idx as u64),
        worst_got: approx.get(idx).map(|&v| v as f64),
        worst_expected: original.get(idx).map(|&v| v as f64),
        mismatches,
        reference: "original-f32, one step per group".into(),
        max_ulp: None,
    }
}

/// Exact comparison of bit patterns (u8 codes, f16 or f32 values).
fn bits<T: Copy + Into<u32>>(got: &[T], expected: &[T], reference: &str) -> ErrorStats {
    let g: Vec<u32> = got.iter().map(|&v| v.into()).collect();
    let e: Vec<u32> = expected.iter().map(|&v| v.into()).collect();
    compare_bits(&g, &e, reference)
}

fn f16_bits(v: &[f16]) -> Vec<u16> {
    v.iter().map(|h| h.to_bits()).collect()
}

/// The record's footprint fields for `n` weights in `format`.
fn footprint_extra(m: &mut Measurement, format: Format, n: u64) {
    m.extra.insert("footprint".into(), json!(footprint(format, n)));
}

impl Experiment for Quant {
    fn name(&self) -> &'static str {
        "quant"
    }
    fn description(&self) -> &'static str {
        "4-bit weights: INT4 pack/unpack, group-wise sym/asym and GGUF Q4_0/Q4_1 (de)quantization, W4A16 GEMV/GEMM vs cuBLAS fp16, SmolLM2 requantization table"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let mut out = Vec::new();
        let gpu = matches!(backend, Backend::Cuda(_));
        // int4: an odd count (checked, untimed), then the timed sizes.
        out.push(json!({"op": "int4", "n": 1_000_003, "timed": false}));
        let int4_n: &[usize] = match (gpu, quick) {
            (true, false) => &[1 << 24, 1 << 28],
            (true, true) => &[1 << 24],
            (false, false) => &[1 << 24, 1 << 26],
            (false, true) => &[1 << 16],
        };
        out.extend(int4_n.iter().map(|&n| json!({"op": "int4", "n": n})));
        let (rows, cols) = match (gpu, quick) {
            (true, false) => (8192, 8192),
            (true, true) => (4096, 4096),
            (false, false) => (4096, 4096),
            (false, true) => (64, 1024),
        };
        let formats: Vec<String> = if gpu { ["sym_g128", "asym_g128", "q4_0", "q4_1"].map(String::from).to_vec() } else { Format::all().iter().map(|f| f.name()).collect() };
        out.extend(formats.iter().map(|f| json!({"op": "format", "format": f, "rows": rows, "cols": cols})));
        if gpu {
            let shapes: &[(usize, usize)] = if quick {
                &[(4096, 4096), (1536, 576)]
            } else {
                &[(4096, 4096), (4096, 11008), (11008, 4096), (8192, 8192), (576, 576), (1536, 576), (576, 1536)]
            };
            let batches: &[usize] = if quick { &[1, 16] } else { BATCHES };
            for &(n, k) in shapes {
                // K = 576 (SmolLM2's hidden size) is not a multiple of 128: groups of 64 there.
                let group = if k % 128 == 0 { 128 } else { 64 };
                out.push(json!({"op": "w4a16", "n": n, "k": k, "scheme": "sym", "group": group, "batches": batches}));
            }
            // Asymmetric (scale + min) and Q4_0-like groups of 32 at batch 1 on the big shape.
            let (n, k) = if quick { (4096, 4096) } else { (8192, 8192) };
            out.push(json!({"op": "w4a16", "n": n, "k": k, "scheme": "asym", "group": 128, "batches": [1]}));
            out.push(json!({"op": "w4a16", "n": n, "k": k, "scheme": "sym", "group": 32, "batches": [1]}));
            // Odd row count and a K of one chunk short of a full warp step: checked, untimed.
            out.push(json!({"op": "w4a16", "n": 37, "k": 992, "scheme": "asym", "group": 32, "batches": BATCHES, "timed": false}));
            // The same odd rows with K split over 2 (3 at batch 16) blocks per tile, a partial last step.
            out.push(json!({"op": "w4a16", "n": 37, "k": 4064, "scheme": "sym", "group": 32, "batches": BATCHES, "timed": false}));
        }
        if std::env::var_os(SMOLLM2_ENV).is_some() {
            out.push(json!({"op": "smollm2", "layers": if quick { 1 } else { 30 }, "timed": false}));
        }
        out
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match param_str(case, "op")? {
            "int4" => run_int4(s, case),
            "format" => run_format(s, case),
            "w4a16" => run_w4a16(s, case),
            "smollm2" => run_smollm2(s, case),
            op => Err(LabError::Invalid(format!("quant: unknown op `{op}` (int4, format, w4a16, smollm2)"))),
        }
    }
}

/// One lab figure from a closure that writes an output and is checked against `check`.
#[allow(clippy::too_many_arguments)]
fn measure_host<T: Clone>(s: &mut Session, case: &Value, variant: &str, work: Work, timed: bool, out: &mut Vec<T>, f: impl Fn(&mut Vec<T>), check: impl Fn(&[T]) -> ErrorStats) -> Result<Measurement> {
    f(out);
    let before = check(out);
    let mut m = Measurement::new(variant, "lab", case, work);
    if timed {
        m.time = Some(cpu_time(&s.budget, || f(out)));
    }
    m.error = Some(first_failure(before, check(out)));
    m.ceiling = Some("copy_gb_s");
    Ok(m)
}

/// The same on the device: poison, launch, check, time, check again.
#[allow(clippy::too_many_arguments)]
fn measure_device<T: DeviceRepr + ValidAsZeroBits + Default + Clone>(
    s: &Session,
    gpu: &Gpu,
    case: &Value,
    variant: &str,
    provider: &str,
    work: Work,
    timed: bool,
    out: &mut CudaSlice<T>,
    launch: impl Fn(&mut CudaSlice<T>) -> Result<()>,
    check: impl Fn(&[T]) -> ErrorStats,
) -> Result<Measurement> {
    gpu.poison(out)?;
    launch(out)?;
    gpu.sync()?;
    let before = check(&gpu.download(out)?);
    let time = if timed { Some(time_gpu(gpu, &s.budget, || launch(out))?) } else { None };
    let after = check(&gpu.download(out)?);
    let mut m = Measurement::new(variant, provider, case, work);
    (m.time, m.error, m.ceiling) = (time, Some(first_failure(before, after)), Some("copy_gb_s"));
    Ok(m)
}

/// A grid-stride launch filling the chip (as vector_add's float4 kernel).
fn stride_grid(gpu: &Gpu, items: usize) -> LaunchConfig {
    let grid = (gpu.info.sm_count as usize * 8).min(items.div_ceil(256)).max(1) as u32;
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

fn run_int4(s: &mut Session, case: &Value) -> Result<()> {
    let n = param_usize(case, "n")?;
    let timed = param_timed(case);
    let mut rng = rng_for(s.opts.seed, case);
    let codes: Vec<u8> = (0..n).map(|_| rand::Rng::random_range(&mut rng, 0..16u8)).collect();
    // The reference, one element at a time from the documented order.
    let mut expect_packed = vec![0u8; int4::packed_len(n)];
    for (i, &c) in codes.iter().enumerate() {
        expect_packed[i / 2] |= c << (4 * (i % 2));
    }
    let work = Work { bytes: (n + int4::packed_len(n)) as u64, flops: 0 };
    let backend = s.backend.clone();
    let mut ms = Vec::new();
    match &backend {
        Backend::Cpu => {
            if s.wants("cpu_pack", "lab") {
                let mut out = vec![0u8; int4::packed_len(n)];
                ms.push(measure_host(s, case, "cpu_pack", work, timed, &mut out, |o| int4::pack_into(&codes, o).expect("codes < 16"), |o| bits(o, &expect_packed, "scalar-pack"))?);
            }
            if s.wants("cpu_unpack", "lab") {
                let mut out = vec![0u8; n];
                ms.push(measure_host(s, case, "cpu_unpack", work, timed, &mut out, |o| int4::unpack_into(&expect_packed, o).expect("sizes match"), |o| bits(o, &codes, "codes"))?);
            }
        }
        Backend::Cuda(gpu) => {
            let (dcodes, dpacked) = (gpu.upload(&codes)?, gpu.upload(&expect_packed)?);
            let nn = n as i64;
            let cfg = stride_grid(gpu, n.div_ceil(32));
            if s.wants("pack_int4", "lab") {
                let f = kernel(gpu, "pack_int4")?;
                let mut out = gpu.stream.alloc_zeros::<u8>(int4::packed_len(n)).doing("allocating packed codes")?;
                let launch = |o: &mut CudaSlice<u8>| -> Result<()> {
                    // SAFETY: codes holds n bytes, o holds ceil(n/2); the kernel bounds by n.
                    unsafe { gpu.stream.launch_builder(&f).arg(&dcodes).arg(o).arg(&nn).launch(cfg) }.map(|_| ()).doing("launching pack_int4")
                };
                ms.push(measure_device(s, gpu, case, "pack_int4", "lab", work, timed, &mut out, launch, |o| bits(o, &expect_packed, "scalar-pack"))?);
            }
            if s.wants("unpack_int4", "lab") {
                let f = kernel(gpu, "unpack_int4")?;
                let mut out = gpu.stream.alloc_zeros::<u8>(n).doing("allocating codes")?;
                let launch = |o: &mut CudaSlice<u8>| -> Result<()> {
                    // SAFETY: packed holds ceil(n/2) bytes, o holds n; the kernel bounds by n.
                    unsafe { gpu.stream.launch_builder(&f).arg(&dpacked).arg(o).arg(&nn).launch(cfg) }.map(|_| ()).doing("launching unpack_int4")
                };
                ms.push(measure_device(s, gpu, case, "unpack_int4", "lab", work, timed, &mut out, launch, |o| bits(o, &codes, "codes"))?);
            }
        }
    }
    for mut m in ms {
        // Packed INT4 against the same values as fp32 and fp16 (codes alone, no scales).
        m.extra.insert("footprint".into(), json!({"bytes": int4::packed_len(n), "smaller_than_f32": 4.0 * n as f64 / int4::packed_len(n) as f64, "smaller_than_f16": 2.0 * n as f64 / int4::packed_len(n) as f64}));
        s.emit(m)?;
    }
    Ok(())
}

/// Weights ~ N(0, 1/cols), as a trained layer's scale.
fn weights(s: &Session, case: &Value, rows: usize, cols: usize) -> Vec<f32> {
    let mut rng = rng_for(s.opts.seed, case);
    let sd = 1.0 / (cols as f32).sqrt();
    (0..rows * cols).map(|_| { let z: f32 = StandardNormal.sample(&mut rng); sd * z }).collect()
}

fn run_format(s: &mut Session, case: &Value) -> Result<()> {
    let format = parse_format(param_str(case, "format")?)?;
    let (rows, cols) = (param_usize(case, "rows")?, param_usize(case, "cols")?);
    let timed = param_timed(case);
    let x = weights(s, &json!({"rows": rows, "cols": cols}), rows, cols);
    let n = (rows * cols) as u64;
    let q = Quantized::new(format, &x, rows, cols)?;
    let deq = q.dequantize();
    let name = format.name();
    let qbytes = q.bytes();
    let backend = s.backend.clone();
    let mut ms = Vec::new();
    match &backend {
        Backend::Cpu => {
            let v = format!("cpu_quantize_{name}");
            if s.wants(&v, "lab") {
                let work = Work { bytes: 4 * n + qbytes, flops: 0 };
                let mut out = Vec::new();
                let quantize = |o: &mut Vec<f32>| *o = Quantized::new(format, &x, rows, cols).expect("validated above").dequantize();
                // Timed: quantization alone; checked: its reconstruction, one step per group.
                let mut m = measure_host(s, case, &v, work, false, &mut out, quantize, |o| step_check(&x, o, &q, format.group()))?;
                if timed {
                    m.time = Some(cpu_time(&s.budget, || {
                        std::hint::black_box(Quantized::new(format, &x, rows, cols).expect("validated above"));
                    }));
                }
                ms.push(m);
            }
            let v = format!("cpu_dequantize_{name}");
            if s.wants(&v, "lab") {
                let work = Work { bytes: qbytes + 4 * n, flops: 0 };
                let reference: Vec<u32> = reference_dequantize(&q).iter().map(|v| v.to_bits()).collect();
                let mut out = Vec::new();
                ms.push(measure_host(s, case, &v, work, timed, &mut out, |o| *o = q.dequantize(), |o| {
                    compare_bits(&o.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), &reference, "scalar-dequantize")
                })?);
            }
        }
        Backend::Cuda(gpu) => {
            let wanted: Vec<String> = dequant_variants(format).into_iter().filter(|v| s.wants(v, "lab")).collect();
            let expected: Vec<u16> = if wanted.is_empty() { vec![] } else { f16_bits(&deq.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>()) };
            for v in wanted {
                let f = kernel(gpu, &v)?;
                let mut out = gpu.stream.alloc_zeros::<f16>(n as usize).doing("allocating the dequantized weights")?;
                let work = Work { bytes: qbytes + 2 * n, flops: 0 };
                let nn = n as i64;
                let m = match &q {
                    Quantized::Group(g) => {
                        let (dp, ds) = (gpu.upload(&g.packed)?, gpu.upload(&g.scales)?);
                        let dm = if g.mins.is_empty() { None } else { Some(gpu.upload(&g.mins)?) };
                        let group = g.group as i32;
                        let cfg = stride_grid(gpu, n as usize / 32);
                        let launch = |o: &mut CudaSlice<f16>| -> Result<()> {
                            let mut b = gpu.stream.launch_builder(&f);
                            b.arg(&dp).arg(&ds);
                            if let Some(dm) = &dm {
                                b.arg(dm);
                            }
                            // SAFETY: packed holds n/2 bytes, scales (mins) n/group halves, o n
                            // halves; n % 32 == 0 and group % 32 == 0 (validated formats).
                            unsafe { b.arg(o).arg(&nn).arg(&group).launch(cfg) }.map(|_| ()).doing("launching a group dequantize")
                        };
                        measure_device(s, gpu, case, &v, "lab", work, timed, &mut out, launch, |o| bits(&f16_bits(o), &expected, "cpu-dequantize"))?
                    }
                    Quantized::Blocks(_, blocks) => {
                        let db = gpu.upload(blocks)?;
                        let nblocks = (n / 32) as i64;
                        let cfg = stride_grid(gpu, nblocks as usize);
                        let launch = |o: &mut CudaSlice<f16>| -> Result<()> {
                            // SAFETY: blocks holds nblocks whole blocks, o 32 halves per block.
                            unsafe { gpu.stream.launch_builder(&f).arg(&db).arg(o).arg(&nblocks).launch(cfg) }.map(|_| ()).doing("launching a block dequantize")
                        };
                        measure_device(s, gpu, case, &v, "lab", work, timed, &mut out, launch, |o| bits(&f16_bits(o), &expected, "cpu-dequantize"))?
                    }
                };
                ms.push(m);
            }
        }
    }
    let e = group::error_metrics(&x, &deq)?;
    for mut m in ms {
        footprint_extra(&mut m, format, n);
        m.extra.insert("quant_error".into(), json!(e));
        s.emit(m)?;
    }
    Ok(())
}

/// Dequantization read straight from the definitions, one element at a time: the independent
/// check of the parallel dequantizers.
pub fn reference_dequantize(q: &Quantized) -> Vec<f32> {
    match q {
        Quantized::Group(g) => (0..g.rows * g.cols)
            .map(|i| {
                let code = (g.packed[i / 2] >> (4 * (i % 2))) & 15;
                let d = g.scales[i / g.group].to_f32();
                match g.scheme {
                    Scheme::Sym => (code as f32 - 8.0) * d,
                    Scheme::Asym => code as f32 * d + g.mins[i / g.group].to_f32(),
                }
            })
            .collect(),
        Quantized::Blocks(b, bytes) => (0..bytes.len() / b.bytes() * 32)
            .map(|i| {
                let blk = &bytes[i / 32 * b.bytes()..(i / 32 + 1) * b.bytes()];
                let (d, m, qs) = ggml::parts(*b, blk);
                let j = i % 32;
                let code = if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 };
                match b {
                    Block::Q4_0 => (code as f32 - 8.0) * d,
                    Block::Q4_1 => code as f32 * d + m,
                }
            })
            .collect(),
    }
}

/// Y[b, r] = sum_k X[b, k] W[r, k] in f64, rows in parallel.
pub fn reference_w4a16(x: &[f64], w: &[f32], batch: usize, n: usize, k: usize) -> Vec<f64> {
    let cols: Vec<Vec<f64>> = (0..n)
        .into_par_iter()
        .map(|r| {
            let wr = &w[r * k..(r + 1) * k];
            (0..batch).map(|b| x[b * k..(b + 1) * k].iter().zip(wr).map(|(&a, &v)| a * v as f64).sum()).collect()
        })
        .collect();
    let mut y = vec![0.0; batch * n];
    for (r, c) in cols.iter().enumerate() {
        for (b, v) in c.iter().enumerate() {
            y[b * n + r] = *v;
        }
    }
    y
}

/// The W4A16 check's tolerance for a reference product: 1e-2 relative, and 1e-2 of its RMS
/// absolute (outputs near zero are sums of cancelling terms).
pub fn w4a16_tolerance(expected: &[f64]) -> Tolerance {
    let rms = (expected.iter().map(|v| v * v).sum::<f64>() / expected.len() as f64).sqrt();
    Tolerance { atol: W4_REL * rms.max(f64::MIN_POSITIVE), rtol: W4_REL }
}

/// A W4A16 output against its reference.
pub fn check_w4a16(y: &[f16], expected: &[f64], tol: Tolerance) -> ErrorStats {
    compare(&y.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), expected, tol, "cpu-f64-dequantized")
}

/// Checks a W4A16 problem: K and the group size multiples of 32, the group dividing K.
pub fn validate_w4a16(n: usize, k: usize, group: usize, batch: usize) -> Result<()> {
    if n == 0 || k == 0 || !BATCHES.contains(&batch) {
        return Err(LabError::shape("w4a16", format!("N={n} K={k} batch {batch}: N and K at least 1, batch one of {BATCHES:?}")));
    }
    if !k.is_multiple_of(32) || !group.is_multiple_of(32) || !k.is_multiple_of(group) {
        return Err(LabError::shape("w4a16", format!("K={k}, group {group}: both must be multiples of 32 and the group must divide K")));
    }
    Ok(())
}

fn run_w4a16(s: &mut Session, case: &Value) -> Result<()> {
    let Backend::Cuda(gpu) = s.backend.clone() else {
        return Err(LabError::Invalid("w4a16 runs on the GPU backend".into()));
    };
    let (n, k, group) = (param_usize(case, "n")?, param_usize(case, "k")?, param_usize(case, "group")?);
    let scheme = match param_str(case, "scheme")? {
        "sym" => Scheme::Sym,
        "asym" => Scheme::Asym,
        other => return Err(LabError::Invalid(format!("unknown scheme `{other}` (sym, asym)"))),
    };
    // One record per batch; a rerun of one record carries `batch` instead of `batches`.
    let batches: Vec<usize> = match case.get("batch") {
        Some(_) => vec![param_usize(case, "batch")?],
        None => case.get("batches").and_then(Value::as_array).map(|a| a.iter().filter_map(|v| v.as_u64().map(|b| b as usize)).collect()).unwrap_or_default(),
    };
    for &b in &batches {
        validate_w4a16(n, k, group, b)?;
    }
    let timed = param_timed(case);
    let mut shape_case = case.clone();
    if let Some(o) = shape_case.as_object_mut() {
        o.remove("batches");
        o.remove("batch");
    }
    let w = weights(s, &shape_case, n, k);
    let q = group::quantize(&w, n, k, scheme, group)?;
    let wd = q.dequantize();
    let wd16: Vec<f16> = wd.par_iter().map(|&v| f16::from_f32(v)).collect();
    let (dq, ds) = (gpu.upload(&q.packed)?, gpu.upload(&q.scales)?);
    let dm = gpu.upload(if q.mins.is_empty() { &q.scales } else { &q.mins })?;
    // The tile layout, rearranged once like the dequantized weights cuBLAS reads (untimed).
    let t = tiles::tile(&q);
    let (tq, ts) = (gpu.upload(&t.codes)?, gpu.upload(&t.scales)?);
    let tsm = gpu.upload(&tiles::step_major(&t))?;
    let tm = gpu.upload(if t.mins.is_empty() { &t.scales } else { &t.mins })?;
    stream_read(s, &gpu, &shape_case, &q, &dq, &ds, &dm)?;
    let dw16 = gpu.upload(&wd16)?;
    let blas = CudaBlas::new(gpu.stream.clone()).doing("creating the cuBLAS handle")?;
    let format = Format::Group { scheme, group };
    for b in batches {
        let mut params = shape_case.clone();
        params["batch"] = json!(b);
        let mut rng = rng_for(s.opts.seed, &params);
        let x: Vec<f16> = (0..b * k).map(|_| f16::from_f32(StandardNormal.sample(&mut rng))).collect();
        let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        let expected = reference_w4a16(&xf, &wd, b, n, k);
        let tol = w4a16_tolerance(&expected);
        let check = |y: &[f16]| check_w4a16(y, &expected, tol);
        let dx = gpu.upload(&x)?;
        let mut dy = gpu.stream.alloc_zeros::<f16>(b * n).doing("allocating Y")?;
        // Split-K designs: fp32 partials (slices x B x N) and one counter per tile, zero at rest.
        let ws_len = W4_DESIGNS.iter().map(|d| if d.split_k { d.slices(k, b) * b * n } else { 1 }).max().unwrap_or(1);
        let dws = gpu.stream.alloc_zeros::<f32>(ws_len).doing("allocating the split-K workspace")?;
        let tiles = W4_DESIGNS.iter().filter(|d| d.split_k).map(|d| n.div_ceil(d.rows)).max().unwrap_or(1);
        let ddone = gpu.stream.alloc_zeros::<u32>(tiles).doing("allocating the split-K counters")?;
        let io = 2 * (b * k + b * n) as u64;
        let flops = 2 * (b * n * k) as u64;
        for design in W4_DESIGNS {
            let variant = design.variant(scheme, b);
            if !s.wants(&variant, "lab") {
                continue;
            }
            let f = kernel(&gpu, &variant)?;
            let cfg = design.launch(n, k, b, scheme, gpu.info.sm_count as usize);
            // The rings' blocks per SM get the shared memory they need; the rest stays L1 for X
            // and the scales.
            crate::ops::gemm::fit_dynamic_smem(&gpu, &f, cfg.shared_mem_bytes as usize, design.blocks_per_sm())?;
            let (ni, ki, gi) = (n as i32, k as i32, group as i32);
            let (cq, cs, cm) = match design.layout {
                Layout::Rows => (&dq, &ds, &dm),
                Layout::Tiles => (&tq, &ts, &tm),
                Layout::StepMajor => (&tsm, &ts, &tm),
            };
            let launch = |y: &mut CudaSlice<f16>| -> Result<()> {
                let mut l = gpu.stream.launch_builder(&f);
                l.arg(cq).arg(cs);
                if scheme == Scheme::Asym {
                    l.arg(cm);
                }
                l.arg(&dx).arg(y);
                if design.split_k {
                    l.arg(&dws).arg(&ddone);
                }
                // SAFETY: codes n*k/2 bytes, scales (mins) n*k/group halves (tiled: the padded
                // tile layout, in either order, ceil(n/16) tiles of ceil(k/128) 1 KB blocks and
                // 16 x k/group scales; the grid is one block per tile), X b*k, Y b*n halves; k and group are multiples of 32 (validated);
                // rows past n are never stored.
                // Split-K: the workspace holds grid.y x b x n floats and the counters one per
                // 16-row tile (grid.x), zeroed here and left zeroed by every launch. Pipelined:
                // the dynamic shared memory is the ring's size, its limit raised above.
                unsafe { l.arg(&ni).arg(&ki).arg(&gi).launch(cfg) }.map(|_| ()).doing("launching w4a16")
            };
            let work = Work { bytes: q.bytes() + io, flops };
            let mut m = measure_device(s, &gpu, &params, &variant, "lab", work, timed, &mut dy, launch, check)?;
            m.tolerance = Some(tol);
            footprint_extra(&mut m, format, (n * k) as u64);
            s.emit(m)?;
        }
        if s.wants("cublas_f16_dequantized", "cublas") {
            let (ni, ki, bi) = (n as i32, k as i32, b as i32);
            // Y^T (N x B, column-major) = W (op T of the K x N column-major view) . X^T.
            let cfg = GemmConfig { transa: CUBLAS_OP_T, transb: CUBLAS_OP_N, m: ni, n: bi, k: ki, alpha: f16::ONE, lda: ki, ldb: ki, beta: f16::ZERO, ldc: ni };
            let launch = |y: &mut CudaSlice<f16>| -> Result<()> {
                // SAFETY: W is n x k, X is b x k, Y is b x n halves, as cfg says.
                unsafe { blas.gemm(cfg, &dw16, &dx, y) }.doing("cuBLAS fp16 GEMM")
            };
            let work = Work { bytes: 2 * (n * k) as u64 + io, flops };
            let mut m = measure_device(s, &gpu, &params, "cublas_f16_dequantized", "cublas", work, timed, &mut dy, launch, check)?;
            m.tolerance = Some(tol);
            s.emit(m)?;
        }
    }
    Ok(())
}

/// XOR of the little-endian u32 words of `bytes`, a partial last word zero-padded: what
/// `quant_stream_read_f16`'s blocks XOR together.
pub fn xor_words(bytes: &[u8]) -> u32 {
    bytes.chunks(4).map(|c| c.iter().enumerate().fold(0u32, |w, (i, &b)| w | (b as u32) << (8 * i))).fold(0, |a, w| a ^ w)
}

/// The floor's kernels: (variant, loads in flight per thread, blocks of 256 per SM). One load:
/// 32 blocks per SM (4 waves of resident blocks), the fastest of 8, 16 and 32 in a probe of
/// 33.6 MB reads on the H100. More loads per thread: one wave, so that each thread's loads
/// cover its share in one or two rounds.
const STREAM_READS: [(&str, usize, usize); 3] = [("stream_read", 1, 32), ("stream_read_x4", 4, 8), ("stream_read_x8", 8, 8)];

/// `stream_read`: the floor under every W4A16 design of a shape, in the same run. It reads the
/// bytes they must read (codes, scales, and mins when asymmetric) once, as the copy ceiling's
/// kernel reads, decoding nothing; the host checks the XOR of every word. One record per shape
/// and kernel of [`STREAM_READS`].
fn stream_read(s: &mut Session, gpu: &Gpu, case: &Value, q: &GroupQuant, dq: &CudaSlice<u8>, ds: &CudaSlice<f16>, dm: &CudaSlice<f16>) -> Result<()> {
    let (ns, nm, nq) = (2 * q.scales.len() as i64, 2 * q.mins.len() as i64, q.packed.len() as i64);
    let want = xor_words(&q.packed) ^ xor_words(&f16_bytes(&q.scales)) ^ xor_words(&f16_bytes(&q.mins));
    let vectors = (q.bytes() as usize).div_ceil(16);
    for (variant, loads, blocks_per_sm) in STREAM_READS {
        if !s.wants(variant, "lab") {
            continue;
        }
        let f = kernel(gpu, variant)?;
        // Never more than `loads` 16 B vectors per thread (4224 blocks for SmolLM2's 166 KB
        // layers cost 2 us more than the layers' GEMVs themselves).
        let blocks = (blocks_per_sm * gpu.info.sm_count as usize).min(vectors.div_ceil(256 * loads));
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut out = gpu.stream.alloc_zeros::<u32>(blocks).doing("allocating the block words")?;
        let launch = |out: &mut CudaSlice<u32>| -> Result<()> {
            // SAFETY: each buffer holds at least the byte count passed with it (mins: 0 bytes
            // read when symmetric); out holds one word per block of the grid.
            unsafe { gpu.stream.launch_builder(&f).arg(dq).arg(&nq).arg(ds).arg(&ns).arg(dm).arg(&nm).arg(out).launch(cfg) }.map(|_| ()).doing("launching stream_read")
        };
        let check = |got: &[u32]| bits(&[got.iter().fold(0, |a, &w| a ^ w)], &[want], "cpu-xor");
        let work = Work { bytes: q.bytes(), flops: 0 };
        let m = measure_device(s, gpu, case, variant, "lab", work, param_timed(case), &mut out, launch, check)?;
        s.emit(m)?;
    }
    Ok(())
}

fn f16_bytes(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect()
}

fn run_smollm2(s: &mut Session, case: &Value) -> Result<()> {
    let path = std::env::var(SMOLLM2_ENV).map_err(|_| LabError::Invalid(format!("{SMOLLM2_ENV} is not set (scripts/test.sh installs the model; see README)")))?;
    let layers = param_usize(case, "layers")?;
    // A rerun of one table row names its tensor and format.
    let only_tensor = case.get("tensor").and_then(Value::as_str).filter(|t| *t != "all");
    let only_format = case.get("format").and_then(Value::as_str);
    let file = crate::weights::gguf::GgufFile::open(&path)?;
    let g = file.parse()?;
    let tensors: Vec<_> = g
        .tensors
        .iter()
        .filter(|t| t.ty == crate::weights::gguf::GgmlType::Q4_1 && t.dims.len() == 2)
        .filter(|t| only_tensor.is_none_or(|name| t.name == name))
        .filter(|t| t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|l| l.parse::<usize>().ok()).is_some_and(|l| l < layers))
        .collect();
    if tensors.is_empty() {
        return Err(LabError::Invalid(format!("{path}: no 2-D Q4_1 tensors in the first {layers} layers")));
    }
    // Totals per format over every tensor: (signal, noise, max abs, bytes, weights).
    let mut totals: Vec<(f64, f64, f64, u64, u64, u64)> = vec![(0.0, 0.0, 0.0, 0, 0, 0); Format::all().len()];
    let mut skipped = vec![0usize; Format::all().len()];
    for t in tensors {
        let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let x = ggml::dequantize(Block::Q4_1, g.data(t))?;
        check_finite(&x, &t.name)?;
        let signal: f64 = x.par_iter().map(|&v| (v as f64).powi(2)).sum();
        for (fi, format) in Format::all().into_iter().enumerate() {
            let variant = format.name();
            if !s.wants(&variant, "lab") || only_format.is_some_and(|f| f != variant) {
                continue;
            }
            // SmolLM2's hidden size, 576, is 4.5 groups of 128: such a tensor is counted as skipped
            // in that format's total rather than quantized with a ragged last group.
            if cols % format.group() != 0 {
                skipped[fi] += 1;
                continue;
            }
            let q = Quantized::new(format, &x, rows, cols)?;
            let y = q.dequantize();
            let e = group::error_metrics(&x, &y)?;
            let params = json!({"op": "smollm2", "layers": layers, "tensor": t.name, "rows": rows, "cols": cols, "format": variant, "timed": false});
            let mut m = Measurement::new(&variant, "lab", &params, Work { bytes: q.bytes(), flops: 0 });
            m.error = Some(step_check(&x, &y, &q, format.group()));
            footprint_extra(&mut m, format, (rows * cols) as u64);
            m.extra.insert("quant_error".into(), json!(e));
            let noise = signal * e.rel_rmse.powi(2);
            let tot = &mut totals[fi];
            *tot = (tot.0 + signal, tot.1 + noise, tot.2.max(e.max_abs), tot.3 + q.bytes(), tot.4 + (rows * cols) as u64, tot.5 + m.error.as_ref().map_or(0, |e| e.mismatches));
            s.emit(m)?;
        }
    }
    for ((format, (signal, noise, max_abs, bytes, n, mismatches)), skipped) in Format::all().into_iter().zip(totals).zip(skipped) {
        if n == 0 || only_tensor.is_some() {
            continue;
        }
        let params = json!({"op": "smollm2", "tensor": "all", "layers": layers, "format": format.name(), "timed": false});
        let mut m = Measurement::new(format.name(), "lab", &params, Work { bytes, flops: 0 });
        let rel = (noise / signal).sqrt();
        m.error = Some(ErrorStats { max_abs, max_rel: rel, worst_fraction_of_tolerance: 0.0, worst_index: None, worst_got: None, worst_expected: None, mismatches, reference: "original-f32, one step per group".into(), max_ulp: None });
        footprint_extra(&mut m, format, n);
        m.extra.insert("quant_error".into(), json!({"rel_rmse": rel, "max_abs": max_abs, "sqnr_db": 10.0 * (signal / noise).log10()}));
        m.extra.insert("tensors_skipped".into(), json!(skipped));
        s.emit(m)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_dequantizers_agree_with_the_parallel_ones_to_the_bit() {
        let (rows, cols) = (6, 256);
        let x: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.173).cos() * (1.0 + i as f32 / 500.0)).collect();
        for format in Format::all() {
            let q = Quantized::new(format, &x, rows, cols).unwrap();
            let fast: Vec<u32> = q.dequantize().iter().map(|v| v.to_bits()).collect();
            let slow: Vec<u32> = reference_dequantize(&q).iter().map(|v| v.to_bits()).collect();
            assert_eq!(fast, slow, "{}", format.name());
            let e = step_check(&x, &q.dequantize(), &q, format.group());
            assert!(e.passed(), "{}: {e:?}", format.name());
            // A wrong code is caught.
            let mut y = q.dequantize();
            y[77] += 3.0 * q.steps()[77 / format.group()];
            let e = step_check(&x, &y, &q, format.group());
            assert_eq!((e.passed(), e.worst_index), (false, Some(77)), "{}", format.name());
        }
    }

    #[test]
    fn the_w4a16_reference_is_a_plain_product_and_bad_shapes_are_named() {
        let (b, n, k) = (2, 3, 4);
        let x: Vec<f64> = (0..b * k).map(|i| i as f64).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 - 2.0).collect();
        let y = reference_w4a16(&x, &w, b, n, k);
        for bi in 0..b {
            for r in 0..n {
                let e: f64 = (0..k).map(|j| x[bi * k + j] * w[r * k + j] as f64).sum();
                assert_eq!(y[bi * n + r], e);
            }
        }
        assert!(validate_w4a16(8, 4096, 128, 1).is_ok());
        assert!(validate_w4a16(8, 4016, 32, 1).unwrap_err().to_string().contains("multiples of 32"));
        assert!(validate_w4a16(8, 4096, 96, 1).unwrap_err().to_string().contains("group must divide K"));
        assert!(validate_w4a16(8, 4096, 128, 3).unwrap_err().to_string().contains("batch 3"));
        assert!(parse_format("q5_0").is_err());
        assert_eq!(parse_format("asym_g64").unwrap(), Format::Group { scheme: Scheme::Asym, group: 64 });
    }

    /// quant.cu's dequant_ggml_cp_async on the CPU, index for index: lane l copies 16 B vectors
    /// u = l + 32 i of a 64-block warp step (src-size min(16, bytes left), zero-filled), then
    /// writes elements 8p .. 8p + 7 (p = l % 4) of staged block 8j + l / 4 for j < 8. The decode
    /// of one staged block is the one the 32-block kernel uses (checked to the bit on the GPU).
    fn model_ggml_cp_async(b: Block, input: &[u8]) -> Vec<f32> {
        const SEGS: usize = 2; // GGML_SEGS
        let (bytes, total) = (b.bytes(), input.len());
        let nblocks = total / bytes;
        let (nvec, nv) = (2 * bytes * SEGS, (2 * bytes * SEGS).div_ceil(32));
        let mut out = vec![f32::NAN; nblocks * 32];
        for seg in 0..nblocks.div_ceil(32 * SEGS) {
            let base = seg * 32 * SEGS * bytes;
            let mut stage = vec![0xA5u8; 16 * nvec];
            for lane in 0..32 {
                for i in 0..nv {
                    let (u, off) = (lane + 32 * i, base + 16 * (lane + 32 * i));
                    if u < nvec && off < total {
                        let src = 16.min(total - off);
                        stage[16 * u..16 * u + 16].fill(0);
                        stage[16 * u..16 * u + src].copy_from_slice(&input[off..off + src]);
                    }
                }
            }
            for j in 0..4 * SEGS {
                for lane in 0..32 {
                    let (local, part) = (8 * j + lane / 4, lane % 4);
                    let blk = seg * 32 * SEGS + local;
                    if blk < nblocks {
                        let vals = ggml::dequantize(b, &stage[local * bytes..(local + 1) * bytes]).unwrap();
                        let dst = &mut out[32 * blk + 8 * part..32 * blk + 8 * part + 8];
                        assert!(dst.iter().all(|v| v.is_nan()), "block {blk} part {part} written twice");
                        dst.copy_from_slice(&vals[8 * part..8 * part + 8]);
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_cp_async_block_dequantize_covers_every_block_once() {
        for b in [Block::Q4_0, Block::Q4_1] {
            for nblocks in [1, 3, 63, 64, 65, 130, 200] {
                let x: Vec<f32> = (0..32 * nblocks).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
                let input = ggml::quantize(b, &x).unwrap();
                let want: Vec<u32> = ggml::dequantize(b, &input).unwrap().iter().map(|v| v.to_bits()).collect();
                let got: Vec<u32> = model_ggml_cp_async(b, &input).iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{b:?}, {nblocks} blocks");
            }
        }
        assert_eq!(dequant_variants(Format::Q4_1), ["dequant_q4_1", "dequant_q4_1_cp_async"]);
        assert_eq!(dequant_variants(Format::Group { scheme: Scheme::Asym, group: 32 }), ["dequant_asym"]);
        let src = crate::kernels::source(FAMILY).unwrap();
        assert!(src.contains("#define GGML_SEGS 2\n"));
    }

    /// The host's XOR folds little-endian words, zero-padding a partial last one, as quant.cu's
    /// xor_words does for the tail bytes it reads one by one.
    #[test]
    fn the_stream_read_check_folds_words_as_the_kernel_does() {
        assert_eq!(xor_words(&[]), 0);
        assert_eq!(xor_words(&[0x01, 0x02, 0x03, 0x04]), 0x0403_0201);
        assert_eq!(xor_words(&[0x01, 0x02, 0x03, 0x04, 0xFF, 0x10]), 0x0403_0201 ^ 0x10FF);
        assert_eq!(xor_words(&[7; 8]), 0);
        let src = crate::kernels::source(FAMILY).unwrap();
        assert!(src.contains("acc ^= (unsigned)p[i] << (8 * (i % 4));"));
    }

    /// The launch shapes the Rust side assumes are the ones quant.cu instantiates.
    #[test]
    fn launch_shapes_match_the_kernel_source() {
        let src = crate::kernels::source(FAMILY).unwrap();
        let [cuda, mma, splitk, pipe, occ8, tiled, rolling, ring, prefetch, post, sweep, sweep4, bulk] = W4_DESIGNS else { panic!("thirteen W4A16 designs") };
        assert_eq!((sweep.name, sweep.rows, sweep.warps, sweep.layout, sweep.ring), ("w4a16_mma_tiled_sweep", occ8.rows, occ8.warps, Layout::StepMajor, Ring::None));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_tiled_sweep, w4a16_mma_tiled_sweep, 64 * MMA_WARPS, 4)\n"));
        assert_eq!((sweep4.name, sweep4.rows, sweep4.warps, sweep4.layout, sweep4.ring), ("w4a16_mma_tiled_sweep4", mma.rows, mma.warps, Layout::StepMajor, Ring::None));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_tiled_sweep4, w4a16_mma_tiled_sweep4, 32 * MMA_WARPS, 4)\n"));
        assert_eq!((bulk.name, bulk.rows, bulk.warps, bulk.layout, bulk.ring), ("w4a16_mma_tiled_bulk", occ8.rows, occ8.warps, Layout::StepMajor, Ring::Bulk));
        assert!(src.contains(&format!("#define BULK_STEPS {BULK_STEPS}\n")));
        assert!(src.contains("require_dynamic_smem(W * BULK_STEPS * 1024);\n    const int warp"));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_tiled_bulk, w4a16_mma_tiled_bulk, 64 * MMA_WARPS, 4)\n"));
        assert!(4 * (Ring::Bulk.smem(Scheme::Asym) + 8 * 16 * 16 * 4) <= 227 * 1024, "4 blocks per SM at batch 16");
        assert_eq!((post.name, post.rows, post.warps, post.layout, post.ring), ("w4a16_mma_tiled_post", occ8.rows, occ8.warps, Layout::Tiles, Ring::None));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_tiled_post, w4a16_mma_tiled_post, 64 * MMA_WARPS, 4)\n"));
        assert_eq!((prefetch.name, prefetch.rows, prefetch.warps, prefetch.layout, prefetch.ring), ("w4a16_mma_tiled_prefetch", occ8.rows, occ8.warps, Layout::Tiles, Ring::None));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_tiled_prefetch, w4a16_mma_tiled_prefetch, 64 * MMA_WARPS, 4)\n"));
        assert_eq!((ring.name, ring.rows, ring.warps, ring.layout, ring.ring), ("w4a16_mma_tiled_async", occ8.rows, occ8.warps, Layout::Tiles, Ring::Async));
        assert!(W4_DESIGNS.iter().all(|d| (d.ring != Ring::None) == (d.name == ring.name || d.name == bulk.name)));
        assert!(src.contains(&format!("#define RING_STEPS {RING_STEPS}\n")));
        assert!(src.contains("static constexpr int BYTES = 1024 + (ASYM ? 256 : 128);"));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_tiled_async, w4a16_mma_tiled_async, 64 * MMA_WARPS, 4)\n"));
        assert!(4 * Ring::Async.smem(Scheme::Asym) <= 227 * 1024, "4 blocks per SM");
        assert_eq!((occ8.rows, occ8.warps, occ8.split_k, occ8.pipelined), (mma.rows, 2 * mma.warps, false, false));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_occ8, w4a16_mma_occ8, 64 * MMA_WARPS, 4)\n"));
        assert_eq!((tiled.name, tiled.rows, tiled.warps, tiled.split_k, tiled.pipelined), ("w4a16_mma_tiled", occ8.rows, occ8.warps, false, false));
        assert_eq!((rolling.name, rolling.rows, rolling.warps, rolling.split_k, rolling.pipelined), ("w4a16_mma_tiled_rolling", occ8.rows, occ8.warps, false, false));
        assert!(W4_DESIGNS.iter().all(|d| (d.layout != Layout::Rows) == d.name.starts_with("w4a16_mma_tiled")));
        assert!(W4_DESIGNS.iter().all(|d| (d.layout == Layout::StepMajor) == [sweep.name, sweep4.name, bulk.name].contains(&d.name)));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_tiled_rolling, w4a16_mma_tiled_rolling, 64 * MMA_WARPS, 4)\n"));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_tiled, w4a16_mma_tiled, 64 * MMA_WARPS, 4)\n"));
        assert_eq!((tiles::TILE_ROWS, tiles::STEP_WEIGHTS), (mma.rows, 128));
        assert_eq!((cuda.name, mma.name, splitk.name, pipe.name), ("w4a16", "w4a16_mma", "w4a16_mma_splitk", "w4a16_mma_pipelined"));
        assert!(src.contains(&format!(
            "#define PIPE_WARPS {}\n#define PIPE_CHUNKS {PIPE_CHUNKS}\n#define PIPE_STAGES {PIPE_STAGES}\n#define PIPE_SVECS {PIPE_SVECS}\n#define PIPE_BLOCKS_PER_SM {PIPE_BLOCKS_PER_SM}\n",
            pipe.warps
        )));
        assert_eq!((pipe.rows, pipe.pipelined, pipe.split_k, mma.pipelined), (mma.rows, true, false, false));
        assert!(src.contains("static constexpr int VECS = CODES + (ASYM ? 2 : 1) * MMA_ROWS * PIPE_SVECS;"));
        assert_eq!((pipelined_smem(Scheme::Sym), pipelined_smem(Scheme::Asym)), (75776, 86016));
        // 132 SMs: 512 tiles in 256 blocks of 2, 256 in 256 of 1, 688 in 230 of 3 (the last 1), 3 in 3.
        assert_eq!([8192, 4096, 11008, 37].map(|n| pipelined_grid(n, 132)), [256, 256, 230, 3]);
        for n in (1usize..20000).step_by(7) {
            let (tiles, grid) = (n.div_ceil(16), pipelined_grid(n, 132));
            let tpb = tiles.div_ceil(grid);
            assert!(grid <= 132 * PIPE_BLOCKS_PER_SM && (grid - 1) * tpb < tiles && grid * tpb >= tiles, "N={n}");
        }
        assert!(src.contains(&format!("#define W4_WARPS {}\n", cuda.warps)));
        assert!(src.contains(&format!("#define MMA_WARPS {}\n#define MMA_ROWS {}\n", mma.warps, mma.rows)));
        assert_eq!((splitk.rows, splitk.warps, splitk.split_k, mma.split_k), (mma.rows, mma.warps, true, false));
        for &b in BATCHES {
            assert!(src.contains(&format!("\nW4A16({b}, {})\n", cuda.rows)), "batch {b}");
            assert!(src.contains(&format!("    W4A16_KERNELS(NAME, BODY, THREADS, MINB, {b})")), "batch {b}");
            assert!(src.contains(&format!("\nW4A16_MMA_SPLITK({b})\n")), "batch {b}");
        }
        assert_eq!(src.matches("\nW4A16(").count(), BATCHES.len());
        assert_eq!(src.matches("    W4A16_KERNELS(NAME, BODY, THREADS, MINB, ").count(), BATCHES.len());
        // Every tensor-core rung but split-K, each instantiated once through W4A16_RUNG.
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma, w4a16_mma, 32 * MMA_WARPS, 4)\n"));
        assert!(src.contains("\nW4A16_RUNG(w4a16_mma_pipelined, w4a16_mma_pipelined, 32 * PIPE_WARPS, PIPE_BLOCKS_PER_SM)\n"));
        assert_eq!(src.matches("\nW4A16_RUNG(").count(), W4_DESIGNS.len() - 2);
        assert_eq!(src.matches("\nW4A16_MMA_SPLITK(").count(), BATCHES.len());
        assert!(src.contains("static constexpr int U = B > 8 ? 3 : 4;"));
        assert_eq!((mma_steps_in_flight(16), mma_steps_in_flight(8)), (3, 4));
        let v = gpu_variants();
        assert_eq!(v.iter().filter(|v| v.starts_with("w4a16_mma_") && !v.contains("splitk") && !v.contains("pipelined") && !v.contains("occ8") && !v.contains("tiled")).count(), 2 * BATCHES.len());
        assert_eq!(v.iter().filter(|v| v.starts_with("w4a16_mma_tiled_")).count(), 16 * BATCHES.len());
        assert_eq!(v.iter().filter(|v| v.starts_with("w4a16_mma_tiled_rolling_")).count(), 2 * BATCHES.len());
        assert_eq!(v.iter().filter(|v| v.starts_with("w4a16_mma_occ8_")).count(), 2 * BATCHES.len());
        assert_eq!(v.iter().filter(|v| v.starts_with("w4a16_mma_pipelined_")).count(), 2 * BATCHES.len());
        assert_eq!(v.iter().filter(|v| v.starts_with("w4a16_mma_splitk_")).count(), 2 * BATCHES.len());
        // 8192: 64 steps, 4 slices of 4 warps x 4 steps (6 x 4 x 3 at batch 16); one warp round.
        assert_eq!((splitk_slices(8192, 1), splitk_slices(8192, 16), splitk_slices(992, 16), splitk_slices(11008, 4)), (4, 6, 1, 6));
        for (k, b) in [(8192usize, 1), (8192, 16), (11008, 8), (4064, 16), (576, 1), (32, 2)] {
            let (nsteps, s) = ((k / 32).div_ceil(4), splitk_slices(k, b));
            assert!(nsteps.div_ceil(4 * s) <= mma_steps_in_flight(b), "K={k} batch {b}");
        }
    }
}
