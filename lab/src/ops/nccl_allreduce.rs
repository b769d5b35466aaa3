//! The `nccl_allreduce` experiment: all-reduce across the GPUs of one host, NCCL's own beside the
//! lab's ring over NCCL send/recv ([`crate::collective::nccl`]), plain and pipelined, and the
//! lab's ring over peer loads (`ring_peer`).
//!
//! Figures as nccl-tests defines them (see the `allreduce` experiment); a repetition is timed on
//! the host from issue to the last stream's completion on every GPU.
//!
//! Where there is one GPU or none, or no NCCL library, the experiment checks the same plan on
//! simulated ranks in host memory (`ring_plan_host`), so the schedule the GPUs run is always
//! tested.

use crate::collective::nccl::{gpus_for_nccl, nccl_all_reduce, nccl_error, ring_all_reduce, world_sizes, PeerRing, RingBufs, NCCL_KERNELS};
use crate::collective::nccl_log;
use crate::collective::plan::RingPlan;
use crate::collective::ring::reference_sum;
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, Backend, Experiment, Measurement, Session};
use crate::kernels::{symbol, DType};
use crate::ops::allreduce::{figure, rank_input, sizes, tolerance};
use crate::ops::compare::{compare_elems, first_failure};
use crate::ops::Elem;
use crate::profile::host_time;
use crate::profile::sanitize::Tool;
use crate::record::Tolerance;
use crate::{LabError, Result};
use cudarc::driver::CudaSlice;
use cudarc::nccl::safe::NcclType;
use serde_json::{json, Value};

pub struct NcclAllReduce;

const FAMILY: &str = "collective";

/// The lab's GPU rings: name and segment size (`None`: one segment per chunk). NCCL's send/recv
/// has a fixed cost of tens of microseconds per grouped round and ramps up slowly: 4 MiB
/// segments ran at a third of the link's rate on two H200s, so the pipelined ring needs large
/// segments (64 MiB) to gain anything from overlapping the adds.
const RINGS: [(&str, Option<usize>); 3] =
    [("ring_p2p", None), ("ring_p2p_pipelined", Some(4 << 20)), ("ring_p2p_pipelined_64m", Some(64 << 20))];

/// The ring with no NCCL in it: the same plan (one segment per chunk), each rank's kernel loading
/// its predecessor's segment over NVLink. On four H100s `ring_p2p`'s rounds ran at ~60% of their
/// two-GPU rate (NCCL's send/recv, not the link); this ring tells the two apart.
const PEER_RING: &str = "ring_peer";

impl Experiment for NcclAllReduce {
    fn name(&self) -> &'static str {
        "nccl_allreduce"
    }
    fn description(&self) -> &'static str {
        "all-reduce across a host's GPUs: the lab ring over NCCL send/recv (plain, pipelined) and over peer loads vs ncclAllReduce; busbw by size"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["bytes=268435456 dtype=f32", "bytes=1073741824 dtype=f32"]
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let mut cases = Vec::new();
        let gate = |n: usize, len: usize, dtype: DType, transport: &str| {
            json!({"bytes": len * dtype.size(), "len": len, "dtype": dtype.name(), "ranks": n, "transport": transport, "timed": false})
        };
        match gpus_for_nccl(backend) {
            Ok(count) => {
                // Every world size: gates first, then 4 B to 1 GiB in f32 and in bf16.
                let max = if quick { 1 << 20 } else { 1 << 30 };
                for n in world_sizes(count).into_iter().filter(|&n| n >= 2) {
                    for len in [0, n - 1, 1001, 1 << 20 | 3] {
                        cases.push(gate(n, len, DType::F32, "nccl"));
                    }
                    cases.push(gate(n, 1001, DType::Bf16, "nccl"));
                    for dtype in [DType::F32, DType::Bf16] {
                        for b in sizes(max) {
                            cases.push(json!({"bytes": b, "len": b / dtype.size(), "dtype": dtype.name(), "ranks": n, "transport": "nccl"}));
                        }
                    }
                }
            }
            Err(why) => {
                eprintln!("note: nccl_allreduce: {why}; checking the GPU ring's plan on simulated ranks only");
                for n in [2, 3, 4] {
                    for (len, dtype) in [(0, DType::F32), (n - 1, DType::F32), (1001, DType::F32), (1001, DType::Bf16), (1 << 16 | 5, DType::F16)] {
                        cases.push(gate(n, len, dtype, "plan"));
                    }
                }
            }
        }
        cases
    }
    /// The gates on two GPUs (the smallest world, the one a two-GPU host has).
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        crate::experiment::quick_gates(self, backend).into_iter().filter(|c| c["ranks"] == 2).collect()
    }
    /// NCCL's kernels, except under initcheck: it knows memory as written only through the
    /// kernels it instruments, and the lab's adds read what NCCL's kernels received.
    fn sanitize_uninstrumented(&self, tool: Tool) -> Option<&'static str> {
        (tool != Tool::Initcheck).then_some(NCCL_KERNELS)
    }
    /// NCCL's Simple protocol under initcheck: with the default, NCCL's LL kernels read memory no
    /// write the tool saw had set (on two H100s, 168,867 reports over the five gates, after which
    /// the tool aborted), so initcheck never finished. Whether Simple, which waits on counters
    /// rather than polling flags stored with the data, reads less of it is not yet measured.
    fn sanitize_env(&self, tool: Tool) -> &'static [(&'static str, &'static str)] {
        if tool == Tool::Initcheck {
            &[("NCCL_PROTO", "Simple")]
        } else {
            &[]
        }
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        let transport = param_str(case, "transport")?;
        let measurements = match (transport, DType::parse(param_str(case, "dtype")?)?) {
            ("plan", DType::F32) => simulate::<f32>(s, case)?,
            ("plan", DType::Bf16) => simulate::<half::bf16>(s, case)?,
            ("plan", DType::F16) => simulate::<half::f16>(s, case)?,
            ("nccl", DType::F32) => measure::<f32>(s, case)?,
            ("nccl", DType::Bf16) => measure::<half::bf16>(s, case)?,
            ("nccl", DType::F16) => measure::<half::f16>(s, case)?,
            (other, _) => return Err(LabError::Invalid(format!("nccl_allreduce: unknown transport `{other}` (nccl, plan)"))),
        };
        for m in measurements {
            s.emit(m)?;
        }
        Ok(())
    }
}

/// NCCL and the GPU ring round to the storage type after every hop, not once: up to n - 1
/// roundings of partial sums no larger than n (inputs lie in [-1, 1)), on top of the final one.
fn hop_tolerance(dtype: DType, n: usize) -> Tolerance {
    let once = tolerance(dtype, n);
    let hops = if dtype == DType::F32 { 0.0 } else { ((n - 1) * n) as f64 * once.rtol };
    Tolerance { atol: once.atol + hops, rtol: once.rtol }
}

/// Every rank's input and the exact sum, from the run's seed.
fn inputs<T: Elem>(seed: u64, case: &Value, n: usize, len: usize) -> (Vec<Vec<T>>, Vec<f64>) {
    use rayon::prelude::*;
    // In parallel: at 1 GiB on 4 GPUs the host's inputs and checks took longer than the timing.
    let inputs: Vec<Vec<T>> = (0..n).into_par_iter().map(|r| rank_input(seed, case, r, len)).collect();
    let expected = reference_sum(&inputs);
    (inputs, expected)
}

/// The plan on host buffers: the schedule's check without GPUs (rounding to the storage type
/// after every add, as the GPU kernel does).
fn simulate<T: Elem>(s: &mut Session, case: &Value) -> Result<Vec<Measurement>> {
    let (n, len) = (param_usize(case, "ranks")?, param_usize(case, "len")?);
    if !s.wants("ring_plan_host", "lab") {
        return Ok(Vec::new());
    }
    let (inputs, expected) = inputs::<T>(s.opts.seed, case, n, len);
    let mut bufs: Vec<Vec<f32>> = inputs.iter().map(|v| v.iter().map(|x| x.to_f32()).collect()).collect();
    let plan = RingPlan::new(len, n, Some(64), 16 / T::DTYPE.size());
    plan.simulate(&mut bufs, |x| T::from_f32(x).to_f32());
    let tol = hop_tolerance(T::DTYPE, n);
    let outs: Vec<Vec<T>> = bufs.iter().map(|b| b.iter().map(|&x| T::from_f32(x)).collect()).collect();
    let mut m = figure("ring_plan_host", "lab", case, (len * T::DTYPE.size()) as u64, n, None, worst(&outs, &expected, tol), None, tol, identical(&outs));
    m.extra.insert("segments".into(), plan.segments.into());
    Ok(vec![m])
}

/// The first failing rank's comparison with the exact sum, else rank 0's.
fn worst<T: Elem>(outs: &[Vec<T>], expected: &[f64], tol: Tolerance) -> Option<crate::record::ErrorStats> {
    use rayon::prelude::*;
    let each: Vec<_> = outs.par_iter().map(|o| compare_elems(o, expected, tol, "f64-sum")).collect();
    each.into_iter().reduce(first_failure)
}

fn identical<T: Elem>(outs: &[Vec<T>]) -> bool {
    outs.iter().all(|o| T::bytes(o) == T::bytes(&outs[0]))
}

fn measure<T: Elem + NcclType>(s: &mut Session, case: &Value) -> Result<Vec<Measurement>> {
    let Backend::Cuda(first) = &s.backend else { return Err(LabError::Invalid("nccl_allreduce over NCCL needs the CUDA backend".into())) };
    let first = first.clone();
    let (n, len) = (param_usize(case, "ranks")?, param_usize(case, "len")?);
    let started = std::time::Instant::now();
    let w = crate::collective::nccl::world(&first, n)?;
    // Zero when the world was opened by an earlier case.
    let init_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut log = nccl_log::prepare_env().as_ref().ok().map(|p| nccl_log::Log::open(p.clone()));
    let (inputs, expected) = inputs::<T>(s.opts.seed, case, n, len);
    let tol = hop_tolerance(T::DTYPE, n);
    let bytes = (len * T::DTYPE.size()) as u64;
    let timed = param_timed(case);
    let version = cudarc::nccl::result::get_nccl_version().map_err(nccl_error("reading its version"))?;
    let align = 16 / T::DTYPE.size();

    let pristine: Vec<CudaSlice<T>> = w.ranks.iter().zip(&inputs).map(|(r, x)| r.gpu.upload(x)).collect::<Result<_>>()?;
    let mut out = Vec::new();
    let mut providers: Vec<(&str, &str, Option<RingPlan>)> = vec![("ncclAllReduce", "nccl", None)];
    providers.extend(RINGS.map(|(name, seg)| (name, "lab", Some(RingPlan::new(len, n, seg.map(|b| b / T::DTYPE.size()), align)))));
    providers.push((PEER_RING, "lab", Some(RingPlan::new(len, n, None, align))));
    for (variant, provider, plan) in providers {
        if !s.wants(variant, provider) {
            continue;
        }
        let mut bufs = Vec::with_capacity(n);
        let segments = plan.map_or(1, |p| p.segments);
        for (rank, p) in w.ranks.iter().zip(&pristine) {
            let stream = &rank.gpu.stream;
            let x = stream.clone_dtod(p).doing("copying the input")?;
            // The scratch starts as NaN (0xFF bytes): a segment added before it landed shows. The
            // peer ring reads its neighbour in place and needs none.
            let scratch_len = if variant == PEER_RING { 1 } else { plan.map_or(1, |p| p.max_chunk()).max(1) };
            let mut scratch = stream.alloc_zeros::<T>(scratch_len).doing("allocating the scratch")?;
            rank.gpu.poison(&mut scratch)?;
            let event = || rank.gpu.ctx.new_event(None).doing("creating an event");
            let landed = (0..segments).map(|_| event()).collect::<Result<_>>()?;
            let added = (0..segments).map(|_| event()).collect::<Result<_>>()?;
            let add = rank.gpu.function(FAMILY, &symbol(FAMILY, "add", T::DTYPE))?;
            bufs.push(RingBufs { x, scratch, landed, added, add });
        }
        let peer = if variant == PEER_RING { Some(PeerRing::new(&w)?) } else { None };
        w.sync()?;
        let run = |bufs: &mut [RingBufs<T>]| match (&plan, &peer) {
            (Some(p), Some(peer)) => peer.all_reduce(&w, p, bufs, 0, false),
            (Some(p), None) => ring_all_reduce(&w, p, bufs, 0),
            (None, _) => nccl_all_reduce(&w, bufs),
        };
        let download = |bufs: &[RingBufs<T>]| -> Result<Vec<Vec<T>>> { w.ranks.iter().zip(bufs).map(|(r, b)| r.gpu.download(&b.x)).collect() };
        if let Some(log) = &mut log {
            log.take()?;
        }
        run(&mut bufs)?;
        w.sync()?;
        // The algorithm and protocol NCCL chose for this call (rank 0 logs one line per call).
        let choice = match (&mut log, plan) {
            (Some(log), None) => nccl_log::all_reduce_choice(&log.take()?, bytes).cloned(),
            _ => None,
        };
        let first_outs = download(&bufs)?;
        let before = worst(&first_outs, &expected, tol);
        let time = if timed {
            let start = first.nvml.as_ref().and_then(|nv| nv.clocks_now());
            let bufs = std::cell::RefCell::new(&mut bufs);
            let restore = || -> Result<()> {
                for ((rank, b), p) in w.ranks.iter().zip(bufs.borrow_mut().iter_mut()).zip(&pristine) {
                    rank.gpu.stream.memcpy_dtod(p, &mut b.x).doing("restoring the input")?;
                }
                w.sync()
            };
            let (summary, mut mode) = host_time(&s.budget, restore, || {
                run(&mut bufs.borrow_mut())?;
                w.sync()
            })?;
            mode.clocks = first.nvml.as_ref().and_then(|nv| crate::gpu::nvml::clocks_around(start, nv));
            Some((summary, mode))
        } else {
            None
        };
        let outs = download(&bufs)?;
        let after = worst(&outs, &expected, tol);
        let mut m = figure(variant, provider, case, bytes, n, time, before, after, tol, identical(&outs) && identical(&first_outs));
        m.extra.insert("nccl_version".into(), version.into());
        m.extra.insert("nccl_init_ms".into(), init_ms.into());
        m.extra.insert("gpus".into(), json!(w.ranks.iter().map(|r| r.gpu.info.name.clone()).collect::<Vec<_>>()));
        if plan.is_none() {
            match (&choice, nccl_log::prepare_env()) {
                (Some(c), _) => {
                    m.extra.insert("nccl_algo".into(), c.algo.clone().into());
                    m.extra.insert("nccl_proto".into(), c.proto.clone().into());
                }
                (None, Err(why)) => _ = m.extra.insert("nccl_choice_missing".into(), why.clone().into()),
                (None, Ok(p)) => _ = m.extra.insert("nccl_choice_missing".into(), format!("no tuning line for {bytes} bytes in {}", p.display()).into()),
            }
        }
        if let Some(p) = plan {
            m.extra.insert("segments".into(), p.segments.into());
            m.extra.insert("segment_bytes".into(), (p.max_chunk().div_ceil(p.segments) * T::DTYPE.size()).into());
        }
        out.push(m);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_two_gpus_the_cases_check_the_plan_on_simulated_ranks() {
        let cases = NcclAllReduce.cases(&Backend::Cpu, true);
        assert!(!cases.is_empty() && cases.iter().all(|c| c["transport"] == "plan" && c["timed"] == false));
        assert!(cases.iter().any(|c| c["len"] == 1 && c["ranks"] == 2), "fewer elements than ranks");
    }
}
