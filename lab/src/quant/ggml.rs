//! GGUF / ggml block formats Q4_0 and Q4_1, bit-compatible with llama.cpp.
//!
//! Layout (ggml's `ggml-common.h`: `block_q4_0`, `block_q4_1`; algorithms from
//! `ggml/src/ggml-quants.c`: `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`,
//! `dequantize_row_q4_0`, `dequantize_row_q4_1`), 32 weights per block, little-endian:
//!
//! - Q4_0, 18 bytes: f16 `d`, then 16 bytes `qs`; value = `(q - 8) * d`.
//! - Q4_1, 20 bytes: f16 `d`, f16 `m`, then 16 bytes `qs`; value = `q * d + m`.
//!
//! Inside a block, byte `qs[j]` holds element `j` in its LOW nibble and element `j + 16` in its
//! HIGH nibble (unlike [`super::int4`], where neighbours share a byte).
//!
//! The writers follow the reference quantizers step by step, so they produce the same bytes:
//! Q4_0 takes the element of largest magnitude (the first, if tied) as `max`, `d = max / -8`,
//! `q = min(15, trunc(x / d + 8.5))`; Q4_1 takes `d = (max - min) / 15`, `m = min`,
//! `q = min(15, trunc((x - min) / d + 0.5))`; both scale by `1/d` computed before `d` is rounded
//! to f16 (round to nearest even). Dequantizing multiplies then adds in f32 with two roundings
//! (no fused multiply-add), the formula as written.

use crate::{LabError, Result};
use half::f16;
use rayon::prelude::*;

/// Weights per block.
pub const QK: usize = 32;
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
/// Blocks per parallel task.
const PAR_BLOCKS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    Q4_0,
    Q4_1,
}

impl Block {
    pub fn bytes(self) -> usize {
        match self {
            Block::Q4_0 => Q4_0_BYTES,
            Block::Q4_1 => Q4_1_BYTES,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Block::Q4_0 => "q4_0",
            Block::Q4_1 => "q4_1",
        }
    }
    /// Bytes for `n` weights (`n` a multiple of 32).
    pub fn size_of(self, n: usize) -> usize {
        n / QK * self.bytes()
    }
}

fn check_len(n: usize, what: &str) -> Result<()> {
    if n.is_multiple_of(QK) {
        Ok(())
    } else {
        Err(LabError::shape(what, format!("{n} values are not a whole number of {QK}-weight blocks")))
    }
}

fn quantize_block(block: Block, x: &[f32], out: &mut [u8]) {
    let mut q = [0u8; QK];
    let (d, m) = match block {
        Block::Q4_0 => {
            let (mut amax, mut max) = (0f32, 0f32);
            for &v in x {
                if amax < v.abs() {
                    (amax, max) = (v.abs(), v);
                }
            }
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for (c, &v) in q.iter_mut().zip(x) {
                // C's (int8_t) cast truncates toward zero; the argument lies in [0.5, 16.5].
                *c = ((v * id + 8.5) as i8).min(15) as u8;
            }
            (d, None)
        }
        Block::Q4_1 => {
            let (lo, hi) = x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (if v < lo { v } else { lo }, if v > hi { v } else { hi }));
            let d = (hi - lo) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for (c, &v) in q.iter_mut().zip(x) {
                *c = (((v - lo) * id + 0.5) as i8).min(15) as u8;
            }
            (d, Some(lo))
        }
    };
    out[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let qs = match m {
        Some(m) => {
            out[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
            &mut out[4..20]
        }
        None => &mut out[2..18],
    };
    for j in 0..QK / 2 {
        qs[j] = q[j] | (q[j + QK / 2] << 4);
    }
}

/// Quantizes `x` (a multiple of 32 values, all finite) into blocks, llama.cpp's reference way.
pub fn quantize(block: Block, x: &[f32]) -> Result<Vec<u8>> {
    check_len(x.len(), block.name())?;
    super::group::check_finite(x, block.name())?;
    let bs = block.bytes();
    let mut out = vec![0u8; block.size_of(x.len())];
    out.par_chunks_mut(bs * PAR_BLOCKS).zip(x.par_chunks(QK * PAR_BLOCKS)).for_each(|(o, xs)| {
        for (ob, xb) in o.chunks_exact_mut(bs).zip(xs.chunks_exact(QK)) {
            quantize_block(block, xb, ob);
        }
    });
    Ok(out)
}

/// Scale, min (0 for Q4_0) and the 16 code bytes of one block.
#[inline]
pub fn parts(block: Block, b: &[u8]) -> (f32, f32, &[u8]) {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    match block {
        Block::Q4_0 => (d, 0.0, &b[2..18]),
        Block::Q4_1 => (d, f16::from_le_bytes([b[2], b[3]]).to_f32(), &b[4..20]),
    }
}

fn dequantize_block(block: Block, b: &[u8], y: &mut [f32]) {
    let (d, m, qs) = parts(block, b);
    let (lo, hi) = y.split_at_mut(QK / 2);
    for j in 0..QK / 2 {
        let (q0, q1) = ((qs[j] & 15) as i32, (qs[j] >> 4) as i32);
        match block {
            Block::Q4_0 => {
                lo[j] = (q0 - 8) as f32 * d;
                hi[j] = (q1 - 8) as f32 * d;
            }
            Block::Q4_1 => {
                lo[j] = q0 as f32 * d + m;
                hi[j] = q1 as f32 * d + m;
            }
        }
    }
}

/// Dequantizes whole blocks into `out` (32 values per block).
pub fn dequantize_into(block: Block, blocks: &[u8], out: &mut [f32]) -> Result<()> {
    let bs = block.bytes();
    if !blocks.len().is_multiple_of(bs) || blocks.len() / bs * QK != out.len() {
        return Err(LabError::shape(block.name(), format!("{} bytes are not {} blocks of {bs} bytes", blocks.len(), out.len() / QK)));
    }
    out.par_chunks_mut(QK * PAR_BLOCKS).zip(blocks.par_chunks(bs * PAR_BLOCKS)).for_each(|(ys, bl)| {
        for (y, b) in ys.chunks_exact_mut(QK).zip(bl.chunks_exact(bs)) {
            dequantize_block(block, b, y);
        }
    });
    Ok(())
}

pub fn dequantize(block: Block, blocks: &[u8]) -> Result<Vec<f32>> {
    if !blocks.len().is_multiple_of(block.bytes()) {
        return Err(LabError::shape(block.name(), format!("{} bytes are not a whole number of {}-byte blocks", blocks.len(), block.bytes())));
    }
    let mut out = vec![0f32; blocks.len() / block.bytes() * QK];
    dequantize_into(block, blocks, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Q4_0 block made by hand from the format: d = 0.5, element j has code j % 16.
    #[test]
    fn hand_made_blocks_decode_as_the_format_says() {
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        // qs[j]: element j (low) has code j, element j + 16 (high) has code 15 - j.
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize(Block::Q4_0, &b).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
        }
        let mut b1 = f16::from_f32(0.25).to_le_bytes().to_vec();
        b1.extend(f16::from_f32(-1.0).to_le_bytes());
        b1.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize(Block::Q4_1, &b1).unwrap();
        assert_eq!((y[0], y[15], y[16], y[31]), (-1.0, 2.75, 2.75, -1.0));
    }

    #[test]
    fn requantizing_a_dequantized_tensor_gives_the_same_bytes() {
        let x: Vec<f32> = (0..QK * 300).map(|i| (i as f32 * 0.37).sin() * (1.0 + (i / 32) as f32 * 0.01)).collect();
        for block in [Block::Q4_0, Block::Q4_1] {
            let b = quantize(block, &x).unwrap();
            assert_eq!(b.len(), block.size_of(x.len()));
            let y = dequantize(block, &b).unwrap();
            assert_eq!(quantize(block, &y).unwrap(), b, "{block:?}");
            let e = super::super::group::error_metrics(&x, &y).unwrap();
            assert!(e.sqnr_db > 15.0, "{block:?}: {e:?}");
        }
    }

    #[test]
    fn the_largest_magnitude_gets_code_zero_in_q4_0() {
        let mut x = [0.1f32; QK];
        x[3] = -2.0;
        x[20] = 1.0;
        let b = quantize(Block::Q4_0, &x).unwrap();
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 0.25, "d = max / -8");
        assert_eq!(b[2 + 3] & 15, 0, "x = max maps to q = 0");
        assert_eq!(b[2 + 4] >> 4, 12, "element 20 is the high nibble of qs[4]: trunc(1.0 / 0.25 + 8.5) = 12");
    }

    #[test]
    fn bad_input_is_named() {
        assert!(quantize(Block::Q4_1, &[0.0; 33]).unwrap_err().to_string().contains("33 values are not a whole number of 32-weight blocks"));
        assert!(quantize(Block::Q4_0, &[f32::INFINITY; 32]).unwrap_err().to_string().contains("not finite"));
        assert!(dequantize(Block::Q4_1, &[0u8; 21]).is_err());
        assert!(dequantize_into(Block::Q4_0, &[0u8; 18], &mut [0f32; 64]).is_err());
    }
}
