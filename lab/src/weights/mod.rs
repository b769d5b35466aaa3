//! Zero-copy weight loading over memory maps: [`gguf`] (llama.cpp's model files), and
//! [`gguf_writer`], which writes them.

pub mod gguf;
pub mod gguf_writer;

impl From<gguf::GgufError> for crate::LabError {
    fn from(e: gguf::GgufError) -> Self {
        crate::LabError::Invalid(format!("GGUF: {e}"))
    }
}

/// Writes `bytes` at `path` through a temporary file beside it, so a failed write leaves nothing
/// half-written; an existing file is never replaced.
pub fn write_new(path: &std::path::Path, bytes: &[u8]) -> crate::Result<()> {
    use crate::LabError;
    if path.exists() {
        return Err(LabError::Invalid(format!("{} exists: choose another name or remove it", path.display())));
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| LabError::io(dir, e))?;
    std::io::Write::write_all(&mut tmp, bytes).map_err(|e| LabError::io(path, e))?;
    tmp.persist_noclobber(path).map_err(|e| LabError::io(path, e.error))?;
    Ok(())
}
