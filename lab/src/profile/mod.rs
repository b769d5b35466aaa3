//! Profilers: sample statistics and work accounting. Timers live beside their backend
//! (`gpu::timing` for CUDA events, [`cpu_time`] for host code).

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

/// How a time was taken; kept in every record.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TimingMode {
    /// "cold" (L2 scrubbed before every repetition) or "warm".
    pub l2: String,
    /// "eager" launches (graph replay may come later).
    pub launch: String,
    pub warmup: usize,
    /// Raw samples in milliseconds, in the order they were taken.
    pub raw_ms: Vec<f64>,
}

/// How many repetitions to take: at least `min`, at most `max`, about `budget_ms` in all.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub warmup: usize,
    pub min: usize,
    pub max: usize,
    pub budget_ms: f64,
}

impl Budget {
    pub fn new(quick: bool) -> Self {
        if quick {
            Budget { warmup: 2, min: 5, max: 20, budget_ms: 200.0 }
        } else {
            Budget { warmup: 5, min: 10, max: 100, budget_ms: 1000.0 }
        }
    }
    /// Repetitions to take after a warm-up whose median took `warm_ms`.
    pub fn reps(&self, warm_ms: f64) -> usize {
        let fit = (self.budget_ms / warm_ms.max(1e-6)) as usize;
        fit.clamp(self.min, self.max)
    }
}

/// Times a host function: warm-up, then repetitions by the budget.
pub fn cpu_time(budget: &Budget, mut f: impl FnMut()) -> (TimeSummary, TimingMode) {
    let mut once = || {
        let t = std::time::Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1e3
    };
    let warm: Vec<f64> = (0..budget.warmup.max(1)).map(|_| once()).collect();
    let reps = budget.reps(TimeSummary::of(&warm).median);
    let raw: Vec<f64> = (0..reps).map(|_| once()).collect();
    let mode = TimingMode {
        l2: "warm".into(),
        launch: "host".into(),
        warmup: warm.len(),
        raw_ms: raw.clone(),
    };
    (TimeSummary::of(&raw), mode)
}
