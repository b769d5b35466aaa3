//! `quant`: 4-bit weights. INT4 packing ([`int4`]), group-wise symmetric and asymmetric
//! quantizers with their error metrics and footprints ([`group`]), GGUF's Q4_0 / Q4_1 blocks
//! ([`ggml`]), the tile layout of the tensor-core GEMV's weights ([`tiles`]), and the `quant` experiment: packing and (de)quantization throughput, the W4A16
//! GEMV/GEMM kernels of kernels/quant.cu against cuBLAS on the dequantized weights, and the
//! requantization table of a real model (SmolLM2-135M, when `LAB_SMOLLM2_GGUF` names it).

pub mod experiment;
pub mod ggml;
pub mod group;
pub mod int4;
pub mod tiles;
#[cfg(test)]
mod w4a16_mma_model;

pub use group::{error_metrics, footprint, Footprint, Format, GroupQuant, QuantError, Scheme};
pub use experiment::Quant;

/// TEMPORARY until the table lands.
pub fn variants() -> Vec<crate::ops::variant::VariantInfo> {
    Vec::new()
}
