//! The model being trained: parameters in one flat f32 buffer, each tensor named as the GGUF
//! tensor it becomes; the forward pass over a batch of token windows, keeping what the backward
//! reads; the backward; and the fused softmax cross-entropy over the next token.
//!
//! Projections, attention and RMSNorm run through the lab's ops (`ops::linear`, `ops::attention`,
//! `ops::rmsnorm`), the embedding, RoPE, SwiGLU, the residual sums and the loss through
//! [`super::steps`], on either backend: one forward and one backward for both. Storage and
//! arithmetic are f32 except the attention, which runs in bf16 on the GPU (its kernels take 16-bit
//! inputs) and in f32 on the CPU unless asked for bf16 (the GPU path's check does).

use super::steps;
use crate::error::Doing;
use crate::experiment::Backend;
use crate::kernels::DType;
use crate::model::llama::weights::Layer;
use crate::model::llama::Config;
use crate::ops::attention::{self, backward as attn_bwd, Mask};
use crate::ops::{linear, rmsnorm, Elem};
use crate::tensor::{Buffer, Tensor};
use crate::{LabError, Result};
use cudarc::driver::CudaSlice;
use half::bf16;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
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

/// What one layer's forward keeps for its backward (2-D tensors are [tokens, width]). The
/// attention's own inputs and output are kept at the precision it ran in.
struct Saved<A: Elem> {
    x: Tensor<f32>,
    h1: Tensor<f32>,
    q: Tensor<A>,
    k: Tensor<A>,
    v: Tensor<A>,
    o: Tensor<A>,
    lse: Tensor<f32>,
    att: Tensor<f32>,
    x_mid: Tensor<f32>,
    h2: Tensor<f32>,
    g: Tensor<f32>,
    u: Tensor<f32>,
    a: Tensor<f32>,
}

struct Forward<A: Elem> {
    layers: Vec<Saved<A>>,
    x_out: Tensor<f32>,
    h_out: Tensor<f32>,
    logits: Tensor<f32>,
}

const CAUSAL: Mask = Mask { causal: true, window: 0 };

/// Where the weights are read from: the host buffer, or a device buffer of the same layout.
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    Host(&'a [f32]),
    Device(&'a CudaSlice<f32>),
}

/// Where the gradients are added: a host buffer, or a device buffer of the same layout.
pub(crate) enum Grads<'a> {
    Host(&'a mut [f32]),
    Device(&'a mut CudaSlice<f32>),
}

/// One parameter tensor as a tensor on `dev`.
fn weight(dev: &Backend, w: Weights, s: &Span) -> Result<Tensor<f32>> {
    match (w, dev) {
        (Weights::Host(p), _) => Tensor::from_slice(dev, &s.shape, &p[s.at.clone()]),
        (Weights::Device(p), Backend::Cuda(gpu)) => {
            let mut t = Tensor::zeros(dev, &s.shape)?;
            gpu.stream.memcpy_dtod(&p.slice(s.at.clone()), t.cuda_mut().expect("on the device")).doing("copying a weight")?;
            Ok(t)
        }
        (Weights::Device(_), Backend::Cpu) => Err(LabError::Invalid("device weights on the CPU backend".into())),
    }
}

/// Adds `src[range]` into the gradient of span `s`.
fn add_grad(dev: &Backend, g: &mut Grads, s: &Span, src: &Tensor<f32>, range: Range<usize>) -> Result<()> {
    match (g, dev) {
        (Grads::Host(g), _) => {
            let src = src.to_vec()?;
            g[s.at.clone()].iter_mut().zip(&src[range]).for_each(|(a, b)| *a += b);
            Ok(())
        }
        (Grads::Device(g), Backend::Cuda(gpu)) => steps::add_view(gpu, &mut g.slice_mut(s.at.clone()), &src.cuda().expect("on the device").slice(range)),
        (Grads::Device(_), Backend::Cpu) => Err(LabError::Invalid("device gradients on the CPU backend".into())),
    }
}

/// y = x W^T through `ops::linear` (bias-free: a zero bias).
fn linear_fwd(dev: &Backend, x: &Tensor<f32>, w: &Tensor<f32>) -> Result<Tensor<f32>> {
    let (m, n) = (x.rows(), w.rows());
    let b = Tensor::zeros(dev, &[n])?;
    let (mut z, mut y) = (Tensor::zeros(dev, &[m, n])?, Tensor::zeros(dev, &[m, n])?);
    linear::forward(dev, x, w, &b, &mut z, &mut y, linear::Act::None)?;
    Ok(y)
}

/// dX of y = x W^T, adding dW into the gradient of `s`.
fn linear_bwd(dev: &Backend, x: &Tensor<f32>, w: &Tensor<f32>, dy: &Tensor<f32>, g: &mut Grads, s: &Span) -> Result<Tensor<f32>> {
    let (m, k, n) = (x.rows(), x.cols(), dy.cols());
    let mut grads = Tensor::zeros(dev, &[m * k + n * k + n])?;
    let mut scratch = linear::BackwardScratch::new(dev, m, n)?;
    // With Act::None the op never reads the pre-activation (its derivative is 1): dY stands in.
    linear::backward(dev, x, w, dy, dy, linear::Act::None, &mut grads, &mut scratch)?;
    add_grad(dev, g, s, &grads, m * k..m * k + n * k)?;
    let dx = match (dev, grads.buffer()) {
        (Backend::Cuda(gpu), Buffer::Cuda(all)) => Tensor::from_cuda(&[m, k], gpu.stream.clone_dtod(&all.slice(..m * k)).doing("copying dX")?)?,
        _ => Tensor::from_vec(&[m, k], grads.to_vec()?[..m * k].to_vec())?,
    };
    Ok(dx)
}

fn rms_fwd(dev: &Backend, x: &Tensor<f32>, gamma: &Tensor<f32>, eps: f32) -> Result<Tensor<f32>> {
    let mut y = Tensor::zeros(dev, x.shape())?;
    rmsnorm::forward(dev, x, gamma, &mut y, eps)?;
    Ok(y)
}

/// dX of RMSNorm, adding dGamma into the gradient of `s`.
#[allow(clippy::too_many_arguments)]
fn rms_bwd(dev: &Backend, x: &Tensor<f32>, gamma: &Tensor<f32>, dy: &Tensor<f32>, g: &mut Grads, s: &Span, eps: f32, fault: Fault) -> Result<Tensor<f32>> {
    let mut dx = Tensor::zeros(dev, x.shape())?;
    let mut dg = Tensor::zeros(dev, &[gamma.len()])?;
    rmsnorm::backward_with(dev, x, gamma, dy, &mut dx, &mut dg, eps, fault == Fault::RmsNormMeanTerm)?;
    add_grad(dev, g, s, &dg, 0..gamma.len())?;
    Ok(dx)
}

/// A copy of `x` in the attention's precision.
fn to_attn<A: Elem>(dev: &Backend, x: &Tensor<f32>) -> Result<Tensor<A>> {
    match A::DTYPE {
        DType::F32 => Tensor::from_vec(x.shape(), x.to_vec()?.into_iter().map(A::from_f32).collect()),
        DType::Bf16 => cast_tensor(steps::to_bf16(dev, x)?),
        DType::F16 => Err(LabError::Invalid("the trainer's attention runs in f32 or bf16".into())),
    }
}

/// An f32 copy of an attention tensor.
fn from_attn<A: Elem>(dev: &Backend, x: &Tensor<A>) -> Result<Tensor<f32>> {
    match (x as &dyn std::any::Any).downcast_ref::<Tensor<bf16>>() {
        Some(b) => steps::from_bf16(dev, b),
        None => Tensor::from_vec(x.shape(), x.to_vec()?.into_iter().map(A::to_f32).collect()),
    }
}

/// `Tensor<bf16>` as `Tensor<A>` where A is bf16.
fn cast_tensor<A: Elem>(x: Tensor<bf16>) -> Result<Tensor<A>> {
    let b: Box<dyn std::any::Any> = Box::new(x);
    b.downcast::<Tensor<A>>().map(|b| *b).map_err(|_| LabError::Invalid(format!("bf16 is not {}", A::DTYPE.name())))
}

/// The RoPE angle table on the device (the CPU path computes its angles itself).
fn rope_table(dev: &Backend, c: &Config, seq: usize) -> Result<Option<CudaSlice<f32>>> {
    match dev {
        Backend::Cuda(gpu) => gpu.upload(&steps::rope_table(c, seq).concat()).map(Some),
        Backend::Cpu => Ok(None),
    }
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

    fn check(&self, batch: &Batch) -> Result<()> {
        let c = &self.layout.config;
        if batch.seq > c.context {
            return Err(LabError::Invalid(format!("windows of {} tokens are longer than the model's context of {}", batch.seq, c.context)));
        }
        if let Some(&t) = batch.tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(LabError::Invalid(format!("token id {t} is outside the vocabulary of {}", c.vocab)));
        }
        Ok(())
    }

    /// The weights as the backend reads them: on the GPU, one copy of the buffer.
    fn placed(&self, dev: &Backend) -> Result<Option<CudaSlice<f32>>> {
        match dev {
            Backend::Cpu => Ok(None),
            Backend::Cuda(gpu) => gpu.upload(&self.params).map(Some),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn forward<A: Elem>(&self, dev: &Backend, w: Weights, table: Option<&CudaSlice<f32>>, inputs: &[u32], rows: usize, seq: usize) -> Result<Forward<A>> {
        let (c, lay) = (&self.layout.config, &self.layout);
        let (n, d) = (inputs.len(), c.dim);
        let mut x = steps::embed(dev, &weight(dev, w, &lay.embed)?, inputs, d)?;
        let mut layers = Vec::with_capacity(c.layers);
        for l in &lay.layers {
            let h1 = rms_fwd(dev, &x, &weight(dev, w, &l.attn_norm)?, c.eps)?;
            let (mut q, mut k) = (linear_fwd(dev, &h1, &weight(dev, w, &l.q)?)?, linear_fwd(dev, &h1, &weight(dev, w, &l.k)?)?);
            let v = linear_fwd(dev, &h1, &weight(dev, w, &l.v)?)?;
            steps::rope_rows(dev, c, &mut q, seq, false, table)?;
            steps::rope_rows(dev, c, &mut k, seq, false, table)?;
            let q: Tensor<A> = to_attn(dev, &q.reshape(&[rows, seq, c.heads, c.head_dim])?)?;
            let k: Tensor<A> = to_attn(dev, &k.reshape(&[rows, seq, c.kv_heads, c.head_dim])?)?;
            let v: Tensor<A> = to_attn(dev, &v.reshape(&[rows, seq, c.kv_heads, c.head_dim])?)?;
            let (mut o, mut lse) = (Tensor::<A>::zeros(dev, q.shape())?, Tensor::zeros(dev, &[rows, c.heads, seq])?);
            attention::forward(dev, &q, &k, &v, CAUSAL, &mut o, &mut lse)?;
            let att = from_attn(dev, &o)?.reshape(&[n, d])?;
            let mut x_mid = linear_fwd(dev, &att, &weight(dev, w, &l.o)?)?;
            steps::add(dev, &mut x_mid, &x)?;
            let h2 = rms_fwd(dev, &x_mid, &weight(dev, w, &l.ffn_norm)?, c.eps)?;
            let (g, u) = (linear_fwd(dev, &h2, &weight(dev, w, &l.gate)?)?, linear_fwd(dev, &h2, &weight(dev, w, &l.up)?)?);
            let a = steps::swiglu(dev, &g, &u)?;
            let mut x_next = linear_fwd(dev, &a, &weight(dev, w, &l.down)?)?;
            steps::add(dev, &mut x_next, &x_mid)?;
            layers.push(Saved { x, h1, q, k, v, o, lse, att, x_mid, h2, g, u, a });
            x = x_next;
        }
        let h_out = rms_fwd(dev, &x, &weight(dev, w, &lay.out_norm)?, c.eps)?;
        let logits = linear_fwd(dev, &h_out, &weight(dev, w, lay.head())?)?;
        Ok(Forward { layers, x_out: x, h_out, logits })
    }

    /// The mean next-token loss over the batch (attention in bf16 on the GPU, f32 on the CPU).
    pub fn loss(&self, dev: &Backend, batch: &Batch) -> Result<f64> {
        let placed = self.placed(dev)?;
        self.loss_with(dev, placed.as_ref().map_or(Weights::Host(&self.params), Weights::Device), batch)
    }

    /// [`Model::loss`] with the weights read from `w`.
    pub(crate) fn loss_with(&self, dev: &Backend, w: Weights, batch: &Batch) -> Result<f64> {
        self.check(batch)?;
        let table = rope_table(dev, &self.layout.config, batch.seq)?;
        let logits = match dev {
            Backend::Cpu => self.forward::<f32>(dev, w, None, &batch.inputs(), batch.rows, batch.seq)?.logits,
            Backend::Cuda(_) => self.forward::<bf16>(dev, w, table.as_ref(), &batch.inputs(), batch.rows, batch.seq)?.logits,
        };
        steps::cross_entropy(dev, &logits, &batch.targets())?.0.value(dev)
    }

    /// The logits of every position of one sequence, [tokens x vocab], on the CPU.
    pub fn logits(&self, dev: &Backend, tokens: &[u32]) -> Result<Vec<f32>> {
        let batch = Batch { tokens: tokens.to_vec(), rows: 1, seq: tokens.len() };
        self.check(&batch)?;
        if let Backend::Cuda(_) = dev {
            return Err(LabError::Invalid("the trainer's logits are read on the CPU backend".into()));
        }
        self.forward::<f32>(dev, Weights::Host(&self.params), None, tokens, 1, tokens.len())?.logits.to_vec()
    }

    /// The mean next-token loss over the batch, and its gradient written into `grads` (the
    /// buffer's layout).
    pub fn loss_and_grads(&self, dev: &Backend, batch: &Batch, grads: &mut [f32]) -> Result<f64> {
        self.loss_and_grads_with(dev, batch, grads, Fault::None)
    }

    pub(crate) fn loss_and_grads_with(&self, dev: &Backend, batch: &Batch, grads: &mut [f32], fault: Fault) -> Result<f64> {
        if grads.len() != self.layout.len {
            return Err(LabError::Invalid(format!("the gradient buffer holds {} values; the model has {}", grads.len(), self.layout.len)));
        }
        match dev {
            Backend::Cpu => self.loss_and_grads_at::<f32>(dev, Weights::Host(&self.params), Grads::Host(grads), batch, fault)?.value(dev),
            Backend::Cuda(gpu) => {
                let p = self.placed(dev)?.expect("on the device");
                let mut g = gpu.stream.alloc_zeros::<f32>(self.layout.len).doing("allocating the gradients")?;
                let loss = self.loss_and_grads_at::<bf16>(dev, Weights::Device(&p), Grads::Device(&mut g), batch, fault)?.value(dev)?;
                gpu.stream.memcpy_dtoh(&g, grads).doing("reading the gradients")?;
                Ok(loss)
            }
        }
    }

    /// The loss and its gradient with the attention in precision `A` (bf16 on the GPU, whose
    /// attention kernels take 16-bit inputs; either on the CPU), added into zeroed `grads`. On
    /// the GPU the loss is left on the device, the work queued.
    pub(crate) fn loss_and_grads_at<A: Elem>(&self, dev: &Backend, w: Weights, mut grads: Grads, batch: &Batch, fault: Fault) -> Result<steps::Loss> {
        self.check(batch)?;
        let (c, lay) = (&self.layout.config, &self.layout);
        match &mut grads {
            Grads::Host(g) => g.fill(0.0),
            Grads::Device(g) => match dev {
                Backend::Cuda(gpu) => gpu.stream.memset_zeros(&mut **g).doing("zeroing the gradients")?,
                Backend::Cpu => return Err(LabError::Invalid("device gradients on the CPU backend".into())),
            },
        }
        let (inputs, (rows, seq)) = (batch.inputs(), (batch.rows, batch.seq));
        let n = inputs.len();
        let table = rope_table(dev, c, seq)?;
        let table = table.as_ref();
        let f = self.forward::<A>(dev, w, table, &inputs, rows, seq)?;
        let (loss, dlogits) = steps::cross_entropy(dev, &f.logits, &batch.targets())?;
        let g = &mut grads;
        let dh = linear_bwd(dev, &f.h_out, &weight(dev, w, lay.head())?, &dlogits, g, lay.head())?;
        let mut dx = rms_bwd(dev, &f.x_out, &weight(dev, w, &lay.out_norm)?, &dh, g, &lay.out_norm, c.eps, fault)?;
        for (l, s) in lay.layers.iter().zip(&f.layers).rev() {
            let da = linear_bwd(dev, &s.a, &weight(dev, w, &l.down)?, &dx, g, &l.down)?;
            let (dgate, dup) = steps::swiglu_backward(dev, &da, &s.g, &s.u)?;
            let mut dh2 = linear_bwd(dev, &s.h2, &weight(dev, w, &l.gate)?, &dgate, g, &l.gate)?;
            steps::add(dev, &mut dh2, &linear_bwd(dev, &s.h2, &weight(dev, w, &l.up)?, &dup, g, &l.up)?)?;
            steps::add(dev, &mut dx, &rms_bwd(dev, &s.x_mid, &weight(dev, w, &l.ffn_norm)?, &dh2, g, &l.ffn_norm, c.eps, fault)?)?;
            let datt = linear_bwd(dev, &s.att, &weight(dev, w, &l.o)?, &dx, g, &l.o)?;
            let dout: Tensor<A> = to_attn(dev, &datt.reshape(s.q.shape())?)?;
            let mut ag = attn_bwd::Grads::zeros(dev, attention::dims(&s.q, &s.k, &s.v, &s.o, &s.lse)?)?;
            attn_bwd::backward(dev, &attn_bwd::Saved { q: &s.q, k: &s.k, v: &s.v, o: &s.o, lse: &s.lse, dout: &dout }, CAUSAL, &mut ag)?;
            let mut dq = from_attn(dev, &ag.dq)?.reshape(&[n, c.dim])?;
            let mut dk = from_attn(dev, &ag.dk)?.reshape(&[n, c.kv_dim()])?;
            let dv = from_attn(dev, &ag.dv)?.reshape(&[n, c.kv_dim()])?;
            steps::rope_rows(dev, c, &mut dq, seq, true, table)?;
            steps::rope_rows(dev, c, &mut dk, seq, true, table)?;
            let mut dh1 = linear_bwd(dev, &s.h1, &weight(dev, w, &l.q)?, &dq, g, &l.q)?;
            steps::add(dev, &mut dh1, &linear_bwd(dev, &s.h1, &weight(dev, w, &l.k)?, &dk, g, &l.k)?)?;
            steps::add(dev, &mut dh1, &linear_bwd(dev, &s.h1, &weight(dev, w, &l.v)?, &dv, g, &l.v)?)?;
            steps::add(dev, &mut dx, &rms_bwd(dev, &s.x, &weight(dev, w, &l.attn_norm)?, &dh1, g, &l.attn_norm, c.eps, fault)?)?;
        }
        // The embedding's rows gather their tokens' gradients (summed per token in position order).
        let at = lay.embed.at.clone();
        let de = match g {
            Grads::Host(h) => steps::CudaOrHost::Host(&mut h[at]),
            Grads::Device(d) => steps::CudaOrHost::Cuda(d.slice_mut(at)),
        };
        steps::embed_backward(dev, &inputs, &dx, de)?;
        Ok(loss)
    }
}
