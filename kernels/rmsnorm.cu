// rmsnorm.cu: y = x * rstd * gamma per row, rstd = 1/sqrt(mean(x^2) + eps),
// fp32 statistics. x, y [rows, cols] row-major (row stride = cols); gamma
// [cols], same dtype as x. Storage T in {float, bf16}, arithmetic fp32.
// Symbols: rmsnorm_<variant>_{f32,bf16}(const T* x, const T* gamma, T* y,
//          int rows, int cols, float eps).
// Bytes/elem are DRAM traffic for x and y with s = sizeof(T) (gamma is cols
// elements shared by all rows, L2 hits); the floor is 2s. 16 B vector
// loads/stores when cols % V == 0 (V = 4 f32, 8 bf16), coalesced scalar
// ones otherwise.
//
//  1. block          block (512,1,1), grid (rows,1,1).
//     One block per row: pass 1 sum of squares (block reduction), pass 2
//     write re-reading the row: 2 reads + 1 write = 3s (the re-read may hit
//     L2 for rows that fit). Per-thread serial sums over cols/512 elements.
//  2. onchip_block   block (t,1,1), t = min(1024, max(32, round_up(
//     ceil(cols/16), 32))), grid (rows,1,1); cols <= 16384 (= 16 x 1024).
//     Row held in registers (16 per thread, thread tid holds vectors or
//     scalars tid + k*t; padding slots hold 0, which adds nothing to the sum
//     of squares): 1 read + 1 write = 2s, the floor. __launch_bounds__(1024,
//     2) as layernorm's onchip. (If cols > 16*blockDim.x it falls back to
//     variant 1's two passes with the same block: correct, not fast.)
//
// Measured on H100 (CUDA events, median of 20; GB/s counts x read + y write;
// copy_ 2.97 TB/s f32, 2.90 bf16) at 16384x4096 / 8192x8192 / 4096x16384:
// onchip f32 2.94 / 2.94 / 2.92 TB/s, bf16 2.86 / 2.87 / 2.85; block f32
// 2.90 / 2.64 / 2.11, bf16 2.74 / 2.82 / 2.66; torch F.rms_norm f32 2.00 /
// 1.95 / 1.90, bf16 1.97 / 1.91 / 1.79.
//
// Semantics: any rows >= 0, cols >= 1; NaN or inf in a row propagates as the
// arithmetic gives. rstd is 1.0f / sqrtf(ms + eps) (IEEE, not rsqrtf): here
// the held row fits in 32 registers across those calls, unlike layernorm's.

#include "common.cuh"

// Sum of x^2 over threads tid, tid+nt, ... of nt.
template <typename T>
__device__ __forceinline__ float rms_partial(const T* __restrict__ xr, int cols, int tid, int nt) {
    constexpr int V = VecTraits<T>::N;
    float acc = 0.f;
    if (cols % V == 0) {
        const int nvec = cols / V;
        for (int i = tid; i < nvec; i += nt) {
            float v[V];
            load_vec16<T>(xr + (size_t)i * V, v);
            float s = 0.f;
#pragma unroll
            for (int e = 0; e < V; ++e) s += v[e] * v[e];
            acc += s;
        }
    } else {
        for (int j = tid; j < cols; j += nt) {
            const float v = to_float(xr[j]);
            acc += v * v;
        }
    }
    return acc;
}

// Two-pass rmsnorm of one row by the whole block (blockDim.x a multiple of
// 32). Variant 1, and the safety net of variant 2.
template <typename T>
__device__ __forceinline__ void rms_block_row(const T* __restrict__ xr, const T* __restrict__ g,
                                              T* __restrict__ yr, int cols, float eps) {
    constexpr int V = VecTraits<T>::N;
    const int tid = threadIdx.x, nt = blockDim.x;
    const float ms = block_reduce_sum(rms_partial<T>(xr, cols, tid, nt)) / (float)cols;
    const float rstd = 1.0f / sqrtf(ms + eps);
    if (cols % V == 0) {
        const int nvec = cols / V;
        for (int i = tid; i < nvec; i += nt) {
            float v[V], gv[V];
            load_vec16<T>(xr + (size_t)i * V, v);
            load_vec16<T>(g + (size_t)i * V, gv);
#pragma unroll
            for (int e = 0; e < V; ++e) v[e] = v[e] * rstd * gv[e];
            store_vec16<T>(yr + (size_t)i * V, v);
        }
    } else {
        for (int j = tid; j < cols; j += nt) yr[j] = from_float<T>(to_float(xr[j]) * rstd * to_float(g[j]));
    }
}

// ---------------------------------------------------------------------------
// 1. block
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void block(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ y,
                                      int rows, int cols, float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;  // block-uniform, so no thread misses a barrier
    rms_block_row<T>(x + (size_t)row * cols, g, y + (size_t)row * cols, cols, eps);
}

// ---------------------------------------------------------------------------
// 2. onchip_block
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void onchip_block(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ y,
                                             int rows, int cols, float eps) {
    constexpr int ITEMS = 16;
    constexpr int V = VecTraits<T>::N;
    constexpr int NV = ITEMS / V;
    const int row = blockIdx.x;
    if (row >= rows) return;  // block-uniform
    const T* xr = x + (size_t)row * cols;
    T* yr = y + (size_t)row * cols;
    const int tid = threadIdx.x, nt = blockDim.x;
    if (cols > ITEMS * nt) {  // block-uniform safety net
        rms_block_row<T>(xr, g, yr, cols, eps);
        return;
    }
    const bool vec = cols % V == 0;
    const int nvec = cols / V;
    float v[ITEMS];
    if (vec) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = tid + k * nt;
            if (i < nvec) {
                load_vec16<T>(xr + (size_t)i * V, v + k * V);
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e) v[k * V + e] = 0.f;
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const int j = tid + k * nt;
            v[k] = j < cols ? to_float(xr[j]) : 0.f;
        }
    }
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) q += v[k] * v[k];
    const float ms = block_reduce_sum(q) / (float)cols;
    const float rstd = 1.0f / sqrtf(ms + eps);
    if (vec) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = tid + k * nt;
            if (i < nvec) {
                float gv[V];
                load_vec16<T>(g + (size_t)i * V, gv);
#pragma unroll
                for (int e = 0; e < V; ++e) v[k * V + e] = v[k * V + e] * rstd * gv[e];
                store_vec16<T>(yr + (size_t)i * V, v + k * V);
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const int j = tid + k * nt;
            if (j < cols) yr[j] = from_float<T>(v[k] * rstd * to_float(g[j]));
        }
    }
}

// ---------------------------------------------------------------------------
// Exports: one extern "C" kernel per (variant, dtype).
// ---------------------------------------------------------------------------
#define RMS_LB_512 __launch_bounds__(512)
#define RMS_LB_1024_X2 __launch_bounds__(1024, 2)

#define RMS_EXPORT(variant, ATTRS)                                                                          \
    extern "C" __global__ void ATTRS rmsnorm_##variant##_f32(const float* __restrict__ x,                   \
                                                             const float* __restrict__ gamma,               \
                                                             float* __restrict__ y, int rows, int cols,     \
                                                             float eps) {                                   \
        variant<float>(x, gamma, y, rows, cols, eps);                                                       \
    }                                                                                                       \
    extern "C" __global__ void ATTRS rmsnorm_##variant##_bf16(const __nv_bfloat16* __restrict__ x,          \
                                                              const __nv_bfloat16* __restrict__ gamma,      \
                                                              __nv_bfloat16* __restrict__ y, int rows,      \
                                                              int cols, float eps) {                        \
        variant<__nv_bfloat16>(x, gamma, y, rows, cols, eps);                                               \
    }

RMS_EXPORT(block, RMS_LB_512)
RMS_EXPORT(onchip_block, RMS_LB_1024_X2)

// ---------------------------------------------------------------------------
// Backward (f32; ops::rmsnorm::backward). With r = rstd and dot = sum_j
// gamma_j dy_j x_j: dx = r gamma dy - x r^3 dot / cols. `drop_mean` leaves
// the second term out: the fault the checks must catch, never set otherwise.
// part[row, j] = dy x r, summed over rows by rmsnorm_column_sum into dgamma.
//  rmsnorm_backward_f32     block (a multiple of 32, <= 1024), grid (rows).
//  rmsnorm_column_sum_f32   block (32, 32), grid (ceil(cols / 32)): thread
//      (tx, ty) sums rows ty, ty + 32, ... of column 32 b + tx in order, then
//      the 32 partials are summed in ty order: no atomics, so the result is
//      the same on every run.
// ---------------------------------------------------------------------------
extern "C" __global__ void rmsnorm_backward_f32(const float* __restrict__ x, const float* __restrict__ gamma,
                                                const float* __restrict__ dy, float* __restrict__ dx,
                                                float* __restrict__ part, int cols, float eps, int drop_mean) {
    const long long off = (long long)blockIdx.x * cols;
    const float *xr = x + off, *dyr = dy + off;
    float ss = 0.f, dot = 0.f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        ss += xr[j] * xr[j];
        dot += gamma[j] * dyr[j] * xr[j];
    }
    ss = block_reduce_sum(ss);
    dot = block_reduce_sum(dot);
    const float r = 1.0f / sqrtf(ss / (float)cols + eps);
    const float mean = drop_mean ? 0.f : r * r * r * dot / (float)cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        dx[off + j] = r * gamma[j] * dyr[j] - xr[j] * mean;
        part[off + j] = dyr[j] * xr[j] * r;
    }
}

extern "C" __global__ void __launch_bounds__(1024) rmsnorm_column_sum_f32(const float* __restrict__ part,
                                                                          float* __restrict__ out, int rows, int cols) {
    __shared__ float acc[32][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (col < cols)
        for (int r = threadIdx.y; r < rows; r += 32) s += part[(long long)r * cols + col];
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float t = 0.f;
        for (int k = 0; k < 32; ++k) t += acc[k][threadIdx.x];
        out[col] = t;
    }
}
