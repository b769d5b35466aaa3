// ceilings: kernels that measure what the device can do, so every other figure is a fraction
// of a measured roof rather than of a datasheet.
//
// Variants:
//   copy_float4  grid-stride 16-byte copy, four loads in flight per thread: the memory roof
//                (bytes read + bytes written), beside the driver's own memcpy.
//   fma          8 independent FMA chains per thread in registers: the FP32 roof
//                (2 flops per FMA; independent chains hide the 4-cycle FMA latency).
//   mma_sync     f16/bf16 mma.sync.m16n8k16 with fp32 accumulation, operands in registers, no
//                loads in the loop: the roof of the path the mma.sync GEMM rungs take (the
//                `tensor` roof is cuBLAS, which takes wgmma on sm_90). Eight independent
//                accumulators per warp hide the HMMA latency; consecutive HMMAs alternate
//                between two A and two B fragments of random values, so operands toggle as in
//                a GEMM, which matters once the power cap sets the clock (long runs).
//   mma_sync_w2  the same at the occupancy of the mma_warp64 GEMM rungs: one block of 8 warps
//                per SM (2 warps per scheduler), 32 accumulators per warp (a 64 x 64 warp tile's
//                HMMAs per k16 step): what that occupancy and ILP allow without any load.
//   read_scrub   not a ceiling: reads a buffer twice the L2 size before a timed repetition
//                (`--l2 clean`), so the kernel's inputs come from memory and L2 holds only clean
//                lines; zeroing the buffer instead leaves dirty lines the kernel must write back.
#include "common.cuh"

extern "C" __global__ void ceilings_read_scrub_f32(const float4* __restrict__ buf, long long n4, float* __restrict__ sink) {
    float acc = 0.f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        const float4 v = buf[i];
        acc += v.x + v.y + v.z + v.w;
    }
    if (acc != 0.f) *sink = acc;  // never true for the zeroed buffer; keeps the loads alive
}

extern "C" __global__ void ceilings_copy_float4_f32(const float* __restrict__ src, float* __restrict__ dst,
                                                    long long n) {
    long long n4 = n / 4;
    long long stride = (long long)gridDim.x * blockDim.x;
    const float4* s4 = reinterpret_cast<const float4*>(src);
    float4* d4 = reinterpret_cast<float4*>(dst);
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    // Four 16-byte loads in flight per thread before the first store.
    for (; i + 3 * stride < n4; i += 4 * stride) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = s4[i + u * stride];
#pragma unroll
        for (int u = 0; u < 4; ++u) d4[i + u * stride] = v[u];
    }
    for (; i < n4; i += stride) d4[i] = s4[i];
    long long t = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) dst[t] = src[t];
}

// Each thread: `iters` rounds of 8 FMAs. The seed comes from memory and the sum goes back so
// the compiler can neither fold nor drop the chains.
extern "C" __global__ void ceilings_fma_f32(float* __restrict__ out, int iters, float mul, float add) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    float seed = out[tid];
    float r0 = seed, r1 = seed + 1.f, r2 = seed + 2.f, r3 = seed + 3.f;
    float r4 = seed + 4.f, r5 = seed + 5.f, r6 = seed + 6.f, r7 = seed + 7.f;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            r0 = fmaf(r0, mul, add); r1 = fmaf(r1, mul, add); r2 = fmaf(r2, mul, add); r3 = fmaf(r3, mul, add);
            r4 = fmaf(r4, mul, add); r5 = fmaf(r5, mul, add); r6 = fmaf(r6, mul, add); r7 = fmaf(r7, mul, add);
        }
    }
    out[tid] = r0 + r1 + r2 + r3 + r4 + r5 + r6 + r7;
}

// Each thread: `iters` rounds of CH HMMAs on CH accumulators; writes the sum of their C fragments.
// frags: 12 registers x 32 lanes (A0 a0..a3, A1 a0..a3, B0 b0 b1, B1 b0 b1), shared by every warp.
template <typename T, int CH>
__device__ __forceinline__ void mma_sync_roof(const unsigned* __restrict__ frags, float* __restrict__ out, int iters) {
    const int lane = threadIdx.x & 31;
    unsigned a[2][4], b[2][2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[s][i] = frags[(4 * s + i) * 32 + lane];
#pragma unroll
        for (int i = 0; i < 2; ++i) b[s][i] = frags[(8 + 2 * s + i) * 32 + lane];
    }
    float c[CH][4] = {};
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int u = 0; u < CH; ++u) Mma<T>::run(c[u], a[u & 1], b[(u >> 1) & 1]);
    }
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float s = 0.f;
#pragma unroll
        for (int u = 0; u < CH; ++u) s += c[u][i];
        out[4 * t + i] = s;
    }
}

#define MMA_SYNC_ROOF(NAME, CH, MINB)                                                                                         \
    extern "C" __global__ void __launch_bounds__(256, MINB) ceilings_##NAME##_f16(const unsigned* __restrict__ frags, float* __restrict__ out, \
                                                                                 int iters) {                                 \
        mma_sync_roof<__half, CH>(frags, out, iters);                                                                         \
    }                                                                                                                         \
    extern "C" __global__ void __launch_bounds__(256, MINB) ceilings_##NAME##_bf16(const unsigned* __restrict__ frags,       \
                                                                                  float* __restrict__ out, int iters) {       \
        mma_sync_roof<__nv_bfloat16, CH>(frags, out, iters);                                                                  \
    }
MMA_SYNC_ROOF(mma_sync, 8, 4)
MMA_SYNC_ROOF(mma_sync_w2, 32, 1)
