// gemm, mma.sync fed by TMA (sm_90a): mma_warp64_tma and mma_warp64_tail_split. Ladder: simt.cu.
#include "mma.cuh"

// ---------------------------------------------------------------------------------------------
// 13. mma_warp64_tma (sm_90a only): mma_warp64_k64's 8 warps of 64x64, its ldmatrix + mma.sync
// schedule and its one block barrier per slab, with the slabs copied by TMA into wgmma_tma's
// stage layout instead of by cp.async from every thread. What goes: each thread's 12 cp.async per
// slab, the ~24 address instructions beside them, and their queueing in front of the ldmatrix
// (Nsight Compute puts ~13% of k64's warp stall samples on those copies: MIO throttle,
// long-scoreboard waits on reused address registers, late fragments behind the copy burst).
// The refill is issued where k64 issues it (one lane of warp 0, elected, right after the barrier
// that ends every warp's reads of the slot), so three slabs stay in flight behind the one read.
// Each warp asks whether slab kt + 1 has landed (mbarrier.test_wait, which never blocks) before
// step 2's 32 mma and acts on the reply after them, spinning only if it has not: the reply takes
// tens of cycles, which every warp waited out at once when the poll came right before the
// barrier (3-10% at the large shapes). No empty barriers: the block barrier frees the slot.
// What remains is warp 0's issue work (one expect_tx and two TMA copies, or five with 2D B boxes,
// each wrapped by ptxas in uniform-datapath setup with 9-12-cycle stall counts), which the other
// warps wait for at the next barrier. Spreading the copies over five warps, or replacing the
// block barrier by per-slot named barriers that only the issuing warp waits on (warps taking
// turns, or warp 0 alone), was slower (h100-gemm-mma-warp64-tma.md).
// Stage layout (WgTile<256, 4, 1>): A one box of 128 rows x 128 bytes, B four boxes of 64 k-rows
// x 128 bytes, each 128-byte swizzled = swz(row, chunk, 8) from its 1024-aligned start. A is
// k64's A slab exactly; a warp's B columns are box wn / 64, whose rows are 128 bytes (k64's:
// 512), so its lane offset is swz(lane's row, lane's chunk, 8) in that box and a k16 step 2048 bytes.
// B arrives as one 3D box per slab (dimensions: 64 columns, K rows, column blocks; box 64 x 64
// x 4, whose image is the four 2D boxes side by side) where every column block lies within a row
// of B (ceil(N / 64) * 64 <= ldb): one copy instead of four for warp 0 to issue. TMA bounds each
// dimension on its own, so a partial last block would be read past N from the row; elsewhere B
// comes in 2D boxes (the map's rank, b_rank, says which).
// Edges: TMA zero-fills past M, N and K; 2D B boxes wholly past N are not issued (their warps
// compute on stale columns that are never stored); stores are predicated (store_acc). One main
// loop for every block.
// ---------------------------------------------------------------------------------------------

// 14. mma_warp64_tail_split (sm_90a only): the same body with TAIL. A block per tile leaves the
// SMs without a tile in the grid's last wave idle while the others finish it (at 8192^3, 2048
// tiles on 132 SMs: 15.5 waves in the time of 16, though at the board's power limit the idle SMs
// leave their power to the busy ones: h100-gemm-tail-split.md). Here the first dp_tiles tiles (whole waves)
// run as mma_warp64_tma's blocks do, and each of the rest = tiles - dp_tiles others is cut into
// `slices` K ranges of ceil(nk / slices) slabs: one block per (slice, tile) after the whole
// tiles, slice-major, so that the blocks running together walk the same K range, as a wave of
// whole tiles does (their A and B slabs shared in L2). The host picks dp_tiles and slices from
// the SM count (tail_plan in ops/gemm/plan.rs). A split block stores its fp32 partial tile in its own
// workspace slot, in fragment order (thread t's acc[i][j] as one float4 at (i * 8 + j) * 256 + t:
// every warp store is 512 contiguous bytes), and counts itself in on the tile's counter; the
// last of the tile's blocks to arrive sums the slots in slice order (the same bits whichever
// block comes last), stores C with alpha and beta, and resets the counter for the next launch.
// ---------------------------------------------------------------------------------------------

// A split block's workspace slot: its 128x256 fp32 partial tile, in float4.
constexpr int TAIL_SLOT_F4 = 128 * 256 / 4;

__device__ __forceinline__ void tail_store_partial(float* __restrict__ ws, int unit, const float (&acc)[4][8][4]) {
    float4* slot = reinterpret_cast<float4*>(ws) + (u64)unit * TAIL_SLOT_F4 + threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) __stcg(slot + (i * 8 + j) * 256, make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]));
}

// The sum of the slots of units first, first + stride, ... (slices of them), into acc: half the
// fragments at a time, 16 float4 loads in flight (all 32 beside the 128 sums would spill).
__device__ __forceinline__ void tail_sum(const float* __restrict__ ws, int first, int stride, int slices, float (&acc)[4][8][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half)
        for (int v = 0; v < slices; ++v) {
            const float4* slot = reinterpret_cast<const float4*>(ws) + (u64)(first + v * stride) * TAIL_SLOT_F4 + threadIdx.x;
#pragma unroll
            for (int i = 2 * half; i < 2 * half + 2; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float4 x = __ldcg(slot + (i * 8 + j) * 256);
                    acc[i][j][0] += x.x, acc[i][j][1] += x.y, acc[i][j][2] += x.z, acc[i][j][3] += x.w;
                }
        }
}

template <typename T, bool TAIL>
__device__ __forceinline__ void mma_warp64_tma_body(const TmaDesc& ta, const TmaDesc& tb, T* C, int M, int N, int K, int ldc,
                                                    float alpha, float beta, int b_rank, int dp_tiles = 0, int slices = 1,
                                                    float* __restrict__ ws = nullptr, unsigned* __restrict__ done = nullptr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using P = WgTile<256, 4, 1>;
    constexpr int STAGES = P::STAGES, BK = P::BK;
    extern __shared__ __align__(1024) unsigned char smem[];
    require_dynamic_smem(P::SMEM);
    const unsigned ring = (smem_addr(smem) + 1023u) & ~1023u;
    const unsigned bars = ring + STAGES * P::STAGE_BYTES;  // full[s] at bars + 8 s
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    // This block's tile and its slabs kb .. kb + nk - 1; unit >= 0: its place among the split blocks.
    int tile_id = blockIdx.x, kb = 0, nk = (K + BK - 1) / BK, unit = -1, rest = 0;
    if constexpr (TAIL) {
        if ((int)blockIdx.x >= dp_tiles) {
            const int per = (nk + slices - 1) / slices;
            unit = blockIdx.x - dp_tiles;
            rest = (gridDim.x - dp_tiles) / slices;
            tile_id = dp_tiles + unit % rest;
            kb = (unit / rest) * per;
            nk = min(nk, kb + per) - kb;
        }
    }
    const int2 tile = grouped_tile(tile_id, M, N, P::BM, P::BN);
    const int bm = tile.x, bn = tile.y;
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 64;
    const int b_boxes = min(P::B_BOXES, (N - bn + P::B_BOX_N - 1) / P::B_BOX_N);
    auto stage = [&](int kt) { return ring + (kt % STAGES) * P::STAGE_BYTES; };
    auto full = [&](int kt) { return bars + 8 * (kt % STAGES); };
    // One thread: tb is either B's 3D map (all four 64-column boxes of a slab in one copy, zero
    // fill past N counted in the bytes) or its 2D map (a copy per box, boxes wholly past N skipped).
    auto issue = [&](int kt) {
        const int k0 = (kb + kt) * BK;  // the slab's first row of K
        if (b_rank == 3) {
            mbar_expect_tx(full(kt), P::STAGE_BYTES);
            tma_load_2d(stage(kt), &ta, k0, bm, full(kt));
            tma_load_3d(stage(kt) + P::A_BYTES, &tb, 0, k0, bn / P::B_BOX_N, full(kt));
            return;
        }
        mbar_expect_tx(full(kt), P::A_BYTES + b_boxes * P::B_BOX_BYTES);
        tma_load_2d(stage(kt), &ta, k0, bm, full(kt));
        for (int j = 0; j < b_boxes; ++j) tma_load_2d(stage(kt) + P::A_BYTES + j * P::B_BOX_BYTES, &tb, bn + j * P::B_BOX_N, k0, full(kt));
    };
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) mbar_init(bars + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&ta)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&tb)) : "memory");
    }
    __syncthreads();
    if (tid == 0)
        for (int kt = 0; kt < min(nk, STAGES); ++kt) issue(kt);
    const bool leader = warp == 0 && elect_one();  // one lane of warp 0, chosen by elect.sync
    const int2 lm = ldmatrix_x4_lane(lane);
    const int a_lane = swz(wm + lm.x, lm.y, 8);
    const int b_lane = P::A_BYTES + (wn / P::B_BOX_N) * P::B_BOX_BYTES + swz(lm.x, lm.y, 8);
    auto frags = [&](int kt, int ks, unsigned (&a)[4][4], unsigned (&b)[8][2]) {
        warp64_frags<BK * 2, P::B_BOX_N * 2>(stage(kt), a_lane, b_lane, ks, a, b);
    };
    float acc[4][8][4] = {};
    unsigned a0[4][4], b0[8][2], a1[4][4], b1[8][2];
    mbar_wait(full(0), 0);
    frags(0, 0, a0, b0);
    for (int kt = 0; kt < nk; ++kt) {
        frags(kt, 1, a1, b1);
        warp64_mma<T>(acc, a0, b0);
        frags(kt, 2, a0, b0);
        warp64_mma<T>(acc, a1, b1);
        frags(kt, 3, a1, b1);
        // Has slab kt + 1 landed? Asked before step 2's mma, answered after it: the mbarrier's
        // reply takes tens of cycles, which every warp would otherwise wait out at the same time.
        const bool landed = kt + 1 >= nk || mbar_test(full(kt + 1), ((kt + 1) / STAGES) & 1);
        warp64_mma<T>(acc, a0, b0);
        if (!landed) mbar_wait(full(kt + 1), ((kt + 1) / STAGES) & 1);
        // Every warp has issued its last ldmatrix of slab kt (step 3's, above): its slot is free.
        __syncthreads();
        if (leader && kt + STAGES < nk) issue(kt + STAGES);
        if (kt + 1 < nk) frags(kt + 1, 0, a0, b0);
        warp64_mma<T>(acc, a1, b1);
    }
    if constexpr (TAIL) {
        if (unit >= 0) {
            tail_store_partial(ws, unit, acc);
            unsigned* counter = done + (tile_id - dp_tiles);
            if (!last_to_arrive(counter, slices)) return;
            tail_sum(ws, unit % rest, rest, slices, acc);
            if (threadIdx.x == 0) *counter = 0u;  // ready for the next launch
        }
    }
    store_acc<T, 4, 8>(C, M, N, ldc, bm + wm, bn + wn, acc, alpha, beta);
#else
    __trap();  // built for another target: the launcher offers this variant on compute capability 9.0 only
#endif
}

// mma_warp64_tma: mma_warp64_k64's loop and block barrier, its slabs copied by TMA (one thread).
// b_rank: 3 when tb is B's 3D map (one copy per slab), else 2.
extern "C" __global__ void __launch_bounds__(256, 1) gemm_mma_warp64_tma_f16(WGMMA_TMA_ARGS(__half), int b_rank) {
    mma_warp64_tma_body<__half, false>(ta, tb, C, M, N, K, ldc, alpha, beta, b_rank);
}
extern "C" __global__ void __launch_bounds__(256, 1) gemm_mma_warp64_tma_bf16(WGMMA_TMA_ARGS(__nv_bfloat16), int b_rank) {
    mma_warp64_tma_body<__nv_bfloat16, false>(ta, tb, C, M, N, K, ldc, alpha, beta, b_rank);
}
// mma_warp64_tail_split: the first dp_tiles blocks as mma_warp64_tma's, the rest (slice, tile)
// blocks of the last partial wave's tiles; ws holds a 128x256 fp32 slot per split block, done a
// counter per split tile (zero at rest).
#define TAIL_SPLIT_ARGS int b_rank, int dp_tiles, int slices, float *__restrict__ ws, unsigned *__restrict__ done
extern "C" __global__ void __launch_bounds__(256, 1) gemm_mma_warp64_tail_split_f16(WGMMA_TMA_ARGS(__half), TAIL_SPLIT_ARGS) {
    mma_warp64_tma_body<__half, true>(ta, tb, C, M, N, K, ldc, alpha, beta, b_rank, dp_tiles, slices, ws, done);
}
extern "C" __global__ void __launch_bounds__(256, 1) gemm_mma_warp64_tail_split_bf16(WGMMA_TMA_ARGS(__nv_bfloat16), TAIL_SPLIT_ARGS) {
    mma_warp64_tma_body<__nv_bfloat16, true>(ta, tb, C, M, N, K, ldc, alpha, beta, b_rank, dp_tiles, slices, ws, done);
}
