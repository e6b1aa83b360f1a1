// `gemm` module: projections on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate),
// for the programs whose rows make a matrix product of a projection (prefill chunks, wide
// multi-seq and verify programs) rather than a matrix-vector one.
#include "common.cuh"

// Block tile: 64 rows (tokens) × 32 output features, k in steps of 32. Four warps, each owning
// 16 rows × 32 features (one m16 A fragment against four n8 B fragments per k16 step). Tiles
// are staged in shared memory with a row pitch of 40 bf16 (80 bytes): every ldmatrix row
// address stays 16-byte aligned and the eight rows of one 8×8 matrix fall in distinct banks.
//
// Numerics: each output's accumulator starts at +0 and takes the products of its row of x and
// its weight row in k order, 16 at a time through mma.sync, then the zero padding of the last
// k tile. The order does not depend on the row count, on which block or warp holds the row, or
// on the grid: a row's bytes are the same in any program that launches this kernel (batch
// invariance). Against the CUDA-core reference (gemv's segmented dots) the sums differ in the
// last bits, so the rules launching these kernels are `differs` (FUSIONS.toml).
#define GEMM_BM 64
#define GEMM_BN 32
#define GEMM_BK 32
#define GEMM_PITCH (GEMM_BK + 8)
#define GEMM_THREADS 128

// A tile of `tile` rows × GEMM_BK k of a row-major bf16 matrix src[count][k] into shared
// memory: rows at or past `count` and k at or past `k` are +0.
template <unsigned tile>
__device__ __forceinline__ void gemm_stage(bf16 (*s)[GEMM_PITCH], const bf16* src, unsigned first,
                                           unsigned count, unsigned k, unsigned k0, bool vec) {
    constexpr unsigned chunks = GEMM_BK / 8;
    for (unsigned c = threadIdx.x; c < tile * chunks; c += GEMM_THREADS) {
        const unsigned r = c / chunks;
        const unsigned kc = (c % chunks) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (first + r < count && k0 + kc < k) {
            v = load8_bits(src + (unsigned long long)(first + r) * k + k0 + kc, k - (k0 + kc), vec);
        }
        *reinterpret_cast<uint4*>(&s[r][kc]) = v;
    }
}

// acc[j][0..3] of this lane: rows (g, g+8) of its warp's 16, features 8j + 2t and the next,
// of dot(x row, w row) over all of k.
template <class Store>
__device__ __forceinline__ void gemm_run(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                         unsigned rows, unsigned k, unsigned n, Store store) {
    __shared__ __align__(16) bf16 xs[GEMM_BM][GEMM_PITCH];
    __shared__ __align__(16) bf16 ws[GEMM_BN][GEMM_PITCH];
    pdl_wait();
    pdl_launch_dependents();
    const unsigned warp = threadIdx.x / 32;
    const unsigned lane = threadIdx.x % 32;
    const unsigned n0 = blockIdx.x * GEMM_BN;
    const unsigned m0 = blockIdx.y * GEMM_BM;
    const bool vec = (k % 8u) == 0u && aligned16(x) && aligned16(w);
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    }
    for (unsigned k0 = 0; k0 < k; k0 += GEMM_BK) {
        gemm_stage<GEMM_BM>(xs, x, m0, rows, k, k0, vec);
        gemm_stage<GEMM_BN>(ws, w, n0, n, k, k0, vec);
        __syncthreads();
#pragma unroll
        for (unsigned kk = 0; kk < GEMM_BK; kk += 16) {
            // Matrices: rows 0-7 / 8-15 of the warp's 16 (lane bit 3), k 0-7 / 8-15 (bit 4).
            unsigned a[4];
            ldmatrix_x4(a, &xs[warp * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
            for (unsigned p = 0; p < 2; ++p) {
                // Matrices: k 0-7 / 8-15 (lane bit 3) of features 0-7 / 8-15 (bit 4) of pair p.
                unsigned b[4];
                ldmatrix_x4(b, &ws[p * 16 + (lane >> 4) * 8 + (lane & 7)][kk + ((lane >> 3) & 1) * 8]);
                mma_bf16_16816(acc[2 * p], a, b[0], b[1]);
                mma_bf16_16816(acc[2 * p + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    const unsigned g = lane >> 2;
    const unsigned t = lane & 3;
#pragma unroll
    for (unsigned j = 0; j < 4; ++j) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            const unsigned r = m0 + warp * 16 + g + (e >> 1) * 8;
            const unsigned f = n0 + j * 8 + 2 * t + (e & 1);
            if (r < rows && f < n) store(r, f, acc[j][e]);
        }
    }
}

struct StoreLinear {
    const bf16* bias;
    bf16* y;
    unsigned n;
    __device__ __forceinline__ void operator()(unsigned r, unsigned f, float acc) const {
        y[(unsigned long long)r * n + f] = linear_value(acc, bias, f);
    }
};

struct StoreLogits {
    float* logits;
    unsigned n;
    __device__ __forceinline__ void operator()(unsigned r, unsigned f, float acc) const {
        logits[(unsigned long long)r * n + f] = acc;
    }
};

// x bf16[rows·k], w bf16[n_out·k], bias bf16[n_out]? → y bf16[rows·n_out] = bf16(dot + bias),
// stored as gemv::linear stores it. grid = (⌈n_out/32⌉, ⌈rows/64⌉), 128 threads.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_mma(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ bias,
               bf16* __restrict__ y, unsigned rows, unsigned k, unsigned n_out) {
    gemm_run(x, w, rows, k, n_out, StoreLinear{bias, y, n_out});
}

// x bf16[rows·k], w bf16[vocab·k] → logits f32[rows·vocab] (the LM head, an MoE router).
// grid = (⌈vocab/32⌉, ⌈rows/64⌉), 128 threads.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    lm_head_mma(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ logits,
                unsigned rows, unsigned k, unsigned vocab) {
    gemm_run(x, w, rows, k, vocab, StoreLogits{logits, vocab});
}
