// ---------------------------------------------------------------------------
// W4A16 on tensor cores, one load round per warp: w4a16_mma_splitk_{sym,asym}_b{B}_f16.
// The same warp step as w4a16_mma (w4a16_mma_warp: 16-row tile, U steps of 16 B codes per lane
// issued before any is decoded, decoded to f16, mma.sync), but K is split so finely that a warp
// owns at most U steps: it issues every load it will ever make in one round, waits for one DRAM
// round trip, decodes, and is done. A tile's K is spread over gridDim.y = S blocks of 4 warps
// (S = ceil(nsteps / (4 U)), chosen by the launcher; the kernel is correct for any S: a warp's
// slice is ceil(nsteps / 4S) steps, in rounds of U). Each block sums its 4 warps in shared memory
// (warp order) and writes one fp32 partial per (slice, batch, row) to a workspace
// ws[S][B][N]; the last block of a tile to arrive (a per-tile counter) adds the S partials in
// slice order, writes Y in f16 and resets the counter for the next launch. S = 1 (K <= 2048,
// or K <= 1536 at B = 16) writes Y directly. The sum order is fixed: results are reproducible.
// Napkin math (H100 SXM, N = K = 8192, 132 SMs, 3.02 TB/s copy ceiling):
// - nsteps = 64 steps of 128 weights; B <= 8: U = 4, S = 4, a grid of 512 x 4 = 2048 blocks,
//   B = 16: U = 3, S = 6, 3072 blocks. __launch_bounds__(128, 4): 4 blocks (16 warps) per SM,
//   528 slots: 3.9 waves (5.8 at B = 16) of blocks that live one round trip each.
// - Bytes in flight: 4 KB of codes per warp (3 KB at B = 16), 64 KB per SM (48 KB), 8.4 MB
//   GPU-wide: 4x Little's ~16 KB per SM. A single wave with every load up front is out of reach
//   in registers: the whole register file (132 x 256 KB = 33.8 MB) is the size of W (32 MiB of
//   codes); what changes against w4a16_mma is that a round belongs to a block, and a finished
//   block's slot is refilled at once by one that issues all its loads, rather than a warp
//   walking 4 rounds of its quarter of K behind its own decode.
// - Workspace: 4 B x S x B x N written and read back (128 KB at B = 1, 3.1 MB at B = 16), from L2.
// - Expected: ~1 round trip (~1 us loaded) + 34.6 MB at ~2.7 TB/s (cuBLAS's sustained GEMV rate)
//   = 12.8 us, + ~1 us for the last wave and the finishing blocks: ~14.5 us at B = 1..4,
//   ~15 us at B = 8, ~18 us at B = 16 (twice the MMAs, 6 waves, 3 KB per warp).
// ptxas -v, sm_90 (CUDA 13.0; registers / static smem, no spills in any):
//   sym  b1 b2 b4 b8 b16 117 / 257-4097 B
//   asym b1 124, b2 b4 127, b8 124, b16 122 / 257-4097 B   (w4a16_mma after the shared warp step
//   was factored out: unchanged, 115 / 127 / 105 / 116)
// ---------------------------------------------------------------------------
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_splitk(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                                 const __half* __restrict__ x, __half* __restrict__ y, float* __restrict__ ws,
                                                 unsigned* __restrict__ done, int n_rows, int k, int group) {
    __shared__ float part[MMA_WARPS][B][MMA_ROWS];
    const int warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * MMA_ROWS;
    const int slices = gridDim.y, s = blockIdx.y;
    const int nsteps = (k / 32 + 3) / 4;
    // Warp w of slice s owns steps [t0, t1): slices x 4 contiguous slices of K, in slice-major order.
    const int per = (nsteps + MMA_WARPS * slices - 1) / (MMA_WARPS * slices);
    const int t0 = (s * MMA_WARPS + warp) * per, t1 = min(t0 + per, nsteps);
    w4a16_mma_warp<B, ASYM>(wq, scales, mins, x, n_rows, k, group, row0, t0, t1, part[warp]);
    __syncthreads();
    if (slices == 1) {
        mma_store_y<B, MMA_WARPS>(part, y, n_rows, row0);
        return;
    }
    for (int i = threadIdx.x; i < B * MMA_ROWS; i += 32 * MMA_WARPS) {
        const int b = i / MMA_ROWS, r = i % MMA_ROWS;
        if (row0 + r < n_rows) ws[((long long)s * B + b) * n_rows + row0 + r] = mma_block_sum<B>(part, i);
    }
    // The tile's last block finishes it.
    if (!last_to_arrive(done + blockIdx.x, slices)) return;
    for (int i = threadIdx.x; i < B * MMA_ROWS; i += 32 * MMA_WARPS) {
        const int b = i / MMA_ROWS, r = i % MMA_ROWS;
        if (row0 + r < n_rows) {
            float acc = 0.f;
            for (int v = 0; v < slices; ++v) acc += __ldcg(ws + ((long long)v * B + b) * n_rows + row0 + r);
            y[(long long)b * n_rows + row0 + r] = __float2half_rn(acc);
        }
    }
    if (threadIdx.x == 0) done[blockIdx.x] = 0u;  // ready for the next launch
}

#define W4A16_MMA_SPLITK(B)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS, 4) quant_w4a16_mma_splitk_sym_b##B##_f16(                  \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ x, __half* __restrict__ y, \
        float* __restrict__ ws, unsigned* __restrict__ done, int n_rows, int k, int group) {                                \
        w4a16_mma_splitk<B, false>(wq, scales, scales, x, y, ws, done, n_rows, k, group);                                   \
    }                                                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS, 4) quant_w4a16_mma_splitk_asym_b##B##_f16(                 \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,                      \
        const __half* __restrict__ x, __half* __restrict__ y, float* __restrict__ ws, unsigned* __restrict__ done,          \
        int n_rows, int k, int group) {                                                                                     \
        w4a16_mma_splitk<B, true>(wq, scales, mins, x, y, ws, done, n_rows, k, group);                                      \
    }

W4A16_MMA_SPLITK(1)
W4A16_MMA_SPLITK(2)
W4A16_MMA_SPLITK(4)
W4A16_MMA_SPLITK(8)
W4A16_MMA_SPLITK(16)
