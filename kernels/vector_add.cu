// vector_add: c = a + b, the bandwidth baseline. 12 bytes move per element (two reads, one write)
// and one flop runs, so the kernel is bound by memory at any size that leaves L2.
//
// Variants:
//   scalar             one element per thread, one 4-byte access per array: the textbook kernel.
//   float4_grid_stride 16-byte loads/stores in a grid-stride loop over a grid sized to the chip,
//                      four iterations unrolled so each thread has 8 loads (128 B) in flight
//                      before its first store: fewer instructions per byte, more bytes in flight.
//   float4_one_pass    the same loop body on a grid with one trip per thread (four float4 each):
//                      many short blocks, each reading one contiguous span, as a Triton program
//                      tiles a tensor. bias_gelu gained 6-8% of the copy ceiling this way.
#include "common.cuh"

extern "C" __global__ void vector_add_scalar_f32(const float* __restrict__ a, const float* __restrict__ b,
                                                 float* __restrict__ c, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

__device__ __forceinline__ float4 add4(float4 x, float4 y) {
    return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

// Correct for any grid: the launch decides between grid-stride and one pass.
__device__ __forceinline__ void add_float4(const float* __restrict__ a, const float* __restrict__ b,
                                           float* __restrict__ c, long long n) {
    const long long n4 = n / 4;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* c4 = reinterpret_cast<float4*>(c);
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        float4 x[4], y[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            x[u] = a4[i + u * stride];
            y[u] = b4[i + u * stride];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) c4[i + u * stride] = add4(x[u], y[u]);
    }
    for (; i < n4; i += stride) c4[i] = add4(a4[i], b4[i]);
    // The last n % 4 elements, by the first threads of the grid.
    long long t = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) c[t] = a[t] + b[t];
}

extern "C" __global__ void vector_add_float4_grid_stride_f32(const float* __restrict__ a, const float* __restrict__ b,
                                                             float* __restrict__ c, long long n) {
    add_float4(a, b, c, n);
}

extern "C" __global__ void vector_add_float4_one_pass_f32(const float* __restrict__ a, const float* __restrict__ b,
                                                          float* __restrict__ c, long long n) {
    add_float4(a, b, c, n);
}
