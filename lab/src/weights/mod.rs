//! Zero-copy weight loading over memory maps: [`gguf`] (llama.cpp's model files).

pub mod gguf;
