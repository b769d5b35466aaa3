//! The training loop's state and its step: a batch from the stream, loss and gradients, clipping,
//! AdamW. Everything a resume needs is here and in the checkpoint ([`super::checkpoint`]).

use super::data::Stream;
use super::model::{Batch, Model};
use super::optim::{clip_grad_norm, AdamW, State};
use crate::experiment::Backend;
use crate::{LabError, Result};

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
        Ok(Trainer { model, opt, state, stream, rows, seq, seed, grads: vec![0.0; n], decay })
    }

    /// One step on the stream's next batch.
    pub fn step(&mut self, dev: &Backend) -> Result<StepStats> {
        let batch = self.stream.next_batch(self.rows, self.seq)?;
        self.step_on(dev, &batch)
    }

    /// One step on `batch`.
    pub fn step_on(&mut self, dev: &Backend, batch: &Batch) -> Result<StepStats> {
        let loss = self.model.loss_and_grads(dev, batch, &mut self.grads)?;
        if !loss.is_finite() {
            return Err(LabError::Invalid(format!("the loss is {loss} at step {}: training diverged (lower the learning rate)", self.state.step)));
        }
        let grad_norm = clip_grad_norm(&mut self.grads, self.opt.clip);
        let lr = self.opt.step(&mut self.model.params, &self.grads, &self.decay, &mut self.state);
        Ok(StepStats { loss, grad_norm, lr, tokens: batch.rows * batch.seq })
    }
}
