//! Zero-copy weight loading over memory maps: [`gguf`] (llama.cpp's model files), and
//! [`gguf_writer`], which writes them.

pub mod gguf;
pub mod gguf_writer;

impl From<gguf::GgufError> for crate::LabError {
    fn from(e: gguf::GgufError) -> Self {
        crate::LabError::Invalid(format!("GGUF: {e}"))
    }
}
