// loader: the work a training step does on a batch lab::data delivered, of a length set by the
// caller, so that the loader's overlap with compute can be measured against a known time.
//
// Variants:
//   consume  reads the batch once (16 B per load, grid-stride) into eight FMA chains per thread,
//            then runs `iters` dependent FMA rounds on them: the time grows with iters and barely
//            with the batch, and every byte of the batch is read on the compute stream.
#include "common.cuh"

extern "C" __global__ void loader_consume_f32(const uint4* __restrict__ data, long long words,
                                              float* __restrict__ out, int iters) {
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j] = 1e-3f * j;
    for (long long i = tid; i < words; i += stride) {
        const uint4 v = data[i];
        acc[0] += (float)(v.x & 0xff);
        acc[1] += (float)(v.y & 0xff);
        acc[2] += (float)(v.z & 0xff);
        acc[3] += (float)(v.w & 0xff);
    }
    // A fixed point at 1 (as the ceilings' FMA chain): bounded values however long.
    for (int k = 0; k < iters; k++) {
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = fmaf(acc[j], 0.9999f, 1e-4f);
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) s += acc[j];
    out[tid] = s;
}
