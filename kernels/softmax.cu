// softmax.cu: row-wise softmax ladder, y = exp(x - max) / sum(exp(x - max)).
// Row-major, row stride = cols; storage T in {float, bf16}, arithmetic fp32.
// Symbols: softmax_<variant>_{f32,bf16}(const T* x, T* y, int rows, int cols).
// Bytes/elem below are DRAM traffic with s = sizeof(T) (4 f32, 2 bf16); the
// floor is 2s (read once, write once): at 3.35 TB/s a 4096x4096 f32 softmax
// (128 MiB moved) needs >= ~40 us.
//
//  1. naive_thread_per_row   block (256,1,1), grid (ceil(rows/256),1,1).
//     One thread per row, 3 passes (max, sum, write): 3 reads + 1 write = 4s
//     requested, and uncoalesced (a warp load touches 32 rows = 32 sectors for
//     32 useful elements); the llm.c kernel1 baseline.
//  2. block_three_pass       block (256,1,1), grid (rows,1,1).
//     One block per row, coalesced scalar loads, block reductions; still
//     3 reads + 1 write = 4s (the 2 re-reads may hit L2 for rows that fit).
//  3. online_warp_per_row    block (256,1,1), grid (ceil(rows/8),1,1).
//     One warp per row (8 rows/block, shuffles only, no smem or barriers);
//     online (max,sum) fuses passes 1+2: 2 reads + 1 write = 3s; 16 B vector
//     loads when cols % (16/s) == 0. For short rows.
//  4. online_block_per_row   block (512,1,1), grid (rows,1,1).
//     Same 3s traffic with 512 threads per row and 16 B vector loads, so long
//     rows get enough loads in flight; MaxSum block reduction.
//  5. onchip_block_per_row   block (t,1,1), t = min(1024, max(32, round_up(
//     ceil(cols/16), 32))), grid (rows,1,1); cols <= 16384.
//     Row held in registers (16/thread): 1 read + 1 write = 2s, the floor;
//     exp computed once per element and reused for the write. (If cols >
//     16*blockDim.x it falls back to variant 4's two passes, not a fast path.)
//  6. cluster_per_row        block (1024,1,1), grid (rows*8,1,1), compile-time
//     cluster (8,1,1), sm_90 only; 16385 <= cols <= 262144.
//     A cluster of 8 blocks splits the row; each block keeps its chunk in
//     registers (32/thread) and pushes its (max,sum) to the 7 others through
//     distributed shared memory: 2s per element plus 8 x 8 x 8 B of DSMEM
//     stores per row. One 1024-thread block fills an SM (64 regs/thread), so
//     load, reduce, exchange and store do not overlap across blocks: measured
//     on H100 it beats variant 4 only for the longest rows (~2.2 TB/s f32 at
//     262144 wide), and loses below ~131072. (Rows over 8*1024*32 fall back
//     to variant 4's two passes in block rank 0 alone: correct, not fast.)
//
// Shared semantics (all variants, same as the CPU reference): exp(-inf) = 0;
// a row of all -inf writes zeros; NaN or +inf anywhere makes the row NaN
// (NaN-propagating max, no special case); any rows >= 0, cols >= 1.
// expf (not __expf) keeps ~2 ulp accuracy; the kernels stay memory-bound.

#include "common.cuh"
// Cluster primitives come from the sm_90 intrinsics NVRTC provides built in
// (__cluster_barrier_arrive/wait, __cluster_map_shared_rank), not from
// cooperative_groups.h: in CUDA 13 that header includes <nv/target> from CCCL,
// which is not on the NVRTC include path (only the CUDA include dir is).

// ---------------------------------------------------------------------------
// Shared building blocks.
// ---------------------------------------------------------------------------

// Thread-local online (max,sum) over a row, threads tid, tid+nt, ... of nt.
// Vector path only when each 16 B vector lies inside the row (cols % V == 0,
// which with a 256 B aligned base makes every row start 16 B aligned).
template <typename T>
__device__ __forceinline__ MaxSum online_stats_strided(const T* __restrict__ xr, int cols, int tid, int nt) {
    constexpr int V = VecTraits<T>::N;
    MaxSum st = maxsum_identity();
    if (cols % V == 0) {
        const int nvec = cols / V;
        for (int i = tid; i < nvec; i += nt) {
            float v[V];
            load_vec16<T>(xr + (size_t)i * V, v);
            online_update<V>(st, v);
        }
    } else {
        // Scalar tail-safe path: 4 strided (still coalesced) loads per rescale.
        for (int base = 0; base < cols; base += 4 * nt) {
            float v[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int j = base + k * nt + tid;
                v[k] = j < cols ? to_float(xr[j]) : NEG_INF;
            }
            online_update<4>(st, v);
        }
    }
    return st;
}

// y = exp(x - shift) * inv over a row, same thread mapping as above.
template <typename T>
__device__ __forceinline__ void write_strided(const T* __restrict__ xr, T* __restrict__ yr, int cols, int tid,
                                              int nt, float shift, float inv) {
    constexpr int V = VecTraits<T>::N;
    if (cols % V == 0) {
        const int nvec = cols / V;
        for (int i = tid; i < nvec; i += nt) {
            float v[V];
            load_vec16<T>(xr + (size_t)i * V, v);
#pragma unroll
            for (int e = 0; e < V; ++e) v[e] = expf(v[e] - shift) * inv;
            store_vec16<T>(yr + (size_t)i * V, v);
        }
    } else {
        for (int j = tid; j < cols; j += nt) yr[j] = from_float<T>(expf(to_float(xr[j]) - shift) * inv);
    }
}

// Two-pass online softmax of one row by the whole block (any blockDim.x that
// is a multiple of 32). Variant 4, and the safety net of variants 5 and 6.
template <typename T>
__device__ __forceinline__ void online_block_row(const T* __restrict__ xr, T* __restrict__ yr, int cols) {
    MaxSum st = online_stats_strided<T>(xr, cols, threadIdx.x, blockDim.x);
    st = block_reduce_maxsum(st);
    write_strided<T>(xr, yr, cols, threadIdx.x, blockDim.x, safe_shift(st.m), safe_inv_sum(st.m, st.d));
}

// ---------------------------------------------------------------------------
// 1. naive_thread_per_row
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void naive_thread_per_row(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;  // no barriers or shuffles in this kernel
    const T* xr = x + (size_t)row * cols;
    T* yr = y + (size_t)row * cols;
    float m = NEG_INF;
    for (int j = 0; j < cols; ++j) m = fmax_nan(m, to_float(xr[j]));
    const float s = safe_shift(m);
    float d = 0.f;
    for (int j = 0; j < cols; ++j) d += expf(to_float(xr[j]) - s);
    const float inv = safe_inv_sum(m, d);
    for (int j = 0; j < cols; ++j) yr[j] = from_float<T>(expf(to_float(xr[j]) - s) * inv);
}

// ---------------------------------------------------------------------------
// 2. block_three_pass
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void block_three_pass(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    const int row = blockIdx.x;
    if (row >= rows) return;  // block-uniform, so no thread misses a barrier
    const T* xr = x + (size_t)row * cols;
    T* yr = y + (size_t)row * cols;
    const int tid = threadIdx.x, nt = blockDim.x;
    float m = NEG_INF;
    for (int j = tid; j < cols; j += nt) m = fmax_nan(m, to_float(xr[j]));
    m = block_reduce_max(m);
    const float s = safe_shift(m);
    float d = 0.f;
    for (int j = tid; j < cols; j += nt) d += expf(to_float(xr[j]) - s);
    d = block_reduce_sum(d);
    const float inv = safe_inv_sum(m, d);
    for (int j = tid; j < cols; j += nt) yr[j] = from_float<T>(expf(to_float(xr[j]) - s) * inv);
}

// ---------------------------------------------------------------------------
// 3. online_warp_per_row
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void online_warp_per_row(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // warp-uniform; only intra-warp shuffles follow
    const T* xr = x + (size_t)row * cols;
    T* yr = y + (size_t)row * cols;
    MaxSum st = online_stats_strided<T>(xr, cols, lane, 32);
    st = warp_reduce_maxsum(st);
    write_strided<T>(xr, yr, cols, lane, 32, safe_shift(st.m), safe_inv_sum(st.m, st.d));
}

// ---------------------------------------------------------------------------
// 4. online_block_per_row
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void online_block_per_row(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    const int row = blockIdx.x;
    if (row >= rows) return;  // block-uniform
    online_block_row<T>(x + (size_t)row * cols, y + (size_t)row * cols, cols);
}

// ---------------------------------------------------------------------------
// 5. onchip_block_per_row
// ---------------------------------------------------------------------------
// Thread tid holds vectors tid + k*nt (k < ITEMS/V), or scalars tid + k*nt
// (k < ITEMS): every load instruction is coalesced across the block. Slots
// past the row end hold -inf, i.e. contribute nothing.
template <typename T>
__device__ __forceinline__ void onchip_block_per_row(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    constexpr int ITEMS = 16;
    constexpr int V = VecTraits<T>::N;
    constexpr int NV = ITEMS / V;
    const int row = blockIdx.x;
    if (row >= rows) return;  // block-uniform
    const T* xr = x + (size_t)row * cols;
    T* yr = y + (size_t)row * cols;
    const int tid = threadIdx.x, nt = blockDim.x;
    // Safety net (block-uniform): a launch too small to hold the row falls
    // back to the two-pass kernel instead of silently dropping elements.
    if (cols > ITEMS * nt) {
        online_block_row<T>(xr, yr, cols);
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
                for (int e = 0; e < V; ++e) v[k * V + e] = NEG_INF;
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const int j = tid + k * nt;
            v[k] = j < cols ? to_float(xr[j]) : NEG_INF;
        }
    }
    float m = NEG_INF;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) m = fmax_nan(m, v[k]);
    m = block_reduce_max(m);
    const float s = safe_shift(m);
    float d = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        v[k] = expf(v[k] - s);  // reused by the write: one exp per element
        d += v[k];
    }
    d = block_reduce_sum(d);
    const float inv = safe_inv_sum(m, d);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) v[k] *= inv;
    if (vec) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = tid + k * nt;
            if (i < nvec) store_vec16<T>(yr + (size_t)i * V, v + k * V);
        }
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const int j = tid + k * nt;
            if (j < cols) yr[j] = from_float<T>(v[k]);
        }
    }
}

// ---------------------------------------------------------------------------
// 6. cluster_per_row (sm_90)
// ---------------------------------------------------------------------------
#define SOFTMAX_CLUSTER 8


// Block rank r of the cluster owns the contiguous chunk [r*per, min(cols,
// (r+1)*per)), per = ceil(cols/8) (in 16 B vectors when vectorising, so the
// chunk boundaries are vector-aligned). Inside the chunk thread tid holds
// items tid + k*nt as in variant 5. The block reduces its max, keeps
// e = exp(x - block max) in registers and reduces their sum; the 8 block
// partials are exchanged through distributed shared memory, and the row's
// (M, D) gives one factor exp(block max - M) / D per block, so exp is
// computed once per element.
template <typename T>
__device__ __forceinline__ void cluster_per_row(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int C = SOFTMAX_CLUSTER;
    constexpr int ITEMS = 32;
    constexpr int V = VecTraits<T>::N;
    constexpr int NV = ITEMS / V;
    // slots[r] = (max, sum) of block rank r, pushed here by that block.
    __shared__ MaxSum slots[C];

    const int rank = (int)__clusterRelativeBlockRank();
    // The 1-D cluster (8,1,1) is blocks 8r .. 8r+7, so row is cluster-uniform
    // and this return (before any cluster barrier) takes the whole cluster.
    const long long row = blockIdx.x / C;
    if (row >= rows) return;
    const T* xr = x + (size_t)row * cols;
    T* yr = y + (size_t)row * cols;
    const int tid = threadIdx.x, nt = blockDim.x;

    // Safety net (cluster-uniform): a row longer than 8*nt*32 is done by block
    // rank 0 with the two-pass kernel; no block touches DSMEM on this path.
    if (cols > C * ITEMS * nt) {
        if (rank == 0) online_block_row<T>(xr, yr, cols);
        return;
    }

    // Announce "this block is running" (nothing to publish yet, so relaxed);
    // the matching wait comes after the loads, so the barrier latency hides
    // behind them. No block may touch another's shared memory before it.
    __cluster_barrier_arrive_relaxed();

    const bool vec = cols % V == 0;
    int lo, hi;  // chunk bounds: in vectors if vec, else in elements
    if (vec) {
        const int nvec = cols / V;
        const int per = (nvec + C - 1) / C;
        lo = min(nvec, rank * per);
        hi = min(nvec, lo + per);
    } else {
        const int per = (cols + C - 1) / C;
        lo = min(cols, rank * per);
        hi = min(cols, lo + per);
    }

    float v[ITEMS];
    if (vec) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = lo + tid + k * nt;
            if (i < hi) {
                load_vec16<T>(xr + (size_t)i * V, v + k * V);
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e) v[k * V + e] = NEG_INF;
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const int j = lo + tid + k * nt;
            v[k] = j < hi ? to_float(xr[j]) : NEG_INF;
        }
    }

    // Block statistics from registers (cheap fmax / add reductions); the
    // registers then hold exp(x - block max), one exp per element.
    float bm = NEG_INF;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) bm = fmax_nan(bm, v[k]);
    bm = block_reduce_max(bm);
    const float bs = safe_shift(bm);
    float bd = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        // Skip exp for slots past the chunk end (they hold -inf, i.e. 0): for
        // shorter rows most slots are empty, and the branch is warp-uniform
        // except in the one warp that straddles the end.
        const int idx = lo + tid + (vec ? k / V : k) * nt;
        if (idx < hi) {
            v[k] = expf(v[k] - bs);
            bd += v[k];
        } else {
            v[k] = 0.f;
        }
    }
    bd = block_reduce_sum(bd);

    // All 8 blocks are running: push this block's partial into slot `rank` of
    // every block of the cluster (lanes 0..7 of warp 0, one remote store each).
    __cluster_barrier_wait();
    if (tid < C) {
        MaxSum p;
        p.m = bm;
        p.d = bd;
        *static_cast<MaxSum*>(__cluster_map_shared_rank(&slots[rank], (unsigned)tid)) = p;
    }
    // Second cluster barrier, i.e. cluster.sync(): arrive (release) + wait
    // (acquire), so afterwards every block holds all 8 partials locally.
    // Pushing (not pulling through DSMEM) means no block touches another's
    // shared memory after this point, so none has to wait for the others
    // before exiting: two cluster barriers instead of three, and the first
    // one's latency hides behind the loads. (Tried on H100: a relaxed arrive
    // as the exit guard of a DSMEM pull faulted, as a relaxed arrive does not
    // order the reads before it; a build that also mixed release and relaxed
    // arrives within one warp hung.)
    __cluster_barrier_arrive();
    __cluster_barrier_wait();

    // Every group of 8 lanes combines the 8 local slots (lane & 7) with a
    // 3-step butterfly: all threads get the row's (M, D) without a barrier.
    const int lane = tid & 31;
    MaxSum r = slots[lane & (C - 1)];
#pragma unroll
    for (int o = C / 2; o > 0; o >>= 1) {
        MaxSum other;
        other.m = __shfl_xor_sync(0xffffffffu, r.m, o);
        other.d = __shfl_xor_sync(0xffffffffu, r.d, o);
        r = combine(r, other);
    }
    const float inv = safe_inv_sum(r.m, r.d);  // 0 for an all -inf row, NaN for a NaN row
    // A block whose chunk is all -inf holds zeros: its factor is 0, but
    // 0 * inv keeps a NaN row NaN (and avoids exp(0 - M) overflowing).
    const float f = bm == NEG_INF ? 0.f * inv : expf(bm - safe_shift(r.m)) * inv;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) v[k] *= f;

    if (vec) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = lo + tid + k * nt;
            if (i < hi) store_vec16<T>(yr + (size_t)i * V, v + k * V);
        }
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const int j = lo + tid + k * nt;
            if (j < hi) yr[j] = from_float<T>(v[k]);
        }
    }

#else
    // Clusters need sm_90: on older archs this variant is an empty kernel.
    (void)x; (void)y; (void)rows; (void)cols;
#endif
}

// ---------------------------------------------------------------------------
// Exports: one extern "C" kernel per (variant, dtype).
// ---------------------------------------------------------------------------
#define SOFTMAX_LB_256 __launch_bounds__(256)
#define SOFTMAX_LB_512 __launch_bounds__(512)
// Variant 5: (1024, 2) caps it at 32 registers, so two 1024-thread blocks
// (rows of 8K..16K) fit on one SM and overlap each other's phases.
#define SOFTMAX_LB_1024_X2 __launch_bounds__(1024, 2)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SOFTMAX_LB_CLUSTER __launch_bounds__(1024, 1) __cluster_dims__(SOFTMAX_CLUSTER, 1, 1)
#else
#define SOFTMAX_LB_CLUSTER __launch_bounds__(1024, 1)
#endif

#define SOFTMAX_EXPORT(variant, ATTRS)                                                                       \
    extern "C" __global__ void ATTRS softmax_##variant##_f32(const float* __restrict__ x, float* __restrict__ y, \
                                                            int rows, int cols) {                            \
        variant<float>(x, y, rows, cols);                                                                    \
    }                                                                                                        \
    extern "C" __global__ void ATTRS softmax_##variant##_bf16(const __nv_bfloat16* __restrict__ x,           \
                                                             __nv_bfloat16* __restrict__ y, int rows,        \
                                                             int cols) {                                     \
        variant<__nv_bfloat16>(x, y, rows, cols);                                                            \
    }

SOFTMAX_EXPORT(naive_thread_per_row, SOFTMAX_LB_256)
SOFTMAX_EXPORT(block_three_pass, SOFTMAX_LB_256)
SOFTMAX_EXPORT(online_warp_per_row, SOFTMAX_LB_256)
SOFTMAX_EXPORT(online_block_per_row, SOFTMAX_LB_512)
SOFTMAX_EXPORT(onchip_block_per_row, SOFTMAX_LB_1024_X2)
SOFTMAX_EXPORT(cluster_per_row, SOFTMAX_LB_CLUSTER)
