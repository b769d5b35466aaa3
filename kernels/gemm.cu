// gemm: C = alpha * A B + beta * C, row-major A (M x K, leading dim lda), B (K x N, ldb),
// C (M x N, ldc). fp32 variants are SIMT; fp16/bf16 variants read fp16/bf16, accumulate in fp32
// and write C in the input dtype (as cuBLAS gemm_ex with CUBLAS_COMPUTE_32F does), alpha and beta
// in fp32. beta == 0 never reads C (so a NaN-poisoned C is overwritten, as BLAS specifies).
// Every variant takes any M, N, K >= 1: edge tiles are zero-filled on load and predicated on
// store; 16-byte loads fall back to element loads where a chunk straddles the edge or its address
// is not 16-byte aligned (odd K, N or leading dimensions), so no shape is refused.
//
// Ladder (symbol gemm_<variant>_<dtype>; launch shapes in lab/src/ops/gemm.rs launch_config):
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
#include "common.cuh"

typedef unsigned long long u64;

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

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<u64>(p) & 15) == 0; }

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

// ---------------------------------------------------------------------------------------------
// Tensor-core pieces (fp16 / bf16 in, fp32 accumulate). Fragment layouts of m16n8k16 (PTX ISA,
// "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A (16x16, row): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16x8, col):  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C (16x8, f32):  c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, and register i of every
// lane receives matrix i at (row lane/4, cols 2(lane%4)..+1) -- with .trans, at (rows
// 2(lane%4)..+1, col lane/4), which turns k-major B rows into the b0/b1 pairs.
// So A: lane l points at (row l%16, col 8(l/16)) -> a0..a3 in order; B (k x n in smem): lane l
// points at (k l%16, n 8(l/16)) -> {b0, b1} of n-tile 0, then {b0, b1} of n-tile 1.
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
// 6. mma_ldmatrix: 128x128x32 tile, 8 warps (2 along M x 4 along N) of 64x32. Padded rows (+8
// halves = 16 bytes) put the 8 row addresses of each ldmatrix phase in 8 distinct bank groups.
// ---------------------------------------------------------------------------------------------

namespace tc1 {
constexpr int BM = 128, BN = 128, BK = 32, WM = 64, WN = 32, THREADS = 256;
constexpr int MI = WM / 16, NI = WN / 8;               // 4 x 4 mma tiles per warp
constexpr int LDA_S = BK + 8, LDB_S = BN + 8;          // padded smem row lengths (halves)
constexpr int A_CHUNKS = BM * BK / 8 / THREADS;        // 2 x 16 bytes per thread
constexpr int B_CHUNKS = BK * BN / 8 / THREADS;        // 2
}  // namespace tc1

template <typename T>
__device__ __forceinline__ void mma_ldmatrix_body(const T* __restrict__ A, const T* __restrict__ B, T* C, int M, int N,
                                                  int K, int lda, int ldb, int ldc, float alpha, float beta) {
    using namespace tc1;
    __shared__ __align__(16) T As[2][BM * LDA_S];
    __shared__ __align__(16) T Bs[2][BK * LDB_S];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int wm = (warp / (BN / WN)) * WM, wn = (warp % (BN / WN)) * WN;
    uint4 ra[A_CHUNKS], rb[B_CHUNKS];
    auto load_global = [&](int k0) {
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int c = tid + i * THREADS, r = c / (BK / 8), kc = (c % (BK / 8)) * 8;
            const int gr = bm + r;
            ra[i] = load8_guarded(A + (u64)min(gr, M - 1) * lda + k0 + kc, gr < M ? K - k0 - kc : 0);
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
            *reinterpret_cast<uint4*>(&As[buf][(c / (BK / 8)) * LDA_S + (c % (BK / 8)) * 8]) = ra[i];
        }
#pragma unroll
        for (int i = 0; i < B_CHUNKS; ++i) {
            const int c = tid + i * THREADS;
            *reinterpret_cast<uint4*>(&Bs[buf][(c / (BN / 8)) * LDB_S + (c % (BN / 8)) * 8]) = rb[i];
        }
    };
    float acc[MI][NI][4] = {};
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
            for (int i = 0; i < MI; ++i)
                ldmatrix_x4(a[i], smem_addr(&As[buf][(wm + i * 16 + lane % 16) * LDA_S + ks * 16 + (lane / 16) * 8]));
#pragma unroll
            for (int j = 0; j < NI; j += 2) {
                unsigned r[4];
                ldmatrix_x4_trans(r, smem_addr(&Bs[buf][(ks * 16 + lane % 16) * LDB_S + wn + j * 8 + (lane / 16) * 8]));
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
    store_acc<T, MI, NI>(C, M, N, ldc, bm + wm, bn + wn, acc, alpha, beta);
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

// 16 bytes global -> shared, bypassing L1; src_bytes < 16 zero-fills the rest (0: all zeros).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

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
        for (int i = 0; i < MI; ++i) ldmatrix_x4(a[i], sa + swz(wm + i * 16 + lane % 16, ks * 2 + lane / 16, P::A_CPR));
#pragma unroll
        for (int j = 0; j < NI; j += 2) {
            unsigned r[4];
            ldmatrix_x4_trans(r, sb + swz(ks * 16 + lane % 16, (wn + j * 8) / 8 + lane / 16, P::B_CPR));
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
    // Reader: lane offsets of the ldmatrix rows (see the derivation in the test mirror).
    // A, m16 tile i, k16 step ks: row wm + 16 i + lane % 16, chunk 2 ks + lane / 16; the XOR term
    // ((lane % 16) / 2 for 64-byte rows, lane % 8 for 128-byte rows) does not depend on i or ks,
    // and the chunk bits of 2 ks are free of lane / 16, so the offset is a_lane ^ (32 ks) plus 16 i rows.
    const int a_lane = swz_a<BK>(wm + lane % 16, lane / 16);
    // B, n8 pair jp (0, 2, 4, 6), step ks: row 16 ks + lane % 16, chunk wn / 8 + jp + lane / 16;
    // the offset is (b_lane ^ 16 jp) plus 16 ks rows.
    const int b_lane = P::A_BYTES + swz(lane % 16, wn / 8 + lane / 16, P::B_CPR);
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

// A CUtensorMap as cuTensorMapEncodeTiled writes it on the host: 128 opaque bytes, passed by value
// as a __grid_constant__ parameter (TMA reads it from parameter space; 64-byte alignment).
struct __align__(64) TmaDesc {
    unsigned long long opaque[16];
};

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
// 512), so its lane offset is swz(lane % 16, lane / 16, 8) in that box and a k16 step 2048 bytes.
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
// the SM count (tail_plan in gemm.rs). A split block stores its fp32 partial tile in its own
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
    const int a_lane = swz(wm + lane % 16, lane / 16, 8);
    const int b_lane = P::A_BYTES + (wn / P::B_BOX_N) * P::B_BOX_BYTES + swz(lane % 16, lane / 16, 8);
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
