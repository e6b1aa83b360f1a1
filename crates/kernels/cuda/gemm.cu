// `gemm` module: projections on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate),
// for the programs whose rows make a matrix product of a projection (prefill chunks, wide
// multi-seq and verify programs) rather than a matrix-vector one.
#include "common.cuh"

// Block tile: 64 rows (tokens) × 32 output features, k in steps of 64. Four warps, each owning
// 16 rows × 32 features (one m16 A fragment against four n8 B fragments per k16 step). Tiles
// are staged in shared memory with a row pitch of 72 bf16 (144 bytes): every ldmatrix row
// address stays 16-byte aligned and the eight rows of one 8×8 matrix fall in distinct banks.
// Staging is software-pipelined through registers: each thread loads its chunks of the next
// k tile from global memory while the warps run the current tile's mma.sync, so a tile's
// load latency hides behind the one before it (the first device run, 2026-12-04, measured
// the unpipelined 32-wide tiles at 2-17% of the tensor pipe, one block per SM waiting on
// its loads). bf16 weight tiles are also asked of L2 GEMM_AHEAD tiles ahead (gemm_ahead), for
// the launches with few blocks and little arithmetic: decode widths.
//
// Numerics: each output's accumulator starts at +0 and takes the products of its row of x and
// its weight row in k order, 16 at a time through mma.sync, then the zero padding of the last
// k tile. The order does not depend on the row count, on which block or warp holds the row, or
// on the grid: a row's bytes are the same in any program that launches this kernel (batch
// invariance). Against the CUDA-core reference (gemv's segmented dots) the sums differ in the
// last bits, so the rules launching these kernels are `differs` (FUSIONS.toml).
#define GEMM_BM 64
#define GEMM_BN 32
#define GEMM_BK 64
#define GEMM_PITCH (GEMM_BK + 8)
#define GEMM_THREADS 128
// 16-byte chunks of one staged k tile per thread: of x's 64 rows, of one weight's 32.
#define GEMM_X_CHUNKS (GEMM_BM * GEMM_BK / 8 / GEMM_THREADS)
#define GEMM_W_CHUNKS (GEMM_BN * GEMM_BK / 8 / GEMM_THREADS)

// Which rows of x a block's 64 tile rows are: `src(r)` the row of x that tile row r reads
// (GEMM_NO_ROW: zeros, nothing stored), `dst(r)` the output row it stores.
#define GEMM_NO_ROW 0xffffffffu

// `leads()`: whether the block asks L2 for its weight tiles ahead (gemm_ahead): one block of
// those that read the same tiles, the first to run them.

// Rows m0.. of a row-major x of `rows` rows, stored at the same rows. The first row block
// leads: the row blocks of one feature block are issued side by side (gemm_block) and read
// the same weight tiles.
struct SpanRows {
    unsigned m0;
    unsigned rows;
    __device__ __forceinline__ unsigned src(unsigned r) const {
        return m0 + r < rows ? m0 + r : GEMM_NO_ROW;
    }
    __device__ __forceinline__ unsigned dst(unsigned r) const { return m0 + r; }
    __device__ __forceinline__ bool leads() const { return m0 == 0u; }
};

// The block's place in the grid: x the row blocks (⌈rows/64⌉), y the feature blocks (of 32
// features, in the kernel's own numbering). Blocks are issued x fastest, so the blocks that
// share a weight tile run side by side and the tile comes from DRAM once while x's rows (a few
// MB at most) stay in L2. Feature-major order streamed every weight once per row block: 8 times
// for a 512-row prefill chunk whose weights exceed L2. CUTLASS's threadblock rasterisation makes
// the same choice for a short, wide product. y holds at most 65535 feature blocks (2,097,120
// features), which the emitters check.
struct GemmBlock {
    unsigned m0;      // the block's first row
    unsigned feature; // its feature block
};
__device__ __forceinline__ GemmBlock gemm_block() {
    return GemmBlock{blockIdx.x * GEMM_BM, blockIdx.y};
}

// `count` picks (indices r·k + j into an MoE step's ids) gathered in shared memory: tile row r
// reads x row picks[r] / k and stores output row picks[r].
struct PickRows {
    const unsigned* picks;
    unsigned count;
    unsigned k;
    __device__ __forceinline__ unsigned src(unsigned r) const {
        return r < count ? picks[r] / k : GEMM_NO_ROW;
    }
    __device__ __forceinline__ unsigned dst(unsigned r) const { return picks[r]; }
    // An expert's tiles are this block's alone.
    __device__ __forceinline__ bool leads() const { return true; }
};

// `count` picks gathered in shared memory whose rows of x are the picks themselves (x is per
// pick, as the experts' act is): tile row r reads and stores row picks[r].
struct PickSelf {
    const unsigned* picks;
    unsigned count;
    __device__ __forceinline__ unsigned src(unsigned r) const {
        return r < count ? picks[r] : GEMM_NO_ROW;
    }
    __device__ __forceinline__ unsigned dst(unsigned r) const { return picks[r]; }
    __device__ __forceinline__ bool leads() const { return true; }
};

// load8_bits with its scalar path inline (the same bits): the out-of-line call made ptxas
// spill around it in the experts kernel, whose pick loop keeps more registers live.
__device__ __forceinline__ uint4 gemm_load8(const bf16* p, unsigned valid, bool vec) {
    if (vec && valid >= 8) {
        return __ldg(reinterpret_cast<const uint4*>(p));
    }
    unsigned w[4];
#pragma unroll
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned lo = 2 * i < valid ? bf16_bits(p[2 * i]) : 0u;
        const unsigned hi = 2 * i + 1 < valid ? bf16_bits(p[2 * i + 1]) : 0u;
        w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Where a tile's 16-byte chunks come from: `load8(row, k, i0, vec)` gives elements [i0, i0 + 8)
// of row `row` of an [..][k] matrix as 8 packed bf16 (at or past k: +0). `AHEAD`: whether
// gemm_ahead asks L2 for its tiles, through `at(row, k, i)`, element i's address (i < k).

// A row-major bf16 matrix (x, or a bf16 weight).
struct GemmBf16 {
    const bf16* __restrict__ p;
    __device__ __forceinline__ bool aligned() const { return aligned16(p); }
    __device__ __forceinline__ uint4 load8(unsigned row, unsigned k, unsigned i0, bool vec) const {
        return gemm_load8(p + (unsigned long long)row * k + i0, k - i0, vec);
    }
    static constexpr bool AHEAD = true;
    // gemm_narrow's stage: 256 k (16 KB of a 32-feature tile in flight a block).
    static constexpr unsigned NARROW_K = 256;
    __device__ __forceinline__ const void* at(unsigned row, unsigned k, unsigned i) const {
        return p + (unsigned long long)row * k + i;
    }
};

// A quantized weight (common.cuh's WFp8, WInt4): each chunk dequantised on its way to shared
// memory, so the tile holds exactly the dequantised bf16 matrix and the mma.sync sequence is
// the bf16 kernel's.
template <class W>
struct GemmQuant {
    W w;
    __device__ __forceinline__ bool aligned() const { return true; }
    __device__ __forceinline__ uint4 load8(unsigned row, unsigned k, unsigned i0, bool) const {
        return w.row(row, k).load8(i0, k - i0);
    }
    // Not asked ahead: the addresses kept live across the tile loop made ptxas spill in the
    // quantized qkv and experts kernels, which sit at its 128-register mark; a quantized tile
    // is also a half or a quarter of the bytes, with the dequantisation to run.
    static constexpr bool AHEAD = false;
    // gemm_narrow's stage: 128 k, a thread's 4 dequantised chunks of each weight in registers
    // (256 made ptxas spill the fp8 entry; 128 k of fp8 is 4 KB of a tile in flight a block,
    // twice the wide tile's).
    static constexpr unsigned NARROW_K = 128;
};

// One expert's quantized matrix of a stacked blob (common.cuh's MoeFp8Matrix, MoeInt4Matrix),
// dequantised chunk by chunk as GemmQuant does.
template <class M>
struct GemmExpert {
    M m;
    __device__ __forceinline__ bool aligned() const { return true; }
    __device__ __forceinline__ uint4 load8(unsigned row, unsigned k, unsigned i0, bool) const {
        return m.load8(row, i0, k - i0);
    }
    static constexpr bool AHEAD = false; // as GemmQuant
};

// An int4 expert's chunk with its row's addresses worked out once (the generic
// MoeInt4Matrix::load8 recomputes them per weight, which made ptxas spill in
// experts_down_mma_int4): each weight is weight_bits's dequant_int4_bits of the same nibble,
// zero point and scale; a chunk whole in one group on the fast path (quant_chunk_whole).
template <>
struct GemmExpert<MoeInt4Matrix> {
    MoeInt4Matrix m;
    __device__ __forceinline__ bool aligned() const { return true; }
    __device__ __forceinline__ uint4 load8(unsigned row, unsigned k, unsigned i0, bool) const {
        const unsigned valid = k - i0;
        const unsigned char* q = m.values + (unsigned long long)row * (k / 2u);
        const unsigned long long g0 = (unsigned long long)row * m.groups;
        if (quant_chunk_whole(i0, valid, m.group) && quant_aligned(q + (i0 >> 1), 4u)) {
            const unsigned long long g = g0 + i0 / m.group;
            return dequant8_int4(__ldg(reinterpret_cast<const unsigned*>(q + (i0 >> 1))),
                                 m.zeros[g], m.scales[g]);
        }
        unsigned b[8];
#pragma unroll
        for (unsigned e = 0; e < 8u; ++e) {
            const unsigned i = i0 + e;
            b[e] = 0u;
            if (e < valid) {
                const unsigned byte = q[i / 2u];
                const unsigned nibble = (i & 1u) != 0u ? byte >> 4 : byte & 0xfu;
                const unsigned long long g = g0 + i / m.group;
                b[e] = dequant_int4_bits(nibble, m.zeros[g], m.scales[g]);
            }
        }
        return pack8_bits(b);
    }
    static constexpr bool AHEAD = false; // as GemmQuant
};

// This thread's N chunks of the tile at k0 of matrix src whose rows `rows_of` names (x's 64
// rows, or a weight's 32 through SpanRows{n0, n}), into registers: +0 past k and for
// GEMM_NO_ROW. Chunk i is tile chunk c = threadIdx.x + i·T (row c / (BK/8), k
// (c % (BK/8))·8), as gemm_put stores it. BK: the tile's k (GEMM_BK; the source's NARROW_K for
// gemm_narrow); T: the block's threads (GEMM_THREADS; GEMM_LARGE_THREADS for gemm_large).
template <unsigned N, unsigned BK = GEMM_BK, unsigned T = GEMM_THREADS, class Rows, class Src>
__device__ __forceinline__ void gemm_fetch(uint4 (&v)[N], const Src& src, Rows rows_of,
                                           unsigned k, unsigned k0, bool vec) {
    constexpr unsigned chunks = BK / 8;
#pragma unroll
    for (unsigned i = 0; i < N; ++i) {
        const unsigned c = threadIdx.x + i * T;
        const unsigned kc = (c % chunks) * 8;
        const unsigned row = rows_of.src(c / chunks);
        v[i] = make_uint4(0u, 0u, 0u, 0u);
        if (row != GEMM_NO_ROW && k0 + kc < k) {
            v[i] = src.load8(row, k, k0 + kc, vec);
        }
    }
}

// A thread's fetched chunks (gemm_fetch's) into the shared tile s, of BK k a row.
template <unsigned N, unsigned BK = GEMM_BK, unsigned T = GEMM_THREADS>
__device__ __forceinline__ void gemm_put(bf16 (*s)[BK + 8], const uint4 (&v)[N]) {
    constexpr unsigned chunks = BK / 8;
#pragma unroll
    for (unsigned i = 0; i < N; ++i) {
        const unsigned c = threadIdx.x + i * T;
        *reinterpret_cast<uint4*>(&s[c / chunks][(c % chunks) * 8]) = v[i];
    }
}

// Whether every 8-element chunk of x and of the NW weights loads as one 16-byte vector: k a
// multiple of 8 and every matrix 16-byte aligned (else gemm_load8's scalar path, the same bits).
template <unsigned NW, class W>
__device__ __forceinline__ bool gemm_vec(const GemmBf16& xm, const W (&w)[NW], unsigned k) {
    bool vec = (k % 8u) == 0u && xm.aligned();
#pragma unroll
    for (unsigned i = 0; i < NW; ++i) vec = vec && w[i].aligned();
    return vec;
}

// Weight tiles asked of L2 ahead of the tile being staged, by a block whose rows lead
// (`leads()`). A block stages one k tile in registers while the warps run the one before, so
// alone it keeps one tile of each weight in flight: 4 KB of bf16 a block, a DRAM round trip per
// 64 k. That is what a decode-width launch waits on — few blocks (⌈n/32⌉ of one row block), no
// arithmetic to hide behind — and the first device run timed a tensor-core decode step at
// 10.8 ms against gemv's 2.8 ms. With the window a tile's loads find their lines in L2, and up
// to GEMM_AHEAD tiles per weight are on their way from DRAM. No value is read (prefetch_l2):
// the bytes are the same.
#define GEMM_AHEAD 8u

// Weight row cols_of.src(c)'s line at k tile kt of each of NW weights, thread c + 32·i asking for
// weight i's (NW <= 4); past k, GEMM_NO_ROW columns and blocks that do not lead ask for nothing.
// Everything is worked out again at each call: kept live across the tile loop, it made ptxas
// spill in the gated qkv kernels.
template <unsigned NW, class W, class Rows, class Cols>
__device__ __forceinline__ void gemm_ahead(const W (&w)[NW], Rows rows_of, Cols cols_of,
                                           unsigned k, unsigned kt) {
    static_assert(NW * GEMM_BN <= GEMM_THREADS, "one column of one weight a thread");
    if constexpr (W::AHEAD) {
        const unsigned i = threadIdx.x / GEMM_BN;
        if (!rows_of.leads() || kt >= k || i >= NW) {
            return;
        }
        const unsigned row = cols_of.src(threadIdx.x % GEMM_BN);
        if (row != GEMM_NO_ROW) {
#pragma unroll
            for (unsigned j = 0; j < NW; ++j) {
                if (j == i) prefetch_l2(w[j].at(row, k, kt));
            }
        }
    }
}

// gemm_tile_acc: the block's tile of NW weights (one, or gate and up) against the same 64 rows
// of x (`rows_of`'s), tile column c being weight row cols_of.src(c) (GEMM_NO_ROW: a zero
// column), into acc: acc[i][j][0..3] of this lane is rows (g, g+8) of its warp's 16, tile
// columns 8j + 2t and the next, of dot(x row, w[i] row) over all of k. Each accumulator takes
// the same mma.sync sequence whatever NW and the columns are, so a fused kernel's dots are
// linear_mma's bytes. The caller waits on the previous grid (pdl_wait) first; the tile ends on
// a barrier after its last use of shared memory, so a caller may store and restage at once.
// gemm_tile: output features n0..n0+32 of each weight; store(dst row, f, v) for every row
// `rows_of` names and f < n, v[i] the dot of weight i.
template <unsigned NW, class W, class Rows, class Cols>
__device__ __forceinline__ void gemm_tile_acc(const bf16* __restrict__ x, const W (&w)[NW],
                                              Rows rows_of, Cols cols_of, unsigned k,
                                              float (&acc)[NW][4][4]) {
    __shared__ __align__(16) bf16 xs[GEMM_BM][GEMM_PITCH];
    __shared__ __align__(16) bf16 ws[NW][GEMM_BN][GEMM_PITCH];
    const unsigned warp = threadIdx.x / 32;
    const unsigned lane = threadIdx.x % 32;
    const GemmBf16 xm{x};
    const bool vec = gemm_vec(xm, w, k);
#pragma unroll
    for (unsigned i = 0; i < NW; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
        }
    }
    // The next k tile in registers while the current one runs from shared memory.
    uint4 xv[GEMM_X_CHUNKS];
    uint4 wv[NW][GEMM_W_CHUNKS];
    gemm_fetch(xv, xm, rows_of, k, 0u, vec);
#pragma unroll
    for (unsigned i = 0; i < NW; ++i) gemm_fetch(wv[i], w[i], cols_of, k, 0u, vec);
    // Tiles 1..GEMM_AHEAD into L2, then at each tile k0 the one GEMM_AHEAD past k0's next.
    for (unsigned a = 1u; a <= GEMM_AHEAD; ++a) gemm_ahead(w, rows_of, cols_of, k, a * GEMM_BK);
    for (unsigned k0 = 0; k0 < k; k0 += GEMM_BK) {
        gemm_put(xs, xv);
#pragma unroll
        for (unsigned i = 0; i < NW; ++i) gemm_put(ws[i], wv[i]);
        __syncthreads();
        // Between the put and the fetch, where no staged chunk is live in registers.
        gemm_ahead(w, rows_of, cols_of, k, k0 + (GEMM_AHEAD + 1u) * GEMM_BK);
        if (k0 + GEMM_BK < k) {
            gemm_fetch(xv, xm, rows_of, k, k0 + GEMM_BK, vec);
#pragma unroll
            for (unsigned i = 0; i < NW; ++i) {
                gemm_fetch(wv[i], w[i], cols_of, k, k0 + GEMM_BK, vec);
            }
        }
#pragma unroll
        for (unsigned kk = 0; kk < GEMM_BK; kk += 16) {
            // Matrices: rows 0-7 / 8-15 of the warp's 16 (lane bit 3), k 0-7 / 8-15 (bit 4).
            unsigned a[4];
            ldmatrix_x4(a, &xs[warp * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
            for (unsigned i = 0; i < NW; ++i) {
#pragma unroll
                for (unsigned p = 0; p < 2; ++p) {
                    // Matrices: k 0-7 / 8-15 (lane bit 3) of features 0-7 / 8-15 (bit 4) of
                    // pair p.
                    unsigned b[4];
                    ldmatrix_x4(b, &ws[i][p * 16 + (lane >> 4) * 8 + (lane & 7)][kk + ((lane >> 3) & 1) * 8]);
                    mma_bf16_16816(acc[i][2 * p], a, b[0], b[1]);
                    mma_bf16_16816(acc[i][2 * p + 1], a, b[2], b[3]);
                }
            }
        }
        __syncthreads();
    }
}

template <unsigned NW, class W, class Rows, class Store>
__device__ __forceinline__ void gemm_tile(const bf16* __restrict__ x, const W (&w)[NW],
                                          Rows rows_of, unsigned k, unsigned n, unsigned n0,
                                          Store store) {
    float acc[NW][4][4];
    gemm_tile_acc<NW>(x, w, rows_of, SpanRows{n0, n}, k, acc);
    const unsigned warp = threadIdx.x / 32;
    const unsigned lane = threadIdx.x % 32;
    const unsigned g = lane >> 2;
    const unsigned t = lane & 3;
#pragma unroll
    for (unsigned j = 0; j < 4; ++j) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            const unsigned r = warp * 16 + g + (e >> 1) * 8;
            const unsigned f = n0 + j * 8 + 2 * t + (e & 1);
            float v[NW];
#pragma unroll
            for (unsigned i = 0; i < NW; ++i) v[i] = acc[i][j][e];
            if (rows_of.src(r) != GEMM_NO_ROW && f < n) store(rows_of.dst(r), f, v);
        }
    }
}

// ---- decode widths: gemm_narrow (the `_narrow` entries, lever `mma_narrow`) ----------------
//
// At a decode width a block of gemm_tile has one row of 64 to compute and waits on its weight
// tiles: one 64-k tile of each weight in flight a block, a round trip per tile, while three of
// its four warps multiply zero rows. gemm_narrow takes the same block (32 features, 128
// threads, the same grid) through the rows 16 at a time, each warp owning 8 of the features
// (one n8 column against the 16 rows), and stages k NARROW_K at a time (the weight source's:
// 256 for bf16, four times the weight bytes in flight a block from registers and a quarter of
// the round trips; 128 for a quantized weight, dequantised as it is fetched), and runs no
// mma.sync on rows that are not there. Each output's accumulator takes exactly gemm_tile's
// sequence (from +0, one mma.sync m16n8k16 per 16 k in k order, up to the same 64-k tile end),
// so the bytes are linear_mma's whatever the width: a `_narrow` entry is a drop-in for its
// kernel (emulated test `narrow_entries_write_the_bytes_of_the_wide_ones`).
#define GEMM_NM 16

// The narrow tile of NW weights against 16 rows of x (`rows_of`'s), tile column c being weight
// row cols_of.src(c): acc[i][0..3] of this lane is rows (g, g+8), tile columns 8·warp + 2t and
// the next, of dot(x row, w[i] row). Ends on a barrier after its last use of shared memory.
template <unsigned NW, class W, class Rows, class Cols>
__device__ __forceinline__ void gemm_narrow_acc(const bf16* __restrict__ x, const W (&w)[NW],
                                                Rows rows_of, Cols cols_of, unsigned k,
                                                float (&acc)[NW][4]) {
    // The stage's k, and a thread's chunks of x and of each weight in it.
    constexpr unsigned NK = W::NARROW_K;
    constexpr unsigned NX = GEMM_NM * NK / 8 / GEMM_THREADS;
    constexpr unsigned NWC = GEMM_BN * NK / 8 / GEMM_THREADS;
    static_assert(NK % GEMM_BK == 0 && NX * 8 * GEMM_THREADS == GEMM_NM * NK, "whole tiles");
    __shared__ __align__(16) bf16 xs[GEMM_NM][NK + 8];
    __shared__ __align__(16) bf16 ws[NW][GEMM_BN][NK + 8];
    const unsigned warp = threadIdx.x / 32;
    const unsigned lane = threadIdx.x % 32;
    const GemmBf16 xm{x};
    const bool vec = gemm_vec(xm, w, k);
#pragma unroll
    for (unsigned i = 0; i < NW; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
    }
    uint4 xv[NX];
    uint4 wv[NW][NWC];
    gemm_fetch<NX, NK>(xv, xm, rows_of, k, 0u, vec);
#pragma unroll
    for (unsigned i = 0; i < NW; ++i) {
        gemm_fetch<NWC, NK>(wv[i], w[i], cols_of, k, 0u, vec);
    }
    // The window of gemm_tile_acc: GEMM_AHEAD 64-k tiles past the stage being fetched.
    for (unsigned a = 0u; a < GEMM_AHEAD; ++a) gemm_ahead(w, rows_of, cols_of, k, NK + a * GEMM_BK);
    for (unsigned k0 = 0; k0 < k; k0 += NK) {
        gemm_put<NX, NK>(xs, xv);
#pragma unroll
        for (unsigned i = 0; i < NW; ++i) gemm_put<NWC, NK>(ws[i], wv[i]);
        __syncthreads();
        for (unsigned a = 0u; a < NK / GEMM_BK; ++a) {
            gemm_ahead(w, rows_of, cols_of, k, k0 + NK + (GEMM_AHEAD + a) * GEMM_BK);
        }
        if (k0 + NK < k) {
            gemm_fetch<NX, NK>(xv, xm, rows_of, k, k0 + NK, vec);
#pragma unroll
            for (unsigned i = 0; i < NW; ++i) {
                gemm_fetch<NWC, NK>(wv[i], w[i], cols_of, k, k0 + NK, vec);
            }
        }
        // gemm_tile's 64-k tiles that start before k, each four k16 steps (its zero padding
        // included), in order.
#pragma unroll 1
        for (unsigned kt = 0; kt < NK; kt += GEMM_BK) {
            if (k0 + kt < k) {
#pragma unroll
                for (unsigned kk = kt; kk < kt + GEMM_BK; kk += 32) {
                    // Matrices: rows 0-7 / 8-15 (lane bit 3), k 0-7 / 8-15 (bit 4), of k16
                    // steps kk and kk + 16.
                    unsigned a0[4], a1[4];
                    ldmatrix_x4(a0, &xs[lane & 15][kk + (lane >> 4) * 8]);
                    ldmatrix_x4(a1, &xs[lane & 15][kk + 16 + (lane >> 4) * 8]);
#pragma unroll
                    for (unsigned i = 0; i < NW; ++i) {
                        // Matrices: k 0-7, 8-15, 16-23, 24-31 past kk (lane bits 3-4) of the
                        // warp's 8 features.
                        unsigned b[4];
                        ldmatrix_x4(b, &ws[i][warp * 8 + (lane & 7)][kk + (lane >> 3) * 8]);
                        mma_bf16_16816(acc[i], a0, b[0], b[1]);
                        mma_bf16_16816(acc[i], a1, b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads();
    }
}

// gemm_tile's outputs through narrow tiles: the block's rows m0.. (up to GEMM_BM of them, the
// wide kernel's row block) 16 at a time, store(dst row, f, v) for every row and f < n.
template <unsigned NW, class W, class Store>
__device__ __forceinline__ void gemm_narrow(const bf16* __restrict__ x, const W (&w)[NW],
                                            unsigned m0, unsigned rows, unsigned k, unsigned n,
                                            unsigned n0, Store store) {
    const unsigned warp = threadIdx.x / 32;
    const unsigned lane = threadIdx.x % 32;
    const unsigned g = lane >> 2;
    const unsigned t = lane & 3;
    for (unsigned m = m0; m < rows && m < m0 + GEMM_BM; m += GEMM_NM) {
        const SpanRows rows_of{m, rows};
        float acc[NW][4];
        gemm_narrow_acc<NW>(x, w, rows_of, SpanRows{n0, n}, k, acc);
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            const unsigned r = g + (e >> 1) * 8;
            const unsigned f = n0 + warp * 8 + 2 * t + (e & 1);
            float v[NW];
#pragma unroll
            for (unsigned i = 0; i < NW; ++i) v[i] = acc[i][e];
            if (rows_of.src(r) != GEMM_NO_ROW && f < n) store(rows_of.dst(r), f, v);
        }
    }
}

// gemm_tile, or gemm_narrow when NARROW.
template <unsigned NW, bool NARROW, class W, class Store>
__device__ __forceinline__ void gemm_block_rows(const bf16* __restrict__ x, const W (&w)[NW],
                                                unsigned rows, unsigned k, unsigned n,
                                                unsigned n0, Store store) {
    const unsigned m0 = gemm_block().m0;
    if constexpr (NARROW) {
        gemm_narrow<NW>(x, w, m0, rows, k, n, n0, store);
    } else {
        gemm_tile<NW>(x, w, SpanRows{m0, rows}, k, n, n0, store);
    }
}

// gemm_tile over the block's 64 rows (gemm_block's m0) of a row-major x of `rows` rows.
// `ok` false (a quantized weight's zero block or group) writes nothing.
template <unsigned NW, bool NARROW = false, class W, class Store>
__device__ __forceinline__ void gemm_run(const bf16* __restrict__ x, const W (&w)[NW],
                                         unsigned rows, unsigned k, unsigned n, unsigned n0,
                                         Store store, bool ok = true) {
    pdl_wait();
    pdl_launch_dependents();
    if (!ok) {
        return;
    }
    gemm_block_rows<NW, NARROW>(x, w, rows, k, n, n0, store);
}

// gemm_run for an LM head's rows that `want` flags (the step's want-logits flags; null: every
// row): a block none of whose rows is wanted returns before it stages a tile, so rows nobody
// reads stream no weight; in a block with one, the others are computed as gemm_run computes
// them (the staging and the mma.sync sequence are linear_mma's) and not stored
// (StoreLogits skips them), their logits rows left as they were.
template <unsigned NW, bool NARROW = false, class W, class Store>
__device__ __forceinline__ void gemm_run_wanted(const bf16* __restrict__ x, const W (&w)[NW],
                                                const int* __restrict__ want, unsigned rows,
                                                unsigned k, unsigned n, unsigned n0, Store store,
                                                bool ok = true) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned m0 = gemm_block().m0;
    if (!ok || !rows_wanted(want, m0, min(rows, m0 + GEMM_BM))) {
        return;
    }
    gemm_block_rows<NW, NARROW>(x, w, rows, k, n, n0, store);
}

// ---- prefill widths: gemm_large (the `_large` entries, lever `mma_large`) -----------------
//
// A block of gemm_tile multiplies 64 rows by 32 features: per 64-k tile it stages 12 KB (16 KB
// with gate and up) for 0.26 MFLOP a weight, and its four warps each read all 32 features' B
// fragments for 16 rows of A (three ldmatrix a k16 step for four mma.sync). At a prefill chunk
// of 512 rows the first device run measured its kernels at 6-17% of the tensor pipe.
// gemm_large takes 128 rows × 64 features in a block of eight warps, each owning 32 rows × 32
// features (two m16 A fragments against four n8 B fragments: four ldmatrix a k16 step for eight
// mma.sync a weight): twice the arithmetic per staged byte and per shared-memory read, as
// CUTLASS's larger threadblock and warp tiles do for a long product. Staging is gemm_tile's:
// the next 64-k tile in registers while the current one's mma.sync run. Each output's
// accumulator takes exactly gemm_tile's sequence (from +0, one mma.sync m16n8k16 per 16 k in k
// order, up to the same 64-k tile end), so a `_large` entry writes its kernel's bytes at any
// width (emulated test `large_entries_write_the_bytes_of_the_wide_ones`); only the grid
// differs: (⌈rows/128⌉, feature blocks of 64: ⌈features/64⌉, or each matrix's after the
// previous one's, or qkv_rope_kv's rope blocks of 32 pairs), 256 threads. The emitters take
// them for programs of 128 rows or more whose large grid has a block for every SM
// (`gemm::large_fits_grid`); a narrower projection keeps the 64 × 32 tiles' four times as
// many blocks.
#define GEMM_LARGE_BM 128
#define GEMM_LARGE_BN 64
#define GEMM_LARGE_THREADS 256
#define GEMM_LARGE_X_CHUNKS (GEMM_LARGE_BM * GEMM_BK / 8 / GEMM_LARGE_THREADS)
#define GEMM_LARGE_W_CHUNKS (GEMM_LARGE_BN * GEMM_BK / 8 / GEMM_LARGE_THREADS)

// One staged 64-k tile of gemm_large (x's 128 rows in xs, each weight's 64 in ws) into acc, as
// gemm_large_acc describes it: four k16 steps in k order, each warp 32 rows × 32 columns.
template <unsigned NW>
__device__ __forceinline__ void gemm_large_mma(const bf16 (&xs)[GEMM_LARGE_BM][GEMM_PITCH],
                                               const bf16 (&ws)[NW][GEMM_LARGE_BN][GEMM_PITCH],
                                               float (&acc)[NW][2][4][4]) {
    const unsigned warp = threadIdx.x / 32;
    const unsigned lane = threadIdx.x % 32;
    const unsigned wr = (warp % 4u) * 32u; // the warp's first row of the tile
    const unsigned wc = (warp / 4u) * 32u; // its first column
#pragma unroll
    for (unsigned kk = 0; kk < GEMM_BK; kk += 16) {
        // Matrices: rows 0-7 / 8-15 of the warp's m-th 16 (lane bit 3), k 0-7 / 8-15 (bit 4).
        unsigned a[2][4];
#pragma unroll
        for (unsigned m = 0; m < 2; ++m) {
            ldmatrix_x4(a[m], &xs[wr + m * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
        }
#pragma unroll
        for (unsigned i = 0; i < NW; ++i) {
#pragma unroll
            for (unsigned p = 0; p < 2; ++p) {
                // Matrices: k 0-7 / 8-15 (lane bit 3) of features 0-7 / 8-15 (bit 4) of the
                // warp's pair p.
                unsigned b[4];
                ldmatrix_x4(b, &ws[i][wc + p * 16 + (lane >> 4) * 8 + (lane & 7)]
                                  [kk + ((lane >> 3) & 1) * 8]);
#pragma unroll
                for (unsigned m = 0; m < 2; ++m) {
                    mma_bf16_16816(acc[i][m][2 * p], a[m], b[0], b[1]);
                    mma_bf16_16816(acc[i][m][2 * p + 1], a[m], b[2], b[3]);
                }
            }
        }
    }
}

// gemm_large's accumulators at +0.
template <unsigned NW> __device__ __forceinline__ void gemm_large_zero(float (&acc)[NW][2][4][4]) {
#pragma unroll
    for (unsigned i = 0; i < NW; ++i) {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][m][j][e] = 0.0f;
            }
        }
    }
}

// The large tile of NW weights against 128 rows of x (`rows_of`'s), tile column c being weight
// row cols_of.src(c): acc[i][m][j][0..3] of this lane is rows 32·(warp % 4) + 16m + (g, g+8),
// tile columns 32·(warp / 4) + 8j + 2t and the next, of dot(x row, w[i] row). Ends on a
// barrier after its last use of shared memory.
template <unsigned NW, class W, class Rows, class Cols>
__device__ __forceinline__ void gemm_large_acc(const bf16* __restrict__ x, const W (&w)[NW],
                                               Rows rows_of, Cols cols_of, unsigned k,
                                               float (&acc)[NW][2][4][4]) {
    __shared__ __align__(16) bf16 xs[GEMM_LARGE_BM][GEMM_PITCH];
    __shared__ __align__(16) bf16 ws[NW][GEMM_LARGE_BN][GEMM_PITCH];
    const GemmBf16 xm{x};
    const bool vec = gemm_vec(xm, w, k);
    gemm_large_zero<NW>(acc);
    uint4 xv[GEMM_LARGE_X_CHUNKS];
    uint4 wv[NW][GEMM_LARGE_W_CHUNKS];
    gemm_fetch<GEMM_LARGE_X_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(xv, xm, rows_of, k, 0u, vec);
#pragma unroll
    for (unsigned i = 0; i < NW; ++i) {
        gemm_fetch<GEMM_LARGE_W_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(wv[i], w[i], cols_of, k, 0u,
                                                                      vec);
    }
    for (unsigned k0 = 0; k0 < k; k0 += GEMM_BK) {
        gemm_put<GEMM_LARGE_X_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(xs, xv);
#pragma unroll
        for (unsigned i = 0; i < NW; ++i) {
            gemm_put<GEMM_LARGE_W_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(ws[i], wv[i]);
        }
        __syncthreads();
        if (k0 + GEMM_BK < k) {
            gemm_fetch<GEMM_LARGE_X_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(xv, xm, rows_of, k,
                                                                          k0 + GEMM_BK, vec);
#pragma unroll
            for (unsigned i = 0; i < NW; ++i) {
                gemm_fetch<GEMM_LARGE_W_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(
                    wv[i], w[i], cols_of, k, k0 + GEMM_BK, vec);
            }
        }
        gemm_large_mma<NW>(xs, ws, acc);
        __syncthreads();
    }
}

// ---- prefill widths, pipelined: gemm_pipe (the `_pipe` entries, lever `mma_pipe`) ----------
//
// gemm_large stages through registers: each thread loads its chunks of the next 64-k tile
// while the warps run the current one and stores them after a barrier, so a block keeps one
// tile in flight and a tile's loads must land within one tile's mma.sync. gemm_pipe keeps
// GEMM_PIPE_STAGES of gemm_large's tiles in shared memory and fills them with cp.async (16-byte
// global → shared copies that bypass registers and L1), as CUTLASS's multistage Ampere GEMMs
// do: while the warps run tile t, tiles t + 1 and t + 2 are on their way. The stages are
// dynamic shared memory, 81 KB with one weight and 108 KB with gate and up (their launch opts
// in past 48 KB; two blocks an SM each, with no registers spent on staging). The warps, their
// fragments and each accumulator's mma.sync sequence are gemm_large's (gemm_large_mma), so a
// `_pipe` entry writes its kernel's bytes at any width (emulated test
// `pipe_entries_write_the_bytes_of_the_wide_ones`). A chunk that is not there (a row past
// `rows`, k past its end) is stored as zeros, as gemm_large stages it; when k is not a multiple
// of 8 or a matrix is not 16-byte aligned, a stage is fetched through registers (gemm_fetch,
// gemm_put) into the same shared memory: the same bytes either way. bf16 weights only: a
// quantized tile is dequantised on its way through registers, which cp.async skips.
#define GEMM_PIPE_STAGES 3u

extern __shared__ __align__(16) bf16 gemm_pipe_smem[];

// One stage: gemm_large's tiles of x (128 rows) and of each weight (64), GEMM_PITCH a row.
template <unsigned NW>
struct GemmPipeStage {
    bf16 xs[GEMM_LARGE_BM][GEMM_PITCH];
    bf16 ws[NW][GEMM_LARGE_BN][GEMM_PITCH];
};

// This thread's N chunks of the 64-k tile at k0 of matrix p (its rows `rows_of` names) into
// the shared tile s by cp.async, chunk c = threadIdx.x + i·256 as gemm_fetch numbers them; an
// absent chunk (GEMM_NO_ROW, or past k) stored as zeros at once. k is a multiple of 8 and p
// 16-byte aligned.
template <unsigned N, class Rows>
__device__ __forceinline__ void gemm_copy_async(bf16 (*s)[GEMM_PITCH], const bf16* __restrict__ p,
                                                Rows rows_of, unsigned k, unsigned k0) {
    constexpr unsigned chunks = GEMM_BK / 8;
#pragma unroll
    for (unsigned i = 0; i < N; ++i) {
        const unsigned c = threadIdx.x + i * GEMM_LARGE_THREADS;
        const unsigned kc = (c % chunks) * 8;
        const unsigned row = rows_of.src(c / chunks);
        bf16* dst = &s[c / chunks][kc];
        if (row != GEMM_NO_ROW && k0 + kc < k) {
            cp_async16(dst, p + (unsigned long long)row * k + k0 + kc);
        } else {
            *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// The 64-k tile at k0 of x and each weight into stage st, as one cp.async group of this thread
// (empty when !vec: then fetched through registers and stored at once, gemm_large's way).
template <unsigned NW, class Rows, class Cols>
__device__ __forceinline__ void gemm_pipe_fill(GemmPipeStage<NW>& st, const bf16* __restrict__ x,
                                               const GemmBf16 (&w)[NW], Rows rows_of,
                                               Cols cols_of, unsigned k, unsigned k0, bool vec) {
    if (vec) {
        gemm_copy_async<GEMM_LARGE_X_CHUNKS>(st.xs, x, rows_of, k, k0);
#pragma unroll
        for (unsigned i = 0; i < NW; ++i) {
            gemm_copy_async<GEMM_LARGE_W_CHUNKS>(st.ws[i], w[i].p, cols_of, k, k0);
        }
    } else {
        uint4 xv[GEMM_LARGE_X_CHUNKS];
        gemm_fetch<GEMM_LARGE_X_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(xv, GemmBf16{x}, rows_of, k,
                                                                      k0, false);
        gemm_put<GEMM_LARGE_X_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(st.xs, xv);
#pragma unroll
        for (unsigned i = 0; i < NW; ++i) {
            uint4 wv[GEMM_LARGE_W_CHUNKS];
            gemm_fetch<GEMM_LARGE_W_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(wv, w[i], cols_of, k, k0,
                                                                          false);
            gemm_put<GEMM_LARGE_W_CHUNKS, GEMM_BK, GEMM_LARGE_THREADS>(st.ws[i], wv);
        }
    }
    cp_async_commit();
}

// gemm_large_acc's accumulators (the same layout and bytes) through GEMM_PIPE_STAGES stages in
// dynamic shared memory (the launch's GEMM_PIPE_STAGES · sizeof(GemmPipeStage<NW>) bytes).
// Tile t sits in stage t % GEMM_PIPE_STAGES; the fill of tile t + 2 goes out after the barrier
// that ends every warp's reading of tile t − 1, whose stage it reuses. Ends on a barrier after
// its last use of shared memory, with no copy in flight.
template <unsigned NW, class Rows, class Cols>
__device__ __forceinline__ void gemm_pipe_acc(const bf16* __restrict__ x, const GemmBf16 (&w)[NW],
                                              Rows rows_of, Cols cols_of, unsigned k,
                                              float (&acc)[NW][2][4][4]) {
    GemmPipeStage<NW>* stages = reinterpret_cast<GemmPipeStage<NW>*>(gemm_pipe_smem);
    const bool vec = gemm_vec(GemmBf16{x}, w, k);
    gemm_large_zero<NW>(acc);
    const unsigned tiles = (k + GEMM_BK - 1u) / GEMM_BK;
#pragma unroll
    for (unsigned t = 0; t + 1u < GEMM_PIPE_STAGES; ++t) {
        if (t < tiles) {
            gemm_pipe_fill<NW>(stages[t], x, w, rows_of, cols_of, k, t * GEMM_BK, vec);
        } else {
            cp_async_commit();
        }
    }
    for (unsigned t = 0; t < tiles; ++t) {
        // Tile t's group is complete (only the newest, tile t + 1's, may be in flight); after
        // the barrier every thread's copies of it are visible and no warp reads tile t − 1.
        cp_async_wait<GEMM_PIPE_STAGES - 2u>();
        __syncthreads();
        const unsigned next = t + GEMM_PIPE_STAGES - 1u;
        if (next < tiles) {
            gemm_pipe_fill<NW>(stages[next % GEMM_PIPE_STAGES], x, w, rows_of, cols_of, k,
                               next * GEMM_BK, vec);
        } else {
            cp_async_commit();
        }
        const GemmPipeStage<NW>& st = stages[t % GEMM_PIPE_STAGES];
        gemm_large_mma<NW>(st.xs, st.ws, acc);
    }
    cp_async_wait<0u>();
    __syncthreads();
}

// gemm_large_acc (PIPE: gemm_pipe_acc, bf16 weights) over the block's rows (blockIdx.x · 128 ..)
// and features n0 .. n0 + 63 of a row-major x of `rows` rows: store(row, f, v) for every row
// and f < n, v[i] the dot of weight i. `ok` false (a quantized weight's zero block or group)
// writes nothing; a block none of whose rows `want` flags (an LM head's; null: every row)
// returns before it stages a tile, as gemm_run_wanted's does.
template <unsigned NW, bool PIPE = false, class W, class Store>
__device__ __forceinline__ void gemm_large_run(const bf16* __restrict__ x, const W (&w)[NW],
                                               unsigned rows, unsigned k, unsigned n,
                                               unsigned n0, Store store, bool ok = true,
                                               const int* __restrict__ want = nullptr) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned m0 = blockIdx.x * GEMM_LARGE_BM;
    if (!ok || !rows_wanted(want, m0, min(rows, m0 + GEMM_LARGE_BM))) {
        return;
    }
    const SpanRows rows_of{m0, rows};
    float acc[NW][2][4][4];
    if constexpr (PIPE) {
        gemm_pipe_acc<NW>(x, w, rows_of, SpanRows{n0, n}, k, acc);
    } else {
        gemm_large_acc<NW>(x, w, rows_of, SpanRows{n0, n}, k, acc);
    }
    const unsigned warp = threadIdx.x / 32;
    const unsigned lane = threadIdx.x % 32;
    const unsigned g = lane >> 2;
    const unsigned t = lane & 3;
#pragma unroll
    for (unsigned m = 0; m < 2; ++m) {
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) {
#pragma unroll
            for (unsigned e = 0; e < 4; ++e) {
                const unsigned r = (warp % 4u) * 32u + m * 16 + g + (e >> 1) * 8;
                const unsigned f = n0 + (warp / 4u) * 32u + j * 8 + 2 * t + (e & 1);
                float v[NW];
#pragma unroll
                for (unsigned i = 0; i < NW; ++i) v[i] = acc[i][m][j][e];
                if (rows_of.src(r) != GEMM_NO_ROW && f < n) store(rows_of.dst(r), f, v);
            }
        }
    }
}

// The feature blocks of one launch's tile: 32 features a block (gemm_tile's, gemm_narrow's) or
// 64 (LARGE: gemm_large's). A launch of several matrices (qkv_mma's, linear_pair_mma's) lays
// each matrix's blocks of this width after the previous matrix's.
template <bool LARGE>
__device__ __forceinline__ unsigned gemm_feature_blocks(unsigned n) {
    constexpr unsigned bn = LARGE ? GEMM_LARGE_BN : GEMM_BN;
    return (n + bn - 1u) / bn;
}

// gemm_run (NARROW: through gemm_narrow) or gemm_large_run (LARGE; PIPE: through gemm_pipe)
// over the block's rows and its feature block b of a weight of n features (features b · 32 ..,
// or b · 64 .. when LARGE).
template <unsigned NW, bool NARROW, bool LARGE, bool PIPE = false, class W, class Store>
__device__ __forceinline__ void gemm_any_run(const bf16* __restrict__ x, const W (&w)[NW],
                                             unsigned rows, unsigned k, unsigned n, unsigned b,
                                             Store store, bool ok = true) {
    static_assert(LARGE || !PIPE, "gemm_pipe stages gemm_large's tiles");
    if constexpr (LARGE) {
        gemm_large_run<NW, PIPE>(x, w, rows, k, n, b * GEMM_LARGE_BN, store, ok);
    } else {
        gemm_run<NW, NARROW>(x, w, rows, k, n, b * GEMM_BN, store, ok);
    }
}

struct StoreLinear {
    const bf16* bias;
    bf16* y;
    unsigned n;
    __device__ __forceinline__ void operator()(unsigned r, unsigned f, const float (&v)[1]) const {
        y[(unsigned long long)r * n + f] = linear_value(v[0], bias, f);
    }
};

// An f32 output row (the LM head's, a router's) for each row whose `want` flag is not 0 (null:
// every row).
struct StoreLogits {
    float* logits;
    unsigned n;
    const int* want;
    __device__ __forceinline__ void operator()(unsigned r, unsigned f, const float (&v)[1]) const {
        if (row_wanted(want, r)) {
            logits[(unsigned long long)r * n + f] = v[0];
        }
    }
};

// act::silu_mul of the gate and up projections as linear_mma stores them (bf16, no bias).
struct StoreSiluMul {
    bf16* act;
    unsigned n;
    __device__ __forceinline__ void operator()(unsigned r, unsigned f, const float (&v)[2]) const {
        act[(unsigned long long)r * n + f] =
            silu_mul_value(linear_value(v[0], nullptr, f), linear_value(v[1], nullptr, f));
    }
};

// x bf16[rows·k], w bf16[n_out·k], bias bf16[n_out]? → y bf16[rows·n_out] = bf16(dot + bias),
// stored as gemv::linear stores it. grid = (⌈rows/64⌉, ⌈n_out/32⌉) (gemm_block), 128 threads.
template <bool NARROW>
__device__ __forceinline__ void linear_mma_body(const bf16* __restrict__ x,
                                                const bf16* __restrict__ w,
                                                const bf16* __restrict__ bias, bf16* __restrict__ y,
                                                unsigned rows, unsigned k, unsigned n_out) {
    const GemmBf16 ws[1] = {{w}};
    gemm_run<1, NARROW>(x, ws, rows, k, n_out, gemm_block().feature * GEMM_BN,
                        StoreLinear{bias, y, n_out});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_mma(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ bias,
               bf16* __restrict__ y, unsigned rows, unsigned k, unsigned n_out) {
    linear_mma_body<false>(x, w, bias, y, rows, k, n_out);
}
// linear_mma through gemm_narrow (decode widths; the same grid and bytes).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_mma_narrow(const bf16* __restrict__ x, const bf16* __restrict__ w,
                      const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                      unsigned k, unsigned n_out) {
    linear_mma_body<true>(x, w, bias, y, rows, k, n_out);
}

// x bf16[rows·k], w bf16[vocab·k] → logits f32[rows·vocab] (the LM head, an MoE router), for
// the rows `want` flags (null: every row; gemm_run_wanted). grid = (⌈rows/64⌉, ⌈vocab/32⌉)
// (gemm_block), 128 threads.
template <bool NARROW>
__device__ __forceinline__ void lm_head_mma_body(const bf16* __restrict__ x,
                                                 const bf16* __restrict__ w,
                                                 float* __restrict__ logits,
                                                 const int* __restrict__ want, unsigned rows,
                                                 unsigned k, unsigned vocab) {
    const GemmBf16 ws[1] = {{w}};
    gemm_run_wanted<1, NARROW>(x, ws, want, rows, k, vocab, gemm_block().feature * GEMM_BN,
                               StoreLogits{logits, vocab, want});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    lm_head_mma(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ logits,
                const int* __restrict__ want, unsigned rows, unsigned k, unsigned vocab) {
    lm_head_mma_body<false>(x, w, logits, want, rows, k, vocab);
}
// lm_head_mma through gemm_narrow (decode widths; the same grid and bytes).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    lm_head_mma_narrow(const bf16* __restrict__ x, const bf16* __restrict__ w,
                       float* __restrict__ logits, const int* __restrict__ want, unsigned rows,
                       unsigned k, unsigned vocab) {
    lm_head_mma_body<true>(x, w, logits, want, rows, k, vocab);
}

// gemm_run over one quantized weight (WFp8, WInt4) whose parameters are `ok` (nonzero blocks
// or groups; otherwise nothing is written), for the rows `want` flags (null: every row);
// NARROW: through gemm_narrow.
template <bool NARROW = false, class W, class Store>
__device__ __forceinline__ void gemm_run_quant(bool ok, const bf16* __restrict__ x, W w,
                                               unsigned rows, unsigned k, unsigned n,
                                               Store store, const int* want = nullptr) {
    const GemmQuant<W> ws[1] = {{w}};
    gemm_run_wanted<1, NARROW>(x, ws, want, rows, k, n, gemm_block().feature * GEMM_BN, store,
                               ok);
}

// The quantized entries of linear_mma and lm_head_mma: w an fp8 blob (f32 scales of block_n ×
// block_k blocks) or an int4 blob (f32 scales and u8 zero points per `group` of a row),
// dequantised chunk by chunk into the staged tile (GemmQuant), so each output is the bf16
// kernel's on the dequantised matrix. Same grid as the bf16 kernels. A zero block or group (the
// CPU twin refuses it) writes nothing.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_mma_fp8(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                   const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows, unsigned k,
                   unsigned n_out, unsigned block_n, unsigned block_k) {
    gemm_run_quant(block_n != 0u && block_k != 0u, x, WFp8{w, n_out, block_n, block_k}, rows, k,
                   n_out, StoreLinear{bias, y, n_out});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_mma_int4(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                    const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                    unsigned k, unsigned n_out, unsigned group) {
    gemm_run_quant(group != 0u, x, WInt4{w, n_out, group}, rows, k, n_out,
                   StoreLinear{bias, y, n_out});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    lm_head_mma_fp8(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                    float* __restrict__ logits, const int* __restrict__ want, unsigned rows,
                    unsigned k, unsigned vocab, unsigned block_n, unsigned block_k) {
    gemm_run_quant(block_n != 0u && block_k != 0u, x, WFp8{w, vocab, block_n, block_k}, rows, k,
                   vocab, StoreLogits{logits, vocab, want}, want);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    lm_head_mma_int4(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                     float* __restrict__ logits, const int* __restrict__ want, unsigned rows,
                     unsigned k, unsigned vocab, unsigned group) {
    gemm_run_quant(group != 0u, x, WInt4{w, vocab, group}, rows, k, vocab,
                   StoreLogits{logits, vocab, want}, want);
}

// The four quantized entries through gemm_narrow (decode widths, lever mma_narrow; a stage of
// GemmQuant's NARROW_K): the same arguments, grid and bytes. Every quantized _narrow entry
// declares a minimum of one block per SM: without it ptxas held some of them to 96-128
// registers and spilled 4-24 bytes (which `ptx --check` refuses); with it they take 78-150, no
// spills, 3-6 blocks per SM.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    linear_mma_fp8_narrow(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                          const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                          unsigned k, unsigned n_out, unsigned block_n, unsigned block_k) {
    gemm_run_quant<true>(block_n != 0u && block_k != 0u, x, WFp8{w, n_out, block_n, block_k},
                         rows, k, n_out, StoreLinear{bias, y, n_out});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    linear_mma_int4_narrow(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                           const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                           unsigned k, unsigned n_out, unsigned group) {
    gemm_run_quant<true>(group != 0u, x, WInt4{w, n_out, group}, rows, k, n_out,
                         StoreLinear{bias, y, n_out});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    lm_head_mma_fp8_narrow(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                           float* __restrict__ logits, const int* __restrict__ want,
                           unsigned rows, unsigned k, unsigned vocab, unsigned block_n,
                           unsigned block_k) {
    gemm_run_quant<true>(block_n != 0u && block_k != 0u, x, WFp8{w, vocab, block_n, block_k},
                         rows, k, vocab, StoreLogits{logits, vocab, want}, want);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    lm_head_mma_int4_narrow(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                            float* __restrict__ logits, const int* __restrict__ want,
                            unsigned rows, unsigned k, unsigned vocab, unsigned group) {
    gemm_run_quant<true>(group != 0u, x, WInt4{w, vocab, group}, rows, k, vocab,
                         StoreLogits{logits, vocab, want}, want);
}

// qkv_mma's body for any weight source (GemmBf16, GemmQuant<WFp8>, GemmQuant<WInt4>): the
// block's projection (q's feature blocks, then k's, then v's) stored as linear_mma stores it.
// `ok` as gemm_run's. LARGE: through gemm_large (the `_large` entries: blocks of 64 features);
// PIPE: its tiles through gemm_pipe (the `_pipe` entry; bf16).
template <class W, bool LARGE = false, bool PIPE = false>
__device__ __forceinline__ void qkv_run(bool ok, const bf16* __restrict__ x, const W (&w)[3],
                                        const bf16* const (&bias)[3], bf16* const (&out)[3],
                                        unsigned rows, unsigned k, unsigned nq, unsigned nkv) {
    const unsigned q_blocks = gemm_feature_blocks<LARGE>(nq);
    const unsigned kv_blocks = gemm_feature_blocks<LARGE>(nkv);
    unsigned b = gemm_block().feature;
    W ws[1] = {w[0]};
    StoreLinear store{bias[0], out[0], nq};
    unsigned n = nq;
    if (b >= q_blocks + kv_blocks) {
        b -= q_blocks + kv_blocks;
        ws[0] = w[2];
        store = StoreLinear{bias[2], out[2], nkv};
        n = nkv;
    } else if (b >= q_blocks) {
        b -= q_blocks;
        ws[0] = w[1];
        store = StoreLinear{bias[1], out[1], nkv};
        n = nkv;
    }
    gemm_any_run<1, false, LARGE, PIPE>(x, ws, rows, k, n, b, store, ok);
}

// The q, k and v projections of x bf16[rows·k] in one launch: q bf16[rows·nq],
// k_out and v bf16[rows·nkv], each as linear_mma stores it. grid = (⌈rows/64⌉, ⌈nq/32⌉ +
// 2·⌈nkv/32⌉) (gemm_block), 128 threads: q's feature blocks, then k's, then v's.
template <bool LARGE, bool PIPE = false>
__device__ __forceinline__ void qkv_bf16(const bf16* __restrict__ x, const bf16* __restrict__ wq,
                                         const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                                         const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                                         const bf16* __restrict__ bv, bf16* __restrict__ q,
                                         bf16* __restrict__ k_out, bf16* __restrict__ v,
                                         unsigned rows, unsigned k, unsigned nq, unsigned nkv) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    const bf16* const bias[3] = {bq, bk, bv};
    bf16* const out[3] = {q, k_out, v};
    qkv_run<GemmBf16, LARGE, PIPE>(true, x, w, bias, out, rows, k, nq, nkv);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_mma(const bf16* __restrict__ x, const bf16* __restrict__ wq, const bf16* __restrict__ bq,
            const bf16* __restrict__ wk, const bf16* __restrict__ bk, const bf16* __restrict__ wv,
            const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
            bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv) {
    qkv_bf16<false>(x, wq, bq, wk, bk, wv, bv, q, k_out, v, rows, k, nq, nkv);
}

// Two sibling projections of x bf16[rows·k] in one launch (Gated DeltaNet's in_proj_qkvz and
// in_proj_ba): y1 bf16[rows·n1], y2 bf16[rows·n2], each as linear_mma stores it. grid =
// (⌈rows/64⌉, ⌈n1/32⌉ + ⌈n2/32⌉) (gemm_block), 128 threads: the first matrix's feature blocks,
// then the second's.
template <bool NARROW, bool LARGE = false, bool PIPE = false>
__device__ __forceinline__ void linear_pair_mma_body(
    const bf16* __restrict__ x, const bf16* __restrict__ w1, const bf16* __restrict__ b1,
    const bf16* __restrict__ w2, const bf16* __restrict__ b2, bf16* __restrict__ y1,
    bf16* __restrict__ y2, unsigned rows, unsigned k, unsigned n1, unsigned n2) {
    const unsigned first_blocks = gemm_feature_blocks<LARGE>(n1);
    unsigned b = gemm_block().feature;
    GemmBf16 ws[1] = {{w1}};
    StoreLinear store{b1, y1, n1};
    unsigned n = n1;
    if (b >= first_blocks) {
        b -= first_blocks;
        ws[0] = GemmBf16{w2};
        store = StoreLinear{b2, y2, n2};
        n = n2;
    }
    gemm_any_run<1, NARROW, LARGE, PIPE>(x, ws, rows, k, n, b, store);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_pair_mma(const bf16* __restrict__ x, const bf16* __restrict__ w1,
                    const bf16* __restrict__ b1, const bf16* __restrict__ w2,
                    const bf16* __restrict__ b2, bf16* __restrict__ y1, bf16* __restrict__ y2,
                    unsigned rows, unsigned k, unsigned n1, unsigned n2) {
    linear_pair_mma_body<false>(x, w1, b1, w2, b2, y1, y2, rows, k, n1, n2);
}
// linear_pair_mma through gemm_narrow (decode widths; the same grid and bytes).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_pair_mma_narrow(const bf16* __restrict__ x, const bf16* __restrict__ w1,
                           const bf16* __restrict__ b1, const bf16* __restrict__ w2,
                           const bf16* __restrict__ b2, bf16* __restrict__ y1,
                           bf16* __restrict__ y2, unsigned rows, unsigned k, unsigned n1,
                           unsigned n2) {
    linear_pair_mma_body<true>(x, w1, b1, w2, b2, y1, y2, rows, k, n1, n2);
}

// qkv_mma on quantized q, k and v (one kind, each with its own blocks or group: a per-tensor
// fp8 scale is a block of the whole matrix), dequantised as linear_mma_fp8's and
// linear_mma_int4's are, so each output is linear_mma's on the dequantised matrix. A zero
// block or group writes nothing. LARGE: the `_large` entries' bodies.
template <bool LARGE>
__device__ __forceinline__ void qkv_fp8(
    const bf16* __restrict__ x, const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
    const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
    const unsigned char* __restrict__ wv, const bf16* __restrict__ bv, bf16* __restrict__ q,
    bf16* __restrict__ k_out, bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq,
    unsigned nkv, unsigned q_block_n, unsigned q_block_k, unsigned k_block_n, unsigned k_block_k,
    unsigned v_block_n, unsigned v_block_k) {
    const bool ok = q_block_n != 0u && q_block_k != 0u && k_block_n != 0u && k_block_k != 0u &&
                    v_block_n != 0u && v_block_k != 0u;
    const GemmQuant<WFp8> w[3] = {{WFp8{wq, nq, q_block_n, q_block_k}},
                                  {WFp8{wk, nkv, k_block_n, k_block_k}},
                                  {WFp8{wv, nkv, v_block_n, v_block_k}}};
    const bf16* const bias[3] = {bq, bk, bv};
    bf16* const out[3] = {q, k_out, v};
    qkv_run<GemmQuant<WFp8>, LARGE>(ok, x, w, bias, out, rows, k, nq, nkv);
}

template <bool LARGE>
__device__ __forceinline__ void qkv_int4(
    const bf16* __restrict__ x, const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
    const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
    const unsigned char* __restrict__ wv, const bf16* __restrict__ bv, bf16* __restrict__ q,
    bf16* __restrict__ k_out, bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq,
    unsigned nkv, unsigned q_group, unsigned k_group, unsigned v_group) {
    const bool ok = q_group != 0u && k_group != 0u && v_group != 0u;
    const GemmQuant<WInt4> w[3] = {{WInt4{wq, nq, q_group}},
                                   {WInt4{wk, nkv, k_group}},
                                   {WInt4{wv, nkv, v_group}}};
    const bf16* const bias[3] = {bq, bk, bv};
    bf16* const out[3] = {q, k_out, v};
    qkv_run<GemmQuant<WInt4>, LARGE>(ok, x, w, bias, out, rows, k, nq, nkv);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_mma_fp8(const bf16* __restrict__ x, const unsigned char* __restrict__ wq,
                const bf16* __restrict__ bq, const unsigned char* __restrict__ wk,
                const bf16* __restrict__ bk, const unsigned char* __restrict__ wv,
                const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
                bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv,
                unsigned q_block_n, unsigned q_block_k, unsigned k_block_n, unsigned k_block_k,
                unsigned v_block_n, unsigned v_block_k) {
    qkv_fp8<false>(x, wq, bq, wk, bk, wv, bv, q, k_out, v, rows, k, nq, nkv, q_block_n,
                   q_block_k, k_block_n, k_block_k, v_block_n, v_block_k);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_mma_int4(const bf16* __restrict__ x, const unsigned char* __restrict__ wq,
                 const bf16* __restrict__ bq, const unsigned char* __restrict__ wk,
                 const bf16* __restrict__ bk, const unsigned char* __restrict__ wv,
                 const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
                 bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv,
                 unsigned q_group, unsigned k_group, unsigned v_group) {
    qkv_int4<false>(x, wq, bq, wk, bk, wv, bv, q, k_out, v, rows, k, nq, nkv, q_group, k_group,
                    v_group);
}

// ---- q/k/v with rope and the KV write in the epilogue (qkv_rope_kv_mma) ------------------
//
// A block's 32 tile columns are, for a rope block of a q or k head, 16 features of the head's
// first rotary half (c0 + c) and their 16 partners (half + c0 + c): mma's tile columns 8j + 2t
// (+1) and 8(j + 2) + 2t (+1) sit in the same lane, so each lane ropes its pairs in registers.
// A pass-through block takes 32 features past the rotary dims, a v block 32 of v's. Every
// value is first rounded as linear_mma stores it, then roped and stored as rope::rope_kv_write
// does (head_transform's arithmetic on the bf16 projections), so the launch writes the bytes of
// qkv_mma then rope_kv_write.
//
// With qk-norm (wqn, wkn given) a q or k head is one block: qk-norm needs the whole head's sum
// of squares, so the block runs the head's 32-feature tiles one after another, rounds each
// value as linear_mma stores it into the head stage (dynamic shared memory, 64 rows × head_dim;
// the `_large` entries' 128 rows, with the tile past 48 KB for a head wider than 84: their launch opts
// in to), then each warp runs rope::qk_norm_rope_kv_write's head_transform over its rows' staged heads:
// the bytes of qkv_mma then qk_norm_rope_kv_write.
//
// Gated (Qwen3-Next, qkv_gated_norm_zc_rope_kv_mma): q's weight holds per head [q | gate]
// (2·head_dim rows), so a q head's block runs both halves through the stage: the gate half
// first, copied to gate_out as attn::gate_split copies it, then the q half as above; the
// qk-norm's weights are zero-centred. The bytes of qkv_mma then rope::gated_qk_norm_zc_rope_kv_write.

#define GEMM_HEAD_DIM_MAX 256u // the widest head the stage holds (64 · 256 · 2 B = 32 KB; 64 KB
                               // of 128 rows)
extern __shared__ __align__(16) bf16 gemm_head_stage[];

// A qkv_rope_kv_mma block's tile columns (one type for every block, so the tile's shared
// memory is allocated once): with `pairs`, column c of the tile's q-th 32 (q = c / 32: 0 in a
// 32-column tile, 0 or 1 in gemm_large's 64) is feature c0 + 16q + c % 32 (c % 32 < 16) or its
// partner half + c0 + 16q + c % 32 − 16 of the head whose first weight row is `base`
// (GEMM_NO_ROW past the rotary half); else weight row base + c, below `end`.
struct QkvRopeCols {
    unsigned base;
    unsigned end;
    unsigned c0;
    unsigned half;
    bool pairs;
    __device__ __forceinline__ unsigned src(unsigned c) const {
        if (!pairs) {
            return base + c < end ? base + c : GEMM_NO_ROW;
        }
        const unsigned i = c0 + (c >> 5) * 16u + (c & 15u);
        if (i >= half) {
            return GEMM_NO_ROW;
        }
        return base + i + ((c & 16u) != 0u ? half : 0u);
    }
};

// The geometry of a qkv_rope_kv_mma launch and the block's part of it.
struct QkvRopeGeometry {
    unsigned heads, kv_heads, head_dim, half;
    unsigned rope_blocks; // per head: ⌈half / 16⌉ (⌈half / 32⌉ in gemm_large's tile)
    unsigned pass_blocks; // per head: ⌈(head_dim − 2·half) / 32⌉ (/ 64 in gemm_large's)
    bool norm;            // qk-norm: one block per head
    bool gated;           // with norm: q heads [q | gate], zero-centred qk-norm weights
    __device__ __forceinline__ unsigned per_head() const {
        return norm ? 1u : rope_blocks + pass_blocks;
    }
};

// The rows of one narrow pass (gemm_narrow's 16 from m): tile rows past 16 are none, so a
// wide epilogue run on qkv_tile's values stores the pass's rows from warp 0 alone.
struct PassRows {
    unsigned m;
    unsigned rows;
    __device__ __forceinline__ unsigned src(unsigned r) const {
        return r < GEMM_NM && m + r < rows ? m + r : GEMM_NO_ROW;
    }
    __device__ __forceinline__ unsigned dst(unsigned r) const { return m + r; }
    __device__ __forceinline__ bool leads() const { return m == 0u; }
};

// gemm_tile_acc for qkv_rope_kv's epilogues; NARROW: gemm_narrow_acc over a PassRows' 16 rows,
// then its values through shared memory into every warp's acc in warp 0's places of the wide
// tile (lane (g, t): rows g and g + 8, tile columns 8j + 2t and the next), so the epilogue's
// pairs (columns c and c + 16) sit in one lane as they do wide. The next call's staging ends
// on barriers before its values are written, so no read of this call's is overtaken.
template <bool NARROW, class W, class Rows, class Cols>
__device__ __forceinline__ void qkv_tile(const bf16* __restrict__ x, const W (&w)[1],
                                         Rows rows_of, Cols cols_of, unsigned k,
                                         float (&acc)[1][4][4]) {
    if constexpr (!NARROW) {
        gemm_tile_acc<1>(x, w, rows_of, cols_of, k, acc);
    } else {
        __shared__ float pass_tile[GEMM_NM][GEMM_BN + 1];
        const unsigned warp = threadIdx.x / 32;
        const unsigned lane = threadIdx.x % 32;
        const unsigned g = lane >> 2;
        const unsigned t = lane & 3;
        float nacc[1][4];
        gemm_narrow_acc<1>(x, w, rows_of, cols_of, k, nacc);
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            pass_tile[g + (e >> 1) * 8][warp * 8 + 2 * t + (e & 1)] = nacc[0][e];
        }
        __syncthreads();
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) {
#pragma unroll
            for (unsigned e = 0; e < 4; ++e) {
                acc[0][j][e] = pass_tile[g + (e >> 1) * 8][j * 8 + 2 * t + (e & 1)];
            }
        }
    }
}

// Where this lane's accumulators sit in a qkv_rope_kv block's tile: acc[0][m][j][e] is tile row
// row(m, e) and tile column col(j, e). The 64 × 32 tile (and the narrow one, whose values
// qkv_tile puts in its places) has one m; gemm_large's 128 × 64 two, its warps 32 rows × 32
// columns each. Columns col(j, e) and col(j + 2, e) are 16 apart within the lane's 32: a rope
// block's pair (QkvRopeCols).
template <bool LARGE>
struct QkvLane {
    static constexpr unsigned MF = LARGE ? 2u : 1u;           // m fragments
    static constexpr unsigned BM = LARGE ? GEMM_LARGE_BM : GEMM_BM; // tile rows
    static constexpr unsigned BN = LARGE ? GEMM_LARGE_BN : GEMM_BN; // tile columns
    static constexpr unsigned WARPS = (LARGE ? GEMM_LARGE_THREADS : GEMM_THREADS) / 32u;
    unsigned row0, col0, g, t;
    __device__ __forceinline__ QkvLane() {
        const unsigned warp = threadIdx.x / 32;
        const unsigned lane = threadIdx.x % 32;
        row0 = LARGE ? (warp % 4u) * 32u : warp * 16u;
        col0 = LARGE ? (warp / 4u) * 32u : 0u;
        g = lane >> 2;
        t = lane & 3;
    }
    __device__ __forceinline__ unsigned row(unsigned m, unsigned e) const {
        return row0 + m * 16u + g + (e >> 1) * 8u;
    }
    __device__ __forceinline__ unsigned col(unsigned j, unsigned e) const {
        return col0 + j * 8u + 2u * t + (e & 1u);
    }
    // The rotary pair of col(j, e) (j < 2) in a rope block: its index past the block's c0.
    __device__ __forceinline__ unsigned pair(unsigned j, unsigned e) const {
        return col0 / 2u + j * 8u + 2u * t + (e & 1u);
    }
};

// qkv_tile, or with LARGE gemm_large_acc over the block's 128 rows and 64 tile columns.
template <bool NARROW, bool LARGE, class W, class Rows, class Cols>
__device__ __forceinline__ void qkv_any_tile(const bf16* __restrict__ x, const W (&w)[1],
                                             Rows rows_of, Cols cols_of, unsigned k,
                                             float (&acc)[1][QkvLane<LARGE>::MF][4][4]) {
    if constexpr (LARGE) {
        gemm_large_acc<1>(x, w, rows_of, cols_of, k, acc);
    } else {
        qkv_tile<NARROW>(x, w, rows_of, cols_of, k, acc[0]);
    }
}

// One row block's (wide: SpanRows) or one narrow pass's (PassRows) outputs of
// qkv_rope_kv_run's block; LARGE: gemm_large's 128-row block.
template <bool NARROW, bool LARGE, class W, class Rows>
__device__ __forceinline__ void qkv_rope_kv_rows(
    const bf16* __restrict__ x, const W (&w)[3], const bf16* const (&bias)[3],
    const bf16* const (&norm_w)[2], float eps, const int* __restrict__ positions,
    const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
    bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
    unsigned k, QkvRopeGeometry geo, unsigned block_size, unsigned num_pages, Rows rows_of) {
    const unsigned hd = geo.head_dim;
    const unsigned nq = geo.heads * hd;
    const unsigned nkv = geo.kv_heads * hd;
    const unsigned row_elems = nkv;
    const unsigned long long slots = (unsigned long long)num_pages * block_size;
    const unsigned warp = threadIdx.x / 32;
    const unsigned lane = threadIdx.x % 32;
    using Lane = QkvLane<LARGE>;
    const Lane at;
    // The block: a q head's, then a k head's (rope blocks, then pass-through), then v's.
    unsigned b = gemm_block().feature;
    const unsigned head_blocks = (geo.heads + geo.kv_heads) * geo.per_head();
    float acc[1][Lane::MF][4][4];
    if (b >= head_blocks) {
        // v: features BN·b.. of v, stored to each row's v slot.
        b -= head_blocks;
        const W ws[1] = {w[2]};
        qkv_any_tile<NARROW, LARGE>(x, ws, rows_of,
                                    QkvRopeCols{b * Lane::BN, nkv, 0u, 0u, false}, k, acc);
#pragma unroll
        for (unsigned m = 0; m < Lane::MF; ++m) {
#pragma unroll
            for (unsigned j = 0; j < 4; ++j) {
#pragma unroll
                for (unsigned e = 0; e < 4; ++e) {
                    const unsigned f = b * Lane::BN + at.col(j, e);
                    const unsigned row = rows_of.src(at.row(m, e));
                    if (row == GEMM_NO_ROW || f >= nkv) {
                        continue;
                    }
                    const int slot = slot_mapping[row];
                    if (slot < 0 || (unsigned long long)slot >= slots) {
                        continue;
                    }
                    bf16* dst = cache + cache_offset((unsigned)slot / block_size, 1,
                                                     (unsigned)slot % block_size, block_size,
                                                     row_elems);
                    dst[f] = linear_value(acc[0][m][j][e], bias[2], f);
                }
            }
        }
        return;
    }
    const unsigned head = b / geo.per_head();
    const unsigned part = b % geo.per_head();
    const bool is_q = head < geo.heads;
    const unsigned h = is_q ? head : head - geo.heads;
    const unsigned base = h * hd;
    // A gated q head's weight rows: its 2·head_dim features [q | gate].
    const bool gated_q = is_q && geo.gated;
    const unsigned wbase = gated_q ? 2u * base : base;
    const W ws[1] = {is_q ? w[0] : w[1]};
    const bf16* bh = is_q ? bias[0] : bias[1];
    // Where row `row`'s head goes: q_out, or the k slot (null: a slot outside the cache).
    auto head_dst = [&](unsigned row) -> bf16* {
        if (is_q) {
            return q_out + (unsigned long long)row * nq + base;
        }
        const int slot = slot_mapping[row];
        if (slot < 0 || (unsigned long long)slot >= slots) {
            return nullptr;
        }
        return cache + cache_offset((unsigned)slot / block_size, 0, (unsigned)slot % block_size,
                                    block_size, row_elems) + base;
    };
    // The qk-norm layouts stage the block's rows of a head: 64, or gemm_large's 128 (whose launch
    // opts in past 48 KB of shared memory for a head wider than 84), or a narrow pass's 16.
    if (geo.norm) {
        // A half head's tiles (weight rows from..from + hd) into the stage, rounded as
        // linear_mma stores them.
        auto stage_half = [&](unsigned from) {
            for (unsigned c0 = 0; c0 < hd; c0 += Lane::BN) {
                qkv_any_tile<NARROW, LARGE>(x, ws, rows_of,
                                            QkvRopeCols{from + c0, from + hd, 0u, 0u, false}, k,
                                            acc);
#pragma unroll
                for (unsigned m = 0; m < Lane::MF; ++m) {
#pragma unroll
                    for (unsigned j = 0; j < 4; ++j) {
#pragma unroll
                        for (unsigned e = 0; e < 4; ++e) {
                            const unsigned r = at.row(m, e);
                            const unsigned i = c0 + at.col(j, e);
                            // A narrow launch's stage holds the pass's 16 rows.
                            if (i < hd && (!NARROW || r < GEMM_NM)) {
                                gemm_head_stage[r * hd + i] =
                                    linear_value(acc[0][m][j][e], bh, from + i);
                            }
                        }
                    }
                }
            }
            __syncthreads();
        };
        if (gated_q) {
            // The gate half first, through the stage to gate_out (as attn::gate_split copies it).
            stage_half(wbase + hd);
            for (unsigned r = warp; r < Lane::BM; r += Lane::WARPS) {
                const unsigned row = rows_of.src(r);
                if (row == GEMM_NO_ROW) {
                    continue;
                }
                bf16* gate_row = gate_out + (unsigned long long)row * nq + base;
                for (unsigned i = lane; i < hd; i += 32) {
                    gate_row[i] = gemm_head_stage[r * hd + i];
                }
            }
            __syncthreads(); // every warp has read the gate before the q half overwrites it
        }
        // The head (a gated q head's q half); then per row qk-norm and rope as
        // qk_norm_rope_kv_write does from the bf16 projections.
        stage_half(wbase);
        const bf16* wn = is_q ? norm_w[0] : norm_w[1];
        for (unsigned r = warp; r < Lane::BM; r += Lane::WARPS) {
            const unsigned row = rows_of.src(r);
            if (row == GEMM_NO_ROW) {
                continue;
            }
            bf16* dst = head_dst(row);
            if (dst == nullptr) {
                continue;
            }
            if (geo.gated) {
                head_transform<true>(&gemm_head_stage[r * hd], dst, hd, wn, eps, positions[row],
                                     inv_freq, geo.half, lane);
            } else {
                head_transform(&gemm_head_stage[r * hd], dst, hd, wn, eps, positions[row],
                               inv_freq, geo.half, lane);
            }
        }
        return;
    }
    if (part < geo.rope_blocks) {
        // BN / 2 pairs: features c0.. of the first rotary half and their partners.
        const unsigned c0 = part * (Lane::BN / 2u);
        qkv_any_tile<NARROW, LARGE>(x, ws, rows_of, QkvRopeCols{base, 0u, c0, geo.half, true}, k,
                                    acc);
        const float scaling = inv_freq[geo.half];
#pragma unroll
        for (unsigned m = 0; m < Lane::MF; ++m) {
#pragma unroll
            for (unsigned j = 0; j < 2; ++j) {
#pragma unroll
                for (unsigned e = 0; e < 4; ++e) {
                    const unsigned i = c0 + at.pair(j, e);
                    const unsigned row = rows_of.src(at.row(m, e));
                    if (row == GEMM_NO_ROW || i >= geo.half) {
                        continue;
                    }
                    bf16* dst = head_dst(row);
                    if (dst == nullptr) {
                        continue;
                    }
                    const bf16 x1 = linear_value(acc[0][m][j][e], bh, base + i);
                    const bf16 x2 = linear_value(acc[0][m][j + 2][e], bh, base + geo.half + i);
                    float c, sn;
                    rope_cos_sin(positions[row], inv_freq[i], &c, &sn);
                    c = __fmul_rn(c, scaling);
                    sn = __fmul_rn(sn, scaling);
                    rope_pair(to_f32(x1), to_f32(x2), c, sn, &dst[i], &dst[i + geo.half]);
                }
            }
        }
        return;
    }
    // Pass-through: features 2·half + BN·(part − rope_blocks).. of the head.
    const unsigned i0 = 2u * geo.half + (part - geo.rope_blocks) * Lane::BN;
    qkv_any_tile<NARROW, LARGE>(x, ws, rows_of, QkvRopeCols{base + i0, base + hd, 0u, 0u, false},
                                k, acc);
#pragma unroll
    for (unsigned m = 0; m < Lane::MF; ++m) {
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) {
#pragma unroll
            for (unsigned e = 0; e < 4; ++e) {
                const unsigned i = i0 + at.col(j, e);
                const unsigned row = rows_of.src(at.row(m, e));
                if (row == GEMM_NO_ROW || i >= hd) {
                    continue;
                }
                bf16* dst = head_dst(row);
                if (dst != nullptr) {
                    dst[i] = linear_value(acc[0][m][j][e], bh, base + i);
                }
            }
        }
    }
}

// qkv_rope_kv_mma's block (its layout in `geo`): the wide tile over its 64 rows, or with
// NARROW (the `_narrow` entries, lever mma_narrow) gemm_narrow's passes of 16, whose launch
// stages 16 rows of a qk-norm head (its dynamic shared memory sized for them), not 64; with
// LARGE (the `_large` entries, lever mma_large) gemm_large's 128 rows, whose qk-norm launch
// stages 128.
template <class W, bool NARROW = false, bool LARGE = false>
__device__ __forceinline__ void qkv_rope_kv_run(
    bool ok, const bf16* __restrict__ x, const W (&w)[3], const bf16* const (&bias)[3],
    const bf16* const (&norm_w)[2], float eps, const int* __restrict__ positions,
    const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
    bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
    unsigned rows, unsigned k, QkvRopeGeometry geo, unsigned block_size, unsigned num_pages) {
    pdl_wait();
    pdl_launch_dependents();
    if (!ok || (geo.norm && geo.head_dim > GEMM_HEAD_DIM_MAX)) {
        return;
    }
    const unsigned m0 = blockIdx.x * QkvLane<LARGE>::BM;
    if constexpr (NARROW) {
        for (unsigned m = m0; m < rows && m < m0 + GEMM_BM; m += GEMM_NM) {
            qkv_rope_kv_rows<true, false>(x, w, bias, norm_w, eps, positions, inv_freq,
                                          slot_mapping, q_out, gate_out, cache, k, geo,
                                          block_size, num_pages, PassRows{m, rows});
        }
    } else {
        qkv_rope_kv_rows<false, LARGE>(x, w, bias, norm_w, eps, positions, inv_freq,
                                       slot_mapping, q_out, gate_out, cache, k, geo, block_size,
                                       num_pages, SpanRows{m0, rows});
    }
}

// LARGE: gemm_large's blocks (32 pairs or 64 features a block).
template <bool LARGE>
__device__ __forceinline__ QkvRopeGeometry qkv_rope_geometry(unsigned heads, unsigned kv_heads,
                                                             unsigned head_dim,
                                                             unsigned rotary_dim, bool norm,
                                                             bool gated) {
    constexpr unsigned bn = QkvLane<LARGE>::BN;
    // rotary_dim is even and at most head_dim (the CPU twin refuses anything else); clamp.
    const unsigned half = min(rotary_dim, head_dim) / 2u;
    return QkvRopeGeometry{heads, kv_heads, head_dim, half, (half + bn / 2u - 1u) / (bn / 2u),
                           (head_dim - 2u * half + bn - 1u) / bn, norm, gated};
}

// A qkv_rope_kv_mma launch's head and cache dimensions.
struct QkvRopeDims {
    unsigned heads, kv_heads, head_dim, rotary_dim, block_size, num_pages;
};

// The layouts of a qkv_rope_kv_mma entry: rope blocks, qk-norm's one block per head, and
// that with a gated q and zero-centred qk-norm weights (Qwen3-Next).
#define QKV_ROPE 0u
#define QKV_NORM 1u
#define QKV_GATED_NORM_ZC 2u

// One entry's launch over weight sources w (q, k, v) in `layout` (a constant in each entry, so
// each compiles only its own). The qk-norm layouts need both weights and the gated one
// gate_out (without them it writes nothing). `ok` false (a zero block or group) writes nothing.
template <class W, bool NARROW = false, bool LARGE = false>
__device__ __forceinline__ void qkv_rope_kv_entry(
    bool ok, const bf16* __restrict__ x, const W (&w)[3], unsigned layout,
    const bf16* const (&bias)[3], const bf16* const (&norm_w)[2], float eps,
    const int* __restrict__ positions, const float* __restrict__ inv_freq,
    const int* __restrict__ slot_mapping, bf16* __restrict__ q_out, bf16* __restrict__ gate_out,
    bf16* __restrict__ cache, unsigned rows, unsigned k, QkvRopeDims d) {
    const bool norm = layout != QKV_ROPE;
    const bool gated = layout == QKV_GATED_NORM_ZC;
    ok = ok && (!norm || (norm_w[0] != nullptr && norm_w[1] != nullptr)) &&
         (!gated || gate_out != nullptr);
    qkv_rope_kv_run<W, NARROW, LARGE>(
        ok, x, w, bias, norm_w, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k,
        qkv_rope_geometry<LARGE>(d.heads, d.kv_heads, d.head_dim, d.rotary_dim, norm, gated),
        d.block_size, d.num_pages);
}

// q, k and v of x bf16[rows·k] (wq [heads·head_dim·k], wk and wv [kv_heads·head_dim·k], biases
// optional); q roped into q_out, k roped and v into each row's slot of the paged cache (a slot
// outside it skipped), the bytes of qkv_mma then rope::rope_kv_write. grid = (⌈rows/64⌉, (heads +
// kv_heads)·(⌈half/16⌉ + ⌈(head_dim − 2·half)/32⌉) + ⌈kv_heads·head_dim/32⌉) (gemm_block), half =
// rotary_dim / 2; 128 threads. wqn, wkn and eps are qkv_norm_rope_kv_mma's, gate_out
// qkv_gated_norm_zc_rope_kv_mma's (unread here).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_rope_kv_mma(const bf16* __restrict__ x, const bf16* __restrict__ wq,
        const bf16* __restrict__ bq, const bf16* __restrict__ wk, const bf16* __restrict__ bk,
        const bf16* __restrict__ wv, const bf16* __restrict__ bv, const bf16* __restrict__ wqn,
        const bf16* __restrict__ wkn, const int* __restrict__ positions,
        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
        bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
        unsigned rows, unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
        unsigned rotary_dim, unsigned block_size, unsigned num_pages, float eps) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    const bool ok = true;
    qkv_rope_kv_entry(ok, x, w, QKV_ROPE, {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq,
                      slot_mapping, q_out, gate_out, cache, rows, k,
                      QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

// qkv_rope_kv_mma with qk-norm first (weights wqn, wkn bf16[head_dim]): the bytes of qkv_mma
// then rope::qk_norm_rope_kv_write. grid = (⌈rows/64⌉, heads + kv_heads +
// ⌈kv_heads·head_dim/32⌉) (gemm_block), 64·head_dim·2 bytes of dynamic shared memory; head_dim <= 256 (the CPU twin
// refuses more; the kernel stores nothing).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_norm_rope_kv_mma(const bf16* __restrict__ x, const bf16* __restrict__ wq,
        const bf16* __restrict__ bq, const bf16* __restrict__ wk, const bf16* __restrict__ bk,
        const bf16* __restrict__ wv, const bf16* __restrict__ bv, const bf16* __restrict__ wqn,
        const bf16* __restrict__ wkn, const int* __restrict__ positions,
        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
        bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
        unsigned rows, unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
        unsigned rotary_dim, unsigned block_size, unsigned num_pages, float eps) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    const bool ok = true;
    qkv_rope_kv_entry(ok, x, w, QKV_NORM, {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq,
                      slot_mapping, q_out, gate_out, cache, rows, k,
                      QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

// qkv_norm_rope_kv_mma for Qwen3-Next's gated attention: wq bf16[heads·2·head_dim·k] holds per
// head [q | gate]; the gate half goes to gate_out bf16[rows·heads·head_dim] and the qk-norm's
// weights are zero-centred. The bytes of qkv_mma then rope::gated_qk_norm_zc_rope_kv_write.
// The grid and shared memory of qkv_norm_rope_kv_mma.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_gated_norm_zc_rope_kv_mma(const bf16* __restrict__ x, const bf16* __restrict__ wq,
        const bf16* __restrict__ bq, const bf16* __restrict__ wk, const bf16* __restrict__ bk,
        const bf16* __restrict__ wv, const bf16* __restrict__ bv, const bf16* __restrict__ wqn,
        const bf16* __restrict__ wkn, const int* __restrict__ positions,
        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
        bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
        unsigned rows, unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
        unsigned rotary_dim, unsigned block_size, unsigned num_pages, float eps) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    const bool ok = true;
    qkv_rope_kv_entry(ok, x, w, QKV_GATED_NORM_ZC, {bq, bk, bv}, {wqn, wkn}, eps, positions,
                      inv_freq, slot_mapping, q_out, gate_out, cache, rows, k,
                      QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

// The three bf16 layouts through gemm_narrow (decode widths, lever mma_narrow): the same
// arguments, grid and bytes; a qk-norm layout's launch asks for 16·head_dim·2 bytes of dynamic
// shared memory (a pass's rows), not 64·head_dim·2.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_rope_kv_mma_narrow(const bf16* __restrict__ x, const bf16* __restrict__ wq,
        const bf16* __restrict__ bq, const bf16* __restrict__ wk, const bf16* __restrict__ bk,
        const bf16* __restrict__ wv, const bf16* __restrict__ bv, const bf16* __restrict__ wqn,
        const bf16* __restrict__ wkn, const int* __restrict__ positions,
        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
        bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
        unsigned rows, unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
        unsigned rotary_dim, unsigned block_size, unsigned num_pages, float eps) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    qkv_rope_kv_entry<GemmBf16, true>(true, x, w, QKV_ROPE, {bq, bk, bv}, {wqn, wkn}, eps,
                                      positions, inv_freq, slot_mapping, q_out, gate_out, cache,
                                      rows, k,
                                      QkvRopeDims{heads, kv_heads, head_dim, rotary_dim,
                                                  block_size, num_pages});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_norm_rope_kv_mma_narrow(const bf16* __restrict__ x, const bf16* __restrict__ wq,
        const bf16* __restrict__ bq, const bf16* __restrict__ wk, const bf16* __restrict__ bk,
        const bf16* __restrict__ wv, const bf16* __restrict__ bv, const bf16* __restrict__ wqn,
        const bf16* __restrict__ wkn, const int* __restrict__ positions,
        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
        bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
        unsigned rows, unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
        unsigned rotary_dim, unsigned block_size, unsigned num_pages, float eps) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    qkv_rope_kv_entry<GemmBf16, true>(true, x, w, QKV_NORM, {bq, bk, bv}, {wqn, wkn}, eps,
                                      positions, inv_freq, slot_mapping, q_out, gate_out, cache,
                                      rows, k,
                                      QkvRopeDims{heads, kv_heads, head_dim, rotary_dim,
                                                  block_size, num_pages});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_gated_norm_zc_rope_kv_mma_narrow(const bf16* __restrict__ x, const bf16* __restrict__ wq,
        const bf16* __restrict__ bq, const bf16* __restrict__ wk, const bf16* __restrict__ bk,
        const bf16* __restrict__ wv, const bf16* __restrict__ bv, const bf16* __restrict__ wqn,
        const bf16* __restrict__ wkn, const int* __restrict__ positions,
        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
        bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
        unsigned rows, unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
        unsigned rotary_dim, unsigned block_size, unsigned num_pages, float eps) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    qkv_rope_kv_entry<GemmBf16, true>(true, x, w, QKV_GATED_NORM_ZC, {bq, bk, bv}, {wqn, wkn}, eps,
                                      positions, inv_freq, slot_mapping, q_out, gate_out, cache,
                                      rows, k,
                                      QkvRopeDims{heads, kv_heads, head_dim, rotary_dim,
                                                  block_size, num_pages});
}

// qkv_rope_kv_mma, qkv_norm_rope_kv_mma and qkv_gated_norm_zc_rope_kv_mma on quantized q, k and
// v (one kind, each with its own blocks or group), dequantised as qkv_mma_fp8's and
// qkv_mma_int4's are. A zero block or group writes nothing. q's matrix has heads·head_dim rows,
// twice that in the gated layout (each head [q | gate]).
__device__ __forceinline__ unsigned qkv_q_rows(unsigned layout, QkvRopeDims d) {
    return (layout == QKV_GATED_NORM_ZC ? 2u : 1u) * d.heads * d.head_dim;
}

// An fp8 entry in `layout`: w q, k and v, blocks (block_n, block_k) of each; NARROW and LARGE
// as qkv_rope_kv_entry's.
template <bool NARROW, bool LARGE = false>
__device__ __forceinline__ void qkv_rope_kv_fp8(
    unsigned layout, const bf16* __restrict__ x, const unsigned char* const (&w)[3],
    const unsigned (&blocks)[6], const bf16* const (&bias)[3], const bf16* const (&norm_w)[2],
    float eps, const int* __restrict__ positions, const float* __restrict__ inv_freq,
    const int* __restrict__ slot_mapping, bf16* __restrict__ q_out, bf16* __restrict__ gate_out,
    bf16* __restrict__ cache, unsigned rows, unsigned k, QkvRopeDims d) {
    const unsigned nkv = d.kv_heads * d.head_dim;
    const GemmQuant<WFp8> ws[3] = {{WFp8{w[0], qkv_q_rows(layout, d), blocks[0], blocks[1]}},
                                   {WFp8{w[1], nkv, blocks[2], blocks[3]}},
                                   {WFp8{w[2], nkv, blocks[4], blocks[5]}}};
    bool ok = true;
#pragma unroll
    for (unsigned i = 0; i < 6u; ++i) ok = ok && blocks[i] != 0u;
    qkv_rope_kv_entry<GemmQuant<WFp8>, NARROW, LARGE>(ok, x, ws, layout, bias, norm_w, eps,
                                                      positions, inv_freq, slot_mapping, q_out,
                                                      gate_out, cache, rows, k, d);
}

// An int4 entry in `layout`: w q, k and v, each with its group; NARROW and LARGE as
// qkv_rope_kv_entry's.
template <bool NARROW, bool LARGE = false>
__device__ __forceinline__ void qkv_rope_kv_int4(
    unsigned layout, const bf16* __restrict__ x, const unsigned char* const (&w)[3],
    const unsigned (&groups)[3], const bf16* const (&bias)[3], const bf16* const (&norm_w)[2],
    float eps, const int* __restrict__ positions, const float* __restrict__ inv_freq,
    const int* __restrict__ slot_mapping, bf16* __restrict__ q_out, bf16* __restrict__ gate_out,
    bf16* __restrict__ cache, unsigned rows, unsigned k, QkvRopeDims d) {
    const unsigned nkv = d.kv_heads * d.head_dim;
    const GemmQuant<WInt4> ws[3] = {{WInt4{w[0], qkv_q_rows(layout, d), groups[0]}},
                                    {WInt4{w[1], nkv, groups[1]}},
                                    {WInt4{w[2], nkv, groups[2]}}};
    const bool ok = groups[0] != 0u && groups[1] != 0u && groups[2] != 0u;
    qkv_rope_kv_entry<GemmQuant<WInt4>, NARROW, LARGE>(ok, x, ws, layout, bias, norm_w, eps,
                                                       positions, inv_freq, slot_mapping, q_out,
                                                       gate_out, cache, rows, k, d);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_rope_kv_mma_fp8(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_block_n,
        unsigned q_block_k, unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
        unsigned v_block_k) {
    qkv_rope_kv_fp8<false>(QKV_ROPE, x, {wq, wk, wv},
        {q_block_n, q_block_k, k_block_n, k_block_k, v_block_n, v_block_k},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_norm_rope_kv_mma_fp8(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_block_n,
        unsigned q_block_k, unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
        unsigned v_block_k) {
    qkv_rope_kv_fp8<false>(QKV_NORM, x, {wq, wk, wv},
        {q_block_n, q_block_k, k_block_n, k_block_k, v_block_n, v_block_k},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_gated_norm_zc_rope_kv_mma_fp8(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_block_n,
        unsigned q_block_k, unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
        unsigned v_block_k) {
    qkv_rope_kv_fp8<false>(QKV_GATED_NORM_ZC, x, {wq, wk, wv},
        {q_block_n, q_block_k, k_block_n, k_block_k, v_block_n, v_block_k},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_rope_kv_mma_int4(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_group, unsigned k_group,
        unsigned v_group) {
    qkv_rope_kv_int4<false>(QKV_ROPE, x, {wq, wk, wv}, {q_group, k_group, v_group},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_norm_rope_kv_mma_int4(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_group, unsigned k_group,
        unsigned v_group) {
    qkv_rope_kv_int4<false>(QKV_NORM, x, {wq, wk, wv}, {q_group, k_group, v_group},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    qkv_gated_norm_zc_rope_kv_mma_int4(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_group, unsigned k_group,
        unsigned v_group) {
    qkv_rope_kv_int4<false>(QKV_GATED_NORM_ZC, x, {wq, wk, wv},
        {q_group, k_group, v_group},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

// The six quantized entries through gemm_narrow (decode widths, lever mma_narrow; a stage of
// GemmQuant's NARROW_K; one block per SM at least, as the quantized linear_mma_narrow
// entries): the same arguments, grid and bytes, a qk-norm layout's launch staging 16 rows of a
// head as the bf16 `_narrow` entries' do.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qkv_rope_kv_mma_fp8_narrow(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_block_n,
        unsigned q_block_k, unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
        unsigned v_block_k) {
    qkv_rope_kv_fp8<true>(QKV_ROPE, x, {wq, wk, wv},
        {q_block_n, q_block_k, k_block_n, k_block_k, v_block_n, v_block_k},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qkv_norm_rope_kv_mma_fp8_narrow(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_block_n,
        unsigned q_block_k, unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
        unsigned v_block_k) {
    qkv_rope_kv_fp8<true>(QKV_NORM, x, {wq, wk, wv},
        {q_block_n, q_block_k, k_block_n, k_block_k, v_block_n, v_block_k},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qkv_gated_norm_zc_rope_kv_mma_fp8_narrow(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_block_n,
        unsigned q_block_k, unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
        unsigned v_block_k) {
    qkv_rope_kv_fp8<true>(QKV_GATED_NORM_ZC, x, {wq, wk, wv},
        {q_block_n, q_block_k, k_block_n, k_block_k, v_block_n, v_block_k},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qkv_rope_kv_mma_int4_narrow(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_group, unsigned k_group,
        unsigned v_group) {
    qkv_rope_kv_int4<true>(QKV_ROPE, x, {wq, wk, wv}, {q_group, k_group, v_group},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qkv_norm_rope_kv_mma_int4_narrow(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_group, unsigned k_group,
        unsigned v_group) {
    qkv_rope_kv_int4<true>(QKV_NORM, x, {wq, wk, wv}, {q_group, k_group, v_group},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    qkv_gated_norm_zc_rope_kv_mma_int4_narrow(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_group, unsigned k_group,
        unsigned v_group) {
    qkv_rope_kv_int4<true>(QKV_GATED_NORM_ZC, x, {wq, wk, wv},
        {q_group, k_group, v_group},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

// Gate and up projections (wg, wu bf16[inter·k]) of x bf16[rows·k], then act bf16[rows·inter]
// = silu(gate) · up, with gate and up rounded to bf16 first as linear_mma stores them.
// grid = (⌈rows/64⌉, ⌈inter/32⌉) (gemm_block), 128 threads: each block takes both weights' tiles.
template <bool NARROW>
__device__ __forceinline__ void gate_up_silu_mma_body(const bf16* __restrict__ x,
                                                      const bf16* __restrict__ wg,
                                                      const bf16* __restrict__ wu,
                                                      bf16* __restrict__ act, unsigned rows,
                                                      unsigned k, unsigned inter) {
    const GemmBf16 ws[2] = {{wg}, {wu}};
    gemm_run<2, NARROW>(x, ws, rows, k, inter, gemm_block().feature * GEMM_BN,
                        StoreSiluMul{act, inter});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    gate_up_silu_mma(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                     const bf16* __restrict__ wu, bf16* __restrict__ act, unsigned rows,
                     unsigned k, unsigned inter) {
    gate_up_silu_mma_body<false>(x, wg, wu, act, rows, k, inter);
}
// gate_up_silu_mma through gemm_narrow (decode widths; the same grid and bytes).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    gate_up_silu_mma_narrow(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                            const bf16* __restrict__ wu, bf16* __restrict__ act, unsigned rows,
                            unsigned k, unsigned inter) {
    gate_up_silu_mma_body<true>(x, wg, wu, act, rows, k, inter);
}

// ---- the `_large` entries (gemm_large, in the "prefill widths" section above) -------

// linear_mma through gemm_large (prefill widths; its bytes). grid = (⌈rows/128⌉, ⌈n_out/64⌉),
// 256 threads (124 registers: two blocks an SM).
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    linear_mma_large(const bf16* __restrict__ x, const bf16* __restrict__ w,
                     const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                     unsigned k, unsigned n_out) {
    const GemmBf16 ws[1] = {{w}};
    gemm_large_run<1>(x, ws, rows, k, n_out, blockIdx.y * GEMM_LARGE_BN,
                      StoreLinear{bias, y, n_out});
}
// gate_up_silu_mma through gemm_large (prefill widths; its bytes). grid = (⌈rows/128⌉,
// ⌈inter/64⌉), 256 threads. Its 166 registers (both weights' accumulators and staging) allow one
// block an SM: capped at 128 for two, ptxas spills 140 bytes.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    gate_up_silu_mma_large(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                           const bf16* __restrict__ wu, bf16* __restrict__ act, unsigned rows,
                           unsigned k, unsigned inter) {
    const GemmBf16 ws[2] = {{wg}, {wu}};
    gemm_large_run<2>(x, ws, rows, k, inter, blockIdx.y * GEMM_LARGE_BN, StoreSiluMul{act, inter});
}
// lm_head_mma through gemm_large (prefill widths; its bytes, for the rows `want` flags).
// grid = (⌈rows/128⌉, ⌈vocab/64⌉), 256 threads.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    lm_head_mma_large(const bf16* __restrict__ x, const bf16* __restrict__ w,
                      float* __restrict__ logits, const int* __restrict__ want, unsigned rows,
                      unsigned k, unsigned vocab) {
    const GemmBf16 ws[1] = {{w}};
    gemm_large_run<1>(x, ws, rows, k, vocab, blockIdx.y * GEMM_LARGE_BN,
                      StoreLogits{logits, vocab, want}, true, want);
}

// ---- the `_pipe` entries (gemm_pipe, in the "prefill widths, pipelined" section above) -----

// linear_mma through gemm_pipe: linear_mma_large's grid and bytes, GEMM_PIPE_STAGES stages of
// dynamic shared memory (82,944 bytes).
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    linear_mma_pipe(const bf16* __restrict__ x, const bf16* __restrict__ w,
                    const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                    unsigned k, unsigned n_out) {
    const GemmBf16 ws[1] = {{w}};
    gemm_large_run<1, true>(x, ws, rows, k, n_out, blockIdx.y * GEMM_LARGE_BN,
                            StoreLinear{bias, y, n_out});
}
// gate_up_silu_mma through gemm_pipe: gate_up_silu_mma_large's grid and bytes, 110,592 bytes of
// dynamic shared memory.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    gate_up_silu_mma_pipe(const bf16* __restrict__ x, const bf16* __restrict__ wg,
                          const bf16* __restrict__ wu, bf16* __restrict__ act, unsigned rows,
                          unsigned k, unsigned inter) {
    const GemmBf16 ws[2] = {{wg}, {wu}};
    gemm_large_run<2, true>(x, ws, rows, k, inter, blockIdx.y * GEMM_LARGE_BN,
                            StoreSiluMul{act, inter});
}
// lm_head_mma through gemm_pipe: lm_head_mma_large's grid and bytes, 82,944 bytes of dynamic
// shared memory.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    lm_head_mma_pipe(const bf16* __restrict__ x, const bf16* __restrict__ w,
                     float* __restrict__ logits, const int* __restrict__ want, unsigned rows,
                     unsigned k, unsigned vocab) {
    const GemmBf16 ws[1] = {{w}};
    gemm_large_run<1, true>(x, ws, rows, k, vocab, blockIdx.y * GEMM_LARGE_BN,
                            StoreLogits{logits, vocab, want}, true, want);
}
// qkv_mma through gemm_pipe: qkv_mma_large's grid and bytes, 82,944 bytes of dynamic shared
// memory.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    qkv_mma_pipe(const bf16* __restrict__ x, const bf16* __restrict__ wq,
                 const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                 const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                 const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
                 bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv) {
    qkv_bf16<true, true>(x, wq, bq, wk, bk, wv, bv, q, k_out, v, rows, k, nq, nkv);
}
// linear_pair_mma through gemm_pipe: linear_pair_mma_large's grid and bytes, 82,944 bytes of
// dynamic shared memory.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    linear_pair_mma_pipe(const bf16* __restrict__ x, const bf16* __restrict__ w1,
                         const bf16* __restrict__ b1, const bf16* __restrict__ w2,
                         const bf16* __restrict__ b2, bf16* __restrict__ y1,
                         bf16* __restrict__ y2, unsigned rows, unsigned k, unsigned n1,
                         unsigned n2) {
    linear_pair_mma_body<false, true, true>(x, w1, b1, w2, b2, y1, y2, rows, k, n1, n2);
}

// The quantized entries of linear_mma and lm_head_mma through gemm_large (gate_up_silu_mma's
// follow its quantized bodies, below): the same arguments and bytes as theirs, in the large
// grid. A tile of a quantized weight is dequantised as it is fetched (GemmQuant), so each
// 128-row block dequantises a weight once where the 64-row tiles do it twice.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    linear_mma_fp8_large(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                         const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                         unsigned k, unsigned n_out, unsigned block_n, unsigned block_k) {
    const GemmQuant<WFp8> ws[1] = {{WFp8{w, n_out, block_n, block_k}}};
    gemm_large_run<1>(x, ws, rows, k, n_out, blockIdx.y * GEMM_LARGE_BN,
                      StoreLinear{bias, y, n_out}, block_n != 0u && block_k != 0u);
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    linear_mma_int4_large(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                          const bf16* __restrict__ bias, bf16* __restrict__ y, unsigned rows,
                          unsigned k, unsigned n_out, unsigned group) {
    const GemmQuant<WInt4> ws[1] = {{WInt4{w, n_out, group}}};
    gemm_large_run<1>(x, ws, rows, k, n_out, blockIdx.y * GEMM_LARGE_BN,
                      StoreLinear{bias, y, n_out}, group != 0u);
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    lm_head_mma_fp8_large(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                          float* __restrict__ logits, const int* __restrict__ want,
                          unsigned rows, unsigned k, unsigned vocab, unsigned block_n,
                          unsigned block_k) {
    const GemmQuant<WFp8> ws[1] = {{WFp8{w, vocab, block_n, block_k}}};
    gemm_large_run<1>(x, ws, rows, k, vocab, blockIdx.y * GEMM_LARGE_BN,
                      StoreLogits{logits, vocab, want}, block_n != 0u && block_k != 0u, want);
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    lm_head_mma_int4_large(const bf16* __restrict__ x, const unsigned char* __restrict__ w,
                           float* __restrict__ logits, const int* __restrict__ want,
                           unsigned rows, unsigned k, unsigned vocab, unsigned group) {
    const GemmQuant<WInt4> ws[1] = {{WInt4{w, vocab, group}}};
    gemm_large_run<1>(x, ws, rows, k, vocab, blockIdx.y * GEMM_LARGE_BN,
                      StoreLogits{logits, vocab, want}, group != 0u, want);
}

// qkv_mma, its quantized entries and linear_pair_mma through gemm_large (prefill widths; their
// bytes): each matrix's blocks of 64 features after the previous matrix's, so grid =
// (⌈rows/128⌉, ⌈nq/64⌉ + 2·⌈nkv/64⌉) or (⌈rows/128⌉, ⌈n1/64⌉ + ⌈n2/64⌉), 256 threads.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    qkv_mma_large(const bf16* __restrict__ x, const bf16* __restrict__ wq,
                  const bf16* __restrict__ bq, const bf16* __restrict__ wk,
                  const bf16* __restrict__ bk, const bf16* __restrict__ wv,
                  const bf16* __restrict__ bv, bf16* __restrict__ q, bf16* __restrict__ k_out,
                  bf16* __restrict__ v, unsigned rows, unsigned k, unsigned nq, unsigned nkv) {
    qkv_bf16<true>(x, wq, bq, wk, bk, wv, bv, q, k_out, v, rows, k, nq, nkv);
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    qkv_mma_fp8_large(const bf16* __restrict__ x, const unsigned char* __restrict__ wq,
                      const bf16* __restrict__ bq, const unsigned char* __restrict__ wk,
                      const bf16* __restrict__ bk, const unsigned char* __restrict__ wv,
                      const bf16* __restrict__ bv, bf16* __restrict__ q,
                      bf16* __restrict__ k_out, bf16* __restrict__ v, unsigned rows, unsigned k,
                      unsigned nq, unsigned nkv, unsigned q_block_n, unsigned q_block_k,
                      unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
                      unsigned v_block_k) {
    qkv_fp8<true>(x, wq, bq, wk, bk, wv, bv, q, k_out, v, rows, k, nq, nkv, q_block_n,
                  q_block_k, k_block_n, k_block_k, v_block_n, v_block_k);
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    qkv_mma_int4_large(const bf16* __restrict__ x, const unsigned char* __restrict__ wq,
                       const bf16* __restrict__ bq, const unsigned char* __restrict__ wk,
                       const bf16* __restrict__ bk, const unsigned char* __restrict__ wv,
                       const bf16* __restrict__ bv, bf16* __restrict__ q,
                       bf16* __restrict__ k_out, bf16* __restrict__ v, unsigned rows, unsigned k,
                       unsigned nq, unsigned nkv, unsigned q_group, unsigned k_group,
                       unsigned v_group) {
    qkv_int4<true>(x, wq, bq, wk, bk, wv, bv, q, k_out, v, rows, k, nq, nkv, q_group, k_group,
                   v_group);
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    linear_pair_mma_large(const bf16* __restrict__ x, const bf16* __restrict__ w1,
                          const bf16* __restrict__ b1, const bf16* __restrict__ w2,
                          const bf16* __restrict__ b2, bf16* __restrict__ y1,
                          bf16* __restrict__ y2, unsigned rows, unsigned k, unsigned n1,
                          unsigned n2) {
    linear_pair_mma_body<false, true>(x, w1, b1, w2, b2, y1, y2, rows, k, n1, n2);
}

// qkv_rope_kv_mma (the plain layout: rope blocks, no qk-norm) and its quantized entries through
// gemm_large (prefill widths; their bytes): per q or k head ⌈half/32⌉ rope blocks (32 features
// of the first rotary half and their 32 partners, each warp's 32 columns 16 pairs as the 64 × 32
// tile's are) and ⌈(head_dim − 2·half)/64⌉ pass-through blocks, then ⌈kv_heads·head_dim/64⌉ v
// blocks; grid = (⌈rows/128⌉, those), 256 threads, no dynamic shared memory. The qk-norm
// layouts' `_large` entries (below) take one block per q or k head and 128·head_dim·2 bytes of
// dynamic shared memory.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    qkv_rope_kv_mma_large(const bf16* __restrict__ x, const bf16* __restrict__ wq,
        const bf16* __restrict__ bq, const bf16* __restrict__ wk, const bf16* __restrict__ bk,
        const bf16* __restrict__ wv, const bf16* __restrict__ bv, const bf16* __restrict__ wqn,
        const bf16* __restrict__ wkn, const int* __restrict__ positions,
        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
        bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
        unsigned rows, unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
        unsigned rotary_dim, unsigned block_size, unsigned num_pages, float eps) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    qkv_rope_kv_entry<GemmBf16, false, true>(true, x, w, QKV_ROPE, {bq, bk, bv}, {wqn, wkn}, eps,
                                             positions, inv_freq, slot_mapping, q_out, gate_out,
                                             cache, rows, k,
                                             QkvRopeDims{heads, kv_heads, head_dim, rotary_dim,
                                                         block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    qkv_rope_kv_mma_fp8_large(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_block_n,
        unsigned q_block_k, unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
        unsigned v_block_k) {
    qkv_rope_kv_fp8<false, true>(QKV_ROPE, x, {wq, wk, wv},
        {q_block_n, q_block_k, k_block_n, k_block_k, v_block_n, v_block_k},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

// At two blocks an SM (128 registers) ptxas spilled 8 bytes here: one block of eight warps.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS, 1)
    qkv_rope_kv_mma_int4_large(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_group, unsigned k_group,
        unsigned v_group) {
    qkv_rope_kv_int4<false, true>(QKV_ROPE, x, {wq, wk, wv}, {q_group, k_group, v_group},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}


// The qk-norm and gated layouts through gemm_large: per q or k head one block, which runs the
// head's 64-feature tiles into a stage of 128 rows (128·head_dim·2 bytes of dynamic shared
// memory: with the tile's 27 KB past the 48 KB a launch gets without opting in for a head wider than 84, so the CUDA
// backend opts in), then ⌈kv_heads·head_dim/64⌉ v blocks; grid = (⌈rows/128⌉, those), 256
// threads. The bytes of their 64-row entries.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    qkv_norm_rope_kv_mma_large(const bf16* __restrict__ x, const bf16* __restrict__ wq,
        const bf16* __restrict__ bq, const bf16* __restrict__ wk, const bf16* __restrict__ bk,
        const bf16* __restrict__ wv, const bf16* __restrict__ bv, const bf16* __restrict__ wqn,
        const bf16* __restrict__ wkn, const int* __restrict__ positions,
        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
        bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
        unsigned rows, unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
        unsigned rotary_dim, unsigned block_size, unsigned num_pages, float eps) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    qkv_rope_kv_entry<GemmBf16, false, true>(true, x, w, QKV_NORM, {bq, bk, bv}, {wqn, wkn}, eps,
                                             positions, inv_freq, slot_mapping, q_out, gate_out,
                                             cache, rows, k,
                                             QkvRopeDims{heads, kv_heads, head_dim, rotary_dim,
                                                         block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    qkv_gated_norm_zc_rope_kv_mma_large(const bf16* __restrict__ x, const bf16* __restrict__ wq,
        const bf16* __restrict__ bq, const bf16* __restrict__ wk, const bf16* __restrict__ bk,
        const bf16* __restrict__ wv, const bf16* __restrict__ bv, const bf16* __restrict__ wqn,
        const bf16* __restrict__ wkn, const int* __restrict__ positions,
        const float* __restrict__ inv_freq, const int* __restrict__ slot_mapping,
        bf16* __restrict__ q_out, bf16* __restrict__ gate_out, bf16* __restrict__ cache,
        unsigned rows, unsigned k, unsigned heads, unsigned kv_heads, unsigned head_dim,
        unsigned rotary_dim, unsigned block_size, unsigned num_pages, float eps) {
    const GemmBf16 w[3] = {{wq}, {wk}, {wv}};
    qkv_rope_kv_entry<GemmBf16, false, true>(true, x, w, QKV_GATED_NORM_ZC, {bq, bk, bv},
                                             {wqn, wkn}, eps, positions, inv_freq, slot_mapping,
                                             q_out, gate_out, cache, rows, k,
                                             QkvRopeDims{heads, kv_heads, head_dim, rotary_dim,
                                                         block_size, num_pages});
}

// Blocks an SM, as ptxas allocates without a spill: the bf16 entries and qk-norm's fp8 two (128
// registers); the gated fp8 one spilled 4 bytes at two, so it and the int4 ones take one.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS, 2)
    qkv_norm_rope_kv_mma_fp8_large(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_block_n,
        unsigned q_block_k, unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
        unsigned v_block_k) {
    qkv_rope_kv_fp8<false, true>(QKV_NORM, x, {wq, wk, wv},
        {q_block_n, q_block_k, k_block_n, k_block_k, v_block_n, v_block_k},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS, 1)
    qkv_norm_rope_kv_mma_int4_large(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_group, unsigned k_group,
        unsigned v_group) {
    qkv_rope_kv_int4<false, true>(QKV_NORM, x, {wq, wk, wv}, {q_group, k_group, v_group},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS, 1)
    qkv_gated_norm_zc_rope_kv_mma_fp8_large(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_block_n,
        unsigned q_block_k, unsigned k_block_n, unsigned k_block_k, unsigned v_block_n,
        unsigned v_block_k) {
    qkv_rope_kv_fp8<false, true>(QKV_GATED_NORM_ZC, x, {wq, wk, wv},
        {q_block_n, q_block_k, k_block_n, k_block_k, v_block_n, v_block_k},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS, 1)
    qkv_gated_norm_zc_rope_kv_mma_int4_large(const bf16* __restrict__ x,
        const unsigned char* __restrict__ wq, const bf16* __restrict__ bq,
        const unsigned char* __restrict__ wk, const bf16* __restrict__ bk,
        const unsigned char* __restrict__ wv, const bf16* __restrict__ bv,
        const bf16* __restrict__ wqn, const bf16* __restrict__ wkn,
        const int* __restrict__ positions, const float* __restrict__ inv_freq,
        const int* __restrict__ slot_mapping, bf16* __restrict__ q_out,
        bf16* __restrict__ gate_out, bf16* __restrict__ cache, unsigned rows, unsigned k,
        unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned rotary_dim,
        unsigned block_size, unsigned num_pages, float eps, unsigned q_group, unsigned k_group,
        unsigned v_group) {
    qkv_rope_kv_int4<false, true>(QKV_GATED_NORM_ZC, x, {wq, wk, wv}, {q_group, k_group, v_group},
        {bq, bk, bv}, {wqn, wkn}, eps, positions, inv_freq, slot_mapping, q_out, gate_out, cache,
        rows, k, QkvRopeDims{heads, kv_heads, head_dim, rotary_dim, block_size, num_pages});
}

// gate_up_silu_mma on quantized gate and up (one kind, each with its own blocks or group),
// dequantised as qkv_mma_fp8's and qkv_mma_int4's are. A zero block or group writes nothing.
// NARROW: through gemm_narrow (the `_narrow` entries, lever mma_narrow).
template <bool NARROW, bool LARGE = false>
__device__ __forceinline__ void gate_up_silu_fp8(const bf16* __restrict__ x,
                                                 const unsigned char* __restrict__ wg,
                                                 const unsigned char* __restrict__ wu,
                                                 bf16* __restrict__ act, unsigned rows,
                                                 unsigned k, unsigned inter, unsigned g_block_n,
                                                 unsigned g_block_k, unsigned u_block_n,
                                                 unsigned u_block_k) {
    const bool ok = g_block_n != 0u && g_block_k != 0u && u_block_n != 0u && u_block_k != 0u;
    const GemmQuant<WFp8> ws[2] = {{WFp8{wg, inter, g_block_n, g_block_k}},
                                   {WFp8{wu, inter, u_block_n, u_block_k}}};
    if constexpr (LARGE) {
        gemm_large_run<2>(x, ws, rows, k, inter, blockIdx.y * GEMM_LARGE_BN,
                          StoreSiluMul{act, inter}, ok);
    } else {
        gemm_run<2, NARROW>(x, ws, rows, k, inter, gemm_block().feature * GEMM_BN,
                            StoreSiluMul{act, inter}, ok);
    }
}

template <bool NARROW, bool LARGE = false>
__device__ __forceinline__ void gate_up_silu_int4(const bf16* __restrict__ x,
                                                  const unsigned char* __restrict__ wg,
                                                  const unsigned char* __restrict__ wu,
                                                  bf16* __restrict__ act, unsigned rows,
                                                  unsigned k, unsigned inter, unsigned g_group,
                                                  unsigned u_group) {
    const bool ok = g_group != 0u && u_group != 0u;
    const GemmQuant<WInt4> ws[2] = {{WInt4{wg, inter, g_group}}, {WInt4{wu, inter, u_group}}};
    if constexpr (LARGE) {
        gemm_large_run<2>(x, ws, rows, k, inter, blockIdx.y * GEMM_LARGE_BN,
                          StoreSiluMul{act, inter}, ok);
    } else {
        gemm_run<2, NARROW>(x, ws, rows, k, inter, gemm_block().feature * GEMM_BN,
                            StoreSiluMul{act, inter}, ok);
    }
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    gate_up_silu_mma_fp8(const bf16* __restrict__ x, const unsigned char* __restrict__ wg,
                         const unsigned char* __restrict__ wu, bf16* __restrict__ act,
                         unsigned rows, unsigned k, unsigned inter, unsigned g_block_n,
                         unsigned g_block_k, unsigned u_block_n, unsigned u_block_k) {
    gate_up_silu_fp8<false>(x, wg, wu, act, rows, k, inter, g_block_n, g_block_k, u_block_n,
                            u_block_k);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    gate_up_silu_mma_int4(const bf16* __restrict__ x, const unsigned char* __restrict__ wg,
                          const unsigned char* __restrict__ wu, bf16* __restrict__ act,
                          unsigned rows, unsigned k, unsigned inter, unsigned g_group,
                          unsigned u_group) {
    gate_up_silu_int4<false>(x, wg, wu, act, rows, k, inter, g_group, u_group);
}

// The two quantized entries through gemm_narrow (decode widths, lever mma_narrow; one block
// per SM at least, as the quantized linear_mma_narrow entries): the same arguments, grid and
// bytes.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    gate_up_silu_mma_fp8_narrow(const bf16* __restrict__ x, const unsigned char* __restrict__ wg,
                                const unsigned char* __restrict__ wu, bf16* __restrict__ act,
                                unsigned rows, unsigned k, unsigned inter, unsigned g_block_n,
                                unsigned g_block_k, unsigned u_block_n, unsigned u_block_k) {
    gate_up_silu_fp8<true>(x, wg, wu, act, rows, k, inter, g_block_n, g_block_k, u_block_n,
                           u_block_k);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1)
    gate_up_silu_mma_int4_narrow(const bf16* __restrict__ x, const unsigned char* __restrict__ wg,
                                 const unsigned char* __restrict__ wu, bf16* __restrict__ act,
                                 unsigned rows, unsigned k, unsigned inter, unsigned g_group,
                                 unsigned u_group) {
    gate_up_silu_int4<true>(x, wg, wu, act, rows, k, inter, g_group, u_group);
}

// gate_up_silu_mma_fp8 and _int4 through gemm_large (prefill widths, lever mma_large; gemm.cu's
// "prefill widths" section): the same arguments and bytes, in the large grid.
extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    gate_up_silu_mma_fp8_large(const bf16* __restrict__ x, const unsigned char* __restrict__ wg,
                               const unsigned char* __restrict__ wu, bf16* __restrict__ act,
                               unsigned rows, unsigned k, unsigned inter, unsigned g_block_n,
                               unsigned g_block_k, unsigned u_block_n, unsigned u_block_k) {
    gate_up_silu_fp8<false, true>(x, wg, wu, act, rows, k, inter, g_block_n, g_block_k,
                                  u_block_n, u_block_k);
}

extern "C" __global__ void __launch_bounds__(GEMM_LARGE_THREADS)
    gate_up_silu_mma_int4_large(const bf16* __restrict__ x, const unsigned char* __restrict__ wg,
                                const unsigned char* __restrict__ wu, bf16* __restrict__ act,
                                unsigned rows, unsigned k, unsigned inter, unsigned g_group,
                                unsigned u_group) {
    gate_up_silu_int4<false, true>(x, wg, wu, act, rows, k, inter, g_group, u_group);
}

// Every pick s (= r·k + j) of expert e among `total` ids, gathered 64 at a time in shared memory
// (atomics: their order in a tile varies, but no pick's bytes depend on its tile), `tile(picks,
// take)` run whenever 64 are gathered and at the end; `invalid(s)` for a pick whose id is
// outside 0..experts, called by expert 0's blocks only. Every thread of the block calls it.
template <class Tile, class Invalid>
__device__ __forceinline__ void experts_gather(const int* __restrict__ ids, unsigned total,
                                               unsigned e, unsigned experts, Tile tile,
                                               Invalid invalid) {
    // A window of 64 ids adds at most 64 picks to fewer than 64 waiting.
    __shared__ unsigned picks[2 * GEMM_BM];
    __shared__ unsigned count;
    if (threadIdx.x == 0) count = 0u;
    __syncthreads();
    for (unsigned base = 0;; base += GEMM_BM) {
        const unsigned s = base + threadIdx.x;
        if (threadIdx.x < GEMM_BM && s < total) {
            const int id = ids[s];
            if (id == (int)e) {
                picks[atomicAdd(&count, 1u)] = s;
            } else if (e == 0u && (id < 0 || (unsigned)id >= experts)) {
                invalid(s);
            }
        }
        __syncthreads();
        const unsigned waiting = count;
        // Past the last window of ids up to 127 picks may wait: a full tile now, the rest on
        // the next pass, which gathers nothing.
        const bool drained = base + GEMM_BM >= total;
        if (waiting >= GEMM_BM || (drained && waiting > 0u)) {
            const unsigned take = waiting < GEMM_BM ? waiting : GEMM_BM;
            tile(picks, take);
            __syncthreads();
            // take is 64 whenever picks stay (waiting − take < 64): the moves read 64.. and
            // write 0..63, apart.
            if (threadIdx.x < waiting - take) picks[threadIdx.x] = picks[take + threadIdx.x];
            __syncthreads();
            if (threadIdx.x == 0) count = waiting - take;
        }
        __syncthreads();
        if (drained && count == 0u) {
            break;
        }
    }
}

// Expert blockIdx.y's gate and up tiles (GemmBf16 or GemmExpert) against its picks:
// experts_gate_up_silu_mma's body for any weight source.
template <class W>
__device__ __forceinline__ void experts_gate_up(const bf16* __restrict__ x,
                                                const int* __restrict__ ids, W gate, W up,
                                                bf16* __restrict__ act, unsigned rows,
                                                unsigned hidden, unsigned inter, unsigned experts,
                                                unsigned k) {
    const unsigned e = blockIdx.y;
    const unsigned n0 = blockIdx.x * GEMM_BN;
    experts_gather(
        ids, rows * k, e, experts,
        [&](const unsigned* picks, unsigned take) {
            const W ws[2] = {gate, up};
            gemm_tile<2>(x, ws, PickRows{picks, take, k}, hidden, inter, n0,
                         StoreSiluMul{act, inter});
        },
        [&](unsigned s) {
            for (unsigned f = n0; f < n0 + GEMM_BN && f < inter; ++f) {
                act[(unsigned long long)s * inter + f] = to_bf16(0.0f);
            }
        });
}

// The routed experts' gate and up projections on the tensor cores, grouped by expert: for each
// pick s (= r·k + j) of expert e = ids[s], act bf16[s·inter + f] = silu(bf16(x_r · wg[e][f])) ·
// bf16(x_r · wu[e][f]), every dot and stored value linear_mma's (so gate_up_silu_mma's on that
// expert's matrices). grid = (⌈inter/32⌉, experts), 128 threads: block (fb, e) gathers expert
// e's picks (experts_gather) and runs a 64-pick tile at a time. A pick whose id is outside
// 0..experts (the twin refuses it) is zeros, written by expert 0's blocks.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    experts_gate_up_silu_mma(const bf16* __restrict__ x, const int* __restrict__ ids,
                             const bf16* __restrict__ wg, const bf16* __restrict__ wu,
                             bf16* __restrict__ act, unsigned rows, unsigned hidden,
                             unsigned inter, unsigned experts, unsigned k) {
    pdl_wait();
    pdl_launch_dependents();
    const unsigned long long matrix = (unsigned long long)inter * hidden;
    experts_gate_up(x, ids, GemmBf16{wg + blockIdx.y * matrix}, GemmBf16{wu + blockIdx.y * matrix},
                    act, rows, hidden, inter, experts, k);
}

// experts_gate_up_silu_mma on quantized experts: wg, wu the stacked blobs (words) of
// [experts][inter][hidden] in fp8 (blocks block_n × block_k) or int4 (groups of `group`, hidden
// even), each weight chunk dequantised as its tile is staged (GemmExpert), so each pick's bytes
// are experts_gate_up_silu_mma's on the dequantised experts. A zero block or group, or an odd
// hidden for int4 (the CPU twin refuses them), writes nothing.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    experts_gate_up_silu_mma_fp8(const bf16* __restrict__ x, const int* __restrict__ ids,
                                 const unsigned* __restrict__ wg, const unsigned* __restrict__ wu,
                                 bf16* __restrict__ act, unsigned rows, unsigned hidden,
                                 unsigned inter, unsigned experts, unsigned k, unsigned block_n,
                                 unsigned block_k) {
    pdl_wait();
    pdl_launch_dependents();
    if (block_n == 0u || block_k == 0u) {
        return;
    }
    const unsigned e = blockIdx.y;
    experts_gate_up(x, ids,
                    GemmExpert<MoeFp8Matrix>{MoeFp8Matrix(wg, e, inter, hidden, block_n, block_k)},
                    GemmExpert<MoeFp8Matrix>{MoeFp8Matrix(wu, e, inter, hidden, block_n, block_k)},
                    act, rows, hidden, inter, experts, k);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    experts_gate_up_silu_mma_int4(const bf16* __restrict__ x, const int* __restrict__ ids,
                                  const unsigned* __restrict__ wg,
                                  const unsigned* __restrict__ wu, bf16* __restrict__ act,
                                  unsigned rows, unsigned hidden, unsigned inter,
                                  unsigned experts, unsigned k, unsigned group) {
    pdl_wait();
    pdl_launch_dependents();
    if (group == 0u || (hidden & 1u) != 0u) {
        return;
    }
    const unsigned e = blockIdx.y;
    experts_gate_up(x, ids, GemmExpert<MoeInt4Matrix>{MoeInt4Matrix(wg, e, inter, hidden, group)},
                    GemmExpert<MoeInt4Matrix>{MoeInt4Matrix(wu, e, inter, hidden, group)}, act,
                    rows, hidden, inter, experts, k);
}

struct StoreDots {
    float* dots;
    unsigned n;
    __device__ __forceinline__ void operator()(unsigned r, unsigned f, const float (&v)[1]) const {
        dots[(unsigned long long)r * n + f] = v[0];
    }
};

// Expert blockIdx.y's down tile (GemmBf16 or GemmExpert) against its picks:
// experts_down_mma's body for any weight source.
template <class W>
__device__ __forceinline__ void experts_down(const bf16* __restrict__ act,
                                             const int* __restrict__ ids, W down,
                                             float* __restrict__ dots, unsigned rows,
                                             unsigned hidden, unsigned inter, unsigned experts,
                                             unsigned k) {
    const unsigned n0 = blockIdx.x * GEMM_BN;
    experts_gather(
        ids, rows * k, blockIdx.y, experts,
        [&](const unsigned* picks, unsigned take) {
            const W ws[1] = {down};
            gemm_tile<1>(act, ws, PickSelf{picks, take}, inter, hidden, n0,
                         StoreDots{dots, hidden});
        },
        [](unsigned) {});
}

// The routed experts' down projections on the tensor cores, grouped by expert: for each pick s
// (= r·k + j) of expert e = ids[s], dots f32[s·hidden + f] = act_s · wd[e][f] (act
// bf16[rows·k·inter], wd bf16[experts·hidden·inter]), each dot linear_mma's. grid =
// (⌈hidden/32⌉, experts), 128 threads, as experts_gate_up_silu_mma. A pick whose id is outside
// 0..experts gets no dots (moe::down_combine skips it). moe::down_combine then sums each row's
// picks in order.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    experts_down_mma(const bf16* __restrict__ act, const int* __restrict__ ids,
                     const bf16* __restrict__ wd, float* __restrict__ dots, unsigned rows,
                     unsigned hidden, unsigned inter, unsigned experts, unsigned k) {
    pdl_wait();
    pdl_launch_dependents();
    experts_down(act, ids, GemmBf16{wd + blockIdx.y * ((unsigned long long)hidden * inter)}, dots,
                 rows, hidden, inter, experts, k);
}

// experts_down_mma on quantized experts: wd the stacked blob (words) of [experts][hidden][inter]
// in fp8 or int4 (inter even), dequantised as experts_gate_up_silu_mma_fp8's are. A zero block
// or group, or an odd inter for int4, writes nothing.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    experts_down_mma_fp8(const bf16* __restrict__ act, const int* __restrict__ ids,
                         const unsigned* __restrict__ wd, float* __restrict__ dots, unsigned rows,
                         unsigned hidden, unsigned inter, unsigned experts, unsigned k,
                         unsigned block_n, unsigned block_k) {
    pdl_wait();
    pdl_launch_dependents();
    if (block_n == 0u || block_k == 0u) {
        return;
    }
    experts_down(act, ids,
                 GemmExpert<MoeFp8Matrix>{MoeFp8Matrix(wd, blockIdx.y, hidden, inter, block_n,
                                                       block_k)},
                 dots, rows, hidden, inter, experts, k);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    experts_down_mma_int4(const bf16* __restrict__ act, const int* __restrict__ ids,
                          const unsigned* __restrict__ wd, float* __restrict__ dots,
                          unsigned rows, unsigned hidden, unsigned inter, unsigned experts,
                          unsigned k, unsigned group) {
    pdl_wait();
    pdl_launch_dependents();
    if (group == 0u || (inter & 1u) != 0u) {
        return;
    }
    experts_down(act, ids, GemmExpert<MoeInt4Matrix>{MoeInt4Matrix(wd, blockIdx.y, hidden, inter, group)},
                 dots, rows, hidden, inter, experts, k);
}
