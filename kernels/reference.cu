// reference: f64 kernels that check the lab's kernels where the CPU reference would take minutes
// (a full 2100 x 2040 x 4072 product is 17 G multiply-adds). They are references, not rungs: the
// plainest code that is right, widened exactly to double, checked in turn against the CPU's f64
// reference at sampled entries (lab/src/ops/gemm/reference.rs).
#include "common.cuh"

// C = alpha A B + beta C0 in double, and each element's sum of absolute terms
// |alpha| sum_k |A[i,k] B[k,j]| + |beta C0[i,j]| (what its rounding error is bounded by).
// One thread per element, 16 x 16 tiles of A and B through shared memory; C0 may be null.
template <typename T>
__device__ void gemm_f64(const T* __restrict__ A, const T* __restrict__ B, const T* __restrict__ C0, double* value,
                         double* scale, int M, int N, int K, int lda, int ldb, int ldc, float alpha, float beta) {
    __shared__ double a[16][17], b[16][17];
    const int ty = threadIdx.y, tx = threadIdx.x;
    const int row = blockIdx.y * 16 + ty, col = blockIdx.x * 16 + tx;
    double dot = 0.0, sum_abs = 0.0;
    for (int k0 = 0; k0 < K; k0 += 16) {
        a[ty][tx] = (row < M && k0 + tx < K) ? (double)to_float(A[(unsigned long long)row * lda + k0 + tx]) : 0.0;
        b[ty][tx] = (k0 + ty < K && col < N) ? (double)to_float(B[(unsigned long long)(k0 + ty) * ldb + col]) : 0.0;
        __syncthreads();
        for (int kk = 0; kk < 16; ++kk) {
            const double p = a[ty][kk] * b[kk][tx];
            dot += p;
            sum_abs += fabs(p);
        }
        __syncthreads();
    }
    if (row >= M || col >= N) return;
    const double old = (C0 != nullptr && beta != 0.f) ? (double)beta * (double)to_float(C0[(unsigned long long)row * ldc + col]) : 0.0;
    value[(unsigned long long)row * N + col] = (double)alpha * dot + old;
    scale[(unsigned long long)row * N + col] = fabs((double)alpha) * sum_abs + fabs(old);
}

#define REFERENCE_GEMM(T, SUFFIX)                                                                               \
    extern "C" __global__ void __launch_bounds__(256) reference_gemm_##SUFFIX(                                 \
        const T* A, const T* B, const T* C0, double* value, double* scale, int M, int N, int K, int lda, int ldb, \
        int ldc, float alpha, float beta) {                                                                     \
        gemm_f64<T>(A, B, C0, value, scale, M, N, K, lda, ldb, ldc, alpha, beta);                              \
    }
REFERENCE_GEMM(float, f32)
REFERENCE_GEMM(__half, f16)
REFERENCE_GEMM(__nv_bfloat16, bf16)
