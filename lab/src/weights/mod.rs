//! Zero-copy weight loading over memory maps: [`gguf`] (llama.cpp's model files).

pub mod gguf;

impl From<gguf::GgufError> for crate::LabError {
    fn from(e: gguf::GgufError) -> Self {
        crate::LabError::Invalid(format!("GGUF: {e}"))
    }
}
