//! All-reduce across the GPUs of one host: NCCL's own all-reduce beside the lab's ring, whose
//! segments travel by NCCL send/recv between device buffers and are summed by
//! `kernels/collective.cu`. One process drives every GPU (`ncclCommInitAll`, grouped calls).
//!
//! The ring follows a [`RingPlan`]. Each GPU has two streams: NCCL's transfers run on a comm
//! stream, the adds on the GPU's own stream; events carry the plan's two dependencies (an add
//! waits for its segment to arrive; a later send of that segment waits for its add). With one
//! segment per chunk (`ring_p2p`) every add sits between two transfers; `ring_p2p_pipelined`
//! cuts chunks into segments so the add of one overlaps the transfer of the next.
//!
//! The `nccl_allreduce` experiment that measures both is [`crate::ops::nccl_allreduce`].

use super::plan::RingPlan;
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::ops::Elem;
use crate::{LabError, Result};
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nccl::safe::{Comm, NcclType, ReduceOp};
use std::sync::Arc;

/// The longest wait for an all-reduce (a 1 GiB one takes milliseconds).
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// One GPU of the ring: its runtime (whose stream runs the adds) and the stream NCCL runs on.
pub(crate) struct Rank {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) comm_stream: Arc<CudaStream>,
}

/// Every GPU of the ring, with its NCCL communicator.
pub(crate) struct World {
    pub(crate) ranks: Vec<Rank>,
    pub(crate) comms: Vec<Comm>,
}

impl World {
    pub(crate) fn open(first: &Arc<Gpu>, n: usize) -> Result<World> {
        let mut ranks = Vec::with_capacity(n);
        for i in 0..n {
            let gpu = if i == 0 { first.clone() } else { Gpu::new(i)? };
            let comm_stream = gpu.ctx.new_stream().doing("creating a stream for NCCL")?;
            ranks.push(Rank { gpu, comm_stream });
        }
        let comms = Comm::from_devices(ranks.iter().map(|r| r.comm_stream.clone()).collect()).map_err(nccl_error("creating the communicators"))?;
        Ok(World { ranks, comms })
    }

    /// Waits for both streams of every GPU, or fails after [`DEADLINE`]: a transfer whose
    /// partner was never issued would otherwise hang the run.
    pub(crate) fn sync(&self) -> Result<()> {
        use cudarc::driver::sys::{cuStreamQuery, CUresult};
        let start = std::time::Instant::now();
        for (i, r) in self.ranks.iter().enumerate() {
            r.gpu.ctx.bind_to_thread().doing("binding a context")?;
            for stream in [&r.comm_stream, &r.gpu.stream] {
                loop {
                    // SAFETY: a live stream of the bound context.
                    match unsafe { cuStreamQuery(stream.cu_stream()) } {
                        CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < DEADLINE => std::hint::spin_loop(),
                        CUresult::CUDA_ERROR_NOT_READY => {
                            return Err(LabError::Invalid(format!("GPU {i} did not finish within {DEADLINE:?}: an NCCL send or receive without its partner?")))
                        }
                        q => break q.result().doing("waiting for a stream (a kernel or NCCL may have failed)")?,
                    }
                }
            }
        }
        Ok(())
    }
}

pub(crate) fn nccl_error(doing: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> LabError {
    move |e| LabError::Invalid(format!("NCCL failed while {doing}: {e:?}"))
}

/// Runs `f` between ncclGroupStart and ncclGroupEnd: one thread drives every rank, so each
/// round of calls must be grouped or the first blocking call would wait for ranks not yet issued.
fn grouped(f: impl FnOnce() -> Result<()>) -> Result<()> {
    cudarc::nccl::safe::group_start().map_err(nccl_error("starting a group"))?;
    let r = f();
    cudarc::nccl::safe::group_end().map_err(nccl_error("ending a group"))?;
    r
}

/// Buffers and events of one rank for the ring.
pub(crate) struct RingBufs<T> {
    pub(crate) x: CudaSlice<T>,
    pub(crate) scratch: CudaSlice<T>,
    /// Per segment: its transfer landed (recorded on the comm stream) / its add is done.
    pub(crate) landed: Vec<CudaEvent>,
    pub(crate) added: Vec<CudaEvent>,
    pub(crate) add: CudaFunction,
}

/// The lab's ring: the plan's phases, one grouped NCCL round each, adds on the compute streams.
// Rank r indexes its communicator, its buffers and its phase together.
#[allow(clippy::needless_range_loop)]
pub(crate) fn ring_all_reduce<T: Elem + NcclType>(w: &World, plan: &RingPlan, bufs: &mut [RingBufs<T>]) -> Result<()> {
    let n = w.ranks.len();
    for phase in plan.phases() {
        let k = phase.segment;
        if !(phase.reduce && phase.step == 0) {
            for (rank, b) in w.ranks.iter().zip(bufs.iter()) {
                rank.comm_stream.wait(&b.added[k]).doing("ordering a send after its add")?;
            }
        }
        grouped(|| {
            for r in 0..n {
                // Empty segments are skipped on both sides: the receiver sees the same range.
                if let Some(out) = phase.outgoing(r) {
                    w.comms[r].send(&bufs[r].x.slice(out.range.clone()), ((r + 1) % n) as i32).map_err(nccl_error("sending a segment"))?;
                }
                let Some(incoming) = phase.incoming(r) else { continue };
                let (from, b) = (((r + n - 1) % n) as i32, &mut bufs[r]);
                if phase.reduce {
                    let mut dst = b.scratch.slice_mut(incoming.in_chunk..incoming.in_chunk + incoming.range.len());
                    w.comms[r].recv(&mut dst, from).map_err(nccl_error("receiving a segment"))?;
                } else {
                    w.comms[r].recv(&mut b.x.slice_mut(incoming.range.clone()), from).map_err(nccl_error("receiving a segment"))?;
                }
            }
            Ok(())
        })?;
        if !phase.reduce {
            continue;
        }
        for (r, (rank, b)) in w.ranks.iter().zip(bufs.iter_mut()).enumerate() {
            let Some(incoming) = phase.incoming(r).cloned() else { continue };
            let len = incoming.range.len();
            let stream = &rank.gpu.stream;
            b.landed[k].record(&rank.comm_stream).doing("recording a transfer")?;
            stream.wait(&b.landed[k]).doing("ordering an add after its transfer")?;
            let words = len / (16 / T::DTYPE.size());
            let cfg = LaunchConfig { grid_dim: (words.div_ceil(256).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let mut acc = b.x.slice_mut(incoming.range);
            let x = b.scratch.slice(incoming.in_chunk..incoming.in_chunk + len);
            let nn = len as i64;
            // SAFETY: acc and x hold `len` elements; the kernel bounds every access by n.
            unsafe { stream.launch_builder(&b.add).arg(&mut acc).arg(&x).arg(&nn).launch(cfg) }.doing("launching the ring's add")?;
            b.added[k].record(stream).doing("recording an add")?;
        }
    }
    Ok(())
}

/// NCCL's all-reduce, in place, on every GPU.
pub(crate) fn nccl_all_reduce<T: Elem + NcclType>(w: &World, bufs: &mut [RingBufs<T>]) -> Result<()> {
    grouped(|| {
        for (comm, b) in w.comms.iter().zip(bufs.iter_mut()) {
            comm.all_reduce_in_place(&mut b.x, &ReduceOp::Sum).map_err(nccl_error("issuing ncclAllReduce"))?;
        }
        Ok(())
    })
}
