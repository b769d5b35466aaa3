// llama_head.cu: the decode step's tail in one launch (concatenated after llama_layer.cu).
//
//  head_q8_0   RMSNorm of x with the output norm, the LM head and, when the step is greedy,
//              each sequence's next token by argmax's rule (the lowest id of the largest
//              logit, a NaN winning): what add_rmsnorm, quant's w8a16 and argmax do in three
//              launches, the last a one-block scan of every logit.
//
// The head's Q8_0 blocks are repacked once, losslessly (lab/src/ops/llama/mod.rs, pack_head),
// into mma.sync's A-fragment order: tile t (rows 16 t .. 16 t + 15) and block j (columns 32 j ..
// 32 j + 31) take 512 bytes, lane l's 16 of them the codes its fragments hold (g = l / 4,
// c = l % 4): word 2 h + e is k16 step h's columns 16 h + 2 c + 8 e and the one after, row g's
// two codes, then row g + 8's. The scales of (t, j) are 8 words, word g the f16 pair (d of row g,
// d of row g + 8). A code becomes an exact f16 in two instructions (a byte permute under 0x64,
// then minus 1152) where w8a16 spends ~6.5 instructions a weight and runs at ~40% of the copy
// rate at batch 1, issue-bound (kernels/quant/w8a16.cu); the tensor cores sum each block's exact
// products in f32, which its d then scales. The mma's 8 columns are sequences (two column tiles
// for up to 16), B from the block's own normalised copy of x, rounded to f16 as add_rmsnorm
// rounds h. The blocks' choices meet in global memory; the last block to finish counts itself in
// and chooses (the same order every launch).

#define HD_WARPS 8
#define HD_THREADS (32 * HD_WARPS)
#define HD_CH 6                    // blocks of 32 columns a warp loads at a time: two such chunks in flight
#define HD_MAXK 1024
#define HD_MAXB 16
#define HD_HS (HD_MAXK / 2 + 4)    // words between sequences' rows of h: lane (g, c) reads word 4 g + c mod 32, no conflict

struct HdChunk {
    uint4 q[HD_CH];
    unsigned d[HD_CH];
};

// Chunk `ch` of tile `tile`: blocks ch HD_CH .. of the lane's codes and scales (zeros past the row).
__device__ __forceinline__ void hd_load(HdChunk& c, const uint4* __restrict__ codes, const unsigned* __restrict__ scales, int tile, int ch, int kb,
                                        int lane) {
#pragma unroll
    for (int i = 0; i < HD_CH; ++i) {
        const int j = ch * HD_CH + i;
        const long long tj = (long long)tile * kb + j;
        c.q[i] = j < kb ? __ldcs(codes + tj * 32 + lane) : make_uint4(0u, 0u, 0u, 0u);
        c.d[i] = j < kb ? __ldg(scales + tj * 8 + (lane >> 2)) : 0u;
    }
}

// Codes (bytes 2 hi, 2 hi + 1 of w) as an exact f16 pair: 1024 + code + 128, less 1152.
__device__ __forceinline__ unsigned hd_codes(unsigned w, int hi) {
    const unsigned u = __byte_perm(w ^ 0x80808080u, 0x64646464u, hi ? 0x4342u : 0x4140u);
    __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&u), __float2half2_rn(1152.f));
    return *reinterpret_cast<const unsigned*>(&h);
}

// argmax's order: v beats (best, idx) when larger, equal with a lower id, or a NaN (the lowest id
// of the NaNs).
__device__ __forceinline__ bool hd_beats(float v, int j, float best, int idx) {
    return v > best || (v == best && j < idx) || (v != v && (best == best || j < idx));
}

__device__ __forceinline__ void hd_keep(float& best, int& idx, float v, int j) {
    if (hd_beats(v, j, best, idx)) best = v, idx = j;
}

// codes, scales: pack_head's; x [batch, k] f32, gamma [k]; logits [batch, n_rows]. choice (grid
// x HD_MAXB words) and done (one word, 0 between launches) are the greedy choice's scratch; null
// when the step samples (the logits are then all this launch writes). Grid: any, HD_THREADS.
extern "C" __global__ void __launch_bounds__(HD_THREADS) llama_head_q8_0_f32(
    const uint4* __restrict__ codes, const unsigned* __restrict__ scales, const float* __restrict__ x, const float* __restrict__ gamma, float eps,
    float* __restrict__ logits, int n_rows, int k, int batch, unsigned long long* __restrict__ choice, unsigned* __restrict__ done,
    unsigned* __restrict__ tokens, int* __restrict__ pos, const int* __restrict__ prompt_len, int cap) {
    __shared__ unsigned hs[HD_MAXB][HD_HS];
    __shared__ float gs[HD_MAXK];
    __shared__ float wv[HD_WARPS][HD_MAXB];
    __shared__ int wi[HD_WARPS][HD_MAXB];
    __shared__ int spos[HD_MAXB], splen[HD_MAXB];
    __shared__ bool last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int kb = k / 32, tiles = (n_rows + 15) / 16, nch = (kb + HD_CH - 1) / HD_CH, nts = batch > 8 ? 2 : 1;
    // Warp w of block b takes tiles b + gridDim.x w, then every warps-th: a round short of tiles
    // leaves the last warps of every block idle, not the last blocks.
    const int warps = gridDim.x * HD_WARPS, first = blockIdx.x + gridDim.x * warp;
    const int steps = first < tiles ? ((tiles - 1 - first) / warps + 1) * nch : 0;
    // The weights are no kernel's output: the first chunk and gamma are read before the wait.
    HdChunk buf[2];
    if (steps > 0) hd_load(buf[0], codes, scales, first, 0, kb, lane);
    for (int i = tid; i < k; i += HD_THREADS) gs[i] = gamma[i];
    // So are the positions and prompt lengths the choice needs: the step before wrote pos before
    // the kernel ahead of this one started.
    if (choice != nullptr && tid < batch) spos[tid] = pos[tid], splen[tid] = prompt_len[tid];
    step_wait();
    __syncthreads();
    // h = x rstd gamma in f16, a warp a sequence; zeros for the mma's columns past the batch.
    __half* hh = reinterpret_cast<__half*>(&hs[0][0]);
    for (int s = warp; s < 8 * nts; s += HD_WARPS) {
        if (s < batch) {
            float v[HD_MAXK / 32];
            float ss = 0.f;
#pragma unroll
            for (int u = 0; u < HD_MAXK / 32; ++u) v[u] = lane + 32 * u < k ? x[(long long)s * k + lane + 32 * u] : 0.f;
#pragma unroll
            for (int u = 0; u < HD_MAXK / 32; ++u) ss += v[u] * v[u];
            const float rstd = 1.f / sqrtf(warp_reduce_sum(ss) / k + eps);
#pragma unroll
            for (int u = 0; u < HD_MAXK / 32; ++u)
                if (lane + 32 * u < k) hh[s * 2 * HD_HS + lane + 32 * u] = __float2half_rn(v[u] * rstd * gs[lane + 32 * u]);
        } else {
            for (int i = lane; i < k / 2; i += 32) hs[s][i] = 0u;
        }
    }
    __syncthreads();
    float acc[2][4], best[2][2];
    int idx[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
        best[n][0] = best[n][1] = NEG_INF;
        idx[n][0] = idx[n][1] = 0x7fffffff;
    }
    // Step st is chunk st % nch of the warp's (st / nch)-th tile.
    auto run = [&](const HdChunk& now, int st) {
        const int ch = st % nch, tile = first + (st / nch) * warps;
#pragma unroll
        for (int i = 0; i < HD_CH; ++i) {
            const int j = ch * HD_CH + i;
            if (j >= kb) break;
            const unsigned* w = reinterpret_cast<const unsigned*>(&now.q[i]);
            unsigned a[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h) a[h][0] = hd_codes(w[2 * h], 0), a[h][1] = hd_codes(w[2 * h], 1), a[h][2] = hd_codes(w[2 * h + 1], 0), a[h][3] = hd_codes(w[2 * h + 1], 1);
            const float2 d = __half22float2(*reinterpret_cast<const __half2*>(&now.d[i]));
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                if (n >= nts) break;
                float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const unsigned b[2] = {hs[8 * n + g][16 * j + 8 * h + c], hs[8 * n + g][16 * j + 8 * h + c + 4]};
                    Mma<__half>::run(part, a[h], b);
                }
                acc[n][0] += d.x * part[0], acc[n][1] += d.x * part[1], acc[n][2] += d.y * part[2], acc[n][3] += d.y * part[3];
            }
        }
        if (ch != nch - 1) return;
        // The tile's rows are done: lane (g, c) holds rows g and g + 8 of sequences 2 c, 2 c + 1.
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int s = 8 * n + 2 * c + e;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = 16 * tile + g + 8 * r;
                    if (s < batch && row < n_rows) {
                        logits[(long long)s * n_rows + row] = acc[n][2 * r + e];
                        hd_keep(best[n][e], idx[n][e], acc[n][2 * r + e], row);
                    }
                    acc[n][2 * r + e] = 0.f;
                }
            }
        }
    };
    // Two chunks in flight: the next one's loads are issued before this one is used.
    for (int st = 0; st < steps; st += 2) {
        if (st + 1 < steps) hd_load(buf[1], codes, scales, first + ((st + 1) / nch) * warps, (st + 1) % nch, kb, lane);
        run(buf[0], st);
        if (st + 1 < steps) {
            if (st + 2 < steps) hd_load(buf[0], codes, scales, first + ((st + 2) / nch) * warps, (st + 2) % nch, kb, lane);
            run(buf[1], st + 1);
        }
    }
    if (choice == nullptr) return;
    // The warp's choice per sequence (lanes of one c hold the same sequences), then the block's.
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                const float v = __shfl_xor_sync(0xffffffffu, best[n][e], o);
                const int j = __shfl_xor_sync(0xffffffffu, idx[n][e], o);
                hd_keep(best[n][e], idx[n][e], v, j);
            }
            if (g == 0) wv[warp][8 * n + 2 * c + e] = best[n][e], wi[warp][8 * n + 2 * c + e] = idx[n][e];
        }
    }
    __syncthreads();
    if (tid < batch) {
        float b = NEG_INF;
        int i = 0x7fffffff;
        for (int w = 0; w < HD_WARPS; ++w) hd_keep(b, i, wv[w][tid], wi[w][tid]);
        choice[(long long)blockIdx.x * HD_MAXB + tid] = (unsigned long long)(unsigned)i << 32 | __float_as_uint(b);
        __threadfence();
    }
    __syncthreads();
    if (tid == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The last block: every block's choice per sequence, in block order within a thread, then
    // across the warp and the block (hd_beats is an order: the result does not depend on how).
    for (int s = 0; s < batch; ++s) {
        float b = NEG_INF;
        int i = 0x7fffffff;
        for (int blk = tid; blk < (int)gridDim.x; blk += HD_THREADS) {
            const unsigned long long p = __ldcg(choice + (long long)blk * HD_MAXB + s);
            hd_keep(b, i, __uint_as_float((unsigned)p), (int)(p >> 32));
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, b, o);
            const int j = __shfl_xor_sync(0xffffffffu, i, o);
            hd_keep(b, i, v, j);
        }
        if (lane == 0) wv[warp][0] = b, wi[warp][0] = i;
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < HD_WARPS; ++w) hd_keep(b, i, wv[w][0], wi[w][0]);
            emit_token_at(tokens, pos, s, cap, i, spos[s], splen[s]);
        }
        __syncthreads();
    }
    if (tid == 0) *done = 0u;
}
