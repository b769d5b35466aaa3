//! The algorithm and protocol NCCL chose for each collective, read from its own debug log.
//!
//! NCCL reads its environment once, at its first call in a process. [`prepare_env`] sets it
//! before that: NVLink multicast off (`NCCL_NVLS_ENABLE=0`, see GPU.md), and, unless the user
//! asked for NCCL's debug output themselves, `NCCL_DEBUG=INFO` with `NCCL_DEBUG_SUBSYS=TUNING`
//! into a file of this process (`NCCL_DEBUG_FILE`), which [`Log`] reads back. Rank 0 of a
//! communicator writes one tuning line per collective; its form changed across versions:
//!
//! - 2.23 on: `AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}`
//! - before: `4096 Bytes -> Algo 1 proto 0 time 12.3` (numbers: NCCL's enums)
//! - the newest also: `Best tuning, algorithm, RING, protocol, SIMPLE`

use crate::{LabError, Result};
use regex::Regex;
use serde::Serialize;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::OnceLock;

/// One tuning decision: the collective (when the line names it), its size, algorithm, protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Choice {
    pub func: Option<String>,
    pub bytes: Option<u64>,
    pub algo: String,
    pub proto: String,
}

/// NCCL's `ncclAlgo` and `ncclProtocol` enums, for the older numeric lines.
const ALGOS: [&str; 7] = ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"];
const PROTOS: [&str; 3] = ["LL", "LL128", "SIMPLE"];

fn patterns() -> &'static [Regex; 3] {
    static P: OnceLock<[Regex; 3]> = OnceLock::new();
    P.get_or_init(|| {
        [
            r"NCCL INFO (\w+): (\d+) Bytes -> Algo ([A-Za-z_]+) proto ([A-Za-z0-9_]+)",
            r"NCCL INFO (\d+) Bytes -> Algo (\d+) proto (\d+)",
            r"NCCL INFO Best tuning, algorithm, ([A-Za-z_]+), protocol, ([A-Za-z0-9_]+)",
        ]
        .map(|p| Regex::new(p).expect("a valid pattern"))
    })
}

/// The tuning decision on one line of NCCL's log, if the line holds one.
pub fn parse_line(line: &str) -> Option<Choice> {
    let [named, numbered, best] = patterns();
    if let Some(c) = named.captures(line) {
        return Some(Choice { func: Some(c[1].to_string()), bytes: c[2].parse().ok(), algo: c[3].to_string(), proto: c[4].to_string() });
    }
    if let Some(c) = numbered.captures(line) {
        let name = |table: &[&str], i: &str| i.parse::<usize>().ok().and_then(|i| table.get(i)).map_or_else(|| format!("#{i}"), |s| s.to_string());
        return Some(Choice { func: None, bytes: c[1].parse().ok(), algo: name(&ALGOS, &c[2]), proto: name(&PROTOS, &c[3]) });
    }
    best.captures(line).map(|c| Choice { func: None, bytes: None, algo: c[1].to_string(), proto: c[2].to_string() })
}

/// The decision for an all-reduce of `bytes` among `choices` (the last that fits: a line that
/// names another collective or another size does not).
pub fn all_reduce_choice(choices: &[Choice], bytes: u64) -> Option<&Choice> {
    choices.iter().rev().find(|c| c.func.as_deref().is_none_or(|f| f == "AllReduce") && c.bytes.is_none_or(|b| b == bytes))
}

/// Sets NCCL's environment (see the module's head) once, before NCCL's first call; returns the
/// debug file the lab reads, or why there is none. Must run before any thread reads the
/// environment concurrently: the first NCCL world is opened from the main thread.
pub fn prepare_env() -> &'static std::result::Result<PathBuf, String> {
    static LOG: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    LOG.get_or_init(|| {
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
        }
        match (std::env::var("NCCL_DEBUG").ok(), std::env::var("NCCL_DEBUG_FILE").ok()) {
            (None, None) => {
                let path = std::env::temp_dir().join(format!("lab-nccl-{}.log", std::process::id()));
                std::env::set_var("NCCL_DEBUG", "INFO");
                std::env::set_var("NCCL_DEBUG_SUBSYS", "TUNING");
                std::env::set_var("NCCL_DEBUG_FILE", &path);
                Ok(path)
            }
            (_, Some(f)) if !f.contains('%') => Ok(PathBuf::from(f)),
            _ => Err("NCCL_DEBUG was set without a plain NCCL_DEBUG_FILE: NCCL's choices are not read".into()),
        }
    })
}

/// Reads the lines NCCL appended to its debug file since the last read.
pub struct Log {
    path: PathBuf,
    offset: u64,
}

impl Log {
    /// From the file's current end (a file not yet written starts at 0).
    pub fn open(path: PathBuf) -> Self {
        let offset = std::fs::metadata(&path).map_or(0, |m| m.len());
        Log { path, offset }
    }

    /// The decisions logged since the last call.
    pub fn take(&mut self) -> Result<Vec<Choice>> {
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(LabError::io(&self.path, e)),
        };
        f.seek(SeekFrom::Start(self.offset)).map_err(|e| LabError::io(&self.path, e))?;
        let mut text = String::new();
        f.read_to_string(&mut text).map_err(|e| LabError::io(&self.path, format!("reading NCCL's debug log: {e}")))?;
        // A line NCCL is still writing stays for the next read.
        let whole = text.rfind('\n').map_or(0, |i| i + 1);
        self.offset += whole as u64;
        Ok(text[..whole].lines().filter_map(parse_line).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_the_tuning_line_is_read() {
        let new = "host:1234:1240 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..15}";
        let c = parse_line(new).unwrap();
        assert_eq!((c.func.as_deref(), c.bytes, c.algo.as_str(), c.proto.as_str()), (Some("AllReduce"), Some(4194304), "RING", "SIMPLE"));
        let old = "host:1234:1240 [0] NCCL INFO 1024 Bytes -> Algo 0 proto 1 time 10.500000";
        assert_eq!(parse_line(old).unwrap(), Choice { func: None, bytes: Some(1024), algo: "TREE".into(), proto: "LL128".into() });
        let best = "host:1:2 [0] NCCL INFO Best tuning, algorithm, NVLS_TREE, protocol, LL";
        assert_eq!((parse_line(best).unwrap().algo.as_str(), parse_line(best).unwrap().proto.as_str()), ("NVLS_TREE", "LL"));
        // An enum value this table does not know is kept as its number, not dropped or misnamed.
        assert_eq!(parse_line("NCCL INFO 8 Bytes -> Algo 9 proto 2 time 1.0").unwrap().algo, "#9");
        for other in ["host:1:2 [0] NCCL INFO Channel 00/16 : 0 1", "NCCL INFO comm 0x5 rank 0 nranks 2", ""] {
            assert_eq!(parse_line(other), None, "{other}");
        }
    }

    #[test]
    fn the_choice_is_the_last_all_reduce_of_that_size() {
        let lines = [
            "NCCL INFO AllReduce: 64 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..0}",
            "NCCL INFO AllGather: 64 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}",
            "NCCL INFO AllReduce: 128 Bytes -> Algo RING proto LL128 channel{Lo..Hi}={0..0}",
        ];
        let cs: Vec<Choice> = lines.iter().filter_map(|l| parse_line(l)).collect();
        assert_eq!(all_reduce_choice(&cs, 64).unwrap().algo, "TREE");
        assert_eq!(all_reduce_choice(&cs, 128).unwrap().proto, "LL128");
        assert_eq!(all_reduce_choice(&cs, 256), None);
    }

    #[test]
    fn the_log_is_read_from_where_the_last_read_stopped() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nccl.log");
        let mut log = Log::open(path.clone());
        assert_eq!(log.take().unwrap(), Vec::new(), "no file yet");
        let mut f = std::fs::File::create(&path).unwrap();
        writeln!(f, "NCCL INFO AllReduce: 4 Bytes -> Algo TREE proto LL channel{{Lo..Hi}}={{0..0}}").unwrap();
        write!(f, "NCCL INFO AllReduce: 8 Bytes -> Algo RING").unwrap();
        assert_eq!(log.take().unwrap().len(), 1);
        writeln!(f, " proto LL channel{{Lo..Hi}}={{0..0}}").unwrap();
        let second = log.take().unwrap();
        assert_eq!((second.len(), second[0].bytes), (1, Some(8)), "a half-written line is read once complete");
        assert!(log.take().unwrap().is_empty());
    }
}
