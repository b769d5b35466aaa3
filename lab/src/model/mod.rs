//! Models assembled from ops, and what they need around them (tokenizer, chat template).

pub mod eval;
pub mod llama;
pub mod tokenizer;
