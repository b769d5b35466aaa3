// ---------------------------------------------------------------------------
// W4A16 on tensor cores, weights staged through shared memory: w4a16_mma_pipelined_{sym,asym}_b{B}_f16.
// w4a16_mma keeps its bytes in flight in registers (115-127 per thread, 4 warps per tile, 8-16
// warps per SM; ncu: 27-37% of DRAM peak, 12-22% occupancy). Here a block's loads land in a
// ring of PIPE_STAGES shared-memory stages filled by cp.async.cg (16 B, L2 only), so the bytes
// in flight cost no registers, and the warps decode from shared memory with the same step
// (w4a16_mma_step: f16 decode, mma.sync m16n8k16, X through L1 with __ldg).
// - Stage: one 16-row tile x PIPE_CHUNKS = 32 chunks (1024 weights) of K: 8 KB of codes, row r's
//   chunk jl at slot r * 32 + (jl ^ 4 (r & 1)) (rows g and g + 1 of one quarter-warp's 16 B
//   reads land in different 64 B halves of the bank row: no conflicts), then per row
//   PIPE_SVECS = 5 aligned 16 B vectors of scales (and of mins) starting at the vector holding
//   the stage's first group: 32 chunks touch at most 32 groups (group 32), 7 + 32 <= 40 halves.
//   8192 + 1280 B (sym) / 8192 + 2560 B (asym) per stage; 8 stages: 75776 / 86016 B dynamic.
// - Block: 8 warps; warp w decodes step w of each stage (4 chunks, 128 weights of 16 rows).
//   The block walks its tiles' stages as one sequence (tile-major), issuing stage s + 7 while
//   it decodes stage s (cp.async.wait_group 6, one barrier per stage), so the ring stays full
//   across tile boundaries; at a tile's last stage the 8 warps' partials meet in shared memory
//   (warp order) and the tile's 16 rows of Y are written.
// - Grid: persistent, PIPE_BLOCKS_PER_SM = 2 blocks per SM (smem 2 x (86 KB + 8.5 KB) and
//   registers 2 x 256 x 128 = the whole file): tiles per block tpb = ceil(tiles / (2 x SMs)),
//   grid = ceil(tiles / tpb), contiguous tiles per block, so every block does the same number
//   of tiles (no tail of a partial wave): N = 8192: 512 tiles, 256 blocks x 2 tiles (32 stages
//   each); N = 4096: 256 blocks x 1 tile; N = 11008: 688 tiles, 230 blocks x 3.
// - Bytes in flight: 7 stages x 8 KB = 56 KB per block, 112 KB per SM, 14 MB GPU-wide at
//   N = K = 8192 (Little's law asks ~16 KB per SM at 3 TB/s x 0.7 us; w4a16_mma had ~62 KB per
//   SM on paper but only between decode phases).
// - Issue: the same ~200 instructions per warp step as w4a16_mma (~6.4 us per SM at B = 1 on
//   8192 x 8192, ~10.6 us at B = 16), now beside a stream that no longer waits on it, 16 warps
//   per SM (4 per scheduler). LDS: 2 x 16 B of codes per lane per step, conflict-free.
// - Expected, 8192 x 8192 g128: ~1.5 us to fill the ring + 34.6 MB at ~2.7 TB/s = ~14 us at
//   B = 1..4, ~15 us at B = 8, ~18 us at B = 16 (issue-bound, X from L2).
// lab/src/quant/w4a16_mma_model.rs mirrors the stage layout, the scale window and the walk.
// ptxas -v, sm_90 (CUDA 13.0; registers / static smem, no spills in any; dynamic smem 75776 B
// sym, 86016 B asym, raised above 48 KiB by the launcher):
//   sym  b1 b2 b4 b8 93 / 512-4096 B   b16 102 / 8 KiB
//   asym b1 b2 b8 96, b4 95 / 512-4096 B   b16 104 / 8 KiB
//   (w4a16_mma and w4a16_mma_splitk after w4a16_mma_step was factored out: unchanged)
// ---------------------------------------------------------------------------
#define PIPE_WARPS 8
#define PIPE_CHUNKS 32
#define PIPE_STAGES 8
#define PIPE_SVECS 5
#define PIPE_BLOCKS_PER_SM 2

// 16 B vectors of one stage: codes, then scales (and mins) per row.
template <bool ASYM>
struct PipeStage {
    static constexpr int CODES = MMA_ROWS * PIPE_CHUNKS;
    static constexpr int VECS = CODES + (ASYM ? 2 : 1) * MMA_ROWS * PIPE_SVECS;
};

// Slot of row r's chunk jl (0..PIPE_CHUNKS) in a stage.
__device__ __forceinline__ int pipe_code_slot(int r, int jl) { return r * PIPE_CHUNKS + (jl ^ ((r & 1) << 2)); }

// First scale (in halves) of the 16 B vector holding row `row`'s group g0: the stage's window.
__device__ __forceinline__ long long pipe_scale_base(long long row, int gpr, int g0) { return (row * gpr + g0) / 8 * 8; }

// Copies of one stage (tile at row0, chunks [s0, s0 + PIPE_CHUNKS)) into `st`, spread over the
// block's threads; chunks past K and vectors past the scales are zero-filled (src-size 0), the
// partial last vector of the scales by cp_async16_tail.
template <bool ASYM>
__device__ __forceinline__ void pipe_issue(uint4* st, const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                           int n_rows, int k, int gpr, int cpg, int row0, int s0) {
    const int nchunks = k / 32;
    for (int i = threadIdx.x; i < PipeStage<ASYM>::CODES; i += 32 * PIPE_WARPS) {
        const int r = i / PIPE_CHUNKS, jl = i % PIPE_CHUNKS, j = s0 + jl;
        const long long row = min(row0 + r, n_rows - 1);  // clamped rows are never stored
        const bool ok = j < nchunks;
        cp_async16(st + pipe_code_slot(r, jl), wq + row * (k / 2) + 16LL * (ok ? j : 0), ok ? 16 : 0);
    }
    const long long total = 2LL * n_rows * gpr;  // bytes of scales (and of mins)
    const int g0 = s0 / cpg;
    for (int i = threadIdx.x; i < PipeStage<ASYM>::VECS - PipeStage<ASYM>::CODES; i += 32 * PIPE_WARPS) {
        const int which = i / (MMA_ROWS * PIPE_SVECS), r = i / PIPE_SVECS % MMA_ROWS, v = i % PIPE_SVECS;
        const long long row = min(row0 + r, n_rows - 1);
        const long long off = 2 * pipe_scale_base(row, gpr, g0) + 16LL * v;
        const long long bytes = max(0LL, min(16LL, total - off));
        const u8* src = reinterpret_cast<const u8*>(which ? mins : scales);
        cp_async16_tail(st + PipeStage<ASYM>::CODES + i, src + (bytes > 0 ? off : 0), (int)bytes);
    }
}

// A scale (or min) of row r's group grp from the stage's window, as f16x2; 0 past K.
__device__ __forceinline__ unsigned pipe_splat(const uint4* win, int r, long long row, int gpr, int g0, int grp, bool ok) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(win + r * PIPE_SVECS);
    const unsigned s = ok ? (unsigned)h[row * gpr + grp - pipe_scale_base(row, gpr, g0)] : 0u;
    return s | (s << 16);
}

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_pipelined(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                                    const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {
    extern __shared__ uint4 ring[];
    __shared__ float part[PIPE_WARPS][B][MMA_ROWS];
    constexpr int VECS = PipeStage<ASYM>::VECS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int nchunks = k / 32, cpg = group / 32, gpr = k / group;
    const int nst = (nchunks + PIPE_CHUNKS - 1) / PIPE_CHUNKS;  // stages per tile
    const int tiles = (n_rows + MMA_ROWS - 1) / MMA_ROWS;
    const int tpb = (tiles + gridDim.x - 1) / gridDim.x;
    const int tile0 = blockIdx.x * tpb, ntiles = max(0, min(tpb, tiles - tile0));
    const int total = ntiles * nst;  // this block's stages, tile-major
    // Stage p of the walk: tile tile0 + p / nst, chunks from (p % nst) * PIPE_CHUNKS.
#pragma unroll
    for (int p = 0; p < PIPE_STAGES - 1; ++p) {
        if (p < total) pipe_issue<ASYM>(ring + p * VECS, wq, scales, mins, n_rows, k, gpr, cpg, (tile0 + p / nst) * MMA_ROWS, p % nst * PIPE_CHUNKS);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    MmaAcc<B> acc;
    acc.zero();
    for (int p = 0; p < total; ++p) {
        asm volatile("cp.async.wait_group %0;" ::"n"(PIPE_STAGES - 2) : "memory");
        __syncthreads();  // stage p landed for every thread; stage p - 1's slot is free
        const int q = p + PIPE_STAGES - 1;
        if (q < total) pipe_issue<ASYM>(ring + q % PIPE_STAGES * VECS, wq, scales, mins, n_rows, k, gpr, cpg, (tile0 + q / nst) * MMA_ROWS, q % nst * PIPE_CHUNKS);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const uint4* st = ring + p % PIPE_STAGES * VECS;
        const int row0 = (tile0 + p / nst) * MMA_ROWS, s0 = p % nst * PIPE_CHUNKS, g0 = s0 / cpg;
        const long long rg = min(row0 + g, n_rows - 1), rh = min(row0 + g + 8, n_rows - 1);
        for (int tl = warp; tl < PIPE_CHUNKS / 4 && s0 + 4 * tl < nchunks; tl += PIPE_WARPS) {  // warp-uniform
            const int jl = 4 * tl + c, j = s0 + jl, grp = j / cpg;
            const bool ok = j < nchunks;
            const uint4* win = st + PipeStage<ASYM>::CODES;
            const unsigned dg = pipe_splat(win, g, rg, gpr, g0, grp, ok), dh = pipe_splat(win, g + 8, rh, gpr, g0, grp, ok);
            const unsigned m2g = ASYM ? pipe_splat(win + MMA_ROWS * PIPE_SVECS, g, rg, gpr, g0, grp, ok) : 0u;
            const unsigned m2h = ASYM ? pipe_splat(win + MMA_ROWS * PIPE_SVECS, g + 8, rh, gpr, g0, grp, ok) : 0u;
            w4a16_mma_step<B, ASYM>(acc, st[pipe_code_slot(g, jl)], st[pipe_code_slot(g + 8, jl)], dg, dh, m2g, m2h, x, k, j, nchunks, g);
        }
        if (p % nst == nst - 1) {  // the tile's last stage: sum the warps in warp order, write Y
            mma_store_part<B>(acc, part[warp], g, c);
            acc.zero();
            __syncthreads();
            for (int i = threadIdx.x; i < B * MMA_ROWS; i += 32 * PIPE_WARPS) {
                const int b = i / MMA_ROWS, r = i % MMA_ROWS;
                float s = 0.f;
#pragma unroll
                for (int w = 0; w < PIPE_WARPS; ++w) s += part[w][b][r];
                if (row0 + r < n_rows) y[(long long)b * n_rows + row0 + r] = __float2half_rn(s);
            }
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

W4A16_RUNG(w4a16_mma_pipelined, w4a16_mma_pipelined, 32 * PIPE_WARPS, PIPE_BLOCKS_PER_SM)
