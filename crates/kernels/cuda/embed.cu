// `embed` module: gathers embedding rows into the f32 residual stream.
#include "common.cuh"

// tokens i32[rows], table bf16[vocab·hidden] → out f32[rows·hidden]. One block per row
// (grid-stride over rows). A token id outside 0..vocab writes a zero row: the GPU cannot
// refuse a launch the way the CPU twin does, and zeros never read out of bounds.
extern "C" __global__ void __launch_bounds__(256) embedding(const int* __restrict__ tokens,
                                                            const bf16* __restrict__ table,
                                                            float* __restrict__ out,
                                                            unsigned rows, unsigned hidden,
                                                            unsigned vocab) {
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
