// quant.cu: 4-bit weights (lab/src/quant). Every symbol ends in _f16, the family's activation
// and dequantized-output type; pack/unpack move raw 4-bit codes.
//   pack_int4_f16          codes (one per byte) -> two per byte, low nibble first: 2 x 16 B loads, 16 B store
//   unpack_int4_f16        the inverse, staged per warp (below): coalesced 16 B loads and stores
//   dequant_sym_f16        group-wise symmetric codes + f16 scales -> f16, (q - 8) d, staged per warp
//   dequant_asym_f16       group-wise asymmetric codes + f16 scales and mins -> f16, q d + m, staged
//   dequant_q4_0_f16       GGUF Q4_0 blocks (18 B) as stored in the file -> f16, staged per warp
//   dequant_q4_1_f16       GGUF Q4_1 blocks (20 B) -> f16, staged per warp
// "Staged per warp": a warp reads 32 x 16 B of input with coalesced loads into shared memory,
// then each lane turns the slice that maps to ITS 16 B of output into values, so the 2-4x wider
// output is also written with consecutive lanes on consecutive 16 B (without staging, each lane
// would write 32-64 contiguous bytes and every store instruction would touch half-sectors).
//   w4a16_{sym,asym}_b{1,2,4,8,16}_f16
//                          Y[B, N] = X[B, K] W^T, W as group-wise int4 + f16 scales (mins), X and Y
//                          f16, fp32 accumulation. Bandwidth design: a block owns R = 4 rows and
//                          splits K across all its threads in 4 B code words, every thread issuing
//                          its U x R word loads (and scales) before any arithmetic; no shared-memory
//                          prologue (X is read through the read-only path, shared by every block
//                          from L1/L2), a grid of N / 4 short blocks (several waves, so one block's
//                          reduction overlaps the others' streaming), warp shuffles + one barrier
//                          at the end. At B >= 8 the same layout is compute-bound: each dequantized
//                          word serves B activations and each X load serves R rows.
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

// Staged kernels: blocks of 8 warps, each warp owning 32 x 16 B input segments, grid-stride.
#define SEG_WARPS 8

extern "C" __global__ void __launch_bounds__(32 * SEG_WARPS) quant_unpack_int4_f16(const u8* __restrict__ packed, u8* __restrict__ codes, long long n) {
    __shared__ uint4 stage[SEG_WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long n32 = n / 32;  // whole 16 B chunks of packed codes
    const long long nseg = (n32 + 31) / 32;
    const uint4* src = reinterpret_cast<const uint4*>(packed);
    uint4* dst = reinterpret_cast<uint4*>(codes);
    for (long long seg = (long long)blockIdx.x * SEG_WARPS + warp; seg < nseg; seg += (long long)gridDim.x * SEG_WARPS) {
        if (seg * 32 + lane < n32) stage[warp][lane] = __ldcs(src + seg * 32 + lane);
        __syncwarp();
        // Output chunk o (16 codes, 16 B) comes from packed bytes 8o .. 8o + 7.
        const uint2* st = reinterpret_cast<const uint2*>(stage[warp]);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const long long o = seg * 64 + 32 * j + lane;
            if (o < 2 * n32) {
                const uint2 p = st[32 * j + lane];
                uint4 a;
                a.x = unpack4(p.x); a.y = unpack4(p.x >> 16);
                a.z = unpack4(p.y); a.w = unpack4(p.y >> 16);
                __stcs(dst + o, a);
            }
        }
        __syncwarp();  // the stage is rewritten next step
    }
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long e = 32 * n32 + tid; e < n; e += (long long)gridDim.x * blockDim.x) {
        const unsigned byte = packed[e / 2];
        codes[e] = (u8)((e & 1) ? (byte >> 4) : (byte & 0xFu));
    }
}

// 8 f16 values -> one 16 B store.
__device__ __forceinline__ void store8(__half* p, const float* v) { store_vec16<__half>(p, v); }

// Group-wise formats: n values (n % 32 == 0), group % 32 == 0, so the 8 codes of one u32 word
// share one scale (and min). Word w of the codes becomes output values 8w .. 8w + 7 (16 B).
template <bool ASYM>
__device__ __forceinline__ void dequant_group(const u8* __restrict__ packed, const __half* __restrict__ scales,
                                              const __half* __restrict__ mins, __half* __restrict__ out, long long n, int group) {
    __shared__ uint4 stage[SEG_WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long n32 = n / 32;
    const long long nseg = (n32 + 31) / 32;
    const uint4* src = reinterpret_cast<const uint4*>(packed);
    for (long long seg = (long long)blockIdx.x * SEG_WARPS + warp; seg < nseg; seg += (long long)gridDim.x * SEG_WARPS) {
        if (seg * 32 + lane < n32) stage[warp][lane] = __ldcs(src + seg * 32 + lane);
        __syncwarp();
        const unsigned* words = reinterpret_cast<const unsigned*>(stage[warp]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const long long w = seg * 128 + 32 * j + lane;
            if (w < 4 * n32) {
                const unsigned word = words[32 * j + lane];
                const long long g = 8 * w / group;
                const float d = __half2float(scales[g]);
                const float m = ASYM ? __half2float(mins[g]) : 0.f;
                float v[8];
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    const unsigned q = (word >> (4 * t)) & 0xFu;
                    v[t] = ASYM ? dq_asym(q, d, m) : dq_sym(q, d);
                }
                store8(out + 8 * w, v);
            }
        }
        __syncwarp();
    }
}

extern "C" __global__ void __launch_bounds__(32 * SEG_WARPS) quant_dequant_sym_f16(const u8* __restrict__ packed, const __half* __restrict__ scales,
                                                 __half* __restrict__ out, long long n, int group) {
    dequant_group<false>(packed, scales, scales, out, n, group);
}

extern "C" __global__ void __launch_bounds__(32 * SEG_WARPS) quant_dequant_asym_f16(const u8* __restrict__ packed, const __half* __restrict__ scales,
                                                  const __half* __restrict__ mins, __half* __restrict__ out, long long n, int group) {
    dequant_group<true>(packed, scales, mins, out, n, group);
}

// GGUF blocks: qs[j] holds element j (low nibble) and element j + 16 (high nibble).
// A warp stages 32 blocks (576 or 640 B: whole 16 B vectors, 16 B aligned) and lane l then writes
// the 16 B holding elements 8p .. 8p + 7 of block 8j + l / 4, p = l % 4: low nibbles of
// qs[0..7] (p = 0) or qs[8..15] (p = 1), high nibbles of the same (p = 2, 3).
template <int BYTES>
__device__ __forceinline__ void dequant_ggml(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    __shared__ uint4 stage[SEG_WARPS][2 * BYTES];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long nseg = (nblocks + 31) / 32;
    const long long total = nblocks * BYTES;
    for (long long seg = (long long)blockIdx.x * SEG_WARPS + warp; seg < nseg; seg += (long long)gridDim.x * SEG_WARPS) {
        const long long base = seg * 32 * BYTES;
        for (int u = lane; u < 2 * BYTES; u += 32) {
            const long long off = base + 16 * u;
            if (off + 16 <= total) {
                stage[warp][u] = __ldcs(reinterpret_cast<const uint4*>(blocks + off));
            } else if (off < total) {  // the last, partial vector: byte by byte, never past the end
                u8* sb = reinterpret_cast<u8*>(&stage[warp][u]);
                for (int b = 0; b < 16; ++b) sb[b] = off + b < total ? blocks[off + b] : 0;
            }
        }
        __syncwarp();
        const u8* sb = reinterpret_cast<const u8*>(stage[warp]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int local = 8 * j + lane / 4, part = lane % 4;
            const long long blk = seg * 32 + local;
            if (blk < nblocks) {
                const u8* b = sb + local * BYTES;
                const float d = __half2float(__ushort_as_half((unsigned short)(b[0] | (b[1] << 8))));
                const float m = BYTES == 20 ? __half2float(__ushort_as_half((unsigned short)(b[2] | (b[3] << 8)))) : 0.f;
                const u8* qs = b + (BYTES == 20 ? 4 : 2) + 8 * (part & 1);
                float v[8];
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    const unsigned q = part >= 2 ? (qs[t] >> 4) : (qs[t] & 0xFu);
                    v[t] = BYTES == 20 ? dq_asym(q, d, m) : dq_sym(q, d);
                }
                store8(out + 32 * blk + 8 * part, v);
            }
        }
        __syncwarp();
    }
}

extern "C" __global__ void __launch_bounds__(32 * SEG_WARPS) quant_dequant_q4_0_f16(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    dequant_ggml<18>(blocks, out, nblocks);
}

extern "C" __global__ void __launch_bounds__(32 * SEG_WARPS) quant_dequant_q4_1_f16(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    dequant_ggml<20>(blocks, out, nblocks);
}

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
