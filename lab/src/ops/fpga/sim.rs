//! The design as a cycle-accurate simulator: verilated at run time (as NVRTC compiles the CUDA
//! families), cached by a hash of the sources, the parameters and the Verilator version, and run
//! as a subprocess on rows written to a file. Building the crate needs no Verilator; running
//! the `fpga` experiment does.

use crate::{LabError, Result};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::process::Command;

/// The design's files, as the simulator's build directory holds them.
pub const SOURCES: &[(&str, &str)] = &[
    ("softmax.sv", include_str!("../../../../hw/softmax/softmax.sv")),
    ("tb.cpp", include_str!("../../../../hw/softmax/tb.cpp")),
    ("exp2_lut.mem", include_str!("../../../../hw/softmax/exp2_lut.mem")),
    ("recip_lut.mem", include_str!("../../../../hw/softmax/recip_lut.mem")),
];

/// `LAB_VERILATOR`, else `verilator` on the PATH.
fn verilator() -> String {
    std::env::var("LAB_VERILATOR").unwrap_or_else(|_| "verilator".into())
}

/// `verilator --version`, or an error that names the package to install.
pub fn version() -> Result<String> {
    version_of(&verilator())
}

/// [`version`] of the given binary.
pub fn version_of(bin: &str) -> Result<String> {
    let out = Command::new(bin).arg("--version").output().map_err(|e| {
        LabError::Invalid(format!(
            "the fpga experiment simulates its design with Verilator, and `{bin}` cannot be run ({e}): install the `verilator` package (Debian/Ubuntu: apt-get install verilator) or name the binary in LAB_VERILATOR"
        ))
    })?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The lab's cache folder, then `verilator/` (beside NVRTC's `ptx/`).
fn cache_dir() -> PathBuf {
    crate::gpu::compile::lab_cache_dir().unwrap_or_else(std::env::temp_dir).join("verilator")
}

/// A built simulator of the design with `lanes` lanes.
pub struct Simulator {
    pub dir: PathBuf,
    pub lanes: usize,
}

/// What one simulation gave: fp32 output bits and the clock edges it took.
pub struct SimOutput {
    pub y: Vec<u32>,
    pub cycles: u64,
}

/// The key of a build: every source, the parameters and the tool's version.
fn key(sources: &[(&str, &str)], lanes: usize, version: &str) -> String {
    let mut h = Sha256::new();
    for (name, text) in sources {
        h.update(name.as_bytes());
        h.update(text.as_bytes());
    }
    h.update(format!("LANES={lanes} {version}").as_bytes());
    format!("softmax-l{lanes}-{:x}", h.finalize())
}

impl Simulator {
    /// The cached simulator for `lanes`, verilating and compiling it first when there is none.
    pub fn build(lanes: usize) -> Result<Simulator> {
        Self::build_from(SOURCES, lanes)
    }

    /// [`Simulator::build`] from the given sources (tests plant faults in them).
    pub fn build_from(sources: &[(&str, &str)], lanes: usize) -> Result<Simulator> {
        if !lanes.is_power_of_two() {
            return Err(LabError::Invalid(format!("fpga: lanes must be a power of two, not {lanes}")));
        }
        let version = version()?;
        let dir = cache_dir().join(key(sources, lanes, &version));
        if dir.join("sim").is_file() {
            return Ok(Simulator { dir, lanes });
        }
        // Built in a directory of its own, then renamed: processes building the same design at
        // once never see a half-written one.
        std::fs::create_dir_all(cache_dir()).map_err(|e| LabError::io(cache_dir(), e))?;
        let tmp = tempfile::tempdir_in(cache_dir()).map_err(|e| LabError::io(cache_dir(), e))?;
        for (name, text) in sources {
            std::fs::write(tmp.path().join(name), text).map_err(|e| LabError::io(tmp.path().join(name), e))?;
        }
        let out = Command::new(verilator())
            .current_dir(tmp.path())
            .args(["--cc", "--exe", "--build", "-j", "2", "--top-module", "softmax_stream", "--Mdir", "obj", "-o", "../sim"])
            .arg(format!("-GLANES={lanes}"))
            .args(["softmax.sv", "tb.cpp"])
            .output()
            .map_err(|e| LabError::Invalid(format!("running {}: {e}", verilator())))?;
        if !out.status.success() {
            return Err(LabError::Compile {
                family: "fpga".into(),
                arch: format!("verilator, LANES={lanes}"),
                log: format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
            });
        }
        let _ = std::fs::remove_dir_all(tmp.path().join("obj"));
        let built = tmp.keep();
        if std::fs::rename(&built, &dir).is_err() {
            // Another process got there first: theirs is the same build.
            let _ = std::fs::remove_dir_all(&built);
        }
        Ok(Simulator { dir, lanes })
    }

    /// Streams `x` (rows of `n` bf16 bit patterns) through the design.
    pub fn run(&self, x: &[u16], n: usize) -> Result<SimOutput> {
        if n == 0 || x.is_empty() || !x.len().is_multiple_of(n) {
            return Err(LabError::shape("fpga", format!("{} values do not make rows of {n}", x.len())));
        }
        let rows = x.len() / n;
        let io = tempfile::tempdir().map_err(|e| LabError::io(std::env::temp_dir(), e))?;
        let (input, output) = (io.path().join("x.bin"), io.path().join("y.bin"));
        std::fs::write(&input, x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).map_err(|e| LabError::io(&input, e))?;
        // The ROMs are read from the working directory.
        let out = Command::new(self.dir.join("sim"))
            .current_dir(&self.dir)
            .args([n.to_string(), rows.to_string()])
            .args([&input, &output])
            .output()
            .map_err(|e| LabError::io(self.dir.join("sim"), e))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(LabError::Invalid(format!("the fpga simulator failed: {stdout}{}", String::from_utf8_lossy(&out.stderr))));
        }
        let cycles = parse_cycles(&stdout)?;
        let bytes = std::fs::read(&output).map_err(|e| LabError::io(&output, e))?;
        Ok(SimOutput { y: bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(), cycles })
    }
}

fn parse_cycles(stdout: &str) -> Result<u64> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("cycles "))
        .and_then(|c| c.trim().parse().ok())
        .ok_or_else(|| LabError::Invalid(format!("the fpga simulator printed no `cycles N` line: {stdout:?}")))
}
