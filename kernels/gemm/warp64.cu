// gemm, mma_warp64(_wide, _k64): 64x64 warp tiles on cp.async rings. Ladder: simt.cu.
#include "mma.cuh"

// ---------------------------------------------------------------------------------------------
// 8. mma_warp64(_wide, _k64): 64x64 warp tiles (32 mma per 8 ldmatrix.x4: 128 B of ldmatrix per
// mma against 192 B for 64x32), BK = 32 (or 64) slabs in a STAGES-slot cp.async ring, one
// barrier per slab. Schedule (slab s in slot s % STAGES; the prologue commits STAGES groups,
// slabs 0..STAGES-1; KS = BK / 16 k16 steps per slab):
//   iteration kt: for ks < KS - 1: ldmatrix step ks+1 of slab kt | mma step ks; then
//   wait_group(STAGES-2) + barrier (slab kt+1 landed, and every warp has read all of slab kt) |
//   cp.async slab kt+STAGES into slab kt's slot, commit | ldmatrix step 0 of slab kt+1 | mma
//   step KS-1.
// Fragments are double-buffered across the k16 steps and across the slab boundary, so the mma
// of one step always has the next step's ldmatrix in flight.
// BK = 32: A slab rows are 64 bytes (4 chunks): rows 2l and 2l+1 share 128-byte line l, and chunk
// (r % 2) * 4 + c of the line is stored at that index ^ (l % 8): an ldmatrix phase (8 rows from a
// multiple of 8, one logical chunk) and a cp.async warp write (8 rows x 4 chunks) both hit 8
// distinct 16-byte bank groups per line. BK = 64: A rows are 128 bytes and use swz() (8 chunks).
// B rows (BN * 2 bytes) use swz() as mma_pipelined does.
// Loads: interior blocks (tile inside M x N, K % BK == 0, 16-byte aligned rows) issue bare
// cp.async from per-thread pointers; every other block goes through load_chunk() (zero fill,
// element fallback), in its own copy of the main loop.
// Why BK = 64 (mma_warp64_k64): per barrier each warp issues 128 mma instead of 64, so the
// barrier, the cp.async wait, the loop branch and the ring bookkeeping cost half as much per mma,
// and a warp that reaches the barrier early idles its tensor pipe half as often; 4 stages of 48
// KiB keep 3 slabs (144 KiB, 192 k) in flight against 4 x 24 KiB (128 k) for the wide rung, more
// room for L2 latency under load. Fragments are still two step buffers: 242 registers against
// 238, the 12-chunk loader's address chain.
// ---------------------------------------------------------------------------------------------

// Byte offset of 16-byte chunk `chunk` (0..3) of row `row` in a tile of 64-byte rows.
__device__ __forceinline__ int swz64(int row, int chunk) {
    const int line = row >> 1;
    return (line * 8 + ((((row & 1) << 2) | chunk) ^ (line & 7))) * 16;
}

// Byte offset of chunk `chunk` of row `row` of an A slab BK halves deep (64- or 128-byte rows).
template <int BK>
__device__ __forceinline__ int swz_a(int row, int chunk) {
    return BK == 32 ? swz64(row, chunk) : swz(row, chunk, BK / 8);
}

template <typename T, int BM, int BN, int BK_, int WARPS_M, int WARPS_N, int STAGES>
struct W64 {
    static constexpr int BK = BK_, WM = 64, WN = 64, MI = WM / 16, NI = WN / 8, KS = BK / 16;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BK * BN * 2, STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int SMEM = STAGES * STAGE_BYTES;
    static constexpr int A_ROW = BK * 2;                                // bytes per A smem row
    static constexpr int A_CPR = BK / 8, B_CPR = BN / 8;              // 16-byte chunks per smem row
    static constexpr int A_ROWS_STEP = THREADS / A_CPR;                // rows between a thread's A chunks
    static constexpr int B_ROWS_STEP = THREADS / B_CPR;                // ... and its B chunks
    static constexpr int A_ITERS = BM / A_ROWS_STEP, B_ITERS = BK / B_ROWS_STEP;
    static constexpr int A_PERIOD = BK == 32 ? 16 : 8;                 // rows after which swz_a repeats
    static_assert(BM == WARPS_M * WM && BN == WARPS_N * WN, "warps tile the block");
    static_assert((BK == 32 || BK == 64) && B_CPR % 8 == 0, "swz64 or swz for A, swz for B");
    static_assert(KS % 2 == 0, "the step buffers alternate and step 0 of a slab lands in buffer 0");
    // A thread's later chunks sit a whole number of swizzle periods below its first (16 lines of
    // 64-byte A rows, 8 rows of 128-byte A rows or of B), so their offsets are the first one's plus
    // a constant; so do a warp's m16 tiles (16 rows apart).
    static_assert(A_ROWS_STEP % A_PERIOD == 0 && B_ROWS_STEP % 8 == 0, "constant per-chunk smem stride");
    static_assert(A_ITERS * A_ROWS_STEP == BM && B_ITERS * B_ROWS_STEP == BK, "loads cover a slab");
    static_assert(STAGES >= 2 && SMEM <= 232448, "ring, within H100's 227 KiB per block");
};

// A 64x64 warp tile's fragments of k16 step ks from a stage at shared address `stage`, whose A
// rows are A_ROW bytes and B rows B_ROW bytes, both XOR-swizzled by 16-byte chunk: A m16 tile i
// by ldmatrix.x4 at (a_lane ^ 32 ks) plus 16 rows per tile, B n8 pair j by .x4.trans at
// (b_lane ^ 16 j) plus 16 rows per step (a_lane and b_lane: the lane's row and chunk at step 0,
// derived where each rung lays out its stage).
template <int A_ROW, int B_ROW>
__device__ __forceinline__ void warp64_frags(unsigned stage, int a_lane, int b_lane, int ks, unsigned (&a)[4][4], unsigned (&b)[8][2]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) ldmatrix_x4(a[i], stage + (a_lane ^ (ks * 32)) + i * 16 * A_ROW);
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        unsigned r[4];
        ldmatrix_x4_trans(r, stage + (b_lane ^ (j * 16)) + ks * 16 * B_ROW);
        b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
    }
}

// The 32 mma of one k16 step of a 64x64 warp tile, serpentine: consecutive mma share a B fragment.
template <typename T>
__device__ __forceinline__ void warp64_mma(float (&acc)[4][8][4], const unsigned (&a)[4][4], const unsigned (&b)[8][2]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int j = (i & 1) ? 7 - jj : jj;
            Mma<T>::run(acc[i][j], a[i], b[j]);
        }
}

template <typename T, int BM, int BN, int BK_, int WARPS_M, int WARPS_N, int STAGES>
__device__ __forceinline__ void mma_warp64_body(const T* __restrict__ A, const T* __restrict__ B, T* C, int M, int N, int K,
                                                int lda, int ldb, int ldc, float alpha, float beta) {
    using P = W64<T, BM, BN, BK_, WARPS_M, WARPS_N, STAGES>;
    constexpr int BK = P::BK, MI = P::MI, NI = P::NI;
    extern __shared__ __align__(128) unsigned char smem[];
    require_dynamic_smem(P::SMEM);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int2 tile = grouped_tile(blockIdx.x, M, N, BM, BN);
    const int bm = tile.x, bn = tile.y;
    const int wm = (warp / WARPS_N) * P::WM, wn = (warp % WARPS_N) * P::WN;

    // Loader: thread tid owns A chunk column tid % A_CPR of rows tid / A_CPR + i * A_ROWS_STEP,
    // and B chunk column tid % B_CPR of rows tid / B_CPR + i * B_ROWS_STEP.
    const int a_row = tid / P::A_CPR, a_ch = tid % P::A_CPR;
    const int b_row = tid / P::B_CPR, b_ch = tid % P::B_CPR;
    const int a_dst = swz_a<BK>(a_row, a_ch), b_dst = P::A_BYTES + swz(b_row, b_ch, P::B_CPR);
    // Interior: every slab of the block is whole and every chunk 16-byte aligned in global memory.
    const bool interior = bm + BM <= M && bn + BN <= N && K % BK == 0 && lda % 8 == 0 && ldb % 8 == 0 && aligned16(A) &&
                          aligned16(B);
    const T* a_src = A + (u64)min(bm + a_row, M - 1) * lda + a_ch * 8;
    const T* b_src = B + (u64)b_row * ldb + min(bn + b_ch * 8, N - 1);
    const u64 a_step = (u64)P::A_ROWS_STEP * lda, b_step = (u64)P::B_ROWS_STEP * ldb;
    const unsigned smem0 = smem_addr(smem);
    auto load_slab = [&](bool fast, int slot_off, int kt) {
        const int k0 = kt * BK;
        if (fast) {
#pragma unroll
            for (int i = 0; i < P::A_ITERS; ++i)
                cp_async16(smem0 + slot_off + a_dst + i * P::A_ROWS_STEP * P::A_ROW, a_src + k0 + i * a_step, 16);
            const T* bs = b_src + (u64)k0 * ldb;
#pragma unroll
            for (int i = 0; i < P::B_ITERS; ++i)
                cp_async16(smem0 + slot_off + b_dst + i * P::B_ROWS_STEP * BN * 2, bs + i * b_step, 16);
        } else {
            // Not unrolled, so no per-chunk value stays live across the main loop (unrolled,
            // this path pushed the kernel past 255 registers and spilled).
            unsigned char* s = smem + slot_off;
#pragma unroll 1
            for (int i = 0; i < P::A_ITERS; ++i) {
                const int gr = bm + a_row + i * P::A_ROWS_STEP, gk = k0 + a_ch * 8;
                load_chunk(s, a_dst + i * P::A_ROWS_STEP * P::A_ROW, A + (u64)min(gr, M - 1) * lda + min(gk, K - 1),
                           gr < M ? K - gk : 0);
            }
#pragma unroll 1
            for (int i = 0; i < P::B_ITERS; ++i) {
                const int gk = k0 + b_row + i * P::B_ROWS_STEP, gn = bn + b_ch * 8;
                load_chunk(s, b_dst + i * P::B_ROWS_STEP * BN * 2, B + (u64)min(gk, K - 1) * ldb + min(gn, N - 1),
                           gk < K ? N - gn : 0);
            }
        }
    };
    // Reader: lane offsets of the ldmatrix rows (see the derivation in the test mirror); the lane
    // points at (row lm.x = lane % 16, chunk lm.y = lane / 16) of each 16x16 block.
    // A, m16 tile i, k16 step ks: row wm + 16 i + lm.x, chunk 2 ks + lm.y; the XOR term
    // ((lane % 16) / 2 for 64-byte rows, lane % 8 for 128-byte rows) does not depend on i or ks,
    // and the chunk bits of 2 ks are free of lm.y, so the offset is a_lane ^ (32 ks) plus 16 i rows.
    const int2 lm = ldmatrix_x4_lane(lane);
    const int a_lane = swz_a<BK>(wm + lm.x, lm.y);
    // B, n8 pair jp (0, 2, 4, 6), step ks: row 16 ks + lm.x, chunk wn / 8 + jp + lm.y;
    // the offset is (b_lane ^ 16 jp) plus 16 ks rows.
    const int b_lane = P::A_BYTES + swz(lm.x, wn / 8 + lm.y, P::B_CPR);
    auto load_frags = [&](int slot_off, int ks, unsigned (&a)[MI][4], unsigned (&b)[NI][2]) {
        warp64_frags<P::A_ROW, BN * 2>(smem0 + slot_off, a_lane, b_lane, ks, a, b);
    };

    float acc[MI][NI][4] = {};
    const int nk = (K + BK - 1) / BK;
    // The main loop, instantiated twice: interior blocks carry only the bare cp.async state
    // (fewer live registers), edge blocks the bounds-checked loader.
    auto main_loop = [&](bool fast) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            if (s < nk) load_slab(fast, s * P::STAGE_BYTES, s);
            cp_async_commit();
        }
        unsigned a0[MI][4], b0[NI][2], a1[MI][4], b1[NI][2];
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        int rd = 0;  // byte offset of slab kt's slot
        load_frags(rd, 0, a0, b0);
        for (int kt = 0; kt < nk; ++kt) {
            load_frags(rd, 1, a1, b1);
            warp64_mma<T>(acc, a0, b0);
            // BK = 64: steps 1 and 2, each with the next step's fragments loading behind it.
#pragma unroll
            for (int ks = 1; ks + 1 < P::KS; ks += 2) {
                load_frags(rd, ks + 1, a0, b0);
                warp64_mma<T>(acc, a1, b1);
                load_frags(rd, ks + 2, a1, b1);
                warp64_mma<T>(acc, a0, b0);
            }
            cp_async_wait<STAGES - 2>();
            __syncthreads();
            if (kt + STAGES < nk) load_slab(fast, rd, kt + STAGES);
            cp_async_commit();
            rd = rd + P::STAGE_BYTES == P::SMEM ? 0 : rd + P::STAGE_BYTES;
            if (kt + 1 < nk) load_frags(rd, 0, a0, b0);
            warp64_mma<T>(acc, a1, b1);
        }
        cp_async_wait<0>();
    };
    if (interior)
        main_loop(true);  // inlined twice: each copy has `fast` constant
    else
        main_loop(false);
    store_acc<T, MI, NI>(C, M, N, ldc, bm + wm, bn + wn, acc, alpha, beta);
}

// mma_warp64: 2.3 instructions per HMMA instead of 10-16, two 4-warp blocks per SM (238 regs).
extern "C" __global__ void __launch_bounds__(128, 2) gemm_mma_warp64_f16(GEMM_ARGS(__half)) {
    mma_warp64_body<__half, 128, 128, 32, 2, 2, 4>(GEMM_PASS);
}
extern "C" __global__ void __launch_bounds__(128, 2) gemm_mma_warp64_bf16(GEMM_ARGS(__nv_bfloat16)) {
    mma_warp64_body<__nv_bfloat16, 128, 128, 32, 2, 2, 4>(GEMM_PASS);
}
// mma_warp64_wide: the same loop on 128x256 tiles, a third less L2 traffic per flop, one block per SM.
extern "C" __global__ void __launch_bounds__(256, 1) gemm_mma_warp64_wide_f16(GEMM_ARGS(__half)) {
    mma_warp64_body<__half, 128, 256, 32, 2, 4, 5>(GEMM_PASS);
}
extern "C" __global__ void __launch_bounds__(256, 1) gemm_mma_warp64_wide_bf16(GEMM_ARGS(__nv_bfloat16)) {
    mma_warp64_body<__nv_bfloat16, 128, 256, 32, 2, 4, 5>(GEMM_PASS);
}
// mma_warp64_k64: the wide loop on 64-deep slabs, half the barriers per mma, 4 stages (192 KiB).
extern "C" __global__ void __launch_bounds__(256, 1) gemm_mma_warp64_k64_f16(GEMM_ARGS(__half)) {
    mma_warp64_body<__half, 128, 256, 64, 2, 4, 4>(GEMM_PASS);
}
extern "C" __global__ void __launch_bounds__(256, 1) gemm_mma_warp64_k64_bf16(GEMM_ARGS(__nv_bfloat16)) {
    mma_warp64_body<__nv_bfloat16, 128, 256, 64, 2, 4, 4>(GEMM_PASS);
}
