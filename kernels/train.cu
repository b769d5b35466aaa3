// train.cu: the steps of a Llama training step that no other family has
// (lab/src/train/steps.rs launches them; its CPU twins are there too). All
// f32 storage and arithmetic unless a name says otherwise; any sizes >= 0.
//
//  embed            out[i, :] = table[tokens[i], :]. Grid-stride over n*d.
//  embed_backward   dE[t, :] += sum of dx[i, :] over the positions i of
//                   token t, in position order: a block per distinct token
//                   (the host sorts positions by token), threads over
//                   columns. No atomics: the sum does not depend on timing.
//  rope             rotates pairs (2p, 2p+1) of each head's first 2*half
//                   values by the angle table cs[pos][p] = (cos, sin), pos =
//                   row mod seq; `inverse` rotates back (RoPE's backward).
//  swiglu           a = silu(g) u;  swiglu_backward: dg, du from da.
//  cross_entropy    a block per row: lse over the vocabulary (f32 max, f64
//                   sum), loss[row] = lse - logit[target] (f64), and
//                   dlogits = (softmax - onehot) * inv_n in place of nothing
//                   else: the logits are only read.
//  add              y += x.
//  to_bf16 / from_bf16   casts around the 16-bit attention kernels.
//  sum_squares      partial[b] = sum of x^2 over block b's grid-stride
//                   share, in f64 (the global gradient norm).
//  adamw            PyTorch's AdamW step on f32 master weights, gradients
//                   scaled by `clip` first (1 when not clipped), as
//                   train::optim::AdamW::step does on the host.

#include "common.cuh"

extern "C" __global__ void train_embed_f32(const unsigned* __restrict__ tokens, const float* __restrict__ table,
                                           float* __restrict__ out, long long n, int d) {
    const long long total = n * d;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long i = e / d;
        out[e] = table[(long long)tokens[i] * d + (e - i * d)];
    }
}

// grid (distinct tokens), block (<= 256): order[starts[b] .. starts[b+1]) are
// the positions of token uniq[b].
extern "C" __global__ void train_embed_backward_f32(const unsigned* __restrict__ order, const int* __restrict__ starts,
                                                    const unsigned* __restrict__ uniq, const float* __restrict__ dx,
                                                    float* __restrict__ de, int d) {
    const int b = blockIdx.x, lo = starts[b], hi = starts[b + 1];
    float* row = de + (long long)uniq[b] * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float s = 0.f;
        for (int p = lo; p < hi; ++p) s += dx[(long long)order[p] * d + j];
        row[j] += s;
    }
}

// Thread per (row, head, pair); x is [rows, heads * head_dim].
extern "C" __global__ void train_rope_f32(float* __restrict__ x, const float2* __restrict__ cs, long long rows, int heads,
                                          int head_dim, int half, int seq, int inverse) {
    const long long total = rows * heads * half;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        const int p = (int)(e % half);
        const long long rh = e / half;
        const long long r = rh / heads;
        const int h = (int)(rh % heads);
        const float2 c = cs[(long long)(r % seq) * half + p];
        const float sn = inverse ? -c.y : c.y;
        float* v = x + r * heads * head_dim + (long long)h * head_dim + 2 * p;
        const float a = v[0], b = v[1];
        v[0] = a * c.x - b * sn;
        v[1] = a * sn + b * c.x;
    }
}

__device__ __forceinline__ float sigmoidf(float g) { return 1.f / (1.f + expf(-g)); }

extern "C" __global__ void train_swiglu_f32(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ a,
                                            long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        a[i] = g[i] * sigmoidf(g[i]) * u[i];
}

// d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g).
extern "C" __global__ void train_swiglu_backward_f32(const float* __restrict__ da, const float* __restrict__ g,
                                                     const float* __restrict__ u, float* __restrict__ dg,
                                                     float* __restrict__ du, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float gv = g[i], s = sigmoidf(gv);
        dg[i] = da[i] * u[i] * s * (1.f + gv * (1.f - s));
        du[i] = da[i] * gv * s;
    }
}

__device__ __forceinline__ double block_reduce_sum_f64(double v) {
    __shared__ double scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// grid (rows), block (a multiple of 32, <= 1024). A target outside the
// vocabulary is refused on the host before launch.
extern "C" __global__ void train_cross_entropy_f32(const float* __restrict__ logits, const unsigned* __restrict__ targets,
                                                   float* __restrict__ dlogits, double* __restrict__ loss, int vocab,
                                                   float inv_n) {
    const long long r = blockIdx.x;
    const float* l = logits + r * vocab;
    float* dl = dlogits + r * vocab;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) m = fmax_nan(m, l[j]);
    m = block_reduce_max(m);
    double s = 0.0;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) s += (double)expf(l[j] - m);
    s = block_reduce_sum_f64(s);
    const double lse = (double)m + log(s);
    const int t = (int)targets[r];
    const float lsef = (float)lse;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) dl[j] = (expf(l[j] - lsef) - (j == t ? 1.f : 0.f)) * inv_n;
    if (threadIdx.x == 0) loss[r] = lse - (double)l[t];
}

extern "C" __global__ void train_add_f32(float* __restrict__ y, const float* __restrict__ x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) y[i] += x[i];
}

extern "C" __global__ void train_to_bf16_f32(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

extern "C" __global__ void train_from_bf16_f32(const __nv_bfloat16* __restrict__ x, float* __restrict__ y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}

// block (a multiple of 32); partial holds gridDim.x values.
extern "C" __global__ void train_sum_squares_f32(const float* __restrict__ x, long long n, double* __restrict__ partial) {
    double s = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        s += (double)x[i] * (double)x[i];
    s = block_reduce_sum_f64(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// decay[i] != 0: parameter i takes weight decay. step_size = lr / (1 - b1^t),
// bc2_sqrt = sqrt(1 - b2^t), both from the host in f64 as the CPU step has them.
extern "C" __global__ void train_adamw_f32(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                           float* __restrict__ v, const unsigned char* __restrict__ decay, long long n,
                                           float lr, float wd, float b1, float b2, float eps, float step_size,
                                           float bc2_sqrt, float clip) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float gi = g[i] * clip;
        float pi = p[i];
        if (decay[i]) pi *= 1.f - lr * wd;
        const float mi = b1 * m[i] + (1.f - b1) * gi;
        const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}
