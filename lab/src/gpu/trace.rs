//! Where a captured step's time goes, as the step itself sees it: kernels that keep a timeline
//! (`lab_trace`, kernels/llama.cu) stamp the global timer when their first block starts and when
//! its wait for the kernel before returns ([`super::Gpu::set_trace`]). With programmatic edges a
//! kernel starts while the one before runs, so a kernel's own cost inside the graph is the time
//! from its wait returning to the next kernel's: its chain of dependent work after the wait plus
//! one boundary. Nsight Compute times each kernel alone with the caches flushed, which is not
//! what the graph pays.

use super::Gpu;
use crate::error::Doing;
use crate::{LabError, Result};
use serde::Serialize;
use statrs::statistics::{Data, OrderStatistics};

/// Slots a trace buffer holds after its count: kernels/llama.cu's LAB_TRACE_SLOTS.
pub const SLOTS: usize = 65536;

/// One kernel's share of the step (every launch of it in a step together).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Span {
    /// The stamped kernel, then the unstamped ones that run before the next stamp (" + ").
    pub kernels: String,
    pub launches: usize,
    /// From its wait returning to the next stamped kernel's, the median over steps, summed over
    /// its launches in a step.
    pub us: f64,
    /// The median from its first block starting to its wait returning (how early it launched),
    /// averaged over its launches.
    pub lead_us: f64,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Timeline {
    /// Median from one step's first wait to the next step's.
    pub step_us: f64,
    pub spans: Vec<Span>,
    /// The smallest nonzero difference between two stamps: the timer's resolution, or finer.
    pub resolution_ns: u64,
    /// Slots whose wait returned before the slot before's: none when the kernels ran in the
    /// order the graph lists them and the timer is one clock.
    pub out_of_order: usize,
    /// Where those were: each span whose wait returned before the one before it, and how often.
    pub inversions: Vec<(String, usize)>,
    /// The first step's stamps: each span's kernels, start and wait (us from the first start).
    pub first_step: Vec<(String, f64, f64)>,
}

fn median(v: Vec<f64>) -> f64 {
    Data::new(v).median()
}

/// The timeline of `steps` consecutive replays of a step whose kernels are `kernels` in order,
/// `stamped(k)` saying which of them stamp, from the trace buffer `words` ([`SLOTS`] slots of
/// (start, wait) after their count). An error unless every step stamped every stamped kernel once.
pub fn timeline(words: &[u64], kernels: &[String], stamped: impl Fn(&str) -> bool, steps: usize) -> Result<Timeline> {
    // Each stamped kernel and the unstamped ones after it, up to the next stamped one.
    let mut labels: Vec<String> = Vec::new();
    for k in kernels {
        match labels.last_mut() {
            Some(l) if !stamped(k) => *l = format!("{l} + {k}"),
            _ if stamped(k) => labels.push(k.clone()),
            _ => {}
        }
    }
    let per = labels.len();
    let count = words.first().copied().unwrap_or(0) as usize;
    if steps < 2 || per == 0 || count != steps * per || words.len() < 1 + 2 * count {
        return Err(LabError::Invalid(format!(
            "the trace holds {count} stamps for {steps} steps of {per} stamped kernels: a kernel missed its stamp, or stamped twice, or the buffer is short ({} words)",
            words.len()
        )));
    }
    let start = |i: usize| words[1 + 2 * i] as f64;
    let wait = |i: usize| words[2 + 2 * i] as f64;
    let out_of_order = (1..count).filter(|&i| wait(i) < wait(i - 1)).count();
    let mut inversions: Vec<(String, usize)> = Vec::new();
    for i in (1..count).filter(|&i| wait(i) < wait(i - 1)) {
        match inversions.iter_mut().find(|(l, _)| *l == labels[i % per]) {
            Some((_, n)) => *n += 1,
            None => inversions.push((labels[i % per].clone(), 1)),
        }
    }
    // A step's last span ends at the next step's first wait, so the last step's has no end.
    let mut spans: Vec<Span> = Vec::new();
    for (k, label) in labels.iter().enumerate() {
        let last = steps - usize::from(k + 1 == per);
        let us = median((0..last).map(|r| (wait(r * per + k + 1) - wait(r * per + k)) / 1e3).collect());
        let lead = median((0..steps).map(|r| (wait(r * per + k) - start(r * per + k)) / 1e3).collect());
        match spans.iter_mut().find(|s| &s.kernels == label) {
            // lead_us holds the sum until the end.
            Some(s) => (s.launches, s.us, s.lead_us) = (s.launches + 1, s.us + us, s.lead_us + lead),
            None => spans.push(Span { kernels: label.clone(), launches: 1, us, lead_us: lead }),
        }
    }
    for s in &mut spans {
        s.lead_us /= s.launches as f64;
    }
    let step_us = median((1..steps).map(|r| (wait(r * per) - wait((r - 1) * per)) / 1e3).collect());
    let stamps = (0..count).flat_map(|i| [words[1 + 2 * i], words[2 + 2 * i]]);
    let mut sorted: Vec<u64> = stamps.collect();
    sorted.sort_unstable();
    let resolution_ns = sorted.windows(2).map(|w| w[1] - w[0]).filter(|&d| d > 0).min().unwrap_or(0);
    let t0 = start(0);
    let first_step = (0..per).map(|k| (labels[k].clone(), (start(k) - t0) / 1e3, (wait(k) - t0) / 1e3)).collect();
    Ok(Timeline { step_us, spans, resolution_ns, out_of_order, inversions, first_step })
}

/// Runs `step` (one replay of a captured step whose kernels are `kernels`, in order) `steps`
/// times with every loaded module's trace on ([`Gpu::set_trace`]), then reads the timeline.
pub fn record(gpu: &Gpu, steps: usize, mut step: impl FnMut() -> Result<()>, kernels: &[String], stamped: impl Fn(&str) -> bool) -> Result<Timeline> {
    let buf = gpu.stream.alloc_zeros::<u64>(1 + 2 * SLOTS).doing("allocating the trace buffer")?;
    if gpu.set_trace(Some(&buf))? == 0 {
        return Err(LabError::Invalid("no loaded module keeps a timeline".into()));
    }
    let ran = (0..steps).try_for_each(|_| step());
    gpu.set_trace(None)?;
    ran?;
    gpu.sync()?;
    timeline(&gpu.download(&buf)?, kernels, stamped, steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stamps of `steps` steps of kernels a (2 us after its wait until b's), b (3 us), then an
    /// unstamped h, then a again (1 us until the next step's first wait); each starts 0.5 us
    /// before its wait returns.
    fn trace(steps: usize, skip: Option<usize>) -> Vec<u64> {
        let gaps = [2000u64, 3000, 1000];
        let mut words = vec![0u64];
        let mut t = 10_000u64;
        for r in 0..steps {
            for (k, g) in gaps.iter().enumerate() {
                if skip == Some(r * 3 + k) {
                    t += g;
                    continue;
                }
                words.extend([t - 500, t]);
                words[0] += 1;
                t += g;
            }
        }
        words
    }

    fn kernels() -> Vec<String> {
        ["a", "b", "h", "a"].map(String::from).to_vec()
    }

    #[test]
    fn spans_add_each_kernels_launches_and_name_what_runs_unstamped() {
        let t = timeline(&trace(5, None), &kernels(), |k| k != "h", 5).unwrap();
        assert_eq!(t.step_us, 6.0);
        assert_eq!(t.spans, vec![Span { kernels: "a".into(), launches: 2, us: 3.0, lead_us: 0.5 }, Span { kernels: "b + h".into(), launches: 1, us: 3.0, lead_us: 0.5 }]);
        assert_eq!(t.resolution_ns, 500);
        assert_eq!((t.out_of_order, t.inversions.len()), (0, 0));
        assert_eq!(t.first_step[1], ("b + h".to_string(), 2.0, 2.5));
    }

    #[test]
    fn a_missing_stamp_is_an_error_and_a_disorder_is_counted() {
        let e = timeline(&trace(5, Some(7)), &kernels(), |k| k != "h", 5).unwrap_err().to_string();
        assert!(e.contains("14 stamps for 5 steps of 3 stamped kernels"), "{e}");
        // Two kernels' slots taken in the other order than they ran are counted.
        let mut words = trace(5, None);
        words.swap(1, 3);
        words.swap(2, 4);
        let t = timeline(&words, &kernels(), |k| k != "h", 5).unwrap();
        assert_eq!((t.out_of_order, t.inversions), (1, vec![("b + h".to_string(), 1)]));
    }
}
