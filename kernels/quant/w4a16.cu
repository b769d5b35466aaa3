// ---------------------------------------------------------------------------
// W4A16 GEMV / small-batch GEMM.
// W: N rows of K/2 bytes (int4, low nibble first: u32 word j of a 16 B chunk holds weights
// 8j..8j+7 in nibbles 0..7); scales (mins): N x K/group f16; X: B x K f16; Y: B x N f16.
// Needs K % 32 == 0 and group % 32 == 0 (a 32-weight chunk never straddles a group).
// Napkin math, N = K = 8192, B = 1: 32 MiB of codes + 1 MiB of scales must be read; at ~3 TB/s
// that is ~11 us, against ~45 us for cuBLAS reading the 128 MiB of f16 weights. Little's law: at
// ~3 TB/s and ~1 us of loaded latency, ~3 MB must be in flight, ~23 KB per SM; a block here has
// 128 x U x R x 4 B = 8 KB of codes outstanding (U = 4) and an SM holds several blocks.
// ---------------------------------------------------------------------------
#define W4_WARPS 4
#define W4_THREADS (32 * W4_WARPS)

// The 8 codes of a u32 word as floats minus `bias`: each code lands in the low byte of
// 0x4B000000 (2^23 + q as a float) through one byte permute; subtracting 2^23 + bias is exact.
// About 1.25 integer instructions and one FADD per weight, no int -> float conversion.
__device__ __forceinline__ void codes8(unsigned w, float bias, float* out) {
    const unsigned lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;  // nibbles 0,2,4,6 / 1,3,5,7
    const float sub = 8388608.f + bias;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        out[2 * s] = __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7440u + s)) - sub;
        out[2 * s + 1] = __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7440u + s)) - sub;
    }
}

// 8 f16 activations (16 B, read-only path: every block reads the same X, so it stays in L1/L2).
__device__ __forceinline__ void x8(const __half* __restrict__ p, float* out) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // element 2i is the low half of word i
        out[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xFFFFu)));
        out[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
    }
}

// A block of W4_THREADS threads owns R rows; the K axis is split across all its threads in u32
// code words (8 weights): thread t takes words t, t + W4_THREADS, ... of every row, U words per
// step with all U x R code loads (and their scales) issued before any arithmetic. A warp's load
// of one row is 128 contiguous bytes, and its X reads (16 B per lane, consecutive lanes on
// consecutive 16 B) are dense. Partial sums: warp shuffles, then 4 warps through shared memory.
// Symmetric: dot on q - 8 (exact small integers), scaled once per word. Asymmetric: W = q d + m,
// so a word contributes d (x . q) + m (sum x): the sum of x is shared by the R rows.
template <int B, int R, int U, bool ASYM>
__device__ __forceinline__ void w4a16(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                      const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {
    __shared__ float part[W4_WARPS][R * B];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * R;
    const int nw = k / 8, wpg = group / 8, gpr = k / group;  // words per row, words per group
    const unsigned* wrow[R];
    const __half* srow[R];
    const __half* mrow[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const long long row = min(row0 + r, n_rows - 1);  // clamped rows are computed, never stored
        wrow[r] = reinterpret_cast<const unsigned*>(wq + row * (k / 2));
        srow[r] = scales + row * gpr;
        mrow[r] = mins + row * gpr;
    }
    float acc[R][B];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) acc[r][b] = 0.f;

    // Word w = g wpg + rem (g: its group), advanced W4_THREADS words at a time without a division.
    const int gstep = W4_THREADS / wpg, rstep = W4_THREADS % wpg;
    int w = threadIdx.x, g = w / wpg, rem = w % wpg;
    while (w < nw) {
        unsigned q[U][R];
        __half d[U][R], m[U][R];
        int wu[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            wu[u] = w;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                q[u][r] = 0u;
                d[u][r] = __ushort_as_half((unsigned short)0);
                m[u][r] = d[u][r];
                if (w < nw) {
                    q[u][r] = __ldcs(wrow[r] + w);
                    d[u][r] = srow[r][g];
                    if (ASYM) m[u][r] = mrow[r][g];
                }
            }
            w += W4_THREADS;
            g += gstep;
            rem += rstep;
            if (rem >= wpg) {
                rem -= wpg;
                ++g;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (wu[u] >= nw) break;  // only the last step of a row can be partial
            float wf[R][8];
#pragma unroll
            for (int r = 0; r < R; ++r) codes8(q[u][r], ASYM ? 0.f : 8.f, wf[r]);
#pragma unroll
            for (int b = 0; b < B; ++b) {
                float xv[8];
                x8(x + (long long)b * k + 8 * wu[u], xv);
                float sx = 0.f;
                if (ASYM) {
#pragma unroll
                    for (int t = 0; t < 8; ++t) sx += xv[t];
                }
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float dot = 0.f;
#pragma unroll
                    for (int t = 0; t < 8; ++t) dot = fmaf(xv[t], wf[r][t], dot);
                    const float dd = __half2float(d[u][r]);
                    acc[r][b] = ASYM ? fmaf(dd, dot, fmaf(__half2float(m[u][r]), sx, acc[r][b])) : fmaf(dot, dd, acc[r][b]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) {
            const float v = warp_reduce_sum(acc[r][b]);
            if (lane == 0) part[warp][r * B + b] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < R * B; i += W4_THREADS) {
        const int r = i / B, b = i % B;
        if (row0 + r < n_rows) {
            float s = 0.f;
#pragma unroll
            for (int v = 0; v < W4_WARPS; ++v) s += part[v][i];
            y[(long long)b * n_rows + row0 + r] = __float2half_rn(s);
        }
    }
}

// R rows per block; U words per row in flight per thread (fewer where the accumulators grow).
// At B = 1, 5 blocks per SM (<= 102 registers, no spills): 40 KB of codes in flight per SM.
#define W4A16(B, R)                                                                                                         \
    extern "C" __global__ void __launch_bounds__(W4_THREADS, (B == 1 ? 5 : 1)) quant_w4a16_sym_b##B##_f16(                                   \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ x, __half* __restrict__ y, \
        int n_rows, int k, int group) {                                                                                     \
        w4a16<B, R, (B <= 4 ? 4 : 2), false>(wq, scales, scales, x, y, n_rows, k, group);                                   \
    }                                                                                                                       \
    extern "C" __global__ void __launch_bounds__(W4_THREADS, (B == 1 ? 5 : 1)) quant_w4a16_asym_b##B##_f16(                                  \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,                      \
        const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {                               \
        w4a16<B, R, (B <= 4 ? 4 : 2), true>(wq, scales, mins, x, y, n_rows, k, group);                                      \
    }

W4A16(1, 4)
W4A16(2, 4)
W4A16(4, 4)
W4A16(8, 4)
W4A16(16, 4)
