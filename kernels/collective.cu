// collective: the arithmetic of the GPU ring all-reduce (lab/src/collective/nccl.rs). NCCL's
// send/recv move the segments; this kernel folds a received segment into the rank's buffer:
// acc[i] = acc[i] + x[i], summed in f32 and rounded once to the storage type (as NCCL does per hop).
// The peer ring (`ring_peer`) passes the predecessor GPU's buffer as x, read over NVLink, and
// gathers with collective_copy.
//
// 12 bytes move per f32 element (two reads, one write) against ~4 over the link, and HBM is ~10x
// faster than one NVLink direction, so the add costs ~1/3 of its segment's transfer time when run
// after it: the pipelined ring hides it behind the next segment's transfer instead.
//
// Segments start on 16-byte boundaries (the plan aligns them), so the body moves 16 bytes per
// load; the last n % V elements take a scalar tail.
#include "common.cuh"

template <typename T> struct Vec16;
template <> struct Vec16<float> { static constexpr int N = 4; };
template <> struct Vec16<__nv_bfloat16> { static constexpr int N = 8; };
template <> struct Vec16<__half> { static constexpr int N = 8; };

template <typename T> __device__ __forceinline__ T add_rounded(T a, T b) {
    return static_cast<T>(static_cast<float>(a) + static_cast<float>(b));
}
template <> __device__ __forceinline__ float add_rounded<float>(float a, float b) { return a + b; }

// One trip per thread over 16-byte words (the launch covers n / V words), then the tail.
template <typename T> __device__ __forceinline__ void add_into(T* __restrict__ acc, const T* __restrict__ x, long long n) {
    constexpr int V = Vec16<T>::N;
    const long long words = n / V;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < words) {
        uint4 a = reinterpret_cast<const uint4*>(acc)[i];
        const uint4 b = __ldcs(reinterpret_cast<const uint4*>(x) + i);  // read once: stream it
        T* pa = reinterpret_cast<T*>(&a);
        const T* pb = reinterpret_cast<const T*>(&b);
#pragma unroll
        for (int v = 0; v < V; ++v) pa[v] = add_rounded(pa[v], pb[v]);
        reinterpret_cast<uint4*>(acc)[i] = a;
    }
    const long long t = words * V + i;
    if (i < V && t < n) acc[t] = add_rounded(acc[t], x[t]);
}

extern "C" __global__ void collective_add_f32(float* __restrict__ acc, const float* __restrict__ x, long long n) {
    add_into(acc, x, n);
}
extern "C" __global__ void collective_add_bf16(__nv_bfloat16* __restrict__ acc, const __nv_bfloat16* __restrict__ x, long long n) {
    add_into(acc, x, n);
}
extern "C" __global__ void collective_add_f16(__half* __restrict__ acc, const __half* __restrict__ x, long long n) {
    add_into(acc, x, n);
}

// The peer ring's all-gather: dst[i] = src[i] over `bytes` bytes, src on another GPU. Same shape
// as the add: one 16-byte word per thread, then the last bytes % 16 one byte per thread.
extern "C" __global__ void collective_copy(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src, long long bytes) {
    const long long words = bytes / 16;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < words) reinterpret_cast<uint4*>(dst)[i] = __ldcs(reinterpret_cast<const uint4*>(src) + i);
    const long long t = words * 16 + i;
    if (i < 16 && t < bytes) dst[t] = src[t];
}
