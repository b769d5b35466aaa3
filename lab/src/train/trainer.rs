//! The training loop's state and its step: a batch from the stream, loss and gradients, clipping,
//! AdamW. Everything a resume needs is here and in the checkpoint ([`super::checkpoint`]).

use super::data::Stream;
use super::model::{Batch, Fault, Grads, Model, Weights};
use super::optim::{clip_factor, AdamW, State};
use super::steps::{self, DeviceState, Loss};
use crate::error::Doing;
use crate::experiment::Backend;
use crate::gpu::Gpu;
use crate::tensor::{Buffer, Tensor};
use crate::{LabError, Result};
use std::sync::Arc;

pub struct Trainer {
    pub model: Model,
    pub opt: AdamW,
    pub state: State,
    pub stream: Stream,
    /// Windows per batch, and tokens per window.
    pub rows: usize,
    pub seq: usize,
    /// The seed the weights were drawn from (recorded; training itself draws nothing).
    pub seed: u64,
    grads: Vec<f32>,
    /// Which parameters take weight decay: matrices, not norm weights.
    decay: Vec<bool>,
    /// Weights, gradients and moments on the GPU once a step ran there; while it is newer than
    /// `model` and `state`, [`Trainer::to_host`] must run before they are read or saved.
    device: Option<(Arc<Gpu>, DeviceState)>,
    host_stale: bool,
}

/// What one step measured.
#[derive(Clone, Copy, Debug)]
pub struct StepStats {
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    pub lr: f32,
    pub tokens: usize,
}

impl Trainer {
    pub fn new(model: Model, opt: AdamW, state: State, stream: Stream, (rows, seq): (usize, usize), seed: u64) -> Result<Self> {
        let n = model.layout.len;
        if state.m.len() != n || state.v.len() != n {
            return Err(LabError::Invalid(format!("optimizer moments of {} and {} values for a model of {n}", state.m.len(), state.v.len())));
        }
        let mut decay = vec![false; n];
        for s in model.layout.spans().into_iter().filter(|s| s.shape.len() > 1) {
            decay[s.at.clone()].fill(true);
        }
        Ok(Trainer { model, opt, state, stream, rows, seq, seed, grads: vec![0.0; n], decay, device: None, host_stale: false })
    }

    /// One step on the stream's next batch.
    pub fn step(&mut self, dev: &Backend) -> Result<StepStats> {
        let batch = self.stream.next_batch(self.rows, self.seq)?;
        self.step_on(dev, &batch)
    }

    /// One step on `batch`. On the GPU the weights, gradients and moments stay on the device
    /// between steps: the clipping norm and AdamW run there too.
    pub fn step_on(&mut self, dev: &Backend, batch: &Batch) -> Result<StepStats> {
        let loss = self.gradients(dev, batch)?.value(dev)?;
        let norm = self.grad_norm(dev)?;
        self.apply(dev, loss, norm, 1)
    }

    /// The loss on `batch` and its gradient, left in the trainer's gradient buffer (on the GPU,
    /// the device's, with the loss still on the device).
    pub(crate) fn gradients(&mut self, dev: &Backend, batch: &Batch) -> Result<Loss> {
        let gpu = match dev {
            Backend::Cpu => {
                self.leave_device()?;
                return self.model.loss_and_grads(dev, batch, &mut self.grads).map(Loss::Ready);
            }
            Backend::Cuda(gpu) => gpu,
        };
        if self.device.is_none() {
            let decay: Vec<u8> = self.decay.iter().map(|&d| d as u8).collect();
            let up = |v: &[f32]| gpu.upload(v);
            let state = DeviceState { params: up(&self.model.params)?, grads: gpu.stream.alloc_zeros(self.model.layout.len).doing("allocating the gradients")?, m: up(&self.state.m)?, v: up(&self.state.v)?, decay: gpu.upload(&decay)? };
            self.device = Some((gpu.clone(), state));
        }
        let (_, d) = self.device.as_mut().expect("placed above");
        self.host_stale = true;
        self.model.loss_and_grads_at::<half::bf16>(dev, Weights::Device(&d.params), Grads::Device(&mut d.grads), batch, Fault::None)
    }

    /// The global norm of the gradient buffer.
    pub(crate) fn grad_norm(&self, dev: &Backend) -> Result<f64> {
        match (dev, &self.device) {
            (Backend::Cuda(gpu), Some((_, d))) => Ok(steps::sum_squares(gpu, &d.grads)?.sqrt()),
            _ => Ok(self.grads.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt()),
        }
    }

    /// AdamW from the gradient buffer divided by `ranks` (a data-parallel sum; 1 otherwise),
    /// clipped to the optimizer's norm given the buffer's own `norm`.
    pub(crate) fn apply(&mut self, dev: &Backend, loss: f64, norm: f64, ranks: usize) -> Result<StepStats> {
        finite(loss, self.state.step)?;
        let grad_norm = norm / ranks as f64;
        let clip = clip_factor(grad_norm, self.opt.clip) / ranks as f32;
        let tokens = self.rows * self.seq;
        match (dev, &mut self.device) {
            (Backend::Cuda(gpu), Some((_, d))) => {
                let a = self.opt.next(&mut self.state, clip);
                steps::adamw(gpu, d, &a)?;
                Ok(StepStats { loss, grad_norm, lr: a.lr, tokens })
            }
            _ => {
                if clip != 1.0 {
                    self.grads.iter_mut().for_each(|v| *v *= clip);
                }
                let lr = self.opt.step(&mut self.model.params, &self.grads, &self.decay, &mut self.state);
                Ok(StepStats { loss, grad_norm, lr, tokens })
            }
        }
    }

    /// A copy of this trainer at its current state, its device buffers not yet placed.
    pub(crate) fn replica(&self) -> Result<Trainer> {
        self.host_current()?;
        Trainer::new(self.model.clone(), self.opt.clone(), self.state.clone(), self.stream.clone(), (self.rows, self.seq), self.seed)
    }

    /// The gradient buffer as a tensor (for a group's all-reduce), and back.
    pub(crate) fn take_grads(&mut self) -> Result<Tensor<f32>> {
        match &mut self.device {
            Some((gpu, d)) => {
                let empty = gpu.stream.alloc_zeros(0).doing("allocating")?;
                Tensor::from_cuda(&[d.grads.len()], std::mem::replace(&mut d.grads, empty))
            }
            None => Tensor::from_vec(&[self.grads.len()], std::mem::take(&mut self.grads)),
        }
    }

    pub(crate) fn put_grads(&mut self, mut g: Tensor<f32>) {
        match (&mut self.device, g.buffer_mut()) {
            (Some((_, d)), Buffer::Cuda(b)) => std::mem::swap(&mut d.grads, b),
            (_, Buffer::Host(v)) => self.grads = std::mem::take(v),
            _ => unreachable!("gradients come back where they were taken from"),
        }
    }

    /// The model's loss on `batch` at its current weights (on the GPU, those on the device).
    pub fn loss(&self, dev: &Backend, batch: &Batch) -> Result<f64> {
        match (&self.device, dev) {
            (Some((_, d)), Backend::Cuda(_)) => self.model.loss_with(dev, Weights::Device(&d.params), batch),
            _ => {
                self.host_current()?;
                self.model.loss(dev, batch)
            }
        }
    }

    /// Copies the weights and moments of GPU steps back into `model` and `state`.
    pub fn to_host(&mut self) -> Result<()> {
        if let (Some((gpu, d)), true) = (&self.device, self.host_stale) {
            let s = &gpu.stream;
            s.memcpy_dtoh(&d.params, &mut self.model.params).doing("reading the weights")?;
            s.memcpy_dtoh(&d.m, &mut self.state.m).doing("reading the first moments")?;
            s.memcpy_dtoh(&d.v, &mut self.state.v).doing("reading the second moments")?;
            self.host_stale = false;
        }
        Ok(())
    }

    /// Back to the host, the device buffers released.
    fn leave_device(&mut self) -> Result<()> {
        self.to_host()?;
        self.device = None;
        Ok(())
    }

    /// An error when GPU steps are newer than `model` and `state`.
    pub(crate) fn host_current(&self) -> Result<()> {
        if self.host_stale {
            return Err(LabError::Invalid("the trainer's weights are on the GPU, newer than its host copy: call Trainer::to_host first".into()));
        }
        Ok(())
    }
}

fn finite(loss: f64, step: usize) -> Result<()> {
    if !loss.is_finite() {
        return Err(LabError::Invalid(format!("the loss is {loss} at step {step}: training diverged (lower the learning rate)")));
    }
    Ok(())
}
