//! Whether each kernel family's committed source has passed on a GPU: records carry the hash of
//! every family's source they ran ([`crate::kernels::hash`]); a family is verified when, over
//! every GPU run of its current source (the newest record of each figure or sanitizer launch
//! counting), each check of a lab kernel passed, the sanitizer found nothing in the lab's
//! kernels, and every sanitizer tool ran every (variant of the family's table, shape) that any
//! tool ran (a sanitizer run cut short covers less). A family whose source changed since is unverified, whatever its
//! older runs said (`scripts/gpu-test-pass.sh` makes both runs).

use super::safety::{status, EXPERIMENT as SANITIZE};
use crate::train::torch_ref::compares_runs;
use crate::record::{Record, Verdict};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Family {
    pub name: String,
    /// The hash of its committed source.
    pub hash: String,
    /// What the runs of this source's checks found ("412 of 412 passed in runs ...").
    pub checks: String,
    /// What the sanitizer runs of this source found.
    pub sanitizer: String,
    pub verified: bool,
}

/// Of `records` (committed builds on a GPU) made with `family` at `hash`, the newest of each key,
/// and the runs they come from.
fn newest<'a, K: Ord>(records: &[&'a Record], family: &str, hash: &str, sanitizer: bool, key: impl Fn(&Record) -> K) -> (Vec<&'a Record>, BTreeSet<&'a str>) {
    // A run is one binary: a sanitizer record of the family's own experiment whose process
    // launched none of its kernels (a variant of plain copies) still ran this source when its
    // run did.
    let at_hash = |r: &Record| r.kernels.get(family).is_some_and(|h| h == hash);
    let runs: BTreeSet<&str> = records.iter().filter(|r| at_hash(r)).map(|r| r.run_id.as_str()).collect();
    let own = |r: &Record| sanitizer && r.params["experiment"] == family && runs.contains(r.run_id.as_str());
    let mut by_key: BTreeMap<K, &Record> = BTreeMap::new();
    for &r in records.iter().filter(|r| (r.experiment == SANITIZE) == sanitizer && (at_hash(r) || own(r))) {
        let slot = by_key.entry(key(r)).or_insert(r);
        if slot.run_id < r.run_id {
            *slot = r;
        }
    }
    let recs: Vec<&Record> = by_key.into_values().collect();
    let runs = recs.iter().map(|r| r.run_id.as_str()).collect();
    (recs, runs)
}

fn runs_text(runs: &BTreeSet<&str>) -> String {
    let list: Vec<&str> = runs.iter().copied().collect();
    // A long history names its last two runs and counts the rest: the table stays readable.
    if list.len() > 3 {
        return format!("runs {} and {} earlier", list[list.len() - 2..].join(", "), list.len() - 2);
    }
    format!("{} {}", if list.len() == 1 { "run" } else { "runs" }, list.join(", "))
}

/// Every family with kernels, against `hashes` (family -> hash of its committed source).
pub fn families(records: &[Record], hashes: &BTreeMap<String, String>) -> Vec<Family> {
    let gpu: Vec<&Record> = records.iter().filter(|r| r.backend == "cuda" && !r.git.dirty).collect();
    let mut out = Vec::new();
    for (name, hash) in hashes {
        // The newest run that ran an earlier source of this family, for "changed since".
        let older = gpu.iter().filter(|r| r.kernels.get(name).is_some_and(|h| h != hash)).map(|r| r.run_id.as_str()).max();
        let never = |what: &str| match older {
            Some(run) => format!("none at this source (changed since run {run})"),
            None => format!("no {what} records this source"),
        };
        // A peer's figure says nothing about the lab's kernels: only the lab's own are counted;
        // nor does a comparison of two training runs' curves, which judges the training's
        // sensitivity to rounding as much as any kernel.
        let lab: Vec<&Record> = gpu.iter().copied().filter(|r| (r.provider == "lab" && !compares_runs(r)) || r.experiment == SANITIZE).collect();
        let (recs, runs) = newest(&lab, name, hash, false, |r| (r.experiment.clone(), r.variant.clone(), r.params.to_string()));
        let (checks, checked) = if recs.is_empty() {
            (never("GPU run"), false)
        } else {
            let failed = recs.iter().filter(|r| r.verdict == Verdict::Fail).count();
            let text = if failed == 0 { format!("{} of {} passed in {}", recs.len(), recs.len(), runs_text(&runs)) } else { format!("{failed} of {} failed in {}", recs.len(), runs_text(&runs)) };
            (text, failed == 0)
        };
        let (recs, runs) = newest(&lab, name, hash, true, |r| (r.variant.clone(), r.params.to_string()));
        let (sanitizer, clean) = if recs.is_empty() {
            (never("sanitizer run"), false)
        } else {
            let bad = recs.iter().filter(|r| !matches!(status(r), "clean" | "library")).count();
            // (variant, shape) of the family's own experiment each tool ran: every tool should
            // have run all of them. A record names every family its process launched, and a tool
            // runs one process per experiment or per shape, so launches of other experiments
            // (a model's engine) say only that each tool ran the family at all.
            // Only the variants of the family's table: a peer (cuBLAS) run alone launches no lab
            // kernel, so its records never name the family, while one run beside the ladder does.
            let table: Vec<String> = crate::family::find(name).map(|f| (f.variants)().into_iter().map(|v| v.name.to_string()).collect()).unwrap_or_default();
            let own: Vec<&&Record> = recs.iter().filter(|r| r.params["experiment"] == name.as_str() && (table.is_empty() || table.contains(&r.variant))).collect();
            let mut by_tool: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
            for r in if own.is_empty() { recs.iter().collect() } else { own } {
                let launch = if r.params["experiment"] == name.as_str() { (r.variant.clone(), r.params["case"].to_string()) } else { Default::default() };
                by_tool.entry(r.params["tool"].as_str().unwrap_or("").to_string()).or_default().insert(launch);
            }
            for tool in crate::profile::sanitize::Tool::ALL {
                by_tool.entry(tool.name().to_string()).or_default();
            }
            let all: BTreeSet<&(String, String)> = by_tool.values().flatten().collect();
            let short: Vec<String> = by_tool.iter().filter(|(_, l)| l.len() < all.len()).map(|(t, l)| format!("{t} {} of {}", l.len(), all.len())).collect();
            let text = match (bad, short.is_empty()) {
                (0, true) => format!("clean on {} launches in {}", recs.len(), runs_text(&runs)),
                (0, false) => format!("clean, but incomplete ({}) in {}", short.join(", "), runs_text(&runs)),
                _ => format!("{bad} of {} not clean in {}", recs.len(), runs_text(&runs)),
            };
            (text, bad == 0 && short.is_empty())
        };
        out.push(Family { name: name.clone(), hash: hash.clone(), checks, sanitizer, verified: checked && clean });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(run: &str, experiment: &str, hash: &str, verdict: Verdict, sanitizer: Option<&str>) -> Record {
        let line = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/report/records/2026-11-22T14-00-38Z-h100-14a3904.jsonl")).unwrap();
        let mut r: Record = serde_json::from_str(line.lines().next().unwrap()).unwrap();
        (r.run_id, r.experiment, r.verdict, r.backend, r.provider) = (run.into(), experiment.into(), verdict, "cuda".into(), "lab".into());
        r.git.dirty = false;
        r.kernels = [("softmax".to_string(), hash.to_string())].into();
        if let Some(s) = sanitizer {
            r.extra.insert("sanitizer".into(), serde_json::json!({ "status": s }));
            r.params = serde_json::json!({"experiment": "softmax", "tool": "memcheck", "case": {"n": 1}});
        }
        r
    }

    fn with(mut r: Record, key: &str, value: serde_json::Value) -> Record {
        r.params[key] = value;
        r
    }

    /// One sanitizer launch under every tool.
    fn sanitized(run: &str, hash: &str, verdict: Verdict, status: &str) -> Vec<Record> {
        crate::profile::sanitize::Tool::ALL.iter().map(|t| with(record(run, SANITIZE, hash, verdict, Some(status)), "tool", t.name().into())).collect()
    }

    #[test]
    fn a_family_is_verified_only_at_the_source_its_passing_runs_ran() {
        let now: BTreeMap<String, String> = [("softmax".to_string(), "bbbb".to_string())].into();
        let mut old = vec![record("r1", "softmax", "aaaa", Verdict::Pass, None)];
        old.extend(sanitized("r1", "aaaa", Verdict::Pass, "clean"));
        let f = &families(&old, &now)[0];
        assert!(!f.verified);
        assert_eq!(f.checks, "none at this source (changed since run r1)");
        assert!(families(&[], &now)[0].checks.starts_with("no GPU run records"));

        let mut both = old.clone();
        both.extend([record("r2", "softmax", "bbbb", Verdict::Pass, None), with(record("r2", "softmax", "bbbb", Verdict::Implausible, None), "n", 7.into())]);
        both.extend(sanitized("r3", "bbbb", Verdict::Pass, "library"));
        let f = &families(&both, &now)[0];
        assert!(f.verified, "{f:?}");
        assert_eq!((f.checks.as_str(), f.sanitizer.as_str()), ("2 of 2 passed in run r2", "clean on 4 launches in run r3"));

        // A failed check or an erring sanitizer record, newest of its figure, unverifies it.
        let mut failed = both.clone();
        failed.push(record("r4", "softmax", "bbbb", Verdict::Fail, None));
        assert_eq!(families(&failed, &now)[0].checks, "1 of 2 failed in runs r2, r4");
        assert!(!families(&failed, &now)[0].verified);
        let mut erring = both.clone();
        erring.push(record("r4", SANITIZE, "bbbb", Verdict::Fail, Some("errors")));
        assert!(!families(&erring, &now)[0].verified);
        // ... and a newer pass of the same figure verifies it again; a peer's failure never counts.
        let mut again = failed.clone();
        again.push(record("r5", "softmax", "bbbb", Verdict::Pass, None));
        let mut peer = record("r5", "softmax", "bbbb", Verdict::Fail, None);
        peer.provider = "torch".into();
        again.push(peer);
        assert_eq!(families(&again, &now)[0].checks, "2 of 2 passed in runs r2, r5");
        assert!(families(&again, &now)[0].verified);
        // Nor does a training run's loss curve apart from torch's: it judges the trajectory.
        let mut curve = record("r6", "pipeline", "bbbb", Verdict::Fail, None);
        curve.variant = "loss_curve".into();
        again.push(curve);
        assert!(families(&again, &now)[0].verified);
        // A dirty build or a CPU run says nothing about the committed kernels.
        let mut dirty = old.clone();
        dirty.push(record("r2", "softmax", "bbbb", Verdict::Pass, None));
        dirty.extend(sanitized("r2", "bbbb", Verdict::Pass, "clean"));
        dirty.iter_mut().filter(|r| r.run_id == "r2").for_each(|r| r.git.dirty = true);
        assert!(!families(&dirty, &now)[0].verified);
    }

    /// A sanitizer run cut short: racecheck ran one of the two shapes memcheck ran, until a later
    /// run gives it the other.
    #[test]
    fn every_tool_must_have_run_every_launch_any_tool_ran() {
        let now: BTreeMap<String, String> = [("softmax".to_string(), "bbbb".to_string())].into();
        let san = |run: &str, tool: &str, n: u64| {
            let r = record(run, SANITIZE, "bbbb", Verdict::Pass, Some("clean"));
            with(with(r, "tool", tool.into()), "case", serde_json::json!({ "n": n }))
        };
        let mut recs = vec![record("r1", "softmax", "bbbb", Verdict::Pass, None), san("r1", "memcheck", 1), san("r1", "memcheck", 2), san("r1", "racecheck", 1)];
        recs.extend(["initcheck", "synccheck"].iter().flat_map(|t| [san("r1", t, 1), san("r1", t, 2)]));
        let f = &families(&recs, &now)[0];
        assert!(!f.verified);
        assert_eq!(f.sanitizer, "clean, but incomplete (racecheck 1 of 2) in run r1");
        recs.push(san("r2", "racecheck", 2));
        let f = &families(&recs, &now)[0];
        assert!(f.verified, "{f:?}");
        assert_eq!(f.sanitizer, "clean on 8 launches in runs r1, r2");
        // A tool that never ran the family leaves it unverified.
        recs.retain(|r| r.params["tool"] != "synccheck");
        assert_eq!(families(&recs, &now)[0].sanitizer, "clean, but incomplete (synccheck 0 of 2) in runs r1, r2");
    }
}
