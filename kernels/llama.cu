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
        if (d < rope_dims) {
            // The angle in f64 (positions up to 1e5 times frequencies near 1 keep their digits),
            // reduced to [-pi, pi] there, then sin and cos in f32: f64 sincos is slow.
            const double t = (double)p * inv_freq[d / 2];
            const float r = (float)(t - 6.283185307179586 * rint(t * 0.15915494309189535));
            float fs, fc;
            sincosf(r, &fs, &fc);
            const float a0 = a;
            a = a0 * fc - b * fs;
            b = a0 * fs + b * fc;
        }
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
