//! lab: a GPU-kernel research lab.
//!
//! Kernels live in `kernels/` (a file or a folder per family) and are compiled at run time by
//! NVRTC; each family has a Rust module in [`ops`] holding its variant table, CPU reference,
//! callable ops on [`tensor::Tensor`]s and experiment; [`family::FAMILIES`] lists them all.
//! Every measurement becomes a [`record::Record`], appended to `reports/records/<run-id>.jsonl`.

pub mod collective;
pub mod data;
pub mod error;
pub mod experiment;
pub mod family;
pub mod gpu;
pub mod kernels;
pub mod model;
pub mod ops;
pub mod profile;
pub mod quant;
pub mod record;
pub mod report;
pub mod tensor;
pub mod train;
pub mod weights;

pub use error::{LabError, Result};
/// The DataFrame library behind [`record::load`], for notebooks and scripts building their own.
pub use polars;

/// What a notebook or script needs in one `use lab::prelude::*;`.
pub mod prelude {
    pub use crate::error::{LabError, Result};
    pub use crate::experiment::{find, registry, Backend, BackendChoice, Experiment, RunOptions, Session};
    pub use crate::kernels::DType;
    pub use crate::gpu::Gpu;
    pub use crate::ops::{attention, bias_gelu, gemm, layernorm, linear, quant, rmsnorm, softmax, vector_add};
    pub use crate::tensor::Tensor;
    pub use crate::record::{load, load_with_damage, read_records, Record};
    pub use crate::report::charts;
    pub use crate::report::show::{Markdown, Svg, Table};
}
