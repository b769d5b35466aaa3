// pdl.cuh: programmatic dependent launch (sm_90). In a captured graph whose kernel-to-kernel
// edges are programmatic (lab/src/gpu/graph.rs), a kernel's blocks start while the kernel before
// it is still running, run what comes before pdl_wait() (reads of weights that no kernel writes),
// and block in pdl_wait() until every kernel they depend on has finished and its writes are
// visible. Only kernels whose PTX holds the wait get such an edge (Gpu::function reads the PTX),
// so a kernel must call pdl_wait() before it reads anything an earlier kernel wrote and before
// it writes anything. Launched without the attribute, both instructions are no-ops.
#ifndef LAB_KERNELS_PDL_CUH
#define LAB_KERNELS_PDL_CUH

// Waits for the kernels this one depends on, then lets the next kernel's blocks launch: they
// start early, but at most one kernel ahead (its blocks trigger only after their own wait).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for the 16-byte-aligned part of [p, p + bytes) in one bulk request (sm_90; nothing
// before): rounded inwards, so it never touches a byte past the buffer. For weights a kernel will
// read after pdl_wait().
__device__ __forceinline__ void pdl_prefetch_l2(const void* p, long long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned long long a = reinterpret_cast<unsigned long long>(p);
    const unsigned long long a0 = (a + 15) & ~15ull, a1 = (a + bytes) & ~15ull;
    if (bytes > 0 && a1 > a0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a0), "r"((unsigned)(a1 - a0)) : "memory");
#endif
}

#endif  // LAB_KERNELS_PDL_CUH
