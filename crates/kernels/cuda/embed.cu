// `embed` module: gathers embedding rows into the f32 residual stream.
#include "common.cuh"

// Programmatic dependent launch (common.cuh): every kernel here waits for the previous grid at
// entry, before any early return or buffer access, then lets the next launch be scheduled at
// once (its blocks run only their weight prologue before their own wait, so the earliest
// trigger hides the most of its launch behind this kernel; it never makes a write visible
// sooner).

// tokens i32[rows], table bf16[vocab·hidden] → out f32[rows·hidden]. One block per row
// (grid-stride over rows). A token id outside 0..vocab writes a zero row: the GPU cannot
// refuse a launch the way the CPU twin does, and zeros never read out of bounds.
extern "C" __global__ void __launch_bounds__(256) embedding(const int* __restrict__ tokens,
                                                            const bf16* __restrict__ table,
                                                            float* __restrict__ out,
                                                            unsigned rows, unsigned hidden,
                                                            unsigned vocab) {
    pdl_wait();
    pdl_launch_dependents();
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const int token = tokens[r];
        const bool valid = token >= 0 && (unsigned)token < vocab;
        const bf16* src = table + (unsigned long long)(valid ? token : 0) * hidden;
        float* dst = out + (unsigned long long)r * hidden;
        for (unsigned i = threadIdx.x; i < hidden; i += blockDim.x) {
            dst[i] = valid ? to_f32(src[i]) : 0.0f;
        }
    }
}
