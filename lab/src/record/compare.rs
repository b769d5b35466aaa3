//! `lab compare A B`: per experiment, variant, provider and shape, the change in median time from
//! run A to run B with a bootstrap confidence interval from the raw samples, read as faster,
//! slower or no detectable change. Runs whose hardware or environment differ are refused unless
//! the caller insists: a regression between two machines is not a regression.

use super::{Record, Verdict};
use crate::{LabError, Result};
use rand::{Rng, SeedableRng};
use statrs::statistics::{Data, OrderStatistics};
use std::collections::BTreeMap;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Faster,
    Slower,
    NoDetectableChange,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    pub experiment: String,
    pub variant: String,
    pub provider: String,
    pub params: serde_json::Value,
    pub a_ms: f64,
    pub b_ms: f64,
    /// Median of B over median of A, and its 95% bootstrap interval.
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
    pub change: Change,
}

/// Median ratio b/a with a 95% percentile-bootstrap interval (resampling both sample sets).
/// Deterministic: the resampling is seeded.
pub fn bootstrap_ratio(a: &[f64], b: &[f64], resamples: usize) -> (f64, f64, f64) {
    let median = |v: Vec<f64>| Data::new(v).median();
    let ratio = median(b.to_vec()) / median(a.to_vec());
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let draw = |v: &[f64], rng: &mut rand::rngs::StdRng| -> Vec<f64> { (0..v.len()).map(|_| v[rng.random_range(0..v.len())]).collect() };
    let ratios: Vec<f64> = (0..resamples).map(|_| median(draw(b, &mut rng)) / median(draw(a, &mut rng))).collect();
    let mut d = Data::new(ratios);
    (ratio, d.quantile(0.025), d.quantile(0.975))
}

/// Faster or slower only when the whole interval lies beyond the noise threshold (a relative
/// change, e.g. 0.02): smaller moves are what two runs of one binary show on a busy machine.
pub fn classify(lo: f64, hi: f64, threshold: f64) -> Change {
    if hi < 1.0 - threshold {
        Change::Faster
    } else if lo > 1.0 + threshold {
        Change::Slower
    } else {
        Change::NoDetectableChange
    }
}

/// Compares every timed, passing figure that both runs hold. Refuses runs with different
/// fingerprints unless `force`.
pub fn compare_runs(a: &[Record], b: &[Record], threshold: f64, force: bool) -> Result<Vec<Comparison>> {
    let (Some(fa), Some(fb)) = (a.first().map(fingerprint), b.first().map(fingerprint)) else {
        return Err(LabError::Invalid("nothing to compare: a run has no records".into()));
    };
    let differ: Vec<String> = fa
        .iter()
        .filter(|(k, v)| fb.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: `{v}` vs `{}`", fb.get(k).map(String::as_str).unwrap_or("")))
        .collect();
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
    let usable = |r: &&Record| r.verdict == Verdict::Pass && r.timing.as_ref().is_some_and(|t| !t.raw_ms.is_empty());
    let in_b: BTreeMap<_, &Record> = b.iter().filter(usable).map(|r| (key(r), r)).collect();
    let mut out = Vec::new();
    for ra in a.iter().filter(usable) {
        let ka = key(ra);
        let Some(rb) = in_b.get(&ka) else { continue };
        let (sa, sb) = (&ra.timing.as_ref().unwrap().raw_ms, &rb.timing.as_ref().unwrap().raw_ms);
        let (ratio, lo, hi) = bootstrap_ratio(sa, sb, 2000);
        out.push(Comparison {
            experiment: ra.experiment.clone(),
            variant: ka.1,
            provider: ra.provider.clone(),
            params: serde_json::from_str(&ka.3).unwrap_or_else(|_| ra.params.clone()),
            a_ms: Data::new(sa.clone()).median(),
            b_ms: Data::new(sb.clone()).median(),
            ratio,
            lo,
            hi,
            change: classify(lo, hi, threshold),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(center: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| center * (1.0 + rng.random_range(-0.03..0.03))).collect()
    }

    #[test]
    fn same_distribution_is_no_detectable_change() {
        let (r, lo, hi) = bootstrap_ratio(&noisy(1.0, 50, 1), &noisy(1.0, 50, 2), 2000);
        assert!(lo <= r && r <= hi && lo < 1.0 + 0.02 && hi > 1.0 - 0.02, "{lo} {r} {hi}");
        assert_eq!(classify(lo, hi, 0.02), Change::NoDetectableChange);
    }

    #[test]
    fn a_twenty_percent_shift_is_detected_both_ways() {
        let (a, b) = (noisy(1.0, 50, 3), noisy(1.2, 50, 4));
        let (r, lo, hi) = bootstrap_ratio(&a, &b, 2000);
        assert!((r - 1.2).abs() < 0.03 && lo > 1.1, "{lo} {r} {hi}");
        assert_eq!(classify(lo, hi, 0.02), Change::Slower);
        let (_, lo, hi) = bootstrap_ratio(&b, &a, 2000);
        assert_eq!(classify(lo, hi, 0.02), Change::Faster);
    }

    /// A real run written before quant's variants lost their parameters, against the same run
    /// as it would be written today: every timed figure is matched under the new name.
    #[test]
    fn old_quant_names_match_todays_across_the_rename() {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../reports/records/2026-11-23T02-11-08Z-h100-4ad7b7b.jsonl.gz"));
        let (old, damage) = crate::record::read_records(path).unwrap();
        assert!(damage.is_empty() && old.iter().any(|r| r.variant == "w4a16_mma_tiled_sweep4_sym_b16"));
        let new: Vec<Record> = old
            .iter()
            .cloned()
            .map(|mut r| {
                (r.variant, r.params) = crate::ops::quant::current_name(&r.experiment, &r.variant, &r.params);
                r
            })
            .collect();
        assert!(new.iter().all(|r| !r.variant.ends_with("_b16")));
        let rows = compare_runs(&old, &new, 0.02, false).unwrap();
        let timed: std::collections::BTreeSet<_> = old
            .iter()
            .filter(|r| r.verdict == Verdict::Pass && r.timing.as_ref().is_some_and(|t| !t.raw_ms.is_empty()))
            .map(|r| (&r.experiment, &r.variant, &r.provider, r.params.to_string()))
            .collect();
        assert_eq!(rows.len(), timed.len());
        assert!(rows.iter().all(|c| c.ratio == 1.0));
        let sweep4 = rows.iter().find(|c| c.variant == "w4a16_mma_tiled_sweep4" && c.params["batch"] == 16).unwrap();
        assert_eq!(sweep4.params["scheme"], "sym");
    }

    #[test]
    fn a_shift_inside_the_threshold_is_not_reported() {
        let (_, lo, hi) = bootstrap_ratio(&noisy(1.0, 50, 5), &noisy(1.01, 50, 6), 2000);
        assert_eq!(classify(lo, hi, 0.05), Change::NoDetectableChange);
    }
}
