//! The quant family's references and checks: a matrix in any 4-bit format ([`Quantized`]), the
//! one-element-at-a-time dequantizer, the f64 W4A16 product, and the comparisons the experiment
//! and the tests judge outputs with.

use super::variants::BATCHES;
use crate::kernels::DType;
use crate::ops::compare::{compare_bits, compare_product, ProductBound};
use crate::quant::ggml::{self, Block};
use crate::quant::group::{self, Format, GroupQuant, Scheme};
use crate::record::ErrorStats;
use crate::{LabError, Result};
use half::f16;
use rayon::prelude::*;

pub fn parse_format(name: &str) -> Result<Format> {
    Format::all().into_iter().find(|f| f.name() == name).ok_or_else(|| LabError::Invalid(format!("unknown 4-bit format `{name}` (sym_g32 .. asym_g128, q4_0, q4_1)")))
}

/// A matrix in any of the 4-bit formats (Q8_0 weights are a [`super::q8::Q8Tensor`]).
#[derive(Clone, Debug)]
pub enum Quantized {
    Group(GroupQuant),
    Blocks(Block, Vec<u8>),
}

impl Quantized {
    /// Quantizes a `rows x cols` matrix (Q4_0 / Q4_1: blocks of 32 along each row).
    pub fn new(format: Format, x: &[f32], rows: usize, cols: usize) -> Result<Self> {
        match format {
            Format::Group { scheme, group } => group::quantize(x, rows, cols, scheme, group).map(Quantized::Group),
            Format::Q4_0 | Format::Q4_1 => {
                group::validate(x.len(), rows, cols, ggml::QK)?;
                let b = if format == Format::Q4_0 { Block::Q4_0 } else { Block::Q4_1 };
                ggml::quantize(b, x).map(|q| Quantized::Blocks(b, q))
            }
        }
    }
    pub fn format(&self) -> Format {
        match self {
            Quantized::Group(q) => Format::Group { scheme: q.scheme, group: q.group },
            Quantized::Blocks(Block::Q4_0, _) => Format::Q4_0,
            Quantized::Blocks(Block::Q4_1, _) => Format::Q4_1,
            Quantized::Blocks(Block::Q8_0, _) => unreachable!("Quantized holds 4-bit formats; Q8_0 weights are a Q8Tensor"),
        }
    }
    /// Weights held.
    pub fn len(&self) -> usize {
        match self {
            Quantized::Group(q) => q.rows * q.cols,
            Quantized::Blocks(b, q) => q.len() / b.bytes() * ggml::QK,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn dequantize(&self) -> Vec<f32> {
        match self {
            Quantized::Group(q) => q.dequantize(),
            Quantized::Blocks(b, q) => ggml::dequantize(*b, q).expect("whole blocks by construction"),
        }
    }
    /// [`Quantized::dequantize`] into `out` (every weight, in order).
    pub fn dequantize_into(&self, out: &mut [f32]) {
        match self {
            Quantized::Group(q) => q.dequantize_into(out),
            Quantized::Blocks(b, q) => ggml::dequantize_into(*b, q, out).expect("whole blocks by construction"),
        }
    }
    pub fn bytes(&self) -> u64 {
        match self {
            Quantized::Group(q) => q.bytes(),
            Quantized::Blocks(_, q) => q.len() as u64,
        }
    }
    /// The quantization step of each group, in order (|d|).
    pub fn steps(&self) -> Vec<f32> {
        match self {
            Quantized::Group(q) => q.scales.iter().map(|d| d.to_f32().abs()).collect(),
            Quantized::Blocks(b, q) => q.chunks_exact(b.bytes()).map(|blk| ggml::parts(*b, blk).0.abs()).collect(),
        }
    }
}

/// What [`step_check`] records as its reference.
pub const STEP_REFERENCE: &str = "original-f32, half the input's step per group";

/// An f16 scale or min is off by less than one unit in its last place (11 significant bits),
/// rounded to nearest or directed: 2^-10 of its value, or 2^-24 (the subnormal spacing) when tiny.
const F16_REL: f64 = 1.0 / 1024.0;
const F16_TINY: f64 = 1.0 / 16_777_216.0;
/// The quantizers' and dequantizers' own f32 arithmetic (codes picked from (x - m) / d, values
/// made as q d + m): well inside 16 units of 2^-24 of the group's largest magnitude.
const F32_SLACK: f64 = 1.0 / 1_048_576.0;

/// How a format lays its grid over a group, read off its quantizer (`quant::group`,
/// `quant::ggml`): what the input alone says its step is and which values its codes reach.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Grid {
    /// `q d` with `d = max|x| / qmax`: lab's symmetric groups (qmax 7, codes -8..7) and Q8_0
    /// (127, codes -127..127). Every input lies inside the grid.
    Symmetric { qmax: f64 },
    /// Q4_0: `(q - 8) d` with `d = x_m / -8`, x_m the first element of largest magnitude: the
    /// codes reach 8 steps on x_m's side and 7 on the other, where a value beyond 7 steps is
    /// clamped to the 7th (up to a whole step off).
    SignedMax,
    /// `q d + m` with `m = min`, `d = (max - min) / levels` (4-bit: 15): the grid spans the group.
    Asymmetric { levels: f64 },
}

impl Grid {
    pub const Q8_0: Grid = Grid::Symmetric { qmax: 127.0 };

    pub fn of(format: Format) -> Grid {
        match format {
            Format::Group { scheme: Scheme::Sym, .. } => Grid::Symmetric { qmax: 7.0 },
            Format::Q4_0 => Grid::SignedMax,
            Format::Group { scheme: Scheme::Asym, .. } | Format::Q4_1 => Grid::Asymmetric { levels: 15.0 },
        }
    }

    /// The most each element of the group `xs` may move, from `xs` alone: half the step (or the
    /// distance past the grid's last value, Q4_0), plus the stored scale's rounding times the
    /// largest code it multiplies and the stored min's rounding, plus f32 arithmetic. A quantizer
    /// that stores a larger scale than the group needs, or a shifted min, exceeds it.
    fn bounds(self, xs: &[f32]) -> impl Fn(f32) -> f64 {
        let (mut amax, mut lo, mut hi, mut extreme) = (0f64, f64::MAX, f64::MIN, 0f64);
        for &v in xs {
            let v = v as f64;
            if v.abs() > amax {
                (amax, extreme) = (v.abs(), v);
            }
            (lo, hi) = (lo.min(v), hi.max(v));
        }
        let rounding = |v: f64| v * F16_REL + F16_TINY;
        // (step, the largest code multiplying d, |min| stored, the grid's reach)
        let (step, codes, min, reach) = match self {
            Grid::Symmetric { qmax } => (amax / qmax, qmax, None, (-amax, amax)),
            Grid::SignedMax => {
                let step = amax / 8.0;
                (step, 8.0, None, if extreme >= 0.0 { (-7.0 * step, amax) } else { (-amax, 7.0 * step) })
            }
            Grid::Asymmetric { levels } => ((hi - lo) / levels, levels, Some(lo.abs()), (lo, hi)),
        };
        let fixed = codes * rounding(step) + min.map_or(0.0, rounding) + F32_SLACK * amax;
        move |x: f32| {
            let x = x as f64;
            let outside = (reach.0 - x).max(x - reach.1).max(0.0);
            (0.5 * step).max(outside) + fixed
        }
    }
}

/// Checks a reconstruction element by element against a bound taken from the original group
/// alone ([`Grid`]), never from the scale the quantizer stored: a quantizer that keeps an
/// oversized scale or a shifted min fails it. `worst_fraction_of_tolerance` is the largest
/// error over its element's bound (a correct quantizer comes close to 1: some element of most
/// groups lies near half a step); `max_abs` and `max_rel` are the measured error.
pub fn step_check(original: &[f32], approx: &[f32], grid: Grid, group: usize) -> ErrorStats {
    assert_eq!(original.len(), approx.len(), "step_check: lengths differ");
    assert!(group > 0 && original.len().is_multiple_of(group), "step_check: {} values are not whole groups of {group}", original.len());
    let (worst, mismatches, max_abs, idx) = original
        .par_chunks(group)
        .zip(approx.par_chunks(group))
        .enumerate()
        .map(|(g, (xs, ys))| {
            let bound = grid.bounds(xs);
            let mut acc = (0f64, 0u64, 0f64, g * group);
            for (i, (&x, &y)) in xs.iter().zip(ys).enumerate() {
                let e = (x as f64 - y as f64).abs();
                let f = if y.is_finite() { e / bound(x) } else { f64::INFINITY };
                acc.1 += u64::from(f > 1.0);
                acc.2 = acc.2.max(e);
                if f > acc.0 {
                    (acc.0, acc.3) = (f, g * group + i);
                }
            }
            acc
        })
        .reduce(|| (0.0, 0, 0.0, 0), |a, b| (if b.0 > a.0 { b.0 } else { a.0 }, a.1 + b.1, a.2.max(b.2), if b.0 > a.0 { b.3 } else { a.3 }));
    let max_rel = original.par_iter().zip(approx).filter(|(x, _)| **x != 0.0).map(|(&x, &y)| ((x - y) as f64 / x as f64).abs()).reduce(|| 0.0, f64::max);
    ErrorStats {
        max_abs,
        max_rel,
        worst_fraction_of_tolerance: worst,
        worst_index: Some(idx as u64),
        worst_got: approx.get(idx).map(|&v| v as f64),
        worst_expected: original.get(idx).map(|&v| v as f64),
        mismatches,
        reference: STEP_REFERENCE.into(),
        max_ulp: None,
        bound: Some("max(half the input group's step, distance past its grid) + the stored scale's and min's f16 rounding".into()),
    }
}

/// Exact comparison of bit patterns (u8 codes, f16 or f32 values).
pub fn bits<T: Copy + Into<u32>>(got: &[T], expected: &[T], reference: &str) -> ErrorStats {
    let g: Vec<u32> = got.iter().map(|&v| v.into()).collect();
    let e: Vec<u32> = expected.iter().map(|&v| v.into()).collect();
    compare_bits(&g, &e, reference)
}


pub fn f16_bits(v: &[f16]) -> Vec<u16> {
    v.iter().map(|h| h.to_bits()).collect()
}

/// One weight as its format defines it: the code's value c (q - 8, q, or Q8_0's signed q), the
/// scale d and the min m of asymmetric formats; the weight is c d (+ m).
type Terms = (f32, f32, Option<f32>);

fn value((c, d, m): Terms) -> f32 {
    match m {
        Some(m) => c * d + m,
        None => c * d,
    }
}

/// Every weight's [`Terms`], read straight from the definitions one element at a time.
fn reference_terms(q: &Quantized) -> Vec<Terms> {
    match q {
        Quantized::Group(g) => (0..g.rows * g.cols)
            .map(|i| {
                let code = ((g.packed[i / 2] >> (4 * (i % 2))) & 15) as f32;
                let d = g.scales[i / g.group].to_f32();
                match g.scheme {
                    Scheme::Sym => (code - 8.0, d, None),
                    Scheme::Asym => (code, d, Some(g.mins[i / g.group].to_f32())),
                }
            })
            .collect(),
        Quantized::Blocks(b, bytes) => block_terms(*b, bytes),
    }
}

/// [`reference_terms`] of GGUF blocks (Q4_0, Q4_1 or Q8_0).
fn block_terms(b: Block, bytes: &[u8]) -> Vec<Terms> {
    (0..bytes.len() / b.bytes() * 32)
        .map(|i| {
            let blk = &bytes[i / 32 * b.bytes()..(i / 32 + 1) * b.bytes()];
            let (d, m, qs) = ggml::parts(b, blk);
            let j = i % 32;
            let nibble = || (if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 }) as f32;
            match b {
                Block::Q4_0 => (nibble() - 8.0, d, None),
                Block::Q4_1 => (nibble(), d, Some(m)),
                Block::Q8_0 => (qs[j] as i8 as f32, d, None),
            }
        })
        .collect()
}

/// Dequantization read straight from the definitions, one element at a time: the independent
/// check of the parallel dequantizers.
pub fn reference_dequantize(q: &Quantized) -> Vec<f32> {
    reference_terms(q).into_iter().map(value).collect()
}

/// GGUF blocks (Q4_0, Q4_1 or Q8_0) dequantized one element at a time from the definitions.
pub fn reference_dequantize_blocks(b: Block, bytes: &[u8]) -> Vec<f32> {
    block_terms(b, bytes).into_iter().map(value).collect()
}

/// |c d| + |m| of every weight: the size of the terms a W4A16 design sums for it (the CUDA-core
/// design sums d (x . c) and m (sum x) apart), which its rounding error scales with.
pub fn reference_magnitudes(q: &Quantized) -> Vec<f32> {
    reference_terms(q).into_iter().map(|(c, d, m)| (c * d).abs() + m.map_or(0.0, f32::abs)).collect()
}

/// Y[b, r] = sum_k X[b, k] W[r, k] in f64, rows in parallel.
pub fn reference_w4a16(x: &[f64], w: &[f32], batch: usize, n: usize, k: usize) -> Vec<f64> {
    let cols: Vec<Vec<f64>> = (0..n)
        .into_par_iter()
        .map(|r| {
            let wr = &w[r * k..(r + 1) * k];
            (0..batch).map(|b| x[b * k..(b + 1) * k].iter().zip(wr).map(|(&a, &v)| a * v as f64).sum()).collect()
        })
        .collect();
    let mut y = vec![0.0; batch * n];
    for (r, c) in cols.iter().enumerate() {
        for (b, v) in c.iter().enumerate() {
            y[b * n + r] = *v;
        }
    }
    y
}

/// The f16 rounding of a weight decoded in f16 (the tensor-core designs' fma(c, d, m), rounded
/// once): 2^-11 of its value, at most of |c d| + |m|.
const F16_DECODE: f64 = 1.0 / 2048.0;

/// How far a W4A16 output may be from the f64 product of the dequantized weights, element by
/// element: K products accumulated in f32 and the result rounded to f16
/// ([`ProductBound::fp32_accumulation`]), each weight decoded in f16 on the tensor cores, all
/// scaled by the output's sum of |x| (|c d| + |m|) ([`reference_magnitudes`]).
pub fn w4a16_bound(k: usize) -> ProductBound {
    let b = ProductBound::fp32_accumulation(k, DType::F16);
    ProductBound { per_scale: b.per_scale + F16_DECODE, ..b }
}

/// A W4A16 output against its reference: `scale` the f64 product of |X| and
/// [`reference_magnitudes`], within `bound` ([`w4a16_bound`]).
pub fn check_w4a16(y: &[f16], expected: &[f64], scale: &[f64], bound: ProductBound) -> ErrorStats {
    compare_product(&crate::ops::widen(y), expected, scale, bound, "cpu-f64-dequantized")
}

/// Checks a W4A16 problem: K and the group size multiples of 32, the group dividing K.
pub fn validate_w4a16(n: usize, k: usize, group: usize, batch: usize) -> Result<()> {
    if n == 0 || k == 0 || !BATCHES.contains(&batch) {
        return Err(LabError::shape("w4a16", format!("N={n} K={k} batch {batch}: N and K at least 1, batch one of {BATCHES:?}")));
    }
    if !k.is_multiple_of(32) || !group.is_multiple_of(32) || !k.is_multiple_of(group) {
        return Err(LabError::shape("w4a16", format!("K={k}, group {group}: both must be multiples of 32 and the group must divide K")));
    }
    Ok(())
}

/// XOR of the little-endian u32 words of `bytes`, a partial last word zero-padded: what
/// `quant_stream_read_f16`'s blocks XOR together.
pub fn xor_words(bytes: &[u8]) -> u32 {
    bytes.chunks(4).map(|c| c.iter().enumerate().fold(0u32, |w, (i, &b)| w | (b as u32) << (8 * i))).fold(0, |a, w| a ^ w)
}


pub fn f16_bytes(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::ggml;

    #[test]
    fn reference_dequantizers_agree_with_the_parallel_ones_to_the_bit() {
        let (rows, cols) = (6, 256);
        let x: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.173).cos() * (1.0 + i as f32 / 500.0)).collect();
        for format in Format::all() {
            let q = Quantized::new(format, &x, rows, cols).unwrap();
            let fast: Vec<u32> = q.dequantize().iter().map(|v| v.to_bits()).collect();
            let slow: Vec<u32> = reference_dequantize(&q).iter().map(|v| v.to_bits()).collect();
            assert_eq!(fast, slow, "{}", format.name());
            let e = step_check(&x, &q.dequantize(), Grid::of(format), format.group());
            assert!(e.passed(), "{}: {e:?}", format.name());
            // A wrong code is caught.
            let mut y = q.dequantize();
            y[77] += 3.0 * q.steps()[77 / format.group()];
            let e = step_check(&x, &y, Grid::of(format), format.group());
            assert_eq!((e.passed(), e.worst_index), (false, Some(77)), "{}", format.name());
        }
    }

    /// Every format under test, with its grid, group and what its quantizer stores per group:
    /// (format name, grid, group, reconstruction, stored (scale, min) per group, codes' range).
    #[allow(clippy::type_complexity)]
    fn quantized_every_way(x: &[f32], rows: usize, cols: usize) -> Vec<(String, Grid, usize, Vec<f32>, Vec<(f32, f32)>, (f32, f32))> {
        let mut out = Vec::new();
        for format in Format::all() {
            let q = Quantized::new(format, x, rows, cols).unwrap();
            let stored: Vec<(f32, f32)> = match &q {
                Quantized::Group(g) => (0..g.scales.len()).map(|i| (g.scales[i].to_f32(), g.mins.get(i).map_or(0.0, |m| m.to_f32()))).collect(),
                Quantized::Blocks(b, bytes) => bytes.chunks_exact(b.bytes()).map(|blk| ggml::parts(*b, blk)).map(|(d, m, _)| (d, m)).collect(),
            };
            let codes = match Grid::of(format) {
                Grid::Asymmetric { .. } => (0.0, 15.0),
                _ => (-8.0, 7.0),
            };
            out.push((format.name(), Grid::of(format), format.group(), q.dequantize(), stored, codes));
        }
        let q8 = ggml::quantize(Block::Q8_0, x).unwrap();
        let stored = q8.chunks_exact(Block::Q8_0.bytes()).map(|blk| ggml::parts(Block::Q8_0, blk)).map(|(d, m, _)| (d, m)).collect();
        out.push(("q8_0".into(), Grid::Q8_0, ggml::QK, ggml::dequantize(Block::Q8_0, &q8).unwrap(), stored, (-128.0, 127.0)));
        out
    }

    /// A quantizer that stores `fault(d, m)` instead of each group's (scale, min) and picks every
    /// code nearest against what it stored, clamped to the format's codes: its reconstruction.
    fn faulty(x: &[f32], group: usize, stored: &[(f32, f32)], (lo, hi): (f32, f32), fault: impl Fn(f32, f32) -> (f32, f32)) -> Vec<f32> {
        x.chunks(group)
            .zip(stored)
            .flat_map(|(xs, &(d, m))| {
                let (d, m) = fault(d, m);
                xs.iter().map(move |&v| ((v - m) / d).round().clamp(lo, hi) * d + m)
            })
            .collect()
    }

    /// The check as it was: one step of the scale the quantizer stored per group, plus 1e-3 of
    /// the group's largest magnitude.
    fn within_stored_step(x: &[f32], y: &[f32], group: usize, steps: &[f32]) -> bool {
        x.chunks(group).zip(y.chunks(group)).zip(steps).all(|((xs, ys), &d)| {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
            xs.iter().zip(ys).all(|(&a, &b)| ((a - b) as f64).abs() <= d.abs() as f64 * (1.0 + 1e-3) + 1e-3 * amax)
        })
    }

    /// Planted faults: in every format a quantizer that stores twice the scale its group needs,
    /// and in the formats with a min one whose min sits 0.9 of a step low, each choosing its codes
    /// consistently with what it stored. The bound taken from the input fails both; the bound of
    /// the stored scale passed both.
    #[test]
    fn an_oversized_scale_or_a_shifted_min_fails_the_check_from_the_input() {
        let (rows, cols) = (8, 256);
        let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * (1.0 + (i as f32 * 0.013).sin())).collect();
        for (name, grid, group, honest, stored, codes) in quantized_every_way(&x, rows, cols) {
            let e = step_check(&x, &honest, grid, group);
            assert!(e.passed() && e.worst_fraction_of_tolerance > 0.8, "{name}: {e:?}");
            let doubled = faulty(&x, group, &stored, codes, |d, m| (2.0 * d, m));
            let steps: Vec<f32> = stored.iter().map(|&(d, _)| 2.0 * d).collect();
            assert!(within_stored_step(&x, &doubled, group, &steps), "{name}: the stored-scale bound should have passed the doubled scale");
            let e = step_check(&x, &doubled, grid, group);
            assert!(!e.passed() && e.worst_fraction_of_tolerance > 1.5, "{name}: a doubled scale passed: {e:?}");
            if let Grid::Asymmetric { .. } = grid {
                let shifted = faulty(&x, group, &stored, codes, |d, m| (d, m - 0.9 * d));
                let steps: Vec<f32> = stored.iter().map(|&(d, _)| d).collect();
                assert!(within_stored_step(&x, &shifted, group, &steps), "{name}: the stored-scale bound should have passed the shifted min");
                let e = step_check(&x, &shifted, grid, group);
                assert!(!e.passed() && e.worst_fraction_of_tolerance > 1.5, "{name}: a shifted min passed: {e:?}");
            }
        }
    }

    proptest::proptest! {
        /// The bound is never too tight: any finite matrix at any scale (down to f16's subnormal
        /// scales), in every format and Q8_0, passes it.
        #[test]
        fn random_matrices_pass_the_check_in_every_format(rows in 1usize..4, groups in 1usize..3, exp in -22i32..10, seed in 0u64..1000, offset in -2f32..2.0) {
            let cols = 128 * groups;
            let scale = 2f32.powi(exp);
            let x: Vec<f32> = (0..rows * cols).map(|i| scale * (((i as u64 * 2654435761 + seed * 97) % 2001) as f32 / 1000.0 - 1.0 + offset)).collect();
            for (name, grid, group, y, _, _) in quantized_every_way(&x, rows, cols) {
                let e = step_check(&x, &y, grid, group);
                proptest::prop_assert!(e.passed(), "{} at 2^{}: {:?}", name, exp, e);
            }
        }
    }

    #[test]
    fn the_w4a16_reference_is_a_plain_product_and_bad_shapes_are_named() {
        let (b, n, k) = (2, 3, 4);
        let x: Vec<f64> = (0..b * k).map(|i| i as f64).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 - 2.0).collect();
        let y = reference_w4a16(&x, &w, b, n, k);
        for bi in 0..b {
            for r in 0..n {
                let e: f64 = (0..k).map(|j| x[bi * k + j] * w[r * k + j] as f64).sum();
                assert_eq!(y[bi * n + r], e);
            }
        }
        assert!(validate_w4a16(8, 4096, 128, 1).is_ok());
        assert!(validate_w4a16(8, 4016, 32, 1).unwrap_err().to_string().contains("multiples of 32"));
        assert!(validate_w4a16(8, 4096, 96, 1).unwrap_err().to_string().contains("group must divide K"));
        assert!(validate_w4a16(8, 4096, 128, 3).unwrap_err().to_string().contains("batch 3"));
        assert!(parse_format("q5_0").is_err());
        assert_eq!(parse_format("asym_g64").unwrap(), Format::Group { scheme: Scheme::Asym, group: 64 });
    }

    /// kernels/quant/pack_dequant.cu's dequant_ggml_cp_async on the CPU, index for index: lane l copies 16 B vectors
    /// u = l + 32 i of a 64-block warp step (src-size min(16, bytes left), zero-filled), then
    /// writes elements 8p .. 8p + 7 (p = l % 4) of staged block 8j + l / 4 for j < 8. The decode
    /// of one staged block is the one the 32-block kernel uses (checked to the bit on the GPU).
    fn model_ggml_cp_async(b: Block, input: &[u8]) -> Vec<f32> {
        const SEGS: usize = super::super::variants::GGML_SEGS;
        let (bytes, total) = (b.bytes(), input.len());
        let nblocks = total / bytes;
        let (nvec, nv) = (2 * bytes * SEGS, (2 * bytes * SEGS).div_ceil(32));
        let mut out = vec![f32::NAN; nblocks * 32];
        for seg in 0..nblocks.div_ceil(32 * SEGS) {
            let base = seg * 32 * SEGS * bytes;
            let mut stage = vec![0xA5u8; 16 * nvec];
            for lane in 0..32 {
                for i in 0..nv {
                    let (u, off) = (lane + 32 * i, base + 16 * (lane + 32 * i));
                    if u < nvec && off < total {
                        let src = 16.min(total - off);
                        stage[16 * u..16 * u + 16].fill(0);
                        stage[16 * u..16 * u + src].copy_from_slice(&input[off..off + src]);
                    }
                }
            }
            for j in 0..4 * SEGS {
                for lane in 0..32 {
                    let (local, part) = (8 * j + lane / 4, lane % 4);
                    let blk = seg * 32 * SEGS + local;
                    if blk < nblocks {
                        let vals = ggml::dequantize(b, &stage[local * bytes..(local + 1) * bytes]).unwrap();
                        let dst = &mut out[32 * blk + 8 * part..32 * blk + 8 * part + 8];
                        assert!(dst.iter().all(|v| v.is_nan()), "block {blk} part {part} written twice");
                        dst.copy_from_slice(&vals[8 * part..8 * part + 8]);
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_cp_async_block_dequantize_covers_every_block_once() {
        for b in [Block::Q4_0, Block::Q4_1] {
            for nblocks in [1, 3, 63, 64, 65, 130, 200] {
                let x: Vec<f32> = (0..32 * nblocks).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
                let input = ggml::quantize(b, &x).unwrap();
                let want: Vec<u32> = ggml::dequantize(b, &input).unwrap().iter().map(|v| v.to_bits()).collect();
                let got: Vec<u32> = model_ggml_cp_async(b, &input).iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{b:?}, {nblocks} blocks");
            }
        }
    }

    /// The host's XOR folds little-endian words, zero-padding a partial last one, as the
    /// kernel's xor_words does for the tail bytes it reads one by one.
    #[test]
    fn the_stream_read_check_folds_words_as_the_kernel_does() {
        assert_eq!(xor_words(&[]), 0);
        assert_eq!(xor_words(&[0x01, 0x02, 0x03, 0x04]), 0x0403_0201);
        assert_eq!(xor_words(&[0x01, 0x02, 0x03, 0x04, 0xFF, 0x10]), 0x0403_0201 ^ 0x10FF);
        assert_eq!(xor_words(&[7; 8]), 0);
    }
}
