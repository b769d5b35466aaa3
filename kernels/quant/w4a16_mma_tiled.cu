// w4a16_mma_occ8_{sym,asym}_b{B}_f16: w4a16_mma with K split over 8 warps instead of 4 and 2
// steps in flight per warp instead of 4, so that a thread fits in 64 registers: 4 blocks of 8
// warps (32 warps) share an SM instead of 4 blocks of 4. Nsight Compute found w4a16_mma
// latency-bound at a quarter occupancy (4 warps per scheduler, 10 cycles between a warp's
// issues, 51% of DRAM peak); at 8192 rows its 512 blocks of 4 warps are all the warps there are.
// This rung has twice the warps for the same bytes in flight per SM (32 warps x 2 KB).
// ptxas -v, sm_90 (CUDA 13.0): 64 registers, no spills, sym and asym, every batch.
// Steps in flight: 2, and 1 at B = 8 (sym at 2 spills 4 bytes at the 64-register cap; B = 16 at 1
// spills, at 2 does not).
#define OCC8_STEPS(B) ((B) == 8 ? 1 : 2)
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_occ8(W4A16_ARGS) {
    w4a16_mma<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_occ8, w4a16_mma_occ8, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_{sym,asym}_b{B}_f16: w4a16_mma_occ8 reading W in the tile layout
// (lab/src/quant/tiles.rs), where every warp load is 512 contiguous bytes. In the row-major
// layout a warp's 16 B load touches 8 rows x 64 B, 4 KB apart; reading 32 MiB in that pattern
// alone (no decode) takes as long as the whole w4a16_mma kernel (~22 us on an H100), against
// ~15 us when each warp load reads 512 contiguous bytes: the access pattern, not the decode,
// held every earlier rung. The tile layout stores, per 16-row tile, one 1 KB block per step of
// 128 weights: first each lane's 16 B of row g = lane / 4 (chunk 4t + lane % 4), then of row
// g + 8, lanes in order; so a lane loads exactly the two chunks w4a16_mma_step decodes, and a
// warp's step is 1 KB contiguous. Scales (mins): 16 per (tile, group), as (row r, row r + 8) pairs.
// Tiles past N and chunks past K are zero in the layout and never loaded or stored.
// ptxas -v, sm_90: 64 registers; spills: sym b16 8 B, asym b1 4 B, b2 b4 b16 8 B, none elsewhere.
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled(W4A16_ARGS) {
    w4a16_mma<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, true>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled, w4a16_mma_tiled, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_rolling_{sym,asym}_b{B}_f16: w4a16_mma_tiled with the loads rolling instead
// of in rounds. A round-based warp issues its U steps, waits, decodes them, and has nothing in
// flight while it decodes the last; here each slot is refilled with the step U ahead as soon as
// its step is decoded, so a warp always has loads in flight.
// ptxas -v, sm_90: 63-64 registers, no spills at b1-b8; b16 spills 16 B (sym) and 100 B (asym).
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_rolling(W4A16_ARGS) {
    w4a16_mma<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, true, true>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_rolling, w4a16_mma_tiled_rolling, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_prefetch_{sym,asym}_b{B}_f16: w4a16_mma_tiled with each warp's next round
// fetched into L2 while it decodes this one, by bulk prefetches (cp.async.bulk.prefetch.L2, one
// instruction per 1 KB step from lane 0, PREFETCH_STEPS ahead of the step it issues; the slice's
// scales at the start). Nsight Compute found w4a16_mma_tiled latency-bound: DRAM at 62% of peak,
// no warp ready in 44% of the scheduler cycles, each warp waiting on its own 2 steps from DRAM.
// Here a round's loads find their bytes in L2. (8 steps ahead, which at N = K = 8192 requests
// the whole matrix at the start, was 29% slower than no prefetch: DRAM then returns the bytes
// in no useful order, and the decode waits for the last of them.)
#define PREFETCH_STEPS 2
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_prefetch(W4A16_ARGS) {
    w4a16_mma<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, true, false, PREFETCH_STEPS>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_prefetch, w4a16_mma_tiled_prefetch, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_post_{sym,asym}_b{B}_f16: w4a16_mma_tiled with the scales applied after the
// MMAs (w4a16_mma_step_post) where a step lies in one group: symmetric codes, group % 128 == 0.
// Other groups, and asymmetric codes, run w4a16_mma_tiled's step (the asym kernels are
// w4a16_mma_tiled's). The SASS of w4a16_mma_tiled_sym_b1 spends 128 of its 417 instructions per
// round on HFMA2; here the decode is the LOP3 alone.
// A tiled rung with U steps per warp, W warps, loads rolling or in rounds, contiguous slices
// or sweeping warps, that applies the scales after the MMAs where it can (symmetric codes,
// group % 128 == 0) and inside them elsewhere.
template <int B, bool ASYM, int U, int W, bool ROLL, bool SWEEP>
__device__ __forceinline__ void w4a16_mma_tiled_post_where_possible(W4A16_ARGS) {
    if constexpr (!ASYM) {
        if (group % 128 == 0) {
            w4a16_mma<B, false, U, W, true, ROLL, 0, true, SWEEP>(wq, scales, mins, x, y, n_rows, k, group);
            return;
        }
    }
    w4a16_mma<B, ASYM, U, W, true, ROLL, 0, false, SWEEP>(wq, scales, mins, x, y, n_rows, k, group);
}

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_post(W4A16_ARGS) {
    w4a16_mma_tiled_post_where_possible<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, false, false>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_post, w4a16_mma_tiled_post, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_sweep_{sym,asym}_b{B}_f16: w4a16_mma_tiled_post with the block's warps taking
// its tile's steps in turn (warp w: steps w, w + 8, ...) instead of one contiguous slice each,
// on the step-major tile layout (lab/src/quant/tiles.rs: step t of every tile, tile after tile,
// before step t + 1). Every way of keeping more steps in flight per warp lost to 2 steps in
// rounds (rolling loads, rings in shared memory, L2 prefetch, TMA): with contiguous slices an
// SM's 32 warps each stream a different part of W, 4096 streams spread over all of it. The
// copy-style read that reaches the floor sweeps memory in order with the whole grid. Here the
// blocks, all resident at once and each taking its tile's steps in order, read one window of
// the step-major layout that moves through W from end to end. The warps' partial sums change
// order (still fixed: reproducible). Measured within the run-to-run spread of _post (see
// reports/notes/h100-w4a16-bulk.md).
// ptxas -v, sm_90: 64 registers; no spills but sym b16 (252 B) and asym b16 (16 B).
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_sweep(W4A16_ARGS) {
    w4a16_mma_tiled_post_where_possible<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, false, true>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_sweep, w4a16_mma_tiled_sweep, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_sweep4_{sym,asym}_b{B}_f16: w4a16_mma_tiled_sweep with 4 warps per block (warp
// w: steps w, w + 4, ...) at up to 128 registers, and MmaSteps<B>::U steps per warp rolling (a
// slot refilled with the step U ahead as soon as its step is decoded). _sweep's warps hold 2
// steps each in rounds, none in flight while they decode the second; here each warp keeps U - 1
// to U steps in flight at all times: 16 warps x 3-4 KB per SM, continuously. Measured slower at
// batch 1-8 (8192 x 8192 b1: 22.4 us against 18.3) and faster at 16 (30.8 against 43.1): with
// half the warps the decode's latency is hidden less (reports/notes/h100-w4a16-read-floor.md).
// ptxas -v, sm_90: 118-128 registers; no spills but sym b16 (16 B).
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_sweep4(W4A16_ARGS) {
    w4a16_mma_tiled_post_where_possible<B, ASYM, MmaSteps<B>::U, MMA_WARPS, true, true>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_sweep4, w4a16_mma_tiled_sweep4, 32 * MMA_WARPS, 4)
