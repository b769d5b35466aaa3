// ceilings: kernels that measure what the device can do, so every other figure is a fraction
// of a measured roof rather than of a datasheet.
//
// Variants:
//   copy_float4  grid-stride 16-byte copy, four loads in flight per thread: the memory roof
//                (bytes read + bytes written), beside the driver's own memcpy.
//   read_float4  grid-stride 16-byte reads, four in flight per thread, each thread's wrapping
//                integer sum of its words written once (exact, so checkable): a read-only stream, which HBM serves faster than
//                a copy's even mix (vector_add's two reads per write beat the copy by 2% on an
//                H100), so the memory roof is the fastest of the copy and this.
//   fma          8 independent FMA chains per thread in registers: the FP32 roof
//                (2 flops per FMA; independent chains hide the 4-cycle FMA latency).
//   mma_sync     f16/bf16 mma.sync.m16n8k16 with fp32 accumulation, operands in registers, no
//                loads in the loop: the roof of the path the mma.sync GEMM rungs take (the
//                `tensor` roof is wgmma's, below, or cuBLAS's). Eight independent
//                accumulators per warp hide the HMMA latency; consecutive HMMAs alternate
//                between two A and two B fragments of random values, so operands toggle as in
//                a GEMM, which matters once the power cap sets the clock (long runs).
//   mma_sync_w2  the same at the occupancy of the mma_warp64 GEMM rungs: one block of 8 warps
//                per SM (2 warps per scheduler), 32 accumulators per warp (a 64 x 64 warp tile's
//                HMMAs per k16 step): what that occupancy and ILP allow without any load.
//   wgmma        sm_90a only: the `tensor` roof without a GEMM's copies. One block of two
//                warpgroups per SM (as wgmma_tma's consumers) runs rounds of the four m64n256k16
//                of a 64-deep slab on one A (128 x 64) and one B (64 x 256) tile of random values
//                written once into shared memory in the layout TMA gives the GEMM, one wgmma
//                group in flight behind the one issued. cuBLAS at the squares only bounds the
//                tensor rate from below: a long-K GEMM can run faster than both (measured: 4096 x
//                4096 x 11008 above 4096^3 and 8192^3), which made it look implausible.
//   read_scrub   not a ceiling: reads a buffer twice the L2 size before a timed repetition
//                (`--l2 clean`), so the kernel's inputs come from memory and L2 holds only clean
//                lines; zeroing the buffer instead leaves dirty lines the kernel must write back.
//   sync_step, sync_persistent  not a roof of throughput but of latency: what one grid-wide
//                dependency costs (every block of a step needs the step before), as a graph of
//                one-step kernels (sync_step) with full or programmatic edges (pdl.cuh), and as
//                one cooperative kernel with a barrier between steps (sync_persistent). A decode
//                step of a small model is ~180 such dependencies in a row.
//   sync_step_cluster  sync_step in clusters of three blocks: whether a programmatic edge lets a
//                cluster kernel start while the kernel before it runs.
#include "common.cuh"
#include "pdl.cuh"

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

extern "C" __global__ void ceilings_read_float4_f32(const uint4* __restrict__ src, long long n4, unsigned* __restrict__ sums) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0u;
    long long i = t;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = src[i + u * stride];
#pragma unroll
        for (int u = 0; u < 4; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
    }
    for (; i < n4; i += stride) {
        const uint4 v = src[i];
        acc += v.x + v.y + v.z + v.w;
    }
    sums[t] = acc;
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

// Each thread of the two consumer warpgroups: `iters` rounds of the four m64n256k16 wgmmas of a
// 64-deep slab, reading a 128 x 64 A tile (its warpgroup's 64 rows) and a 64 x 256 B tile that
// stay in shared memory, one wgmma group in flight behind the one being issued. Every thread
// writes the sum of its 128 accumulators to sums; block 0 also writes them all to tile0.
template <typename T>
__device__ __forceinline__ void wgmma_roof(const uint4* __restrict__ a, const uint4* __restrict__ b, float* __restrict__ sums,
                                           float* __restrict__ tile0, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int A_BYTES = 128 * 64 * 2, B_BOX_BYTES = WG_B_LBO;
    extern __shared__ __align__(1024) unsigned char smem[];
    require_dynamic_smem(A_BYTES + 4 * B_BOX_BYTES + 1024);
    const unsigned pad = (1024u - (smem_addr(smem) & 1023u)) & 1023u;  // wgmma's swizzle wants 1024-aligned tiles
    unsigned char* tile = smem + pad;
    // The layout TMA writes for wgmma_tma (kernels/gemm/wgmma.cu): A rows of 128 bytes; B in boxes of
    // 64 columns, rows of 128 bytes; 16-byte chunk c of row r stored at chunk c ^ (r % 8).
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) {
        const int m = i / 8, c = i % 8;
        *reinterpret_cast<uint4*>(tile + m * 128 + ((c ^ (m & 7)) << 4)) = a[i];
    }
    for (int i = threadIdx.x; i < 2048; i += blockDim.x) {
        const int k = i / 32, j = (i % 32) / 8, c = i % 8;
        *reinterpret_cast<uint4*>(tile + A_BYTES + j * B_BOX_BYTES + k * 128 + ((c ^ (k & 7)) << 4)) = b[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // make the stores visible to wgmma
    __syncthreads();
    const unsigned a0 = smem_addr(tile) + (threadIdx.x / 128) * 64 * 128, b0 = smem_addr(tile) + A_BYTES;
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.f;
    for (int it = 0; it < iters; ++it) {
        wg_pin(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) Wgmma<T, 256>::run(d, wg_desc(a0 + 32 * ks, WG_A_LBO, WG_A_SBO), wg_desc(b0 + 2048 * ks, WG_B_LBO, WG_B_SBO));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        wg_pin(d);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    wg_pin(d);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 128; ++i) s += d[i];
    sums[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (blockIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < 128; ++i) tile0[i * blockDim.x + threadIdx.x] = d[i];
    }
#else
    __trap();  // built for another target: the tensor roof offers this kernel on compute capability 9.0 only
#endif
}

extern "C" __global__ void __launch_bounds__(256, 1) ceilings_wgmma_f16(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                                                      float* __restrict__ sums, float* __restrict__ tile0, int iters) {
    wgmma_roof<__half>(a, b, sums, tile0, iters);
}
extern "C" __global__ void __launch_bounds__(256, 1) ceilings_wgmma_bf16(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                                                       float* __restrict__ sums, float* __restrict__ tile0, int iters) {
    wgmma_roof<__nv_bfloat16>(a, b, sums, tile0, iters);
}

// ---- sync: chains of grid-wide dependencies ---------------------------------------------------
// Step s of block b: thread 0 checks that block b + 1 (mod G) finished step s - 1 (its flag in
// the buffer of s's parity holds s), counting a miss in *errors, then sets its own flag for step
// s + 1 in the other buffer. Flags are 2 G words, zero before step 0.
__device__ __forceinline__ void sync_body(volatile unsigned* flags, unsigned* errors, int step) {
    if (threadIdx.x == 0) {
        const unsigned G = gridDim.x;
        if (flags[(step & 1) * G + (blockIdx.x + 1) % G] != (unsigned)step) atomicAdd(errors, 1u);
        flags[((step + 1) & 1) * G + blockIdx.x] = step + 1;
    }
}

// Spins `ns` nanoseconds of the global timer: a kernel's work without its memory traffic. (The
// timer is read here on every architecture; common.cuh's global_ns sits among the sm_90 helpers.)
__device__ __forceinline__ void spin_ns(unsigned ns) {
    if (ns == 0) return;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// A step spends `pre` ns before its wait (work that needs nothing of the kernel before, as the
// engine's weight loads) and `post` after (its own chain): with a programmatic edge the pre work
// of one kernel overlaps the post work of the one before when its blocks find room beside them.
#define SYNC_STEP(NAME, ATTRS)                                                                                           \
    extern "C" __global__ void ATTRS NAME(unsigned* flags, unsigned* errors, int step, unsigned pre, unsigned post) {    \
        spin_ns(pre);                                                                                                  \
        pdl_wait();                                                                                                    \
        spin_ns(post);                                                                                                 \
        sync_body(flags, errors, step);                                                                                \
    }
SYNC_STEP(ceilings_sync_step_f32, )
// The same launched in clusters of three blocks (as the engine's attention_o_q4_1); sm_90 only,
// which the launcher checks (before it, the symbol exists without the clusters).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SYNC_CLUSTER __cluster_dims__(3, 1, 1)
#else
#define SYNC_CLUSTER
#endif
SYNC_STEP(ceilings_sync_step_cluster_f32, SYNC_CLUSTER)

// Counter barrier (as cooperative groups' grid sync): bar[0] counts arrivals, bar[1] the
// generation. The last block to arrive resets the count before it advances the generation, so no
// block can arrive at the next barrier on a stale count. Every arrival is an atomic on one word:
// they serialize in L2.
__device__ __forceinline__ void grid_barrier_counter(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned* gen = bar + 1;
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*gen == g) {}
        }
        __threadfence();
    }
    __syncthreads();
}

// Flag barrier: block b stores generation `gen` (1, 2, ... from zeroed words) into its own word
// bar[b] with release semantics; block 0's threads each wait (acquire) on some of those words,
// then block 0 releases gen into bar[G], on which every block waits. No two blocks write one word
// and no full fence: stores and polls instead of serialized atomics.
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void grid_barrier_flags(unsigned* bar, unsigned gen) {
    const unsigned G = gridDim.x;
    __syncthreads();
    if (threadIdx.x == 0) store_release(bar + blockIdx.x, gen);
    if (blockIdx.x == 0) {
        for (unsigned i = threadIdx.x; i < G; i += blockDim.x)
            while (load_acquire(bar + i) < gen) {}
        __syncthreads();
        if (threadIdx.x == 0) store_release(bar + G, gen);
    }
    if (threadIdx.x == 0)
        while (load_acquire(bar + G) < gen) {}
    __syncthreads();
}

// Every step in one kernel, with barrier 1 (counter) or 2 (flags) between steps; 0 leaves the
// barriers out: the fault the check must catch. bar holds G + 1 words, zero at launch.
extern "C" __global__ void ceilings_sync_persistent_f32(unsigned* flags, unsigned* errors, unsigned* bar, int steps, int barrier) {
    for (int s = 0; s < steps; ++s) {
        sync_body(flags, errors, s);
        if (barrier == 1) grid_barrier_counter(bar);
        if (barrier == 2) grid_barrier_flags(bar, s + 1);
    }
}
