//! The GPU engine: weights stay in their GGUF blocks on the device (Q4_1 matrices repacked
//! losslessly for the W4A16 designs, the Q8_0 embedding read as stored), activations in f16
//! around an f32 residual stream, a paged KV cache per layer, and greedy sampling on the device.
//!
//! A step runs one position of every sequence of a [`Batch`]: the token at its position goes
//! through the model, its keys and values join the cache, and the next token is chosen on the
//! device (prompt positions keep their token). Nothing in a step reads the host, so the first
//! step runs eagerly (loading kernels, sizing scratch) and every later one replays a captured
//! CUDA graph, its kernel-to-kernel edges programmatic if asked ([`Batch::set_programmatic`]).
//!
//! Per layer: add_rmsnorm, the fused QKV product, rope_cache, decode attention, the output
//! product, add_rmsnorm, the fused gate|up product, swiglu, the down product. With
//! [`Batch::set_fused`], the same work on the same GGUF blocks in four fused products around the
//! attention: qkv_rope_q4_1, decode attention, residual_q4_1 (output), gate_up_swiglu_q4_1,
//! residual_q4_1 (down). Decode attention is two launches (split and combine, [`ATTENTION`]) or
//! one (decode_merge, through [`Batch::set_attention`]); with [`ATTENTION_O`] the attention and
//! the output product are one launch, and a layer four; with [`LAYER`] a layer is one launch.
//! [`Batch::set_ffn`] makes the FFN one launch too (ffn_q4_1), a layer three, and
//! [`Batch::set_head`] the step's tail (head_q8_0).
//!
//! This file loads the model's device weights; [`batch`] holds a batch's buffers and launch
//! sequences (a child module, so that it reads the weights' fields directly).

use super::config::Config;
use super::weights::Tensors;
use crate::experiment::Backend;
use crate::gpu::Gpu;
use crate::ops::llama as k;
use crate::ops::quant::{self, QuantTensor};
use crate::quant::ggml::Block;
use crate::tensor::Tensor;
use crate::weights::gguf::{Gguf, GgmlType, TensorInfo};
use crate::{LabError, Result};
use cudarc::driver::CudaSlice;
use half::f16;
use rayon::prelude::*;
use std::sync::Arc;

mod batch;
pub use batch::Batch;

pub struct GpuModel {
    pub config: Config,
    gpu: Arc<Gpu>,
    dev: Backend,
    /// Q8_0 blocks, `vocab` rows of `dim`.
    embed: CudaSlice<u8>,
    /// The LM head (the embedding's blocks again when tied).
    head: quant::Q8Tensor,
    /// The same blocks repacked for head_q8_0 (rows up to its width); boxed, so that `Engine`'s
    /// GPU model stays near its CPU model's size.
    head_packed: Option<Box<k::PackedHead>>,
    layers: Vec<GpuLayer>,
    out_norm: CudaSlice<f32>,
    /// base^(-2i / rope_dims) / linear scale, i < rope_dims / 2.
    inv_freq: CudaSlice<f64>,
}

struct GpuLayer {
    /// The products' weights dequantized to f16 and transposed (K x N), for prefill's GEMMs.
    dense: Dense,
    /// The products' Q4_1 blocks as the GGUF stores them, for the fused decode products.
    raw: Raw,
    attn_norm: CudaSlice<f32>,
    /// Q, K and V stacked: (hq + 2 hkv) d rows.
    qkv: QuantTensor,
    o: QuantTensor,
    ffn_norm: CudaSlice<f32>,
    /// gate then up: 2 ffn rows.
    gate_up: QuantTensor,
    down: QuantTensor,
}

struct Dense {
    qkv: Tensor<f16>,
    o: Tensor<f16>,
    gate_up: Tensor<f16>,
    down: Tensor<f16>,
}

struct Raw {
    qkv: CudaSlice<u8>,
    o: CudaSlice<u8>,
    gate_up: CudaSlice<u8>,
    down: CudaSlice<u8>,
}

/// A Q4_1 matrix of `rows x cols` as f16, transposed to `cols x rows` (the B of C = A B).
fn dense_t(dev: &Backend, blocks: &[u8], rows: usize, cols: usize) -> Result<Tensor<f16>> {
    let w = crate::quant::ggml::dequantize(Block::Q4_1, blocks)?;
    let mut t = vec![f16::ZERO; rows * cols];
    t.par_chunks_mut(rows).enumerate().for_each(|(c, out)| out.iter_mut().enumerate().for_each(|(r, o)| *o = f16::from_f32(w[r * cols + c])));
    Tensor::from_slice(dev, &[cols, rows], &t)
}

/// The bytes of these tensors, which must all be of type `ty`, end to end: stacking the rows of
/// weight matrices that read the same input.
fn stacked(g: &Gguf, parts: &[(&str, &TensorInfo)], ty: GgmlType) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for (name, t) in parts {
        if t.ty != ty {
            return Err(LabError::Invalid(format!("tensor `{name}` is {}: the GPU engine reads {} matrices", t.ty.name(), ty.name())));
        }
        out.extend_from_slice(g.data(t));
    }
    Ok(out)
}

fn f32_vector(gpu: &Gpu, g: &Gguf, name: &str, t: &TensorInfo) -> Result<CudaSlice<f32>> {
    if t.ty != GgmlType::F32 {
        return Err(LabError::Invalid(format!("tensor `{name}` is {}: norms are read as F32", t.ty.name())));
    }
    gpu.upload(&crate::quant::ggml::to_f32(t.ty, g.data(t))?)
}

impl GpuModel {
    pub fn load(gpu: &Arc<Gpu>, g: &Gguf) -> Result<Self> {
        let config = Config::from_gguf(g)?;
        let t = Tensors::find(g, &config)?;
        let c = &config;
        if ![64, 128].contains(&c.head_dim) {
            return Err(LabError::Invalid(format!("head size {}: the decode kernels take 64 or 128", c.head_dim)));
        }
        let dev = Backend::Cuda(gpu.clone());
        let matrix = |parts: &[(&str, &TensorInfo)], rows: usize, cols: usize| -> Result<(QuantTensor, Tensor<f16>, CudaSlice<u8>)> {
            let bytes = stacked(g, parts, GgmlType::Q4_1)?;
            Ok((QuantTensor::from_gguf_q4_1(&dev, &bytes, rows, cols)?, dense_t(&dev, &bytes, rows, cols)?, gpu.upload(&bytes)?))
        };
        let mut layers = Vec::with_capacity(c.layers);
        for (i, l) in t.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let (q, k, v, o, gate, up, down) = (n("attn_q"), n("attn_k"), n("attn_v"), n("attn_output"), n("ffn_gate"), n("ffn_up"), n("ffn_down"));
            let (qkv, qkv_t, qkv_r) = matrix(&[(&q, l.q), (&k, l.k), (&v, l.v)], c.dim + 2 * c.kv_dim(), c.dim)?;
            let (o, o_t, o_r) = matrix(&[(&o, l.o)], c.dim, c.dim)?;
            let (gate_up, gate_up_t, gate_up_r) = matrix(&[(&gate, l.gate), (&up, l.up)], 2 * c.ffn, c.dim)?;
            let (down, down_t, down_r) = matrix(&[(&down, l.down)], c.dim, c.ffn)?;
            layers.push(GpuLayer {
                dense: Dense { qkv: qkv_t, o: o_t, gate_up: gate_up_t, down: down_t },
                raw: Raw { qkv: qkv_r, o: o_r, gate_up: gate_up_r, down: down_r },
                attn_norm: f32_vector(gpu, g, &n("attn_norm"), l.attn_norm)?,
                qkv,
                o,
                ffn_norm: f32_vector(gpu, g, &n("ffn_norm"), l.ffn_norm)?,
                gate_up,
                down,
            });
        }
        let embed = stacked(g, &[("token_embd.weight", t.embed)], GgmlType::Q8_0)?;
        let head_name = if t.output.is_some() { "output.weight" } else { "token_embd.weight" };
        let head_blocks = stacked(g, &[(head_name, t.head())], GgmlType::Q8_0)?;
        let head = quant::Q8Tensor::from_blocks(&dev, &head_blocks, c.vocab, c.dim)?;
        let head_packed = if c.dim <= k::HEAD_MAX_WIDTH { Some(Box::new(k::PackedHead::new(gpu, &head_blocks, c.vocab, c.dim)?)) } else { None };
        let inv_freq: Vec<f64> = (0..c.rope_dims / 2).map(|i| c.rope_angle(1, i)).collect();
        Ok(GpuModel {
            embed: gpu.upload(&embed)?,
            head,
            head_packed,
            layers,
            out_norm: f32_vector(gpu, g, "output_norm.weight", t.out_norm)?,
            inv_freq: gpu.upload(&inv_freq)?,
            gpu: gpu.clone(),
            dev,
            config,
        })
    }

    /// Bytes a decode step of `batch` sequences must read at least: every weight once, as the
    /// step reads it (Q4_1 for the W4A16 batches, f16 through the GEMM otherwise; the Q8_0 head).
    pub fn weight_bytes(&self, batch: usize) -> u64 {
        let c = &self.config;
        let weights = (c.dim * (c.dim + 2 * c.kv_dim()) + c.dim * c.dim + 3 * c.dim * c.ffn) as u64;
        let per_weight = if quant::variants::BATCHES.contains(&batch) { 20.0 / 32.0 } else { 2.0 };
        let per_layer = (weights as f64 * per_weight) as u64 + 8 * c.dim as u64;
        c.layers as u64 * per_layer + (c.vocab * c.dim / 32 * 34) as u64 + 4 * c.dim as u64
    }

    /// The bytes of the LM head that layer `i`'s down product asks L2 for before its wait: the
    /// head (30 MB of Q8_0 for SmolLM2) is read right after the last layer, and a step reads its
    /// weights at a small share of the memory's rate, so the head is fetched over the last layers
    /// (as many as keep it and their own weights within 3/4 of L2), not while its kernel waits.
    /// `head` is the size of the buffer the head is read from (its GGUF blocks, or head_q8_0's
    /// packed codes).
    pub fn head_ahead(&self, i: usize, head: usize) -> Option<std::ops::Range<usize>> {
        let c = &self.config;
        let layer = (self.weight_bytes(1) - self.head.bytes()) as usize / c.layers;
        ahead_share(head, layer, c.layers, self.gpu.info.l2_bytes.max(0) as usize, i)
    }

    /// Whether [`Batch::set_fused`] takes a batch of `seqs`: the fused products' limits on
    /// sequences and widths.
    pub fn fuses(&self, seqs: usize) -> bool {
        let c = &self.config;
        seqs <= k::FUSED_MAX_SEQS && c.dim <= k::FUSED_MAX_NORMED && c.ffn <= k::FUSED_MAX_WIDTH && c.dim.is_multiple_of(32) && c.ffn.is_multiple_of(32)
    }

    /// Whether a fused batch of `seqs` takes [`ATTENTION_O`]: the kernel's limits on heads, and sm_90.
    pub fn fuses_attention(&self, seqs: usize) -> bool {
        let c = &self.config;
        self.fuses(seqs) && self.gpu.arch >= 90 && k::attention_o_takes(c.heads, c.kv_heads, c.head_dim) && c.heads * c.head_dim == c.dim
    }

    /// Whether a fused batch of `seqs` sequences runs its tail in one launch ([`Batch::set_head`]).
    pub fn fuses_head(&self, seqs: usize) -> bool {
        self.fuses(seqs) && self.head_packed.is_some() && seqs <= k::HEAD_MAX_SEQS
    }

    /// Whether a fused batch of `seqs` sequences runs its FFN in one launch ([`Batch::set_ffn`]).
    pub fn fuses_ffn(&self, seqs: usize) -> bool {
        self.fuses(seqs) && self.gpu.arch >= 90
    }

    /// Whether a fused batch of `seqs` sequences of `capacity` positions takes [`LAYER`]: the
    /// kernel's limits on shapes and positions, and sm_90.
    pub fn fuses_layer(&self, seqs: usize, capacity: usize) -> bool {
        let c = &self.config;
        self.fuses(seqs) && self.gpu.arch >= 90 && k::layer_takes(c.heads, c.kv_heads, c.head_dim, c.dim, c.ffn) && capacity <= k::LAYER_MAX_POSITIONS
    }

    /// `seqs` sequences of up to `capacity` positions each.
    pub fn batch(&self, seqs: usize, capacity: usize) -> Result<Batch<'_>> {
        Batch::new(self, seqs, capacity)
    }
}

/// The decode attention variant a batch starts with. decode_merge (one launch, the combine done
/// by each head group's last split) is faster alone, but inside the programmatic step the
/// combine's launch was already hidden: at batch 1 it was 1.6% slower at context 128 and 2.9%
/// faster at 2048, and 3.6% slower at batch 64 and 2048 (note h200-decode-merge).
pub const ATTENTION: &str = "decode_mma";

/// Layer `i`'s share of `head` bytes fetched ahead over the last layers of `layers` (each reading
/// `layer` bytes of its own): as many as keep the head and their weights within 3/4 of `l2`;
/// none when the head alone does not fit there.
fn ahead_share(head: usize, layer: usize, layers: usize, l2: usize, i: usize) -> Option<std::ops::Range<usize>> {
    let spread = ((l2 * 3 / 4).saturating_sub(head) / layer.max(1)).min(layers);
    let first = layers - spread;
    let share = head.div_ceil(spread.max(1));
    (i >= first).then(|| (i - first) * share..((i - first + 1) * share).min(head))
}

/// The attention "variant" that is the llama family's attention_o_q4_1: decode attention and the
/// output product in one launch, for the fused steps ([`GpuModel::fuses_attention`]).
pub const ATTENTION_O: &str = "attention_o_q4_1";

/// Positions attention_o_q4_1 takes in one pass of keys (its AO_KEYS); past them each further
/// pass costs more than the split decode attention saves.
pub const ATTENTION_O_ONE_PASS: usize = 512;

/// The "attention variant" that is the llama family's layer_q4_1: the whole layer in one launch,
/// for fused steps ([`GpuModel::fuses_layer`]).
pub const LAYER: &str = "layer_q4_1";

#[cfg(test)]
mod tests {
    use super::ahead_share;

    #[test]
    fn the_head_is_fetched_whole_over_the_last_layers_that_fit_in_l2() {
        // SmolLM2 on an H200: a 30.1 MB head, 2.2 MB a layer, 30 layers, 50 MiB of L2: four layers.
        let (head, layer, l2) = (30_081_024, 2_211_840, 52_428_800);
        let shares: Vec<_> = (0..30).filter_map(|i| ahead_share(head, layer, 30, l2, i).map(|r| (i, r))).collect();
        assert_eq!(shares.iter().map(|s| s.0).collect::<Vec<_>>(), vec![26, 27, 28, 29]);
        // The shares tile the head: each starts where the last ended, the last ends at its end.
        assert_eq!(shares[0].1.start, 0);
        assert!(shares.windows(2).all(|w| w[0].1.end == w[1].1.start));
        assert_eq!(shares[3].1.end, head);
        // A head that alone overfills 3/4 of L2 is not fetched ahead; a large L2 spreads it over every layer.
        assert!((0..30).all(|i| ahead_share(head, layer, 30, head, i).is_none()));
        assert_eq!((0..30).filter(|&i| ahead_share(head, layer, 30, 1 << 30, i).is_some()).count(), 30);
    }
}
