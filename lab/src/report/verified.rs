//! Whether each kernel family's committed source has passed on a GPU: records carry the hash of
//! every family's source they ran ([`crate::kernels::hash`]); a family is verified when the
//! newest GPU run of its current source passed every check it made and the newest sanitizer run
//! of it found nothing in the lab's kernels. A family whose source changed since is unverified,
//! whatever its older runs said (`scripts/gpu-test-pass.sh` makes both runs).

use super::safety::{status, EXPERIMENT as SANITIZE};
use crate::record::{Record, Verdict};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Family {
    pub name: String,
    /// The hash of its committed source.
    pub hash: String,
    /// What the newest run of this source's checks found ("412 of 412 passed in run ...").
    pub checks: String,
    /// What the newest sanitizer run of this source found.
    pub sanitizer: String,
    pub verified: bool,
}

/// Of `records` (committed builds on a GPU) made with `family` at `hash`, the newest run's.
fn newest<'a>(records: &[&'a Record], family: &str, hash: &str, sanitizer: bool) -> Option<(String, Vec<&'a Record>)> {
    let mut runs: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in records.iter().filter(|r| (r.experiment == SANITIZE) == sanitizer && r.kernels.get(family).is_some_and(|h| h == hash)) {
        runs.entry(r.run_id.as_str()).or_default().push(r);
    }
    runs.into_iter().next_back().map(|(id, recs)| (id.to_string(), recs))
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
        let (checks, checked) = match newest(&gpu, name, hash, false) {
            Some((run, recs)) => {
                let failed = recs.iter().filter(|r| r.verdict == Verdict::Fail).count();
                let text = if failed == 0 { format!("{} of {} passed in run {run}", recs.len(), recs.len()) } else { format!("{failed} of {} failed in run {run}", recs.len()) };
                (text, failed == 0)
            }
            None => (never("GPU run"), false),
        };
        let (sanitizer, clean) = match newest(&gpu, name, hash, true) {
            Some((run, recs)) => {
                let bad = recs.iter().filter(|r| !matches!(status(r), "clean" | "library")).count();
                let text = if bad == 0 { format!("clean on {} launches in run {run}", recs.len()) } else { format!("{bad} of {} not clean in run {run}", recs.len()) };
                (text, bad == 0)
            }
            None => (never("sanitizer run"), false),
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
        (r.run_id, r.experiment, r.verdict, r.backend) = (run.into(), experiment.into(), verdict, "cuda".into());
        r.git.dirty = false;
        r.kernels = [("softmax".to_string(), hash.to_string())].into();
        if let Some(s) = sanitizer {
            r.extra.insert("sanitizer".into(), serde_json::json!({ "status": s }));
        }
        r
    }

    #[test]
    fn a_family_is_verified_only_at_the_source_its_passing_runs_ran() {
        let now: BTreeMap<String, String> = [("softmax".to_string(), "bbbb".to_string())].into();
        let old = vec![record("r1", "softmax", "aaaa", Verdict::Pass, None), record("r1", SANITIZE, "aaaa", Verdict::Pass, Some("clean"))];
        let f = &families(&old, &now)[0];
        assert!(!f.verified);
        assert_eq!(f.checks, "none at this source (changed since run r1)");
        assert!(families(&[], &now)[0].checks.starts_with("no GPU run records"));

        let mut both = old.clone();
        both.extend([record("r2", "softmax", "bbbb", Verdict::Pass, None), record("r2", "softmax", "bbbb", Verdict::Implausible, None)]);
        both.push(record("r3", SANITIZE, "bbbb", Verdict::Pass, Some("library")));
        let f = &families(&both, &now)[0];
        assert!(f.verified, "{f:?}");
        assert_eq!((f.checks.as_str(), f.sanitizer.as_str()), ("2 of 2 passed in run r2", "clean on 1 launches in run r3"));

        // A failed check or an erring sanitizer record in the newest run at this source unverifies it.
        let mut failed = both.clone();
        failed.push(record("r4", "softmax", "bbbb", Verdict::Fail, None));
        assert_eq!(families(&failed, &now)[0].checks, "1 of 1 failed in run r4");
        assert!(!families(&failed, &now)[0].verified);
        let mut erring = both.clone();
        erring.push(record("r4", SANITIZE, "bbbb", Verdict::Fail, Some("errors")));
        assert!(!families(&erring, &now)[0].verified);
        // A dirty build or a CPU run says nothing about the committed kernels.
        let mut dirty = old.clone();
        dirty.extend([record("r2", "softmax", "bbbb", Verdict::Pass, None), record("r2", SANITIZE, "bbbb", Verdict::Pass, Some("clean"))]);
        dirty.iter_mut().filter(|r| r.run_id == "r2").for_each(|r| r.git.dirty = true);
        assert!(!families(&dirty, &now)[0].verified);
    }
}
