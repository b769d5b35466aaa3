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
        let bytes = std::fs::read(&file).map_err(|e| LabError::io(&file, e))?;
        let (r, d) = parse_run_file(&file, &bytes);
        records.extend(r);
        damage.extend(d);
    }
    Ok((records, damage))
}

/// The records in `bytes`, the content of the run file `file` (gunzipped when its name ends in
/// `.gz`), and its damaged lines: one that is not UTF-8, JSON or a record, and the line where
/// gzip data breaks off or goes bad. Every line before the damage reads.
pub fn parse_run_file(file: &Path, bytes: &[u8]) -> (Vec<Record>, Vec<Damage>) {
    use std::io::Read;
    let mut broken = None;
    let text: std::borrow::Cow<[u8]> = if file.to_str().is_some_and(|s| s.ends_with(".gz")) {
        let mut text = Vec::new();
        // Multi: gzip files joined end to end are one file. What came out before an error stays
        // in `text`; the line the error cut is not whole and goes with the damage.
        if let Err(e) = flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut text) {
            text.truncate(text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1));
            broken = Some(e);
        }
        text.into()
    } else {
        bytes.into()
    };
    let (mut records, mut damage) = (Vec::new(), Vec::new());
    let mut lines = 0;
    for (i, piece) in text.split_inclusive(|&b| b == b'\n').enumerate() {
        lines = i + 1;
        let line = piece.strip_suffix(b"\n").unwrap_or(piece);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let parsed = match std::str::from_utf8(line) {
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => parse_line(line),
            Err(e) => Err(format!("not UTF-8: {e}")),
        };
        match parsed {
            Ok(r) => records.push(r),
            // The writer ends every line it finishes: a damaged last line without its end is
            // one a killed run was writing.
            Err(why) if !piece.ends_with(b"\n") => {
                damage.push(Damage { file: file.into(), line: lines, why: format!("torn last line (the run was killed while writing it?): {why}") })
            }
            Err(why) => damage.push(Damage { file: file.into(), line: lines, why }),
        }
    }
    if let Some(e) = broken {
        damage.push(Damage { file: file.into(), line: lines + 1, why: format!("not readable as gzip from this line on: {e}") });
    }
    (records, damage)
}

fn parse_line(line: &str) -> std::result::Result<Record, String> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    match value.get("schema").and_then(|s| s.as_u64()) {
        Some(s) if s == u64::from(SCHEMA) => {}
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

    use std::path::Path;

    /// The first `n` lines of the fixture, each ended as the writer ends it.
    fn lines(n: usize) -> Vec<u8> {
        LINE.lines().take(n).flat_map(|l| [l.as_bytes(), b"\n"].concat()).collect()
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn a_line_cut_inside_a_character_is_damage_and_the_lines_before_it_read() {
        // A kill mid-write can cut a multi-byte character ("é" is C3 A9): the file is not UTF-8.
        let bytes = [lines(2).as_slice(), b"{\"command\": \"caf\xC3"].concat();
        let (records, damage) = super::parse_run_file(Path::new("run.jsonl"), &bytes);
        assert_eq!(records.len(), 2);
        assert_eq!(damage.len(), 1, "{damage:?}");
        assert!(damage[0].to_string().starts_with("run.jsonl:3: torn last line") && damage[0].why.contains("not UTF-8"), "{}", damage[0]);
        // Not at the end: damage that is not a tear, and the line after it still reads.
        let bytes = [lines(1).as_slice(), b"\xFF\n", &lines(2)].concat();
        let (records, damage) = super::parse_run_file(Path::new("run.jsonl"), &bytes);
        assert_eq!((records.len(), damage.len(), damage[0].line), (3, 1, 2), "{damage:?}");
        assert!(damage[0].why.starts_with("not UTF-8"), "{}", damage[0]);
    }

    #[test]
    fn a_gzip_file_cut_short_keeps_its_whole_lines_and_names_the_line_it_breaks_in() {
        let all = LINE.lines().count();
        let gz = gzip(&lines(all));
        let (records, damage) = super::parse_run_file(Path::new("run.jsonl.gz"), &gz[..gz.len() / 2]);
        assert!(!records.is_empty() && records.len() < all, "{} of {all}", records.len());
        assert_eq!(damage.len(), 1, "{damage:?}");
        assert_eq!(damage[0].line, records.len() + 1);
        assert!(damage[0].why.starts_with("not readable as gzip from this line on"), "{}", damage[0]);
        // Not gzip at all: damage from line 1, not an error that stops other files loading.
        let (records, damage) = super::parse_run_file(Path::new("run.jsonl.gz"), b"not gzip at all");
        assert!(records.is_empty() && damage.len() == 1 && damage[0].line == 1, "{damage:?}");
    }

    #[test]
    fn gzip_files_joined_end_to_end_read_whole_and_garbage_after_them_is_damage() {
        let joined = [gzip(&lines(2)), gzip(&lines(3))].concat();
        let (records, damage) = super::parse_run_file(Path::new("run.jsonl.gz"), &joined);
        assert_eq!((records.len(), damage.len()), (5, 0), "{damage:?}");
        let (records, damage) = super::parse_run_file(Path::new("run.jsonl.gz"), &[gzip(&lines(2)).as_slice(), b"\0\0junk"].concat());
        assert_eq!(records.len(), 2);
        assert!(damage.len() == 1 && damage[0].line == 3, "{damage:?}");
    }

    #[test]
    fn a_schema_past_u32_is_not_read_as_schema_1() {
        let mut record: serde_json::Value = serde_json::from_str(LINE.lines().next().unwrap()).unwrap();
        record["schema"] = (u64::from(u32::MAX) + 2).into();
        let why = super::parse_line(&record.to_string()).unwrap_err();
        assert!(why.starts_with("schema 4294967297 is not one this lab reads"), "{why}");
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
