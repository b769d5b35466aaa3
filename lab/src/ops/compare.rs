//! Compares a result with its f64 reference: max abs/rel error, the worst element, a verdict.

use super::{widen, Elem};
use crate::record::{ErrorStats, Tolerance};
use rayon::prelude::*;

/// |got - expected| <= atol + rtol * |expected| for every element; NaN passes only where the
/// reference is NaN, and infinities only where they match exactly.
pub fn compare(got: &[f64], expected: &[f64], tol: Tolerance, reference: &str) -> ErrorStats {
    compare_with(got, expected, |_, e| tol.atol + tol.rtol * e.abs(), reference)
}

/// How far a product's element may be from its f64 reference: the forward error bound of a
/// sum of K products accumulated in fp32 (the form BLAS test suites use), plus the rounding of
/// the result to the output type and half its smallest subnormal:
/// |c - ref| <= atol + rtol |ref| + per_scale (|alpha| sum_k |A_ik| |B_kj| + |beta| |C0_ij|).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProductBound {
    pub atol: f64,
    pub rtol: f64,
    pub per_scale: f64,
}

impl ProductBound {
    /// K products accumulated in fp32 (2 (K + 2) eps: the summation's gamma_K with a factor 2
    /// for accumulators that truncate, plus alpha and beta), stored as `out`.
    pub fn fp32_accumulation(k: usize, out: crate::kernels::DType) -> Self {
        use crate::kernels::DType;
        let (eps, half_subnormal) = match out {
            DType::F32 => (2f64.powi(-23), 2f64.powi(-150)),
            DType::F16 => (2f64.powi(-10), 2f64.powi(-25)),
            DType::Bf16 => (2f64.powi(-7), 2f64.powi(-134)),
        };
        ProductBound { atol: half_subnormal, rtol: eps, per_scale: 2.0 * (k as f64 + 2.0) * 2f64.powi(-23) }
    }
    /// The same, for a GEMM that may round partial sums to the output type before adding them
    /// (cuBLAS's default math allows split-K reductions in the output type): each rounding adds
    /// up to eps_out / 2 of its partial, at most eps_out / 2 of the sum of terms; two such
    /// roundings are allowed (the partials, then their sum).
    pub fn with_output_type_reduction(self) -> Self {
        ProductBound { per_scale: self.per_scale + self.rtol, ..self }
    }
    /// The part a record's `tolerance` can hold (the rest is said in `error.bound`).
    pub fn tolerance(&self) -> Tolerance {
        Tolerance { atol: self.atol, rtol: self.rtol }
    }
    pub fn describe(&self) -> String {
        format!("atol + rtol |ref| + {:.3e} (|alpha| |A||B| + |beta| |C0|)_ij", self.per_scale)
    }
}

/// Each element against its own [`ProductBound`], `scale[i]` being its sum of absolute terms:
/// an error confined to one column or one k-tile fails here, where a norm-wise test of the whole
/// output (relative Frobenius error) would average it away.
pub fn compare_product(got: &[f64], expected: &[f64], scale: &[f64], bound: ProductBound, reference: &str) -> ErrorStats {
    assert_eq!(expected.len(), scale.len(), "compare_product: lengths differ");
    let mut s = compare_with(got, expected, |i, e| bound.atol + bound.rtol * e.abs() + bound.per_scale * scale[i], reference);
    s.bound = Some(bound.describe());
    s
}

/// Each element within its own allowance `allow[i]` (a bound derived for that element, e.g. the
/// moe layer's), said in `bound`.
pub fn compare_within(got: &[f64], expected: &[f64], allow: &[f64], bound: &str, reference: &str) -> ErrorStats {
    assert_eq!(expected.len(), allow.len(), "compare_within: lengths differ");
    let mut s = compare_with(got, expected, |i, _| allow[i], reference);
    s.bound = Some(bound.to_string());
    s
}

/// [`compare`] with each element's allowance from `allow(index, expected)`.
fn compare_with(got: &[f64], expected: &[f64], allow: impl Fn(usize, f64) -> f64, reference: &str) -> ErrorStats {
    assert_eq!(got.len(), expected.len(), "compare: lengths differ");
    let mut s = ErrorStats::empty(reference);
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        let fraction = if e.is_nan() || g.is_nan() || e.is_infinite() || g.is_infinite() {
            let same = (e.is_nan() && g.is_nan()) || g == e;
            if same { 0.0 } else { f64::INFINITY }
        } else {
            let abs = (g - e).abs();
            s.max_abs = s.max_abs.max(abs);
            if e != 0.0 {
                s.max_rel = s.max_rel.max(abs / e.abs());
            }
            // Exact agreement is 0 even where the allowance is 0 (atol = 0, expected = 0).
            if abs == 0.0 { 0.0 } else { abs / allow(i, e) }
        };
        if fraction > 1.0 {
            s.mismatches += 1;
        }
        if fraction > s.worst_fraction_of_tolerance || (s.worst_index.is_none() && fraction.is_nan()) {
            s.worst_fraction_of_tolerance = fraction;
            s.worst_index = Some(i as u64);
            s.worst_got = Some(g);
            s.worst_expected = Some(e);
        }
    }
    if s.mismatches > 0 && !s.max_abs.is_finite() {
        s.max_abs = f64::INFINITY;
    }
    s
}

/// [`compare`] for an output of element type `T`, with its error in ULPs of `T`.
pub fn compare_elems<T: Elem>(got: &[T], expected: &[f64], tol: Tolerance, reference: &str) -> ErrorStats {
    let mut s = compare(&widen(got), expected, tol, reference);
    s.max_ulp = Some(max_ulp(got, expected));
    s
}

/// Largest |ordinal(got) - ordinal(round(expected))| over pairs where both are finite.
pub fn max_ulp<T: Elem>(got: &[T], expected: &[f64]) -> u64 {
    got.par_iter()
        .zip(expected)
        .filter(|(g, e)| g.to_f64().is_finite() && e.is_finite())
        .map(|(&g, &e)| g.ordinal().abs_diff(T::from_f64(e).ordinal()))
        .max()
        .unwrap_or(0)
}

/// The relative Frobenius error ||got - expected||_F / ||expected||_F over finite pairs: what a
/// norm-wise check would judge (the tests show the faults it misses).
pub fn frobenius_rel(got: &[f64], expected: &[f64]) -> f64 {
    let (d2, n2) = got.iter().zip(expected).filter(|(g, e)| g.is_finite() && e.is_finite()).fold((0.0, 0.0), |(d, n), (&g, &e)| (d + (g - e) * (g - e), n + e * e));
    if n2 > 0.0 { (d2 / n2).sqrt() } else { d2.sqrt() }
}

/// The check made before timing if it failed, else the one after: a kernel must be right both
/// times, and the first failure is the one worth reading.
/// One judgement of several outputs compared part by part (each with its own tolerance), laid
/// end to end: mismatches add up, the worst element is the worst part's, its index counted from
/// the start of the first part. `parts` are (stats, that part's offset).
pub fn merge_parts(parts: Vec<(ErrorStats, usize)>) -> ErrorStats {
    let mut all: Option<ErrorStats> = None;
    for (mut e, offset) in parts {
        e.worst_index = e.worst_index.map(|i| i + offset as u64);
        all = Some(match all {
            None => e,
            Some(mut a) => {
                a.mismatches += e.mismatches;
                a.max_abs = a.max_abs.max(e.max_abs);
                a.max_rel = a.max_rel.max(e.max_rel);
                a.max_ulp = a.max_ulp.max(e.max_ulp);
                if e.worst_fraction_of_tolerance > a.worst_fraction_of_tolerance {
                    (a.worst_fraction_of_tolerance, a.worst_index) = (e.worst_fraction_of_tolerance, e.worst_index);
                    (a.worst_got, a.worst_expected) = (e.worst_got, e.worst_expected);
                }
                a
            }
        });
    }
    all.expect("at least one part")
}

pub fn first_failure(before: ErrorStats, after: ErrorStats) -> ErrorStats {
    if before.passed() { after } else { before }
}

impl ErrorStats {
    pub fn passed(&self) -> bool {
        self.mismatches == 0
    }
}

/// Bit-exact comparison (copies): counts differing elements and names the first.
pub fn compare_bits(got: &[u32], expected: &[u32], reference: &str) -> ErrorStats {
    assert_eq!(got.len(), expected.len(), "compare_bits: lengths differ");
    let mismatches = got.par_iter().zip(expected).filter(|(g, e)| g != e).count() as u64;
    let first = (mismatches > 0).then(|| got.iter().zip(expected).position(|(g, e)| g != e).unwrap_or(0));
    ErrorStats {
        max_abs: if mismatches > 0 { f64::INFINITY } else { 0.0 },
        max_rel: if mismatches > 0 { f64::INFINITY } else { 0.0 },
        worst_fraction_of_tolerance: if mismatches > 0 { f64::INFINITY } else { 0.0 },
        worst_index: first.map(|i| i as u64),
        worst_got: first.map(|i| got[i] as f64),
        worst_expected: first.map(|i| expected[i] as f64),
        mismatches,
        reference: reference.to_string(),
        max_ulp: None,
        bound: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const TOL: Tolerance = Tolerance { atol: 1e-6, rtol: 1e-5 };

    #[test]
    fn equal_inputs_pass_and_a_small_error_is_measured() {
        let s = compare(&[1.0, 2.0], &[1.0, 2.0], TOL, "t");
        assert!(s.passed());
        assert_eq!(s.max_abs, 0.0);
        let s = compare(&[1.0, 2.000001], &[1.0, 2.0], TOL, "t");
        assert!(s.passed());
        assert!((s.max_abs - 1e-6).abs() < 1e-12);
        assert_eq!(s.worst_index, Some(1));
    }

    #[test]
    fn nan_passes_only_against_nan() {
        assert!(!compare(&[f64::NAN], &[0.5], TOL, "t").passed());
        assert!(compare(&[f64::NAN], &[f64::NAN], TOL, "t").passed());
        assert!(!compare(&[0.5], &[f64::NAN], TOL, "t").passed());
        let s = compare(&[0.5, f64::NAN], &[0.5, 0.25], TOL, "t");
        assert_eq!((s.mismatches, s.worst_index), (1, Some(1)));
    }

    #[test]
    fn ulps_count_representable_steps_of_the_output_type() {
        use half::bf16;
        let one = bf16::from_f32(1.0);
        let next = bf16::from_bits(one.to_bits() + 1);
        assert_eq!(max_ulp(&[one, next], &[1.0, 1.0]), 1);
        // Across zero: the smallest negative and positive subnormals are 2 steps apart.
        assert_eq!(max_ulp(&[bf16::from_bits(0x8001)], &[bf16::from_bits(1).to_f64()]), 2);
        assert_eq!(max_ulp(&[-0.0f32], &[0.0]), 0);
        assert_eq!(max_ulp(&[1.0f32 + f32::EPSILON * 3.0], &[1.0]), 3);
        // Non-finite pairs are the tolerance check's business, not the ULP figure's.
        assert_eq!(max_ulp(&[f32::NAN], &[1.0]), 0);
        let s = compare_elems(&[one, next], &[1.0, 1.0], TOL, "t");
        assert_eq!(s.max_ulp, Some(1));
    }

    #[test]
    fn a_large_error_fails_with_its_index() {
        let s = compare(&[0.0, 0.1, 0.3], &[0.0, 0.1, 0.2], TOL, "t");
        assert!(!s.passed());
        assert_eq!(s.worst_index, Some(2));
        assert_eq!(s.worst_got, Some(0.3));
    }
    #[test]
    fn an_element_within_its_product_bound_passes_and_one_beyond_fails() {
        let bound = ProductBound { atol: 0.0, rtol: 0.0, per_scale: 1e-3 };
        // Near-cancelling elements get the allowance of their terms, not of their value.
        let s = compare_product(&[1e-9 + 5e-4, 2.0], &[1e-9, 2.0], &[1.0, 2.0], bound, "t");
        assert!(s.passed() && s.bound.is_some(), "{s:?}");
        let s = compare_product(&[1e-9, 2.003], &[1e-9, 2.0], &[1.0, 2.0], bound, "t");
        assert_eq!((s.passed(), s.worst_index), (false, Some(1)));
        assert!((s.worst_fraction_of_tolerance - 1.5).abs() < 1e-9, "{s:?}");
        assert!(!compare_product(&[f64::NAN], &[1.0], &[1.0], ProductBound { atol: 1e9, rtol: 1e9, per_scale: 1e9 }, "t").passed());
        let off = [1.001, -2.002];
        assert!((frobenius_rel(&off, &[1.0, -2.0]) - 1e-3).abs() < 1e-9);
    }
}
