//! The f64 reference, the check against it (full or sampled), and the CPU backend's variant.

use super::{Dims, FULL_REFERENCE_MACS, SAMPLES};
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::kernels::symbol;
use crate::ops::compare::{compare_product, ProductBound};
use crate::ops::Elem;
use crate::record::ErrorStats;
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use rand::Rng;
use rayon::prelude::*;

/// One entry of the f64 reference, alpha * sum_k A[i,k] B[k,j] + beta * C0[i,j], and its sum of
/// absolute terms |alpha| sum_k |A[i,k] B[k,j]| + |beta C0[i,j]| (what its rounding error scales with).
pub fn reference_at<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, (alpha, beta): (f32, f32), i: usize, j: usize) -> (f64, f64) {
    let ai = &a[i * d.lda..i * d.lda + d.k];
    let (dot, abs) = ai.iter().enumerate().fold((0.0, 0.0), |(s, t), (kk, x)| {
        let p = x.to_f64() * b[kk * d.ldb + j].to_f64();
        (s + p, t + p.abs())
    });
    let old = old_term(c0, beta, d, i, j);
    (alpha as f64 * dot + old, (alpha as f64).abs() * abs + old.abs())
}

/// beta C0[i,j] in f64, 0 without C0 or with beta = 0 (C0 is then never read).
fn old_term<T: Elem>(c0: Option<&[T]>, beta: f32, d: Dims, i: usize, j: usize) -> f64 {
    match c0 {
        Some(c) if beta != 0.0 => beta as f64 * c[i * d.ldc + j].to_f64(),
        _ => 0.0,
    }
}

/// The full f64 reference, dense M x N: the values and their sums of absolute terms (rows in
/// parallel, B transposed once so every entry is a contiguous dot product with four independent
/// sums).
pub fn reference_terms<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, (alpha, beta): (f32, f32)) -> (Vec<f64>, Vec<f64>) {
    let bt: Vec<f64> = (0..d.n * d.k).into_par_iter().map(|x| b[(x % d.k) * d.ldb + x / d.k].to_f64()).collect();
    let mut out = vec![(0.0, 0.0); d.m * d.n];
    out.par_chunks_mut(d.n).enumerate().for_each(|(i, row)| {
        let ai: Vec<f64> = a[i * d.lda..i * d.lda + d.k].iter().map(|x| x.to_f64()).collect();
        for (j, o) in row.iter_mut().enumerate() {
            let bj = &bt[j * d.k..(j + 1) * d.k];
            let (mut s, mut t) = ([0.0f64; 4], [0.0f64; 4]);
            let (ac, bc) = (ai.chunks_exact(4), bj.chunks_exact(4));
            let tail = ac.remainder().iter().zip(bc.remainder()).fold((0.0, 0.0), |(s, t), (x, y)| (s + x * y, t + (x * y).abs()));
            for (x, y) in ac.zip(bc) {
                for q in 0..4 {
                    s[q] += x[q] * y[q];
                    t[q] += (x[q] * y[q]).abs();
                }
            }
            let dot = (s[0] + s[1]) + (s[2] + s[3]) + tail.0;
            let abs = (t[0] + t[1]) + (t[2] + t[3]) + tail.1;
            let old = old_term(c0, beta, d, i, j);
            *o = (alpha as f64 * dot + old, (alpha as f64).abs() * abs + old.abs());
        }
    });
    out.into_iter().unzip()
}

/// The full f64 reference values alone.
pub fn reference<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, ab: (f32, f32)) -> Vec<f64> {
    reference_terms(a, b, c0, d, ab).0
}

/// What a result is checked against, element by element: the whole product, or sampled
/// entries, each with its sum of absolute terms.
pub enum Expected {
    Full { values: Vec<f64>, scales: Vec<f64>, name: String },
    Sampled { picks: Vec<(usize, usize)>, values: Vec<f64>, scales: Vec<f64> },
}

impl Expected {
    /// The full product on the CPU up to [`FULL_REFERENCE_MACS`], else the four corners and
    /// [`SAMPLES`] random entries.
    pub fn new<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, ab: (f32, f32), rng: &mut impl Rng) -> Self {
        if d.macs() <= FULL_REFERENCE_MACS {
            return Expected::full(a, b, c0, d, ab);
        }
        Expected::sampled(a, b, c0, d, ab, rng)
    }
    pub fn full<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, ab: (f32, f32)) -> Self {
        let (values, scales) = reference_terms(a, b, c0, d, ab);
        Expected::Full { values, scales, name: "cpu-f64".into() }
    }
    pub fn sampled<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, ab: (f32, f32), rng: &mut impl Rng) -> Self {
        let mut picks = vec![(0, 0), (0, d.n - 1), (d.m - 1, 0), (d.m - 1, d.n - 1)];
        picks.extend((0..SAMPLES).map(|_| (rng.random_range(0..d.m), rng.random_range(0..d.n))));
        let (values, scales) = picks.par_iter().map(|&(i, j)| reference_at(a, b, c0, d, ab, i, j)).unzip();
        Expected::Sampled { picks, values, scales }
    }
    /// The full product by the f64 kernel of `kernels/reference.cu` on `gpu`, from the inputs
    /// already there, trusted only once it agrees with the CPU's f64 reference at the four corners
    /// and [`SAMPLES`] random entries (to within the f64 rounding of K-term sums).
    #[allow(clippy::too_many_arguments)]
    pub fn on_gpu<T: Elem>(gpu: &Gpu, host: (&[T], &[T], Option<&[T]>), dev: (&CudaSlice<T>, &CudaSlice<T>, Option<&CudaSlice<T>>), d: Dims, (alpha, beta): (f32, f32), rng: &mut impl Rng) -> Result<Self> {
        let f = gpu.function("reference", &symbol("reference", "gemm", T::DTYPE))?;
        let (mut values, mut scales) = (gpu.stream.alloc_zeros::<f64>(d.m * d.n).doing("allocating the reference")?, gpu.stream.alloc_zeros::<f64>(d.m * d.n).doing("allocating the reference")?);
        let (m, n, k, lda, ldb, ldc) = (d.m as i32, d.n as i32, d.k as i32, d.lda as i32, d.ldb as i32, d.ldc as i32);
        // Without C0, beta is 0 and the kernel never reads it: A stands in for the pointer.
        let (beta, c0) = match dev.2 {
            Some(c0) => (beta, c0),
            None => (0.0, dev.0),
        };
        let cfg = LaunchConfig { grid_dim: (d.n.div_ceil(16) as u32, d.m.div_ceil(16) as u32, 1), block_dim: (16, 16, 1), shared_mem_bytes: 0 };
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(dev.0).arg(dev.1).arg(c0).arg(&mut values).arg(&mut scales).arg(&m).arg(&n).arg(&k).arg(&lda).arg(&ldb).arg(&ldc).arg(&alpha).arg(&beta);
        // SAFETY: validate() checked A, B and C0 against M, N, K and their leading dimensions;
        // the kernel reads within them and writes the dense M x N outputs allocated above.
        unsafe { l.launch(cfg) }.doing("launching the f64 reference gemm")?;
        let (values, scales) = (gpu.download(&values)?, gpu.download(&scales)?);
        let Expected::Sampled { picks, values: want, scales: want_scale } = Expected::sampled(host.0, host.1, host.2, d, (alpha, beta), rng) else { unreachable!() };
        for (((&(i, j), &w), &ws), x) in picks.iter().zip(&want).zip(&want_scale).zip(0..) {
            let (g, gs) = (values[i * d.n + j], scales[i * d.n + j]);
            let slack = 4.0 * (d.k as f64 + 2.0) * f64::EPSILON * ws + f64::MIN_POSITIVE;
            if !((g - w).abs() <= slack && (gs - ws).abs() <= slack) {
                return Err(LabError::Invalid(format!("the GPU's f64 reference gemm disagrees with the CPU's at ({i}, {j}) (entry {x} of {}): {g} vs {w}, terms {gs} vs {ws}", picks.len())));
            }
        }
        Ok(Expected::Full { values, scales, name: format!("gpu-f64, agreeing with cpu-f64 at {} entries", picks.len()) })
    }
    pub fn name(&self) -> String {
        match self {
            Expected::Full { name, .. } => name.clone(),
            Expected::Sampled { picks, .. } => format!("cpu-f64-sampled-{}", picks.len()),
        }
    }
    /// Every element of `c` (M rows of leading dimension ldc) within its bound of the reference.
    pub fn check<T: Elem>(&self, c: &[T], d: Dims, bound: ProductBound) -> ErrorStats {
        let (got, expected, scales): (Vec<f64>, &[f64], &[f64]) = match self {
            Expected::Full { values, scales, .. } => ((0..d.m * d.n).into_par_iter().map(|x| c[(x / d.n) * d.ldc + x % d.n].to_f64()).collect(), values, scales),
            Expected::Sampled { picks, values, scales } => (picks.iter().map(|&(i, j)| c[i * d.ldc + j].to_f64()).collect(), values, scales),
        };
        compare_product(&got, expected, scales, bound, &self.name())
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
    use crate::kernels::DType;
    use crate::ops::gemm::bound;
    use rand::SeedableRng;

    fn inputs<T: Elem>(d: Dims, seed: u64) -> (Vec<T>, Vec<T>, Vec<T>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut f = |len: usize| -> Vec<T> { (0..len).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect() };
        (f((d.m - 1) * d.lda + d.k), f((d.k - 1) * d.ldb + d.n), f((d.m - 1) * d.ldc + d.n))
    }

    fn check_cpu<T: Elem>(d: Dims, ab: (f32, f32)) {
        let (a, b, c0) = inputs::<T>(d, d.macs());
        let expected = Expected::full(&a, &b, Some(&c0), d, ab);
        let mut c = c0.clone();
        cpu_blocked(&a, &b, &mut c, d, ab);
        let e = expected.check(&c, d, bound(T::DTYPE, d.k));
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
                assert!((reference_at(&a, &b, Some(&c0), d, (0.5, 2.0), i, j).0 - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn sampled_checks_catch_a_wrong_entry_and_nan() {
        let d = Dims::dense(40, 30, 20);
        let (a, b, _) = inputs::<f32>(d, 5);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let picks: Vec<(usize, usize)> = (0..200).map(|_| (rng.random_range(0..d.m), rng.random_range(0..d.n))).chain([(39, 29)]).collect();
        let (values, scales) = picks.iter().map(|&(i, j)| reference_at(&a, &b, None, d, (1.0, 0.0), i, j)).unzip();
        let expected = Expected::Sampled { picks, values, scales };
        assert_eq!(expected.name(), "cpu-f64-sampled-201");
        let mut c = vec![0f32; d.m * d.n];
        cpu_blocked(&a, &b, &mut c, d, (1.0, 0.0));
        let tight = bound(DType::F32, d.k);
        assert!(expected.check(&c, d, tight).passed());
        c[39 * 30 + 29] += 1e-3;
        let e = expected.check(&c, d, tight);
        assert_eq!((e.passed(), e.worst_index), (false, Some(200)), "{e:?}");
        c[39 * 30 + 29] = f32::NAN;
        let loose = ProductBound { atol: 1e9, rtol: 1e9, per_scale: 1e9 };
        assert!(!expected.check(&c, d, loose).passed());
        // Large products use the sampled check, small ones the full one.
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let (a, b, _) = inputs::<f32>(Dims::dense(2, 3, 4), 1);
        assert_eq!(Expected::new(&a, &b, None, Dims::dense(2, 3, 4), (1.0, 0.0), &mut rng).name(), "cpu-f64");
    }

    /// The planted fault a norm-wise check misses: one column of an fp16 product without its
    /// last, partial k-tile (40 of 1000 products) is 0.6% of the whole output's norm, under the
    /// old 1e-2 relative Frobenius tolerance, and fails the element-wise bound in every row.
    #[test]
    fn one_column_missing_its_last_k_tile_fails_the_element_bound_but_not_the_norm() {
        use crate::ops::compare::frobenius_rel;
        let d = Dims::dense(300, 1000, 1000);
        let (a, b, _) = inputs::<half::f16>(d, 7);
        let expected = Expected::full(&a, &b, None, d, (1.0, 0.0));
        let mut c = vec![half::f16::ZERO; d.m * d.n];
        cpu_blocked(&a, &b, &mut c, d, (1.0, 0.0));
        let tight = bound(DType::F16, d.k);
        assert!(expected.check(&c, d, tight).passed());
        let (j, k0) = (517, d.k / 64 * 64);
        for i in 0..d.m {
            let tile: f32 = (k0..d.k).map(|kk| a[i * d.k + kk].to_f32() * b[kk * d.n + j].to_f32()).sum();
            c[i * d.n + j] = half::f16::from_f32(c[i * d.n + j].to_f32() - tile);
        }
        let Expected::Full { values, .. } = &expected else { unreachable!() };
        let norm = frobenius_rel(&c.iter().map(|x| x.to_f64()).collect::<Vec<_>>(), values);
        assert!(norm < 1e-2, "the old norm-wise check would have caught it: {norm}");
        let e = expected.check(&c, d, tight);
        assert!(e.mismatches > 250, "{e:?}");
        assert_eq!(e.worst_index.map(|x| x as usize % d.n), Some(j));
    }
}
