//! GGUF's Q6_K block (ggml type 14), the format llama-quantize gives an output head whose width is
//! a multiple of 256: 256 weights in 210 bytes (6.5625 bits a weight), little-endian.
//!
//! Layout (ggml's `block_q6_K`): `ql` 128 bytes (low 4 bits of each code), `qh` 64 bytes (high 2
//! bits), `scales` 16 int8 (one per 16 weights), f16 `d`. Weight `i` has a 6-bit code `q` in
//! 0..64 and the value `d * scales[i / 16] * (q - 32)`. The 256 weights are two halves of 128; in
//! half `h`, weight `32 k + l` (quarter `k` in 0..4, `l` in 0..32) keeps its low bits in
//! `ql[64 h + l + 32 (k % 2)]` (the low nibble for quarters 0 and 1, the high for 2 and 3) and
//! its high bits at bit `2 k` of `qh[32 h + l]`.
//!
//! The quantizer is the lab's, not llama-quantize's (which searches each sub-block's scale for
//! the least weighted error): each 16-weight sub-block takes the element of largest magnitude
//! (the first, if tied) as `max` and the scale `max / -32`, so that element is code 0 (up to the
//! rounding of that scale to a multiple of `d`); the sub-block scale of largest magnitude sets `d = scale / -128`, every sub-block scale is
//! stored as `round(scale / d)` (at most 127), and each weight as `round(x / (d s)) + 32` clamped
//! to 0..63 (so a weight of the other sign as large as `max` reads back one step short: the codes
//! reach 32 steps one way and 31 the other). Its blocks and ggml's read alike, bit for bit, in
//! both directions (test `against_ggml`); on that test's 512 Gaussian values its error is 4% above
//! ggml's reference quantizer's (RMS 0.0784 against 0.0755).

use crate::{LabError, Result};
use half::f16;
use rayon::prelude::*;

/// Weights per block, and bytes.
pub const QK_K: usize = 256;
pub const Q6_K_BYTES: usize = 210;

/// Quantizes `x` (a multiple of 256 values, all finite) into Q6_K blocks.
pub fn quantize(x: &[f32]) -> Result<Vec<u8>> {
    if !x.len().is_multiple_of(QK_K) {
        return Err(LabError::shape("q6_k", format!("{} values are not a whole number of {QK_K}-weight blocks", x.len())));
    }
    super::group::check_finite(x, "q6_k")?;
    let mut out = vec![0u8; x.len() / QK_K * Q6_K_BYTES];
    out.par_chunks_exact_mut(Q6_K_BYTES).zip(x.par_chunks_exact(QK_K)).for_each(|(o, xb)| quantize_block(xb, o));
    Ok(out)
}

fn quantize_block(x: &[f32], out: &mut [u8]) {
    // Each sub-block's scale: its signed element of largest magnitude over -32.
    let mut scales = [0f32; QK_K / 16];
    for (s, sub) in scales.iter_mut().zip(x.chunks_exact(16)) {
        let max = sub.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        *s = max / -32.0;
    }
    let top = scales.iter().fold(0f32, |m, &s| if s.abs() > m.abs() { s } else { m });
    let (ql, rest) = out.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
    let (sc, d_bytes) = rest.split_at_mut(16);
    ql.fill(0);
    qh.fill(0);
    let d = f16::from_f32(top / -128.0);
    d_bytes.copy_from_slice(&d.to_le_bytes());
    let d = d.to_f32();
    for (i, (&s, b)) in scales.iter().zip(sc.iter_mut()).enumerate() {
        let q = if d != 0.0 { (s / d).round().clamp(-128.0, 127.0) as i8 } else { 0 };
        *b = q as u8;
        let step = d * q as f32;
        for (j, &v) in x[16 * i..16 * i + 16].iter().enumerate() {
            let code = if step != 0.0 { ((v / step).round().clamp(-32.0, 31.0) as i32 + 32) as u8 } else { 32 };
            let (h, r) = ((16 * i + j) / 128, (16 * i + j) % 128);
            let (k, l) = (r / 32, r % 32);
            ql[64 * h + l + 32 * (k % 2)] |= (code & 0xF) << (4 * (k / 2));
            qh[32 * h + l] |= (code >> 4) << (2 * k);
        }
    }
}

/// Q6_K blocks to f32 values, `d * scale` then times `q - 32`, one f32 rounding each (llama.cpp's
/// `dequantize_row_q6_K`).
pub fn dequantize(blocks: &[u8]) -> Result<Vec<f32>> {
    if !blocks.len().is_multiple_of(Q6_K_BYTES) {
        return Err(LabError::shape("q6_k", format!("{} bytes are not a whole number of {Q6_K_BYTES}-byte blocks", blocks.len())));
    }
    let mut out = vec![0f32; blocks.len() / Q6_K_BYTES * QK_K];
    out.par_chunks_exact_mut(QK_K).zip(blocks.par_chunks_exact(Q6_K_BYTES)).for_each(|(y, b)| {
        let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
        let d = f16::from_le_bytes([b[208], b[209]]).to_f32();
        for h in 0..2 {
            for l in 0..32 {
                let high = qh[32 * h + l];
                for k in 0..4 {
                    let low = ql[64 * h + l + 32 * (k % 2)] >> (4 * (k / 2)) & 0xF;
                    let q = (low | ((high >> (2 * k)) & 3) << 4) as i32 - 32;
                    let i = 128 * h + 32 * k + l;
                    y[i] = d * sc[i / 16] as i8 as f32 * q as f32;
                }
            }
        }
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block made by hand from the layout, weight by weight: d = 0.5, sub-block `s` scaled by
    /// `s - 8`, weight `i` coded `(7 i) % 64`. Every value is read back exactly.
    #[test]
    fn a_block_made_from_the_layout_reads_back_exactly() {
        let mut b = vec![0u8; Q6_K_BYTES];
        let code = |i: usize| (7 * i % 64) as u8;
        for i in 0..QK_K {
            // Half, then position within it: quarter k of 32, lane l.
            let (h, k, l) = (i / 128, i % 128 / 32, i % 32);
            let low_byte = 64 * h + l + if k == 1 || k == 3 { 32 } else { 0 };
            b[low_byte] |= if k >= 2 { (code(i) & 15) << 4 } else { code(i) & 15 };
            b[128 + 32 * h + l] |= (code(i) >> 4) << (2 * k);
        }
        for s in 0..16 {
            b[192 + s] = (s as i8 - 8) as u8;
        }
        b[208..210].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        let y = dequantize(&b).unwrap();
        for (i, &v) in y.iter().enumerate() {
            assert_eq!(v, 0.5 * ((i / 16) as f32 - 8.0) * (code(i) as f32 - 32.0), "weight {i}");
        }
    }

    /// Quantized and read back, every weight is within half a step of its sub-block, plus half a
    /// step more where it is clamped (the other sign's end of the codes is one step shorter), plus
    /// what rounding the sub-block's scale to a multiple of d moves (32 times half of d); the
    /// block's largest weight comes back to f16 precision; a zero sub-block stays zero.
    #[test]
    fn quantized_values_read_back_within_a_step() {
        let mut x: Vec<f32> = (0..2 * QK_K).map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0 * (1.0 + (i / 16 % 5) as f32)).collect();
        x[300..316].fill(0.0);
        let b = quantize(&x).unwrap();
        assert_eq!(b.len(), 2 * Q6_K_BYTES);
        let y = dequantize(&b).unwrap();
        for (blk, (xs, ys)) in x.chunks(QK_K).zip(y.chunks(QK_K)).enumerate() {
            let d = f16::from_le_bytes([b[blk * Q6_K_BYTES + 208], b[blk * Q6_K_BYTES + 209]]).to_f32();
            for (s, (xv, yv)) in xs.chunks(16).zip(ys.chunks(16)).enumerate() {
                let step = (d * b[blk * Q6_K_BYTES + 192 + s] as i8 as f32).abs();
                for (a, c) in xv.iter().zip(yv) {
                    assert!((a - c).abs() <= step + 16.0 * d.abs() + 1e-6, "block {blk} sub-block {s}: {a} read back as {c} (step {step})");
                }
            }
        }
        assert!(y[300..316].iter().all(|&v| v == 0.0));
        let (i, &m) = x[..QK_K].iter().enumerate().fold((0, &0f32), |(j, m), (i, v)| if v.abs() > m.abs() { (i, v) } else { (j, m) });
        assert!((y[i] - m).abs() <= m.abs() * 1e-3, "the largest weight {m} read back as {}", y[i]);
    }

    #[test]
    fn bad_lengths_and_values_are_named() {
        assert!(quantize(&[0.0; 255]).unwrap_err().to_string().contains("256-weight blocks"));
        assert!(dequantize(&[0; 209]).unwrap_err().to_string().contains("210-byte blocks"));
        let mut x = vec![0.0; 256];
        x[3] = f32::NAN;
        assert!(quantize(&x).is_err());
    }
}

/// Against llama.cpp's own code (ggml's `quantize_row_q6_K_ref` and `dequantize_row_q6_K`, called
/// from its CPU library on 512 values with a zero sub-block; lab/tests/fixtures/q6_k): ggml's
/// blocks read here as ggml reads them, and the lab's blocks read by ggml as here, bit for bit.
/// `UPDATE_FIXTURES=1` rewrites `lab_blocks.bin` (then `ggml_values_of_lab_blocks.bin` must be
/// made again with ggml).
#[cfg(test)]
mod against_ggml {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/q6_k").join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    #[test]
    fn ggml_and_the_lab_read_each_others_blocks_alike() {
        let ggml = dequantize(&fixture("ggml_blocks.bin")).unwrap();
        assert_eq!(ggml.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), floats(&fixture("ggml_values.bin")).iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        let ours = quantize(&floats(&fixture("inputs.bin"))).unwrap();
        if std::env::var_os("UPDATE_FIXTURES").is_some() {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/q6_k/lab_blocks.bin");
            std::fs::write(path, &ours).unwrap();
        }
        assert_eq!(ours, fixture("lab_blocks.bin"), "the lab's quantizer changed its bytes");
        let read = dequantize(&ours).unwrap();
        assert_eq!(read.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), floats(&fixture("ggml_values_of_lab_blocks.bin")).iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}
