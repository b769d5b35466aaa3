//! The tokens training reads: a text tokenized once with the model's tokenizer into a token file
//! (safetensors: one U32 tensor `tokens`, and the text it came from in the metadata), the stream
//! of windows a training step takes (read from the token file through [`crate::data::Loader`]
//! by the pipeline's loop, [`window_loader`]), and the held-out windows an evaluation takes.

use super::model::Batch;
use crate::data::{self, Loader, ReadMode};
use crate::experiment::Backend;
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
    let meta = HashMap::from([("source".to_string(), text.display().to_string()), ("text_bytes".to_string(), s.len().to_string())]);
    write_tokens(&ids, meta, out)?;
    Ok(ids)
}

/// Writes `ids` to a new token file at `out`, with `meta` in its header.
pub fn write_tokens(ids: &[u32], meta: HashMap<String, String>, out: &Path) -> Result<()> {
    let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(Dtype::U32, vec![ids.len()], &bytes).map_err(|e| LabError::Invalid(format!("token file: {e}")))?;
    let file = safetensors::serialize([("tokens", view)], Some(meta)).map_err(|e| LabError::Invalid(format!("token file: {e}")))?;
    crate::weights::write_new(out, &file)
}

/// Where a token file's ids lie: (byte offset of the first, how many), from its header alone.
pub fn token_data(path: &Path) -> Result<(u64, usize)> {
    token_map(path).map(|(_, offset, count)| (offset as u64, count))
}

/// The token file mapped, with the offset and count of its ids, its header checked.
fn token_map(path: &Path) -> Result<(memmap2::Mmap, usize, usize)> {
    let file = std::fs::File::open(path).map_err(|e| LabError::io(path, format!("cannot open: {e}")))?;
    // SAFETY: read-only; the header check below covers the whole map.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| LabError::io(path, format!("cannot map: {e}")))?;
    let bad = |why: String| LabError::Invalid(format!("{}: not a token file: {why}", path.display()));
    let (header, meta) = SafeTensors::read_metadata(&map).map_err(|e| bad(e.to_string()))?;
    let t = meta.info("tokens").ok_or_else(|| bad("no tensor `tokens`".into()))?;
    if t.dtype != Dtype::U32 || t.shape.len() != 1 {
        return Err(bad(format!("`tokens` is {:?} {:?}, not a U32 vector", t.dtype, t.shape)));
    }
    let (offset, count) = (8 + header + t.data_offsets.0, t.shape[0]);
    Ok((map, offset, count))
}

/// A loader of a token file's windows of `seq + 1` tokens, window j starting at token j seq (each
/// shares its last token with the next one's first), `rows` to a batch, read ahead into host
/// buffers by the loader's reader thread through a memory map.
pub fn window_loader(path: &Path, rows: usize, seq: usize) -> Result<Loader> {
    let (offset, _) = token_data(path)?;
    let cfg = data::Config { offset, stride: Some(seq * 4), read: ReadMode::Mmap, threads: 1, ..data::Config::tokens(seq + 1, 4, rows) };
    Loader::open(path, cfg, &Backend::Cpu)
}

/// The next batch of an epoch of [`window_loader`]'s windows, as a training batch.
pub fn next_window_batch(epoch: &mut data::Epoch<'_>, seq: usize) -> Result<Batch> {
    let b = epoch.next_batch()?.ok_or_else(|| LabError::Invalid("the token file's epoch ended before the steps did".into()))?;
    let data::BatchData::Host(bytes) = b.data else { unreachable!("window_loader runs on the CPU backend") };
    let tokens = bytes.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes"))).collect();
    Batch::new(tokens, b.samples.len(), seq)
}

/// The ids of a token file written by [`tokenize_file`].
pub fn read_tokens(path: &Path) -> Result<Vec<u32>> {
    let (map, offset, count) = token_map(path)?;
    Ok(map[offset..][..4 * count].chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
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
        let out = self.take_windows(rows, seq).into_iter().flat_map(|at| self.tokens[at..][..seq + 1].to_vec()).collect();
        Batch::new(out, rows, seq)
    }

    /// Where the next `count` windows start, the position moved past them as that many rows of
    /// [`Stream::next_batch`] move it.
    pub fn take_windows(&mut self, count: usize, seq: usize) -> Vec<usize> {
        (0..count)
            .map(|_| {
                if self.position + seq + 1 > self.tokens.len() {
                    self.position = 0;
                }
                self.position += seq;
                self.position - seq
            })
            .collect()
    }

    /// The next `count` windows as indices of [`window_loader`]'s windows (window j starts at
    /// token j seq); a position between window starts is an error.
    pub fn take_window_indices(&mut self, count: usize, seq: usize) -> Result<Vec<u64>> {
        if !self.position.is_multiple_of(seq) {
            return Err(LabError::Invalid(format!("the data position {} is not a window start (a multiple of {seq})", self.position)));
        }
        Ok(self.take_windows(count, seq).into_iter().map(|at| (at / seq) as u64).collect())
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
