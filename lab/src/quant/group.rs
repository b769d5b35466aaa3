//! Group-wise 4-bit quantizers along the input dimension, their error metrics and footprints.
//!
//! A weight matrix is `rows x cols` row-major (PyTorch's `[out, in]`); every run of `group`
//! consecutive elements of a row shares an f16 scale (and, asymmetric, an f16 minimum).
//! Codes are packed row by row with [`super::int4`]'s nibble order; scales are `rows x groups`.
//!
//! - Symmetric (absmax): `d = absmax / 7`, `q = clamp(round(x / d), -8, 7) + 8`, value `(q - 8) d`.
//! - Asymmetric (scale + min): `d = (max - min) / 15`, `m = min`,
//!   `q = clamp(round((x - m) / d), 0, 15)`, value `q d + m`.
//!
//! `d` is rounded UP and `m` DOWN to f16 first, and the codes are chosen against those stored
//! values: every input then lies inside the grid, so no code is clamped and every element is
//! within half a step of its original (tiny groups with subnormal f16 scales included). Codes
//! round to nearest, ties away from zero. An all-equal (e.g. all-zero) group gets `d = 0` and reproduces exactly.
//! Non-finite inputs, a group size that does not divide `cols`, and scales beyond the f16 range
//! are errors naming the place.

use super::int4;
use crate::{LabError, Result};
use half::f16;
use rayon::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Sym,
    Asym,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Sym => "sym",
            Scheme::Asym => "asym",
        }
    }
}

/// Every 4-bit format the lab measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Group { scheme: Scheme, group: usize },
    /// GGUF Q4_0: blocks of 32, f16 scale, value `(q - 8) d`.
    Q4_0,
    /// GGUF Q4_1: blocks of 32, f16 scale and min, value `q d + m`.
    Q4_1,
}

impl Format {
    /// Every format of the requantization table: sym/asym x 32/64/128, then Q4_0 and Q4_1.
    pub fn all() -> Vec<Format> {
        let mut v = Vec::new();
        for scheme in [Scheme::Sym, Scheme::Asym] {
            for group in [32, 64, 128] {
                v.push(Format::Group { scheme, group });
            }
        }
        v.extend([Format::Q4_0, Format::Q4_1]);
        v
    }
    pub fn name(self) -> String {
        match self {
            Format::Group { scheme, group } => format!("{}_g{group}", scheme.name()),
            Format::Q4_0 => "q4_0".into(),
            Format::Q4_1 => "q4_1".into(),
        }
    }
    /// Elements sharing one scale.
    pub fn group(self) -> usize {
        match self {
            Format::Group { group, .. } => group,
            Format::Q4_0 | Format::Q4_1 => super::ggml::QK,
        }
    }
    /// Bytes of per-group metadata (scale, and min where there is one).
    pub fn group_overhead_bytes(self) -> usize {
        match self {
            Format::Group { scheme: Scheme::Sym, .. } | Format::Q4_0 => 2,
            Format::Group { scheme: Scheme::Asym, .. } | Format::Q4_1 => 4,
        }
    }
}

/// How much memory a format takes for `n` weights, against fp32 and fp16.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Footprint {
    pub bytes: u64,
    pub bits_per_weight: f64,
    /// fp32 bytes / these bytes (8 with no scale overhead).
    pub smaller_than_f32: f64,
    /// fp16 bytes / these bytes (4 with no scale overhead).
    pub smaller_than_f16: f64,
}

/// The footprint of `n` weights (a whole number of groups) in `format`: packed codes plus
/// per-group scales (and mins).
pub fn footprint(format: Format, n: u64) -> Footprint {
    let groups = n.div_ceil(format.group() as u64);
    let bytes = n.div_ceil(2) + groups * format.group_overhead_bytes() as u64;
    let b = bytes.max(1) as f64;
    Footprint { bytes, bits_per_weight: 8.0 * bytes as f64 / n.max(1) as f64, smaller_than_f32: 4.0 * n as f64 / b, smaller_than_f16: 2.0 * n as f64 / b }
}

/// A quantized `rows x cols` matrix in one of the group formats.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupQuant {
    pub scheme: Scheme,
    pub group: usize,
    pub rows: usize,
    pub cols: usize,
    /// `rows * cols / 2` bytes, row-major, int4 nibble order.
    pub packed: Vec<u8>,
    /// `rows * cols / group` scales, row-major.
    pub scales: Vec<f16>,
    /// Asymmetric only: one minimum per scale (empty for symmetric).
    pub mins: Vec<f16>,
}

/// Checks a matrix shape and group size, naming what is wrong.
pub fn validate(len: usize, rows: usize, cols: usize, group: usize) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Err(LabError::shape("quantize", format!("{rows} x {cols}: both dimensions must be at least 1")));
    }
    if rows.checked_mul(cols) != Some(len) {
        return Err(LabError::shape("quantize", format!("{len} values do not make a {rows} x {cols} matrix")));
    }
    if group == 0 || !group.is_multiple_of(2) || !cols.is_multiple_of(group) {
        return Err(LabError::shape("quantize", format!("group size {group} must be even and divide the row length {cols}")));
    }
    Ok(())
}

/// Rejects NaN and infinities, naming the first.
pub fn check_finite(x: &[f32], what: &str) -> Result<()> {
    // A branch-free pass over chunks (vectorizes); the index is looked for only on failure.
    if x.par_chunks(1 << 16).all(|c| c.iter().fold(true, |a, v| a & v.is_finite())) {
        return Ok(());
    }
    let i = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
    Err(LabError::Invalid(format!("{what}: value {} at index {i} is not finite", x[i])))
}

fn finite_f16(h: f16, v: f32, what: &str, group: usize) -> Result<f16> {
    if h.is_finite() {
        Ok(h)
    } else {
        Err(LabError::Invalid(format!("{what} of group {group} is {v}, beyond the f16 range")))
    }
}

/// The smallest f16 >= v (v >= 0): a scale rounded up keeps the whole group inside the grid.
fn f16_up(v: f32, what: &str, group: usize) -> Result<f16> {
    let h = f16::from_f32(v);
    let h = if h.to_f32() < v { f16::from_bits(h.to_bits() + 1) } else { h };
    finite_f16(h, v, what, group)
}

/// The largest f16 <= v: a minimum rounded down keeps every value above it.
fn f16_down(v: f32, what: &str, group: usize) -> Result<f16> {
    let h = f16::from_f32(v);
    let h = if h.to_f32() <= v {
        h
    } else if h.to_bits() & 0x7fff == 0 {
        f16::from_bits(0x8001) // below zero: the smallest negative subnormal
    } else if h.is_sign_negative() {
        f16::from_bits(h.to_bits() + 1)
    } else {
        f16::from_bits(h.to_bits() - 1)
    };
    finite_f16(h, v, what, group)
}

/// Quantizes one group into codes (unpacked), returning (scale, min).
fn quantize_group(x: &[f32], scheme: Scheme, codes: &mut [u8], index: usize) -> Result<(f16, f16)> {
    match scheme {
        Scheme::Sym => {
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = f16_up(amax / 7.0, "scale", index)?;
            let id = if d.to_f32() == 0.0 { 0.0 } else { 1.0 / d.to_f32() };
            for (c, &v) in codes.iter_mut().zip(x) {
                *c = ((v * id).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
            }
            Ok((d, f16::ZERO))
        }
        Scheme::Asym => {
            let (lo, hi) = x.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            let m = f16_down(lo, "minimum", index)?;
            let d = f16_up((hi - m.to_f32()) / 15.0, "scale", index)?;
            let (mf, id) = (m.to_f32(), if d.to_f32() == 0.0 { 0.0 } else { 1.0 / d.to_f32() });
            for (c, &v) in codes.iter_mut().zip(x) {
                *c = ((v - mf) * id).round().clamp(0.0, 15.0) as u8;
            }
            Ok((d, m))
        }
    }
}

/// Quantizes a `rows x cols` matrix group-wise (groups along `cols`), rows in parallel.
pub fn quantize(x: &[f32], rows: usize, cols: usize, scheme: Scheme, group: usize) -> Result<GroupQuant> {
    validate(x.len(), rows, cols, group)?;
    check_finite(x, "quantize")?;
    let gpr = cols / group;
    let mut packed = vec![0u8; rows * cols / 2];
    let mut scales = vec![f16::ZERO; rows * gpr];
    let mut mins = vec![f16::ZERO; rows * gpr];
    packed
        .par_chunks_mut(cols / 2)
        .zip(scales.par_chunks_mut(gpr).zip(mins.par_chunks_mut(gpr)))
        .enumerate()
        .try_for_each(|(r, (prow, (srow, mrow)))| -> Result<()> {
            let mut codes = vec![0u8; group];
            for g in 0..gpr {
                let xs = &x[r * cols + g * group..r * cols + (g + 1) * group];
                (srow[g], mrow[g]) = quantize_group(xs, scheme, &mut codes, r * gpr + g)?;
                int4::pack_into(&codes, &mut prow[g * group / 2..(g + 1) * group / 2])?;
            }
            Ok(())
        })?;
    if scheme == Scheme::Sym {
        mins.clear();
    }
    Ok(GroupQuant { scheme, group, rows, cols, packed, scales, mins })
}

impl GroupQuant {
    /// Dequantizes to f32, rows in parallel: `(q - 8) d`, or `q d + m` as an f32 product then an
    /// f32 sum (two roundings, no fused multiply-add), so the GPU kernels agree to the bit.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        self.dequantize_into(&mut out);
        out
    }

    /// [`GroupQuant::dequantize`] into `out` (rows x cols values).
    pub fn dequantize_into(&self, out: &mut [f32]) {
        assert_eq!(out.len(), self.rows * self.cols, "dequantize_into: the output holds rows x cols values");
        let (gpr, group) = (self.cols / self.group, self.group);
        out.par_chunks_mut(self.cols).zip(self.packed.par_chunks(self.cols / 2)).enumerate().for_each(|(r, (orow, prow))| {
            for (g, (og, pg)) in orow.chunks_exact_mut(group).zip(prow.chunks_exact(group / 2)).enumerate() {
                let d = self.scales[r * gpr + g].to_f32();
                match self.scheme {
                    Scheme::Sym => {
                        for (pair, &b) in og.chunks_exact_mut(2).zip(pg) {
                            pair[0] = ((b & 15) as f32 - 8.0) * d;
                            pair[1] = ((b >> 4) as f32 - 8.0) * d;
                        }
                    }
                    Scheme::Asym => {
                        let m = self.mins[r * gpr + g].to_f32();
                        for (pair, &b) in og.chunks_exact_mut(2).zip(pg) {
                            pair[0] = (b & 15) as f32 * d + m;
                            pair[1] = (b >> 4) as f32 * d + m;
                        }
                    }
                }
            }
        });
    }

    pub fn bytes(&self) -> u64 {
        (self.packed.len() + 2 * (self.scales.len() + self.mins.len())) as u64
    }
}

/// How far a reconstruction is from the original, in f64.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct QuantError {
    /// sqrt(sum (x - y)^2 / sum x^2).
    pub rel_rmse: f64,
    pub max_abs: f64,
    /// 10 log10(sum x^2 / sum (x - y)^2), in dB (infinite when exact; null in JSON).
    pub sqnr_db: f64,
}

/// Error metrics of `approx` against `original` (same length).
pub fn error_metrics(original: &[f32], approx: &[f32]) -> Result<QuantError> {
    if original.len() != approx.len() {
        return Err(LabError::shape("error metrics", format!("{} originals against {} reconstructions", original.len(), approx.len())));
    }
    let (signal, noise, max_abs) = original
        .par_iter()
        .zip(approx)
        .map(|(&x, &y)| {
            let (x, e) = (x as f64, (x as f64 - y as f64).abs());
            (x * x, e * e, e)
        })
        .reduce(|| (0.0, 0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1, a.2.max(b.2)));
    let rel_rmse = if signal > 0.0 { (noise / signal).sqrt() } else if noise == 0.0 { 0.0 } else { f64::INFINITY };
    Ok(QuantError { rel_rmse, max_abs, sqnr_db: 10.0 * (signal / noise).log10() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.731 + seed).sin() * 3.0 + (i % 7) as f32 * 0.1).collect()
    }

    #[test]
    fn every_element_is_within_half_a_step_and_codes_use_the_range() {
        for scheme in [Scheme::Sym, Scheme::Asym] {
            for group in [32, 64, 128] {
                let (rows, cols) = (3, 256);
                let x = data(rows * cols, group as f32);
                let q = quantize(&x, rows, cols, scheme, group).unwrap();
                assert_eq!((q.packed.len(), q.scales.len()), (rows * cols / 2, rows * cols / group));
                let y = q.dequantize();
                for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
                    let g = i / group;
                    let d = q.scales[g].to_f32();
                    // Half a step, plus f32 rounding of q d + m (asym).
                    let slack = if scheme == Scheme::Asym { 1e-6 * (15.0 * d + q.mins[g].to_f32().abs()) } else { 0.0 };
                    assert!((a - b).abs() <= 0.5 * d * (1.0 + 1e-6) + slack, "{scheme:?} g{group} i{i}: {a} vs {b}, d {d}");
                }
                let e = error_metrics(&x, &y).unwrap();
                assert!(e.rel_rmse > 0.0 && e.rel_rmse < 0.1 && e.sqnr_db > 20.0, "{scheme:?} g{group}: {e:?}");
            }
        }
    }

    #[test]
    fn symmetric_zero_is_exact_and_constant_groups_reproduce() {
        let x = vec![0f32; 64];
        let q = quantize(&x, 1, 64, Scheme::Sym, 32).unwrap();
        assert!(q.packed.iter().all(|&b| b == 0x88), "zero is code 8");
        assert_eq!(q.dequantize(), x);
        let c = vec![1.25f32; 64];
        assert_eq!(quantize(&c, 2, 32, Scheme::Asym, 32).unwrap().dequantize(), c);
        let e = error_metrics(&c, &c).unwrap();
        assert_eq!((e.rel_rmse, e.max_abs), (0.0, 0.0));
        assert!(e.sqnr_db.is_infinite());
    }

    #[test]
    fn footprints_count_codes_and_scales() {
        let n = 4096 * 4096;
        let f = footprint(Format::Group { scheme: Scheme::Sym, group: 128 }, n);
        assert_eq!(f.bytes, n / 2 + n / 128 * 2);
        assert!((f.bits_per_weight - 4.125).abs() < 1e-12);
        assert!((f.smaller_than_f32 - 32.0 / 4.125).abs() < 1e-9 && (f.smaller_than_f16 - 16.0 / 4.125).abs() < 1e-9);
        assert!((footprint(Format::Q4_0, n).bits_per_weight - 4.5).abs() < 1e-12);
        assert!((footprint(Format::Q4_1, n).bits_per_weight - 5.0).abs() < 1e-12);
        assert!((footprint(Format::Group { scheme: Scheme::Asym, group: 32 }, n).bits_per_weight - 5.0).abs() < 1e-12);
        let q = quantize(&data(2 * 256, 1.0), 2, 256, Scheme::Asym, 64).unwrap();
        assert_eq!(q.bytes(), footprint(Format::Group { scheme: Scheme::Asym, group: 64 }, 512).bytes);
    }

    #[test]
    fn stored_scales_round_up_and_minimums_down() {
        for v in [1e-9f32, 3.3e-6, 0.1, 1.0, 1000.3] {
            let (up, down) = (f16_up(v, "s", 0).unwrap().to_f32(), f16_down(v, "m", 0).unwrap().to_f32());
            assert!(up >= v && down <= v && up > 0.0, "{v}: {down} {up}");
            let down = f16_down(-v, "m", 0).unwrap().to_f32();
            assert!(down <= -v, "{v}: {down}");
        }
        assert_eq!(f16_down(0.0, "m", 0).unwrap().to_f32(), 0.0);
        assert_eq!(f16_up(0.0, "s", 0).unwrap().to_f32(), 0.0);
        assert!(f16_up(65505.0, "s", 3).unwrap_err().to_string().contains("group 3"));
        assert!(f16_down(-1e9, "minimum", 0).is_err());
    }

    #[test]
    fn bad_input_is_named() {
        let x = data(96, 0.0);
        assert!(quantize(&x, 1, 96, Scheme::Sym, 64).unwrap_err().to_string().contains("group size 64 must be even and divide the row length 96"));
        assert!(quantize(&x, 2, 64, Scheme::Sym, 32).unwrap_err().to_string().contains("96 values do not make a 2 x 64 matrix"));
        let mut bad = x.clone();
        bad[5] = f32::NAN;
        assert!(quantize(&bad, 1, 96, Scheme::Asym, 32).unwrap_err().to_string().contains("index 5 is not finite"));
        bad[5] = 1e9;
        assert!(quantize(&bad, 1, 96, Scheme::Sym, 32).unwrap_err().to_string().contains("beyond the f16 range"));
        assert!(error_metrics(&x, &x[1..]).is_err());
    }

    proptest::proptest! {
        /// Any finite matrix, any scale of values: every element comes back within half a step
        /// (plus the f16 rounding of the min, asymmetric), and GGUF blocks re-encode to themselves.
        #[test]
        fn random_matrices_stay_within_half_a_step(rows in 1usize..4, groups in 1usize..4, g in 0usize..3, exp in -20i32..10, seed in 0u64..1000) {
            let group = [32, 64, 128][g];
            let cols = groups * group;
            let scale = 2f32.powi(exp);
            let x: Vec<f32> = (0..rows * cols).map(|i| scale * ((i as u64 * 2654435761 + seed * 97) % 2001) as f32 / 1000.0 - scale).collect();
            for scheme in [Scheme::Sym, Scheme::Asym] {
                let q = quantize(&x, rows, cols, scheme, group).unwrap();
                let y = q.dequantize();
                for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
                    let gi = i / group;
                    let d = q.scales[gi].to_f32();
                    let slack = if scheme == Scheme::Asym { 1e-6 * (15.0 * d + q.mins[gi].to_f32().abs()) } else { 0.0 };
                    proptest::prop_assert!((a - b).abs() <= 0.5 * d * (1.0 + 1e-6) + slack, "{:?} i{} {} vs {}", scheme, i, a, b);
                }
            }
            for block in [super::super::ggml::Block::Q4_0, super::super::ggml::Block::Q4_1] {
                let b = super::super::ggml::quantize(block, &x).unwrap();
                let y = super::super::ggml::dequantize(block, &b).unwrap();
                proptest::prop_assert_eq!(super::super::ggml::quantize(block, &y).unwrap(), b);
            }
        }
    }
}
