// gemm: C = alpha * A B + beta * C, row-major A (M x K, leading dim lda), B (K x N, ldb),
// C (M x N, ldc). fp32 variants are SIMT; fp16/bf16 variants read fp16/bf16, accumulate in fp32
// and write C in the input dtype (as cuBLAS gemm_ex with CUBLAS_COMPUTE_32F does), alpha and beta
// in fp32. beta == 0 never reads C (so a NaN-poisoned C is overwritten, as BLAS specifies).
// Every variant takes any M, N, K >= 1: edge tiles are zero-filled on load and predicated on
// store; 16-byte loads fall back to element loads where a chunk straddles the edge or its address
// is not 16-byte aligned (odd K, N or leading dimensions), so no shape is refused.
//
// Ladder (symbol gemm_<variant>_<dtype>; launch shapes in lab/src/ops/gemm/variants.rs; files: simt.cu,
// mma_sync.cu (mma_ldmatrix, mma_pipelined(_wide), mma_splitk), warp64.cu, wgmma.cu, mma_tma.cu, in this
// order; PTX helpers in kernels/mma.cuh):
//   naive          f32: one thread per output, K-loop straight from global memory; block (32,8).
//                  Coalesced along N, but every A and B element is re-read M or N times from L2.
//   smem_tiled     f32: 32x32 output tile per 1024-thread block, A and B tiles staged in shared
//                  memory: global traffic / 32. Still 2 shared loads per FMA: bound by smem.
//   blocktile_1d   f32: 64x64 tile, BK=8, each of 512 threads owns 8 outputs in a column: one B
//                  value from smem feeds 8 FMAs (siboehm's SGEMM worklog, kernel 4).
//   blocktile_2d   f32: 128x128 tile, BK=8, 256 threads each own an 8x8 outer product held in
//                  registers: 16 smem loads feed 64 FMAs (kernel 5).
//   vectorized     f32: blocktile_2d with float4 global loads, A stored transposed in smem so
//                  the inner loop reads A and B with float4 shared loads, float4 stores (kernel 6).
//   warptiled      f32: 128x128 tile, BK=16, 128 threads; each warp owns 64x64 and each thread
//                  an 8x16 patch as 4 subtiles: warp-local smem reads, fewer conflicts, more ILP
//                  (kernel 10); plus two smem buffers with register-staged prefetch of the next
//                  slab, so one barrier per slab and global latency hidden behind the FMAs.
//   mma_ldmatrix   f16/bf16: tensor cores through inline-PTX mma.sync.m16n8k16 (fp32 accumulate)
//                  fed by ldmatrix.x4 (A) and ldmatrix.x4.trans (B) from padded smem; 128x128x32
//                  tile, 8 warps of 64x32; register-staged prefetch, two smem buffers; capped at
//                  128 registers (two blocks per SM) without spilling.
//   mma_pipelined  f16/bf16: a deeper pipeline (measured slower than mma_ldmatrix): 128x128x64 tile, 8 warps of 64x32, a
//                  4-stage cp.async pipeline (zero-fill via src-size 0) into an XOR-swizzled smem
//                  layout (16-byte chunk ^ row%8: conflict-free ldmatrix without padding), fragments
//                  double-buffered in registers across the four k16 steps, grouped block order
//                  for L2 reuse. wgmma (sm_90a) would be the next rung; this stays on sm_80 PTX.
//   mma_pipelined_wide  same with a 128x256x64 tile, 8 warps of 64x64 (twice the reuse per
//                  fragment, 128 accumulators per thread), 4 stages (192 KiB smem).
//   mma_warp64     f16/bf16: cuts the instructions issued per mma (the main loops of the rungs
//                  above issue 10-16 per HMMA, see below: issue-bound), with 64x64 warp tiles:
//                  128x128x32 tile, 4 warps, 4-stage cp.async ring (64 KiB), two blocks per SM,
//                  one barrier per slab, fragments double-buffered across slabs, bare cp.async
//                  from precomputed pointers in interior blocks.
//   mma_warp64_wide  same loop with a 128x256x32 tile, 8 warps of 64x64, 5 stages (120 KiB),
//                  one block per SM: a third less L2->SM traffic per flop than 128x128.
//   mma_warp64_k64  the wide loop on 64-deep slabs: 128x256x64 tile, 4 stages (192 KiB), four
//                  k16 steps per barrier: half the barriers, cp.async waits and loop overhead per
//                  mma, 144 KiB in flight instead of 96.
//   mma_warp64_tma  f16/bf16, sm_90a only: mma_warp64_k64's warps, loop and barrier per slab,
//                  the slabs copied by TMA (one lane of warp 0, right after the barrier) into
//                  wgmma_tma's stage layout, each warp asking the slab's mbarrier a step early:
//                  none of the 12 cp.async per thread and slab, their address registers or their
//                  queueing in front of the ldmatrix. Needs lda, ldb multiples of 8.
//   mma_warp64_tail_split  mma_warp64_tma whose last partial wave is split along K: the tiles
//                  that would leave SMs idle in the grid's last wave run as K slices on every SM,
//                  their fp32 partials summed in slice order by the tile's last block; skinny
//                  shapes (fewer tiles than SMs) are all tail: 1.4-3x faster than mma_warp64_tma
//                  at M <= 512. At 8192^3 (68 tiles on 132 SMs after 15 whole waves) no faster:
//                  at the power limit idle SMs cost nothing (h100-gemm-tail-split.md).
//   mma_splitk     f16/bf16 for decode shapes (M of a few tokens, where a 128-row tile leaves
//                  most of the GPU idle: M = 16, N = 4096 is 32 blocks of 128x128): mma_pipelined's
//                  loop on a 16x128x64 tile, 8 warps of 16x16, 4 stages (72 KiB), K split over
//                  grid.y = S blocks per tile (the launcher picks S for >= 2 blocks per SM, each
//                  slice >= 4 slabs); fp32 partials in a workspace, summed in slice order by the
//                  tile's last block (a per-tile counter it resets). S = 1 stores directly.
//   wgmma_tma      f16/bf16, sm_90a only (offered on compute capability 9.0 alone; a trap in the
//                  sm_80/sm_90 builds): TMA copies 128-byte-swizzled tiles into a 4-stage mbarrier
//                  ring, wgmma.mma_async m64n256k16 reads them through smem descriptors (B N-major
//                  via the transpose flag). 128x256x64 tile, 3 warpgroups: 1 TMA producer
//                  (setmaxnreg 40), 2 consumers of 64x256 (setmaxnreg 232). No per-mma address or
//                  load instructions at all. Needs lda, ldb multiples of 8 (TMA row strides).
//   wgmma_n128     wgmma_tma's loop on 128x128x64 tiles (m64n128k16), 3 stages, two blocks per SM
//                  with a one-warp producer: twice the tiles, for shapes that leave SMs idle at
//                  128x256 (M <= 512, 1024^3 to 2048^3), and one block's epilogue under the other's loop.
//   wgmma_n128_deep  the same 128x128 tile with wgmma_tma's warps (a producer warpgroup,
//                  setmaxnreg) and 7 stages, one block per SM: three times the bytes in flight per
//                  SM where a skinny shape leaves a block an SM to itself (M <= 512, decode).
//   wgmma_n64_deep  128x64 tiles (m64n64k16, one B box), 9 stages of 24 KiB, one block per SM:
//                  twice the blocks of wgmma_n128_deep again, for M <= 128 (64 blocks at N = 4096),
//                  each re-reading all of A from L2 for half the B.
// Tried and removed (each slower than the rung it changed; notes in reports/notes):
//   mma_tma        mma_warp64_k64's loop fed by wgmma_tma's TMA ring, no block barrier: 6-10%
//                  slower, its warps waiting on late stages (h100-gemm-mma-tma.md).
//   k64 orderings  16 block rows per grouped sweep; n8-tile-outer mma order (h100-mma-sync-roof.md).
//   mma_warps12    12 warps of 64x48 (3 per scheduler, 168 registers, A single-buffered) on
//                  192x192 tiles: 18-40% slower, late fragments and 12-warp barriers (same note).
//   wgmma split-K  K over grid.y for M <= 512: no faster at M = 128, slower at 1024^3
//                  (h100-gemm-wgmma-splitk.md); its faster epilogue stayed with mma_splitk.
//   wgmma B boxes of 16 k-rows (4x as many copies): 16-25% slower at every shape (same note).
//   wgmma_multicast  wgmma_tma in clusters of two blocks along M, each B box copied once and
//                  multicast to both: 3-10% slower once its releases to the peer block used the
//                  default (cta) scope, 35% slower with cluster-scope ones (h100-gemm-wgmma-multicast.md).
//   wgmma_persistent  wgmma_tma's loop on one block per SM looping over tiles, the ring running on
//                  across them (no prologue per tile): +1-3% at 4096^3, but -7% to +3% at 8192^3 and
//                  -5% to +1% at the Llama prefill shapes, with tiles handed out round-robin or from
//                  a global counter (h100-gemm-wgmma-persistent.md).
//   mma_warp64_spread  k64 with each refill's copies issued a quarter per k16 step instead of all
//                  after the barrier: the MIO-throttle and short-scoreboard stalls vanish, but the
//                  HMMA pipe stays ~80% busy (barrier stalls rise instead); equal at 8192^3, 1-11%
//                  slower elsewhere (h100-gemm-mma-spread.md).
//   mma_warp64_multicast  mma_warp64_tma in clusters of two blocks along M, each copying half of
//                  the B slab into both (TMA multicast), a slot refilled once both blocks released
//                  it: 8-11% slower at 8192^3, 6-19% elsewhere, in four versions of the coupling
//                  (h100-gemm-mma-multicast.md).
//
// ptxas -v for sm_90 (CUDA 13.0 ptxas on the NVRTC PTX; registers / static smem / spill bytes;
// the run records the driver's own figures per variant in `extra`):
//   naive 32 / 0 / 0            smem_tiled 32 / 8 KiB / 0       blocktile_1d 49 / 4 KiB / 0
//   blocktile_2d 128 / 8 KiB / 0  vectorized 118 / 8 KiB / 0    warptiled 246 / 32 KiB / 0
//   mma_ldmatrix 125 / 37 KiB / 0   mma_pipelined 170 / 0 (+128 KiB dynamic) / 0
//   mma_pipelined_wide 251 / 0 (+192 KiB dynamic) / 0
//   mma_warp64 238 / 0 (+64 KiB dynamic) / 0       mma_warp64_wide 238 / 0 (+120 KiB dynamic) / 0
//   mma_warp64_k64 242 / 0 (+192 KiB dynamic) / 0      mma_splitk 62 / 128 B (+72 KiB dynamic) / 0
//   (f16 and bf16 alike; sm_80: mma_warp64(_wide, _k64) 234 registers, no spills)
//   mma_warp64_tma for sm_90a: 208 / 0 (+197696 dynamic) / 0
//   mma_warp64_tail_split for sm_90a: 208 / 1 KiB (the last-to-arrive flag, 1024-aligned) (+197696
//   dynamic) / 0; its main loop 374 instructions against mma_warp64_tma's 368 (the K offset)
//   wgmma_tma for sm_90a: 168 / 0 (+197696 dynamic) / 0, no stack frame (the launch-time figure
//   for 384 threads; setmaxnreg then moves the producer to 40 and the consumers to 232)
//   wgmma_n128 for sm_90a: 90 / 0 (+99376 dynamic) / 0 (288 threads, two blocks per SM)
//   wgmma_n128_deep for sm_90a: 168 / 0 (+230512 dynamic) / 0 (384 threads; setmaxnreg 40 / 232)
//   wgmma_n64_deep for sm_90a: 168 / 0 (+222352 dynamic) / 0 (the same)
// Main loop in SASS (nvdisasm of the sm_90 cubin; instructions per loop trip / HMMA in it):
//   mma_ldmatrix 318 / 32 (9.9 per HMMA)   mma_pipelined 1033 / 64 (16.1)
//   mma_pipelined_wide 1798 / 128 (14.0)   (most of it load_chunk's per-chunk bounds and branches)
//   mma_warp64 144 / 64 (2.3; edge blocks 285)   mma_warp64_wide 134 / 64 (2.1; edge blocks 297)
//   mma_warp64_k64 234 / 128 (1.8; edge blocks 376): 32 ldmatrix, 12 cp.async, 1 barrier per trip
//   wgmma_tma (sm_90a cubin) consumer: ~91 per k-tile with 4 HGMMA.64x256x16.F32 (.tnspB), each
//   the work of 32 HMMA.16816 per warp: ~0.7 per HMMA-equivalent; accumulators R24-R151 in place.
// A warp scheduler issues one instruction per clock. If HMMA.16816 occupies an SMSP's tensor
// core for 8 clocks (A100's per-SM mma.sync rate; H100's is not documented), 16 instructions per
// HMMA cap the tensor cores at half rate from issue alone: 1024 flop/clock/SM, 268 TFLOP/s at
// 1.98 GHz, about where mma_pipelined measured (215-225); at 14 per HMMA, 306 for the wide rung
// (measured 238-259).
// Capping mma_pipelined at 128 registers (two blocks per SM) spills 60 bytes, so it is not;
// with one block per SM anyway, a fourth stage costs no occupancy and hides more latency.
#include "mma.cuh"

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ float epilogue(const T* c, float acc, float alpha, float beta) {
    float v = alpha * acc;
    if (beta != 0.f) v = fmaf(beta, to_float<T>(*c), v);
    return v;
}

template <typename T>
__device__ __forceinline__ void store_one(T* C, u64 idx, float acc, float alpha, float beta) {
    C[idx] = from_float<T>(epilogue(C + idx, acc, alpha, beta));
}

// Four floats at p, of which `rem` are in bounds (<= 0: none): one float4 load when all four are
// in and p is 16-byte aligned, else element loads with zero fill.
__device__ __forceinline__ float4 load4_guarded(const float* p, int rem) {
    if (rem >= 4 && aligned16(p)) return *reinterpret_cast<const float4*>(p);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (rem > 0) v.x = p[0];
    if (rem > 1) v.y = p[1];
    if (rem > 2) v.z = p[2];
    if (rem > 3) v.w = p[3];
    return v;
}

// Four consecutive outputs of one row, `rem` of them in bounds.
__device__ __forceinline__ void store4_guarded(float* c, int rem, const float* acc, float alpha, float beta) {
    if (rem >= 4 && aligned16(c)) {
        float4 v = make_float4(alpha * acc[0], alpha * acc[1], alpha * acc[2], alpha * acc[3]);
        if (beta != 0.f) {
            const float4 old = *reinterpret_cast<const float4*>(c);
            v.x = fmaf(beta, old.x, v.x);
            v.y = fmaf(beta, old.y, v.y);
            v.z = fmaf(beta, old.z, v.z);
            v.w = fmaf(beta, old.w, v.w);
        }
        *reinterpret_cast<float4*>(c) = v;
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
        if (j < rem) c[j] = epilogue(c + j, acc[j], alpha, beta);
}

// ---------------------------------------------------------------------------------------------
// 1. naive
// ---------------------------------------------------------------------------------------------

extern "C" __global__ void gemm_naive_f32(const float* __restrict__ A, const float* __restrict__ B, float* C, int M, int N,
                                          int K, int lda, int ldb, int ldc, float alpha, float beta) {
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int row = blockIdx.y * 8 + threadIdx.y;
    if (row >= M || col >= N) return;
    const float* a = A + (u64)row * lda;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc = fmaf(a[k], B[(u64)k * ldb + col], acc);
    store_one(C, (u64)row * ldc + col, acc, alpha, beta);
}

// ---------------------------------------------------------------------------------------------
// 2. smem_tiled: block (32,32), one output per thread.
// ---------------------------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(1024) gemm_smem_tiled_f32(const float* __restrict__ A, const float* __restrict__ B,
                                                                      float* C, int M, int N, int K, int lda, int ldb, int ldc,
                                                                      float alpha, float beta) {
    __shared__ float As[32][32];
    __shared__ float Bs[32][32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * 32 + ty, col = blockIdx.x * 32 + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += 32) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A[(u64)row * lda + k0 + tx] : 0.f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(u64)(k0 + ty) * ldb + col] : 0.f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 32; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);  // As: broadcast in a warp
        __syncthreads();
    }
    if (row < M && col < N) store_one(C, (u64)row * ldc + col, acc, alpha, beta);
}

// ---------------------------------------------------------------------------------------------
// 3a. blocktile_1d: 64x64 tile, BK = 8, 512 threads, TM = 8 outputs per thread (one column).
// ---------------------------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(512) gemm_blocktile_1d_f32(const float* __restrict__ A, const float* __restrict__ B,
                                                                       float* C, int M, int N, int K, int lda, int ldb, int ldc,
                                                                       float alpha, float beta) {
    constexpr int BM = 64, BN = 64, BK = 8, TM = 8;
    __shared__ float As[BM * BK];
    __shared__ float Bs[BK * BN];
    const int tid = threadIdx.x;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int tcol = tid % BN, trow = tid / BN;            // trow in 0..7: rows trow*8 .. +7
    const int arow = tid / BK, acol = tid % BK;            // one A element per thread
    const int brow = tid / BN, bcol = tid % BN;            // one B element per thread
    float acc[TM] = {0.f};
    for (int k0 = 0; k0 < K; k0 += BK) {
        As[arow * BK + acol] = (bm + arow < M && k0 + acol < K) ? A[(u64)(bm + arow) * lda + k0 + acol] : 0.f;
        Bs[brow * BN + bcol] = (k0 + brow < K && bn + bcol < N) ? B[(u64)(k0 + brow) * ldb + bn + bcol] : 0.f;
        __syncthreads();
#pragma unroll
        for (int d = 0; d < BK; ++d) {
            const float b = Bs[d * BN + tcol];
#pragma unroll
            for (int i = 0; i < TM; ++i) acc[i] = fmaf(As[(trow * TM + i) * BK + d], b, acc[i]);
        }
        __syncthreads();
    }
    const int col = bn + tcol;
    if (col >= N) return;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = bm + trow * TM + i;
        if (row < M) store_one(C, (u64)row * ldc + col, acc[i], alpha, beta);
    }
}

// ---------------------------------------------------------------------------------------------
// 3b. blocktile_2d: 128x128 tile, BK = 8, 256 threads, 8x8 outputs per thread.
// ---------------------------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(256) gemm_blocktile_2d_f32(const float* __restrict__ A, const float* __restrict__ B,
                                                                       float* C, int M, int N, int K, int lda, int ldb, int ldc,
                                                                       float alpha, float beta) {
    constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;
    __shared__ float As[BM * BK];
    __shared__ float Bs[BK * BN];
    const int tid = threadIdx.x;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int tcol = tid % (BN / TN), trow = tid / (BN / TN);
    const int arow = tid / BK, acol = tid % BK;  // rows arow + 32 * i
    const int brow = tid / BN, bcol = tid % BN;  // rows brow + 2 * i
    float acc[TM][TN] = {{0.f}};
    float rm[TM], rn[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int o = 0; o < BM; o += 32) {
            const int r = bm + arow + o, k = k0 + acol;
            As[(arow + o) * BK + acol] = (r < M && k < K) ? A[(u64)r * lda + k] : 0.f;
        }
#pragma unroll
        for (int o = 0; o < BK; o += 2) {
            const int k = k0 + brow + o, c = bn + bcol;
            Bs[(brow + o) * BN + bcol] = (k < K && c < N) ? B[(u64)k * ldb + c] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int d = 0; d < BK; ++d) {
#pragma unroll
            for (int i = 0; i < TM; ++i) rm[i] = As[(trow * TM + i) * BK + d];
#pragma unroll
            for (int j = 0; j < TN; ++j) rn[j] = Bs[d * BN + tcol * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(rm[i], rn[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = bm + trow * TM + i;
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = bn + tcol * TN + j;
            if (col < N) store_one(C, (u64)row * ldc + col, acc[i][j], alpha, beta);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. vectorized: blocktile_2d with float4 loads and A transposed in smem (As[k][m]).
// ---------------------------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(256) gemm_vectorized_f32(const float* __restrict__ A, const float* __restrict__ B,
                                                                     float* C, int M, int N, int K, int lda, int ldb, int ldc,
                                                                     float alpha, float beta) {
    constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;
    __shared__ __align__(16) float As[BK * BM];
    __shared__ __align__(16) float Bs[BK * BN];
    const int tid = threadIdx.x;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int tcol = tid % (BN / TN), trow = tid / (BN / TN);
    const int arow = tid / (BK / 4), acol = (tid % (BK / 4)) * 4;  // 128 rows x 2 float4
    const int brow = tid / (BN / 4), bcol = (tid % (BN / 4)) * 4;  // 8 rows x 32 float4
    float acc[TM][TN] = {{0.f}};
    float rm[TM], rn[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        {
            const int r = bm + arow;
            const float4 v = load4_guarded(A + (u64)min(r, M - 1) * lda + k0 + acol, r < M ? K - k0 - acol : 0);
            As[(acol + 0) * BM + arow] = v.x;
            As[(acol + 1) * BM + arow] = v.y;
            As[(acol + 2) * BM + arow] = v.z;
            As[(acol + 3) * BM + arow] = v.w;
        }
        {
            const int k = k0 + brow;
            const float4 v = load4_guarded(B + (u64)min(k, K - 1) * ldb + bn + bcol, k < K ? N - bn - bcol : 0);
            *reinterpret_cast<float4*>(&Bs[brow * BN + bcol]) = v;
        }
        __syncthreads();
#pragma unroll
        for (int d = 0; d < BK; ++d) {
            *reinterpret_cast<float4*>(&rm[0]) = *reinterpret_cast<const float4*>(&As[d * BM + trow * TM]);
            *reinterpret_cast<float4*>(&rm[4]) = *reinterpret_cast<const float4*>(&As[d * BM + trow * TM + 4]);
            *reinterpret_cast<float4*>(&rn[0]) = *reinterpret_cast<const float4*>(&Bs[d * BN + tcol * TN]);
            *reinterpret_cast<float4*>(&rn[4]) = *reinterpret_cast<const float4*>(&Bs[d * BN + tcol * TN + 4]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(rm[i], rn[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = bm + trow * TM + i;
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
            const int col = bn + tcol * TN + j;
            store4_guarded(C + (u64)row * ldc + col, N - col, &acc[i][j], alpha, beta);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 5. warptiled: 128x128x16 tile, 128 threads = 4 warps of 64x64; each thread 8 rows x (4 x 4
// columns) as WNITER = 4 subtiles 16 columns apart. Two smem buffers, next slab staged in
// registers while this one is computed.
// ---------------------------------------------------------------------------------------------

namespace wt {
constexpr int BM = 128, BN = 128, BK = 16, WM = 64, WN = 64, WNITER = 4, TM = 8, TN = 4;
constexpr int THREADS = 128;
constexpr int WSUBN = WN / WNITER;                     // 16
constexpr int A_LOADS = BM * BK / 4 / THREADS;         // 4 float4 per thread
constexpr int B_LOADS = BK * BN / 4 / THREADS;         // 4 float4 per thread
static_assert(WM * WN == 32 * TM * TN * WNITER, "one M subtile per warp");
static_assert(WSUBN == (32 / TM) * TN, "a warp row of threads spans one N subtile");
}  // namespace wt

extern "C" __global__ void __launch_bounds__(wt::THREADS) gemm_warptiled_f32(const float* __restrict__ A,
                                                                             const float* __restrict__ B, float* C, int M,
                                                                             int N, int K, int lda, int ldb, int ldc,
                                                                             float alpha, float beta) {
    using namespace wt;
    __shared__ __align__(16) float As[2][BK * BM];  // transposed: As[k][m]
    __shared__ __align__(16) float Bs[2][BK * BN];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int wrow = warp / (BN / WN), wcol = warp % (BN / WN);
    const int trow = lane / (WSUBN / TN), tcol = lane % (WSUBN / TN);  // 8 x 4 threads per subtile
    const int arow = tid / (BK / 4), acol = (tid % (BK / 4)) * 4;       // rows arow + 32 i
    const int brow = tid / (BN / 4), bcol = (tid % (BN / 4)) * 4;       // rows brow + 4 i
    float4 ra[A_LOADS], rb[B_LOADS];
    auto load_global = [&](int k0) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int r = bm + arow + i * (THREADS / (BK / 4));
            ra[i] = load4_guarded(A + (u64)min(r, M - 1) * lda + k0 + acol, r < M ? K - k0 - acol : 0);
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int k = k0 + brow + i * (THREADS / (BN / 4));
            rb[i] = load4_guarded(B + (u64)min(k, K - 1) * ldb + bn + bcol, k < K ? N - bn - bcol : 0);
        }
    };
    auto store_smem = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int r = arow + i * (THREADS / (BK / 4));
            As[buf][(acol + 0) * BM + r] = ra[i].x;
            As[buf][(acol + 1) * BM + r] = ra[i].y;
            As[buf][(acol + 2) * BM + r] = ra[i].z;
            As[buf][(acol + 3) * BM + r] = ra[i].w;
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i)
            *reinterpret_cast<float4*>(&Bs[buf][(brow + i * (THREADS / (BN / 4))) * BN + bcol]) = rb[i];
    };
    float acc[TM][WNITER * TN] = {{0.f}};
    float rm[TM], rn[WNITER * TN];
    const int nk = (K + BK - 1) / BK;
    load_global(0);
    store_smem(0);
    __syncthreads();
    for (int kt = 0; kt < nk; ++kt) {
        const int buf = kt & 1;
        if (kt + 1 < nk) load_global((kt + 1) * BK);  // in flight during the FMAs below
#pragma unroll
        for (int d = 0; d < BK; ++d) {
            const float* as = &As[buf][d * BM + wrow * WM + trow * TM];
            *reinterpret_cast<float4*>(&rm[0]) = *reinterpret_cast<const float4*>(as);
            *reinterpret_cast<float4*>(&rm[4]) = *reinterpret_cast<const float4*>(as + 4);
#pragma unroll
            for (int s = 0; s < WNITER; ++s)
                *reinterpret_cast<float4*>(&rn[s * TN]) =
                    *reinterpret_cast<const float4*>(&Bs[buf][d * BN + wcol * WN + s * WSUBN + tcol * TN]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < WNITER * TN; ++j) acc[i][j] = fmaf(rm[i], rn[j], acc[i][j]);
        }
        // The other buffer was last read before the previous barrier: safe to overwrite.
        if (kt + 1 < nk) store_smem(buf ^ 1);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = bm + wrow * WM + trow * TM + i;
        if (row >= M) continue;
#pragma unroll
        for (int s = 0; s < WNITER; ++s) {
            const int col = bn + wcol * WN + s * WSUBN + tcol * TN;
            store4_guarded(C + (u64)row * ldc + col, N - col, &acc[i][s * TN], alpha, beta);
        }
    }
}
