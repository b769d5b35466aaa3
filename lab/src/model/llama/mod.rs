//! A Llama-architecture model from its GGUF file: the hyper-parameters ([`Config`]), the tensors
//! ([`weights::Tensors`]), a CPU reference forward ([`CpuModel`], the oracle) and the GPU engine
//! ([`GpuModel`], weights kept quantized on the device, decode steps captured as a CUDA graph).

pub mod config;
pub mod cpu;
pub mod generate;
pub mod gpu;
pub mod sample;
pub mod weights;

pub use config::Config;
pub use cpu::{CpuCache, CpuModel};
pub use generate::{generate, Engine, Generated};
pub use gpu::{Batch, GpuModel};
pub use sample::Sampling;
