// bias_gelu.cu: y = GeLU(x + b), x and y [rows, cols] row-major contiguous,
// b [cols] broadcast over rows. Storage T in {float, __half, bf16}, arithmetic
// fp32. Two GeLU forms:
//   tanh: 0.5 v (1 + tanhf(0.7978845608 (v + 0.044715 v^3)))
//   erf:  0.5 v (1 + erff(v 0.70710678))
// tanhf / erff are the accurate libdevice versions (no fast-math intrinsics).
// Symbols, dt in {f32, f16, bf16}:
//   bias_gelu_unfused_add_<dt>(const T* x, const T* b, T* tmp, long long rows, int cols)
//   bias_gelu_unfused_gelu_{tanh,erf}_<dt>(const T* tmp, T* y, long long n)
//   bias_gelu_fused_{tanh,erf,tanh_sigmoid}_<dt>(const T* x, const T* b, T* y, long long rows, int cols)
// DRAM traffic per element with s = sizeof(T) (b is cols elements, read from
// L1/L2, negligible): the floor is 2s. At ~2.97 TB/s of H100 copy bandwidth a
// 16384x8192 f32 tensor (1 GiB moved at 2s) needs >= ~361 us.
//
//  1. unfused (two kernels)  tmp = T(x + b), then y = gelu(tmp): 2s + 2s = 4s,
//     the round trip of tmp through HBM that an eager framework pays (tmp is
//     also rounded to T in between, as there). Both kernels use the same
//     vectorised loop as variant 2, so the difference is the round trip only.
//  2. fused_{tanh,erf}       one kernel, 2s: the floor.
//  3. fused_tanh_sigmoid     the tanh form as v / (1 + e^(-2u)) with the hardware exponential:
//                            the same bytes, a third of the instructions (below), so the 16-bit
//                            kernels are no longer capped by arithmetic.
//
// Launch (all 5 kernels per dtype): block (256,1,1), grid (min(sm_count*8,
// ceil(n/(256*V))),1,1), n = rows*cols, V = 16/s (4 f32, 8 f16/bf16). Every
// kernel is a grid-stride loop, so any grid >= 1 is correct; the grid above
// is one full wave at the 8 blocks/SM that __launch_bounds__(256, 8) (<= 32
// registers) allows, so no block waits for a second wave.
// Loop: 16 B vectors (V elements) when the bias pattern is vector-aligned,
// i.e. cols % V == 0 for the bias kernels (the gelu-only kernel always
// vectorises; its last n % V elements are done by the first threads);
// otherwise the same loop over single elements. Each thread loads BG_UNROLL
// (2) vectors of x (and 2 of b, L1/L2 hits) before it stores any: 32 B of x
// in flight per thread, 64 KiB per SM at 2048 threads, past the ~20 KiB/SM
// that Little's law asks at 3 TB/s x ~0.8 us. (4 spilled at the 32-register
// cap; 1, 2 and 3 measured the same on H100.)
// Bias column: one 64-bit modulo per thread at start; after that the column
// advances by (grid stride % cols) with one add and compare-subtract per
// vector. Needs 16 B aligned x, b, y / tmp (allocations are 256 B aligned).
//
// Measured on H100 (CUDA events, median of 20; GB/s counts x read + y write):
// 16384x8192 fused f32 2.77 / 2.73 TB/s (tanh / erf), 93% / 92% of copy_
// (2.97); f16 and bf16 2.48 / 2.53 TB/s, 84-85%: with 8 elements per 16 B
// the ~28 instructions per element (accurate tanhf / erff are ~16 of them)
// cap the 16-bit kernels near 620 G elements/s (4096x4096 16-bit: 92-93% of
// its copy_). Loading the next trip's vector into registers before the math
// did not help, an L2 prefetch of it hurt. Unfused: ~1.31-1.39 TB/s in the
// same units; torch eager gelu(x + b): 1.35 (f32), 1.03 (bf16) TB/s.
//
// Semantics: NaN / inf propagate as the fp32 arithmetic gives: +inf -> +inf,
// -inf -> (-inf) * 0 = NaN (both forms, as the f64 formula), NaN -> NaN.
// n >= 1, any cols >= 1. For v below about -5 the factor (1 + tanh) or
// (1 + erf) cancels in fp32, so y (a tiny negative number or -0) has small
// absolute (~1e-7 |v|) but large relative error against f64: compare with an
// absolute tolerance there.

#include "common.cuh"

#ifndef BG_UNROLL
#define BG_UNROLL 2
#endif

#define BG_ACT_NONE 0
#define BG_ACT_TANH 1
#define BG_ACT_ERF 2
#define BG_ACT_TANH_SIGMOID 3

// The tanh form rewritten without tanh: 0.5 v (1 + tanh(u)) = v / (1 + e^(-2u)), exactly. With
// the hardware exponential (ex2.approx, ~2 ulp) and one reciprocal it is ~10 instructions instead
// of ~28, and it never cancels: for v << 0 it divides by a large number rather than adding
// 1 + tanh -> 0. Error: e^(-2u) carries |2u| 2^-24 relative (the scaling of its argument), at most
// ~5e-6 where it matters (|2u| <= 88), inside the f32 tolerance; beyond, y underflows to -0.
__device__ __forceinline__ float gelu_tanh_sigmoid(float v) {
    const float u = v * fmaf(v * v, GELU_C * GELU_A, GELU_C);
    return __fdividef(v, 1.f + __expf(-2.f * u));
}

template <int ACT>
__device__ __forceinline__ float bg_act(float v) {
    if (ACT == BG_ACT_TANH) {
        return gelu_tanh(v);
    } else if (ACT == BG_ACT_ERF) {
        return gelu_erf(v);
    } else if (ACT == BG_ACT_TANH_SIGMOID) {
        return gelu_tanh_sigmoid(v);
    } else {
        return v;
    }
}

// Column advance modulo cu (c < cu and step < cu, so one subtract suffices).
__device__ __forceinline__ int bg_next_col(int c, int step, int cu) {
    c += step;
    return c >= cu ? c - cu : c;
}

// Grid-stride loop over nu units of W elements: y[u] = act(x[u] (+ b[u % cu])).
// cu = cols / W (bias kernels only).
template <typename T, int W, bool BIAS, int ACT>
__device__ __forceinline__ void bg_loop(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y,
                                        long long nu, int cu) {
    constexpr int U = BG_UNROLL;
    const long long S = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int c = 0, step = 0;
    if (BIAS) {
        c = (int)(i % cu);
        step = (int)(S % cu);
    }
    for (; i + (U - 1) * S < nu; i += U * S) {
        float v[U][W];
#pragma unroll
        for (int u = 0; u < U; ++u) load_w<T, W>(x + (size_t)(i + u * S) * W, v[u]);
        if (BIAS) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float bb[W];
                load_w<T, W>(b + (size_t)c * W, bb);
#pragma unroll
                for (int e = 0; e < W; ++e) v[u][e] += bb[e];
                c = bg_next_col(c, step, cu);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int e = 0; e < W; ++e) v[u][e] = bg_act<ACT>(v[u][e]);
            store_w<T, W>(y + (size_t)(i + u * S) * W, v[u]);
        }
    }
    for (; i < nu; i += S) {
        float v[W];
        load_w<T, W>(x + (size_t)i * W, v);
        if (BIAS) {
            float bb[W];
            load_w<T, W>(b + (size_t)c * W, bb);
#pragma unroll
            for (int e = 0; e < W; ++e) v[e] += bb[e];
            c = bg_next_col(c, step, cu);
        }
#pragma unroll
        for (int e = 0; e < W; ++e) v[e] = bg_act<ACT>(v[e]);
        store_w<T, W>(y + (size_t)i * W, v);
    }
}

// x + b (ACT none: the unfused first kernel) or act(x + b) (fused).
template <typename T, int ACT>
__device__ __forceinline__ void bias_act(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y,
                                         long long rows, int cols) {
    constexpr int V = VecTraits<T>::N;
    const long long n = rows * (long long)cols;
    if (cols % V == 0) {
        bg_loop<T, V, true, ACT>(x, b, y, n / V, cols / V);
    } else {
        bg_loop<T, 1, true, ACT>(x, b, y, n, cols);
    }
}

// act(x) over n elements (the unfused second kernel).
template <typename T, int ACT>
__device__ __forceinline__ void act_only(const T* __restrict__ x, T* __restrict__ y, long long n) {
    constexpr int V = VecTraits<T>::N;
    const long long nv = n / V;
    bg_loop<T, V, false, ACT>(x, nullptr, y, nv, 1);
    // The last n % V elements, by the first threads of the grid.
    const long long t = nv * V + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) y[t] = from_float<T>(bg_act<ACT>(to_float(x[t])));
}

// ---------------------------------------------------------------------------
// Exports.
// ---------------------------------------------------------------------------
#define BG_LB __launch_bounds__(256, 8)

#define BG_EXPORT_DT(T, dt)                                                                                   \
    extern "C" __global__ void BG_LB bias_gelu_unfused_add_##dt(const T* __restrict__ x, const T* __restrict__ b, \
                                                                T* __restrict__ tmp, long long rows, int cols) { \
        bias_act<T, BG_ACT_NONE>(x, b, tmp, rows, cols);                                                      \
    }                                                                                                         \
    extern "C" __global__ void BG_LB bias_gelu_unfused_gelu_tanh_##dt(const T* __restrict__ tmp,               \
                                                                      T* __restrict__ y, long long n) {       \
        act_only<T, BG_ACT_TANH>(tmp, y, n);                                                                  \
    }                                                                                                         \
    extern "C" __global__ void BG_LB bias_gelu_unfused_gelu_erf_##dt(const T* __restrict__ tmp,                \
                                                                     T* __restrict__ y, long long n) {        \
        act_only<T, BG_ACT_ERF>(tmp, y, n);                                                                   \
    }                                                                                                         \
    extern "C" __global__ void BG_LB bias_gelu_fused_tanh_##dt(const T* __restrict__ x, const T* __restrict__ b, \
                                                               T* __restrict__ y, long long rows, int cols) {  \
        bias_act<T, BG_ACT_TANH>(x, b, y, rows, cols);                                                        \
    }                                                                                                         \
    extern "C" __global__ void BG_LB bias_gelu_fused_erf_##dt(const T* __restrict__ x, const T* __restrict__ b, \
                                                              T* __restrict__ y, long long rows, int cols) {   \
        bias_act<T, BG_ACT_ERF>(x, b, y, rows, cols);                                                         \
    }                                                                                                         \
    extern "C" __global__ void BG_LB bias_gelu_fused_tanh_sigmoid_##dt(const T* __restrict__ x,                \
                                                                       const T* __restrict__ b,                \
                                                                       T* __restrict__ y, long long rows, int cols) { \
        bias_act<T, BG_ACT_TANH_SIGMOID>(x, b, y, rows, cols);                                                \
    }

BG_EXPORT_DT(float, f32)
BG_EXPORT_DT(__half, f16)
BG_EXPORT_DT(__nv_bfloat16, bf16)
