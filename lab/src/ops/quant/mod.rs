//! `quant`: 4-bit weights, and GGUF's 8-bit Q8_0, as callable ops (kernels/quant/ on the GPU,
//! the [`crate::quant`] library on the CPU): INT4 packing, dequantization, the read floor, the
//! W4A16 product Y = X W^T and Q8_0's W8A16 product and row gather, over one variant table whose names carry no parameters (scheme, batch and format
//! are params).
//!
//! - [`variants`]: the table, the W4A16 designs' launch shapes, the one function that spells a
//!   kernel symbol, and the reading of old records' parameterized names.
//! - [`launch`]: [`QuantTensor`] and the ops (`w4a16_matvec`, `dequantize`, `pack_int4`, ...).
//! - [`q8`]: [`Q8Tensor`] (GGUF Q8_0 blocks as stored) and its ops (`w8a16_matvec`,
//!   `embed_q8_0`, `dequantize_q8_0`).
//! - [`models`]: what the W4A16 designs and the W8A16 kernel compute, replayed on the CPU; the
//!   CUDA-core kernels' models are the CPU variants `cpu_w4a16` and `cpu_w8a16`.
//! - [`reference`]: the one-element-at-a-time dequantizer, the f64 product, the checks.
//! - [`experiment`]: the `quant` experiment, measuring every row through the ops.

pub mod experiment;
pub mod launch;
pub mod models;
pub mod q8;
pub mod reference;
pub mod variants;

pub use experiment::Quant;
pub use launch::{
    best_w4a16, default_layout, dequantize, dequantize_with, pack_int4, pack_int4_with, stream_read_blocks, stream_read_with, unpack_int4,
    unpack_int4_with, w4a16_matvec, w4a16_matvec_with, QuantTensor,
};
pub use crate::quant::{Format, Scheme};
pub use q8::{dequantize_q8_0, dequantize_q8_0_with, embed_q8_0, embed_q8_0_with, w8a16_matvec, w8a16_matvec_with, Q8Tensor};
pub use variants::{current_name, variants, Layout, VARIANTS};
