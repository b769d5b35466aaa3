// linear: Y = act(X W^T + b) and its backward, with the matrix products in cuBLAS and the rest
// here. X is [M, K], W is [N, K] (PyTorch's layout), b is [N]; Z = X W^T + b is kept for the
// backward pass. Storage T in {float, bf16}, arithmetic fp32.
//
// Kernels (the launcher in lab/src/ops/linear.rs orders them around the GEMMs):
//   bias_act_<act>        epilogue after the forward GEMM: z += b (in place), y = act(z); act in
//                         none, relu, gelu (tanh form). One read of the GEMM output, two writes
//                         (z for backward, y): the HBM round trip cuBLASLt's fused epilogue saves.
//                         Grid-stride, block (256,1,1), grid min(sm_count*8, ceil(n/256)).
//   act_backward_<act>    dz = dy * act'(z): one elementwise pass, same launch.
//   bias_grad_partial     db without atomics, stage 1: block (32,8,1) owns 32 columns of one slab
//                         of rows; its 8 row lanes stride the slab and a shared-memory tree sums
//                         them into partial[slab][col] (fp32). grid (ceil(N/32), slabs, 1).
//   bias_grad_final       stage 2: one thread per column adds the slabs in order. Deterministic:
//                         the same inputs give the same bits, run after run.
#include "common.cuh"

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_GELU 2

template <int ACT>
__device__ __forceinline__ float act_fwd(float v) {
    if (ACT == ACT_RELU) return v > 0.f ? v : 0.f;
    if (ACT == ACT_GELU) return gelu_tanh(v);
    return v;
}

template <int ACT>
__device__ __forceinline__ float act_grad(float v) {
    if (ACT == ACT_RELU) return v > 0.f ? 1.f : 0.f;
    if (ACT == ACT_GELU) return gelu_tanh_grad(v);
    return 1.f;
}

template <typename T, int ACT>
__device__ __forceinline__ void bias_act(T* __restrict__ z, const T* __restrict__ b, T* __restrict__ y,
                                         long long rows, int cols) {
    const long long n = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        // z is rounded to T once, as stored: y is computed from the stored z, so backward sees
        // exactly the pre-activation forward used.
        const T zt = from_float<T>(to_float(z[i]) + to_float(b[i % cols]));
        z[i] = zt;
        y[i] = from_float<T>(act_fwd<ACT>(to_float(zt)));
    }
}

template <typename T, int ACT>
__device__ __forceinline__ void act_backward(const T* __restrict__ dy, const T* __restrict__ z, T* __restrict__ dz,
                                             long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        dz[i] = from_float<T>(to_float(dy[i]) * act_grad<ACT>(to_float(z[i])));
    }
}

template <typename T>
__device__ __forceinline__ void bias_grad_partial(const T* __restrict__ dz, float* __restrict__ partial, int rows,
                                                  int cols, int rows_per_slab) {
    __shared__ float acc[8][33];  // +1 column: no bank conflicts on the transposed reads
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int start = blockIdx.y * rows_per_slab;
    const int end = min(rows, start + rows_per_slab);
    float s = 0.f;
    if (col < cols) {
        for (int r = start + threadIdx.y; r < end; r += 8) s += to_float(dz[(size_t)r * cols + col]);
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float t = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) t += acc[k][threadIdx.x];
        partial[(size_t)blockIdx.y * cols + col] = t;
    }
}

template <typename T>
__device__ __forceinline__ void bias_grad_final(const float* __restrict__ partial, T* __restrict__ db, int slabs,
                                                int cols) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float s = 0.f;
    for (int k = 0; k < slabs; ++k) s += partial[(size_t)k * cols + col];
    db[col] = from_float<T>(s);
}

#define LINEAR_ACT(NAME, ACT, T, DT)                                                                       \
    extern "C" __global__ void linear_bias_act_##NAME##_##DT(T* z, const T* b, T* y, long long rows,       \
                                                             int cols) {                                   \
        bias_act<T, ACT>(z, b, y, rows, cols);                                                             \
    }                                                                                                      \
    extern "C" __global__ void linear_act_backward_##NAME##_##DT(const T* dy, const T* z, T* dz,           \
                                                                 long long n) {                            \
        act_backward<T, ACT>(dy, z, dz, n);                                                                \
    }

#define LINEAR_DTYPE(T, DT)                                                                                \
    LINEAR_ACT(none, ACT_NONE, T, DT)                                                                      \
    LINEAR_ACT(relu, ACT_RELU, T, DT)                                                                      \
    LINEAR_ACT(gelu, ACT_GELU, T, DT)                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                      \
        linear_bias_grad_partial_##DT(const T* dz, float* partial, int rows, int cols, int rows_per_slab) { \
        bias_grad_partial<T>(dz, partial, rows, cols, rows_per_slab);                                      \
    }                                                                                                      \
    extern "C" __global__ void linear_bias_grad_final_##DT(const float* partial, T* db, int slabs,         \
                                                           int cols) {                                     \
        bias_grad_final<T>(partial, db, slabs, cols);                                                      \
    }

LINEAR_DTYPE(float, f32)
LINEAR_DTYPE(__nv_bfloat16, bf16)
