// gemm, the wgmma rungs (sm_90a): wgmma_tma, wgmma_n128, wgmma_n128_deep, wgmma_n64_deep. Ladder: simt.cu.
#include "mma.cuh"

// ---------------------------------------------------------------------------------------------
// 11. wgmma_tma (sm_90a only): Hopper's own data path. TMA (cp.async.bulk.tensor.2d) copies the A
// and B tiles into 128-byte-swizzled shared memory and signals an mbarrier with the bytes that
// landed; warpgroup MMAs (wgmma.mma_async m64n256k16, fp32 accumulate) read both operands straight
// from shared memory through 64-bit descriptors, so no thread issues a load, an ldmatrix or an
// address computation per mma. Warp-specialised: warpgroups 0 and 1 are consumers, each owning
// 64 rows x 256 columns of the 128x256 block tile (128 fp32 accumulators per thread); warpgroup 2
// is the producer (one thread issues the TMA copies; setmaxnreg gives its registers away).
// 12. wgmma_n128: the same loop on 128x128 tiles (m64n128k16, 64 accumulators per thread), 3
// stages of 32 KiB, two blocks per SM: twice the tiles of wgmma_tma, for shapes whose 128x256
// tiles leave SMs idle (M <= 512 at N = 4096: 64 tiles or fewer on 132 SMs; 2048^3: 128) and an
// SM that overlaps one block's epilogue with the other's main loop. A producer warpgroup plus
// setmaxnreg cannot work here: ptxas compiles every thread to the launch's limit (65536 / 768
// threads: 80 registers, too few for a wgmma with 64 accumulators), so the producer is one warp
// and the block 288 threads (limit 112; ptxas -v: 90 registers).
//
// Shared memory per stage: A 128 x 64 halves = 16 KiB (one TMA box of 128 rows x 128 bytes),
// B 64 x 256 halves = 32 KiB (four boxes of 64 k-rows x 64 n = 128 bytes, side by side), 48 KiB
// in all. H100 allows 227 KiB (232448 bytes) of dynamic shared memory per block: 4 stages =
// 192 KiB + 1 KiB of slack to align the ring to 1024 bytes (the 128-byte swizzle repeats every
// 8 rows x 128 bytes and TMA and wgmma both apply it to absolute address bits 4-6 ^ 7-9) + 64 bytes
// of mbarriers = 197696 bytes; a fifth stage (240 KiB) does not fit. One block per SM.
// wgmma_n128: 3 x 32 KiB + 1 KiB + 48 = 99376 bytes per block, two blocks in the SM's 228 KiB.
// Registers: 384 threads x 168 = 64512 of 65536 at launch; setmaxnreg then moves them to
// 40 (producer) / 232 (consumers): 128 x 40 + 256 x 232 = 64512.
//
// Operand layouts (PTX ISA, "Shared Memory Matrix Layout" and "Matrix Descriptor"):
//   A is row-major M x K = K-major: box rows are 64 k (128 bytes) of one m; descriptor with
//   128-byte swizzle, stride byte offset 1024 (8 rows x 128 bytes to the next 8 rows), leading
//   byte offset unused for swizzled K-major (encoded as 1). The k16 step s starts 32 s bytes in.
//   B is row-major K x N = N-major (wgmma's transpose flag, allowed for 16-bit types): box rows
//   are 64 n (128 bytes) of one k; leading byte offset 8192 (from one 64-column box to the
//   next), stride byte offset 1024 (from 8 k-rows to the next 8). The k16 step s starts 2048 s
//   bytes in (16 k-rows of 128 bytes).
// Pipeline: full[s] (1 arrival + the stage's 49152 transaction bytes, fewer at the N edge) and empty[s] (one arrival
// per consumer warp, 8) per stage. Tile kt uses stage kt % 4; the consumer waits full[s] with
// parity (kt / 4) & 1, the producer waits empty[s] with parity ((kt / 4) & 1) ^ 1 (a fresh
// barrier's "previous phase" counts as complete, so the first 4 tiles do not wait). Consumers
// keep one wgmma group in flight: after issuing tile kt they wait for tile kt - 1's group and
// release its stage.
// Bounds: TMA zero-fills the parts of a box outside the tensor (M, N and K edges), and still
// counts the whole box in the transaction bytes; B boxes wholly past N are not issued (and not
// counted); stores are predicated (store2). Requires row strides (lda, ldb) that are multiples of
// 16 bytes, which the launcher checks.
// ---------------------------------------------------------------------------------------------

// The block tile and ring of a wgmma rung: BN = 256 (wgmma_tma: 4 stages, one block per SM) or
// 128 (wgmma_n128: 3 stages, two blocks per SM; wgmma_n128_deep: 7 stages, one block per SM) or
// 64 (wgmma_n64_deep: 9 stages, one block per SM).
template <int BN_, int STAGES_, int BLOCKS_PER_SM_>
struct WgTile {
    static constexpr int BM = 128, BN = BN_, BK = 64, STAGES = STAGES_, BLOCKS_PER_SM = BLOCKS_PER_SM_;
    static constexpr int CONSUMERS = 2;
    static constexpr int A_BYTES = BM * BK * 2;                      // 16 KiB
    static constexpr int B_BOX_N = 64, B_BOXES = BN / B_BOX_N;         // boxes of 64 columns
    static constexpr int B_BOX_BYTES = BK * B_BOX_N * 2;              // 8 KiB
    static constexpr int STAGE_BYTES = A_BYTES + B_BOXES * B_BOX_BYTES;  // 48, 32 or 24 KiB
    static constexpr int SMEM = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8;  // 197696, 99376, 230512, 222352
    // The producer: a whole warpgroup that gives its registers to the consumers through setmaxnreg
    // (one block per SM: 384 x 168 at launch, then 40 and 232), or, at two blocks per SM, one
    // warp: ptxas compiles every thread to the launch's limit (65536 / 576 threads: 112), which
    // already holds 64 accumulators. Either way it follows the consumer warpgroups.
    static constexpr int PRODUCER_THREADS = BLOCKS_PER_SM == 1 ? 128 : 32, THREADS = 128 * CONSUMERS + PRODUCER_THREADS;
    static constexpr bool SETMAXNREG = PRODUCER_THREADS == 128;
    static constexpr int LAUNCH_REGS = 65536 / (THREADS * BLOCKS_PER_SM) / 8 * 8;
    static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = SETMAXNREG ? (THREADS * LAUNCH_REGS - 128 * PRODUCER_REGS) / (128 * CONSUMERS) / 8 * 8 : LAUNCH_REGS;
    static_assert(BLOCKS_PER_SM * (SMEM + 1024) <= 233472, "fits H100's 228 KiB of shared memory per SM");
    static_assert(BK * 2 == 128, "one 128-byte swizzle row per k-slab row");
    static_assert(BN / 2 <= CONSUMER_REGS - 24, "accumulators and some room beside them");
};


template <typename T, typename P>
__device__ __forceinline__ void wgmma_tma_body(const TmaDesc& ta, const TmaDesc& tb, T* C, int M, int N, int K, int ldc,
                                               float alpha, float beta) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = P::BM, BN = P::BN, BK = P::BK, STAGES = P::STAGES, CONSUMERS = P::CONSUMERS;
    constexpr int A_BYTES = P::A_BYTES, B_BOX_N = P::B_BOX_N, B_BOXES = P::B_BOXES, B_BOX_BYTES = P::B_BOX_BYTES;
    constexpr int STAGE_BYTES = P::STAGE_BYTES, ACC = BN / 2;  // fp32 accumulators per consumer thread
    extern __shared__ __align__(1024) unsigned char smem[];
    require_dynamic_smem(P::SMEM);
    const unsigned ring = (smem_addr(smem) + 1023u) & ~1023u;
    const unsigned bars = ring + STAGES * STAGE_BYTES;  // full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s)
    const int wgi = threadIdx.x / 128, tid = threadIdx.x % 128;

    const int2 tile = grouped_tile(blockIdx.x, M, N, BM, BN);
    const int bm = tile.x, bn = tile.y;
    const int nk = (K + BK - 1) / BK;

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (STAGES + s), CONSUMERS * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wgi == CONSUMERS) {
        if constexpr (P::SETMAXNREG) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(P::PRODUCER_REGS));
        if (tid == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&ta)) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&tb)) : "memory");
            // B boxes wholly right of N are not loaded: their columns feed only outputs >= N, which
            // are never stored (whatever the slot held stays in those columns).
            const int b_boxes = min(B_BOXES, (N - bn + B_BOX_N - 1) / B_BOX_N);
            const unsigned tx = A_BYTES + b_boxes * B_BOX_BYTES;
            for (int kt = 0; kt < nk; ++kt) {
                const int s = kt % STAGES;
                const unsigned full = bars + 8 * s, a = ring + s * STAGE_BYTES;
                mbar_wait(bars + 8 * (STAGES + s), ((kt / STAGES) & 1) ^ 1);
                mbar_expect_tx(full, tx);
                tma_load_2d(a, &ta, kt * BK, bm, full);
                for (int j = 0; j < b_boxes; ++j) tma_load_2d(a + A_BYTES + j * B_BOX_BYTES, &tb, bn + j * B_BOX_N, kt * BK, full);
            }
        }
        return;
    }

    if constexpr (P::SETMAXNREG) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(P::CONSUMER_REGS));
    const int warp = tid / 32, lane = tid % 32;
    float d[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) d[i] = 0.f;
    const unsigned a_rows = wgi * 64 * BK * 2;  // this warpgroup's 64 rows of the A box
    for (int kt = 0; kt < nk; ++kt) {
        const int s = kt % STAGES;
        const unsigned a = ring + s * STAGE_BYTES + a_rows, b = ring + s * STAGE_BYTES + A_BYTES;
        mbar_wait(bars + 8 * s, (kt / STAGES) & 1);
        wg_pin(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks)
            Wgmma<T, BN>::run(d, wg_desc(a + 32 * ks, WG_A_LBO, WG_A_SBO), wg_desc(b + 2048 * ks, WG_B_LBO, WG_B_SBO));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        wg_pin(d);
        // Tile kt - 1's group has finished reading its stage: hand the stage back (one arrival per warp).
        if (kt > 0 && lane == 0) mbar_arrive(bars + 8 * (STAGES + (kt - 1) % STAGES));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    wg_pin(d);

    // Accumulator layout of m64nNk16: thread (warp w, lane l) holds, for each 8-column block j,
    // d[4j], d[4j+1] at row 16w + l/4, columns 8j + 2(l%4) + {0, 1}, and d[4j+2], d[4j+3] 8 rows below.
    const int row = bm + wgi * 64 + warp * 16 + lane / 4, col = bn + 2 * (lane % 4);
    // Whole tiles with beta == 0 and 4-byte aligned pairs (the common case) store without checks:
    // BN / 4 packed stores instead of as many calls of store2 with their bounds and alignment branches.
    const bool whole = bm + BM <= M && bn + BN <= N && beta == 0.f && (ldc & 1) == 0 && (reinterpret_cast<u64>(C) & 3) == 0;
    if (whole) {
        T* c0 = C + (u64)row * ldc + col;
        T* c8 = c0 + 8 * (u64)ldc;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            *reinterpret_cast<unsigned*>(c0 + 8 * j) = pack2<T>(alpha * d[4 * j], alpha * d[4 * j + 1]);
            *reinterpret_cast<unsigned*>(c8 + 8 * j) = pack2<T>(alpha * d[4 * j + 2], alpha * d[4 * j + 3]);
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        store2<T>(C, M, N, ldc, row, col + 8 * j, d[4 * j], d[4 * j + 1], alpha, beta);
        store2<T>(C, M, N, ldc, row + 8, col + 8 * j, d[4 * j + 2], d[4 * j + 3], alpha, beta);
    }
#else
    __trap();  // built for another target: the launcher offers this variant on compute capability 9.0 only
#endif
}


// wgmma_tma: TMA + mbarrier ring + warp-specialised wgmma, sm_90a (a trap elsewhere; never launched there).
#define WGMMA_TMA_ARGS(T) const __grid_constant__ TmaDesc ta, const __grid_constant__ TmaDesc tb, T *C, int M, int N, int K, \
                          int ldc, float alpha, float beta
using WgWide = WgTile<256, 4, 1>;
using WgN128 = WgTile<128, 3, 2>;
using WgN128Deep = WgTile<128, 7, 1>;
using WgN64Deep = WgTile<64, 9, 1>;
#define WGMMA_RUNG(NAME, P)                                                                                            \
    extern "C" __global__ void __launch_bounds__(P::THREADS, P::BLOCKS_PER_SM) gemm_##NAME##_f16(WGMMA_TMA_ARGS(__half)) { \
        wgmma_tma_body<__half, P>(ta, tb, C, M, N, K, ldc, alpha, beta);                                               \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(P::THREADS, P::BLOCKS_PER_SM) gemm_##NAME##_bf16(WGMMA_TMA_ARGS(__nv_bfloat16)) { \
        wgmma_tma_body<__nv_bfloat16, P>(ta, tb, C, M, N, K, ldc, alpha, beta);                                        \
    }
// wgmma_tma: 128x256 tiles, 4 stages, one block per SM.
WGMMA_RUNG(wgmma_tma, WgWide)
// wgmma_n128: 128x128 tiles, 3 stages, two blocks per SM.
WGMMA_RUNG(wgmma_n128, WgN128)
// wgmma_n128_deep: 128x128 tiles, 7 stages, one block per SM.
WGMMA_RUNG(wgmma_n128_deep, WgN128Deep)
// wgmma_n64_deep: 128x64 tiles, 9 stages, one block per SM.
WGMMA_RUNG(wgmma_n64_deep, WgN64Deep)
