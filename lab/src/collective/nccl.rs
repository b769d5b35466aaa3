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
//! The peer ring (`ring_peer`, [`PeerRing`]) follows the same plan without NCCL: each
//! rank's kernel reads its predecessor's segment straight from that GPU's memory (peer access over
//! NVLink) and adds it in, or copies it in the all-gather; events between neighbours order it.
//!
//! The `nccl_allreduce` experiment that measures both is [`crate::ops::nccl_allreduce`].

use super::plan::RingPlan;
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::ops::Elem;
use crate::{LabError, Result};
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nccl::safe::{Comm, NcclType, ReduceOp};
use std::rc::Rc;
use std::sync::Arc;

/// NCCL's device kernels (`ncclDevKernel_*`, `ncclKernel_*` in older releases), as a regex searched
/// in kernel names: compute-sanitizer leaves them uninstrumented where an experiment launches
/// them beside the lab's kernels. Under memcheck on four GPUs they drew reports on their
/// peer-memory protocols and then a launch failure, so nothing of the lab's was checked; the
/// lab's kernels are named for their family and contain no `nccl`. (`.*` on both sides: the
/// same kernels whether the tool searches the name or matches it whole.)
pub const NCCL_KERNELS: &str = ".*nccl.*";

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
    /// Why some GPU cannot load from another's memory (`ring_peer` cannot run), if so.
    pub(crate) no_peer_access: Option<String>,
}

/// The world sizes a scaling sweep visits on a host of `count` GPUs: 1, each power of two below
/// `count`, and `count` itself.
pub fn world_sizes(count: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = std::iter::successors(Some(1usize), |n| Some(n * 2)).take_while(|&n| n < count).collect();
    if count >= 1 {
        sizes.push(count);
    }
    sizes
}

/// GPUs usable for NCCL on `backend`, or why there are none.
pub fn gpus_for_nccl(backend: &crate::experiment::Backend) -> std::result::Result<usize, String> {
    let crate::experiment::Backend::Cuda(_) = backend else { return Err("the CPU backend".into()) };
    // SAFETY: only probes the dynamic loader.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err("no NCCL library (libnccl.so.2) found".into());
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n >= 2 => Ok(n as usize),
        Ok(n) => Err(format!("{n} GPU(s); NCCL needs at least 2")),
        Err(e) => Err(format!("cannot count GPUs ({e:?})")),
    }
}

thread_local! {
    /// Worlds already opened on this thread, by size and first GPU: a communicator takes up to
    /// seconds to set up, and a sweep asks for the same few worlds case after case. Never dropped
    /// (`ManuallyDrop`): NCCL's teardown must not run from a destructor at process exit.
    static WORLDS: std::cell::RefCell<std::mem::ManuallyDrop<Vec<Rc<World>>>> = Default::default();
}

/// The world of GPUs 0..n with `first` as GPU 0, opened once per thread.
pub(crate) fn world(first: &Arc<Gpu>, n: usize) -> Result<Rc<World>> {
    if let Some(w) = WORLDS.with_borrow(|ws| ws.iter().find(|w| w.ranks.len() == n && Arc::ptr_eq(&w.ranks[0].gpu, first)).cloned()) {
        return Ok(w);
    }
    let w = Rc::new(World::open(first, n)?);
    WORLDS.with_borrow_mut(|ws| ws.push(w.clone()));
    Ok(w)
}

impl World {
    /// Opens GPUs 0..n (`first` is GPU 0) and their communicators; see also [`world`].
    pub(crate) fn open(first: &Arc<Gpu>, n: usize) -> Result<World> {
        let count = cudarc::driver::CudaContext::device_count().doing("counting GPUs")? as usize;
        if n < 2 || n > count {
            return Err(LabError::Invalid(format!("an NCCL world of {n} GPUs: this host has {count} (at least 2 are needed)")));
        }
        // NCCL reads its environment at its first call.
        let _ = super::nccl_log::prepare_env();
        let mut ranks = Vec::with_capacity(n);
        for i in 0..n {
            let gpu = if i == 0 { first.clone() } else { Gpu::new(i)? };
            let comm_stream = gpu.ctx.new_stream().doing("creating a stream for NCCL")?;
            ranks.push(Rank { gpu, comm_stream });
        }
        let no_peer_access = enable_peer_access(&ranks)?;
        let comms = Comm::from_devices(ranks.iter().map(|r| r.comm_stream.clone()).collect()).map_err(nccl_error("creating the communicators"))?;
        Ok(World { ranks, comms, no_peer_access })
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

/// Lets every GPU of the world load from every other's memory, once per ordered pair per process,
/// before NCCL opens the world: NCCL enables the same pairs and is told they already are; were the
/// lab second, its own call would fail that way, an API error the sanitizer charges to the lab.
/// Buffers come from each GPU's memory pool (stream-ordered allocation), which peer access between
/// contexts does not open: the pool grants the peer access of its own (without it the peer ring's
/// first load was an illegal address). Returns why some pair cannot reach the other, if one cannot.
fn enable_peer_access(ranks: &[Rank]) -> Result<Option<String>> {
    use cudarc::driver::sys::{cuCtxEnablePeerAccess, cuDeviceCanAccessPeer, cuDeviceGetMemPool, cuMemPoolSetAccess, CUmemAccessDesc, CUmemAccess_flags, CUmemLocation, CUmemLocationType};
    static ENABLED: std::sync::Mutex<std::collections::BTreeSet<(i32, i32)>> = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut enabled = ENABLED.lock().unwrap_or_else(|e| e.into_inner());
    let mut missing = None;
    for a in ranks {
        for b in ranks {
            let (da, db) = (a.gpu.ctx.cu_device(), b.gpu.ctx.cu_device());
            if da == db || enabled.contains(&(da, db)) {
                continue;
            }
            let mut can = 0;
            // SAFETY: plain out-parameter; both devices exist (their contexts do).
            unsafe { cuDeviceCanAccessPeer(&mut can, da, db) }.result().doing("asking whether one GPU can reach another's memory")?;
            if can == 0 {
                missing.get_or_insert_with(|| format!("GPU {da} cannot load from GPU {db}'s memory (no peer access)"));
                continue;
            }
            a.gpu.ctx.bind_to_thread().doing("binding a context")?;
            // SAFETY: both contexts are live; the pair was never enabled by this process.
            unsafe { cuCtxEnablePeerAccess(b.gpu.ctx.cu_ctx(), 0) }.result().doing("enabling peer access between GPUs")?;
            let mut pool = std::ptr::null_mut();
            // SAFETY: plain out-parameter for a live device.
            unsafe { cuDeviceGetMemPool(&mut pool, db) }.result().doing("reading a GPU's memory pool")?;
            let access = CUmemAccessDesc {
                location: CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: da },
                flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: one valid descriptor for the pool just read.
            unsafe { cuMemPoolSetAccess(pool, &access, 1) }.result().doing("opening a GPU's memory pool to a peer")?;
            enabled.insert((da, db));
        }
    }
    Ok(missing)
}

pub(crate) fn nccl_error(doing: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> LabError {
    move |e| LabError::Invalid(format!("NCCL failed while {doing}: {e:?}"))
}

/// Runs `f` between ncclGroupStart and ncclGroupEnd: one thread drives every rank, so each
/// round of calls must be grouped or the first blocking call would wait for ranks not yet issued.
pub(crate) fn grouped(f: impl FnOnce() -> Result<()>) -> Result<()> {
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

/// The launch of kernels/collective.cu's kernels over `bytes`: one thread per whole 16-byte word
/// (at least one block, whose first threads also take the tail).
fn word_per_thread(bytes: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((bytes / 16).div_ceil(256).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// The lab's ring: the plan's phases, one grouped NCCL round each, adds on the compute streams.
// Rank r indexes its communicator, its buffers and its phase together.
#[allow(clippy::needless_range_loop)]
/// The plan covers elements `base..base + plan.len` of each rank's `x`.
pub(crate) fn ring_all_reduce<T: Elem + NcclType>(w: &World, plan: &RingPlan, bufs: &mut [RingBufs<T>], base: usize) -> Result<()> {
    let n = w.ranks.len();
    let at = |r: &std::ops::Range<usize>| base + r.start..base + r.end;
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
                    w.comms[r].send(&bufs[r].x.slice(at(&out.range)), ((r + 1) % n) as i32).map_err(nccl_error("sending a segment"))?;
                }
                let Some(incoming) = phase.incoming(r) else { continue };
                let (from, b) = (((r + n - 1) % n) as i32, &mut bufs[r]);
                if phase.reduce {
                    let mut dst = b.scratch.slice_mut(incoming.in_chunk..incoming.in_chunk + incoming.range.len());
                    w.comms[r].recv(&mut dst, from).map_err(nccl_error("receiving a segment"))?;
                } else {
                    w.comms[r].recv(&mut b.x.slice_mut(at(&incoming.range)), from).map_err(nccl_error("receiving a segment"))?;
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
            let cfg = word_per_thread(len * T::DTYPE.size());
            let mut acc = b.x.slice_mut(at(&incoming.range));
            let x = b.scratch.slice(incoming.in_chunk..incoming.in_chunk + len);
            let nn = len as i64;
            // SAFETY: acc and x hold `len` elements; the kernel bounds every access by n.
            unsafe { stream.launch_builder(&b.add).arg(&mut acc).arg(&x).arg(&nn).launch(cfg) }.doing("launching the ring's add")?;
            b.added[k].record(stream).doing("recording an add")?;
        }
    }
    Ok(())
}

/// The peer ring's per-rank copy kernel and event.
pub(crate) struct PeerRing {
    copy: Vec<CudaFunction>,
    done: Vec<CudaEvent>,
}

impl PeerRing {
    pub(crate) fn new(w: &World) -> Result<PeerRing> {
        if let Some(why) = &w.no_peer_access {
            return Err(LabError::Invalid(format!("the peer ring needs every GPU to read its neighbour's memory: {why}")));
        }
        let copy = w.ranks.iter().map(|r| r.gpu.function("collective", "collective_copy")).collect::<Result<_>>()?;
        let done = w.ranks.iter().map(|r| r.gpu.ctx.new_event(None).doing("creating an event")).collect::<Result<_>>()?;
        Ok(PeerRing { copy, done })
    }

    /// The plan's phases over elements `base..base + plan.len` of every rank's `x`, one kernel
    /// per rank each, reading the predecessor's buffer in place, on each GPU's compute stream or
    /// (`on_comm`) its comm stream. `done[r]`, recorded after each of rank r's phases, carries both
    /// orders a phase needs: its predecessor finished writing what it reads, and its successor
    /// finished reading (in the phase before) the range it writes. Recorded once before the first
    /// phase too (the inputs may still be in the making) and waited on after the last (a caller's
    /// next kernel must not overwrite a buffer a neighbour still reads).
    // Rank r indexes its buffers, its event and its phase together.
    #[allow(clippy::needless_range_loop)]
    pub(crate) fn all_reduce<T: Elem>(&self, w: &World, plan: &RingPlan, bufs: &mut [RingBufs<T>], base: usize, on_comm: bool) -> Result<()> {
        use cudarc::driver::DevicePtr;
        let n = w.ranks.len();
        let size = T::DTYPE.size();
        let stream = |r: usize| if on_comm { &w.ranks[r].comm_stream } else { &w.ranks[r].gpu.stream };
        let ptrs: Vec<u64> = (0..n).map(|r| bufs[r].x.device_ptr(stream(r)).0).collect();
        let record_all = || -> Result<()> {
            for r in 0..n {
                self.done[r].record(stream(r)).doing("recording a ring phase")?;
            }
            Ok(())
        };
        // Every rank waits for both neighbours' latest record; all waits of a phase are issued
        // before any rank records that phase, else a rank would wait for its neighbour's current one.
        let wait_neighbours = || -> Result<()> {
            for r in 0..n {
                for nb in [(r + n - 1) % n, (r + 1) % n] {
                    if nb != r {
                        stream(r).wait(&self.done[nb]).doing("ordering a ring phase after a neighbour's")?;
                    }
                }
            }
            Ok(())
        };
        record_all()?;
        for phase in plan.phases() {
            wait_neighbours()?;
            for r in 0..n {
                let Some(incoming) = phase.incoming(r) else { continue };
                let (at, len) = (base + incoming.range.start, incoming.range.len());
                let src = ptrs[(r + n - 1) % n] + (at * size) as u64;
                let cfg = word_per_thread(len * size);
                let mut dst = bufs[r].x.slice_mut(at..at + len);
                // SAFETY: dst and the peer's range hold `len` elements (the same range of equal
                // buffers); both kernels bound every access by their length argument.
                if phase.reduce {
                    let nn = len as i64;
                    unsafe { stream(r).launch_builder(&bufs[r].add).arg(&mut dst).arg(&src).arg(&nn).launch(cfg) }.doing("launching the peer ring's add")?;
                } else {
                    let bytes = (len * size) as i64;
                    unsafe { stream(r).launch_builder(&self.copy[r]).arg(&mut dst).arg(&src).arg(&bytes).launch(cfg) }.doing("launching the peer ring's copy")?;
                }
            }
            record_all()?;
        }
        wait_neighbours()
    }
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_sweep_visits_one_gpu_each_power_of_two_and_the_whole_host() {
        assert_eq!(super::world_sizes(1), [1]);
        assert_eq!(super::world_sizes(4), [1, 2, 4]);
        assert_eq!(super::world_sizes(6), [1, 2, 4, 6]);
        assert_eq!(super::world_sizes(8), [1, 2, 4, 8]);
    }
}
