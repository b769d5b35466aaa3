//! The CPU reference forward: weights dequantized to f32 from the file as stored, every dot
//! product, norm and softmax accumulated in f64, RoPE angles in f64. It is the oracle the GPU
//! engine is judged against; one token reads every weight once (about 0.5 GB of f32 for
//! SmolLM2-135M), so it suits a few tokens, not a benchmark.

use super::config::Config;
use super::weights::{Layer, Tensors};
use crate::quant::ggml;
use crate::weights::gguf::Gguf;
use crate::{LabError, Result};
use rayon::prelude::*;

pub struct CpuModel {
    pub config: Config,
    /// `vocab x dim`, row per token.
    embed: Vec<f32>,
    layers: Vec<Layer<Vec<f32>>>,
    out_norm: Vec<f32>,
    /// `vocab x dim`; `None` when the head is the embedding.
    output: Option<Vec<f32>>,
}

/// Keys and values of the positions seen so far, per layer (`len x kv_dim` each).
pub struct CpuCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    pub len: usize,
}

impl CpuModel {
    pub fn load(g: &Gguf) -> Result<Self> {
        let config = Config::from_gguf(g)?;
        let t = Tensors::find(g, &config)?;
        let read = |name: &str, info: &crate::weights::gguf::TensorInfo| {
            ggml::to_f32(info.ty, g.data(info)).map_err(|e| LabError::Invalid(format!("tensor `{name}`: {e}")))
        };
        let layers = t
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| l.try_map(|name, info| read(&format!("blk.{i}.{name}.weight"), info)))
            .collect::<Result<Vec<_>>>()?;
        Ok(CpuModel {
            embed: read("token_embd.weight", t.embed)?,
            layers,
            out_norm: read("output_norm.weight", t.out_norm)?,
            output: t.output.map(|o| read("output.weight", o)).transpose()?,
            config,
        })
    }

    pub fn cache(&self) -> CpuCache {
        let n = self.config.layers;
        CpuCache { k: vec![Vec::new(); n], v: vec![Vec::new(); n], len: 0 }
    }

    /// Runs `tokens` at the cache's next positions and returns the logits after the last one.
    pub fn forward(&self, cache: &mut CpuCache, tokens: &[u32]) -> Result<Vec<f32>> {
        let Some((&last, init)) = tokens.split_last() else {
            return Err(LabError::Invalid("forward needs at least one token".into()));
        };
        for &t in init {
            self.step(cache, t, false)?;
        }
        Ok(self.step(cache, last, true)?.expect("logits were asked for"))
    }

    /// One token at position `cache.len`: appends its keys and values, returns the logits when
    /// `logits` (the LM head is a fifth of a step's work; prefill skips it).
    pub fn step(&self, cache: &mut CpuCache, token: u32, logits: bool) -> Result<Option<Vec<f32>>> {
        let c = &self.config;
        if token as usize >= c.vocab {
            return Err(LabError::Invalid(format!("token id {token} is outside the vocabulary of {}", c.vocab)));
        }
        if cache.len >= c.context {
            return Err(LabError::Invalid(format!("position {} is past the model's context of {} tokens", cache.len, c.context)));
        }
        let (d, kvd, pos) = (c.dim, c.kv_dim(), cache.len);
        let mut x = self.embed[token as usize * d..(token as usize + 1) * d].to_vec();
        let mut h = vec![0f32; d];
        for (l, w) in self.layers.iter().enumerate() {
            rmsnorm(&x, &w.attn_norm, c.eps, &mut h);
            let (mut q, mut k, mut v) = (vec![0f32; d], vec![0f32; kvd], vec![0f32; kvd]);
            matvec(&w.q, &h, &mut q);
            matvec(&w.k, &h, &mut k);
            matvec(&w.v, &h, &mut v);
            rope(c, pos, &mut q, false);
            rope(c, pos, &mut k, false);
            cache.k[l].extend_from_slice(&k);
            cache.v[l].extend_from_slice(&v);
            let att = attend(c, &q, &cache.k[l], &cache.v[l]);
            let mut o = vec![0f32; d];
            matvec(&w.o, &att, &mut o);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            rmsnorm(&x, &w.ffn_norm, c.eps, &mut h);
            let (mut g, mut u) = (vec![0f32; c.ffn], vec![0f32; c.ffn]);
            matvec(&w.gate, &h, &mut g);
            matvec(&w.up, &h, &mut u);
            let act: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| (silu(g as f64) * u as f64) as f32).collect();
            matvec(&w.down, &act, &mut o);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
        }
        cache.len += 1;
        if !logits {
            return Ok(None);
        }
        rmsnorm(&x, &self.out_norm, c.eps, &mut h);
        let mut out = vec![0f32; c.vocab];
        matvec(self.output.as_deref().unwrap_or(&self.embed), &h, &mut out);
        Ok(Some(out))
    }
}

pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// out = x / rms(x) * gamma.
fn rmsnorm(x: &[f32], gamma: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps as f64).sqrt();
    out.iter_mut().zip(x.iter().zip(gamma)).for_each(|(o, (&x, &g))| *o = (x as f64 * r * g as f64) as f32);
}

/// out (rows) = W (rows x x.len(), row-major) x, rows in parallel, each dot in f64.
fn matvec(w: &[f32], x: &[f32], out: &mut [f32]) {
    let k = x.len();
    out.par_iter_mut().zip(w.par_chunks_exact(k)).for_each(|(o, row)| {
        *o = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
    });
}

/// Rotates neighbouring pairs (2i, 2i+1) of each head's first `rope_dims` values; `inverse`
/// turns them back (RoPE's backward: the transpose of a rotation is its inverse).
pub(crate) fn rope(c: &Config, pos: usize, x: &mut [f32], inverse: bool) {
    for head in x.chunks_exact_mut(c.head_dim) {
        for i in 0..c.rope_dims / 2 {
            let angle = c.rope_angle(pos, i);
            let (sin, cos) = if inverse { -angle } else { angle }.sin_cos();
            let (a, b) = (head[2 * i] as f64, head[2 * i + 1] as f64);
            head[2 * i] = (a * cos - b * sin) as f32;
            head[2 * i + 1] = (a * sin + b * cos) as f32;
        }
    }
}

/// Causal attention of one query position over every cached position, query heads grouped
/// onto their KV head.
fn attend(c: &Config, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let (hd, kvd, group) = (c.head_dim, c.kv_dim(), c.heads / c.kv_heads);
    let n = k.len() / kvd;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; c.dim];
    out.par_chunks_exact_mut(hd).enumerate().for_each(|(h, o)| {
        let (qh, off) = (&q[h * hd..(h + 1) * hd], (h / group) * hd);
        let s: Vec<f64> = (0..n).map(|j| k[j * kvd + off..][..hd].iter().zip(qh).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale).collect();
        let m = s.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        let p: Vec<f64> = s.iter().map(|&s| (s - m).exp()).collect();
        let sum: f64 = p.iter().sum();
        for (i, o) in o.iter_mut().enumerate() {
            *o = ((0..n).map(|j| p[j] * v[j * kvd + off + i] as f64).sum::<f64>() / sum) as f32;
        }
    });
    out
}
