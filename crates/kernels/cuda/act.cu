// `act` module: activations.
#include "common.cuh"

// Programmatic dependent launch (common.cuh): every kernel here waits for the previous grid at
// entry, before any early return or buffer access, then lets the next launch be scheduled at
// once (its blocks run only their weight prologue before their own wait, so the earliest
// trigger hides the most of its launch behind this kernel; it never makes a write visible
// sooner).

// out bf16[rows·width] = silu(a) · b (a: the gate projection, b: the up projection).
// Elementwise: 256 threads, 4 elements each, grid-stride.
extern "C" __global__ void __launch_bounds__(256) silu_mul(const bf16* __restrict__ a,
                                                           const bf16* __restrict__ b,
                                                           bf16* __restrict__ out, unsigned rows,
                                                           unsigned width) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned long long n = (unsigned long long)rows * width;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x * 4ull;
    for (unsigned long long base = (unsigned long long)blockIdx.x * blockDim.x * 4ull; base < n;
         base += stride) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            unsigned long long i = base + (unsigned long long)e * blockDim.x + threadIdx.x;
            if (i < n) {
                out[i] = silu_mul_value(a[i], b[i]);
            }
        }
    }
}

// out bf16[rows·width] = bf16(a · sigmoid(b)) (Qwen3-Next's gated attention output: a the
// attention output, b its gate). Elementwise: 256 threads, 4 elements each, grid-stride.
extern "C" __global__ void __launch_bounds__(256) sigmoid_mul(const bf16* __restrict__ a,
                                                              const bf16* __restrict__ b,
                                                              bf16* __restrict__ out,
                                                              unsigned rows, unsigned width) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned long long n = (unsigned long long)rows * width;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x * 4ull;
    for (unsigned long long base = (unsigned long long)blockIdx.x * blockDim.x * 4ull; base < n;
         base += stride) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            unsigned long long i = base + (unsigned long long)e * blockDim.x + threadIdx.x;
            if (i < n) {
                out[i] = sigmoid_gated(a[i], b[i]);
            }
        }
    }
}
