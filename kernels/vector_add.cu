// vector_add: c = a + b, the bandwidth baseline. 12 bytes move per element (two reads, one write)
// and one flop runs, so the kernel is bound by memory at any size that leaves L2.
//
// Variants:
//   scalar            one element per thread, one 4-byte access per array: the textbook kernel.
//   float4_grid_stride 16-byte loads/stores in a grid-stride loop over a grid sized to the chip
//                     (a few blocks per SM): fewer instructions per byte, more bytes in flight.
#include "common.cuh"

extern "C" __global__ void vector_add_scalar_f32(const float* __restrict__ a, const float* __restrict__ b,
                                                 float* __restrict__ c, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void vector_add_float4_grid_stride_f32(const float* __restrict__ a,
                                                             const float* __restrict__ b,
                                                             float* __restrict__ c, long long n) {
    long long n4 = n / 4;
    long long stride = (long long)gridDim.x * blockDim.x;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* c4 = reinterpret_cast<float4*>(c);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 x = a4[i], y = b4[i];
        c4[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
    // The last n % 4 elements, by the first threads of the grid.
    long long t = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) c[t] = a[t] + b[t];
}
