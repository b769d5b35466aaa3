//! GGUF block formats the lab reads but does not write, the ones llama-quantize's K-quant files
//! (Q2_K to Q5_K_M) and 4-bit non-linear files hold besides Q6_K and Q8_0: Q5_0, Q5_1, Q2_K,
//! Q3_K, Q4_K, Q5_K, IQ4_NL and IQ4_XS,
//! dequantized to f32 as ggml's `dequantize_row_*` do (layouts from ggml-common.h, formulas from
//! ggml-quants.c), bit for bit: each value is one f32 product of the code and the scale, then one
//! f32 addition (no fused multiply-add). Checked against ggml's own code in `against_ggml` below.
//!
//! - Q5_0, 22 bytes a 32-weight block: f16 `d`, 4 bytes `qh`, 16 bytes `qs`. Element `j < 16`
//!   keeps its low 4 bits in the low nibble of `qs[j]` and its fifth bit at bit `j` of `qh`
//!   (little-endian u32); element `j + 16` the high nibble of `qs[j]` and bit `j + 16`. Value
//!   `(q - 16) d`.
//! - Q5_1, 24 bytes: f16 `d`, f16 `m`, then `qh` and `qs` as Q5_0. Value `q d + m`.
//! - Q4_K, 144 bytes a 256-weight block: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins
//!   for the 8 sub-blocks of 32, 128 bytes `qs`. Sub-block `s` reads `(d sc_s) q - (dmin m_s)`;
//!   weights `64 k + l` and `64 k + 32 + l` (`l < 32`) are the low and high nibbles of
//!   `qs[32 k + l]`, in sub-blocks `2 k` and `2 k + 1`. Scale and min of sub-block `j`: for
//!   `j < 4`, the low 6 bits of bytes `j` and `j + 4`; else the nibbles of byte `j + 4` under the
//!   top 2 bits of bytes `j - 4` and `j`.
//! - Q5_K, 176 bytes: as Q4_K with 32 bytes `qh` between the scales and `qs`: bit `2 k` of
//!   `qh[l]` is the fifth bit of weight `64 k + l`, bit `2 k + 1` that of weight `64 k + 32 + l`.
//! - Q2_K, 84 bytes a 256-weight block: 16 bytes of 4-bit scales (low nibble) and mins (high)
//!   for 16 sub-blocks of 16, 64 bytes `qs` of 2-bit codes, f16 `d`, f16 `dmin`. Weight
//!   `128 h + 32 j + 16 g + l` (`h < 2`, `j < 4`, `g < 2`, `l < 16`) has code bits `2 j` of
//!   `qs[32 h + 16 g + l]`, sub-block `8 h + 2 j + g`, value `(d sc) q - (dmin m)`.
//! - Q3_K, 110 bytes: 32 bytes `hmask`, 64 bytes `qs`, 12 bytes of 6-bit scales, f16 `d`. The
//!   same weight has the 2 low code bits as in Q2_K and a third bit (set: +0, clear: -4) at bit
//!   `4 h + j` of `hmask[16 g + l]`; value `d (s - 32) q`, where scale `s` of sub-block `i`
//!   (`i < 16`) takes its low 4 bits from byte `i % 8` (the low nibble for `i < 8`, the high
//!   otherwise) and its top 2 bits from bits `2 (i / 4)` of byte `8 + i % 4`.
//! - IQ4_NL, 18 bytes a 32-weight block: f16 `d`, 16 bytes of 4-bit indices laid out as Q4_0's
//!   codes; value `d t[i]` with ggml's non-linear table `t` (`kvalues_iq4nl`).
//! - IQ4_XS, 136 bytes a 256-weight block: f16 `d`, u16 `scales_h`, 4 bytes `scales_l`, 128
//!   bytes of indices, 32-weight sub-blocks laid out as IQ4_NL's; sub-block `b` has the 6-bit
//!   scale `s` with low 4 bits from nibble `b % 2` of `scales_l[b / 2]` and top 2 bits from bits
//!   `2 b` of `scales_h`; value `(d (s - 32)) t[i]`.

use crate::weights::gguf::GgmlType;
use crate::{LabError, Result};
use half::f16;
use rayon::prelude::*;

/// The types this module reads.
pub const TYPES: [GgmlType; 8] = [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS];

/// Tensor data of one of [`TYPES`] as f32 values, in order.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    let read: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::IQ4_NL => iq4_nl,
        GgmlType::IQ4_XS => iq4_xs,
        other => return Err(LabError::Invalid(format!("ggml_read: {} is not among the types read here", other.name()))),
    };
    let (n, size) = ty.block().map(|(n, s)| (n as usize, s as usize)).expect("a known type");
    if !bytes.len().is_multiple_of(size) {
        return Err(LabError::shape(ty.name(), format!("{} bytes are not a whole number of {size}-byte blocks", bytes.len())));
    }
    let mut out = vec![0f32; bytes.len() / size * n];
    out.par_chunks_exact_mut(n).zip(bytes.par_chunks_exact(size)).for_each(|(y, b)| read(b, y));
    Ok(out)
}

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The 5-bit codes of a Q5_0 / Q5_1 block from its `qh` (4 bytes) and `qs` (16 bytes).
fn codes5(qh: &[u8], qs: &[u8]) -> [u32; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    std::array::from_fn(|i| {
        let (j, high) = (i % 16, i >= 16);
        let low = if high { qs[j] >> 4 } else { qs[j] & 15 };
        u32::from(low) | ((h >> i) & 1) << 4
    })
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (v, q) in y.iter_mut().zip(codes5(&b[2..6], &b[6..22])) {
        *v = (q as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (v, q) in y.iter_mut().zip(codes5(&b[4..8], &b[8..24])) {
        *v = q as f32 * d + m;
    }
}

/// A Q2_K or Q3_K block: 16 sub-blocks of 16 weights; `value(sub, code, h, j, g, l)` turns the
/// 2 low code bits of weight `128 h + 32 j + 16 g + l` in sub-block `sub` into its value.
fn k_block_16(qs: &[u8], y: &mut [f32], value: impl Fn(usize, u8, usize, usize, usize, usize) -> f32) {
    for h in 0..2 {
        for j in 0..4 {
            for g in 0..2 {
                for l in 0..16 {
                    let q = (qs[32 * h + 16 * g + l] >> (2 * j)) & 3;
                    y[128 * h + 32 * j + 16 * g + l] = value(8 * h + 2 * j + g, q, h, j, g, l);
                }
            }
        }
    }
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, d, dmin) = (&b[..16], half(b, 80), half(b, 82));
    k_block_16(&b[16..80], y, |sub, q, _, _, _, _| {
        let (dl, ml) = (d * f32::from(scales[sub] & 15), dmin * f32::from(scales[sub] >> 4));
        dl * f32::from(q) - ml
    });
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, s, d) = (&b[..32], &b[96..108], half(b, 108));
    let scale = |i: usize| -> i32 {
        let low = if i < 8 { s[i] & 15 } else { s[i - 8] >> 4 };
        i32::from(low | ((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32
    };
    k_block_16(&b[32..96], y, |sub, q, h, j, g, l| {
        let dl = d * scale(sub) as f32;
        let high = hmask[16 * g + l] >> (4 * h + j) & 1;
        dl * f32::from(q as i8 - if high == 1 { 0 } else { 4 })
    });
}

/// Scale and min of sub-block `j` (of 8) from a K block's 12 scale bytes.
fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 15) | (s[j - 4] >> 6) << 4, (s[j + 4] >> 4) | (s[j] >> 6) << 4)
    }
}

/// A Q4_K or Q5_K block: `fifth(k, l, high)` is the fifth bit (0 or 16) of weight `64 k + l`
/// (`+ 32` when `high`).
fn k_block(b: &[u8], qs: &[u8], y: &mut [f32], fifth: impl Fn(usize, usize, bool) -> u8) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    for k in 0..4 {
        for (sub, y) in y[64 * k..64 * k + 64].chunks_exact_mut(32).enumerate() {
            // Sub-block 2 k reads the low nibbles of qs[32 k..], sub-block 2 k + 1 the high ones.
            let (sc, m) = scale_min(2 * k + sub, &b[4..16]);
            let (d1, m1, high) = (d * f32::from(sc), dmin * f32::from(m), sub == 1);
            for (l, v) in y.iter_mut().enumerate() {
                let q = qs[32 * k + l];
                let low = if high { q >> 4 } else { q & 15 };
                *v = d1 * f32::from(low + fifth(k, l, high)) - m1;
            }
        }
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    k_block(b, &b[16..144], y, |_, _, _| 0);
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let qh = &b[16..48];
    k_block(b, &b[48..176], y, |k, l, high| if qh[l] >> (2 * k + usize::from(high)) & 1 == 1 { 16 } else { 0 });
}

/// ggml's `kvalues_iq4nl`: the 16 levels of IQ4_NL and IQ4_XS.
const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// 32 weights of 4-bit level indices (`qs`, 16 bytes) scaled by `dl`.
fn iq4_sub(dl: f32, qs: &[u8], y: &mut [f32]) {
    for j in 0..16 {
        y[j] = dl * f32::from(IQ4_LEVELS[usize::from(qs[j] & 15)]);
        y[j + 16] = dl * f32::from(IQ4_LEVELS[usize::from(qs[j] >> 4)]);
    }
}

fn iq4_nl(b: &[u8], y: &mut [f32]) {
    iq4_sub(half(b, 0), &b[2..18], y);
}

fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let (d, high) = (half(b, 0), u16::from_le_bytes([b[2], b[3]]));
    for (s, y) in y.chunks_exact_mut(32).enumerate() {
        let low = (b[4 + s / 2] >> (4 * (s % 2))) & 15;
        let scale = i32::from(low) | i32::from((high >> (2 * s)) & 3) << 4;
        iq4_sub(d * (scale - 32) as f32, &b[8 + 16 * s..24 + 16 * s], y);
    }
}

/// Against ggml's own code (its `ggml_quantize_chunk` and the types' `to_float`, run by
/// lab/peers/ggml_blocks.c through lab/examples/ggml_blocks.rs on 1,024 values with hostile
/// blocks): ggml's blocks read here to the same f32 bits as ggml reads them, for every type.
#[cfg(test)]
mod against_ggml {
    use super::*;

    #[test]
    fn ggml_blocks_read_as_ggml_reads_them() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml_blocks");
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        for ty in TYPES {
            let name = ty.name().to_lowercase();
            let ours = dequantize(ty, &read(&format!("{name}.blocks"))).unwrap();
            let theirs: Vec<u32> = read(&format!("{name}.values")).chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            assert_eq!(ours.len(), theirs.len(), "{name}");
            let differ = ours.iter().zip(&theirs).filter(|(a, b)| a.to_bits() != **b).count();
            assert_eq!(differ, 0, "{name}: {differ} of {} values differ from ggml's", ours.len());
        }
    }

    #[test]
    fn a_partial_block_is_an_error() {
        assert!(dequantize(GgmlType::Q4_K, &[0; 143]).unwrap_err().to_string().contains("144-byte blocks"));
        assert!(dequantize(GgmlType::Q8_0, &[0; 34]).is_err());
    }
}
