//! head_q8_0 (kernels/llama_head.cu): the decode step's tail in one launch, the output norm, the
//! LM head from its Q8_0 blocks repacked for mma.sync ([`pack_head`]) and the greedy choice.

use super::{check, FAMILY};
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::Result;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// The kernel's HD_MAXK (the widest x it normalises), HD_MAXB (sequences) and HD_THREADS.
pub const HEAD_MAX_WIDTH: usize = 1024;
pub const HEAD_MAX_SEQS: usize = 16;
const HEAD_THREADS: u32 = 256;

/// Where the codes of (row, column) of a 16-row tile's 32-column block sit among its 512 bytes:
/// mma.sync m16n8k16's A fragment (PTX ISA, "Matrix Fragments for mma.m16n8k16"): lane 4 g + c
/// holds rows g and g + 8 at columns 2 c, 2 c + 1, 2 c + 8 and 2 c + 9 of each k16 step, as
/// word 2 step + (columns 8 and up), row g's two codes then row g + 8's.
fn fragment_byte(row: usize, col: usize) -> usize {
    let (g, hi) = (row % 8, row / 8);
    let (step, kk) = (col / 16, col % 16);
    let (c, e, odd) = ((kk % 8) / 2, kk / 8, kk % 2);
    (4 * g + c) * 16 + (2 * step + e) * 4 + 2 * hi + odd
}

/// The head's `rows` x `cols` Q8_0 blocks (GGUF's 34-byte blocks, rows one after another) as
/// head_q8_0 reads them: the codes of each 16-row tile and 32-column block as 512 bytes in
/// fragment order ([`fragment_byte`]), then per (tile, block) 8 words, word g the f16 pair
/// (d of row g, d of row g + 8). Rows past the last tile's end are codes and scales of zero.
pub fn pack_head(blocks: &[u8], rows: usize, cols: usize) -> Result<(Vec<u8>, Vec<u32>)> {
    let kb = cols / 32;
    check("head_q8_0", cols.is_multiple_of(32) && blocks.len() == rows * kb * 34, || format!("{} bytes of Q8_0 for {rows} rows of {cols}", blocks.len()))?;
    let tiles = rows.div_ceil(16);
    let mut codes = vec![0u8; tiles * kb * 512];
    let mut scales = vec![0u32; tiles * kb * 8];
    for r in 0..rows {
        let (t, tr) = (r / 16, r % 16);
        for j in 0..kb {
            let b = &blocks[(r * kb + j) * 34..][..34];
            let at = (t * kb + j) * 512;
            for (col, &q) in b[2..].iter().enumerate() {
                codes[at + fragment_byte(tr, col)] = q;
            }
            let d = u16::from_le_bytes([b[0], b[1]]) as u32;
            scales[(t * kb + j) * 8 + tr % 8] |= d << (16 * (tr / 8));
        }
    }
    Ok((codes, scales))
}

/// A head repacked for head_q8_0, on the device.
pub struct PackedHead {
    codes: CudaSlice<u8>,
    scales: CudaSlice<u32>,
    pub rows: usize,
    pub cols: usize,
}

impl PackedHead {
    /// The codes (all but the scales' 1/17): what the last layers fetch into L2 ahead of it.
    pub fn codes(&self) -> &CudaSlice<u8> {
        &self.codes
    }

    pub fn new(gpu: &Gpu, blocks: &[u8], rows: usize, cols: usize) -> Result<Self> {
        check("head_q8_0", cols <= HEAD_MAX_WIDTH, || format!("rows of {cols}: head_q8_0 normalises up to {HEAD_MAX_WIDTH}"))?;
        let (codes, scales) = pack_head(blocks, rows, cols)?;
        Ok(PackedHead { codes: gpu.upload(&codes)?, scales: gpu.upload(&scales)?, rows, cols })
    }
}

/// The greedy choice's scratch: each block's choice per sequence, and the count of blocks done
/// (zero between launches: the last block resets it).
pub struct HeadChoice {
    choice: CudaSlice<u64>,
    done: CudaSlice<u32>,
}

/// head_q8_0's grid: two blocks an SM (its registers and 37 KB of shared memory allow two), fewer
/// when the head has fewer tiles than warps.
fn head_blocks(gpu: &Gpu, rows: usize) -> usize {
    (2 * gpu.info.sm_count.max(1) as usize).min(rows.div_ceil(16).div_ceil(HEAD_THREADS as usize / 32)).max(1)
}

impl HeadChoice {
    pub fn new(gpu: &Gpu, rows: usize) -> Result<Self> {
        let choice = gpu.stream.alloc_zeros(head_blocks(gpu, rows) * HEAD_MAX_SEQS).doing("allocating head_q8_0's choices")?;
        let done = gpu.stream.alloc_zeros(1).doing("allocating head_q8_0's count")?;
        Ok(HeadChoice { choice, done })
    }
}

/// The sequences' tokens and positions, for the greedy choice.
pub struct Choose<'a> {
    pub scratch: &'a mut HeadChoice,
    pub tokens: &'a mut CudaSlice<u32>,
    pub pos: &'a mut CudaSlice<i32>,
    pub prompt_len: &'a CudaSlice<i32>,
    pub cap: usize,
}

/// logits [seqs, rows] = RMSNorm(x [seqs, cols]) gamma W^T; with `choose`, each sequence's next
/// token written and its position advanced as argmax does.
#[allow(clippy::too_many_arguments)]
pub fn head_q8_0(gpu: &Gpu, w: &PackedHead, x: &CudaSlice<f32>, gamma: &CudaSlice<f32>, eps: f32, logits: &mut CudaSlice<f32>, seqs: usize, choose: Option<Choose>) -> Result<()> {
    let (rows, cols) = (w.rows, w.cols);
    check("head_q8_0", (1..=HEAD_MAX_SEQS).contains(&seqs) && x.len() >= seqs * cols && gamma.len() == cols && logits.len() >= seqs * rows, || {
        format!("{seqs} sequences (1 to {HEAD_MAX_SEQS}) of {cols} -> {rows}: x {}, gamma {}, logits {}", x.len(), gamma.len(), logits.len())
    })?;
    let blocks = head_blocks(gpu, rows);
    if let Some(c) = &choose {
        check("head_q8_0", c.scratch.choice.len() >= blocks * HEAD_MAX_SEQS && c.tokens.len() >= seqs * c.cap && c.pos.len() >= seqs && c.prompt_len.len() >= seqs, || {
            format!("{seqs} sequences of {} positions: scratch for {} blocks, tokens {}, pos {}", c.cap, c.scratch.choice.len() / HEAD_MAX_SEQS, c.tokens.len(), c.pos.len())
        })?;
    }
    let f = gpu.function(FAMILY, &symbol(FAMILY, "head_q8_0", DType::F32))?;
    let [rows_i, cols_i, seqs_i] = [rows, cols, seqs].map(|v| v as i32);
    let null = 0u64;
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(&w.codes).arg(&w.scales).arg(x).arg(gamma).arg(&eps).arg(logits).arg(&rows_i).arg(&cols_i).arg(&seqs_i);
    let cap = choose.as_ref().map_or(0, |c| c.cap as i32);
    match choose {
        Some(c) => l.arg(&mut c.scratch.choice).arg(&mut c.scratch.done).arg(c.tokens).arg(c.pos).arg(c.prompt_len),
        None => l.arg(&null).arg(&null).arg(&null).arg(&null).arg(&null),
    };
    l.arg(&cap);
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (HEAD_THREADS, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the packed head holds its tiles, x, gamma and logits their sequences, the choice's
    // scratch a word per block and sequence for this grid and its count is zero between launches
    // (allocated zero, reset by the last block); tokens, pos and prompt_len hold the sequences
    // (all checked).
    unsafe { l.launch(cfg) }.map(|_| ()).doing("launching llama head_q8_0")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code lands on its own byte, and a lane's four words read back as the A fragments of
    /// the PTX ISA's table: rows g, g + 8 and columns 2 c + {0, 1} (+ 8) of each k16 step.
    #[test]
    fn packing_is_the_fragment_order() {
        let (rows, cols) = (19, 64);
        let kb = cols / 32;
        let mut blocks = vec![0u8; rows * kb * 34];
        for r in 0..rows {
            for j in 0..kb {
                let b = &mut blocks[(r * kb + j) * 34..][..34];
                b[..2].copy_from_slice(&(1000 + r as u16 * 3 + j as u16).to_le_bytes());
                for (i, q) in b[2..].iter_mut().enumerate() {
                    *q = ((r * 7 + j * 5 + i * 11) % 251) as u8;
                }
            }
        }
        let (codes, scales) = pack_head(&blocks, rows, cols).unwrap();
        assert_eq!(codes.len(), 2 * kb * 512);
        let code = |r: usize, col: usize| if r < rows { blocks[(r * kb + col / 32) * 34 + 2 + col % 32] } else { 0 };
        for t in 0..2 {
            for j in 0..kb {
                for lane in 0..32 {
                    let (g, c) = (lane / 4, lane % 4);
                    let at = (t * kb + j) * 512 + lane * 16;
                    for step in 0..2 {
                        for (e, k0) in [(0, 2 * c), (1, 2 * c + 8)] {
                            let word = &codes[at + (2 * step + e) * 4..][..4];
                            let col = 32 * j + 16 * step + k0;
                            let want = [code(16 * t + g, col), code(16 * t + g, col + 1), code(16 * t + g + 8, col), code(16 * t + g + 8, col + 1)];
                            assert_eq!(word, want, "tile {t} block {j} lane {lane} step {step} e {e}");
                        }
                    }
                    let d = scales[(t * kb + j) * 8 + g];
                    let scale = |r: usize| if r < rows { u16::from_le_bytes([blocks[(r * kb + j) * 34], blocks[(r * kb + j) * 34 + 1]]) as u32 } else { 0 };
                    assert_eq!(d, scale(16 * t + g) | scale(16 * t + g + 8) << 16);
                }
            }
        }
        assert!(pack_head(&blocks[1..], rows, cols).is_err());
    }
}
