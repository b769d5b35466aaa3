//! Nsight Compute metrics for one kernel launch: runs `lab launch-once` under `ncu` (or
//! `LAB_NCU`), profiling only the first launch of the named kernel, and reads ncu's CSV.

use crate::{LabError, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

/// `ncu` unless `LAB_NCU` names another.
pub fn ncu() -> String {
    std::env::var("LAB_NCU").unwrap_or_else(|_| "ncu".into())
}

/// metric -> value for the first launch of `kernel` in `lab launch-once <experiment>`.
pub fn measure(kernel: &str, experiment: &str, case: &Value, variant: &str, seed: u64, metrics: &[&str]) -> Result<BTreeMap<String, f64>> {
    let fail = |why: String| LabError::Peer { peer: "ncu".into(), why };
    let exe = std::env::current_exe().map_err(|e| fail(format!("cannot find this program: {e}")))?;
    let out = Command::new(ncu())
        .args(["--csv", "--page", "raw", "--launch-count", "1"])
        .args(["--kernel-name", kernel, "--metrics", &metrics.join(",")])
        .arg(exe)
        .args(["launch-once", experiment, "--case", &case.to_string(), "--variant", variant, "--seed", &seed.to_string()])
        .output()
        .map_err(|e| fail(format!("cannot start `{}`: {e}", ncu())))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(fail(format!("{} exited with {}: {}", ncu(), out.status, err.lines().last().unwrap_or_default())));
    }
    parse(&stdout, kernel, metrics).map_err(fail)
}

/// Reads the metrics of the row for `kernel` from ncu's `--csv --page raw` output: a header row,
/// a units row, one row per profiled launch; ncu's own `==PROF==` lines are skipped.
pub fn parse(stdout: &str, kernel: &str, metrics: &[&str]) -> std::result::Result<BTreeMap<String, f64>, String> {
    let csv_text: String = stdout.lines().filter(|l| !l.starts_with("==")).map(|l| format!("{l}\n")).collect();
    let mut rows = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(csv_text.as_bytes()).into_records();
    let header = loop {
        match rows.next() {
            Some(Ok(r)) if r.iter().any(|f| f == "Kernel Name") => break r,
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(format!("unreadable ncu CSV: {e}")),
            None => return Err(format!("no ncu result for kernel `{kernel}` (was it launched?)")),
        }
    };
    let col = |name: &str| header.iter().position(|f| f == name);
    let name_col = col("Kernel Name").expect("found above");
    for row in rows {
        let row = row.map_err(|e| format!("unreadable ncu CSV: {e}"))?;
        if !row.get(name_col).is_some_and(|n| n.starts_with(kernel)) {
            continue; // the units row, or another kernel
        }
        let mut out = BTreeMap::new();
        for m in metrics {
            let i = col(m).ok_or_else(|| format!("ncu reported no column `{m}`"))?;
            let text = row.get(i).unwrap_or_default().replace(',', "");
            let v: f64 = text.parse().map_err(|_| format!("metric `{m}` is `{text}`, not a number"))?;
            out.insert(m.to_string(), v);
        }
        return Ok(out);
    }
    Err(format!("no ncu row for kernel `{kernel}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = r#"==PROF== Connected to process 4242 (/x/lab)
==PROF== Profiling "divergence_paths_branch_f32": 0%....50%....100% - 3 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","smsp__sass_branch_targets.sum","smsp__thread_inst_executed_per_inst_executed.ratio"
"","","","","","","","","ratio"
"0","4242","lab","127.0.0.1","divergence_paths_branch_f32","1","13","1,048,576","7.98"
==PROF== Disconnected from process 4242
"#;

    #[test]
    fn reads_the_kernel_row_with_thousands_separators() {
        let m = parse(OUT, "divergence_paths_branch_f32", &["smsp__thread_inst_executed_per_inst_executed.ratio", "smsp__sass_branch_targets.sum"]).unwrap();
        assert_eq!(m["smsp__sass_branch_targets.sum"], 1048576.0);
        assert_eq!(m["smsp__thread_inst_executed_per_inst_executed.ratio"], 7.98);
    }

    #[test]
    fn a_missing_kernel_or_metric_is_named() {
        assert!(parse(OUT, "other_kernel", &["smsp__sass_branch_targets.sum"]).unwrap_err().contains("other_kernel"));
        assert!(parse(OUT, "divergence_paths_branch_f32", &["no_such.metric"]).unwrap_err().contains("no_such.metric"));
        assert!(parse("==PROF== nothing\n", "k", &[]).unwrap_err().contains("no ncu result"));
    }
}
