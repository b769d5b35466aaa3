// quant.cu: 4-bit weights (lab/src/quant). Every symbol ends in _f16, the family's activation
// and dequantized-output type; pack/unpack move raw 4-bit codes.
//   pack_int4_f16          codes (one per byte) -> two per byte, low nibble first: 2 x 16 B loads, 16 B store
//   unpack_int4_f16        the inverse, staged per warp (below): coalesced 16 B loads and stores
//   dequant_sym_f16        group-wise symmetric codes + f16 scales -> f16, (q - 8) d, staged per warp
//   dequant_asym_f16       group-wise asymmetric codes + f16 scales and mins -> f16, q d + m, staged
//   dequant_q4_0_f16       GGUF Q4_0 blocks (18 B) as stored in the file -> f16, staged per warp
//   dequant_q4_1_f16       GGUF Q4_1 blocks (20 B) -> f16, staged per warp
//   dequant_q4_{0,1}_cp_async_f16
//                          the same, 64 blocks per warp step staged with cp.async, every copy in
//                          flight at once (the loop above waits for a lane's first load before
//                          issuing its second), and only 16 B stores
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
//   w4a16_mma_{sym,asym}_b{1,2,4,8,16}_f16
//                          the same product on tensor cores, built for bytes in flight: a block of
//                          4 warps owns 16 rows (one mma.sync M tile), each warp a quarter of K;
//                          every lane issues 4 steps x 2 x 16 B streaming code loads before decoding
//                          any (4 KB per warp), codes decoded to f16 in registers, one wave of N / 16
//                          blocks at 4 per SM, one shared-memory step across the warps (below).
//   w4a16_mma_splitk_{sym,asym}_b{1,2,4,8,16}_f16
//                          the same warp step with K split over blocks as well (grid N / 16 x S),
//                          each warp owning at most the steps it keeps in flight: one load round
//                          per warp; fp32 partials per slice in a workspace, summed in slice order
//                          by the tile's last block (a per-tile counter, reset by that block).
//   w4a16_mma_pipelined_{sym,asym}_b{1,2,4,8,16}_f16
//                          the same warp step decoding from shared memory: a persistent grid of
//                          8-warp blocks (2 per SM) streams its 16-row tiles through an 8-stage
//                          ring of 8 KB stages (codes + scale windows) with cp.async.cg, 7 stages
//                          in flight per block while the warps decode the oldest.
//   w4a16_mma_occ8_*       w4a16_mma with K over 8 warps, 2 steps in flight, 64 registers.
//   w4a16_mma_tiled_*      occ8 reading W in the tile layout (lab/src/quant/tiles.rs): every warp
//                          load is 512 contiguous bytes, scales in (row r, row r + 8) pairs.
//   w4a16_mma_tiled_{rolling,async,prefetch,post}_*
//                          tiled with one change each: loads refilled as each step is decoded; a
//                          per-warp cp.async ring in shared memory; the next round prefetched into
//                          L2; the scales applied after the MMAs (sym, group % 128 == 0).
//   w4a16_mma_tiled_sweep_* tiled_post with the block's warps taking its tile's steps in turn, on
//                          the step-major tile layout: the grid reads W from end to end in order.
//   w4a16_mma_tiled_sweep4_* tiled_sweep on 4 warps per block at 128 registers, 3-4 steps per
//                          warp rolling.
//   w4a16_mma_tiled_bulk_* tiled_sweep with each warp's steps copied by TMA (one 1 KB bulk copy
//                          per step) into a per-warp 4-slot ring in shared memory (sm_90).
//   stream_read_f16        the floor: reads a W4A16 kernel's bytes once and decodes nothing.
//   stream_read_x{4,8}_f16 the floor with 4 or 8 loads in flight per thread.
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
// 8 f16 values -> one 16 B store that NVVM cannot split: through store8, the first of the
// decode's stores compiles to 4 x st.global.u32 (the other three stay v4).
__device__ __forceinline__ void store8_v4(__half* p, const float* v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(pack_f16x2(v[0], v[1])), "r"(pack_f16x2(v[2], v[3])),
                 "r"(pack_f16x2(v[4], v[5])), "r"(pack_f16x2(v[6], v[7])));
}

// The decode of 32 SEGS staged blocks starting at block 32 SEGS seg (j = 0 .. 4 SEGS - 1).
template <int BYTES, int SEGS, bool V4>
__device__ __forceinline__ void ggml_decode(const u8* sb, __half* __restrict__ out, long long seg, long long nblocks, int lane) {
#pragma unroll
    for (int j = 0; j < 4 * SEGS; ++j) {
        const int local = 8 * j + lane / 4, part = lane % 4;
        const long long blk = seg * 32 * SEGS + local;
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
            if (V4) {
                store8_v4(out + 32 * blk + 8 * part, v);
            } else {
                store8(out + 32 * blk + 8 * part, v);
            }
        }
    }
}

// The last, partial 16 B vector of the input: byte by byte, never past the end.
__device__ __forceinline__ void stage_tail(uint4* dst, const u8* __restrict__ blocks, long long off, long long total) {
    u8* sb = reinterpret_cast<u8*>(dst);
    for (int b = 0; b < 16; ++b) sb[b] = off + b < total ? blocks[off + b] : 0;
}

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
            } else if (off < total) {
                stage_tail(&stage[warp][u], blocks, off, total);
            }
        }
        __syncwarp();
        ggml_decode<BYTES, 1, false>(reinterpret_cast<const u8*>(stage[warp]), out, seg, nblocks, lane);
        __syncwarp();
    }
}

// dequant_q4_{0,1}_cp_async: the loop above issues a lane's second 16 B load (36 or 40 vectors
// per 32 blocks: only lanes 0-3 or 0-7 have one) after its first has landed in shared memory, so
// a warp waits two round trips per 576-640 B. Here a warp step is 64 blocks and every lane
// issues all 3 of its copies (1152-1280 B per warp) global -> shared with cp.async, which holds
// no registers: one round trip for twice the bytes. A partial last vector is copied short and
// zero-filled (cp.async's src-size), never read past the end. (Loading the 3 vectors into
// registers first does not work: at 32 registers ptxas stages the first before issuing the third.)
// And every output store is one 16 B vector (store8_v4), where the loop above writes a quarter
// of its output in 4-byte stores. ptxas -v, sm_90: 32 registers (8 blocks of 256 per SM, as the
// 32-block loop), 9216 / 10240 B of static smem (Q4_0 / Q4_1), no spills.
#define GGML_SEGS 2
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}

template <int BYTES>
__device__ __forceinline__ void dequant_ggml_cp_async(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    constexpr int NVEC = 2 * BYTES * GGML_SEGS, NV = (NVEC + 31) / 32;  // 16 B vectors per warp step, per lane
    __shared__ uint4 stage[SEG_WARPS][NVEC];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long nseg = (nblocks + 32 * GGML_SEGS - 1) / (32 * GGML_SEGS);
    const long long total = nblocks * BYTES;
    for (long long seg = (long long)blockIdx.x * SEG_WARPS + warp; seg < nseg; seg += (long long)gridDim.x * SEG_WARPS) {
        const long long base = seg * 32 * GGML_SEGS * BYTES;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int u = lane + 32 * i;
            const long long off = base + 16 * u;
            if (u < NVEC && off < total) cp_async16(&stage[warp][u], blocks + off, (int)min(16LL, total - off));
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncwarp();
        ggml_decode<BYTES, GGML_SEGS, true>(reinterpret_cast<const u8*>(stage[warp]), out, seg, nblocks, lane);
        __syncwarp();
    }
}

extern "C" __global__ void __launch_bounds__(32 * SEG_WARPS) quant_dequant_q4_0_f16(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    dequant_ggml<18>(blocks, out, nblocks);
}

extern "C" __global__ void __launch_bounds__(32 * SEG_WARPS) quant_dequant_q4_1_f16(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    dequant_ggml<20>(blocks, out, nblocks);
}

extern "C" __global__ void __launch_bounds__(32 * SEG_WARPS) quant_dequant_q4_0_cp_async_f16(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    dequant_ggml_cp_async<18>(blocks, out, nblocks);
}

extern "C" __global__ void __launch_bounds__(32 * SEG_WARPS) quant_dequant_q4_1_cp_async_f16(const u8* __restrict__ blocks, __half* __restrict__ out, long long nblocks) {
    dequant_ggml_cp_async<20>(blocks, out, nblocks);
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

// ---------------------------------------------------------------------------
// W4A16 on tensor cores, built for bytes in flight: w4a16_mma_{sym,asym}_b{B}_f16.
// Napkin math (H100 SXM, N = K = 8192, B = 1): 32 MiB of codes + 1 MiB of scales + 16 KiB of X
// = 34.6 MB: 11.5 us at the measured 3.02 TB/s copy ceiling; the bar (80%) is 14.3 us. Little's
// law: ~3 TB/s x ~0.7 us of unloaded latency = ~2 MB in flight GPU-wide, ~16 KB per SM.
// The CUDA-core rung had that on paper (5 blocks x 8 KB per SM) but in 4-byte loads, 2 load
// rounds per block and 3.1 waves of short blocks, and its inner loop costs ~4 instructions per
// weight per lane: ~8 us of issue at B = 1, compute-bound from B = 4 (measured).
// Here a block is one tile of 16 rows, 4 warps; warp w takes a contiguous quarter of K. A step
// is 128 weights of every row: lane (g = lane / 4, c = lane % 4) loads 16 B of codes of row g
// and of row g + 8 at chunk 4t + c (each row's 4 lanes read 64 contiguous bytes), and issues
// U = 4 steps of codes and scales before decoding any: 128 B per lane, 4 KB per warp (8.4 MB,
// a quarter of W, requested by the first round of the grid), ~62 KB per SM at 15.5 warps: ~4x
// Little's ask. __launch_bounds__(128, 4): 4 blocks per SM, so N / 16 = 512 blocks fill
// 132 x 4 = 528 slots in one wave (no tail of a second wave). Codes are read once:
// ld.global.nc.L1::no_allocate keeps them from evicting X, which every tile reads through L1.
// The dot products run on mma.sync m16n8k16 (fp32 accumulation); the weights enter it as f16
// rounded once from (q - 8) d or q d + m, the values cuBLAS reads. SASS per step (sm_90,
// B = 1, sym): 32 LOP3 + 64 HFMA2 decode 8 code words (LOP3 into f16 1024 + q, an FMA to
// q - bias exactly, an FMA to (q - bias) d + m), 16 PRMT pair X, 8 HMMA, 4 LDG of X; ~200
// instructions with the load round: ~6.4 us of issue per SM at 1.98 GHz, half the budget and
// overlapped with the stream; B = 16 (two MMAs per step, 3 steps in flight): ~10.6 us.
// Fragments (PTX m16n8k16): A a0a1 (row g, k 2c..2c+1), a2a3 (row g + 8), a4a5 / a6a7 (the same
// rows, k 2c + 8..2c + 9); B b0b1 (k 2c..2c+1, col g), b2b3 (k 2c + 8..); C c0c1 (row g, cols
// 2c..2c+1), c2c3 (row g + 8). The K order inside an MMA is free as long as A and B agree:
// lane class c feeds k 2c.. from its own 32-weight chunk, and code word i, half h of that chunk
// gives the pairs (q[8i + 2h], q[8i + 2h + 4]) as a0a1 and (q[8i + 2h + 1], q[8i + 2h + 5]) as
// a4a5, which one mask each picks out of the word shifted right by 8h; X is paired the same way
// by two byte permutes. Batch b is MMA column b (B = 16: two MMAs per step, columns 0..7 and
// 8..15); lanes whose column is past B, or whose chunk is past K, feed zeros.
// lab/src/quant/w4a16_mma_model.rs mirrors this kernel step by step on the CPU for the tests.
// ptxas -v, sm_90 (CUDA 13.0; registers / static smem, no spills in any):
//   sym  b1 b2 b4 b8 115 / 256-2048 B   b16 105 / 4 KiB
//   asym b1 b2 b4 123, b8 127 / 256-2048 B   b16 116 / 4 KiB     (sm_80: no spills either; b1-b4 were
//   127 before the load step became the `issue` lambda shared with the tiled rungs)
// ---------------------------------------------------------------------------
#define MMA_WARPS 4
#define MMA_ROWS 16

// 16 B of codes, read once: not kept in L1.
__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned fma_f16x2(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ void mma_f16_16816(float* acc, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two codes of word w as f16x2 (low half first): HI = false takes nibbles 0 and 4 into f16
// 1024 + q, HI = true nibbles 1 and 5 into 1024 + 16q: (w & mask) | 0x64006400 in one LOP3
// (written plainly, it compiles to two).
template <bool HI>
__device__ __forceinline__ unsigned codes_f16x2(unsigned w) {
    unsigned v;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(w), "n"(HI ? 0x00F000F0u : 0x000F000Fu), "n"(0x64006400u));
    return v;
}

// Two weights of code word w as f16x2: codes_f16x2, then one FMA makes q - bias exactly
// (x 1 - (1024 + bias), x 1/16 - (64 + bias)), one more (q - bias) d + m, rounded once.
// f16 constants: 0x3C00 = 1, 0x2C00 = 1/16, 0xE408 = -1032, 0xE400 = -1024, 0xD480 = -72, 0xD400 = -64.
template <bool HI, bool ASYM>
__device__ __forceinline__ unsigned w2_f16x2(unsigned w, unsigned d2, unsigned m2) {
    const unsigned v = codes_f16x2<HI>(w);
    const unsigned mul = HI ? 0x2C002C00u : 0x3C003C00u;
    const unsigned off = HI ? (ASYM ? 0xD400D400u : 0xD480D480u) : (ASYM ? 0xE400E400u : 0xE408E408u);
    return fma_f16x2(fma_f16x2(v, mul, off), d2, m2);
}

__device__ __forceinline__ unsigned word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// An f16 scale (or min) as f16x2 (d, d); 0 for a chunk past K (its weights become 0).
__device__ __forceinline__ unsigned splat_f16(const __half* p, bool ok) {
    const unsigned s = ok ? (unsigned)__ldg(reinterpret_cast<const unsigned short*>(p)) : 0u;
    return s | (s << 16);
}

// Steps in flight per warp: 4 (128 B of codes per lane); at B = 16, whose X and second MMA
// take ~20 more registers, 3 (with 4 it spills 4-8 bytes at the 128-register cap).
template <int B>
struct MmaSteps {
    static constexpr int U = B > 8 ? 3 : 4;
};

// Accumulator shape of a warp's 16-row tile: MMAs per step (batch columns 0..7, and 8..15 at
// B = 16) and chains. At B <= 8 two chains (halves h = 0, 1) so that back-to-back MMAs do not
// wait on each other; at B = 16 the two column blocks are already two chains.
template <int B>
struct MmaAcc {
    static constexpr int NH = B > 8 ? 2 : 1;
    static constexpr int CH = NH == 1 ? 2 : 1;
    float v[NH][CH][4];
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int nh = 0; nh < NH; ++nh)
#pragma unroll
            for (int h = 0; h < CH; ++h)
#pragma unroll
                for (int i = 0; i < 4; ++i) v[nh][h][i] = 0.f;
    }
};

// X of this lane's MMA column(s) b = g + 8 nh over chunk j's 32 weights (zeros past B or K).
template <int B>
__device__ __forceinline__ void load_x_chunk(uint4 (&xv)[MmaAcc<B>::NH][4], const __half* __restrict__ x, int k, int j, int nchunks, int g) {
#pragma unroll
    for (int nh = 0; nh < MmaAcc<B>::NH; ++nh) {
        const int b = g + 8 * nh;
        const bool ok = b < B && j < nchunks;
        const uint4* xp = reinterpret_cast<const uint4*>(x + (long long)b * k + 32 * j);
#pragma unroll
        for (int v = 0; v < 4; ++v) xv[nh][v] = ok ? __ldg(xp + v) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// The B fragment of MMA (i, h) of a step from one column's X words: words 4i + h and 4i + h + 2
// hold x[8i + 2h .. + 1] and x[8i + 2h + 4 .. + 5].
__device__ __forceinline__ void x_frag(const uint4 (&xv)[4], int i, int h, unsigned& b0, unsigned& b1) {
    const unsigned xa = word_of(xv[(4 * i + h) / 4], (4 * i + h) % 4);
    const unsigned xb = word_of(xv[(4 * i + h + 2) / 4], (4 * i + h + 2) % 4);
    b0 = __byte_perm(xa, xb, 0x5410);
    b1 = __byte_perm(xa, xb, 0x7632);
}

// One step of a warp (16 rows x 128 weights): this lane's 16 B code chunks cg (row g) and ch
// (row g + 8), at chunk j of the row, with their scales (mins) as f16x2 splats, decoded to f16
// and multiplied on mma.sync against X of the same 32 weights (zeros past B or K). Where the
// codes come from (registers loaded from global in w4a16_mma_warp, shared memory in
// w4a16_mma_pipelined) is the caller's business.
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_step(MmaAcc<B>& acc, const uint4& cg, const uint4& ch, unsigned dg, unsigned dh, unsigned m2g,
                                               unsigned m2h, const __half* __restrict__ x, int k, int j, int nchunks, int g) {
    constexpr int NH = MmaAcc<B>::NH, CH = MmaAcc<B>::CH;
    uint4 xv[NH][4];
    load_x_chunk<B>(xv, x, k, j, nchunks, g);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned wg = word_of(cg, i) >> (8 * h), wh = word_of(ch, i) >> (8 * h);
            const unsigned a0 = w2_f16x2<false, ASYM>(wg, dg, m2g);
            const unsigned a1 = w2_f16x2<false, ASYM>(wh, dh, m2h);
            const unsigned a2 = w2_f16x2<true, ASYM>(wg, dg, m2g);
            const unsigned a3 = w2_f16x2<true, ASYM>(wh, dh, m2h);
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) {
                unsigned b0, b1;
                x_frag(xv[nh], i, h, b0, b1);
                mma_f16_16816(acc.v[nh][h % CH], a0, a1, a2, a3, b0, b1);
            }
        }
    }
}

// w4a16_mma_step for symmetric codes whose step lies in one group (group % 128 == 0), with the
// scale applied after the MMAs (w4a16_mma_tiled_post). The codes enter the MMA as the f16 the
// LOP3 makes of them, 1024 + q (low nibbles, k 0..7 of each MMA) and 1024 + 16q (high, k 8..15),
// with no FMA; X's k 8..15 half (b1) is scaled by 1/16 to match (exact unless x / 16 is
// subnormal). A second MMA with the constant A (1032 | 1152) gives C = 1032 sum(x_lo) +
// 72 sum(x_hi), so that S - C = sum((q - 8) x): the f16 products are exact in fp32, the sums carry
// fp32 rounding at the scale of 1024 |x| (~1e-5 of a step's sum here). Each row's scale then
// multiplies its step sum once: acc += d (S - C). Against w4a16_mma_step: no HFMA2 (64 per
// step), 8 more HMMA and 8 f16 multiplies.
// d2: this lane's (row g, row g + 8) scale pair; zero past K or past the matrix.
template <int B>
__device__ __forceinline__ void w4a16_mma_step_post(MmaAcc<B>& acc, const uint4& cg, const uint4& ch, unsigned d2, const __half* __restrict__ x,
                                                    int k, int j, int nchunks, int g) {
    constexpr int NH = MmaAcc<B>::NH;
    uint4 xv[NH][4];
    load_x_chunk<B>(xv, x, k, j, nchunks, g);
    float sum[NH][4], cor[NH][4];
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
#pragma unroll
        for (int i = 0; i < 4; ++i) sum[nh][i] = cor[nh][i] = 0.f;
    const unsigned c_lo = 0x64086408u, c_hi = 0x64806480u, sixteenth = 0x2C002C00u;  // f16 1032, 1152, 1/16
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned wg = word_of(cg, i) >> (8 * h), wh = word_of(ch, i) >> (8 * h);
            const unsigned a0 = codes_f16x2<false>(wg), a1 = codes_f16x2<false>(wh), a2 = codes_f16x2<true>(wg), a3 = codes_f16x2<true>(wh);
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) {
                unsigned b0, bx;
                x_frag(xv[nh], i, h, b0, bx);
                const unsigned b1 = fma_f16x2(bx, sixteenth, 0u);  // the k 8..15 half of X, / 16
                mma_f16_16816(sum[nh], a0, a1, a2, a3, b0, b1);
                mma_f16_16816(cor[nh], c_lo, c_lo, c_hi, c_hi, b0, b1);
            }
        }
    }
    const float dg = __half2float(__ushort_as_half((unsigned short)(d2 & 0xFFFFu))), dh = __half2float(__ushort_as_half((unsigned short)(d2 >> 16)));
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc.v[nh][0][i] = fmaf(i < 2 ? dg : dh, sum[nh][i] - cor[nh][i], acc.v[nh][0][i]);
}

// C fragment -> part[batch][row] (this warp's slot), the two chains added.
template <int B>
__device__ __forceinline__ void mma_store_part(const MmaAcc<B>& acc, float (*part)[MMA_ROWS], int g, int c) {
    constexpr int NH = MmaAcc<B>::NH, CH = MmaAcc<B>::CH;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int b = 8 * nh + 2 * c + (i & 1);
            if (b < B) part[b][g + 8 * (i >> 1)] = CH == 2 ? acc.v[nh][0][i] + acc.v[nh][CH - 1][i] : acc.v[nh][0][i];
        }
}

// A lane's chunk j = 4t + c and the group it falls in, advanced `jstep` chunks (one step, or S
// steps for a warp that takes every S-th step) at a time without a division.
struct StepWalk {
    int j, grp, rem;
    const int cpg, gstep, rstep, jstep;
    __device__ __forceinline__ StepWalk(int j0, int cpg_, int jstep_ = 4)
        : j(j0), grp(j0 / cpg_), rem(j0 % cpg_), cpg(cpg_), gstep(jstep_ / cpg_), rstep(jstep_ % cpg_), jstep(jstep_) {}
    __device__ __forceinline__ void next() {
        j += jstep;
        grp += gstep;
        rem += rstep;
        if (rem >= cpg) {
            rem -= cpg;
            ++grp;
        }
    }
};

// One warp's share of a 16-row tile: steps [t0, t1) of K (step t covers chunks 4t .. 4t + 3),
// U steps of codes and scales loaded per round before any is decoded, decoded and multiplied
// on mma.sync; the C fragment lands in part[batch][row] (this warp's slot). Shared by
// w4a16_mma (a quarter of K per warp) and w4a16_mma_splitk (at most U steps per warp).
// Bytes at p (16 B aligned, a multiple of 16) fetched into L2, one bulk request (sm_90; a no-op
// before, where the rung that asks for it then behaves as w4a16_mma_tiled).
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

template <int B, bool ASYM, int U = MmaSteps<B>::U, bool TILED = false, bool ROLL = false, int PF = 0, bool POST = false, int S = 1>
__device__ __forceinline__ void w4a16_mma_warp(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                               const __half* __restrict__ x, int n_rows, int k, int group, int row0, int t0, int t1,
                                               float (*part)[MMA_ROWS]) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const long long rg = min(row0 + g, n_rows - 1), rh = min(row0 + g + 8, n_rows - 1);  // clamped rows are never stored
    const int nchunks = k / 32, cpg = group / 32, gpr = k / group;
    const uint4* qg = reinterpret_cast<const uint4*>(wq + rg * (k / 2));
    const uint4* qh = reinterpret_cast<const uint4*>(wq + rh * (k / 2));
    // Tiled (w4a16_mma_tiled): step t's 16 B for this lane at 64 t + lane (row g) and 64 t + 32 +
    // lane (row g + 8) of the tile's blocks; the scales (mins) of rows g and g + 8 for group grp
    // one 4-byte pair, word 8 grp + g of the tile's.
    // Sweeping warps (S > 1) read the step-major tile layout, where step t of every tile comes
    // before step t + 1 of any: block (tile, t) at (t ntiles + tile) KB.
    const long long tile = row0 / MMA_ROWS, nsteps = (nchunks + 3) / 4;
    const long long tstep = S > 1 ? 64LL * ((n_rows + MMA_ROWS - 1) / MMA_ROWS) : 64;
    const uint4* qt = reinterpret_cast<const uint4*>(wq) + tile * (S > 1 ? 1 : nsteps) * 64 + lane;
    const unsigned* sp = reinterpret_cast<const unsigned*>(scales + tile * gpr * MMA_ROWS) + g;
    const unsigned* mp = reinterpret_cast<const unsigned*>(mins + tile * gpr * MMA_ROWS) + g;
    const __half* sg = scales + rg * gpr;
    const __half* sh = scales + rh * gpr;
    const __half* mg = mins + rg * gpr;
    const __half* mh = mins + rh * gpr;
    // The warp's steps: t0, t0 + S, t0 + 2S, ... below t1 (S = 1: a contiguous slice).
    StepWalk walk(4 * t0 + c, cpg, 4 * S);
    static_assert(PF == 0 || S == 1, "prefetches run ahead within a contiguous slice");
    // PF > 0 (tiled only): lane 0 asks L2 for the slice's scales (and mins) at the start, and for
    // step t + PF as the warp issues step t, so DRAM streams PF steps ahead of the registers.
    const uint4* tq0 = qt - lane;
    if (PF > 0 && lane == 0 && t0 < t1) {
        const int g0 = 4 * t0 / cpg, g1 = (min(4 * t1, nchunks) - 1) / cpg;
        prefetch_l2(scales + (tile * gpr + g0) * MMA_ROWS, 32u * (g1 - g0 + 1));
        if (ASYM) prefetch_l2(mins + (tile * gpr + g0) * MMA_ROWS, 32u * (g1 - g0 + 1));
    }
    MmaAcc<B> acc;
    acc.zero();

    uint4 cg[U], ch[U];
    unsigned dg[U], dh[U], m2g[U], m2h[U];
    int jj[U];
    // Loads step t (codes and scales) into slot u, zeros past t1 or K; steps are issued in order,
    // so the running chunk and group indices are the next step's.
    auto issue = [&](int u, int t) {
        jj[u] = walk.j;
        const bool ok = t < t1 && walk.j < nchunks;
        cg[u] = ch[u] = make_uint4(0u, 0u, 0u, 0u);
        if (ok) {
            cg[u] = ld_stream16(TILED ? qt + tstep * t : qg + walk.j);
            ch[u] = ld_stream16(TILED ? qt + tstep * t + 32 : qh + walk.j);
        }
        if (TILED) {  // one load per table: the (row g, row g + 8) pair, each half splatted
            const unsigned s2 = ok ? __ldg(sp + 8 * walk.grp) : 0u, n2 = ASYM && ok ? __ldg(mp + 8 * walk.grp) : 0u;
            dg[u] = POST ? s2 : __byte_perm(s2, 0u, 0x1010);  // POST: the raw pair, split after the MMAs
            dh[u] = __byte_perm(s2, 0u, 0x3232);
            m2g[u] = __byte_perm(n2, 0u, 0x1010);
            m2h[u] = __byte_perm(n2, 0u, 0x3232);
        } else {
            dg[u] = splat_f16(sg + walk.grp, ok);
            dh[u] = splat_f16(sh + walk.grp, ok);
            m2g[u] = ASYM ? splat_f16(mg + walk.grp, ok) : 0u;
            m2h[u] = ASYM ? splat_f16(mh + walk.grp, ok) : 0u;
        }
        if (PF > 0 && lane == 0 && t + PF < t1) prefetch_l2(tq0 + 64LL * (t + PF), 1024u);
        walk.next();
    };
    auto decode = [&](int u) {
        if (POST)
            w4a16_mma_step_post<B>(acc, cg[u], ch[u], dg[u], x, k, jj[u], nchunks, g);
        else
            w4a16_mma_step<B, ASYM>(acc, cg[u], ch[u], dg[u], dh[u], m2g[u], m2h[u], x, k, jj[u], nchunks, g);
    };
    if (ROLL) {
        // Rolling: a slot is refilled with the step U ahead as soon as its step is decoded, so
        // U - 1 to U steps stay in flight while the warp decodes (in rounds: none while it
        // decodes a round's last step). Refilling before the decode would need a (U + 1)th slot:
        // at 64 registers that spills 56-260 bytes.
#pragma unroll
        for (int u = 0; u < U; ++u) issue(u, t0 + u * S);
        for (int t = t0; t < t1; t += U * S) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (t + u * S >= t1) break;  // warp-uniform: every lane reaches each mma.sync
                decode(u);
                issue(u, t + (u + U) * S);
            }
        }
    } else {
        for (int t = t0; t < t1; t += U * S) {
#pragma unroll
            for (int u = 0; u < U; ++u) issue(u, t + u * S);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (t + u * S >= t1) break;  // warp-uniform: every lane reaches each mma.sync
                decode(u);
            }
        }
    }
    mma_store_part<B>(acc, part, g, c);
}

// The block's sum of its warps' partials for element i = b * MMA_ROWS + r, in warp order.
template <int B, int W = MMA_WARPS>
__device__ __forceinline__ float mma_block_sum(const float (*part)[B][MMA_ROWS], int i) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) s += part[w][i / MMA_ROWS][i % MMA_ROWS];
    return s;
}

// Y of the tile at row0: each (batch, row) the block's warp partials in warp order, rows past N skipped.
template <int B, int W>
__device__ __forceinline__ void mma_store_y(const float (*part)[B][MMA_ROWS], __half* __restrict__ y, int n_rows, int row0) {
    for (int i = threadIdx.x; i < B * MMA_ROWS; i += 32 * W) {
        const int b = i / MMA_ROWS, r = i % MMA_ROWS;
        if (row0 + r < n_rows) y[(long long)b * n_rows + row0 + r] = __float2half_rn(mma_block_sum<B, W>(part, i));
    }
}

template <int B, bool ASYM, int U = MmaSteps<B>::U, int W = MMA_WARPS, bool TILED = false, bool ROLL = false, int PF = 0, bool POST = false,
          bool SWEEP = false>
__device__ __forceinline__ void w4a16_mma(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                          const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {
    __shared__ float part[W][B][MMA_ROWS];
    const int warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * MMA_ROWS;
    const int nsteps = (k / 32 + 3) / 4;
    // This warp's contiguous slice of steps [t0, t1), or (SWEEP) every W-th step from `warp`.
    const int per = (nsteps + W - 1) / W;
    const int t0 = SWEEP ? warp : warp * per, t1 = SWEEP ? nsteps : min(t0 + per, nsteps);
    w4a16_mma_warp<B, ASYM, U, TILED, ROLL, PF, POST, SWEEP ? W : 1>(wq, scales, mins, x, n_rows, k, group, row0, t0, t1, part[warp]);
    // Then the W K slices are summed in warp order.
    __syncthreads();
    mma_store_y<B, W>(part, y, n_rows, row0);
}

// The parameters of every W4A16 rung's device body (the symmetric kernels pass scales as mins).
#define W4A16_ARGS                                                                                                          \
    const u8 *__restrict__ wq, const __half *__restrict__ scales, const __half *__restrict__ mins, const __half *__restrict__ x, \
        __half *__restrict__ y, int n_rows, int k, int group

// One rung's kernels quant_<NAME>_{sym,asym}_b<B>_f16, each a call of BODY<B, ASYM>.
#define W4A16_KERNELS(NAME, BODY, THREADS, MINB, B)                                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) quant_##NAME##_sym_b##B##_f16(                              \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ x, __half* __restrict__ y, \
        int n_rows, int k, int group) {                                                                                     \
        BODY<B, false>(wq, scales, scales, x, y, n_rows, k, group);                                                         \
    }                                                                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) quant_##NAME##_asym_b##B##_f16(                             \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,                      \
        const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {                               \
        BODY<B, true>(wq, scales, mins, x, y, n_rows, k, group);                                                            \
    }
// Every batch of a rung: BATCHES in lab/src/quant/experiment.rs.
#define W4A16_RUNG(NAME, BODY, THREADS, MINB)                                                                               \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 1)                                                                             \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 2)                                                                             \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 4)                                                                             \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 8)                                                                             \
    W4A16_KERNELS(NAME, BODY, THREADS, MINB, 16)

W4A16_RUNG(w4a16_mma, w4a16_mma, 32 * MMA_WARPS, 4)

// w4a16_mma_occ8_{sym,asym}_b{B}_f16: w4a16_mma with K split over 8 warps instead of 4 and 2
// steps in flight per warp instead of 4, so that a thread fits in 64 registers: 4 blocks of 8
// warps (32 warps) share an SM instead of 4 blocks of 4. Nsight Compute found w4a16_mma
// latency-bound at a quarter occupancy (4 warps per scheduler, 10 cycles between a warp's
// issues, 51% of DRAM peak); at 8192 rows its 512 blocks of 4 warps are all the warps there are.
// This rung has twice the warps for the same bytes in flight per SM (32 warps x 2 KB).
// ptxas -v, sm_90 (CUDA 13.0): 64 registers, no spills, sym and asym, every batch.
// Steps in flight: 2, and 1 at B = 8 (sym at 2 spills 4 bytes at the 64-register cap; B = 16 at 1
// spills, at 2 does not).
#define OCC8_STEPS(B) ((B) == 8 ? 1 : 2)
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_occ8(W4A16_ARGS) {
    w4a16_mma<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_occ8, w4a16_mma_occ8, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_{sym,asym}_b{B}_f16: w4a16_mma_occ8 reading W in the tile layout
// (lab/src/quant/tiles.rs), where every warp load is 512 contiguous bytes. In the row-major
// layout a warp's 16 B load touches 8 rows x 64 B, 4 KB apart; reading 32 MiB in that pattern
// alone (no decode) takes as long as the whole w4a16_mma kernel (~22 us on an H100), against
// ~15 us when each warp load reads 512 contiguous bytes: the access pattern, not the decode,
// held every earlier rung. The tile layout stores, per 16-row tile, one 1 KB block per step of
// 128 weights: first each lane's 16 B of row g = lane / 4 (chunk 4t + lane % 4), then of row
// g + 8, lanes in order; so a lane loads exactly the two chunks w4a16_mma_step decodes, and a
// warp's step is 1 KB contiguous. Scales (mins): 16 per (tile, group), as (row r, row r + 8) pairs.
// Tiles past N and chunks past K are zero in the layout and never loaded or stored.
// ptxas -v, sm_90: 64 registers; spills: sym b16 8 B, asym b1 4 B, b2 b4 b16 8 B, none elsewhere.
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled(W4A16_ARGS) {
    w4a16_mma<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, true>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled, w4a16_mma_tiled, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_rolling_{sym,asym}_b{B}_f16: w4a16_mma_tiled with the loads rolling instead
// of in rounds. A round-based warp issues its U steps, waits, decodes them, and has nothing in
// flight while it decodes the last; here each slot is refilled with the step U ahead as soon as
// its step is decoded, so a warp always has loads in flight.
// ptxas -v, sm_90: 63-64 registers, no spills at b1-b8; b16 spills 16 B (sym) and 100 B (asym).
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_rolling(W4A16_ARGS) {
    w4a16_mma<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, true, true>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_rolling, w4a16_mma_tiled_rolling, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_prefetch_{sym,asym}_b{B}_f16: w4a16_mma_tiled with each warp's next round
// fetched into L2 while it decodes this one, by bulk prefetches (cp.async.bulk.prefetch.L2, one
// instruction per 1 KB step from lane 0, PREFETCH_STEPS ahead of the step it issues; the slice's
// scales at the start). Nsight Compute found w4a16_mma_tiled latency-bound: DRAM at 62% of peak,
// no warp ready in 44% of the scheduler cycles, each warp waiting on its own 2 steps from DRAM.
// Here a round's loads find their bytes in L2. (8 steps ahead, which at N = K = 8192 requests
// the whole matrix at the start, was 29% slower than no prefetch: DRAM then returns the bytes
// in no useful order, and the decode waits for the last of them.)
#define PREFETCH_STEPS 2
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_prefetch(W4A16_ARGS) {
    w4a16_mma<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, true, false, PREFETCH_STEPS>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_prefetch, w4a16_mma_tiled_prefetch, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_post_{sym,asym}_b{B}_f16: w4a16_mma_tiled with the scales applied after the
// MMAs (w4a16_mma_step_post) where a step lies in one group: symmetric codes, group % 128 == 0.
// Other groups, and asymmetric codes, run w4a16_mma_tiled's step (the asym kernels are
// w4a16_mma_tiled's). The SASS of w4a16_mma_tiled_sym_b1 spends 128 of its 417 instructions per
// round on HFMA2; here the decode is the LOP3 alone.
// A tiled rung with U steps per warp, W warps, loads rolling or in rounds, contiguous slices
// or sweeping warps, that applies the scales after the MMAs where it can (symmetric codes,
// group % 128 == 0) and inside them elsewhere.
template <int B, bool ASYM, int U, int W, bool ROLL, bool SWEEP>
__device__ __forceinline__ void w4a16_mma_tiled_post_where_possible(W4A16_ARGS) {
    if constexpr (!ASYM) {
        if (group % 128 == 0) {
            w4a16_mma<B, false, U, W, true, ROLL, 0, true, SWEEP>(wq, scales, mins, x, y, n_rows, k, group);
            return;
        }
    }
    w4a16_mma<B, ASYM, U, W, true, ROLL, 0, false, SWEEP>(wq, scales, mins, x, y, n_rows, k, group);
}

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_post(W4A16_ARGS) {
    w4a16_mma_tiled_post_where_possible<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, false, false>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_post, w4a16_mma_tiled_post, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_sweep_{sym,asym}_b{B}_f16: w4a16_mma_tiled_post with the block's warps taking
// its tile's steps in turn (warp w: steps w, w + 8, ...) instead of one contiguous slice each,
// on the step-major tile layout (lab/src/quant/tiles.rs: step t of every tile, tile after tile,
// before step t + 1). Every way of keeping more steps in flight per warp lost to 2 steps in
// rounds (rolling loads, rings in shared memory, L2 prefetch, TMA): with contiguous slices an
// SM's 32 warps each stream a different part of W, 4096 streams spread over all of it. The
// copy-style read that reaches the floor sweeps memory in order with the whole grid. Here the
// blocks, all resident at once and each taking its tile's steps in order, read one window of
// the step-major layout that moves through W from end to end. The warps' partial sums change
// order (still fixed: reproducible). Measured within the run-to-run spread of _post (see
// reports/notes/h100-w4a16-bulk.md).
// ptxas -v, sm_90: 64 registers; no spills but sym b16 (252 B) and asym b16 (16 B).
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_sweep(W4A16_ARGS) {
    w4a16_mma_tiled_post_where_possible<B, ASYM, OCC8_STEPS(B), 2 * MMA_WARPS, false, true>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_sweep, w4a16_mma_tiled_sweep, 64 * MMA_WARPS, 4)

// w4a16_mma_tiled_sweep4_{sym,asym}_b{B}_f16: w4a16_mma_tiled_sweep with 4 warps per block (warp
// w: steps w, w + 4, ...) at up to 128 registers, and MmaSteps<B>::U steps per warp rolling (a
// slot refilled with the step U ahead as soon as its step is decoded). _sweep's warps hold 2
// steps each in rounds, none in flight while they decode the second; here each warp keeps U - 1
// to U steps in flight at all times: 16 warps x 3-4 KB per SM, continuously. Measured slower at
// batch 1-8 (8192 x 8192 b1: 22.4 us against 18.3) and faster at 16 (30.8 against 43.1): with
// half the warps the decode's latency is hidden less (reports/notes/h100-w4a16-read-floor.md).
// ptxas -v, sm_90: 118-128 registers; no spills but sym b16 (16 B).
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_sweep4(W4A16_ARGS) {
    w4a16_mma_tiled_post_where_possible<B, ASYM, MmaSteps<B>::U, MMA_WARPS, true, true>(wq, scales, mins, x, y, n_rows, k, group);
}
W4A16_RUNG(w4a16_mma_tiled_sweep4, w4a16_mma_tiled_sweep4, 32 * MMA_WARPS, 4)

// ---------------------------------------------------------------------------
// w4a16_mma_tiled_async_{sym,asym}_b{B}_f16: w4a16_mma_tiled with its loads staged through
// shared memory by cp.async, so that the bytes in flight cost no registers. Each lane copies
// exactly what it would have loaded (its 16 B of rows g and g + 8, and the 4 B words holding
// their scales, and mins) into its own slots of a per-warp ring of RING_STEPS steps, and reads
// back only what it copied itself: cp.async.wait_group orders a lane's own copies, so neither a
// barrier nor a warp sync is needed. A slot is refilled with the step RING_STEPS ahead as soon as
// its step has been read, so RING_STEPS - 1 steps stay in flight per warp while it decodes
// (w4a16_mma_tiled: 2 in rounds). Chunks past K (and steps past the warp's slice) are copied
// with a source size of 0, which zero-fills them, as the register rungs feed zeros.
// Slot (1152 B sym, 1280 B asym): codes [2][32] x 16 B, then the lanes' scale pairs [32] x 4 B,
// then their min pairs; 32 consecutive lanes on consecutive 16 B (or 4 B): no bank conflicts.
// Dynamic smem per block: 8 warps x RING_STEPS x slot = 36 KB sym, 40 KB asym at 4 steps:
// 4 blocks per SM fit (the launcher prefers the whole carveout as shared memory).
// ptxas -v, sm_90: 64 registers, no spills at any batch.
// ---------------------------------------------------------------------------
#define RING_STEPS 4

template <bool ASYM>
struct RingSlot {
    static constexpr int BYTES = 1024 + (ASYM ? 256 : 128);
};

__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_warp_async(u8* ring, const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                                     const __half* __restrict__ x, int k, int group, int row0, int t0, int t1,
                                                     float (*part)[MMA_ROWS]) {
    constexpr int SLOT = RingSlot<ASYM>::BYTES;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int nchunks = k / 32, cpg = group / 32, gpr = k / group;
    const long long tile = row0 / MMA_ROWS, nsteps = (nchunks + 3) / 4;
    const uint4* qt = reinterpret_cast<const uint4*>(wq) + tile * nsteps * 64 + lane;
    // The (row g, row g + 8) scale (min) pair of group grp: word 8 grp + g of the tile's.
    const unsigned* sw = reinterpret_cast<const unsigned*>(scales + tile * gpr * MMA_ROWS) + g;
    const unsigned* mw = reinterpret_cast<const unsigned*>(mins + tile * gpr * MMA_ROWS) + g;
    StepWalk walk(4 * t0 + c, cpg);
    // Copies step t into slot s (zero-filled past t1 or K), then commits them as one group.
    auto issue = [&](int s, int t) {
        const bool ok = t < t1 && walk.j < nchunks;
        u8* slot = ring + s * SLOT;
        const long long at = ok ? 64LL * t : 0, gw = ok ? 8LL * walk.grp : 0;
        cp_async16(slot + 16 * lane, qt + at, ok ? 16 : 0);
        cp_async16(slot + 512 + 16 * lane, qt + at + 32, ok ? 16 : 0);
        cp_async4(slot + 1024 + 4 * lane, sw + gw, ok ? 4 : 0);
        if (ASYM) cp_async4(slot + 1152 + 4 * lane, mw + gw, ok ? 4 : 0);
        asm volatile("cp.async.commit_group;" ::: "memory");
        walk.next();
    };
    MmaAcc<B> acc;
    acc.zero();
#pragma unroll
    for (int s = 0; s < RING_STEPS; ++s) issue(s, t0 + s);
    for (int t = t0; t < t1; ++t) {
        asm volatile("cp.async.wait_group %0;" ::"n"(RING_STEPS - 1) : "memory");  // step t landed
        const int s = (t - t0) % RING_STEPS;
        const u8* slot = ring + s * SLOT;
        const uint4 cg = *reinterpret_cast<const uint4*>(slot + 16 * lane), ch = *reinterpret_cast<const uint4*>(slot + 512 + 16 * lane);
        const unsigned s2 = *reinterpret_cast<const unsigned*>(slot + 1024 + 4 * lane);
        const unsigned n2 = ASYM ? *reinterpret_cast<const unsigned*>(slot + 1152 + 4 * lane) : 0u;
        const unsigned dg = __byte_perm(s2, 0u, 0x1010), dh = __byte_perm(s2, 0u, 0x3232);
        const unsigned m2g = __byte_perm(n2, 0u, 0x1010), m2h = __byte_perm(n2, 0u, 0x3232);
        issue(s, t + RING_STEPS);  // the slot's values are in registers: refill it
        w4a16_mma_step<B, ASYM>(acc, cg, ch, dg, dh, m2g, m2h, x, k, 4 * t + c, nchunks, g);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    mma_store_part<B>(acc, part, g, c);
}

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_async(W4A16_ARGS) {
    constexpr int W = 2 * MMA_WARPS;
    extern __shared__ uint4 dyn[];
    __shared__ float part[W][B][MMA_ROWS];
    const int warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * MMA_ROWS;
    const int nsteps = (k / 32 + 3) / 4;
    const int per = (nsteps + W - 1) / W;
    const int t0 = warp * per, t1 = min(t0 + per, nsteps);
    u8* ring = reinterpret_cast<u8*>(dyn) + warp * RING_STEPS * RingSlot<ASYM>::BYTES;
    w4a16_mma_warp_async<B, ASYM>(ring, wq, scales, mins, x, k, group, row0, t0, t1, part[warp]);
    __syncthreads();
    mma_store_y<B, W>(part, y, n_rows, row0);
}

W4A16_RUNG(w4a16_mma_tiled_async, w4a16_mma_tiled_async, 64 * MMA_WARPS, 4)

// ---------------------------------------------------------------------------
// w4a16_mma_tiled_bulk_{sym,asym}_b{B}_f16: w4a16_mma_tiled_sweep with its codes fetched by the
// copy engine (TMA, sm_90). In the tile layout a warp's step is one contiguous 1 KB block, so
// lane 0 copies it with one cp.async.bulk into a slot of the warp's ring of BULK_STEPS slots in
// shared memory, completing on the slot's mbarrier: bytes in flight that cost neither registers
// nor per-lane instructions (w4a16_mma_tiled_async's cp.async cost 4-6 per lane and step). When
// a slot's phase completes each lane reads its two 16 B chunks, the warp syncs, and lane 0
// refills the slot with the step BULK_STEPS ahead before the warp decodes: BULK_STEPS - 1 to
// BULK_STEPS steps in flight per warp at all times (w4a16_mma_tiled: 0-2, in rounds). Each lane
// loads its scale (min) pair word into a register ring as its step is issued, BULK_STEPS steps
// before it decodes. Steps past the warp's last are neither copied nor waited for, so no copy
// is in flight when a warp ends. The decode, its order and the sums are w4a16_mma_tiled_sweep's.
// Before sm_90 the kernels are w4a16_mma_tiled_sweep's.
// Dynamic smem per block: 8 warps x BULK_STEPS x 1 KB = 32 KB; 4 blocks per SM.
// ptxas -v, sm_90: 64 registers; spills 0-12 B at b1-b8, 36 B (asym) and 380 B (sym) at b16.
// Measured slower than every register rung at batch 1 (22.5 against 17.8-18.4 us at 8192 x 8192),
// and faster with 2 slots than with 4. Nsight Compute counts ~40% more instructions issued than
// tiled_post where the SASS has ~20% more per step; waiting with mbar_sleep instead of polling
// did not change it (reports/notes/h100-w4a16-bulk.md).
// ---------------------------------------------------------------------------
#define BULK_STEPS 4

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
template <int B, bool ASYM, bool POST, int S>
__device__ __forceinline__ void w4a16_mma_warp_bulk(const u8* ring, unsigned bars, const u8* __restrict__ wq, const __half* __restrict__ scales,
                                                    const __half* __restrict__ mins, const __half* __restrict__ x, int k, int group, int row0,
                                                    int t0, int t1, float (*part)[MMA_ROWS]) {
    constexpr int R = BULK_STEPS;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int nchunks = k / 32, cpg = group / 32, gpr = k / group;
    // The step-major tile layout (as w4a16_mma_tiled_sweep reads it): block (tile, t) at (t ntiles + tile) KB.
    const long long tile = row0 / MMA_ROWS, tstep = 1024LL * gridDim.x;
    const u8* qt = wq + tile * 1024;
    const unsigned* sp = reinterpret_cast<const unsigned*>(scales + tile * gpr * MMA_ROWS) + g;
    const unsigned* mp = reinterpret_cast<const unsigned*>(mins + tile * gpr * MMA_ROWS) + g;
    const unsigned ring_at = smem_addr(ring);
    if (lane == 0) {
#pragma unroll
        for (int u = 0; u < R; ++u) mbar_init(bars + 8 * u, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();
    StepWalk walk(4 * t0 + c, cpg, 4 * S);  // the next step to issue: t0, t0 + S, ... below t1
    unsigned s2[R], n2[R];
    // Step t into slot u (no copy past t1), and this lane's scale (min) pair for it (0 past t1 or K).
    auto issue = [&](int u, int t) {
        const bool ok = t < t1 && walk.j < nchunks;
        s2[u] = ok ? __ldg(sp + 8 * walk.grp) : 0u;
        n2[u] = ASYM && ok ? __ldg(mp + 8 * walk.grp) : 0u;
        if (lane == 0 && t < t1) {
            mbar_expect_tx(bars + 8 * u, 1024);
            bulk_load(ring_at + 1024 * u, qt + tstep * t, 1024, bars + 8 * u);
        }
        walk.next();
    };
    MmaAcc<B> acc;
    acc.zero();
#pragma unroll
    for (int u = 0; u < R; ++u) issue(u, t0 + u * S);
    for (int t = t0, round = 0; t < t1; t += R * S, ++round) {
#pragma unroll
        for (int u = 0; u < R; ++u) {
            if (t + u * S >= t1) break;  // warp-uniform: every lane reaches each mma.sync
            mbar_sleep(bars + 8 * u, round & 1);
            const uint4 cg = *reinterpret_cast<const uint4*>(ring + 1024 * u + 16 * lane);
            const uint4 ch = *reinterpret_cast<const uint4*>(ring + 1024 * u + 512 + 16 * lane);
            const unsigned sv = s2[u], nv = n2[u];
            __syncwarp();  // every lane has read the slot: refill it
            issue(u, t + (u + R) * S);
            const int j = 4 * (t + u * S) + c;
            if (POST)
                w4a16_mma_step_post<B>(acc, cg, ch, sv, x, k, j, nchunks, g);
            else
                w4a16_mma_step<B, ASYM>(acc, cg, ch, __byte_perm(sv, 0u, 0x1010), __byte_perm(sv, 0u, 0x3232), __byte_perm(nv, 0u, 0x1010),
                                        __byte_perm(nv, 0u, 0x3232), x, k, j, nchunks, g);
        }
    }
    mma_store_part<B>(acc, part, g, c);
}
#endif

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_tiled_bulk(W4A16_ARGS) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int W = 2 * MMA_WARPS;
    extern __shared__ uint4 dyn[];
    __shared__ float part[W][B][MMA_ROWS];
    __shared__ unsigned long long bars[W][BULK_STEPS];
    require_dynamic_smem(W * BULK_STEPS * 1024);
    const int warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * MMA_ROWS;
    const int nsteps = (k / 32 + 3) / 4;
    const u8* ring = reinterpret_cast<const u8*>(dyn) + warp * BULK_STEPS * 1024;
    const unsigned wb = smem_addr(bars[warp]);
    bool post = false;
    if constexpr (!ASYM) post = group % 128 == 0;
    // Warp w takes steps w, w + W, ... (as w4a16_mma_tiled_sweep).
    if (post)
        w4a16_mma_warp_bulk<B, false, true, W>(ring, wb, wq, scales, mins, x, k, group, row0, warp, nsteps, part[warp]);
    else
        w4a16_mma_warp_bulk<B, ASYM, false, W>(ring, wb, wq, scales, mins, x, k, group, row0, warp, nsteps, part[warp]);
    __syncthreads();
    mma_store_y<B, W>(part, y, n_rows, row0);
#else
    w4a16_mma_tiled_sweep<B, ASYM>(wq, scales, mins, x, y, n_rows, k, group);
#endif
}

W4A16_RUNG(w4a16_mma_tiled_bulk, w4a16_mma_tiled_bulk, 64 * MMA_WARPS, 4)

// ---------------------------------------------------------------------------
// W4A16 on tensor cores, one load round per warp: w4a16_mma_splitk_{sym,asym}_b{B}_f16.
// The same warp step as w4a16_mma (w4a16_mma_warp: 16-row tile, U steps of 16 B codes per lane
// issued before any is decoded, decoded to f16, mma.sync), but K is split so finely that a warp
// owns at most U steps: it issues every load it will ever make in one round, waits for one DRAM
// round trip, decodes, and is done. A tile's K is spread over gridDim.y = S blocks of 4 warps
// (S = ceil(nsteps / (4 U)), chosen by the launcher; the kernel is correct for any S: a warp's
// slice is ceil(nsteps / 4S) steps, in rounds of U). Each block sums its 4 warps in shared memory
// (warp order) and writes one fp32 partial per (slice, batch, row) to a workspace
// ws[S][B][N]; the last block of a tile to arrive (a per-tile counter) adds the S partials in
// slice order, writes Y in f16 and resets the counter for the next launch. S = 1 (K <= 2048,
// or K <= 1536 at B = 16) writes Y directly. The sum order is fixed: results are reproducible.
// Napkin math (H100 SXM, N = K = 8192, 132 SMs, 3.02 TB/s copy ceiling):
// - nsteps = 64 steps of 128 weights; B <= 8: U = 4, S = 4, a grid of 512 x 4 = 2048 blocks,
//   B = 16: U = 3, S = 6, 3072 blocks. __launch_bounds__(128, 4): 4 blocks (16 warps) per SM,
//   528 slots: 3.9 waves (5.8 at B = 16) of blocks that live one round trip each.
// - Bytes in flight: 4 KB of codes per warp (3 KB at B = 16), 64 KB per SM (48 KB), 8.4 MB
//   GPU-wide: 4x Little's ~16 KB per SM. A single wave with every load up front is out of reach
//   in registers: the whole register file (132 x 256 KB = 33.8 MB) is the size of W (32 MiB of
//   codes); what changes against w4a16_mma is that a round belongs to a block, and a finished
//   block's slot is refilled at once by one that issues all its loads, rather than a warp
//   walking 4 rounds of its quarter of K behind its own decode.
// - Workspace: 4 B x S x B x N written and read back (128 KB at B = 1, 3.1 MB at B = 16), from L2.
// - Expected: ~1 round trip (~1 us loaded) + 34.6 MB at ~2.7 TB/s (cuBLAS's sustained GEMV rate)
//   = 12.8 us, + ~1 us for the last wave and the finishing blocks: ~14.5 us at B = 1..4,
//   ~15 us at B = 8, ~18 us at B = 16 (twice the MMAs, 6 waves, 3 KB per warp).
// ptxas -v, sm_90 (CUDA 13.0; registers / static smem, no spills in any):
//   sym  b1 b2 b4 b8 b16 117 / 257-4097 B
//   asym b1 124, b2 b4 127, b8 124, b16 122 / 257-4097 B   (w4a16_mma after the shared warp step
//   was factored out: unchanged, 115 / 127 / 105 / 116)
// ---------------------------------------------------------------------------
template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_splitk(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                                 const __half* __restrict__ x, __half* __restrict__ y, float* __restrict__ ws,
                                                 unsigned* __restrict__ done, int n_rows, int k, int group) {
    __shared__ float part[MMA_WARPS][B][MMA_ROWS];
    const int warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * MMA_ROWS;
    const int slices = gridDim.y, s = blockIdx.y;
    const int nsteps = (k / 32 + 3) / 4;
    // Warp w of slice s owns steps [t0, t1): slices x 4 contiguous slices of K, in slice-major order.
    const int per = (nsteps + MMA_WARPS * slices - 1) / (MMA_WARPS * slices);
    const int t0 = (s * MMA_WARPS + warp) * per, t1 = min(t0 + per, nsteps);
    w4a16_mma_warp<B, ASYM>(wq, scales, mins, x, n_rows, k, group, row0, t0, t1, part[warp]);
    __syncthreads();
    if (slices == 1) {
        mma_store_y<B, MMA_WARPS>(part, y, n_rows, row0);
        return;
    }
    for (int i = threadIdx.x; i < B * MMA_ROWS; i += 32 * MMA_WARPS) {
        const int b = i / MMA_ROWS, r = i % MMA_ROWS;
        if (row0 + r < n_rows) ws[((long long)s * B + b) * n_rows + row0 + r] = mma_block_sum<B>(part, i);
    }
    // The tile's last block finishes it.
    if (!last_to_arrive(done + blockIdx.x, slices)) return;
    for (int i = threadIdx.x; i < B * MMA_ROWS; i += 32 * MMA_WARPS) {
        const int b = i / MMA_ROWS, r = i % MMA_ROWS;
        if (row0 + r < n_rows) {
            float acc = 0.f;
            for (int v = 0; v < slices; ++v) acc += __ldcg(ws + ((long long)v * B + b) * n_rows + row0 + r);
            y[(long long)b * n_rows + row0 + r] = __float2half_rn(acc);
        }
    }
    if (threadIdx.x == 0) done[blockIdx.x] = 0u;  // ready for the next launch
}

#define W4A16_MMA_SPLITK(B)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS, 4) quant_w4a16_mma_splitk_sym_b##B##_f16(                  \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ x, __half* __restrict__ y, \
        float* __restrict__ ws, unsigned* __restrict__ done, int n_rows, int k, int group) {                                \
        w4a16_mma_splitk<B, false>(wq, scales, scales, x, y, ws, done, n_rows, k, group);                                   \
    }                                                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS, 4) quant_w4a16_mma_splitk_asym_b##B##_f16(                 \
        const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,                      \
        const __half* __restrict__ x, __half* __restrict__ y, float* __restrict__ ws, unsigned* __restrict__ done,          \
        int n_rows, int k, int group) {                                                                                     \
        w4a16_mma_splitk<B, true>(wq, scales, mins, x, y, ws, done, n_rows, k, group);                                      \
    }

W4A16_MMA_SPLITK(1)
W4A16_MMA_SPLITK(2)
W4A16_MMA_SPLITK(4)
W4A16_MMA_SPLITK(8)
W4A16_MMA_SPLITK(16)

// ---------------------------------------------------------------------------
// W4A16 on tensor cores, weights staged through shared memory: w4a16_mma_pipelined_{sym,asym}_b{B}_f16.
// w4a16_mma keeps its bytes in flight in registers (115-127 per thread, 4 warps per tile, 8-16
// warps per SM; ncu: 27-37% of DRAM peak, 12-22% occupancy). Here a block's loads land in a
// ring of PIPE_STAGES shared-memory stages filled by cp.async.cg (16 B, L2 only), so the bytes
// in flight cost no registers, and the warps decode from shared memory with the same step
// (w4a16_mma_step: f16 decode, mma.sync m16n8k16, X through L1 with __ldg).
// - Stage: one 16-row tile x PIPE_CHUNKS = 32 chunks (1024 weights) of K: 8 KB of codes, row r's
//   chunk jl at slot r * 32 + (jl ^ 4 (r & 1)) (rows g and g + 1 of one quarter-warp's 16 B
//   reads land in different 64 B halves of the bank row: no conflicts), then per row
//   PIPE_SVECS = 5 aligned 16 B vectors of scales (and of mins) starting at the vector holding
//   the stage's first group: 32 chunks touch at most 32 groups (group 32), 7 + 32 <= 40 halves.
//   8192 + 1280 B (sym) / 8192 + 2560 B (asym) per stage; 8 stages: 75776 / 86016 B dynamic.
// - Block: 8 warps; warp w decodes step w of each stage (4 chunks, 128 weights of 16 rows).
//   The block walks its tiles' stages as one sequence (tile-major), issuing stage s + 7 while
//   it decodes stage s (cp.async.wait_group 6, one barrier per stage), so the ring stays full
//   across tile boundaries; at a tile's last stage the 8 warps' partials meet in shared memory
//   (warp order) and the tile's 16 rows of Y are written.
// - Grid: persistent, PIPE_BLOCKS_PER_SM = 2 blocks per SM (smem 2 x (86 KB + 8.5 KB) and
//   registers 2 x 256 x 128 = the whole file): tiles per block tpb = ceil(tiles / (2 x SMs)),
//   grid = ceil(tiles / tpb), contiguous tiles per block, so every block does the same number
//   of tiles (no tail of a partial wave): N = 8192: 512 tiles, 256 blocks x 2 tiles (32 stages
//   each); N = 4096: 256 blocks x 1 tile; N = 11008: 688 tiles, 230 blocks x 3.
// - Bytes in flight: 7 stages x 8 KB = 56 KB per block, 112 KB per SM, 14 MB GPU-wide at
//   N = K = 8192 (Little's law asks ~16 KB per SM at 3 TB/s x 0.7 us; w4a16_mma had ~62 KB per
//   SM on paper but only between decode phases).
// - Issue: the same ~200 instructions per warp step as w4a16_mma (~6.4 us per SM at B = 1 on
//   8192 x 8192, ~10.6 us at B = 16), now beside a stream that no longer waits on it, 16 warps
//   per SM (4 per scheduler). LDS: 2 x 16 B of codes per lane per step, conflict-free.
// - Expected, 8192 x 8192 g128: ~1.5 us to fill the ring + 34.6 MB at ~2.7 TB/s = ~14 us at
//   B = 1..4, ~15 us at B = 8, ~18 us at B = 16 (issue-bound, X from L2).
// lab/src/quant/w4a16_mma_model.rs mirrors the stage layout, the scale window and the walk.
// ptxas -v, sm_90 (CUDA 13.0; registers / static smem, no spills in any; dynamic smem 75776 B
// sym, 86016 B asym, raised above 48 KiB by the launcher):
//   sym  b1 b2 b4 b8 93 / 512-4096 B   b16 102 / 8 KiB
//   asym b1 b2 b8 96, b4 95 / 512-4096 B   b16 104 / 8 KiB
//   (w4a16_mma and w4a16_mma_splitk after w4a16_mma_step was factored out: unchanged)
// ---------------------------------------------------------------------------
#define PIPE_WARPS 8
#define PIPE_CHUNKS 32
#define PIPE_STAGES 8
#define PIPE_SVECS 5
#define PIPE_BLOCKS_PER_SM 2

// 16 B vectors of one stage: codes, then scales (and mins) per row.
template <bool ASYM>
struct PipeStage {
    static constexpr int CODES = MMA_ROWS * PIPE_CHUNKS;
    static constexpr int VECS = CODES + (ASYM ? 2 : 1) * MMA_ROWS * PIPE_SVECS;
};

// Slot of row r's chunk jl (0..PIPE_CHUNKS) in a stage.
__device__ __forceinline__ int pipe_code_slot(int r, int jl) { return r * PIPE_CHUNKS + (jl ^ ((r & 1) << 2)); }

// First scale (in halves) of the 16 B vector holding row `row`'s group g0: the stage's window.
__device__ __forceinline__ long long pipe_scale_base(long long row, int gpr, int g0) { return (row * gpr + g0) / 8 * 8; }

// Copies of one stage (tile at row0, chunks [s0, s0 + PIPE_CHUNKS)) into `st`, spread over the
// block's threads; chunks past K and vectors past the scales are zero-filled (src-size 0).
template <bool ASYM>
__device__ __forceinline__ void pipe_issue(uint4* st, const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                           int n_rows, int k, int gpr, int cpg, int row0, int s0) {
    const int nchunks = k / 32;
    for (int i = threadIdx.x; i < PipeStage<ASYM>::CODES; i += 32 * PIPE_WARPS) {
        const int r = i / PIPE_CHUNKS, jl = i % PIPE_CHUNKS, j = s0 + jl;
        const long long row = min(row0 + r, n_rows - 1);  // clamped rows are never stored
        const bool ok = j < nchunks;
        cp_async16(st + pipe_code_slot(r, jl), wq + row * (k / 2) + 16LL * (ok ? j : 0), ok ? 16 : 0);
    }
    const long long total = 2LL * n_rows * gpr;  // bytes of scales (and of mins)
    const int g0 = s0 / cpg;
    for (int i = threadIdx.x; i < PipeStage<ASYM>::VECS - PipeStage<ASYM>::CODES; i += 32 * PIPE_WARPS) {
        const int which = i / (MMA_ROWS * PIPE_SVECS), r = i / PIPE_SVECS % MMA_ROWS, v = i % PIPE_SVECS;
        const long long row = min(row0 + r, n_rows - 1);
        const long long off = 2 * pipe_scale_base(row, gpr, g0) + 16LL * v;
        const long long bytes = max(0LL, min(16LL, total - off));
        const u8* src = reinterpret_cast<const u8*>(which ? mins : scales);
        cp_async16(st + PipeStage<ASYM>::CODES + i, src + (bytes > 0 ? off : 0), (int)bytes);
    }
}

// A scale (or min) of row r's group grp from the stage's window, as f16x2; 0 past K.
__device__ __forceinline__ unsigned pipe_splat(const uint4* win, int r, long long row, int gpr, int g0, int grp, bool ok) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(win + r * PIPE_SVECS);
    const unsigned s = ok ? (unsigned)h[row * gpr + grp - pipe_scale_base(row, gpr, g0)] : 0u;
    return s | (s << 16);
}

template <int B, bool ASYM>
__device__ __forceinline__ void w4a16_mma_pipelined(const u8* __restrict__ wq, const __half* __restrict__ scales, const __half* __restrict__ mins,
                                                    const __half* __restrict__ x, __half* __restrict__ y, int n_rows, int k, int group) {
    extern __shared__ uint4 ring[];
    __shared__ float part[PIPE_WARPS][B][MMA_ROWS];
    constexpr int VECS = PipeStage<ASYM>::VECS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int nchunks = k / 32, cpg = group / 32, gpr = k / group;
    const int nst = (nchunks + PIPE_CHUNKS - 1) / PIPE_CHUNKS;  // stages per tile
    const int tiles = (n_rows + MMA_ROWS - 1) / MMA_ROWS;
    const int tpb = (tiles + gridDim.x - 1) / gridDim.x;
    const int tile0 = blockIdx.x * tpb, ntiles = max(0, min(tpb, tiles - tile0));
    const int total = ntiles * nst;  // this block's stages, tile-major
    // Stage p of the walk: tile tile0 + p / nst, chunks from (p % nst) * PIPE_CHUNKS.
#pragma unroll
    for (int p = 0; p < PIPE_STAGES - 1; ++p) {
        if (p < total) pipe_issue<ASYM>(ring + p * VECS, wq, scales, mins, n_rows, k, gpr, cpg, (tile0 + p / nst) * MMA_ROWS, p % nst * PIPE_CHUNKS);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    MmaAcc<B> acc;
    acc.zero();
    for (int p = 0; p < total; ++p) {
        asm volatile("cp.async.wait_group %0;" ::"n"(PIPE_STAGES - 2) : "memory");
        __syncthreads();  // stage p landed for every thread; stage p - 1's slot is free
        const int q = p + PIPE_STAGES - 1;
        if (q < total) pipe_issue<ASYM>(ring + q % PIPE_STAGES * VECS, wq, scales, mins, n_rows, k, gpr, cpg, (tile0 + q / nst) * MMA_ROWS, q % nst * PIPE_CHUNKS);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const uint4* st = ring + p % PIPE_STAGES * VECS;
        const int row0 = (tile0 + p / nst) * MMA_ROWS, s0 = p % nst * PIPE_CHUNKS, g0 = s0 / cpg;
        const long long rg = min(row0 + g, n_rows - 1), rh = min(row0 + g + 8, n_rows - 1);
        for (int tl = warp; tl < PIPE_CHUNKS / 4 && s0 + 4 * tl < nchunks; tl += PIPE_WARPS) {  // warp-uniform
            const int jl = 4 * tl + c, j = s0 + jl, grp = j / cpg;
            const bool ok = j < nchunks;
            const uint4* win = st + PipeStage<ASYM>::CODES;
            const unsigned dg = pipe_splat(win, g, rg, gpr, g0, grp, ok), dh = pipe_splat(win, g + 8, rh, gpr, g0, grp, ok);
            const unsigned m2g = ASYM ? pipe_splat(win + MMA_ROWS * PIPE_SVECS, g, rg, gpr, g0, grp, ok) : 0u;
            const unsigned m2h = ASYM ? pipe_splat(win + MMA_ROWS * PIPE_SVECS, g + 8, rh, gpr, g0, grp, ok) : 0u;
            w4a16_mma_step<B, ASYM>(acc, st[pipe_code_slot(g, jl)], st[pipe_code_slot(g + 8, jl)], dg, dh, m2g, m2h, x, k, j, nchunks, g);
        }
        if (p % nst == nst - 1) {  // the tile's last stage: sum the warps in warp order, write Y
            mma_store_part<B>(acc, part[warp], g, c);
            acc.zero();
            __syncthreads();
            for (int i = threadIdx.x; i < B * MMA_ROWS; i += 32 * PIPE_WARPS) {
                const int b = i / MMA_ROWS, r = i % MMA_ROWS;
                float s = 0.f;
#pragma unroll
                for (int w = 0; w < PIPE_WARPS; ++w) s += part[w][b][r];
                if (row0 + r < n_rows) y[(long long)b * n_rows + row0 + r] = __float2half_rn(s);
            }
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

W4A16_RUNG(w4a16_mma_pipelined, w4a16_mma_pipelined, 32 * PIPE_WARPS, PIPE_BLOCKS_PER_SM)

// ---------------------------------------------------------------------------
// stream_read_f16: the floor under every W4A16 kernel of a shape. It reads the bytes such a
// kernel must read (codes, scales, mins: up to three buffers) once, as the copy ceiling's kernel
// reads (16 B per lane, consecutive lanes on consecutive 16 B, grid-stride, streaming loads),
// and decodes nothing. Each block writes the XOR of the little-endian u32 words it read (a
// partial last word zero-padded), so the host can check that every byte was read.
// stream_read_x{4,8}_f16: the same with U = 4 or 8 loads issued per thread before any is used
// (U = 1 waits on each load in turn: at 2048 threads an SM has 32 KB in flight). Measured no
// faster than U = 1 at any size: one load per thread was never short of bytes in flight
// (reports/notes/h100-w4a16-read-floor.md).
// ---------------------------------------------------------------------------
template <int U>
__device__ __forceinline__ unsigned xor_words(const u8* __restrict__ p, long long bytes) {
    unsigned acc = 0u;
    const long long nv = bytes / 16, stride = (long long)gridDim.x * blockDim.x;
    const long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (long long i = i0; i < nv; i += U * stride) {
        uint4 w[U];
#pragma unroll
        for (int u = 0; u < U; ++u) w[u] = i + u * stride < nv ? ld_stream16(reinterpret_cast<const uint4*>(p) + i + u * stride) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= w[u].x ^ w[u].y ^ w[u].z ^ w[u].w;
    }
    for (long long i = 16 * nv + i0; i < bytes; i += stride) acc ^= (unsigned)p[i] << (8 * (i % 4));
    return acc;
}

template <int U>
__device__ __forceinline__ void stream_read(const u8* __restrict__ a, long long na, const u8* __restrict__ b, long long nb, const u8* __restrict__ c,
                                            long long nc, unsigned* __restrict__ out) {
    __shared__ unsigned part[8];
    unsigned acc = xor_words<U>(a, na) ^ xor_words<U>(b, nb) ^ xor_words<U>(c, nc);
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned s = 0u;
        for (int w = 0; w < 8; ++w) s ^= part[w];
        out[blockIdx.x] = s;
    }
}

#define STREAM_READ(NAME, U)                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) quant_##NAME##_f16(const u8* __restrict__ a, long long na, const u8* __restrict__ b, \
                                                                         long long nb, const u8* __restrict__ c, long long nc,          \
                                                                         unsigned* __restrict__ out) {                                \
        stream_read<U>(a, na, b, nb, c, nc, out);                                                                                     \
    }
STREAM_READ(stream_read, 1)
STREAM_READ(stream_read_x4, 4)
STREAM_READ(stream_read_x8, 8)
