//! `gemm`: C = alpha A B + beta C, row-major, a ladder from one thread per output to tensor cores
//! (kernels/gemm/), beside cuBLAS in the same run on the same inputs. fp32 variants are SIMT;
//! the TMA rungs (`mma_warp64_tma` and `mma_warp64_tail_split`: TMA and mbarriers feeding
//! mma.sync; `wgmma_tma` and its narrower tiles: the same with wgmma) exist on compute
//! capability 9.0 only and take row strides that are multiples of 16 bytes ([`not_applicable`]
//! says why not); fp16/bf16 variants accumulate in fp32 and write C in the input dtype (what
//! cuBLAS gemm_ex with CUBLAS_COMPUTE_32F does, so the peer and ours produce the same thing).
//!
//! As an operation on tensors ([`matmul`], [`matmul_with`], [`gemm`]): A is M x K, B is K x N and
//! C is M x N, all row-major and dense; neither operand is transposed (B is K x N, not the N x K
//! layout of a `nn.Linear` weight). A may have more than two dimensions: M is then the product
//! of all but its last, and C has A's leading dimensions followed by N.
//!
//! ```
//! use lab::prelude::*;
//! use lab::ops::gemm;
//! let cpu = Backend::Cpu;
//! let a = Tensor::from_vec(&[2, 3], vec![1f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
//! let b = Tensor::from_vec(&[3, 1], vec![1f32, 0.0, -1.0]).unwrap();
//! let mut c = Tensor::<f32>::zeros(&cpu, &[2, 1]).unwrap();
//! gemm::matmul(&cpu, &a, &b, &mut c).unwrap();
//! assert_eq!(c.to_vec().unwrap(), vec![-2.0, -2.0]);
//! ```
//!
//! Correctness is element-wise, against an f64 reference computed from the stored inputs: each
//! element within the forward error bound of its fp32 accumulation (2 (K + 2) eps32 times its
//! sum of absolute terms, [`bound`]) plus the output's rounding; NaN never passes. Products up to
//! [`FULL_REFERENCE_MACS`] are checked in full (`reference: "cpu-f64"`); larger ones in full
//! against an f64 kernel on the GPU (`"gpu-f64"`, itself checked against the CPU at the sampled
//! entries), or on the CPU backend at [`SAMPLES`] random entries plus the four corners
//! (`"cpu-f64-sampled-<count>"`).
//!
//! Files: `variants` (the table), `launch` (kernels and their arguments), `tma` (tensor maps and
//! the wgmma tiles), `plan` (split-K and the tail split), `reference` (f64 reference, the check,
//! the CPU variant), `experiment` and `cublas` (the sweep and its peer); `sim_*` replay the
//! kernels' index math and pipelines on the CPU (tests only).

mod cublas;
mod experiment;
mod launch;
pub mod plan;
pub mod reference;
pub mod tma;
pub mod variants;
#[cfg(test)]
mod mirrors;
#[cfg(test)]
mod sim_mma_sync;
#[cfg(test)]
mod sim_simt;
#[cfg(test)]
mod sim_tma;

pub use experiment::Gemm;
pub use launch::{fit_dynamic_smem, kernel, raise_dynamic_smem};
pub use plan::{splitk_slices, tail_plan, Split, TailPlan};
pub use reference::{cpu_blocked, reference, reference_at, reference_terms, Expected};
pub use tma::{encode_tensor_map, wg, TensorMap, TmaMaps};
pub use variants::{applies, find, not_applicable, refusal, Config, Grid, Kind, VARIANTS};

use crate::experiment::Backend;
use crate::kernels::DType;
use crate::ops::compare::ProductBound;
use crate::ops::variant::{self, Variant, VariantInfo};
use crate::ops::Elem;
use crate::profile::Work;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};

const FAMILY: &str = "gemm";

/// The slow rungs (naive, smem_tiled) run in the sweep only up to this many multiply-adds (2048^3).
pub const SLOW_MAX_MACS: u64 = 1 << 33;
/// Up to this many multiply-adds the f64 reference is computed in full.
pub const FULL_REFERENCE_MACS: u64 = 1 << 31;
/// Entries checked when the product is too large for a full reference.
pub const SAMPLES: usize = 4096;

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// Shape and leading dimensions (elements between consecutive rows) of one GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}

impl Dims {
    /// Dense row-major operands: lda = K, ldb = ldc = N.
    pub fn dense(m: usize, n: usize, k: usize) -> Self {
        Dims { m, n, k, lda: k, ldb: n, ldc: n }
    }
    pub fn macs(&self) -> u64 {
        (self.m * self.n) as u64 * self.k as u64
    }
    /// flops = 2 M N K; bytes = A and B read once, C written once (and read once when beta != 0).
    pub fn work(&self, elem: usize, beta: f32) -> Work {
        let c = (self.m * self.n) as u64 * if beta != 0.0 { 2 } else { 1 };
        Work { bytes: elem as u64 * ((self.m * self.k + self.k * self.n) as u64 + c), flops: 2 * self.macs() }
    }
}

/// Checks a GEMM's arguments: every dimension >= 1 and < 2^31, each leading dimension at least
/// its row, and each buffer long enough for the rows it is read or written through.
/// Leading dimensions need no alignment: 16-byte loads fall back to element loads where a row
/// start is not 16-byte aligned.
pub fn validate(d: Dims, a_len: usize, b_len: usize, c_len: usize) -> Result<()> {
    let Dims { m, n, k, lda, ldb, ldc } = d;
    if m == 0 || n == 0 || k == 0 {
        return Err(LabError::shape("gemm", format!("M={m} N={n} K={k}: every dimension must be at least 1")));
    }
    if [m, n, k, lda, ldb, ldc].iter().any(|&v| v > i32::MAX as usize) {
        return Err(LabError::shape("gemm", format!("M={m} N={n} K={k} lda={lda} ldb={ldb} ldc={ldc}: each must be below 2^31")));
    }
    for (name, ld, row, what) in [("lda", lda, k, "K"), ("ldb", ldb, n, "N"), ("ldc", ldc, n, "N")] {
        if ld < row {
            return Err(LabError::shape("gemm", format!("{name}={ld} is shorter than a row ({what}={row})")));
        }
    }
    for (name, len, rows, ld, row) in [("A", a_len, m, lda, k), ("B", b_len, k, ldb, n), ("C", c_len, m, ldc, n)] {
        let need = (rows - 1) * ld + row;
        if len < need {
            return Err(LabError::shape("gemm", format!("{name} has {len} elements, {rows} rows of leading dimension {ld} need {need}")));
        }
    }
    Ok(())
}

/// Each element's allowance: every variant (and cuBLAS) accumulates the K products in fp32 and
/// stores `dtype`.
pub fn bound(dtype: DType, k: usize) -> ProductBound {
    ProductBound::fp32_accumulation(k, dtype)
}

/// The variant [`matmul`] runs for `dtype` and shape `d` on `dev`: the fastest as measured on an
/// H100, falling down the ladder where a rung cannot take the device (sm_90a, shared memory) or
/// the shape (TMA row strides). CPU: cpu_blocked. fp32: warptiled (h100-gemm-ladder.md).
/// fp16/bf16: mma_splitk for decode shapes, M <= 16 (85-96% of cuBLAS, h100-gemm-splitk.md);
/// else, by how many 128x256 tiles C has against the SMs (h100-gemm-wgmma-n128.md):
/// wgmma_n64_deep up to a quarter of the SMs (M = 128 x 4096 x 4096, 1024^3), wgmma_n128_deep
/// below one per SM (512 x 4096 x 4096), wgmma_tma from there; without sm_90a, the widest
/// mma.sync ring that fits (h100-gemm-k64.md).
pub fn best(dev: &Backend, dtype: DType, d: Dims) -> &'static Variant<Config> {
    let named = |name| find(name).expect("the best gemm variants are in the table");
    let gpu = match dev {
        Backend::Cpu => return named("cpu_blocked"),
        Backend::Cuda(_) if dtype == DType::F32 => return named("warptiled"),
        Backend::Cuda(gpu) => gpu,
    };
    let (sms, optin) = (gpu.info.sm_count as usize, gpu.info.max_smem_per_block_optin as usize);
    let wide_tiles = d.m.div_ceil(128) * d.n.div_ceil(256);
    let first = if d.m <= 16 {
        "mma_splitk"
    } else if wide_tiles <= sms / 4 {
        "wgmma_n64_deep"
    } else if wide_tiles < sms {
        "wgmma_n128_deep"
    } else {
        "wgmma_tma"
    };
    [first, "mma_warp64_k64", "mma_warp64_wide", "mma_warp64"]
        .into_iter()
        .map(named)
        .find(|v| v.requires.met_by(dev) && refusal(v, d, optin).is_none())
        .unwrap_or_else(|| named("mma_ldmatrix"))
}

/// M, N and K of C = A B from the tensors' shapes, or an error naming the tensor that does not fit.
pub fn dims_of<T: Elem>(a: &Tensor<T>, b: &Tensor<T>, c: &Tensor<T>) -> Result<Dims> {
    let bad = |why: String| Err(LabError::shape("gemm", why));
    if a.shape().is_empty() {
        return bad("A is a scalar; it must be M x K".into());
    }
    if b.shape().len() != 2 {
        return bad(format!("B is {:?}; it must be K x N (two dimensions)", b.shape()));
    }
    let (m, k, n) = (a.rows(), a.cols(), b.cols());
    if b.rows() != k {
        return bad(format!("A is {:?} (M = {m}, K = {k}) but B is {:?}: B must be K x N = {k} x N", a.shape(), b.shape()));
    }
    let want: Vec<usize> = a.shape()[..a.shape().len() - 1].iter().copied().chain([n]).collect();
    if c.shape() != want {
        return bad(format!("C is {:?} but A B is {want:?} (M = {m}, N = {n}, K = {k})", c.shape()));
    }
    Ok(Dims::dense(m, n, k))
}

/// C = A B with the best variant for the backend, dtype and shape ([`best`]).
pub fn matmul<T: Elem>(dev: &Backend, a: &Tensor<T>, b: &Tensor<T>, c: &mut Tensor<T>) -> Result<()> {
    let d = dims_of(a, b, c)?;
    gemm(dev, best(dev, T::DTYPE, d).name, 1.0, a, b, 0.0, c)
}

/// C = A B with the named variant (any row of [`VARIANTS`]).
pub fn matmul_with<T: Elem>(dev: &Backend, variant: &str, a: &Tensor<T>, b: &Tensor<T>, c: &mut Tensor<T>) -> Result<()> {
    gemm(dev, variant, 1.0, a, b, 0.0, c)
}

/// C = alpha A B + beta C with the named variant. beta = 0 never reads C (a NaN there is
/// overwritten, as BLAS specifies). Shapes, dtype, placement and what the variant can take are
/// checked first, so a mismatch is an error, never an out-of-bounds access.
pub fn gemm<T: Elem>(dev: &Backend, variant: &str, alpha: f32, a: &Tensor<T>, b: &Tensor<T>, beta: f32, c: &mut Tensor<T>) -> Result<()> {
    let v = find(variant)?;
    variant::check_runs(FAMILY, v, dev, T::DTYPE)?;
    check_placement("gemm", dev, &[("A", a.placement()), ("B", b.placement()), ("C", c.placement())])?;
    let d = dims_of(a, b, c)?;
    validate(d, a.len(), b.len(), c.len())?;
    match dev {
        Backend::Cpu => {
            let (a, b) = (a.host().expect("placement checked"), b.host().expect("placement checked"));
            cpu_blocked(a, b, c.host_mut().expect("placement checked"), d, (alpha, beta));
            Ok(())
        }
        Backend::Cuda(gpu) => {
            if let Some(why) = refusal(v, d, gpu.info.max_smem_per_block_optin as usize) {
                return Err(LabError::shape("gemm", format!("`{variant}` cannot take M={} N={} K={}: {why}", d.m, d.n, d.k)));
            }
            let (a, b) = (a.cuda().expect("placement checked"), b.cuda().expect("placement checked"));
            launch::launch(gpu, v, d, (alpha, beta), a, b, c.cuda_mut().expect("placement checked"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_arguments_are_named() {
        let d = Dims::dense(2, 3, 4);
        assert!(validate(d, 8, 12, 6).is_ok());
        let err = |d: Dims, a: usize, b: usize, c: usize| validate(d, a, b, c).unwrap_err().to_string();
        assert!(err(Dims::dense(0, 3, 4), 0, 12, 0).contains("at least 1"));
        assert!(err(d, 7, 12, 6).contains("A has 7 elements"));
        assert!(err(d, 8, 11, 6).contains("B has 11 elements"));
        assert!(err(d, 8, 12, 5).contains("C has 5 elements"));
        assert!(err(Dims { lda: 3, ..d }, 8, 12, 6).contains("lda=3 is shorter than a row (K=4)"));
        assert!(err(Dims { ldc: 2, ..d }, 8, 12, 6).contains("ldc=2"));
        assert!(err(Dims::dense(1 << 31, 1, 1), 1 << 31, 1, 1 << 31).contains("below 2^31"));
        // A variant runs only in its own dtypes: that is said before anything else.
        let e = variant::check_runs(FAMILY, find("mma_pipelined").unwrap(), &Backend::Cpu, DType::F32).unwrap_err().to_string();
        assert!(e.contains("gemm variant `mma_pipelined` takes f16, bf16, not f32"), "{e}");
        // Padded leading dimensions are fine when the buffers hold them.
        assert!(validate(Dims { m: 2, n: 3, k: 4, lda: 5, ldb: 3, ldc: 7 }, 9, 12, 10).is_ok());
    }

    fn cpu_tensors(m: usize, n: usize, k: usize) -> (Tensor<f32>, Tensor<f32>, Tensor<f32>) {
        let f = |len: usize, s: usize| (0..len).map(|i| ((i * s) % 13) as f32 - 6.0).collect::<Vec<_>>();
        let a = Tensor::from_vec(&[m, k], f(m * k, 7)).unwrap();
        let b = Tensor::from_vec(&[k, n], f(k * n, 5)).unwrap();
        (a, b, Tensor::from_vec(&[m, n], f(m * n, 3)).unwrap())
    }

    #[test]
    fn the_callable_op_matches_the_reference_on_odd_shapes() {
        let dev = Backend::Cpu;
        for (m, n, k) in [(1, 1, 1), (1, 37, 29), (33, 47, 65), (97, 131, 77), (130, 3, 1000)] {
            let (a, b, mut c) = cpu_tensors(m, n, k);
            let (ah, bh, c0) = (a.to_vec().unwrap(), b.to_vec().unwrap(), c.to_vec().unwrap());
            let d = Dims::dense(m, n, k);
            matmul(&dev, &a, &b, &mut c).unwrap();
            let e = Expected::full(&ah, &bh, None, d, (1.0, 0.0)).check(&c.to_vec().unwrap(), d, bound(DType::F32, k));
            assert!(e.passed(), "{m}x{n}x{k}: {e:?}");
            let mut c = Tensor::from_vec(&[m, n], c0.clone()).unwrap();
            gemm(&dev, "cpu_blocked", 0.5, &a, &b, -1.25, &mut c).unwrap();
            let e = Expected::full(&ah, &bh, Some(&c0), d, (0.5, -1.25)).check(&c.to_vec().unwrap(), d, bound(DType::F32, k));
            assert!(e.passed(), "{m}x{n}x{k} with alpha and beta: {e:?}");
        }
        // A batch of rows: A [2, 3, 4] times B [4, 5] is C [2, 3, 5].
        let a = Tensor::from_vec(&[2, 3, 4], (0..24).map(|i| i as f32).collect()).unwrap();
        let b = Tensor::from_vec(&[4, 5], (0..20).map(|i| (i % 3) as f32).collect()).unwrap();
        let mut c = Tensor::<f32>::zeros(&dev, &[2, 3, 5]).unwrap();
        matmul_with(&dev, "cpu_blocked", &a, &b, &mut c).unwrap();
        let want = reference(&a.to_vec().unwrap(), &b.to_vec().unwrap(), None, Dims::dense(6, 5, 4), (1.0, 0.0));
        assert_eq!(c.to_vec().unwrap(), want.iter().map(|&x| x as f32).collect::<Vec<_>>());
        // bf16 through the same op.
        let h = |v: Vec<f32>| v.into_iter().map(half::bf16::from_f32).collect::<Vec<_>>();
        let a = Tensor::from_vec(&[3, 2], h(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])).unwrap();
        let b = Tensor::from_vec(&[2, 2], h(vec![1.0, 0.0, 0.0, 1.0])).unwrap();
        let mut c = Tensor::<half::bf16>::zeros(&dev, &[3, 2]).unwrap();
        matmul(&dev, &a, &b, &mut c).unwrap();
        assert_eq!(c.to_vec().unwrap(), a.to_vec().unwrap());
    }

    #[test]
    fn the_callable_op_names_bad_input() {
        let dev = Backend::Cpu;
        let (a, b, mut c) = cpu_tensors(3, 7, 5);
        let err = |r: Result<()>| r.unwrap_err().to_string();
        let (_, b_wrong, _) = cpu_tensors(3, 7, 4);
        let e = err(matmul(&dev, &a, &b_wrong, &mut c));
        assert!(e.contains("A is [3, 5] (M = 3, K = 5) but B is [4, 7]: B must be K x N = 5 x N"), "{e}");
        let mut c_wrong = Tensor::<f32>::zeros(&dev, &[3, 6]).unwrap();
        let e = err(matmul(&dev, &a, &b, &mut c_wrong));
        assert!(e.contains("C is [3, 6] but A B is [3, 7] (M = 3, N = 7, K = 5)"), "{e}");
        let b3 = b.to_vec().unwrap();
        let e = err(matmul(&dev, &a, &Tensor::from_vec(&[1, 5, 7], b3).unwrap(), &mut c));
        assert!(e.contains("B is [1, 5, 7]; it must be K x N"), "{e}");
        let (a0, b0, mut c0) = cpu_tensors(0, 7, 5);
        assert!(err(matmul(&dev, &a0, &b0, &mut c0)).contains("M=0 N=7 K=5: every dimension must be at least 1"));
        // A GPU rung on the CPU backend, a name not in the table, a dtype a rung does not take.
        let e = err(matmul_with(&dev, "warptiled", &a, &b, &mut c));
        assert!(e.contains("`warptiled` needs gpu, not the CPU backend"), "{e}");
        let e = err(matmul_with(&dev, "tiled_by_magic", &a, &b, &mut c));
        assert!(e.contains("`tiled_by_magic` is not a gemm variant (one of: naive, smem_tiled,"), "{e}");
        let h = Tensor::<half::f16>::zeros(&dev, &[2, 2]).unwrap();
        let mut hc = Tensor::<half::f16>::zeros(&dev, &[2, 2]).unwrap();
        let e = err(matmul_with(&dev, "mma_warp64", &h, &h, &mut hc));
        assert!(e.contains("`mma_warp64` needs gpu, not the CPU backend"), "{e}");
        let e = err(matmul_with(&dev, "wgmma_tma", &h, &h, &mut hc));
        assert!(e.contains("gemm variant `wgmma_tma` needs sm_90a, not the CPU backend"), "{e}");
        let e = err(matmul_with(&Backend::Cpu, "warptiled", &h, &h, &mut hc));
        assert!(e.contains("`warptiled` takes f32, not f16"), "{e}");
    }

    #[test]
    fn the_default_on_the_cpu_is_cpu_blocked_and_every_name_is_listed_once() {
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            assert_eq!(best(&Backend::Cpu, dtype, Dims::dense(7, 9, 11)).name, "cpu_blocked");
        }
        let names = variant::names(VARIANTS);
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
        assert_eq!(variants().len(), 20);
    }
}
