// mma.cuh: PTX wrappers for the tensor-core kernels (ldmatrix and its lane addresses, cp.async,
// TMA tensor copies) and the mma.sync loop gemm's mma_ldmatrix and moe's grouped_mma share;
// mbarriers, elect, bulk copies, mma.sync and wgmma are in common.cuh, which ceilings and quant share.
#ifndef LAB_KERNELS_MMA_CUH
#define LAB_KERNELS_MMA_CUH

#include "common.cuh"

typedef unsigned long long u64;

__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Where lane `lane` points ldmatrix.x4 in a 16x16 block of 16-bit elements: (row, 16-byte
// column). Lanes 8i..8i+7 give the rows of 8x8 matrix i, which register i receives (fragment
// layouts: kernels/gemm/mma_sync.cu). Here matrix i sits at rows 8 (i % 2).., column i / 2: from
// an A tile (m x k) the registers are a0..a3; with .trans from a B tile held k x n, {b0, b1} of
// the n8 tile at the block's column 0, then of the one at column 8.
__device__ __forceinline__ int2 ldmatrix_x4_lane(int lane) { return make_int2(lane % 16, lane / 16); }

// The same for a B tile held n x k (attention's K rows: keys are B's columns), without .trans:
// matrix i sits at rows 8 (i / 2).., column i % 2, so the registers are {b0, b1} of the n8 tile
// of the block's rows 0..7, then of rows 8..15.
__device__ __forceinline__ int2 ldmatrix_x4_lane_nk(int lane) { return make_int2(lane % 8 + (lane / 16) * 8, (lane / 8) % 2); }

// 16 bytes global -> shared, bypassing L1; src_bytes < 16 zero-fills the rest (0: all zeros).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }


// A CUtensorMap as cuTensorMapEncodeTiled writes it on the host: 128 opaque bytes, passed by value
// as a __grid_constant__ parameter (TMA reads it from parameter space; 64-byte alignment).
struct __align__(64) TmaDesc {
    unsigned long long opaque[16];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One 2D box of `map` whose first element is (c0 along the contiguous dimension, c1 along rows)
// into shared memory at dst; completion adds the box's bytes to mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaDesc* map, int c0, int c1, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
// The same for a 3D box at (c0, c1, c2), innermost first.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaDesc* map, int c0, int c1, int c2, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
#endif

// ---------------------------------------------------------------------------------------------
// The mma.sync loop of gemm's mma_ldmatrix and moe's grouped_mma: a 128x128x32 block tile, 8
// warps (2 along M x 4 along N) of 64x32, a register-staged double buffer (slab kt + 1 comes from
// global memory into registers while slab kt is multiplied from shared memory). Padded rows (+8
// halves = 16 bytes) put the 8 row addresses of each ldmatrix phase in 8 distinct bank groups.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<u64>(p) & 15) == 0; }

// Eight 16-bit values at p, `rem` of them in bounds: one 16-byte load when all are in and p is
// aligned, else element loads with zero fill.
template <typename T>
__device__ __forceinline__ uint4 load8_guarded(const T* p, int rem) {
    if (rem >= 8 && aligned16(p)) return *reinterpret_cast<const uint4*>(p);
    const unsigned short* q = reinterpret_cast<const unsigned short*>(p);
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned lo = 2 * i < rem ? q[2 * i] : 0u;
        const unsigned hi = 2 * i + 1 < rem ? q[2 * i + 1] : 0u;
        w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

namespace tc1 {
constexpr int BM = 128, BN = 128, BK = 32, WM = 64, WN = 32, THREADS = 256;
constexpr int MI = WM / 16, NI = WN / 8;               // 4 x 4 mma tiles per warp
constexpr int LDA_S = BK + 8, LDB_S = BN + 8;          // padded smem row lengths (halves)
constexpr int A_CHUNKS = BM * BK / 8 / THREADS;        // 2 x 16 bytes per thread
constexpr int B_CHUNKS = BK * BN / 8 / THREADS;        // 2
// The origin (row, column) of warp `warp`'s 64x32 part of the block tile.
__device__ __forceinline__ int2 warp_origin(int warp) { return make_int2((warp / (BN / WN)) * WM, (warp % (BN / WN)) * WN); }
}  // namespace tc1

// acc += the block tile at (bm, bn) of A (M x K, row stride lda) times B (K x N, ldb): the calling
// warp's 64x32 part at tc1::warp_origin. A's rows past M, B's columns past N and K past K are
// read as zeros. With AT, A is held K x M (element (m, k) at A[k * lda + m], as moe's weight
// gradients read their activations): its slabs are stored k-major and ldmatrix transposes them.
template <typename T, bool AT = false>
__device__ __forceinline__ void mma_ldmatrix_tile(const T* __restrict__ A, const T* __restrict__ B, int M, int N, int K, int lda, int ldb,
                                                  int bm, int bn, float (&acc)[tc1::MI][tc1::NI][4]) {
    using namespace tc1;
    __shared__ __align__(16) T As[2][BM * LDA_S];
    __shared__ __align__(16) T Bs[2][BK * LDB_S];
    const int tid = threadIdx.x, lane = tid % 32;
    const int2 w = warp_origin(tid / 32), lm = ldmatrix_x4_lane(lane);
    const int wm = w.x, wn = w.y;
    constexpr int LDAT_S = BM + 8;  // AT: a k row of the slab, padded as B's rows are
    static_assert(BK * LDAT_S <= BM * LDA_S, "the transposed A slab fits A's buffer");
    uint4 ra[A_CHUNKS], rb[B_CHUNKS];
    auto load_global = [&](int k0) {
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int c = tid + i * THREADS;
            if constexpr (AT) {
                const int r = c / (BM / 8), mc = (c % (BM / 8)) * 8, gk = k0 + r;
                ra[i] = load8_guarded(A + (u64)min(gk, K - 1) * lda + bm + mc, gk < K ? M - bm - mc : 0);
            } else {
                const int r = c / (BK / 8), kc = (c % (BK / 8)) * 8, gr = bm + r;
                ra[i] = load8_guarded(A + (u64)min(gr, M - 1) * lda + k0 + kc, gr < M ? K - k0 - kc : 0);
            }
        }
#pragma unroll
        for (int i = 0; i < B_CHUNKS; ++i) {
            const int c = tid + i * THREADS, r = c / (BN / 8), nc = (c % (BN / 8)) * 8;
            const int gk = k0 + r;
            rb[i] = load8_guarded(B + (u64)min(gk, K - 1) * ldb + bn + nc, gk < K ? N - bn - nc : 0);
        }
    };
    auto store_smem = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int c = tid + i * THREADS;
            const int at = AT ? (c / (BM / 8)) * LDAT_S + (c % (BM / 8)) * 8 : (c / (BK / 8)) * LDA_S + (c % (BK / 8)) * 8;
            *reinterpret_cast<uint4*>(&As[buf][at]) = ra[i];
        }
#pragma unroll
        for (int i = 0; i < B_CHUNKS; ++i) {
            const int c = tid + i * THREADS;
            *reinterpret_cast<uint4*>(&Bs[buf][(c / (BN / 8)) * LDB_S + (c % (BN / 8)) * 8]) = rb[i];
        }
    };
    const int nk = (K + BK - 1) / BK;
    load_global(0);
    store_smem(0);
    __syncthreads();
    for (int kt = 0; kt < nk; ++kt) {
        const int buf = kt & 1;
        if (kt + 1 < nk) load_global((kt + 1) * BK);
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {
            unsigned a[MI][4], b[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                if constexpr (AT) {
                    // Matrix q = lane / 8 at k rows 8 (q / 2).., m columns 8 (q % 2)..: transposed, a0..a3.
                    const int2 ln = ldmatrix_x4_lane_nk(lane);
                    ldmatrix_x4_trans(a[i], smem_addr(&As[buf][(ks * 16 + ln.x) * LDAT_S + wm + i * 16 + ln.y * 8]));
                } else {
                    ldmatrix_x4(a[i], smem_addr(&As[buf][(wm + i * 16 + lm.x) * LDA_S + ks * 16 + lm.y * 8]));
                }
            }
#pragma unroll
            for (int j = 0; j < NI; j += 2) {
                unsigned r[4];
                ldmatrix_x4_trans(r, smem_addr(&Bs[buf][(ks * 16 + lm.x) * LDB_S + wn + j * 8 + lm.y * 8]));
                b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) Mma<T>::run(acc[i][j], a[i], b[j]);
        }
        if (kt + 1 < nk) store_smem(buf ^ 1);
        __syncthreads();
    }
}

#endif  // LAB_KERNELS_MMA_CUH
