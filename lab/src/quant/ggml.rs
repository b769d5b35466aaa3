//! GGUF / ggml block formats Q4_0, Q4_1 and Q8_0, bit-compatible with llama.cpp, and the
//! readers of GGUF tensor data into f32 ([`to_f32`]).
//!
//! Layout (ggml's `ggml-common.h`: `block_q4_0`, `block_q4_1`, `block_q8_0`; algorithms from
//! `ggml/src/ggml-quants.c`: `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`,
//! `quantize_row_q8_0_ref`, `dequantize_row_q4_0`, `dequantize_row_q4_1`, `dequantize_row_q8_0`),
//! 32 weights per block, little-endian:
//!
//! - Q4_0, 18 bytes: f16 `d`, then 16 bytes `qs`; value = `(q - 8) * d`.
//! - Q4_1, 20 bytes: f16 `d`, f16 `m`, then 16 bytes `qs`; value = `q * d + m`.
//! - Q8_0, 34 bytes: f16 `d`, then 32 int8 `qs`, element `j` in `qs[j]`; value = `q * d`.
//!
//! Inside a 4-bit block, byte `qs[j]` holds element `j` in its LOW nibble and element `j + 16` in
//! its HIGH nibble (unlike [`super::int4`], where neighbours share a byte).
//!
//! The writers follow the reference quantizers step by step, so they produce the same bytes:
//! Q4_0 takes the element of largest magnitude (the first, if tied) as `max`, `d = max / -8`,
//! `q = min(15, trunc(x / d + 8.5))`; Q4_1 takes `d = (max - min) / 15`, `m = min`,
//! `q = min(15, trunc((x - min) / d + 0.5))`; Q8_0 takes `amax = max |x|`, `d = amax / 127` and
//! `q = roundf(x / d)` (C's `roundf`: halfway cases away from zero, as Rust's `f32::round`). All
//! scale by `1/d` computed before `d` is rounded to f16 (round to nearest even). Dequantizing
//! multiplies (then adds, Q4_1) in f32 with one rounding per operation (no fused multiply-add),
//! the formula as written.

use super::group::{GroupQuant, Scheme};
use crate::weights::gguf::GgmlType;
use crate::{LabError, Result};
use half::f16;
use rayon::prelude::*;

/// Weights per block.
pub const QK: usize = 32;
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q8_0_BYTES: usize = 34;
/// Blocks per parallel task.
const PAR_BLOCKS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    Q4_0,
    Q4_1,
    Q8_0,
}

impl Block {
    pub fn bytes(self) -> usize {
        match self {
            Block::Q4_0 => Q4_0_BYTES,
            Block::Q4_1 => Q4_1_BYTES,
            Block::Q8_0 => Q8_0_BYTES,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Block::Q4_0 => "q4_0",
            Block::Q4_1 => "q4_1",
            Block::Q8_0 => "q8_0",
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
        Block::Q8_0 => return quantize_q8_0(x, out),
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

fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    // ggml's MAX(amax, fabsf(v)): the running maximum of the magnitudes.
    let amax = x.iter().fold(0f32, |a, v| if a > v.abs() { a } else { v.abs() });
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (c, &v) in out[2..Q8_0_BYTES].iter_mut().zip(x) {
        // |v * id| is 127 at most, up to rounding; C stores roundf's result into an int8_t. (Values
        // so small that 1/d overflows are undefined behaviour in C; `as` saturates.)
        *c = (v * id).round() as i8 as u8;
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

/// Scale, min (0 for Q4_0 and Q8_0) and the code bytes of one block (16 packed nibble pairs, or
/// Q8_0's 32 int8).
#[inline]
pub fn parts(block: Block, b: &[u8]) -> (f32, f32, &[u8]) {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    match block {
        Block::Q4_0 => (d, 0.0, &b[2..18]),
        Block::Q4_1 => (d, f16::from_le_bytes([b[2], b[3]]).to_f32(), &b[4..20]),
        Block::Q8_0 => (d, 0.0, &b[2..34]),
    }
}

fn dequantize_block(block: Block, b: &[u8], y: &mut [f32]) {
    let (d, m, qs) = parts(block, b);
    let (lo, hi) = y.split_at_mut(QK / 2);
    match block {
        Block::Q4_0 => {
            for j in 0..QK / 2 {
                lo[j] = ((qs[j] & 15) as i32 - 8) as f32 * d;
                hi[j] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
            }
        }
        Block::Q4_1 => {
            for j in 0..QK / 2 {
                lo[j] = (qs[j] & 15) as f32 * d + m;
                hi[j] = (qs[j] >> 4) as f32 * d + m;
            }
        }
        Block::Q8_0 => {
            for (y, &q) in y.iter_mut().zip(qs) {
                *y = q as i8 as f32 * d;
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

/// GGUF tensor data of type `ty` as f32 values, in order: F32, F16 and BF16 read as stored
/// (little-endian; BF16 is the high half of an f32), Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K,
/// IQ4_NL and IQ4_XS dequantized. Any other type is an error naming it.
pub fn to_f32(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    let plain = |size: usize, read: fn(&[u8]) -> f32| -> Result<Vec<f32>> {
        if !bytes.len().is_multiple_of(size) {
            return Err(LabError::shape(ty.name(), format!("{} bytes are not a whole number of {size}-byte values", bytes.len())));
        }
        Ok(bytes.par_chunks_exact(size).map(read).collect())
    };
    match ty {
        GgmlType::F32 => plain(4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        GgmlType::F16 => plain(2, |c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
        GgmlType::BF16 => plain(2, |c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)),
        GgmlType::Q4_0 => dequantize(Block::Q4_0, bytes),
        GgmlType::Q4_1 => dequantize(Block::Q4_1, bytes),
        GgmlType::Q8_0 => dequantize(Block::Q8_0, bytes),
        GgmlType::Q6_K => super::q6_k::dequantize(bytes),
        t if super::ggml_read::TYPES.contains(&t) => super::ggml_read::dequantize(t, bytes),
        other => Err(LabError::Invalid(format!("to_f32: GGUF type {} ({}) is not read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS are)", other.name(), other.0))),
    }
}

impl GroupQuant {
    /// The Q4_1 blocks of a `rows x cols` matrix (blocks of 32 along each row, as GGUF stores a
    /// tensor of dims `[cols, rows]`) as group-wise asymmetric codes with groups of 32, losslessly:
    /// Q4_1's value is Asym's `q d + m` with the same f16 `d` and `m`, so the scales, minimums and
    /// codes are copied and only the nibble order changes (`qs[j]` holds elements `j` and
    /// `j + 16`; here neighbours share a byte). Dequantizes to the same f32 bits as
    /// [`dequantize`]`(Block::Q4_1, ..)`.
    pub fn from_q4_1(blocks: &[u8], rows: usize, cols: usize) -> Result<GroupQuant> {
        Self::from_blocks(Block::Q4_1, blocks, rows, cols)
    }

    /// [`GroupQuant::from_q4_1`] for either 4-bit block: Q4_0's `(q - 8) d` is Sym's with the
    /// same f16 `d` (which may be negative), Q4_1 becomes Asym.
    pub fn from_blocks(block: Block, blocks: &[u8], rows: usize, cols: usize) -> Result<GroupQuant> {
        let scheme = match block {
            Block::Q4_0 => Scheme::Sym,
            Block::Q4_1 => Scheme::Asym,
            Block::Q8_0 => return Err(LabError::Invalid("GroupQuant holds 4-bit codes; Q8_0 blocks have 8-bit ones".into())),
        };
        let bytes = block.bytes();
        let n = rows.checked_mul(cols).filter(|&n| n > 0 && cols.is_multiple_of(QK));
        let Some(n) = n.filter(|&n| blocks.len() == block.size_of(n)) else {
            return Err(LabError::shape(
                "GroupQuant::from_blocks",
                format!("{} bytes for a {rows} x {cols} matrix: rows >= 1, cols a multiple of {QK}, {bytes} bytes per {QK} weights", blocks.len()),
            ));
        };
        let mut packed = vec![0u8; n / 2];
        let mut scales = vec![f16::ZERO; n / QK];
        let mut mins = vec![f16::ZERO; n / QK];
        let tasks = packed.par_chunks_mut(QK / 2 * PAR_BLOCKS).zip(scales.par_chunks_mut(PAR_BLOCKS)).zip(mins.par_chunks_mut(PAR_BLOCKS));
        tasks.zip(blocks.par_chunks(bytes * PAR_BLOCKS)).for_each(|(((p, s), m), b)| {
            for (((p, s), m), b) in p.chunks_exact_mut(QK / 2).zip(s).zip(m).zip(b.chunks_exact(bytes)) {
                let (d, min, qs) = parts(block, b);
                // From f16 bits, so back to f16 exactly.
                (*s, *m) = (f16::from_f32(d), f16::from_f32(min));
                for i in 0..QK / 4 {
                    // Byte i holds elements 2i, 2i + 1 (low nibbles of qs); byte 8 + i elements
                    // 16 + 2i, 17 + 2i (their high nibbles).
                    p[i] = (qs[2 * i] & 15) | (qs[2 * i + 1] << 4);
                    p[QK / 4 + i] = (qs[2 * i] >> 4) | (qs[2 * i + 1] & 0xF0);
                }
            }
        });
        if scheme == Scheme::Sym {
            mins.clear();
        }
        Ok(GroupQuant { scheme, group: QK, rows, cols, packed, scales, mins })
    }
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
        // Q8_0: d = 0.5, element j is the int8 qs[j] = j - 16 (two's complement byte).
        let mut b8 = f16::from_f32(0.5).to_le_bytes().to_vec();
        b8.extend((0..32i8).map(|j| (j - 16) as u8));
        let y = dequantize(Block::Q8_0, &b8).unwrap();
        assert_eq!(y, (0..32).map(|j| (j as f32 - 16.0) * 0.5).collect::<Vec<_>>());
    }

    /// Q8_0's codes are roundf(x / d): halfway cases go away from zero (not to even).
    #[test]
    fn q8_0_scales_by_the_largest_magnitude_and_rounds_halves_away_from_zero() {
        let mut x = [0f32; QK];
        x[..7].copy_from_slice(&[-127.0, 2.5, -2.5, 0.5, -0.5, 1.5, 126.49]);
        let b = quantize(Block::Q8_0, &x).unwrap();
        assert_eq!(b.len(), Q8_0_BYTES);
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 1.0, "d = amax / 127");
        let q: Vec<i8> = b[2..9].iter().map(|&c| c as i8).collect();
        assert_eq!(q, [-127, 3, -3, 1, -1, 2, 126]);
        assert!(b[9..].iter().all(|&c| c == 0));
        let zeros = quantize(Block::Q8_0, &[0f32; QK]).unwrap();
        assert!(zeros.iter().all(|&c| c == 0), "d = 0, id = 0");
    }

    #[test]
    fn requantizing_a_dequantized_tensor_gives_the_same_bytes() {
        let x: Vec<f32> = (0..QK * 300).map(|i| (i as f32 * 0.37).sin() * (1.0 + (i / 32) as f32 * 0.01)).collect();
        for block in [Block::Q4_0, Block::Q4_1, Block::Q8_0] {
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
        assert!(dequantize(Block::Q8_0, &[0u8; 35]).unwrap_err().to_string().contains("35 bytes are not a whole number of 34-byte blocks"));
    }

    #[test]
    fn gguf_data_reads_as_f32_and_other_types_are_named() {
        let v = [1.5f32, -0.25, 65504.0, 3.0e-5];
        let f32s: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(to_f32(GgmlType::F32, &f32s).unwrap(), v);
        let f16s: Vec<u8> = v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect();
        assert_eq!(to_f32(GgmlType::F16, &f16s).unwrap(), v.map(|x| f16::from_f32(x).to_f32()));
        // BF16 keeps an f32's top 16 bits: 1.5 is 0x3FC0, -0.25 is 0xBE80.
        assert_eq!(to_f32(GgmlType::BF16, &[0xC0, 0x3F, 0x80, 0xBE]).unwrap(), [1.5, -0.25]);
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.3).cos()).collect();
        for (ty, block) in [(GgmlType::Q4_0, Block::Q4_0), (GgmlType::Q4_1, Block::Q4_1), (GgmlType::Q8_0, Block::Q8_0)] {
            let b = quantize(block, &x).unwrap();
            assert_eq!(to_f32(ty, &b).unwrap(), dequantize(block, &b).unwrap(), "{block:?}");
        }
        assert!(to_f32(GgmlType::F32, &[0u8; 6]).unwrap_err().to_string().contains("6 bytes are not a whole number of 4-byte values"));
        let err = to_f32(GgmlType(21), &[0u8; 110]).unwrap_err().to_string();
        assert!(err.contains("GGUF type IQ3_S (21) is not read"), "{err}");
    }

    /// Every nibble and any finite scale and minimum: the repacked matrix dequantizes to the
    /// blocks' own f32 bits.
    #[test]
    fn q4_1_blocks_repack_into_asymmetric_groups_losslessly() {
        let (rows, cols) = (3, 96);
        let mut blocks = Vec::new();
        for i in 0..rows * cols / QK {
            blocks.extend(f16::from_f32(0.013 * (i as f32 + 1.0)).to_le_bytes());
            blocks.extend(f16::from_f32(-0.2 + 0.07 * i as f32).to_le_bytes());
            blocks.extend((0..16).map(|j| ((j * 37 + i * 11) % 256) as u8));
        }
        let quantized = quantize(Block::Q4_1, &(0..rows * cols).map(|i| (i as f32 * 0.71).sin()).collect::<Vec<_>>()).unwrap();
        for b in [blocks, quantized] {
            let g = GroupQuant::from_q4_1(&b, rows, cols).unwrap();
            assert_eq!((g.scheme, g.group, g.packed.len(), g.scales.len(), g.mins.len()), (Scheme::Asym, 32, rows * cols / 2, 9, 9));
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(g.dequantize()), bits(dequantize(Block::Q4_1, &b).unwrap()));
        }
        // Q4_0 becomes symmetric groups of 32, its (possibly negative) d kept.
        let q4_0 = quantize(Block::Q4_0, &(0..rows * cols).map(|i| (i as f32 * 0.71).sin()).collect::<Vec<_>>()).unwrap();
        let g = GroupQuant::from_blocks(Block::Q4_0, &q4_0, rows, cols).unwrap();
        assert_eq!((g.scheme, g.group, g.scales.len(), g.mins.len()), (Scheme::Sym, 32, 9, 0));
        assert!(g.scales.iter().any(|d| d.is_sign_negative()));
        assert_eq!(g.dequantize().iter().map(|v| v.to_bits()).collect::<Vec<_>>(), dequantize(Block::Q4_0, &q4_0).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        assert!(GroupQuant::from_blocks(Block::Q8_0, &[0u8; 34], 1, 32).is_err());
        assert!(GroupQuant::from_q4_1(&[0u8; 80], 1, 96).unwrap_err().to_string().contains("80 bytes for a 1 x 96 matrix"));
        assert!(GroupQuant::from_q4_1(&[0u8; 60], 2, 48).is_err());
        assert!(GroupQuant::from_q4_1(&[], 0, 32).is_err());
    }
}
