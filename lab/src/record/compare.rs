//! `lab compare A B`: per experiment, variant, provider and shape, the change in median time from
//! run A to run B with a bootstrap confidence interval from the raw samples, read as faster,
//! slower or no detectable change. Runs whose hardware or environment differ are refused unless
//! the caller insists: a regression between two machines is not a regression.
//!
//! A GPU drifts between runs (clocks under the power cap, another host of the same kind), and
//! every figure of a run drifts with it. So each figure is also read against a reference
//! measured in the same run: a lab kernel against the fastest peer on the same inputs, else
//! against the run's own ceiling record of its roof. Peers and ceilings are the yardsticks: what
//! they did between the runs is the machine's drift, shown and not judged.
//! The relative change, `(B / A of the figure) / (B / A of its reference)`, is what decides
//! faster or slower by default; the absolute change stays beside it (`View::Absolute`).

mod table;
#[cfg(test)]
mod tests;

pub use table::render;

use super::{Record, Verdict};
use crate::{LabError, Result};
use rand::{Rng, SeedableRng};
use statrs::statistics::{Data, OrderStatistics};
use std::collections::BTreeMap;

/// Fewer samples than this on a side and a figure is "not enough samples": the smallest number
/// of repetitions a run takes (`--quick`'s budget); a median's bootstrap from fewer is no interval.
pub const MIN_SAMPLES: usize = 5;
const RESAMPLES: usize = 2000;

/// What must match for two runs to be compared: device and board (form factor, power limit),
/// driver, host and allow-listed env.
pub fn fingerprint(r: &Record) -> BTreeMap<&'static str, String> {
    let d = &r.device;
    BTreeMap::from([
        ("backend", r.backend.clone()),
        ("device.name", d.name.clone()),
        ("device.cc", d.cc.clone()),
        ("device.sm_count", d.sm_count.to_string()),
        ("device.memory_bytes", d.memory_bytes.to_string()),
        ("device.driver", d.driver.clone()),
        ("device.cuda", d.cuda.clone()),
        ("device.form_factor", d.board.as_ref().map(|b| b.form_factor.clone()).unwrap_or_default()),
        ("device.power_limit_w", d.board.as_ref().and_then(|b| b.power_limit_w).map(|w| w.to_string()).unwrap_or_default()),
        ("host.cpu", r.host.cpu.clone()),
        ("host.cores", r.host.cores.to_string()),
        ("env", format!("{:?}", r.env)),
    ])
}

/// Where two runs' fingerprints differ, as `key: `a` vs `b``; empty when they match.
pub fn fingerprint_differences(a: &Record, b: &Record) -> Vec<String> {
    let (fa, fb) = (fingerprint(a), fingerprint(b));
    fa.iter()
        .filter(|(k, v)| fb.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: `{v}` vs `{}`", fb.get(k).map(String::as_str).unwrap_or("")))
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Faster,
    Slower,
    NoDetectableChange,
    /// Fewer than [`MIN_SAMPLES`] raw samples on a side: no interval to judge by.
    NotEnoughSamples,
}

impl Change {
    /// "no detectable change", as the tables print it.
    pub fn label(self) -> &'static str {
        match self {
            Change::Faster => "faster",
            Change::Slower => "slower",
            Change::NoDetectableChange => "no detectable change",
            Change::NotEnoughSamples => "not enough samples",
        }
    }
    /// Faster or slower: what a reader is asked to look at.
    pub fn flagged(self) -> bool {
        matches!(self, Change::Faster | Change::Slower)
    }
}

/// Which change decides the verdict: relative to the run's reference (the default), or the
/// raw change in time, which also moves with the machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    #[default]
    Relative,
    Absolute,
}

/// A ratio of B over A and its 95% bootstrap interval (NaN bounds when there are too few
/// samples to resample).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Interval {
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
}

/// What a figure was read against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The fastest peer (cuBLAS, torch, ...) on the same inputs in the same run.
    Peer,
    /// The run's own ceiling record of the figure's roof (copy bandwidth, FMA, tensor rate).
    Ceiling,
    /// A peer's or a ceiling's own figure: a yardstick, whose change is the machine's drift.
    Reference,
    /// Nothing in the runs to read it against: the change is absolute, drift included.
    Absolute,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Reference {
    pub basis: Basis,
    /// "cublas" for a peer, the ceiling's name ("copy_gb_s") for a ceiling.
    pub name: String,
    pub variant: String,
    pub provider: String,
    pub params: serde_json::Value,
    /// The reference's own change from A to B: how far the machine moved under it.
    pub drift: Interval,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    pub experiment: String,
    pub variant: String,
    pub provider: String,
    pub params: serde_json::Value,
    pub a_ms: f64,
    pub b_ms: f64,
    /// Raw samples in A and in B.
    pub samples: [usize; 2],
    /// Median of B over median of A, and its 95% bootstrap interval: the absolute change.
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
    pub absolute: Change,
    pub basis: Basis,
    /// The peer or ceiling read against (basis `Peer` or `Ceiling`).
    pub reference: Option<Reference>,
    /// The absolute ratio over the reference's: the change relative to the run's reference.
    pub relative: Option<Interval>,
    /// The default (relative) view's verdict: on `relative` where there is a reference, never
    /// flagged for a yardstick itself, on the absolute change where there is nothing to read
    /// a figure against.
    pub change: Change,
}

impl Comparison {
    pub fn verdict(&self, view: View) -> Change {
        match view {
            View::Relative => self.change,
            View::Absolute => self.absolute,
        }
    }
}

/// The statistic of the sample sets' medians, with a 95% percentile-bootstrap interval from
/// resampling every set independently. Deterministic: the resampling is seeded.
fn bootstrap<const N: usize>(sets: [&[f64]; N], statistic: impl Fn([f64; N]) -> f64, resamples: usize) -> Interval {
    let median = |v: Vec<f64>| Data::new(v).median();
    let ratio = statistic(sets.map(|s| median(s.to_vec())));
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut draw = |v: &[f64]| -> f64 { median((0..v.len()).map(|_| v[rng.random_range(0..v.len())]).collect()) };
    let stats: Vec<f64> = (0..resamples).map(|_| statistic(sets.map(&mut draw))).collect();
    let mut d = Data::new(stats);
    Interval { ratio, lo: d.quantile(0.025), hi: d.quantile(0.975) }
}

/// Median ratio b/a with a 95% percentile-bootstrap interval (resampling both sample sets).
/// Deterministic: the resampling is seeded.
pub fn bootstrap_ratio(a: &[f64], b: &[f64], resamples: usize) -> (f64, f64, f64) {
    let i = bootstrap([b, a], |[b, a]| b / a, resamples);
    (i.ratio, i.lo, i.hi)
}

/// The change of a figure relative to its reference's: `(b / a) / (ref_b / ref_a)` of medians,
/// with a 95% bootstrap interval from all four sample sets (one run's samples of the figure and
/// of its reference are taken at different moments, so they are resampled independently).
pub fn bootstrap_relative(a: &[f64], b: &[f64], ref_a: &[f64], ref_b: &[f64], resamples: usize) -> Interval {
    bootstrap([b, a, ref_b, ref_a], |[b, a, rb, ra]| (b / a) / (rb / ra), resamples)
}

/// Faster or slower only when the whole interval lies beyond the noise threshold (a relative
/// change, e.g. 0.02): smaller moves are what two runs of one binary show on a busy machine.
pub fn classify(lo: f64, hi: f64, threshold: f64) -> Change {
    if lo.is_nan() || hi.is_nan() {
        Change::NotEnoughSamples
    } else if hi < 1.0 - threshold {
        Change::Faster
    } else if lo > 1.0 + threshold {
        Change::Slower
    } else {
        Change::NoDetectableChange
    }
}

/// A noise band is a relative change in [0, 1): 0.02 is 2%.
pub fn check_threshold(threshold: f64) -> Result<()> {
    if threshold.is_finite() && (0.0..1.0).contains(&threshold) {
        Ok(())
    } else {
        Err(LabError::Invalid(format!("the threshold is a relative change from 0 up to 1 (0.02 is 2%); got {threshold}")))
    }
}

/// One figure both runs hold.
struct Pair<'a> {
    key: (String, String, String, String),
    a: &'a Record,
    b: &'a Record,
    absolute: Interval,
}

impl Pair<'_> {
    fn samples(&self) -> [&[f64]; 2] {
        [raw(self.a), raw(self.b)]
    }
    fn enough(&self) -> bool {
        self.samples().iter().all(|s| s.len() >= MIN_SAMPLES)
    }
    /// The roof a figure is placed against; a ceiling record names the one it measures.
    fn roof(&self) -> Option<&str> {
        if self.a.experiment == "ceilings" {
            self.a.extra.get("ceiling_name").and_then(|v| v.as_str())
        } else {
            self.a.ceiling.as_deref()
        }
    }
}

fn raw(r: &Record) -> &[f64] {
    r.timing.as_ref().map_or(&[], |t| &t.raw_ms)
}

/// Compares every timed, passing figure that both runs hold, absolutely and against the
/// reference of its run. Refuses runs with different fingerprints unless `force`.
pub fn compare_runs(a: &[Record], b: &[Record], threshold: f64, force: bool) -> Result<Vec<Comparison>> {
    check_threshold(threshold)?;
    let (Some(ra), Some(rb)) = (a.first(), b.first()) else {
        return Err(LabError::Invalid("nothing to compare: a run has no records".into()));
    };
    let differ = fingerprint_differences(ra, rb);
    if !differ.is_empty() && !force {
        return Err(LabError::Invalid(format!(
            "the runs were made on different hardware or environments ({}); pass --force to compare anyway",
            differ.join("; ")
        )));
    }
    // Old records of a renamed variant are read under today's name (quant's `<design>_<scheme>_b<batch>`).
    let key = |r: &Record| {
        let (variant, params) = crate::ops::quant::current_name(&r.experiment, &r.variant, &r.params);
        (r.experiment.clone(), variant, r.provider.clone(), params.to_string())
    };
    let usable = |r: &&Record| r.verdict == Verdict::Pass && !raw(r).is_empty();
    let in_b: BTreeMap<_, &Record> = b.iter().filter(usable).map(|r| (key(r), r)).collect();
    let pairs: Vec<Pair> = a
        .iter()
        .filter(usable)
        .filter_map(|ra| {
            let k = key(ra);
            let rb = *in_b.get(&k)?;
            let enough = [raw(ra), raw(rb)].iter().all(|s| s.len() >= MIN_SAMPLES);
            let absolute = if enough {
                bootstrap([raw(rb), raw(ra)], |[b, a]| b / a, RESAMPLES)
            } else {
                Interval { ratio: median(raw(rb)) / median(raw(ra)), lo: f64::NAN, hi: f64::NAN }
            };
            Some(Pair { key: k, a: ra, b: rb, absolute })
        })
        .collect();
    Ok(references(&pairs).into_iter().zip(&pairs).map(|(against, p)| judge(p, against, &pairs, threshold)).collect())
}

fn median(v: &[f64]) -> f64 {
    Data::new(v.to_vec()).median()
}

/// What each pair is read against: a lab kernel its fastest peer on the same inputs (fastest in
/// A), else, of its roof's ceiling records, the one closest to it in time per repetition in A
/// (under the power cap the clock a kernel gets depends on how long it runs: a 20 us GEMM runs
/// at full clock while an 8192^3 one is capped). Peers and ceilings are yardsticks themselves.
/// Only figures with enough samples on both sides serve as references.
enum Against {
    Pair(usize),
    Yardstick,
    Nothing,
}

fn references(pairs: &[Pair]) -> Vec<Against> {
    let mut peers: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut ceilings: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let a_ms: Vec<f64> = pairs.iter().map(|p| median(p.samples()[0])).collect();
    for (i, p) in pairs.iter().enumerate().filter(|(_, p)| p.enough()) {
        let (experiment, _, provider, params) = &p.key;
        if experiment == "ceilings" {
            if let Some(roof) = p.roof() {
                ceilings.entry(roof).or_default().push(i);
            }
        } else if provider != "lab" {
            let slot = peers.entry((experiment.as_str(), params.as_str())).or_insert(i);
            if a_ms[i] < a_ms[*slot] {
                *slot = i;
            }
        }
    }
    let distance = |i: usize, j: usize| (a_ms[i] / a_ms[j]).ln().abs();
    pairs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (experiment, _, provider, params) = &p.key;
            if experiment == "ceilings" || provider != "lab" {
                return Against::Yardstick;
            }
            let peer = peers.get(&(experiment.as_str(), params.as_str())).copied();
            let ceiling = || {
                let roof = ceilings.get(p.roof()?)?;
                roof.iter().copied().min_by(|&x, &y| distance(i, x).total_cmp(&distance(i, y)))
            };
            peer.or_else(ceiling).map_or(Against::Nothing, Against::Pair)
        })
        .collect()
}

fn judge(p: &Pair, against: Against, pairs: &[Pair], threshold: f64) -> Comparison {
    let absolute = classify(p.absolute.lo, p.absolute.hi, threshold);
    let (basis, reference, relative) = match against {
        Against::Yardstick => (Basis::Reference, None, None),
        Against::Nothing => (Basis::Absolute, None, None),
        Against::Pair(_) if !p.enough() => (Basis::Absolute, None, None),
        Against::Pair(j) => {
            let r = &pairs[j];
            let ([a, b], [ra, rb]) = (p.samples(), r.samples());
            let relative = bootstrap_relative(a, b, ra, rb, RESAMPLES);
            let (basis, name) = if r.key.0 == "ceilings" {
                (Basis::Ceiling, r.roof().unwrap_or_default().to_string())
            } else {
                (Basis::Peer, r.key.2.clone())
            };
            let reference = Reference { basis, name, variant: r.key.1.clone(), provider: r.key.2.clone(), params: parse(r), drift: r.absolute };
            (basis, Some(reference), Some(relative))
        }
    };
    let change = match (basis, relative) {
        (_, Some(i)) => classify(i.lo, i.hi, threshold),
        (Basis::Reference, _) if absolute != Change::NotEnoughSamples => Change::NoDetectableChange,
        _ => absolute,
    };
    let [sa, sb] = p.samples();
    Comparison {
        experiment: p.key.0.clone(),
        variant: p.key.1.clone(),
        provider: p.key.2.clone(),
        params: parse(p),
        a_ms: median(sa),
        b_ms: median(sb),
        samples: [sa.len(), sb.len()],
        ratio: p.absolute.ratio,
        lo: p.absolute.lo,
        hi: p.absolute.hi,
        absolute,
        basis,
        reference,
        relative,
        change,
    }
}

fn parse(p: &Pair) -> serde_json::Value {
    serde_json::from_str(&p.key.3).unwrap_or_else(|_| p.a.params.clone())
}
