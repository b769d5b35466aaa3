// moe_backward.cu: the MoE layer's backward kernels (lab/src/ops/moe/backward.rs derives the
// math), after moe.cu in the family's source, whose helpers (moe_token_scores, store_acc_tile,
// the mma.sync tile) they use. No host synchronisation:
//   combine_backward  a block per token: dy[slot] = w dout_t and dJ/dw = dout_t . y[slot].
//   swiglu_backward   a block per live row: d(gate, up) from the stored pre-activations.
//   route_backward    a warp per token, as route: dJ/dlogits (combine weights, the two losses)
//                     and dJ/d(noise logits).
//   transpose         [B, R, C] -> [B, C, R] through 32x33 shared tiles: the experts' weights
//                     for the input-gradient products, x and the router for the projections.
//   grouped_wgrad     dW_e = A_e^T B_e over each expert's segment of rows: grouped_mma's mma.sync
//                     tile with A read transposed; should buy ~5x over the SIMT 64x64 tiles it
//                     replaced (35 TFLOP/s on an H100), which held the backward at Mixtral's size.

// A block per token: for each assignment j with a slot s, dy[s] = w_tj dout_t and
// dw[t, j] = dout_t . y[s]; a dropped assignment gets dw = 0. Dead rows of dy are not written.
template <typename T>
__device__ __forceinline__ void combine_backward_body(const T* dout, const T* y, const int* slot, const float* w, int K, int N,
                                                      T* dy, float* dw) {
    const u64 t = blockIdx.x;
    for (int j = 0; j < K; ++j) {
        const int s = slot[t * K + j];  // block-uniform
        float dot = 0.f;
        if (s >= 0) {
            const float wj = w[t * K + j];
            for (int c = threadIdx.x; c < N; c += blockDim.x) {
                const float d = to_float<T>(dout[t * N + c]);
                dot += d * to_float<T>(y[(u64)s * N + c]);
                dy[(u64)s * N + c] = from_float<T>(wj * d);
            }
        }
        dot = block_reduce_sum(dot);
        if (threadIdx.x == 0) dw[t * K + j] = s >= 0 ? dot : 0.f;
    }
}

// pre[s] holds (gate, up) pairs interleaved; act = silu(g) u, so dg = d u silu'(g), du = d silu(g).
template <typename T>
__device__ __forceinline__ void swiglu_backward_body(const T* pre, const T* dact, const int* offsets, int E, int I, T* dpre) {
    const int s = blockIdx.x;
    if (s >= offsets[E]) return;
    for (int i = threadIdx.x; i < I; i += blockDim.x) {
        const u64 r = (u64)s * 2 * I + 2 * i;
        const float g = to_float<T>(pre[r]), u = to_float<T>(pre[r + 1]), d = to_float<T>(dact[(u64)s * I + i]);
        const float sg = 1.f / (1.f + __expf(-g));
        dpre[r] = from_float<T>(d * u * sg * (1.f + g * (1.f - sg)));
        dpre[r + 1] = from_float<T>(d * g * sg);
    }
}

// One token's router backward, a warp, lane l holding experts l, l + 32, ... as route_token.
// aux_c = d_aux alpha E / T, z_c = 2 d_z / T.
template <typename T>
__device__ __forceinline__ void route_backward_token(const T* logits, const T* noise, const float* eps, const int* experts,
                                                     const float* dw, const int* load, int t, int tokens, int E, int K,
                                                     int sigmoid, int renorm, float aux_c, float z_c, T* dlogits, T* dnoise) {
    const int lane = threadIdx.x % 32;
    const u64 row = (u64)t * E;
    const MoeTokenScores sc = moe_token_scores<T>(logits, noise, eps, row, E, sigmoid);
    const float (&l)[8] = sc.l, (&s)[8] = sc.s;
    const float total = sc.total, lmax = sc.lmax, lsum = sc.lsum;
    float ds[8] = {};
    // The combine weights: w_j = s_j, or s_j / S with S the chosen scores' sum.
    float sum = 0.f, dot = 0.f;
    for (int j = 0; j < K; ++j) {
        const float sv = moe_expert_value(s, experts[(u64)t * K + j]);  // warp-uniform expert
        sum += sv, dot += dw[(u64)t * K + j] * sv;
    }
    for (int j = 0; j < K; ++j) {
        const int e = experts[(u64)t * K + j];
        const float d = dw[(u64)t * K + j], add = renorm ? d / sum - dot / (sum * sum) : d;
#pragma unroll
        for (int q = 0; q < 8; ++q)
            if (q == e / 32 && lane == e % 32) ds[q] += add;
    }
    // The load-balancing loss: alpha E / T (f_m / Z - sum_i f_i s_i / Z^2), f the load share.
    float f[8], fs = 0.f;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const int e = lane + 32 * q;
        f[q] = e < E ? (float)load[e] / ((float)tokens * K) : 0.f;
        fs += f[q] * s[q];
    }
    fs = warp_reduce_sum(fs);
    float sd = 0.f;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        ds[q] += aux_c * (f[q] / total - fs / (total * total));
        sd += s[q] * ds[q];
    }
    sd = warp_reduce_sum(sd);
    const float lse = lmax + logf(lsum);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const int e = lane + 32 * q;
        if (e >= E) continue;
        const float dh = sigmoid ? ds[q] * s[q] * (1.f - s[q]) : s[q] * (ds[q] - sd);
        dlogits[row + e] = from_float<T>(dh + z_c * lse * __expf(l[q] - lmax) / lsum);
        if (noise) {
            const float n = to_float<T>(noise[row + e]);
            dnoise[row + e] = from_float<T>(dh * eps[row + e] / (1.f + __expf(-n)));
        }
    }
}

// Blocks of 256 threads, a warp per token.
template <typename T>
__device__ __forceinline__ void route_backward_body(const T* logits, const T* noise, const float* eps, const int* experts,
                                                    const float* dw, const int* load, int tokens, int E, int K, int sigmoid,
                                                    int renorm, float aux_c, float z_c, T* dlogits, T* dnoise) {
    const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= tokens) return;  // warp-uniform
    route_backward_token<T>(logits, noise, eps, experts, dw, load, t, tokens, E, K, sigmoid, renorm, aux_c, z_c, dlogits, dnoise);
}

// Grid (ceil(C / 32), ceil(R / 32), B), blocks of 32 x 8: out[b, c, r] = in[b, r, c].
template <typename T>
__device__ __forceinline__ void transpose_body(const T* in, int R, int C, T* out) {
    __shared__ float tile[32][33];  // the pad keeps the column reads off one bank; f32 holds bf16 and f16 exactly
    const u64 base = (u64)blockIdx.z * R * C;
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int r = r0 + i, c = c0 + threadIdx.x;
        if (r < R && c < C) tile[i][threadIdx.x] = to_float<T>(in[base + (u64)r * C + c]);
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int c = c0 + i, r = r0 + threadIdx.x;
        if (r < R && c < C) out[base + (u64)c * R + r] = from_float<T>(tile[threadIdx.x][i]);
    }
}

// Grid (ceil(N / 128), ceil(K / 128), E), 256 threads: W[e] (K x N) = A[seg e]^T B[seg e], A rows x K
// and B rows x N, the segment offsets[e]..offsets[e + 1] clamped to the rows: the mma.sync loop
// with A read transposed (the segment's rows are the product's inner dimension). Every element of
// W is written (an expert with no rows gets zeros).
template <typename T>
__device__ __forceinline__ void grouped_wgrad_body(const T* __restrict__ A, const T* __restrict__ B, const int* offsets, int rows,
                                                   int K, int N, T* W) {
    using namespace tc1;
    const int e = blockIdx.z, bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const int r0 = min(offsets[e], rows), r1 = max(r0, min(offsets[e + 1], rows));
    float acc[MI][NI][4] = {};
    mma_ldmatrix_tile<T, true>(A + (u64)r0 * K, B + (u64)r0 * N, K, N, r1 - r0, K, N, bm, bn, acc);
    store_acc_tile<T>(acc, W + (u64)e * K * N, K, N, bm, bn, 0);
}

#define MOE_BACKWARD_TYPED(T, S)                                                                                         \
    extern "C" __global__ void moe_combine_backward_##S(const T* dout, const T* y, const int* slot, const float* w, int K, \
                                                        int N, T* dy, float* dw) {                                       \
        combine_backward_body<T>(dout, y, slot, w, K, N, dy, dw);                                                        \
    }                                                                                                                    \
    extern "C" __global__ void moe_swiglu_backward_##S(const T* pre, const T* dact, const int* offsets, int E, int I,     \
                                                       T* dpre) {                                                        \
        swiglu_backward_body<T>(pre, dact, offsets, E, I, dpre);                                                         \
    }                                                                                                                    \
    extern "C" __global__ void moe_route_backward_##S(const T* logits, const T* noise, const float* eps, const int* experts, \
                                                      const float* dw, const int* load, int tokens, int E, int K,        \
                                                      int sigmoid, int renorm, float aux_c, float z_c, T* dlogits,       \
                                                      T* dnoise) {                                                       \
        route_backward_body<T>(logits, noise, eps, experts, dw, load, tokens, E, K, sigmoid, renorm, aux_c, z_c, dlogits, \
                               dnoise);                                                                                  \
    }                                                                                                                    \
    extern "C" __global__ void moe_transpose_##S(const T* in, int R, int C, T* out) { transpose_body<T>(in, R, C, out); } \
    extern "C" __global__ void __launch_bounds__(256) moe_grouped_wgrad_##S(const T* A, const T* B, const int* offsets,   \
                                                                        int rows, int K, int N, T* W) {                  \
        grouped_wgrad_body<T>(A, B, offsets, rows, K, N, W);                                                             \
    }

MOE_BACKWARD_TYPED(__nv_bfloat16, bf16)
MOE_BACKWARD_TYPED(__half, f16)
