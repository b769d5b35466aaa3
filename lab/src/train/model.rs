//! The model being trained: parameters in one flat f32 buffer, each tensor named as the GGUF
//! tensor it becomes; the forward pass over a batch of token windows, keeping what the backward
//! reads; the backward; and the fused softmax cross-entropy over the next token.
//!
//! Projections, attention and RMSNorm run through the lab's ops (`ops::linear`, `ops::attention`,
//! `ops::rmsnorm`) on the given backend. The embedding, RoPE (the engine's own function, so the
//! convention is the one `CpuModel` and llama.cpp apply), SwiGLU and the loss are host code: they
//! have no kernels yet, so training runs on the CPU backend and a CUDA backend is refused.

use crate::experiment::Backend;
use crate::model::llama::cpu::{rope, silu};
use crate::model::llama::weights::Layer;
use crate::model::llama::Config;
use crate::ops::attention::{self, backward as attn_bwd, Mask};
use crate::ops::{linear, rmsnorm};
use crate::tensor::Tensor;
use crate::{LabError, Result};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use std::ops::Range;

/// One parameter tensor: its GGUF name, its row-major shape (rows = outputs), its place in the buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: String,
    pub shape: Vec<usize>,
    pub at: Range<usize>,
}

/// Where every tensor of a model with this config lives in the flat buffer.
#[derive(Clone, Debug)]
pub struct Layout {
    pub config: Config,
    pub embed: Span,
    pub layers: Vec<Layer<Span>>,
    pub out_norm: Span,
    /// The LM head; `None` when it is tied to the embedding.
    pub output: Option<Span>,
    pub len: usize,
}

fn layer_spans(l: &Layer<Span>) -> [&Span; 9] {
    [&l.attn_norm, &l.q, &l.k, &l.v, &l.o, &l.ffn_norm, &l.gate, &l.up, &l.down]
}

impl Layout {
    pub fn new(c: &Config) -> Result<Self> {
        let bad = |why: String| Err(LabError::Invalid(format!("model config: {why}")));
        if [c.layers, c.dim, c.heads, c.kv_heads, c.ffn, c.vocab, c.context].contains(&0) {
            return bad(format!("{c:?} has a size of 0"));
        }
        if c.heads * c.head_dim != c.dim || !c.heads.is_multiple_of(c.kv_heads) {
            return bad(format!("{} heads of {} over {} KV heads do not make a width of {}", c.heads, c.head_dim, c.kv_heads, c.dim));
        }
        if c.rope_dims > c.head_dim || !c.rope_dims.is_multiple_of(2) {
            return bad(format!("RoPE turns {} dimensions of heads {} wide: an even count up to the head size", c.rope_dims, c.head_dim));
        }
        let (d, kv, f) = (c.dim, c.kv_dim(), c.ffn);
        let mut at = 0;
        let mut span = |name: String, shape: &[usize]| {
            let n: usize = shape.iter().product();
            at += n;
            Span { name, shape: shape.to_vec(), at: at - n..at }
        };
        let embed = span("token_embd.weight".into(), &[c.vocab, d]);
        let layers = (0..c.layers)
            .map(|i| {
                let mut b = |n: &str, shape: &[usize]| span(format!("blk.{i}.{n}.weight"), shape);
                Layer {
                    attn_norm: b("attn_norm", &[d]),
                    q: b("attn_q", &[d, d]),
                    k: b("attn_k", &[kv, d]),
                    v: b("attn_v", &[kv, d]),
                    o: b("attn_output", &[d, d]),
                    ffn_norm: b("ffn_norm", &[d]),
                    gate: b("ffn_gate", &[f, d]),
                    up: b("ffn_up", &[f, d]),
                    down: b("ffn_down", &[d, f]),
                }
            })
            .collect();
        let out_norm = span("output_norm.weight".into(), &[d]);
        let output = (!c.tied_embeddings).then(|| span("output.weight".into(), &[c.vocab, d]));
        Ok(Layout { config: c.clone(), embed, layers, out_norm, output, len: at })
    }

    /// Every tensor, in buffer order.
    pub fn spans(&self) -> Vec<&Span> {
        let mut v = vec![&self.embed];
        self.layers.iter().for_each(|l| v.extend(layer_spans(l)));
        v.push(&self.out_norm);
        v.extend(&self.output);
        v
    }

    /// The LM head: `output.weight`, or the embedding when tied.
    pub fn head(&self) -> &Span {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}

/// Token windows of `seq + 1` tokens each: every position predicts the next.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub rows: usize,
    pub seq: usize,
}

impl Batch {
    pub fn new(tokens: Vec<u32>, rows: usize, seq: usize) -> Result<Self> {
        if rows == 0 || seq == 0 || tokens.len() != rows * (seq + 1) {
            return Err(LabError::Invalid(format!("a batch of {rows} windows of {seq}+1 tokens cannot hold {} tokens", tokens.len())));
        }
        Ok(Batch { tokens, rows, seq })
    }
    pub fn inputs(&self) -> Vec<u32> {
        self.tokens.chunks(self.seq + 1).flat_map(|w| w[..self.seq].to_vec()).collect()
    }
    pub fn targets(&self) -> Vec<u32> {
        self.tokens.chunks(self.seq + 1).flat_map(|w| w[1..].to_vec()).collect()
    }
}

/// A fault planted in the backward, for the gradient check to catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// RMSNorm's backward without the mean-square term.
    RmsNormMeanTerm,
}

/// Parameters and their layout.
#[derive(Clone, Debug)]
pub struct Model {
    pub layout: Layout,
    pub params: Vec<f32>,
}

/// What one layer's forward keeps for its backward (2-D tensors are [tokens, width]).
struct Saved {
    x: Tensor<f32>,
    h1: Tensor<f32>,
    q: Tensor<f32>,
    k: Tensor<f32>,
    v: Tensor<f32>,
    o: Tensor<f32>,
    lse: Tensor<f32>,
    att: Tensor<f32>,
    x_mid: Tensor<f32>,
    h2: Tensor<f32>,
    g: Tensor<f32>,
    u: Tensor<f32>,
    a: Tensor<f32>,
}

struct Forward {
    layers: Vec<Saved>,
    x_out: Tensor<f32>,
    h_out: Tensor<f32>,
    logits: Tensor<f32>,
}

const CAUSAL: Mask = Mask { causal: true, window: 0 };

fn host(t: &Tensor<f32>) -> &[f32] {
    t.host().expect("the trainer keeps its tensors on the host")
}

fn host_mut(t: &mut Tensor<f32>) -> &mut [f32] {
    t.host_mut().expect("the trainer keeps its tensors on the host")
}

/// y = x W^T through `ops::linear` (bias-free: a zero bias).
fn linear_fwd(dev: &Backend, x: &Tensor<f32>, w: &[f32], n: usize) -> Result<Tensor<f32>> {
    let (m, k) = (x.rows(), x.cols());
    let wt = Tensor::from_slice(dev, &[n, k], w)?;
    let b = Tensor::zeros(dev, &[n])?;
    let (mut z, mut y) = (Tensor::zeros(dev, &[m, n])?, Tensor::zeros(dev, &[m, n])?);
    linear::forward(dev, x, &wt, &b, &mut z, &mut y, linear::Act::None)?;
    Ok(y)
}

/// dX of y = x W^T, adding dW into `dw`.
fn linear_bwd(dev: &Backend, x: &Tensor<f32>, w: &[f32], dy: &Tensor<f32>, dw: &mut [f32]) -> Result<Tensor<f32>> {
    let (m, k, n) = (x.rows(), x.cols(), dy.cols());
    let wt = Tensor::from_slice(dev, &[n, k], w)?;
    let mut grads = Tensor::zeros(dev, &[m * k + n * k + n])?;
    let mut scratch = linear::BackwardScratch::new(dev, m, n)?;
    // With Act::None the op never reads the pre-activation (its derivative is 1): dY stands in.
    linear::backward(dev, x, &wt, dy, dy, linear::Act::None, &mut grads, &mut scratch)?;
    let g = grads.to_vec()?;
    dw.iter_mut().zip(&g[m * k..m * k + n * k]).for_each(|(a, b)| *a += b);
    Tensor::from_vec(&[m, k], g[..m * k].to_vec())
}

fn add(a: &mut Tensor<f32>, b: &Tensor<f32>) {
    host_mut(a).iter_mut().zip(host(b)).for_each(|(a, b)| *a += b);
}

fn rms_fwd(dev: &Backend, x: &Tensor<f32>, gamma: &[f32], eps: f32) -> Result<Tensor<f32>> {
    let g = Tensor::from_slice(dev, &[gamma.len()], gamma)?;
    let mut y = Tensor::zeros(dev, x.shape())?;
    rmsnorm::forward(dev, x, &g, &mut y, eps)?;
    Ok(y)
}

/// dX of RMSNorm, adding dGamma into `dgamma`.
fn rms_bwd(dev: &Backend, x: &Tensor<f32>, gamma: &[f32], dy: &Tensor<f32>, dgamma: &mut [f32], eps: f32, fault: Fault) -> Result<Tensor<f32>> {
    let mut dx = Tensor::zeros(dev, x.shape())?;
    let mut dg = Tensor::zeros(dev, &[gamma.len()])?;
    if fault == Fault::RmsNormMeanTerm {
        rmsnorm::cpu_backward(host(x), gamma, host(dy), host_mut(&mut dx), host_mut(&mut dg), eps, true);
    } else {
        rmsnorm::backward(dev, x, &Tensor::from_slice(dev, &[gamma.len()], gamma)?, dy, &mut dx, &mut dg, eps)?;
    }
    dgamma.iter_mut().zip(host(&dg)).for_each(|(a, b)| *a += b);
    Ok(dx)
}

/// RoPE on every row of `x` ([tokens, heads x head_dim]), row n at position n mod seq.
fn rope_rows(c: &Config, x: &mut Tensor<f32>, seq: usize, inverse: bool) {
    let w = x.cols();
    host_mut(x).par_chunks_mut(w).enumerate().for_each(|(n, row)| rope(c, n % seq, row, inverse));
}

/// Mean over rows of -log softmax(logits)[target], and its gradient with respect to the logits;
/// each row's log-sum-exp in f64.
pub fn cross_entropy(logits: &[f32], targets: &[u32], vocab: usize) -> (f64, Vec<f32>) {
    let n = targets.len();
    let mut grad = vec![0f32; logits.len()];
    let losses: Vec<f64> = grad
        .par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab).zip(targets))
        .map(|(g, (l, &t))| {
            let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let lse = m + l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            for (j, (g, &v)) in g.iter_mut().zip(l).enumerate() {
                *g = (((v as f64 - lse).exp() - f64::from(j == t as usize)) / n as f64) as f32;
            }
            lse - l[t as usize] as f64
        })
        .collect();
    (losses.iter().sum::<f64>() / n as f64, grad)
}

impl Model {
    /// Matrices drawn from N(0, std^2) (SmolLM2 uses 0.02), norm weights 1.
    pub fn init(config: &Config, std: f32, seed: u64) -> Result<Self> {
        let layout = Layout::new(config)?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let normal = Normal::new(0.0, std).map_err(|e| LabError::Invalid(format!("init std {std}: {e}")))?;
        let mut params = vec![0f32; layout.len];
        for s in layout.spans() {
            let p = &mut params[s.at.clone()];
            if s.shape.len() == 1 {
                p.fill(1.0);
            } else {
                p.iter_mut().for_each(|v| *v = normal.sample(&mut rng));
            }
        }
        Ok(Model { layout, params })
    }

    pub fn get(&self, s: &Span) -> &[f32] {
        &self.params[s.at.clone()]
    }

    fn check(&self, dev: &Backend, batch: &Batch) -> Result<()> {
        if let Backend::Cuda(_) = dev {
            return Err(LabError::Invalid("training runs on the CPU backend only: its embedding, RoPE, SwiGLU and loss have no kernels yet".into()));
        }
        let c = &self.layout.config;
        if batch.seq > c.context {
            return Err(LabError::Invalid(format!("windows of {} tokens are longer than the model's context of {}", batch.seq, c.context)));
        }
        if let Some(&t) = batch.tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(LabError::Invalid(format!("token id {t} is outside the vocabulary of {}", c.vocab)));
        }
        Ok(())
    }

    fn forward(&self, dev: &Backend, inputs: &[u32], rows: usize, seq: usize) -> Result<Forward> {
        let (c, lay) = (&self.layout.config, &self.layout);
        let (n, d, kvd) = (inputs.len(), c.dim, c.kv_dim());
        let embed = self.get(&lay.embed);
        let x0: Vec<f32> = inputs.iter().flat_map(|&t| embed[t as usize * d..][..d].to_vec()).collect();
        let mut x = Tensor::from_vec(&[n, d], x0)?.to(dev)?;
        let mut layers = Vec::with_capacity(c.layers);
        for l in &lay.layers {
            let h1 = rms_fwd(dev, &x, self.get(&l.attn_norm), c.eps)?;
            let (mut q, mut k) = (linear_fwd(dev, &h1, self.get(&l.q), d)?, linear_fwd(dev, &h1, self.get(&l.k), kvd)?);
            let v = linear_fwd(dev, &h1, self.get(&l.v), kvd)?;
            rope_rows(c, &mut q, seq, false);
            rope_rows(c, &mut k, seq, false);
            let (q, k, v) = (q.reshape(&[rows, seq, c.heads, c.head_dim])?, k.reshape(&[rows, seq, c.kv_heads, c.head_dim])?, v.reshape(&[rows, seq, c.kv_heads, c.head_dim])?);
            let (mut o, mut lse) = (Tensor::zeros(dev, q.shape())?, Tensor::zeros(dev, &[rows, c.heads, seq])?);
            attention::forward(dev, &q, &k, &v, CAUSAL, &mut o, &mut lse)?;
            let att = o.to(dev)?.reshape(&[n, d])?;
            let mut x_mid = linear_fwd(dev, &att, self.get(&l.o), d)?;
            add(&mut x_mid, &x);
            let h2 = rms_fwd(dev, &x_mid, self.get(&l.ffn_norm), c.eps)?;
            let (g, u) = (linear_fwd(dev, &h2, self.get(&l.gate), c.ffn)?, linear_fwd(dev, &h2, self.get(&l.up), c.ffn)?);
            let a: Vec<f32> = host(&g).par_iter().zip(host(&u)).map(|(&g, &u)| (silu(g as f64) * u as f64) as f32).collect();
            let a = Tensor::from_vec(&[n, c.ffn], a)?;
            let mut x_next = linear_fwd(dev, &a, self.get(&l.down), d)?;
            add(&mut x_next, &x_mid);
            layers.push(Saved { x, h1, q, k, v, o, lse, att, x_mid, h2, g, u, a });
            x = x_next;
        }
        let h_out = rms_fwd(dev, &x, self.get(&lay.out_norm), c.eps)?;
        let logits = linear_fwd(dev, &h_out, self.get(lay.head()), c.vocab)?;
        Ok(Forward { layers, x_out: x, h_out, logits })
    }

    /// The mean next-token loss over the batch.
    pub fn loss(&self, dev: &Backend, batch: &Batch) -> Result<f64> {
        self.check(dev, batch)?;
        let f = self.forward(dev, &batch.inputs(), batch.rows, batch.seq)?;
        Ok(cross_entropy(host(&f.logits), &batch.targets(), self.layout.config.vocab).0)
    }

    /// The logits of every position of one sequence, [tokens x vocab].
    pub fn logits(&self, dev: &Backend, tokens: &[u32]) -> Result<Vec<f32>> {
        let batch = Batch { tokens: tokens.to_vec(), rows: 1, seq: tokens.len() };
        self.check(dev, &batch)?;
        self.forward(dev, tokens, 1, tokens.len())?.logits.to_vec()
    }

    /// The mean next-token loss over the batch, and its gradient written into `grads` (the
    /// buffer's layout).
    pub fn loss_and_grads(&self, dev: &Backend, batch: &Batch, grads: &mut [f32]) -> Result<f64> {
        self.loss_and_grads_with(dev, batch, grads, Fault::None)
    }

    pub(crate) fn loss_and_grads_with(&self, dev: &Backend, batch: &Batch, grads: &mut [f32], fault: Fault) -> Result<f64> {
        self.check(dev, batch)?;
        let (c, lay) = (&self.layout.config, &self.layout);
        if grads.len() != lay.len {
            return Err(LabError::Invalid(format!("the gradient buffer holds {} values; the model has {}", grads.len(), lay.len)));
        }
        grads.fill(0.0);
        let (inputs, (rows, seq)) = (batch.inputs(), (batch.rows, batch.seq));
        let (n, d) = (inputs.len(), c.dim);
        let f = self.forward(dev, &inputs, rows, seq)?;
        let (loss, dlogits) = cross_entropy(host(&f.logits), &batch.targets(), c.vocab);
        let dlogits = Tensor::from_vec(&[n, c.vocab], dlogits)?;
        let g = |s: &Span| s.at.clone();
        let dh = linear_bwd(dev, &f.h_out, self.get(lay.head()), &dlogits, &mut grads[g(lay.head())])?;
        let mut dx = rms_bwd(dev, &f.x_out, self.get(&lay.out_norm), &dh, &mut grads[g(&lay.out_norm)], c.eps, fault)?;
        for (l, s) in lay.layers.iter().zip(&f.layers).rev() {
            let da = linear_bwd(dev, &s.a, self.get(&l.down), &dx, &mut grads[g(&l.down)])?;
            let (mut dgate, mut dup) = (vec![0f32; n * c.ffn], vec![0f32; n * c.ffn]);
            dgate.par_iter_mut().zip(dup.par_iter_mut()).zip(host(&da).par_iter().zip(host(&s.g).par_iter().zip(host(&s.u)))).for_each(|((dg, du), (&da, (&gv, &uv)))| {
                let (gv, sig) = (gv as f64, 1.0 / (1.0 + (-gv as f64).exp()));
                *dg = (da as f64 * uv as f64 * sig * (1.0 + gv * (1.0 - sig))) as f32;
                *du = (da as f64 * silu(gv)) as f32;
            });
            let (dgate, dup) = (Tensor::from_vec(&[n, c.ffn], dgate)?, Tensor::from_vec(&[n, c.ffn], dup)?);
            let mut dh2 = linear_bwd(dev, &s.h2, self.get(&l.gate), &dgate, &mut grads[g(&l.gate)])?;
            add(&mut dh2, &linear_bwd(dev, &s.h2, self.get(&l.up), &dup, &mut grads[g(&l.up)])?);
            add(&mut dx, &rms_bwd(dev, &s.x_mid, self.get(&l.ffn_norm), &dh2, &mut grads[g(&l.ffn_norm)], c.eps, fault)?);
            let datt = linear_bwd(dev, &s.att, self.get(&l.o), &dx, &mut grads[g(&l.o)])?;
            let dout = datt.reshape(s.q.shape())?;
            let mut ag = attn_bwd::Grads::zeros(dev, attention::dims(&s.q, &s.k, &s.v, &s.o, &s.lse)?)?;
            attn_bwd::backward(dev, &attn_bwd::Saved { q: &s.q, k: &s.k, v: &s.v, o: &s.o, lse: &s.lse, dout: &dout }, CAUSAL, &mut ag)?;
            let (mut dq, mut dk, dv) = (ag.dq.reshape(&[n, d])?, ag.dk.reshape(&[n, c.kv_dim()])?, ag.dv.reshape(&[n, c.kv_dim()])?);
            rope_rows(c, &mut dq, seq, true);
            rope_rows(c, &mut dk, seq, true);
            let mut dh1 = linear_bwd(dev, &s.h1, self.get(&l.q), &dq, &mut grads[g(&l.q)])?;
            add(&mut dh1, &linear_bwd(dev, &s.h1, self.get(&l.k), &dk, &mut grads[g(&l.k)])?);
            add(&mut dh1, &linear_bwd(dev, &s.h1, self.get(&l.v), &dv, &mut grads[g(&l.v)])?);
            add(&mut dx, &rms_bwd(dev, &s.x, self.get(&l.attn_norm), &dh1, &mut grads[g(&l.attn_norm)], c.eps, fault)?);
        }
        // The embedding's rows gather their tokens' gradients in token order (deterministic).
        let de = &mut grads[g(&lay.embed)];
        for (&t, row) in inputs.iter().zip(host(&dx).chunks(d)) {
            de[t as usize * d..][..d].iter_mut().zip(row).for_each(|(a, b)| *a += b);
        }
        Ok(loss)
    }
}
