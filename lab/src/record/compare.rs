//! `lab compare A B`: per experiment, variant, provider and shape, the change in median time from
//! run A to run B with a bootstrap confidence interval from the raw samples, read as faster,
//! slower or no detectable change. Runs whose hardware or environment differ are refused unless
//! the caller insists: a regression between two machines is not a regression.
//!
//! A GPU drifts between runs (clocks under the power cap, another host of the same kind), and two
//! runs of one binary differ by more than either run's repetitions show: each figure moves by its
//! own 1-2% (more on power-capped shapes), while the bootstrap interval of one run's repetitions
//! against another's is a fraction of a percent wide. So the default view reads every figure
//! against the pair of runs itself (reports/notes/h100-compare-relative.md measured why):
//!
//! - the drift: the median change of the yardsticks (peers and ceilings: code the candidate does
//!   not touch), or of every shared figure where fewer than [`MIN_FIGURES`] yardsticks were run;
//!   it is divided out of each figure's change, for the median and for the fastest repetition;
//! - the noise: the robust spread (1.4826 x the median absolute deviation) of the log change in
//!   median over the yardsticks or over every shared figure, whichever is smaller (the
//!   yardsticks' cannot be widened by a change to lab's code);
//! - a lab kernel is faster or slower only when the whole interval of its median's change and the
//!   change of its fastest repetition, drift divided out, both lie beyond
//!   `max(threshold, NOISE_K x noise)` on the same side. A kernel that got slower is slower at
//!   its best as well as typically; a change of clock state moves the median and rarely the
//!   fastest repetition, a disturbed repetition the reverse.
//!
//! With fewer than [`MIN_FIGURES`] shared figures there is no estimate of either: each figure is
//! judged as the relative view judges it (against its run's peer or ceiling, else absolutely),
//! and the summary says so.
//!
//! Two other readings stay beside it: the absolute change (`View::Absolute`, `--absolute`), and
//! the change relative to a reference measured in the same run (a lab kernel against its fastest
//! peer on the same inputs, else its run's ceiling record of its roof), `View::Relative`.
//! Peers and ceilings are yardsticks: their own change is shown and not judged by default.

mod table;
#[cfg(test)]
mod tests;

pub use table::{describe, render};

use super::{Record, Verdict};
use crate::{LabError, Result};
use rand::{Rng, SeedableRng};
use statrs::distribution::{ContinuousCDF, Normal};
use statrs::statistics::{Data, OrderStatistics};
use std::collections::BTreeMap;

/// Fewer samples than this on a side and a figure is "not enough samples": the smallest number
/// of repetitions a run takes (`--quick`'s budget); a median's bootstrap from fewer is no interval.
pub const MIN_SAMPLES: usize = 5;
const RESAMPLES: usize = 2000;
/// Fewer figures than this (yardsticks for the drift, shared figures for the noise) and there is
/// no estimate between the runs: a median and a spread of fewer are one or two figures' noise.
pub const MIN_FIGURES: usize = 8;
/// How many times the noise between the runs a change must exceed to be called. The changes
/// between two runs of one binary are heavy-tailed (power-capped shapes step by 5-15%): on the
/// 21 pairs of H100 runs of one commit in reports/notes/h100-compare-relative.md, 4 x leaves 4
/// lab kernels flagged of 992 and finds a planted 10% slowdown on 18 pairs of 18 (3 x: 16 flagged,
/// 18 found; 5 x: 2 and 17; 6 x: 1 and 12).
pub const NOISE_K: f64 = 4.0;

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

/// Which change decides the verdict: against the drift and noise between the two runs (the
/// default), relative to the reference of the figure's own run, or the raw change in time, which
/// also moves with the machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    #[default]
    Noise,
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
    /// The relative view's verdict: on `relative` where there is a reference, never flagged for
    /// a yardstick itself, on the absolute change where there is nothing to read a figure against.
    pub relative_change: Change,
    /// The fastest repetition in A and in B (ms).
    pub fastest_ms: [f64; 2],
    /// The fastest repetition of B over that of A.
    pub fastest: f64,
    /// Both changes with the drift between the runs divided out; `None` when the runs share too
    /// few figures to estimate it ([`Between::drift`] is `None`).
    pub net: Option<Net>,
    /// The default view's verdict: the net changes against the band of [`Between`] (never flagged
    /// for a yardstick); with no estimate between the runs, the relative view's.
    pub change: Change,
}

/// A figure's change with the drift between the runs divided out.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Net {
    /// The median's change and its 95% interval, over the drift of the medians.
    pub median: Interval,
    /// The fastest repetition's change over the drift of the fastest repetitions.
    pub fastest: f64,
}

impl Comparison {
    pub fn verdict(&self, view: View) -> Change {
        match view {
            View::Noise => self.change,
            View::Relative => self.relative_change,
            View::Absolute => self.absolute,
        }
    }
    /// A peer's or a ceiling's own figure: its change is the machine's, not judged by default.
    pub fn is_yardstick(&self) -> bool {
        self.basis == Basis::Reference
    }
}

/// Where the drift between the runs was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftFrom {
    /// The yardsticks: peers and ceilings, code the candidate does not change.
    Yardsticks,
    /// Every shared figure, lab's kernels included: too few yardsticks were run in both.
    AllFigures,
}

/// The drift between the two runs and their noise, from the figures they share.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Drift {
    pub from: DriftFrom,
    /// How many figures the drift is the median of.
    pub figures: usize,
    /// The median change (B over A) of those figures' medians and of their fastest repetitions.
    pub median: f64,
    pub fastest: f64,
}

/// The noise between two runs: 1.4826 x the median absolute deviation of the log change in median
/// (a standard deviation where the changes are normal) over the yardsticks or over every shared
/// figure, whichever is smaller.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Noise {
    pub from: DriftFrom,
    pub figures: usize,
    pub spread: f64,
}

/// What the pair of runs says about itself: its drift, its noise and the band a change must
/// leave to be called.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Between {
    /// Figures both runs hold with at least [`MIN_SAMPLES`] samples on each side.
    pub figures: usize,
    /// `None` with fewer than [`MIN_FIGURES`] such figures.
    pub drift: Option<Drift>,
    /// The noise between the runs; `None` with too few figures.
    pub noise: Option<Noise>,
    /// A relative change within +-band is not called: `exp(max(ln(1 + threshold), NOISE_K x
    /// noise)) - 1`; the threshold alone without a noise estimate.
    pub band: f64,
    pub threshold: f64,
}

/// Every figure two runs share, and what the pair says about itself.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparisons {
    pub rows: Vec<Comparison>,
    pub between: Between,
}

impl Comparisons {
    /// Figures flagged faster or slower in a view; yardsticks count only in the absolute one.
    pub fn flagged(&self, view: View) -> usize {
        self.rows.iter().filter(|c| c.verdict(view).flagged()).count()
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

/// Compares every timed, passing figure that both runs hold: against the drift and noise between
/// the runs, absolutely, and against the reference of its run. Refuses runs with different
/// fingerprints unless `force`.
pub fn compare_runs(a: &[Record], b: &[Record], threshold: f64, force: bool) -> Result<Comparisons> {
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
    // A figure timed with L2 warm in one run and cleared in the other moves by the cache alone
    // (SmolLM2's decode step: 1.19 ms warm, 1.48 ms clean, same commit).
    let mode = |r: &Record| r.timing.as_ref().map(|t| format!("L2 {}, {} launches", t.l2, t.launch));
    let timed_apart: Vec<String> = a
        .iter()
        .filter(usable)
        .filter_map(|ra| in_b.get(&key(ra)).filter(|rb| mode(ra) != mode(rb)).map(|rb| format!("{} {} {}: {} vs {}", ra.experiment, ra.variant, ra.params, mode(ra).unwrap_or_default(), mode(rb).unwrap_or_default())))
        .collect();
    if let (Some(first), false) = (timed_apart.first(), force) {
        return Err(LabError::Invalid(format!(
            "{} figure(s) were timed differently in the two runs (first: {first}); rerun one with the other's --l2 and launch mode, or pass --force to compare anyway",
            timed_apart.len()
        )));
    }
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
    let against = references(&pairs);
    let between = between(&pairs, &against, threshold);
    let rows = against.into_iter().zip(&pairs).map(|(against, p)| judge(p, against, &pairs, &between)).collect();
    Ok(Comparisons { rows, between })
}

fn median(v: &[f64]) -> f64 {
    Data::new(v.to_vec()).median()
}

fn fastest(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// 1.4826 x the median absolute deviation: a robust standard deviation (for normal data the two
/// agree), which a few figures that moved a lot do not inflate.
pub fn robust_spread(v: &[f64]) -> f64 {
    let m = median(v);
    let deviations: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    median(&deviations) / Normal::standard().inverse_cdf(0.75)
}

/// The drift between the runs (from the yardsticks where enough were run in both, else from every
/// shared figure), the noise (see [`Noise`]) and the band they give; nothing but the threshold
/// with fewer than [`MIN_FIGURES`] figures.
fn between(pairs: &[Pair], against: &[Against], threshold: f64) -> Between {
    let usable: Vec<usize> = (0..pairs.len()).filter(|&i| pairs[i].enough()).collect();
    let floor = (1.0 + threshold).ln();
    let mut between = Between { figures: usable.len(), drift: None, noise: None, band: threshold, threshold };
    if usable.len() < MIN_FIGURES {
        return between;
    }
    let log_change = |i: usize, statistic: fn(&[f64]) -> f64| {
        let [a, b] = pairs[i].samples();
        (statistic(b) / statistic(a)).ln()
    };
    let yardsticks: Vec<usize> = usable.iter().copied().filter(|&i| matches!(against[i], Against::Yardstick)).collect();
    let (from, over) = if yardsticks.len() >= MIN_FIGURES { (DriftFrom::Yardsticks, &yardsticks) } else { (DriftFrom::AllFigures, &usable) };
    let drift_of = |statistic: fn(&[f64]) -> f64| median(&over.iter().map(|&i| log_change(i, statistic)).collect::<Vec<_>>()).exp();
    between.drift = Some(Drift { from, figures: over.len(), median: drift_of(median), fastest: drift_of(fastest) });
    // The yardsticks' own spread, which a change to lab's code cannot widen, where enough were run;
    // every figure's where that is smaller (more of them, and capped yardsticks can be the noisiest).
    let spread = |over: &[usize]| robust_spread(&over.iter().map(|&i| log_change(i, median)).collect::<Vec<_>>());
    let all = (DriftFrom::AllFigures, usable.len(), spread(&usable));
    let (noise_from, noise_figures, noise) = match from {
        DriftFrom::Yardsticks => {
            let own = (DriftFrom::Yardsticks, yardsticks.len(), spread(&yardsticks));
            if own.2 <= all.2 { own } else { all }
        }
        DriftFrom::AllFigures => all,
    };
    between.noise = Some(Noise { from: noise_from, figures: noise_figures, spread: noise });
    between.band = floor.max(NOISE_K * noise).exp() - 1.0;
    between
}

/// The default verdict: slower when the median's whole interval and the fastest repetition both
/// lie above `1 + band`, faster when both lie below `1 / (1 + band)` (the band is symmetric in
/// log); changes already divided by the drift where there is one.
fn classify_both(median: Interval, fastest: f64, band: f64) -> Change {
    let (up, down) = (1.0 + band, 1.0 / (1.0 + band));
    if median.lo.is_nan() || median.hi.is_nan() {
        Change::NotEnoughSamples
    } else if median.lo > up && fastest > up {
        Change::Slower
    } else if median.hi < down && fastest < down {
        Change::Faster
    } else {
        Change::NoDetectableChange
    }
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

fn judge(p: &Pair, against: Against, pairs: &[Pair], between: &Between) -> Comparison {
    let threshold = between.threshold;
    let absolute = classify(p.absolute.lo, p.absolute.hi, threshold);
    let yardstick = matches!(against, Against::Yardstick);
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
    let unjudged = |verdict: Change| if yardstick && verdict != Change::NotEnoughSamples { Change::NoDetectableChange } else { verdict };
    let relative_change = match relative {
        Some(i) => classify(i.lo, i.hi, threshold),
        None => unjudged(absolute),
    };
    let [sa, sb] = p.samples();
    let fastest_ms = [fastest(sa), fastest(sb)];
    let fastest_ratio = fastest_ms[1] / fastest_ms[0];
    let net = between.drift.map(|d| Net {
        median: Interval { ratio: p.absolute.ratio / d.median, lo: p.absolute.lo / d.median, hi: p.absolute.hi / d.median },
        fastest: fastest_ratio / d.fastest,
    });
    // Without an estimate between the runs, the reference of the figure's own run is what there is.
    let change = match net {
        Some(n) => unjudged(classify_both(n.median, n.fastest, between.band)),
        None => relative_change,
    };
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
        relative_change,
        fastest_ms,
        fastest: fastest_ratio,
        net,
        change,
    }
}

fn parse(p: &Pair) -> serde_json::Value {
    serde_json::from_str(&p.key.3).unwrap_or_else(|_| p.a.params.clone())
}
