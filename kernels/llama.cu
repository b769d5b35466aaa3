// llama.cu: the steps of a Llama forward between the weight products (quant family) and
// attention (attention family), fused where one pass can do two things. The residual stream x
// is f32 (it sums two updates per layer); what a product reads is f16. Rows are tokens: in a
// decode step one per sequence, in a prefill `rows_per_seq` consecutive positions of one
// sequence. Row r belongs to sequence r / rows_per_seq at position pos[seq] + r % rows_per_seq,
// positions read on the device so that a captured graph replays every step. Every kernel waits
// for the one before it first thing (pdl.cuh): a decode step's graph may launch it early.
//
//  embed_q8_0    x = the token's row of a Q8_0 embedding (tokens[seq * cap + position]).
//  add_rmsnorm   x += y (when y is given), h = x rstd gamma: the residual add fused into the
//                next norm, so x is read once for both. block (256), grid (rows).
//  rope_cache    RoPE (neighbour pairs) on Q and K of the fused QKV product at each row's
//                position, Q out, K and V stored in the paged cache: one pass over the product.
//  swiglu        silu(gate) * up of the fused gate|up product.
//  argmax        greedy choice per row of the logits, written as the sequence's next token once
//                past its prompt, and the position advanced: no host round trip between steps,
//                and a prompt can be fed through the same step.
//
// The fused decode products (batches of up to Q4_MAXB sequences, rows up to 32 Q4_MAXG groups
// wide) read the Q4_1 weights as the GGUF stores them and fold the steps around a product into
// it, so that a layer is five launches and the attention's two, not ten:
//  qkv_rope_q4_1        RMSNorm of x, the QKV product, RoPE and the cache store.
//  gate_up_swiglu_q4_1  RMSNorm of x, the gate and up products, SwiGLU.
//  residual_q4_1        a product of an f16 input added into x (the output and down products).
// A warp owns one or two output rows; its lanes load their weights before pdl_wait (nothing
// writes weights), so the loads overlap the kernel before. Each block normalises the whole input
// itself: it is a few KB from L2, cheaper than another launch. Every value the unfused step
// rounds to f16 (h, the product, the gate and up) is rounded here too.

#include "common.cuh"
#include "pdl.cuh"

__device__ __forceinline__ int row_pos(const int* pos, int r, int rows_per_seq) { return pos[r / rows_per_seq] + r % rows_per_seq; }

// Q8_0 block: f16 d, 32 int8; value = q d.
extern "C" __global__ void llama_embed_q8_0_f32(const unsigned char* __restrict__ w, const unsigned* __restrict__ tokens,
                                                const int* __restrict__ pos, float* __restrict__ x, int rows_per_seq, int cap, int dim) {
    pdl_wait();
    const int r = blockIdx.x, seq = r / rows_per_seq;
    const unsigned t = tokens[(long long)seq * cap + row_pos(pos, r, rows_per_seq)];
    const unsigned char* row = w + (long long)t * (dim / 32) * 34;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const unsigned char* blk = row + (i / 32) * 34;
        const float d = __half2float(__ushort_as_half((unsigned short)(blk[0] | (blk[1] << 8))));
        x[(long long)r * dim + i] = (float)(signed char)blk[2 + i % 32] * d;
    }
}

extern "C" __global__ void llama_add_rmsnorm_f16(float* __restrict__ x, const __half* __restrict__ y, const float* __restrict__ gamma,
                                                 __half* __restrict__ h, int dim, float eps) {
    pdl_wait();
    float* xr = x + (long long)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (y) {
            v += __half2float(y[(long long)blockIdx.x * dim + i]);
            xr[i] = v;
        }
        ss += v * v;
    }
    const float rstd = 1.f / sqrtf(block_reduce_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) h[(long long)blockIdx.x * dim + i] = __float2half_rn(xr[i] * rstd * gamma[i]);
}

// The pair (a, b) turned by position p times the frequency: the angle in f64 (positions up to 1e5
// times frequencies near 1 keep their digits), reduced to [-pi, pi] there, then sin and cos in
// f32 (f64 sincos is slow).
__device__ __forceinline__ void rotate(float& a, float& b, int p, double inv_freq) {
    const double t = (double)p * inv_freq;
    const float r = (float)(t - 6.283185307179586 * rint(t * 0.15915494309189535));
    float fs, fc;
    sincosf(r, &fs, &fc);
    const float a0 = a;
    a = a0 * fc - b * fs;
    b = a0 * fs + b * fc;
}

// qkv [rows, (hq + 2 hkv) D]: Q heads, then K heads, then V heads. inv_freq[i] = base^(-2i/rope_dims)
// / scale, in f64 so that angles at long positions keep their digits.
extern "C" __global__ void llama_rope_cache_f16(const __half* __restrict__ qkv, __half* __restrict__ q, __half* __restrict__ kc,
                                                __half* __restrict__ vc, const int* __restrict__ table, const int* __restrict__ pos,
                                                const double* __restrict__ inv_freq, int rows_per_seq, int hq, int hkv, int D,
                                                int rope_dims, int page, int max_pages) {
    pdl_wait();
    const int r = blockIdx.x, seq = r / rows_per_seq, p = row_pos(pos, r, rows_per_seq);
    const int width = (hq + 2 * hkv) * D;
    const __half* in = qkv + (long long)r * width;
    const long long slot = (long long)table[seq * max_pages + p / page] * page + p % page;
    // Pairs of Q and K heads (rotated or not), then V copied.
    const int qk_pairs = (hq + hkv) * D / 2;
    for (int i = threadIdx.x; i < qk_pairs + hkv * D; i += blockDim.x) {
        if (i >= qk_pairs) {
            const int e = i - qk_pairs;
            vc[slot * hkv * D + e] = in[(hq + hkv) * D + e];
            continue;
        }
        const int e = 2 * i, head = e / D, d = e % D;
        float a = __half2float(in[e]), b = __half2float(in[e + 1]);
        if (d < rope_dims) rotate(a, b, p, inv_freq[d / 2]);
        __half* out = head < hq ? q + (long long)r * hq * D + e : kc + slot * hkv * D + (e - hq * D);
        out[0] = __float2half_rn(a);
        out[1] = __float2half_rn(b);
    }
}

extern "C" __global__ void llama_swiglu_f16(const __half* __restrict__ gu, __half* __restrict__ act, int rows, int ffn) {
    pdl_wait();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)rows * ffn; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / ffn, j = i % ffn;
        const float g = __half2float(gu[r * 2 * ffn + j]), u = __half2float(gu[r * 2 * ffn + ffn + j]);
        act[i] = __float2half_rn(g / (1.f + __expf(-g)) * u);
    }
}

// One block per sequence; ties go to the lowest id, a NaN logit wins (so it shows). The chosen id
// becomes tokens[seq][pos + 1] unless that is still a prompt token; pos advances unless the
// cache is full.
extern "C" __global__ void llama_argmax_f32(const float* __restrict__ logits, unsigned* __restrict__ tokens, int* __restrict__ pos,
                                            const int* __restrict__ prompt_len, int vocab, int cap) {
    pdl_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* row = logits + (long long)blockIdx.x * vocab;
    float best = NEG_INF;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = row[i];
        if (idx == 0x7fffffff || v > best || (v != v && best == best)) best = v, idx = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const int j = __shfl_xor_sync(0xffffffffu, idx, o);
        if (v > best || (v == best && j < idx) || (v != v && (best == best || j < idx))) best = v, idx = j;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = best, si[warp] = idx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            const float v = sv[w];
            const int j = si[w];
            if (v > best || (v == best && j < idx) || (v != v && (best == best || j < idx))) best = v, idx = j;
        }
        const int p = pos[blockIdx.x];
        if (p + 1 < cap) {
            if (p + 1 >= prompt_len[blockIdx.x]) tokens[(long long)blockIdx.x * cap + p + 1] = (unsigned)idx;
            pos[blockIdx.x] = p + 1;
        }
    }
}

// ---- fused decode products ----------------------------------------------------------------

#define Q4_MAXG 2
#define Q4_MAXB 16

__device__ __forceinline__ float round16(float v) { return __half2float(__float2half_rn(v)); }

// A lane's share of one Q4_1 row: groups lane, lane + 32, ... (20 bytes each: d|m, 16 of q).
struct Q4Row {
    unsigned u[Q4_MAXG][5];
};

__device__ __forceinline__ void q4_load(Q4Row& r, const unsigned char* row, int groups, int lane) {
#pragma unroll
    for (int g = 0; g < Q4_MAXG; ++g) {
        const int grp = lane + 32 * g;
        if (grp < groups) {
            const unsigned* p = reinterpret_cast<const unsigned*>(row + grp * 20);
#pragma unroll
            for (int k = 0; k < 5; ++k) r.u[g][k] = __ldg(p + k);
        }
    }
}

// The shared input: ht[(s * 32 + j) * groups + grp] = h[s][32 grp + j] (a lane per group reads
// consecutive words), hsum[s * groups + grp] = the group's sum (the Q4_1 minimum's term).
__device__ __forceinline__ void q4_sums(float* ht, float* hsum, int seqs, int groups) {
    __syncthreads();
    for (int i = threadIdx.x; i < seqs * groups; i += blockDim.x) {
        const int s = i / groups, grp = i % groups;
        float t = 0.f;
        for (int j = 0; j < 32; ++j) t += ht[(s * 32 + j) * groups + grp];
        hsum[i] = t;
    }
    __syncthreads();
}

// h = f16(x rstd gamma), rstd = 1 / sqrt(mean(x^2) + eps) per sequence (a warp per sequence).
__device__ __forceinline__ void q4_input_norm(float* ht, float* hsum, const float* __restrict__ x, const float* __restrict__ gamma, float eps,
                                              int seqs, int dim) {
    __shared__ float rstd[Q4_MAXB];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, groups = dim / 32;
    for (int s = warp; s < seqs; s += blockDim.x >> 5) {
        float ss = 0.f;
        for (int i = lane; i < dim; i += 32) ss += x[s * dim + i] * x[s * dim + i];
        ss = warp_reduce_sum(ss);
        if (lane == 0) rstd[s] = 1.f / sqrtf(ss / dim + eps);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < seqs * dim; i += blockDim.x) {
        const int s = i / dim, c = i % dim;
        ht[(s * 32 + c % 32) * groups + c / 32] = round16(x[i] * rstd[s] * gamma[c]);
    }
    q4_sums(ht, hsum, seqs, groups);
}

__device__ __forceinline__ void q4_input_f16(float* ht, float* hsum, const __half* __restrict__ a, int seqs, int dim) {
    const int groups = dim / 32;
    for (int i = threadIdx.x; i < seqs * dim; i += blockDim.x) {
        const int s = i / dim, c = i % dim;
        ht[(s * 32 + c % 32) * groups + c / 32] = __half2float(a[i]);
    }
    q4_sums(ht, hsum, seqs, groups);
}

// The row's product with sequence s's input, summed over the warp (every lane gets it).
__device__ __forceinline__ float q4_dot(const Q4Row& r, const float* ht, const float* hsum, int s, int groups, int lane) {
    float acc = 0.f;
#pragma unroll
    for (int g = 0; g < Q4_MAXG; ++g) {
        const int grp = lane + 32 * g;
        if (grp < groups) {
            const float* h = ht + s * 32 * groups + grp;
            float t = 0.f;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const unsigned q = r.u[g][1 + k];
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    const int j = 4 * k + b;
                    t += (float)((q >> (8 * b)) & 15u) * h[j * groups] + (float)((q >> (8 * b + 4)) & 15u) * h[(j + 16) * groups];
                }
            }
            const float d = __half2float(__ushort_as_half((unsigned short)(r.u[g][0] & 0xffffu)));
            const float m = __half2float(__ushort_as_half((unsigned short)(r.u[g][0] >> 16)));
            acc += d * t + m * hsum[s * groups + grp];
        }
    }
    return warp_reduce_sum(acc);
}

// Dynamic shared memory: seqs x 33 x groups floats.
// w: the stacked Q, K, V rows ((hq + 2 hkv) D of dim); a warp per neighbour pair of rows.
extern "C" __global__ void llama_qkv_rope_q4_1_f16(const unsigned char* __restrict__ w, const float* __restrict__ x, const float* __restrict__ gamma,
                                                   float eps, __half* __restrict__ q, __half* __restrict__ kc, __half* __restrict__ vc,
                                                   const int* __restrict__ table, const int* __restrict__ pos, const double* __restrict__ inv_freq,
                                                   int seqs, int dim, int hq, int hkv, int D, int rope_dims, int page, int max_pages) {
    extern __shared__ float sm[];
    const int lane = threadIdx.x & 31, groups = dim / 32;
    const int pair = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), pairs = (hq + 2 * hkv) * D / 2;
    Q4Row r0, r1;
    if (pair < pairs) {
        q4_load(r0, w + (long long)(2 * pair) * groups * 20, groups, lane);
        q4_load(r1, w + (long long)(2 * pair + 1) * groups * 20, groups, lane);
    }
    pdl_wait();
    float *ht = sm, *hsum = sm + seqs * 32 * groups;
    q4_input_norm(ht, hsum, x, gamma, eps, seqs, dim);
    if (pair >= pairs) return;
    float a = 0.f, b = 0.f;
    for (int s = 0; s < seqs; ++s) {
        const float ya = q4_dot(r0, ht, hsum, s, groups, lane), yb = q4_dot(r1, ht, hsum, s, groups, lane);
        if (lane == s) a = ya, b = yb;
    }
    if (lane >= seqs) return;
    const int s = lane, p = pos[s], e = 2 * pair, head = e / D, d = e % D;
    const long long slot = (long long)table[s * max_pages + p / page] * page + p % page;
    a = round16(a), b = round16(b);
    if (head < hq + hkv && d < rope_dims) rotate(a, b, p, inv_freq[d / 2]);
    __half* out = head < hq ? q + (long long)s * hq * D + e : head < hq + hkv ? kc + slot * hkv * D + (e - hq * D) : vc + slot * hkv * D + (e - (hq + hkv) * D);
    out[0] = __float2half_rn(a);
    out[1] = __float2half_rn(b);
}

// w: gate rows then up rows (2 ffn of dim); a warp per output column j (gate j and up j).
extern "C" __global__ void llama_gate_up_swiglu_q4_1_f16(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                                         const float* __restrict__ gamma, float eps, __half* __restrict__ act, int seqs,
                                                         int dim, int ffn) {
    extern __shared__ float sm[];
    const int lane = threadIdx.x & 31, groups = dim / 32;
    const int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    Q4Row gr, ur;
    if (j < ffn) {
        q4_load(gr, w + (long long)j * groups * 20, groups, lane);
        q4_load(ur, w + (long long)(ffn + j) * groups * 20, groups, lane);
    }
    pdl_wait();
    float *ht = sm, *hsum = sm + seqs * 32 * groups;
    q4_input_norm(ht, hsum, x, gamma, eps, seqs, dim);
    if (j >= ffn) return;
    for (int s = 0; s < seqs; ++s) {
        const float g = round16(q4_dot(gr, ht, hsum, s, groups, lane)), u = round16(q4_dot(ur, ht, hsum, s, groups, lane));
        if (lane == s) act[(long long)s * ffn + j] = __float2half_rn(g / (1.f + __expf(-g)) * u);
    }
}

// x [seqs, n] += f16(a [seqs, k] W^T), W n rows of k; a warp per row.
extern "C" __global__ void llama_residual_q4_1_f16(const unsigned char* __restrict__ w, const __half* __restrict__ a, float* __restrict__ x,
                                                   int seqs, int n, int k) {
    extern __shared__ float sm[];
    const int lane = threadIdx.x & 31, groups = k / 32;
    const int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    Q4Row r;
    if (j < n) q4_load(r, w + (long long)j * groups * 20, groups, lane);
    pdl_wait();
    float *ht = sm, *hsum = sm + seqs * 32 * groups;
    q4_input_f16(ht, hsum, a, seqs, k);
    if (j >= n) return;
    for (int s = 0; s < seqs; ++s) {
        const float y = round16(q4_dot(r, ht, hsum, s, groups, lane));
        if (lane == s) x[(long long)s * n + j] += y;
    }
}
