// divergence: what a warp pays when its lanes disagree. Every element runs the same dependent
// chain of `iters` FMAs, x = x * a + b, with constants (a, b) chosen by a path id: the work per
// element is identical on every path, so any slowdown is the warp running paths one after another.
//
// Variants:
//   paths_branch  lane l of each warp takes path l % k through a 32-way switch whose cases are
//                 separate loops: a warp with k distinct paths executes k loops back to back with
//                 the other lanes masked off. Ideal model: time grows like k.
//   paths_select  the same arithmetic, the path's constants computed instead of branched to:
//                 control divergence turned into data, one loop per warp whatever k is.
//   data_branch   if (x > 0) loop A else loop B, on the element's own value: warps are uniform on
//                 sorted input and split (both loops run) on shuffled input.
//   data_select   the divergence-free rewrite of data_branch: select the constants, run one loop.
// Branch and select variants compute bit-identical results (same fmaf, same constants).
#include "common.cuh"

// Path p's constants: a in [0.5, 1) keeps the chain bounded; both exact in f32 for p < 32.
#define PATH_A(p) (0.5f + 0.015625f * (float)(p))
#define PATH_B(p) (0.0009765625f * (float)((p) + 1))
#define CHAIN(A, B)                                               \
    for (int it = 0; it < iters; ++it) x = fmaf(x, (A), (B));

#define PATH_CASE(p) \
    case p:          \
        CHAIN(PATH_A(p), PATH_B(p)) break;

extern "C" __global__ void divergence_paths_branch_f32(const float* __restrict__ in, float* __restrict__ out,
                                                       long long n, int k, int iters) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i];
    switch ((threadIdx.x & 31) % k) {
        PATH_CASE(0) PATH_CASE(1) PATH_CASE(2) PATH_CASE(3) PATH_CASE(4) PATH_CASE(5) PATH_CASE(6) PATH_CASE(7)
        PATH_CASE(8) PATH_CASE(9) PATH_CASE(10) PATH_CASE(11) PATH_CASE(12) PATH_CASE(13) PATH_CASE(14) PATH_CASE(15)
        PATH_CASE(16) PATH_CASE(17) PATH_CASE(18) PATH_CASE(19) PATH_CASE(20) PATH_CASE(21) PATH_CASE(22) PATH_CASE(23)
        PATH_CASE(24) PATH_CASE(25) PATH_CASE(26) PATH_CASE(27) PATH_CASE(28) PATH_CASE(29) PATH_CASE(30) PATH_CASE(31)
    }
    out[i] = x;
}

extern "C" __global__ void divergence_paths_select_f32(const float* __restrict__ in, float* __restrict__ out,
                                                       long long n, int k, int iters) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i];
    const int p = (threadIdx.x & 31) % k;
    const float a = PATH_A(p), b = PATH_B(p);
    CHAIN(a, b)
    out[i] = x;
}

// Two data-dependent paths: path 1 for positive elements, path 0 otherwise.
extern "C" __global__ void divergence_data_branch_f32(const float* __restrict__ in, float* __restrict__ out,
                                                      long long n, int k, int iters) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i];
    if (x > 0.f) {
        CHAIN(PATH_A(1), PATH_B(1))
    } else {
        CHAIN(PATH_A(0), PATH_B(0))
    }
    out[i] = x;
}

extern "C" __global__ void divergence_data_select_f32(const float* __restrict__ in, float* __restrict__ out,
                                                      long long n, int k, int iters) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i];
    const int p = x > 0.f ? 1 : 0;
    const float a = PATH_A(p), b = PATH_B(p);
    CHAIN(a, b)
    out[i] = x;
}
