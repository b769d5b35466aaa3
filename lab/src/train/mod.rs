//! Training a small Llama-architecture model from scratch with the lab's ops, then writing it as
//! a GGUF file the lab's engine (and llama.cpp) reads.
//!
//! - [`model`]: parameters, forward, backward, fused softmax cross-entropy, on either backend.
//! - [`steps`]: the parts of a step no op family has (embedding, RoPE, SwiGLU, the loss, AdamW),
//!   on the CPU and as the `train` family's kernels (kernels/train.cu).
//! - [`reference`]: the same loss in f64 end to end, the oracle of the gradient check.
//! - [`optim`]: AdamW, gradient clipping, the learning-rate schedule.
//! - [`data`]: token files, the training stream, evaluation windows.
//! - [`trainer`] and [`checkpoint`]: the loop's state, its step, and saving and resuming it;
//!   [`parallel`]: the step data-parallel over a group of ranks (GPUs, or threads on the CPU).
//! - [`export`]: the model as GGUF; [`pipeline`]: `lab pipeline`, all of it end to end.
//! - [`torch_ref`]: the same training in PyTorch, whose loss curve the lab's must match.

pub mod checkpoint;
pub mod data;
pub mod experiment;
pub mod export;
pub mod model;
pub mod optim;
pub mod parallel;
pub mod pipeline;
pub mod reference;
pub mod steps;
pub mod torch_ref;
pub mod trainer;

pub use model::{Batch, Layout, Model, Span};
pub use trainer::Trainer;

#[cfg(test)]
pub(crate) mod tests;
