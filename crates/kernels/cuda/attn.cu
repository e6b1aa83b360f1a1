// `attn` module: paged attention over one layer's KV cache region
// `[num_pages][2][block_size][kv_heads][head_dim]` bf16.
//
// Launch (ops/attn.rs): grid = (heads, rows, ATTN_SPLITS), 256 threads (8 warps) per block, for
// both kernels. Row r attends to its sequence's first seq_lens[r] tokens (causality in verify
// comes from the lengths), token j at page block_tables[r·max_blocks + j / block_size]. With a
// sliding window (`window` W > 0) it attends to the last W of them only, tokens
// max(0, len − W)..len (transformers' mask: a query at i sees j with i − W < j <= i); the pages
// before the window are never read (the Session may have recycled them: their block-table
// entries are then the scratch page). window = 0 is full causal attention.
//
// Flash-decoding: a context of n tokens attended (min(len, W) with a window) is cut into
// S = min(ATTN_SPLITS, ⌈n / 256⌉) contiguous chunks of ⌈n / S⌉ tokens, block (h, r, s) taking
// chunk s (blocks s >= S return at once). Inside a block the chunk is cut into 8 contiguous
// pieces, one per warp; each warp runs an online softmax over its piece, 32 keys at a time
// (lane = key for q·k, lane = dims for p·v), and the 8 partial (max, sum, acc) are merged in shared memory in warp order. With S = 1
// (n <= 256) block 0 stores the result itself, with today's single-block arithmetic. With
// S > 1 each block writes its partial to its slot of `scratch`, fences, and counts itself in
// on the (head, row)'s counter; the block that arrives last merges the S partials in split
// order s = 0..S-1 (M = max m_s, L = Σ l_s·e^(m_s−M), out = Σ acc_s·e^(m_s−M) / L), stores
// out and resets the counter to zero. Every partial is computed in a fixed order from the
// inputs alone, and the merge reads them in a fixed order, so the result does not depend on
// which block arrives last; the split depends only on seq_len and the window, so a sequence's
// output is the same bytes at any row count and in any row position. Requires head_dim <= 256.
//
// scratch (ops::attn::scratch_bytes): per (head, row), at slot (r·heads + h) of
// 1 + ATTN_SPLITS·(head_dim + 2) words, a u32 counter (zero between launches) and then
// ATTN_SPLITS partials [max, sum, acc[head_dim]] f32.
//
// paged_decode_o / paged_causal_o (the `fold_o_proj` lever) fold the o projection and the
// residual add into the same launch: the block that would store a (head, row)'s output (block 0
// with S = 1, the merging block with S > 1) keeps it on chip, rounded to bf16 as stored today,
// and computes that head's partial o projection over every output feature into `o_scratch`
// (ops::attn::fold::o_scratch_bytes: per row a u32 counter, then heads partials of n_out f32);
// the head block that counts in last on the row's counter sums the heads in order h = 0..heads-1,
// adds the bias, rounds to bf16, adds the residual, stores h_out and zeroes the counter. See
// o_fold_epilogue. The per-head partial sums make the projection's bits differ from
// gemv::linear's single dot over heads·head_dim (a `differs` rule).
//
// paged_decode_prefetch (the `attn_prefetch` lever; a variant entry of paged_decode): the same
// body with another load schedule (kPrefetch, PREFETCH in the key loop): the next tile's
// page-table entry read and its K/V rows asked of L2 before the tile is consumed, K issued 4
// 16-byte chunks at a time, V read 16 bytes a lane for 4 keys at once. Arithmetic and its
// order are paged_decode's, so the bytes are too (NaN and inf included).
#include "common.cuh"

#define ATTN_WARPS 8u
#define ATTN_THREADS 256u
#define ATTN_MAX_HEAD_DIM 256u
#define ATTN_DIMS_PER_LANE 8u // ATTN_MAX_HEAD_DIM / 32
#define ATTN_SPLITS 16u       // ops::attn::ATTN_SPLITS
#define ATTN_SPLIT_MIN_TOKENS 256u
#define ATTN_K_BATCH 4u // paged_decode_prefetch: 16-byte K loads issued before the first is used
#define ATTN_V_BATCH 4u // paged_decode_prefetch: keys whose V rows are in flight at once

// Chunks a context of `len` tokens is cut into: a function of len alone (batch invariance).
__device__ __forceinline__ unsigned attn_splits(unsigned len) {
    const unsigned wanted = (len + ATTN_SPLIT_MIN_TOKENS - 1u) / ATTN_SPLIT_MIN_TOKENS;
    return wanted < 1u ? 1u : (wanted > ATTN_SPLITS ? ATTN_SPLITS : wanted);
}

// The o projection folded into attention (paged_decode_o / paged_causal_o): what the block
// holding a (head, row)'s final output needs beyond attention's arguments. Null in the plain
// kernels, which store `out` instead (times sigmoid(gate) when `gate` is given).
struct OFold {
    const bf16* gate;  // sigmoid gate bf16[rows·heads·head_dim] (Qwen3-Next), or null (the
                       // plain kernels store `out` gated by it too)
    const bf16* wo;    // o_proj weight bf16[n_out][heads·head_dim]
    const bf16* bias;  // bf16[n_out], or null
    const float* h;    // residual stream f32[rows·n_out]
    float* h_out;      // f32[rows·n_out]
    float* o_scratch;  // per-row counters and per-head partials (see the header)
    unsigned n_out;
};

__device__ __forceinline__ void o_fold_epilogue(const OFold& fold, const float* num_s, float den,
                                                bool empty, unsigned h, unsigned r, unsigned heads,
                                                unsigned head_dim,
                                                unsigned long long q_at);

// dot + q[0..8] · k (8 packed bf16), fma in dim order: the plain body's inner step.
__device__ __forceinline__ float attn_dot8(const float* q8, uint4 k, float dot) {
    float kf[8];
    widen8(k, kf);
    const float4 qa = *reinterpret_cast<const float4*>(q8);
    const float4 qb = *reinterpret_cast<const float4*>(q8 + 4);
    dot = __fmaf_rn(qa.x, kf[0], dot);
    dot = __fmaf_rn(qa.y, kf[1], dot);
    dot = __fmaf_rn(qa.z, kf[2], dot);
    dot = __fmaf_rn(qa.w, kf[3], dot);
    dot = __fmaf_rn(qb.x, kf[4], dot);
    dot = __fmaf_rn(qb.y, kf[5], dot);
    dot = __fmaf_rn(qb.z, kf[6], dot);
    dot = __fmaf_rn(qb.w, kf[7], dot);
    return dot;
}

// kPrefetch: the `attn_prefetch` lever's load schedule (paged_decode_prefetch; PREFETCH in the
// key loop): the same arithmetic in the same order, so the same bytes.
template <bool kFold, bool kPrefetch>
__device__ __forceinline__ void attention_block(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    bf16* __restrict__ out, float* scratch, unsigned rows, unsigned heads, unsigned kv_heads,
    unsigned head_dim, unsigned block_size, unsigned max_blocks, unsigned num_pages,
    unsigned window, float scale, const OFold& fold) {
    __shared__ __align__(16) float q_s[ATTN_MAX_HEAD_DIM];
    __shared__ float m_s[ATTN_WARPS];
    __shared__ float l_s[ATTN_WARPS];
    __shared__ float acc_s[ATTN_WARPS][ATTN_MAX_HEAD_DIM];
    __shared__ float split_e[ATTN_SPLITS];
    __shared__ float split_l[ATTN_SPLITS];
    __shared__ float den_s;
    __shared__ unsigned last_s;

    const unsigned h = blockIdx.x;
    const unsigned r = blockIdx.y;
    const unsigned split = blockIdx.z;
    if (h >= heads || r >= rows || blockDim.x != ATTN_THREADS || gridDim.z != ATTN_SPLITS ||
        head_dim == 0u || head_dim > ATTN_MAX_HEAD_DIM || kv_heads == 0u || block_size == 0u) {
        return; // the whole block (the CPU twin refuses these launches)
    }
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned group = heads / kv_heads > 0u ? heads / kv_heads : 1u;
    const unsigned kvh = min(h / group, kv_heads - 1u);
    const unsigned row_elems = kv_heads * head_dim;
    const unsigned long long q_at = ((unsigned long long)r * heads + h) * head_dim;

    // Length clamped to the block table's capacity (the CPU twin refuses anything outside).
    const long long capacity = (long long)max_blocks * block_size;
    long long len_ll = seq_lens[r];
    len_ll = len_ll < 0 ? 0 : (len_ll > capacity ? capacity : len_ll);
    const unsigned len = (unsigned)len_ll;

    // The window: tokens first..len (all of them without one).
    const unsigned first = (window != 0u && len > window) ? len - window : 0u;
    const unsigned span = len - first;
    const unsigned splits = attn_splits(span);
    if (split >= splits) {
        return; // an idle block: shorter contexts use fewer chunks (uniform across the block)
    }
    const unsigned split_chunk = (span + splits - 1u) / splits;
    const unsigned split_begin = first + min(span, split * split_chunk);
    const unsigned split_end = min(len, split_begin + split_chunk);

    // Zeros past head_dim: the last 8-wide step of q·k may read them (against zero keys).
    for (unsigned d = threadIdx.x; d < ATTN_MAX_HEAD_DIM; d += ATTN_THREADS) {
        q_s[d] = d < head_dim ? to_f32(q[q_at + d]) : 0.0f;
    }
    __syncthreads();

    const unsigned chunk = (split_end - split_begin + ATTN_WARPS - 1u) / ATTN_WARPS;
    const unsigned begin = min(split_end, split_begin + warp * chunk);
    const unsigned end = min(split_end, begin + chunk);
    const int* table = block_tables + (unsigned long long)r * max_blocks;
    // Keys are read as 16-byte vectors when every key row is 16-byte aligned.
    const bool vec = (head_dim % 8u == 0u) && (row_elems % 8u == 0u) && aligned16(cache);

    float m = NEG_INF;
    float l = 0.0f;
    float acc[ATTN_DIMS_PER_LANE];
#pragma unroll
    for (unsigned t = 0; t < ATTN_DIMS_PER_LANE; ++t) {
        acc[t] = 0.0f;
    }

    if (kPrefetch) {
        // PREFETCH (the `attn_prefetch` lever): the same keys, scores, softmax and fma order,
        // only the loads move. The next tile's page-table entry is read (and its K and V rows
        // asked of L2) before this tile is consumed; a key's K row is loaded 4 chunks (32 dims)
        // at a time before any of them is used; V is read 16 bytes a lane (lane holds dims
        // lane·8 .. lane·8+7, where the plain body holds t·32 + lane), 4 keys' rows issued
        // before the first is added.
        int page_next = begin + lane < end ? table[(begin + lane) / block_size] : -1;
        for (unsigned base = begin; base < end; base += 32u) {
            const unsigned j = base + lane;
            const int page = page_next;
            const unsigned jn = j + 32u;
            page_next = jn < end ? table[jn / block_size] : -1;
            if (page_next >= 0 && (unsigned)page_next < num_pages) {
                prefetch_l2(cache + cache_offset((unsigned)page_next, 0, jn % block_size,
                                                 block_size, row_elems) +
                            (unsigned long long)kvh * head_dim);
                prefetch_l2(cache + cache_offset((unsigned)page_next, 1, jn % block_size,
                                                 block_size, row_elems) +
                            (unsigned long long)kvh * head_dim);
            }
            float s = NEG_INF;
            unsigned long long v_at = 0ull;
            if (j < end && page >= 0 && (unsigned)page < num_pages) {
                const unsigned long long k_at =
                    cache_offset((unsigned)page, 0, j % block_size, block_size, row_elems) +
                    (unsigned long long)kvh * head_dim;
                v_at = cache_offset((unsigned)page, 1, j % block_size, block_size, row_elems) +
                       (unsigned long long)kvh * head_dim;
                float dot = 0.0f;
                for (unsigned g0 = 0; g0 < head_dim; g0 += 8u * ATTN_K_BATCH) {
                    uint4 kb[ATTN_K_BATCH];
#pragma unroll
                    for (unsigned u = 0; u < ATTN_K_BATCH; ++u) {
                        const unsigned d0 = g0 + 8u * u;
                        kb[u] = d0 < head_dim
                                    ? load8_bits(cache + k_at + d0, min(8u, head_dim - d0), vec)
                                    : make_uint4(0u, 0u, 0u, 0u);
                    }
#pragma unroll
                    for (unsigned u = 0; u < ATTN_K_BATCH; ++u) {
                        const unsigned d0 = g0 + 8u * u;
                        if (d0 < head_dim) {
                            dot = attn_dot8(&q_s[d0], kb[u], dot);
                        }
                    }
                }
                s = __fmul_rn(dot, scale);
            }
            const float m_new = fmax_nan(m, warp_max_nan(s));
            const float p = s == NEG_INF ? 0.0f : expf(__fsub_rn(s, m_new));
            const float corr = m == NEG_INF ? 0.0f : expf(__fsub_rn(m, m_new));
            l = __fadd_rn(__fmul_rn(l, corr), warp_sum(p));
#pragma unroll
            for (unsigned t = 0; t < ATTN_DIMS_PER_LANE; ++t) {
                acc[t] = __fmul_rn(acc[t], corr);
            }
            const unsigned dv = lane * 8u;
            const unsigned v_valid = dv < head_dim ? min(8u, head_dim - dv) : 0u;
            for (unsigned j0 = 0; j0 < 32u; j0 += ATTN_V_BATCH) {
                uint4 vb[ATTN_V_BATCH];
                float pb[ATTN_V_BATCH];
                bool key[ATTN_V_BATCH];
#pragma unroll
                for (unsigned u = 0; u < ATTN_V_BATCH; ++u) {
                    pb[u] = __shfl_sync(SOLDER_FULL_MASK, p, j0 + u);
                    const unsigned long long vj = __shfl_sync(SOLDER_FULL_MASK, v_at, j0 + u);
                    key[u] = vj != 0ull; // v_at of a real key is never 0 (part 1 of its page)
                    vb[u] = key[u] && v_valid > 0u ? load8_bits(cache + vj + dv, v_valid, vec)
                                                   : make_uint4(0u, 0u, 0u, 0u);
                }
#pragma unroll
                for (unsigned u = 0; u < ATTN_V_BATCH; ++u) {
                    if (!key[u]) {
                        continue; // uniform across the warp
                    }
                    float vf[8];
                    widen8(vb[u], vf);
                    const float pj = pb[u];
#pragma unroll
                    for (unsigned t = 0; t < ATTN_DIMS_PER_LANE; ++t) {
                        if (dv + t < head_dim) {
                            // Weight 0: the twin's 0·v, an exact zero unless v is not finite.
                            acc[t] = (pj == 0.0f && is_finite(vf[t]))
                                         ? acc[t]
                                         : __fmaf_rn(pj, vf[t], acc[t]);
                        }
                    }
                }
            }
            m = m_new;
        }
    } else {
        for (unsigned base = begin; base < end; base += 32u) {
            const unsigned j = base + lane;
            float s = NEG_INF;
            unsigned long long v_at = 0ull;
            if (j < end) {
                const int page = table[j / block_size];
                if (page >= 0 && (unsigned)page < num_pages) {
                    const unsigned long long k_at =
                        cache_offset((unsigned)page, 0, j % block_size, block_size, row_elems) +
                        (unsigned long long)kvh * head_dim;
                    v_at = cache_offset((unsigned)page, 1, j % block_size, block_size, row_elems) +
                           (unsigned long long)kvh * head_dim;
                    // s = (q · k_j) · scale, fma in dim order.
                    float dot = 0.0f;
                    for (unsigned d0 = 0; d0 < head_dim; d0 += 8u) {
                        float kf[8];
                        widen8(load8_bits(cache + k_at + d0, min(8u, head_dim - d0), vec), kf);
                        const float4 qa = *reinterpret_cast<const float4*>(&q_s[d0]);
                        const float4 qb = *reinterpret_cast<const float4*>(&q_s[d0 + 4u]);
                        dot = __fmaf_rn(qa.x, kf[0], dot);
                        dot = __fmaf_rn(qa.y, kf[1], dot);
                        dot = __fmaf_rn(qa.z, kf[2], dot);
                        dot = __fmaf_rn(qa.w, kf[3], dot);
                        dot = __fmaf_rn(qb.x, kf[4], dot);
                        dot = __fmaf_rn(qb.y, kf[5], dot);
                        dot = __fmaf_rn(qb.z, kf[6], dot);
                        dot = __fmaf_rn(qb.w, kf[7], dot);
                    }
                    s = __fmul_rn(dot, scale);
                }
            }
            // NaN-keeping max: a NaN score makes m NaN, and with it every p, l and acc (the twin's
            // sum is NaN). No tile is skipped for its scores: a tile whose keys all score -inf
            // (m_new still -inf) adds p = 0 for each, which is 0·v = NaN where v is not finite.
            const float m_new = fmax_nan(m, warp_max_nan(s));
            const float p = s == NEG_INF ? 0.0f : expf(__fsub_rn(s, m_new));
            const float corr = m == NEG_INF ? 0.0f : expf(__fsub_rn(m, m_new));
            l = __fadd_rn(__fmul_rn(l, corr), warp_sum(p));
    #pragma unroll
            for (unsigned t = 0; t < ATTN_DIMS_PER_LANE; ++t) {
                acc[t] = __fmul_rn(acc[t], corr);
            }
            for (unsigned jj = 0; jj < 32u; ++jj) {
                const float pj = __shfl_sync(SOLDER_FULL_MASK, p, jj);
                const unsigned long long vj = __shfl_sync(SOLDER_FULL_MASK, v_at, jj);
                if (vj == 0ull) {
                    continue; // no key (v_at of a real key is never 0: part 1 of its page)
                }
                if (pj == 0.0f) {
                    // A real key of weight 0 (score -inf or underflow): the twin adds 0·v, an
                    // exact zero unless v is not finite, then NaN.
    #pragma unroll
                    for (unsigned t = 0; t < ATTN_DIMS_PER_LANE; ++t) {
                        const unsigned d = t * 32u + lane;
                        if (d < head_dim) {
                            const float v = to_f32(cache[vj + d]);
                            acc[t] = is_finite(v) ? acc[t] : __fmaf_rn(pj, v, acc[t]);
                        }
                    }
                    continue; // uniform across the warp
                }
    #pragma unroll
                for (unsigned t = 0; t < ATTN_DIMS_PER_LANE; ++t) {
                    const unsigned d = t * 32u + lane;
                    if (d < head_dim) {
                        acc[t] = __fmaf_rn(pj, to_f32(cache[vj + d]), acc[t]);
                    }
                }
            }
            m = m_new;
        }

    }

    if (lane == 0u) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
#pragma unroll
    for (unsigned t = 0; t < ATTN_DIMS_PER_LANE; ++t) {
        const unsigned d = kPrefetch ? lane * 8u + t : t * 32u + lane;
        if (d < head_dim) {
            acc_s[warp][d] = acc[t];
        }
    }
    __syncthreads();

    // Merge the warps' partials in warp order: the block's (max_all, den, num[d]), num kept in
    // acc_s[0][d] (thread d is the only reader and writer of column d from here on). A warp
    // whose max is -inf (no key, or every key -inf) has l = 0 and acc +0 or NaN (0·v of a
    // non-finite v): its NaN still counts (0·NaN).
    float max_all = NEG_INF;
    for (unsigned w = 0; w < ATTN_WARPS; ++w) {
        max_all = fmax_nan(max_all, m_s[w]);
    }
    float den = 0.0f;
    for (unsigned w = 0; w < ATTN_WARPS; ++w) {
        if (m_s[w] != NEG_INF) {
            den = __fmaf_rn(l_s[w], expf(__fsub_rn(m_s[w], max_all)), den);
        }
    }
    for (unsigned d = threadIdx.x; d < head_dim; d += ATTN_THREADS) {
        float num = 0.0f;
        for (unsigned w = 0; w < ATTN_WARPS; ++w) {
            const float a = acc_s[w][d];
            if (m_s[w] != NEG_INF) {
                num = __fmaf_rn(a, expf(__fsub_rn(m_s[w], max_all)), num);
            } else if (!is_finite(a)) {
                num = __fmaf_rn(a, 0.0f, num);
            }
        }
        acc_s[0][d] = num;
    }

    if (splits > 1u) {
        const unsigned split_words = head_dim + 2u;
        float* slot = scratch + ((unsigned long long)r * heads + h) *
                                    (1ull + (unsigned long long)ATTN_SPLITS * split_words);
        unsigned* counter = reinterpret_cast<unsigned*>(slot);
        float* partial = slot + 1u + split * split_words;
        if (threadIdx.x == 0u) {
            partial[0] = max_all;
            partial[1] = den;
        }
        for (unsigned d = threadIdx.x; d < head_dim; d += ATTN_THREADS) {
            partial[2u + d] = acc_s[0][d];
        }
        __threadfence(); // this block's partial is visible device-wide before it counts in
        __syncthreads();
        if (threadIdx.x == 0u) {
            const unsigned arrived = counter_arrive(counter);
            last_s = arrived == splits - 1u ? 1u : 0u;
        }
        __syncthreads();
        if (last_s == 0u) {
            return; // another block merges (uniform across the block)
        }
        __threadfence();
        // The last block: every partial is written. Merge them in split order (L2 reads).
        if (threadIdx.x < splits) {
            split_e[threadIdx.x] = __ldcg(slot + 1u + threadIdx.x * split_words);
            split_l[threadIdx.x] = __ldcg(slot + 2u + threadIdx.x * split_words);
        }
        __syncthreads();
        if (threadIdx.x == 0u) {
            float max_split = NEG_INF;
            for (unsigned t = 0; t < splits; ++t) {
                max_split = fmax_nan(max_split, split_e[t]);
            }
            float total = 0.0f;
            for (unsigned t = 0; t < splits; ++t) {
                // e_t = e^(m_t − M), 0 for an empty chunk.
                const float e =
                    split_e[t] == NEG_INF ? 0.0f : expf(__fsub_rn(split_e[t], max_split));
                split_e[t] = e;
                total = __fmaf_rn(split_l[t], e, total);
            }
            den_s = total;
            counter_clear(counter); // all S blocks have counted in: zero again for the next launch
        }
        __syncthreads();
        den = den_s;
        for (unsigned d = threadIdx.x; d < head_dim; d += ATTN_THREADS) {
            float num = 0.0f;
            for (unsigned t = 0; t < splits; ++t) {
                // A split of weight 0 adds an exact zero unless its acc is not finite.
                const float a = __ldcg(slot + 3u + t * split_words + d);
                if (split_e[t] != 0.0f || !is_finite(a)) {
                    num = __fmaf_rn(a, split_e[t], num);
                }
            }
            acc_s[0][d] = num;
        }
    }

    // num / den, NaN included (den is NaN after a NaN or +inf score, 0 when every key scored
    // -inf: 0/0, as the twin's); zeros only for a row with no token at all (len 0).
    const bool empty = span == 0u;
    if (kFold) {
        o_fold_epilogue(fold, acc_s[0], den, empty, h, r, heads, head_dim, q_at);
    } else {
        for (unsigned d = threadIdx.x; d < head_dim; d += ATTN_THREADS) {
            const float num = acc_s[0][d];
            const bf16 o = to_bf16(empty ? 0.0f : __fdiv_rn(num, den));
            out[q_at + d] = fold.gate != nullptr ? sigmoid_gated(o, fold.gate[q_at + d]) : o;
        }
    }
}

// The plain kernels' body: attention only, `out` stored (gated by `gate` unless null).
template <bool kPrefetch>
__device__ __forceinline__ void paged_attention_block(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, bf16* __restrict__ out, float* scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale) {
    const OFold plain = {gate, nullptr, nullptr, nullptr, nullptr, nullptr, 0u};
    attention_block<false, kPrefetch>(q, cache, block_tables, seq_lens, out, scratch, rows,
                                      heads, kv_heads, head_dim, block_size, max_blocks,
                                      num_pages, window, scale, plain);
}

// The fold epilogue, run by the one block that holds (head h, row r)'s final attention output:
// num_s[d] / den is the value attention would store. 1. out_s[d] = that value rounded to bf16
// (times sigmoid(gate), rounded again, when gated: act::sigmoid_mul's arithmetic). 2. The head's
// partial o projection over every output feature, p[f] = Σ_d out_s[d] · wo[f][h·head_dim + d]:
// lane c of a group of G lanes (G the power of two >= ⌈head_dim / 8⌉) takes the 8-element chunk
// c (fma over its elements in order, from 0; chunks past the head are +0), then a butterfly over
// the G lanes (xor G/2, ..., 1); a warp covers 32 / G features at a time, the 8 warps split the
// features, weights read 16 bytes a lane. 3. p goes to the row's scratch slot at head h; the block
// fences and counts itself in on the row's counter. 4. The block that arrives last (the heads-th)
// sums the heads' partials in head order h = 0..heads-1 (from +0, f32 adds), adds the bias and
// rounds to bf16 (linear_value), adds the residual (residual_value), stores h_out and zeroes the
// counter. Every partial is a function of the inputs alone and the sum reads them in a fixed
// order, so h_out does not depend on which block arrives last.
#define OFOLD_UNROLL 4u
#define OFOLD_HEADER_WORDS 4u // ops::attn::fold::O_SCRATCH_HEADER_WORDS

__device__ __forceinline__ void o_fold_epilogue(const OFold& fold, const float* num_s, float den,
                                                bool empty, unsigned h, unsigned r, unsigned heads,
                                                unsigned head_dim,
                                                unsigned long long q_at) {
    __shared__ __align__(16) bf16 out_s[ATTN_MAX_HEAD_DIM];
    __shared__ unsigned last_row_s;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned n_out = fold.n_out;

    for (unsigned d = threadIdx.x; d < ATTN_MAX_HEAD_DIM; d += ATTN_THREADS) {
        bf16 o = to_bf16(0.0f); // zeros past head_dim: a chunk's tail reads them
        if (d < head_dim) {
            o = to_bf16(empty ? 0.0f : __fdiv_rn(num_s[d], den));
            if (fold.gate != nullptr) {
                o = sigmoid_gated(o, fold.gate[q_at + d]);
            }
        }
        out_s[d] = o;
    }
    __syncthreads();

    const unsigned chunks = (head_dim + 7u) / 8u; // <= 32 (head_dim <= 256)
    unsigned group = 1u;
    while (group < chunks) {
        group <<= 1;
    }
    const unsigned per_warp = 32u / group;
    const unsigned c = lane & (group - 1u);
    const unsigned slot = lane / group;
    const unsigned valid = c < chunks ? min(8u, head_dim - c * 8u) : 0u;
    const unsigned long long in_features = (unsigned long long)heads * head_dim;
    const bool wvec = aligned16(fold.wo) && (head_dim % 8u == 0u) && (in_features % 8ull == 0ull);
    const uint4 xbits = *reinterpret_cast<const uint4*>(&out_s[c * 8u]);
    const bf16* w_head = fold.wo + (unsigned long long)h * head_dim + c * 8u;
    const unsigned long long slot_words =
        OFOLD_HEADER_WORDS + (unsigned long long)heads * n_out;
    float* row_slot = fold.o_scratch + (unsigned long long)r * slot_words;
    float* partial = row_slot + OFOLD_HEADER_WORDS + (unsigned long long)h * n_out;
    const unsigned step = ATTN_WARPS * per_warp;
    // f0 depends on the warp alone: every lane runs the same iterations (the shuffles' mask).
    for (unsigned f0 = warp * per_warp; f0 < n_out; f0 += step * OFOLD_UNROLL) {
        uint4 wbits[OFOLD_UNROLL];
#pragma unroll
        for (unsigned u = 0; u < OFOLD_UNROLL; ++u) {
            const unsigned f = f0 + u * step + slot;
            wbits[u] = (f < n_out && valid > 0u)
                           ? load8_bits(w_head + (unsigned long long)f * in_features, valid, wvec)
                           : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (unsigned u = 0; u < OFOLD_UNROLL; ++u) {
            float acc = dot8(xbits, wbits[u], 0.0f);
            for (unsigned m = group >> 1; m > 0u; m >>= 1) {
                acc = __fadd_rn(acc, __shfl_xor_sync(SOLDER_FULL_MASK, acc, m));
            }
            const unsigned f = f0 + u * step + slot;
            if (c == 0u && f < n_out) {
                partial[f] = acc;
            }
        }
    }

    __threadfence(); // this head's partials are visible device-wide before it counts in
    __syncthreads();
    unsigned* counter = reinterpret_cast<unsigned*>(row_slot);
    if (threadIdx.x == 0u) {
        const unsigned arrived = counter_arrive(counter);
        last_row_s = arrived == heads - 1u ? 1u : 0u;
    }
    __syncthreads();
    if (last_row_s == 0u) {
        return; // another head's block finishes the row (uniform across the block)
    }
    __threadfence();
    // The last head: every partial of the row is written. Sum them in head order (L2 reads).
    const float* partials = row_slot + OFOLD_HEADER_WORDS;
    const unsigned long long row_at = (unsigned long long)r * n_out;
    for (unsigned f = threadIdx.x; f < n_out; f += ATTN_THREADS) {
        float acc = 0.0f;
#pragma unroll 4
        for (unsigned hh = 0; hh < heads; ++hh) {
            acc = __fadd_rn(acc, __ldcg(partials + (unsigned long long)hh * n_out + f));
        }
        fold.h_out[row_at + f] = residual_value(fold.h[row_at + f], linear_value(acc, fold.bias, f));
    }
    if (threadIdx.x == 0u) {
        counter_clear(counter); // every head has counted in: zero again for the next launch
    }
}

// One query row per sequence: q bf16[rows·heads·head_dim], block_tables i32[rows·max_blocks],
// seq_lens i32[rows] → out bf16[rows·heads·head_dim]; gate: bf16[rows·heads·head_dim] or null,
// when given out is stored times sigmoid(gate) as act::sigmoid_mul stores it (Qwen3-Next's
// gated attention); scratch: cross-block partials and counters (see above); window: the
// layer's sliding window in tokens, 0 for none.
extern "C" __global__ void __launch_bounds__(256) paged_decode(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, bf16* __restrict__ out, float* scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale) {
    pdl_wait(); // before any early return and any buffer another launch writes
    pdl_launch_dependents();
    paged_attention_block<false>(q, cache, block_tables, seq_lens, gate, out, scratch, rows,
                                 heads, kv_heads, head_dim, block_size, max_blocks, num_pages,
                                 window, scale);
}

// paged_decode with the `attn_prefetch` lever's load schedule: the next tile's page-table entry
// read (and its K/V rows asked of L2) before this tile is consumed, each key's K row issued 4
// 16-byte chunks at a time before the first is used, V read 16 bytes a lane for 4 keys at once.
// The same arguments, launch, arithmetic order and bytes as paged_decode (NaN and inf too).
extern "C" __global__ void __launch_bounds__(256) paged_decode_prefetch(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, bf16* __restrict__ out, float* scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale) {
    pdl_wait(); // before any early return and any buffer another launch writes
    pdl_launch_dependents();
    paged_attention_block<true>(q, cache, block_tables, seq_lens, gate, out, scratch, rows,
                                heads, kv_heads, head_dim, block_size, max_blocks, num_pages,
                                window, scale);
}

// K query rows of one sequence (or several, verify_batch), causal among themselves through
// their lengths: the same arguments, arithmetic and launch as paged_decode.
extern "C" __global__ void __launch_bounds__(256) paged_causal(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, bf16* __restrict__ out, float* scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale) {
    pdl_wait(); // before any early return and any buffer another launch writes
    pdl_launch_dependents();
    paged_attention_block<false>(q, cache, block_tables, seq_lens, gate, out, scratch, rows,
                                 heads, kv_heads, head_dim, block_size, max_blocks, num_pages,
                                 window, scale);
}

// Attention, then the o projection and the residual add (the `fold_o_proj` lever): the same
// grid, blocks and attention arithmetic as paged_decode, then o_fold_epilogue in the block that
// holds each (head, row)'s output. gate: bf16[rows·heads·head_dim] multiplied in as
// act::sigmoid_mul does (Qwen3-Next's gated attention), or null; wo bf16[n_out][heads·head_dim];
// bias bf16[n_out] or null; h, h_out f32[rows·n_out]; o_scratch (ops::attn::fold::
// o_scratch_bytes): per row, at slot r of 4 + heads·n_out words, a u32 counter (zero between
// launches), 3 words of padding, then heads partials f32[n_out].
__device__ __forceinline__ void paged_o_block(
    const bf16* q, const bf16* cache, const int* block_tables, const int* seq_lens,
    const bf16* gate, const bf16* wo, const bf16* bias, const float* h, float* h_out,
    float* scratch, float* o_scratch, unsigned rows, unsigned heads, unsigned kv_heads,
    unsigned head_dim, unsigned block_size, unsigned max_blocks, unsigned num_pages,
    unsigned window, float scale, unsigned n_out) {
    pdl_wait(); // before any early return and any buffer another launch writes
    pdl_launch_dependents();
    const OFold fold = {gate, wo, bias, h, h_out, o_scratch, n_out};
    attention_block<true, false>(q, cache, block_tables, seq_lens, nullptr, scratch, rows,
                                 heads, kv_heads, head_dim, block_size, max_blocks, num_pages,
                                 window, scale, fold);
}

extern "C" __global__ void __launch_bounds__(256) paged_decode_o(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, const bf16* __restrict__ wo, const bf16* __restrict__ bias,
    const float* h, float* h_out, float* scratch, float* o_scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale, unsigned n_out) {
    paged_o_block(q, cache, block_tables, seq_lens, gate, wo, bias, h, h_out, scratch,
                  o_scratch, rows, heads, kv_heads, head_dim, block_size, max_blocks, num_pages,
                  window, scale, n_out);
}

// The verify form (K causal rows per sequence through their lengths), as paged_causal is to
// paged_decode: the same arguments, arithmetic and launch as paged_decode_o.
extern "C" __global__ void __launch_bounds__(256) paged_causal_o(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, const bf16* __restrict__ wo, const bf16* __restrict__ bias,
    const float* h, float* h_out, float* scratch, float* o_scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale, unsigned n_out) {
    paged_o_block(q, cache, block_tables, seq_lens, gate, wo, bias, h, h_out, scratch,
                  o_scratch, rows, heads, kv_heads, head_dim, block_size, max_blocks, num_pages,
                  window, scale, n_out);
}

// Splits a gated q projection (Qwen3-Next): q2 bf16[rows·heads·2·head_dim], each head
// `[q | gate]` → q, gate bf16[rows·heads·head_dim] (bit copies). Elementwise over the outputs:
// 256 threads, 4 elements each, grid-stride.
extern "C" __global__ void __launch_bounds__(256) gate_split(const bf16* __restrict__ q2,
                                                             bf16* __restrict__ q,
                                                             bf16* __restrict__ gate,
                                                             unsigned rows, unsigned heads,
                                                             unsigned head_dim) {
    pdl_wait(); // before any early return and any buffer another launch writes
    pdl_launch_dependents();
    if (head_dim == 0u) {
        return;
    }
    const unsigned long long n = (unsigned long long)rows * heads * head_dim;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x * 4ull;
    for (unsigned long long base = (unsigned long long)blockIdx.x * blockDim.x * 4ull; base < n;
         base += stride) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            unsigned long long i = base + (unsigned long long)e * blockDim.x + threadIdx.x;
            if (i < n) {
                const unsigned long long head = i / head_dim;
                const unsigned long long src = head * 2ull * head_dim + (i - head * head_dim);
                q[i] = q2[src];
                gate[i] = q2[src + head_dim];
            }
        }
    }
}
