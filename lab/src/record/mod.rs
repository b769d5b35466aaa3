//! Experiment records: one JSON object per line in `reports/records/<run-id>.jsonl`.
//!
//! The field names are a contract with the notebooks, the report and outside scripts (see
//! DESIGN.md): add fields freely, never rename. Files are append-only; nothing rewrites them.

pub mod compare;
mod frame;
mod provenance;

pub use frame::{load, load_with_damage, Damage};
pub use provenance::{env_allow_listed, git_info, host_info, run_id, utc_now, GitInfo, HostInfo};

use crate::gpu::DeviceInfo;
use crate::profile::{Throughput, TimeSummary, TimingMode, Work};
use crate::{LabError, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

pub const SCHEMA: u32 = 1;

/// JSON has no NaN: serde_json writes one as null. Read null back as NaN, so that a record whose
/// statistic is NaN (a reference holding a NaN, say) still loads and still fails.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Error of a result against its reference.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ErrorStats {
    #[serde(deserialize_with = "nan_if_null")]
    pub max_abs: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub max_rel: f64,
    /// Largest |got - expected| / (atol + rtol * |expected|): <= 1 passes.
    #[serde(deserialize_with = "nan_if_null")]
    pub worst_fraction_of_tolerance: f64,
    /// Flat index of the worst element, what it was and what it should have been.
    pub worst_index: Option<u64>,
    pub worst_got: Option<f64>,
    pub worst_expected: Option<f64>,
    /// Elements that failed the tolerance (NaN where a number was expected counts).
    pub mismatches: u64,
    pub reference: String,
    /// Largest distance, in units in the last place of the output type, between an output and
    /// the reference rounded to that type (finite pairs only). Absent where outputs are not floats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ulp: Option<u64>,
    /// How each element's allowance was formed where it is more than the record's
    /// `atol + rtol |expected|` (a product's bound grows with its sum of absolute terms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<String>,
}

impl ErrorStats {
    /// No element compared yet: nothing wrong, against `reference`.
    pub fn empty(reference: &str) -> Self {
        ErrorStats {
            max_abs: 0.0,
            max_rel: 0.0,
            worst_fraction_of_tolerance: 0.0,
            worst_index: None,
            worst_got: None,
            worst_expected: None,
            mismatches: 0,
            reference: reference.into(),
            max_ulp: None,
            bound: None,
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    /// Correct, but faster than the device's measured ceiling allows: something is off.
    Implausible,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub schema: u32,
    pub run_id: String,
    /// `<run_id>#<n>`: what `lab rerun` takes.
    pub record_id: String,
    pub experiment: String,
    pub variant: String,
    pub provider: String,
    pub params: serde_json::Value,
    pub seed: u64,
    pub time_ms: Option<TimeSummary>,
    pub work: Work,
    pub throughput: Option<Throughput>,
    pub fraction_of_ceiling: Option<f64>,
    /// Which ceiling `fraction_of_ceiling` is measured against ("copy_gb_s", "fma_tflop_s", ...).
    pub ceiling: Option<String>,
    pub error: Option<ErrorStats>,
    pub tolerance: Option<Tolerance>,
    pub verdict: Verdict,
    pub timing: Option<TimingMode>,
    pub backend: String,
    pub device: DeviceInfo,
    pub host: HostInfo,
    pub git: GitInfo,
    pub lab_version: String,
    pub time: String,
    pub command: String,
    /// Allow-listed environment variables (NCCL_*, CUDA_*, OMPI_*) that change what a run does.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
    /// Whether the run used `--quick` sizes and budgets (a rerun repeats it).
    #[serde(default)]
    pub quick: bool,
    /// Where the params came from when not from the experiment's sweep: "command line" for a
    /// `lab run --shape`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_from: Option<String>,
    /// The kernel families the run had launched when it made this record, each with the hash of
    /// its source ([`crate::kernels::hash`]); empty where no lab kernel ran (CPU, peers alone).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kernels: std::collections::BTreeMap<String, String>,
    /// Free-form extras (peer versions, notes from the provider).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Appends records of one run to `<dir>/<run_id>.jsonl`, one flushed line each, so a crash
/// loses nothing already measured.
pub struct RunWriter {
    pub run_id: String,
    pub path: PathBuf,
    file: std::fs::File,
    count: usize,
}

impl RunWriter {
    pub fn create(dir: &Path, run_id: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| LabError::io(dir, format!("cannot create the records folder: {e}")))?;
        let path = dir.join(format!("{run_id}.jsonl"));
        // Never append to another run's file, whatever its id.
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(|e| LabError::io(&path, format!("cannot create the run file (another run with this id?): {e}")))?;
        Ok(RunWriter { run_id: run_id.into(), path, file, count: 0 })
    }

    /// The id the next record will get.
    pub fn next_id(&self) -> String {
        format!("{}#{}", self.run_id, self.count)
    }

    pub fn append(&mut self, record: &Record) -> Result<()> {
        let mut line = serde_json::to_string(record).map_err(|e| LabError::Invalid(format!("record not serialisable: {e}")))?;
        line.push('\n');
        // One write of the whole line: a run killed mid-way leaves complete lines and at most a
        // torn last one, which readers report and skip.
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush())
            .map_err(|e| LabError::io(&self.path, e))?;
        self.count += 1;
        Ok(())
    }

    pub fn count(&self) -> usize {
        self.count
    }
}

/// Every record under `path` (a folder of `.jsonl` files, or one file), typed; damaged lines
/// are returned beside them, never fatal.
pub fn read_records(path: &Path) -> Result<(Vec<Record>, Vec<Damage>)> {
    let mut records = Vec::new();
    let mut damage = Vec::new();
    for file in frame::record_files(path)? {
        let text = read_run_file(&file)?;
        let lines = text.lines().count();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match parse_line(line) {
                Ok(r) => records.push(r),
                // The writer ends every line it finishes: a damaged last line without its end is
                // one a killed run was writing.
                Err(why) if i + 1 == lines && !text.ends_with('\n') => {
                    damage.push(Damage { file: file.clone(), line: i + 1, why: format!("torn last line (the run was killed while writing it?): {why}") })
                }
                Err(why) => damage.push(Damage { file: file.clone(), line: i + 1, why }),
            }
        }
    }
    Ok((records, damage))
}

/// The text of a run file, gunzipped when its name ends in `.gz`.
fn read_run_file(file: &Path) -> Result<String> {
    use std::io::Read;
    if !file.to_str().is_some_and(|s| s.ends_with(".gz")) {
        return std::fs::read_to_string(file).map_err(|e| LabError::io(file, e));
    }
    let f = std::fs::File::open(file).map_err(|e| LabError::io(file, e))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(f).read_to_string(&mut text).map_err(|e| LabError::io(file, format!("not a readable gzip-compressed run file: {e}")))?;
    Ok(text)
}

fn parse_line(line: &str) -> std::result::Result<Record, String> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    match value.get("schema").and_then(|s| s.as_u64()) {
        Some(s) if s as u32 == SCHEMA => {}
        Some(s) => return Err(format!("schema {s} is not one this lab reads (it reads {SCHEMA})")),
        None => return Err("no `schema` field".into()),
    }
    serde_json::from_value(value).map_err(|e| format!("not a schema-{SCHEMA} record: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_nan_statistic_is_written_as_null_and_read_back_as_nan() {
        let e = super::ErrorStats {
            max_abs: 1.0,
            max_rel: f64::NAN,
            worst_fraction_of_tolerance: f64::NAN,
            worst_index: Some(2),
            worst_got: Some(1.0),
            worst_expected: None,
            mismatches: 1,
            reference: "a reference holding a NaN".into(),
            max_ulp: None,
            bound: None,
        };
        let text = serde_json::to_string(&e).unwrap();
        assert!(text.contains("\"worst_fraction_of_tolerance\":null"), "{text}");
        let back: super::ErrorStats = serde_json::from_str(&text).unwrap();
        assert!(back.max_rel.is_nan() && back.worst_fraction_of_tolerance.is_nan() && back.max_abs == 1.0 && back.mismatches == 1);
    }

    use proptest::prelude::*;

    const LINE: &str = include_str!("../../tests/fixtures/report/records/2026-11-22T14-00-38Z-h100-14a3904.jsonl");

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// A record line damaged anywhere (bytes replaced, cut short, spliced) reads as a record or
        /// as an error saying why, never a panic; the line as written reads back.
        #[test]
        fn a_damaged_record_line_is_an_error_not_a_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8), cut in any::<prop::sample::Index>()) {
            let line = LINE.lines().next().unwrap();
            prop_assert!(super::parse_line(line).is_ok());
            let mut b = line.as_bytes().to_vec();
            for (at, byte) in edits {
                let i = at.index(b.len());
                b[i] = byte;
            }
            b.truncate(cut.index(b.len() + 1));
            let _ = super::parse_line(&String::from_utf8_lossy(&b));
        }

        #[test]
        fn any_text_is_an_error_not_a_panic(text in ".{0,400}") {
            let _ = super::parse_line(&text);
        }
    }
}
