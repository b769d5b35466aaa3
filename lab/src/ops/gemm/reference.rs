//! The f64 reference, the check against it (full or sampled), and the CPU backend's variant.

use super::{Dims, FULL_REFERENCE_MACS, SAMPLES};
use crate::ops::compare::compare_frobenius;
use crate::ops::Elem;
use crate::record::ErrorStats;
use rand::Rng;
use rayon::prelude::*;

/// One entry of the f64 reference: alpha * sum_k A[i,k] B[k,j] + beta * C0[i,j].
pub fn reference_at<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, (alpha, beta): (f32, f32), i: usize, j: usize) -> f64 {
    let ai = &a[i * d.lda..i * d.lda + d.k];
    let dot: f64 = ai.iter().enumerate().map(|(kk, x)| x.to_f64() * b[kk * d.ldb + j].to_f64()).sum();
    let old = match c0 {
        Some(c) if beta != 0.0 => beta as f64 * c[i * d.ldc + j].to_f64(),
        _ => 0.0,
    };
    alpha as f64 * dot + old
}

/// The full f64 reference, dense M x N (rows in parallel, B transposed once so every entry is a
/// contiguous dot product with four independent sums).
pub fn reference<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, (alpha, beta): (f32, f32)) -> Vec<f64> {
    let bt: Vec<f64> = (0..d.n * d.k).into_par_iter().map(|x| b[(x % d.k) * d.ldb + x / d.k].to_f64()).collect();
    let mut out = vec![0.0; d.m * d.n];
    out.par_chunks_mut(d.n).enumerate().for_each(|(i, row)| {
        let ai: Vec<f64> = a[i * d.lda..i * d.lda + d.k].iter().map(|x| x.to_f64()).collect();
        for (j, o) in row.iter_mut().enumerate() {
            let bj = &bt[j * d.k..(j + 1) * d.k];
            let mut s = [0.0f64; 4];
            let (ac, bc) = (ai.chunks_exact(4), bj.chunks_exact(4));
            let tail: f64 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
            for (x, y) in ac.zip(bc) {
                for q in 0..4 {
                    s[q] += x[q] * y[q];
                }
            }
            let dot = (s[0] + s[1]) + (s[2] + s[3]) + tail;
            let old = match c0 {
                Some(c) if beta != 0.0 => beta as f64 * c[i * d.ldc + j].to_f64(),
                _ => 0.0,
            };
            *o = alpha as f64 * dot + old;
        }
    });
    out
}

/// What a result is checked against: the whole product, or sampled entries.
pub enum Expected {
    Full(Vec<f64>),
    Sampled { picks: Vec<(usize, usize)>, values: Vec<f64> },
}

impl Expected {
    pub fn new<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, ab: (f32, f32), rng: &mut impl Rng) -> Self {
        if d.macs() <= FULL_REFERENCE_MACS {
            return Expected::Full(reference(a, b, c0, d, ab));
        }
        let mut picks = vec![(0, 0), (0, d.n - 1), (d.m - 1, 0), (d.m - 1, d.n - 1)];
        picks.extend((0..SAMPLES).map(|_| (rng.random_range(0..d.m), rng.random_range(0..d.n))));
        let values = picks.par_iter().map(|&(i, j)| reference_at(a, b, c0, d, ab, i, j)).collect();
        Expected::Sampled { picks, values }
    }
    pub fn name(&self) -> String {
        match self {
            Expected::Full(_) => "cpu-f64".into(),
            Expected::Sampled { picks, .. } => format!("cpu-f64-sampled-{}", picks.len()),
        }
    }
    /// Relative Frobenius error of `c` (M rows of leading dimension ldc) against the reference.
    pub fn check<T: Elem>(&self, c: &[T], d: Dims, rel: f64) -> ErrorStats {
        let (got, expected): (Vec<f64>, &[f64]) = match self {
            Expected::Full(e) => ((0..d.m * d.n).into_par_iter().map(|x| c[(x / d.n) * d.ldc + x % d.n].to_f64()).collect(), e),
            Expected::Sampled { picks, values } => (picks.iter().map(|&(i, j)| c[i * d.ldc + j].to_f64()).collect(), values),
        };
        compare_frobenius(&got, expected, rel, &self.name())
    }
}

/// The CPU backend's variant: f32 arithmetic, cache-blocked (64-row blocks in parallel; within a
/// block, 512-column by 256-deep panels of B so the panel stays in L2 while every row of the
/// block streams over it as vectorisable row updates).
pub fn cpu_blocked<T: Elem>(a: &[T], b: &[T], c: &mut [T], d: Dims, (alpha, beta): (f32, f32)) {
    const MB: usize = 64;
    const NB: usize = 512;
    const KB: usize = 256;
    let af: Vec<f32> = a.par_iter().map(|x| x.to_f32()).collect();
    let bf: Vec<f32> = b.par_iter().map(|x| x.to_f32()).collect();
    c.par_chunks_mut(MB * d.ldc).enumerate().for_each(|(blk, cblk)| {
        let r0 = blk * MB;
        let rows = MB.min(d.m - r0);
        let mut acc = vec![0f32; rows * NB];
        for n0 in (0..d.n).step_by(NB) {
            let nw = NB.min(d.n - n0);
            acc.iter_mut().for_each(|v| *v = 0.0);
            for k0 in (0..d.k).step_by(KB) {
                for r in 0..rows {
                    let arow = &af[(r0 + r) * d.lda..];
                    let accr = &mut acc[r * NB..r * NB + nw];
                    for kk in k0..(k0 + KB).min(d.k) {
                        let x = arow[kk];
                        let brow = &bf[kk * d.ldb + n0..kk * d.ldb + n0 + nw];
                        // Plain multiply-add (not mul_add: without the fma target feature that is a libm call).
                        accr.iter_mut().zip(brow).for_each(|(o, &y)| *o += x * y);
                    }
                }
            }
            for r in 0..rows {
                let out = &mut cblk[r * d.ldc + n0..r * d.ldc + n0 + nw];
                for (o, &v) in out.iter_mut().zip(&acc[r * NB..r * NB + nw]) {
                    let old = if beta != 0.0 { beta * o.to_f32() } else { 0.0 };
                    *o = T::from_f32(alpha * v + old);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gemm::tolerance;
    use rand::SeedableRng;

    fn inputs<T: Elem>(d: Dims, seed: u64) -> (Vec<T>, Vec<T>, Vec<T>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut f = |len: usize| -> Vec<T> { (0..len).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect() };
        (f((d.m - 1) * d.lda + d.k), f((d.k - 1) * d.ldb + d.n), f((d.m - 1) * d.ldc + d.n))
    }

    fn check_cpu<T: Elem>(d: Dims, ab: (f32, f32)) {
        let (a, b, c0) = inputs::<T>(d, d.macs());
        let expected = Expected::Full(reference(&a, &b, Some(&c0), d, ab));
        let mut c = c0.clone();
        cpu_blocked(&a, &b, &mut c, d, ab);
        let e = expected.check(&c, d, tolerance(T::DTYPE));
        assert!(e.passed(), "{:?} {d:?}: {e:?}", T::DTYPE);
        // Padding between rows of C (ldc > N) is never written.
        for i in 0..d.m.saturating_sub(1) {
            for j in d.n..d.ldc {
                assert_eq!(c[i * d.ldc + j].to_f32(), c0[i * d.ldc + j].to_f32(), "padding at ({i}, {j}) changed");
            }
        }
    }

    #[test]
    fn cpu_variant_matches_the_reference_on_odd_shapes() {
        for (m, n, k) in [(1, 1, 1), (1, 1000, 777), (33, 47, 65), (97, 131, 600), (1000, 1000, 1000), (4097, 513, 777)] {
            check_cpu::<f32>(Dims::dense(m, n, k), (1.0, 0.0));
        }
        for (m, n, k) in [(1, 37, 29), (65, 130, 300)] {
            check_cpu::<f32>(Dims::dense(m, n, k), (0.5, -1.25));
            check_cpu::<half::f16>(Dims::dense(m, n, k), (1.0, 0.0));
            check_cpu::<half::bf16>(Dims::dense(m, n, k), (0.5, -1.25));
        }
        // Leading dimensions longer than the rows.
        check_cpu::<f32>(Dims { m: 19, n: 23, k: 29, lda: 31, ldb: 27, ldc: 25 }, (2.0, 0.5));
    }

    #[test]
    fn reference_agrees_with_an_independent_triple_loop() {
        let d = Dims { m: 7, n: 5, k: 9, lda: 11, ldb: 6, ldc: 8 };
        let (a, b, c0) = inputs::<f32>(d, 3);
        let full = reference(&a, &b, Some(&c0), d, (0.5, 2.0));
        for i in 0..d.m {
            for j in 0..d.n {
                let mut dot = 0.0f64;
                for kk in 0..d.k {
                    dot += a[i * d.lda + kk] as f64 * b[kk * d.ldb + j] as f64;
                }
                let want = 0.5 * dot + 2.0 * c0[i * d.ldc + j] as f64;
                assert!((full[i * d.n + j] - want).abs() < 1e-12);
                assert!((reference_at(&a, &b, Some(&c0), d, (0.5, 2.0), i, j) - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn sampled_checks_catch_a_wrong_entry_and_nan() {
        let d = Dims::dense(40, 30, 20);
        let (a, b, _) = inputs::<f32>(d, 5);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let picks: Vec<(usize, usize)> = (0..200).map(|_| (rng.random_range(0..d.m), rng.random_range(0..d.n))).chain([(39, 29)]).collect();
        let values = picks.iter().map(|&(i, j)| reference_at(&a, &b, None, d, (1.0, 0.0), i, j)).collect();
        let expected = Expected::Sampled { picks, values };
        assert_eq!(expected.name(), "cpu-f64-sampled-201");
        let mut c = vec![0f32; d.m * d.n];
        cpu_blocked(&a, &b, &mut c, d, (1.0, 0.0));
        assert!(expected.check(&c, d, 1e-5).passed());
        c[39 * 30 + 29] += 10.0;
        assert!(!expected.check(&c, d, 1e-5).passed());
        c[39 * 30 + 29] = f32::NAN;
        assert!(!expected.check(&c, d, 1e9).passed());
        // Large products use the sampled check, small ones the full one.
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let (a, b, _) = inputs::<f32>(Dims::dense(2, 3, 4), 1);
        assert_eq!(Expected::new(&a, &b, None, Dims::dense(2, 3, 4), (1.0, 0.0), &mut rng).name(), "cpu-f64");
    }
}
