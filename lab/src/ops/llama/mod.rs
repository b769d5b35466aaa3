//! `llama`: the fused steps of a Llama forward between its weight products and attention
//! (kernels/llama.cu), as launches on the engine's device buffers ([`crate::model::llama`]
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

pub const FAMILY: &str = "llama";

pub mod experiment;
pub use experiment::Llama;

/// The fused steps; each is one kernel with no ladder yet.
pub const VARIANTS: &[Variant<()>] = &[
    Variant { name: "embed_q8_0", dtypes: &[DType::F32], requires: Requires::Gpu, what: "the token's Q8_0 embedding row into the f32 residual stream", config: () },
    Variant { name: "add_rmsnorm", dtypes: &[DType::F16], requires: Requires::Gpu, what: "residual add fused into the next RMSNorm: x read once for both", config: () },
    Variant { name: "rope_cache", dtypes: &[DType::F16], requires: Requires::Gpu, what: "RoPE on Q and K of the fused QKV product, K and V stored in the paged cache", config: () },
    Variant { name: "swiglu", dtypes: &[DType::F16], requires: Requires::Gpu, what: "silu(gate) * up of the fused gate|up product", config: () },
    Variant { name: "argmax", dtypes: &[DType::F32], requires: Requires::Gpu, what: "greedy token per sequence, written and the position advanced on the device", config: () },
];

/// The kernels' rows, then the model they make up: the `llama` experiment's records are the
/// engine's (on the CPU backend, the reference forward).
pub fn variants() -> Vec<VariantInfo> {
    let mut rows = variant::infos(VARIANTS);
    rows.push(VariantInfo {
        name: "engine",
        dtypes: vec!["f16"],
        requires: "gpu or cpu",
        what: "the whole model (model::llama): the steps above around W4A16, W8A16 and decode attention as one CUDA graph per step; the f64 reference on the CPU",
    });
    rows.push(VariantInfo {
        name: "engine_pdl",
        dtypes: vec!["f16"],
        requires: "gpu",
        what: "the engine with its decode graph's kernel-to-kernel edges programmatic (PDL, sm_90): each kernel launches while the one before runs, asks L2 for its weights, then waits for it",
    });
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
