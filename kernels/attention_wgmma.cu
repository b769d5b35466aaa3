// attention_wgmma.cu: the Hopper rungs of the attention forward (sm_90a), after FlashAttention 3
// (Shah et al. 2024). Conventions (layout, masks, lse): attention.cu. Operand layouts and the
// mbarrier ring: kernels/gemm/wgmma.cu (wgmma_tma), whose helpers (common.cuh, mma.cuh) this reuses.
//
//  4. wgmma            TMA copies the block's Q once and K and V tiles of 128 keys into a ring of
//                      128-byte-swizzled shared memory (a 4D map per tensor: head_dim, heads,
//                      seq, batch, so rows past the sequence arrive as zeros), issued by one
//                      thread of warpgroup 1; two warpgroups own 64 query rows each and
//                      run S = Q K^T as wgmma m64n128k16 (both operands from shared memory), the
//                      online softmax in registers, then O += P V as wgmma m64nDk16 with P taken
//                      from registers (the accumulator layout of S is the A-fragment layout).
//                      Should buy: no ldmatrix, no address arithmetic per mma, 4x the work per
//                      tensor-core instruction of mma.sync: the pace of wgmma, less the softmax.
//                      block (256,1,1), grid (ceil(Sq/128), Hq, B), dynamic smem WgAttn<D>::SMEM.
//  5. wgmma_overlap    wgmma, with the next tile's S = Q K^T and this tile's O += P V in flight
//                      while the softmax of the tile runs (FlashAttention 3's intra-warpgroup
//                      pipelining): P of one tile and S of the next live in registers together.
//                      Should buy: the softmax's exp2 and shuffles hidden behind the tensor cores.
//  6. wgmma_pingpong   wgmma_overlap, with the two warpgroups taking turns to issue their
//                      wgmmas (named barriers 1 and 2, FlashAttention 3's inter-warpgroup
//                      schedule): one warpgroup's softmax runs while the other's GEMMs do.
//                      Should buy: the tensor cores fed by one warpgroup while the other is busy
//                      with exp2, instead of both contending at once.

#include "mma.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One 4D box of `map` at (c0 innermost, c1, c2, c3) into shared memory at dst, completing on
// mbarrier `bar` (tma_load_2d and tma_load_3d of mma.cuh, one dimension more: head_dim, heads,
// seq, batch).
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaDesc* map, int c0, int c1, int c2, int c3, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// S (64 floats) = (accumulate ? S : 0) + Q (64x16, K-major) K^T, K's 128 keys K-major (no transpose).
#define ATT_QK(TY)                                                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                    \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" WG_REGS64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
                 : WG_D64                                                                                      \
                 : "l"(da), "l"(db), "r"(accumulate)                                                           \
                 : "memory")
// O (N / 2 floats) += P (64x16 from registers) V (16 x N, N-major: transposed).
#define ATT_PV(N, TY, DREGS, REGS, A0, DB, ONE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ONE ", 0;\n"                                                \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" REGS "}, {" A0 "}, " DB ", p, 1, 1, 1;\n}\n" \
                 : DREGS                                                                                       \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)                                  \
                 : "memory")

template <typename T> struct AttnWg;
#define ATT_WG_TYPE(T, TY)                                                                                       \
    template <> struct AttnWg<T> {                                                                               \
        static __device__ __forceinline__ void qk(float (&d)[64], u64 da, u64 db, int accumulate) { ATT_QK(TY); } \
        static __device__ __forceinline__ void pv(float (&d)[64], const unsigned (&a)[4], u64 db) {              \
            ATT_PV(128, TY, WG_D64, WG_REGS64, "%64, %65, %66, %67", "%68", "%69");                               \
        }                                                                                                        \
        static __device__ __forceinline__ void pv(float (&d)[32], const unsigned (&a)[4], u64 db) {              \
            ATT_PV(64, TY, WG_D32, WG_REGS32, "%32, %33, %34, %35", "%36", "%37");                                \
        }                                                                                                        \
    };
ATT_WG_TYPE(__half, "f16")
ATT_WG_TYPE(__nv_bfloat16, "bf16")
#endif

// The block and ring of the wgmma rungs at head dim D: 128 query rows (two warpgroups), 128-key
// tiles, 3 stages at D128 (224 KiB), 4 at D64. A tile of R rows arrives as D / 64 boxes of R rows
// x 128 bytes.
template <int D>
struct WgAttn {
    static constexpr int BM = 128, BN = 128, STAGES = D == 128 ? 3 : 4, BOXES = D / 64;
    static constexpr int Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2, BOX_ROWS_BYTES = BN * 128;  // BN = BM
    static constexpr int STAGE_BYTES = 2 * KV_BYTES;                                                     // K, then V
    // Q, the ring, 1 KiB to align to the swizzle atom, mbarriers: q_full, k_full[s], v_full[s], empty[s].
    static constexpr int SMEM = Q_BYTES + STAGES * STAGE_BYTES + 1024 + 8 * (1 + 3 * STAGES);
    // No producer warpgroup: wgmma_overlap keeps S, P and O (160 registers) live at once, and
    // with 12 warps (3 on each of an SM's four 16,384-register quarters) ptxas 12.9 compiled it to
    // ~170 registers even with setmaxnreg 24 / 240 (FlashAttention 3's split), spilling P and
    // serialising the wgmmas; with a producer warp (9 warps, 224 registers) the launch failed
    // for want of registers. 8 warps leave 255 registers to every thread.
    static constexpr int THREADS = 256;
    static_assert(D == 64 || D == 128, "head dims 64 and 128");
    static_assert(SMEM <= 232448, "fits H100's 227 KiB of dynamic shared memory");
};

// What a thread holds of its warpgroup's 64 rows (accumulator layout of m64nNk16: for
// each 8-column block j, d[4j], d[4j+1] at row 16 warp + lane / 4, columns 8j + 2 (lane % 4) +
// {0, 1}; d[4j+2], d[4j+3] 8 rows below): the running max and sum of its two rows, in log2 units.
struct SoftmaxRows {
    float m[2], l[2];
};

// 2^x by the special-function unit alone (exp2f adds a range check and two multiplies to keep
// denormal results, which P does not need: they are below bf16's and f16's smallest steps).
__device__ __forceinline__ float ex2_ftz(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// Masks S where the tile crosses a boundary, folds it into the running statistics and turns it
// into P (unnormalised, in place); returns the factor by which the accumulator of the tiles before
// must be scaled, per row. The scale (> 0) is applied inside the exponent, one FFMA per score:
// the row max of the raw scores is the max of the scaled ones.
// Row r keeps keys [keys[r].x, keys[r].y) (attn_keep as a range: the masks are intervals).
__device__ __forceinline__ float2 attn_wg_softmax(float (&s)[64], SoftmaxRows& st, const int2 (&keys)[2], int kv0, float sl2, bool edge) {
    const int t = threadIdx.x % 4;
    if (edge) {
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = kv0 + 8 * j + 2 * t + (e & 1);
                const int2 k = keys[e / 2];
                if (key < k.x || key >= k.y) s[4 * j + e] = NEG_INF;
            }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float mx = NEG_INF;
#pragma unroll
        for (int j = 0; j < 16; ++j) mx = fmax_nan(mx, fmax_nan(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
        mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmax_nan(st.m[r], mx * sl2);
        const float shift = safe_shift(mx);
        alpha[r] = ex2_ftz(st.m[r] - shift);
        st.m[r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            s[4 * j + 2 * r] = ex2_ftz(fmaf(s[4 * j + 2 * r], sl2, -shift));
            s[4 * j + 2 * r + 1] = ex2_ftz(fmaf(s[4 * j + 2 * r + 1], sl2, -shift));
            sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
        }
        st.l[r] = st.l[r] * alpha[r] + sum;  // this lane's share; the quad is summed at the end
    }
    return make_float2(alpha[0], alpha[1]);
}

template <typename T, int D, bool OVERLAP, bool PINGPONG>
__device__ void attn_wgmma_forward(const TmaDesc& tq, const TmaDesc& tk, const TmaDesc& tv, T* __restrict__ o, float* __restrict__ lse,
                                   const int* __restrict__ cu_q, const int* __restrict__ cu_k, int Sq, int Sk, int Hq, int Hkv, float scale,
                                   int causal, int window) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using P = WgAttn<D>;
    constexpr int BM = P::BM, BN = P::BN, STAGES = P::STAGES, BOXES = P::BOXES, ACC = D / 2;
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(1024) unsigned char smem[];
    require_dynamic_smem(P::SMEM);
    const unsigned sq_ = (smem_addr(smem) + 1023u) & ~1023u;  // Q: BOXES boxes of BM rows x 128 bytes
    const unsigned ring = sq_ + P::Q_BYTES;                     // stage s: K boxes, then V boxes
    const unsigned bars = ring + STAGES * P::STAGE_BYTES;
    auto k_full = [&](int s) { return bars + 8 * (1 + s); };
    auto v_full = [&](int s) { return bars + 8 * (1 + STAGES + s); };
    auto empty = [&](int s) { return bars + 8 * (1 + 2 * STAGES + s); };
    const int wgi = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int q0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
    const AttnSeq seq = attn_seq(cu_q, cu_k, b, Sq, Sk, Hq);
    Sq = seq.sq, Sk = seq.sk;
    if (q0 >= Sq) return;  // a shorter sequence of a variable-length batch
    // TMA coordinates: dense maps are (.., seq, batch); a packed batch's maps hold one batch of
    // all rows, so its rows past this sequence are the next sequence's (keys masked as past Sk,
    // query rows not stored) rather than zeros.
    const int tb = cu_q ? 0 : b, tq0 = cu_q ? (int)seq.q_row0 : 0, tk0 = cu_q ? (int)seq.k_row0 : 0;
    const int off = Sk - Sq;

    const int2 span = attn_key_tiles(q0, BM, Sk, off, causal, window, BN);  // the keys this block's rows keep
    const int lo = span.x, tiles = span.y;

    if (threadIdx.x == 0) {
        mbar_init(bars, 1);
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(k_full(s), 1);
            mbar_init(v_full(s), 1);
            mbar_init(empty(s), 8);  // one arrival per warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    // The loads: thread 0 of warpgroup 1 issues Q and the first STAGES tiles, then tile it +
    // STAGES once both warpgroups have released tile it (warpgroup 1 is the later of the two
    // under ping-pong, so its wait for warpgroup 0 is short).
    const bool loader = threadIdx.x == 128;
    auto load_tile = [&](int it) {
        const int s = it % STAGES, kv0 = lo + it * BN;
        const unsigned kb = ring + s * P::STAGE_BYTES, vb = kb + P::KV_BYTES;
        // Out-of-bounds rows are zero-filled and still counted in the transaction bytes.
        mbar_expect_tx(k_full(s), P::KV_BYTES);
        for (int x = 0; x < BOXES; ++x) tma_load_4d(kb + x * P::BOX_ROWS_BYTES, &tk, 64 * x, hk, tk0 + kv0, tb, k_full(s));
        mbar_expect_tx(v_full(s), P::KV_BYTES);
        for (int x = 0; x < BOXES; ++x) tma_load_4d(vb + x * P::BOX_ROWS_BYTES, &tv, 64 * x, hk, tk0 + kv0, tb, v_full(s));
    };
    if (loader) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&tq)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&tk)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&tv)) : "memory");
        mbar_expect_tx(bars, P::Q_BYTES);
        for (int x = 0; x < BOXES; ++x) tma_load_4d(sq_ + x * BM * 128, &tq, 64 * x, h, tq0 + q0, tb, bars);
        for (int it = 0; it < min(tiles, STAGES); ++it) load_tile(it);
    }

    const int warp = tid / 32, lane = tid % 32;
    const int wrow0 = q0 + wgi * 64;                  // the warpgroup's first row
    const int row0 = wrow0 + warp * 16 + lane / 4;    // this thread's rows: row0, row0 + 8
    const unsigned qa = sq_ + wgi * 64 * 128;         // the warpgroup's 64 rows of each Q box
    const float sl2 = scale * LOG2E;
    int2 keys[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        keys[r] = make_int2(window > 0 ? row + off - window + 1 : 0, causal ? min(Sk, row + off + 1) : Sk);
    }
    // Descriptors: Q and K K-major (a k16 step is 32 bytes along a 128-byte row, a box BM or BN
    // rows further on); V N-major (a k16 step is 16 rows = 2048 bytes, the next 64 columns one box on).
    auto q_desc = [&](int ks) { return wg_desc(qa + (ks / 4) * BM * 128 + (ks % 4) * 32, WG_A_LBO, WG_A_SBO); };
    auto k_desc = [&](unsigned kb, int ks) { return wg_desc(kb + (ks / 4) * P::BOX_ROWS_BYTES + (ks % 4) * 32, WG_A_LBO, WG_A_SBO); };
    auto v_desc = [&](unsigned vb, int ks) { return wg_desc(vb + ks * 2048, P::BOX_ROWS_BYTES, 1024); };
    // Does tile kv0 need the mask for some row of this warpgroup?
    auto edge = [&](int kv0) {
        return kv0 + BN > Sk || (causal && kv0 + BN - 1 > wrow0 + off) || (window > 0 && kv0 <= wrow0 + 63 + off - window);
    };
    // The waits for a tile's K and V come before any wgmma is issued: ptxas serialises wgmmas
    // left in flight across a polling loop.
    auto wait_k = [&](int it) { mbar_wait(k_full(it % STAGES), (it / STAGES) & 1); };
    auto wait_v = [&](int it) { mbar_wait(v_full(it % STAGES), (it / STAGES) & 1); };
    auto issue_qk = [&](float (&s)[64], int it) {
        const unsigned kb = ring + (it % STAGES) * P::STAGE_BYTES;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) AttnWg<T>::qk(s, q_desc(ks), k_desc(kb, ks), ks > 0);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    };
    // P (rounded to T, as FlashAttention does) as the A fragments of the P V wgmmas.
    auto to_a = [&](const float (&s)[64], unsigned (&pa)[8][4]) {
#pragma unroll
        for (int ks = 0; ks < 8; ++ks)
#pragma unroll
            for (int e = 0; e < 4; ++e) pa[ks][e] = pack2<T>(s[8 * ks + 2 * e], s[8 * ks + 2 * e + 1]);
    };
    auto issue_pv = [&](float (&acc)[ACC], const unsigned (&pa)[8][4], int it) {
        const unsigned vb = ring + (it % STAGES) * P::STAGE_BYTES + P::KV_BYTES;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < BN / 16; ++ks) AttnWg<T>::pv(acc, pa[ks], v_desc(vb, ks));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    };
    // Keeps P's registers live until the wgmma reading them has been waited for.
    auto pin_a = [&](unsigned (&pa)[8][4]) {
#pragma unroll
        for (int ks = 0; ks < 8; ++ks)
#pragma unroll
            for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(pa[ks][e])::"memory");
    };
    auto release = [&](int it) {
        if (lane == 0) mbar_arrive(empty(it % STAGES));
        if (loader && it + STAGES < tiles) {
            mbar_wait(empty(it % STAGES), (it / STAGES) & 1);
            load_tile(it + STAGES);
        }
    };
    auto rescale = [&](float (&acc)[ACC], float2 alpha) {
#pragma unroll
        for (int j = 0; j < ACC / 4; ++j) acc[4 * j] *= alpha.x, acc[4 * j + 1] *= alpha.x, acc[4 * j + 2] *= alpha.y, acc[4 * j + 3] *= alpha.y;
    };

    // Ping-pong: a warpgroup's turn to issue wgmmas starts when the other has issued its own
    // (bar.sync on its barrier, which the other's bar.arrive completes) and ends by handing the
    // turn over. Both take tiles + 1 turns; warpgroup 1 hands warpgroup 0 the first turn and
    // skips handing over after its last, so every arrival is matched by a sync.
    int turn = 0;
    auto turn_begin = [&]() {
        if (PINGPONG) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wgi) : "memory");
    };
    auto turn_end = [&]() {
        if (PINGPONG && !(wgi == 1 && turn == tiles)) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wgi) : "memory");
        ++turn;
    };
    if (PINGPONG && wgi == 1 && tiles > 0) asm volatile("bar.arrive 1, 256;\n" ::: "memory");

    float acc[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.f;
    SoftmaxRows st = {{NEG_INF, NEG_INF}, {0.f, 0.f}};
    float s[64];
    unsigned pa[8][4];
    mbar_wait(bars, 0);
    if (!OVERLAP) {
        for (int it = 0; it < tiles; ++it) {
            const int kv0 = lo + it * BN;
            wait_k(it);
            issue_qk(s, it);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            wg_pin(s);
            rescale(acc, attn_wg_softmax(s, st, keys, kv0, sl2, edge(kv0)));
            to_a(s, pa);
            wait_v(it);
            issue_pv(acc, pa, it);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            wg_pin(acc);
            pin_a(pa);
            release(it);
        }
    } else if (tiles > 0) {
        // Tile 0's scores first; then, per tile it >= 1, S_it = Q K_it^T and O += P_{it-1} V_{it-1}
        // are issued together, the first is waited for, and the softmax of tile it runs while the
        // second is still in flight; O is rescaled once that one is done.
        turn_begin();
        wait_k(0);
        issue_qk(s, 0);
        turn_end();
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg_pin(s);
        rescale(acc, attn_wg_softmax(s, st, keys, lo, sl2, edge(lo)));
        to_a(s, pa);
        for (int it = 1; it < tiles; ++it) {
            const int kv0 = lo + it * BN;
            turn_begin();
            wait_k(it);
            wait_v(it - 1);
            issue_qk(s, it);
            issue_pv(acc, pa, it - 1);
            turn_end();
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S_it done, P V may still run
            wg_pin(s);
            const float2 alpha = attn_wg_softmax(s, st, keys, kv0, sl2, edge(kv0));
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            wg_pin(acc);
            pin_a(pa);
            release(it - 1);
            rescale(acc, alpha);
            to_a(s, pa);
        }
        turn_begin();
        wait_v(tiles - 1);
        issue_pv(acc, pa, tiles - 1);
        turn_end();
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        wg_pin(acc);
        pin_a(pa);
        release(tiles - 1);
    }

    // O = acc / l; lse = ln(sum) + max in natural-log units; rows past Sq are not stored.
    const int t = lane % 4;
    const long long qs = (long long)Hq * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float lr = st.l[r];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const int row = row0 + 8 * r;
        if (row >= Sq) continue;
        const float inv = lr > 0.f ? 1.f / lr : 0.f;
        T* orow = o + (seq.q_row0 + row) * qs + (long long)h * D;
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<unsigned*>(orow + 8 * j + 2 * t) = pack2<T>(acc[4 * j + 2 * r] * inv, acc[4 * j + 2 * r + 1] * inv);
        if (t == 0) lse[seq.lse0 + h * seq.lse_head + row] = lr > 0.f ? (st.m[r] + __log2f(lr)) / LOG2E : NEG_INF;
    }
#else
    __trap();  // built for another target: the launcher offers these rungs on compute capability 9.0 only
#endif
}

// Exports: attention_<variant>_d<D>_{f16,bf16}.
#define WG_ATTN_EXPORT(TY, T, NAME, D, OVERLAP, PINGPONG)                                                                          \
    extern "C" __global__ void __launch_bounds__(WgAttn<D>::THREADS, 1) attention_##NAME##_d##D##_##TY(                                    \
        const __grid_constant__ TmaDesc tq, const __grid_constant__ TmaDesc tk, const __grid_constant__ TmaDesc tv, T* o,    \
        float* lse, const int* cu_q, const int* cu_k, int Sq, int Sk, int Hq, int Hkv, float scale, int causal, int window) { \
        attn_wgmma_forward<T, D, OVERLAP, PINGPONG>(tq, tk, tv, o, lse, cu_q, cu_k, Sq, Sk, Hq, Hkv, scale, causal, window);          \
    }
#define WG_ATTN_EXPORTS(TY, T)                        \
    WG_ATTN_EXPORT(TY, T, wgmma, 64, false, false)           \
    WG_ATTN_EXPORT(TY, T, wgmma, 128, false, false)          \
    WG_ATTN_EXPORT(TY, T, wgmma_overlap, 64, true, false)    \
    WG_ATTN_EXPORT(TY, T, wgmma_overlap, 128, true, false)   \
    WG_ATTN_EXPORT(TY, T, wgmma_pingpong, 64, true, true)    \
    WG_ATTN_EXPORT(TY, T, wgmma_pingpong, 128, true, true)
WG_ATTN_EXPORTS(f16, __half)
WG_ATTN_EXPORTS(bf16, __nv_bfloat16)
