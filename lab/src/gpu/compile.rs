//! NVRTC compilation with a disk cache keyed by source, options and NVRTC version.

use crate::{LabError, Result};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

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

/// Compiles one family to PTX for `compute_<arch>` (e.g. 90), using the disk cache.
pub fn compile_family(family: &str, arch: u32) -> Result<String> {
    compile_source(family, &crate::kernels::source(family)?, arch)
}

/// Compiles CUDA source named `family` (errors and cache files carry the name).
pub fn compile_source(family: &str, src: &str, arch: u32) -> Result<String> {
    let include = cuda_include_dir().ok_or_else(|| {
        LabError::NoNvrtc(
            "CUDA headers (cuda_bf16.h) not found: set LAB_CUDA_INCLUDE or CUDA_HOME".into(),
        )
    })?;
    let options = vec![
        format!("--gpu-architecture=compute_{arch}"),
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
    let cache = cache_dir().map(|d| d.join(format!("{key}.ptx")));
    if let Some(path) = &cache {
        if let Ok(ptx) = std::fs::read_to_string(path) {
            return Ok(ptx);
        }
    }
    let opts = cudarc::nvrtc::CompileOptions { options, ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => LabError::Compile {
            family: family.into(),
            arch: format!("compute_{arch}"),
            log: log.to_string_lossy().into_owned(),
        },
        other => LabError::Compile {
            family: family.into(),
            arch: format!("compute_{arch}"),
            log: other.to_string(),
        },
    })?;
    let text = ptx.to_src();
    if let Some(path) = &cache {
        // A cache that cannot be written only costs a recompile next time.
        let _ = std::fs::create_dir_all(path.parent().unwrap())
            .and_then(|_| std::fs::write(path.with_extension("tmp"), &text))
            .and_then(|_| std::fs::rename(path.with_extension("tmp"), path));
    }
    Ok(text)
}

/// `LAB_CACHE_DIR`, else `~/.cache/lab/ptx`.
fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("LAB_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| dirs::cache_dir().map(|d| d.join("lab")))
        .map(|d| d.join("ptx"))
}
