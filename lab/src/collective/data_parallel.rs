//! Data-parallel training of [`super::bucket`]'s MLP on a [`Group`]: every rank holds a replica
//! (layers through `ops::linear`: cuBLAS and the lab's epilogues on a GPU, the CPU path on the
//! host), takes its rows of the global batch, and the gradients are summed across ranks in
//! buckets (the flat layout and the bucket cuts of `bucket`), by ncclAllReduce or by the lab's
//! ring over NCCL send/recv ([`Reducer`]); on the host by the lab's ring on threads.
//!
//! With overlap, a bucket's sum is queued on the comm streams as soon as the backward pass has
//! written its last gradient, while the pass goes on with the layers below on the compute
//! streams; without, every bucket waits for the whole pass. The ring's adds run on the compute
//! stream (`super::nccl`), so its buckets overlap the backward pass less than NCCL's do.
//!
//! The loss and its gradient are computed on the host from each rank's output (a few KB).

use super::bucket::{buckets, mse, Data, Mlp, Schedule, Tensor as Param};
use super::group::{copy_block, Block, Group};
use super::nccl::{ring_all_reduce, PeerRing, RingBufs};
use super::plan::RingPlan;
use crate::error::Doing;
use crate::experiment::Backend;
use crate::kernels::{symbol, DType};
use crate::ops::linear::{backward, forward, Act, BackwardScratch};
use crate::tensor::Tensor;
use crate::{LabError, Result};
use std::ops::Range;

/// What sums a bucket across GPUs (on the host: always the lab's ring on threads): ncclAllReduce,
/// the lab's ring over NCCL send/recv, or the lab's ring over peer loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reducer {
    Nccl,
    Ring,
    PeerRing,
}

impl Reducer {
    pub fn name(self) -> &'static str {
        match self {
            Reducer::Nccl => "nccl",
            Reducer::Ring => "ring",
            Reducer::PeerRing => "ring_peer",
        }
    }
}

/// One rank's replica and its buffers, per layer l: W_l, b_l, pre-activation Z_l, output A_l,
/// the backward's [dX | dW | db] and scratch, and dL/dA_l.
struct Replica {
    w: Vec<Tensor<f32>>,
    b: Vec<Tensor<f32>>,
    x: Tensor<f32>,
    z: Vec<Tensor<f32>>,
    a: Vec<Tensor<f32>>,
    g: Vec<Tensor<f32>>,
    scratch: Vec<BackwardScratch<f32>>,
    dy: Vec<Tensor<f32>>,
}

/// Each rank's inputs and targets.
type Batch = Vec<(Vec<f32>, Vec<f32>)>;

pub struct DataParallel {
    pub g: Group,
    pub dims: Vec<usize>,
    pub rows_per_rank: usize,
    pub lr: f32,
    pub how: Schedule,
    pub reducer: Reducer,
    params: Vec<Param>,
    buckets: Vec<Range<usize>>,
    replicas: Vec<Replica>,
    /// Each rank's flat gradient, in [`Mlp`]'s layout.
    grads: Vec<Tensor<f32>>,
    data: Data,
    /// The last batch drawn: (step, each rank's inputs and targets).
    batch: Option<(usize, Batch)>,
    /// The GPU ring's scratch and events per rank, and its plan per bucket; the peer ring's
    /// kernels and events where it sums.
    ring: Vec<RingBufs<f32>>,
    plans: Vec<RingPlan>,
    peer: Option<PeerRing>,
    /// False: no bucket is summed (the step's compute alone, for timing).
    sum: bool,
    /// A planted fault for the tests: this bucket is never summed.
    pub(crate) skip_bucket: Option<usize>,
}

impl DataParallel {
    /// Replicas of `Mlp::new(dims, seed)` on every rank of `g`.
    pub fn new(g: Group, dims: &[usize], rows_per_rank: usize, lr: f32, how: Schedule, reducer: Reducer, seed: u64) -> Result<Self> {
        if dims.len() < 2 || dims.contains(&0) || rows_per_rank == 0 {
            return Err(LabError::shape("data-parallel mlp", format!("widths {dims:?} and {rows_per_rank} rows per rank: two widths and one row at least, none zero")));
        }
        let mlp = Mlp::new(dims, seed);
        let params = mlp.tensors();
        let bk = buckets(&params, how.bucket_bytes);
        let at = |l: usize, bias: bool| params.iter().find(|p| p.layer == l && p.bias == bias).expect("every layer has W and b").at.clone();
        let rows = rows_per_rank;
        let mut replicas = Vec::new();
        let mut grads = Vec::new();
        for dev in &g.devs {
            let layers = 0..dims.len() - 1;
            let zeros = |shape: &[usize]| Tensor::<f32>::zeros(dev, shape);
            replicas.push(Replica {
                w: layers.clone().map(|l| Tensor::from_slice(dev, &[dims[l + 1], dims[l]], &mlp.params[at(l, false)])).collect::<Result<_>>()?,
                b: layers.clone().map(|l| Tensor::from_slice(dev, &[dims[l + 1]], &mlp.params[at(l, true)])).collect::<Result<_>>()?,
                x: zeros(&[rows, dims[0]])?,
                z: layers.clone().map(|l| zeros(&[rows, dims[l + 1]])).collect::<Result<_>>()?,
                a: layers.clone().map(|l| zeros(&[rows, dims[l + 1]])).collect::<Result<_>>()?,
                g: layers.clone().map(|l| zeros(&[rows * dims[l] + dims[l + 1] * dims[l] + dims[l + 1]])).collect::<Result<_>>()?,
                scratch: layers.clone().map(|l| BackwardScratch::new(dev, rows, dims[l + 1])).collect::<Result<_>>()?,
                dy: layers.map(|l| zeros(&[rows, dims[l + 1]])).collect::<Result<_>>()?,
            });
            grads.push(zeros(&[mlp.params.len()])?);
        }
        let (mut ring, mut plans, mut peer) = (Vec::new(), Vec::new(), None);
        if let (Reducer::Ring | Reducer::PeerRing, Some(w)) = (reducer, &g.world) {
            // The ring's add loads 16 bytes at a time from the bucket's start.
            if let Some(b) = bk.iter().find(|b| b.start % 4 != 0) {
                return Err(LabError::shape("data-parallel mlp", format!("the ring needs every bucket to start on 4 floats; widths {dims:?} start one at {}", b.start)));
            }
            plans = bk.iter().map(|b| RingPlan::new(b.len(), g.size(), None, 4)).collect();
            // The peer ring reads its neighbour's gradient in place and needs no scratch.
            let scratch = if reducer == Reducer::PeerRing { 1 } else { plans.iter().map(RingPlan::max_chunk).max().unwrap_or(1).max(1) };
            if reducer == Reducer::PeerRing {
                peer = Some(PeerRing::new(w)?);
            }
            for r in &w.ranks {
                let stream = &r.gpu.stream;
                let event = || r.gpu.ctx.new_event(None).doing("creating an event");
                ring.push(RingBufs {
                    // Stands in for the rank's gradient, which is swapped in for each bucket's sum.
                    x: stream.alloc_zeros::<f32>(1).doing("allocating")?,
                    scratch: stream.alloc_zeros::<f32>(scratch).doing("allocating the ring's scratch")?,
                    landed: vec![event()?],
                    added: vec![event()?],
                    add: r.gpu.function("collective", &symbol("collective", "add", DType::F32))?,
                });
            }
        }
        let data = Data::new(dims[0], dims[dims.len() - 1], seed);
        Ok(DataParallel { g, dims: dims.to_vec(), rows_per_rank, lr, how, reducer, params, buckets: bk, replicas, grads, data, batch: None, ring, plans, peer, sum: true, skip_bucket: None })
    }

    /// Leaves every gradient unsummed from now on: the step without communication.
    pub fn skip_all_buckets(&mut self) {
        self.sum = false;
    }

    pub fn buckets(&self) -> &[Range<usize>] {
        &self.buckets
    }

    fn param(&self, l: usize, bias: bool) -> Range<usize> {
        self.params.iter().find(|p| p.layer == l && p.bias == bias).expect("every layer has W and b").at.clone()
    }

    /// Queues the sum of bucket `i` across ranks.
    fn reduce(&mut self, i: usize) -> Result<()> {
        if !self.sum || self.skip_bucket == Some(i) {
            return Ok(());
        }
        let range = self.buckets[i].clone();
        match (&self.g.world, self.reducer) {
            (Some(w), Reducer::Ring | Reducer::PeerRing) => {
                for r in &w.ranks {
                    r.comm_stream.join(&r.gpu.stream).doing("ordering a bucket's sum after its gradients")?;
                }
                let swap = |grads: &mut [Tensor<f32>], ring: &mut [RingBufs<f32>]| {
                    for (g, b) in grads.iter_mut().zip(ring.iter_mut()) {
                        std::mem::swap(g.cuda_mut().expect("a GPU rank's gradient is on it"), &mut b.x);
                    }
                };
                swap(&mut self.grads, &mut self.ring);
                // The peer ring runs on the comm streams, so that the backward goes on beside it.
                let summed = match &self.peer {
                    Some(peer) => peer.all_reduce(w, &self.plans[i], &mut self.ring, range.start, true),
                    None => ring_all_reduce(w, &self.plans[i], &mut self.ring, range.start),
                };
                swap(&mut self.grads, &mut self.ring);
                summed
            }
            _ => self.g.all_reduce_queued(&mut self.grads, range),
        }
    }

    /// One SGD step on step `step`'s global batch (each rank its rows); returns the global loss.
    pub fn step(&mut self, step: usize) -> Result<f64> {
        let (n, rows, layers) = (self.g.size(), self.rows_per_rank, self.dims.len() - 1);
        if self.batch.as_ref().is_none_or(|(s, _)| *s != step) {
            let data = &self.data;
            self.batch = Some((step, (0..n).map(|r| data.rows(step, r * rows..(r + 1) * rows)).collect()));
        }
        let batch = &self.batch.as_ref().expect("drawn above").1;
        let act = |l: usize| if l + 1 < layers { Act::Relu } else { Act::None };
        for ((rep, dev), (x, _)) in self.replicas.iter_mut().zip(&self.g.devs).zip(batch) {
            rep.x.copy_from(&Tensor::from_vec(&[rows, self.dims[0]], x.clone())?)?;
            for l in 0..layers {
                let (done, rest) = rep.a.split_at_mut(l);
                let input = if l == 0 { &rep.x } else { &done[l - 1] };
                forward(dev, input, &rep.w[l], &rep.b[l], &mut rep.z[l], &mut rest[0], act(l))?;
            }
        }
        let mut loss = 0.0;
        let outputs = self.dims[layers];
        for (rep, (_, target)) in self.replicas.iter_mut().zip(batch) {
            let (l, dy) = mse(&rep.a[layers - 1].to_vec()?, target, rows * n, outputs);
            loss += l;
            rep.dy[layers - 1].copy_from(&Tensor::from_vec(&[rows, outputs], dy)?)?;
        }
        // Backward, last layer first; a bucket is queued as soon as its last gradient is written.
        let mut queued = 0;
        for l in (0..layers).rev() {
            let (fan_in, fan_out) = (self.dims[l], self.dims[l + 1]);
            let (wat, len) = (self.param(l, false).start, fan_out * fan_in + fan_out);
            for ((rep, dev), grads) in self.replicas.iter_mut().zip(&self.g.devs).zip(self.grads.iter_mut()) {
                let input = if l == 0 { &rep.x } else { &rep.a[l - 1] };
                backward(dev, input, &rep.w[l], &rep.z[l], &rep.dy[l], act(l), &mut rep.g[l], &mut rep.scratch[l])?;
                // [dX | dW | db]: dW and db are W_l and b_l's place in the flat gradient; dX is
                // the gradient of the layer below's output.
                copy_block(dev, &rep.g[l], Block { at: rows * fan_in, pitch: len }, grads, Block { at: wat, pitch: len }, (1, len))?;
                if l > 0 {
                    let dx = rows * fan_in;
                    copy_block(dev, &rep.g[l], Block { at: 0, pitch: dx }, &mut rep.dy[l - 1], Block { at: 0, pitch: dx }, (1, dx))?;
                }
            }
            while self.how.overlap && queued < self.buckets.len() && self.buckets[queued].end <= wat + len {
                self.reduce(queued)?;
                queued += 1;
            }
        }
        while queued < self.buckets.len() {
            self.reduce(queued)?;
            queued += 1;
        }
        self.g.join()?;
        for l in 0..layers {
            let (wr, br) = (self.param(l, false), self.param(l, true));
            for ((rep, dev), grads) in self.replicas.iter_mut().zip(&self.g.devs).zip(&self.grads) {
                axpy(dev, -self.lr, grads, wr.start, &mut rep.w[l])?;
                axpy(dev, -self.lr, grads, br.start, &mut rep.b[l])?;
            }
        }
        Ok(loss)
    }

    /// Every rank's parameters, in [`Mlp`]'s flat layout.
    pub fn params(&self) -> Result<Vec<Vec<f32>>> {
        let count = Mlp::count(&self.dims);
        self.replicas
            .iter()
            .map(|rep| {
                let mut flat = vec![0.0; count];
                for p in &self.params {
                    let t = if p.bias { &rep.b[p.layer] } else { &rep.w[p.layer] };
                    flat[p.at.clone()].copy_from_slice(&t.to_vec()?);
                }
                Ok(flat)
            })
            .collect()
    }
}

/// y += alpha x[at..at + y.len()] (cuBLAS saxpy on a GPU).
fn axpy(dev: &Backend, alpha: f32, x: &Tensor<f32>, at: usize, y: &mut Tensor<f32>) -> Result<()> {
    let len = y.len();
    if at + len > x.len() {
        return Err(LabError::shape("axpy", format!("elements {at}..{} of a tensor of {}", at + len, x.len())));
    }
    match dev {
        Backend::Cpu => {
            let (x, y) = (x.host().expect("a host rank's tensor"), y.host_mut().expect("a host rank's tensor"));
            y.iter_mut().zip(&x[at..at + len]).for_each(|(y, x)| *y += alpha * x);
            Ok(())
        }
        Backend::Cuda(gpu) => {
            use cudarc::driver::{DevicePtr, DevicePtrMut};
            let blas = gpu.blas()?;
            let (xp, _) = x.cuda().expect("a GPU rank's tensor").device_ptr(&gpu.stream);
            let (yp, _) = y.cuda_mut().expect("a GPU rank's tensor").device_ptr_mut(&gpu.stream);
            // SAFETY: x holds at + len floats and y len, on the handle's stream; alpha is a host
            // scalar (cuBLAS's default pointer mode).
            unsafe { cudarc::cublas::sys::cublasSaxpy_v2(*blas.handle(), len as i32, &alpha, (xp + 4 * at as u64) as *const f32, 1, yp as *mut f32, 1) }
                .result()
                .doing("cuBLAS saxpy (the SGD update)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::bucket::{losses_match, train_single, GATE_TOL, LOSS_RTOL, LR};
    use super::*;
    use crate::ops::compare::compare;

    const DIMS: [usize; 4] = [24, 40, 32, 8];

    fn train(n: usize, how: Schedule, steps: usize, skip: Option<usize>) -> (Vec<f64>, Vec<Vec<f32>>) {
        let mut dp = DataParallel::new(Group::host(n).unwrap(), &DIMS, 3, LR, how, Reducer::Nccl, 5).unwrap();
        dp.skip_bucket = skip;
        let losses = (0..steps).map(|s| dp.step(s).unwrap()).collect();
        (losses, dp.params().unwrap())
    }

    fn follows(losses: &[f64], params: &[Vec<f32>], want: &(Vec<f64>, Vec<f32>)) -> bool {
        let same = |p: &Vec<f32>| compare(&crate::ops::widen(p), &crate::ops::widen(&want.1), GATE_TOL, "single").passed();
        losses_match(losses, &want.0, LOSS_RTOL) && params.iter().all(same)
    }

    #[test]
    fn a_host_group_follows_single_process_training_with_any_buckets() {
        for n in [1, 2, 3] {
            let want = train_single(&DIMS, 3 * n, LR, 5, 5).unwrap();
            for bucket_bytes in [1, 2000, usize::MAX] {
                for overlap in [true, false] {
                    let how = Schedule { bucket_bytes, overlap };
                    let (losses, params) = train(n, how, 5, None);
                    assert!(follows(&losses, &params, &want), "n={n} {how:?}: {losses:?} vs {:?}", want.0);
                    assert!(params.iter().all(|p| p == &params[0]), "replicas diverged");
                }
            }
        }
    }

    #[test]
    fn a_bucket_left_unsummed_fails_the_check() {
        let want = train_single(&DIMS, 6, LR, 5, 5).unwrap();
        let how = Schedule { bucket_bytes: 2000, overlap: true };
        let (losses, params) = train(2, how, 5, Some(1));
        assert!(!follows(&losses, &params, &want), "training with a bucket never summed passed");
        // With one rank there is nothing to sum: the same fault is harmless, as it should be.
        let want = train_single(&DIMS, 3, LR, 5, 5).unwrap();
        let (losses, params) = train(1, how, 5, Some(1));
        assert!(follows(&losses, &params, &want));
    }
}
