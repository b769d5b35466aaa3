// attention.cu: scaled dot-product attention forward, O = softmax(scale Q K^T + mask) V, with the
// log-sum-exp of every row saved for a backward pass.
// Layout [batch, seq, heads, head_dim] row-major (FlashAttention's), storage T in {f16, bf16},
// arithmetic and softmax statistics in fp32. Query head h reads key/value head h / (Hq / Hkv)
// (MHA, GQA, MQA). Masks: key j of query i is kept when j < Sk and, if causal, j <= i + Sk - Sq
// (aligned bottom-right, as FlashAttention 2 does) and, if window > 0, j > i + Sk - Sq - window.
// A row with no key kept gives O = 0 and lse = -inf.
// Variable-length batches (fa2, fa2_m32 and the wgmma rungs): with cumulative offsets cu_q and
// cu_k (B + 1 ints each, FlashAttention's cu_seqlens), sequence b is rows [cu_q[b], cu_q[b+1]) of
// Q and O, [total_q, Hq, D], and rows [cu_k[b], cu_k[b+1]) of K and V; lse is [Hq, total_q]; Sq and
// Sk are the longest lengths, which size the grid. Null offsets: the dense layout.
//
//  1. naive            three kernels: S = scale Q K^T materialized in fp32 (one thread per score),
//                      a row softmax over S in place (P, lse), then O = P V (one thread per output).
//                      It writes and reads B H Sq Sk 4-byte scores: the memory traffic FlashAttention
//                      removes.
//  2. fa2              FlashAttention 2's loop on mma.sync (m16n8k16): a block of 4 warps owns 64
//                      query rows (16 per warp, Q held in registers), walks 64-key tiles of K and V
//                      double-buffered in padded shared memory through cp.async, keeps S and the
//                      running (max, sum) in registers (online softmax), and never writes S.
//                      Should buy: S never leaves the SM, so the kernel is bound by the tensor pipe.
//                      block (128,1,1), grid (ceil(Sq/64), Hq, B), dynamic smem FA_SMEM(D, 1).
//  3. fa2_m32          fa2 with 32 query rows per warp (128 per block): each K and V fragment read
//                      from shared memory feeds two mmas instead of one; Q re-read from shared
//                      memory each tile to stay within 255 registers.
//                      Should buy: the tensor pipe, not ldmatrix, sets the pace at D128.
//                      block (128,1,1), grid (ceil(Sq/128), Hq, B), dynamic smem FA_SMEM(D, 2).
#include "mma.cuh"

// Is key j of query row i kept? off = Sk - Sq.
__device__ __forceinline__ bool attn_keep(int i, int j, int Sk, int off, int causal, int window) {
    return j < Sk && (!causal || j <= i + off) && (window <= 0 || j > i + off - window);
}

// The tiles of `bn` keys that some of `rows` query rows from q0 keep: (first key, a multiple of
// bn; how many tiles from it).
__device__ __forceinline__ int2 attn_key_tiles(int q0, int rows, int Sk, int off, int causal, int window, int bn) {
    int hi = Sk, lo = 0;
    if (causal) hi = min(Sk, q0 + rows - 1 + off + 1);
    if (window > 0) lo = max(0, q0 + off - window + 1);
    lo = lo / bn * bn;
    return make_int2(lo, hi > lo ? (hi - lo + bn - 1) / bn : 0);
}

// ---------------------------------------------------------------------------------------------
// 1. naive
// ---------------------------------------------------------------------------------------------
// s[b, h, i, j] = scale q_i . k_j (or -inf where masked). grid (ceil(Sk/256), Sq, B*Hq).
template <typename T>
__device__ void naive_scores(const T* __restrict__ q, const T* __restrict__ k, float* __restrict__ s, int Sq, int Sk, int Hq,
                             int Hkv, int D, float scale, int causal, int window) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    const int b = blockIdx.z / Hq, h = blockIdx.z % Hq, hk = h / (Hq / Hkv);
    if (j >= Sk) return;
    float acc = NEG_INF;
    if (attn_keep(i, j, Sk, Sk - Sq, causal, window)) {
        const T* qi = q + (((long long)b * Sq + i) * Hq + h) * D;
        const T* kj = k + (((long long)b * Sk + j) * Hkv + hk) * D;
        acc = 0.f;
        for (int d = 0; d < D; ++d) acc += to_float(qi[d]) * to_float(kj[d]);
        acc *= scale;
    }
    s[(((long long)b * Hq + h) * Sq + i) * Sk + j] = acc;
}

// Row softmax of s in place, and lse per row (natural log); a block of 256 per row.
__device__ void naive_softmax(float* __restrict__ s, float* __restrict__ lse, int Sk) {
    float* row = s + (long long)blockIdx.x * Sk;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < Sk; j += blockDim.x) m = fmax_nan(m, row[j]);
    m = block_reduce_max(m);
    const float shift = safe_shift(m);
    float sum = 0.f;
    for (int j = threadIdx.x; j < Sk; j += blockDim.x) sum += __expf(row[j] - shift);
    sum = block_reduce_sum(sum);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int j = threadIdx.x; j < Sk; j += blockDim.x) row[j] = __expf(row[j] - shift) * inv;
    if (threadIdx.x == 0) lse[blockIdx.x] = sum > 0.f ? m + __logf(sum) : NEG_INF;
}

// o[b, i, h, d] = sum_j p[b, h, i, j] v[b, j, hk, d]. grid (ceil(D/64), Sq, B*Hq), block 64.
template <typename T>
__device__ void naive_pv(const float* __restrict__ p, const T* __restrict__ v, T* __restrict__ o, int Sq, int Sk, int Hq, int Hkv,
                         int D) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    const int b = blockIdx.z / Hq, h = blockIdx.z % Hq, hk = h / (Hq / Hkv);
    if (d >= D) return;
    const float* pi = p + (((long long)b * Hq + h) * Sq + i) * Sk;
    float acc = 0.f;
    for (int j = 0; j < Sk; ++j) acc += pi[j] * to_float(v[(((long long)b * Sk + j) * Hkv + hk) * D + d]);
    o[(((long long)b * Sq + i) * Hq + h) * D + d] = from_float<T>(acc);
}

// ---------------------------------------------------------------------------------------------
// 2. fa2 (fragment layouts of m16n8k16 and ldmatrix: kernels/gemm/mma_sync.cu; lane addresses:
// ldmatrix_x4_lane and ldmatrix_x4_lane_nk, kernels/mma.cuh)
// ---------------------------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) { return pack_bf16x2(lo, hi); }
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) { return pack_f16x2(lo, hi); }

// Two m16n8 accumulator tiles, lo (k 0-7) and hi (k 8-15), as the A fragment of an m16n8k16
// mma, rounded to T: how P (forward, decode) and dS (backward) feed the next product.
template <typename T>
__device__ __forceinline__ void acc_a_frag(const float (&lo)[4], const float (&hi)[4], unsigned (&a)[4]) {
    a[0] = pack2<T>(lo[0], lo[1]), a[1] = pack2<T>(lo[2], lo[3]), a[2] = pack2<T>(hi[0], hi[1]), a[3] = pack2<T>(hi[2], hi[3]);
}

constexpr int FA_BN = 64, FA_THREADS = 128;

// Where sequence b lives: its first row of Q/O and of K/V, its lengths, and its lse row offset
// for head 0 (head h adds h * lse_head). Dense: b * Sq, b * Sk, and lse [B, Hq, Sq].
struct AttnSeq {
    long long q_row0, k_row0, lse0, lse_head;
    int sq, sk;
};
__device__ __forceinline__ AttnSeq attn_seq(const int* cu_q, const int* cu_k, int b, int Sq, int Sk, int Hq) {
    if (cu_q == nullptr) return {(long long)b * Sq, (long long)b * Sk, (long long)b * Hq * Sq, Sq, Sq, Sk};
    const int q0 = cu_q[b], k0 = cu_k[b];
    return {q0, k0, q0, cu_q[gridDim.z], cu_q[b + 1] - q0, cu_k[b + 1] - k0};
}

// `rows` rows from row0 of a [rows, heads, D] tensor (row stride `stride` elements, `valid` rows
// in bounds) into shared memory with row pitch D + 8; rows out of bounds are zero-filled.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void fa_load_tile(T* dst, const T* src, long long stride, int row0, int valid) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += FA_THREADS) {
        const int r = c / CHUNKS, cc = c % CHUNKS;
        const bool in = row0 + r < valid;
        const T* g = in ? src + (long long)(row0 + r) * stride + cc * 8 : src;
        cp_async16(smem_addr(dst + r * (D + 8) + cc * 8), g, in ? 16 : 0);
    }
}

// The step of a loop over key tiles in a double buffer: starts the next K and V tiles (rows from
// next_kv0) into the other half when there are more (`more`), then waits for the current ones.
template <typename T, int D>
__device__ __forceinline__ void fa_kv_step(T* sK, T* sV, const T* kb, const T* vb, long long ks, int buf, int next_kv0, int Sk, bool more) {
    if (more) {
        fa_load_tile<T, D, FA_BN>(sK + (buf ^ 1) * FA_BN * (D + 8), kb, ks, next_kv0, Sk);
        fa_load_tile<T, D, FA_BN>(sV + (buf ^ 1) * FA_BN * (D + 8), vb, ks, next_kv0, Sk);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
}

// MT: 16-row m-tiles per warp. fa2 (MT 1) keeps Q in registers; fa2_m32 (MT 2) gives each warp
// 32 rows so that every K and V fragment read from shared memory feeds two mmas (at MT 1 the
// ldmatrix traffic, 32 KB per warp per 64-key tile at D128, outlasts the 128 mmas it feeds), and
// re-reads Q from shared memory each tile to stay within 255 registers.
template <typename T, int D, int MT>
__device__ void fa2_forward(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                            float* __restrict__ lse, const int* __restrict__ cu_q, const int* __restrict__ cu_k, int Sq, int Sk, int Hq,
                            int Hkv, float scale, int causal, int window) {
    constexpr int BM = 64 * MT, LD = D + 8;  // padded pitch: the 8 rows an ldmatrix reads fall in distinct banks
    constexpr bool Q_IN_REGS = MT == 1;
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    T* sQ = reinterpret_cast<T*>(fa_smem);
    T* sK = sQ + BM * LD;            // two buffers
    T* sV = sK + 2 * FA_BN * LD;     // two buffers
    const int q0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
    const AttnSeq seq = attn_seq(cu_q, cu_k, b, Sq, Sk, Hq);
    Sq = seq.sq, Sk = seq.sk;
    if (q0 >= Sq) return;  // a shorter sequence of a variable-length batch
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int2 lm = ldmatrix_x4_lane(lane), lk = ldmatrix_x4_lane_nk(lane);  // Q, V; K (n x k)
    const int off = Sk - Sq;
    const long long qs = (long long)Hq * D, ks = (long long)Hkv * D;
    const T* qb = q + seq.q_row0 * qs + (long long)h * D;
    const T* kb = k + seq.k_row0 * ks + (long long)hk * D;
    const T* vb = v + seq.k_row0 * ks + (long long)hk * D;

    const int2 span = attn_key_tiles(q0, BM, Sk, off, causal, window, FA_BN);  // the keys this block's rows keep
    const int lo = span.x, tiles = span.y;

    fa_load_tile<T, D, BM>(sQ, qb, qs, q0, Sq);
    if (tiles > 0) {
        fa_load_tile<T, D, FA_BN>(sK, kb, ks, lo, Sk);
        fa_load_tile<T, D, FA_BN>(sV, vb, ks, lo, Sk);
    }
    cp_async_commit();

    unsigned qf[Q_IN_REGS ? D / 16 : 1][4];
    float acc[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < D / 8; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
    float m[MT][2], l[MT][2];  // rows g and g + 8 of each m-tile, log2 units
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = NEG_INF, l[mt][0] = l[mt][1] = 0.f;
    const float sl2 = scale * LOG2E;
    const int wrow = warp * 16 * MT;  // the warp's first row in the block

    for (int it = 0; it < tiles; ++it) {
        const int kv0 = lo + it * FA_BN, buf = it & 1;
        // The next tile streams in while this one is used.
        fa_kv_step<T, D>(sK, sV, kb, vb, ks, buf, kv0 + FA_BN, Sk, it + 1 < tiles);
        if (Q_IN_REGS && it == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                ldmatrix_x4(qf[Q_IN_REGS ? kk : 0], smem_addr(&sQ[(wrow + lm.x) * LD + kk * 16 + lm.y * 8]));
        }
        const T* Kt = sK + buf * FA_BN * LD;
        const T* Vt = sV + buf * FA_BN * LD;

        // S = Q K^T for the warp's rows and the tile's 64 keys: 8 n-tiles of 8 keys per m-tile.
        float s[MT][FA_BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < FA_BN / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if (Q_IN_REGS) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) qa[mt][e] = qf[Q_IN_REGS ? kk : 0][e];
                } else {
                    ldmatrix_x4(qa[mt], smem_addr(&sQ[(wrow + mt * 16 + lm.x) * LD + kk * 16 + lm.y * 8]));
                }
            }
#pragma unroll
            for (int j = 0; j < FA_BN / 8; j += 2) {
                unsigned r[4];
                ldmatrix_x4(r, smem_addr(&Kt[(j * 8 + lk.x) * LD + kk * 16 + lk.y * 8]));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    Mma<T>::run(s[mt][j], qa[mt], r);
                    Mma<T>::run(s[mt][j + 1], qa[mt], r + 2);
                }
            }
        }
        // Scale into log2 units and mask where the tile crosses a boundary.
        const bool edge = kv0 + FA_BN > Sk || (causal && kv0 + FA_BN - 1 > q0 + off) || (window > 0 && kv0 <= q0 + BM - 1 + off - window);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const int row_a = q0 + wrow + mt * 16 + g;
#pragma unroll
            for (int j = 0; j < FA_BN / 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kv0 + j * 8 + 2 * t + (e & 1), row = row_a + (e < 2 ? 0 : 8);
                    s[mt][j][e] = (!edge || attn_keep(row, key, Sk, off, causal, window)) ? s[mt][j][e] * sl2 : NEG_INF;
                }
            }
        }
        // Online softmax: new row max (a quad of lanes shares a row), rescale what came before.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = m[mt][r];
#pragma unroll
                for (int j = 0; j < FA_BN / 8; ++j) mx = fmax_nan(mx, fmax_nan(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
                mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float shift = safe_shift(mx);
                alpha[r] = exp2f(m[mt][r] - shift);
                m[mt][r] = mx;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < FA_BN / 8; ++j) {
                    s[mt][j][2 * r] = exp2f(s[mt][j][2 * r] - shift);
                    s[mt][j][2 * r + 1] = exp2f(s[mt][j][2 * r + 1] - shift);
                    sum += s[mt][j][2 * r] + s[mt][j][2 * r + 1];
                }
                l[mt][r] = l[mt][r] * alpha[r] + sum;  // this lane's share; the quad is summed at the end
            }
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                acc[mt][n][0] *= alpha[0];
                acc[mt][n][1] *= alpha[0];
                acc[mt][n][2] *= alpha[1];
                acc[mt][n][3] *= alpha[1];
            }
        }
        // O += P V: P's accumulator layout is the A fragment of the next mma (two n-tiles per
        // k16 step), rounded to T as FlashAttention does.
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; ++kk) {
            unsigned pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) acc_a_frag<T>(s[mt][2 * kk], s[mt][2 * kk + 1], pa[mt]);
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                unsigned r[4];
                ldmatrix_x4_trans(r, smem_addr(&Vt[(kk * 16 + lm.x) * LD + n * 8 + lm.y * 8]));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    Mma<T>::run(acc[mt][n], pa[mt], r);
                    Mma<T>::run(acc[mt][n + 1], pa[mt], r + 2);
                }
            }
        }
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    cp_async_wait<0>();

    // O = acc / l; lse = ln(sum) + max, in natural-log units.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const int row = q0 + wrow + mt * 16 + g + 8 * r;
            if (row >= Sq) continue;
            const float inv = lr > 0.f ? 1.f / lr : 0.f;
            T* orow = o + (seq.q_row0 + row) * qs + (long long)h * D;
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *reinterpret_cast<unsigned*>(orow + n * 8 + 2 * t) = pack2<T>(acc[mt][n][2 * r] * inv, acc[mt][n][2 * r + 1] * inv);
            if (t == 0) lse[seq.lse0 + h * seq.lse_head + row] = lr > 0.f ? (m[mt][r] + __log2f(lr)) / LOG2E : NEG_INF;
        }
    }
}

// Bytes of dynamic shared memory for head dim D and MT m-tiles per warp: Q, two K and two V tiles.
#define FA_SMEM(D, MT) ((64 * (MT) + 4 * FA_BN) * ((D) + 8) * 2)

// ---------------------------------------------------------------------------------------------
// Exports: attention_<variant>_<part>_{f16,bf16}; fa2 per head dim (64, 128).
// ---------------------------------------------------------------------------------------------
#define FA_EXPORT(TY, T, NAME, D, MT)                                                                                          \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) attention_##NAME##_d##D##_##TY(                                       \
        const T* q, const T* k, const T* v, T* o, float* lse, const int* cu_q, const int* cu_k, int Sq, int Sk, int Hq, int Hkv,     \
        float scale, int causal, int window) {                                                                                     \
        fa2_forward<T, D, MT>(q, k, v, o, lse, cu_q, cu_k, Sq, Sk, Hq, Hkv, scale, causal, window);                                \
    }
#define ATTN_EXPORT(TY, T)                                                                                                          \
    extern "C" __global__ void attention_naive_scores_##TY(const T* q, const T* k, float* s, int Sq, int Sk, int Hq, int Hkv, int D, \
                                                            float scale, int causal, int window) {                                 \
        naive_scores<T>(q, k, s, Sq, Sk, Hq, Hkv, D, scale, causal, window);                                                       \
    }                                                                                                                               \
    extern "C" __global__ void attention_naive_pv_##TY(const float* p, const T* v, T* o, int Sq, int Sk, int Hq, int Hkv, int D) { \
        naive_pv<T>(p, v, o, Sq, Sk, Hq, Hkv, D);                                                                                  \
    }                                                                                                                               \
    FA_EXPORT(TY, T, fa2, 64, 1)                                                                                                    \
    FA_EXPORT(TY, T, fa2, 128, 1)                                                                                                   \
    FA_EXPORT(TY, T, fa2_m32, 64, 2)                                                                                                \
    FA_EXPORT(TY, T, fa2_m32, 128, 2)

ATTN_EXPORT(f16, __half)
ATTN_EXPORT(bf16, __nv_bfloat16)

extern "C" __global__ void attention_naive_softmax_f32(float* s, float* lse, int Sk) { naive_softmax(s, lse, Sk); }
