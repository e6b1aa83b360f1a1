// `moe` module: Mixture-of-Experts routing (softmax → top-k, optionally fused with the router
// projection), the routed expert MLP (gate·up·SiLU, then down with the weighted sum over the
// picks) and the shared expert's gated combine.
//
// Expert weights are stacked row-major: gate and up `[experts][inter][hidden]`, down
// `[experts][hidden][inter]`. Picks are ids i32[rows·k] and weights f32[rows·k].
//
// Launch (ops/moe.rs):
//  - routing: one block of 256 threads per row (grid-stride), the row's probabilities in
//    `experts · 4` bytes of dynamic shared memory;
//  - gate_up_silu: grid (rows·k picks, ⌈inter/8⌉ feature tiles (grid-stride past 65535)),
//    256 threads, one warp per output feature of the pick's expert;
//  - down: grid (rows, ⌈hidden/8⌉ feature tiles), 256 threads, one warp per output feature,
//    summing the row's picks in pick order;
//  - combine_shared: elementwise; gate_combine_shared: one block per row (grid-stride).
//
// Every dot is in gemv's segment order (common.cuh `warp_dot`, DOT_SEG): so a router logit is
// bit for bit what gemv::lm_head stores, and one pick's gate/up value is what gemv's
// gate_up_silu would give on that expert's matrices.
#include "common.cuh"

// Programmatic dependent launch (common.cuh): every kernel here waits for the previous grid at
// entry, before any early return or buffer access, then lets the next launch be scheduled at
// once (its blocks run only their weight prologue before their own wait, so the earliest
// trigger hides the most of its launch behind this kernel; it never makes a write visible
// sooner).

// ---- routing -------------------------------------------------------------------------------

#define ROUTE_NONE 0xffffffffu

// The row's probabilities (softmax in place), then picks; `experts` floats.
extern __shared__ float route_probs[];

// Is candidate (p, i) ahead of (bp, bi)? Larger probability first, ties to the lower id; an
// empty candidate (ROUTE_NONE) is behind everything. Two NaNs tie: a row's probabilities are
// all NaN or none (a NaN, +inf or all -inf logits make the softmax's sum NaN), and the twin
// then picks the lowest untaken ids (nothing is greater than NaN), as the tie does here.
__device__ __forceinline__ bool route_ahead(float p, unsigned i, float bp, unsigned bi) {
    const bool tie = p == bp || (p != p && bp != bp);
    return i != ROUTE_NONE && (bi == ROUTE_NONE || p > bp || (tie && i < bi));
}

// Softmax of the row's logits (in route_probs[0..experts)), then the top k by repeated
// selection (descending, ties to the lower expert id) → ids, weights (the row's k entries),
// renormalised to sum 1 when `norm_topk`. Called by the whole block. Orders: the max is exact;
// the sum is warp 0's (lane l sums e ≡ l mod 32 in order, then the butterfly), depending only
// on `experts`; each selection is exact (a strict total order); the renormalising sum is over
// the picks in order. A pick that finds nothing (k > experts) is id −1, weight 0.
__device__ __forceinline__ void route_row(unsigned experts, unsigned k, bool norm_topk,
                                          int* __restrict__ ids, float* __restrict__ weights) {
    __shared__ float red_p[32];
    __shared__ unsigned red_i[32];
    __shared__ float row_max;
    __shared__ float row_sum;
    float* probs = route_probs;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;

    if (warp == 0) {
        float m = NEG_INF;
        for (unsigned e = lane; e < experts; e += 32) {
            m = fmaxf(m, probs[e]);
        }
        m = warp_max(m);
        if (lane == 0) {
            row_max = m;
        }
    }
    __syncthreads();
    const float mx = row_max;
    for (unsigned e = threadIdx.x; e < experts; e += blockDim.x) {
        probs[e] = expf(__fsub_rn(probs[e], mx));
    }
    __syncthreads();
    if (warp == 0) {
        float s = 0.0f;
        for (unsigned e = lane; e < experts; e += 32) {
            s = __fadd_rn(s, probs[e]);
        }
        s = warp_sum(s);
        if (lane == 0) {
            row_sum = s;
        }
    }
    __syncthreads();
    const float sum = row_sum;
    for (unsigned e = threadIdx.x; e < experts; e += blockDim.x) {
        probs[e] = __fdiv_rn(probs[e], sum);
    }
    __syncthreads();

    // Taken experts are marked −1 (probabilities are >= 0).
    float picked = 0.0f;
    for (unsigned j = 0; j < k; ++j) {
        float bp = 0.0f;
        unsigned bi = ROUTE_NONE;
        for (unsigned e = threadIdx.x; e < experts; e += blockDim.x) {
            const float p = probs[e];
            if (!(p < 0.0f) && route_ahead(p, e, bp, bi)) {
                bp = p;
                bi = e;
            }
        }
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) {
            const float op = __shfl_xor_sync(SOLDER_FULL_MASK, bp, m);
            const unsigned oi = __shfl_xor_sync(SOLDER_FULL_MASK, bi, m);
            if (route_ahead(op, oi, bp, bi)) {
                bp = op;
                bi = oi;
            }
        }
        if (lane == 0) {
            red_p[warp] = bp;
            red_i[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (unsigned w = 1; w < warps; ++w) {
                if (route_ahead(red_p[w], red_i[w], bp, bi)) {
                    bp = red_p[w];
                    bi = red_i[w];
                }
            }
            const float weight = bi != ROUTE_NONE ? bp : 0.0f;
            ids[j] = bi != ROUTE_NONE ? (int)bi : -1;
            weights[j] = weight;
            picked = __fadd_rn(picked, weight);
            if (bi != ROUTE_NONE) {
                probs[bi] = -1.0f;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && norm_topk) {
        for (unsigned j = 0; j < k; ++j) {
            weights[j] = __fdiv_rn(weights[j], picked);
        }
    }
}

// logits f32[rows·experts] → softmax → top k per row: ids i32[rows·k], weights f32[rows·k]
// (renormalised when norm_topk != 0).
extern "C" __global__ void __launch_bounds__(256) topk_softmax(const float* __restrict__ logits,
                                                               int* __restrict__ ids,
                                                               float* __restrict__ weights,
                                                               unsigned rows, unsigned experts,
                                                               unsigned k, unsigned norm_topk) {
    pdl_wait();
    pdl_launch_dependents();
    if (experts == 0u || k == 0u || (blockDim.x & 31u) != 0u) {
        return;
    }
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        __syncthreads(); // the previous row's readers are done with route_probs
        const float* row = logits + (unsigned long long)r * experts;
        for (unsigned e = threadIdx.x; e < experts; e += blockDim.x) {
            route_probs[e] = row[e];
        }
        __syncthreads();
        const unsigned long long at = (unsigned long long)r * k;
        route_row(experts, k, norm_topk != 0u, ids + at, weights + at);
    }
}

// The router projection of x bf16[rows·hidden] (w bf16[experts·hidden]) then `topk_softmax`,
// the f32 logits kept in shared memory. Each logit is warp_dot(x row, w row), the
// bits gemv::lm_head stores, and the routing is the same `route_row`: byte-identical to
// gemv::lm_head followed by moe::topk_softmax.
extern "C" __global__ void __launch_bounds__(256) router_topk(const bf16* __restrict__ x,
                                                              const bf16* __restrict__ w,
                                                              int* __restrict__ ids,
                                                              float* __restrict__ weights,
                                                              unsigned rows, unsigned hidden,
                                                              unsigned experts, unsigned k,
                                                              unsigned norm_topk) {
    pdl_wait();
    pdl_launch_dependents();
    if (experts == 0u || k == 0u || hidden == 0u || (blockDim.x & 31u) != 0u) {
        return;
    }
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        __syncthreads(); // the previous row's readers are done with route_probs
        const bf16* xr = x + (unsigned long long)r * hidden;
        for (unsigned e = warp; e < experts; e += warps) {
            const float logit = warp_dot(xr, w + (unsigned long long)e * hidden, hidden, lane);
            if (lane == 0) {
                route_probs[e] = logit;
            }
        }
        __syncthreads();
        const unsigned long long at = (unsigned long long)r * k;
        route_row(experts, k, norm_topk != 0u, ids + at, weights + at);
    }
}

// ---- the routed expert MLP -----------------------------------------------------------------

// For each row and pick j (expert e = ids[r·k + j]): act bf16[(r·k + j)·inter + f] =
// silu(bf16(x_r · wg[e][f])) · bf16(x_r · wu[e][f]), as gemv::gate_up_silu stores it. One warp
// per (pick, feature); the gate and up rows stream together against the same x chunks. An id
// outside 0..experts (the CPU twin refuses it) gives zeros.
//
// The CPU twin groups picks by expert to read each expert once; here each (pick, feature) warp
// reads its expert's rows with 16-byte loads and picks of one expert re-read them from L2.
extern "C" __global__ void __launch_bounds__(256) gate_up_silu(const bf16* __restrict__ x,
                                                               const int* __restrict__ ids,
                                                               const bf16* __restrict__ wg,
                                                               const bf16* __restrict__ wu,
                                                               bf16* __restrict__ act,
                                                               unsigned rows, unsigned hidden,
                                                               unsigned inter, unsigned experts,
                                                               unsigned k) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;
    const unsigned long long picks = (unsigned long long)rows * k;
    for (unsigned long long s = blockIdx.x; s < picks; s += gridDim.x) {
        const unsigned long long row = s / k;
        const int id = ids[s];
        const bool valid = id >= 0 && (unsigned)id < experts;
        const bf16* xr = x + row * hidden;
        for (unsigned fb = blockIdx.y; fb * warps < inter; fb += gridDim.y) {
            const unsigned f = fb * warps + warp;
            if (f >= inter) {
                continue;
            }
            bf16* dst = act + s * inter + f;
            if (!valid) {
                if (lane == 0) {
                    *dst = to_bf16(0.0f);
                }
                continue;
            }
            const unsigned long long wat = ((unsigned long long)id * inter + f) * hidden;
            const bf16* gr = wg + wat;
            const bf16* ur = wu + wat;
            const bool xv = aligned16(xr);
            const bool gv = aligned16(gr);
            const bool uv = aligned16(ur);
            float sg = 0.0f;
            float su = 0.0f;
            for (unsigned seg = 0; seg * DOT_SEG < hidden; ++seg) {
                float ag = 0.0f;
                float au = 0.0f;
#pragma unroll
                for (unsigned j = 0; j < DOT_SEG_LANE_CHUNKS; ++j) {
                    const unsigned i0 = seg * DOT_SEG + (j * 32u + lane) * 8u;
                    if (i0 < hidden) {
                        const unsigned n = min(8u, hidden - i0);
                        const uint4 xb = load8_bits(xr + i0, n, xv);
                        ag = dot8(xb, load8_bits(gr + i0, n, gv), ag);
                        au = dot8(xb, load8_bits(ur + i0, n, uv), au);
                    }
                }
                sg = dot_fold(sg, warp_sum(ag), seg);
                su = dot_fold(su, warp_sum(au), seg);
            }
            if (lane == 0) {
                *dst = silu_mul_value(linear_value(sg, nullptr, f), linear_value(su, nullptr, f));
            }
        }
    }
}

// out bf16[rows·hidden] = Σ_j weights[r·k + j] · (act[r·k + j] · wd[ids[r·k + j]][o]), summed
// in f32 over the picks j in increasing order (acc + dot · weight, as the CPU twin), stored
// bf16 once. One warp per (row, output feature). A pick with an id outside 0..experts adds
// nothing.
extern "C" __global__ void __launch_bounds__(256) down(const bf16* __restrict__ act,
                                                       const int* __restrict__ ids,
                                                       const float* __restrict__ weights,
                                                       const bf16* __restrict__ wd,
                                                       bf16* __restrict__ out, unsigned rows,
                                                       unsigned hidden, unsigned inter,
                                                       unsigned experts, unsigned k) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        for (unsigned fb = blockIdx.y; fb * warps < hidden; fb += gridDim.y) {
            const unsigned o = fb * warps + warp;
            if (o >= hidden) {
                continue;
            }
            float acc = 0.0f;
            for (unsigned j = 0; j < k; ++j) {
                const unsigned long long s = (unsigned long long)r * k + j;
                const int id = ids[s];
                if (id < 0 || (unsigned)id >= experts) {
                    continue;
                }
                const bf16* wr = wd + ((unsigned long long)id * hidden + o) * inter;
                const float d = warp_dot(act + s * inter, wr, inter, lane);
                acc = __fadd_rn(acc, __fmul_rn(d, weights[s]));
            }
            if (lane == 0) {
                out[(unsigned long long)r * hidden + o] = to_bf16(acc);
            }
        }
    }
}

// moe::down's sum over each row's picks, from dots f32[rows·k·hidden] computed apart
// (gemm::experts_down_mma, the tensor cores): out bf16[r·hidden + o] = Σ_j dots[(r·k + j)·hidden
// + o] · weights[r·k + j] in f32 over the picks j in increasing order (acc + dot · weight, as
// moe::down), stored bf16 once; a pick with an id outside 0..experts adds nothing.
// Elementwise over rows·hidden outputs: 256 threads, grid-stride.
extern "C" __global__ void __launch_bounds__(256) down_combine(const float* __restrict__ dots,
                                                               const int* __restrict__ ids,
                                                               const float* __restrict__ weights,
                                                               bf16* __restrict__ out,
                                                               unsigned rows, unsigned hidden,
                                                               unsigned experts, unsigned k) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned long long n = (unsigned long long)rows * hidden;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long r = i / hidden;
        const unsigned long long o = i - r * hidden;
        float acc = 0.0f;
        for (unsigned j = 0; j < k; ++j) {
            const unsigned long long s = r * k + j;
            const int id = ids[s];
            if (id < 0 || (unsigned)id >= experts) {
                continue;
            }
            acc = __fadd_rn(acc, __fmul_rn(dots[s * hidden + o], weights[s]));
        }
        out[i] = to_bf16(acc);
    }
}

// ---- the routed expert MLP on quantized experts ----------------------------------------------

// The `_fp8` and `_int4` entries of gate_up_silu and down read each expert matrix from its blob
// (solder_circuit::format: the values, then at the next 256-byte boundary the f32 scales, then
// for int4 the u8 zero points; matrix e at e · stride, the blob's bytes rounded up to 256),
// dequantise each weight to bf16 in registers and then run the bf16 kernel's arithmetic
// unchanged, so their bytes equal gate_up_silu / down on the dequantised experts:
//  - fp8:  w = bf16_rn(f32(e4m3(q)) · scale), scale of block (f / block_n, i / block_k);
//  - int4: w = bf16_rn(f32(q − z) · scale), q the low nibble of byte f·k/2 + i/2 for even i
//    (the high one for odd i), scale and z of group (f, i / group).
// A blob is passed as 32-bit words (the device's bytes, little endian). A zero block or group,
// or an odd k for int4 (the CPU twin refuses them), writes nothing.

// load8_bits inlined whole (its scalar path is out of line, and a call keeps the dequantising
// kernels' live registers across it): the same bits.
__device__ __forceinline__ unsigned moe_bits2(const bf16* p, unsigned valid, unsigned j) {
    const unsigned lo = j < valid ? bf16_bits(p[j]) : 0u;
    const unsigned hi = j + 1u < valid ? bf16_bits(p[j + 1u]) : 0u;
    return lo | (hi << 16);
}

__device__ __forceinline__ uint4 moe_load8_bits(const bf16* p, unsigned valid, bool vec) {
    if (vec && valid >= 8) {
        return __ldg(reinterpret_cast<const uint4*>(p));
    }
    return make_uint4(moe_bits2(p, valid, 0u), moe_bits2(p, valid, 2u), moe_bits2(p, valid, 4u),
                      moe_bits2(p, valid, 6u));
}

// gate_up_silu's loop with the weights of (expert, feature) from `matrix(id)` (a Moe*Matrix):
// the same dot order, the same stores.
template <typename MatrixOf>
__device__ __forceinline__ void moe_gate_up_quant(const bf16* __restrict__ x,
                                                  const int* __restrict__ ids,
                                                  bf16* __restrict__ act, unsigned rows,
                                                  unsigned hidden, unsigned inter,
                                                  unsigned experts, unsigned k,
                                                  MatrixOf matrix) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;
    const unsigned long long picks = (unsigned long long)rows * k;
    for (unsigned long long s = blockIdx.x; s < picks; s += gridDim.x) {
        const unsigned long long row = s / k;
        const int id = ids[s];
        const bool valid = id >= 0 && (unsigned)id < experts;
        const bf16* xr = x + row * hidden;
        for (unsigned fb = blockIdx.y; fb * warps < inter; fb += gridDim.y) {
            const unsigned f = fb * warps + warp;
            if (f >= inter) {
                continue;
            }
            bf16* dst = act + s * inter + f;
            if (!valid) {
                if (lane == 0) {
                    *dst = to_bf16(0.0f);
                }
                continue;
            }
            const auto g = matrix((unsigned)id, 0);
            const auto u = matrix((unsigned)id, 1);
            const bool xv = aligned16(xr);
            float sg = 0.0f;
            float su = 0.0f;
            for (unsigned seg = 0; seg * DOT_SEG < hidden; ++seg) {
                float ag = 0.0f;
                float au = 0.0f;
#pragma unroll 1 // the chunks in order, as unrolled; fewer live predicates
                for (unsigned j = 0; j < DOT_SEG_LANE_CHUNKS; ++j) {
                    const unsigned i0 = seg * DOT_SEG + (j * 32u + lane) * 8u;
                    if (i0 < hidden) {
                        const unsigned n = min(8u, hidden - i0);
                        const uint4 xb = moe_load8_bits(xr + i0, n, xv);
                        ag = dot8(xb, g.load8(f, i0, n), ag);
                        au = dot8(xb, u.load8(f, i0, n), au);
                    }
                }
                sg = dot_fold(sg, warp_sum(ag), seg);
                su = dot_fold(su, warp_sum(au), seg);
            }
            if (lane == 0) {
                *dst = silu_mul_value(linear_value(sg, nullptr, f), linear_value(su, nullptr, f));
            }
        }
    }
}

// down's loop with the weights of (expert, output feature) from `matrix(id)`; warp_dot's order.
template <typename MatrixOf>
__device__ __forceinline__ void moe_down_quant(const bf16* __restrict__ act,
                                               const int* __restrict__ ids,
                                               const float* __restrict__ weights,
                                               bf16* __restrict__ out, unsigned rows,
                                               unsigned hidden, unsigned inter, unsigned experts,
                                               unsigned k, MatrixOf matrix) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        for (unsigned fb = blockIdx.y; fb * warps < hidden; fb += gridDim.y) {
            const unsigned o = fb * warps + warp;
            if (o >= hidden) {
                continue;
            }
            float acc = 0.0f;
            for (unsigned j = 0; j < k; ++j) {
                const unsigned long long s = (unsigned long long)r * k + j;
                const int id = ids[s];
                if (id < 0 || (unsigned)id >= experts) {
                    continue;
                }
                const auto wm = matrix((unsigned)id);
                const bf16* a = act + s * inter;
                const bool av = aligned16(a);
                float d = 0.0f;
                for (unsigned seg = 0; seg * DOT_SEG < inter; ++seg) {
                    float part = 0.0f;
#pragma unroll 1 // the chunks in order, as unrolled; fewer live predicates
                    for (unsigned c = 0; c < DOT_SEG_LANE_CHUNKS; ++c) {
                        const unsigned i0 = seg * DOT_SEG + (c * 32u + lane) * 8u;
                        if (i0 < inter) {
                            const unsigned valid = min(8u, inter - i0);
                            part = dot8(moe_load8_bits(a + i0, valid, av), wm.load8(o, i0, valid),
                                        part);
                        }
                    }
                    d = dot_fold(d, warp_sum(part), seg);
                }
                acc = __fadd_rn(acc, __fmul_rn(d, weights[s]));
            }
            if (lane == 0) {
                out[(unsigned long long)r * hidden + o] = to_bf16(acc);
            }
        }
    }
}

// The gate (which 0) or up (which 1) matrix of an expert.
struct MoeFp8GateUp {
    const unsigned* wg;
    const unsigned* wu;
    unsigned inter, hidden, block_n, block_k;
    __device__ __forceinline__ MoeFp8Matrix operator()(unsigned e, unsigned which) const {
        return MoeFp8Matrix(which == 0u ? wg : wu, e, inter, hidden, block_n, block_k);
    }
};

struct MoeInt4GateUp {
    const unsigned* wg;
    const unsigned* wu;
    unsigned inter, hidden, group;
    __device__ __forceinline__ MoeInt4Matrix operator()(unsigned e, unsigned which) const {
        return MoeInt4Matrix(which == 0u ? wg : wu, e, inter, hidden, group);
    }
};

struct MoeFp8Down {
    const unsigned* wd;
    unsigned hidden, inter, block_n, block_k;
    __device__ __forceinline__ MoeFp8Matrix operator()(unsigned e) const {
        return MoeFp8Matrix(wd, e, hidden, inter, block_n, block_k);
    }
};

struct MoeInt4Down {
    const unsigned* wd;
    unsigned hidden, inter, group;
    __device__ __forceinline__ MoeInt4Matrix operator()(unsigned e) const {
        return MoeInt4Matrix(wd, e, hidden, inter, group);
    }
};

// gate_up_silu on fp8 experts: wg, wu the stacked blobs of [experts][inter][hidden].
extern "C" __global__ void __launch_bounds__(256)
    gate_up_silu_fp8(const bf16* __restrict__ x, const int* __restrict__ ids,
                     const unsigned* __restrict__ wg, const unsigned* __restrict__ wu,
                     bf16* __restrict__ act, unsigned rows, unsigned hidden, unsigned inter,
                     unsigned experts, unsigned k, unsigned block_n, unsigned block_k) {
    pdl_wait();
    pdl_launch_dependents();
    if (block_n == 0u || block_k == 0u) {
        return;
    }
    moe_gate_up_quant(x, ids, act, rows, hidden, inter, experts, k,
                      MoeFp8GateUp{wg, wu, inter, hidden, block_n, block_k});
}

// gate_up_silu on int4 experts: wg, wu the stacked blobs of [experts][inter][hidden].
extern "C" __global__ void __launch_bounds__(256)
    gate_up_silu_int4(const bf16* __restrict__ x, const int* __restrict__ ids,
                      const unsigned* __restrict__ wg, const unsigned* __restrict__ wu,
                      bf16* __restrict__ act, unsigned rows, unsigned hidden, unsigned inter,
                      unsigned experts, unsigned k, unsigned group) {
    pdl_wait();
    pdl_launch_dependents();
    if (group == 0u || (hidden & 1u) != 0u) {
        return;
    }
    moe_gate_up_quant(x, ids, act, rows, hidden, inter, experts, k,
                      MoeInt4GateUp{wg, wu, inter, hidden, group});
}

// down on fp8 experts: wd the stacked blob of [experts][hidden][inter].
extern "C" __global__ void __launch_bounds__(256)
    down_fp8(const bf16* __restrict__ act, const int* __restrict__ ids,
             const float* __restrict__ weights, const unsigned* __restrict__ wd,
             bf16* __restrict__ out, unsigned rows, unsigned hidden, unsigned inter,
             unsigned experts, unsigned k, unsigned block_n, unsigned block_k) {
    pdl_wait();
    pdl_launch_dependents();
    if (block_n == 0u || block_k == 0u) {
        return;
    }
    moe_down_quant(act, ids, weights, out, rows, hidden, inter, experts, k,
                   MoeFp8Down{wd, hidden, inter, block_n, block_k});
}

// down on int4 experts: wd the stacked blob of [experts][hidden][inter].
extern "C" __global__ void __launch_bounds__(256)
    down_int4(const bf16* __restrict__ act, const int* __restrict__ ids,
              const float* __restrict__ weights, const unsigned* __restrict__ wd,
              bf16* __restrict__ out, unsigned rows, unsigned hidden, unsigned inter,
              unsigned experts, unsigned k, unsigned group) {
    pdl_wait();
    pdl_launch_dependents();
    if (group == 0u || (inter & 1u) != 0u) {
        return;
    }
    moe_down_quant(act, ids, weights, out, rows, hidden, inter, experts, k,
                   MoeInt4Down{wd, hidden, inter, group});
}

// ---- the shared expert ---------------------------------------------------------------------

// out bf16[rows·hidden] = bf16(routed + sigmoid(gate[r]) · shared), in f32 (gate bf16[rows], the
// shared-expert gate projection). Elementwise: 256 threads, 4 elements each, grid-stride.
extern "C" __global__ void __launch_bounds__(256) combine_shared(const bf16* __restrict__ routed,
                                                                 const bf16* __restrict__ shared,
                                                                 const bf16* __restrict__ gate,
                                                                 bf16* __restrict__ out,
                                                                 unsigned rows, unsigned hidden) {
    pdl_wait();
    pdl_launch_dependents();
    if (hidden == 0u) {
        return;
    }
    const unsigned long long n = (unsigned long long)rows * hidden;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x * 4ull;
    for (unsigned long long base = (unsigned long long)blockIdx.x * blockDim.x * 4ull; base < n;
         base += stride) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            unsigned long long i = base + (unsigned long long)e * blockDim.x + threadIdx.x;
            if (i < n) {
                const float s = sigmoid_f32(to_f32(gate[i / hidden]));
                out[i] = to_bf16(__fadd_rn(to_f32(routed[i]), __fmul_rn(s, to_f32(shared[i]))));
            }
        }
    }
}

// combine_shared with the shared-expert gate's projection computed inside: gate = bf16(x[r] · wg
// + bg) (a one-feature projection, wg bf16[k], bg bf16[1] or null: `warp_dot` and
// `linear_value`, gemv::linear's bits), then combine_shared's arithmetic on each element, so
// the bytes are those of gemv::linear then combine_shared. One block of 256 threads per row
// (grid-stride): warp 0 the dot, then every thread the row's elements.
extern "C" __global__ void __launch_bounds__(256)
    gate_combine_shared(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                        const bf16* __restrict__ bg, const bf16* __restrict__ routed,
                        const bf16* __restrict__ shared, bf16* __restrict__ out, unsigned rows,
                        unsigned hidden, unsigned k) {
    pdl_wait();
    pdl_launch_dependents();
    if (hidden == 0u) {
        return;
    }
    __shared__ float gate;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        if (threadIdx.x < 32u) {
            const float d = warp_dot(x + (unsigned long long)r * k, wg, k, threadIdx.x);
            if (threadIdx.x == 0u) {
                gate = sigmoid_f32(to_f32(linear_value(d, bg, 0u)));
            }
        }
        __syncthreads();
        const float s = gate;
        const unsigned long long at = (unsigned long long)r * hidden;
        for (unsigned i = threadIdx.x; i < hidden; i += blockDim.x) {
            out[at + i] =
                to_bf16(__fadd_rn(to_f32(routed[at + i]), __fmul_rn(s, to_f32(shared[at + i]))));
        }
        __syncthreads(); // the next row's gate waits for every thread's read of this one
    }
}
