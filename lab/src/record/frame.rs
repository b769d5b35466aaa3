//! Records as a polars DataFrame with flat columns (`time_ms.median`, `params.cols`, ...).

use super::{read_records, Record};
use crate::{LabError, Result};
use polars::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A line that could not be read, with where it is and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Damage {
    pub file: PathBuf,
    pub line: usize,
    pub why: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.why)
    }
}

/// Loads every record under `dir` into a DataFrame; damaged lines are reported on stderr and
/// skipped.
pub fn load(dir: impl AsRef<Path>) -> Result<DataFrame> {
    let (frame, damage) = load_with_damage(dir)?;
    for d in &damage {
        eprintln!("skipped a damaged record line: {d}");
    }
    Ok(frame)
}

/// Like [`load`], returning the damaged lines instead of printing them.
pub fn load_with_damage(dir: impl AsRef<Path>) -> Result<(DataFrame, Vec<Damage>)> {
    let (records, damage) = read_records(dir.as_ref())?;
    Ok((to_frame(&records)?, damage))
}

/// `.jsonl` and `.jsonl.gz` files under a folder in name order, or the one file given.
pub(super) fn record_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| LabError::io(path, format!("cannot read the records folder: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(".jsonl") || s.ends_with(".jsonl.gz")))
        .collect();
    files.sort();
    Ok(files)
}

/// One column per leaf of the record's JSON; arrays (raw samples) stay JSON text.
fn to_frame(records: &[Record]) -> Result<DataFrame> {
    let mut rows: Vec<BTreeMap<String, serde_json::Value>> = Vec::with_capacity(records.len());
    for r in records {
        let mut flat = BTreeMap::new();
        let value = serde_json::to_value(r).map_err(|e| LabError::Invalid(e.to_string()))?;
        flatten("", &value, &mut flat);
        rows.push(flat);
    }
    let mut names: Vec<String> = rows.iter().flat_map(|r| r.keys().cloned()).collect();
    names.sort();
    names.dedup();
    let columns: Vec<Column> = names.iter().map(|name| column(name, &rows)).collect();
    DataFrame::new(rows.len(), columns).map_err(|e| LabError::Invalid(format!("building the records frame: {e}")))
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// Numbers become f64, booleans bool, everything else a string; missing cells are null.
fn column(name: &str, rows: &[BTreeMap<String, serde_json::Value>]) -> Column {
    use serde_json::Value as V;
    let cells: Vec<Option<&V>> = rows.iter().map(|r| r.get(name).filter(|v| !v.is_null())).collect();
    if cells.iter().flatten().all(|v| v.is_number()) {
        let vals: Vec<Option<f64>> = cells.iter().map(|c| c.and_then(|v| v.as_f64())).collect();
        Column::new(name.into(), vals)
    } else if cells.iter().flatten().all(|v| v.is_boolean()) {
        let vals: Vec<Option<bool>> = cells.iter().map(|c| c.and_then(|v| v.as_bool())).collect();
        Column::new(name.into(), vals)
    } else {
        let vals: Vec<Option<String>> = cells
            .iter()
            .map(|c| c.map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())))
            .collect();
        Column::new(name.into(), vals)
    }
}
