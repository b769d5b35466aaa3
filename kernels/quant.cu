// quant.cu: 4-bit weights (lab/src/quant). Every symbol ends in _f16, the family's activation
// and dequantized-output type; pack/unpack move raw 4-bit codes.
//   pack_int4_f16          codes (one per byte) -> two per byte, low nibble first: 2 x 16 B loads, 16 B store
//   unpack_int4_f16        the inverse: one 16 B load, 2 x 16 B stores
//   dequant_sym_f16        group-wise symmetric codes + f16 scales -> f16, (q - 8) d, 32 codes per 16 B load
//   dequant_asym_f16       group-wise asymmetric codes + f16 scales and mins -> f16, q d + m
//   dequant_q4_0_f16       GGUF Q4_0 blocks (18 B, 2-byte aligned) as stored in the file -> f16
//   dequant_q4_1_f16       GGUF Q4_1 blocks (20 B, 4-byte aligned) -> f16
//   w4a16_{sym,asym}_b{1,2,4,8,16}_f16
//                          Y[B, N] = X[B, K] W^T, W as group-wise int4 + f16 scales (mins), X and Y
//                          f16, fp32 accumulation. Bandwidth design: each warp owns R rows (R = 4 for
//                          B <= 4, else 2) for ILP, each lane streams 16 B of every row per step with
//                          the next step's loads in flight, X staged in shared memory (padded: no
//                          bank conflicts), warp-shuffle reduction at the end.
// Every grid-stride loop bounds its accesses by the element counts it is given; the vector paths
// need 16-byte aligned buffers (device allocations are 256-byte aligned) and the launchers check
// the divisibility each kernel states.
#include "common.cuh"

typedef unsigned char u8;

// Dequantized values are computed as the CPU computes them: f32 product, then f32 sum, each
// rounded (no contraction into an FMA), then rounded once to f16. CPU and GPU agree to the bit.
__device__ __forceinline__ float dq_sym(unsigned q, float d) { return __fmul_rn((float)((int)q - 8), d); }
__device__ __forceinline__ float dq_asym(unsigned q, float d, float m) { return __fadd_rn(__fmul_rn((float)q, d), m); }

// 4 codes (bytes of w, each <= 15) -> 16 bits, code i in nibble i.
__device__ __forceinline__ unsigned pack4(unsigned w) {
    return (w & 0xFu) | ((w >> 4) & 0xF0u) | ((w >> 8) & 0xF00u) | ((w >> 12) & 0xF000u);
}
// 4 nibbles (bits 0..15 of w) -> 4 bytes, nibble i in byte i.
__device__ __forceinline__ unsigned unpack4(unsigned w) {
    return (w & 0xFu) | ((w << 4) & 0xF00u) | ((w << 8) & 0xF0000u) | ((w << 12) & 0xF000000u);
}

extern "C" __global__ void quant_pack_int4_f16(const u8* __restrict__ codes, u8* __restrict__ packed, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n32 = n / 32;
    const uint4* src = reinterpret_cast<const uint4*>(codes);
    uint4* dst = reinterpret_cast<uint4*>(packed);
    for (long long i = tid; i < n32; i += stride) {
        const uint4 a = __ldcs(src + 2 * i);
        const uint4 b = __ldcs(src + 2 * i + 1);
        uint4 o;
        o.x = pack4(a.x) | (pack4(a.y) << 16);
        o.y = pack4(a.z) | (pack4(a.w) << 16);
        o.z = pack4(b.x) | (pack4(b.y) << 16);
        o.w = pack4(b.z) | (pack4(b.w) << 16);
        __stcs(dst + i, o);
    }
    // Tail: the last n % 32 codes, one output byte per thread (an odd count leaves a zero high nibble).
    const long long bytes = (n + 1) / 2;
    for (long long j = 16 * n32 + tid; j < bytes; j += stride) {
        const unsigned lo = codes[2 * j] & 0xFu;
        const unsigned hi = 2 * j + 1 < n ? (codes[2 * j + 1] & 0xFu) : 0u;
        packed[j] = (u8)(lo | (hi << 4));
    }
}

extern "C" __global__ void quant_unpack_int4_f16(const u8* __restrict__ packed, u8* __restrict__ codes, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n32 = n / 32;
    const uint4* src = reinterpret_cast<const uint4*>(packed);
    uint4* dst = reinterpret_cast<uint4*>(codes);
    for (long long i = tid; i < n32; i += stride) {
        const uint4 p = __ldcs(src + i);
        uint4 a, b;
        a.x = unpack4(p.x); a.y = unpack4(p.x >> 16);
        a.z = unpack4(p.y); a.w = unpack4(p.y >> 16);
        b.x = unpack4(p.z); b.y = unpack4(p.z >> 16);
        b.z = unpack4(p.w); b.w = unpack4(p.w >> 16);
        __stcs(dst + 2 * i, a);
        __stcs(dst + 2 * i + 1, b);
    }
    for (long long e = 32 * n32 + tid; e < n; e += stride) {
        const unsigned byte = packed[e / 2];
        codes[e] = (u8)((e & 1) ? (byte >> 4) : (byte & 0xFu));
    }
}

// 8 f16 values -> one 16 B store.
__device__ __forceinline__ void store8(__half* p, const float* v) { store_vec16<__half>(p, v); }

// Group-wise formats: n values (n % 32 == 0), group % 32 == 0, so the 32 codes of one 16 B load
// share one scale (and min).
template <bool ASYM>
__device__ __forceinline__ void dequant_group(const u8* __restrict__ packed, const __half* __restrict__ scales,
                                              const __half* __restrict__ mins, __half* __restrict__ out, long long n, int group) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long n32 = n / 32;
    const uint4* src = reinterpret_cast<const uint4*>(packed);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n32; i += stride) {
        const uint4 p = __ldcs(src + i);
        const long long g = (32 * i) / group;
        const float d = __half2float(scales[g]);
        const float m = ASYM ? __half2float(mins[g]) : 0.f;
        const unsigned w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float v[8];
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                const unsigned q = (w[j] >> (4 * t)) & 0xFu;
                v[t] = ASYM ? dq_asym(q, d, m) : dq_sym(q, d);
            }
            store8(out + 32 * i + 8 * j, v);
        }
    }
}

extern "C" __global__ void quant_dequant_sym_f16(const u8* __restrict__ packed, const __half* __restrict__ scales,
                                                 __half* __restrict__ out, long long n, int group) {
    dequant_group<false>(packed, scales, scales, out, n, group);
}

extern "C" __global__ void quant_dequant_asym_f16(const u8* __restrict__ packed, const __half* __restrict__ scales,
                                                  const __half* __restrict__ mins, __half* __restrict__ out, long long n, int group) {
    dequant_group<true>(packed, scales, mins, out, n, group);
}

// GGUF blocks: qs[j] holds element j (low nibble) and element j + 16 (high nibble).
// One block per thread per step; its 32 outputs are 64 contiguous bytes (4 x 16 B stores).
template <int BYTES>
__device__ __forceinline__ void dequant_ggml(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nblocks; i += stride) {
        const u8* b = blocks + BYTES * i;
        unsigned qs[4];
        float d, m = 0.f;
        if (BYTES == 20) {  // Q4_1: 4-byte aligned, five 32-bit loads
            const unsigned* w = reinterpret_cast<const unsigned*>(b);
            const unsigned dm = __ldcs(w);
            d = __half2float(__ushort_as_half((unsigned short)(dm & 0xFFFFu)));
            m = __half2float(__ushort_as_half((unsigned short)(dm >> 16)));
#pragma unroll
            for (int j = 0; j < 4; ++j) qs[j] = __ldcs(w + 1 + j);
        } else {  // Q4_0: 2-byte aligned, nine 16-bit loads
            const unsigned short* h = reinterpret_cast<const unsigned short*>(b);
            d = __half2float(__ushort_as_half(__ldcs(h)));
#pragma unroll
            for (int j = 0; j < 4; ++j) qs[j] = (unsigned)__ldcs(h + 1 + 2 * j) | ((unsigned)__ldcs(h + 2 + 2 * j) << 16);
        }
        float lo[16], hi[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const unsigned byte = (qs[j / 4] >> (8 * (j % 4))) & 0xFFu;
            lo[j] = BYTES == 20 ? dq_asym(byte & 0xFu, d, m) : dq_sym(byte & 0xFu, d);
            hi[j] = BYTES == 20 ? dq_asym(byte >> 4, d, m) : dq_sym(byte >> 4, d);
        }
        __half* o = out + 32 * i;
        store8(o, lo);
        store8(o + 8, lo + 8);
        store8(o + 16, hi);
        store8(o + 24, hi + 8);
    }
}

extern "C" __global__ void quant_dequant_q4_0_f16(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    dequant_ggml<18>(blocks, out, nblocks);
}

extern "C" __global__ void quant_dequant_q4_1_f16(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    dequant_ggml<20>(blocks, out, nblocks);
}

// ---------------------------------------------------------------------------
// W4A16 GEMV / small-batch GEMM.
// W: N rows of K/2 bytes (int4, low nibble first: u32 word j of a 16 B chunk holds weights
// 8j..8j+7 in nibbles 0..7); scales (mins): N x K/group f16; X: B x K f16; Y: B x N f16.
// Needs K % 32 == 0 and group % 32 == 0 (a 32-weight chunk never straddles a group).
// Napkin math, N = K = 8192, B = 1: 32 MiB of codes + 1 MiB of scales must be read; at ~3 TB/s
// that is ~11 us, against ~45 us for cuBLAS reading the 128 MiB of f16 weights.
// ---------------------------------------------------------------------------
#define W4_WARPS 4
#define W4_THREADS (32 * W4_WARPS)
// X is staged in tiles of W4_TILE / B columns for all B rows: 16384 halves, padded by 8 per
// 32 (a lane's 64 B chunk then starts 80 B after its neighbour's: the 16 B reads of 8 lanes
// fall in distinct banks) = 40 KiB of static shared memory.
#define W4_TILE 16384
#define W4_PAD_CHUNK 40

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

template <int B, int R, bool ASYM>
__device__ __forceinline__ void w4a16(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                      const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {
    __shared__ __align__(16) __half xs[W4_TILE / 32 * W4_PAD_CHUNK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * W4_WARPS + warp) * R;
    const int kt = min(k, W4_TILE / B);  // tile width: a multiple of 32 (k is)
    const int gpr = k / group;
    const long long row_bytes = k / 2;
    float acc[R][B];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) acc[r][b] = 0.f;

    for (int k0 = 0; k0 < k; k0 += kt) {
        const int width = min(kt, k - k0);
        const int chunks = width / 32;
        // This tile's first weights are requested before X is staged: the barrier then waits
        // behind HBM traffic that is already in flight.
        // Scales (and mins) travel with their codes, so no load waits inside the loop.
        uint4 cur[R];
        __half dcur[R], mcur[R];
        auto load = [&](int c, uint4* dst, __half* ds, __half* ms) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int row = min(row0 + r, n_rows - 1);  // clamped rows are computed, never stored
                dst[r] = __ldcs(reinterpret_cast<const uint4*>(wq + row * row_bytes + (k0 + 32 * c) / 2));
                const long long si = (long long)row * gpr + (k0 + 32 * c) / group;
                ds[r] = scales[si];
                ms[r] = ASYM ? mins[si] : ds[r];
            }
        };
        if (row0 < n_rows && lane < chunks) load(lane, cur, dcur, mcur);
        __syncthreads();  // the previous tile is no longer read
        for (int v = threadIdx.x; v < B * chunks * 4; v += W4_THREADS) {
            const int b = v / (chunks * 4), rest = v % (chunks * 4);
            const uint4 val = *reinterpret_cast<const uint4*>(x + (long long)b * k + k0 + 8 * rest);
            *reinterpret_cast<uint4*>(xs + (b * chunks + rest / 4) * W4_PAD_CHUNK + 8 * (rest % 4)) = val;
        }
        __syncthreads();
        if (row0 >= n_rows) continue;  // whole warp idle (it still joins every barrier)
        for (int c = lane; c < chunks; c += 32) {
            uint4 nxt[R];
            __half dnxt[R], mnxt[R];
            if (c + 32 < chunks) load(c + 32, nxt, dnxt, mnxt);  // next step's bytes in flight during this one
            float d[R], m[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                d[r] = __half2float(dcur[r]);
                m[r] = ASYM ? __half2float(mcur[r]) : 0.f;
            }
            // Symmetric: dot products on q - 8 (exact small integers), scaled once per chunk.
            // Asymmetric: weights q d + m made first (one FMA each), then the products.
            float dot[R][B];
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int b = 0; b < B; ++b) dot[r][b] = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float w[R][8];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const unsigned word = j == 0 ? cur[r].x : j == 1 ? cur[r].y : j == 2 ? cur[r].z : cur[r].w;
                    codes8(word, ASYM ? 0.f : 8.f, w[r]);
                    if (ASYM) {
#pragma unroll
                        for (int t = 0; t < 8; ++t) w[r][t] = fmaf(w[r][t], d[r], m[r]);
                    }
                }
#pragma unroll
                for (int b = 0; b < B; ++b) {
                    float xv[8];
                    load_vec16<__half>(xs + (b * chunks + c) * W4_PAD_CHUNK + 8 * j, xv);
#pragma unroll
                    for (int r = 0; r < R; ++r)
#pragma unroll
                        for (int t = 0; t < 8; ++t) dot[r][b] = fmaf(xv[t], w[r][t], dot[r][b]);
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int b = 0; b < B; ++b) acc[r][b] = ASYM ? acc[r][b] + dot[r][b] : fmaf(dot[r][b], d[r], acc[r][b]);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                cur[r] = nxt[r];
                dcur[r] = dnxt[r];
                mcur[r] = mnxt[r];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int b = 0; b < B; ++b) acc[r][b] = warp_reduce_sum(acc[r][b]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (row0 + r < n_rows)
#pragma unroll
                for (int b = 0; b < B; ++b) y[(long long)b * n_rows + row0 + r] = __float2half_rn(acc[r][b]);
    }
}

#define W4A16(B, R)                                                                                                         \
    extern "C" __global__ void __launch_bounds__(W4_THREADS) quant_w4a16_sym_b##B##_f16(                                   \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ x, __half* __restrict__ y, \
        int n_rows, int k, int group) {                                                                                     \
        w4a16<B, R, false>(wq, scales, scales, x, y, n_rows, k, group);                                                     \
    }                                                                                                                       \
    extern "C" __global__ void __launch_bounds__(W4_THREADS) quant_w4a16_asym_b##B##_f16(                                  \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,                      \
        const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {                               \
        w4a16<B, R, true>(wq, scales, mins, x, y, n_rows, k, group);                                                        \
    }

W4A16(1, 4)
W4A16(2, 4)
W4A16(4, 4)
W4A16(8, 2)
W4A16(16, 2)
