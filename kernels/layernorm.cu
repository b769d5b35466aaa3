// layernorm.cu: y = (x - mean) * rstd * gamma + beta per row, rstd =
// 1/sqrt(var + eps), var the biased (population) variance; fp32 statistics.
// x, y [rows, cols] row-major (row stride = cols); gamma, beta [cols], same
// dtype as x. Storage T in {float, bf16}, arithmetic fp32.
// Symbols: layernorm_<variant>_{f32,bf16}(const T* x, const T* gamma,
//          const T* beta, T* y, int rows, int cols, float eps).
// Bytes/elem below are DRAM traffic for x and y with s = sizeof(T) (gamma and
// beta are cols elements shared by all rows, L2 hits); the floor is 2s: at
// ~3.0 TB/s a 16384x4096 f32 layernorm (512 MiB moved) needs >= ~180 us.
// Every variant takes 16 B vector loads/stores when cols % V == 0 (V = 16/s:
// 4 f32, 8 bf16; with 256 B aligned bases every row is then 16 B aligned)
// and coalesced scalar ones otherwise.
//
//  1. two_pass_block   block (512,1,1), grid (rows,1,1).
//     One block per row: pass 1 sum -> mean (block reduction), pass 2
//     sum((x - mean)^2) -> var re-reading the row, pass 3 write: 3 reads +
//     1 write = 4s requested (the 2 re-reads may hit L2 for rows that fit).
//     Exact two-pass variance; per-thread serial sums over cols/512 elements.
//  2. welford_warp     block (256,1,1), grid (ceil(rows/8),1,1).
//     One warp per row (8 rows per block, shuffles only, no smem or
//     barriers). Each lane folds 16 B chunks (exact chunk mean and M2) into
//     its running (count, mean, M2) with Chan's merge (one division per
//     chunk; plain per-element Welford on the scalar path), then a lane-
//     ordered shuffle Welford merge; a write pass re-reads the row: 2 reads +
//     1 write = 3s. For short rows (a warp has few loads in flight).
//  3. onchip_block     block (t,1,1), t = min(1024, max(32, round_up(
//     ceil(cols/16), 32))), grid (rows,1,1); cols <= 16384 (= 16 x 1024).
//     Row held in registers (16 per thread, thread tid holds vectors or
//     scalars tid + k*t): mean by block reduction, then sum((x - mean)^2)
//     from registers (exact two-pass, no second HBM read), write: 1 read +
//     1 write = 2s, the floor. __launch_bounds__(1024, 2): <= 32 registers, so
//     two 1024-thread blocks (rows of 8K..16K) share an SM and overlap their
//     phases. When cols % V != 0 the write re-reads x (an L2 hit, DRAM stays
//     ~2s) instead of holding the 16 scalars through it, which spilled. (If
//     cols > 16*blockDim.x it falls back to variant 1's three passes with the
//     same block: correct, not fast.)
//
// Measured on H100 (CUDA events, median of 20; GB/s counts x read + y write;
// copy_ 2.97 TB/s f32, 2.90 bf16): onchip f32 2.96 / 2.94 / 2.89 TB/s at
// 16384x4096 / 8192x8192 / 4096x16384, bf16 2.85 / 2.84 / 2.81; torch
// F.layer_norm 1.98 / 1.87 / 1.82 (f32), 1.97 / 1.82 / 1.73 (bf16).
// two_pass_block f32 2.39 / 2.93 / 2.45; welford_warp f32 1.88 / 1.75 / 1.78.
// With __launch_bounds__(1024, 1) (48-64 registers) onchip bf16 fell to 2.19
// TB/s at 4096x16384: the two-blocks-per-SM bound matters there.
//
// Semantics: any rows >= 0, cols >= 1, eps >= 0 as given; NaN or inf in a row
// makes its mean or variance NaN/inf and propagates as the arithmetic gives.
// rstd is 1.0f / sqrtf(var + eps) (IEEE sqrt and division, not rsqrtf) in
// variants 1 and 2. Variant 3 holds the row across it, and the slow-path
// subroutine calls of '/' and sqrtf made it spill at 32 registers, so it uses
// common.cuh's rcp/div/rsqrt_nocall (the same MUFU approximations plus one
// Newton step: within 1 ulp of the IEEE results, no call).

#include "common.cuh"

// ---------------------------------------------------------------------------
// Shared building blocks: strided row passes, threads tid, tid+nt, ... of nt.
// ---------------------------------------------------------------------------

// Sum of x (SQ false) or of (x - mean)^2 (SQ true) over this thread's share.
template <typename T, bool SQ>
__device__ __forceinline__ float ln_partial(const T* __restrict__ xr, int cols, int tid, int nt, float mean) {
    constexpr int V = VecTraits<T>::N;
    float acc = 0.f;
    if (cols % V == 0) {
        const int nvec = cols / V;
        for (int i = tid; i < nvec; i += nt) {
            float v[V];
            load_vec16<T>(xr + (size_t)i * V, v);
            float s = 0.f;
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float d = SQ ? v[e] - mean : v[e];
                s += SQ ? d * d : d;
            }
            acc += s;
        }
    } else {
        for (int j = tid; j < cols; j += nt) {
            const float d = SQ ? to_float(xr[j]) - mean : to_float(xr[j]);
            acc += SQ ? d * d : d;
        }
    }
    return acc;
}

// y = (x - mean) * rstd * gamma + beta over this thread's share.
template <typename T>
__device__ __forceinline__ void ln_write(const T* __restrict__ xr, const T* __restrict__ g,
                                         const T* __restrict__ b, T* __restrict__ yr, int cols, int tid, int nt,
                                         float mean, float rstd) {
    constexpr int V = VecTraits<T>::N;
    if (cols % V == 0) {
        const int nvec = cols / V;
        for (int i = tid; i < nvec; i += nt) {
            float v[V], gv[V], bv[V];
            load_vec16<T>(xr + (size_t)i * V, v);
            load_vec16<T>(g + (size_t)i * V, gv);
            load_vec16<T>(b + (size_t)i * V, bv);
#pragma unroll
            for (int e = 0; e < V; ++e) v[e] = (v[e] - mean) * rstd * gv[e] + bv[e];
            store_vec16<T>(yr + (size_t)i * V, v);
        }
    } else {
        for (int j = tid; j < cols; j += nt)
            yr[j] = from_float<T>((to_float(xr[j]) - mean) * rstd * to_float(g[j]) + to_float(b[j]));
    }
}

// Three-pass layernorm of one row by the whole block (blockDim.x a multiple
// of 32). Variant 1, and the safety net of variant 3.
template <typename T>
__device__ __forceinline__ void ln_block_row(const T* __restrict__ xr, const T* __restrict__ g,
                                             const T* __restrict__ b, T* __restrict__ yr, int cols, float eps) {
    const int tid = threadIdx.x, nt = blockDim.x;
    const float mean = block_reduce_sum(ln_partial<T, false>(xr, cols, tid, nt, 0.f)) / (float)cols;
    const float var = block_reduce_sum(ln_partial<T, true>(xr, cols, tid, nt, mean)) / (float)cols;
    const float rstd = 1.0f / sqrtf(var + eps);
    ln_write<T>(xr, g, b, yr, cols, tid, nt, mean, rstd);
}

// ---------------------------------------------------------------------------
// 1. two_pass_block
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void two_pass_block(const T* __restrict__ x, const T* __restrict__ g,
                                               const T* __restrict__ b, T* __restrict__ y, int rows, int cols,
                                               float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;  // block-uniform, so no thread misses a barrier
    ln_block_row<T>(x + (size_t)row * cols, g, b, y + (size_t)row * cols, cols, eps);
}

// ---------------------------------------------------------------------------
// 2. welford_warp
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void welford_warp(const T* __restrict__ x, const T* __restrict__ g,
                                             const T* __restrict__ b, T* __restrict__ y, int rows, int cols,
                                             float eps) {
    constexpr int V = VecTraits<T>::N;
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // warp-uniform; only intra-warp shuffles follow
    const T* xr = x + (size_t)row * cols;
    T* yr = y + (size_t)row * cols;
    Welford st = welford_identity();
    if (cols % V == 0) {
        const int nvec = cols / V;
        for (int i = lane; i < nvec; i += 32) {
            float v[V];
            load_vec16<T>(xr + (size_t)i * V, v);
            // Exact statistics of the chunk (V is a power of two: 1/V exact).
            float s = 0.f;
#pragma unroll
            for (int e = 0; e < V; ++e) s += v[e];
            Welford c;
            c.n = (float)V;
            c.mean = s * (1.f / V);
            c.m2 = 0.f;
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float d = v[e] - c.mean;
                c.m2 += d * d;
            }
            st = welford_combine(st, c);
        }
    } else {
        for (int j = lane; j < cols; j += 32) {
            const float v = to_float(xr[j]);
            st.n += 1.f;
            const float d = v - st.mean;
            st.mean += d / st.n;
            st.m2 += d * (v - st.mean);
        }
    }
    st = warp_reduce_welford(st);
    const float var = st.m2 / (float)cols;
    const float rstd = 1.0f / sqrtf(var + eps);
    ln_write<T>(xr, g, b, yr, cols, lane, 32, st.mean, rstd);
}

// ---------------------------------------------------------------------------
// 3. onchip_block
// ---------------------------------------------------------------------------
// Units of W elements (one 16 B vector, or W = 1 when cols % V != 0): thread
// tid holds units tid + k*nt, k < ITEMS/W, so every load instruction is
// coalesced across the block. Slots past the row end hold 0 (nothing added to
// the sum) and are skipped for the squared deviations and the write.
// Scalar path (W = 1): the statistics come from registers as well, but the
// write re-reads x (an L2 hit: the block read the row microseconds earlier)
// through ln_write's loop; holding the 16 values through 16 unrolled scalar
// writes (48 address computations) spilled at the 32-register cap.
// ptxas sits at exactly 32 registers here: small edits (even reordering the
// rstd multiply) have made it spill; re-run ptxas -v after touching this.
template <typename T, int W>
__device__ __forceinline__ void ln_onchip_row(const T* __restrict__ xr, const T* __restrict__ g,
                                              const T* __restrict__ b, T* __restrict__ yr, int cols, float eps) {
    constexpr int ITEMS = 16;
    constexpr int NK = ITEMS / W;
    constexpr bool HOLD = W > 1;
    const int tid = threadIdx.x, nt = blockDim.x;
    const int nu = cols / W;
    const float cf = (float)cols, rc = rcp_nocall(cf);
    float v[ITEMS];
#pragma unroll
    for (int k = 0; k < NK; ++k) {
        const int u = tid + k * nt;
        if (u < nu) {
            load_w<T, W>(xr + (size_t)u * W, v + k * W);
        } else {
#pragma unroll
            for (int e = 0; e < W; ++e) v[k * W + e] = 0.f;
        }
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) s += v[k];
    const float mean = div_nocall(block_reduce_sum(s), cf, rc);
    // Slot validity (and below, the write's indices) from opaque copies of
    // tid: otherwise the compiler keeps the load pass's 16 indices / 64-bit
    // addresses alive across the reductions to reuse them, and spills.
    int tid1 = tid;
    asm volatile("" : "+r"(tid1));
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < NK; ++k) {
        const bool valid = tid1 + k * nt < nu;
#pragma unroll
        for (int e = 0; e < W; ++e) {
            // Held slots are shifted unconditionally (padding ones are never
            // written); only valid ones count.
            const float d = v[k * W + e] - mean;
            if (HOLD) v[k * W + e] = d;
            if (valid) q += d * d;
        }
    }
    const float var = div_nocall(block_reduce_sum(q), cf, rc);
    const float rstd = rsqrt_nocall(var + eps);
    if (!HOLD) {
        ln_write<T>(xr, g, b, yr, cols, tid, nt, mean, rstd);  // its scalar loop
        return;
    }
    int tid2 = tid;
    asm volatile("" : "+r"(tid2));
#pragma unroll
    for (int k = 0; k < NK; ++k) {
        const int u = tid2 + k * nt;
        if (u < nu) {
            float gv[W], bv[W];
            load_w<T, W>(g + (size_t)u * W, gv);
            load_w<T, W>(b + (size_t)u * W, bv);
#pragma unroll
            for (int e = 0; e < W; ++e) v[k * W + e] = v[k * W + e] * rstd * gv[e] + bv[e];
            store_w<T, W>(yr + (size_t)u * W, v + k * W);
        }
    }
}

template <typename T>
__device__ __forceinline__ void onchip_block(const T* __restrict__ x, const T* __restrict__ g,
                                             const T* __restrict__ b, T* __restrict__ y, int rows, int cols,
                                             float eps) {
    constexpr int V = VecTraits<T>::N;
    const int row = blockIdx.x;
    if (row >= rows) return;  // block-uniform
    const T* xr = x + (size_t)row * cols;
    T* yr = y + (size_t)row * cols;
    // Safety net (block-uniform): a launch too small to hold the row falls
    // back to the three-pass kernel instead of silently dropping elements.
    if (cols > 16 * (int)blockDim.x) {
        ln_block_row<T>(xr, g, b, yr, cols, eps);
    } else if (cols % V == 0) {
        ln_onchip_row<T, V>(xr, g, b, yr, cols, eps);
    } else {
        ln_onchip_row<T, 1>(xr, g, b, yr, cols, eps);
    }
}

// ---------------------------------------------------------------------------
// Exports: one extern "C" kernel per (variant, dtype).
// ---------------------------------------------------------------------------
#define LN_LB_256 __launch_bounds__(256)
#define LN_LB_512 __launch_bounds__(512)
#define LN_LB_1024_X2 __launch_bounds__(1024, 2)

#define LN_EXPORT(variant, ATTRS)                                                                           \
    extern "C" __global__ void ATTRS layernorm_##variant##_f32(                                             \
        const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,       \
        float* __restrict__ y, int rows, int cols, float eps) {                                             \
        variant<float>(x, gamma, beta, y, rows, cols, eps);                                                 \
    }                                                                                                       \
    extern "C" __global__ void ATTRS layernorm_##variant##_bf16(                                            \
        const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ gamma,                       \
        const __nv_bfloat16* __restrict__ beta, __nv_bfloat16* __restrict__ y, int rows, int cols,          \
        float eps) {                                                                                        \
        variant<__nv_bfloat16>(x, gamma, beta, y, rows, cols, eps);                                         \
    }

LN_EXPORT(two_pass_block, LN_LB_512)
LN_EXPORT(welford_warp, LN_LB_256)
LN_EXPORT(onchip_block, LN_LB_1024_X2)
