//! The tokens training reads: a text tokenized once with the model's tokenizer into a token file
//! (safetensors: one U32 tensor `tokens`, and the text it came from in the metadata), the stream
//! of windows a training step takes, and the held-out windows an evaluation takes.

use super::model::Batch;
use crate::model::tokenizer::Tokenizer;
use crate::{LabError, Result};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

/// Tokenizes the UTF-8 text at `text` and writes the ids to a new token file at `out`.
pub fn tokenize_file(tok: &Tokenizer, text: &Path, out: &Path) -> Result<Vec<u32>> {
    let s = std::fs::read_to_string(text).map_err(|e| LabError::io(text, format!("cannot read the text: {e}")))?;
    let ids = tok.encode(&s, false).map_err(|e| LabError::Invalid(format!("{}: {e}", text.display())))?;
    if ids.is_empty() {
        return Err(LabError::Invalid(format!("{} holds no tokens", text.display())));
    }
    let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(Dtype::U32, vec![ids.len()], &bytes).map_err(|e| LabError::Invalid(format!("token file: {e}")))?;
    let meta = HashMap::from([("source".to_string(), text.display().to_string()), ("text_bytes".to_string(), s.len().to_string())]);
    let file = safetensors::serialize([("tokens", view)], Some(meta)).map_err(|e| LabError::Invalid(format!("token file: {e}")))?;
    crate::weights::write_new(out, &file)?;
    Ok(ids)
}

/// The ids of a token file written by [`tokenize_file`].
pub fn read_tokens(path: &Path) -> Result<Vec<u32>> {
    let bytes = std::fs::read(path).map_err(|e| LabError::io(path, e))?;
    let bad = |why: String| LabError::Invalid(format!("{}: not a token file: {why}", path.display()));
    let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let t = st.tensor("tokens").map_err(|e| bad(e.to_string()))?;
    if t.dtype() != Dtype::U32 || t.shape().len() != 1 {
        return Err(bad(format!("`tokens` is {:?} {:?}, not a U32 vector", t.dtype(), t.shape())));
    }
    Ok(t.data().chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
}

/// Windows taken in order from a token stream: each step's batch starts where the last ended
/// (consecutive windows overlap by the one token that is both a target and the next input),
/// and the stream starts over when too little is left. `position` is all a resume needs.
#[derive(Clone, Debug)]
pub struct Stream {
    pub tokens: Vec<u32>,
    pub position: usize,
}

impl Stream {
    pub fn new(tokens: Vec<u32>, seq: usize) -> Result<Self> {
        if tokens.len() < seq + 1 {
            return Err(LabError::Invalid(format!("{} tokens do not make one window of {seq}+1", tokens.len())));
        }
        Ok(Stream { tokens, position: 0 })
    }

    pub fn next_batch(&mut self, rows: usize, seq: usize) -> Result<Batch> {
        let mut out = Vec::with_capacity(rows * (seq + 1));
        for _ in 0..rows {
            if self.position + seq + 1 > self.tokens.len() {
                self.position = 0;
            }
            out.extend_from_slice(&self.tokens[self.position..][..seq + 1]);
            self.position += seq;
        }
        Batch::new(out, rows, seq)
    }
}

/// Up to `max_windows` windows of `seq`+1 tokens from the start of `tokens`, in batches of at
/// most `rows`: what an evaluation reads.
pub fn eval_batches(tokens: &[u32], rows: usize, seq: usize, max_windows: usize) -> Result<Vec<Batch>> {
    let starts: Vec<usize> = (0..).map(|i| i * seq).take_while(|s| s + seq < tokens.len()).take(max_windows).collect();
    if starts.is_empty() {
        return Err(LabError::Invalid(format!("the held-out text has {} tokens: fewer than one window of {seq}+1", tokens.len())));
    }
    starts.chunks(rows).map(|c| Batch::new(c.iter().flat_map(|&s| tokens[s..=s + seq].to_vec()).collect(), c.len(), seq)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_takes_windows_in_order_and_starts_over_at_the_end() {
        let mut s = Stream::new((0..10).collect(), 3).unwrap();
        assert_eq!(s.next_batch(2, 3).unwrap().tokens, vec![0, 1, 2, 3, 3, 4, 5, 6]);
        // 6..=9 fits; then 9 + 4 > 10 starts over.
        assert_eq!(s.next_batch(2, 3).unwrap().tokens, vec![6, 7, 8, 9, 0, 1, 2, 3]);
        assert_eq!(s.position, 3);
        assert!(Stream::new(vec![1, 2], 2).unwrap_err().to_string().contains("2 tokens do not make one window of 2+1"));
    }

    #[test]
    fn evaluation_windows_cover_the_text_once() {
        let b = eval_batches(&(0..11).collect::<Vec<u32>>(), 2, 3, 10).unwrap();
        let windows: Vec<Vec<u32>> = b.iter().flat_map(|b| b.tokens.chunks(4).map(<[u32]>::to_vec).collect::<Vec<_>>()).collect();
        assert_eq!(windows, vec![vec![0, 1, 2, 3], vec![3, 4, 5, 6], vec![6, 7, 8, 9]]);
        assert_eq!(b.iter().map(|b| b.rows).collect::<Vec<_>>(), vec![2, 1]);
        assert!(eval_batches(&[1, 2, 3], 2, 3, 10).is_err());
    }

    #[test]
    fn a_token_file_reads_back_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let ids = [5u32, 0, 49151, 7];
        let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(Dtype::U32, vec![4], &bytes).unwrap();
        let path = dir.path().join("t.safetensors");
        std::fs::write(&path, safetensors::serialize([("tokens", view)], None).unwrap()).unwrap();
        assert_eq!(read_tokens(&path).unwrap(), ids);
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"not safetensors").unwrap();
        assert!(read_tokens(&junk).unwrap_err().to_string().contains("junk: not a token file"));
    }
}
