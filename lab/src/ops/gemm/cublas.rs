//! The peer: cuBLAS on the same tensors, in the same run, checked like the lab variants.

use super::Dims;
use crate::error::Doing;
use crate::experiment::Session;
use crate::gpu::Gpu;
use crate::kernels::DType;
use crate::ops::{measure_gpu_as, Check, Elem};
use crate::profile::Work;
use crate::tensor::Tensor;
use crate::Result;
use cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
use cudarc::cublas::sys::{cublasMath_t, cublasSetMathMode};
use cudarc::cublas::{CudaBlas, Gemm as BlasGemm, GemmConfig};
use cudarc::driver::CudaSlice;
use serde_json::{json, Value};

/// The cuBLAS peers of a dtype: (variant, math mode, what the record's `math` says). For f16 and
/// bf16 the default math lets cuBLAS keep split-K partial sums in the output type (what PyTorch
/// allows by default too), so it is checked with that allowance; the same call with reduced
/// precision reductions disallowed is checked with the lab variants' fp32-accumulation bound.
pub fn peers(dtype: DType) -> &'static [(&'static str, cublasMath_t, &'static str)] {
    use cublasMath_t::{CUBLAS_DEFAULT_MATH, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION};
    match dtype {
        DType::F32 => &[("cublas_sgemm", CUBLAS_DEFAULT_MATH, "sgemm, CUBLAS_DEFAULT_MATH (no TF32)")],
        _ => &[
            ("cublas_gemm_ex", CUBLAS_DEFAULT_MATH, "gemm_ex, CUBLAS_COMPUTE_32F, CUBLAS_DEFAULT_MATH: split-K partials may be kept in the output type"),
            (
                "cublas_gemm_ex_fp32_reduction",
                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
                "gemm_ex, CUBLAS_COMPUTE_32F, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION",
            ),
        ],
    }
}

/// cuBLAS's C = alpha A B + beta C (sgemm for f32, gemm_ex with fp32 compute for f16/bf16) as
/// records of provider `cublas`, one per [`peers`] entry; `checks` are the lab variants' bound and
/// that bound with output-type reductions allowed; `skipped` (the lab variants that could not
/// take the shape) goes into their `extra` as into the variants'.
#[allow(clippy::too_many_arguments)]
pub fn measure<T: Elem>(
    s: &mut Session,
    gpu: &Gpu,
    case: &Value,
    d: Dims,
    (alpha, beta): (f32, f32),
    (a, b, c0): (&Tensor<T>, &Tensor<T>, Option<&Tensor<T>>),
    c: &mut Tensor<T>,
    work: Work,
    (check, check_reduced): (&Check<T>, &Check<T>),
    timed: bool,
    skipped: serde_json::Map<String, Value>,
) -> Result<()>
where
    CudaBlas: BlasGemm<T>,
{
    let on_gpu = "gemm tensors are on the GPU";
    let (da, db, dc0) = (a.cuda().expect(on_gpu), b.cuda().expect(on_gpu), c0.map(|c| c.cuda().expect(on_gpu)));
    let (m, n, k) = (d.m as i32, d.n as i32, d.k as i32);
    // Row-major C = A B is column-major C^T = B^T A^T: pass B first, with the dimensions
    // swapped. fp32 stays fp32 (no TF32) under every math mode used here.
    let cfg = GemmConfig {
        transa: CUBLAS_OP_N,
        transb: CUBLAS_OP_N,
        m: n,
        n: m,
        k,
        alpha: T::from_f32(alpha),
        lda: d.ldb as i32,
        ldb: d.lda as i32,
        beta: T::from_f32(beta),
        ldc: d.ldc as i32,
    };
    for &(peer, mode, math) in peers(T::DTYPE) {
        if !s.wants(peer, "cublas") {
            continue;
        }
        let blas = CudaBlas::new(gpu.stream.clone()).doing("creating the cuBLAS handle")?;
        // SAFETY: a live handle of this stream; the mode is one of cuBLAS's own.
        unsafe { cublasSetMathMode(*blas.handle(), mode) }.result().doing("setting cuBLAS's math mode")?;
        let launch = |c: &mut CudaSlice<T>| -> Result<()> {
            // beta != 0 reads C: every launch starts from the same C0 (such cases are untimed).
            if let Some(c0) = dc0 {
                gpu.stream.memcpy_dtod(c0, c).doing("restoring C before the GEMM")?;
            }
            // SAFETY: the same buffers and dimensions the lab variants were validated for.
            unsafe { blas.gemm(cfg, db, da, c) }.doing("cuBLAS GEMM")
        };
        let mut extra = serde_json::Map::new();
        extra.insert("math".into(), json!(math));
        if !skipped.is_empty() {
            extra.insert("not_applicable".into(), Value::Object(skipped.clone()));
        }
        let check = if mode == cublasMath_t::CUBLAS_DEFAULT_MATH && T::DTYPE != DType::F32 { check_reduced } else { check };
        measure_gpu_as(s, gpu, case, (peer, "cublas"), work, check, timed, c.cuda_mut().expect(on_gpu), extra, launch)?;
    }
    Ok(())
}
