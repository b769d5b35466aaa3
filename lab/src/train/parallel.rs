//! Data-parallel training of the pipeline's model on a [`Group`]: a replica per rank, each taking
//! its rows of the global batch, the gradients summed across ranks in buckets (ncclAllReduce on
//! GPUs, the lab's ring on threads on the CPU backend), every replica then taking the same AdamW
//! step. The global batch is the single trainer's, so the run follows one rank's training on the
//! whole batch up to the order of f32 sums.
//!
//! On GPUs each rank's forward and backward is queued by its own host thread before any loss is
//! read, so the GPUs work side by side; the buckets are summed after the backward pass (no
//! overlap with it).

use super::model::Batch;
use super::steps::Loss;
use super::trainer::{StepStats, Trainer};
use crate::collective::group::Group;
use crate::experiment::Backend;
use crate::{LabError, Result};

/// Gradient elements per bucket: 4 Mi f32 (16 MiB), one all-reduce each.
pub const BUCKET: usize = 4 << 20;

pub struct Parallel {
    pub group: Group,
    /// Rank 0's trainer holds the stream, and is the one saved.
    pub ranks: Vec<Trainer>,
}

impl Parallel {
    /// Replicas of `t` on the group's ranks, each taking `t.rows / ranks` rows of every batch.
    pub fn new(group: Group, t: Trainer) -> Result<Self> {
        let n = group.size();
        if !t.rows.is_multiple_of(n) {
            return Err(LabError::Invalid(format!("{} rows a batch do not split over {n} ranks", t.rows)));
        }
        let mut ranks = Vec::with_capacity(n);
        for _ in 1..n {
            ranks.push(t.replica()?);
        }
        ranks.insert(0, t);
        Ok(Parallel { group, ranks })
    }

    /// One step on rank 0's stream's next global batch.
    pub fn step(&mut self) -> Result<StepStats> {
        let (rows, seq) = (self.ranks[0].rows, self.ranks[0].seq);
        let batch = self.ranks[0].stream.next_batch(rows, seq)?;
        self.step_on(&batch)
    }

    /// One step on `batch` (all ranks' rows).
    pub fn step_on(&mut self, batch: &Batch) -> Result<StepStats> {
        let n = self.group.size();
        let share = batch.rows / n;
        if batch.rows != share * n || share == 0 {
            return Err(LabError::Invalid(format!("a batch of {} rows does not split over {n} ranks", batch.rows)));
        }
        let window = batch.seq + 1;
        let parts = (0..n).map(|r| Batch::new(batch.tokens[r * share * window..(r + 1) * share * window].to_vec(), share, batch.seq)).collect::<Result<Vec<_>>>()?;
        // GPUs: a host thread per rank queues its work (one thread issuing every rank's hundreds
        // of launches kept the GPUs waiting). The CPU backend's ranks run one after another, each
        // on every core.
        let losses: Vec<Loss> = if matches!(self.group.devs[0], Backend::Cuda(_)) && n > 1 {
            std::thread::scope(|sc| {
                let handles: Vec<_> = self.ranks.iter_mut().zip(&self.group.devs).zip(&parts).map(|((t, dev), part)| sc.spawn(move || t.gradients(dev, part))).collect();
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(LabError::Invalid("a rank's thread panicked".into())))).collect::<Result<Vec<_>>>()
            })?
        } else {
            self.ranks.iter_mut().zip(&self.group.devs).zip(&parts).map(|((t, dev), part)| t.gradients(dev, part)).collect::<Result<Vec<_>>>()?
        };
        let mut grads = self.ranks.iter_mut().map(Trainer::take_grads).collect::<Result<Vec<_>>>()?;
        let len = grads[0].len();
        let summed = (0..len).step_by(BUCKET).try_for_each(|at| self.group.all_reduce_queued(&mut grads, at..(at + BUCKET).min(len)));
        for (t, g) in self.ranks.iter_mut().zip(grads) {
            t.put_grads(g);
        }
        summed?;
        self.group.join()?;
        let mut loss = 0.0;
        for (l, dev) in losses.into_iter().zip(&self.group.devs) {
            loss += l.value(dev)?;
        }
        // Every rank holds the same sum: its norm once.
        let norm = self.ranks[0].grad_norm(&self.group.devs[0])?;
        let mut stats = None;
        for (t, dev) in self.ranks.iter_mut().zip(&self.group.devs) {
            stats = Some(t.apply(dev, loss / n as f64, norm, n)?);
        }
        let mut stats = stats.expect("a group has a rank");
        stats.tokens = batch.rows * batch.seq;
        Ok(stats)
    }
}
