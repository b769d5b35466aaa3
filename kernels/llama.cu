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
//  sample        the same, drawn from softmax(logits / T) cut to the top k and the top p of its
//                mass, with a uniform number that depends only on (seed, sequence, position):
//                runs are reproducible and a replayed graph draws afresh at each position.
//
// The fused decode products that fold these steps into the weight products are in
// llama_fused.cu, and a whole decode layer in one launch in llama_layer.cu (concatenated after
// this file in that order).

#include "common.cuh"
#include "pdl.cuh"

// The step's timeline (Gpu::set_trace, the decode case's `timeline`): while lab_trace is set,
// the first thread of each kernel's first block takes the next slot (lab_trace[0] counts them)
// as it starts, and writes the global timer there as it starts and as its wait returns:
// lab_trace[1 + 2 slot] and [2 + 2 slot]. The slot's atomic is issued before the wait, so the
// chain after it pays nothing but the two stores. Every kernel of the family waits through it
// (sm_90: programmatic launch and the timeline both; nothing before).
#define LAB_TRACE_SLOTS 65536
__device__ unsigned long long* lab_trace;

// A kernel whose code before its wait waits on loads of its own (qkv_rope_q4_1 and
// attention_o_q4_1 read the position, then the page table) stamps its start at its entry with
// step_begin and passes it on; its slot is still taken as it reaches the wait.
__device__ __forceinline__ unsigned long long step_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if ((threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0 && lab_trace != nullptr) return global_ns();
#endif
    return 0;
}

__device__ __forceinline__ void step_wait(unsigned long long start = 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned long long* trace = nullptr;
    unsigned long long slot = 0;
    if ((threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0 && lab_trace != nullptr) {
        trace = lab_trace;
        if (start == 0) start = global_ns();
        slot = atomicAdd(trace, 1ull);
        // The slot is taken before this kernel lets the next one launch (in pdl_wait): an atomic
        // still in flight behind this thread's loads could otherwise be overtaken by the next
        // kernel's, and the slots would name the wrong kernels.
        __threadfence();
    }
    pdl_wait();
    if (trace != nullptr && slot < LAB_TRACE_SLOTS) {
        trace[1 + 2 * slot] = start;
        trace[2 + 2 * slot] = global_ns();
    }
#endif
}

__device__ __forceinline__ int row_pos(const int* pos, int r, int rows_per_seq) { return pos[r / rows_per_seq] + r % rows_per_seq; }

// The cache slot of sequence s's position k: page k / page of its table, row k % page there.
__device__ __forceinline__ long long cache_slot(const int* __restrict__ table, int s, int max_pages, int page, int k) {
    return (long long)table[s * max_pages + k / page] * page + k % page;
}

// Q8_0 block: f16 d, 32 int8; value = q d.
extern "C" __global__ void llama_embed_q8_0_f32(const unsigned char* __restrict__ w, const unsigned* __restrict__ tokens,
                                                const int* __restrict__ pos, float* __restrict__ x, int rows_per_seq, int cap, int dim) {
    step_wait();
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
    step_wait();
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
__device__ __forceinline__ void rope_angle(int p, double inv_freq, float& fs, float& fc) {
    const double t = (double)p * inv_freq;
    const float r = (float)(t - 6.283185307179586 * rint(t * 0.15915494309189535));
    sincosf(r, &fs, &fc);
}
__device__ __forceinline__ void rotate_by(float& a, float& b, float fs, float fc) {
    const float a0 = a;
    a = a0 * fc - b * fs;
    b = a0 * fs + b * fc;
}
__device__ __forceinline__ void rotate(float& a, float& b, int p, double inv_freq) {
    float fs, fc;
    rope_angle(p, inv_freq, fs, fc);
    rotate_by(a, b, fs, fc);
}

// qkv [rows, (hq + 2 hkv) D]: Q heads, then K heads, then V heads. inv_freq[i] = base^(-2i/rope_dims)
// / scale, in f64 so that angles at long positions keep their digits.
extern "C" __global__ void llama_rope_cache_f16(const __half* __restrict__ qkv, __half* __restrict__ q, __half* __restrict__ kc,
                                                __half* __restrict__ vc, const int* __restrict__ table, const int* __restrict__ pos,
                                                const double* __restrict__ inv_freq, int rows_per_seq, int hq, int hkv, int D,
                                                int rope_dims, int page, int max_pages) {
    step_wait();
    const int r = blockIdx.x, seq = r / rows_per_seq, p = row_pos(pos, r, rows_per_seq);
    const int width = (hq + 2 * hkv) * D;
    const __half* in = qkv + (long long)r * width;
    const long long slot = cache_slot(table, seq, max_pages, page, p);
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
    step_wait();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)rows * ffn; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / ffn, j = i % ffn;
        const float g = __half2float(gu[r * 2 * ffn + j]), u = __half2float(gu[r * 2 * ffn + ffn + j]);
        act[i] = __float2half_rn(g / (1.f + __expf(-g)) * u);
    }
}

// The chosen id becomes tokens[seq][pos + 1] unless that is still a prompt token; pos advances
// unless the cache is full. One thread per sequence; emit_token_at takes the position p and the
// prompt length already read (head_q8_0 reads them before its wait).
__device__ __forceinline__ void emit_token_at(unsigned* __restrict__ tokens, int* __restrict__ pos, int seq, int cap, int id, int p, int prompt_len) {
    if (p + 1 < cap) {
        if (p + 1 >= prompt_len) tokens[(long long)seq * cap + p + 1] = (unsigned)id;
        pos[seq] = p + 1;
    }
}

__device__ __forceinline__ void emit_token(unsigned* __restrict__ tokens, int* __restrict__ pos, const int* __restrict__ prompt_len, int seq,
                                           int cap, int id) {
    emit_token_at(tokens, pos, seq, cap, id, pos[seq], prompt_len[seq]);
}

// Scans of a row of logits by a block. A thread loads ROW_BATCH values before it uses any: one
// latency per batch, not per value (argmax's loop, which compared each load before issuing the
// next, took 15.5 us on an H200 for 49,152 logits; sample's dozen such scans took ~0.5 ms).
// f(i, v) sees a thread's ids in increasing order.
#define ROW_BATCH 16
// Ids threadIdx.x, threadIdx.x + blockDim.x, ... below n.
template <typename F> __device__ __forceinline__ void row_strided(const float* __restrict__ row, int n, F f) {
    for (int i0 = threadIdx.x; i0 < n; i0 += ROW_BATCH * blockDim.x) {
        float v[ROW_BATCH];
#pragma unroll
        for (int u = 0; u < ROW_BATCH; ++u) v[u] = i0 + u * (int)blockDim.x < n ? row[i0 + u * blockDim.x] : 0.f;
#pragma unroll
        for (int u = 0; u < ROW_BATCH; ++u)
            if (i0 + u * (int)blockDim.x < n) f(i0 + u * (int)blockDim.x, v[u]);
    }
}
// Ids lo..hi-1.
template <typename F> __device__ __forceinline__ void row_range(const float* __restrict__ row, int lo, int hi, F f) {
    for (int i0 = lo; i0 < hi; i0 += ROW_BATCH) {
        float v[ROW_BATCH];
#pragma unroll
        for (int u = 0; u < ROW_BATCH; ++u) v[u] = i0 + u < hi ? row[i0 + u] : 0.f;
#pragma unroll
        for (int u = 0; u < ROW_BATCH; ++u)
            if (i0 + u < hi) f(i0 + u, v[u]);
    }
}

// One block per sequence; ties go to the lowest id, a NaN logit wins (so it shows).
extern "C" __global__ void llama_argmax_f32(const float* __restrict__ logits, unsigned* __restrict__ tokens, int* __restrict__ pos,
                                            const int* __restrict__ prompt_len, int vocab, int cap) {
    step_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* row = logits + (long long)blockIdx.x * vocab;
    float best = NEG_INF;
    int idx = 0x7fffffff;
    // A thread's ids rise, so `>` keeps the lowest of equal logits.
    row_strided(row, vocab, [&](int i, float v) {
        if (idx == 0x7fffffff || v > best || (v != v && best == best)) best = v, idx = i;
    });
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
        emit_token(tokens, pos, prompt_len, blockIdx.x, cap, idx);
    }
}

// ---- sampling ------------------------------------------------------------------------------
// Weights are fixed point, w = floor(exp(z - max z) 2^31) with z = logit / T, summed as 64-bit
// integers: every sum is exact whatever its order, so the draw is reproducible and the CPU's
// mirror (model::llama::sample) computes the same sets. The top-k and top-p cuts are one radix
// select (8 bits a pass from the top) of the smallest key whose keys at or above it reach a
// weight: k for top-k (a weight of 1 per token), p of the kept mass for top-p. Tokens tied with
// the threshold are all kept. The draw walks the kept tokens in id order.

#define SAMPLE_THREADS 1024

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Order-preserving key of a float: a larger value has a larger key.
__device__ __forceinline__ unsigned sample_key(float v) {
    const unsigned b = __float_as_uint(v);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ unsigned long long sample_weight(float z, float zmax) { return (unsigned long long)(expf(z - zmax) * 2147483648.f); }

// A 64-bit add into a histogram kept as two 32-bit words per bin: two native atomics, where a
// 64-bit atomicAdd on shared memory is a compare-and-swap loop (ATOMS.CAST.SPIN.64 on sm_90) that
// 1024 threads contending for 256 bins spun in (~0.1 ms per radix pass on an H200). Exact: the add
// that wraps the low word carries into the high one.
__device__ __forceinline__ void hist_add(unsigned* lo, unsigned* hi, int b, unsigned long long v) {
    const unsigned l = (unsigned)v, old = atomicAdd(&lo[b], l);
    const unsigned h = (unsigned)(v >> 32) + (old + l < old ? 1u : 0u);
    if (h) atomicAdd(&hi[b], h);
}

// The largest key t with sum(weight of tokens whose key >= t, among those with key >= floor) >=
// need (need >= 1 and reachable). weight(i) is 1 when `ones`, else the fixed-point weight.
__device__ unsigned sample_select(const float* __restrict__ row, int vocab, float inv_t, float zmax, unsigned floor, bool ones,
                                  unsigned long long need) {
    __shared__ unsigned hist_lo[256], hist_hi[256];
    __shared__ unsigned s_prefix;
    __shared__ unsigned long long s_above;
    unsigned prefix = 0, mask = 0;
    unsigned long long above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist_lo[i] = hist_hi[i] = 0;
        __syncthreads();
        // Most keys share their top byte, so one shared counter would take nearly every atomic:
        // a thread sums its run of equal bins in a register, and the warp merges the runs it
        // ends with before the last atomics.
        int bin = -1;
        unsigned long long run = 0;
        row_strided(row, vocab, [&](int, float v) {
            const float z = v * inv_t;
            const unsigned key = sample_key(z);
            if (key >= floor && (key & mask) == prefix) {
                const int b = (key >> shift) & 255u;
                if (b != bin) {
                    if (bin >= 0) hist_add(hist_lo, hist_hi, bin, run);
                    bin = b, run = 0;
                }
                run += ones ? 1ull : sample_weight(z, zmax);
            }
        });
        const unsigned same = __match_any_sync(0xffffffffu, bin);
        unsigned long long merged = 0;
        for (int l = 0; l < 32; ++l) {
            const unsigned long long v = __shfl_sync(0xffffffffu, run, l);
            if (same >> l & 1u) merged += v;
        }
        if (bin >= 0 && (threadIdx.x & 31) == __ffs(same) - 1) hist_add(hist_lo, hist_hi, bin, merged);
        __syncthreads();
        auto hist = [&](int d) { return (unsigned long long)hist_hi[d] << 32 | hist_lo[d]; };
        if (threadIdx.x < 32) {
            // Lane L holds bins 8L..8L+7; the suffix sums from lane 31 down find the digit.
            const int lane = threadIdx.x;
            unsigned long long tot = 0;
            for (int b = 0; b < 8; ++b) tot += hist(8 * lane + b);
            unsigned long long suffix = tot;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long v = __shfl_down_sync(0xffffffffu, suffix, o);
                if (lane + o < 32) suffix += v;
            }
            const unsigned hit = __ballot_sync(0xffffffffu, above + suffix >= need);
            const int L = hit ? 31 - __clz(hit) : 0;
            const unsigned long long beyond = __shfl_sync(0xffffffffu, suffix - tot, L);  // lanes above L
            if (lane == 0) {
                unsigned long long acc = above + beyond;
                int d = 8 * L + 7;
                for (; d > 8 * L; --d) {
                    if (acc + hist(d) >= need) break;
                    acc += hist(d);
                }
                s_prefix = prefix | ((unsigned)d << shift);
                s_above = acc;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        above = s_above;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

// One block of SAMPLE_THREADS per sequence. top_k 0 (or >= vocab) and top_p >= 1 cut nothing.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) llama_sample_f32(const float* __restrict__ logits, unsigned* __restrict__ tokens,
                                                                               int* __restrict__ pos, const int* __restrict__ prompt_len, int vocab,
                                                                               int cap, float temperature, int top_k, float top_p,
                                                                               unsigned long long seed) {
    step_wait();
    __shared__ unsigned long long part[SAMPLE_THREADS / 32];
    __shared__ int s_pick;
    const float* row = logits + (long long)blockIdx.x * vocab;
    const float inv_t = 1.f / temperature;
    float m = NEG_INF;
    row_strided(row, vocab, [&](int, float v) { m = fmax_nan(m, v * inv_t); });
    const float zmax = block_reduce_max(m);
    unsigned floor = 0;
    if (top_k > 0 && top_k < vocab) floor = sample_select(row, vocab, inv_t, zmax, 0, true, (unsigned long long)top_k);
    // The kept mass, then the top-p cut inside it.
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * chunk, hi = min(vocab, lo + chunk);
    auto mass = [&](unsigned at_least) {
        unsigned long long t = 0;
        row_range(row, lo, hi, [&](int, float v) {
            const float z = v * inv_t;
            if (sample_key(z) >= at_least) t += sample_weight(z, zmax);
        });
        return t;
    };
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    auto block_sum = [&](unsigned long long v) {
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        __syncthreads();
        if (lane == 0) part[warp] = v;
        __syncthreads();
        unsigned long long t = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += part[w];
        return t;
    };
    // This thread's kept mass, and the block's.
    unsigned long long mine = mass(floor);
    unsigned long long total = block_sum(mine);
    if (top_p < 1.f) {
        const unsigned long long need = (unsigned long long)ceil((double)top_p * (double)total);
        if (need >= 1) floor = sample_select(row, vocab, inv_t, zmax, floor, false, need);
        mine = mass(floor);
        total = block_sum(mine);
    }
    // u in [0, 1) from 24 bits of the counter's hash; the target is floor(u total).
    const int p = pos[blockIdx.x];
    const unsigned long long h = splitmix64(seed ^ splitmix64(((unsigned long long)blockIdx.x << 32) | (unsigned)p));
    const unsigned long long target = __umul64hi(total, (h >> 40) << 40);
    // Exclusive prefix of the per-thread masses in id order: the thread whose range holds the
    // target walks it.
    unsigned long long incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    __syncthreads();
    if (lane == 31) part[warp] = incl;
    if (threadIdx.x == 0) s_pick = -1;
    __syncthreads();
    unsigned long long before = incl - mine;
    for (int w = 0; w < warp; ++w) before += part[w];
    if (mine > 0 && target >= before && target < before + mine) {
        unsigned long long acc = before;
        bool found = false;
        row_range(row, lo, hi, [&](int i, float v) {
            const float z = v * inv_t;
            if (found || sample_key(z) < floor) return;
            acc += sample_weight(z, zmax);
            if (target < acc) s_pick = i, found = true;
        });
    }
    __syncthreads();
    if (threadIdx.x == 0) emit_token(tokens, pos, prompt_len, blockIdx.x, cap, s_pick < 0 ? 0 : s_pick);
}
