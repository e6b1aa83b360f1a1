// `pick` module: a step's greedy tokens on the device, so a step reads back one id a row
// instead of its logits row (vocab f32).
#include "common.cuh"

#define PICK_THREADS 256u
#define PICK_NONE 0xffffffffu

// (v, i) beats (best_v, best_i): a larger value, or the same value at a lower index; NaN never
// wins, and anything beats no candidate (PICK_NONE). A total order on the non-NaN candidates,
// so the reduction's result does not depend on its order: the host's `sampling::greedy`.
__device__ __forceinline__ bool pick_beats(float v, unsigned i, float best_v, unsigned best_i) {
    if (i == PICK_NONE || v != v) {
        return false;
    }
    return best_i == PICK_NONE || v > best_v || (v == best_v && i < best_i);
}

// logits f32[rows·vocab] → ids i32[rows]: each row's arg-max (the lowest index among equal
// maxima, NaN never), or -1 when the row has no logit but -inf and NaN (the host's sampler
// refuses such a row); `tokens` i32[rows], or null: the same ids again (the next step's token
// field of the step metadata, when steps feed each other on the device). One block per row
// (grid-stride over rows), 256 threads: each thread scans every 256th logit, then the warps'
// and the block's candidates are reduced.
extern "C" __global__ void __launch_bounds__(256) argmax(const float* __restrict__ logits,
                                                         int* __restrict__ ids,
                                                         int* __restrict__ tokens,
                                                         unsigned rows, unsigned vocab) {
    __shared__ float warp_v[PICK_THREADS / 32u];
    __shared__ unsigned warp_i[PICK_THREADS / 32u];
    pdl_wait(); // before any early return and any buffer another launch writes
    pdl_launch_dependents();
    if (blockDim.x != PICK_THREADS) {
        return; // the whole block (the CPU twin refuses these launches)
    }
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = logits + (unsigned long long)r * vocab;
        float best_v = 0.0f;
        unsigned best_i = PICK_NONE;
        for (unsigned i = threadIdx.x; i < vocab; i += PICK_THREADS) {
            const float v = row[i];
            if (pick_beats(v, i, best_v, best_i)) {
                best_v = v;
                best_i = i;
            }
        }
        for (unsigned m = 16u; m > 0u; m >>= 1) {
            const float v = __shfl_xor_sync(SOLDER_FULL_MASK, best_v, m);
            const unsigned i = __shfl_xor_sync(SOLDER_FULL_MASK, best_i, m);
            if (pick_beats(v, i, best_v, best_i)) {
                best_v = v;
                best_i = i;
            }
        }
        if (lane == 0u) {
            warp_v[warp] = best_v;
            warp_i[warp] = best_i;
        }
        __syncthreads();
        if (threadIdx.x == 0u) {
            for (unsigned w = 1; w < PICK_THREADS / 32u; ++w) {
                if (pick_beats(warp_v[w], warp_i[w], best_v, best_i)) {
                    best_v = warp_v[w];
                    best_i = warp_i[w];
                }
            }
            // Every candidate -inf: only -inf and NaN in the row.
            const bool none = best_i == PICK_NONE || best_v == NEG_INF;
            ids[r] = none ? -1 : (int)best_i;
            if (tokens != nullptr) {
                tokens[r] = none ? -1 : (int)best_i;
            }
        }
        __syncthreads(); // the next row reuses the warps' slots
    }
}
