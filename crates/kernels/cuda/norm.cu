// `norm` module: RMSNorm of the residual stream, its fusion with the residual add, and the
// per-head qk-norm, each also zero-centred (`*_zc`, weight applied as 1 + w: Qwen3-Next). Rows are normalised by one warp each (`row_inv_rms`, the same routine the
// fused gemv kernels run), so every routing gives a row the same bits.
#include "common.cuh"

// Programmatic dependent launch (common.cuh): every kernel here waits for the previous grid at
// entry, before any early return or buffer access, then lets the next launch be scheduled at
// once (its blocks run only their weight prologue before their own wait, so the earliest
// trigger hides the most of its launch behind this kernel; it never makes a write visible
// sooner).

// One warp per row: the block's warps take consecutive rows (grid-stride). ZC: zero-centred
// weights (1 + w, Qwen3-Next), otherwise w.
template <bool ZC>
__device__ __forceinline__ void norm_rows(const float* __restrict__ h, const bf16* __restrict__ d,
                                          const bf16* __restrict__ w, float* __restrict__ h_out,
                                          bf16* __restrict__ out, unsigned rows, unsigned hidden,
                                          float eps) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warps = blockDim.x >> 5;
    for (unsigned r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
        const unsigned long long at = (unsigned long long)r * hidden;
        const float* hr = h + at;
        const bf16* dr = d != nullptr ? d + at : nullptr;
        const float inv = row_inv_rms(hr, dr, hidden, eps, lane);
        for (unsigned i = lane; i < hidden; i += 32) {
            const float value = row_value(hr, dr, i);
            if (h_out != nullptr) {
                h_out[at + i] = value;
            }
            out[at + i] = ZC ? norm_value_zc(value, inv, w[i]) : norm_value(value, inv, w[i]);
        }
    }
}

// x f32[rows·hidden], w bf16[hidden] → out bf16[rows·hidden].
extern "C" __global__ void __launch_bounds__(256) rms_norm(const float* __restrict__ x,
                                                           const bf16* __restrict__ w,
                                                           bf16* __restrict__ out, unsigned rows,
                                                           unsigned hidden, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    norm_rows<false>(x, nullptr, w, nullptr, out, rows, hidden, eps);
}

// h f32 + x bf16 → h_out f32 (optional, may be null), then RMSNorm → out bf16.
extern "C" __global__ void __launch_bounds__(256) add_rms_norm(const float* __restrict__ h,
                                                               const bf16* __restrict__ x,
                                                               const bf16* __restrict__ w,
                                                               float* __restrict__ h_out,
                                                               bf16* __restrict__ out,
                                                               unsigned rows, unsigned hidden,
                                                               float eps) {
    pdl_wait();
    pdl_launch_dependents();
    norm_rows<false>(h, x, w, h_out, out, rows, hidden, eps);
}

// Per-head RMSNorm of q bf16[rows·heads·head_dim] and k bf16[rows·kv_heads·head_dim] with
// weights wq, wk bf16[head_dim]; one block per row, one warp per head.
extern "C" __global__ void __launch_bounds__(1024) qk_norm(const bf16* __restrict__ q,
                                                           const bf16* __restrict__ k,
                                                           const bf16* __restrict__ wq,
                                                           const bf16* __restrict__ wk,
                                                           bf16* __restrict__ q_out,
                                                           bf16* __restrict__ k_out, unsigned rows,
                                                           unsigned heads, unsigned kv_heads,
                                                           unsigned head_dim, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    head_pass(q, k, nullptr, wq, wk, eps, nullptr, nullptr, 0, nullptr, q_out, k_out, nullptr,
              rows, heads, kv_heads, head_dim, 0, 0);
}

// ---- zero-centred (Qwen3-Next) -------------------------------------------------------------

// x f32[rows·hidden], w bf16[hidden] → out bf16[rows·hidden] = bf16((x · inv) · (1 + w)).
extern "C" __global__ void __launch_bounds__(256) rms_norm_zc(const float* __restrict__ x,
                                                              const bf16* __restrict__ w,
                                                              bf16* __restrict__ out,
                                                              unsigned rows, unsigned hidden,
                                                              float eps) {
    pdl_wait();
    pdl_launch_dependents();
    norm_rows<true>(x, nullptr, w, nullptr, out, rows, hidden, eps);
}

// h f32 + x bf16 → h_out f32 (optional), then `rms_norm_zc` → out bf16. Byte-identical to
// add::residual_add then rms_norm_zc: every sum is `residual_value` (what residual_add stores)
// and `row_inv_rms` reduces those same f32 values in the same order.
extern "C" __global__ void __launch_bounds__(256) add_rms_norm_zc(const float* __restrict__ h,
                                                                  const bf16* __restrict__ x,
                                                                  const bf16* __restrict__ w,
                                                                  float* __restrict__ h_out,
                                                                  bf16* __restrict__ out,
                                                                  unsigned rows, unsigned hidden,
                                                                  float eps) {
    pdl_wait();
    pdl_launch_dependents();
    norm_rows<true>(h, x, w, h_out, out, rows, hidden, eps);
}

// `qk_norm` with zero-centred weights: one block per row (grid-stride), one warp per head (q
// heads then k heads, strided by the block's warp count), the head's Σx² reduced as
// `head_transform` reduces it.
extern "C" __global__ void __launch_bounds__(1024) qk_norm_zc(const bf16* __restrict__ q,
                                                              const bf16* __restrict__ k,
                                                              const bf16* __restrict__ wq,
                                                              const bf16* __restrict__ wk,
                                                              bf16* __restrict__ q_out,
                                                              bf16* __restrict__ k_out,
                                                              unsigned rows, unsigned heads,
                                                              unsigned kv_heads,
                                                              unsigned head_dim, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;
    const unsigned all_heads = heads + kv_heads;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        for (unsigned hh = warp; hh < all_heads; hh += warps) {
            const bool is_q = hh < heads;
            const unsigned long long at =
                is_q ? ((unsigned long long)r * heads + hh) * head_dim
                     : ((unsigned long long)r * kv_heads + (hh - heads)) * head_dim;
            const bf16* x = (is_q ? q : k) + at;
            bf16* dst = (is_q ? q_out : k_out) + at;
            const bf16* w = is_q ? wq : wk;
            const float ss =
                warp_sum_squares([&](unsigned i) { return to_f32(x[i]); }, head_dim, lane);
            const float inv = inv_rms(ss, head_dim, eps);
            for (unsigned i = lane; i < head_dim; i += 32) {
                dst[i] = norm_value_zc(to_f32(x[i]), inv, w[i]);
            }
        }
    }
}

// The MTP draft head's input (Qwen3-Next): per row, the zero-centred RMSNorm of the token's
// embedding e f32[rows·hidden] (weight we) and of the target's hidden row x bf16[rows·hidden]
// (weight wh), side by side: out bf16[rows·2·hidden], embedding first. One warp per row
// (grid-stride); each half reduced as `row_inv_rms` reduces a row (x widened to f32).
extern "C" __global__ void __launch_bounds__(256) mtp_pre_fc_zc(const float* __restrict__ e,
                                                                const bf16* __restrict__ x,
                                                                const bf16* __restrict__ we,
                                                                const bf16* __restrict__ wh,
                                                                bf16* __restrict__ out,
                                                                unsigned rows, unsigned hidden,
                                                                float eps) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warps = blockDim.x >> 5;
    for (unsigned r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
        const unsigned long long at = (unsigned long long)r * hidden;
        const float* er = e + at;
        const bf16* xr = x + at;
        bf16* o = out + 2ull * at;
        const float inv_e = row_inv_rms(er, nullptr, hidden, eps, lane);
        for (unsigned i = lane; i < hidden; i += 32) {
            o[i] = norm_value_zc(er[i], inv_e, we[i]);
        }
        const float ss = warp_sum_squares([&](unsigned i) { return to_f32(xr[i]); }, hidden, lane);
        const float inv_x = inv_rms(ss, hidden, eps);
        for (unsigned i = lane; i < hidden; i += 32) {
            o[hidden + i] = norm_value_zc(to_f32(xr[i]), inv_x, wh[i]);
        }
    }
}
