// `add` module: the residual add.
#include "common.cuh"

// Programmatic dependent launch (common.cuh): every kernel here waits for the previous grid at
// entry, before any early return or buffer access, then lets the next launch be scheduled at
// once (its blocks run only their weight prologue before their own wait, so the earliest
// trigger hides the most of its launch behind this kernel; it never makes a write visible
// sooner).

// out f32[rows·hidden] = h f32 + x bf16. Elementwise: 256 threads, 4 elements each, grid-stride.
extern "C" __global__ void __launch_bounds__(256) residual_add(const float* __restrict__ h,
                                                               const bf16* __restrict__ x,
                                                               float* __restrict__ out,
                                                               unsigned rows, unsigned hidden) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned long long n = (unsigned long long)rows * hidden;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x * 4ull;
    for (unsigned long long base = (unsigned long long)blockIdx.x * blockDim.x * 4ull; base < n;
         base += stride) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            unsigned long long i = base + (unsigned long long)e * blockDim.x + threadIdx.x;
            if (i < n) {
                out[i] = residual_value(h[i], x[i]);
            }
        }
    }
}
