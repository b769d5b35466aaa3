//! Where and from what a record was made: host, git state, time, run id.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HostInfo {
    pub cpu: String,
    pub cores: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GitInfo {
    pub commit: String,
    pub dirty: bool,
}

pub fn host_info() -> HostInfo {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    HostInfo { cpu, cores }
}

/// The commit the binary was built from (build.rs), so a binary copied to a host without the
/// repository still says where it came from.
pub fn git_info() -> GitInfo {
    GitInfo {
        commit: env!("LAB_GIT_COMMIT").to_string(),
        dirty: env!("LAB_GIT_DIRTY") == "true",
    }
}

/// The environment variables that change what a GPU or MPI run does, by prefix.
pub fn env_allow_listed() -> std::collections::BTreeMap<String, String> {
    std::env::vars().filter(|(k, _)| ["NCCL_", "CUDA_", "OMPI_"].iter().any(|p| k.starts_with(p))).collect()
}

/// RFC 3339 UTC time to the second.
pub fn utc_now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// `2026-11-22T14-03-11Z-h100-3f2a9c1-07be`: sortable, names the device and the commit, then 16
/// random bits.
pub fn run_id(device_name: &str, time: &str) -> String {
    let short = device_name
        .trim_start_matches("NVIDIA ")
        .split_whitespace()
        .next()
        .unwrap_or("cpu")
        .to_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>();
    let commit: String = git_info().commit.chars().take(7).collect();
    // Runs started in the same second on the same kind of device and commit (side by side, or on
    // two hosts whose records are merged later) still get distinct ids and files.
    let suffix: u16 = rand::random();
    format!("{}-{short}-{commit}-{suffix:04x}", time.replace(':', "-"))
}
