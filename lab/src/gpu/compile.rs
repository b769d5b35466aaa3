//! NVRTC compilation with a disk cache keyed by source, options and NVRTC version.

use crate::{LabError, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Is libnvrtc loadable? cudarc panics on first use when it is not, so ask first.
pub fn nvrtc_present() -> bool {
    // SAFETY: only probes the dynamic loader.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        return Err(LabError::NoNvrtc(
            "libnvrtc.so.13 was not found by the dynamic loader (install the CUDA toolkit or the \
             `nvidia-cuda-nvrtc` wheel and add its lib folder to LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| LabError::NoNvrtc(format!("nvrtcVersion failed: {e:?}")))?;
    Ok((major, minor))
}

/// Where `cuda_bf16.h`, `cooperative_groups.h` and friends live: `LAB_CUDA_INCLUDE`, then
/// `CUDA_HOME`/`CUDA_PATH`, then `/usr/local/cuda/include`, then the `nvidia-cuda-runtime` wheel
/// of an active virtual environment.
pub fn cuda_include_dir() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(p) = std::env::var("LAB_CUDA_INCLUDE") {
        candidates.push(p.into());
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(p) = std::env::var(var) {
            candidates.push(PathBuf::from(p).join("include"));
        }
    }
    candidates.push("/usr/local/cuda/include".into());
    if let Ok(venv) = std::env::var("VIRTUAL_ENV") {
        if let Ok(entries) = std::fs::read_dir(PathBuf::from(venv).join("lib")) {
            for e in entries.flatten() {
                candidates.push(e.path().join("site-packages/nvidia/cu13/include"));
            }
        }
    }
    candidates.into_iter().find(|p| p.join("cuda_bf16.h").is_file())
}

/// What NVRTC compiles for: a compute capability as one number (90 for 9.0) and whether to use its
/// architecture-specific feature set (`compute_90a`: wgmma, setmaxnreg; kernels/gemm/ guards
/// such code with `__CUDA_ARCH_FEAT_SM90_ALL`). PTX built for `90a` loads on devices of exactly
/// 9.0 and on nothing else, so [`Target::for_device`] picks it for 9.0 alone; every family shares
/// the one rule (the rest compile to the same code either way). A plain number converts to the
/// portable target, so `compile_family(f, 90)` is `compute_90`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub arch: u32,
    pub specific: bool,
}

impl Target {
    /// The target a device of compute capability `arch` runs: `90a` on 9.0, else plain.
    pub fn for_device(arch: u32) -> Self {
        Target { arch, specific: arch == 90 }
    }
    /// NVRTC's `--gpu-architecture` value, e.g. `compute_90a`.
    pub fn gpu_architecture(&self) -> String {
        format!("compute_{self}")
    }
}

impl From<u32> for Target {
    fn from(arch: u32) -> Self {
        Target { arch, specific: false }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.arch, if self.specific { "a" } else { "" })
    }
}

impl std::str::FromStr for Target {
    type Err = String;
    /// `90` or `90a`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (digits, specific) = match s.strip_suffix('a') {
            Some(d) => (d, true),
            None => (s, false),
        };
        digits
            .parse()
            .map(|arch| Target { arch, specific })
            .map_err(|_| format!("`{s}` is not a compute capability such as 80, 90 or 90a"))
    }
}

/// Compiles one family to PTX for a target (`90` is `compute_90`), using the disk cache.
pub fn compile_family(family: &str, target: impl Into<Target>) -> Result<String> {
    compile_family_in(cache_dir().as_deref(), family, target)
}

/// [`compile_family`] with PTX cached in the folder `cache` (`None`: no disk cache). Tests give
/// their own folder, so they neither read nor fill the user's cache.
pub fn compile_family_in(cache: Option<&Path>, family: &str, target: impl Into<Target>) -> Result<String> {
    compile_source_in(cache, family, &crate::kernels::source(family)?, target)
}

/// What NVRTC makes of integer expressions in a family's source (its constants, `sizeof`s,
/// template members): a probe kernel compiled after the source stores each one, and the stores in
/// its PTX are read back, so a Rust mirror is tested against the kernel's own values. Each
/// expression must be a compile-time constant that fits 32 bits (`__float_as_uint(x)` for a float).
/// PTX is cached in `cache`, as [`compile_family_in`] does.
pub fn probe_u32(cache: Option<&Path>, family: &str, exprs: &[&str]) -> Result<Vec<u32>> {
    probe_source_u32(cache, family, &crate::kernels::source(family)?, exprs, 90.into())
}

/// [`probe_u32`] over any source and target: calls of a kernel's own index functions with
/// constant arguments fold to constants too, so a Rust mirror of a swizzle or a block order is
/// compared with what the kernel computes (sm_90a's functions need target `90a`).
pub fn probe_source_u32(cache: Option<&Path>, family: &str, source: &str, exprs: &[&str], target: Target) -> Result<Vec<u32>> {
    let stores: String = exprs.iter().enumerate().map(|(i, e)| format!("    o[{i}] = (unsigned)({e});\n")).collect();
    let src = format!("{source}\nextern \"C\" __global__ void lab_probe(volatile unsigned* o) {{\n{stores}}}\n");
    let ptx = compile_source_in(cache, &format!("{family}_probe"), &src, target)?;
    let body = ptx.split(".entry lab_probe(").nth(1).ok_or_else(|| LabError::Invalid("the probe kernel is missing from its PTX".into()))?;
    let mut regs = std::collections::HashMap::new();
    let mut got = vec![None; exprs.len()];
    for line in body.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")) {
        let line = line.as_str();
        if let Some(rest) = line.strip_prefix("mov.u32 ").or_else(|| line.strip_prefix("mov.b32 ")) {
            if let Some((reg, v)) = rest.trim_end_matches(';').split_once(", ") {
                regs.insert(reg.to_string(), v.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("st.volatile.global.u32 ").or_else(|| line.strip_prefix("st.volatile.global.b32 ")) {
            let Some((addr, v)) = rest.trim_end_matches(';').split_once("], ") else { continue };
            let offset: usize = addr.split_once('+').map_or(Some(0), |(_, o)| o.parse().ok()).unwrap_or(usize::MAX);
            let v = regs.get(v).cloned().unwrap_or_else(|| v.to_string());
            // PTX writes an immediate in decimal, negative past 2^31, or in hex.
            let value = v.parse::<u32>().ok().or_else(|| v.parse::<i32>().ok().map(|x| x as u32)).or_else(|| v.strip_prefix("0x").and_then(|h| u32::from_str_radix(h, 16).ok()));
            if let (Some(slot), Some(value)) = (got.get_mut(offset / 4), value) {
                *slot = Some(value);
            }
        }
    }
    exprs
        .iter()
        .zip(got)
        .map(|(e, v)| v.ok_or_else(|| LabError::Invalid(format!("`{e}` is not a 32-bit compile-time constant of `{family}`"))))
        .collect()
}

/// Compiles CUDA source named `family` (errors and cache files carry the name).
pub fn compile_source(family: &str, src: &str, target: impl Into<Target>) -> Result<String> {
    compile_source_in(cache_dir().as_deref(), family, src, target)
}

/// [`compile_source`] with PTX cached in the folder `cache` (`None`: no disk cache).
pub fn compile_source_in(cache: Option<&Path>, family: &str, src: &str, target: impl Into<Target>) -> Result<String> {
    let arch = target.into().gpu_architecture();
    let include = cuda_include_dir().ok_or_else(|| {
        LabError::NoNvrtc(
            "CUDA headers (cuda_bf16.h) not found: set LAB_CUDA_INCLUDE or CUDA_HOME".into(),
        )
    })?;
    let options = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        format!("-I{}", include.display()),
    ];
    let (major, minor) = nvrtc_version()?;
    let key = {
        let mut h = Sha256::new();
        h.update(src.as_bytes());
        for o in &options {
            h.update(o.as_bytes());
        }
        h.update(format!("nvrtc {major}.{minor}").as_bytes());
        format!("{family}-{:x}", h.finalize())
    };
    let cache = cache.map(|d| d.join(format!("{key}.ptx")));
    if let Some(path) = &cache {
        if let Ok(ptx) = std::fs::read_to_string(path) {
            return Ok(ptx);
        }
    }
    let opts = cudarc::nvrtc::CompileOptions { options, ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => LabError::Compile {
            family: family.into(),
            arch: arch.clone(),
            log: log.to_string_lossy().into_owned(),
        },
        other => LabError::Compile {
            family: family.into(),
            arch: arch.clone(),
            log: other.to_string(),
        },
    })?;
    let text = ptx.to_src();
    if let Some(path) = &cache {
        // A cache that cannot be written only costs a recompile next time. Each process writes
        // its own temporary file, so processes compiling the same family at once (tests, `lab
        // sanitize`) never rename a file another is still writing.
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        let _ = std::fs::create_dir_all(path.parent().unwrap())
            .and_then(|_| std::fs::write(&tmp, &text))
            .and_then(|_| std::fs::rename(&tmp, path));
    }
    Ok(text)
}

/// `LAB_CACHE_DIR`, else `~/.cache/lab/ptx`.
fn cache_dir() -> Option<PathBuf> {
    lab_cache_dir().map(|d| d.join("ptx"))
}

/// Where the lab caches what it builds at run time (PTX, simulators): `LAB_CACHE_DIR`, else
/// `~/.cache/lab`.
pub fn lab_cache_dir() -> Option<PathBuf> {
    std::env::var_os("LAB_CACHE_DIR").map(PathBuf::from).or_else(|| dirs::cache_dir().map(|d| d.join("lab")))
}
