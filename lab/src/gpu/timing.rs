//! CUDA-event timing: warm-up, L2 scrubbed before every repetition, median and percentiles.

use super::Gpu;
use crate::error::Doing;
use crate::profile::{Budget, TimeSummary, TimingMode};
use crate::Result;
use cudarc::driver::sys::CUevent_flags;

/// Times `launch` (which enqueues work on `gpu.stream`) with events around each repetition.
/// Before each repetition a buffer twice the L2 size is cleared so inputs come from HBM.
pub fn time_gpu(gpu: &Gpu, budget: &Budget, mut launch: impl FnMut() -> Result<()>) -> Result<(TimeSummary, TimingMode)> {
    let scrub_len = (2 * gpu.info.l2_bytes.max(1 << 20)) as usize;
    let mut scrub = gpu.stream.alloc_zeros::<u8>(scrub_len).doing("allocating the L2 scrub buffer")?;
    let mut run = |n: usize| -> Result<Vec<f64>> {
        let mut events = Vec::with_capacity(n);
        for _ in 0..n {
            gpu.stream.memset_zeros(&mut scrub).doing("scrubbing L2")?;
            let start = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).doing("creating an event")?;
            let end = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).doing("creating an event")?;
            start.record(&gpu.stream).doing("recording an event")?;
            launch()?;
            end.record(&gpu.stream).doing("recording an event")?;
            events.push((start, end));
        }
        gpu.sync()?;
        events
            .iter()
            .map(|(s, e)| s.elapsed_ms(e).map(|t| t as f64).doing("reading event times"))
            .collect()
    };
    let warm = run(budget.warmup.max(1))?;
    let reps = budget.reps(TimeSummary::of(&warm).median);
    let raw = run(reps)?;
    let mode = TimingMode { l2: "cold".into(), launch: "eager".into(), warmup: warm.len(), raw_ms: raw.clone() };
    Ok((TimeSummary::of(&raw), mode))
}
