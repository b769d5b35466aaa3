// ---------------------------------------------------------------------------
// W4A16 on tensor cores, built for bytes in flight: w4a16_mma_{sym,asym}_b{B}_f16.
// Napkin math (H100 SXM, N = K = 8192, B = 1): 32 MiB of codes + 1 MiB of scales + 16 KiB of X
// = 34.6 MB: 11.5 us at the measured 3.02 TB/s copy ceiling; the bar (80%) is 14.3 us. Little's
// law: ~3 TB/s x ~0.7 us of unloaded latency = ~2 MB in flight GPU-wide, ~16 KB per SM.
// The CUDA-core rung had that on paper (5 blocks x 8 KB per SM) but in 4-byte loads, 2 load
// rounds per block and 3.1 waves of short blocks, and its inner loop costs ~4 instructions per
// weight per lane: ~8 us of issue at B = 1, compute-bound from B = 4 (measured).
// Here a block is one tile of 16 rows, 4 warps; warp w takes a contiguous quarter of K. A step
// is 128 weights of every row: lane (g = lane / 4, c = lane % 4) loads 16 B of codes of row g
// and of row g + 8 at chunk 4t + c (each row's 4 lanes read 64 contiguous bytes), and issues
// U = 4 steps of codes and scales before decoding any: 128 B per lane, 4 KB per warp (8.4 MB,
// a quarter of W, requested by the first round of the grid), ~62 KB per SM at 15.5 warps: ~4x
// Little's ask. __launch_bounds__(128, 4): 4 blocks per SM, so N / 16 = 512 blocks fill
// 132 x 4 = 528 slots in one wave (no tail of a second wave). Codes are read once:
// ld.global.nc.L1::no_allocate keeps them from evicting X, which every tile reads through L1.
// The dot products run on mma.sync m16n8k16 (fp32 accumulation); the weights enter it as f16
// rounded once from (q - 8) d or q d + m, the values cuBLAS reads. SASS per step (sm_90,
// B = 1, sym): 32 LOP3 + 64 HFMA2 decode 8 code words (LOP3 into f16 1024 + q, an FMA to
// q - bias exactly, an FMA to (q - bias) d + m), 16 PRMT pair X, 8 HMMA, 4 LDG of X; ~200
// instructions with the load round: ~6.4 us of issue per SM at 1.98 GHz, half the budget and
// overlapped with the stream; B = 16 (two MMAs per step, 3 steps in flight): ~10.6 us.
// Fragments (PTX m16n8k16): A a0a1 (row g, k 2c..2c+1), a2a3 (row g + 8), a4a5 / a6a7 (the same
// rows, k 2c + 8..2c + 9); B b0b1 (k 2c..2c+1, col g), b2b3 (k 2c + 8..); C c0c1 (row g, cols
// 2c..2c+1), c2c3 (row g + 8). The K order inside an MMA is free as long as A and B agree:
// lane class c feeds k 2c.. from its own 32-weight chunk, and code word i, half h of that chunk
// gives the pairs (q[8i + 2h], q[8i + 2h + 4]) as a0a1 and (q[8i + 2h + 1], q[8i + 2h + 5]) as
// a4a5, which one mask each picks out of the word shifted right by 8h; X is paired the same way
// by two byte permutes. Batch b is MMA column b (B = 16: two MMAs per step, columns 0..7 and
// 8..15); lanes whose column is past B, or whose chunk is past K, feed zeros.
// lab/src/quant/w4a16_mma_model.rs mirrors this kernel step by step on the CPU for the tests.
// ptxas -v, sm_90 (CUDA 13.0; registers / static smem, no spills in any):
//   sym  b1 b2 b4 b8 115 / 256-2048 B   b16 105 / 4 KiB
//   asym b1 b2 b4 123, b8 127 / 256-2048 B   b16 116 / 4 KiB     (sm_80: no spills either; b1-b4 were
//   127 before the load step became the `issue` lambda shared with the tiled rungs)
// ---------------------------------------------------------------------------
#include "pdl.cuh"

#define MMA_WARPS 4
#define MMA_ROWS 16

// 16 B of codes, read once: not kept in L1.
__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned fma_f16x2(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ void mma_f16_16816(float* acc, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two codes of word w as f16x2 (low half first): HI = false takes nibbles 0 and 4 into f16
// 1024 + q, HI = true nibbles 1 and 5 into 1024 + 16q: (w & mask) | 0x64006400 in one LOP3
// (written plainly, it compiles to two).
template <bool HI>
__device__ __forceinline__ unsigned codes_f16x2(unsigned w) {
    unsigned v;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(w), "n"(HI ? 0x00F000F0u : 0x000F000Fu), "n"(0x64006400u));
    return v;
}

// Two weights of code word w as f16x2: codes_f16x2, then one FMA makes q - bias exactly
// (x 1 - (1024 + bias), x 1/16 - (64 + bias)), one more (q - bias) d + m, rounded once.
// f16 constants: 0x3C00 = 1, 0x2C00 = 1/16, 0xE408 = -1032, 0xE400 = -1024, 0xD480 = -72, 0xD400 = -64.
template <bool HI, bool ASYM>
__device__ __forceinline__ unsigned w2_f16x2(unsigned w, unsigned d2, unsigned m2) {
    const unsigned v = codes_f16x2<HI>(w);
    const unsigned mul = HI ? 0x2C002C00u : 0x3C003C00u;
    const unsigned off = HI ? (ASYM ? 0xD400D400u : 0xD480D480u) : (ASYM ? 0xE400E400u : 0xE408E408u);
    return fma_f16x2(fma_f16x2(v, mul, off), d2, m2);
}

__device__ __forceinline__ unsigned word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// An f16 scale (or min) as f16x2 (d, d); 0 for a chunk past K (its weights become 0).
__device__ __forceinline__ unsigned splat_f16(const __half* p, bool ok) {
    const unsigned s = ok ? (unsigned)__ldg(reinterpret_cast<const unsigned short*>(p)) : 0u;
    return s | (s << 16);
}

// Steps in flight per warp: 4 (128 B of codes per lane); at B = 16, whose X and second MMA
// take ~20 more registers, 3 (with 4 it spills 4-8 bytes at the 128-register cap).
template <int B>
struct MmaSteps {
    static constexpr int U = B > 8 ? 3 : 4;
};

// Accumulator shape of a warp's 16-row tile: MMAs per step (batch columns 0..7, and 8..15 at
// B = 16) and chains. At B <= 8 two chains (halves h = 0, 1) so that back-to-back MMAs do not
// wait on each other; at B = 16 the two column blocks are already two chains.
template <int B>
struct MmaAcc {
    static constexpr int NH = B > 8 ? 2 : 1;
    static constexpr int CH = NH == 1 ? 2 : 1;
    float v[NH][CH][4];
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int nh = 0; nh < NH; ++nh)
#pragma unroll
            for (int h = 0; h < CH; ++h)
#pragma unroll
                for (int i = 0; i < 4; ++i) v[nh][h][i] = 0.f;
    }
};

// X of this lane's MMA column(s) b = g + 8 nh over chunk j's 32 weights (zeros past B or K).
template <int B>
__device__ __forceinline__ void load_x_chunk(uint4 (&xv)[MmaAcc<B>::NH][4], const __half* __restrict__ x, int k, int j, int nchunks, int g) {
#pragma unroll
    for (int nh = 0; nh < MmaAcc<B>::NH; ++nh) {
        const int b = g + 8 * nh;
        const bool ok = b < B && j < nchunks;
        const uint4* xp = reinterpret_cast<const uint4*>(x + (long long)b * k + 32 * j);
#pragma unroll
        for (int v = 0; v < 4; ++v) xv[nh][v] = ok ? __ldg(xp + v) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// The B fragment of MMA (i, h) of a step from one column's X words: words 4i + h and 4i + h + 2
// hold x[8i + 2h .. + 1] and x[8i + 2h + 4 .. + 5].
__device__ __forceinline__ void x_frag(const uint4 (&xv)[4], int i, int h, unsigned& b0, unsigned& b1) {
    const unsigned xa = word_of(xv[(4 * i + h) / 4], (4 * i + h) % 4);
    const unsigned xb = word_of(xv[(4 * i + h + 2) / 4], (4 * i + h + 2) % 4);
    b0 = __byte_perm(xa, xb, 0x5410);
    b1 = __byte_perm(xa, xb, 0x7632);
}

// One step of a warp (16 rows x 128 weights): this lane's 16 B code chunks cg (row g) and ch
// (row g + 8), at chunk j of the row, with their scales (mins) as f16x2 splats, decoded to f16
// and multiplied on mma.sync against X of the same 32 weights (zeros past B or K). Where the
// codes come from (registers loaded from global in w4a16_mma_warp, shared memory in
// w4a16_mma_pipelined) is the caller's business.
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_step(MmaAcc<B>& acc, const uint4& cg, const uint4& ch, unsigned dg, unsigned dh, unsigned m2g,
                                               unsigned m2h, const __half* __restrict__ x, int k, int j, int nchunks, int g) {
    constexpr int NH = MmaAcc<B>::NH, CH = MmaAcc<B>::CH;
    uint4 xv[NH][4];
    load_x_chunk<B>(xv, x, k, j, nchunks, g);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned wg = word_of(cg, i) >> (8 * h), wh = word_of(ch, i) >> (8 * h);
            const unsigned a0 = w2_f16x2<false, ASYM>(wg, dg, m2g);
            const unsigned a1 = w2_f16x2<false, ASYM>(wh, dh, m2h);
            const unsigned a2 = w2_f16x2<true, ASYM>(wg, dg, m2g);
            const unsigned a3 = w2_f16x2<true, ASYM>(wh, dh, m2h);
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) {
                unsigned b0, b1;
                x_frag(xv[nh], i, h, b0, b1);
                mma_f16_16816(acc.v[nh][h % CH], a0, a1, a2, a3, b0, b1);
            }
        }
    }
}

// w4a16_mma_step for symmetric codes whose step lies in one group (group % 128 == 0), with the
// scale applied after the MMAs (w4a16_mma_tiled_post). The codes enter the MMA as the f16 the
// LOP3 makes of them, 1024 + q (low nibbles, k 0..7 of each MMA) and 1024 + 16q (high, k 8..15),
// with no FMA; X's k 8..15 half (b1) is scaled by 1/16 to match (exact unless x / 16 is
// subnormal). A second MMA with the constant A (1032 | 1152) gives C = 1032 sum(x_lo) +
// 72 sum(x_hi), so that S - C = sum((q - 8) x): the f16 products are exact in fp32, the sums carry
// fp32 rounding at the scale of 1024 |x| (~1e-5 of a step's sum here). Each row's scale then
// multiplies its step sum once: acc += d (S - C). Against w4a16_mma_step: no HFMA2 (64 per
// step), 8 more HMMA and 8 f16 multiplies.
// d2: this lane's (row g, row g + 8) scale pair; zero past K or past the matrix.
template <int B>
__device__ __forceinline__ void w4a16_mma_step_post(MmaAcc<B>& acc, const uint4& cg, const uint4& ch, unsigned d2, const __half* __restrict__ x,
                                                    int k, int j, int nchunks, int g) {
    constexpr int NH = MmaAcc<B>::NH;
    uint4 xv[NH][4];
    load_x_chunk<B>(xv, x, k, j, nchunks, g);
    float sum[NH][4], cor[NH][4];
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
#pragma unroll
        for (int i = 0; i < 4; ++i) sum[nh][i] = cor[nh][i] = 0.f;
    const unsigned c_lo = 0x64086408u, c_hi = 0x64806480u, sixteenth = 0x2C002C00u;  // f16 1032, 1152, 1/16
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned wg = word_of(cg, i) >> (8 * h), wh = word_of(ch, i) >> (8 * h);
            const unsigned a0 = codes_f16x2<false>(wg), a1 = codes_f16x2<false>(wh), a2 = codes_f16x2<true>(wg), a3 = codes_f16x2<true>(wh);
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) {
                unsigned b0, bx;
                x_frag(xv[nh], i, h, b0, bx);
                const unsigned b1 = fma_f16x2(bx, sixteenth, 0u);  // the k 8..15 half of X, / 16
                mma_f16_16816(sum[nh], a0, a1, a2, a3, b0, b1);
                mma_f16_16816(cor[nh], c_lo, c_lo, c_hi, c_hi, b0, b1);
            }
        }
    }
    const float dg = __half2float(__ushort_as_half((unsigned short)(d2 & 0xFFFFu))), dh = __half2float(__ushort_as_half((unsigned short)(d2 >> 16)));
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc.v[nh][0][i] = fmaf(i < 2 ? dg : dh, sum[nh][i] - cor[nh][i], acc.v[nh][0][i]);
}

// C fragment -> part[batch][row] (this warp's slot), the two chains added.
template <int B>
__device__ __forceinline__ void mma_store_part(const MmaAcc<B>& acc, float (*part)[MMA_ROWS], int g, int c) {
    constexpr int NH = MmaAcc<B>::NH, CH = MmaAcc<B>::CH;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int b = 8 * nh + 2 * c + (i & 1);
            if (b < B) part[b][g + 8 * (i >> 1)] = CH == 2 ? acc.v[nh][0][i] + acc.v[nh][CH - 1][i] : acc.v[nh][0][i];
        }
}

// A lane's chunk j = 4t + c and the group it falls in, advanced `jstep` chunks (one step, or S
// steps for a warp that takes every S-th step) at a time without a division.
struct StepWalk {
    int j, grp, rem;
    const int cpg, gstep, rstep, jstep;
    __device__ __forceinline__ StepWalk(int j0, int cpg_, int jstep_ = 4)
        : j(j0), grp(j0 / cpg_), rem(j0 % cpg_), cpg(cpg_), gstep(jstep_ / cpg_), rstep(jstep_ % cpg_), jstep(jstep_) {}
    __device__ __forceinline__ void next() {
        j += jstep;
        grp += gstep;
        rem += rstep;
        if (rem >= cpg) {
            rem -= cpg;
            ++grp;
        }
    }
};

// One warp's share of a 16-row tile: steps [t0, t1) of K (step t covers chunks 4t .. 4t + 3),
// U steps of codes and scales loaded per round before any is decoded, decoded and multiplied
// on mma.sync; the C fragment lands in part[batch][row] (this warp's slot). Shared by
// w4a16_mma (a quarter of K per warp) and w4a16_mma_splitk (at most U steps per warp).
// Bytes at p (16 B aligned, a multiple of 16) fetched into L2, one bulk request (sm_90; a no-op
// before, where the rung that asks for it then behaves as w4a16_mma_tiled).
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

template <int B, bool ASYM, int U = MmaSteps<B>::U, bool TILED = false, bool ROLL = false, int PF = 0, bool POST = false, int S = 1>
__device__ __forceinline__ void w4a16_mma_warp(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                               const __half* __restrict__ x, int n_rows, int k, int group, int row0, int t0, int t1,
                                               float (*part)[MMA_ROWS]) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const long long rg = min(row0 + g, n_rows - 1), rh = min(row0 + g + 8, n_rows - 1);  // clamped rows are never stored
    const int nchunks = k / 32, cpg = group / 32, gpr = k / group;
    const uint4* qg = reinterpret_cast<const uint4*>(wq + rg * (k / 2));
    const uint4* qh = reinterpret_cast<const uint4*>(wq + rh * (k / 2));
    // Tiled (w4a16_mma_tiled): step t's 16 B for this lane at 64 t + lane (row g) and 64 t + 32 +
    // lane (row g + 8) of the tile's blocks; the scales (mins) of rows g and g + 8 for group grp
    // one 4-byte pair, word 8 grp + g of the tile's.
    // Sweeping warps (S > 1) read the step-major tile layout, where step t of every tile comes
    // before step t + 1 of any: block (tile, t) at (t ntiles + tile) KB.
    const long long tile = row0 / MMA_ROWS, nsteps = (nchunks + 3) / 4;
    const long long tstep = S > 1 ? 64LL * ((n_rows + MMA_ROWS - 1) / MMA_ROWS) : 64;
    const uint4* qt = reinterpret_cast<const uint4*>(wq) + tile * (S > 1 ? 1 : nsteps) * 64 + lane;
    const unsigned* sp = reinterpret_cast<const unsigned*>(scales + tile * gpr * MMA_ROWS) + g;
    const unsigned* mp = reinterpret_cast<const unsigned*>(mins + tile * gpr * MMA_ROWS) + g;
    const __half* sg = scales + rg * gpr;
    const __half* sh = scales + rh * gpr;
    const __half* mg = mins + rg * gpr;
    const __half* mh = mins + rh * gpr;
    // The warp's steps: t0, t0 + S, t0 + 2S, ... below t1 (S = 1: a contiguous slice).
    StepWalk walk(4 * t0 + c, cpg, 4 * S);
    static_assert(PF == 0 || S == 1, "prefetches run ahead within a contiguous slice");
    // PF > 0 (tiled only): lane 0 asks L2 for the slice's scales (and mins) at the start, and for
    // step t + PF as the warp issues step t, so DRAM streams PF steps ahead of the registers.
    const uint4* tq0 = qt - lane;
    if (PF > 0 && lane == 0 && t0 < t1) {
        const int g0 = 4 * t0 / cpg, g1 = (min(4 * t1, nchunks) - 1) / cpg;
        prefetch_l2(scales + (tile * gpr + g0) * MMA_ROWS, 32u * (g1 - g0 + 1));
        if (ASYM) prefetch_l2(mins + (tile * gpr + g0) * MMA_ROWS, 32u * (g1 - g0 + 1));
    }
    MmaAcc<B> acc;
    acc.zero();

    uint4 cg[U], ch[U];
    unsigned dg[U], dh[U], m2g[U], m2h[U];
    int jj[U];
    // Loads step t (codes and scales) into slot u, zeros past t1 or K; steps are issued in order,
    // so the running chunk and group indices are the next step's.
    auto issue = [&](int u, int t) {
        jj[u] = walk.j;
        const bool ok = t < t1 && walk.j < nchunks;
        cg[u] = ch[u] = make_uint4(0u, 0u, 0u, 0u);
        if (ok) {
            cg[u] = ld_stream16(TILED ? qt + tstep * t : qg + walk.j);
            ch[u] = ld_stream16(TILED ? qt + tstep * t + 32 : qh + walk.j);
        }
        if (TILED) {  // one load per table: the (row g, row g + 8) pair, each half splatted
            const unsigned s2 = ok ? __ldg(sp + 8 * walk.grp) : 0u, n2 = ASYM && ok ? __ldg(mp + 8 * walk.grp) : 0u;
            dg[u] = POST ? s2 : __byte_perm(s2, 0u, 0x1010);  // POST: the raw pair, split after the MMAs
            dh[u] = __byte_perm(s2, 0u, 0x3232);
            m2g[u] = __byte_perm(n2, 0u, 0x1010);
            m2h[u] = __byte_perm(n2, 0u, 0x3232);
        } else {
            dg[u] = splat_f16(sg + walk.grp, ok);
            dh[u] = splat_f16(sh + walk.grp, ok);
            m2g[u] = ASYM ? splat_f16(mg + walk.grp, ok) : 0u;
            m2h[u] = ASYM ? splat_f16(mh + walk.grp, ok) : 0u;
        }
        if (PF > 0 && lane == 0 && t + PF < t1) prefetch_l2(tq0 + 64LL * (t + PF), 1024u);
        walk.next();
    };
    auto decode = [&](int u) {
        if (POST)
            w4a16_mma_step_post<B>(acc, cg[u], ch[u], dg[u], x, k, jj[u], nchunks, g);
        else
            w4a16_mma_step<B, ASYM>(acc, cg[u], ch[u], dg[u], dh[u], m2g[u], m2h[u], x, k, jj[u], nchunks, g);
    };
    if (ROLL) {
        // Rolling: a slot is refilled with the step U ahead as soon as its step is decoded, so
        // U - 1 to U steps stay in flight while the warp decodes (in rounds: none while it
        // decodes a round's last step). Refilling before the decode would need a (U + 1)th slot:
        // at 64 registers that spills 56-260 bytes.
#pragma unroll
        for (int u = 0; u < U; ++u) issue(u, t0 + u * S);
        for (int t = t0; t < t1; t += U * S) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (t + u * S >= t1) break;  // warp-uniform: every lane reaches each mma.sync
                decode(u);
                issue(u, t + (u + U) * S);
            }
        }
    } else {
        for (int t = t0; t < t1; t += U * S) {
#pragma unroll
            for (int u = 0; u < U; ++u) issue(u, t + u * S);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (t + u * S >= t1) break;  // warp-uniform: every lane reaches each mma.sync
                decode(u);
            }
        }
    }
    mma_store_part<B>(acc, part, g, c);
}

// The block's sum of its warps' partials for element i = b * MMA_ROWS + r, in warp order.
template <int B, int W = MMA_WARPS>
__device__ __forceinline__ float mma_block_sum(const float (*part)[B][MMA_ROWS], int i) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) s += part[w][i / MMA_ROWS][i % MMA_ROWS];
    return s;
}

// Y of the tile at row0: each (batch, row) the block's warp partials in warp order, rows past N skipped.
template <int B, int W>
__device__ __forceinline__ void mma_store_y(const float (*part)[B][MMA_ROWS], __half* __restrict__ y, int n_rows, int row0) {
    for (int i = threadIdx.x; i < B * MMA_ROWS; i += 32 * W) {
        const int b = i / MMA_ROWS, r = i % MMA_ROWS;
        if (row0 + r < n_rows) y[(long long)b * n_rows + row0 + r] = __float2half_rn(mma_block_sum<B, W>(part, i));
    }
}

template <int B, bool ASYM, int U = MmaSteps<B>::U, int W = MMA_WARPS, bool TILED = false, bool ROLL = false, int PF = 0, bool POST = false,
          bool SWEEP = false>
__device__ __forceinline__ void w4a16_mma(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                          const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {
    __shared__ float part[W][B][MMA_ROWS];
    const int warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * MMA_ROWS;
    const int nsteps = (k / 32 + 3) / 4;
    // This warp's contiguous slice of steps [t0, t1), or (SWEEP) every W-th step from `warp`.
    const int per = (nsteps + W - 1) / W;
    const int t0 = SWEEP ? warp : warp * per, t1 = SWEEP ? nsteps : min(t0 + per, nsteps);
    // The tile's codes and scales are no kernel's output: L2 is asked for them before waiting for
    // the kernel before this one (pdl.cuh), so under programmatic launch they arrive while it
    // finishes. Tiled: ceil(K / 128) KB of codes and 16 x K / group scales (and mins) per tile,
    // the last tile padded; rows: the tile's rows one after another. A step-major tile is spread.
    if (threadIdx.x == 0 && !SWEEP) {
        const long long gpr = k / group, rows = TILED ? MMA_ROWS : min(MMA_ROWS, n_rows - row0);
        const long long first = TILED ? (long long)blockIdx.x * MMA_ROWS * gpr : (long long)row0 * gpr;
        pdl_prefetch_l2(wq + (TILED ? (long long)blockIdx.x * nsteps * 1024 : (long long)row0 * (k / 2)), TILED ? nsteps * 1024LL : rows * (k / 2));
        pdl_prefetch_l2(scales + first, 2 * rows * gpr);
        if (ASYM) pdl_prefetch_l2(mins + first, 2 * rows * gpr);
    }
    pdl_wait();
    w4a16_mma_warp<B, ASYM, U, TILED, ROLL, PF, POST, SWEEP ? W : 1>(wq, scales, mins, x, n_rows, k, group, row0, t0, t1, part[warp]);
    // Then the W K slices are summed in warp order.
    __syncthreads();
    mma_store_y<B, W>(part, y, n_rows, row0);
}

// The parameters of every W4A16 rung's device body (the symmetric kernels pass scales as mins).
#define W4A16_ARGS                                                                                                          \
    const u8 *__restrict__ wq, const __half *__restrict__ scales, const __half *__restrict__ mins, const __half *__restrict__ x, \
        __half *__restrict__ y, int n_rows, int k, int group

// One rung's kernels quant_<NAME>_{sym,asym}_b<B>_f16, each a call of BODY<B, ASYM>.
#define W4A16_KERNELS(NAME, BODY, THREADS, MINB, B)                                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) quant_##NAME##_sym_b##B##_f16(                              \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ x, __half* __restrict__ y, \
        int n_rows, int k, int group) {                                                                                     \
        BODY<B, false>(wq, scales, scales, x, y, n_rows, k, group);                                                         \
    }                                                                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) quant_##NAME##_asym_b##B##_f16(                             \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,                      \
        const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {                               \
        BODY<B, true>(wq, scales, mins, x, y, n_rows, k, group);                                                            \
    }
// Every batch of a rung: BATCHES in lab/src/ops/quant/variants.rs.
#define W4A16_RUNG(NAME, BODY, THREADS, MINB)                                                                               \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 1)                                                                             \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 2)                                                                             \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 4)                                                                             \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 8)                                                                             \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 16)

W4A16_RUNG(w4a16_mma, w4a16_mma, 32 * MMA_WARPS, 4)
