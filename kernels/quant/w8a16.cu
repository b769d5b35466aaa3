// ---------------------------------------------------------------------------
// Q8_0 weights as GGUF stores them (lab/src/quant/ggml.rs): 34-byte blocks of an f16 scale d and
// 32 int8 codes, value q d; a row of K weights is K / 32 blocks, rows one after another. SmolLM2's
// token embedding, tied as its LM head, is such a matrix (49152 x 576). Kernels:
//   quant_w8a16_b{1,2,4,8,16}_f16   Y (f32, batch x N) = X (f16, batch x K) W^T, batch <= B
//   quant_embed_q8_0_f32            out (f32) = the rows of W at token ids
//   quant_dequant_q8_0_f16          all of W -> f16
// Values are q d as an f32 product, as the CPU computes them.
// ---------------------------------------------------------------------------
#include "pdl.cuh"

#define W8_WARPS 8
// Rows a warp owns at most (the launcher picks 1..W8_ROWS so that the grid fills the GPU).
#define W8_ROWS 16
// 16 B vectors a warp stages per step: 32 blocks (1088 B) from a 16 B boundary up to 14 B before
// them, plus the 4 B a lane's word reads may run past its block, rounded up.
#define W8_RUN_VECS 72

// The 16 B vector at byte `off` (a multiple of 16) of a buffer of `total` (even) bytes: a
// streaming load when whole, the buffer's last partial vector 2 bytes at a time, zeros past it.
__device__ __forceinline__ uint4 q8_vec(const u8* __restrict__ w, long long off, long long total) {
    if (off + 16 <= total) return __ldcs(reinterpret_cast<const uint4*>(w + off));
    unsigned v[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < 16; i += 2)
        if (off + i < total) v[i / 4] |= (unsigned)*reinterpret_cast<const unsigned short*>(w + off + i) << (8 * (i % 4));
    return make_uint4(v[0], v[1], v[2], v[3]);
}

// A lane's share of the loads of a run of `len` bytes at byte `a`: vectors lane + 32 i of the
// run's cover from the 16 B boundary at or below `a` (at most 70 of them; the rest zero).
__device__ __forceinline__ void q8_load(const u8* __restrict__ w, long long a, int len, long long total, int lane, uint4* v) {
    const long long a0 = a & ~15LL;
    const int nvec = (int)((a - a0 + len + 15) >> 4);
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        const int u = lane + 32 * i;
        v[i] = u < nvec ? q8_vec(w, a0 + 16 * u, total) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// The block at byte `off` (even) of a staged run: returns d, and its 32 codes as 8 words (4 codes
// each, lowest first). The codes start at off + 2, 4-byte aligned or 2 bytes past it: nine
// aligned shared-memory words and a funnel shift give the eight words either way.
__device__ __forceinline__ float q8_block(const u8* st, int off, unsigned* q) {
    const int e = off + 2, s = (e & 2) * 8;
    const unsigned* w = reinterpret_cast<const unsigned*>(st + (e & ~3));
    unsigned word[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) word[i] = w[i];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = __funnelshift_r(word[i], word[i + 1], s);
    return __half2float(*reinterpret_cast<const __half*>(st + off));
}

// 4 int8 codes (a word, lowest first) as floats: code + 128 lands in the low byte of 2^23's bit
// pattern through one byte permute, and subtracting 2^23 + 128 is exact (codes8's trick, signed).
__device__ __forceinline__ void s8x4(unsigned w, float* out) {
    const unsigned u = w ^ 0x80808080u;
#pragma unroll
    for (int s = 0; s < 4; ++s) out[s] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u + s)) - 8388736.f;
}

// X in shared memory: the block copies its batch x K halves once, each 32-value block of X padded
// to 40 halves, so that lanes reading consecutive blocks' 16 B land in distinct banks. (An f32
// copy, converted once, measured slower at B = 16: twice the shared-memory traffic and footprint.)
__device__ __forceinline__ int w8_xpos(int b, int kb, int c) { return (b * kb + c) * 40; }

// A warp owns `rows_per_warp` consecutive rows: rows * K / 32 consecutive blocks of W, taken 32 at
// a time. Blocks are 34 B (2-byte aligned), so a lane cannot read its own with 16 B loads; the
// warp reads each run of 32 blocks (1088 B) with coalesced 16 B loads into shared memory (every
// sector read once, whole) and each lane decodes one block from there. The next run's loads are
// issued before this run is decoded. A lane's block gives B partial dot products (f32 FMAs over
// its 32 codes, then times d); rows are runs of consecutive lanes, so a segmented shuffle sum
// leaves each row's share in its first lane, which adds it to the row's f32 accumulator in shared
// memory: a fixed order, the same result every launch.
// Napkin math, SmolLM2's LM head (N = 49152, K = 576): 30.1 MB of blocks, ~10 us at ~3 TB/s at
// B = 1. Every block reads its 32 values of X per batch row again (no reuse across rows): from
// global memory, a warp's loads at a 64 B stride would cost L1 four times the wavefronts of the
// padded shared copy. Measured on an H200, B = 1 runs at ~40% of the copy rate, issue-bound (~6.5
// instructions per weight, a third of them the int8 -> f32 conversion); at B = 16 the FMAs and
// X's shared-memory traffic bound it. Tensor cores (codes -> f16 exactly) are the next rung.
template <int B>
__device__ __forceinline__ void w8a16(const u8* __restrict__ w, const __half* __restrict__ x, float* __restrict__ y, int n_rows, int k,
                                      int batch, int rows_per_warp) {
    __shared__ uint4 stage[W8_WARPS][W8_RUN_VECS];
    __shared__ float acc[W8_WARPS][W8_ROWS * B];
    extern __shared__ uint4 w8_x[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kb = k / 32;
    __half* xs = reinterpret_cast<__half*>(w8_x);
    for (int i = threadIdx.x; i < batch * kb * 4; i += blockDim.x) {
        const int b = i / (4 * kb), c = i / 4 - b * kb, h = i % 4;
        *reinterpret_cast<uint4*>(xs + w8_xpos(b, kb, c) + 8 * h) = __ldg(reinterpret_cast<const uint4*>(x + (long long)b * k + 32 * c + 8 * h));
    }
    __syncthreads();
    const long long row_bytes = 34LL * kb, total = row_bytes * n_rows;
    const int row0 = (blockIdx.x * W8_WARPS + warp) * rows_per_warp;
    if (row0 >= n_rows) return;  // whole warps only, after the block's one barrier
    const int rows = min(rows_per_warp, n_rows - row0);
    const int nblk = rows * kb;
    const long long base = row_bytes * row0;
    float* a = acc[warp];
    for (int i = lane; i < W8_ROWS * B; i += 32) a[i] = 0.f;
    const u8* st = reinterpret_cast<const u8*>(stage[warp]);
    // Row r and block c of this lane's block run + lane, advanced 32 blocks a run without a division.
    const int rstep = 32 / kb, cstep = 32 % kb;
    int r = lane / kb, c = lane % kb;
    uint4 v[3];
    q8_load(w, base, 34 * min(32, nblk), total, lane, v);
    for (int run = 0; run < nblk; run += 32) {
        __syncwarp();  // the last run's decode is done with the stage, its sums are in acc
#pragma unroll
        for (int i = 0; i < 3; ++i)
            if (lane + 32 * i < W8_RUN_VECS) stage[warp][lane + 32 * i] = v[i];
        __syncwarp();
        if (run + 32 < nblk) q8_load(w, base + 34LL * (run + 32), 34 * min(32, nblk - run - 32), total, lane, v);
        const int row = run + lane < nblk ? r : W8_ROWS;  // past the warp's rows: a segment never stored
        float part[B];
#pragma unroll
        for (int b = 0; b < B; ++b) part[b] = 0.f;
        if (row < rows) {
            unsigned q[8];
            const float d = q8_block(st, (int)((base + 34LL * run) & 15) + 34 * lane, q);
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                float wf[8];
                s8x4(q[2 * h], wf);
                s8x4(q[2 * h + 1], wf + 4);
#pragma unroll
                for (int b = 0; b < B; ++b) {
                    if (b < batch) {
                        float xv[8];
                        load_vec16<__half>(xs + w8_xpos(b, kb, c) + 8 * h, xv);
#pragma unroll
                        for (int t = 0; t < 8; ++t) part[b] = fmaf(xv[t], wf[t], part[b]);
                    }
                }
            }
#pragma unroll
            for (int b = 0; b < B; ++b) part[b] *= d;
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int ro = __shfl_down_sync(0xffffffffu, row, o);
#pragma unroll
            for (int b = 0; b < B; ++b) {
                const float p = __shfl_down_sync(0xffffffffu, part[b], o);
                if (lane + o < 32 && ro == row) part[b] += p;
            }
        }
        const int before = __shfl_up_sync(0xffffffffu, row, 1);
        if (row < rows && (lane == 0 || before != row)) {
#pragma unroll
            for (int b = 0; b < B; ++b)
                if (b < batch) a[row * B + b] += part[b];
        }
        r += rstep;
        c += cstep;
        if (c >= kb) {
            c -= kb;
            ++r;
        }
    }
    __syncwarp();
    for (int i = lane; i < rows * B; i += 32) {
        const int rr = i / B, b = i % B;
        if (b < batch) y[(long long)b * n_rows + row0 + rr] = a[i];
    }
}

#define W8A16(B)                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * W8_WARPS) quant_w8a16_b##B##_f16(                                     \
        const u8* __restrict__ w, const __half* __restrict__ x, float* __restrict__ y, int n_rows, int k, int batch,          \
        int rows_per_warp) {                                                                                               \
        /* The block's rows are no kernel's output: asked of L2 before waiting (pdl.cuh). */                              \
        const long long r0 = (long long)blockIdx.x * W8_WARPS * rows_per_warp, rb = 34LL * (k / 32);                        \
        if (threadIdx.x == 0 && r0 < n_rows) pdl_prefetch_l2(w + r0 * rb, min((long long)W8_WARPS * rows_per_warp, n_rows - r0) * rb); \
        pdl_wait();                                                                                                        \
        w8a16<B>(w, x, y, n_rows, k, batch, rows_per_warp);                                                                \
    }

W8A16(1)
W8A16(2)
W8A16(4)
W8A16(8)
W8A16(16)

__device__ __forceinline__ void q8_put(float* p, float v) { *p = v; }
__device__ __forceinline__ void q8_put(__half* p, float v) { *p = __float2half_rn(v); }

// Rows of W, one warp per output row, grid-stride: row t of `out` is row ids[t] of W (row t when
// ids is null). Lane l writes element l of each block: the warp reads a block's 32 codes as 32
// consecutive bytes and writes 32 consecutive values. An id past the table gives a row of NaN
// (the host cannot check ids that live on the device) and reads nothing.
template <typename T>
__device__ __forceinline__ void q8_rows(const u8* __restrict__ w, const unsigned* __restrict__ ids, T* __restrict__ out, long long n_out,
                                        int k, int n_rows) {
    const int lane = threadIdx.x & 31, kb = k / 32;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long t = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < n_out; t += warps) {
        const unsigned row = ids ? ids[t] : (unsigned)t;
        T* o = out + t * k;
        if (row >= (unsigned)n_rows) {
            for (int e = lane; e < k; e += 32) q8_put(o + e, __int_as_float(0x7fc00000));
            continue;
        }
        const u8* src = w + (long long)row * 34 * kb;
        for (int c = 0; c < kb; ++c) {
            const float d = __half2float(*reinterpret_cast<const __half*>(src + 34 * c));
            q8_put(o + 32 * c + lane, __fmul_rn((float)(signed char)src[34 * c + 2 + lane], d));
        }
    }
}

extern "C" __global__ void quant_embed_q8_0_f32(const u8* __restrict__ w, const unsigned* __restrict__ ids, float* __restrict__ out, long long n_ids,
                                                int k, int n_rows) {
    q8_rows<float>(w, ids, out, n_ids, k, n_rows);
}

extern "C" __global__ void quant_dequant_q8_0_f16(const u8* __restrict__ w, __half* __restrict__ out, long long n_rows, int k) {
    q8_rows<__half>(w, nullptr, out, n_rows, k, (int)n_rows);
}
