// `kv` module: stores k and v rows in their paged-cache slots.
#include "common.cuh"

// Programmatic dependent launch (common.cuh): every kernel here waits for the previous grid at
// entry, before any early return or buffer access, then lets the next launch be scheduled at
// once (its blocks run only their weight prologue before their own wait, so the earliest
// trigger hides the most of its launch behind this kernel; it never makes a write visible
// sooner).

// k, v bf16[rows·kv_heads·head_dim], slot_mapping i32[rows] → cache (one layer's region,
// `[num_pages][2][block_size][kv_heads][head_dim]` bf16). One block per row (grid-stride). A
// slot outside 0..num_pages·block_size is skipped (the CPU twin refuses the launch instead).
extern "C" __global__ void __launch_bounds__(256) kv_write(const bf16* __restrict__ k,
                                                           const bf16* __restrict__ v,
                                                           const int* __restrict__ slot_mapping,
                                                           bf16* __restrict__ cache, unsigned rows,
                                                           unsigned kv_heads, unsigned head_dim,
                                                           unsigned block_size,
                                                           unsigned num_pages) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned row_elems = kv_heads * head_dim;
    const unsigned long long slots = (unsigned long long)num_pages * block_size;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const int slot = slot_mapping[r];
        if (slot < 0 || (unsigned long long)slot >= slots || block_size == 0) {
            continue;
        }
        const unsigned page = (unsigned)slot / block_size;
        const unsigned offset = (unsigned)slot % block_size;
        bf16* k_dst = cache + cache_offset(page, 0, offset, block_size, row_elems);
        bf16* v_dst = cache + cache_offset(page, 1, offset, block_size, row_elems);
        const bf16* k_src = k + (unsigned long long)r * row_elems;
        const bf16* v_src = v + (unsigned long long)r * row_elems;
        for (unsigned i = threadIdx.x; i < row_elems; i += blockDim.x) {
            k_dst[i] = k_src[i];
            v_dst[i] = v_src[i];
        }
    }
}
