//! `llama`: the fused steps of a Llama forward between its weight products and attention
//! (kernels/llama.cu, llama_fused.cu, llama_layer.cu, llama_head.cu), as launches on the engine's device buffers ([`crate::model::llama`]
//! assembles them). Rows are tokens: a decode step has one per sequence; a row's position is
//! `pos[row / rows_per_seq] + row % rows_per_seq`, read on the device.

use super::variant::{self, Requires, Variant, VariantInfo};
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::ops::attention::decode::KvCache;
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::f16;
use std::ops::Range;

pub const FAMILY: &str = "llama";

pub mod experiment;
pub mod head;
pub use experiment::Llama;
pub use head::{head_q8_0, Choose, HeadChoice, PackedHead, HEAD_MAX_SEQS, HEAD_MAX_WIDTH};

/// The fused steps; each is one kernel with no ladder yet.
pub const VARIANTS: &[Variant<()>] = &[
    Variant { name: "embed_q8_0", dtypes: &[DType::F32], requires: Requires::Gpu, what: "the token's Q8_0 embedding row into the f32 residual stream", config: () },
    Variant { name: "add_rmsnorm", dtypes: &[DType::F16], requires: Requires::Gpu, what: "residual add fused into the next RMSNorm: x read once for both", config: () },
    Variant { name: "rope_cache", dtypes: &[DType::F16], requires: Requires::Gpu, what: "RoPE on Q and K of the fused QKV product, K and V stored in the paged cache", config: () },
    Variant { name: "swiglu", dtypes: &[DType::F16], requires: Requires::Gpu, what: "silu(gate) * up of the fused gate|up product", config: () },
    Variant { name: "argmax", dtypes: &[DType::F32], requires: Requires::Gpu, what: "greedy token per sequence, written and the position advanced on the device", config: () },
    Variant { name: "sample", dtypes: &[DType::F32], requires: Requires::Gpu, what: "a token drawn per sequence from softmax(logits / T) cut to top-k and top-p, reproducible from (seed, sequence, position)", config: () },
    Variant { name: "qkv_rope_q4_1", dtypes: &[DType::F16], requires: Requires::Gpu, what: "fused decode: RMSNorm, the QKV product of GGUF Q4_1 rows, RoPE and the cache store in one launch", config: () },
    Variant { name: "gate_up_swiglu_q4_1", dtypes: &[DType::F16], requires: Requires::Gpu, what: "fused decode: RMSNorm, the gate and up products of GGUF Q4_1 rows and SwiGLU in one launch", config: () },
    Variant { name: "residual_q4_1", dtypes: &[DType::F16], requires: Requires::Gpu, what: "fused decode: a product of GGUF Q4_1 rows added into the f32 residual stream", config: () },
    Variant { name: "ffn_q4_1", dtypes: &[DType::F16], requires: Requires::Sm90, what: "fused decode: RMSNorm, gate and up, SwiGLU and the down product added into the residual stream in one launch, the blocks' partial sums added in a fixed order through DSMEM and by the last cluster to count itself in", config: () },
    Variant { name: "attention_o_q4_1", dtypes: &[DType::F16], requires: Requires::Sm90, what: "fused decode: attention over the cache and the output product added into the residual stream in one launch, clusters of three blocks sharing the heads' outputs through DSMEM", config: () },
    Variant { name: "head_q8_0", dtypes: &[DType::F32], requires: Requires::Gpu, what: "fused decode tail: the output RMSNorm, the Q8_0 LM head on mma.sync (repacked into fragment order) and the greedy choice in one launch", config: () },
    Variant { name: "layer_q4_1", dtypes: &[DType::F16], requires: Requires::Sm90, what: "fused decode: a whole layer in one launch, a cluster of 16 blocks per sequence holding its Q4_1 rows in shared memory and handing activations over through DSMEM", config: () },
];

/// What the fused decode products take (kernels/llama_fused.cu): up to this many sequences; inputs up
/// to 32 x Q4_NORM_G groups of 32 wide for the products that normalise theirs, 32 x Q4_RESIDUAL_G
/// for residual_q4_1.
pub const FUSED_MAX_SEQS: usize = 16;
pub const FUSED_MAX_NORMED: usize = 32 * 32;
pub const FUSED_MAX_WIDTH: usize = 2 * 32 * 32;
/// What attention_o_q4_1 takes beyond those: heads of 64, up to 3 KV heads (the cluster's
/// blocks) of up to 4 query heads each, rows up to 1024 wide.
pub const ATTENTION_O_HEAD_DIM: usize = 64;
pub const ATTENTION_O_MAX_KV_HEADS: usize = 3;
pub const ATTENTION_O_MAX_GROUP: usize = 4;
/// attention_o_q4_1's AO_SMEM: 512 keys of a K row 72 halves apart and a V row.
pub const ATTENTION_O_SMEM: usize = 512 * (72 + 64) * 2;
/// ffn_q4_1's FF_CLUSTER (blocks a cluster, summing their partials through DSMEM) and FF_COLS
/// (columns of the FFN a block, a warp each).
pub const FFN_CLUSTER: usize = 8;
pub const FFN_BLOCK_COLS: usize = 8;
/// What layer_q4_1 takes (kernels/llama_layer.cu): heads of 64, up to 16 query heads, rows up to
/// 1024 wide, an FFN up to 2048, a sixteenth of the QKV rows up to 128, positions below 1024 (16
/// blocks of 64 key slots), and its weights' share within a block's shared memory.
pub const LAYER_HEAD_DIM: usize = 64;
pub const LAYER_MAX_HEADS: usize = 16;
pub const LAYER_MAX_POSITIONS: usize = LAYER_CLUSTER * LAYER_KEY_SLOTS;
/// layer_q4_1's LY_CLUSTER (blocks a sequence), LY_THREADS (a column of the width a thread),
/// LY_NK (key slots a block) and LY_KS (a key row's stride in halves): the launch and the shared
/// memory the launcher sizes follow them (tests/kernels_compile.rs reads them from the kernel).
pub const LAYER_CLUSTER: usize = 16;
pub const LAYER_THREADS: u32 = 1024;
pub const LAYER_KEY_SLOTS: usize = 64;
pub const LAYER_KEY_STRIDE: usize = 72;
/// QKV row pairs a block holds (LY_OWN / 2).
pub const LAYER_MAX_PAIRS: usize = 64;

/// The model the kernels above make up (model::llama), as the `llama` experiment's variants:
/// (name, requires, what). On the CPU backend `engine` is the reference forward.
pub const ENGINES: &[(&str, &str, &str)] = &[
    ("engine", "gpu or cpu", "the whole model (model::llama): the steps above around W4A16, W8A16 and decode attention as one CUDA graph per step; the f64 reference on the CPU"),
    ("engine_pdl", "gpu", "the engine with its decode graph's kernel-to-kernel edges programmatic (PDL, sm_90): each kernel launches while the one before runs, asks L2 for its weights, then waits for it"),
    ("engine_fused", "gpu", "engine_pdl with the fused decode products above: a layer in five launches and the attention's two instead of ten (batches up to 16)"),
    ("engine_merged", "gpu", "engine_fused at batch 1, engine_pdl above, with decode attention in one launch (attention's decode_merge)"),
    ("engine_attention_o", "sm_90+", "engine_fused with decode attention and the output product in one launch (attention_o_q4_1): a layer in four launches (batches up to 16)"),
    ("engine_ffn", "sm_90+", "engine_attention_o with the FFN in one launch too (ffn_q4_1): a layer in three launches (batches up to 16)"),
    ("engine_head", "sm_90+", "engine_attention_o with the step's tail in one launch (head_q8_0): the output norm, the LM head and the greedy choice"),
    ("engine_layer", "sm_90+", "engine_fused with each layer one launch (layer_q4_1, a cluster of 16 blocks per sequence): positions below 1024"),
];

/// The kernels' rows, then the engine's: the `llama` experiment's records are the engine's.
pub fn variants() -> Vec<VariantInfo> {
    let mut rows = variant::infos(VARIANTS);
    rows.extend(ENGINES.iter().map(|&(name, requires, what)| VariantInfo { name, dtypes: vec!["f16"], requires, what }));
    rows
}

fn rows_cfg(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

fn check(what: &str, ok: bool, why: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(LabError::shape(what, why()))
    }
}

/// Where the rows of a step are: `rows` tokens, `rows_per_seq` consecutive positions of each
/// sequence from `pos[seq]`.
#[derive(Clone, Copy, Debug)]
pub struct Rows {
    pub rows: usize,
    pub rows_per_seq: usize,
}

impl Rows {
    pub fn seqs(&self) -> usize {
        self.rows / self.rows_per_seq
    }
}

/// x[r] = embedding row of tokens[seq * cap + position] (Q8_0 blocks, `dim` wide).
#[allow(clippy::too_many_arguments)]
pub fn embed_q8_0(gpu: &Gpu, w: &CudaSlice<u8>, tokens: &CudaSlice<u32>, pos: &CudaSlice<i32>, x: &mut CudaSlice<f32>, r: Rows, cap: usize, dim: usize) -> Result<()> {
    check("embed_q8_0", dim.is_multiple_of(32) && w.len().is_multiple_of(dim / 32 * 34) && x.len() >= r.rows * dim && tokens.len() >= r.seqs() * cap && pos.len() >= r.seqs(), || {
        format!("dim {dim}, {} weight bytes, x {}, tokens {}, pos {} for {r:?}", w.len(), x.len(), tokens.len(), pos.len())
    })?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "embed_q8_0", DType::F32))?;
    let [rps, cap, dim] = [r.rows_per_seq, cap, dim].map(|v| v as i32);
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(w).arg(tokens).arg(pos).arg(x).arg(&rps).arg(&cap).arg(&dim);
    // SAFETY: x holds rows x dim; tokens seqs x cap; every token id is below the vocabulary (the
    // host checks prompts, argmax writes ids below it) and positions below cap (the host stops
    // before the cache is full).
    unsafe { l.launch(rows_cfg(r.rows, 256)) }.map(|_| ()).doing("launching llama embed_q8_0")
}

/// x += y (unless `y` is None), h = x / rms(x) * gamma, per row of `dim`.
#[allow(clippy::too_many_arguments)]
pub fn add_rmsnorm(gpu: &Gpu, x: &mut CudaSlice<f32>, y: Option<&CudaSlice<f16>>, gamma: &CudaSlice<f32>, h: &mut CudaSlice<f16>, rows: usize, dim: usize, eps: f32) -> Result<()> {
    let n = rows * dim;
    check("add_rmsnorm", x.len() >= n && h.len() >= n && gamma.len() == dim && y.is_none_or(|y| y.len() >= n), || format!("{rows} rows of {dim}"))?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "add_rmsnorm", DType::F16))?;
    let (dim_i, null) = (dim as i32, 0u64);
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(x);
    match y {
        Some(y) => l.arg(y),
        None => l.arg(&null),
    };
    l.arg(gamma).arg(h).arg(&dim_i).arg(&eps);
    // SAFETY: x, y and h hold rows x dim, gamma dim (checked); one block per row.
    unsafe { l.launch(rows_cfg(rows, 256)) }.map(|_| ()).doing("launching llama add_rmsnorm")
}

/// RoPE on the Q and K heads of `qkv` [rows, (hq + 2 hkv) d] at each row's position; Q to `q`
/// [rows, hq d], K and V into `cache`. `inv_freq` holds rope_dims / 2 entries.
#[allow(clippy::too_many_arguments)]
pub fn rope_cache(gpu: &Gpu, qkv: &CudaSlice<f16>, q: &mut CudaSlice<f16>, cache: &mut KvCache<f16>, pos: &CudaSlice<i32>, inv_freq: &CudaSlice<f64>, r: Rows, hq: usize) -> Result<()> {
    let (hkv, d) = (cache.hkv, cache.d);
    let rope_dims = 2 * inv_freq.len();
    check("rope_cache", qkv.len() >= r.rows * (hq + 2 * hkv) * d && q.len() >= r.rows * hq * d && rope_dims <= d && r.seqs() <= cache.batch && pos.len() >= r.seqs(), || {
        format!("{r:?}, {hq} query heads, {hkv} KV heads of {d}, {rope_dims} rotated dims")
    })?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "rope_cache", DType::F16))?;
    let [rps, hq, hkv, d, rd, page, mp] = [r.rows_per_seq, hq, hkv, d, rope_dims, cache.page, cache.max_pages].map(|v| v as i32);
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(qkv).arg(q).arg(&mut cache.k).arg(&mut cache.v).arg(&cache.table).arg(pos).arg(inv_freq);
    l.arg(&rps).arg(&hq).arg(&hkv).arg(&d).arg(&rd).arg(&page).arg(&mp);
    // SAFETY: shapes checked above; the cache's table entries are its own pages (checked when it
    // was made) and positions stay below its capacity (the host stops before it is full).
    unsafe { l.launch(rows_cfg(r.rows, 256)) }.map(|_| ()).doing("launching llama rope_cache")
}

/// act [rows, ffn] = silu(gu[:, :ffn]) * gu[:, ffn:].
pub fn swiglu(gpu: &Gpu, gu: &CudaSlice<f16>, act: &mut CudaSlice<f16>, rows: usize, ffn: usize) -> Result<()> {
    check("swiglu", gu.len() >= 2 * rows * ffn && act.len() >= rows * ffn, || format!("{rows} rows of {ffn}"))?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "swiglu", DType::F16))?;
    let [r, n] = [rows, ffn].map(|v| v as i32);
    let grid = (rows * ffn).div_ceil(256).min(gpu.info.sm_count as usize * 8);
    // SAFETY: a grid-stride loop over rows x ffn outputs; gu holds 2 ffn per row (checked).
    unsafe { gpu.stream.launch_builder(&f).arg(gu).arg(act).arg(&r).arg(&n).launch(rows_cfg(grid, 256)) }.map(|_| ()).doing("launching llama swiglu")
}

/// For each of `seqs` rows of logits: the greedy token into tokens[seq][pos + 1] (once past
/// the prompt) and pos advanced.
#[allow(clippy::too_many_arguments)]
pub fn argmax(gpu: &Gpu, logits: &CudaSlice<f32>, tokens: &mut CudaSlice<u32>, pos: &mut CudaSlice<i32>, prompt_len: &CudaSlice<i32>, seqs: usize, vocab: usize, cap: usize) -> Result<()> {
    check("argmax", logits.len() >= seqs * vocab && tokens.len() >= seqs * cap && pos.len() >= seqs && prompt_len.len() >= seqs, || format!("{seqs} rows of {vocab}"))?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "argmax", DType::F32))?;
    let [v, c] = [vocab, cap].map(|x| x as i32);
    // SAFETY: one block per sequence; logits, tokens, pos and prompt_len hold their rows (checked).
    unsafe { gpu.stream.launch_builder(&f).arg(logits).arg(tokens).arg(pos).arg(prompt_len).arg(&v).arg(&c).launch(rows_cfg(seqs, 1024)) }
        .map(|_| ())
        .doing("launching llama argmax")
}

/// A launch of one of the fused decode products: a warp per unit (row pair, column or row), 8
/// warps a block, the input of every sequence (`width` wide, at `most`) in shared memory.
fn fused_cfg(gpu: &Gpu, name: &str, units: usize, seqs: usize, width: usize, most: usize) -> Result<(cudarc::driver::CudaFunction, LaunchConfig)> {
    check(name, (1..=FUSED_MAX_SEQS).contains(&seqs) && width.is_multiple_of(32) && width <= most, || {
        format!("{seqs} sequences of width {width}: {name} takes 1 to {FUSED_MAX_SEQS} sequences of a multiple of 32 up to {most}")
    })?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, name, DType::F16))?;
    let smem = seqs * width * 4;
    crate::ops::gemm::raise_dynamic_smem(&f, smem)?;
    Ok((f, LaunchConfig { grid_dim: (units.div_ceil(8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: smem as u32 }))
}

/// `w` holds `rows` GGUF Q4_1 rows of `cols`.
fn check_q4_1(name: &str, w: &CudaSlice<u8>, rows: usize, cols: usize) -> Result<()> {
    check(name, w.len() == rows * cols / 32 * 20, || format!("{} weight bytes for {rows} Q4_1 rows of {cols}", w.len()))
}

/// One decode step's Q, K and V for `seqs` sequences: h = RMSNorm(x) gamma, qkv = h W^T (`w` the
/// stacked Q4_1 rows), RoPE at each sequence's position, Q to `q`, K and V into `cache`.
#[allow(clippy::too_many_arguments)]
pub fn qkv_rope_q4_1(
    gpu: &Gpu,
    w: &CudaSlice<u8>,
    x: &CudaSlice<f32>,
    gamma: &CudaSlice<f32>,
    eps: f32,
    q: &mut CudaSlice<f16>,
    cache: &mut KvCache<f16>,
    pos: &CudaSlice<i32>,
    inv_freq: &CudaSlice<f64>,
    seqs: usize,
    hq: usize,
) -> Result<()> {
    let (hkv, d, dim) = (cache.hkv, cache.d, gamma.len());
    let rows = (hq + 2 * hkv) * d;
    check_q4_1("qkv_rope_q4_1", w, rows, dim)?;
    check("qkv_rope_q4_1", x.len() >= seqs * dim && q.len() >= seqs * hq * d && 2 * inv_freq.len() <= d && seqs <= cache.batch && pos.len() >= seqs, || {
        format!("{seqs} sequences of {dim}, {hq} query heads, {hkv} KV heads of {d}")
    })?;
    let (f, cfg) = fused_cfg(gpu, "qkv_rope_q4_1", rows / 2, seqs, dim, FUSED_MAX_NORMED)?;
    let [seqs, dim, hq, hkv, d, rd, page, mp] = [seqs, dim, hq, hkv, d, 2 * inv_freq.len(), cache.page, cache.max_pages].map(|v| v as i32);
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(w).arg(x).arg(gamma).arg(&eps).arg(q).arg(&mut cache.k).arg(&mut cache.v).arg(&cache.table).arg(pos).arg(inv_freq);
    l.arg(&seqs).arg(&dim).arg(&hq).arg(&hkv).arg(&d).arg(&rd).arg(&page).arg(&mp);
    // SAFETY: w holds the rows (checked), x, q and pos the sequences; the cache's table entries
    // are its own pages and positions stay below its capacity (as for rope_cache); the shared
    // memory is what fused_cfg sized for seqs x dim.
    unsafe { l.launch(cfg) }.map(|_| ()).doing("launching llama qkv_rope_q4_1")
}

/// act [seqs, ffn] = silu(h Wg^T) * (h Wu^T), h = RMSNorm(x) gamma; `w` the gate rows, then the up rows.
#[allow(clippy::too_many_arguments)]
pub fn gate_up_swiglu_q4_1(gpu: &Gpu, w: &CudaSlice<u8>, x: &CudaSlice<f32>, gamma: &CudaSlice<f32>, eps: f32, act: &mut CudaSlice<f16>, seqs: usize, ffn: usize) -> Result<()> {
    let dim = gamma.len();
    check_q4_1("gate_up_swiglu_q4_1", w, 2 * ffn, dim)?;
    check("gate_up_swiglu_q4_1", x.len() >= seqs * dim && act.len() >= seqs * ffn, || format!("{seqs} sequences of {dim} -> {ffn}"))?;
    let (f, cfg) = fused_cfg(gpu, "gate_up_swiglu_q4_1", ffn, seqs, dim, FUSED_MAX_NORMED)?;
    let [seqs, dim, ffn] = [seqs, dim, ffn].map(|v| v as i32);
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(w).arg(x).arg(gamma).arg(&eps).arg(act).arg(&seqs).arg(&dim).arg(&ffn);
    // SAFETY: w holds 2 ffn rows of dim, x and act their sequences (checked); shared memory sized
    // by fused_cfg.
    unsafe { l.launch(cfg) }.map(|_| ()).doing("launching llama gate_up_swiglu_q4_1")
}

/// x [seqs, n] += a [seqs, k] W^T for `w` n Q4_1 rows of k (the product rounded to f16 first).
/// `ahead`: bytes of another buffer (weights a later kernel reads) asked of L2 before the wait.
#[allow(clippy::too_many_arguments)]
pub fn residual_q4_1(
    gpu: &Gpu,
    w: &CudaSlice<u8>,
    a: &CudaSlice<f16>,
    x: &mut CudaSlice<f32>,
    seqs: usize,
    n: usize,
    k: usize,
    ahead: Option<(&CudaSlice<u8>, Range<usize>)>,
) -> Result<()> {
    check_q4_1("residual_q4_1", w, n, k)?;
    check("residual_q4_1", a.len() >= seqs * k && x.len() >= seqs * n, || format!("{seqs} sequences of {k} -> {n}"))?;
    if let Some((buf, r)) = &ahead {
        check("residual_q4_1", r.start <= r.end && r.end <= buf.len(), || format!("bytes {r:?} ahead of a buffer of {}", buf.len()))?;
    }
    let (f, cfg) = fused_cfg(gpu, "residual_q4_1", n, seqs, k, FUSED_MAX_WIDTH)?;
    let [seqs, n, k] = [seqs, n, k].map(|v| v as i32);
    let (ahead, ahead_bytes) = match ahead {
        Some((buf, r)) => (buf.slice(r.clone()), r.len() as i64),
        None => (w.slice(..), 0),
    };
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(w).arg(a).arg(x).arg(&seqs).arg(&n).arg(&k).arg(&ahead).arg(&ahead_bytes);
    // SAFETY: w holds n rows of k, a and x their sequences (checked); shared memory sized by
    // fused_cfg; the kernel only asks L2 for the ahead_bytes of `ahead` (a view of them).
    unsafe { l.launch(cfg) }.map(|_| ()).doing("launching llama residual_q4_1")
}

/// ffn_q4_1's working memory: each cluster's partial sums ([clusters, seqs, dim]) and a count per
/// cluster rank (zero between launches: the last block to count resets it).
pub struct FfnScratch {
    part: CudaSlice<f32>,
    count: CudaSlice<u32>,
    seqs: usize,
    dim: usize,
    ffn: usize,
}

/// ffn_q4_1's grid: whole clusters covering the FFN's columns.
fn ffn_blocks(ffn: usize) -> usize {
    ffn.div_ceil(FFN_BLOCK_COLS).div_ceil(FFN_CLUSTER) * FFN_CLUSTER
}

impl FfnScratch {
    pub fn new(gpu: &Gpu, seqs: usize, dim: usize, ffn: usize) -> Result<Self> {
        let part = gpu.stream.alloc_zeros(ffn_blocks(ffn) / FFN_CLUSTER * seqs * dim).doing("allocating ffn_q4_1's partial sums")?;
        let count = gpu.stream.alloc_zeros(FFN_CLUSTER).doing("allocating ffn_q4_1's counts")?;
        Ok(FfnScratch { part, count, seqs, dim, ffn })
    }
}

/// x [seqs, dim] += f16(SwiGLU(h Wg^T, h Wu^T) Wd^T), h = RMSNorm(x) gamma, in one launch (sm_90):
/// `wgu` the gate rows then the up rows (Q4_1, 2 ffn of dim), `wd` the down product's dim rows of
/// ffn; every value rounded where gate_up_swiglu_q4_1 and residual_q4_1 round.
#[allow(clippy::too_many_arguments)]
pub fn ffn_q4_1(gpu: &Gpu, wgu: &CudaSlice<u8>, wd: &CudaSlice<u8>, x: &mut CudaSlice<f32>, gamma: &CudaSlice<f32>, eps: f32, scratch: &mut FfnScratch, seqs: usize) -> Result<()> {
    let (dim, ffn) = (gamma.len(), scratch.ffn);
    check("ffn_q4_1", gpu.arch >= 90, || format!("clusters need sm_90, this GPU is sm_{}", gpu.arch))?;
    check_q4_1("ffn_q4_1", wgu, 2 * ffn, dim)?;
    check_q4_1("ffn_q4_1", wd, dim, ffn)?;
    check("ffn_q4_1", x.len() >= seqs * dim && seqs <= scratch.seqs && dim == scratch.dim && ffn.is_multiple_of(32), || {
        format!("{seqs} sequences of {dim} -> {ffn} (scratch for {} of {})", scratch.seqs, scratch.dim)
    })?;
    let (f, mut cfg) = fused_cfg(gpu, "ffn_q4_1", ffn, seqs, dim, FUSED_MAX_NORMED)?;
    cfg.grid_dim.0 = ffn_blocks(ffn) as u32;
    let [seqs, dim, ffn] = [seqs, dim, ffn].map(|v| v as i32);
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(wgu).arg(wd).arg(x).arg(gamma).arg(&eps).arg(&mut scratch.part).arg(&mut scratch.count).arg(&seqs).arg(&dim).arg(&ffn);
    // SAFETY: the weights hold their rows, x its sequences (checked); the scratch holds a cluster's
    // partials for up to its sequences of dim (checked) and its counts are zero between launches
    // (allocated zero, reset by the last block); shared memory sized by fused_cfg.
    unsafe { l.launch(cfg) }.map(|_| ()).doing("launching llama ffn_q4_1")
}

/// Whether attention_o_q4_1 takes `hq` query heads and `hkv` KV heads of `d` (on sm_90).
pub fn attention_o_takes(hq: usize, hkv: usize, d: usize) -> bool {
    d == ATTENTION_O_HEAD_DIM && (1..=ATTENTION_O_MAX_KV_HEADS).contains(&hkv) && hq.is_multiple_of(hkv) && hq / hkv <= ATTENTION_O_MAX_GROUP && hq * d <= FUSED_MAX_NORMED
}

/// x [seqs, hq D] += f16(att W^T), att the decode attention of `q` over `cache` at `pos` (each
/// sequence's rows 0..=pos), `w` the output product's Q4_1 rows; one launch ([`ATTENTION_O_HEAD_DIM`]
/// and the limits after it; sm_90).
#[allow(clippy::too_many_arguments)]
pub fn attention_o_q4_1(gpu: &Gpu, w: &CudaSlice<u8>, q: &CudaSlice<f16>, cache: &KvCache<f16>, pos: &CudaSlice<i32>, x: &mut CudaSlice<f32>, seqs: usize, hq: usize) -> Result<()> {
    let (hkv, d) = (cache.hkv, cache.d);
    let dim = hq * d;
    check("attention_o_q4_1", gpu.arch >= 90, || format!("clusters need sm_90, this GPU is sm_{}", gpu.arch))?;
    check(
        "attention_o_q4_1",
        attention_o_takes(hq, hkv, d),
        || format!("{hq} query heads and {hkv} KV heads of {d}: it takes heads of {ATTENTION_O_HEAD_DIM}, up to {ATTENTION_O_MAX_KV_HEADS} KV heads of up to {ATTENTION_O_MAX_GROUP} query heads, {FUSED_MAX_NORMED} wide"),
    )?;
    check_q4_1("attention_o_q4_1", w, dim, dim)?;
    check("attention_o_q4_1", (1..=cache.batch).contains(&seqs) && q.len() >= seqs * dim && x.len() >= seqs * dim && pos.len() >= seqs, || {
        format!("{seqs} sequences of {dim} over a cache of {}", cache.batch)
    })?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "attention_o_q4_1", DType::F16))?;
    crate::ops::gemm::raise_dynamic_smem(&f, ATTENTION_O_SMEM)?;
    // A warp a row, in whole clusters of three blocks.
    let blocks = dim.div_ceil(16).div_ceil(3) * 3;
    let cfg = LaunchConfig { grid_dim: (blocks as u32, seqs as u32, 1), block_dim: (512, 1, 1), shared_mem_bytes: ATTENTION_O_SMEM as u32 };
    let scale_log2 = std::f32::consts::LOG2_E / (d as f32).sqrt();
    let [hq, hkv, page, mp] = [hq, hkv, cache.page, cache.max_pages].map(|v| v as i32);
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(w).arg(q).arg(&cache.k).arg(&cache.v).arg(&cache.table).arg(pos).arg(x);
    l.arg(&hq).arg(&hkv).arg(&page).arg(&mp).arg(&scale_log2);
    // SAFETY: w holds dim rows of dim, q, x and pos the sequences (checked); positions stay below
    // the cache's capacity and its table entries are its own pages (as for qkv_rope_q4_1); the
    // dynamic shared memory is the kernel's AO_SMEM.
    unsafe { l.launch(cfg) }.map(|_| ()).doing("launching llama attention_o_q4_1")
}

/// Whether layer_q4_1 takes a layer of `hq` query heads and `hkv` KV heads of `d`, `dim` wide
/// with an FFN of `ffn` (shapes only: [`layer_q4_1`] also checks shared memory and positions).
pub fn layer_takes(hq: usize, hkv: usize, d: usize, dim: usize, ffn: usize) -> bool {
    let pairs = (hq + 2 * hkv) * d / 2;
    d == LAYER_HEAD_DIM
        && (1..=LAYER_MAX_HEADS).contains(&hq)
        && hkv >= 1
        && hq.is_multiple_of(hkv)
        && dim == hq * d
        && dim <= FUSED_MAX_NORMED
        && ffn.is_multiple_of(32)
        && (32..=FUSED_MAX_WIDTH).contains(&ffn)
        && pairs.div_ceil(LAYER_CLUSTER) <= LAYER_MAX_PAIRS
}

/// layer_q4_1's dynamic shared memory: each product's rows of one block (16-aligned), then its
/// key and value tiles ([`LAYER_KEY_SLOTS`] of every KV head, keys [`LAYER_KEY_STRIDE`] halves apart).
pub fn layer_smem(dim: usize, hq: usize, hkv: usize, ffn: usize) -> usize {
    let up16 = |v: usize| v.div_ceil(16) * 16;
    let (rb1, rb2) = (dim / 32 * 20, ffn / 32 * 20);
    let (ppb, rpb, fpb) = (((hq + 2 * hkv) * LAYER_HEAD_DIM / 2).div_ceil(LAYER_CLUSTER), dim.div_ceil(LAYER_CLUSTER), ffn.div_ceil(LAYER_CLUSTER));
    up16(2 * ppb * rb1) + up16(rpb * rb1) + up16(2 * fpb * rb1) + up16(rpb * rb2) + LAYER_KEY_SLOTS * hkv * (LAYER_KEY_STRIDE + LAYER_HEAD_DIM) * 2
}

/// One layer's Q4_1 products and norms, as [`layer_q4_1`] reads them.
pub struct LayerWeights<'a> {
    /// (hq + 2 hkv) D rows of dim: Q, K, V.
    pub qkv: &'a CudaSlice<u8>,
    pub o: &'a CudaSlice<u8>,
    /// Gate rows then up rows: 2 ffn of dim.
    pub gate_up: &'a CudaSlice<u8>,
    pub down: &'a CudaSlice<u8>,
    pub attn_norm: &'a CudaSlice<f32>,
    pub ffn_norm: &'a CudaSlice<f32>,
}

/// One decode layer for `seqs` sequences in one launch: x += attention(RoPE(RMSNorm(x) Wqkv)) Wo
/// (K and V stored into `cache` at each sequence's position), then x += SwiGLU(RMSNorm(x) Wgu) Wd,
/// rounded where the fused products round. sm_90; [`layer_takes`]'s shapes.
#[allow(clippy::too_many_arguments)]
pub fn layer_q4_1(
    gpu: &Gpu,
    w: &LayerWeights,
    x: &mut CudaSlice<f32>,
    cache: &mut KvCache<f16>,
    pos: &CudaSlice<i32>,
    inv_freq: &CudaSlice<f64>,
    eps: f32,
    seqs: usize,
    hq: usize,
    ffn: usize,
) -> Result<()> {
    let (hkv, d, dim) = (cache.hkv, cache.d, w.attn_norm.len());
    check("layer_q4_1", gpu.arch >= 90, || format!("clusters of 16 need sm_90, this GPU is sm_{}", gpu.arch))?;
    check("layer_q4_1", layer_takes(hq, hkv, d, dim, ffn), || {
        format!(
            "{hq} query heads and {hkv} KV heads of {d}, {dim} wide, an FFN of {ffn}: it takes heads of {LAYER_HEAD_DIM}, up to {LAYER_MAX_HEADS} query heads, {FUSED_MAX_NORMED} wide, an FFN up to {FUSED_MAX_WIDTH}"
        )
    })?;
    check_q4_1("layer_q4_1", w.qkv, (hq + 2 * hkv) * d, dim)?;
    check_q4_1("layer_q4_1", w.o, dim, dim)?;
    check_q4_1("layer_q4_1", w.gate_up, 2 * ffn, dim)?;
    check_q4_1("layer_q4_1", w.down, dim, ffn)?;
    let capacity = cache.page * cache.max_pages;
    check(
        "layer_q4_1",
        (1..=cache.batch).contains(&seqs) && x.len() >= seqs * dim && pos.len() >= seqs && w.ffn_norm.len() == dim && 2 * inv_freq.len() <= d && capacity <= LAYER_MAX_POSITIONS,
        || format!("{seqs} sequences of {dim} over a cache of {} sequences of {capacity} positions (at most {LAYER_MAX_POSITIONS})", cache.batch),
    )?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "layer_q4_1", DType::F16))?;
    let smem = layer_smem(dim, hq, hkv, ffn);
    let static_smem = f.get_attribute(cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).doing("reading layer_q4_1's static shared memory")? as usize;
    let optin = gpu.info.max_smem_per_block_optin as usize;
    check("layer_q4_1", smem + static_smem <= optin, || format!("a block's share of the weights and tiles takes {smem} + {static_smem} bytes of shared memory; this device allows {optin}"))?;
    crate::ops::gemm::raise_dynamic_smem(&f, smem)?;
    f.set_attribute(cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1).doing("allowing clusters of 16")?;
    let cfg = LaunchConfig { grid_dim: (LAYER_CLUSTER as u32, seqs as u32, 1), block_dim: (LAYER_THREADS, 1, 1), shared_mem_bytes: smem as u32 };
    let scale_log2 = std::f32::consts::LOG2_E / (d as f32).sqrt();
    let [dim, hq, hkv, ffn, rd, page, mp] = [dim, hq, hkv, ffn, 2 * inv_freq.len(), cache.page, cache.max_pages].map(|v| v as i32);
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(w.qkv).arg(w.o).arg(w.gate_up).arg(w.down).arg(w.attn_norm).arg(w.ffn_norm).arg(x);
    l.arg(&mut cache.k).arg(&mut cache.v).arg(&cache.table).arg(pos).arg(inv_freq);
    l.arg(&eps).arg(&dim).arg(&hq).arg(&hkv).arg(&ffn).arg(&rd).arg(&page).arg(&mp).arg(&scale_log2);
    // SAFETY: the weights hold their rows and x and pos the sequences (checked); positions stay
    // below the cache's capacity, at most the kernel's key slots (checked), and its table entries
    // are its own pages (as for qkv_rope_q4_1); the dynamic shared memory is layer_smem's.
    unsafe { l.launch(cfg) }.map(|_| ()).doing("launching llama layer_q4_1")
}

/// [`argmax`]'s contract, the token drawn as `s` says (the draw of
/// [`crate::model::llama::sample::Draw`] at each sequence's position); `s` must not be greedy.
#[allow(clippy::too_many_arguments)]
pub fn sample(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    tokens: &mut CudaSlice<u32>,
    pos: &mut CudaSlice<i32>,
    prompt_len: &CudaSlice<i32>,
    seqs: usize,
    vocab: usize,
    cap: usize,
    s: &crate::model::llama::Sampling,
) -> Result<()> {
    s.check()?;
    check("sample", !s.greedy() && logits.len() >= seqs * vocab && tokens.len() >= seqs * cap && pos.len() >= seqs && prompt_len.len() >= seqs, || {
        format!("{seqs} rows of {vocab} at temperature {}", s.temperature)
    })?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "sample", DType::F32))?;
    let [v, c] = [vocab, cap].map(|x| x as i32);
    let k = s.top_k.min(i32::MAX as usize) as i32;
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(logits).arg(tokens).arg(pos).arg(prompt_len).arg(&v).arg(&c).arg(&s.temperature).arg(&k).arg(&s.top_p).arg(&s.seed);
    // SAFETY: one block per sequence; logits, tokens, pos and prompt_len hold their rows (checked).
    unsafe { l.launch(rows_cfg(seqs, 1024)) }.map(|_| ()).doing("launching llama sample")
}
