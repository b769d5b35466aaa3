//! A batch of sequences decoded together: its device buffers, a step's launch sequence (unfused,
//! fused, with attention and the output product, a layer or the tail in one launch) and the
//! graphs it captures. A child of the model's module, so that it reads the weights' fields.

use super::{GpuModel, ATTENTION, ATTENTION_O, LAYER};
use crate::model::llama::sample::Sampling;
use crate::error::Doing;
use crate::gpu::graph::Graph;
use crate::ops::attention::decode::{Decode, KvCache};
use crate::ops::attention;
use crate::ops::gemm;
use crate::ops::llama::{self as k, Rows};
use crate::ops::quant::{self, QuantTensor};
use crate::tensor::Tensor;
use crate::{LabError, Result};
use cudarc::driver::CudaSlice;
use half::f16;

/// What a fused step launches around decode attention (see the note of model::llama::gpu).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fusion {
    /// Decode attention, then the output product.
    Products,
    /// attention_o_q4_1.
    AttentionO,
    /// layer_q4_1.
    Layer,
}

/// Sequences decoded together, and everything their steps read and write on the device.
pub struct Batch<'m> {
    m: &'m GpuModel,
    seqs: usize,
    cap: usize,
    /// Steps taken: every sequence is at this position.
    steps: usize,
    prompts: Vec<usize>,
    tokens: CudaSlice<u32>,
    pos: CudaSlice<i32>,
    prompt_len: CudaSlice<i32>,
    caches: Vec<KvCache<f16>>,
    decode: Decode,
    x: CudaSlice<f32>,
    h: Tensor<f16>,
    qkv: Tensor<f16>,
    q: CudaSlice<f16>,
    att: Tensor<f16>,
    proj: Tensor<f16>,
    gu: Tensor<f16>,
    act: Tensor<f16>,
    logits: Tensor<f32>,
    graph: Option<Graph>,
    /// [`Batch::steps`]' graph of that many steps.
    chunk: Option<(usize, Graph)>,
    /// Capture the step with programmatic dependent launch between its kernels.
    programmatic: bool,
    /// Decode with the fused products (five launches a layer).
    fused: bool,
    /// What fused steps run around attention.
    fusion: Fusion,
    /// ffn_q4_1's scratch while fused steps run the FFN in one launch.
    ffn: Option<k::FfnScratch>,
    /// head_q8_0's scratch while fused steps run their tail in one launch.
    head: Option<k::HeadChoice>,
    /// How each step chooses its token.
    sampling: Sampling,
    /// A step has run eagerly: the next can be captured.
    warm: bool,
}

impl<'m> Batch<'m> {
    pub(super) fn new(m: &'m GpuModel, seqs: usize, cap: usize) -> Result<Self> {
        let (c, gpu) = (&m.config, &m.gpu);
        if seqs == 0 {
            return Err(LabError::Invalid("a batch of 0 sequences".into()));
        }
        if cap < 2 || cap > c.context {
            return Err(LabError::Invalid(format!("a capacity of {cap} positions: at least 2, at most the model's context of {}", c.context)));
        }
        let zeros16 = |cols: usize| Tensor::<f16>::zeros(&m.dev, &[seqs, cols]);
        let alloc = |n: usize| gpu.stream.alloc_zeros::<f32>(n).doing("allocating the residual stream");
        Ok(Batch {
            caches: (0..c.layers).map(|_| KvCache::contiguous(gpu, seqs, cap, c.kv_heads, c.head_dim)).collect::<Result<_>>()?,
            decode: Decode::with(gpu, ATTENTION, seqs, c.heads, c.kv_heads, c.head_dim, cap)?,
            tokens: gpu.stream.alloc_zeros(seqs * cap).doing("allocating the token buffer")?,
            pos: gpu.stream.alloc_zeros(seqs).doing("allocating positions")?,
            prompt_len: gpu.stream.alloc_zeros(seqs).doing("allocating prompt lengths")?,
            x: alloc(seqs * c.dim)?,
            h: zeros16(c.dim)?,
            qkv: zeros16(c.dim + 2 * c.kv_dim())?,
            q: gpu.stream.alloc_zeros(seqs * c.dim).doing("allocating queries")?,
            att: zeros16(c.dim)?,
            proj: zeros16(c.dim)?,
            gu: zeros16(2 * c.ffn)?,
            act: zeros16(c.ffn)?,
            logits: Tensor::<f32>::zeros(&m.dev, &[seqs, c.vocab])?,
            graph: None,
            chunk: None,
            programmatic: false,
            fused: false,
            fusion: Fusion::Products,
            ffn: None,
            head: None,
            sampling: Sampling::GREEDY,
            warm: false,
            m,
            seqs,
            cap,
            steps: 0,
            prompts: vec![0; seqs],
        })
    }

    /// Starts every sequence over with its prompt (at least one token each).
    pub fn start(&mut self, prompts: &[Vec<u32>]) -> Result<()> {
        let vocab = self.m.config.vocab;
        if prompts.len() != self.seqs {
            return Err(LabError::Invalid(format!("{} prompts for a batch of {}", prompts.len(), self.seqs)));
        }
        let mut tokens = vec![0u32; self.seqs * self.cap];
        for (b, p) in prompts.iter().enumerate() {
            if p.is_empty() || p.len() >= self.cap {
                return Err(LabError::Invalid(format!("prompt {b} has {} tokens: at least 1 and fewer than the capacity of {}", p.len(), self.cap)));
            }
            if let Some(t) = p.iter().find(|&&t| t as usize >= vocab) {
                return Err(LabError::Invalid(format!("prompt {b} holds token id {t}, outside the vocabulary of {vocab}")));
            }
            tokens[b * self.cap..][..p.len()].copy_from_slice(p);
        }
        let gpu = &self.m.gpu;
        let lens: Vec<i32> = prompts.iter().map(|p| p.len() as i32).collect();
        gpu.stream.memcpy_htod(&tokens, &mut self.tokens).doing("uploading prompts")?;
        gpu.stream.memcpy_htod(&lens, &mut self.prompt_len).doing("uploading prompt lengths")?;
        gpu.stream.memcpy_htod(&vec![0i32; self.seqs], &mut self.pos).doing("resetting positions")?;
        self.prompts = prompts.iter().map(Vec::len).collect();
        self.steps = 0;
        Ok(())
    }

    /// Back to position 0 with the same prompts (the cache is overwritten as it refills).
    pub fn rewind(&mut self) -> Result<()> {
        self.m.gpu.stream.memcpy_htod(&vec![0i32; self.seqs], &mut self.pos).doing("resetting positions")?;
        self.steps = 0;
        Ok(())
    }

    /// Steps from now on are captured (again) with programmatic dependent launch between their
    /// kernels, or without it.
    pub fn set_programmatic(&mut self, on: bool) {
        if on != self.programmatic {
            self.programmatic = on;
            (self.graph, self.chunk) = (None, None);
        }
    }

    /// Steps from now on run the fused products (see the note of model::llama::gpu), or the unfused ones;
    /// an error if this batch's size or the model's widths are beyond the fused kernels.
    pub fn set_fused(&mut self, on: bool) -> Result<()> {
        if on && !self.m.fuses(self.seqs) {
            let c = &self.m.config;
            return Err(LabError::Invalid(format!(
                "the fused decode takes up to {} sequences, a width up to {} and an FFN up to {} (a batch of {}, widths {} and {})",
                k::FUSED_MAX_SEQS,
                k::FUSED_MAX_NORMED,
                k::FUSED_MAX_WIDTH,
                self.seqs,
                c.dim,
                c.ffn
            )));
        }
        if !on {
            self.fusion = Fusion::Products;
            self.ffn = None;
            self.head = None;
        }
        if on != self.fused {
            self.fused = on;
            (self.graph, self.chunk) = (None, None);
            self.warm = false;
        }
        Ok(())
    }

    /// Steps from now on run decode attention variant `variant` ([`ATTENTION`] until set), or
    /// [`ATTENTION_O`] or [`LAYER`] (fused steps only).
    pub fn set_attention(&mut self, variant: &str) -> Result<()> {
        let c = &self.m.config;
        let fusion = match variant {
            ATTENTION_O => Fusion::AttentionO,
            LAYER => Fusion::Layer,
            _ => Fusion::Products,
        };
        if fusion == Fusion::Layer && (!self.fused || !self.m.fuses_layer(self.seqs, self.cap)) {
            return Err(LabError::Invalid(format!(
                "{LAYER} runs in fused steps of sm_90, heads of {}, up to {} query heads, an FFN up to {}, fewer than {} positions (fused: {}; {} heads of {}, FFN {}, capacity {}, sm_{})",
                k::LAYER_HEAD_DIM,
                k::LAYER_MAX_HEADS,
                k::FUSED_MAX_WIDTH,
                k::LAYER_MAX_POSITIONS,
                self.fused,
                c.heads,
                c.head_dim,
                c.ffn,
                self.cap,
                self.m.gpu.arch
            )));
        }
        if fusion == Fusion::AttentionO {
            if !self.fused || !self.m.fuses_attention(self.seqs) {
                return Err(LabError::Invalid(format!(
                    "{ATTENTION_O} runs in fused steps of sm_90, heads of {}, up to {} KV heads of up to {} query heads (fused: {}; {} heads, {} KV heads of {}, sm_{})",
                    k::ATTENTION_O_HEAD_DIM,
                    k::ATTENTION_O_MAX_KV_HEADS,
                    k::ATTENTION_O_MAX_GROUP,
                    self.fused,
                    c.heads,
                    c.kv_heads,
                    c.head_dim,
                    self.m.gpu.arch
                )));
            }
        } else if fusion == Fusion::Products {
            self.decode = Decode::with(&self.m.gpu, variant, self.seqs, c.heads, c.kv_heads, c.head_dim, self.cap)?;
        }
        self.fusion = fusion;
        (self.graph, self.chunk) = (None, None);
        self.warm = false;
        Ok(())
    }

    /// Fused steps from now on run the FFN in one launch (ffn_q4_1), or as gate_up_swiglu_q4_1
    /// and residual_q4_1; an error if the batch is not fused or the GPU is older than sm_90.
    pub fn set_ffn(&mut self, on: bool) -> Result<()> {
        if on && !(self.fused && self.m.fuses_ffn(self.seqs)) {
            return Err(LabError::Invalid(format!("ffn_q4_1 runs in fused steps of sm_90 (fused: {}; sm_{})", self.fused, self.m.gpu.arch)));
        }
        if on != self.ffn.is_some() {
            let c = &self.m.config;
            self.ffn = if on { Some(k::FfnScratch::new(&self.m.gpu, self.seqs, c.dim, c.ffn)?) } else { None };
            (self.graph, self.chunk) = (None, None);
            self.warm = false;
        }
        Ok(())
    }

    /// Fused steps from now on run their tail (the output norm, the LM head, the greedy choice) in
    /// one launch (head_q8_0), or as add_rmsnorm, quant's w8a16 and argmax or sample; an error if
    /// the batch is not fused or its rows are wider than head_q8_0 takes.
    pub fn set_head(&mut self, on: bool) -> Result<()> {
        if on && !(self.fused && self.m.fuses_head(self.seqs)) {
            return Err(LabError::Invalid(format!(
                "head_q8_0 runs in fused steps of up to {} sequences with rows up to {} wide (fused: {}; {} sequences, rows of {})",
                k::HEAD_MAX_SEQS,
                k::HEAD_MAX_WIDTH,
                self.fused,
                self.seqs,
                self.m.config.dim
            )));
        }
        if on != self.head.is_some() {
            self.head = if on { Some(k::HeadChoice::new(&self.m.gpu, self.m.config.vocab)?) } else { None };
            (self.graph, self.chunk) = (None, None);
            self.warm = false;
        }
        Ok(())
    }

    /// How steps from now on (and prefill) choose each sequence's next token.
    pub fn set_sampling(&mut self, s: Sampling) -> Result<()> {
        s.check()?;
        if s != self.sampling {
            self.sampling = s;
            (self.graph, self.chunk) = (None, None);
            self.warm = false;
        }
        Ok(())
    }

    /// The captured step's dependencies and how many of them are programmatic (none before the
    /// second step).
    pub fn graph_edges(&self) -> Option<(usize, usize)> {
        self.graph.as_ref().map(|g| (g.edges, g.programmatic))
    }

    /// The captured step's kernels in the order they run (none before the second step).
    pub fn graph_kernels(&self) -> Result<Vec<String>> {
        self.graph.as_ref().map_or(Ok(Vec::new()), |g| g.kernels())
    }

    /// Positions left before the cache is full.
    pub fn room(&self) -> usize {
        self.cap - 1 - self.steps
    }

    /// One position of every sequence (replaying the captured graph after the first step).
    pub fn step(&mut self) -> Result<()> {
        if self.room() == 0 {
            return Err(LabError::Invalid(format!("the KV cache of {} positions is full", self.cap)));
        }
        if let Some(g) = &self.graph {
            g.launch()?;
        } else if !self.warm {
            // The first step loads kernels and sizes scratch, which a capture must not see.
            self.launch()?;
            self.warm = true;
        } else {
            let gpu = self.m.gpu.clone();
            let g = Graph::capture(&gpu, self.programmatic, || self.launch())?;
            g.launch()?;
            self.graph = Some(g);
        }
        self.steps += 1;
        Ok(())
    }

    /// `n` steps as one captured graph of `n` steps once the single step's graph exists (the
    /// steps before run as [`Batch::step`] does): no graph boundary between them, and with
    /// programmatic edges a step's first kernel launches while the last one before it runs. The
    /// host sees no token before all `n` are taken.
    pub fn steps(&mut self, n: usize) -> Result<()> {
        if n > self.room() {
            return Err(LabError::Invalid(format!("{n} steps with room for {} in the KV cache of {} positions", self.room(), self.cap)));
        }
        let mut left = n;
        while left > 0 && (left == 1 || self.graph.is_none()) {
            self.step()?;
            left -= 1;
        }
        if left == 0 {
            return Ok(());
        }
        if self.chunk.as_ref().is_none_or(|c| c.0 != left) {
            let gpu = self.m.gpu.clone();
            let g = Graph::capture(&gpu, self.programmatic, || (0..left).try_for_each(|_| self.launch()))?;
            self.chunk = Some((left, g));
        }
        self.chunk.as_ref().expect("captured above").1.launch()?;
        self.steps += left;
        Ok(())
    }

    fn launch(&mut self) -> Result<()> {
        let (m, c, gpu) = (self.m, &self.m.config, &*self.m.gpu);
        let (b, dim) = (self.seqs, c.dim);
        let rows = Rows { rows: b, rows_per_seq: 1 };
        let (dev, eps) = (&m.dev, c.eps);
        k::embed_q8_0(gpu, &m.embed, &self.tokens, &self.pos, &mut self.x, rows, self.cap, dim)?;
        if self.fused {
            return self.launch_fused();
        }
        k::add_rmsnorm(gpu, &mut self.x, None, &m.layers[0].attn_norm, cuda(&mut self.h), b, dim, eps)?;
        // The W4A16 designs take batches of 1, 2, 4, 8 and 16; other batches multiply the f16
        // copies of the weights through the GEMM family.
        let w4 = quant::variants::BATCHES.contains(&b);
        let product = |w: &QuantTensor, dense: &Tensor<f16>, x: &Tensor<f16>, y: &mut Tensor<f16>| {
            if w4 {
                quant::w4a16_matvec(dev, w, x, y)
            } else {
                gemm::matmul(dev, x, dense, y)
            }
        };
        for (i, l) in m.layers.iter().enumerate() {
            product(&l.qkv, &l.dense.qkv, &self.h, &mut self.qkv)?;
            k::rope_cache(gpu, self.qkv.cuda().expect("on the GPU"), &mut self.q, &mut self.caches[i], &self.pos, &m.inv_freq, rows, c.heads)?;
            self.decode.run(&self.q, &self.caches[i], &self.pos, cuda(&mut self.att), None)?;
            product(&l.o, &l.dense.o, &self.att, &mut self.proj)?;
            k::add_rmsnorm(gpu, &mut self.x, self.proj.cuda(), &l.ffn_norm, cuda(&mut self.h), b, dim, eps)?;
            product(&l.gate_up, &l.dense.gate_up, &self.h, &mut self.gu)?;
            k::swiglu(gpu, self.gu.cuda().expect("on the GPU"), cuda(&mut self.act), b, c.ffn)?;
            product(&l.down, &l.dense.down, &self.act, &mut self.proj)?;
            let next = m.layers.get(i + 1).map_or(&m.out_norm, |n| &n.attn_norm);
            k::add_rmsnorm(gpu, &mut self.x, self.proj.cuda(), next, cuda(&mut self.h), b, dim, eps)?;
        }
        quant::w8a16_matvec(dev, &m.head, &self.h, &mut self.logits)?;
        self.choose()
    }

    /// The layers and the head with the fused products, after the embedding.
    fn launch_fused(&mut self) -> Result<()> {
        let (m, c, gpu) = (self.m, &self.m.config, &*self.m.gpu);
        let (b, dim, eps) = (self.seqs, c.dim, c.eps);
        for (i, l) in m.layers.iter().enumerate() {
            if self.fusion == Fusion::Layer {
                let w = k::LayerWeights { qkv: &l.raw.qkv, o: &l.raw.o, gate_up: &l.raw.gate_up, down: &l.raw.down, attn_norm: &l.attn_norm, ffn_norm: &l.ffn_norm };
                k::layer_q4_1(gpu, &w, &mut self.x, &mut self.caches[i], &self.pos, &m.inv_freq, eps, b, c.heads, c.ffn)?;
                continue;
            }
            k::qkv_rope_q4_1(gpu, &l.raw.qkv, &self.x, &l.attn_norm, eps, &mut self.q, &mut self.caches[i], &self.pos, &m.inv_freq, b, c.heads)?;
            if self.fusion == Fusion::AttentionO {
                k::attention_o_q4_1(gpu, &l.raw.o, &self.q, &self.caches[i], &self.pos, &mut self.x, b, c.heads)?;
            } else {
                self.decode.run(&self.q, &self.caches[i], &self.pos, cuda(&mut self.att), None)?;
                k::residual_q4_1(gpu, &l.raw.o, self.att.cuda().expect("on the GPU"), &mut self.x, b, dim, dim, None)?;
            }
            if let Some(scratch) = &mut self.ffn {
                k::ffn_q4_1(gpu, &l.raw.gate_up, &l.raw.down, &mut self.x, &l.ffn_norm, eps, scratch, b)?;
            } else {
                k::gate_up_swiglu_q4_1(gpu, &l.raw.gate_up, &self.x, &l.ffn_norm, eps, cuda(&mut self.act), b, c.ffn)?;
                // The buffer this step's head will read: head_q8_0's packed codes, or the blocks.
                let head = match (&self.head, &m.head_packed) {
                    (Some(_), Some(p)) => Some(p.codes()),
                    _ => m.head.device(),
                };
                let ahead = head.and_then(|h| Some((h, m.head_ahead(i, h.len())?)));
                k::residual_q4_1(gpu, &l.raw.down, self.act.cuda().expect("on the GPU"), &mut self.x, b, dim, c.ffn, ahead)?;
            }
        }
        if let Some(scratch) = &mut self.head {
            let packed = m.head_packed.as_ref().expect("set_head checked the packed head");
            let greedy = self.sampling.greedy();
            let choose = greedy.then_some(k::Choose { scratch, tokens: &mut self.tokens, pos: &mut self.pos, prompt_len: &self.prompt_len, cap: self.cap });
            k::head_q8_0(gpu, packed, &self.x, &m.out_norm, eps, self.logits.cuda_mut().expect("on the GPU"), b, choose)?;
            return if greedy { Ok(()) } else { self.choose() };
        }
        k::add_rmsnorm(gpu, &mut self.x, None, &m.out_norm, cuda(&mut self.h), b, dim, eps)?;
        quant::w8a16_matvec(&m.dev, &m.head, &self.h, &mut self.logits)?;
        self.choose()
    }

    /// Runs every prompt through the model at once (GEMMs over all its tokens, FlashAttention
    /// over each sequence's cache) and chooses each sequence's first new token: what
    /// `prompt length` steps do, in one pass. The prompts must have the same length.
    pub fn prefill(&mut self) -> Result<()> {
        let n = self.prompts[0];
        if self.steps != 0 || self.prompts.iter().any(|&p| p != n) {
            return Err(LabError::Invalid(format!("prefill runs fresh prompts of one length (these have {:?}, {} steps taken)", self.prompts, self.steps)));
        }
        let (m, c, gpu) = (self.m, &self.m.config, &*self.m.gpu);
        let (b, dim, kvd, dev, eps) = (self.seqs, c.dim, c.kv_dim(), &m.dev, c.eps);
        let rows = Rows { rows: b * n, rows_per_seq: n };
        let t16 = |cols: usize| Tensor::<f16>::zeros(dev, &[b * n, cols]);
        let (mut h, mut qkv, mut att, mut proj, mut gu, mut act) = (t16(dim)?, t16(dim + 2 * kvd)?, t16(dim)?, t16(dim)?, t16(2 * c.ffn)?, t16(c.ffn)?);
        let mut q = gpu.stream.alloc_zeros::<f16>(b * n * dim).doing("allocating prefill queries")?;
        let mut x = gpu.stream.alloc_zeros::<f32>(b * n * dim).doing("allocating the prefill residual stream")?;
        let mut lse = gpu.stream.alloc_zeros::<f32>(c.heads * n).doing("allocating prefill statistics")?;
        let d = attention::Dims { batch: 1, sq: n, sk: n, hq: c.heads, hkv: c.kv_heads, d: c.head_dim };
        let rung = attention::best(dev, d);
        k::embed_q8_0(gpu, &m.embed, &self.tokens, &self.pos, &mut x, rows, self.cap, dim)?;
        k::add_rmsnorm(gpu, &mut x, None, &m.layers[0].attn_norm, cuda(&mut h), b * n, dim, eps)?;
        for (i, l) in m.layers.iter().enumerate() {
            gemm::matmul(dev, &h, &l.dense.qkv, &mut qkv)?;
            k::rope_cache(gpu, qkv.cuda().expect("on the GPU"), &mut q, &mut self.caches[i], &self.pos, &m.inv_freq, rows, c.heads)?;
            let cache = &self.caches[i];
            for s in 0..b {
                let (qs, ks) = (s * n * dim, s * self.cap * kvd);
                let kv = (&q.slice(qs..qs + n * dim), &cache.k.slice(ks..ks + n * kvd), &cache.v.slice(ks..ks + n * kvd));
                let out = &mut cuda(&mut att).slice_mut(qs..qs + n * dim);
                attention::launch_tiled(gpu, rung, d, attention::Mask { causal: true, window: 0 }, kv, out, &mut lse.slice_mut(..), None)?;
            }
            gemm::matmul(dev, &att, &l.dense.o, &mut proj)?;
            k::add_rmsnorm(gpu, &mut x, proj.cuda(), &l.ffn_norm, cuda(&mut h), b * n, dim, eps)?;
            gemm::matmul(dev, &h, &l.dense.gate_up, &mut gu)?;
            k::swiglu(gpu, gu.cuda().expect("on the GPU"), cuda(&mut act), b * n, c.ffn)?;
            gemm::matmul(dev, &act, &l.dense.down, &mut proj)?;
            let next = m.layers.get(i + 1).map_or(&m.out_norm, |nl| &nl.attn_norm);
            k::add_rmsnorm(gpu, &mut x, proj.cuda(), next, cuda(&mut h), b * n, dim, eps)?;
        }
        // The head reads each sequence's last row; argmax then advances every position to n.
        for s in 0..b {
            let src = h.cuda().expect("on the GPU").slice((s * n + n - 1) * dim..(s * n + n) * dim);
            gpu.stream.memcpy_dtod(&src, &mut cuda(&mut self.h).slice_mut(s * dim..(s + 1) * dim)).doing("gathering the last rows")?;
        }
        gpu.stream.memcpy_htod(&vec![n as i32 - 1; b], &mut self.pos).doing("setting positions")?;
        quant::w8a16_matvec(dev, &m.head, &self.h, &mut self.logits)?;
        self.choose()?;
        self.steps = n;
        Ok(())
    }

    /// Each sequence's next token from the logits, written and its position advanced.
    fn choose(&mut self) -> Result<()> {
        let (gpu, b, vocab, cap) = (&*self.m.gpu, self.seqs, self.m.config.vocab, self.cap);
        let logits = self.logits.cuda().expect("on the GPU");
        if self.sampling.greedy() {
            k::argmax(gpu, logits, &mut self.tokens, &mut self.pos, &self.prompt_len, b, vocab, cap)
        } else {
            k::sample(gpu, logits, &mut self.tokens, &mut self.pos, &self.prompt_len, b, vocab, cap, &self.sampling)
        }
    }

    /// Every sequence's tokens so far: its prompt, then what was generated.
    pub fn tokens(&self) -> Result<Vec<Vec<u32>>> {
        let all = self.m.gpu.download(&self.tokens)?;
        Ok(all.chunks(self.cap).zip(&self.prompts).map(|(t, &p)| t[..(self.steps + 1).max(p)].to_vec()).collect())
    }

    /// The logits of the last step, `seqs x vocab`.
    pub fn logits(&self) -> Result<Vec<f32>> {
        self.logits.to_vec()
    }
}

fn cuda(t: &mut Tensor<f16>) -> &mut CudaSlice<f16> {
    t.cuda_mut().expect("the engine's tensors live on the GPU")
}
