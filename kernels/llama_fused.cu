// llama_fused.cu: the fused decode products of the llama family (concatenated after llama.cu,
// whose helpers they use).
//
// The fused decode products (batches of up to Q4_MAXB sequences, rows up to 32 G groups of 32
// wide) read the Q4_1 weights as the GGUF stores them and fold the steps around a product into
// it, so that a layer is five launches and the attention's two, not ten (four with
// attention_o_q4_1, three with ffn_q4_1 too):
//  qkv_rope_q4_1        RMSNorm of x, the QKV product, RoPE and the cache store.
//  gate_up_swiglu_q4_1  RMSNorm of x, the gate and up products, SwiGLU.
//  residual_q4_1        a product of an f16 input added into x (the output and down products).
//  ffn_q4_1             gate_up_swiglu_q4_1 and the down product added into x (below).
//  attention_o_q4_1     decode attention and the output product added into x (below).
// A warp owns one or two output rows; its lanes load their weights (and gamma) before step_wait
// (nothing writes weights), so the loads overlap the kernel before. Each block normalises the
// whole input itself: it is a few KB from L2, cheaper than another launch. Every value the unfused step
// rounds to f16 (h, the product, the gate and up) is rounded here too.

#include "mma.cuh"

// G is the groups of 32 a lane holds per row: rows up to 1024 wide for the products that
// normalise their input (their registers hold two rows), 2048 for residual_q4_1. A block of
// Q4_THREADS threads holds 4 G columns of the input per thread: every global load of the input is
// issued before the first is used (a loop that waited on each load in turn cost the first version
// of these kernels ~0.3 us per round trip, twice their budget).

#define Q4_NORM_G 1
#define Q4_RESIDUAL_G 2
#define Q4_MAXB 16
#define Q4_THREADS 256
#define Q4_K(G) (32 * 32 * (G) / Q4_THREADS)

__device__ __forceinline__ float round16(float v) { return __half2float(__float2half_rn(v)); }

// A lane's share of one Q4_1 row: groups lane, lane + 32, ... (20 bytes each: d|m, 16 of q).
template <int G>
struct Q4Row {
    unsigned u[G][5];
};

template <int G>
__device__ __forceinline__ void q4_load(Q4Row<G>& r, const unsigned char* row, int groups, int lane) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int grp = lane + 32 * g;
        if (grp < groups) {
            const unsigned* p = reinterpret_cast<const unsigned*>(row + grp * 20);
#pragma unroll
            for (int k = 0; k < 5; ++k) r.u[g][k] = __ldg(p + k);
        }
    }
}

// Where column c of sequence s sits in the shared input: ht[(s * 32 + c % 32) * groups + c / 32],
// so that the lanes of a warp (a group each) read consecutive words.
__device__ __forceinline__ int q4_at(int s, int c, int groups) { return (s * 32 + c % 32) * groups + c / 32; }

// gamma's columns of this thread (a weight: read before step_wait).
template <int K>
__device__ __forceinline__ void q4_gamma(float (&g)[K], const float* __restrict__ gamma, int dim) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int c = threadIdx.x + k * Q4_THREADS;
        g[k] = c < dim ? __ldg(gamma + c) : 0.f;
    }
}

// ht = f16(x rstd gamma), rstd = 1 / sqrt(mean(x^2) + eps) per sequence.
template <int K>
__device__ __forceinline__ void q4_input_norm(float* ht, const float* __restrict__ x, const float (&g)[K], float eps, int seqs, int dim) {
    __shared__ float part[Q4_MAXB][Q4_THREADS / 32];
    __shared__ float rstd[Q4_MAXB];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, groups = dim / 32;
    for (int s = 0; s < seqs; ++s) {
        float v[K], ss = 0.f;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int c = threadIdx.x + k * Q4_THREADS;
            v[k] = c < dim ? x[(long long)s * dim + c] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int c = threadIdx.x + k * Q4_THREADS;
            ss += v[k] * v[k];
            if (c < dim) ht[q4_at(s, c, groups)] = v[k];
        }
        ss = warp_reduce_sum(ss);
        if (lane == 0) part[s][warp] = ss;
    }
    __syncthreads();
    if (threadIdx.x < seqs) {
        float t = 0.f;
        for (int w = 0; w < Q4_THREADS / 32; ++w) t += part[threadIdx.x][w];
        rstd[threadIdx.x] = 1.f / sqrtf(t / dim + eps);
    }
    __syncthreads();
    for (int s = 0; s < seqs; ++s) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int c = threadIdx.x + k * Q4_THREADS;
            if (c < dim) {
                float* h = ht + q4_at(s, c, groups);
                *h = round16(*h * rstd[s] * g[k]);
            }
        }
    }
    __syncthreads();
}

template <int K>
__device__ __forceinline__ void q4_input_f16(float* ht, const __half* __restrict__ a, int seqs, int dim) {
    const int groups = dim / 32;
    for (int s = 0; s < seqs; ++s) {
        float v[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int c = threadIdx.x + k * Q4_THREADS;
            v[k] = c < dim ? __half2float(a[(long long)s * dim + c]) : 0.f;
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int c = threadIdx.x + k * Q4_THREADS;
            if (c < dim) ht[q4_at(s, c, groups)] = v[k];
        }
    }
    __syncthreads();
}

// The row's product with sequence s's input, summed over the warp (every lane gets it). The
// group's input sum (for the Q4_1 minimum) is taken on the way.
template <int G>
__device__ __forceinline__ float q4_dot(const Q4Row<G>& r, const float* ht, int s, int groups, int lane) {
    float acc = 0.f;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int grp = lane + 32 * g;
        if (grp < groups) {
            const float* h = ht + s * 32 * groups + grp;
            float t = 0.f, hs = 0.f;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const unsigned q = r.u[g][1 + k];
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    const int j = 4 * k + b;
                    const float lo = h[j * groups], hi = h[(j + 16) * groups];
                    t += (float)((q >> (8 * b)) & 15u) * lo + (float)((q >> (8 * b + 4)) & 15u) * hi;
                    hs += lo + hi;
                }
            }
            const float d = __half2float(__ushort_as_half((unsigned short)(r.u[g][0] & 0xffffu)));
            const float m = __half2float(__ushort_as_half((unsigned short)(r.u[g][0] >> 16)));
            acc += d * t + m * hs;
        }
    }
    return warp_reduce_sum(acc);
}

// Where element e of a stacked QKV row goes when it is a K or a V element (e >= hq D): its place
// in cache slot `slot`.
__device__ __forceinline__ __half* kv_at(__half* kc, __half* vc, long long slot, int hq, int hkv, int D, int e) {
    return e < (hq + hkv) * D ? kc + slot * hkv * D + (e - hq * D) : vc + slot * hkv * D + (e - (hq + hkv) * D);
}

// Dynamic shared memory: seqs x 32 x groups floats; Q4_THREADS threads a block.
// w: the stacked Q, K, V rows ((hq + 2 hkv) D of dim); a warp per neighbour pair of rows.
extern "C" __global__ void __launch_bounds__(Q4_THREADS, 2)
    llama_qkv_rope_q4_1_f16(const unsigned char* __restrict__ w, const float* __restrict__ x, const float* __restrict__ gamma, float eps,
                            __half* __restrict__ q, __half* __restrict__ kc, __half* __restrict__ vc, const int* __restrict__ table,
                            const int* __restrict__ pos, const double* __restrict__ inv_freq, int seqs, int dim, int hq, int hkv, int D,
                            int rope_dims, int page, int max_pages) {
    extern __shared__ float ht[];
    const unsigned long long entered = step_begin();
    const int lane = threadIdx.x & 31, groups = dim / 32;
    const int pair = blockIdx.x * (Q4_THREADS / 32) + (threadIdx.x >> 5), pairs = (hq + 2 * hkv) * D / 2;
    const int e = 2 * pair, head = e / D, d = e % D;
    Q4Row<Q4_NORM_G> r0, r1;
    float g[Q4_K(Q4_NORM_G)];
    if (pair < pairs) {
        q4_load(r0, w + (long long)e * groups * 20, groups, lane);
        q4_load(r1, w + (long long)(e + 1) * groups * 20, groups, lane);
    }
    q4_gamma(g, gamma, dim);
    // The position, its cache slot and the pair's rotation before the wait: pos and the page table
    // were written before the kernel ahead of this one started (as attention_o_q4_1 reads them).
    const bool rotates = head < hq + hkv && d < rope_dims;
    const int p = lane < seqs ? pos[lane] : 0;
    const long long slot = lane < seqs ? cache_slot(table, lane, max_pages, page, p) : 0;
    float fs = 0.f, fc = 1.f;
    if (rotates && lane < seqs) rope_angle(p, inv_freq[d / 2], fs, fc);
    step_wait(entered);
    q4_input_norm(ht, x, g, eps, seqs, dim);
    if (pair >= pairs) return;
    float a = 0.f, b = 0.f;
    for (int s = 0; s < seqs; ++s) {
        const float ya = q4_dot(r0, ht, s, groups, lane), yb = q4_dot(r1, ht, s, groups, lane);
        if (lane == s) a = ya, b = yb;
    }
    if (lane >= seqs) return;
    a = round16(a), b = round16(b);
    if (rotates) rotate_by(a, b, fs, fc);
    __half* out = head < hq ? q + (long long)lane * hq * D + e : kv_at(kc, vc, slot, hq, hkv, D, e);
    out[0] = __float2half_rn(a);
    out[1] = __float2half_rn(b);
}

// A warp's gate and up rows of FFN column j (weights: loaded before step_wait).
__device__ __forceinline__ void q4_gate_up_load(Q4Row<Q4_NORM_G>& gr, Q4Row<Q4_NORM_G>& ur, const unsigned char* __restrict__ w, int j, int ffn,
                                                int groups, int lane) {
    if (j < ffn) {
        q4_load(gr, w + (long long)j * groups * 20, groups, lane);
        q4_load(ur, w + (long long)(ffn + j) * groups * 20, groups, lane);
    }
}

// silu(gate) * up for sequence s, the gate and up rounded to f16 as the unfused step stores them.
__device__ __forceinline__ float q4_swiglu(const Q4Row<Q4_NORM_G>& gr, const Q4Row<Q4_NORM_G>& ur, const float* ht, int s, int groups, int lane) {
    const float gs = round16(q4_dot(gr, ht, s, groups, lane)), us = round16(q4_dot(ur, ht, s, groups, lane));
    return gs / (1.f + __expf(-gs)) * us;
}

// w: gate rows then up rows (2 ffn of dim); a warp per output column j (gate j and up j).
extern "C" __global__ void __launch_bounds__(Q4_THREADS, 2)
    llama_gate_up_swiglu_q4_1_f16(const unsigned char* __restrict__ w, const float* __restrict__ x, const float* __restrict__ gamma, float eps,
                                  __half* __restrict__ act, int seqs, int dim, int ffn) {
    extern __shared__ float ht[];
    const int lane = threadIdx.x & 31, groups = dim / 32;
    const int j = blockIdx.x * (Q4_THREADS / 32) + (threadIdx.x >> 5);
    Q4Row<Q4_NORM_G> gr, ur;
    float g[Q4_K(Q4_NORM_G)];
    q4_gate_up_load(gr, ur, w, j, ffn, groups, lane);
    q4_gamma(g, gamma, dim);
    step_wait();
    q4_input_norm(ht, x, g, eps, seqs, dim);
    if (j >= ffn) return;
    for (int s = 0; s < seqs; ++s) {
        const float a = q4_swiglu(gr, ur, ht, s, groups, lane);
        if (lane == s) act[(long long)s * ffn + j] = __float2half_rn(a);
    }
}

// x [seqs, n] += f16(a [seqs, k] W^T), W n rows of k; a warp per row. The ahead bytes at `ahead`
// (weights of a kernel further on: the engine's LM head) are asked of L2 before the wait, a share
// per block, so that they come from memory while this layer runs, not while that kernel waits.
extern "C" __global__ void __launch_bounds__(Q4_THREADS, 2)
    llama_residual_q4_1_f16(const unsigned char* __restrict__ w, const __half* __restrict__ a, float* __restrict__ x, int seqs, int n, int k,
                            const unsigned char* __restrict__ ahead, long long ahead_bytes) {
    extern __shared__ float ht[];
    const int lane = threadIdx.x & 31, groups = k / 32;
    const int j = blockIdx.x * (Q4_THREADS / 32) + (threadIdx.x >> 5);
    Q4Row<Q4_RESIDUAL_G> r;
    if (j < n) q4_load(r, w + (long long)j * groups * 20, groups, lane);
    if (threadIdx.x == 0 && ahead_bytes > 0) {
        const long long share = ((ahead_bytes + gridDim.x - 1) / gridDim.x + 15) & ~15LL, at = blockIdx.x * share;
        if (at < ahead_bytes) pdl_prefetch_l2(ahead + at, min(share, ahead_bytes - at));
    }
    step_wait();
    // The residual this lane adds to, fetched now to arrive during the input's load.
    const float xv = j < n && lane < seqs ? x[(long long)lane * n + j] : 0.f;
    q4_input_f16<Q4_K(Q4_RESIDUAL_G)>(ht, a, seqs, k);
    if (j >= n) return;
    float y = 0.f;
    for (int s = 0; s < seqs; ++s) {
        const float ys = q4_dot(r, ht, s, groups, lane);
        if (lane == s) y = ys;
    }
    if (lane < seqs) x[(long long)lane * n + j] = xv + round16(y);
}

// ---- ffn_q4_1 ------------------------------------------------------------------------------
// The FFN in one launch: gate_up_swiglu_q4_1's blocks (a warp per column of the FFN, FF_COLS a
// block) go on to multiply their columns of the activation by the same columns of every row of
// the down product, so that the activation never leaves the block; what each block holds then is
// a partial sum of every output row. The partials are added in a fixed order, so every launch
// gives the same x: within a cluster of FF_CLUSTER blocks through distributed shared memory
// (block r summing the r-th eighth of the rows), then across clusters by the last block of each
// rank to count itself in (decode_merge's pattern), which adds its eighth, rounded to f16 as
// residual_q4_1 rounds the product, into x. This trades residual_q4_1's launch (a kernel
// boundary, then a round trip for the activation) for a cluster barrier and a round trip for the
// count. Every block has read x before its cluster's first barrier, and a slice's last block
// counts only after every cluster passed it, so x is written after the last read.

#define FF_CLUSTER 8
#define FF_COLS (Q4_THREADS / 32)
#define FF_ROWS (32 * 32 * Q4_NORM_G / Q4_THREADS)  // down-product rows a thread (dim <= 1024)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FF_ATTRS __launch_bounds__(Q4_THREADS, 2) __cluster_dims__(FF_CLUSTER, 1, 1)
#else
#define FF_ATTRS __launch_bounds__(Q4_THREADS, 2)
#endif

// wgu: the gate rows then the up rows (2 ffn of dim); wd: the down product's dim rows of ffn;
// part [gridDim.x / FF_CLUSTER, seqs, dim]; count [FF_CLUSTER], zero between launches. Grid: whole
// clusters covering ffn / FF_COLS blocks; dynamic smem seqs x dim floats.
extern "C" __global__ void FF_ATTRS llama_ffn_q4_1_f16(const unsigned char* __restrict__ wgu, const unsigned char* __restrict__ wd,
                                                       float* __restrict__ x, const float* __restrict__ gamma, float eps,
                                                       float* __restrict__ part, unsigned* __restrict__ count, int seqs, int dim, int ffn) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ float ht[];  // the normalised input, then this block's partials [seqs][dim]
    __shared__ float act[Q4_MAXB][FF_COLS];
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, groups = dim / 32;
    const int c0 = blockIdx.x * FF_COLS, j = c0 + warp;
    Q4Row<Q4_NORM_G> gr, ur;
    float g[Q4_K(Q4_NORM_G)];
    q4_gate_up_load(gr, ur, wgu, j, ffn, groups, lane);
    q4_gamma(g, gamma, dim);
    // The down product's columns c0.. of rows tid + Q4_THREADS i: the group's d|m word and the two
    // words whose bytes hold those columns (low nibbles for columns 0-15 of a group, high for 16-31).
    const int e0 = c0 % 32, shift = e0 >= 16 ? 4 : 0;
    unsigned dm[FF_ROWS], qa[FF_ROWS], qb[FF_ROWS];
#pragma unroll
    for (int i = 0; i < FF_ROWS; ++i) {
        const int row = tid + i * Q4_THREADS;
        dm[i] = qa[i] = qb[i] = 0u;
        if (row < dim && c0 < ffn) {
            const unsigned* p = reinterpret_cast<const unsigned*>(wd + ((long long)row * (ffn / 32) + c0 / 32) * 20);
            dm[i] = __ldg(p), qa[i] = __ldg(p + 1 + (e0 % 16) / 4), qb[i] = __ldg(p + 2 + (e0 % 16) / 4);
        }
    }
    step_wait();
    q4_input_norm(ht, x, g, eps, seqs, dim);
    for (int s = 0; s < seqs; ++s) {
        float a = 0.f;
        if (j < ffn) a = round16(q4_swiglu(gr, ur, ht, s, groups, lane));
        if (lane == 0) act[s][warp] = a;
    }
    __syncthreads();  // act is whole and ht read: it takes the partials now
    for (int s = 0; s < seqs; ++s) {
        float a[FF_COLS], asum = 0.f;
#pragma unroll
        for (int k = 0; k < FF_COLS; ++k) a[k] = act[s][k], asum += a[k];
#pragma unroll
        for (int i = 0; i < FF_ROWS; ++i) {
            const int row = tid + i * Q4_THREADS;
            if (row >= dim) break;
            float t = 0.f;
#pragma unroll
            for (int k = 0; k < 4; ++k) t += (float)((qa[i] >> (8 * k + shift)) & 15u) * a[k] + (float)((qb[i] >> (8 * k + shift)) & 15u) * a[4 + k];
            const float d = __half2float(__ushort_as_half((unsigned short)(dm[i] & 0xffffu)));
            const float m = __half2float(__ushort_as_half((unsigned short)(dm[i] >> 16)));
            ht[s * dim + row] = d * t + m * asum;
        }
    }
    __cluster_barrier_arrive();
    __cluster_barrier_wait();  // every block's partials are whole
    const int rank = blockIdx.x % FF_CLUSTER, cluster = blockIdx.x / FF_CLUSTER, clusters = gridDim.x / FF_CLUSTER;
    const int n = dim / FF_CLUSTER, r0 = rank * n;
    for (int i = tid; i < seqs * n; i += Q4_THREADS) {
        const int s = i / n, at = s * dim + r0 + i % n;
        float v = 0.f;
#pragma unroll
        for (int q = 0; q < FF_CLUSTER; ++q) v += static_cast<const float*>(__cluster_map_shared_rank(ht, (unsigned)q))[at];
        part[(long long)cluster * seqs * dim + at] = v;
    }
    // Done with the other blocks' memory: they may leave once every block has arrived here.
    __cluster_barrier_arrive();
    // The barrier orders every thread's partials before thread 0's fence, the fence before the
    // count (as in decode_merge); the last block's fence after it orders its reads after.
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        last = atomicAdd(count + rank, 1u) == (unsigned)clusters - 1;
        if (last) {
            count[rank] = 0u;  // every cluster has counted: ready for the next launch
            __threadfence();
        }
    }
    __syncthreads();
    if (last) {
        for (int i = tid; i < seqs * n; i += Q4_THREADS) {
            const int s = i / n, at = s * dim + r0 + i % n;
            float v = 0.f;
#pragma unroll 8
            for (int c = 0; c < clusters; ++c) v += __ldcg(part + (long long)c * seqs * dim + at);
            x[at] += round16(v);
        }
    }
    __cluster_barrier_wait();
#endif
}

// ---- attention_o_q4_1 ----------------------------------------------------------------------
// Decode attention and the output product in one launch, so that nothing crosses a kernel
// boundary between them: heads of AO_D = 64, up to AO_CLUSTER KV heads of up to AO_GMAX query
// heads each, rows up to AO_MAXDIM wide, clusters of AO_CLUSTER blocks (sm_90). Block r of a
// cluster attends with KV head r's query heads over the sequence's cache and keeps their output
// (rounded to f16, as the unfused step stores it) in shared memory; after a cluster barrier each
// block reads the others' (distributed shared memory), so that it holds the whole attention
// output, and each of its warps adds one row of the output product into x as residual_q4_1 does.
// Every cluster attends anew: a few KB of cache from L2 per block at short contexts, against a
// kernel boundary and a round trip through memory.
// Keys pass through shared memory AO_KEYS at a time, one a thread (an online softmax across
// passes): a thread scores its key against the group's query heads, then P V is taken with a
// warp per 16th of the keys and a lane per two columns, and the 16 warps' sums are added. pos, the
// page table and the cache rows before pos were written before the kernel ahead of this one
// started (its blocks launch this one's only after their own pdl_wait), so they are read before
// pdl_wait; the step's own key and value row and Q after it. A first version that took a key with
// 8 threads summing by shuffles spent ~2 us a pass on shuffles and conversions (note
// h200-decode-attention-o).

#define AO_D 64
#define AO_CLUSTER 3
#define AO_THREADS 512
#define AO_WARPS (AO_THREADS / 32)
#define AO_KEYS AO_THREADS
#define AO_GMAX 4
#define AO_MAXDIM 1024
#define AO_KS (AO_D + 8)  // key row stride in halves: a warp's 16-byte loads from 32 rows spread over the banks
#define AO_SMEM (AO_KEYS * (AO_KS + AO_D) * 2)

// Where key k of sequence s, KV head g, starts in the cache.
__device__ __forceinline__ long long ao_row(const int* __restrict__ table, int s, int max_pages, int page, int hkv, int g, int k) {
    return (cache_slot(table, s, max_pages, page, k) * hkv + g) * AO_D;
}

// Key and value row `row` of the cache into tile slot `slot` (cp.async, not committed).
__device__ __forceinline__ void ao_copy_row(__half* sk, __half* sv, const __half* __restrict__ kc, const __half* __restrict__ vc, long long row, int slot) {
#pragma unroll
    for (int c = 0; c < AO_D; c += 8) {
        cp_async16(smem_addr(sk + slot * AO_KS + c), kc + row + c, 16);
        cp_async16(smem_addr(sv + slot * AO_D + c), vc + row + c, 16);
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define AO_ATTRS __launch_bounds__(AO_THREADS, 2) __cluster_dims__(AO_CLUSTER, 1, 1)
#else
#define AO_ATTRS __launch_bounds__(AO_THREADS, 1)
#endif

// w: the output product's dim rows of dim (dim = hq AO_D); q [seqs, hq, AO_D]; x [seqs, dim].
// Grid (a multiple of AO_CLUSTER covering dim / AO_WARPS rows, seqs); dynamic smem AO_SMEM.
extern "C" __global__ void AO_ATTRS llama_attention_o_q4_1_f16(const unsigned char* __restrict__ w, const __half* __restrict__ q,
                                                               const __half* __restrict__ kc, const __half* __restrict__ vc,
                                                               const int* __restrict__ table, const int* __restrict__ pos,
                                                               float* __restrict__ x, int hq, int hkv, int page, int max_pages,
                                                               float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char ao_smem[];
    __half* sk = reinterpret_cast<__half*>(ao_smem);
    __half* sv = sk + AO_KEYS * AO_KS;
    __shared__ float own[AO_MAXDIM];                     // this block's heads' outputs, by column
    __shared__ float ht[AO_MAXDIM];                      // every head's, as q4_dot reads its input
    __shared__ __align__(16) float sq[AO_GMAX][AO_D];    // the group's queries
    __shared__ float sp[AO_GMAX][AO_KEYS];               // a pass's probabilities
    __shared__ float red[AO_WARPS][AO_GMAX * AO_D];      // P V by warp
    __shared__ float wmax[AO_WARPS][AO_GMAX], wsum[AO_WARPS][AO_GMAX];
    const unsigned long long entered = step_begin();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rank = blockIdx.x % AO_CLUSTER, s = blockIdx.y, dim = hq * AO_D, groups = dim / 32, G = hq / hkv;
    const int j = blockIdx.x * AO_WARPS + warp;
    const bool attends = rank < hkv;
    Q4Row<1> r;
    if (j < dim) q4_load(r, w + (long long)j * groups * 20, groups, lane);
    const int p = pos[s], n = p + 1;
    long long own_row = 0;  // where the step's own key will be (thread p of the first pass)
    if (attends && tid < min(p + 1, AO_KEYS)) {
        const long long row = ao_row(table, s, max_pages, page, hkv, rank, tid);
        if (tid < p) ao_copy_row(sk, sv, kc, vc, row, tid);
        own_row = row;
    }
    cp_async_commit();
    step_wait(entered);
    // The step's own key and value row first: its copy and the load of Q below are then one
    // round trip after the wait, not two (the store of Q into shared memory waits for its load).
    if (attends && tid == p && p < AO_KEYS) ao_copy_row(sk, sv, kc, vc, own_row, tid);
    cp_async_commit();
    const float xv = j < dim && lane == 0 ? x[(long long)s * dim + j] : 0.f;
    if (attends && tid < G * AO_D / 8) {
        float v[8];
        const uint4 u = *reinterpret_cast<const uint4*>(q + ((long long)s * hq + rank * G) * AO_D + tid * 8);
        const __half2* h2 = reinterpret_cast<const __half2*>(&u);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(h2[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) (&sq[0][0])[tid * 8 + e] = v[e];
    }
    // Thread tid < G AO_D carries column tid % AO_D of head tid / AO_D across passes.
    float m_run = NEG_INF, l_run = 0.f, o_run = 0.f;
    for (int k0 = 0; attends && k0 < n; k0 += AO_KEYS) {
        const int k1 = min(n, k0 + AO_KEYS), k = k0 + tid;
        if (k0 > 0) {
            __syncthreads();  // the last pass's tiles and sums are read
            if (k < k1) ao_copy_row(sk, sv, kc, vc, ao_row(table, s, max_pages, page, hkv, rank, k), tid);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        float sc[AO_GMAX];
#pragma unroll
        for (int hh = 0; hh < AO_GMAX; ++hh) sc[hh] = 0.f;
        if (k < k1) {
#pragma unroll
            for (int c = 0; c < AO_D; c += 8) {
                const uint4 u = *reinterpret_cast<const uint4*>(sk + tid * AO_KS + c);
                const __half2* h2 = reinterpret_cast<const __half2*>(&u);
                float kf[8];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float2 f = __half22float2(h2[i]);
                    kf[2 * i] = f.x, kf[2 * i + 1] = f.y;
                }
#pragma unroll
                for (int hh = 0; hh < AO_GMAX; ++hh) {
                    if (hh < G) {
                        const float4 a = *reinterpret_cast<const float4*>(&sq[hh][c]), b = *reinterpret_cast<const float4*>(&sq[hh][c + 4]);
                        sc[hh] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] + b.x * kf[4] + b.y * kf[5] + b.z * kf[6] + b.w * kf[7];
                    }
                }
            }
        }
#pragma unroll
        for (int hh = 0; hh < AO_GMAX; ++hh) {
            if (hh >= G) break;
            sc[hh] = k < k1 ? sc[hh] * scale_log2 : NEG_INF;
            const float mx = warp_reduce_max(sc[hh]);
            if (lane == 0) wmax[warp][hh] = mx;
        }
        __syncthreads();
        float mx[AO_GMAX];
#pragma unroll
        for (int hh = 0; hh < AO_GMAX; ++hh) {
            mx[hh] = NEG_INF;
            if (hh >= G) continue;
            for (int w2 = 0; w2 < AO_WARPS; ++w2) mx[hh] = fmax_nan(mx[hh], wmax[w2][hh]);
            const float pr = k < k1 ? exp2f(sc[hh] - safe_shift(mx[hh])) : 0.f;
            sp[hh][tid] = pr;
            const float sum = warp_reduce_sum(pr);
            if (lane == 0) wsum[warp][hh] = sum;
        }
        __syncthreads();
        // P V: warp `warp` takes keys warp, warp + 16, ... of the pass; lane the columns 2 lane, 2 lane + 1.
        float acc[AO_GMAX][2];
#pragma unroll
        for (int hh = 0; hh < AO_GMAX; ++hh) acc[hh][0] = acc[hh][1] = 0.f;
#pragma unroll 4
        for (int kk = warp; kk < k1 - k0; kk += AO_WARPS) {
            const float2 v = __half22float2(*reinterpret_cast<const __half2*>(sv + kk * AO_D + 2 * lane));
#pragma unroll
            for (int hh = 0; hh < AO_GMAX; ++hh) {
                if (hh < G) {
                    const float pr = sp[hh][kk];
                    acc[hh][0] += pr * v.x, acc[hh][1] += pr * v.y;
                }
            }
        }
#pragma unroll
        for (int hh = 0; hh < AO_GMAX; ++hh)
            if (hh < G) red[warp][hh * AO_D + 2 * lane] = acc[hh][0], red[warp][hh * AO_D + 2 * lane + 1] = acc[hh][1];
        __syncthreads();
        if (tid < G * AO_D) {
            const int hh = tid / AO_D;
            float o = 0.f, l = 0.f, m = NEG_INF;
#pragma unroll
            for (int i = 0; i < AO_GMAX; ++i)
                if (i == hh) m = mx[i];
            for (int w2 = 0; w2 < AO_WARPS; ++w2) o += red[w2][tid], l += wsum[w2][hh];
            const float mn = fmax_nan(m_run, m), a = exp2f(m_run - mn), b = exp2f(m - mn);
            o_run = o_run * a + o * b, l_run = l_run * a + l * b, m_run = mn;
        }
    }
    if (attends && tid < G * AO_D) own[rank * G * AO_D + tid] = round16(o_run / l_run);
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    for (int c = tid; c < dim; c += AO_THREADS) {
        const float* src = static_cast<const float*>(__cluster_map_shared_rank(own, (unsigned)(c / (G * AO_D))));
        ht[q4_at(0, c, groups)] = src[c];
    }
    // Done with the other blocks' memory: they may leave once every block has arrived here.
    __cluster_barrier_arrive();
    __syncthreads();
    if (j < dim) {
        const float y = q4_dot(r, ht, 0, groups, lane);
        if (lane == 0) x[(long long)s * dim + j] = xv + round16(y);
    }
    __cluster_barrier_wait();
#endif
}
