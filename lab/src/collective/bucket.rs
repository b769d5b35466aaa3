//! Gradient bucketing for data-parallel training, shown on a plain f32 MLP on CPU ranks.
//!
//! Gradients are laid out in one flat buffer in the order the backward pass produces them (last
//! layer first) and cut into buckets of about `bucket_bytes` at tensor boundaries (a tensor larger
//! than a bucket is a bucket alone), as PyTorch DDP does (its default `bucket_cap_mb` is 25). A
//! bucket is all-reduced as soon as its last gradient is written, on a communication thread that
//! owns the transport, while the backward pass goes on with the layers below.
//!
//! Loss is the mean squared error over the global batch, so the sum over ranks of each rank's
//! gradient (its shard of the batch, divided by the global batch size) is the single-process
//! gradient: data-parallel training follows the single-process loss curve up to the order of the
//! floating-point sums.
//!
//! The `bucketing` experiment that times this training is [`crate::ops::bucketing`].

use super::ring::{Algorithm, Ring};
use super::transport::Transport;
use crate::experiment::rng_for;
use crate::kernels::DType;
use crate::record::Tolerance;
use crate::{LabError, Result};
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::json;

/// PyTorch DDP's default bucket size.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// A multi-layer perceptron with ReLU between layers (none after the last), parameters in one
/// flat buffer laid out in backward order: W_L, b_L, W_{L-1}, b_{L-1}, ..., W_1, b_1.
#[derive(Clone)]
pub struct Mlp {
    pub dims: Vec<usize>,
    pub params: Vec<f32>,
}

/// One parameter tensor: its layer (0-based), whether it is the bias, its place in the flat buffer.
#[derive(Clone, Debug)]
pub(crate) struct Tensor {
    pub(crate) layer: usize,
    pub(crate) bias: bool,
    pub(crate) at: std::ops::Range<usize>,
}

impl Mlp {
    /// Weights N(0, 1/fan_in), biases 0, from a seed: the same on every rank.
    pub fn new(dims: &[usize], seed: u64) -> Self {
        let mut rng = rng_for(seed, &json!({"mlp": dims}));
        let mut mlp = Mlp { dims: dims.to_vec(), params: vec![0.0; Self::count(dims)] };
        for t in mlp.tensors() {
            if !t.bias {
                let scale = 1.0 / (dims[t.layer] as f32).sqrt();
                for p in &mut mlp.params[t.at] {
                    *p = Distribution::<f32>::sample(&StandardNormal, &mut rng) * scale;
                }
            }
        }
        mlp
    }

    pub fn count(dims: &[usize]) -> usize {
        dims.windows(2).map(|w| w[1] * w[0] + w[1]).sum()
    }

    /// Tensors in backward order (the flat buffer's order).
    pub(crate) fn tensors(&self) -> Vec<Tensor> {
        let mut out = Vec::new();
        let mut at = 0;
        for l in (0..self.dims.len() - 1).rev() {
            let (fan_in, fan_out) = (self.dims[l], self.dims[l + 1]);
            out.push(Tensor { layer: l, bias: false, at: at..at + fan_out * fan_in });
            at += fan_out * fan_in;
            out.push(Tensor { layer: l, bias: true, at: at..at + fan_out });
            at += fan_out;
        }
        out
    }

    fn layer(&self, l: usize) -> (&[f32], &[f32]) {
        let ts = self.tensors();
        let w = ts.iter().find(|t| t.layer == l && !t.bias).unwrap().at.clone();
        let b = ts.iter().find(|t| t.layer == l && t.bias).unwrap().at.clone();
        (&self.params[w], &self.params[b])
    }

    /// Activations of every layer for a batch of `rows` inputs (the input first).
    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<Vec<f32>> {
        let mut acts = vec![x.to_vec()];
        let layers = self.dims.len() - 1;
        for l in 0..layers {
            let (w, b) = self.layer(l);
            let mut y = linear(acts.last().unwrap(), rows, w, b, self.dims[l], self.dims[l + 1]);
            if l + 1 < layers {
                y.par_iter_mut().for_each(|v| *v = v.max(0.0));
            }
            acts.push(y);
        }
        acts
    }
}

/// y = x W^T + b for `rows` rows, W stored out x in (row-major), one rayon task per row.
pub fn linear(x: &[f32], rows: usize, w: &[f32], b: &[f32], fan_in: usize, fan_out: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; rows * fan_out];
    if fan_out == 0 {
        return y;
    }
    y.par_chunks_mut(fan_out).enumerate().for_each(|(i, yr)| {
        let xr = &x[i * fan_in..(i + 1) * fan_in];
        for (o, yo) in yr.iter_mut().enumerate() {
            *yo = dot(xr, &w[o * fan_in..(o + 1) * fan_in]) + b[o];
        }
    });
    y
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums: independent chains the compiler can vectorise.
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The loss and dL/dy of the mean squared error 1/(2 B m) sum (y - target)^2 over a global batch
/// of `global_rows` rows of `m` outputs, for this rank's rows. (The mean over outputs too keeps
/// one learning rate stable from 16 outputs to 1024.)
pub(crate) fn mse(y: &[f32], target: &[f32], global_rows: usize, outputs: usize) -> (f64, Vec<f32>) {
    let count = (global_rows * outputs) as f64;
    let loss = y.iter().zip(target).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / (2.0 * count);
    let dy = y.iter().zip(target).map(|(a, b)| ((a - b) as f64 / count) as f32).collect();
    (loss, dy)
}

/// A batch of synthetic regression data: inputs N(0, 1), targets tanh of a fixed random linear
/// map of the inputs (a teacher the MLP can learn). Row `i` of step `s` is the same whoever draws it.
pub struct Data {
    dims: (usize, usize),
    teacher: Vec<f32>,
    seed: u64,
}

impl Data {
    pub fn new(fan_in: usize, fan_out: usize, seed: u64) -> Self {
        let mut rng = rng_for(seed, &json!({"teacher": [fan_in, fan_out]}));
        let scale = 1.0 / (fan_in as f32).sqrt();
        let teacher = (0..fan_in * fan_out).map(|_| Distribution::<f32>::sample(&StandardNormal, &mut rng) * scale).collect();
        Data { dims: (fan_in, fan_out), teacher, seed }
    }

    /// Rows `rows` of step `step`'s global batch: (inputs, targets).
    pub fn rows(&self, step: usize, rows: std::ops::Range<usize>) -> (Vec<f32>, Vec<f32>) {
        let (fi, fo) = self.dims;
        let mut x = Vec::with_capacity(rows.len() * fi);
        for i in rows.clone() {
            let mut rng = rng_for(self.seed, &json!({"step": step, "row": i}));
            x.extend((0..fi).map(|_| Distribution::<f32>::sample(&StandardNormal, &mut rng)));
        }
        let zero = vec![0.0; fo];
        let mut t = linear(&x, rows.len(), &self.teacher_t(), &zero, fi, fo);
        t.iter_mut().for_each(|v| *v = v.tanh());
        (x, t)
    }

    fn teacher_t(&self) -> Vec<f32> {
        let (fi, fo) = self.dims;
        (0..fo * fi).map(|i| self.teacher[(i % fi) * fo + i / fi]).collect()
    }
}

/// How gradients are all-reduced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    pub bucket_bytes: usize,
    /// Reduce each bucket while the backward pass goes on (else all after the backward pass).
    pub overlap: bool,
}

/// Tensor-boundary buckets over the flat buffer: consecutive tensors until adding the next would
/// pass `bucket_bytes`.
pub(crate) fn buckets(tensors: &[Tensor], bucket_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for t in tensors {
        match out.last_mut() {
            Some(b) if (t.at.end - b.start) * 4 <= bucket_bytes => b.end = t.at.end,
            _ => out.push(t.at.clone()),
        }
    }
    out
}

/// One rank of a data-parallel job: the model replica, its buckets' all-reduce plans, the data.
pub struct Trainer<'t> {
    pub mlp: Mlp,
    pub lr: f32,
    pub rows_per_rank: usize,
    pub how: Schedule,
    t: &'t dyn Transport,
    buckets: Vec<std::ops::Range<usize>>,
    plans: Vec<Ring<'t>>,
    pub grads: Vec<f32>,
    data: Data,
}

impl<'t> Trainer<'t> {
    /// Collective (the all-reduce plans are agreed by every rank).
    pub fn new(t: &'t dyn Transport, dims: &[usize], rows_per_rank: usize, lr: f32, how: Schedule, seed: u64) -> Result<Self> {
        if dims.len() < 2 || rows_per_rank == 0 {
            return Err(LabError::shape("mlp", "needs at least two layer widths and one row per rank"));
        }
        let mlp = Mlp::new(dims, seed);
        let buckets = buckets(&mlp.tensors(), how.bucket_bytes);
        let plans = buckets.iter().map(|b| Ring::new(t, b.len(), DType::F32, Algorithm::SendRecv)).collect::<Result<_>>()?;
        let grads = vec![0.0; mlp.params.len()];
        let data = Data::new(dims[0], dims[dims.len() - 1], seed);
        Ok(Trainer { mlp, lr, rows_per_rank, how, t, buckets, plans, grads, data })
    }

    pub fn buckets(&self) -> &[std::ops::Range<usize>] {
        &self.buckets
    }

    /// One SGD step on this rank's shard of step `step`'s global batch; returns the global loss
    /// (summed over ranks).
    pub fn step(&mut self, step: usize) -> Result<f64> {
        let loss = self.gradients(step, true)?;
        let lr = self.lr;
        self.mlp.params.par_iter_mut().zip(&self.grads).for_each(|(p, g)| *p -= lr * g);
        let mut total = [loss as f32];
        super::ring::all_reduce(self.t, &mut total, Algorithm::SendRecv)?;
        Ok(total[0] as f64)
    }

    /// Forward and backward on this rank's shard of step `step` into [`Trainer::grads`], reduced
    /// over ranks when `reduce`; returns this rank's share of the loss. Parameters are unchanged.
    pub fn gradients(&mut self, step: usize, reduce: bool) -> Result<f64> {
        let (r, n, b) = (self.t.rank(), self.t.size(), self.rows_per_rank);
        let (x, target) = self.data.rows(step, r * b..(r + 1) * b);
        let acts = self.mlp.forward(&x, b);
        let (loss, dy) = mse(acts.last().unwrap(), &target, b * n, self.data.dims.1);
        self.backward_and_reduce(&acts, dy, reduce)?;
        Ok(loss)
    }

    /// Backward pass into the flat gradient buffer; each bucket is handed to the communication
    /// thread when complete (overlap), or all are reduced after the pass (or none: `!reduce`).
    fn backward_and_reduce(&mut self, acts: &[Vec<f32>], dy: Vec<f32>, reduce: bool) -> Result<()> {
        let tensors = self.mlp.tensors();
        let (mlp, rows, overlap) = (&self.mlp, self.rows_per_rank, self.how.overlap);
        let (plans, buckets) = (&mut self.plans, &self.buckets);
        // Bucket slices of the flat gradient buffer, in backward order.
        let mut slices: Vec<&mut [f32]> = Vec::new();
        let mut rest: &mut [f32] = &mut self.grads;
        for bk in buckets {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(bk.len());
            slices.push(head);
            rest = tail;
        }
        std::thread::scope(|s| -> Result<()> {
            let (tx, rx) = std::sync::mpsc::channel::<(usize, &mut [f32])>();
            let comm = s.spawn(move || -> Result<()> {
                for (i, g) in rx {
                    plans[i].all_reduce(g)?;
                }
                Ok(())
            });
            let mut back = Backward { mlp, acts, rows, layer: mlp.dims.len() - 2, dy };
            let mut done = Vec::new();
            for (i, (slice, bk)) in slices.into_iter().zip(buckets).enumerate() {
                for t in tensors.iter().filter(|t| t.at.start >= bk.start && t.at.end <= bk.end) {
                    back.grad(t, &mut slice[t.at.start - bk.start..t.at.end - bk.start]);
                }
                if !reduce {
                    continue;
                }
                if overlap {
                    tx.send((i, slice)).map_err(|_| LabError::Invalid("the communication thread stopped".into()))?;
                } else {
                    done.push((i, slice));
                }
            }
            for d in done {
                tx.send(d).map_err(|_| LabError::Invalid("the communication thread stopped".into()))?;
            }
            drop(tx);
            comm.join().expect("communication thread panicked")
        })
    }
}

/// The backward pass, one layer at a time: dL/dy of the current layer's output, pushed down a
/// layer when a tensor of a lower layer is asked for.
struct Backward<'a> {
    mlp: &'a Mlp,
    acts: &'a [Vec<f32>],
    rows: usize,
    layer: usize,
    dy: Vec<f32>,
}

impl Backward<'_> {
    fn grad(&mut self, t: &Tensor, out: &mut [f32]) {
        while self.layer > t.layer {
            self.down();
        }
        let (fi, fo) = (self.mlp.dims[t.layer], self.mlp.dims[t.layer + 1]);
        let (x, dy, rows) = (&self.acts[t.layer], &self.dy, self.rows);
        if t.bias {
            out.par_iter_mut().enumerate().for_each(|(o, g)| *g = (0..rows).map(|i| dy[i * fo + o]).sum());
        } else {
            // dW[o] = sum_i dy[i][o] x[i]
            out.par_chunks_mut(fi).enumerate().for_each(|(o, g)| {
                g.fill(0.0);
                for i in 0..rows {
                    let d = dy[i * fo + o];
                    g.iter_mut().zip(&x[i * fi..(i + 1) * fi]).for_each(|(g, x)| *g += d * x);
                }
            });
        }
    }

    /// dL/dx = dy W, masked by the ReLU of the layer below.
    fn down(&mut self) {
        let l = self.layer;
        let (fi, fo) = (self.mlp.dims[l], self.mlp.dims[l + 1]);
        let (w, _) = self.mlp.layer(l);
        let mut dx = vec![0.0f32; self.rows * fi];
        let (dy, below) = (&self.dy, &self.acts[l]);
        dx.par_chunks_mut(fi).enumerate().for_each(|(i, dxr)| {
            for o in 0..fo {
                let d = dy[i * fo + o];
                dxr.iter_mut().zip(&w[o * fi..(o + 1) * fi]).for_each(|(a, w)| *a += d * w);
            }
            // The input of layer l is the ReLU output of layer l-1: no gradient where it was cut.
            dxr.iter_mut().zip(&below[i * fi..(i + 1) * fi]).for_each(|(a, h)| {
                if *h <= 0.0 {
                    *a = 0.0
                }
            });
        });
        self.dy = dx;
        self.layer -= 1;
    }
}

/// Single-process training on the whole global batch: the reference the data-parallel run must
/// follow. Returns the loss of every step and the final parameters.
pub fn train_single(dims: &[usize], global_rows: usize, lr: f32, steps: usize, seed: u64) -> Result<(Vec<f64>, Vec<f32>)> {
    let t = super::transport::Threads::world(1).pop().unwrap();
    let how = Schedule { bucket_bytes: usize::MAX, overlap: false };
    let mut tr = Trainer::new(&t, dims, global_rows, lr, how, seed)?;
    let losses = (0..steps).map(|s| tr.step(s)).collect::<Result<_>>()?;
    Ok((losses, tr.mlp.params))
}

/// Data-parallel training on `t`: every rank's losses (global) and final parameters.
pub fn train_parallel(t: &dyn Transport, dims: &[usize], rows_per_rank: usize, lr: f32, steps: usize, how: Schedule, seed: u64) -> Result<(Vec<f64>, Vec<f32>)> {
    let mut tr = Trainer::new(t, dims, rows_per_rank, lr, how, seed)?;
    let losses = (0..steps).map(|s| tr.step(s)).collect::<Result<_>>()?;
    Ok((losses, tr.mlp.params))
}

/// Losses agree when each is within `rtol` of the reference's.
pub fn losses_match(got: &[f64], want: &[f64], rtol: f64) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(a, b)| (a - b).abs() <= rtol * b.abs())
}

/// Loss curves must match to this relative tolerance: the sums are the same up to their order
/// (f32), over a few steps.
pub const LOSS_RTOL: f64 = 1e-4;

/// The learning rate of the `bucketing` experiment and of the tests.
pub const LR: f32 = 0.5;

/// Gate tolerance: f32 sums in another order over a few SGD steps.
pub const GATE_TOL: Tolerance = Tolerance { atol: 1e-5, rtol: LOSS_RTOL };

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::transport::run_threads;

    fn check(n: usize, bucket_bytes: usize, overlap: bool) {
        let (dims, rows, steps) = ([24usize, 40, 32, 8], 3, 6);
        let (want_losses, want_params) = train_single(&dims, rows * n, LR, steps, 5).unwrap();
        let how = Schedule { bucket_bytes, overlap };
        let out = run_threads(n, |t| train_parallel(t, &dims, rows, LR, steps, how, 5)).unwrap();
        for (r, (losses, params)) in out.iter().enumerate() {
            assert!(losses_match(losses, &want_losses, LOSS_RTOL), "n={n} {how:?} rank {r}: {losses:?} vs {want_losses:?}");
            let e = crate::ops::compare::compare(&crate::ops::widen(params), &crate::ops::widen(&want_params), GATE_TOL, "single");
            assert!(e.passed(), "n={n} {how:?} rank {r}: {e:?}");
            assert_eq!(params, &out[0].1, "replicas diverged");
        }
    }

    #[test]
    fn data_parallel_training_follows_single_process_training() {
        for n in [1, 2, 3] {
            for bytes in [1, 2000, 1 << 30] {
                for overlap in [true, false] {
                    check(n, bytes, overlap);
                }
            }
        }
    }

    #[test]
    fn gradient_descent_on_one_batch_lowers_its_loss() {
        let t = super::super::transport::Threads::world(1).pop().unwrap();
        let how = Schedule { bucket_bytes: 256, overlap: true };
        let mut tr = Trainer::new(&t, &[24, 40, 32, 8], 6, LR, how, 3).unwrap();
        let losses: Vec<f64> = (0..20).map(|_| tr.step(0).unwrap()).collect();
        assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
    }

    #[test]
    fn buckets_are_contiguous_cut_at_tensors_and_cover_every_gradient() {
        let mlp = Mlp::new(&[10, 20, 30, 5], 1);
        let ts = mlp.tensors();
        assert_eq!(ts[0].at.start, 0);
        for bytes in [1, 4 * 30 * 20, 4 * (30 * 20 + 30), usize::MAX] {
            let bs = buckets(&ts, bytes);
            assert_eq!((bs[0].start, bs.last().unwrap().end), (0, mlp.params.len()));
            assert!(bs.windows(2).all(|w| w[0].end == w[1].start));
            assert!(ts.iter().all(|t| bs.iter().any(|b| b.start <= t.at.start && t.at.end <= b.end)), "a tensor was cut");
        }
        assert_eq!(buckets(&ts, 1).len(), ts.len());
        assert_eq!(buckets(&ts, usize::MAX).len(), 1);
        // The last layer's weight and bias (5x30 + 5 floats) fit 620 bytes; the next tensor does not.
        assert_eq!(buckets(&ts, 620)[0], 0..155);
    }

    #[test]
    fn gradients_match_finite_differences() {
        let dims = [5, 7, 3];
        let t = super::super::transport::Threads::world(1).pop().unwrap();
        let how = Schedule { bucket_bytes: 64, overlap: true };
        let mut tr = Trainer::new(&t, &dims, 4, 0.0, how, 9).unwrap();
        let loss0 = tr.gradients(0, true).unwrap();
        let g = tr.grads.clone();
        for i in [0usize, 3, 20, 22, 30, g.len() - 1] {
            let h = 1e-2f32;
            let p = tr.mlp.params[i];
            tr.mlp.params[i] = p + h;
            let up = tr.gradients(0, false).unwrap();
            tr.mlp.params[i] = p - h;
            let down = tr.gradients(0, false).unwrap();
            tr.mlp.params[i] = p;
            let fd = (up - down) / (2.0 * h as f64);
            assert!((fd - g[i] as f64).abs() <= 2e-3 * (1.0 + fd.abs()), "param {i}: {fd} vs {} (loss {loss0})", g[i]);
        }
    }
}
