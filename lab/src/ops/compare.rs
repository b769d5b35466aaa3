//! Compares a result with its f64 reference: max abs/rel error, the worst element, a verdict.

use super::{widen, Elem};
use crate::record::{ErrorStats, Tolerance};
use rayon::prelude::*;

/// |got - expected| <= atol + rtol * |expected| for every element; NaN passes only where the
/// reference is NaN, and infinities only where they match exactly.
pub fn compare(got: &[f64], expected: &[f64], tol: Tolerance, reference: &str) -> ErrorStats {
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
            if abs == 0.0 { 0.0 } else { abs / (tol.atol + tol.rtol * e.abs()) }
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

/// Relative Frobenius error ||got - expected||_F / ||expected||_F against `rel`: the norm-wise
/// test for products whose elements may cancel to near zero (GEMM), where an elementwise
/// relative test would fail on correct results. A non-finite value where a finite one was
/// expected is always a mismatch, whatever the norm says. `mismatches` counts those elements,
/// plus one when the norm test fails; `worst_fraction_of_tolerance` is the norm error over `rel`
/// (infinite with any non-finite mismatch); the worst element is the largest absolute error.
pub fn compare_frobenius(got: &[f64], expected: &[f64], rel: f64, reference: &str) -> ErrorStats {
    assert_eq!(got.len(), expected.len(), "compare_frobenius: lengths differ");
    let mut s = compare(got, expected, Tolerance { atol: 0.0, rtol: f64::INFINITY }, reference);
    // With rtol = inf only non-finite mismatches count; find the largest absolute error too.
    let (mut diff2, mut norm2) = (0.0f64, 0.0f64);
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        if !(g.is_finite() && e.is_finite()) {
            continue;
        }
        let d = g - e;
        diff2 += d * d;
        norm2 += e * e;
        if worst.is_none_or(|(_, w)| d.abs() > w) {
            worst = Some((i, d.abs()));
        }
    }
    let frob = if norm2 > 0.0 { (diff2 / norm2).sqrt() } else { diff2.sqrt() };
    if s.mismatches == 0 {
        s.worst_fraction_of_tolerance = frob / rel;
        if let Some((i, _)) = worst {
            (s.worst_index, s.worst_got, s.worst_expected) = (Some(i as u64), Some(got[i]), Some(expected[i]));
        }
        if !(frob <= rel) {
            s.mismatches = 1;
        }
    }
    s
}

/// The relative Frobenius error itself (what [`compare_frobenius`] tests), over finite pairs.
pub fn frobenius_rel(got: &[f64], expected: &[f64]) -> f64 {
    let (d2, n2) = got.iter().zip(expected).filter(|(g, e)| g.is_finite() && e.is_finite()).fold((0.0, 0.0), |(d, n), (&g, &e)| (d + (g - e) * (g - e), n + e * e));
    if n2 > 0.0 { (d2 / n2).sqrt() } else { d2.sqrt() }
}

/// The check made before timing if it failed, else the one after: a kernel must be right both
/// times, and the first failure is the one worth reading.
pub fn first_failure(before: ErrorStats, after: ErrorStats) -> ErrorStats {
    if before.passed() { after } else { before }
}

impl ErrorStats {
    pub fn passed(&self) -> bool {
        self.mismatches == 0
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
    fn frobenius_is_norm_wise_and_never_passes_nan() {
        // An element that cancels to ~0 fails elementwise but not norm-wise.
        let expected = [1.0, -2.0, 1e-9, 3.0];
        let got = [1.0, -2.0, 2e-9, 3.0];
        assert!(!compare(&got, &expected, Tolerance { atol: 0.0, rtol: 1e-5 }, "t").passed());
        let s = compare_frobenius(&got, &expected, 1e-5, "t");
        assert!(s.passed(), "{s:?}");
        assert!(s.worst_fraction_of_tolerance < 1.0);
        // A uniform 1e-3 relative error fails a 1e-5 norm test, passes 1e-2.
        let off: Vec<f64> = expected.iter().map(|e| e * 1.001).collect();
        assert!(!compare_frobenius(&off, &expected, 1e-5, "t").passed());
        assert!(compare_frobenius(&off, &expected, 1e-2, "t").passed());
        assert!((frobenius_rel(&off, &expected) - 1e-3).abs() < 1e-9);
        // NaN or inf where a number was expected fails, whatever the tolerance.
        for bad in [f64::NAN, f64::INFINITY] {
            let s = compare_frobenius(&[1.0, bad], &[1.0, 2.0], 1e9, "t");
            assert_eq!((s.passed(), s.worst_index), (false, Some(1)));
        }
        // The worst element is the largest absolute error.
        let s = compare_frobenius(&[1.0, 2.5, 3.1], &[1.0, 2.0, 3.0], 1.0, "t");
        assert_eq!(s.worst_index, Some(1));
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
    }
}
