//! Experiment `train`: the training step on the GPU (kernels/train.cu with the linear, rmsnorm
//! and attention families' kernels) checked against the CPU path, and timed at the `full` plan's
//! shape.
//!
//! Gates (odd shapes, random weights with norm weights away from 1):
//! - `loss` and `grads`: the GPU's loss and gradients against the CPU path with the attention in
//!   bf16 as on the GPU (the CPU path's own gradients are held to f64 central differences by the
//!   unit tests): each gradient tensor within twice what rounding the attention's inputs to bf16
//!   moves it ([`judge_grads`]). On the CPU backend the gate is the loss against the f64 loss
//!   ([`super::reference`]).
//! - `adamw`: the global norm and one clipped AdamW step on the device against the host's.
//!
//! Timed: steps of the `full` plan's model (6 layers of 256, SmolLM2's vocabulary) from random
//! tokens, each step's loss, gradients, norm and update on the device (the pipeline's own step
//! records time every step of a real run).

use super::model::{Batch, Fault, Grads, Model, Weights};
use super::optim::{clip_factor, clip_grad_norm, AdamW, State};
use super::reference::loss_f64;
use super::steps::{self, DeviceState};
use super::trainer::Trainer;
use crate::error::Doing;
use crate::experiment::{rng_for, Backend, Experiment, Measurement, Session};
use crate::model::llama::config::RopeScaling;
use crate::model::llama::Config;
use crate::ops::compare::{compare, compare_within};
use crate::profile::Work;
use crate::record::{ErrorStats, Tolerance};
use crate::{LabError, Result};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::time::Instant;

pub struct Train;

/// The loss, GPU against the CPU path: bf16's unit roundoff, relative.
const LOSS_TOL: Tolerance = Tolerance { atol: 0.0, rtol: 1.0 / 256.0 };
/// The CPU's f32 loss against the f64 loss (the unit tests' bound).
const LOSS_F64_TOL: Tolerance = Tolerance { atol: 0.0, rtol: 1e-5 };
/// Weights after one AdamW step, device against host: f32 operations, perhaps contracted to FMAs.
const ADAMW_TOL: Tolerance = Tolerance { atol: 1e-7, rtol: 1e-6 };

fn usize_of(case: &Value, key: &str) -> Result<usize> {
    case[key].as_u64().map(|v| v as usize).ok_or_else(|| LabError::Invalid(format!("train case {case}: `{key}` is missing")))
}

/// The model a case names: SmolLM2's design, the case's sizes.
fn config(case: &Value) -> Result<Config> {
    let (dim, heads) = (usize_of(case, "dim")?, usize_of(case, "heads")?);
    Ok(Config {
        layers: usize_of(case, "layers")?,
        dim,
        heads,
        kv_heads: usize_of(case, "kv_heads")?,
        head_dim: dim / heads,
        ffn: usize_of(case, "ffn")?,
        vocab: usize_of(case, "vocab")?,
        context: usize_of(case, "seq")?,
        eps: 1e-5,
        rope_base: 10000.0,
        rope_dims: dim / heads,
        rope_scaling: RopeScaling::None,
        rope_factors: None,
        tied_embeddings: true,
    })
}

/// The case's parameters and the model's parameter count.
fn with_count(case: &Value, params: usize) -> Value {
    let mut v = case.clone();
    v["params"] = params.into();
    v
}

/// Weights large enough that every path carries signal, norm weights drawn from [0.5, 1.5).
pub(crate) fn gate_model(c: &Config, seed: u64) -> Result<Model> {
    let mut m = Model::init(c, 0.3, seed)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed + 1);
    for s in m.layout.spans().into_iter().filter(|s| s.shape.len() == 1).cloned().collect::<Vec<_>>() {
        m.params[s.at].iter_mut().for_each(|v| *v = rng.random_range(0.5..1.5));
    }
    Ok(m)
}

pub(crate) fn random_batch(rng: &mut impl Rng, vocab: usize, rows: usize, seq: usize) -> Result<Batch> {
    Batch::new((0..rows * (seq + 1)).map(|_| rng.random_range(0..vocab as u32)).collect(), rows, seq)
}

/// Each gradient tensor's distance from the reference's, relative to the reference's norm,
/// against twice the distance of the same path with its attention in f32 (`yardstick`): how far
/// rounding the attention's inputs to bf16 moves that tensor on this model and batch. The GPU's
/// attention kernels round a little more (P and dS to bf16 for their products), so the bound
/// allows twice that, plus f32's reordering noise.
pub fn judge_grads(m: &Model, got: &[f32], want: &[f32], yardstick: &[f32]) -> ErrorStats {
    let dist = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum::<f64>().sqrt();
    let (mut rel, mut allow) = (Vec::new(), Vec::new());
    for s in m.layout.spans() {
        let w = &want[s.at.clone()];
        let norm = dist(w, &vec![0.0; w.len()]).max(f64::MIN_POSITIVE);
        rel.push(dist(&got[s.at.clone()], w) / norm);
        allow.push(2.0 * dist(&yardstick[s.at.clone()], w) / norm + 1e-5);
    }
    let zeros = vec![0.0; rel.len()];
    compare_within(&rel, &zeros, &allow, "per tensor: |got - ref| / |ref| <= 2 |f32 attention - ref| / |ref| + 1e-5", "CPU path, attention in bf16")
}

impl Experiment for Train {
    fn name(&self) -> &'static str {
        "train"
    }
    fn description(&self) -> &'static str {
        "a Llama training step on the GPU (embedding, RoPE, SwiGLU, cross-entropy, AdamW kernels with the lab's linear, RMSNorm and attention) against the CPU path, and its time at the full plan's shape"
    }
    fn sweep_axis(&self) -> &'static str {
        "params"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let shape = |l: usize, d: usize, h: usize, kv: usize, f: usize, v: usize, rows: usize, seq: usize, timed: bool| {
            json!({"layers": l, "dim": d, "heads": h, "kv_heads": kv, "ffn": f, "vocab": v, "rows": rows, "seq": seq, "timed": timed})
        };
        let mut v = vec![shape(2, 24, 4, 2, 40, 37, 2, 7, false), shape(2, 128, 2, 1, 200, 1001, 3, 67, false)];
        if matches!(backend, Backend::Cuda(_)) && !quick {
            v.push(shape(6, 256, 4, 2, 768, 49152, 16, 256, true));
        }
        v
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        let c = config(case)?;
        let (rows, seq) = (usize_of(case, "rows")?, usize_of(case, "seq")?);
        let mut rng = rng_for(s.opts.seed, case);
        if case["timed"].as_bool() == Some(true) {
            return timed(s, case, &c, rows, seq, &mut rng);
        }
        let m = gate_model(&c, rng.random())?;
        let batch = random_batch(&mut rng, c.vocab, rows, seq)?;
        let params = with_count(case, m.layout.len);
        let dev = s.backend.clone();
        let gpu = match &dev {
            Backend::Cpu => {
                let w: Vec<f64> = m.params.iter().map(|&v| v as f64).collect();
                let got = m.loss(&dev, &batch)?;
                let mut r = Measurement::new("loss", "lab", &params, Work::default());
                r.tolerance = Some(LOSS_F64_TOL);
                r.error = Some(compare(&[got], &[loss_f64(&m.layout, &w, &batch)], LOSS_F64_TOL, "f64 loss"));
                s.emit(r)?;
                return Ok(());
            }
            Backend::Cuda(gpu) => gpu.clone(),
        };
        let mut want = vec![0f32; m.layout.len];
        let want_loss = m.loss_and_grads_at::<half::bf16>(&Backend::Cpu, Weights::Host(&m.params), Grads::Host(&mut want), &batch, Fault::None)?.value(&Backend::Cpu)?;
        let mut got = vec![0f32; m.layout.len];
        let got_loss = m.loss_and_grads(&dev, &batch, &mut got)?;
        let mut r = Measurement::new("loss", "lab", &params, Work::default());
        r.tolerance = Some(LOSS_TOL);
        r.error = Some(compare(&[got_loss], &[want_loss], LOSS_TOL, "CPU path, attention in bf16"));
        r.extra = json!({"loss": got_loss, "cpu_loss": want_loss}).as_object().expect("an object").clone();
        s.emit(r)?;
        let mut yardstick = vec![0f32; m.layout.len];
        m.loss_and_grads(&Backend::Cpu, &batch, &mut yardstick)?;
        let mut r = Measurement::new("grads", "lab", &params, Work::default());
        r.error = Some(judge_grads(&m, &got, &want, &yardstick));
        s.emit(r)?;
        // One clipped AdamW step from these gradients, host and device; the first moments from
        // the gradients' own scale so the update is not the first step's sign(g) alone.
        let opt = AdamW { lr: 1e-2, min_lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, clip: 0.5, warmup: 1, steps: 10 };
        let mut st = State::new(m.layout.len);
        st.m.iter_mut().zip(&want).for_each(|(m, g)| *m = 0.5 * g);
        st.v.iter_mut().zip(&want).for_each(|(v, g)| *v = g * g);
        st.step = 3;
        let decay: Vec<bool> = (0..m.layout.len).map(|i| i % 3 != 0).collect();
        let mut d = DeviceState {
            params: gpu.upload(&m.params)?,
            grads: gpu.upload(&want)?,
            m: gpu.upload(&st.m)?,
            v: gpu.upload(&st.v)?,
            decay: gpu.upload(&decay.iter().map(|&b| b as u8).collect::<Vec<_>>())?,
        };
        let norm = steps::sum_squares(&gpu, &d.grads)?.sqrt();
        let mut dst = st.clone();
        steps::adamw(&gpu, &mut d, &opt.next(&mut dst, clip_factor(norm, opt.clip)))?;
        let (mut p, mut g) = (m.params.clone(), want.clone());
        let host_norm = clip_grad_norm(&mut g, opt.clip);
        opt.step(&mut p, &g, &decay, &mut st);
        let got_p = gpu.stream.clone_dtoh(&d.params).doing("reading the weights")?;
        let mut r = Measurement::new("adamw", "lab", &params, Work::default());
        r.tolerance = Some(ADAMW_TOL);
        let mut error = compare(&got_p.iter().map(|&v| v as f64).collect::<Vec<_>>(), &p.iter().map(|&v| v as f64).collect::<Vec<_>>(), ADAMW_TOL, "host AdamW");
        // The norm's sums differ only in order (f64): far below anything clipping could show.
        if (norm - host_norm).abs() > 1e-9 * host_norm {
            error.mismatches += 1;
            error.worst_fraction_of_tolerance = f64::INFINITY;
            error.reference = format!("host AdamW; the device's gradient norm {norm} is not the host's {host_norm}");
        }
        r.error = Some(error);
        r.extra = json!({"grad_norm": norm, "host_grad_norm": host_norm}).as_object().expect("an object").clone();
        s.emit(r)?;
        Ok(())
    }
}

/// Steps of a model trained from random tokens: the first ten warm up (a GPU just out of idle
/// took 30 ms a step over its first dozen, 20 ms over a pipeline's 200), the rest are timed.
fn timed(s: &mut Session, case: &Value, c: &Config, rows: usize, seq: usize, rng: &mut impl Rng) -> Result<()> {
    const WARMUP: usize = 10;
    let steps = if s.opts.quick { 3 } else { 20 };
    let tokens: Vec<u32> = (0..rows * (seq + 1) * (steps + WARMUP)).map(|_| rng.random_range(0..c.vocab as u32)).collect();
    let model = Model::init(c, 0.02, rng.random())?;
    let n = model.layout.len;
    let opt = AdamW { lr: 1e-3, min_lr: 1e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, clip: 1.0, warmup: 2, steps: steps + WARMUP };
    let mut t = Trainer::new(model, opt, State::new(n), super::data::Stream::new(tokens, seq)?, (rows, seq), 0)?;
    let dev = s.backend.clone();
    let (mut ms, mut losses) = (Vec::new(), Vec::new());
    for i in 0..steps + WARMUP {
        let start = Instant::now();
        let st = t.step(&dev)?;
        if let Backend::Cuda(gpu) = &dev {
            gpu.stream.synchronize().doing("waiting for the step")?;
        }
        if i >= WARMUP {
            ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
        losses.push(st.loss);
    }
    let flops = super::pipeline::step_flops(c, rows, seq);
    let params = with_count(case, n);
    let mut r = Measurement::new("step", "lab", &params, Work { bytes: 0, flops });
    let median = crate::profile::TimeSummary::of(&ms).median;
    r.time = Some(super::pipeline::host_timing(ms));
    r.extra = json!({"losses": losses, "tokens_per_s": (rows * seq) as f64 / (median * 1e-3)}).as_object().expect("an object").clone();
    s.emit(r)?;
    Ok(())
}
