// gemm, mma.sync rungs fed by ldmatrix: mma_ldmatrix, mma_pipelined(_wide) and mma_splitk
// (mma_pipelined's loop on 16-row tiles, K split over grid.y). Ladder: simt.cu.
#include "mma.cuh"

// ---------------------------------------------------------------------------------------------
// Tensor-core pieces (fp16 / bf16 in, fp32 accumulate). Fragment layouts of m16n8k16 (PTX ISA,
// "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A (16x16, row): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16x8, col):  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C (16x8, f32):  c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, and register i of every
// lane receives matrix i at (row lane/4, cols 2(lane%4)..+1) -- with .trans, at (rows
// 2(lane%4)..+1, col lane/4), which turns k-major B rows into the b0/b1 pairs. Where each lane
// points: ldmatrix_x4_lane (kernels/mma.cuh).
// ---------------------------------------------------------------------------------------------

// Grouped block order (as in Triton's matmul tutorial): 8 block rows sweep the block columns
// together, so the A rows and B columns in flight stay in L2. The origin (row, column) of block
// `pid`'s BM x BN tile.
__device__ __forceinline__ int2 grouped_tile(int pid, int M, int N, int BM, int BN) {
    constexpr int GROUP = 8;
    const int grid_m = (M + BM - 1) / BM, grid_n = (N + BN - 1) / BN;
    const int per_group = GROUP * grid_n, group = pid / per_group;
    const int first_m = group * GROUP, group_rows = min(grid_m - first_m, GROUP);
    return make_int2((first_m + (pid % per_group) % group_rows) * BM, ((pid % per_group) / group_rows) * BN);
}

template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) { return pack_f16x2(lo, hi); }
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) { return pack_bf16x2(lo, hi); }

// Outputs (row, col) and (row, col + 1) of a C fragment: one 4-byte store when both are in and
// aligned, else per element.
template <typename T>
__device__ __forceinline__ void store2(T* C, int M, int N, int ldc, int row, int col, float v0, float v1, float alpha,
                                       float beta) {
    if (row >= M || col >= N) return;
    T* c = C + (u64)row * ldc + col;
    if (col + 1 < N && (reinterpret_cast<u64>(c) & 3) == 0) {
        float x = alpha * v0, y = alpha * v1;
        if (beta != 0.f) {
            x = fmaf(beta, to_float<T>(c[0]), x);
            y = fmaf(beta, to_float<T>(c[1]), y);
        }
        *reinterpret_cast<unsigned*>(c) = pack2<T>(x, y);
        return;
    }
    c[0] = from_float<T>(epilogue(c, v0, alpha, beta));
    if (col + 1 < N) c[1] = from_float<T>(epilogue(c + 1, v1, alpha, beta));
}

// Writes a warp's MI x NI grid of m16n8 accumulators whose top-left output is (row0, col0).
template <typename T, int MI, int NI>
__device__ __forceinline__ void store_acc(T* C, int M, int N, int ldc, int row0, int col0, float (&acc)[MI][NI][4],
                                          float alpha, float beta) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            const int r = row0 + i * 16 + g, c = col0 + j * 8 + 2 * t;
            store2(C, M, N, ldc, r, c, acc[i][j][0], acc[i][j][1], alpha, beta);
            store2(C, M, N, ldc, r + 8, c, acc[i][j][2], acc[i][j][3], alpha, beta);
        }
}

// ---------------------------------------------------------------------------------------------
// 6. mma_ldmatrix: 128x128x32 tile, 8 warps (2 along M x 4 along N) of 64x32, padded shared
// memory, a register-staged double buffer: mma_ldmatrix_tile (kernels/mma.cuh, which moe's
// grouped GEMM runs too).
// ---------------------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ void mma_ldmatrix_body(const T* __restrict__ A, const T* __restrict__ B, T* C, int M, int N,
                                                  int K, int lda, int ldb, int ldc, float alpha, float beta) {
    using namespace tc1;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float acc[MI][NI][4] = {};
    mma_ldmatrix_tile<T>(A, B, M, N, K, lda, ldb, bm, bn, acc);
    const int tid = threadIdx.x;
    const int2 w = warp_origin(tid / 32);
    store_acc<T, MI, NI>(C, M, N, ldc, bm + w.x, bn + w.y, acc, alpha, beta);
}

// ---------------------------------------------------------------------------------------------
// 7. mma_pipelined: STAGES-deep cp.async ring of BK = 64 slabs in dynamic smem, XOR-swizzled.
// A slab is BM rows of 128 bytes (8 chunks of 16 B); B is BK rows of BN * 2 bytes. The 16-byte
// chunk c of row r is stored at chunk c ^ (r % 8) of that row: the 8 rows one ldmatrix phase
// reads (same logical chunk, 8 consecutive rows) land in 8 distinct bank groups, and so do the
// cp.async writes. Writer (load_stage) and reader (ldmatrix addresses) both go through swz().
// ---------------------------------------------------------------------------------------------

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows are `chunks_per_row`
// chunks long (a multiple of 8: the XOR only touches the low three bits of the chunk index).
__device__ __forceinline__ int swz(int row, int chunk, int chunks_per_row) {
    return (row * chunks_per_row + (chunk ^ (row & 7))) * 16;
}


// One 16-byte chunk of a tile: cp.async when it is whole and aligned in global memory (or wholly
// outside: zero fill), else element loads and a plain shared store. The plain store is ordered
// for the readers by the same barrier that publishes the cp.async data.
template <typename T>
__device__ __forceinline__ void load_chunk(unsigned char* smem, int off, const T* src, int rem) {
    if (rem <= 0 && aligned16(src)) {
        cp_async16(smem_addr(smem + off), src, 0);
    } else if (rem >= 8 && aligned16(src)) {
        cp_async16(smem_addr(smem + off), src, 16);
    } else {
        *reinterpret_cast<uint4*>(smem + off) = load8_guarded(src, rem);
    }
}

template <typename T, int BM, int BN, int WM, int WN, int STAGES>
struct Pipe {
    static constexpr int BK = 64, THREADS = 256;
    static constexpr int MI = WM / 16, NI = WN / 8;
    static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BK * BN * 2, STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int SMEM = STAGES * STAGE_BYTES;
    static constexpr int A_CPR = BK / 8, B_CPR = BN / 8;  // 16-byte chunks per smem row
    static_assert((BM / WM) * (BN / WN) == THREADS / 32, "8 warps cover the tile");
    static_assert(A_CPR % 8 == 0 && B_CPR % 8 == 0, "swizzle needs rows of >= 128 bytes");
    static_assert(NI % 2 == 0, "B fragments come in pairs of n8 tiles");
};

// Split-K (mma_splitk): block (tile, s) of the S = gridDim.y slices writes its fp32 partial tile
// to ws[s][M][N] and counts itself in on the tile's counter; the last block to arrive sums the S
// partials in slice order, applies alpha and beta (store2) and resets the counter for the next
// launch. The order of the sums is fixed: results are reproducible.
template <typename T, int BM, int BN, int MI, int NI, int THREADS>
__device__ __forceinline__ void splitk_store(T* C, float* __restrict__ ws, unsigned* __restrict__ done, int M, int N, int ldc, int bm, int bn,
                                             int wm, int wn, float (&acc)[MI][NI][4], float alpha, float beta) {
    const int S = gridDim.y, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float* part = ws + (u64)blockIdx.y * M * N;
    // Columns 2t and 2t + 1 of a fragment row are one aligned 8-byte word when N is even (each
    // row of a warp's store is then a whole 32-byte sector); else one float at a time.
    const bool pairs = (N & 1) == 0;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = bm + wm + i * 16 + g + 8 * h, c = bn + wn + j * 8 + 2 * t;
                if (r >= M || c >= N) continue;
                float* q = part + (u64)r * N + c;
                if (pairs) {
                    *reinterpret_cast<float2*>(q) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                } else {
                    q[0] = acc[i][j][2 * h];
                    if (c + 1 < N) q[1] = acc[i][j][2 * h + 1];
                }
            }
    if (!last_to_arrive(done + blockIdx.x, S)) return;
    if ((N & 3) == 0) {
        // Four columns per thread, one 16-byte load per slice, four slices loaded before they
        // are added in slice order: four L2 round trips in flight instead of a chain of them.
        for (int p = threadIdx.x; p < BM * BN / 4; p += THREADS) {
            const int r = bm + p / (BN / 4), c = bn + 4 * (p % (BN / 4));
            if (r >= M || c >= N) continue;
            const float* q = ws + (u64)r * N + c;
            float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int v0 = 0; v0 < S; v0 += 4) {
                float4 x[4];
#pragma unroll
                for (int dv = 0; dv < 4; ++dv)
                    x[dv] = v0 + dv < S ? __ldcg(reinterpret_cast<const float4*>(q + (u64)(v0 + dv) * M * N)) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int dv = 0; dv < 4; ++dv)
                    if (v0 + dv < S) sum.x += x[dv].x, sum.y += x[dv].y, sum.z += x[dv].z, sum.w += x[dv].w;
            }
            store2<T>(C, M, N, ldc, r, c, sum.x, sum.y, alpha, beta);
            store2<T>(C, M, N, ldc, r, c + 2, sum.z, sum.w, alpha, beta);
        }
    } else {
        for (int p = threadIdx.x; p < BM * BN / 2; p += THREADS) {
            const int r = bm + p / (BN / 2), c = bn + 2 * (p % (BN / 2));
            if (r >= M || c >= N) continue;
            float v0 = 0.f, v1 = 0.f;
            for (int v = 0; v < S; ++v) {
                const float* q = ws + ((u64)v * M + r) * N + c;
                v0 += __ldcg(q);
                if (c + 1 < N) v1 += __ldcg(q + 1);
            }
            store2<T>(C, M, N, ldc, r, c, v0, v1, alpha, beta);
        }
    }
    if (threadIdx.x == 0) done[blockIdx.x] = 0u;  // ready for the next launch
}

// SPLIT (mma_splitk): the block takes slice blockIdx.y of gridDim.y of the K slabs (ceil(nk / S)
// each) and finishes through splitk_store; with one slice it stores as the others do.
template <typename T, int BM, int BN, int WM, int WN, int STAGES, bool SPLIT = false>
__device__ __forceinline__ void mma_pipelined_body(const T* __restrict__ A, const T* __restrict__ B, T* C, int M, int N,
                                                   int K, int lda, int ldb, int ldc, float alpha, float beta, float* __restrict__ ws = nullptr,
                                                   unsigned* __restrict__ done = nullptr) {
    using P = Pipe<T, BM, BN, WM, WN, STAGES>;
    constexpr int BK = P::BK, THREADS = P::THREADS, MI = P::MI, NI = P::NI;
    extern __shared__ __align__(128) unsigned char smem[];
    require_dynamic_smem(P::SMEM);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int2 tile = grouped_tile(blockIdx.x, M, N, BM, BN);
    const int bm = tile.x, bn = tile.y;
    const int wm = (warp / (BN / WN)) * WM, wn = (warp % (BN / WN)) * WN;
    const int2 lm = ldmatrix_x4_lane(lane);

    auto load_stage = [&](int stage, int k0) {
        unsigned char* sa = smem + stage * P::STAGE_BYTES;
        unsigned char* sb = sa + P::A_BYTES;
#pragma unroll
        for (int i = 0; i < (BM * P::A_CPR + THREADS - 1) / THREADS; ++i) {
            const int c = tid + i * THREADS, r = c / P::A_CPR, ch = c % P::A_CPR;
            if (BM * P::A_CPR % THREADS != 0 && c >= BM * P::A_CPR) break;  // an A slab of fewer chunks than threads
            const int gr = bm + r, gk = k0 + ch * 8;
            load_chunk(sa, swz(r, ch, P::A_CPR), A + (u64)min(gr, M - 1) * lda + min(gk, K - 1), gr < M ? K - gk : 0);
        }
#pragma unroll
        for (int i = 0; i < BK * P::B_CPR / THREADS; ++i) {
            const int c = tid + i * THREADS, r = c / P::B_CPR, ch = c % P::B_CPR;
            const int gk = k0 + r, gn = bn + ch * 8;
            load_chunk(sb, swz(r, ch, P::B_CPR), B + (u64)min(gk, K - 1) * ldb + min(gn, N - 1), gk < K ? N - gn : 0);
        }
    };
    // Fragments of k16 step ks of a stage: A m16 tiles by ldmatrix.x4, B n8 pairs by .x4.trans.
    auto load_frags = [&](int stage, int ks, unsigned (&a)[MI][4], unsigned (&b)[NI][2]) {
        const unsigned sa = smem_addr(smem + stage * P::STAGE_BYTES);
        const unsigned sb = sa + P::A_BYTES;
#pragma unroll
        for (int i = 0; i < MI; ++i) ldmatrix_x4(a[i], sa + swz(wm + i * 16 + lm.x, ks * 2 + lm.y, P::A_CPR));
#pragma unroll
        for (int j = 0; j < NI; j += 2) {
            unsigned r[4];
            ldmatrix_x4_trans(r, sb + swz(ks * 16 + lm.x, (wn + j * 8) / 8 + lm.y, P::B_CPR));
            b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
        }
    };

    float acc[MI][NI][4] = {};
    // Slabs kb .. kb + nk - 1 (all of K unless SPLIT).
    int kb = 0, nk = (K + BK - 1) / BK;
    if constexpr (SPLIT) {
        const int per = (nk + gridDim.y - 1) / gridDim.y;
        kb = min(nk, (int)blockIdx.y * per);
        nk = min(nk, kb + per) - kb;
    }
    // Prologue: STAGES - 1 slabs in flight; a group is committed even when empty so that
    // "wait until at most STAGES - 2 groups are pending" always means "slab kt has landed".
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load_stage(s, (kb + s) * BK);
        cp_async_commit();
    }
    unsigned a[2][MI][4], b[2][NI][2];
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait<STAGES - 2>();
        // Slab kt is visible to every thread, and every warp is done with slab kt - 1, whose
        // slot the prefetch below overwrites.
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < nk) load_stage(next % STAGES, (kb + next) * BK);
        cp_async_commit();
        const int stage = kt % STAGES;
        load_frags(stage, 0, a[0], b[0]);
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {
            if (ks + 1 < BK / 16) load_frags(stage, ks + 1, a[(ks + 1) & 1], b[(ks + 1) & 1]);  // next step's operands
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) Mma<T>::run(acc[i][j], a[ks & 1][i], b[ks & 1][j]);
        }
    }
    cp_async_wait<0>();
    if constexpr (SPLIT) {
        if (gridDim.y > 1) {
            splitk_store<T, BM, BN, MI, NI, THREADS>(C, ws, done, M, N, ldc, bm, bn, wm, wn, acc, alpha, beta);
            return;
        }
    }
    store_acc<T, MI, NI>(C, M, N, ldc, bm + wm, bn + wn, acc, alpha, beta);
}

#define GEMM_ARGS(T) const T *__restrict__ A, const T *__restrict__ B, T *C, int M, int N, int K, int lda, int ldb, int ldc, \
                     float alpha, float beta
#define GEMM_PASS A, B, C, M, N, K, lda, ldb, ldc, alpha, beta

extern "C" __global__ void __launch_bounds__(256, 2) gemm_mma_ldmatrix_f16(GEMM_ARGS(__half)) { mma_ldmatrix_body<__half>(GEMM_PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) gemm_mma_ldmatrix_bf16(GEMM_ARGS(__nv_bfloat16)) {
    mma_ldmatrix_body<__nv_bfloat16>(GEMM_PASS);
}
extern "C" __global__ void __launch_bounds__(256) gemm_mma_pipelined_f16(GEMM_ARGS(__half)) {
    mma_pipelined_body<__half, 128, 128, 64, 32, 4>(GEMM_PASS);
}
extern "C" __global__ void __launch_bounds__(256) gemm_mma_pipelined_bf16(GEMM_ARGS(__nv_bfloat16)) {
    mma_pipelined_body<__nv_bfloat16, 128, 128, 64, 32, 4>(GEMM_PASS);
}
extern "C" __global__ void __launch_bounds__(256) gemm_mma_pipelined_wide_f16(GEMM_ARGS(__half)) {
    mma_pipelined_body<__half, 128, 256, 64, 64, 4>(GEMM_PASS);
}
extern "C" __global__ void __launch_bounds__(256) gemm_mma_pipelined_wide_bf16(GEMM_ARGS(__nv_bfloat16)) {
    mma_pipelined_body<__nv_bfloat16, 128, 256, 64, 64, 4>(GEMM_PASS);
}
// mma_splitk: mma_pipelined's loop on a 16-row tile, K split over grid.y (decode-sized M).
extern "C" __global__ void __launch_bounds__(256) gemm_mma_splitk_f16(GEMM_ARGS(__half), float* __restrict__ ws, unsigned* __restrict__ done) {
    mma_pipelined_body<__half, 16, 128, 16, 16, 4, true>(GEMM_PASS, ws, done);
}
extern "C" __global__ void __launch_bounds__(256) gemm_mma_splitk_bf16(GEMM_ARGS(__nv_bfloat16), float* __restrict__ ws,
                                                                       unsigned* __restrict__ done) {
    mma_pipelined_body<__nv_bfloat16, 16, 128, 16, 16, 4, true>(GEMM_PASS, ws, done);
}
