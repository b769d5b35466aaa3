//! Errors a user can cause or meet: each names the thing that went wrong.

use std::path::PathBuf;

pub type Result<T, E = LabError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("no CUDA GPU is usable: {0}")]
    NoGpu(String),
    #[error("CUDA driver call failed while {doing}: {source}")]
    Driver { doing: String, source: cudarc::driver::DriverError },
    #[error("cuBLAS call failed while {doing}: {source}")]
    Cublas { doing: String, source: cudarc::cublas::result::CublasError },
    #[error("kernel family `{family}` failed to compile for {arch}:\n{log}")]
    Compile { family: String, arch: String, log: String },
    #[error("NVRTC is not available: {0}")]
    NoNvrtc(String),
    #[error("unknown experiment `{0}` (see `lab list`)")]
    UnknownExperiment(String),
    #[error("unknown variant `{variant}` for experiment `{experiment}`")]
    UnknownVariant { experiment: String, variant: String },
    #[error("bad shape for {what}: {why}")]
    Shape { what: String, why: String },
    #[error("{path}: {why}")]
    Io { path: PathBuf, why: String },
    #[error("peer `{peer}` failed: {why}")]
    Peer { peer: String, why: String },
    #[error("{0}")]
    Invalid(String),
}

impl LabError {
    pub fn io(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        LabError::Io { path: path.into(), why: err.to_string() }
    }
    pub fn shape(what: impl Into<String>, why: impl Into<String>) -> Self {
        LabError::Shape { what: what.into(), why: why.into() }
    }
}

/// Attach what we were doing to a driver error: `ctx.synchronize().doing("syncing")?`.
pub trait Doing<T> {
    fn doing(self, what: &str) -> Result<T>;
}

impl<T> Doing<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn doing(self, what: &str) -> Result<T> {
        self.map_err(|source| LabError::Driver { doing: what.to_string(), source })
    }
}

impl<T> Doing<T> for std::result::Result<T, cudarc::cublas::result::CublasError> {
    fn doing(self, what: &str) -> Result<T> {
        self.map_err(|source| LabError::Cublas { doing: what.to_string(), source })
    }
}
