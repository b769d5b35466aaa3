//! Profilers: sample statistics and work accounting. Timers live beside their backend
//! (`gpu::timing` for CUDA events, [`cpu_time`] for host code).

pub mod ncu;
pub mod sanitize;

use serde::{Deserialize, Serialize};
use statrs::statistics::{Data, OrderStatistics};

/// Median and 20th/80th percentiles of the kept samples, in milliseconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TimeSummary {
    pub median: f64,
    pub p20: f64,
    pub p80: f64,
    pub samples: usize,
}

impl TimeSummary {
    pub fn of(samples_ms: &[f64]) -> Self {
        assert!(!samples_ms.is_empty(), "no timing samples");
        let mut d = Data::new(samples_ms.to_vec());
        TimeSummary {
            median: d.median(),
            p20: d.percentile(20),
            p80: d.percentile(80),
            samples: samples_ms.len(),
        }
    }
}

/// The bytes that must move and the flops that must run for one call.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Work {
    pub bytes: u64,
    pub flops: u64,
}

impl Work {
    /// Achieved GB/s and TFLOP/s at a median time in milliseconds.
    pub fn throughput(&self, median_ms: f64) -> Throughput {
        let s = median_ms * 1e-3;
        Throughput { gb_s: self.bytes as f64 / s / 1e9, tflop_s: self.flops as f64 / s / 1e12 }
    }
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Throughput {
    pub gb_s: f64,
    pub tflop_s: f64,
}

/// Whether L2 is scrubbed before every repetition (inputs come from memory) or left warm.
/// `Clean` is the default of `lab run`, [`Budget::new`] and `RunOptions::new` alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum L2 {
    /// Zeroed before every repetition: inputs come from memory, and L2 is full of dirty lines
    /// whose write-back the timed kernel pays for as it evicts them.
    Cold,
    /// Read before every repetition: inputs come from memory, and L2 holds only clean lines.
    #[default]
    Clean,
    Warm,
}

/// How each repetition is issued: launched from the host, or replayed as a captured CUDA graph
/// (no launch overhead; a provider that cannot be captured is timed eagerly and says so).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Launch {
    Eager,
    Graph,
}

impl L2 {
    pub fn name(self) -> &'static str {
        match self {
            L2::Cold => "cold",
            L2::Clean => "clean",
            L2::Warm => "warm",
        }
    }
}

impl Launch {
    pub fn name(self) -> &'static str {
        match self {
            Launch::Eager => "eager",
            Launch::Graph => "graph",
        }
    }
}

/// SM and memory clocks read just before the first timed repetition and just after the last,
/// and what was holding the clocks down at the end (NVML's clock event reasons).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Clocks {
    pub sm_mhz: [u32; 2],
    pub mem_mhz: [u32; 2],
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limited_by: Vec<String>,
}

/// How a time was taken; kept in every record.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TimingMode {
    /// "cold" (L2 zeroed before every repetition), "clean" (L2 read over before every
    /// repetition) or "warm".
    pub l2: String,
    /// "eager" launches, "graph" replay, or "host" for CPU code.
    pub launch: String,
    pub warmup: usize,
    /// Raw samples in milliseconds, in the order they were taken.
    pub raw_ms: Vec<f64>,
    /// Every warm-up sample, in order: the trace that shows when the times settled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warmup_ms: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clocks: Option<Clocks>,
}

impl TimingMode {
    /// `cold L2, graph` as the report prints it next to a figure.
    pub fn label(&self) -> String {
        format!("{} L2, {}", self.l2, self.launch)
    }
}

/// How many repetitions to take: at least `min`, at most `max`, about `budget_ms` in all; and
/// how to take them.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Repetitions per warm-up round.
    pub warmup: usize,
    pub min: usize,
    pub max: usize,
    pub budget_ms: f64,
    pub l2: L2,
    pub launch: Launch,
}

/// Warm-up stops once a round's median is no more than this much better than the best before.
pub const SETTLED: f64 = 0.02;
/// ... or after this many rounds, whatever the trace says.
pub const MAX_WARMUP_ROUNDS: usize = 8;

impl Budget {
    pub fn new(quick: bool) -> Self {
        let (l2, launch) = (L2::default(), Launch::Eager);
        if quick {
            Budget { warmup: 2, min: 5, max: 20, budget_ms: 200.0, l2, launch }
        } else {
            Budget { warmup: 5, min: 10, max: 100, budget_ms: 1000.0, l2, launch }
        }
    }
    /// One warm-up launch and one timed: a variant launched (nearly) once, as under a sanitizer.
    pub fn once() -> Self {
        Budget { warmup: 1, min: 1, max: 1, budget_ms: 0.0, l2: L2::default(), launch: Launch::Eager }
    }
    /// Repetitions to take after a warm-up whose median took `warm_ms`.
    pub fn reps(&self, warm_ms: f64) -> usize {
        let fit = (self.budget_ms / warm_ms.max(1e-6)) as usize;
        fit.clamp(self.min, self.max)
    }

    /// Repetitions to take after a warm-up trace: by the median of its last round.
    pub fn reps_after(&self, warm: &[f64]) -> usize {
        self.reps(TimeSummary::of(&warm[warm.len().saturating_sub(self.warmup.max(1))..]).median)
    }

    /// Warm-up in rounds of `warmup` repetitions until the median stops improving (by more than
    /// [`SETTLED`]) or [`MAX_WARMUP_ROUNDS`] or the time budget is spent; returns every sample.
    pub fn warm_up<E>(&self, mut round: impl FnMut(usize) -> Result<Vec<f64>, E>) -> Result<Vec<f64>, E> {
        let mut trace = Vec::new();
        let mut best = f64::INFINITY;
        for i in 0..MAX_WARMUP_ROUNDS {
            let r = round(self.warmup.max(1))?;
            let median = TimeSummary::of(&r).median;
            trace.extend(r);
            let settled = i > 0 && median >= best * (1.0 - SETTLED);
            best = best.min(median);
            if settled || trace.iter().sum::<f64>() > self.budget_ms {
                break;
            }
        }
        Ok(trace)
    }

    /// Times `once` (which returns milliseconds): warm-up, then repetitions by the budget.
    pub fn sample<E>(&self, mut once: impl FnMut(usize) -> Result<Vec<f64>, E>) -> Result<(Vec<f64>, Vec<f64>), E> {
        let warm = self.warm_up(&mut once)?;
        let raw = once(self.reps_after(&warm))?;
        Ok((warm, raw))
    }
}

/// Times a host function the same way (caches stay warm: host code has no scrub).
pub fn cpu_time(budget: &Budget, mut f: impl FnMut()) -> (TimeSummary, TimingMode) {
    let Ok(timed) = host_time(budget, || Ok::<(), std::convert::Infallible>(()), || {
        f();
        Ok(())
    });
    timed
}

/// Times `op` on the host clock, `prepare` running untimed before every repetition (restoring
/// an in-place input, synchronising devices).
pub fn host_time<E>(
    budget: &Budget,
    mut prepare: impl FnMut() -> Result<(), E>,
    mut op: impl FnMut() -> Result<(), E>,
) -> Result<(TimeSummary, TimingMode), E> {
    let once = |n: usize| -> Result<Vec<f64>, E> {
        (0..n)
            .map(|_| {
                prepare()?;
                let t = std::time::Instant::now();
                op()?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            })
            .collect()
    };
    let (warm, raw) = budget.sample(once)?;
    let mode = TimingMode {
        l2: "warm".into(),
        launch: "host".into(),
        warmup: warm.len(),
        raw_ms: raw.clone(),
        warmup_ms: warm,
        clocks: None,
    };
    Ok((TimeSummary::of(&raw), mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round of `n` samples from a scripted sequence of round medians.
    fn scripted(medians: &[f64]) -> impl FnMut(usize) -> Result<Vec<f64>, ()> + '_ {
        let mut i = 0;
        move |n| {
            let m = medians[i.min(medians.len() - 1)];
            i += 1;
            Ok(vec![m; n])
        }
    }

    #[test]
    fn warm_up_goes_on_while_the_median_improves_and_keeps_the_trace() {
        let b = Budget { budget_ms: 1e9, ..Budget::new(false) };
        // Improves 10 -> 5 -> 3, then settles at 2.99 (< 2% better): four rounds.
        let trace = b.warm_up(scripted(&[10.0, 5.0, 3.0, 2.99, 1.0])).unwrap();
        assert_eq!(trace.len(), 4 * b.warmup);
        assert_eq!(trace[0], 10.0);
        assert_eq!(*trace.last().unwrap(), 2.99);
        // Never settling stops at the round limit; a spent time budget stops it sooner.
        let falling: Vec<f64> = (0..20).map(|i| 100.0 / (i as f64 + 1.0)).collect();
        assert_eq!(b.warm_up(scripted(&falling)).unwrap().len(), MAX_WARMUP_ROUNDS * b.warmup);
        let short = Budget { budget_ms: 600.0, ..b };
        assert_eq!(short.warm_up(scripted(&falling)).unwrap().len(), 2 * b.warmup);
    }

    #[test]
    fn sampling_takes_repetitions_by_the_settled_median() {
        let b = Budget { budget_ms: 100.0, min: 3, max: 50, ..Budget::new(false) };
        let (warm, raw) = b.sample(scripted(&[9.0, 4.0, 4.0])).unwrap();
        assert_eq!(warm.len(), 3 * b.warmup);
        assert_eq!(raw.len(), 25);
    }
}
