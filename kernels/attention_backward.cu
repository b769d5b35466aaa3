// attention_backward.cu: the backward of attention.cu's forward: dQ, dK, dV from Q, K, V, O, dO and
// the forward's log-sum-exp (lse), with P_ij = exp(scale q_i.k_j - lse_i) on kept pairs,
// dP = dO V^T, D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij, dS = P (dP - D), dQ = scale dS K,
// dK = scale dS^T Q, dV = P^T dO; a key/value head sums over the query heads that share it.
// Compiled after attention.cu in one module: it uses attn_keep, fa_load_tile, pack2, FA_BN.
//
//  1. naive_bwd        four kernels through two fp32 scratches of B Hq Sq Sk: P and dP (one thread
//                      per pair), dS = P (dP - rowsum(P dP)) in place (a block per row), dQ (one
//                      thread per output), dK and dV (one thread per output, summing the group's
//                      heads). The correctness baseline; D comes from P dP, not from O.
//  2. fa2_bwd          FlashAttention 2's backward on mma.sync (m16n8k16): a preprocessing kernel
//                      (D = rowsum(dO * O), dQ's fp32 accumulator zeroed); then a block of 4 warps
//                      per 64-key tile of a KV head (each warp 16 keys), K and V resident in shared
//                      memory, walking the 64-row query tiles of every query head of its group
//                      (Q, dO, lse, D double-buffered through cp.async), recomputing P^T from lse,
//                      accumulating dK and dV in registers; dS goes through shared memory so each
//                      warp adds dQ for 16 query rows to the fp32 accumulator by atomics; a last
//                      kernel scales dQ and rounds it to T.
//                      dQ by atomics, not a second pass: a separate dQ kernel recomputes S and dP
//                      (2 of the 5 matmuls) again, 1.4x the tensor work; the atomics add
//                      Sk/64 fp32 reductions per dQ element, resolved in L2.
//                      Should buy: S, P, dP and dS never leave the SM; bound by the tensor pipe.
//                      block (128,1,1), grid (ceil(Sk/64), Hkv, B), dynamic smem FA_BWD_SMEM(D).
//  3. fa2_bwd_det      fa2_bwd without the dQ atomics (its dK/dV kernel alone), and dQ by a second
//                      kernel over query tiles (FlashAttention 1's split): a block of 4 warps per
//                      64 query rows of a head walks the key tiles in order, recomputes S = Q K^T
//                      and dP = dO V^T, and accumulates dQ += dS K in registers, so every dQ
//                      element is summed in one order by one thread: bit-identical run to run.
//                      Should cost: 7 of the tiles' matmuls instead of 5, less the atomics.
//                      dQ kernel: block (128,1,1), grid (ceil(Sq/64), Hq, B), FA_BWD_DQ_SMEM(D).
//                      It also takes packed variable-length batches (attention.cu's offsets).
#include "mma.cuh"

// ---------------------------------------------------------------------------------------------
// 1. naive_bwd
// ---------------------------------------------------------------------------------------------
// p[b,h,i,j] = exp(scale q_i.k_j - lse_i) and dp[b,h,i,j] = do_i.v_j where kept, else 0.
// grid (ceil(Sk/256), Sq, B*Hq).
template <typename T>
__device__ void naive_bwd_pdp(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                              const float* __restrict__ lse, float* __restrict__ p, float* __restrict__ dp, int Sq, int Sk, int Hq,
                              int Hkv, int D, float scale, int causal, int window) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    const int b = blockIdx.z / Hq, h = blockIdx.z % Hq, hk = h / (Hq / Hkv);
    if (j >= Sk) return;
    float pij = 0.f, dpij = 0.f;
    if (attn_keep(i, j, Sk, Sk - Sq, causal, window)) {
        const T* qi = q + (((long long)b * Sq + i) * Hq + h) * D;
        const T* oi = dout + (((long long)b * Sq + i) * Hq + h) * D;
        const T* kj = k + (((long long)b * Sk + j) * Hkv + hk) * D;
        const T* vj = v + (((long long)b * Sk + j) * Hkv + hk) * D;
        float s = 0.f;
        for (int d = 0; d < D; ++d) s += to_float(qi[d]) * to_float(kj[d]), dpij += to_float(oi[d]) * to_float(vj[d]);
        pij = __expf(s * scale - lse[((long long)b * Hq + h) * Sq + i]);
    }
    const long long at = (((long long)b * Hq + h) * Sq + i) * Sk + j;
    p[at] = pij;
    dp[at] = dpij;
}

// ds = p (dp - sum_j p dp) in place of dp; a block of 256 per row.
__device__ void naive_bwd_ds(const float* __restrict__ p, float* __restrict__ dp, int Sk) {
    const float* pr = p + (long long)blockIdx.x * Sk;
    float* row = dp + (long long)blockIdx.x * Sk;
    float sum = 0.f;
    for (int j = threadIdx.x; j < Sk; j += blockDim.x) sum += pr[j] * row[j];
    sum = block_reduce_sum(sum);
    for (int j = threadIdx.x; j < Sk; j += blockDim.x) row[j] = pr[j] * (row[j] - sum);
}

// dq[b,i,h,d] = scale sum_j ds[b,h,i,j] k[b,j,hk,d]. grid (ceil(D/64), Sq, B*Hq), block 64.
template <typename T>
__device__ void naive_bwd_dq(const float* __restrict__ ds, const T* __restrict__ k, T* __restrict__ dq, int Sq, int Sk, int Hq, int Hkv,
                             int D, float scale) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    const int b = blockIdx.z / Hq, h = blockIdx.z % Hq, hk = h / (Hq / Hkv);
    if (d >= D) return;
    const float* dsi = ds + (((long long)b * Hq + h) * Sq + i) * Sk;
    float acc = 0.f;
    for (int j = 0; j < Sk; ++j) acc += dsi[j] * to_float(k[(((long long)b * Sk + j) * Hkv + hk) * D + d]);
    dq[(((long long)b * Sq + i) * Hq + h) * D + d] = from_float<T>(acc * scale);
}

// dk[b,j,hk,d] = scale sum_{h, i} ds[b,h,i,j] q[b,i,h,d] and dv = sum p[b,h,i,j] do[b,i,h,d] over
// the query heads h of key/value head hk. grid (ceil(D/64), Sk, B*Hkv), block 64.
template <typename T>
__device__ void naive_bwd_dkv(const float* __restrict__ p, const float* __restrict__ ds, const T* __restrict__ q, const T* __restrict__ dout,
                              T* __restrict__ dk, T* __restrict__ dv, int Sq, int Sk, int Hq, int Hkv, int D, float scale) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y;
    const int b = blockIdx.z / Hkv, hk = blockIdx.z % Hkv, group = Hq / Hkv;
    if (d >= D) return;
    float ak = 0.f, av = 0.f;
    for (int h = hk * group; h < (hk + 1) * group; ++h) {
        for (int i = 0; i < Sq; ++i) {
            const long long at = (((long long)b * Hq + h) * Sq + i) * Sk + j, x = (((long long)b * Sq + i) * Hq + h) * D + d;
            ak += ds[at] * to_float(q[x]);
            av += p[at] * to_float(dout[x]);
        }
    }
    const long long y = (((long long)b * Sk + j) * Hkv + hk) * D + d;
    dk[y] = from_float<T>(ak * scale);
    dv[y] = from_float<T>(av);
}

// ---------------------------------------------------------------------------------------------
// 2. fa2_bwd
// ---------------------------------------------------------------------------------------------
// delta[b,h,i] = sum_d do[b,i,h,d] o[b,i,h,d], and dq_acc's row zeroed (if any): a warp per row of
// [B, Sq, Hq], or of a packed batch's [total_q, Hq] (`packed`: delta laid out as its lse, [Hq,
// total_q]). grid (ceil(rows / 4)), block 128.
template <typename T>
__device__ void fa2_bwd_pre(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ delta, float* __restrict__ dq_acc,
                            int rows, int Sq, int Hq, int D, int packed) {
    const int r = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const long long base = (long long)r * D;
    float sum = 0.f;
    for (int d = lane; d < D; d += 32) {
        sum += to_float(o[base + d]) * to_float(dout[base + d]);
        if (dq_acc) dq_acc[base + d] = 0.f;  // fa2_bwd_det has no accumulator
    }
    sum = warp_reduce_sum(sum);
    const int b = r / (Sq * Hq), i = r / Hq % Sq, h = r % Hq;
    if (lane == 0) delta[packed ? (long long)h * (rows / Hq) + r / Hq : ((long long)b * Hq + h) * Sq + i] = sum;
}

// dq = T(scale dq_acc), grid-stride.
template <typename T>
__device__ void fa2_bwd_dq(const float* __restrict__ dq_acc, T* __restrict__ dq, long long n, float scale) {
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < n; x += (long long)gridDim.x * blockDim.x)
        dq[x] = from_float<T>(dq_acc[x] * scale);
}

constexpr int FA_BWD_BM = 64, FA_BWD_LDS = FA_BN + 8;  // query rows per tile; dS's padded pitch

// The backward's paired products over the head dimension: x = A B^T and y = C E^T for one warp's
// 16 rows of A and C (from row `row` of their tiles) against the N rows of B and E, every tile in
// shared memory with rows of D + 8 elements (B and E held n x k). The dK/dV kernel takes
// S^T = K Q^T with dP^T = V dO^T, the dQ kernel S = Q K^T with dP = dO V^T.
template <typename T, int D, int N>
__device__ __forceinline__ void fa_bwd_products(const T* A, const T* C, int row, const T* B, const T* E, float (&x)[N / 8][4],
                                                float (&y)[N / 8][4]) {
    constexpr int LD = D + 8;
    const int lane = threadIdx.x % 32;
    const int2 lm = ldmatrix_x4_lane(lane), lk = ldmatrix_x4_lane_nk(lane);  // A and C; B and E held n x k
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[j][e] = y[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned a[4], c[4];
        ldmatrix_x4(a, smem_addr(&A[(row + lm.x) * LD + kk * 16 + lm.y * 8]));
        ldmatrix_x4(c, smem_addr(&C[(row + lm.x) * LD + kk * 16 + lm.y * 8]));
#pragma unroll
        for (int j = 0; j < N / 8; j += 2) {
            const int at = (j * 8 + lk.x) * LD + kk * 16 + lk.y * 8;
            unsigned r[4];
            ldmatrix_x4(r, smem_addr(&B[at]));
            Mma<T>::run(x[j], a, r);
            Mma<T>::run(x[j + 1], a, r + 2);
            ldmatrix_x4(r, smem_addr(&E[at]));
            Mma<T>::run(y[j], c, r);
            Mma<T>::run(y[j + 1], c, r + 2);
        }
    }
}

// DQ: add dQ by atomics (fa2_bwd); without it the kernel computes dK and dV only (fa2_bwd_det).
template <typename T, int D, bool DQ>
__device__ void fa2_backward(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                             const float* __restrict__ lse, const float* __restrict__ delta, float* __restrict__ dq_acc, T* __restrict__ dk,
                             T* __restrict__ dv, const int* __restrict__ cu_q, const int* __restrict__ cu_k, int Sq, int Sk, int Hq, int Hkv,
                             float scale, int causal, int window) {
    constexpr int BM = FA_BWD_BM, LD = D + 8, LDS = FA_BWD_LDS;
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    T* sK = reinterpret_cast<T*>(fa_smem);
    T* sV = sK + FA_BN * LD;
    T* sQ = sV + FA_BN * LD;     // two buffers
    T* sdO = sQ + 2 * BM * LD;   // two buffers
    T* sdS = sdO + 2 * BM * LD;  // [query][key]
    float* sL = reinterpret_cast<float*>(sdS + BM * LDS);  // two buffers of lse log2(e)
    float* sD = sL + 2 * BM;                               // two buffers of delta
    const int kv0 = blockIdx.x * FA_BN, hk = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
    const AttnSeq seq = attn_seq(cu_q, cu_k, b, Sq, Sk, Hq);
    Sq = seq.sq, Sk = seq.sk;
    if (kv0 >= Sk) return;  // a shorter sequence of a variable-length batch
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int2 lm = ldmatrix_x4_lane(lane);  // A and .trans B
    const int off = Sk - Sq, kw = warp * 16;  // kw: the warp's first key in the tile
    const long long qs = (long long)Hq * D, ks = (long long)Hkv * D;
    const T* kb = k + seq.k_row0 * ks + (long long)hk * D;
    const T* vb = v + seq.k_row0 * ks + (long long)hk * D;

    // The query rows any key of this tile keeps: [lo, hi); causal bounds them below, a window above.
    int lo = 0, hi = Sq;
    if (causal) lo = max(0, kv0 - off);
    if (window > 0) hi = min(Sq, min(kv0 + FA_BN, Sk) - 1 - off + window);
    lo = lo / BM * BM;
    const int qtiles = hi > lo ? (hi - lo + BM - 1) / BM : 0, total = group * qtiles;

    // Query tile `it` (head hk group + it / qtiles, rows from lo + (it % qtiles) BM) into buffer `buf`.
    auto load_q = [&](int it, int buf) {
        const int h = hk * group + it / qtiles, i0 = lo + it % qtiles * BM;
        const long long head = seq.q_row0 * qs + (long long)h * D;
        fa_load_tile<T, D, BM>(sQ + buf * BM * LD, q + head, qs, i0, Sq);
        fa_load_tile<T, D, BM>(sdO + buf * BM * LD, dout + head, qs, i0, Sq);
        const int r = threadIdx.x % BM, i = i0 + r;
        const long long at = seq.lse0 + h * seq.lse_head + i;
        if (threadIdx.x < BM) sL[buf * BM + r] = i < Sq ? lse[at] * LOG2E : 0.f;
        else sD[buf * BM + r] = i < Sq ? delta[at] : 0.f;
    };
    fa_load_tile<T, D, FA_BN>(sK, kb, ks, kv0, Sk);
    fa_load_tile<T, D, FA_BN>(sV, vb, ks, kv0, Sk);
    if (total > 0) load_q(0, 0);
    cp_async_commit();

    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dka[n][e] = dva[n][e] = 0.f;
    const float sl2 = scale * LOG2E;

    for (int it = 0; it < total; ++it) {
        const int buf = it & 1, h = hk * group + it / qtiles, i0 = lo + it % qtiles * BM;
        if (it + 1 < total) load_q(it + 1, buf ^ 1);  // the next tile streams in while this one is used
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T* Qt = sQ + buf * BM * LD;
        const T* Ot = sdO + buf * BM * LD;
        const float* Lt = sL + buf * BM;
        const float* Dt = sD + buf * BM;

        // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys and the tile's 64 queries.
        float st[BM / 8][4], dpt[BM / 8][4];
        fa_bwd_products<T, D, BM>(sK, sV, kw, Qt, Ot, st, dpt);
        // P^T from lse where kept (0 elsewhere, never through -inf arithmetic), dS^T = P^T (dP^T - D).
        const bool edge = i0 + BM > Sq || kv0 + FA_BN > Sk || (causal && kv0 + FA_BN - 1 > i0 + off) ||
                          (window > 0 && kv0 <= i0 + BM - 1 + off - window);
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = kv0 + kw + g + (e < 2 ? 0 : 8), qi = j * 8 + 2 * t + (e & 1);
                const bool keep = !edge || (i0 + qi < Sq && attn_keep(i0 + qi, key, Sk, off, causal, window));
                const float p = keep ? exp2f(st[j][e] * sl2 - Lt[qi]) : 0.f;
                st[j][e] = p;
                dpt[j][e] = p * (dpt[j][e] - Dt[qi]);
            }
        }
        // dV += P^T dO and dK += dS^T Q (scaled at the end), k over the tile's 64 queries: the
        // accumulators' layout is the A fragment, rounded to T as the forward rounds P.
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            unsigned pa[4], da[4];
            acc_a_frag<T>(st[2 * kk], st[2 * kk + 1], pa);
            acc_a_frag<T>(dpt[2 * kk], dpt[2 * kk + 1], da);
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                const int at = (kk * 16 + lm.x) * LD + n * 8 + lm.y * 8;
                unsigned r[4];
                ldmatrix_x4_trans(r, smem_addr(&Ot[at]));
                Mma<T>::run(dva[n], pa, r);
                Mma<T>::run(dva[n + 1], pa, r + 2);
                ldmatrix_x4_trans(r, smem_addr(&Qt[at]));
                Mma<T>::run(dka[n], da, r);
                Mma<T>::run(dka[n + 1], da, r + 2);
            }
        }
        // dQ sums over the tile's keys, which four warps hold: dS goes through shared memory.
        if constexpr (DQ) {
#pragma unroll
            for (int j = 0; j < BM / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) sdS[(j * 8 + 2 * t + (e & 1)) * LDS + kw + g + (e < 2 ? 0 : 8)] = from_float<T>(dpt[j][e]);
            __syncthreads();
            // dQ += dS K for the warp's 16 query rows (kw.. of the tile), added to the fp32 accumulator.
            unsigned sa[FA_BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < FA_BN / 16; ++kk) ldmatrix_x4(sa[kk], smem_addr(&sdS[(kw + lm.x) * LDS + kk * 16 + lm.y * 8]));
            float* dqh = dq_acc + seq.q_row0 * qs + (long long)h * D;
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
                for (int kk = 0; kk < FA_BN / 16; ++kk) {
                    unsigned r[4];
                    ldmatrix_x4_trans(r, smem_addr(&sK[(kk * 16 + lm.x) * LD + n * 8 + lm.y * 8]));
                    Mma<T>::run(c[0], sa[kk], r);
                    Mma<T>::run(c[1], sa[kk], r + 2);
                }
#pragma unroll
                for (int x = 0; x < 2; ++x)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = i0 + kw + g + (e < 2 ? 0 : 8);
                        if (row < Sq) atomicAdd(&dqh[row * qs + (n + x) * 8 + 2 * t + (e & 1)], c[x][e]);
                    }
            }
        }
        __syncthreads();  // every warp is done with this buffer and with dS before they are refilled
    }
    cp_async_wait<0>();

    // dK = scale dS^T Q and dV, rows g and g + 8 of the warp's 16 keys.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = kv0 + kw + g + 8 * r;
        if (key >= Sk) continue;
        T* dkr = dk + (seq.k_row0 + key) * ks + (long long)hk * D;
        T* dvr = dv + (seq.k_row0 + key) * ks + (long long)hk * D;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            *reinterpret_cast<unsigned*>(dkr + n * 8 + 2 * t) = pack2<T>(dka[n][2 * r] * scale, dka[n][2 * r + 1] * scale);
            *reinterpret_cast<unsigned*>(dvr + n * 8 + 2 * t) = pack2<T>(dva[n][2 * r], dva[n][2 * r + 1]);
        }
    }
}

// Bytes of dynamic shared memory for head dim D: K, V, two Q and two dO tiles, dS, two lse and
// two D tiles.
#define FA_BWD_SMEM(D) ((2 * FA_BN + 4 * FA_BWD_BM) * ((D) + 8) * 2 + FA_BWD_BM * FA_BWD_LDS * 2 + 4 * FA_BWD_BM * 4)

// ---------------------------------------------------------------------------------------------
// 3. fa2_bwd_det's dQ kernel
// ---------------------------------------------------------------------------------------------
// dq = T(scale sum_j dS_ij k_j) for 64 query rows of head h (16 per warp), key tiles in order,
// K and V double-buffered as in fa2's forward; Q and dO stay in shared memory (each A fragment
// read feeds 16 mmas) so that dQ, S and dP fit the registers at D128.
template <typename T, int D>
__device__ void fa2_bwd_dq_rows(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                                const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ dq, const int* __restrict__ cu_q,
                                const int* __restrict__ cu_k, int Sq, int Sk, int Hq, int Hkv, float scale, int causal, int window) {
    constexpr int BM = FA_BWD_BM, LD = D + 8;
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    T* sQ = reinterpret_cast<T*>(fa_smem);
    T* sdO = sQ + BM * LD;
    T* sK = sdO + BM * LD;        // two buffers
    T* sV = sK + 2 * FA_BN * LD;  // two buffers
    const int q0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
    const AttnSeq seq = attn_seq(cu_q, cu_k, b, Sq, Sk, Hq);
    Sq = seq.sq, Sk = seq.sk;
    if (q0 >= Sq) return;  // a shorter sequence of a variable-length batch
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int2 lm = ldmatrix_x4_lane(lane);
    const int off = Sk - Sq, wrow = warp * 16;
    const long long qs = (long long)Hq * D, ks = (long long)Hkv * D;
    const long long head = seq.q_row0 * qs + (long long)h * D;
    const T* kb = k + seq.k_row0 * ks + (long long)hk * D;
    const T* vb = v + seq.k_row0 * ks + (long long)hk * D;

    const int2 span = attn_key_tiles(q0, BM, Sk, off, causal, window, FA_BN);  // the keys this block's rows keep
    const int lo = span.x, tiles = span.y;

    fa_load_tile<T, D, BM>(sQ, q + head, qs, q0, Sq);
    fa_load_tile<T, D, BM>(sdO, dout + head, qs, q0, Sq);
    if (tiles > 0) {
        fa_load_tile<T, D, FA_BN>(sK, kb, ks, lo, Sk);
        fa_load_tile<T, D, FA_BN>(sV, vb, ks, lo, Sk);
    }
    cp_async_commit();

    // lse (log2 units) and D of rows g and g + 8; rows past Sq have zero Q and dO, so dS = 0.
    float L[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = q0 + wrow + g + 8 * r;
        const long long at = seq.lse0 + h * seq.lse_head + row;
        L[r] = row < Sq ? lse[at] * LOG2E : 0.f;
        Dr[r] = row < Sq ? delta[at] : 0.f;
    }
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    const float sl2 = scale * LOG2E;

    for (int it = 0; it < tiles; ++it) {
        const int kv0 = lo + it * FA_BN, buf = it & 1;
        // The next tile streams in while this one is used.
        fa_kv_step<T, D>(sK, sV, kb, vb, ks, buf, kv0 + FA_BN, Sk, it + 1 < tiles);
        const T* Kt = sK + buf * FA_BN * LD;
        const T* Vt = sV + buf * FA_BN * LD;

        // S = Q K^T and dP = dO V^T for the warp's 16 rows and the tile's 64 keys.
        float s[FA_BN / 8][4], dp[FA_BN / 8][4];
        fa_bwd_products<T, D, FA_BN>(sQ, sdO, wrow, Kt, Vt, s, dp);
        // P from lse where kept (0 elsewhere), dS = P (dP - D), kept in dp.
        const bool edge = kv0 + FA_BN > Sk || (causal && kv0 + FA_BN - 1 > q0 + off) || (window > 0 && kv0 <= q0 + BM - 1 + off - window);
#pragma unroll
        for (int j = 0; j < FA_BN / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = kv0 + j * 8 + 2 * t + (e & 1), r = e < 2 ? 0 : 1, row = q0 + wrow + g + 8 * r;
                const bool keep = !edge || attn_keep(row, key, Sk, off, causal, window);
                const float p = keep ? exp2f(s[j][e] * sl2 - L[r]) : 0.f;
                dp[j][e] = p * (dp[j][e] - Dr[r]);
            }
        }
        // dQ += dS K: dS's accumulator layout is the A fragment, rounded to T as fa2_bwd rounds it.
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; ++kk) {
            unsigned da[4];
            acc_a_frag<T>(dp[2 * kk], dp[2 * kk + 1], da);
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                unsigned r[4];
                ldmatrix_x4_trans(r, smem_addr(&Kt[(kk * 16 + lm.x) * LD + n * 8 + lm.y * 8]));
                Mma<T>::run(acc[n], da, r);
                Mma<T>::run(acc[n + 1], da, r + 2);
            }
        }
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    cp_async_wait<0>();

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = q0 + wrow + g + 8 * r;
        if (row >= Sq) continue;
        T* out = dq + head + (long long)row * qs;
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
            *reinterpret_cast<unsigned*>(out + n * 8 + 2 * t) = pack2<T>(acc[n][2 * r] * scale, acc[n][2 * r + 1] * scale);
    }
}

// Bytes of dynamic shared memory of the dQ kernel: Q, dO, two K and two V tiles.
#define FA_BWD_DQ_SMEM(D) ((2 * FA_BWD_BM + 4 * FA_BN) * ((D) + 8) * 2)

// ---------------------------------------------------------------------------------------------
// Exports: attention_<variant>_<part>_{f16,bf16}; fa2_bwd and fa2_bwd_det per head dim (64, 128).
// ---------------------------------------------------------------------------------------------
#define FA_BWD_EXPORT(TY, T, D)                                                                                                   \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) attention_fa2_bwd_d##D##_##TY(                                       \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta, float* dq_acc, T* dk, T* dv,      \
        int Sq, int Sk, int Hq, int Hkv, float scale, int causal, int window) {                                                   \
        fa2_backward<T, D, true>(q, k, v, dout, lse, delta, dq_acc, dk, dv, nullptr, nullptr, Sq, Sk, Hq, Hkv, scale, causal,     \
                                 window);                                                                                         \
    }                                                                                                                             \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) attention_fa2_bwd_det_d##D##_##TY(                                   \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta, T* dk, T* dv, const int* cu_q,   \
        const int* cu_k, int Sq, int Sk, int Hq, int Hkv, float scale, int causal, int window) {                                  \
        fa2_backward<T, D, false>(q, k, v, dout, lse, delta, nullptr, dk, dv, cu_q, cu_k, Sq, Sk, Hq, Hkv, scale, causal, window); \
    }                                                                                                                             \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) attention_fa2_bwd_det_dq_d##D##_##TY(                                \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta, T* dq, const int* cu_q,          \
        const int* cu_k, int Sq, int Sk, int Hq, int Hkv, float scale, int causal, int window) {                                  \
        fa2_bwd_dq_rows<T, D>(q, k, v, dout, lse, delta, dq, cu_q, cu_k, Sq, Sk, Hq, Hkv, scale, causal, window);                 \
    }
#define ATTN_BWD_EXPORT(TY, T)                                                                                                    \
    extern "C" __global__ void attention_naive_bwd_pdp_##TY(const T* q, const T* k, const T* v, const T* dout, const float* lse,   \
                                                            float* p, float* dp, int Sq, int Sk, int Hq, int Hkv, int D,          \
                                                            float scale, int causal, int window) {                                \
        naive_bwd_pdp<T>(q, k, v, dout, lse, p, dp, Sq, Sk, Hq, Hkv, D, scale, causal, window);                                   \
    }                                                                                                                             \
    extern "C" __global__ void attention_naive_bwd_dq_##TY(const float* ds, const T* k, T* dq, int Sq, int Sk, int Hq, int Hkv,   \
                                                           int D, float scale) {                                                  \
        naive_bwd_dq<T>(ds, k, dq, Sq, Sk, Hq, Hkv, D, scale);                                                                    \
    }                                                                                                                             \
    extern "C" __global__ void attention_naive_bwd_dkv_##TY(const float* p, const float* ds, const T* q, const T* dout, T* dk,    \
                                                            T* dv, int Sq, int Sk, int Hq, int Hkv, int D, float scale) {         \
        naive_bwd_dkv<T>(p, ds, q, dout, dk, dv, Sq, Sk, Hq, Hkv, D, scale);                                                      \
    }                                                                                                                             \
    extern "C" __global__ void attention_fa2_bwd_pre_##TY(const T* o, const T* dout, float* delta, float* dq_acc, int rows,       \
                                                          int Sq, int Hq, int D) {                                                \
        fa2_bwd_pre<T>(o, dout, delta, dq_acc, rows, Sq, Hq, D, 0);                                                               \
    }                                                                                                                             \
    extern "C" __global__ void attention_fa2_bwd_det_pre_##TY(const T* o, const T* dout, float* delta, int rows, int Sq, int Hq,  \
                                                              int D, int packed) {                                                \
        fa2_bwd_pre<T>(o, dout, delta, nullptr, rows, Sq, Hq, D, packed);                                                         \
    }                                                                                                                             \
    extern "C" __global__ void attention_fa2_bwd_dq_##TY(const float* dq_acc, T* dq, long long n, float scale) {                  \
        fa2_bwd_dq<T>(dq_acc, dq, n, scale);                                                                                      \
    }                                                                                                                             \
    FA_BWD_EXPORT(TY, T, 64)                                                                                                      \
    FA_BWD_EXPORT(TY, T, 128)

ATTN_BWD_EXPORT(f16, __half)
ATTN_BWD_EXPORT(bf16, __nv_bfloat16)

extern "C" __global__ void attention_naive_bwd_ds_f32(const float* p, float* dp, int Sk) { naive_bwd_ds(p, dp, Sk); }
