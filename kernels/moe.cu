// moe: a Mixture-of-Experts layer (lab/src/ops/moe). The grouped GEMM's ladder:
//   cublas_loop  (no kernel here) one cuBLAS GEMM per expert; the host reads the offsets first.
//   grouped_mma  one launch of gemm's mma_ldmatrix tiles (128x128x32 mma.sync, 8 warps of 64x32,
//                ldmatrix, register-staged double buffer: mma_ldmatrix_tile in kernels/mma.cuh);
//                block (n-tile, y) finds its expert by binary search in a tile prefix built on
//                the device (moe_schedule), so M is never padded: rows past an expert's segment
//                are zero-filled on load and masked on store. Epilogue: store, or SwiGLU over
//                interleaved gate/up columns (a thread's c0/c1 pair).
//   grouped_wgmma, grouped_wgmma_n128 (sm_90a)  the same schedule and epilogue on gemm's wgmma_tma
//                loop: A and B by TMA into a ring, two consumer warpgroups on wgmma; 128x256
//                tiles one block per SM, or 128x128 two per SM.
//   grouped_wgmma_persistent  a block per SM looping over the tiles, the ring running on.
//   grouped_wgmma_fused  the layer's down product with the weighted combine in its epilogue: each
//                row's pair scaled by its weight and added (f32 red.v2) into its token's row of
//                an f32 sum, cast once; should buy the [T k, H] products' write and re-read and
//                the combine's launch (Qwen3 at 32k tokens: 1 GB each way).
// Around it, with no host synchronisation (counts and offsets stay on the device):
//   route        a warp per token, 64 per block: scores (softmax or sigmoid, noisy h = l + eps softplus(n)),
//                top-k by k warp argmax rounds (ties to the lower expert), per-expert load and
//                probability sums and the lse^2 sum in shared memory, then one global atomic
//                per expert and block; losses finishes the two losses.
//   chunk_counts / scan / scatter   a stable counting sort of the T k assignments (slot-major:
//                first choices first) into per-expert segments, capacity applied in scan.
//   gather / combine   rows into segment order; weighted sum back per token (f32, j in order;
//                no weights: a plain sum, the backward's dx).
//   swiglu       cublas_loop's separate epilogue.
// The backward's kernels are in moe_backward.cu.
// Index-only kernels carry the f32 suffix (they have no element type).
#include "mma.cuh"

#define MOE_CHUNK 256

__device__ __forceinline__ float moe_softplus(float x) { return x > 20.f ? x : log1pf(__expf(x)); }
__device__ __forceinline__ float moe_silu(float g) { return g / (1.f + __expf(-g)); }

// ---------------------------------------------------------------------------------------------
// Router: a warp per token, 64 tokens per block (8 warps, 8 each); lane l holds experts l, l + 32,
// ... (E <= 256: 8 per lane). The block sums each token's normalised scores, its squared
// log-sum-exp and the load in shared memory, then adds them to acc[0..E), acc[E] and load with
// one atomic per expert: global atomics per address drop from T to T / 64.
// ---------------------------------------------------------------------------------------------
#define MOE_ROUTE_TOKENS 64

// One token's router state in a warp, lane l holding experts l, l + 32, ...: the logits l, the
// selection logits h (noisy gating: l + eps softplus(n)), the scores s (softmax over h, or
// sigmoid), their total (1 under softmax), and the logits' max and exp-sum (lse = lmax + log lsum).
// What route and route_backward both start from.
struct MoeTokenScores {
    float l[8], h[8], s[8], total, lmax, lsum;
};

template <typename T>
__device__ __forceinline__ MoeTokenScores moe_token_scores(const T* logits, const T* noise, const float* eps, u64 row, int E, int sigmoid) {
    const int lane = threadIdx.x % 32;
    MoeTokenScores r;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const int e = lane + 32 * q;
        r.l[q] = r.h[q] = NEG_INF;
        if (e < E) {
            r.l[q] = to_float<T>(logits[row + e]);
            r.h[q] = noise ? r.l[q] + eps[row + e] * moe_softplus(to_float<T>(noise[row + e])) : r.l[q];
        }
    }
    float hmax = NEG_INF, lmax = NEG_INF;
#pragma unroll
    for (int q = 0; q < 8; ++q) hmax = fmax_nan(hmax, r.h[q]), lmax = fmax_nan(lmax, r.l[q]);
    hmax = warp_reduce_max(hmax), lmax = warp_reduce_max(lmax);
    float zsum = 0.f, lsum = 0.f;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const bool in = lane + 32 * q < E;
        r.s[q] = !in ? 0.f : sigmoid ? 1.f / (1.f + __expf(-r.h[q])) : __expf(r.h[q] - hmax);
        zsum += r.s[q];
        lsum += in ? __expf(r.l[q] - lmax) : 0.f;
    }
    zsum = warp_reduce_sum(zsum), lsum = warp_reduce_sum(lsum);
    if (!sigmoid) {
#pragma unroll
        for (int q = 0; q < 8; ++q) r.s[q] /= zsum;
    }
    r.total = sigmoid ? zsum : 1.f, r.lmax = lmax, r.lsum = lsum;
    return r;
}

// Expert e's entry of a per-lane array (v[q] holds expert lane + 32 q), to every lane.
__device__ __forceinline__ float moe_expert_value(const float (&v)[8], int e) {
    float out = 0.f;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const float x = __shfl_sync(0xffffffffu, v[q], e % 32);
        if (q == e / 32) out = x;
    }
    return out;
}

template <typename T>
__device__ __forceinline__ void route_token(const T* logits, const T* noise, const float* eps, int t, int E, int K, int sigmoid,
                                            int renorm, int* experts, float* weights, int* s_load, float* s_acc) {
    const int lane = threadIdx.x % 32;
    const MoeTokenScores sc = moe_token_scores<T>(logits, noise, eps, (u64)t * E, E, sigmoid);
    const float (&h)[8] = sc.h, (&s)[8] = sc.s;
#pragma unroll
    for (int q = 0; q < 8; ++q)
        if (lane + 32 * q < E) atomicAdd(&s_acc[lane + 32 * q], s[q] / sc.total);
    if (lane == 0) {
        const float lse = sc.lmax + logf(sc.lsum);
        atomicAdd(&s_acc[E], lse * lse);
    }
    // Top-k: k rounds of a warp argmax over the experts not yet taken.
    bool taken[8] = {};
    int ek[8];
    float wk[8], wsum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (j >= K) break;
        float bv = NEG_INF;
        int bi = 0x7fffffff;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int e = lane + 32 * q;
            if (e < E && !taken[q] && (bi == 0x7fffffff || h[q] > bv)) bv = h[q], bi = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi != 0x7fffffff && (bi == 0x7fffffff || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        const float sv = moe_expert_value(s, bi);
#pragma unroll
        for (int q = 0; q < 8; ++q)
            if (q == bi / 32 && lane == bi % 32) taken[q] = true;
        ek[j] = bi, wk[j] = sv, wsum += sv;
    }
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (j >= K) break;
            experts[(unsigned long long)t * K + j] = ek[j];
            weights[(unsigned long long)t * K + j] = renorm ? wk[j] / wsum : wk[j];
            atomicAdd(&s_load[ek[j]], 1);
        }
    }
}

// Blocks of 256 threads, ceil(T / 64) of them.
template <typename T>
__device__ __forceinline__ void route_body(const T* logits, const T* noise, const float* eps, int tokens, int E, int K,
                                           int sigmoid, int renorm, int* experts, float* weights, int* load, float* acc) {
    __shared__ float s_acc[257];
    __shared__ int s_load[256];
    for (int e = threadIdx.x; e <= E; e += blockDim.x) {
        s_acc[e] = 0.f;
        if (e < E) s_load[e] = 0;
    }
    __syncthreads();
    const int first = blockIdx.x * MOE_ROUTE_TOKENS, last = min(tokens, first + MOE_ROUTE_TOKENS);
    for (int t = first + threadIdx.x / 32; t < last; t += blockDim.x / 32)  // warp-uniform
        route_token<T>(logits, noise, eps, t, E, K, sigmoid, renorm, experts, weights, s_load, s_acc);
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) {
        atomicAdd(&acc[e], s_acc[e]);
        if (e < E && s_load[e]) atomicAdd(&load[e], s_load[e]);
    }
}

// The two losses from the sums: alpha E sum_i (load_i / (T K)) (acc_i / T), and acc[E] / T.
extern "C" __global__ void moe_losses_f32(const int* load, const float* acc, int tokens, int E, int K, float alpha, float* losses) {
    float v = 0.f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) v += (float)load[e] / ((float)tokens * K) * (acc[e] / tokens);
    v = block_reduce_sum(v);
    if (threadIdx.x == 0) losses[0] = alpha * E * v, losses[1] = acc[E] / tokens;
}

// ---------------------------------------------------------------------------------------------
// Permutation: assignment a = j T + t (slot-major), chunks of MOE_CHUNK assignments.
// ---------------------------------------------------------------------------------------------

// Per chunk, how many of its assignments each expert received (out-of-range experts: none).
extern "C" __global__ void moe_chunk_counts_f32(const int* experts, int tokens, int K, int E, int* chunk_hist) {
    __shared__ int hist[256];
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    const int a = blockIdx.x * MOE_CHUNK + threadIdx.x;
    if (a < tokens * K) {
        const int e = experts[(unsigned long long)(a % tokens) * K + a / tokens];
        if (e >= 0 && e < E) atomicAdd(&hist[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) chunk_hist[(unsigned long long)blockIdx.x * E + e] = hist[e];
}

// Exclusive prefix of 256 values over a block of 256 threads; *total gets their sum.
__device__ __forceinline__ int block_exclusive_scan256(int v, int* total) {
    __shared__ int s[256];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int o = 1; o < 256; o <<= 1) {
        const int add = threadIdx.x >= o ? s[threadIdx.x - o] : 0;
        __syncthreads();
        s[threadIdx.x] += add;
        __syncthreads();
    }
    *total = s[255];
    return s[threadIdx.x] - v;
}

// One block of 256 threads: each chunk's count becomes the expert's rank base at that chunk;
// an expert keeps min(count, cap); offsets is their exclusive prefix, offsets[E] the total.
extern "C" __global__ void moe_scan_f32(int* chunk_hist, int chunks, int E, int cap, int* offsets) {
    const int e = threadIdx.x;
    int run = 0;
    if (e < E)
        for (int c = 0; c < chunks; ++c) {
            const unsigned long long i = (unsigned long long)c * E + e;
            const int v = chunk_hist[i];
            chunk_hist[i] = run;
            run += v;
        }
    int total;
    const int base = block_exclusive_scan256(e < E ? min(run, cap) : 0, &total);
    if (e < E) offsets[e] = base;
    if (e == 0) offsets[E] = total;
}

// Each assignment's rank among its expert's (chunk base + earlier ones in the chunk): kept
// below cap, at row offsets[e] + rank; else slot -1.
extern "C" __global__ void moe_scatter_f32(const int* experts, int tokens, int K, int E, int cap, const int* chunk_base,
                                           const int* offsets, int* slot, int* rows) {
    __shared__ int ex[MOE_CHUNK];
    const int a = blockIdx.x * MOE_CHUNK + threadIdx.x;
    const bool live = a < tokens * K;
    const int t = live ? a % tokens : 0, j = live ? a / tokens : 0;
    int e = live ? experts[(unsigned long long)t * K + j] : -1;
    if (e >= E) e = -1;
    ex[threadIdx.x] = e;
    __syncthreads();
    if (!live) return;
    int s = -1;
    if (e >= 0) {
        int rank = 0;
        for (int i = 0; i < threadIdx.x; ++i) rank += ex[i] == e;
        const int pos = chunk_base[(unsigned long long)blockIdx.x * E + e] + rank;
        if (pos < cap) s = offsets[e] + pos;
    }
    slot[(unsigned long long)t * K + j] = s;
    if (s >= 0) rows[s] = t;
}

template <typename T>
__device__ __forceinline__ void gather_body(const T* x, const int* rows, const int* offsets, int E, int H, T* xp) {
    const int s = blockIdx.x;
    if (s >= offsets[E]) return;
    const T* src = x + (unsigned long long)rows[s] * H;
    T* dst = xp + (unsigned long long)s * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) dst[c] = src[c];
}

template <typename T>
__device__ __forceinline__ void combine_body(const T* y, const int* slot, const float* w, int K, int N, T* out) {
    const unsigned long long t = blockIdx.x;
    for (int c = threadIdx.x; c < N; c += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < K; ++j) {
            const int s = slot[t * K + j];
            if (s >= 0) acc += (w ? w[t * K + j] : 1.f) * to_float<T>(y[(unsigned long long)s * N + c]);
        }
        out[t * N + c] = from_float<T>(acc);
    }
}

// h[s, i] = silu(gu[s, 2i]) gu[s, 2i + 1] for the live rows s < offsets[E].
template <typename T>
__device__ __forceinline__ void swiglu_body(const T* gu, const int* offsets, int E, int I, T* h) {
    const int s = blockIdx.x;
    if (s >= offsets[E]) return;
    for (int i = threadIdx.x; i < I; i += blockDim.x) {
        const unsigned long long r = (unsigned long long)s * 2 * I;
        h[(unsigned long long)s * I + i] = from_float<T>(moe_silu(to_float<T>(gu[r + 2 * i])) * to_float<T>(gu[r + 2 * i + 1]));
    }
}

// ---------------------------------------------------------------------------------------------
// grouped_mma: gemm's mma_ldmatrix tile (mma_ldmatrix_tile, kernels/mma.cuh) on each expert's rows
// ---------------------------------------------------------------------------------------------

// One block of 256 threads: tile_start[e] = m-tiles (of BM rows) of the experts before e,
// tile_start[E] their total. Segments are clamped to the `rows` rows A holds.
extern "C" __global__ void moe_schedule_f32(const int* offsets, int E, int rows, int* tile_start) {
    const int e = threadIdx.x;
    const int m = e < E ? min(offsets[e + 1], rows) - min(offsets[e], rows) : 0;
    int total;
    const int start = block_exclusive_scan256(m > 0 ? (m + tc1::BM - 1) / tc1::BM : 0, &total);
    if (e < E) tile_start[e] = start;
    if (e == 0) tile_start[E] = total;
}

// The expert owning m-tile y of the schedule: the last one whose first tile is at or before y.
__device__ __forceinline__ int moe_tile_owner(const int* tile_start, int E, int y) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (tile_start[mid] <= y) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Accumulators v0, v1 of columns (col, col + 1), col even, of a row of C (rows of NC): stored, or
// under SwiGLU the pair is (gate, up) of output column col / 2.
template <typename T>
__device__ __forceinline__ void store_pair(T* Crow, int N, int col, float v0, float v1, int swiglu) {
    if (swiglu) {
        Crow[col / 2] = from_float<T>(moe_silu(v0) * v1);
    } else {
        Crow[col] = from_float<T>(v0);
        if (col + 1 < N) Crow[col + 1] = from_float<T>(v1);
    }
}

// Grid (n-tiles, an upper bound of the m-tiles); blocks past tile_start[E] leave at once.
// The block tile's accumulators at (bm, bn) into C (M x N, rows of N; of N / 2 under SwiGLU), rows
// past M and columns past N left alone. c0 c1 are columns (col, col + 1) with col even: gate and
// up of output col / 2 under SwiGLU.
template <typename T>
__device__ __forceinline__ void store_acc_tile(const float (&acc)[tc1::MI][tc1::NI][4], T* C, int M, int N, int bm, int bn, int swiglu) {
    using namespace tc1;
    const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t4 = lane % 4, NC = swiglu ? N / 2 : N;
    const int2 w = warp_origin(tid / 32);
    const int wm = w.x, wn = w.y;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = bm + wm + i * 16 + g + 8 * half, col = bn + wn + j * 8 + 2 * t4;
                const float v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
                if (row < M && col < N) store_pair<T>(C + (u64)row * NC, N, col, v0, v1, swiglu);
            }
}

template <typename T>
__device__ __forceinline__ void grouped_mma_body(const T* __restrict__ A, const T* __restrict__ B, T* C, const int* offsets,
                                                 const int* tile_start, int E, int rows, int K, int N, int swiglu) {
    using namespace tc1;
    const int y = blockIdx.y;
    if (y >= tile_start[E]) return;
    const int e = moe_tile_owner(tile_start, E, y), r0 = min(offsets[e], rows), M = min(offsets[e + 1], rows) - r0;
    const int bm = (y - tile_start[e]) * BM, bn = blockIdx.x * BN;
    float acc[MI][NI][4] = {};
    mma_ldmatrix_tile<T>(A + (u64)r0 * K, B + (u64)e * K * N, M, N, K, K, N, bm, bn, acc);
    store_acc_tile<T>(acc, C + (u64)r0 * (swiglu ? N / 2 : N), M, N, bm, bn, swiglu);
}

// ---------------------------------------------------------------------------------------------
// grouped_wgmma, grouped_wgmma_n128 (sm_90a): gemm's wgmma_tma loop (kernels/gemm/wgmma.cu says
// why each step is as it is) on the same schedule of m-tiles as grouped_mma, over m_bound x n-tiles
// tiles taken in groups of 8 n-tiles, a block per tile.
// grouped_wgmma_persistent: the same kernel launched with one block per SM, each looping over
// tiles with its ring running on; should buy the per-tile prologue (the first TMA round trip with
// the tensor cores idle) and the epilogue (stores with the copies idle) where tiles are short.
// Measured (h200-moe-persistent): within 1% at Qwen3, whose 128x256 tiles take ~27 us, so the
// prologue is a small share; 6% slower at Mixtral.
// A is read through a 2D tensor map over all the permuted rows: a tile at row offsets[e] + bm
// also loads rows of the next expert (or zeros past the last row), which only feed outputs the
// store masks. B is a 3D map (N, K, E), so a tile's K edge is zero-filled rather than read from
// the next expert's weights.
// ---------------------------------------------------------------------------------------------

#define MOE_WG_GROUP 8

// The tile and ring, as gemm's WgTile (mirrored by lab/src/ops/gemm/tma.rs, wg::WIDE and wg::N128).
template <int BN_, int STAGES_, int BLOCKS_PER_SM_>
struct MoeWg {
    static constexpr int BM = 128, BN = BN_, BK = 64, STAGES = STAGES_, BLOCKS_PER_SM = BLOCKS_PER_SM_;
    static constexpr int A_BYTES = BM * BK * 2, B_BOX_N = 64, B_BOXES = BN / B_BOX_N, B_BOX_BYTES = BK * B_BOX_N * 2;
    static constexpr int STAGE_BYTES = A_BYTES + B_BOXES * B_BOX_BYTES;
    static constexpr int SMEM = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8;
    static constexpr int PRODUCER_THREADS = BLOCKS_PER_SM == 1 ? 128 : 32, THREADS = 256 + PRODUCER_THREADS;
    static constexpr bool SETMAXNREG = PRODUCER_THREADS == 128;
    static constexpr int LAUNCH_REGS = 65536 / (THREADS * BLOCKS_PER_SM) / 8 * 8;
    static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = SETMAXNREG ? (THREADS * LAUNCH_REGS - 128 * PRODUCER_REGS) / 256 / 8 * 8 : LAUNCH_REGS;
};
using MoeWgWide = MoeWg<256, 4, 1>;
using MoeWgN128 = MoeWg<128, 3, 2>;

// The weighted combine grouped_wgmma_fused folds into the down product: tok[s] is permuted row
// s's token, slot [T, k] and w [T, k] the permutation's slots and the routing's weights, acc the
// [T, N] f32 sums (zeroed before). acc null: C is stored.
struct MoeCombine {
    const int* tok;
    const int* slot;
    const float* w;
    int k;
    float* acc;
};

template <typename T, typename P>
__device__ __forceinline__ void grouped_wgmma_body(const TmaDesc& ta, const TmaDesc& tb, T* C, const int* offsets, const int* tile_start,
                                                   int E, int rows, int K, int N, int swiglu, int m_bound, MoeCombine cb) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = P::BM, BN = P::BN, BK = P::BK, STAGES = P::STAGES, ACC = BN / 2;
    // Tiles t = 0 .. n_tiles x m_bound in groups of MOE_WG_GROUP n-tiles, every m-tile of every
    // expert inside a group: the blocks resident together share their B tiles (an expert's weights
    // are read about once) and re-read A once per group. With n-tiles fastest instead, each m-tile
    // row streamed all of its expert's weights again (Mixtral: 235 MB an expert, 8 m-tiles).
    // A block takes tiles blockIdx.x, + gridDim.x, ...: one with a block per tile, several in the
    // persistent launch, whose ring then runs on across tiles (g counts k-tiles over all of them),
    // so the producer fills the next tile's stages while the consumers store the last one.
    const int n_tiles = (N + BN - 1) / BN, per_group = m_bound * MOE_WG_GROUP, total = n_tiles * m_bound, nk = (K + BK - 1) / BK;
    const int live = tile_start[E];
    // Tile t's expert, first row, rows and origin; false past the schedule's total.
    auto locate = [&](int t, int& e, int& r0, int& M, int& bm, int& bn) {
        const int group = t / per_group, in_group = t % per_group;
        const int width = min(MOE_WG_GROUP, n_tiles - group * MOE_WG_GROUP);
        const int y = in_group / width, nt = group * MOE_WG_GROUP + in_group % width;
        if (y >= live) return false;
        e = moe_tile_owner(tile_start, E, y), r0 = min(offsets[e], rows), M = min(offsets[e + 1], rows) - r0;
        bm = (y - tile_start[e]) * BM, bn = nt * BN;
        return true;
    };
    int e, r0, M, bm, bn, first = blockIdx.x;
    while (first < total && !locate(first, e, r0, M, bm, bn)) first += gridDim.x;
    if (first >= total) return;  // no tile for this block: the whole block, before any barrier
    extern __shared__ __align__(1024) unsigned char smem[];
    require_dynamic_smem(P::SMEM);
    const unsigned ring = (smem_addr(smem) + 1023u) & ~1023u, bars = ring + STAGES * P::STAGE_BYTES;
    const int wgi = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (STAGES + s), 8);  // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wgi == 2) {  // the producer
        if constexpr (P::SETMAXNREG) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(P::PRODUCER_REGS));
        if (tid == 0) {
            int g = 0;
            for (int t = first; t < total; t += gridDim.x) {
                if (!locate(t, e, r0, M, bm, bn)) continue;
                const int b_boxes = min(P::B_BOXES, (N - bn + P::B_BOX_N - 1) / P::B_BOX_N);
                const unsigned tx = P::A_BYTES + b_boxes * P::B_BOX_BYTES;
                for (int kt = 0; kt < nk; ++kt, ++g) {
                    const int s = g % STAGES;
                    const unsigned full = bars + 8 * s, a = ring + s * P::STAGE_BYTES;
                    mbar_wait(bars + 8 * (STAGES + s), ((g / STAGES) & 1) ^ 1);
                    mbar_expect_tx(full, tx);
                    tma_load_2d(a, &ta, kt * BK, r0 + bm, full);
                    for (int j = 0; j < b_boxes; ++j) tma_load_3d(a + P::A_BYTES + j * P::B_BOX_BYTES, &tb, bn + j * P::B_BOX_N, kt * BK, e, full);
                }
            }
        }
        return;
    }
    if constexpr (P::SETMAXNREG) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(P::CONSUMER_REGS));
    const int warp = tid / 32, lane = tid % 32;
    const unsigned a_rows = wgi * 64 * BK * 2;
    int g = 0;
    for (int t = first; t < total; t += gridDim.x) {
        if (!locate(t, e, r0, M, bm, bn)) continue;
        float d[ACC];
#pragma unroll
        for (int i = 0; i < ACC; ++i) d[i] = 0.f;
        for (int kt = 0; kt < nk; ++kt, ++g) {
            const int s = g % STAGES;
            const unsigned a = ring + s * P::STAGE_BYTES + a_rows, b = ring + s * P::STAGE_BYTES + P::A_BYTES;
            mbar_wait(bars + 8 * s, (g / STAGES) & 1);
            wg_pin(d);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int ks = 0; ks < BK / 16; ++ks) Wgmma<T, BN>::run(d, wg_desc(a + 32 * ks, WG_A_LBO, WG_A_SBO), wg_desc(b + 2048 * ks, WG_B_LBO, WG_B_SBO));
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            wg_pin(d);
            if (kt > 0 && lane == 0) mbar_arrive(bars + 8 * (STAGES + (g - 1) % STAGES));
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg_pin(d);
        // The tile's last stage is free once its wgmma is done: the producer may refill it while
        // this tile is stored.
        if (lane == 0) mbar_arrive(bars + 8 * (STAGES + (g - 1) % STAGES));
        // d[4j], d[4j+1]: row 16 warp + lane / 4, columns 8j + 2 (lane % 4) + {0, 1}; d[4j+2],
        // d[4j+3] 8 rows below. The pair is (gate, up) of output column / 2 under SwiGLU, as in
        // grouped_mma. With cb.acc, row s's pair is scaled by its assignment's weight and added
        // into its token's f32 row (the weighted combine; N even, so the pair is 8-byte aligned).
        const int NC = swiglu ? N / 2 : N, col = bn + 2 * (lane % 4);
        T* Ce = C + (u64)r0 * NC;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = bm + wgi * 64 + warp * 16 + lane / 4 + 8 * half;
            if (row >= M) continue;
            float wt = 0.f, *acc_row = nullptr;
            if (cb.acc) {
                const int s = r0 + row, t = cb.tok[s];
                for (int j = 0; j < cb.k; ++j)
                    if (cb.slot[(u64)t * cb.k + j] == s) wt = cb.w[(u64)t * cb.k + j];
                acc_row = cb.acc + (u64)t * N;
            }
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int c = col + 8 * j;
                const float v0 = d[4 * j + 2 * half], v1 = d[4 * j + 2 * half + 1];
                if (c >= N) continue;
                if (acc_row) asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(acc_row + c), "f"(wt * v0), "f"(wt * v1) : "memory");
                else store_pair<T>(Ce + (u64)row * NC, N, c, v0, v1, swiglu);
            }
        }
    }
#else
    __trap();  // built for another target: the launcher offers this variant on sm_90a only
#endif
}

#define MOE_TYPED(T, S)                                                                                                  \
    extern "C" __global__ void moe_route_##S(const T* logits, const T* noise, const float* eps, int tokens, int E, int K, \
                                             int sigmoid, int renorm, int* experts, float* weights, int* load, float* acc) { \
        route_body<T>(logits, noise, eps, tokens, E, K, sigmoid, renorm, experts, weights, load, acc);                   \
    }                                                                                                                    \
    extern "C" __global__ void moe_gather_##S(const T* x, const int* rows, const int* offsets, int E, int H, T* xp) {     \
        gather_body<T>(x, rows, offsets, E, H, xp);                                                                      \
    }                                                                                                                    \
    extern "C" __global__ void moe_combine_##S(const T* y, const int* slot, const float* w, int K, int N, T* out) {       \
        combine_body<T>(y, slot, w, K, N, out);                                                                          \
    }                                                                                                                    \
    extern "C" __global__ void moe_cast_##S(const float* in, unsigned long long n, T* out) {                            \
        for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)                \
            out[i] = from_float<T>(in[i]);                                                                               \
    }                                                                                                                    \
    extern "C" __global__ void moe_swiglu_##S(const T* gu, const int* offsets, int E, int I, T* h) {                     \
        swiglu_body<T>(gu, offsets, E, I, h);                                                                            \
    }                                                                                                                    \
    extern "C" __global__ void __launch_bounds__(256) moe_grouped_mma_##S(const T* A, const T* B, T* C, const int* offsets, \
                                                                      const int* tile_start, int E, int rows, int K,   \
                                                                      int N, int swiglu) {                             \
        grouped_mma_body<T>(A, B, C, offsets, tile_start, E, rows, K, N, swiglu);                                        \
    }                                                                                                                    \
    extern "C" __global__ void __launch_bounds__(MoeWgWide::THREADS, 1) moe_grouped_wgmma_##S(                        \
        const __grid_constant__ TmaDesc ta, const __grid_constant__ TmaDesc tb, T* C, const int* offsets,                \
        const int* tile_start, int E, int rows, int K, int N, int swiglu, int m_bound, const int* tok, const int* slot,  \
        const float* w, int topk, float* acc) {                                                                          \
        grouped_wgmma_body<T, MoeWgWide>(ta, tb, C, offsets, tile_start, E, rows, K, N, swiglu, m_bound,                \
                                         MoeCombine{tok, slot, w, topk, acc});                                          \
    }                                                                                                                    \
    extern "C" __global__ void __launch_bounds__(MoeWgN128::THREADS, 2) moe_grouped_wgmma_n128_##S(                   \
        const __grid_constant__ TmaDesc ta, const __grid_constant__ TmaDesc tb, T* C, const int* offsets,                \
        const int* tile_start, int E, int rows, int K, int N, int swiglu, int m_bound, const int* tok, const int* slot,  \
        const float* w, int topk, float* acc) {                                                                          \
        grouped_wgmma_body<T, MoeWgN128>(ta, tb, C, offsets, tile_start, E, rows, K, N, swiglu, m_bound,                \
                                         MoeCombine{tok, slot, w, topk, acc});                                          \
    }

MOE_TYPED(__nv_bfloat16, bf16)
MOE_TYPED(__half, f16)
