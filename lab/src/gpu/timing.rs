//! CUDA-event timing: warm-up until the median settles, L2 scrubbed (or not) before every
//! repetition, eager launches or CUDA-graph replay, clocks read around the timed stretch.

use super::Gpu;
use crate::error::Doing;
use crate::profile::{Budget, Launch, TimeSummary, TimingMode, L2};
use crate::Result;
use cudarc::driver::PushKernelArg;
use super::graph::Graph;
use cudarc::driver::sys::CUevent_flags;

/// Times `launch` (which enqueues work on `gpu.stream`) with events around each repetition, as
/// `budget` says: with `L2::Cold` a buffer twice the L2 size is cleared before each repetition so
/// inputs come from HBM (`L2::Clean`: read instead, leaving no dirty lines to write back); with `Launch::Graph` the launch is captured once and replayed.
pub fn time_gpu(gpu: &Gpu, budget: &Budget, mut launch: impl FnMut() -> Result<()>) -> Result<(TimeSummary, TimingMode)> {
    let mut scrub = match budget.l2 {
        L2::Cold | L2::Clean => Some(gpu.stream.alloc_zeros::<u8>((2 * gpu.info.l2_bytes.max(1 << 20)) as usize).doing("allocating the L2 scrub buffer")?),
        L2::Warm => None,
    };
    let reader = match budget.l2 {
        L2::Clean => Some((gpu.function("ceilings", &crate::kernels::symbol("ceilings", "read_scrub", crate::kernels::DType::F32))?, gpu.stream.alloc_zeros::<f32>(1).doing("allocating a sink")?)),
        _ => None,
    };
    let graph = match budget.launch {
        Launch::Graph => capture(gpu, &mut launch),
        Launch::Eager => None,
    };
    let mut round = |n: usize| -> Result<Vec<f64>> {
        let mut events = Vec::with_capacity(n);
        for _ in 0..n {
            match (scrub.as_mut(), &reader) {
                (Some(scrub), Some((f, sink))) => {
                    let n = (scrub.len() / 16) as i64;
                    let cfg = cudarc::driver::LaunchConfig { grid_dim: (4 * gpu.info.sm_count as u32, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
                    // SAFETY: the scrub buffer holds n 16-byte words; the sink one float.
                    unsafe { gpu.stream.launch_builder(f).arg(&*scrub).arg(&n).arg(sink).launch(cfg) }.doing("scrubbing L2 by reading")?;
                }
                (Some(scrub), None) => gpu.stream.memset_zeros(scrub).doing("scrubbing L2")?,
                _ => {}
            }
            let start = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).doing("creating an event")?;
            let end = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).doing("creating an event")?;
            start.record(&gpu.stream).doing("recording an event")?;
            match &graph {
                Some(g) => g.launch()?,
                None => launch()?,
            }
            end.record(&gpu.stream).doing("recording an event")?;
            events.push((start, end));
        }
        gpu.sync()?;
        events
            .iter()
            .map(|(s, e)| s.elapsed_ms(e).map(|t| t as f64).doing("reading event times"))
            .collect()
    };
    let warm = budget.warm_up(&mut round)?;
    let start = gpu.nvml.as_ref().and_then(|n| n.clocks_now());
    let raw = round(budget.reps_after(&warm))?;
    let mode = TimingMode {
        l2: budget.l2.name().into(),
        launch: if graph.is_some() { "graph" } else { "eager" }.into(),
        warmup: warm.len(),
        raw_ms: raw.clone(),
        warmup_ms: warm,
        clocks: gpu.nvml.as_ref().and_then(|n| super::nvml::clocks_around(start, n)),
    };
    Ok((TimeSummary::of(&raw), mode))
}

/// Captures one `launch` into a graph. A provider that cannot be captured (a library call that
/// allocates, a host sync) is timed eagerly instead; its record then says "eager".
fn capture(gpu: &Gpu, launch: &mut impl FnMut() -> Result<()>) -> Option<Graph> {
    match Graph::capture(gpu, false, launch).and_then(|g| g.upload().map(|()| g)) {
        Ok(g) => Some(g),
        Err(why) => {
            eprintln!("note: could not capture a CUDA graph ({why}); timing eagerly");
            None
        }
    }
}
