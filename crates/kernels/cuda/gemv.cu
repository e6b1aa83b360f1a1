// `gemv` module: projections (weights `[out][in]` bf16, f32 accumulation) and their fusions
// with the residual add, RMSNorm, SiLU·mul and the residual epilogue.
//
// Two launch shapes per projection kernel (host side: model-layers kernels/gemv), the same
// bytes:
//  - streaming entries `<kernel>_r1`, `_r2`, `_r4`, `_r8` (the default; `gemv_stream`): one
//    entry per row tile, each with its own __launch_bounds__ and register budget; block = 256
//    threads (8 warps); grid.x = row groups of the tile's rows, grid.y = feature blocks capped
//    at 1056 blocks in all (a persistent loop: warp g of a row group takes features g, g +
//    warps, ...). Each block stages its rows' x once (16-byte loads and stores, 8 elements per
//    thread; the norm's 1/rms once per row per block: the whole block loads the rows' residual
//    values into shared memory in one pass when they fit (rows · k <= 8192), else each row's
//    warp issues its loads 8 iterations ahead), then streams weight tiles with the next tile
//    in registers while the current one computes.
//    k longer than the stage (16384 elements over the tile's rows) is staged in spans, once per
//    span per block, with one feature per warp (no cap) so no span is staged twice. A launch
//    with grid.z > 1 and a scratch splits k (split-K, below): the same bytes.
//  - classic entries `<kernel>` (the `gemv_classic` lever; `gemv_run`): one warp per output
//    feature, 8 features per block; grid.x = row groups of 8 rows (the fastest index, so the
//    row groups that share a weight tile run side by side and read it from L2), grid.y =
//    feature blocks (grid-stride when there are more than 65535); all row counts in one entry,
//    the norm recomputed per block by one warp per row.
// Every entry calls pdl_wait, then pdl_launch_dependents (common.cuh), before it reads an
// activation or writes anything; a streaming entry first puts its first weight tile in flight.
// Static shared memory only. `qkv_rope_kv` has only the classic shape, with grid.y = one block
// per whole q, k or v head, for its head epilogue (rope, qk-norm, the KV write), or several
// blocks per head whose last gathers it (split heads).
//
// Every dot and norm has one order, in every entry:
//  - x is staged into shared memory as bf16: copied from x (reference kernels), or recomputed
//    from h (+ d) with the 1/rms of `row_inv_rms` (lane l sums i = l, l + 32, ... with fma, then
//    warp_sum) and `norm_value`, exactly the bytes norm::rms_norm / norm::add_rms_norm store;
//  - each warp streams a feature's weight row(s) with 16-byte loads, in DOT_SEG (1024-element)
//    segments: lane l takes the segment's chunks of 8 elements c ≡ l mod 32, in increasing
//    order, multiplies against every staged row and accumulates with fma in element order from
//    +0; the butterfly `warp_sum` gives the segment's sum (`segment_end`), and the dot is the
//    segment sums added in order (`dot_fold`, common.cuh `warp_dot`).
// So a dot's order depends only on k: the same in every kernel and entry, at every row count,
// in any row position and at any split, which makes each fused kernel byte-identical to its
// reference routing and each streaming (or split) entry to its classic one.
#include "common.cuh"

#define GEMV_WARPS 8u            // output features per block, one warp each
#define GEMV_ROWS 8u             // rows per block (grid.x covers the row groups)
#define GEMV_SEG 2048u           // x elements staged per pass
#define GEMV_LANE_CHUNKS 8u      // GEMV_SEG / 8 / 32: chunks of 8 per lane per pass

// ---- x sources -----------------------------------------------------------------------------

// bf16 rows x[rows][k] (the reference projections).
struct XRows {
    const bf16* x;
    static constexpr unsigned INV_PER_ROW = 1u; // floats of `inv` per row (none used)
    __device__ __forceinline__ void prologue(unsigned, unsigned, unsigned, float*) const {}
    __device__ __forceinline__ bf16 value(unsigned, unsigned r, unsigned i, unsigned k, bool,
                                          const float*) const {
        return x[(unsigned long long)r * k + i];
    }
};

// RMSNorm (weight wn) of h[rows][k], plus d when d != null (residual add fused), with the sum
// optionally stored to h_out by the blocks of the first feature block.
struct XNormRows {
    const float* h;
    const bf16* d;
    const bf16* wn;
    float* h_out;
    float eps;
    static constexpr unsigned INV_PER_ROW = 1u; // the row's 1/rms
    // 1/rms of the block's rows, one warp per row (GEMV_ROWS == GEMV_WARPS).
    __device__ __forceinline__ void prologue(unsigned r0, unsigned nrows, unsigned k,
                                             float* inv) const {
        const unsigned warp = threadIdx.x >> 5;
        if (warp < nrows) {
            const unsigned long long at = (unsigned long long)(r0 + warp) * k;
            const float v = row_inv_rms(h + at, d != nullptr ? d + at : nullptr, k, eps,
                                        threadIdx.x & 31u);
            if ((threadIdx.x & 31u) == 0) {
                inv[warp] = v;
            }
        }
    }
    __device__ __forceinline__ bf16 value(unsigned rr, unsigned r, unsigned i, unsigned k,
                                          bool store_sum, const float* inv) const {
        const unsigned long long at = (unsigned long long)r * k;
        const float v = row_value(h + at, d != nullptr ? d + at : nullptr, i);
        if (store_sum && h_out != nullptr) {
            h_out[at + i] = v;
        }
        return norm_value(v, inv[rr], wn[i]);
    }
};

// Gated DeltaNet's gated RMSNorm (gdn::gated_norm) of core bf16[rows][nv·dv] (k = nv·dv): element
// i of row r, in v head vh = i / dv, is bf16(((x · inv) · w[i − vh·dv]) · silu(z)), z at
// hd.z_source(vh) + (i − vh·dv) of the row's qkvz, inv the (row, head)'s 1/rms over its dv
// values in `warp_sum_squares` order: the bytes gdn::gated_norm stores. `inv` holds
// GEMV_GATED_HEADS floats per row (a launch with more v heads does nothing).
#define GEMV_GATED_HEADS 128u
struct XGatedNormRows {
    const bf16* core;
    const bf16* qkvz;
    const bf16* w;
    GdnHeads hd;
    float eps;
    static constexpr unsigned INV_PER_ROW = GEMV_GATED_HEADS;
    // 1/rms of each (row, v head) of the block's rows: warp g takes pairs g, g + warps, ...
    __device__ __forceinline__ void prologue(unsigned r0, unsigned nrows, unsigned k,
                                             float* inv) const {
        const unsigned lane = threadIdx.x & 31u;
        const unsigned warps = blockDim.x >> 5;
        for (unsigned p = threadIdx.x >> 5; p < nrows * hd.nv; p += warps) {
            const unsigned rr = p / hd.nv;
            const unsigned vh = p - rr * hd.nv;
            const bf16* x = core + (unsigned long long)(r0 + rr) * k + vh * hd.dv;
            const float ss =
                warp_sum_squares([&](unsigned e) { return to_f32(x[e]); }, hd.dv, lane);
            if (lane == 0) {
                inv[rr * GEMV_GATED_HEADS + vh] = inv_rms(ss, hd.dv, eps);
            }
        }
    }
    __device__ __forceinline__ bf16 value(unsigned rr, unsigned r, unsigned i, unsigned k, bool,
                                          const float* inv) const {
        const unsigned vh = i / hd.dv;
        return at(rr, r, i, vh, i - vh * hd.dv, k, inv);
    }
    // Element i of row r, in v head vh at e = i − vh·dv.
    __device__ __forceinline__ bf16 at(unsigned rr, unsigned r, unsigned i, unsigned vh,
                                       unsigned e, unsigned k, const float* inv) const {
        const float x = to_f32(core[(unsigned long long)r * k + i]);
        const float z = to_f32(qkvz[(unsigned long long)r * hd.qkvz_row + hd.z_source(vh) + e]);
        const float y = __fmul_rn(__fmul_rn(x, inv[rr * GEMV_GATED_HEADS + vh]), to_f32(w[e]));
        return to_bf16(__fmul_rn(y, silu_f32(z)));
    }
};

// The gated-norm source of a launch and the k its projection runs over: k itself, or 0 (the
// launch then does nothing) for a geometry the CPU twin refuses, k other than nv·dv, or more
// than GEMV_GATED_HEADS v heads.
__device__ __forceinline__ unsigned gated_source(XGatedNormRows& src, const bf16* core,
                                                 const bf16* qkvz, const bf16* wn, unsigned nk,
                                                 unsigned dk, unsigned nv, unsigned dv,
                                                 unsigned k, float eps) {
    src.core = core;
    src.qkvz = qkvz;
    src.w = wn;
    src.eps = eps;
    const bool ok = src.hd.init(nk, dk, nv, dv) && nv <= GEMV_GATED_HEADS &&
                    (unsigned long long)nv * dv == k;
    return ok ? k : 0u;
}

// ---- output maps: which weight row(s) feature f reads, and what it stores ------------------

__device__ __forceinline__ const bf16* weight_row(const bf16* w, unsigned f, unsigned k) {
    return w + (unsigned long long)f * k;
}

// y bf16[rows][n] = bf16(dot + bias).
struct MapLinear {
    const bf16* w;
    const bf16* bias;
    bf16* y;
    unsigned n;
    __device__ __forceinline__ void rows(unsigned f, unsigned k, const bf16** out) const {
        out[0] = weight_row(w, f, k);
    }
    __device__ __forceinline__ void store(unsigned r, unsigned f, const float* s) const {
        y[(unsigned long long)r * n + f] = linear_value(s[0], bias, f);
    }
};

// logits f32[rows][vocab] = dot.
// A row whose `want` flag (i32[rows]; null: every row) is 0 is not stored: its logits row stays
// as it was (the step's want-logits flags: nobody reads that row). A block none of whose rows
// is wanted returns before it streams a weight (`gemv_wants`).
struct MapLogits {
    const bf16* w;
    float* logits;
    unsigned vocab;
    const int* want;
    __device__ __forceinline__ void rows(unsigned f, unsigned k, const bf16** out) const {
        out[0] = weight_row(w, f, k);
    }
    __device__ __forceinline__ void store(unsigned r, unsigned f, const float* s) const {
        if (row_wanted(want, r)) {
            logits[(unsigned long long)r * vocab + f] = s[0];
        }
    }
};

// Features [0, nq) are q, then nkv of k, then nkv of v; each stored as `linear` stores it.
struct MapQkv {
    const bf16* wq;
    const bf16* bq;
    const bf16* wk;
    const bf16* bk;
    const bf16* wv;
    const bf16* bv;
    bf16* q;
    bf16* k_out;
    bf16* v;
    unsigned nq;
    unsigned nkv;
    __device__ __forceinline__ void rows(unsigned f, unsigned k, const bf16** out) const {
        if (f < nq) {
            out[0] = weight_row(wq, f, k);
        } else if (f < nq + nkv) {
            out[0] = weight_row(wk, f - nq, k);
        } else {
            out[0] = weight_row(wv, f - nq - nkv, k);
        }
    }
    __device__ __forceinline__ void store(unsigned r, unsigned f, const float* s) const {
        if (f < nq) {
            q[(unsigned long long)r * nq + f] = linear_value(s[0], bq, f);
        } else if (f < nq + nkv) {
            const unsigned o = f - nq;
            k_out[(unsigned long long)r * nkv + o] = linear_value(s[0], bk, o);
        } else {
            const unsigned o = f - nq - nkv;
            v[(unsigned long long)r * nkv + o] = linear_value(s[0], bv, o);
        }
    }
};

// Two projections of one input of unrelated widths (siblings): features [0, n1) are y1's,
// then n2 of y2's; each stored as `linear` stores it, so the bytes of two `linear` launches.
struct MapPair {
    const bf16* w1;
    const bf16* b1;
    const bf16* w2;
    const bf16* b2;
    bf16* y1;
    bf16* y2;
    unsigned n1;
    unsigned n2;
    __device__ __forceinline__ void rows(unsigned f, unsigned k, const bf16** out) const {
        out[0] = f < n1 ? weight_row(w1, f, k) : weight_row(w2, f - n1, k);
    }
    __device__ __forceinline__ void store(unsigned r, unsigned f, const float* s) const {
        if (f < n1) {
            y1[(unsigned long long)r * n1 + f] = linear_value(s[0], b1, f);
        } else {
            const unsigned o = f - n1;
            y2[(unsigned long long)r * n2 + o] = linear_value(s[0], b2, o);
        }
    }
};

// Gate and up rows of feature f; act = silu(bf16 gate) · bf16 up, as linear ×2 → silu_mul.
struct MapGateUp {
    const bf16* wg;
    const bf16* wu;
    bf16* act;
    unsigned inter;
    __device__ __forceinline__ void rows(unsigned f, unsigned k, const bf16** out) const {
        out[0] = weight_row(wg, f, k);
        out[1] = weight_row(wu, f, k);
    }
    __device__ __forceinline__ void store(unsigned r, unsigned f, const float* s) const {
        const bf16 gate = linear_value(s[0], nullptr, f);
        const bf16 up = linear_value(s[1], nullptr, f);
        act[(unsigned long long)r * inter + f] = silu_mul_value(gate, up);
    }
};

// h_out f32[rows][n] = h + bf16(dot + bias), as linear → residual_add.
struct MapResidual {
    const bf16* w;
    const bf16* bias;
    const float* h;
    float* h_out;
    unsigned n;
    __device__ __forceinline__ void rows(unsigned f, unsigned k, const bf16** out) const {
        out[0] = weight_row(w, f, k);
    }
    __device__ __forceinline__ void store(unsigned r, unsigned f, const float* s) const {
        const unsigned long long at = (unsigned long long)r * n + f;
        h_out[at] = residual_value(h[at], linear_value(s[0], bias, f));
    }
};

#define GEMV_HEAD_DIM_MAX 256u // the widest head a q/k/v-with-rope block stages

// One head of q, k or v (features [f_base, f_base + head_dim) of the q | k | v layout of
// `MapQkv`): each value rounded as `linear` stores it, into the block's shared head buffer
// ys[row - r0][feature - f_base], for the head epilogue.
struct MapHead {
    const bf16* wq;
    const bf16* bq;
    const bf16* wk;
    const bf16* bk;
    const bf16* wv;
    const bf16* bv;
    bf16 (*ys)[GEMV_HEAD_DIM_MAX];
    unsigned nq;
    unsigned nkv;
    unsigned r0;
    unsigned f_base;
    __device__ __forceinline__ void rows(unsigned f, unsigned k, const bf16** out) const {
        if (f < nq) {
            out[0] = weight_row(wq, f, k);
        } else if (f < nq + nkv) {
            out[0] = weight_row(wk, f - nq, k);
        } else {
            out[0] = weight_row(wv, f - nq - nkv, k);
        }
    }
    __device__ __forceinline__ bf16 value(unsigned f, float dot) const {
        if (f < nq) {
            return linear_value(dot, bq, f);
        }
        if (f < nq + nkv) {
            return linear_value(dot, bk, f - nq);
        }
        return linear_value(dot, bv, f - nq - nkv);
    }
    __device__ __forceinline__ void store(unsigned r, unsigned f, const float* s) const {
        ys[r - r0][f - f_base] = value(f, s[0]);
    }
};

// `MapHead`'s values, each stored as its bf16 bits in a u32 word of vals[row][feature] (the
// split head's scratch: the part of a head one block computes, for the last part to gather).
struct MapHeadParts {
    MapHead head;
    unsigned* vals;
    unsigned features;
    __device__ __forceinline__ void rows(unsigned f, unsigned k, const bf16** out) const {
        head.rows(f, k, out);
    }
    __device__ __forceinline__ void store(unsigned r, unsigned f, const float* s) const {
        vals[(unsigned long long)r * features + f] = bf16_bits(head.value(f, s[0]));
    }
};

// ---- weight rows: where a feature's weights come from, 8 bf16 at a time -------------------
//
// A row's `load8(i0, valid)` gives elements [i0, i0 + 8) as 8 packed bf16 bits (`load8_bits`'
// packing), those at or past `valid` +0. A quantized row dequantises in registers (common.cuh
// `dequant_*_bits`), so the dot reads exactly the dequantised bf16 matrix and its arithmetic is
// the bf16 kernel's.

struct RowBf16 {
    const bf16* p;
    bool vec;
    __device__ __forceinline__ uint4 load8(unsigned i0, unsigned valid) const {
        return load8_bits(p + i0, valid, vec);
    }
};

// A one-matrix map (`MapLinear`, `MapLogits`, `MapResidual`) whose weight is quantized: the
// base map stores, the matrix W hands the rows.
template <class Base, class W>
struct MapQuant {
    Base base;
    W w;
    using Row = typename W::Row;
    __device__ __forceinline__ void weights(unsigned f, unsigned k, Row* out) const {
        out[0] = w.row(f, k);
    }
    __device__ __forceinline__ void store(unsigned r, unsigned f, const float* s) const {
        base.store(r, f, s);
    }
};

// Whether a block of rows [r0, r0 + n) has a row its map stores: only the LM head's map
// (`MapLogits`, bf16 or quantized) skips rows; every other map stores them all.
template <class Map>
__device__ __forceinline__ bool gemv_wants(const Map&, unsigned, unsigned) {
    return true;
}
__device__ __forceinline__ bool gemv_wants(const MapLogits& m, unsigned r0, unsigned n) {
    return rows_wanted(m.want, r0, r0 + n);
}
template <class W>
__device__ __forceinline__ bool gemv_wants(const MapQuant<MapLogits, W>& m, unsigned r0,
                                           unsigned n) {
    return gemv_wants(m.base, r0, n);
}

// The weight rows of feature f as rows with `load8`: a map with a `Row` type hands them
// (`weights`); a bf16 map's `rows` pointers become `RowBf16`s.
template <class T>
struct VoidOf {
    using type = void;
};
template <class Map, class = void>
struct WeightRows {
    using Row = RowBf16;
    template <unsigned NW>
    __device__ __forceinline__ static void get(const Map& map, unsigned f, unsigned k,
                                               Row (&out)[NW]) {
        const bf16* p[NW];
        map.rows(f, k, p);
#pragma unroll
        for (unsigned n = 0; n < NW; ++n) {
            out[n] = RowBf16{p[n], aligned16(p[n])};
        }
    }
};
template <class Map>
struct WeightRows<Map, typename VoidOf<typename Map::Row>::type> {
    using Row = typename Map::Row;
    template <unsigned NW>
    __device__ __forceinline__ static void get(const Map& map, unsigned f, unsigned k,
                                               Row (&out)[NW]) {
        map.weights(f, k, out);
    }
};

// ---- the projection body -------------------------------------------------------------------

// The end of a dot segment (DOT_SEG, common.cuh): for each weight row n and row rr, the
// butterfly sum of the lane partials acc[n][rr] (every lane gets it) is handed to
// take(n, rr, sum) on lane rr only, and the partials start again from +0.
template <unsigned NW, unsigned RT, class Take>
__device__ __forceinline__ void segment_end(float (&acc)[NW][RT], unsigned lane,
                                            const Take& take) {
#pragma unroll
    for (unsigned n = 0; n < NW; ++n) {
#pragma unroll
        for (unsigned rr = 0; rr < RT; ++rr) {
            const float sum = warp_sum(acc[n][rr]);
            acc[n][rr] = 0.0f;
            if (lane == rr) {
                take(n, rr, sum);
            }
        }
    }
}

// RT rows in registers (RT >= the block's row count; extra rows are staged as zeros and never
// stored), NW weight rows per feature (2 for gate/up).
// Feature blocks fb0, fb0 + fb_step, ... cover features [f_base, f_base + features); the sum of
// a fused residual add is stored (when the source stores it) by the first feature block of the
// block where sum_block holds.
template <unsigned RT, unsigned NW, class Src, class Map>
__device__ __forceinline__ void gemv_block(const Src& src, const Map& map, unsigned r0,
                                           unsigned nrows, unsigned k, unsigned fb0,
                                           unsigned fb_step, unsigned f_base, unsigned features,
                                           bool sum_block, bf16 (*xs)[GEMV_SEG],
                                           const float* inv) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned segments = (k + GEMV_SEG - 1u) / GEMV_SEG;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (unsigned fb = fb0; fb * GEMV_WARPS < features; fb += fb_step) {
        const bool active = fb * GEMV_WARPS + warp < features;
        const unsigned f = f_base + (active ? fb * GEMV_WARPS + warp : 0u);
        const bool store_sum = sum_block && fb == fb0;
        typename WeightRows<Map>::Row wrow[NW];
        WeightRows<Map>::get(map, f, k, wrow);
        float acc[NW][RT]; // this dot segment's lane partials
        float tot[NW];     // lane rr: row rr's dot so far (`dot_fold` of the segment sums)
#pragma unroll
        for (unsigned n = 0; n < NW; ++n) {
            tot[n] = 0.0f;
#pragma unroll
            for (unsigned rr = 0; rr < RT; ++rr) {
                acc[n][rr] = 0.0f;
            }
        }
        for (unsigned seg = 0; seg < segments; ++seg) {
            const unsigned seg_base = seg * GEMV_SEG;
            // This segment's weights, in flight while the block stages x.
            uint4 wbits[NW][GEMV_LANE_CHUNKS];
#pragma unroll
            for (unsigned j = 0; j < GEMV_LANE_CHUNKS; ++j) {
                const unsigned i0 = seg_base + (j * 32u + lane) * 8u;
                const unsigned valid = i0 < k ? min(8u, k - i0) : 0u;
#pragma unroll
                for (unsigned n = 0; n < NW; ++n) {
                    wbits[n][j] = (active && valid > 0u) ? wrow[n].load8(i0, valid) : zero;
                }
            }
            __syncthreads(); // the previous pass's readers are done with xs
            for (unsigned idx = threadIdx.x; idx < RT * GEMV_SEG; idx += blockDim.x) {
                const unsigned rr = idx / GEMV_SEG;
                const unsigned i = seg_base + idx % GEMV_SEG;
                xs[rr][idx % GEMV_SEG] = (rr < nrows && i < k)
                                             ? src.value(rr, r0 + rr, i, k, store_sum, inv)
                                             : __ushort_as_bfloat16((unsigned short)0);
            }
            __syncthreads();
            if (active) {
#pragma unroll
                for (unsigned j = 0; j < GEMV_LANE_CHUNKS; ++j) {
                    const unsigned local = (j * 32u + lane) * 8u;
                    if (seg_base + local < k) {
                        float wf[NW][8];
#pragma unroll
                        for (unsigned n = 0; n < NW; ++n) {
                            widen8(wbits[n][j], wf[n]);
                        }
#pragma unroll
                        for (unsigned rr = 0; rr < RT; ++rr) {
                            float xf[8];
                            widen8(*reinterpret_cast<const uint4*>(&xs[rr][local]), xf);
#pragma unroll
                            for (unsigned n = 0; n < NW; ++n) {
#pragma unroll
                                for (unsigned e = 0; e < 8; ++e) {
                                    acc[n][rr] = __fmaf_rn(xf[e], wf[n][e], acc[n][rr]);
                                }
                            }
                        }
                    }
                    // The end of a dot segment (DOT_SEG, common.cuh) that exists: fold it in.
                    const unsigned ds_base = seg_base + (j - (DOT_SEG_LANE_CHUNKS - 1u)) * 256u;
                    if (j % DOT_SEG_LANE_CHUNKS == DOT_SEG_LANE_CHUNKS - 1u && ds_base < k) {
                        segment_end(acc, lane, [&](unsigned n, unsigned, float sum) {
                            tot[n] = dot_fold(tot[n], sum, ds_base / DOT_SEG);
                        });
                    }
                }
            }
        }
        // Epilogue: lane rr stores row rr.
        if (active && lane < nrows) {
            map.store(r0 + lane, f, tot);
        }
    }
}

// gemv_block at the smallest row tile that holds the block's rows.
template <unsigned NW, class Src, class Map>
__device__ __forceinline__ void gemv_rows(const Src& src, const Map& map, unsigned r0,
                                          unsigned nrows, unsigned k, unsigned fb0,
                                          unsigned fb_step, unsigned f_base, unsigned features,
                                          bool sum_block, bf16 (*xs)[GEMV_SEG],
                                          const float* inv) {
    if (nrows == 1u) {
        gemv_block<1, NW>(src, map, r0, nrows, k, fb0, fb_step, f_base, features, sum_block, xs,
                          inv);
    } else if (nrows == 2u) {
        gemv_block<2, NW>(src, map, r0, nrows, k, fb0, fb_step, f_base, features, sum_block, xs,
                          inv);
    } else if (nrows <= 4u) {
        gemv_block<4, NW>(src, map, r0, nrows, k, fb0, fb_step, f_base, features, sum_block, xs,
                          inv);
    } else {
        gemv_block<8, NW>(src, map, r0, nrows, k, fb0, fb_step, f_base, features, sum_block, xs,
                          inv);
    }
}

template <unsigned NW, class Src, class Map>
__device__ __forceinline__ void gemv_run(const Src& src, const Map& map, unsigned rows, unsigned k,
                                         unsigned features, float*) {
    __shared__ __align__(16) bf16 xs[GEMV_ROWS][GEMV_SEG];
    __shared__ float inv[GEMV_ROWS * Src::INV_PER_ROW];
    pdl_wait();
    pdl_launch_dependents();
    const unsigned r0 = blockIdx.x * GEMV_ROWS;
    if (r0 >= rows || k == 0u) {
        return; // the whole block: nothing to do
    }
    const unsigned nrows = min(GEMV_ROWS, rows - r0);
    if (!gemv_wants(map, r0, nrows)) {
        return; // no row of the block is stored (an LM head's rows nobody reads)
    }
    src.prologue(r0, nrows, k, inv);
    __syncthreads();
    gemv_rows<NW>(src, map, r0, nrows, k, blockIdx.y, gridDim.y, 0u, features, blockIdx.y == 0u,
                  xs, inv);
}

// ---- the streaming body --------------------------------------------------------------------
//
// A capped grid of persistent blocks (grid.x = row groups of RT rows, grid.y = feature blocks,
// at most 1056 in all: `stream_config` in model-layers kernels/gemv/stream.rs): each block
// stages its rows' x (and the norm: 1/rms once per row per block) into shared memory once,
// then each warp walks its features (warp g of a row group takes features g, g + warps, ...),
// a tile of GEMV_STREAM_CHUNKS / NW 16-byte chunks per lane and weight row at a time, the next
// tile's weights loaded into registers while the current one computes. When k does not fit
// the stage (GEMV_STREAM_STAGE elements for all RT rows), it is staged in spans, one staging
// per span per block: the grid then gives every warp one feature (no cap), so no span is
// staged twice.
// The dot of every (row, feature) is `gemv_block`'s: per 1024-element segment lane l takes
// chunks c ≡ l (mod 32) in increasing order, fma in element order, then warp_sum, the segment
// sums folded in order; the norm is `row_inv_rms`'s.

#define GEMV_STREAM_STAGE 16384u // staged x elements per block (32 KiB), all rows together
#define GEMV_STREAM_CHUNKS 8u    // 16-byte weight chunks per lane in flight per buffer

// 1/rms of one residual row, by one warp, in `row_inv_rms`'s order (lane l accumulates
// i = l, l + 32, ... with fma, then warp_sum), with GEMV_NORM_AHEAD iterations' loads issued
// before they are accumulated.
#define GEMV_NORM_AHEAD 8u
__device__ __forceinline__ float row_inv_rms_ahead(const float* h, const bf16* d, unsigned k,
                                                   float eps, unsigned lane) {
    float acc = 0.0f;
    for (unsigned base = lane; base < k; base += 32u * GEMV_NORM_AHEAD) {
        float v[GEMV_NORM_AHEAD];
#pragma unroll
        for (unsigned u = 0; u < GEMV_NORM_AHEAD; ++u) {
            const unsigned i = base + 32u * u;
            v[u] = i < k ? row_value(h, d, i) : 0.0f;
        }
#pragma unroll
        for (unsigned u = 0; u < GEMV_NORM_AHEAD; ++u) {
            if (base + 32u * u < k) {
                acc = __fmaf_rn(v[u], v[u], acc);
            }
        }
    }
    return inv_rms(warp_sum(acc), k, eps);
}

// 8 f32 at p as 8 values; `valid` of them read, the rest +0.
__device__ __forceinline__ void load8_f32(const float* p, unsigned valid, float out[8]) {
    if (valid >= 8u && aligned16(p)) {
        const float4 a = *reinterpret_cast<const float4*>(p);
        const float4 b = *reinterpret_cast<const float4*>(p + 4);
        out[0] = a.x;
        out[1] = a.y;
        out[2] = a.z;
        out[3] = a.w;
        out[4] = b.x;
        out[5] = b.y;
        out[6] = b.z;
        out[7] = b.w;
        return;
    }
#pragma unroll
    for (unsigned e = 0; e < 8u; ++e) {
        out[e] = e < valid ? p[e] : 0.0f;
    }
}

// 8 bf16 values packed as `widen8` reads them (element 2i in the low half of word i).
__device__ __forceinline__ uint4 pack8(const bf16 v[8]) {
    unsigned w[4];
#pragma unroll
    for (unsigned i = 0; i < 4u; ++i) {
        w[i] = (unsigned)bf16_bits(v[2 * i]) | ((unsigned)bf16_bits(v[2 * i + 1]) << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 8 staged x elements [i0, i0 + 8) of row r (elements at or past k are +0).
__device__ __forceinline__ uint4 stage8(const XRows& src, unsigned, unsigned r, unsigned i0,
                                        unsigned k, bool, const float*) {
    const bf16* p = src.x + (unsigned long long)r * k + i0;
    return load8_bits(p, min(8u, k - i0), aligned16(p));
}

__device__ __forceinline__ uint4 stage8(const XNormRows& src, unsigned rr, unsigned r,
                                        unsigned i0, unsigned k, bool store_sum,
                                        const float* inv) {
    const unsigned valid = min(8u, k - i0);
    const unsigned long long at = (unsigned long long)r * k + i0;
    float v[8];
    load8_f32(src.h + at, valid, v);
    if (src.d != nullptr) {
        float df[8];
        const bf16* dp = src.d + at;
        widen8(load8_bits(dp, valid, aligned16(dp)), df);
#pragma unroll
        for (unsigned e = 0; e < 8u; ++e) {
            v[e] = __fadd_rn(v[e], df[e]); // residual_value(h, d)
        }
    }
    if (store_sum && src.h_out != nullptr) {
        float* o = src.h_out + at;
        if (valid >= 8u && aligned16(o)) {
            *reinterpret_cast<float4*>(o) = make_float4(v[0], v[1], v[2], v[3]);
            *reinterpret_cast<float4*>(o + 4) = make_float4(v[4], v[5], v[6], v[7]);
        } else {
            for (unsigned e = 0; e < valid; ++e) {
                o[e] = v[e];
            }
        }
    }
    float wf[8];
    const bf16* wp = src.wn + i0;
    widen8(load8_bits(wp, valid, aligned16(wp)), wf);
    bf16 y[8];
#pragma unroll
    for (unsigned e = 0; e < 8u; ++e) {
        // norm_value(v, inv, wn): bf16((v · inv) · w); elements past k are staged +0.
        y[e] = e < valid ? to_bf16(__fmul_rn(__fmul_rn(v[e], inv[rr]), wf[e]))
                         : __ushort_as_bfloat16((unsigned short)0);
    }
    return pack8(y);
}

__device__ __forceinline__ uint4 stage8(const XGatedNormRows& src, unsigned rr, unsigned r,
                                        unsigned i0, unsigned k, bool, const float* inv) {
    const unsigned valid = min(8u, k - i0);
    unsigned vh = i0 / src.hd.dv; // the head and offset walk on with the elements, no division
    unsigned e = i0 - vh * src.hd.dv;
    unsigned words[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (unsigned j = 0; j < 8u; ++j) {
        if (j < valid) {
            words[j / 2u] |= (unsigned)bf16_bits(src.at(rr, r, i0 + j, vh, e, k, inv))
                             << (16u * (j % 2u));
            if (++e == src.hd.dv) {
                e = 0u;
                ++vh;
            }
        }
    }
    return make_uint4(words[0], words[1], words[2], words[3]); // pack8's layout
}

// 1/rms of the block's rows (XNormRows: warp rr takes row r0 + rr), once per block. When the
// rows' residual values fit the stage as f32, every thread loads a share of them into
// `scratch` (the stage, not yet holding x) in one pass of independent loads and each row's
// warp then runs its fma chain from shared memory; otherwise each warp loads its row with
// `row_inv_rms_ahead`. The same values and the same chain either way.
__device__ __forceinline__ void stream_prologue(const XRows&, unsigned, unsigned, unsigned,
                                                float*, float*) {}

__device__ __forceinline__ void stream_prologue(const XNormRows& src, unsigned r0,
                                                unsigned nrows, unsigned k, float* inv,
                                                float* scratch) {
    const unsigned warp = threadIdx.x >> 5;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned long long at0 = (unsigned long long)r0 * k;
    const float* h = src.h + at0;
    const bf16* d = src.d != nullptr ? src.d + at0 : nullptr;
    if ((unsigned long long)nrows * k <= GEMV_STREAM_STAGE / 2u) {
        for (unsigned idx = threadIdx.x; idx < nrows * k; idx += blockDim.x) {
            scratch[idx] = row_value(h, d, idx); // row idx / k, element idx % k
        }
        __syncthreads();
        if (warp < nrows) {
            const float* row = scratch + warp * k;
            const float ss = warp_sum_squares([&](unsigned i) { return row[i]; }, k, lane);
            if (lane == 0) {
                inv[warp] = inv_rms(ss, k, src.eps);
            }
        }
        return; // the first staging's barrier orders inv and the reuse of scratch
    }
    if (warp < nrows) {
        const unsigned long long at = (unsigned long long)warp * k;
        const float v = row_inv_rms_ahead(h + at, d != nullptr ? d + at : nullptr, k, src.eps,
                                          lane);
        if (lane == 0) {
            inv[warp] = v;
        }
    }
}

// XGatedNormRows: each (row, v head)'s 1/rms, as the classic entry's prologue.
__device__ __forceinline__ void stream_prologue(const XGatedNormRows& src, unsigned r0,
                                                unsigned nrows, unsigned k, float* inv,
                                                float*) {
    src.prologue(r0, nrows, k, inv);
}

// One tile's weights: feature f's NW rows, chunks j = 0..TC-1 of tile g of the k range
// [kb, ke) (element kb + (g·TC·32 + j·32 + lane)·8), +0 at or past ke or for an inactive warp.
template <unsigned NW, unsigned TC, class Map>
__device__ __forceinline__ void stream_load(const Map& map, bool active, unsigned f,
                                            unsigned g, unsigned kb, unsigned ke, unsigned k,
                                            unsigned lane, uint4 (&wbits)[NW][TC]) {
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const bf16* wrow[NW];
    map.rows(active ? f : 0u, k, wrow);
#pragma unroll
    for (unsigned j = 0; j < TC; ++j) {
        const unsigned i0 = kb + (g * TC * 32u + j * 32u + lane) * 8u;
#pragma unroll
        for (unsigned n = 0; n < NW; ++n) {
            wbits[n][j] = (active && i0 < ke)
                              ? load8_bits(wrow[n] + i0, min(8u, ke - i0), aligned16(wrow[n]))
                              : zero;
        }
    }
}

// ---- split-K -------------------------------------------------------------------------------
//
// A streaming launch with grid.z = S > 1 splits each dot's DOT_SEG segments (common.cuh) into
// S contiguous ranges of ⌈segments / S⌉, one per grid.z index (an index with no segment does
// nothing). Each warp stores every segment sum it computes to the scratch's partials, then
// counts in on its (row group, feature) counter; the last of the splits to count in reads the
// feature's segment sums back in segment order, folds them (`dot_fold`) and runs the store
// epilogue — the bits of the unsplit dot, whichever split arrives last — and sets the counter
// back to zero. Scratch (f32 words, `kernels::gemv::split` in model-layers): GEMV_SPLIT_COUNTERS
// u32 counters [row group][feature], then the partials [segment][weight row][row][feature].
#define GEMV_SPLIT_COUNTERS 4352u

__device__ __forceinline__ float* split_partial(float* scratch, unsigned seg, unsigned n,
                                                unsigned nw, unsigned r, unsigned rows,
                                                unsigned f, unsigned features) {
    return scratch + GEMV_SPLIT_COUNTERS +
           (((unsigned long long)seg * nw + n) * rows + r) * features + f;
}

template <unsigned RT, unsigned NW, class Src, class Map>
__device__ __forceinline__ void gemv_stream(const Src& src, const Map& map, unsigned rows,
                                            unsigned k, unsigned features, float* scratch) {
    constexpr unsigned TC = GEMV_STREAM_CHUNKS / NW; // chunks per lane and weight row per tile
    constexpr unsigned GE = TC * 256u;               // k elements per tile
    constexpr unsigned SPAN = GEMV_STREAM_STAGE / RT; // staged elements per row (a multiple of GE)
    static_assert(TC % DOT_SEG_LANE_CHUNKS == 0u, "a tile holds whole dot segments");
    __shared__ __align__(16) bf16 xs[GEMV_STREAM_STAGE];
    __shared__ float inv[RT * Src::INV_PER_ROW];
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warps = blockDim.x >> 5;
    const unsigned gw = blockIdx.y * warps + (threadIdx.x >> 5); // this warp in the grid
    const unsigned tw = gridDim.y * warps;                       // warps per row group
    const unsigned r0 = blockIdx.x * RT;
    // This block's k range [kb, ke): whole dot segments, all of k when unsplit.
    const unsigned segments = (k + DOT_SEG - 1u) / DOT_SEG;
    const bool split = gridDim.z > 1u && scratch != nullptr;
    const unsigned seg_per = split ? (segments + gridDim.z - 1u) / gridDim.z : segments;
    const unsigned live_splits = split && seg_per > 0u ? (segments + seg_per - 1u) / seg_per : 1u;
    const unsigned seg0 = split ? blockIdx.z * seg_per : 0u;
    const unsigned kb = min(k, seg0 * DOT_SEG);
    const unsigned ke = split ? min(k, (seg0 + seg_per) * DOT_SEG) : k;
    const unsigned len = ke - kb;
    const unsigned groups = (len + GE - 1u) / GE;       // tiles per feature
    const unsigned spans = (len + SPAN - 1u) / SPAN;
    constexpr unsigned per_span = SPAN / GE;            // tiles per staged span
    const unsigned rounds = (features + tw - 1u) / tw;  // features per warp (block-uniform)

    // The first tile's weights are in flight before the wait (no launch writes them).
    uint4 cur[NW][TC];
    stream_load<NW, TC>(map, gw < features && len > 0u, gw, 0u, kb, ke, k, lane, cur);
    pdl_wait();
    pdl_launch_dependents(); // the next launch's prologue may start; our writes stay ordered
    if (r0 >= rows || k == 0u || features == 0u || len == 0u ||
        (gridDim.z > 1u && blockIdx.z > 0u && !split)) {
        return; // the whole block: nothing to do (an empty split; a split without scratch
                // leaves it to grid.z index 0, which then runs unsplit)
    }
    const unsigned nrows = min(RT, rows - r0);
    if (!gemv_wants(map, r0, nrows)) {
        return; // as gemv_run: every split of the row group returns, so no counter moves
    }
    stream_prologue(src, r0, nrows, k, inv, reinterpret_cast<float*>(xs));
    const bool sum_block = blockIdx.y == 0u;

    float acc[NW][RT]; // this dot segment's lane partials
    float tot[NW];     // unsplit, lane rr: row rr's dot so far (`dot_fold` of the segment sums)
#pragma unroll
    for (unsigned n = 0; n < NW; ++n) {
        tot[n] = 0.0f;
#pragma unroll
        for (unsigned rr = 0; rr < RT; ++rr) {
            acc[n][rr] = 0.0f;
        }
    }
    // Tile (round, g): feature gw + round·tw, k elements kb + [g·GE, (g + 1)·GE).
    for (unsigned round = 0, g = 0; round < rounds;) {
        const unsigned f = gw + round * tw;
        const unsigned span = g / per_span;
        if (g % per_span == 0u && (round == 0u || spans > 1u)) {
            // Stage span `span` of every row (once per block when the range fits the stage).
            __syncthreads(); // inv is written; the previous span's readers are done
            const unsigned base = kb + span * SPAN;
            constexpr unsigned chunks = SPAN / 8u;
            for (unsigned idx = threadIdx.x; idx < RT * chunks; idx += blockDim.x) {
                const unsigned rr = idx / chunks;
                const unsigned i0 = base + (idx % chunks) * 8u;
                uint4 bits = make_uint4(0u, 0u, 0u, 0u);
                if (rr < nrows && i0 < ke) {
                    bits = stage8(src, rr, r0 + rr, i0, k, sum_block && round == 0u, inv);
                }
                *reinterpret_cast<uint4*>(&xs[rr * SPAN + (idx % chunks) * 8u]) = bits;
            }
            __syncthreads();
        }
        // The next tile's weights, in flight while this one computes.
        const bool last_tile = g + 1u == groups;
        const unsigned g_next = last_tile ? 0u : g + 1u;
        const unsigned round_next = last_tile ? round + 1u : round;
        const unsigned f_next = gw + round_next * tw;
        uint4 nxt[NW][TC];
        stream_load<NW, TC>(map, round_next < rounds && f_next < features, f_next, g_next, kb,
                            ke, k, lane, nxt);
        const bool active = f < features;
        if (active) {
#pragma unroll
            for (unsigned j = 0; j < TC; ++j) {
                const unsigned local = (g * TC * 32u + j * 32u + lane) * 8u;
                if (kb + local < ke) {
                    const unsigned at = local - span * SPAN;
                    float wf[NW][8];
#pragma unroll
                    for (unsigned n = 0; n < NW; ++n) {
                        widen8(cur[n][j], wf[n]);
                    }
#pragma unroll
                    for (unsigned rr = 0; rr < RT; ++rr) {
                        float xf[8];
                        widen8(*reinterpret_cast<const uint4*>(&xs[rr * SPAN + at]), xf);
#pragma unroll
                        for (unsigned n = 0; n < NW; ++n) {
#pragma unroll
                            for (unsigned e = 0; e < 8; ++e) {
                                acc[n][rr] = __fmaf_rn(xf[e], wf[n][e], acc[n][rr]);
                            }
                        }
                    }
                }
                // The end of a dot segment that exists: fold it in, or store it when split.
                const unsigned ds_base =
                    kb + (g * TC + j - (DOT_SEG_LANE_CHUNKS - 1u)) * 256u;
                if (j % DOT_SEG_LANE_CHUNKS == DOT_SEG_LANE_CHUNKS - 1u && ds_base < ke) {
                    const unsigned ds = ds_base / DOT_SEG;
                    segment_end(acc, lane, [&](unsigned n, unsigned rr, float sum) {
                        if (!split) {
                            tot[n] = dot_fold(tot[n], sum, ds);
                        } else if (rr < nrows) {
                            *split_partial(scratch, ds, n, NW, r0 + rr, rows, f, features) = sum;
                        }
                    });
                }
            }
        }
        if (last_tile && active && !split) {
            // Epilogue: lane rr stores row rr.
            if (lane < nrows) {
                map.store(r0 + lane, f, tot);
            }
        } else if (last_tile && active) {
            // Split: count in; the last split to arrive merges the feature's segment sums.
            unsigned* counter = reinterpret_cast<unsigned*>(scratch) +
                                (unsigned long long)blockIdx.x * features + f;
            __threadfence(); // this warp's segment sums are visible device-wide before it counts
            __syncwarp();
            unsigned arrived = 0u;
            if (lane == 0u) {
                arrived = counter_arrive(counter);
            }
            arrived = __shfl_sync(SOLDER_FULL_MASK, arrived, 0);
            if (arrived + 1u == live_splits) {
                __threadfence();
                if (lane < nrows) {
                    float s[NW];
#pragma unroll
                    for (unsigned n = 0; n < NW; ++n) {
                        float t = 0.0f;
                        for (unsigned ds = 0; ds < segments; ++ds) {
                            t = dot_fold(
                                t,
                                __ldcg(split_partial(scratch, ds, n, NW, r0 + lane, rows, f,
                                                     features)),
                                ds);
                        }
                        s[n] = t;
                    }
                    map.store(r0 + lane, f, s);
                }
                if (lane == 0u) {
                    counter_clear(counter); // zero again for the next launch
                }
            }
        }
#pragma unroll
        for (unsigned n = 0; n < NW; ++n) {
#pragma unroll
            for (unsigned j = 0; j < TC; ++j) {
                cur[n][j] = nxt[n][j];
            }
        }
        g = g_next;
        round = round_next;
    }
}

#define GEMV_KERNEL extern "C" __global__ void __launch_bounds__(256, 1)

// ---- reference kernels ---------------------------------------------------------------------

// x bf16[rows·k], w bf16[n_out·k], bias bf16[n_out]? → y bf16[rows·n_out].
GEMV_KERNEL linear(const bf16* __restrict__ x, const bf16* __restrict__ w,
                   const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows, unsigned k,
                   unsigned n_out, float* __restrict__ scratch) {
    gemv_run<1>(XRows{x}, MapLinear{w, bias, y, n_out}, rows, k, n_out, scratch);
}

// x bf16[rows·k], w bf16[vocab·k] → logits f32[rows·vocab].
GEMV_KERNEL lm_head(const bf16* __restrict__ x, const bf16* __restrict__ w,
                    float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k, unsigned vocab,
                    float* __restrict__ scratch) {
    gemv_run<1>(XRows{x}, MapLogits{w, logits, vocab, want}, rows, k, vocab, scratch);
}

// ---- quantized weights: the reference kernels reading an fp8 or int4 blob -------------------
//
// w is one blob laid out as circuit::format says (codes, then scales, then zero points), the
// format's parameters scalar arguments after the dimensions. Each weight is dequantised to
// bf16 in registers (`RowFp8`, `RowInt4`), then the bf16 kernel's arithmetic runs unchanged:
// the bytes of `linear` / `lm_head` on the dequantised matrix. Classic shape only.

// x bf16[rows·k], w fp8 blob [n_out·k] (scales of block_n × block_k), bias bf16[n_out]? → y.
GEMV_KERNEL linear_fp8(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                       const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                       unsigned k, unsigned n_out, unsigned block_n, unsigned block_k) {
    gemv_run<1>(XRows{x},
                MapQuant<MapLinear, WFp8>{MapLinear{nullptr, bias, y, n_out},
                                          WFp8{w, n_out, block_n, block_k}},
                rows, k, n_out, nullptr);
}

// x bf16[rows·k], w int4 blob [n_out·k] (scales and zero points per group), bias? → y.
GEMV_KERNEL linear_int4(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                        const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                        unsigned k, unsigned n_out, unsigned group) {
    gemv_run<1>(XRows{x},
                MapQuant<MapLinear, WInt4>{MapLinear{nullptr, bias, y, n_out},
                                           WInt4{w, n_out, group}},
                rows, k, n_out, nullptr);
}

// x bf16[rows·k], w fp8 blob [vocab·k] → logits f32[rows·vocab].
GEMV_KERNEL lm_head_fp8(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                        float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k, unsigned vocab,
                        unsigned block_n, unsigned block_k) {
    gemv_run<1>(XRows{x},
                MapQuant<MapLogits, WFp8>{MapLogits{nullptr, logits, vocab, want},
                                          WFp8{w, vocab, block_n, block_k}},
                rows, k, vocab, nullptr);
}

// x bf16[rows·k], w int4 blob [vocab·k] → logits f32[rows·vocab].
GEMV_KERNEL lm_head_int4(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                         float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k, unsigned vocab,
                         unsigned group) {
    gemv_run<1>(XRows{x},
                MapQuant<MapLogits, WInt4>{MapLogits{nullptr, logits, vocab, want},
                                           WInt4{w, vocab, group}},
                rows, k, vocab, nullptr);
}

// ---- fused kernels -------------------------------------------------------------------------

// RMSNorm of h f32[rows·k] (weight wn bf16[k]) then `linear`.
GEMV_KERNEL norm_linear(const float* __restrict__ h, const bf16* __restrict__ wn,
                        const bf16* __restrict__ w, const bf16* __restrict__ bias,
                        bf16* __restrict__ y, unsigned rows, unsigned k, unsigned n_out,
                        float eps, float* __restrict__ scratch) {
    gemv_run<1>(XNormRows{h, nullptr, wn, nullptr, eps}, MapLinear{w, bias, y, n_out}, rows, k,
                n_out, scratch);
}

// The q, k and v projections of one row set: x bf16[rows·k] → q, k_out, v.
GEMV_KERNEL qkv(const bf16* __restrict__ x, const bf16* __restrict__ wq,
                const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
                bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv,
                float* __restrict__ scratch) {
    gemv_run<1>(XRows{x}, MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k,
                nq + 2u * nkv, scratch);
}

// Two sibling projections of one row set (Gated DeltaNet's in_proj_qkvz and in_proj_ba):
// x bf16[rows·k], w1 bf16[n1·k], b1 bf16[n1]?, w2 bf16[n2·k], b2 bf16[n2]? → y1 bf16[rows·n1],
// y2 bf16[rows·n2].
GEMV_KERNEL linear_pair(const bf16* __restrict__ x, const bf16* __restrict__ w1,
                        const bf16* __restrict__ b1, const bf16* __restrict__ w2,
                        const bf16* __restrict__ b2, bf16* __restrict__ y1,
                        bf16* __restrict__ y2, unsigned rows, unsigned k, unsigned n1,
                        unsigned n2, float* __restrict__ scratch) {
    gemv_run<1>(XRows{x}, MapPair{w1, b1, w2, b2, y1, y2, n1, n2}, rows, k, n1 + n2, scratch);
}

// RMSNorm of h f32[rows·k] (weight wn) then `qkv`.
GEMV_KERNEL norm_qkv(const float* __restrict__ h, const bf16* __restrict__ wn,
                     const bf16* __restrict__ wq, const bf16* __restrict__ bq,
                     const bf16* __restrict__ wk, const bf16* __restrict__ bk,
                     const bf16* __restrict__ wv, const bf16* __restrict__ bv,
                     bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                     unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                     float* __restrict__ scratch) {
    gemv_run<1>(XNormRows{h, nullptr, wn, nullptr, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

// h f32 + d bf16 (→ h_out f32, optional), RMSNorm (weight wn), then `qkv`.
GEMV_KERNEL add_norm_qkv(const float* __restrict__ h, const bf16* __restrict__ d,
                         const bf16* __restrict__ wn, const bf16* __restrict__ wq,
                         const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                         const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                         const bf16* __restrict__ bv, float* __restrict__ h_out,
                         bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                         unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                         float* __restrict__ scratch) {
    gemv_run<1>(XNormRows{h, d, wn, h_out, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

// Gate and up projections (wg, wu bf16[inter·k]) of x bf16[rows·k], then
// act bf16[rows·inter] = silu(gate) · up.
GEMV_KERNEL gate_up_silu(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                         const bf16* __restrict__ wu, bf16* __restrict__ act, unsigned rows,
                         unsigned k, unsigned inter, float* __restrict__ scratch) {
    gemv_run<2>(XRows{x}, MapGateUp{wg, wu, act, inter}, rows, k, inter, scratch);
}

// RMSNorm of h f32[rows·k] (weight wn) then `gate_up_silu`.
GEMV_KERNEL norm_gate_up_silu(const float* __restrict__ h, const bf16* __restrict__ wn,
                              const bf16* __restrict__ wg, const bf16* __restrict__ wu,
                              bf16* __restrict__ act, unsigned rows, unsigned k, unsigned inter,
                              float eps, float* __restrict__ scratch) {
    gemv_run<2>(XNormRows{h, nullptr, wn, nullptr, eps}, MapGateUp{wg, wu, act, inter}, rows, k,
                inter, scratch);
}

// h f32 + o bf16 (→ h_out f32, optional), RMSNorm (weight wn), then `gate_up_silu`.
GEMV_KERNEL add_norm_gate_up_silu(const float* __restrict__ h, const bf16* __restrict__ o,
                                  const bf16* __restrict__ wn, const bf16* __restrict__ wg,
                                  const bf16* __restrict__ wu, float* __restrict__ h_out,
                                  bf16* __restrict__ act, unsigned rows, unsigned k,
                                  unsigned inter, float eps, float* __restrict__ scratch) {
    gemv_run<2>(XNormRows{h, o, wn, h_out, eps}, MapGateUp{wg, wu, act, inter}, rows, k, inter,
                scratch);
}

// `linear` of x bf16[rows·k], then h_out f32[rows·n_out] = h f32 + the bf16 projection.
GEMV_KERNEL linear_residual_add(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                const bf16* __restrict__ bias, const float* __restrict__ h,
                                float* __restrict__ h_out, unsigned rows, unsigned k,
                                unsigned n_out, float* __restrict__ scratch) {
    gemv_run<1>(XRows{x}, MapResidual{w, bias, h, h_out, n_out}, rows, k, n_out, scratch);
}

// Gated DeltaNet's gated_norm → linear → residual_add: the projection's x staged from core
// (XGatedNormRows), h_out = h + bf16(dot + bias) (MapResidual).
GEMV_KERNEL gated_norm_linear_residual_add(const bf16* __restrict__ core,
                                           const bf16* __restrict__ qkvz,
                                           const bf16* __restrict__ wn, const bf16* __restrict__ w,
                                           const bf16* __restrict__ bias,
                                           const float* __restrict__ h, float* __restrict__ h_out,
                                           unsigned rows, unsigned nk, unsigned dk, unsigned nv,
                                           unsigned dv, unsigned k, unsigned n_out, float eps,
                                           float* __restrict__ scratch) {
    XGatedNormRows src;
    const unsigned kk = gated_source(src, core, qkvz, wn, nk, dk, nv, dv, k, eps);
    gemv_run<1>(src, MapResidual{w, bias, h, h_out, n_out}, rows, kk, n_out, scratch);
}

// h f32 + d bf16, RMSNorm (weight wn bf16[k]), then `lm_head` → logits f32[rows·vocab].
GEMV_KERNEL add_norm_lm_head(const float* __restrict__ h, const bf16* __restrict__ d,
                             const bf16* __restrict__ wn, const bf16* __restrict__ w,
                             float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k,
                             unsigned vocab, float eps, float* __restrict__ scratch) {
    gemv_run<1>(XNormRows{h, d, wn, nullptr, eps}, MapLogits{w, logits, vocab, want}, rows, k, vocab,
                scratch);
}

// ---- q/k/v with the head epilogue (rope, optional qk-norm, the KV write) --------------------

// (h f32 + d bf16 when d != null → h_out f32, optional), RMSNorm (weight wn), the q/k/v
// projections, then per head what rope::rope_kv_write (qk_norm_rope_kv_write when qwn, kwn !=
// null) does with them: q heads roped (after qk-norm) into q_out, k heads roped into their cache
// slots, v heads copied beside them. Each value is rounded to bf16 as `linear` stores it before
// the head pass reads it, so the bytes are the separate kernels'.
//
// Launch: grid.x = row groups of 8, grid.y = heads + 2·kv_heads (q heads, k heads, v heads):
// one block owns one whole head (its rotary pairs and its qk-norm) for its rows, its 8 warps
// walking the head's head_dim features 8 at a time; the block's h_out is stored by the blocks of
// head 0. head_dim <= GEMV_HEAD_DIM_MAX (the CPU twin refuses more; the kernel stores nothing).
// Split heads (grid.y = (heads + 2·kv_heads) · P, with `scratch`): P blocks per head, block p
// computing features [p·⌈head_dim/P⌉, ...) of it, each value as `linear` stores it, to the
// scratch (GEMV_SPLIT_COUNTERS u32 counters [row group][head], then u32 words [row][feature]
// holding bf16 bits); the last of the head's P blocks to count in gathers the head into shared
// memory, sets the counter back to zero and runs the head epilogue: the bits of one block.
//
// AHEAD (the `qkv_rope_kv_ahead` entry, lever `qkv_norm_ahead`): before pdl_wait the block asks
// L2 for its features' weight rows (prefetch_l2: weights, which no launch writes), and the
// rows' 1/rms is `stream_prologue`'s — the whole block loads the rows' residual values into
// shared memory in one pass of independent loads, then each row's warp runs the fma chain of
// `row_inv_rms` from there (`row_inv_rms_ahead` past 8192 values) — where the classic entry's
// warp walks its row with one dependent round trip per 32 elements before any weight load is
// issued. The same values in the same order: the same bytes.
template <bool AHEAD>
__device__ __forceinline__ void qkv_rope_kv_body(
    const float* __restrict__ h, const bf16* __restrict__ d, const bf16* __restrict__ wn,
    const bf16* __restrict__ wq, const bf16* __restrict__ bq, const bf16* __restrict__ wk,
    const bf16* __restrict__ bk, const bf16* __restrict__ wv, const bf16* __restrict__ bv,
    const bf16* __restrict__ qwn, const bf16* __restrict__ kwn, const int* __restrict__ positions,
    const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
    float* __restrict__ h_out, bf16* __restrict__ q_out, bf16* __restrict__ cache, unsigned rows,
    unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
    unsigned block_size, unsigned num_pages, float eps, float qk_eps, float* __restrict__ scratch) {
    __shared__ __align__(16) bf16 xs[GEMV_ROWS][GEMV_SEG];
    __shared__ float inv[GEMV_ROWS];
    __shared__ bf16 ys[GEMV_ROWS][GEMV_HEAD_DIM_MAX];
    __shared__ unsigned gather;
    const unsigned all_heads = heads + 2u * kv_heads;
    // Split heads (grid.y = all_heads · parts, scratch given): part p of a head's features.
    const unsigned parts =
        scratch != nullptr && all_heads > 0u && gridDim.y > all_heads ? gridDim.y / all_heads : 1u;
    const unsigned r0 = blockIdx.x * GEMV_ROWS;
    const unsigned head = blockIdx.y / parts;
    const unsigned part = blockIdx.y % parts;
    const unsigned nq = heads * head_dim;
    const unsigned nkv = kv_heads * head_dim;
    const unsigned f_base = head * head_dim;
    const MapHead map{wq, bq, wk, bk, wv, bv, ys, nq, nkv, r0, f_base};
    if (AHEAD && r0 < rows && k > 0u && head_dim <= GEMV_HEAD_DIM_MAX && head < all_heads) {
        // This block's weight rows into L2, one 128-byte line per thread per pass.
        const unsigned per = (head_dim + parts - 1u) / parts;
        const unsigned f0 = min(head_dim, part * per);
        const unsigned nf = min(head_dim, f0 + per) - f0;
        const unsigned lines = (k * 2u + 127u) / 128u; // of one weight row
        for (unsigned idx = threadIdx.x; idx < nf * lines; idx += blockDim.x) {
            const bf16* row[1];
            map.rows(f_base + f0 + idx / lines, k, row);
            prefetch_l2(reinterpret_cast<const char*>(row[0]) + (idx % lines) * 128u);
        }
    }
    pdl_wait();
    pdl_launch_dependents();
    if (r0 >= rows || k == 0u || head_dim == 0u || head_dim > GEMV_HEAD_DIM_MAX ||
        head >= all_heads) {
        return; // the whole block: nothing to do
    }
    const unsigned nrows = min(GEMV_ROWS, rows - r0);
    const XNormRows src{h, d, wn, h_out, eps};
    if (AHEAD) {
        // xs (8 · 2048 bf16) holds GEMV_STREAM_STAGE / 2 f32: the one-pass path's limit.
        static_assert(sizeof(xs) >= GEMV_STREAM_STAGE / 2u * sizeof(float), "the norm's scratch");
        stream_prologue(src, r0, nrows, k, inv, reinterpret_cast<float*>(xs));
    } else {
        src.prologue(r0, nrows, k, inv);
    }
    __syncthreads();
    if (parts == 1u) {
        gemv_rows<1>(src, map, r0, nrows, k, 0u, 1u, f_base, head_dim, head == 0u, xs, inv);
        __syncthreads(); // every feature of the head is in ys
    } else {
        // This part's features, as `linear` stores them, to the scratch; the last part of the
        // head to count in gathers the whole head into ys (the same bits as one block).
        const unsigned features = nq + 2u * nkv;
        unsigned* vals = reinterpret_cast<unsigned*>(scratch) + GEMV_SPLIT_COUNTERS;
        const unsigned per = (head_dim + parts - 1u) / parts;
        const unsigned f0 = min(head_dim, part * per);
        const unsigned nf = min(head_dim, f0 + per) - f0;
        if (nf > 0u) {
            const MapHeadParts out{map, vals, features};
            gemv_rows<1>(src, out, r0, nrows, k, 0u, 1u, f_base + f0, nf,
                         head == 0u && part == 0u, xs, inv);
        }
        __threadfence(); // this part's values are visible device-wide before it counts in
        __syncthreads();
        if (threadIdx.x == 0u) {
            unsigned* counter = reinterpret_cast<unsigned*>(scratch) +
                                (unsigned long long)blockIdx.x * all_heads + head;
            const bool last = counter_arrive(counter) + 1u == parts;
            if (last) {
                counter_clear(counter); // every part has counted in: zero again for the next launch
            }
            gather = last ? 1u : 0u;
        }
        __syncthreads();
        if (gather == 0u) {
            return;
        }
        __threadfence();
        for (unsigned idx = threadIdx.x; idx < nrows * head_dim; idx += blockDim.x) {
            const unsigned rr = idx / head_dim;
            const unsigned i = idx % head_dim;
            const unsigned bits =
                __ldcg(vals + (unsigned long long)(r0 + rr) * features + f_base + i);
            ys[rr][i] = __ushort_as_bfloat16((unsigned short)bits);
        }
        __syncthreads();
    }

    // The head pass: warp rr takes row r0 + rr (GEMV_ROWS == GEMV_WARPS).
    const unsigned lane = threadIdx.x & 31u;
    const unsigned rr = threadIdx.x >> 5;
    if (rr >= nrows) {
        return;
    }
    const unsigned r = r0 + rr;
    const unsigned half = min(rotary_dim, head_dim) / 2u;
    const int position = positions[r];
    if (head < heads) {
        bf16* dst = q_out + ((unsigned long long)r * heads + head) * head_dim;
        head_transform(ys[rr], dst, head_dim, qwn, qk_eps, position, inv_freq, half, lane);
        return;
    }
    const int slot = slot_mapping[r];
    if (slot < 0 || (unsigned long long)slot >= (unsigned long long)num_pages * block_size) {
        return;
    }
    const unsigned page = (unsigned)slot / block_size;
    const unsigned offset = (unsigned)slot % block_size;
    if (head < heads + kv_heads) {
        const unsigned long long at = (unsigned long long)(head - heads) * head_dim;
        bf16* dst = cache + cache_offset(page, 0, offset, block_size, nkv) + at;
        head_transform(ys[rr], dst, head_dim, kwn, qk_eps, position, inv_freq, half, lane);
    } else {
        const unsigned long long at = (unsigned long long)(head - heads - kv_heads) * head_dim;
        bf16* dst = cache + cache_offset(page, 1, offset, block_size, nkv) + at;
        for (unsigned i = lane; i < head_dim; i += 32) {
            dst[i] = ys[rr][i];
        }
    }
}

GEMV_KERNEL qkv_rope_kv(const float* __restrict__ h, const bf16* __restrict__ d,
                        const bf16* __restrict__ wn, const bf16* __restrict__ wq,
                        const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                        const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                        const bf16* __restrict__ bv, const bf16* __restrict__ qwn,
                        const bf16* __restrict__ kwn, const int* __restrict__ positions,
                        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
                        float* __restrict__ h_out, bf16* __restrict__ q_out,
                        bf16* __restrict__ cache, unsigned rows, unsigned k, unsigned heads,
                        unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
                        unsigned block_size, unsigned num_pages, float eps, float qk_eps,
                        float* __restrict__ scratch) {
    qkv_rope_kv_body<false>(h, d, wn, wq, bq, wk, bk, wv, bv, qwn, kwn, positions, inv_freq,
                            slot_mapping, h_out, q_out, cache, rows, k, heads, kv_heads,
                            head_dim, rotary_dim, block_size, num_pages, eps, qk_eps, scratch);
}

// `qkv_rope_kv` with its weights asked for before the wait and its norm in one pass of
// independent loads (AHEAD above; lever `qkv_norm_ahead`): the same arguments and bytes.
GEMV_KERNEL qkv_rope_kv_ahead(const float* __restrict__ h, const bf16* __restrict__ d,
                              const bf16* __restrict__ wn, const bf16* __restrict__ wq,
                              const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                              const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                              const bf16* __restrict__ bv, const bf16* __restrict__ qwn,
                              const bf16* __restrict__ kwn, const int* __restrict__ positions,
                              const float* __restrict__ inv_freq,
                              const int* __restrict__ slot_mapping, float* __restrict__ h_out,
                              bf16* __restrict__ q_out, bf16* __restrict__ cache, unsigned rows,
                              unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
                              unsigned rotary_dim, unsigned block_size, unsigned num_pages,
                              float eps, float qk_eps, float* __restrict__ scratch) {
    qkv_rope_kv_body<true>(h, d, wn, wq, bq, wk, bk, wv, bv, qwn, kwn, positions, inv_freq,
                           slot_mapping, h_out, q_out, cache, rows, k, heads, kv_heads, head_dim,
                           rotary_dim, block_size, num_pages, eps, qk_eps, scratch);
}

// ---- streaming entries ---------------------------------------------------------------------
//
// Each projection kernel above (all but qkv_rope_kv, whose blocks own whole heads) again, as
// `gemv_stream` at one row tile per entry: `<name>_r1` for decode, `_r2`, `_r4`, `_r8` for up
// to 2, 4 and 8 rows per block (more rows take several blocks along grid.x), each with its
// own register budget. The emitter picks them by rows unless the `gemv_classic` lever keeps
// the entries above; the bytes are the same.
#define GEMV_STREAM_R1 extern "C" __global__ void __launch_bounds__(256, 2)
#define GEMV_STREAM_R2 extern "C" __global__ void __launch_bounds__(256, 2)
#define GEMV_STREAM_R4 extern "C" __global__ void __launch_bounds__(256, 2)
#define GEMV_STREAM_R8 extern "C" __global__ void __launch_bounds__(256, 2)

GEMV_STREAM_R1 linear_r1(const bf16* __restrict__ x, const bf16* __restrict__ w,
                         const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                         unsigned k, unsigned n_out, float* __restrict__ scratch) {
    gemv_stream<1, 1>(XRows{x}, MapLinear{w, bias, y, n_out}, rows, k, n_out, scratch);
}

GEMV_STREAM_R2 linear_r2(const bf16* __restrict__ x, const bf16* __restrict__ w,
                         const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                         unsigned k, unsigned n_out, float* __restrict__ scratch) {
    gemv_stream<2, 1>(XRows{x}, MapLinear{w, bias, y, n_out}, rows, k, n_out, scratch);
}

GEMV_STREAM_R4 linear_r4(const bf16* __restrict__ x, const bf16* __restrict__ w,
                         const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                         unsigned k, unsigned n_out, float* __restrict__ scratch) {
    gemv_stream<4, 1>(XRows{x}, MapLinear{w, bias, y, n_out}, rows, k, n_out, scratch);
}

GEMV_STREAM_R8 linear_r8(const bf16* __restrict__ x, const bf16* __restrict__ w,
                         const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                         unsigned k, unsigned n_out, float* __restrict__ scratch) {
    gemv_stream<8, 1>(XRows{x}, MapLinear{w, bias, y, n_out}, rows, k, n_out, scratch);
}

GEMV_STREAM_R1 lm_head_r1(const bf16* __restrict__ x, const bf16* __restrict__ w,
                          float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k, unsigned vocab,
                          float* __restrict__ scratch) {
    gemv_stream<1, 1>(XRows{x}, MapLogits{w, logits, vocab, want}, rows, k, vocab, scratch);
}

GEMV_STREAM_R2 lm_head_r2(const bf16* __restrict__ x, const bf16* __restrict__ w,
                          float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k, unsigned vocab,
                          float* __restrict__ scratch) {
    gemv_stream<2, 1>(XRows{x}, MapLogits{w, logits, vocab, want}, rows, k, vocab, scratch);
}

GEMV_STREAM_R4 lm_head_r4(const bf16* __restrict__ x, const bf16* __restrict__ w,
                          float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k, unsigned vocab,
                          float* __restrict__ scratch) {
    gemv_stream<4, 1>(XRows{x}, MapLogits{w, logits, vocab, want}, rows, k, vocab, scratch);
}

GEMV_STREAM_R8 lm_head_r8(const bf16* __restrict__ x, const bf16* __restrict__ w,
                          float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k, unsigned vocab,
                          float* __restrict__ scratch) {
    gemv_stream<8, 1>(XRows{x}, MapLogits{w, logits, vocab, want}, rows, k, vocab, scratch);
}

GEMV_STREAM_R1 norm_linear_r1(const float* __restrict__ h, const bf16* __restrict__ wn,
                              const bf16* __restrict__ w, const bf16* __restrict__ bias,
                              bf16* __restrict__ y, unsigned rows, unsigned k, unsigned n_out,
                              float eps, float* __restrict__ scratch) {
    gemv_stream<1, 1>(XNormRows{h, nullptr, wn, nullptr, eps}, MapLinear{w, bias, y, n_out}, rows, k,
                n_out, scratch);
}

GEMV_STREAM_R2 norm_linear_r2(const float* __restrict__ h, const bf16* __restrict__ wn,
                              const bf16* __restrict__ w, const bf16* __restrict__ bias,
                              bf16* __restrict__ y, unsigned rows, unsigned k, unsigned n_out,
                              float eps, float* __restrict__ scratch) {
    gemv_stream<2, 1>(XNormRows{h, nullptr, wn, nullptr, eps}, MapLinear{w, bias, y, n_out}, rows, k,
                n_out, scratch);
}

GEMV_STREAM_R4 norm_linear_r4(const float* __restrict__ h, const bf16* __restrict__ wn,
                              const bf16* __restrict__ w, const bf16* __restrict__ bias,
                              bf16* __restrict__ y, unsigned rows, unsigned k, unsigned n_out,
                              float eps, float* __restrict__ scratch) {
    gemv_stream<4, 1>(XNormRows{h, nullptr, wn, nullptr, eps}, MapLinear{w, bias, y, n_out}, rows, k,
                n_out, scratch);
}

GEMV_STREAM_R8 norm_linear_r8(const float* __restrict__ h, const bf16* __restrict__ wn,
                              const bf16* __restrict__ w, const bf16* __restrict__ bias,
                              bf16* __restrict__ y, unsigned rows, unsigned k, unsigned n_out,
                              float eps, float* __restrict__ scratch) {
    gemv_stream<8, 1>(XNormRows{h, nullptr, wn, nullptr, eps}, MapLinear{w, bias, y, n_out}, rows, k,
                n_out, scratch);
}

GEMV_STREAM_R1 qkv_r1(const bf16* __restrict__ x, const bf16* __restrict__ wq,
                      const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                      const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                      const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
                      bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv,
                      float* __restrict__ scratch) {
    gemv_stream<1, 1>(XRows{x}, MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k,
                nq + 2u * nkv, scratch);
}

GEMV_STREAM_R2 qkv_r2(const bf16* __restrict__ x, const bf16* __restrict__ wq,
                      const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                      const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                      const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
                      bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv,
                      float* __restrict__ scratch) {
    gemv_stream<2, 1>(XRows{x}, MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k,
                nq + 2u * nkv, scratch);
}

GEMV_STREAM_R4 qkv_r4(const bf16* __restrict__ x, const bf16* __restrict__ wq,
                      const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                      const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                      const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
                      bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv,
                      float* __restrict__ scratch) {
    gemv_stream<4, 1>(XRows{x}, MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k,
                nq + 2u * nkv, scratch);
}

GEMV_STREAM_R8 qkv_r8(const bf16* __restrict__ x, const bf16* __restrict__ wq,
                      const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                      const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                      const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
                      bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv,
                      float* __restrict__ scratch) {
    gemv_stream<8, 1>(XRows{x}, MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k,
                nq + 2u * nkv, scratch);
}

GEMV_STREAM_R1 linear_pair_r1(const bf16* __restrict__ x, const bf16* __restrict__ w1,
                              const bf16* __restrict__ b1, const bf16* __restrict__ w2,
                              const bf16* __restrict__ b2, bf16* __restrict__ y1,
                              bf16* __restrict__ y2, unsigned rows, unsigned k, unsigned n1,
                              unsigned n2, float* __restrict__ scratch) {
    gemv_stream<1, 1>(XRows{x}, MapPair{w1, b1, w2, b2, y1, y2, n1, n2}, rows, k, n1 + n2,
                      scratch);
}

GEMV_STREAM_R2 linear_pair_r2(const bf16* __restrict__ x, const bf16* __restrict__ w1,
                              const bf16* __restrict__ b1, const bf16* __restrict__ w2,
                              const bf16* __restrict__ b2, bf16* __restrict__ y1,
                              bf16* __restrict__ y2, unsigned rows, unsigned k, unsigned n1,
                              unsigned n2, float* __restrict__ scratch) {
    gemv_stream<2, 1>(XRows{x}, MapPair{w1, b1, w2, b2, y1, y2, n1, n2}, rows, k, n1 + n2,
                      scratch);
}

GEMV_STREAM_R4 linear_pair_r4(const bf16* __restrict__ x, const bf16* __restrict__ w1,
                              const bf16* __restrict__ b1, const bf16* __restrict__ w2,
                              const bf16* __restrict__ b2, bf16* __restrict__ y1,
                              bf16* __restrict__ y2, unsigned rows, unsigned k, unsigned n1,
                              unsigned n2, float* __restrict__ scratch) {
    gemv_stream<4, 1>(XRows{x}, MapPair{w1, b1, w2, b2, y1, y2, n1, n2}, rows, k, n1 + n2,
                      scratch);
}

GEMV_STREAM_R8 linear_pair_r8(const bf16* __restrict__ x, const bf16* __restrict__ w1,
                              const bf16* __restrict__ b1, const bf16* __restrict__ w2,
                              const bf16* __restrict__ b2, bf16* __restrict__ y1,
                              bf16* __restrict__ y2, unsigned rows, unsigned k, unsigned n1,
                              unsigned n2, float* __restrict__ scratch) {
    gemv_stream<8, 1>(XRows{x}, MapPair{w1, b1, w2, b2, y1, y2, n1, n2}, rows, k, n1 + n2,
                      scratch);
}

GEMV_STREAM_R1 norm_qkv_r1(const float* __restrict__ h, const bf16* __restrict__ wn,
                           const bf16* __restrict__ wq, const bf16* __restrict__ bq,
                           const bf16* __restrict__ wk, const bf16* __restrict__ bk,
                           const bf16* __restrict__ wv, const bf16* __restrict__ bv,
                           bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                           unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                           float* __restrict__ scratch) {
    gemv_stream<1, 1>(XNormRows{h, nullptr, wn, nullptr, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

GEMV_STREAM_R2 norm_qkv_r2(const float* __restrict__ h, const bf16* __restrict__ wn,
                           const bf16* __restrict__ wq, const bf16* __restrict__ bq,
                           const bf16* __restrict__ wk, const bf16* __restrict__ bk,
                           const bf16* __restrict__ wv, const bf16* __restrict__ bv,
                           bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                           unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                           float* __restrict__ scratch) {
    gemv_stream<2, 1>(XNormRows{h, nullptr, wn, nullptr, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

GEMV_STREAM_R4 norm_qkv_r4(const float* __restrict__ h, const bf16* __restrict__ wn,
                           const bf16* __restrict__ wq, const bf16* __restrict__ bq,
                           const bf16* __restrict__ wk, const bf16* __restrict__ bk,
                           const bf16* __restrict__ wv, const bf16* __restrict__ bv,
                           bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                           unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                           float* __restrict__ scratch) {
    gemv_stream<4, 1>(XNormRows{h, nullptr, wn, nullptr, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

GEMV_STREAM_R8 norm_qkv_r8(const float* __restrict__ h, const bf16* __restrict__ wn,
                           const bf16* __restrict__ wq, const bf16* __restrict__ bq,
                           const bf16* __restrict__ wk, const bf16* __restrict__ bk,
                           const bf16* __restrict__ wv, const bf16* __restrict__ bv,
                           bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                           unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                           float* __restrict__ scratch) {
    gemv_stream<8, 1>(XNormRows{h, nullptr, wn, nullptr, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

GEMV_STREAM_R1 add_norm_qkv_r1(const float* __restrict__ h, const bf16* __restrict__ d,
                               const bf16* __restrict__ wn, const bf16* __restrict__ wq,
                               const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                               const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                               const bf16* __restrict__ bv, float* __restrict__ h_out,
                               bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                               unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                               float* __restrict__ scratch) {
    gemv_stream<1, 1>(XNormRows{h, d, wn, h_out, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

GEMV_STREAM_R2 add_norm_qkv_r2(const float* __restrict__ h, const bf16* __restrict__ d,
                               const bf16* __restrict__ wn, const bf16* __restrict__ wq,
                               const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                               const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                               const bf16* __restrict__ bv, float* __restrict__ h_out,
                               bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                               unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                               float* __restrict__ scratch) {
    gemv_stream<2, 1>(XNormRows{h, d, wn, h_out, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

GEMV_STREAM_R4 add_norm_qkv_r4(const float* __restrict__ h, const bf16* __restrict__ d,
                               const bf16* __restrict__ wn, const bf16* __restrict__ wq,
                               const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                               const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                               const bf16* __restrict__ bv, float* __restrict__ h_out,
                               bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                               unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                               float* __restrict__ scratch) {
    gemv_stream<4, 1>(XNormRows{h, d, wn, h_out, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

GEMV_STREAM_R8 add_norm_qkv_r8(const float* __restrict__ h, const bf16* __restrict__ d,
                               const bf16* __restrict__ wn, const bf16* __restrict__ wq,
                               const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                               const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                               const bf16* __restrict__ bv, float* __restrict__ h_out,
                               bf16* __restrict__ q, bf16* __restrict__ k_out, bf16* __restrict__ v,
                               unsigned rows, unsigned k, unsigned nq, unsigned nkv, float eps,
                               float* __restrict__ scratch) {
    gemv_stream<8, 1>(XNormRows{h, d, wn, h_out, eps},
                MapQkv{wq, bq, wk, bk, wv, bv, q, k_out, v, nq, nkv}, rows, k, nq + 2u * nkv,
                scratch);
}

GEMV_STREAM_R1 gate_up_silu_r1(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                               const bf16* __restrict__ wu, bf16* __restrict__ act, unsigned rows,
                               unsigned k, unsigned inter, float* __restrict__ scratch) {
    gemv_stream<1, 2>(XRows{x}, MapGateUp{wg, wu, act, inter}, rows, k, inter, scratch);
}

GEMV_STREAM_R2 gate_up_silu_r2(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                               const bf16* __restrict__ wu, bf16* __restrict__ act, unsigned rows,
                               unsigned k, unsigned inter, float* __restrict__ scratch) {
    gemv_stream<2, 2>(XRows{x}, MapGateUp{wg, wu, act, inter}, rows, k, inter, scratch);
}

GEMV_STREAM_R4 gate_up_silu_r4(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                               const bf16* __restrict__ wu, bf16* __restrict__ act, unsigned rows,
                               unsigned k, unsigned inter, float* __restrict__ scratch) {
    gemv_stream<4, 2>(XRows{x}, MapGateUp{wg, wu, act, inter}, rows, k, inter, scratch);
}

GEMV_STREAM_R8 gate_up_silu_r8(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                               const bf16* __restrict__ wu, bf16* __restrict__ act, unsigned rows,
                               unsigned k, unsigned inter, float* __restrict__ scratch) {
    gemv_stream<8, 2>(XRows{x}, MapGateUp{wg, wu, act, inter}, rows, k, inter, scratch);
}

GEMV_STREAM_R1 norm_gate_up_silu_r1(const float* __restrict__ h, const bf16* __restrict__ wn,
                                    const bf16* __restrict__ wg, const bf16* __restrict__ wu,
                                    bf16* __restrict__ act, unsigned rows, unsigned k,
                                    unsigned inter, float eps, float* __restrict__ scratch) {
    gemv_stream<1, 2>(XNormRows{h, nullptr, wn, nullptr, eps}, MapGateUp{wg, wu, act, inter}, rows, k,
                inter, scratch);
}

GEMV_STREAM_R2 norm_gate_up_silu_r2(const float* __restrict__ h, const bf16* __restrict__ wn,
                                    const bf16* __restrict__ wg, const bf16* __restrict__ wu,
                                    bf16* __restrict__ act, unsigned rows, unsigned k,
                                    unsigned inter, float eps, float* __restrict__ scratch) {
    gemv_stream<2, 2>(XNormRows{h, nullptr, wn, nullptr, eps}, MapGateUp{wg, wu, act, inter}, rows, k,
                inter, scratch);
}

GEMV_STREAM_R4 norm_gate_up_silu_r4(const float* __restrict__ h, const bf16* __restrict__ wn,
                                    const bf16* __restrict__ wg, const bf16* __restrict__ wu,
                                    bf16* __restrict__ act, unsigned rows, unsigned k,
                                    unsigned inter, float eps, float* __restrict__ scratch) {
    gemv_stream<4, 2>(XNormRows{h, nullptr, wn, nullptr, eps}, MapGateUp{wg, wu, act, inter}, rows, k,
                inter, scratch);
}

GEMV_STREAM_R8 norm_gate_up_silu_r8(const float* __restrict__ h, const bf16* __restrict__ wn,
                                    const bf16* __restrict__ wg, const bf16* __restrict__ wu,
                                    bf16* __restrict__ act, unsigned rows, unsigned k,
                                    unsigned inter, float eps, float* __restrict__ scratch) {
    gemv_stream<8, 2>(XNormRows{h, nullptr, wn, nullptr, eps}, MapGateUp{wg, wu, act, inter}, rows, k,
                inter, scratch);
}

GEMV_STREAM_R1 add_norm_gate_up_silu_r1(const float* __restrict__ h, const bf16* __restrict__ o,
                                        const bf16* __restrict__ wn, const bf16* __restrict__ wg,
                                        const bf16* __restrict__ wu, float* __restrict__ h_out,
                                        bf16* __restrict__ act, unsigned rows, unsigned k,
                                        unsigned inter, float eps, float* __restrict__ scratch) {
    gemv_stream<1, 2>(XNormRows{h, o, wn, h_out, eps}, MapGateUp{wg, wu, act, inter}, rows, k,
                      inter, scratch);
}

GEMV_STREAM_R2 add_norm_gate_up_silu_r2(const float* __restrict__ h, const bf16* __restrict__ o,
                                        const bf16* __restrict__ wn, const bf16* __restrict__ wg,
                                        const bf16* __restrict__ wu, float* __restrict__ h_out,
                                        bf16* __restrict__ act, unsigned rows, unsigned k,
                                        unsigned inter, float eps, float* __restrict__ scratch) {
    gemv_stream<2, 2>(XNormRows{h, o, wn, h_out, eps}, MapGateUp{wg, wu, act, inter}, rows, k,
                      inter, scratch);
}

GEMV_STREAM_R4 add_norm_gate_up_silu_r4(const float* __restrict__ h, const bf16* __restrict__ o,
                                        const bf16* __restrict__ wn, const bf16* __restrict__ wg,
                                        const bf16* __restrict__ wu, float* __restrict__ h_out,
                                        bf16* __restrict__ act, unsigned rows, unsigned k,
                                        unsigned inter, float eps, float* __restrict__ scratch) {
    gemv_stream<4, 2>(XNormRows{h, o, wn, h_out, eps}, MapGateUp{wg, wu, act, inter}, rows, k,
                      inter, scratch);
}

GEMV_STREAM_R8 add_norm_gate_up_silu_r8(const float* __restrict__ h, const bf16* __restrict__ o,
                                        const bf16* __restrict__ wn, const bf16* __restrict__ wg,
                                        const bf16* __restrict__ wu, float* __restrict__ h_out,
                                        bf16* __restrict__ act, unsigned rows, unsigned k,
                                        unsigned inter, float eps, float* __restrict__ scratch) {
    gemv_stream<8, 2>(XNormRows{h, o, wn, h_out, eps}, MapGateUp{wg, wu, act, inter}, rows, k,
                      inter, scratch);
}

GEMV_STREAM_R1 linear_residual_add_r1(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                      const bf16* __restrict__ bias, const float* __restrict__ h,
                                      float* __restrict__ h_out, unsigned rows, unsigned k,
                                      unsigned n_out, float* __restrict__ scratch) {
    gemv_stream<1, 1>(XRows{x}, MapResidual{w, bias, h, h_out, n_out}, rows, k, n_out, scratch);
}

GEMV_STREAM_R2 linear_residual_add_r2(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                      const bf16* __restrict__ bias, const float* __restrict__ h,
                                      float* __restrict__ h_out, unsigned rows, unsigned k,
                                      unsigned n_out, float* __restrict__ scratch) {
    gemv_stream<2, 1>(XRows{x}, MapResidual{w, bias, h, h_out, n_out}, rows, k, n_out, scratch);
}

GEMV_STREAM_R4 linear_residual_add_r4(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                      const bf16* __restrict__ bias, const float* __restrict__ h,
                                      float* __restrict__ h_out, unsigned rows, unsigned k,
                                      unsigned n_out, float* __restrict__ scratch) {
    gemv_stream<4, 1>(XRows{x}, MapResidual{w, bias, h, h_out, n_out}, rows, k, n_out, scratch);
}

GEMV_STREAM_R8 linear_residual_add_r8(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                      const bf16* __restrict__ bias, const float* __restrict__ h,
                                      float* __restrict__ h_out, unsigned rows, unsigned k,
                                      unsigned n_out, float* __restrict__ scratch) {
    gemv_stream<8, 1>(XRows{x}, MapResidual{w, bias, h, h_out, n_out}, rows, k, n_out, scratch);
}

GEMV_STREAM_R1 gated_norm_linear_residual_add_r1(const bf16* __restrict__ core,
                                                 const bf16* __restrict__ qkvz,
                                                 const bf16* __restrict__ wn,
                                                 const bf16* __restrict__ w,
                                                 const bf16* __restrict__ bias,
                                                 const float* __restrict__ h,
                                                 float* __restrict__ h_out, unsigned rows,
                                                 unsigned nk, unsigned dk, unsigned nv, unsigned dv,
                                                 unsigned k, unsigned n_out, float eps,
                                                 float* __restrict__ scratch) {
    XGatedNormRows src;
    const unsigned kk = gated_source(src, core, qkvz, wn, nk, dk, nv, dv, k, eps);
    gemv_stream<1, 1>(src, MapResidual{w, bias, h, h_out, n_out}, rows, kk, n_out, scratch);
}

GEMV_STREAM_R2 gated_norm_linear_residual_add_r2(const bf16* __restrict__ core,
                                                 const bf16* __restrict__ qkvz,
                                                 const bf16* __restrict__ wn,
                                                 const bf16* __restrict__ w,
                                                 const bf16* __restrict__ bias,
                                                 const float* __restrict__ h,
                                                 float* __restrict__ h_out, unsigned rows,
                                                 unsigned nk, unsigned dk, unsigned nv, unsigned dv,
                                                 unsigned k, unsigned n_out, float eps,
                                                 float* __restrict__ scratch) {
    XGatedNormRows src;
    const unsigned kk = gated_source(src, core, qkvz, wn, nk, dk, nv, dv, k, eps);
    gemv_stream<2, 1>(src, MapResidual{w, bias, h, h_out, n_out}, rows, kk, n_out, scratch);
}

GEMV_STREAM_R4 gated_norm_linear_residual_add_r4(const bf16* __restrict__ core,
                                                 const bf16* __restrict__ qkvz,
                                                 const bf16* __restrict__ wn,
                                                 const bf16* __restrict__ w,
                                                 const bf16* __restrict__ bias,
                                                 const float* __restrict__ h,
                                                 float* __restrict__ h_out, unsigned rows,
                                                 unsigned nk, unsigned dk, unsigned nv, unsigned dv,
                                                 unsigned k, unsigned n_out, float eps,
                                                 float* __restrict__ scratch) {
    XGatedNormRows src;
    const unsigned kk = gated_source(src, core, qkvz, wn, nk, dk, nv, dv, k, eps);
    gemv_stream<4, 1>(src, MapResidual{w, bias, h, h_out, n_out}, rows, kk, n_out, scratch);
}

GEMV_STREAM_R8 gated_norm_linear_residual_add_r8(const bf16* __restrict__ core,
                                                 const bf16* __restrict__ qkvz,
                                                 const bf16* __restrict__ wn,
                                                 const bf16* __restrict__ w,
                                                 const bf16* __restrict__ bias,
                                                 const float* __restrict__ h,
                                                 float* __restrict__ h_out, unsigned rows,
                                                 unsigned nk, unsigned dk, unsigned nv, unsigned dv,
                                                 unsigned k, unsigned n_out, float eps,
                                                 float* __restrict__ scratch) {
    XGatedNormRows src;
    const unsigned kk = gated_source(src, core, qkvz, wn, nk, dk, nv, dv, k, eps);
    gemv_stream<8, 1>(src, MapResidual{w, bias, h, h_out, n_out}, rows, kk, n_out, scratch);
}

GEMV_STREAM_R1 add_norm_lm_head_r1(const float* __restrict__ h, const bf16* __restrict__ d,
                                   const bf16* __restrict__ wn, const bf16* __restrict__ w,
                                   float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k,
                                   unsigned vocab, float eps, float* __restrict__ scratch) {
    gemv_stream<1, 1>(XNormRows{h, d, wn, nullptr, eps}, MapLogits{w, logits, vocab, want}, rows, k,
                      vocab, scratch);
}

GEMV_STREAM_R2 add_norm_lm_head_r2(const float* __restrict__ h, const bf16* __restrict__ d,
                                   const bf16* __restrict__ wn, const bf16* __restrict__ w,
                                   float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k,
                                   unsigned vocab, float eps, float* __restrict__ scratch) {
    gemv_stream<2, 1>(XNormRows{h, d, wn, nullptr, eps}, MapLogits{w, logits, vocab, want}, rows, k,
                      vocab, scratch);
}

GEMV_STREAM_R4 add_norm_lm_head_r4(const float* __restrict__ h, const bf16* __restrict__ d,
                                   const bf16* __restrict__ wn, const bf16* __restrict__ w,
                                   float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k,
                                   unsigned vocab, float eps, float* __restrict__ scratch) {
    gemv_stream<4, 1>(XNormRows{h, d, wn, nullptr, eps}, MapLogits{w, logits, vocab, want}, rows, k,
                      vocab, scratch);
}

GEMV_STREAM_R8 add_norm_lm_head_r8(const float* __restrict__ h, const bf16* __restrict__ d,
                                   const bf16* __restrict__ wn, const bf16* __restrict__ w,
                                   float* __restrict__ logits, const int* __restrict__ want, unsigned rows, unsigned k,
                                   unsigned vocab, float eps, float* __restrict__ scratch) {
    gemv_stream<8, 1>(XNormRows{h, d, wn, nullptr, eps}, MapLogits{w, logits, vocab, want}, rows, k,
                      vocab, scratch);
}

// ---- the step's counter reset --------------------------------------------------------------

// Zeroes every arrival counter a step's split kernels use, as the first launch of each
// program (so of each captured step): attn_count counters attn_stride words apart from attn
// (attention's flash-decoding slots), ofold_count counters ofold_stride words apart from ofold
// (the o fold's rows), and the first GEMV_SPLIT_COUNTERS words of gemv_slots slots
// gemv_stride words apart from gemv (gemv's split-K and split heads, one slot per stream).
// Each kernel also clears its own counter after its merge; this reset is what keeps a grid
// aborted between its count and its clear from poisoning the next step. A null region is
// skipped. Grid-stride over all counters.
extern "C" __global__ void __launch_bounds__(256) counters_reset(
    float* __restrict__ attn, unsigned attn_count, unsigned attn_stride,
    float* __restrict__ ofold, unsigned ofold_count, unsigned ofold_stride,
    float* __restrict__ gemv, unsigned gemv_slots, unsigned gemv_stride) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned na = attn != nullptr ? attn_count : 0u;
    const unsigned no = ofold != nullptr ? ofold_count : 0u;
    const unsigned ng = gemv != nullptr ? gemv_slots * GEMV_SPLIT_COUNTERS : 0u;
    const unsigned step = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < na + no + ng; i += step) {
        unsigned* counter;
        if (i < na) {
            counter = reinterpret_cast<unsigned*>(attn) + (unsigned long long)i * attn_stride;
        } else if (i < na + no) {
            counter = reinterpret_cast<unsigned*>(ofold) +
                      (unsigned long long)(i - na) * ofold_stride;
        } else {
            const unsigned j = i - na - no;
            counter = reinterpret_cast<unsigned*>(gemv) +
                      (unsigned long long)(j / GEMV_SPLIT_COUNTERS) * gemv_stride +
                      j % GEMV_SPLIT_COUNTERS;
        }
        *counter = 0u;
    }
}
