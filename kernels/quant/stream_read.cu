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
