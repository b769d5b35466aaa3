// attention_decode.cu: one query row per sequence against its KV cache (decode), split along the
// context (flash-decoding: many blocks share one long row, then a combine step merges them).
// Storage T in {f16, bf16}; scores, softmax statistics and partial outputs in fp32.
//
// The cache is paged: page p of P rows holds [P, Hkv, D] keys (and values, a second array),
// sequence b's row j lives in page table[b * max_pages + j / P] at slot j % P. A contiguous
// cache is the case P = capacity, table[b] = b. Sequence b attends rows 0..=pos[b]: lengths are
// read on the device, so one captured CUDA graph serves every step. Every kernel waits for the
// kernel before them first thing (pdl.cuh): a decode step's graph may launch them early.
//
//  decode_split     block (128,1,1), grid (nsplit, Hkv * ceil(G / GM), B); split s owns rows
//                   [s * chunk, (s + 1) * chunk) of the sequence, up to GM query heads of one KV
//                   head (G = Hq / Hkv; GM the launcher's smallest of 1, 2, 4, 8 that holds G,
//                   else 8: the per-head loops unroll to the group, not to 8). Warp w scores 32-row tiles w, w + 4, ...: lane l scores
//                   row l against every query head (its K row in registers, Q broadcast from
//                   shared memory), then the warp walks the tile's V rows with each lane owning
//                   D / 32 columns; the whole V tile is loaded into registers before the scores,
//                   so K and V are in flight together. Should buy: each K and V row is read once
//                   for all the query heads of its KV head (GQA), and short batches still fill
//                   the chip.
//                   Writes unnormalized partial O and (max, sum) per (b, h, split), base-2.
//  decode_mma       block (128,1,1), grid (nsplit, Hkv * ceil(G / 16), B), dynamic smem
//                   DM_SMEM(D). The up-to-16 query heads of one KV head are the 16 rows of an
//                   mma.sync m-tile (Q in registers); a ring of DM_STAGES 64-row K and V tiles
//                   streams in through cp.async (the page looked up per row, rows past the
//                   sequence zero-filled); warp w takes keys 16w..16w+15 of each tile: S = Q K^T,
//                   online softmax, O += P V on m16n8k16 (P rounded to T, as fa2 does); the four
//                   warps merge at the end. Writes the partials decode_split writes.
//                   Should buy: loads run two tiles ahead of the math instead of each warp
//                   waiting on its own, and 16 keys cost 16 + 16 mmas instead of 2048 FMAs, so
//                   the walk is held by memory alone.
//  decode_merge     decode_mma with the combine step folded in: a group's only split writes its
//                   output itself, and otherwise the last split of a (sequence, head group) to
//                   finish (a counter per group, reset by that block for the next launch) merges
//                   every split's partials. Should buy: one launch a step instead of two, and no
//                   partials' round trip where one split covers the context.
//  decode_combine   block (D,1,1), grid (Hq, B), dynamic smem 4 (nsplit + 1): merges the splits
//                   that hold rows (dec_merge_splits for one head).

#include "common.cuh"
#include "mma.cuh"
#include "pdl.cuh"

#define DEC_WARPS 4

// Address of row j of sequence b's head kvh in a paged cache.
__device__ __forceinline__ long long dec_row(const int* __restrict__ table, int b, int max_pages, int page, int j, int hkv, int kvh,
                                             int D) {
    const int p = table[b * max_pages + j / page];
    return (((long long)p * page + j % page) * hkv + kvh) * D;
}

#define DEC_LN2 0.69314718055994531f

// Merges the `used` splits' partials of query heads bh0..bh0+gn-1 (rows of [B * Hq]) into o and,
// when given, the natural-log lse. f: gn * used + gn floats of shared memory. Each split's weight
// exp2(m_s - max) goes to f first, so the output loop's loads are independent of each other: one
// latency for a batch of splits rather than one per split. Reads with ld.global.cg: the partials
// may have been written by other blocks of this grid (the caller fenced), never through this
// SM's L1.
template <typename T>
__device__ void dec_merge_splits(const float* __restrict__ part_o, const float* __restrict__ part_ml, long long bh0, int gn, int D, int nsplit,
                                 int used, T* __restrict__ o, float* __restrict__ lse, float* f) {
    float* tot = f + gn * used;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int r = warp; r < gn; r += warps) {
        const float2* ml = reinterpret_cast<const float2*>(part_ml) + (bh0 + r) * nsplit;
        float mx = NEG_INF;
        for (int s = lane; s < used; s += 32) mx = fmax_nan(mx, __ldcg(&ml[s]).x);
        mx = warp_reduce_max(mx);
        float sum = 0.f;
        for (int s = lane; s < used; s += 32) {
            const float2 v = __ldcg(&ml[s]);
            const float w = exp2f(v.x - safe_shift(mx));
            f[r * used + s] = w;
            sum += v.y * w;
        }
        sum = warp_reduce_sum(sum);
        if (lane == 0) {
            tot[r] = sum;
            if (lse) lse[bh0 + r] = (mx + log2f(sum)) * DEC_LN2;
        }
    }
    __syncthreads();
    const int Q = D / 4;  // float4 columns of a row
    for (int i = threadIdx.x; i < gn * Q; i += blockDim.x) {
        const int r = i / Q, c = i % Q;
        const float4* p = reinterpret_cast<const float4*>(part_o + (bh0 + r) * nsplit * D) + c;
        const float* w = f + r * used;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
        for (int s = 0; s < used; ++s) {
            const float4 v = __ldcg(p + (long long)s * Q);
            a.x += v.x * w[s], a.y += v.y * w[s], a.z += v.z * w[s], a.w += v.w * w[s];
        }
        T* out = o + (bh0 + r) * D + 4 * c;
        out[0] = from_float<T>(a.x / tot[r]), out[1] = from_float<T>(a.y / tot[r]);
        out[2] = from_float<T>(a.z / tot[r]), out[3] = from_float<T>(a.w / tot[r]);
    }
}

// The block's rows written out after its warps walked their keys: wml [DEC_WARPS][R][2] (max,
// sum) and wo [DEC_WARPS][R][D] in shared memory, a warp that saw no key holding -inf, 0, 0. The
// warps are merged and stored as split `split`'s partials of heads h0..h0+gn-1. With MERGE, a
// group whose context one split covers writes o (and lse) itself, and otherwise the last split of
// the group to count itself in merges all of them into o, with `scratch` (shared memory, at
// least gn * used + gn floats, wo and wml no longer needed) for the weights.
template <typename T, bool MERGE>
__device__ void dec_store(const float* wo, const float* wml, int R, int D, int gn, int b, int h0, int hq, int split, int used,
                          float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counts, T* __restrict__ o,
                          float* __restrict__ lse, float* scratch) {
    const int nsplit = gridDim.x;
    const bool direct = MERGE && used == 1;
    for (int i = threadIdx.x; i < gn * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        float mx = NEG_INF;
        for (int w = 0; w < DEC_WARPS; ++w) mx = fmax_nan(mx, wml[(w * R + r) * 2]);
        float acc = 0.f, sum = 0.f;
        for (int w = 0; w < DEC_WARPS; ++w) {
            const float f = exp2f(wml[(w * R + r) * 2] - safe_shift(mx));
            acc += wo[(w * R + r) * D + d] * f;
            sum += wml[(w * R + r) * 2 + 1] * f;
        }
        const long long bh = (long long)b * hq + h0 + r;
        if (direct) {
            o[bh * D + d] = from_float<T>(acc / sum);
            if (d == 0 && lse) lse[bh] = (mx + log2f(sum)) * DEC_LN2;
            continue;
        }
        const long long slot = bh * nsplit + split;
        part_o[slot * D + d] = acc;
        if (d == 0) {
            part_ml[slot * 2] = mx;
            part_ml[slot * 2 + 1] = sum;
        }
    }
    if (!MERGE || direct) return;
    // The barrier orders every thread's partials before thread 0's fence (fences are
    // cumulative), the fence before the count: one fence a block, not one a thread. The last
    // block's fence after the count orders its reads of the other splits' partials after it.
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        int* count = counts + (long long)b * gridDim.y + blockIdx.y;
        last = atomicAdd(count, 1) == used - 1;
        if (last) {
            *count = 0;  // every split has counted: ready for the next launch
            __threadfence();
        }
    }
    __syncthreads();
    if (!last) return;
    dec_merge_splits<T>(part_o, part_ml, (long long)b * hq + h0, gn, D, nsplit, used, o, lse, scratch);
}

template <int BYTES> struct DecVRaw;
template <> struct DecVRaw<8> { using type = uint2; };
template <> struct DecVRaw<4> { using type = unsigned; };

template <typename T, int D, int GM>
__device__ void decode_split(const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc, const int* __restrict__ table,
                             const int* __restrict__ pos, float* __restrict__ part_o, float* __restrict__ part_ml, int hq, int hkv,
                             int page, int max_pages, int chunk, float scale_log2) {
    constexpr int C = D / 32;  // columns per lane in the PV walk
    constexpr int V8 = D / 8;  // 16-byte vectors per K row
    using VRaw = typename DecVRaw<C * sizeof(T)>::type;  // one lane's C values of a V row
    __shared__ float qs[GM][D];
    __shared__ float wml[DEC_WARPS][GM][2];
    __shared__ float wacc[DEC_WARPS][GM][D];
    const int split = blockIdx.x, b = blockIdx.z, G = hq / hkv, subs = (G + GM - 1) / GM;
    const int kvh = blockIdx.y / subs, h0 = kvh * G + (blockIdx.y % subs) * GM;
    const int gn = min(GM, kvh * G + G - h0);
    const int len = pos[b] + 1, start = split * chunk, end = min(len, start + chunk);
    if (start >= end) return;  // the combine step reads only splits that hold rows
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < GM * D; i += blockDim.x) {
        const int g = i / D, d = i % D;
        qs[g][d] = g < gn ? to_float(q[((long long)b * hq + h0 + g) * D + d]) * scale_log2 : 0.f;
    }
    __syncthreads();
    float m[GM], l[GM], acc[GM][C];
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        m[g] = NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int c = 0; c < C; ++c) acc[g][c] = 0.f;
    }
    for (int t0 = start + warp * 32; t0 < end; t0 += DEC_WARPS * 32) {
        const int j = t0 + lane, rows = min(32, end - t0);
        const long long off = j < end ? dec_row(table, b, max_pages, page, j, hkv, kvh, D) : 0;
        // The tile's V rows (lane l holds columns l*C..l*C+C of each), issued before the scores
        // need K: both tiles are in flight at once rather than V one latency per row.
        VRaw vraw[32];
#pragma unroll
        for (int r = 0; r < 32; ++r) {
            const long long ro = __shfl_sync(0xffffffffu, off, r);
            vraw[r] = r < rows ? *reinterpret_cast<const VRaw*>(vc + ro + lane * C) : VRaw{};
        }
        float s[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) s[g] = 0.f;
        if (j < end) {
            const uint4* kr = reinterpret_cast<const uint4*>(kc + off);
#pragma unroll
            for (int v = 0; v < V8; ++v) {
                float kf[8];
                load_vec16<T>(reinterpret_cast<const T*>(kr + v), kf);
#pragma unroll
                for (int g = 0; g < GM; ++g) {
                    if (g < gn) {
#pragma unroll
                        for (int e = 0; e < 8; ++e) s[g] += kf[e] * qs[g][v * 8 + e];
                    }
                }
            }
        }
        // Only the gn heads of this block: gn is uniform over the block, so the skipped groups
        // cost no shuffles (SmolLM2's groups of 3 would otherwise pay for 4).
        float p[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            p[g] = 0.f;
            if (g >= gn) continue;
            const float sj = j < end ? s[g] : NEG_INF;
            const float mn = fmax_nan(m[g], warp_reduce_max(sj));
            const float alpha = exp2f(m[g] - safe_shift(mn));
            p[g] = exp2f(sj - safe_shift(mn));
            l[g] = l[g] * alpha + warp_reduce_sum(p[g]);
            m[g] = mn;
#pragma unroll
            for (int c = 0; c < C; ++c) acc[g][c] *= alpha;
        }
        // Rows past the tile's end hold zeros and weigh p = 0.
#pragma unroll
        for (int r = 0; r < 32; ++r) {
            const T* e = reinterpret_cast<const T*>(&vraw[r]);
            float vf[C];
#pragma unroll
            for (int c = 0; c < C; ++c) vf[c] = to_float(e[c]);
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                if (g >= gn) continue;
                const float pr = __shfl_sync(0xffffffffu, p[g], r);
#pragma unroll
                for (int c = 0; c < C; ++c) acc[g][c] += pr * vf[c];
            }
        }
    }
    // The warps' rows to shared memory, then merged and stored.
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            wml[warp][g][0] = m[g];
            wml[warp][g][1] = l[g];
        }
    }
#pragma unroll
    for (int g = 0; g < GM; ++g) {
#pragma unroll
        for (int c = 0; c < C; ++c) wacc[warp][g][lane * C + c] = acc[g][c];
    }
    __syncthreads();
    dec_store<T, false>(&wacc[0][0][0], &wml[0][0][0], GM, D, gn, b, h0, hq, split, 0, part_o, part_ml, nullptr, nullptr, nullptr, nullptr);
}

constexpr int DM_BN = 64, DM_STAGES = 3;
// Q (16 rows) and the ring of K and V tiles, pitch D + 8 (the 8 rows an ldmatrix reads fall in
// distinct banks): 108,800 bytes at D = 128, two blocks per SM.
#define DM_SMEM(D) ((16 + 2 * DM_STAGES * DM_BN) * ((D) + 8) * 2)

// Rows [row0, row0 + DM_BN) of sequence b's KV head kvh into the tiles sk and sv; rows at or
// past `end` are zero-filled and not read.
template <typename T, int D>
__device__ __forceinline__ void dm_load_tile(T* sk, T* sv, const T* __restrict__ kc, const T* __restrict__ vc, const int* __restrict__ table,
                                             int b, int max_pages, int page, int hkv, int kvh, int row0, int end) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int c = threadIdx.x; c < DM_BN * CHUNKS; c += DEC_WARPS * 32) {
        const int r = c / CHUNKS, cc = c % CHUNKS, j = row0 + r;
        const bool in = j < end;
        const long long off = in ? dec_row(table, b, max_pages, page, j, hkv, kvh, D) + cc * 8 : 0;
        cp_async16(smem_addr(sk + r * (D + 8) + cc * 8), kc + off, in ? 16 : 0);
        cp_async16(smem_addr(sv + r * (D + 8) + cc * 8), vc + off, in ? 16 : 0);
    }
}

template <typename T, int D, bool MERGE>
__device__ void decode_mma(const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc, const int* __restrict__ table,
                           const int* __restrict__ pos, float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counts,
                           T* __restrict__ o, float* __restrict__ lse, int hq, int hkv, int page, int max_pages, int chunk, float scale_log2) {
    constexpr int LD = D + 8, TILE = DM_BN * LD;
    extern __shared__ __align__(16) unsigned char dm_smem[];
    T* sQ = reinterpret_cast<T*>(dm_smem);
    T* sK = sQ + 16 * LD;
    T* sV = sK + DM_STAGES * TILE;
    const int split = blockIdx.x, b = blockIdx.z, G = hq / hkv, subs = (G + 15) / 16;
    const int kvh = blockIdx.y / subs, h0 = kvh * G + (blockIdx.y % subs) * 16;
    const int gn = min(16, kvh * G + G - h0);
    const int len = pos[b] + 1, start = split * chunk, end = min(len, start + chunk);
    if (start >= end) return;  // the combine step reads only splits that hold rows
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    const int2 lm = ldmatrix_x4_lane(lane), lk = ldmatrix_x4_lane_nk(lane);  // Q, V; K (n x k)
    const int tiles = (end - start + DM_BN - 1) / DM_BN;

    // The block's query heads as rows 0..gn-1; the rest zero (their outputs are not written).
    for (int c = threadIdx.x; c < 16 * (D / 8); c += DEC_WARPS * 32) {
        const int r = c / (D / 8), cc = c % (D / 8);
        const bool in = r < gn;
        cp_async16(smem_addr(sQ + r * LD + cc * 8), in ? q + ((long long)b * hq + h0 + r) * D + cc * 8 : q, in ? 16 : 0);
    }
    // Tiles 0..DM_STAGES-2 in flight, one commit group each (Q rides with the first).
#pragma unroll
    for (int st = 0; st < DM_STAGES - 1; ++st) {
        if (st < tiles) dm_load_tile<T, D>(sK + st * TILE, sV + st * TILE, kc, vc, table, b, max_pages, page, hkv, kvh, start + st * DM_BN, end);
        cp_async_commit();
    }
    unsigned qf[D / 16][4];
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};  // rows g and g + 8, log2 units

    for (int it = 0; it < tiles; ++it) {
        cp_async_wait<DM_STAGES - 2>();  // tile it has landed (this thread's copies)
        __syncthreads();                 // ... everyone's; and every warp is done with tile it - 1
        const int nt = it + DM_STAGES - 1;
        if (nt < tiles) dm_load_tile<T, D>(sK + (nt % DM_STAGES) * TILE, sV + (nt % DM_STAGES) * TILE, kc, vc, table, b, max_pages, page, hkv, kvh, start + nt * DM_BN, end);
        cp_async_commit();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], smem_addr(&sQ[lm.x * LD + kk * 16 + lm.y * 8]));
        }
        const T* Kt = sK + (it % DM_STAGES) * TILE + warp * 16 * LD;  // the warp's 16 keys
        const T* Vt = sV + (it % DM_STAGES) * TILE + warp * 16 * LD;
        const int key0 = start + it * DM_BN + warp * 16;

        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned r[4];
            ldmatrix_x4(r, smem_addr(&Kt[lk.x * LD + kk * 16 + lk.y * 8]));
            Mma<T>::run(s[0], qf[kk], r);
            Mma<T>::run(s[1], qf[kk], r + 2);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = key0 + j * 8 + 2 * t + (e & 1) < end ? s[j][e] * scale_log2 : NEG_INF;
        // Online softmax per row (a quad of lanes shares one).
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = fmax_nan(m[r], fmax_nan(fmax_nan(s[0][2 * r], s[0][2 * r + 1]), fmax_nan(s[1][2 * r], s[1][2 * r + 1])));
            mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float shift = safe_shift(mx);
            alpha[r] = exp2f(m[r] - shift);
            m[r] = mx;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                s[j][2 * r] = exp2f(s[j][2 * r] - shift);
                s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - shift);
            }
            l[r] = l[r] * alpha[r] + s[0][2 * r] + s[0][2 * r + 1] + s[1][2 * r] + s[1][2 * r + 1];  // the quad is summed at the end
        }
        // O += P V over the 16 keys: P's accumulator layout is the next mma's A fragment.
        unsigned pa[4];
        acc_a_frag<T>(s[0], s[1], pa);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            acc[n][0] *= alpha[0], acc[n][1] *= alpha[0], acc[n][2] *= alpha[1], acc[n][3] *= alpha[1];
            acc[n + 1][0] *= alpha[0], acc[n + 1][1] *= alpha[0], acc[n + 1][2] *= alpha[1], acc[n + 1][3] *= alpha[1];
            unsigned r[4];
            ldmatrix_x4_trans(r, smem_addr(&Vt[lm.x * LD + n * 8 + lm.y * 8]));
            Mma<T>::run(acc[n], pa, r);
            Mma<T>::run(acc[n + 1], pa, r + 2);
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is free: the warps merge through it

    // The warps' rows to shared memory, then merged and stored.
    float* wo = reinterpret_cast<float*>(sK);  // [warp][16][D]
    float* wml = wo + DEC_WARPS * 16 * D;      // [warp][16][2]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float lr = l[r];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const int row = g + 8 * r;
        if (t == 0) {
            wml[(warp * 16 + row) * 2] = m[r];
            wml[(warp * 16 + row) * 2 + 1] = lr;
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            wo[(warp * 16 + row) * D + n * 8 + 2 * t] = acc[n][2 * r];
            wo[(warp * 16 + row) * D + n * 8 + 2 * t + 1] = acc[n][2 * r + 1];
        }
    }
    __syncthreads();
    const int used = min((int)gridDim.x, (len + chunk - 1) / chunk);
    dec_store<T, MERGE>(wo, wml, 16, D, gn, b, h0, hq, split, used, part_o, part_ml, counts, o, lse, reinterpret_cast<float*>(dm_smem));
}

// One head of one sequence per block.
template <typename T>
__device__ void decode_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml, const int* __restrict__ pos,
                               T* __restrict__ o, float* __restrict__ lse, int hq, int D, int chunk, int nsplit) {
    extern __shared__ float dc_f[];
    const int used = min(nsplit, (pos[blockIdx.y] + 1 + chunk - 1) / chunk);
    dec_merge_splits<T>(part_o, part_ml, (long long)blockIdx.y * hq + blockIdx.x, 1, D, nsplit, used, o, lse, dc_f);
}

#define DECODE_SPLIT(T, SUF, D, GM)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attention_decode_split_d##D##_g##GM##_##SUF(                      \
        const T* q, const T* kc, const T* vc, const int* table, const int* pos, float* part_o, float* part_ml, int hq, int hkv,       \
        int page, int max_pages, int chunk, float scale_log2) {                                                                      \
        pdl_wait();                                                                                                                  \
        decode_split<T, D, GM>(q, kc, vc, table, pos, part_o, part_ml, hq, hkv, page, max_pages, chunk, scale_log2);                 \
    }
#define DECODE_MMA(T, SUF, D)                                                                                                        \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attention_decode_mma_d##D##_##SUF(                                      \
        const T* q, const T* kc, const T* vc, const int* table, const int* pos, float* part_o, float* part_ml, int hq, int hkv,       \
        int page, int max_pages, int chunk, float scale_log2) {                                                                      \
        pdl_wait();                                                                                                                  \
        decode_mma<T, D, false>(q, kc, vc, table, pos, part_o, part_ml, nullptr, nullptr, nullptr, hq, hkv, page, max_pages, chunk,  \
                                scale_log2);                                                                                         \
    }                                                                                                                                \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attention_decode_merge_d##D##_##SUF(                                    \
        const T* q, const T* kc, const T* vc, const int* table, const int* pos, float* part_o, float* part_ml, int* counts, T* o,     \
        float* lse, int hq, int hkv, int page, int max_pages, int chunk, float scale_log2) {                                         \
        pdl_wait();                                                                                                                  \
        decode_mma<T, D, true>(q, kc, vc, table, pos, part_o, part_ml, counts, o, lse, hq, hkv, page, max_pages, chunk, scale_log2); \
    }
#define DECODE_KERNELS(T, SUF, D) DECODE_SPLIT(T, SUF, D, 1) DECODE_SPLIT(T, SUF, D, 2) DECODE_SPLIT(T, SUF, D, 4) DECODE_SPLIT(T, SUF, D, 8) DECODE_MMA(T, SUF, D)
DECODE_KERNELS(__half, f16, 64)
DECODE_KERNELS(__half, f16, 128)
DECODE_KERNELS(__nv_bfloat16, bf16, 64)
DECODE_KERNELS(__nv_bfloat16, bf16, 128)

extern "C" __global__ void attention_decode_combine_f16(const float* part_o, const float* part_ml, const int* pos, __half* o, float* lse,
                                                         int hq, int D, int chunk, int nsplit) {
    pdl_wait();
    decode_combine<__half>(part_o, part_ml, pos, o, lse, hq, D, chunk, nsplit);
}
extern "C" __global__ void attention_decode_combine_bf16(const float* part_o, const float* part_ml, const int* pos, __nv_bfloat16* o,
                                                          float* lse, int hq, int D, int chunk, int nsplit) {
    pdl_wait();
    decode_combine<__nv_bfloat16>(part_o, part_ml, pos, o, lse, hq, D, chunk, nsplit);
}
