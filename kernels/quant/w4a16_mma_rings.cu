// ---------------------------------------------------------------------------
// w4a16_mma_tiled_async_{sym,asym}_b{B}_f16: w4a16_mma_tiled with its loads staged through
// shared memory by cp.async, so that the bytes in flight cost no registers. Each lane copies
// exactly what it would have loaded (its 16 B of rows g and g + 8, and the 4 B words holding
// their scales, and mins) into its own slots of a per-warp ring of RING_STEPS steps, and reads
// back only what it copied itself: cp.async.wait_group orders a lane's own copies, so neither a
// barrier nor a warp sync is needed. A slot is refilled with the step RING_STEPS ahead as soon as
// its step has been read, so RING_STEPS - 1 steps stay in flight per warp while it decodes
// (w4a16_mma_tiled: 2 in rounds). Chunks past K (and steps past the warp's slice) are copied
// with a source size of 0, which zero-fills them, as the register rungs feed zeros.
// Slot (1152 B sym, 1280 B asym): codes [2][32] x 16 B, then the lanes' scale pairs [32] x 4 B,
// then their min pairs; 32 consecutive lanes on consecutive 16 B (or 4 B): no bank conflicts.
// Dynamic smem per block: 8 warps x RING_STEPS x slot = 36 KB sym, 40 KB asym at 4 steps:
// 4 blocks per SM fit (the launcher prefers the whole carveout as shared memory).
// ptxas -v, sm_90: 64 registers, no spills at any batch.
// ---------------------------------------------------------------------------
#define RING_STEPS 4

template <bool ASYM>
struct RingSlot {
    static constexpr int BYTES = 1024 + (ASYM ? 256 : 128);
};

__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_warp_async(u8* ring, const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                                     const __half* __restrict__ x, int k, int group, int row0, int t0, int t1,
                                                     float (*part)[MMA_ROWS]) {
    constexpr int SLOT = RingSlot<ASYM>::BYTES;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int nchunks = k / 32, cpg = group / 32, gpr = k / group;
    const long long tile = row0 / MMA_ROWS, nsteps = (nchunks + 3) / 4;
    const uint4* qt = reinterpret_cast<const uint4*>(wq) + tile * nsteps * 64 + lane;
    // The (row g, row g + 8) scale (min) pair of group grp: word 8 grp + g of the tile's.
    const unsigned* sw = reinterpret_cast<const unsigned*>(scales + tile * gpr * MMA_ROWS) + g;
    const unsigned* mw = reinterpret_cast<const unsigned*>(mins + tile * gpr * MMA_ROWS) + g;
    StepWalk walk(4 * t0 + c, cpg);
    // Copies step t into slot s (zero-filled past t1 or K), then commits them as one group.
    auto issue = [&](int s, int t) {
        const bool ok = t < t1 && walk.j < nchunks;
        u8* slot = ring + s * SLOT;
        const long long at = ok ? 64LL * t : 0, gw = ok ? 8LL * walk.grp : 0;
        cp_async16(slot + 16 * lane, qt + at, ok ? 16 : 0);
        cp_async16(slot + 512 + 16 * lane, qt + at + 32, ok ? 16 : 0);
        cp_async4(slot + 1024 + 4 * lane, sw + gw, ok ? 4 : 0);
        if (ASYM) cp_async4(slot + 1152 + 4 * lane, mw + gw, ok ? 4 : 0);
        asm volatile("cp.async.commit_group;" ::: "memory");
        walk.next();
    };
    MmaAcc<B> acc;
    acc.zero();
#pragma unroll
    for (int s = 0; s < RING_STEPS; ++s) issue(s, t0 + s);
    for (int t = t0; t < t1; ++t) {
        asm volatile("cp.async.wait_group %0;" ::"n"(RING_STEPS - 1) : "memory");  // step t landed
        const int s = (t - t0) % RING_STEPS;
        const u8* slot = ring + s * SLOT;
        const uint4 cg = *reinterpret_cast<const uint4*>(slot + 16 * lane), ch = *reinterpret_cast<const uint4*>(slot + 512 + 16 * lane);
        const unsigned s2 = *reinterpret_cast<const unsigned*>(slot + 1024 + 4 * lane);
        const unsigned n2 = ASYM ? *reinterpret_cast<const unsigned*>(slot + 1152 + 4 * lane) : 0u;
        const unsigned dg = __byte_perm(s2, 0u, 0x1010), dh = __byte_perm(s2, 0u, 0x3232);
        const unsigned m2g = __byte_perm(n2, 0u, 0x1010), m2h = __byte_perm(n2, 0u, 0x3232);
        issue(s, t + RING_STEPS);  // the slot's values are in registers: refill it
        w4a16_mma_step<B, ASYM>(acc, cg, ch, dg, dh, m2g, m2h, x, k, 4 * t + c, nchunks, g);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    mma_store_part<B>(acc, part, g, c);
}

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_async(W4A16_ARGS) {
    constexpr int W = 2 * MMA_WARPS;
    extern __shared__ uint4 dyn[];
    __shared__ float part[W][B][MMA_ROWS];
    const int warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * MMA_ROWS;
    const int nsteps = (k / 32 + 3) / 4;
    const int per = (nsteps + W - 1) / W;
    const int t0 = warp * per, t1 = min(t0 + per, nsteps);
    u8* ring = reinterpret_cast<u8*>(dyn) + warp * RING_STEPS * RingSlot<ASYM>::BYTES;
    w4a16_mma_warp_async<B, ASYM>(ring, wq, scales, mins, x, k, group, row0, t0, t1, part[warp]);
    __syncthreads();
    mma_store_y<B, W>(part, y, n_rows, row0);
}

W4A16_RUNG(w4a16_mma_tiled_async, w4a16_mma_tiled_async, 64 * MMA_WARPS, 4)

// ---------------------------------------------------------------------------
// w4a16_mma_tiled_bulk_{sym,asym}_b{B}_f16: w4a16_mma_tiled_sweep with its codes fetched by the
// copy engine (TMA, sm_90). In the tile layout a warp's step is one contiguous 1 KB block, so
// lane 0 copies it with one cp.async.bulk into a slot of the warp's ring of BULK_STEPS slots in
// shared memory, completing on the slot's mbarrier: bytes in flight that cost neither registers
// nor per-lane instructions (w4a16_mma_tiled_async's cp.async cost 4-6 per lane and step). When
// a slot's phase completes each lane reads its two 16 B chunks, the warp syncs, and lane 0
// refills the slot with the step BULK_STEPS ahead before the warp decodes: BULK_STEPS - 1 to
// BULK_STEPS steps in flight per warp at all times (w4a16_mma_tiled: 0-2, in rounds). Each lane
// loads its scale (min) pair word into a register ring as its step is issued, BULK_STEPS steps
// before it decodes. Steps past the warp's last are neither copied nor waited for, so no copy
// is in flight when a warp ends. The decode, its order and the sums are w4a16_mma_tiled_sweep's.
// Before sm_90 the kernels are w4a16_mma_tiled_sweep's.
// Dynamic smem per block: 8 warps x BULK_STEPS x 1 KB = 32 KB; 4 blocks per SM.
// ptxas -v, sm_90: 64 registers; spills 0-12 B at b1-b8, 36 B (asym) and 380 B (sym) at b16.
// Measured slower than every register rung at batch 1 (22.5 against 17.8-18.4 us at 8192 x 8192),
// and faster with 2 slots than with 4. Nsight Compute counts ~40% more instructions issued than
// tiled_post where the SASS has ~20% more per step; waiting with mbar_sleep instead of polling
// did not change it (reports/notes/h100-w4a16-bulk.md).
// ---------------------------------------------------------------------------
#define BULK_STEPS 4

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
template <int B, bool ASYM, bool POST, int S>
__device__ __forceinline__ void w4a16_mma_warp_bulk(const u8* ring, unsigned bars, const u8* __restrict__ wq, const __half* __restrict__ scales,
                                                    const __half* __restrict__ mins, const __half* __restrict__ x, int k, int group, int row0,
                                                    int t0, int t1, float (*part)[MMA_ROWS]) {
    constexpr int R = BULK_STEPS;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int nchunks = k / 32, cpg = group / 32, gpr = k / group;
    // The step-major tile layout (as w4a16_mma_tiled_sweep reads it): block (tile, t) at (t ntiles + tile) KB.
    const long long tile = row0 / MMA_ROWS, tstep = 1024LL * gridDim.x;
    const u8* qt = wq + tile * 1024;
    const unsigned* sp = reinterpret_cast<const unsigned*>(scales + tile * gpr * MMA_ROWS) + g;
    const unsigned* mp = reinterpret_cast<const unsigned*>(mins + tile * gpr * MMA_ROWS) + g;
    const unsigned ring_at = smem_addr(ring);
    if (lane == 0) {
#pragma unroll
        for (int u = 0; u < R; ++u) mbar_init(bars + 8 * u, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();
    StepWalk walk(4 * t0 + c, cpg, 4 * S);  // the next step to issue: t0, t0 + S, ... below t1
    unsigned s2[R], n2[R];
    // Step t into slot u (no copy past t1), and this lane's scale (min) pair for it (0 past t1 or K).
    auto issue = [&](int u, int t) {
        const bool ok = t < t1 && walk.j < nchunks;
        s2[u] = ok ? __ldg(sp + 8 * walk.grp) : 0u;
        n2[u] = ASYM && ok ? __ldg(mp + 8 * walk.grp) : 0u;
        if (lane == 0 && t < t1) {
            mbar_expect_tx(bars + 8 * u, 1024);
            bulk_load(ring_at + 1024 * u, qt + tstep * t, 1024, bars + 8 * u);
        }
        walk.next();
    };
    MmaAcc<B> acc;
    acc.zero();
#pragma unroll
    for (int u = 0; u < R; ++u) issue(u, t0 + u * S);
    for (int t = t0, round = 0; t < t1; t += R * S, ++round) {
#pragma unroll
        for (int u = 0; u < R; ++u) {
            if (t + u * S >= t1) break;  // warp-uniform: every lane reaches each mma.sync
            mbar_sleep(bars + 8 * u, round & 1);
            const uint4 cg = *reinterpret_cast<const uint4*>(ring + 1024 * u + 16 * lane);
            const uint4 ch = *reinterpret_cast<const uint4*>(ring + 1024 * u + 512 + 16 * lane);
            const unsigned sv = s2[u], nv = n2[u];
            __syncwarp();  // every lane has read the slot: refill it
            issue(u, t + (u + R) * S);
            const int j = 4 * (t + u * S) + c;
            if (POST)
                w4a16_mma_step_post<B>(acc, cg, ch, sv, x, k, j, nchunks, g);
            else
                w4a16_mma_step<B, ASYM>(acc, cg, ch, __byte_perm(sv, 0u, 0x1010), __byte_perm(sv, 0u, 0x3232), __byte_perm(nv, 0u, 0x1010),
                                        __byte_perm(nv, 0u, 0x3232), x, k, j, nchunks, g);
        }
    }
    mma_store_part<B>(acc, part, g, c);
}
#endif

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_bulk(W4A16_ARGS) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int W = 2 * MMA_WARPS;
    extern __shared__ uint4 dyn[];
    __shared__ float part[W][B][MMA_ROWS];
    __shared__ unsigned long long bars[W][BULK_STEPS];
    require_dynamic_smem(W * BULK_STEPS * 1024);
    const int warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * MMA_ROWS;
    const int nsteps = (k / 32 + 3) / 4;
    const u8* ring = reinterpret_cast<const u8*>(dyn) + warp * BULK_STEPS * 1024;
    const unsigned wb = smem_addr(bars[warp]);
    bool post = false;
    if constexpr (!ASYM) post = group % 128 == 0;
    // Warp w takes steps w, w + W, ... (as w4a16_mma_tiled_sweep).
    if (post)
        w4a16_mma_warp_bulk<B, false, true, W>(ring, wb, wq, scales, mins, x, k, group, row0, warp, nsteps, part[warp]);
    else
        w4a16_mma_warp_bulk<B, ASYM, false, W>(ring, wb, wq, scales, mins, x, k, group, row0, warp, nsteps, part[warp]);
    __syncthreads();
    mma_store_y<B, W>(part, y, n_rows, row0);
#else
    w4a16_mma_tiled_sweep<B, ASYM>(wq, scales, mins, x, y, n_rows, k, group);
#endif
}

W4A16_RUNG(w4a16_mma_tiled_bulk, w4a16_mma_tiled_bulk, 64 * MMA_WARPS, 4)
