// `flash` module: paged attention on the tensor cores (the `tensor_cores` lever), in the manner
// of FlashAttention-2: a block stages 32-key tiles of K and V in shared memory once for up to
// 64 (row, head) pairs, each warp takes 16 of them through mma.sync m16n8k16 (S = Q·Kᵀ, then
// O += P·V with P rounded to bf16), with an online softmax per pair in registers; up to head_dim
// 128 each tile's loads are issued into registers one tile ahead, while the warps compute the
// tile before. One kernel
// serves every mode, so a sequence's bytes are the same whether its token runs in decode, a
// verify, a prefill chunk or a wide multi-seq step (the lever's batch invariance).
//
// Slots: a block holds `pack` heads (all of one kv head: pack = heads / kv_heads, or 1 when that
// is above 64) × `rows_per_block` rows (R; R·pack <= 64), slot m = (row r0 + m / pack, head
// h0 + m % pack); warp w owns slots 16w..16w+15. Its key tiles are read through the block
// table of its *anchor*, the first of its rows with the longest seq_len: the emitter gives
// R > 1 only to programs whose rows are one sequence (verify, prefill), and R = 1 elsewhere.
// grid = (heads / pack, ⌈rows / R⌉, FLASH_SPLITS), 128 threads.
//
// Numerics of one (row, head), a function of its q, its keys and its length alone:
// - the row attends keys first..len (first = len − W under a sliding window W, else 0);
// - chunks: n = len − first keys, chunk size C = max(256, 32·⌈n / 480⌉) (so at most 16 chunks
//   touch first..len), chunk c = keys c·C..(c+1)·C in absolute positions; chunk z of the row
//   is its (first / C + z)-th, clipped to first..len; block z of the grid takes chunk z of
//   each of its rows (blocks past every row's last chunk return at once);
// - inside a chunk, tiles of 32 keys at absolute multiples of 32, each tile the row's keys
//   touch: s_j = (q·k_j)·scale (the dot through mma.sync: +0, then products in dim order, dims
//   past head_dim zero), -inf for keys outside the chunk; m' = max(m, max_j s_j) (NaN kept);
//   p_j = bf16(exp(s_j − m')) (0 for -inf); l_t = the 32 p_j summed as 4 lane partials (keys
//   8i + 2t, 8i + 2t + 1 for i = 0..3, in that order), (p0 + p1) + (p2 + p3); corr = exp(m − m')
//   (0 while m = -inf); l = fma(l, corr, l_t); o_d = fma(o_d, corr, Σ_j p_j·v_jd) with the sum
//   through mma.sync from +0 over the tile's 32 keys in order;
// - one chunk: out = bf16(o / l); several: each chunk's (m, l, o) goes to the scratch, and the
//   block that counts in last merges them in chunk order: M = max m_z, e_z = exp(m_z − M) (0 for
//   -inf), den = Σ fma(l_z, e_z), num_d = Σ fma(o_zd, e_z), out = bf16(num / den).
// Keys a tile stages but a row does not attend (past its length, before its window, outside
// its chunk) enter its sum as 0·v: nothing for a finite v, NaN for an infinite or NaN one. The
// staged range is the block's (min first .. max len), so only a non-finite key in a row's own
// 32-key tile, but outside its range, can make its bytes depend on the rows beside it.
//
// scratch: the `attn` kernels' (ops::attn::scratch_bytes): per (row, head) a u32 counter (used
// at the slot of the block's first row and head, zero between launches), then FLASH_SPLITS
// partials [m, l, o[head_dim]] f32.
//
// The host emulation runs mma.sync as fmaf in k order (cuda_emu.hpp), which the twin follows;
// a device's tensor cores sum in their own order, so the rule is `differs` against the
// CUDA-core reference (attn::paged_decode / paged_causal).
#include "common.cuh"

#define FLASH_THREADS 128u
#define FLASH_SLOTS 64u      // (row, head) pairs of a block: 4 warps × 16
#define FLASH_KEYS 32u       // keys of one staged tile
#define FLASH_SPLITS 16u     // ops::flash::FLASH_SPLITS == ops::attn::ATTN_SPLITS
#define FLASH_CHUNK_MIN 256u // numerics::flash::CHUNK_MIN
#define FLASH_CHUNK_DIV 480u // numerics::flash::CHUNK_DIV: 15 chunks of 32-key tiles

// Keys of one chunk for a row attending n keys: a multiple of 32, at least 256 and n / 15.
__device__ __forceinline__ unsigned flash_chunk(unsigned n) {
    const unsigned c = ((n + FLASH_CHUNK_DIV - 1u) / FLASH_CHUNK_DIV) * FLASH_KEYS;
    return c > FLASH_CHUNK_MIN ? c : FLASH_CHUNK_MIN;
}

// One row's keys (first..len), its chunk count, and the keys a..b of its chunk z.
struct FlashRow {
    unsigned len;
    unsigned first;
    unsigned chunks;
    unsigned a;
    unsigned b;
};

__device__ __forceinline__ FlashRow flash_row(const int* seq_lens, unsigned r, unsigned capacity,
                                              unsigned window, unsigned z) {
    long long len_ll = seq_lens[r];
    len_ll = len_ll < 0 ? 0 : (len_ll > (long long)capacity ? capacity : len_ll);
    FlashRow fr;
    fr.len = (unsigned)len_ll;
    fr.first = (window != 0u && fr.len > window) ? fr.len - window : 0u;
    fr.chunks = 0u;
    fr.a = 0u;
    fr.b = 0u;
    if (fr.len == 0u) {
        return fr;
    }
    const unsigned chunk = flash_chunk(fr.len - fr.first);
    const unsigned c0 = fr.first / chunk;
    fr.chunks = (fr.len - 1u) / chunk - c0 + 1u;
    if (z < fr.chunks) {
        const unsigned long long begin = (unsigned long long)(c0 + z) * chunk;
        fr.a = begin > fr.first ? (unsigned)begin : fr.first;
        fr.b = begin + chunk < fr.len ? (unsigned)(begin + chunk) : fr.len;
    }
    return fr;
}

// bf16 bits of q[at + d], q[at + d + 1] (zeros past head_dim) as one A-fragment word.
__device__ __forceinline__ unsigned flash_q_pair(const bf16* q, unsigned long long at, unsigned d,
                                                 unsigned head_dim, bool valid) {
    if (!valid || d >= head_dim) {
        return 0u;
    }
    const unsigned lo = bf16_bits(q[at + d]);
    const unsigned hi = d + 1u < head_dim ? bf16_bits(q[at + d + 1u]) : 0u;
    return lo | (hi << 16);
}

__device__ __forceinline__ unsigned flash_pack(bf16 lo, bf16 hi) {
    return (unsigned)bf16_bits(lo) | ((unsigned)bf16_bits(hi) << 16);
}

// Where a block's staged keys come from: the anchor's block table, keys kb..ke, one kv head.
struct FlashKv {
    const bf16* cache;
    const int* table;
    unsigned kb;
    unsigned ke;
    unsigned block_size;
    unsigned row_elems;
    unsigned num_pages;
    unsigned head_dim;
    unsigned long long head_at; // kv head · head_dim
    bool vec;
};

// This thread's 16-byte chunks of the tile at key t0, into registers: chunk c = threadIdx.x +
// i·128 is K's (key c / CPR, dims (c % CPR)·8..) for c < 32·CPR, then V's (dims d_base + ..,
// VCPR chunks a key); zeros outside kb..ke, past head_dim and for a page outside the cache.
template <unsigned CPR, unsigned VCPR, unsigned N>
__device__ __forceinline__ void flash_fetch(uint4 (&v)[N], const FlashKv& kv, unsigned t0,
                                            unsigned d_base) {
#pragma unroll
    for (unsigned i = 0; i < N; ++i) {
        const unsigned c = threadIdx.x + i * FLASH_THREADS;
        const bool is_k = c < FLASH_KEYS * CPR;
        const unsigned cc = is_k ? c : c - FLASH_KEYS * CPR;
        const unsigned per_row = is_k ? CPR : VCPR;
        const unsigned j = t0 + cc / per_row;
        const unsigned d = (cc % per_row) * 8u + (is_k ? 0u : d_base);
        v[i] = make_uint4(0u, 0u, 0u, 0u);
        if (j >= kv.kb && j < kv.ke && d < kv.head_dim) {
            const int page = kv.table[j / kv.block_size];
            if (page >= 0 && (unsigned)page < kv.num_pages) {
                const unsigned long long at =
                    cache_offset((unsigned)page, is_k ? 0u : 1u, j % kv.block_size,
                                 kv.block_size, kv.row_elems) +
                    kv.head_at + d;
                v[i] = load8_bits(kv.cache + at, min(8u, kv.head_dim - d), kv.vec);
            }
        }
    }
}

// The chunks flash_fetch fetched, into the shared K and V tiles.
template <unsigned CPR, unsigned VCPR, unsigned KP, unsigned VP, unsigned N>
__device__ __forceinline__ void flash_put(bf16 (*ks)[KP], bf16 (*vs)[VP], const uint4 (&v)[N]) {
#pragma unroll
    for (unsigned i = 0; i < N; ++i) {
        const unsigned c = threadIdx.x + i * FLASH_THREADS;
        const bool is_k = c < FLASH_KEYS * CPR;
        const unsigned cc = is_k ? c : c - FLASH_KEYS * CPR;
        const unsigned per_row = is_k ? CPR : VCPR;
        bf16* dst = is_k ? &ks[cc / per_row][(cc % per_row) * 8u]
                         : &vs[cc / per_row][(cc % per_row) * 8u];
        *reinterpret_cast<uint4*>(dst) = v[i];
    }
}

// out[i] = o, times sigmoid(gate[i]) as act::sigmoid_mul stores it when `gate` is given
// (Qwen3-Next's gated attention).
__device__ __forceinline__ void store_gated(bf16* __restrict__ out, const bf16* __restrict__ gate,
                                            unsigned long long i, bf16 o) {
    out[i] = gate != nullptr ? sigmoid_gated(o, gate[i]) : o;
}

// The kernels' body for head_dim <= HD. HD <= 128 stages the block's q in shared memory once
// and takes every output dim in one pass over the keys; 256 reads each lane's q fragments again
// for each tile (L1) and makes two passes of 128 output dims each (S computed twice, the same
// bits), so shared memory stays under 48 KiB and the accumulators in registers.
template <unsigned HD>
__device__ __forceinline__ void flash_block(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, bf16* __restrict__ out, float* scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale,
    unsigned rows_per_block) {
    constexpr unsigned PITCH = HD + 8u; // 16-byte rows for ldmatrix, rows in distinct banks
    constexpr unsigned KC = HD / 16u;   // k16 steps of q·k
    constexpr unsigned DV = HD <= 128u ? HD : 128u; // output dims of one pass over the keys
    constexpr unsigned DN = DV / 8u;                // n8 tiles of a pass's output
    constexpr unsigned CPR = HD / 8u;               // 16-byte chunks of a staged key row
    constexpr unsigned VCPR = DV / 8u;              // ... of a staged value row
    constexpr unsigned STAGED = FLASH_KEYS * (CPR + VCPR) / FLASH_THREADS; // chunks a thread
    static_assert(STAGED * FLASH_THREADS == FLASH_KEYS * (CPR + VCPR), "whole chunks a thread");
    constexpr bool kQSmem = HD <= 128u;
    constexpr bool kPrefetch = HD <= 128u; // the next tile's loads in flight (registers)
    __shared__ __align__(16) bf16 qs[kQSmem ? FLASH_SLOTS : 1][kQSmem ? PITCH : 8];
    __shared__ __align__(16) bf16 ks[FLASH_KEYS][PITCH];
    __shared__ __align__(16) bf16 vs[FLASH_KEYS][DV + 8u];
    __shared__ unsigned info[6];
    __shared__ float merge_e[FLASH_SLOTS][FLASH_SPLITS];
    __shared__ float merge_den[FLASH_SLOTS];
    __shared__ unsigned last_s;

    pdl_wait(); // before any early return and any buffer another launch writes
    pdl_launch_dependents();
    if (blockDim.x != FLASH_THREADS || gridDim.z != FLASH_SPLITS || head_dim == 0u ||
        head_dim > HD || kv_heads == 0u || block_size == 0u || heads % kv_heads != 0u ||
        rows_per_block == 0u) {
        return; // the whole block (the CPU twin refuses these launches)
    }
    const unsigned group = heads / kv_heads;
    const unsigned pack = group <= FLASH_SLOTS ? group : 1u;
    if (rows_per_block > FLASH_SLOTS / pack) {
        return;
    }
    const unsigned h0 = blockIdx.x * pack;
    const unsigned r0 = blockIdx.y * rows_per_block;
    const unsigned z = blockIdx.z;
    if (h0 >= heads || r0 >= rows) {
        return;
    }
    const unsigned kvh = h0 / group;
    const unsigned row_elems = kv_heads * head_dim;
    const unsigned capacity = max_blocks * block_size;

    // The block's staged keys kb..ke, anchor, tiles tb..te of chunk z, and chunk count.
    if (threadIdx.x == 0u) {
        unsigned kb = 0xffffffffu, ke = 0u, anchor = r0, tb = 0xffffffffu, te = 0u, zmax = 0u;
        for (unsigned i = 0; i < rows_per_block && r0 + i < rows; ++i) {
            const FlashRow fr = flash_row(seq_lens, r0 + i, capacity, window, z);
            if (fr.len > ke) {
                ke = fr.len;
                anchor = r0 + i;
            }
            kb = fr.first < kb ? fr.first : kb;
            zmax = fr.chunks > zmax ? fr.chunks : zmax;
            if (fr.a < fr.b) {
                tb = fr.a < tb ? fr.a : tb;
                te = fr.b > te ? fr.b : te;
            }
        }
        info[0] = kb;
        info[1] = ke;
        info[2] = anchor;
        info[3] = tb;
        info[4] = te;
        info[5] = zmax > 0u ? zmax : 1u; // block 0 stores a row of no keys (zeros)
    }
    __syncthreads();
    const unsigned kb = info[0], ke = info[1], tb = info[3], te = info[4], zmax = info[5];
    if (z >= zmax) {
        return; // no row of the block has a chunk z (uniform across the block)
    }
    const int* table = block_tables + (unsigned long long)info[2] * max_blocks;

    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2;
    const unsigned t = lane & 3u;
    // This lane's two slots: rows g and g + 8 of its warp's 16.
    bool valid[2];
    FlashRow fr[2];
    unsigned long long at[2]; // q and out offset of the slot's (row, head)
    unsigned slot_row[2], slot_head[2];
#pragma unroll
    for (unsigned s = 0; s < 2; ++s) {
        const unsigned m = warp * 16u + g + 8u * s;
        slot_row[s] = r0 + m / pack;
        slot_head[s] = h0 + m % pack;
        valid[s] = m < rows_per_block * pack && slot_row[s] < rows;
        fr[s] = valid[s] ? flash_row(seq_lens, slot_row[s], capacity, window, z)
                         : FlashRow{0u, 0u, 0u, 0u, 0u};
        at[s] = ((unsigned long long)slot_row[s] * heads + slot_head[s]) * head_dim;
    }
    if (kQSmem) {
        // q's 64 slots × HD dims, zeros past head_dim and for a slot past the rows.
        const bool qvec = (head_dim % 8u == 0u) && aligned16(q);
        for (unsigned c = threadIdx.x; c < FLASH_SLOTS * CPR; c += FLASH_THREADS) {
            const unsigned m = c / CPR;
            const unsigned d0 = (c % CPR) * 8u;
            const unsigned r = r0 + m / pack;
            uint4 bits = make_uint4(0u, 0u, 0u, 0u);
            if (m < rows_per_block * pack && r < rows && d0 < head_dim) {
                const unsigned long long q_at =
                    ((unsigned long long)r * heads + h0 + m % pack) * head_dim + d0;
                bits = load8_bits(q + q_at, min(8u, head_dim - d0), qvec);
            }
            *reinterpret_cast<uint4*>(&qs[m][d0]) = bits;
        }
    }

    const unsigned split_words = head_dim + 2u;
    const unsigned long long slot_words = 1ull + (unsigned long long)FLASH_SPLITS * split_words;
    const bool vec = (head_dim % 8u == 0u) && (row_elems % 8u == 0u) && aligned16(cache);
    const FlashKv kv = {cache, table, kb, ke, block_size, row_elems, num_pages, head_dim,
                        (unsigned long long)kvh * head_dim, vec};
    for (unsigned d_base = 0; d_base < HD && d_base < head_dim; d_base += DV) {
        float m_run[2] = {NEG_INF, NEG_INF};
        float l_run[2] = {0.0f, 0.0f};
        float acc[DN][4];
#pragma unroll
        for (unsigned dn = 0; dn < DN; ++dn) {
#pragma unroll
            for (unsigned e = 0; e < 4; ++e) {
                acc[dn][e] = 0.0f;
            }
        }

        // The tile's loads are issued a tile ahead, into registers, so they are in flight
        // while the warps compute the tile before (the same bytes: only the loads move).
        // (Not at HD 256, whose accumulators leave no registers for it: there each tile is
        // fetched just before it is stored.)
        uint4 staged[STAGED];
        const unsigned t_first = tb - tb % FLASH_KEYS;
        if (kPrefetch && t_first < te) {
            flash_fetch<CPR, VCPR>(staged, kv, t_first, d_base);
        }
        for (unsigned t0 = t_first; t0 < te; t0 += FLASH_KEYS) {
            if (!kPrefetch) {
                flash_fetch<CPR, VCPR>(staged, kv, t0, d_base);
            }
            __syncthreads(); // every warp is done with the previous tile
            flash_put<CPR, VCPR>(ks, vs, staged);
            __syncthreads();
            if (kPrefetch && t0 + FLASH_KEYS < te) {
                flash_fetch<CPR, VCPR>(staged, kv, t0 + FLASH_KEYS, d_base);
            }

            bool active[2];
            unsigned any = 0u;
#pragma unroll
            for (unsigned s = 0; s < 2; ++s) {
                active[s] = fr[s].a < fr[s].b && t0 < fr[s].b && t0 + FLASH_KEYS > fr[s].a;
                any |= active[s] ? 1u : 0u;
            }
            for (unsigned mask = 16u; mask > 0u; mask >>= 1) {
                any |= __shfl_xor_sync(SOLDER_FULL_MASK, any, mask);
            }
            if (any == 0u) {
                continue; // none of the warp's slots attends this tile (uniform across the warp)
            }

            // S = Q·Kᵀ: s[i][e] is key 8i + 2t + (e & 1) of slot e >> 1.
            float sc[4][4];
#pragma unroll
            for (unsigned i = 0; i < 4; ++i) {
#pragma unroll
                for (unsigned e = 0; e < 4; ++e) {
                    sc[i][e] = 0.0f;
                }
            }
#pragma unroll
            for (unsigned kc = 0; kc < KC; ++kc) {
                unsigned a[4];
                if (kQSmem) {
                    // Matrices: slots 0-7 / 8-15 of the warp's 16 (lane bit 3), dims 0-7 / 8-15
                    // (bit 4).
                    ldmatrix_x4(a, &qs[kQSmem ? warp * 16u + (lane & 15u) : 0u]
                                      [kQSmem ? kc * 16u + (lane >> 4) * 8u : 0u]);
                } else {
                    a[0] = flash_q_pair(q, at[0], kc * 16u + 2u * t, head_dim, valid[0]);
                    a[1] = flash_q_pair(q, at[1], kc * 16u + 2u * t, head_dim, valid[1]);
                    a[2] = flash_q_pair(q, at[0], kc * 16u + 8u + 2u * t, head_dim, valid[0]);
                    a[3] = flash_q_pair(q, at[1], kc * 16u + 8u + 2u * t, head_dim, valid[1]);
                }
#pragma unroll
                for (unsigned p = 0; p < 2; ++p) {
                    // Matrices: keys 0-7 / 8-15 (lane bit 4) of pair p, dims 0-7 / 8-15 (bit 3).
                    unsigned b[4];
                    ldmatrix_x4(b, &ks[p * 16u + (lane >> 4) * 8u + (lane & 7u)]
                                      [kc * 16u + ((lane >> 3) & 1u) * 8u]);
                    mma_bf16_16816(sc[2 * p], a, b[0], b[1]);
                    mma_bf16_16816(sc[2 * p + 1], a, b[2], b[3]);
                }
            }

            // Scale, mask, the tile's max, p in bf16 and its sum, per slot.
            float m_new[2], corr[2], l_tile[2];
            bf16 pb[4][4];
#pragma unroll
            for (unsigned s = 0; s < 2; ++s) {
                float tmax = NEG_INF;
#pragma unroll
                for (unsigned i = 0; i < 4; ++i) {
#pragma unroll
                    for (unsigned h = 0; h < 2; ++h) {
                        const unsigned e = 2u * s + h;
                        const unsigned j = t0 + 8u * i + 2u * t + h;
                        const bool in = j >= fr[s].a && j < fr[s].b;
                        sc[i][e] = in ? __fmul_rn(sc[i][e], scale) : NEG_INF;
                        tmax = fmax_nan(tmax, sc[i][e]);
                    }
                }
                tmax = fmax_nan(tmax, __shfl_xor_sync(SOLDER_FULL_MASK, tmax, 1));
                tmax = fmax_nan(tmax, __shfl_xor_sync(SOLDER_FULL_MASK, tmax, 2));
                m_new[s] = fmax_nan(m_run[s], tmax);
                float part = 0.0f;
#pragma unroll
                for (unsigned i = 0; i < 4; ++i) {
#pragma unroll
                    for (unsigned h = 0; h < 2; ++h) {
                        const unsigned e = 2u * s + h;
                        const float p =
                            sc[i][e] == NEG_INF ? 0.0f : expf(__fsub_rn(sc[i][e], m_new[s]));
                        pb[i][e] = to_bf16(p);
                        part = __fadd_rn(part, to_f32(pb[i][e]));
                    }
                }
                part = __fadd_rn(part, __shfl_xor_sync(SOLDER_FULL_MASK, part, 1));
                part = __fadd_rn(part, __shfl_xor_sync(SOLDER_FULL_MASK, part, 2));
                l_tile[s] = part;
                corr[s] = m_run[s] == NEG_INF ? 0.0f : expf(__fsub_rn(m_run[s], m_new[s]));
            }

            // O = O·corr + P·V, each n8 tile of dims from +0 over the tile's 32 keys.
            unsigned pa[2][4];
#pragma unroll
            for (unsigned kk = 0; kk < 2; ++kk) {
                pa[kk][0] = flash_pack(pb[2 * kk][0], pb[2 * kk][1]);
                pa[kk][1] = flash_pack(pb[2 * kk][2], pb[2 * kk][3]);
                pa[kk][2] = flash_pack(pb[2 * kk + 1][0], pb[2 * kk + 1][1]);
                pa[kk][3] = flash_pack(pb[2 * kk + 1][2], pb[2 * kk + 1][3]);
            }
#pragma unroll
            for (unsigned dn = 0; dn < DN; dn += 2) {
                float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                float d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (unsigned kk = 0; kk < 2; ++kk) {
                    // Matrices (transposed): keys 0-7 / 8-15 (lane bit 3), dims of tile dn / dn + 1
                    // (bit 4).
                    unsigned b[4];
                    ldmatrix_x4_trans(b, &vs[kk * 16u + ((lane >> 3) & 1u) * 8u + (lane & 7u)]
                                            [(dn + (lane >> 4)) * 8u]);
                    mma_bf16_16816(d0, pa[kk], b[0], b[1]);
                    mma_bf16_16816(d1, pa[kk], b[2], b[3]);
                }
#pragma unroll
                for (unsigned e = 0; e < 4; ++e) {
                    if (active[e >> 1]) {
                        acc[dn][e] = __fmaf_rn(acc[dn][e], corr[e >> 1], d0[e]);
                        acc[dn + 1][e] = __fmaf_rn(acc[dn + 1][e], corr[e >> 1], d1[e]);
                    }
                }
            }
#pragma unroll
            for (unsigned s = 0; s < 2; ++s) {
                if (active[s]) {
                    l_run[s] = __fmaf_rn(l_run[s], corr[s], l_tile[s]);
                    m_run[s] = m_new[s];
                }
            }
        }

        // One chunk: store. Several: this chunk's partial to the scratch.
#pragma unroll
        for (unsigned s = 0; s < 2; ++s) {
            if (!valid[s] || (z >= fr[s].chunks && !(z == 0u && fr[s].chunks == 0u))) {
                continue;
            }
            if (fr[s].chunks <= 1u) {
#pragma unroll
                for (unsigned dn = 0; dn < DN; ++dn) {
#pragma unroll
                    for (unsigned h = 0; h < 2; ++h) {
                        const unsigned d = d_base + dn * 8u + 2u * t + h;
                        if (d < head_dim) {
                            const float o = fr[s].chunks == 0u
                                                ? 0.0f
                                                : __fdiv_rn(acc[dn][2u * s + h], l_run[s]);
                            store_gated(out, gate, at[s] + d, to_bf16(o));
                        }
                    }
                }
                continue;
            }
            float* partial = scratch + ((unsigned long long)slot_row[s] * heads + slot_head[s]) *
                                           slot_words +
                             1u + z * split_words;
            if (t == 0u) {
                partial[0] = m_run[s];
                partial[1] = l_run[s];
            }
#pragma unroll
            for (unsigned dn = 0; dn < DN; ++dn) {
#pragma unroll
                for (unsigned h = 0; h < 2; ++h) {
                    const unsigned d = d_base + dn * 8u + 2u * t + h;
                    if (d < head_dim) {
                        partial[2u + d] = acc[dn][2u * s + h];
                    }
                }
            }
        }
    }
    if (zmax <= 1u) {
        return;
    }
    __threadfence(); // this block's partials are visible device-wide before it counts in
    __syncthreads();
    unsigned* counter =
        reinterpret_cast<unsigned*>(scratch + ((unsigned long long)r0 * heads + h0) * slot_words);
    if (threadIdx.x == 0u) {
        const unsigned arrived = counter_arrive(counter);
        last_s = arrived == zmax - 1u ? 1u : 0u;
    }
    __syncthreads();
    if (last_s == 0u) {
        return; // another block merges (uniform across the block)
    }
    __threadfence();
    // The last block: every chunk's partial is written. Merge each slot's in chunk order: the
    // slot's first lane of its quad takes the weights e_z and den, then the quad's 4 lanes take
    // every 4th dim (the bytes do not depend on which lane takes a dim).
#pragma unroll
    for (unsigned s = 0; s < 2; ++s) {
        const unsigned m = warp * 16u + g + 8u * s;
        const bool merge = valid[s] && fr[s].chunks > 1u;
        const float* slot = scratch +
                            ((unsigned long long)slot_row[s] * heads + slot_head[s]) * slot_words +
                            1u;
        if (merge && t == 0u) {
            float big = NEG_INF;
            for (unsigned c = 0; c < fr[s].chunks; ++c) {
                big = fmax_nan(big, __ldcg(slot + c * split_words));
            }
            float den = 0.0f;
            for (unsigned c = 0; c < fr[s].chunks; ++c) {
                const float mc = __ldcg(slot + c * split_words);
                const float e = mc == NEG_INF ? 0.0f : expf(__fsub_rn(mc, big));
                merge_e[m][c] = e;
                den = __fmaf_rn(__ldcg(slot + c * split_words + 1u), e, den);
            }
            merge_den[m] = den;
        }
        __syncwarp();
        if (merge) {
            for (unsigned d = t; d < head_dim; d += 4u) {
                float num = 0.0f;
                for (unsigned c = 0; c < fr[s].chunks; ++c) {
                    num = __fmaf_rn(__ldcg(slot + c * split_words + 2u + d), merge_e[m][c], num);
                }
                store_gated(out, gate, at[s] + d, to_bf16(__fdiv_rn(num, merge_den[m])));
            }
        }
    }
    if (threadIdx.x == 0u) {
        counter_clear(counter); // every chunk's block has counted in: zero for the next launch
    }
}

// q bf16[rows·heads·head_dim], cache (the layer's KV pages), block_tables i32[rows·max_blocks],
// seq_lens i32[rows] → out bf16[rows·heads·head_dim], through scratch (see above); gate:
// bf16[rows·heads·head_dim] or null, when given out is stored times sigmoid(gate) as
// act::sigmoid_mul stores it (Qwen3-Next's gated attention); window: the layer's sliding
// window, 0 for none; rows_per_block: R (1, or up to 64 / pack for one sequence's rows).
// head_dim <= 64.
extern "C" __global__ void __launch_bounds__(128) paged_mma(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, bf16* __restrict__ out, float* scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale,
    unsigned rows_per_block) {
    flash_block<64>(q, cache, block_tables, seq_lens, gate, out, scratch, rows, heads,
                    kv_heads, head_dim, block_size, max_blocks, num_pages, window, scale,
                    rows_per_block);
}

// paged_mma for head_dim <= 128: the same arguments, grid and bytes.
extern "C" __global__ void __launch_bounds__(128) paged_mma_128(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, bf16* __restrict__ out, float* scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale,
    unsigned rows_per_block) {
    flash_block<128>(q, cache, block_tables, seq_lens, gate, out, scratch, rows, heads,
                     kv_heads, head_dim, block_size, max_blocks, num_pages, window, scale,
                     rows_per_block);
}

// paged_mma for head_dim <= 256: the same arguments, grid and bytes.
extern "C" __global__ void __launch_bounds__(128) paged_mma_256(
    const bf16* __restrict__ q, const bf16* __restrict__ cache,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const bf16* __restrict__ gate, bf16* __restrict__ out, float* scratch, unsigned rows,
    unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned block_size,
    unsigned max_blocks, unsigned num_pages, unsigned window, float scale,
    unsigned rows_per_block) {
    flash_block<256>(q, cache, block_tables, seq_lens, gate, out, scratch, rows, heads,
                     kv_heads, head_dim, block_size, max_blocks, num_pages, window, scale,
                     rows_per_block);
}
