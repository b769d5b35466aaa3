//! 4-bit weights, the library: INT4 packing ([`int4`]), group-wise symmetric and asymmetric
//! quantizers with their error metrics and footprints ([`group`]), GGUF's Q4_0 / Q4_1 blocks and
//! 8-bit Q8_0 blocks, with the readers of GGUF tensor data into f32 ([`ggml`]), the 6-bit Q6_K
//! block ([`q6_k`]), the tile layout of the tensor-core GEMV's weights ([`tiles`]) and the CPU model of its kernels ([`w4a16_mma_model`]). The kernels,
//! callable ops and the `quant` experiment live in [`crate::ops::quant`].

pub mod ggml;
pub mod ggml_read;
pub mod group;
pub mod int4;
pub mod q6_k;
pub mod tiles;
pub mod w4a16_mma_model;

pub use group::{error_metrics, footprint, Footprint, Format, GroupQuant, QuantError, Scheme};
