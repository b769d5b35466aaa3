// kernels/quant/: 4-bit weights and GGUF's Q8_0 (lab/src/ops/quant, the library in lab/src/quant).
// The files are one source, concatenated in the order lab/src/family.rs lists them:
// pack_dequant.cu, w4a16.cu, w4a16_mma.cu (the tensor-core warp step every later file uses),
// w4a16_mma_tiled.cu, w4a16_mma_rings.cu, w4a16_mma_splitk.cu, w4a16_mma_pipelined.cu,
// stream_read.cu, w8a16.cu. Every symbol ends in its activation or output type (_f16, and _f32 for
// the Q8_0 row gather); W4A16 kernels are <design>_{sym,asym}_b{1,2,4,8,16}_f16
// (lab/src/ops/quant/variants.rs builds the names).
// One line per variant of the table:
//   pack_int4                codes (one per byte) -> two per byte, low nibble first: 2 x 16 B loads, 16 B store
//   unpack_int4              the inverse, staged per warp (below): coalesced 16 B loads and stores
//   dequant                  group-wise sym ((q - 8) d) / asym (q d + m) codes + f16 scales, or GGUF Q4_0 / Q4_1 blocks -> f16, staged per warp;
//                            Q8_0 blocks -> f16 a warp per row (w8a16.cu)
//   dequant_cp_async         GGUF blocks, 64 per warp step staged with cp.async: every copy in flight at once, only 16 B stores
//   w4a16                    CUDA cores: a block owns 4 rows, K split across its threads in 4 B code words, all loads before any arithmetic
//   w4a16_mma                tensor cores: 16-row tiles, K over 4 warps, 4 steps of 16 B streaming loads in flight, one wave
//   w4a16_mma_splitk         w4a16_mma with K split over blocks too: one load round per warp, partials summed by the tile's last block
//   w4a16_mma_pipelined      the warp step decoding from shared memory: persistent 8-warp blocks, an 8-stage cp.async.cg ring
//   w4a16_mma_occ8           w4a16_mma with K over 8 warps, 2 steps in flight, 64 registers
//   w4a16_mma_tiled          occ8 reading W in the tile layout (lab/src/quant/tiles.rs): every warp load 512 contiguous bytes
//   w4a16_mma_tiled_rolling  tiled, each load slot refilled as soon as its step is decoded
//   w4a16_mma_tiled_async    tiled, each lane's loads through a per-warp cp.async ring in shared memory
//   w4a16_mma_tiled_prefetch tiled, the next round bulk-prefetched into L2
//   w4a16_mma_tiled_post     tiled, the scales applied after the MMAs (sym, group % 128 == 0)
//   w4a16_mma_tiled_sweep    tiled_post, the block's warps taking its tile's steps in turn (step-major layout)
//   w4a16_mma_tiled_sweep4   tiled_sweep on 4 warps at 128 registers, 3-4 steps per warp rolling
//   w4a16_mma_tiled_bulk     tiled_sweep, each warp's steps copied by TMA into a 4-slot ring (sm_90)
//   stream_read              the floor: reads a W4A16 kernel's bytes once and decodes nothing
//   stream_read_x4, _x8      the floor with 4 or 8 loads in flight per thread
//   w8a16                    Q8_0 blocks as stored x f16 -> f32: a warp stages runs of 32 blocks with 16 B loads, one block per lane
//   embed                    Q8_0 rows at token ids -> f32, a warp per row
// "Staged per warp": a warp reads 32 x 16 B of input with coalesced loads into shared memory,
// then each lane turns the slice that maps to ITS 16 B of output into values, so the 2-4x wider
// output is also written with consecutive lanes on consecutive 16 B (without staging, each lane
// would write 32-64 contiguous bytes and every store instruction would touch half-sectors).
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
// zero-filled by cp_async16_tail, never read past the end. (Loading the 3 vectors into
// registers first does not work: at 32 registers ptxas stages the first before issuing the third.)
// And every output store is one 16 B vector (store8_v4), where the loop above writes a quarter
// of its output in 4-byte stores. ptxas -v, sm_90: 32 registers (8 blocks of 256 per SM, as the
// 32-block loop), 9216 / 10240 B of static smem (Q4_0 / Q4_1), no spills.
#define GGML_SEGS 2
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}

// A 16 B slot filled from the `bytes` (0..16) left before the end of a buffer, the rest zero.
// cp.async reads only src-size bytes, but compute-sanitizer's memcheck checks its whole 16 B
// source window against the allocation: a last, partial vector is loaded byte by byte and
// stored instead (once per buffer; the barrier that publishes the stage publishes it too).
__device__ __forceinline__ void cp_async16_tail(void* dst, const void* src, int bytes) {
    if (bytes >= 16 || bytes <= 0) {
        cp_async16(dst, src, bytes > 0 ? 16 : 0);
        return;
    }
    const u8* p = static_cast<const u8*>(src);
    unsigned w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < 16; ++i)
        if (i < bytes) w[i / 4] |= (unsigned)p[i] << (8 * (i % 4));
    *static_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
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
            if (u < NVEC && off < total) cp_async16_tail(&stage[warp][u], blocks + off, (int)min(16LL, total - off));
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
