// ceilings: kernels that measure what the device can do, so every other figure is a fraction
// of a measured roof rather than of a datasheet.
//
// Variants:
//   copy_float4  grid-stride 16-byte copy, four loads in flight per thread: the memory roof
//                (bytes read + bytes written), beside the driver's own memcpy.
//   fma          8 independent FMA chains per thread in registers: the FP32 roof
//                (2 flops per FMA; independent chains hide the 4-cycle FMA latency).
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
