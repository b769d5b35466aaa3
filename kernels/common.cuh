// common.cuh: device helpers shared by every kernel family.
// Compiled at run time by NVRTC (no math.h, no host code), for sm_80 and sm_90.
#ifndef LAB_KERNELS_COMMON_CUH
#define LAB_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// NVRTC has no math.h, so no INFINITY: build -inf from its bit pattern.
#ifndef NEG_INF
#define NEG_INF (__int_as_float((int)0xff800000u))
#endif

__device__ __forceinline__ float neg_inf() { return NEG_INF; }

// ---------------------------------------------------------------------------
// NaN-propagating max. fmaxf(NaN, x) returns x, so a plain fmaxf reduction
// would turn a row of [NaN, -inf] into max = -inf, which the "fully masked row
// -> zeros" guard would then silently hide. max.NaN (PTX 7.0, sm_80+) returns
// NaN if either input is NaN, so NaN reaches every statistic.
// ---------------------------------------------------------------------------
__device__ __forceinline__ float fmax_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return (a != a || b != b) ? a + b : fmaxf(a, b);
#endif
}

// Max used as the exp() shift: -inf (fully masked so far) becomes 0 so that
// x - m never computes (-inf) - (-inf) = NaN; exp(-inf - 0) = 0 as wanted.
__device__ __forceinline__ float safe_shift(float m) { return m == NEG_INF ? 0.f : m; }

// ---------------------------------------------------------------------------
// Warp reductions: xor butterfly, full mask (0xffffffff), so every lane ends
// with the result (all 32 lanes must call them).
// ---------------------------------------------------------------------------
__device__ __forceinline__ float warp_reduce_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_reduce_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---------------------------------------------------------------------------
// Block reductions for blockDim.x a multiple of 32, up to 1024 (<= 32 warps,
// hence a 32-entry scratch). Every thread of the block must call them.
// The leading __syncthreads makes back-to-back calls safe (a fast warp cannot
// overwrite scratch while a slow warp still reads the previous result); every
// warp then reduces the 32 partials itself, which broadcasts the result
// without a third barrier.
// ---------------------------------------------------------------------------
__device__ __forceinline__ float block_reduce_max(float v) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_reduce_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : NEG_INF;
    return warp_reduce_max(v);
}

__device__ __forceinline__ float block_reduce_sum(float v) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_reduce_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.f;
    return warp_reduce_sum(v);
}

// ---------------------------------------------------------------------------
// Online softmax statistics (Milakov & Gimelshein 2018): m = running max,
// d = sum of exp(x - m). Identity is {-inf, 0}.
// ---------------------------------------------------------------------------
struct MaxSum {
    float m;
    float d;
};

__device__ __forceinline__ MaxSum maxsum_identity() {
    MaxSum r;
    r.m = NEG_INF;
    r.d = 0.f;
    return r;
}

// Rescale both sums to the common max. The side holding the larger max has
// weight exactly 1, so only exp(smaller - larger) is computed: one exp per
// combine (this sits on the latency chain of every log-depth reduction).
// Both maxes -inf: the shift is 0, e = exp(-inf) = 0, d = 0 and m stays -inf
// (no (-inf) - (-inf) = NaN). One max -inf: its weight is 0. A NaN max makes
// e NaN (fminf may drop the NaN, but the shift keeps it), so d is NaN; +inf
// inputs already carry d = NaN from exp(inf - inf).
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
    const float m = fmax_nan(a.m, b.m);
    const float e = expf(fminf(a.m, b.m) - safe_shift(m));
    MaxSum r;
    r.m = m;
    r.d = a.m >= b.m ? a.d + b.d * e : a.d * e + b.d;
    return r;
}

// Fold N values into a running MaxSum with a single rescale per chunk
// (1 + 1/N exps per element instead of 2). Pad unused slots with -inf.
template <int N>
__device__ __forceinline__ void online_update(MaxSum& st, const float* v) {
    float cm = v[0];
#pragma unroll
    for (int i = 1; i < N; ++i) cm = fmax_nan(cm, v[i]);
    const float m = fmax_nan(st.m, cm);
    const float s = safe_shift(m);
    float d = st.d * expf(st.m - s);
#pragma unroll
    for (int i = 0; i < N; ++i) d += expf(v[i] - s);
    st.m = m;
    st.d = d;
}

__device__ __forceinline__ MaxSum warp_reduce_maxsum(MaxSum v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum other;
        other.m = __shfl_xor_sync(0xffffffffu, v.m, o);
        other.d = __shfl_xor_sync(0xffffffffu, v.d, o);
        v = combine(v, other);
    }
    return v;
}

// Same contract as block_reduce_max / block_reduce_sum.
__device__ __forceinline__ MaxSum block_reduce_maxsum(MaxSum v) {
    __shared__ MaxSum scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_reduce_maxsum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : maxsum_identity();
    return warp_reduce_maxsum(v);
}

// 1/sum for the final normalisation; a fully masked row (max == -inf, sum 0)
// gets 0 so it writes zeros instead of 0/0. NaN statistics stay NaN.
__device__ __forceinline__ float safe_inv_sum(float m, float d) {
    return m == NEG_INF ? 0.f : 1.f / d;
}

// ---------------------------------------------------------------------------
// Storage <-> fp32 converters. Arithmetic is always fp32.
// ---------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
// Round to nearest even (NaN stays NaN), the same as a CPU bf16::from_f32.
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
// Round to nearest even; overflow gives +-inf, NaN stays NaN.
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// ---------------------------------------------------------------------------
// 16-byte vector access: VecTraits<T>::N elements per 16 B (4 f32, 8 bf16).
// The pointer must be 16-byte aligned (callers only vectorise when the row
// length is a multiple of N and the base is 256-byte aligned).
// ---------------------------------------------------------------------------
template <typename T> struct VecTraits;
// enum, not static constexpr: NVRTC would emit the latter as a .global symbol.
template <> struct VecTraits<float> { enum { N = 4 }; };
template <> struct VecTraits<__nv_bfloat16> { enum { N = 8 }; };
template <> struct VecTraits<__half> { enum { N = 8 }; };

template <typename T> __device__ __forceinline__ void load_vec16(const T* p, float* out);
template <typename T> __device__ __forceinline__ void store_vec16(T* p, const float* in);

template <> __device__ __forceinline__ void load_vec16<float>(const float* p, float* out) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
}
template <> __device__ __forceinline__ void store_vec16<float>(float* p, const float* in) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
}

// bf16 -> f32 is exact: the bf16 bits are the top half of the f32 bits
// (element 2k is the low half of 32-bit word k, little endian).
template <> __device__ __forceinline__ void load_vec16<__nv_bfloat16>(const __nv_bfloat16* p, float* out) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half)
    return *reinterpret_cast<const unsigned*>(&h);
}
template <> __device__ __forceinline__ void store_vec16<__nv_bfloat16>(__nv_bfloat16* p, const float* in) {
    uint4 v;
    v.x = pack_bf16x2(in[0], in[1]);
    v.y = pack_bf16x2(in[2], in[3]);
    v.z = pack_bf16x2(in[4], in[5]);
    v.w = pack_bf16x2(in[6], in[7]);
    *reinterpret_cast<uint4*>(p) = v;
}

// f16 <-> f32 is exact one way (every f16 is an f32); f32 -> f16 rounds to
// nearest even. Same word layout as bf16: element 2k is the low half of word k.
template <> __device__ __forceinline__ void load_vec16<__half>(const __half* p, float* out) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);  // .x = lo (low half)
    return *reinterpret_cast<const unsigned*>(&h);
}
template <> __device__ __forceinline__ void store_vec16<__half>(__half* p, const float* in) {
    uint4 v;
    v.x = pack_f16x2(in[0], in[1]);
    v.y = pack_f16x2(in[2], in[3]);
    v.z = pack_f16x2(in[4], in[5]);
    v.w = pack_f16x2(in[6], in[7]);
    *reinterpret_cast<uint4*>(p) = v;
}

// W consecutive elements: one 16 B vector (W == VecTraits<T>::N) or a single
// element (W == 1); lets one loop body serve both the vector and scalar paths.
template <typename T, int W>
__device__ __forceinline__ void load_w(const T* p, float* out) {
    if (W == 1) {
        out[0] = to_float(*p);
    } else {
        load_vec16<T>(p, out);
    }
}
template <typename T, int W>
__device__ __forceinline__ void store_w(T* p, const float* in) {
    if (W == 1) {
        *p = from_float<T>(in[0]);
    } else {
        store_vec16<T>(p, in);
    }
}

// ---------------------------------------------------------------------------
// Division and 1/sqrt without subroutine calls. '/' and sqrtf compile to a
// fast path plus a CALL to a slow-path routine (denormal / special inputs);
// the call clobbers registers, so a kernel that holds a row in registers
// across it spills at a 32-register cap. These use the same hardware
// approximations (MUFU.RCP / MUFU.RSQ) with one Newton step and fused
// residuals: about 1 ulp from the IEEE result at most (not bit-identical in
// general), no call.
// ---------------------------------------------------------------------------
// 1/c for normal c with |c| < 2^126 (e.g. a row length).
__device__ __forceinline__ float rcp_nocall(float c) {
    const float r = __fdividef(1.0f, c);
    return fmaf(r, fmaf(-c, r, 1.0f), r);
}

// s/c given r = rcp_nocall(c): one residual correction of s*r.
__device__ __forceinline__ float div_nocall(float s, float c, float r) {
    const float q = s * r;
    return fmaf(fmaf(-q, c, s), r, q);
}

// 1/sqrt(x). Special inputs as 1.0f / sqrtf(x): 0 -> inf, inf -> 0,
// NaN or x < 0 -> NaN (the raw approximation already gives those).
__device__ __forceinline__ float rsqrt_nocall(float x) {
    const float y = rsqrtf(x);
    const float e = fmaf(-x * y, y, 1.0f);  // 1 - x*y^2
    const float r = fmaf(0.5f * y, e, y);
    return (x > 0.f && x < __int_as_float(0x7f800000)) ? r : y;
}

// ---------------------------------------------------------------------------
// Welford / Chan statistics: n = count, mean, m2 = sum of squared deviations
// from mean. Identity is {0, 0, 0}. combine() is Chan et al.'s parallel
// merge; the count is a float (exact up to 2^24 elements per partial).
// ---------------------------------------------------------------------------
struct Welford {
    float n;
    float mean;
    float m2;
};

__device__ __forceinline__ Welford welford_identity() {
    Welford r;
    r.n = 0.f;
    r.mean = 0.f;
    r.m2 = 0.f;
    return r;
}

// Not commutative in rounding: callers that need every lane to agree must
// pass the operands in the same order on both sides (see warp_reduce_welford).
// An empty side returns the other unchanged (no 0/0).
__device__ __forceinline__ Welford welford_combine(Welford a, Welford b) {
    const float n = a.n + b.n;
    if (b.n == 0.f) return a;
    if (a.n == 0.f) return b;
    const float f = b.n / n;
    const float delta = b.mean - a.mean;
    Welford r;
    r.n = n;
    r.mean = a.mean + delta * f;
    r.m2 = a.m2 + b.m2 + delta * delta * a.n * f;
    return r;
}

// Xor butterfly; the lower lane's value always goes first, so both partners
// compute the same rounding and every lane ends with bit-identical statistics.
__device__ __forceinline__ Welford warp_reduce_welford(Welford v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        Welford other;
        other.n = __shfl_xor_sync(0xffffffffu, v.n, o);
        other.mean = __shfl_xor_sync(0xffffffffu, v.mean, o);
        other.m2 = __shfl_xor_sync(0xffffffffu, v.m2, o);
        v = (lane & o) ? welford_combine(other, v) : welford_combine(v, other);
    }
    return v;
}

// GeLU in fp32, shared by bias_gelu and linear's epilogue. Written as FMAs:
// h (1 + t) = fma(h, t, h) and c (v + a v^3) = v fma(v^2, c a, c) save two instructions per
// element, which counts where 16-bit inputs make an elementwise kernel issue-bound.
// tanhf / erff are the accurate libdevice versions.
#define GELU_C 0.7978845608f   // sqrt(2 / pi)
#define GELU_A 0.044715f
__device__ __forceinline__ float gelu_tanh(float v) {
    const float h = 0.5f * v;
    return fmaf(h, tanhf(v * fmaf(v * v, GELU_C * GELU_A, GELU_C)), h);
}
__device__ __forceinline__ float gelu_erf(float v) {
    const float h = 0.5f * v;
    return fmaf(h, erff(v * 0.70710678f), h);
}
// d/dv of gelu_tanh: 0.5 (1 + t) + 0.5 v (1 - t^2) c (1 + 3 a v^2).
__device__ __forceinline__ float gelu_tanh_grad(float v) {
    const float t = tanhf(v * fmaf(v * v, GELU_C * GELU_A, GELU_C));
    return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * GELU_C * fmaf(3.f * GELU_A, v * v, 1.f);
}

// ---------------------------------------------------------------------------
// Split-K across blocks (gemm's mma_splitk, quant's w4a16_mma_splitk): once a block has written
// its partials, every thread calls this; it publishes them, counts the block in on `counter`,
// and returns true in the block that arrives last of `slices` (after a fence, so that block
// sees every slice's partials), which then sums them and resets the counter.
// ---------------------------------------------------------------------------
__device__ __forceinline__ bool last_to_arrive(unsigned* counter, int slices) {
    __shared__ unsigned last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == (unsigned)(slices - 1);
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

// ---------------------------------------------------------------------------
// Shared-memory rings filled by the copy engine (TMA): shared-memory addresses, mbarriers and
// 1D bulk copies, for gemm's wgmma_tma and quant's tiled_bulk. The mbarrier helpers and bulk_load
// need sm_90.
// ---------------------------------------------------------------------------
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// Traps unless the launch gave at least `need` bytes of dynamic shared memory: a launcher whose
// size disagrees with the kernel's ring faults loudly instead of corrupting memory.
__device__ __forceinline__ void require_dynamic_smem(unsigned need) {
    unsigned dyn_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_smem));
    if (dyn_smem < need) __trap();
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spins until the phase of parity `parity` has completed. A ring that never completes (a wrong
// byte count, a lost arrival) traps after 2^26 failed polls (at least ~0.5 s of polling, at most
// about a minute if every try_wait sleeps its full time limit), far beyond any legitimate wait of
// a ring (microseconds): a launch error instead of a hung process. One add per failed poll.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done, polls = 0;
    do {
        if (++polls == (1u << 26)) __trap();
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// Has the phase of parity `parity` completed? Never blocks (mbarrier.test_wait).
__device__ __forceinline__ bool mbar_test(unsigned bar, unsigned parity) {
    unsigned done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done;
}
// True in exactly one lane of the (converged) warp (elect.sync).
__device__ __forceinline__ bool elect_one() {
    unsigned one;
    asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(one));
    return one;
}
// mbar_wait for a waiter whose SM has other warps to issue: each try_wait may suspend the thread
// for up to 10 ms (the hint CUTLASS passes) instead of the system's default time limit, so that
// a warp waiting on its ring is woken when the phase completes rather than polling. A wait that
// lasts more than a second (%globaltimer, read only once a first try has failed) traps.
__device__ __forceinline__ bool mbar_try_sleep(unsigned bar, unsigned parity) {
    unsigned done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity), "n"(10000000)
        : "memory");
    return done;
}
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void mbar_sleep(unsigned bar, unsigned parity) {
    if (mbar_try_sleep(bar, parity)) return;
    const unsigned long long t0 = global_ns();
    while (!mbar_try_sleep(bar, parity))
        if (global_ns() - t0 > 1000000000ull) __trap();
}
// `bytes` (a multiple of 16) from global src to shared dst (both 16-byte aligned); completion
// adds them to mbarrier `bar`'s transaction count.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src), "r"(bytes),
                 "r"(bar)
                 : "memory");
}
#endif

// mma.sync m16n8k16, fp32 accumulate: C (4 floats) += A (4 regs) B (2 regs), f16 or bf16
// operands (fragment layouts: kernels/gemm/mma_sync.cu).
#define MMA_16816(TY)                                                                                               \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                               \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
template <typename T> struct Mma;
template <> struct Mma<__half> {
    static __device__ __forceinline__ void run(float* c, const unsigned* a, const unsigned* b) { MMA_16816("f16"); }
};
template <> struct Mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float* c, const unsigned* a, const unsigned* b) { MMA_16816("bf16"); }
};

// ---------------------------------------------------------------------------
// wgmma (sm_90a): warpgroup MMAs reading both operands from 128-byte-swizzled shared memory
// through 64-bit descriptors, fp32 accumulate; for gemm's wgmma rungs and the tensor roof of
// ceilings.cu. Operand layouts: kernels/gemm/wgmma.cu (wgmma_tma).
// ---------------------------------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The 64-bit shared-memory matrix descriptor: start address >> 4 (bits 0-13), leading byte offset
// >> 4 (16-29), stride byte offset >> 4 (32-45), base offset 0 (49-51: tiles are 1024-byte
// aligned), swizzle mode 1 = 128-byte (62-63).
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

// Descriptor byte offsets of tiles laid out as TMA writes them with the 128-byte swizzle: A
// K-major (leading offset unused, encoded 16; 8-row groups 1024 bytes apart), B N-major in boxes
// of 64 columns (8 KiB from one box to the next; 8 k-rows 1024 bytes apart).
constexpr unsigned WG_A_LBO = 16, WG_A_SBO = 1024, WG_B_LBO = 64 * 64 * 2, WG_B_SBO = 1024;

#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D32 WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
#define WG_D64 WG_D32, WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
#define WG_D128 WG_D64, WG_D8(64), WG_D8(72), WG_D8(80), WG_D8(88), WG_D8(96), WG_D8(104), WG_D8(112), WG_D8(120)
#define WG_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS64 WG_REGS32 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REGS128 WG_REGS64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// d (N / 2 floats per thread) += A (64x16, K-major) * B (16xN, N-major): scale-d 1, scale-a/b 1,
// transpose A 0, B 1. DA, DB, ONE: the operand numbers that follow the N / 2 accumulators.
#define WGMMA_M64NK16(N, TY, DREGS, REGS, DA, DB, ONE)                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ONE ", 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" REGS "}, " DA ", " DB ", p, 1, 1, 0, 1;\n}\n" \
                 : DREGS                                                                                  \
                 : "l"(da), "l"(db), "r"(1)                                                               \
                 : "memory")
#define WGMMA_TYPE(T, TY)                                                                                   \
    template <> struct Wgmma<T, 256> {                                                                      \
        static __device__ __forceinline__ void run(float (&d)[128], unsigned long long da, unsigned long long db) { \
            WGMMA_M64NK16(256, TY, WG_D128, WG_REGS128, "%128", "%129", "%130");                           \
        }                                                                                                   \
    };                                                                                                      \
    template <> struct Wgmma<T, 128> {                                                                      \
        static __device__ __forceinline__ void run(float (&d)[64], unsigned long long da, unsigned long long db) {  \
            WGMMA_M64NK16(128, TY, WG_D64, WG_REGS64, "%64", "%65", "%66");                                 \
        }                                                                                                   \
    };                                                                                                      \
    template <> struct Wgmma<T, 64> {                                                                       \
        static __device__ __forceinline__ void run(float (&d)[32], unsigned long long da, unsigned long long db) {  \
            WGMMA_M64NK16(64, TY, WG_D32, WG_REGS32, "%32", "%33", "%34");                                  \
        }                                                                                                   \
    };
// Wgmma<T, N>::run(d, da, db): one m64nNk16 of a warpgroup, N = 256, 128 or 64.
template <typename T, int N> struct Wgmma;
WGMMA_TYPE(__half, "f16")
WGMMA_TYPE(__nv_bfloat16, "bf16")

// Pins the accumulators at this point of the instruction stream, so that the compiler neither
// reads them before the wgmma that writes them has been waited for nor moves writes across.
template <int R>
__device__ __forceinline__ void wg_pin(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#endif

#endif  // LAB_KERNELS_COMMON_CUH
