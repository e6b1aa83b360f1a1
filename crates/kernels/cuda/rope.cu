// `rope` module: rotary embedding of q and k, alone or fused with qk-norm and the KV write.
// Every kernel is `head_pass` (common.cuh) with some stages on: one block per row, one warp per
// head; the fused kernels produce exactly the values the reference kernels store between them.
#include "common.cuh"

// Programmatic dependent launch (common.cuh): every kernel here waits for the previous grid at
// entry, before any early return or buffer access, then lets the next launch be scheduled at
// once (its blocks run only their weight prologue before their own wait, so the earliest
// trigger hides the most of its launch behind this kernel; it never makes a write visible
// sooner).

// q bf16[rows·heads·head_dim], k bf16[rows·kv_heads·head_dim], positions i32[rows],
// inv_freq f32[rotary_dim/2 + 1] (the inverse frequencies, then the attention scaling)
// → q_out, k_out.
extern "C" __global__ void __launch_bounds__(1024) rope(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const int* __restrict__ positions,
    const float* __restrict__ inv_freq, bf16* __restrict__ q_out, bf16* __restrict__ k_out,
    unsigned rows, unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim) {
    pdl_wait();
    pdl_launch_dependents();
    head_pass(q, k, nullptr, nullptr, nullptr, 0.0f, positions, inv_freq, rotary_dim, nullptr,
              q_out, k_out, nullptr, rows, heads, kv_heads, head_dim, 0, 0);
}

// qk-norm (weights wq, wk bf16[head_dim]) then rope.
extern "C" __global__ void __launch_bounds__(1024) qk_norm_rope(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ wq,
    const bf16* __restrict__ wk, const int* __restrict__ positions,
    const float* __restrict__ inv_freq, bf16* __restrict__ q_out, bf16* __restrict__ k_out,
    unsigned rows, unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
    float eps) {
    pdl_wait();
    pdl_launch_dependents();
    head_pass(q, k, nullptr, wq, wk, eps, positions, inv_freq, rotary_dim, nullptr, q_out, k_out,
              nullptr, rows, heads, kv_heads, head_dim, 0, 0);
}

// rope of q (→ q_out) and k, then the roped k and v stored in their slots of the cache.
extern "C" __global__ void __launch_bounds__(1024) rope_kv_write(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const int* __restrict__ positions, const float* __restrict__ inv_freq,
    const int* __restrict__ slot_mapping, bf16* __restrict__ q_out, bf16* __restrict__ cache,
    unsigned rows, unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
    unsigned block_size, unsigned num_pages) {
    pdl_wait();
    pdl_launch_dependents();
    head_pass(q, k, v, nullptr, nullptr, 0.0f, positions, inv_freq, rotary_dim, slot_mapping,
              q_out, nullptr, cache, rows, heads, kv_heads, head_dim, block_size, num_pages);
}

// qk-norm, rope of q (→ q_out) and k, then the roped k and v stored in the cache.
extern "C" __global__ void __launch_bounds__(1024) qk_norm_rope_kv_write(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const bf16* __restrict__ wq, const bf16* __restrict__ wk, const int* __restrict__ positions,
    const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
    bf16* __restrict__ q_out, bf16* __restrict__ cache, unsigned rows, unsigned heads,
    unsigned kv_heads, unsigned head_dim, unsigned rotary_dim, unsigned block_size,
    unsigned num_pages, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    head_pass(q, k, v, wq, wk, eps, positions, inv_freq, rotary_dim, slot_mapping, q_out,
              nullptr, cache, rows, heads, kv_heads, head_dim, block_size, num_pages);
}

// Qwen3-Next's gated attention: q2 is the gated q projection (each head `[q | gate]`,
// bf16[rows·heads·2·head_dim]); the gate halves are copied to gate_out, then zero-centred
// qk-norm, rope of q (→ q_out) and k, and the roped k and v stored in the cache: the bytes of
// attn::gate_split, norm::qk_norm_zc and rope_kv_write.
extern "C" __global__ void __launch_bounds__(1024) gated_qk_norm_zc_rope_kv_write(
    const bf16* __restrict__ q2, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const bf16* __restrict__ wq, const bf16* __restrict__ wk, const int* __restrict__ positions,
    const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
    bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
    unsigned rows, unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
    unsigned block_size, unsigned num_pages, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    head_pass<true>(q2, k, v, wq, wk, eps, positions, inv_freq, rotary_dim, slot_mapping, q_out,
                    nullptr, cache, rows, heads, kv_heads, head_dim, block_size, num_pages,
                    gate_out);
}
