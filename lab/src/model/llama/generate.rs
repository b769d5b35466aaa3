//! Generation on either engine, one token at a time (greedy or sampled, [`Sampling`]), each
//! handed to the caller as soon as it is known (to stream text, or stop). The two engines draw
//! the same way: the same token for the same logits, seed and position.

use super::sample::{choose, Sampling};
use super::{Config, CpuModel, GpuModel};
use crate::experiment::Backend;
use crate::weights::gguf::Gguf;
use crate::{LabError, Result};
use std::time::{Duration, Instant};

pub enum Engine {
    Cpu(CpuModel),
    Gpu(GpuModel),
}

impl Engine {
    pub fn load(dev: &Backend, g: &Gguf) -> Result<Self> {
        Ok(match dev {
            Backend::Cpu => Engine::Cpu(CpuModel::load(g)?),
            Backend::Cuda(gpu) => Engine::Gpu(GpuModel::load(gpu, g)?),
        })
    }
    pub fn config(&self) -> &Config {
        match self {
            Engine::Cpu(m) => &m.config,
            Engine::Gpu(m) => &m.config,
        }
    }
}

/// The lowest index of the largest logit (the GPU's argmax rule); a NaN logit is an error.
pub fn argmax(logits: &[f32]) -> Result<u32> {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() {
            return Err(LabError::Invalid(format!("logit {i} is NaN")));
        }
        if v > logits[best] {
            best = i;
        }
    }
    Ok(best as u32)
}

/// What a generation did and how long it took: the prompt's time runs until the first new
/// token is known; the rest is decode.
#[derive(Debug)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub prompt: Duration,
    pub decode: Duration,
}

/// Up to `max_new` tokens after `prompt`, chosen as `sampling` says; `each(token)` sees every
/// new token and returns false to stop there.
pub fn generate(engine: &Engine, prompt: &[u32], max_new: usize, sampling: Sampling, mut each: impl FnMut(u32) -> Result<bool>) -> Result<Generated> {
    sampling.check()?;
    let c = engine.config();
    if prompt.is_empty() {
        return Err(LabError::Invalid("the prompt has no tokens".into()));
    }
    if prompt.len() + max_new > c.context {
        return Err(LabError::Invalid(format!(
            "{} prompt tokens and {max_new} new ones exceed the model's context of {} tokens",
            prompt.len(),
            c.context
        )));
    }
    let start = Instant::now();
    let mut first = None;
    let mut out = Vec::new();
    let mut emit = |t: u32, out: &mut Vec<u32>| -> Result<bool> {
        first.get_or_insert_with(|| start.elapsed());
        out.push(t);
        Ok(each(t)? && out.len() < max_new)
    };
    match engine {
        Engine::Cpu(m) => {
            // Logits at position p choose the token of p + 1, as on the GPU.
            let mut cache = m.cache();
            let mut t = choose(&m.forward(&mut cache, prompt)?, &sampling, 0, prompt.len() - 1)?;
            while max_new > 0 && emit(t, &mut out)? {
                let logits = m.step(&mut cache, t, true)?.expect("logits were asked for");
                t = choose(&logits, &sampling, 0, cache.len - 1)?;
            }
        }
        Engine::Gpu(m) => {
            let mut batch = m.batch(1, prompt.len() + max_new + 1)?;
            // engine_pdl: the same logits bit for bit, 5-8% less time a step on an H100 (note
            // h100-decode-pdl); before sm_90 no kernel waits, so no edge changes.
            batch.set_programmatic(true);
            // engine_fused: five launches a layer instead of ten (note h100-decode-fused).
            batch.set_fused(m.fuses(1))?;
            // engine_attention_o: 5% less a step while every position fits the kernel's one pass
            // of keys, slower past it (notes h200-decode-attention-o, h200-decode-residency).
            if m.fuses_attention(1) && prompt.len() + max_new < super::gpu::ATTENTION_O_ONE_PASS {
                batch.set_attention(super::gpu::ATTENTION_O)?;
            }
            // engine_head: the output norm, the LM head and the choice in one launch (note
            // h200-decode-tail).
            if m.fuses_head(1) {
                batch.set_head(true)?;
            }
            batch.set_sampling(sampling)?;
            batch.start(&[prompt.to_vec()])?;
            batch.prefill()?;
            let last = |b: &super::Batch| -> Result<u32> { Ok(*b.tokens()?[0].last().expect("a step writes a token")) };
            let mut t = last(&batch)?;
            while max_new > 0 && emit(t, &mut out)? {
                batch.step()?;
                t = last(&batch)?;
            }
        }
    }
    let prompt_time = first.unwrap_or_else(|| start.elapsed());
    Ok(Generated { tokens: out, prompt: prompt_time, decode: start.elapsed() - prompt_time })
}
