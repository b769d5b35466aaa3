// llama_layer.cu: a whole decode layer in one launch (concatenated after llama.cu and
// llama_fused.cu, whose helpers it uses).
//
//  layer_q4_1  RMSNorm, the QKV product, RoPE and the cache store, attention over the cache, the
//              output product into x, RMSNorm, gate and up with SwiGLU, the down product into x.
//
// One cluster of LY_CLUSTER blocks (16, a non-portable size: sm_90) per sequence does the layer;
// the blocks hand each other what a kernel boundary used to carry through distributed shared
// memory and cluster barriers, so a layer is one launch, not four. Each block owns a
// sixteenth of every product's rows and holds their GGUF Q4_1 blocks in shared memory (138 KB a
// block for SmolLM2), copied before step_wait while the layer before runs: after the wait the
// chain touches memory only for x, so it is the chain of barriers and on-chip products alone.
// Attention splits the keys across the cluster (position k in block k % LY_CLUSTER, so at short
// contexts every block holds a few), each block taking every query head over its keys (an online
// softmax's partial max, sum and output, combined by every block for itself): positions up to
// LY_CLUSTER x LY_NK in one pass, the rows before the step's own also copied before the wait.
// The products run on the tensor cores (mma.sync m16n8k16, f16 in, f32 out): a warp takes 16 rows
// and a run of groups of 32, each group's 4-bit values made exact f16 integers and multiplied by
// the f16 input (the sequence in the mma's first column, the other seven zero), then scaled by the
// group's d and m as q4_dot does. The first version took q4_dot's lane-a-group loop, which on 16
// SMs issued ~130k warp instructions per SM a layer (52 us alone; note h200-decode-layer).
// Every value the unfused step rounds to f16 is rounded here too.

#define LY_CLUSTER 16
#define LY_THREADS 1024             // a column of the model's width a thread (dim <= 1024)
#define LY_WARPS (LY_THREADS / 32)
#define LY_D AO_D                   // heads of 64: attention_o's cache rows and tiles
#define LY_NK 64                    // key slots a block: positions below LY_CLUSTER * LY_NK
#define LY_MAXH 16                  // query heads (a warp per head in P V)
#define LY_MAXDIM 1024              // the model's width: a column a thread
#define LY_MAXFFN 2048              // the FFN's width (the down product's input)
#define LY_OWN 128                  // a block's share of the QKV outputs (64 pairs) and of the FFN
#define LY_KS AO_KS                 // key row stride in halves
#define LY_PART 1280                // partial sums of a product: (splits x 16-row tiles) rows

// Copies [src, src + bytes) into shared memory at dst with cp.async, 16 bytes a request when both
// ends allow it, 4 otherwise (Q4_1 rows are 20-byte blocks); not committed.
__device__ __forceinline__ void ly_copy(unsigned char* dst, const unsigned char* __restrict__ src, int bytes) {
    if (((reinterpret_cast<unsigned long long>(src) | smem_addr(dst) | (unsigned)bytes) & 15u) == 0) {
        for (int i = threadIdx.x * 16; i < bytes; i += LY_THREADS * 16) cp_async16(smem_addr(dst + i), src + i, 16);
    } else {
        for (int i = threadIdx.x * 4; i < bytes; i += LY_THREADS * 4)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst + i)), "l"(src + i));
    }
}

// Bytes b0, b1 of a group's nibbles as two f16 pairs: (lo b0, lo b1) and (hi b0, hi b1), exact
// integers 0..15 (0x6400 | q is 1024 + q in f16).
__device__ __forceinline__ void ly_dequant(unsigned short x, unsigned& lo, unsigned& hi) {
    const unsigned y = __byte_perm((unsigned)x, 0u, 0x4140);  // b0 in bits 0-7, b1 in 16-23
    unsigned l = (y & 0x000f000fu) | 0x64006400u, h = ((y >> 4) & 0x000f000fu) | 0x64006400u;
    const __half2 k = __half2half2(__ushort_as_half((unsigned short)0x6400u));
    const __half2 a = __hsub2(*reinterpret_cast<__half2*>(&l), k), b = __hsub2(*reinterpret_cast<__half2*>(&h), k);
    lo = *reinterpret_cast<const unsigned*>(&a), hi = *reinterpret_cast<const unsigned*>(&b);
}

// y = W h for `rows` Q4_1 rows (shared memory, rb bytes apart, `groups` groups of 32) and the f16
// input hh with its group sums hsum. Tasks are (16-row tile, run of groups), spread over the
// warps; each leaves its rows' partial sums in part[split * stride + row]. Returns the number of
// splits (the caller sums them after a __syncthreads). Rows past `rows` read the last row.
__device__ __forceinline__ int ly_product(const unsigned char* w, int rows, int rb, int groups, const __half* hh, const float* hsum, float* part,
                                          int& stride) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 2, c = lane & 3;
    const int tiles = (rows + 15) / 16, splits = min(groups, max(1, (2 * LY_WARPS + tiles - 1) / tiles)), per = (groups + splits - 1) / splits;
    stride = 16 * tiles;
    for (int t = warp; t < tiles * splits; t += LY_WARPS) {
        const int tile = t % tiles, sp = t / tiles, g0 = sp * per, g1 = min(groups, g0 + per);
        const unsigned char* w0 = w + min(tile * 16 + r, rows - 1) * rb;
        const unsigned char* w8 = w + min(tile * 16 + r + 8, rows - 1) * rb;
        float acc0 = 0.f, acc8 = 0.f;
        for (int g = g0; g < g1; ++g) {
            // B: the input in column 0 (lanes 0-3), k = 2c, 2c + 1 and 2c + 8, 2c + 9 of each half group.
            unsigned blo[2] = {0u, 0u}, bhi[2] = {0u, 0u};
            if (lane < 4) {
                const unsigned* h = reinterpret_cast<const unsigned*>(hh + 32 * g + 2 * c);
                blo[0] = h[0], blo[1] = h[4], bhi[0] = h[8], bhi[1] = h[12];
            }
            // A: rows r and r + 8, the same k; nibble byte j holds values j (low) and j + 16 (high).
            const unsigned char *q0 = w0 + g * 20, *q8 = w8 + g * 20;
            unsigned alo[4], ahi[4];
            ly_dequant(*reinterpret_cast<const unsigned short*>(q0 + 4 + 2 * c), alo[0], ahi[0]);
            ly_dequant(*reinterpret_cast<const unsigned short*>(q8 + 4 + 2 * c), alo[1], ahi[1]);
            ly_dequant(*reinterpret_cast<const unsigned short*>(q0 + 12 + 2 * c), alo[2], ahi[2]);
            ly_dequant(*reinterpret_cast<const unsigned short*>(q8 + 12 + 2 * c), alo[3], ahi[3]);
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            Mma<__half>::run(acc, alo, blo);
            Mma<__half>::run(acc, ahi, bhi);
            const unsigned dm0 = *reinterpret_cast<const unsigned*>(q0), dm8 = *reinterpret_cast<const unsigned*>(q8);
            const float hs = hsum[g];
            acc0 += __half2float(__ushort_as_half((unsigned short)(dm0 & 0xffffu))) * acc[0] + __half2float(__ushort_as_half((unsigned short)(dm0 >> 16))) * hs;
            acc8 += __half2float(__ushort_as_half((unsigned short)(dm8 & 0xffffu))) * acc[2] + __half2float(__ushort_as_half((unsigned short)(dm8 >> 16))) * hs;
        }
        if (c == 0) part[sp * stride + tile * 16 + r] = acc0, part[sp * stride + tile * 16 + r + 8] = acc8;
    }
    return splits;
}

// Row i of a product: its splits summed in order.
__device__ __forceinline__ float ly_row_sum(const float* part, int splits, int stride, int i) {
    float y = 0.f;
    for (int sp = 0; sp < splits; ++sp) y += part[sp * stride + i];
    return y;
}

// Column c (tid + a multiple of LY_THREADS) of an input into hh (rounded to f16), and its group's
// sum (a warp holds one group).
__device__ __forceinline__ void ly_input(__half* hh, float* hsum, float v, int c, int width) {
    const __half h = __float2half_rn(v);
    const float s = warp_reduce_sum(c < width ? __half2float(h) : 0.f);
    if (c < width) {
        hh[c] = h;
        if ((threadIdx.x & 31) == 0) hsum[c / 32] = s;
    }
}

// v (column tid) normalised into the input.
__device__ __forceinline__ void ly_norm(__half* hh, float* hsum, float* red, float v, float g, float eps, int dim) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float ss = warp_reduce_sum(v * v);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < LY_WARPS; ++w) t += red[w];
    const float rstd = 1.f / sqrtf(t / dim + eps);
    ly_input(hh, hsum, v * rstd * g, threadIdx.x, dim);
}

__device__ __forceinline__ void ly_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LY_ATTRS __launch_bounds__(LY_THREADS, 1) __cluster_dims__(LY_CLUSTER, 1, 1)
#else
#define LY_ATTRS __launch_bounds__(LY_THREADS, 1)
#endif

// Weights as the GGUF stores them: wqkv (hq + 2 hkv) D rows of dim, wo dim of dim, wgu gate then
// up (2 ffn of dim), wd dim of ffn. x [seqs, dim]. Grid (LY_CLUSTER, seqs), LY_THREADS threads;
// dynamic shared memory as the launcher sizes it (the rows of each product this block owns, each
// part 16-aligned, then the key and value tiles).
extern "C" __global__ void LY_ATTRS llama_layer_q4_1_f16(const unsigned char* __restrict__ wqkv, const unsigned char* __restrict__ wo,
                                                         const unsigned char* __restrict__ wgu, const unsigned char* __restrict__ wd,
                                                         const float* __restrict__ attn_norm, const float* __restrict__ ffn_norm, float* __restrict__ x,
                                                         __half* __restrict__ kc, __half* __restrict__ vc, const int* __restrict__ table,
                                                         const int* __restrict__ pos, const double* __restrict__ inv_freq, float eps, int dim, int hq,
                                                         int hkv, int ffn, int rope_dims, int page, int max_pages, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char ly_smem[];
    __shared__ __align__(16) __half hh[LY_MAXFFN];  // the current product's input
    __shared__ float hsum[LY_MAXFFN / 32];          // and its groups' sums
    __shared__ float part[LY_PART];                 // the product's partial sums
    __shared__ float xs[LY_MAXDIM];                 // x as the layer found it
    __shared__ __align__(16) float sq[LY_MAXDIM];   // every query head
    __shared__ float sp[LY_MAXH][LY_NK];            // scores, then probabilities, of this block's keys
    __shared__ float part_o[LY_MAXDIM], part_m[LY_MAXH], part_l[LY_MAXH];  // this block's share of attention
    __shared__ float wgt[LY_MAXH][LY_CLUSTER];      // each block's share's weight in the combined output
    __shared__ float own_qkv[LY_OWN], own_x[LY_MAXDIM / LY_CLUSTER], own_act[LY_OWN];  // what the others read
    __shared__ float red[LY_WARPS];
    __shared__ double freq[LY_OWN / 2];             // each pair's RoPE frequency (0: not rotated)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, b = blockIdx.x, s = blockIdx.y;
    const int g1 = dim / 32, g2 = ffn / 32, rb1 = g1 * 20, rb2 = g2 * 20, G = hq / hkv;
    // This block's rows: QKV pairs [b ppb, ..), output and down rows [b rpb, ..), FFN columns [b fpb, ..).
    const int pairs = (hq + 2 * hkv) * LY_D / 2, ppb = (pairs + LY_CLUSTER - 1) / LY_CLUSTER;
    const int rpb = (dim + LY_CLUSTER - 1) / LY_CLUSTER, fpb = (ffn + LY_CLUSTER - 1) / LY_CLUSTER;
    const int p0 = b * ppb, np = max(0, min(pairs, p0 + ppb) - p0);
    const int r0 = b * rpb, nr = max(0, min(dim, r0 + rpb) - r0);
    const int f0 = b * fpb, nf = max(0, min(ffn, f0 + fpb) - f0);
    auto up16 = [](int v) { return (v + 15) & ~15; };
    // Gate rows [0, fpb) and up rows [fpb, 2 fpb) make one product.
    unsigned char* s_qkv = ly_smem;
    unsigned char* s_o = s_qkv + up16(2 * ppb * rb1);
    unsigned char* s_gu = s_o + up16(rpb * rb1);
    unsigned char* s_d = s_gu + up16(2 * fpb * rb1);
    __half* sk = reinterpret_cast<__half*>(s_d + up16(rpb * rb2));
    __half* sv = sk + LY_NK * hkv * LY_KS;

    ly_copy(s_qkv, wqkv + (long long)2 * p0 * rb1, 2 * np * rb1);
    ly_copy(s_o, wo + (long long)r0 * rb1, nr * rb1);
    ly_copy(s_gu, wgu + (long long)f0 * rb1, nf * rb1);
    ly_copy(s_gu + fpb * rb1, wgu + (long long)(ffn + f0) * rb1, nf * rb1);
    ly_copy(s_d, wd + (long long)r0 * rb2, nr * rb2);
    // Keys b, b + LY_CLUSTER, ... up to the position; the rows before it were written by earlier steps.
    const int p = pos[s];
    const int nk = p >= b ? min(LY_NK, (p - b) / LY_CLUSTER + 1) : 0;
    for (int t = tid; t < nk * hkv; t += LY_THREADS) {
        const int i = t / hkv, g = t % hkv, k = b + LY_CLUSTER * i;
        if (k < p) ao_copy_row(sk, sv, kc, vc, ao_row(table, s, max_pages, page, hkv, g, k), i * hkv + g);
    }
    cp_async_commit();
    const float ga = tid < dim ? __ldg(attn_norm + tid) : 0.f, gf = tid < dim ? __ldg(ffn_norm + tid) : 0.f;
    if (tid < np) {
        const int e = 2 * (p0 + tid), head = e / LY_D, d = e % LY_D;
        freq[tid] = head < hq + hkv && d < rope_dims ? inv_freq[d / 2] : 0.0;
    }
    const long long slot = cache_slot(table, s, max_pages, page, p);
    step_wait();

    // RMSNorm of x, then this block's QKV pairs: RoPE, Q and the step's K and V kept for the
    // others, K and V stored in the cache for later steps.
    float v = tid < dim ? x[(long long)s * dim + tid] : 0.f;
    if (tid < dim) xs[tid] = v;
    ly_norm(hh, hsum, red, v, ga, eps, dim);
    cp_async_wait<0>();
    __syncthreads();
    int stride, splits = ly_product(s_qkv, 2 * np, rb1, g1, hh, hsum, part, stride);
    __syncthreads();
    if (tid < np) {
        float a = round16(ly_row_sum(part, splits, stride, 2 * tid)), c = round16(ly_row_sum(part, splits, stride, 2 * tid + 1));
        const int e = 2 * (p0 + tid), head = e / LY_D;
        if (freq[tid] != 0.0) rotate(a, c, p, freq[tid]);
        own_qkv[2 * tid] = round16(a), own_qkv[2 * tid + 1] = round16(c);
        if (head >= hq) {
            __half* out = kv_at(kc, vc, slot, hq, hkv, LY_D, e);
            out[0] = __float2half_rn(a), out[1] = __float2half_rn(c);
        }
    }
    ly_cluster_sync();

    // Every query head, and the step's own key and value row into the block that holds position p.
    auto qkv_at = [&](int e) {
        const int owner = e / 2 / ppb;
        return static_cast<const float*>(__cluster_map_shared_rank(own_qkv, (unsigned)owner))[e - 2 * owner * ppb];
    };
    for (int c = tid; c < hq * LY_D; c += LY_THREADS) sq[c] = qkv_at(c);
    if (p % LY_CLUSTER == b) {
        const int i = p / LY_CLUSTER;
        for (int t = tid; t < 2 * hkv * LY_D; t += LY_THREADS) {
            const int kv = t / (hkv * LY_D), g = t / LY_D % hkv, d = t % LY_D;
            const __half h = __float2half_rn(qkv_at(hq * LY_D + t));
            if (kv == 0) sk[(i * hkv + g) * LY_KS + d] = h;
            else sv[(i * hkv + g) * LY_D + d] = h;
        }
    }
    __syncthreads();
    // Scores: 8 lanes a (key slot, head), 8 columns each, summed by shuffles.
    const int kh = nk * hq;
    for (int base = warp * 4; base < kh; base += LY_WARPS * 4) {
        const int pr = base + lane / 8, c8 = (lane & 7) * 8;
        const bool ok = pr < kh;
        const int i = ok ? pr / hq : 0, h = ok ? pr % hq : 0;
        const uint4 w = *reinterpret_cast<const uint4*>(sk + (i * hkv + h / G) * LY_KS + c8);
        const __half2* h2 = reinterpret_cast<const __half2*>(&w);
        const float4 qa = *reinterpret_cast<const float4*>(&sq[h * LY_D + c8]), qb = *reinterpret_cast<const float4*>(&sq[h * LY_D + c8 + 4]);
        const float2 k0 = __half22float2(h2[0]), k1 = __half22float2(h2[1]), k2 = __half22float2(h2[2]), k3 = __half22float2(h2[3]);
        float acc = qa.x * k0.x + qa.y * k0.y + qa.z * k1.x + qa.w * k1.y + qb.x * k2.x + qb.y * k2.y + qb.z * k3.x + qb.w * k3.y;
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (ok && (lane & 7) == 0) sp[h][i] = acc * scale_log2;
    }
    __syncthreads();
    // Softmax of this block's keys and P V: warp h takes head h, a lane two columns.
    if (warp < hq) {
        const int h = warp;
        float sc[LY_NK / 32];
#pragma unroll
        for (int u = 0; u < LY_NK / 32; ++u) sc[u] = lane + 32 * u < nk ? sp[h][lane + 32 * u] : NEG_INF;
        float m = NEG_INF;
#pragma unroll
        for (int u = 0; u < LY_NK / 32; ++u) m = fmax_nan(m, sc[u]);
        m = warp_reduce_max(m);
        float l = 0.f;
#pragma unroll
        for (int u = 0; u < LY_NK / 32; ++u) {
            const float pr = lane + 32 * u < nk ? exp2f(sc[u] - safe_shift(m)) : 0.f;
            sp[h][lane + 32 * u] = pr;
            l += pr;
        }
        l = warp_reduce_sum(l);
        __syncwarp();
        float a0 = 0.f, a1 = 0.f;
#pragma unroll 4
        for (int i = 0; i < nk; ++i) {
            const float pr = sp[h][i];
            const float2 vv = __half22float2(*reinterpret_cast<const __half2*>(sv + (i * hkv + h / G) * LY_D + 2 * lane));
            a0 += pr * vv.x, a1 += pr * vv.y;
        }
        part_o[h * LY_D + 2 * lane] = a0, part_o[h * LY_D + 2 * lane + 1] = a1;
        if (lane == 0) part_m[h] = m, part_l[h] = l;
    }
    ly_cluster_sync();

    // Every block combines the cluster's shares for every column (the output product reads them
    // all): 16 lanes a head find the shares' weights, then a thread a column sums them.
    for (int base = warp * 32; base < LY_CLUSTER * hq; base += LY_THREADS) {
        const int h = (base + lane) / LY_CLUSTER, r = lane % LY_CLUSTER;
        const bool ok = h < hq;
        const float mr = ok ? static_cast<const float*>(__cluster_map_shared_rank(part_m, (unsigned)r))[h] : NEG_INF;
        const float lr = ok ? static_cast<const float*>(__cluster_map_shared_rank(part_l, (unsigned)r))[h] : 0.f;
        float m = mr;
#pragma unroll
        for (int o = LY_CLUSTER / 2; o > 0; o >>= 1) m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float w = ok ? exp2f(mr - safe_shift(m)) : 0.f;
        float l = w * lr;
#pragma unroll
        for (int o = LY_CLUSTER / 2; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (ok) wgt[h][r] = w / l;
    }
    __syncthreads();
    if (tid < dim) {
        const int h = tid / LY_D;
        float o = 0.f;
#pragma unroll
        for (int r = 0; r < LY_CLUSTER; ++r) o += wgt[h][r] * static_cast<const float*>(__cluster_map_shared_rank(part_o, (unsigned)r))[tid];
        ly_input(hh, hsum, o, tid, dim);
    }
    __syncthreads();
    // The output product's rows of this block, added into x.
    splits = ly_product(s_o, nr, rb1, g1, hh, hsum, part, stride);
    __syncthreads();
    if (tid < nr) own_x[tid] = xs[r0 + tid] + round16(ly_row_sum(part, splits, stride, tid));
    ly_cluster_sync();

    // RMSNorm of the new x (every block gathers it), this block's gate and up columns, SwiGLU.
    v = tid < dim ? static_cast<const float*>(__cluster_map_shared_rank(own_x, (unsigned)(tid / rpb)))[tid % rpb] : 0.f;
    ly_norm(hh, hsum, red, v, gf, eps, dim);
    __syncthreads();
    splits = ly_product(s_gu, fpb + nf, rb1, g1, hh, hsum, part, stride);
    __syncthreads();
    if (tid < nf) {
        const float gs = round16(ly_row_sum(part, splits, stride, tid)), us = round16(ly_row_sum(part, splits, stride, fpb + tid));
        own_act[tid] = round16(gs / (1.f + __expf(-gs)) * us);
    }
    ly_cluster_sync();

    // The down product's rows of this block over the gathered activations, added into x.
    for (int c = tid; c < ffn; c += LY_THREADS) ly_input(hh, hsum, static_cast<const float*>(__cluster_map_shared_rank(own_act, (unsigned)(c / fpb)))[c % fpb], c, ffn);
    // Done with the other blocks' memory: they may leave once every block has arrived here.
    __cluster_barrier_arrive();
    __syncthreads();
    splits = ly_product(s_d, nr, rb2, g2, hh, hsum, part, stride);
    __syncthreads();
    if (tid < nr) x[(long long)s * dim + r0 + tid] = own_x[tid] + round16(ly_row_sum(part, splits, stride, tid));
    __cluster_barrier_wait();
#endif
}
