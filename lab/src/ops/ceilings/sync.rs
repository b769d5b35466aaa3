//! The latency roof: what one grid-wide dependency costs (kernels/ceilings.cu, `sync_*`). A chain
//! of `steps` steps over one block per SM, each step needing every block of the one before, run
//! three ways (the case's `launch`): a captured graph of one-step kernels with full edges
//! (`graph`), the same graph with programmatic edges (`graph_pdl`, sm_90), and one cooperative
//! kernel with a grid barrier between steps (`cooperative`; `barrier` counter: one atomic counter
//! every block arrives on, as cooperative groups' grid sync; flags: a word per block, gathered by
//! one block, which then releases the rest). The record's `us_per_step` is the
//! figure; every block checks its neighbour's last step, so a missing dependency is an error
//! (the cooperative case also runs without its barriers once and records the misses it caused).
//! The overlap cases give each graph step work before its wait and after it (spun on the global
//! timer), in clusters or not, with shared memory that keeps two kernels' blocks off one SM or not:
//! when a kernel's blocks find room while the one before runs, a step costs its post work and
//! one boundary; when they launch only as it ends, its pre work too.

use super::FAMILY;
use crate::error::Doing;
use crate::experiment::{param_str, param_usize, Measurement, Session};
use crate::gpu::graph::Graph;
use crate::gpu::{timing::time_gpu, Gpu};
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use serde_json::{json, Value};

pub fn gpu_sync(s: &mut Session, gpu: &Gpu, case: &Value) -> Result<()> {
    let steps = param_usize(case, "steps")?;
    let launch = param_str(case, "launch")?;
    // The overlap cases' knobs (graph launches): clusters of 3 or none, dynamic shared memory a
    // block holds (only to take room on its SM), blocks (one per SM unless given), and ns spun
    // before and after the wait.
    let opt = |k: &str, default: usize| case.get(k).map_or(Ok(default), |_| param_usize(case, k));
    let cluster = opt("cluster", 1)?;
    let variant = match (launch, cluster) {
        ("graph" | "graph_pdl", 1) => "sync_step",
        ("graph" | "graph_pdl", 3) => "sync_step_cluster",
        ("graph" | "graph_pdl", c) => return Err(LabError::Invalid(format!("sync: clusters of {c}: 1 or 3"))),
        ("cooperative", _) => "sync_persistent",
        (other, _) => return Err(LabError::Invalid(format!("sync: no launch `{other}` (graph, graph_pdl, cooperative)"))),
    };
    if !s.wants(variant, "lab") {
        return Ok(());
    }
    if (launch == "graph_pdl" || cluster > 1) && gpu.arch < 90 {
        eprintln!("note: sync: programmatic edges and clusters need sm_90; the case is left out on sm_{}", gpu.arch);
        return Ok(());
    }
    let blocks = opt("blocks", gpu.info.sm_count as usize)? / cluster * cluster;
    let smem = opt("smem", 0)?;
    let [pre, post] = [opt("pre_ns", 0)?, opt("post_ns", 0)?].map(|v| v as u32);
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: smem as u32 };
    let mut flags = gpu.stream.alloc_zeros::<u32>(2 * blocks).doing("allocating the step flags")?;
    let mut errors = gpu.stream.alloc_zeros::<u32>(1).doing("allocating the miss count")?;
    let mut bar = gpu.stream.alloc_zeros::<u32>(blocks + 1).doing("allocating the grid barrier")?;
    let barrier = match (launch, case.get("barrier").and_then(Value::as_str)) {
        ("cooperative", Some("counter")) => 1,
        ("cooperative", Some("flags")) => 2,
        ("cooperative", other) => return Err(LabError::Invalid(format!("sync: barrier {other:?}: counter or flags"))),
        _ => 0,
    };
    let mut extra = serde_json::Map::new();
    let steps_i = steps as i32;
    // One run of the chain from zeroed flags: a graph replay or the cooperative kernel.
    let (graph, persistent) = if launch != "cooperative" {
        let f = gpu.function(FAMILY, &symbol(FAMILY, variant, DType::F32))?;
        crate::ops::gemm::raise_dynamic_smem(&f, smem)?;
        let g = Graph::capture(gpu, launch == "graph_pdl", || {
            gpu.stream.memset_zeros(&mut flags).doing("zeroing the step flags")?;
            for step in 0..steps_i {
                // SAFETY: flags holds 2 x blocks words, errors one; the grid is `blocks` blocks.
                unsafe { gpu.stream.launch_builder(&f).arg(&mut flags).arg(&mut errors).arg(&step).arg(&pre).arg(&post).launch(cfg) }
                    .doing("launching sync_step")?;
            }
            Ok(())
        })?;
        g.upload()?;
        extra.insert("programmatic_edges".into(), json!(g.programmatic));
        (Some(g), None)
    } else {
        (None, Some(gpu.function(FAMILY, &symbol(FAMILY, "sync_persistent", DType::F32))?))
    };
    let mut run = |barrier: i32, flags: &mut CudaSlice<u32>, errors: &mut CudaSlice<u32>| -> Result<()> {
        match (&graph, &persistent) {
            (Some(g), _) => g.launch(),
            (None, Some(f)) => {
                gpu.stream.memset_zeros(flags).doing("zeroing the step flags")?;
                gpu.stream.memset_zeros(&mut bar).doing("zeroing the grid barrier")?;
                // SAFETY: as sync_step's, with bar blocks + 1 words; a cooperative launch of one block
                // per SM, which the driver refuses unless every block is resident at once (the
                // barrier's spin needs that).
                unsafe { gpu.stream.launch_builder(f).arg(flags).arg(errors).arg(&mut bar).arg(&steps_i).arg(&barrier).launch_cooperative(cfg) }
                    .map(|_| ())
                    .doing("launching sync_persistent")
            }
            _ => unreachable!("one of the two is made above"),
        }
    };
    if persistent.is_some() {
        // The planted fault: no barriers, so blocks run ahead of their neighbours.
        run(0, &mut flags, &mut errors)?;
        let misses = gpu.download(&errors)?[0];
        extra.insert("misses_without_barrier".into(), json!(misses));
        gpu.stream.memset_zeros(&mut errors).doing("zeroing the miss count")?;
    }
    run(barrier, &mut flags, &mut errors)?;
    gpu.sync()?;
    let time = time_gpu(gpu, &s.budget, || run(barrier, &mut flags, &mut errors))?;
    let misses = gpu.download(&errors)?[0] as f64;
    let error = super::compare(&[misses], &[0.0], Tolerance { atol: 0.0, rtol: 0.0 }, "every block saw its neighbour's previous step (misses counted)");
    extra.insert("us_per_step".into(), json!(time.0.median * 1e3 / steps as f64));
    extra.insert("blocks".into(), json!(blocks));
    let mut m = Measurement::new(variant, "lab", case, Work { bytes: 0, flops: 0 });
    (m.time, m.error, m.extra) = (Some(time), Some(error), extra);
    s.emit(m).map(|_| ())
}
