//! Memory safety per family and variant, from `lab sanitize`'s records: for each GPU variant in
//! its family's table, what each compute-sanitizer tool found in the newest run of a committed
//! build that launched it, or that it was never run.

use crate::record::Record;
use serde::Serialize;
use std::collections::BTreeMap;

/// The experiment name `lab sanitize` records under.
pub const EXPERIMENT: &str = "sanitize";

#[derive(Serialize, Clone, Debug)]
pub struct Family {
    pub name: String,
    /// One line: how many variants are clean under every tool, at which commit(s).
    pub summary: String,
    pub tools: Vec<String>,
    pub rows: Vec<Row>,
}

#[derive(Serialize, Clone, Debug)]
pub struct Row {
    pub variant: String,
    /// Per tool of [`Family::tools`]: "clean (12 shapes)", "3 errors", "not run", ...
    pub cells: Vec<String>,
    pub commit: String,
    pub run_id: String,
    /// The first report of an erring record, for the reader to start from.
    pub first_error: Option<String>,
    pub clean: bool,
}

/// A sanitizer record's status: clean, library, errors, incomplete.
pub(super) fn status(r: &Record) -> &str {
    r.extra.get("sanitizer").and_then(|s| s.get("status")).and_then(|s| s.as_str()).unwrap_or("unknown")
}

/// The families with kernels, each variant's cells from the newest committed-build run that
/// launched it (directly, or inside a variant that covers it).
pub fn families(records: &[Record]) -> Vec<Family> {
    // A build with uncommitted changes says nothing about a commit's kernels.
    let runs: Vec<&Record> = records.iter().filter(|r| r.experiment == EXPERIMENT && !r.git.dirty).collect();
    // (family, variant) -> the records of the newest run that has it, and the variant standing in.
    let mut newest: BTreeMap<(String, String), (String, Vec<&Record>)> = BTreeMap::new();
    for r in &runs {
        let Some(family) = r.params.get("experiment").and_then(|v| v.as_str()) else { continue };
        let covers = r.extra["sanitizer"].get("covers").and_then(|c| c.as_array()).cloned().unwrap_or_default();
        let mut keys = vec![(family.to_string(), r.variant.clone())];
        keys.extend(covers.iter().filter_map(|c| c.as_str()?.split_once('/').map(|(f, v)| (f.to_string(), v.to_string()))));
        for key in keys {
            let e = newest.entry(key).or_insert_with(|| (r.run_id.clone(), Vec::new()));
            if r.run_id > e.0 {
                *e = (r.run_id.clone(), Vec::new());
            }
            if r.run_id == e.0 {
                e.1.push(r);
            }
        }
    }
    let tools = ["memcheck", "racecheck", "initcheck", "synccheck"];
    let mut out = Vec::new();
    for family in crate::family::with_kernels() {
        let Some(exp) = family.experiment else { continue };
        let mut rows = Vec::new();
        for v in (family.variants)().iter().filter(|v| v.requires != "cpu") {
            let found = newest.get(&(exp.name().to_string(), v.name.to_string())).or_else(|| newest.get(&(family.name.to_string(), v.name.to_string())));
            let cells: Vec<String> = tools
                .iter()
                .map(|t| {
                    let Some((_, recs)) = found else { return "not run".into() };
                    let mine: Vec<&&Record> = recs.iter().filter(|r| r.params["tool"] == *t).collect();
                    let count = |s: &str| mine.iter().filter(|r| status(r) == s).count();
                    let errors: u64 = mine.iter().filter(|r| status(r) == "errors").filter_map(|r| r.extra["sanitizer"]["errors"].as_u64()).sum();
                    if mine.is_empty() {
                        "not run".into()
                    } else if errors > 0 {
                        format!("{errors} error(s)")
                    } else if count("incomplete") > 0 {
                        format!("incomplete on {} of {} shapes", count("incomplete"), mine.len())
                    } else if count("library") > 0 {
                        format!("clean; library reports on {} shape(s)", count("library"))
                    } else {
                        format!("clean ({} shapes)", mine.len())
                    }
                })
                .collect();
            let clean = cells.iter().all(|c| c.starts_with("clean"));
            let first_error = found.and_then(|(_, recs)| recs.iter().find(|r| status(r) == "errors")).and_then(|r| r.extra["sanitizer"]["first_error"].as_str()).map(str::to_string);
            let (commit, run_id) = found.map(|(id, recs)| (recs[0].git.commit.chars().take(7).collect(), id.clone())).unwrap_or_default();
            rows.push(Row { variant: v.name.to_string(), cells, commit, run_id, first_error, clean });
        }
        if rows.is_empty() {
            continue;
        }
        let clean = rows.iter().filter(|r| r.clean).count();
        let not_run = rows.iter().filter(|r| r.cells.iter().all(|c| c == "not run")).count();
        let mut commits: Vec<&str> = rows.iter().filter(|r| !r.commit.is_empty()).map(|r| r.commit.as_str()).collect();
        commits.sort();
        commits.dedup();
        let at = if commits.is_empty() { String::new() } else { format!(" at {}", commits.join(", ")) };
        let summary = format!(
            "{clean} of {} GPU variants clean under every tool{at}{}",
            rows.len(),
            if not_run > 0 { format!("; {not_run} never run under the sanitizer") } else { String::new() }
        );
        out.push(Family { name: family.name.to_string(), summary, tools: tools.iter().map(|t| t.to_string()).collect(), rows });
    }
    out
}
