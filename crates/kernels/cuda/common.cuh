// Shared device arithmetic of every solder kernel: bf16 storage, f32 arithmetic, round to
// nearest even when a value is stored as bf16.
//
// Invariant: a fused kernel computes each value it shares with the reference kernels it
// replaces through the same function here, so reference and fused routings give the same
// bytes on the GPU. Every float operation is an explicit IEEE intrinsic (__fadd_rn, __fmul_rn,
// __fmaf_rn, ...) and the modules are compiled with --fmad=false, so no contraction depends on
// the surrounding code. Every reduction has a fixed order that depends only on the data's
// length, never on the block size, the row count or which block runs it.
#pragma once

#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

#define SOLDER_FULL_MASK 0xffffffffu
// -inf (NVRTC has no <cmath> INFINITY).
#define NEG_INF __int_as_float(0xff800000)

// ---- programmatic dependent launch (Hopper) ------------------------------------------------
// With the `pdl` lever a launch may start while the previous kernel on its stream is still
// running (cudaLaunchAttributeProgrammaticStreamSerialization). `pdl_wait` blocks the calling
// thread until every prerequisite grid has completed and its memory is visible; without the
// attribute it returns at once. Invariant: every block of every kernel calls it before any
// early return and before it reads or writes any buffer another launch writes or reads; the
// only work allowed before it is loading weights (buffers no launch writes). Because each
// kernel waits before it can complete, waiting on the previous grid waits on all earlier ones.
// `pdl_launch_dependents` lets the next launch start its own prologue early; it never makes
// this grid's writes visible sooner. Outside CUDA (the host emulation) both are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- arrival counters (split-K, split heads, flash-decoding merges) ------------------------
// A split kernel's blocks each store a partial, fence, and count in on a counter; the one that
// counts last reads every partial back. `counter_arrive` is an acq_rel atomic add at gpu scope:
// it releases the counting thread's writes (and, through the fence and barrier before it, its
// block's) and acquires those of every block that counted before, which the PTX memory model
// requires of the last arriver (a relaxed atomicAdd between fences is only correct on today's
// hardware). `counter_clear` sets it back to zero for the next launch; `gemv::counters_reset`
// also zeroes every counter at the start of each step, so a grid aborted between its count
// and its clear cannot poison later steps. Outside CUDA (the host emulation) they are the plain
// add and store.
__device__ __forceinline__ unsigned counter_arrive(unsigned* counter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    unsigned old;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
    return old;
#else
    return atomicAdd(counter, 1u);
#endif
}

__device__ __forceinline__ void counter_clear(unsigned* counter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(counter), "r"(0u) : "memory");
#else
    *counter = 0u;
#endif
}

// Asks L2 for the 128-byte line holding p (a weight: no launch writes it, so this may come
// before pdl_wait). No value is read; outside CUDA (the host emulation) a no-op.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// ---- asynchronous copies (cp.async, sm_80+) -------------------------------------------------
// 16 bytes from global memory (16-byte aligned) into shared memory (16-byte aligned) without
// passing through registers (cp.async.cg: cached in L2 only, as a tile read once a block is).
// The copy lands at some point before this thread's cp_async_wait lets the group it was
// committed in complete; other threads see it after that wait and a barrier. The host emulation
// (cuda_emu.hpp) holds each copy back until then, so a read that comes too early reads what
// the shared memory held before.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__)
    unsigned addr;
    asm("{ .reg .u64 s; cvta.to.shared.u64 s, %1; cvt.u32.u64 %0, s; }" : "=r"(addr) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(addr), "l"(gmem) : "memory");
#else
    emu_cp_async16(smem, gmem);
#endif
}

// Closes this thread's group of the cp_async16 copies issued since the previous commit (an
// empty group when there were none).
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;" ::: "memory");
#else
    emu_cp_async_commit();
#endif
}

// Waits until at most N of this thread's committed groups (the newest) are still in flight.
template <unsigned N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#else
    emu_cp_async_wait(N);
#endif
}

// ---- tensor cores (mma.sync) ---------------------------------------------------------------
// One warp's bf16 matrix product on the tensor cores, f32 accumulate: d (16×8) += a (16×16,
// row-major) · b (16×8, column-major), in PTX's m16n8k16 fragment layouts. With g = lane / 4
// and t = lane % 4: a[0] holds a(g, 2t..2t+1), a[1] a(g+8, 2t..), a[2] a(g, 8+2t..), a[3]
// a(g+8, 8+2t..); b0 holds b(2t..2t+1, g), b1 b(8+2t.., g); d[0..1] are d(g, 2t..2t+1), d[2..3]
// d(g+8, 2t..); each 32-bit word's low half is the lower index. How a device's tensor cores
// order and round the sixteen products' sum is not documented, so a kernel built on this is
// `differs` against the CUDA-core reference; the host emulation (cuda_emu.hpp) gives it one
// definite order: d = c, then fmaf over k = 0..15.
__device__ __forceinline__ void mma_bf16_16816(float d[4], const unsigned a[4], unsigned b0,
                                               unsigned b1) {
#if defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    emu_mma_m16n8k16_bf16(d, a, b0, b1);
#endif
}

// f32 rounded to TF32 (cvt.rna: 10 mantissa bits, to nearest, ties away from zero), kept in
// an f32's bits with the low 13 zero: what mma_tf32_1688 multiplies. Finite values past TF32's
// largest round to infinity; infinities stay what they are, NaN is the canonical NaN.
__device__ __forceinline__ unsigned to_tf32(float x) {
#if defined(__CUDA_ARCH__)
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
#else
    return emu_cvt_rna_tf32(x);
#endif
}

// One warp's TF32 matrix product on the tensor cores, f32 accumulate: d (16×8) += a (16×8,
// row-major) · b (8×8, column-major), PTX's m16n8k8 .tf32 layouts. With g = lane / 4 and
// t = lane % 4: a[0] holds a(g, t), a[1] a(g+8, t), a[2] a(g, t+4), a[3] a(g+8, t+4); b0 holds
// b(t, g), b1 b(t+4, g); d as mma_bf16_16816's (d(g, 2t..2t+1), d(g+8, 2t..)). Each operand is
// a `to_tf32` value. A TF32 product of two such values is exact in f32, so the host emulation's
// one definite order (d = c, then fmaf over k = 0..7) is c plus each exact product in k order,
// rounded after each add; a device's tensor cores need not follow it (`differs`).
__device__ __forceinline__ void mma_tf32_1688(float d[4], const unsigned a[4], unsigned b0,
                                              unsigned b1) {
#if defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    emu_mma_m16n8k8_tf32(d, a, b0, b1);
#endif
}

// Four 8×8 bf16 matrices from shared memory into one warp's fragments (ldmatrix .x4): lanes
// 8i..8i+7 give the 16-byte-aligned addresses of matrix i's rows 0..7; every lane receives in
// r[i] matrix i's row lane / 4, elements 2·(lane % 4) and the next.
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const bf16* row) {
#if defined(__CUDA_ARCH__)
    unsigned addr;
    asm("{ .reg .u64 s; cvta.to.shared.u64 s, %1; cvt.u32.u64 %0, s; }" : "=r"(addr) : "l"(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#else
    emu_ldmatrix_x4(r, row);
#endif
}

// ldmatrix_x4 transposed (.trans): lanes 8i..8i+7 give the addresses of matrix i's rows 0..7;
// every lane receives in r[i] matrix i's elements (row 2·(lane % 4), column lane / 4) and (row
// 2·(lane % 4) + 1, the same column): a row-major [k][n] tile as mma.sync's B fragment.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const bf16* row) {
#if defined(__CUDA_ARCH__)
    unsigned addr;
    asm("{ .reg .u64 s; cvta.to.shared.u64 s, %1; cvt.u32.u64 %0, s; }" : "=r"(addr) : "l"(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#else
    emu_ldmatrix_x4_trans(r, row);
#endif
}

// ---- conversions ---------------------------------------------------------------------------

// bf16 -> f32, exactly.
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

// f32 -> bf16, round to nearest even.
__device__ __forceinline__ bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }

// The low and high bf16 of a 32-bit word, widened (element 2i is the low half: little endian).
__device__ __forceinline__ float lo_f32(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f32(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// 8 packed bf16 -> 8 f32.
__device__ __forceinline__ void widen8(uint4 v, float out[8]) {
    out[0] = lo_f32(v.x);
    out[1] = hi_f32(v.x);
    out[2] = lo_f32(v.y);
    out[3] = hi_f32(v.y);
    out[4] = lo_f32(v.z);
    out[5] = hi_f32(v.z);
    out[6] = lo_f32(v.w);
    out[7] = hi_f32(v.w);
}

// The step's want-logits flags (i32 per row; null: every row is wanted): whether row r is
// wanted, and whether any of rows [r0, r1) is. The LM head kernels (gemv's MapLogits, gemm's
// StoreLogits and gemm_run_wanted) skip a row that is not, and a block with none returns.
__device__ __forceinline__ bool row_wanted(const int* want, unsigned r) {
    return want == nullptr || want[r] != 0;
}
__device__ __forceinline__ bool rows_wanted(const int* want, unsigned r0, unsigned r1) {
    bool any = false;
    for (unsigned r = r0; r < r1; ++r) {
        any = any || row_wanted(want, r);
    }
    return any;
}

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0ull;
}

__device__ __forceinline__ unsigned short bf16_bits(bf16 x) { return __bfloat16_as_ushort(x); }

// The scalar path of load8_bits: out of line, so the unrolled callers stay small.
__device__ __noinline__ uint4 load8_bits_scalar(const bf16* p, unsigned valid) {
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned lo = (unsigned)(2 * i) < valid ? bf16_bits(p[2 * i]) : 0u;
        const unsigned hi = (unsigned)(2 * i + 1) < valid ? bf16_bits(p[2 * i + 1]) : 0u;
        w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// 8 consecutive bf16 at p as raw bits; elements at or past `valid` read as +0. With `vec`
// (p 16-byte aligned) and a full chunk this is one 16-byte read-only load; the scalar path
// gives the same bits, so alignment never changes a result.
__device__ __forceinline__ uint4 load8_bits(const bf16* p, unsigned valid, bool vec) {
    if (vec && valid >= 8) {
        return __ldg(reinterpret_cast<const uint4*>(p));
    }
    return load8_bits_scalar(p, valid);
}

// ---- warp reductions -----------------------------------------------------------------------

// Butterfly sum over the 32 lanes. Every lane ends with the same bits: at each step lanes i
// and i^m add the same two values (a + b == b + a exactly).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
        v = __fadd_rn(v, __shfl_xor_sync(SOLDER_FULL_MASK, v, m));
    }
    return v;
}

// Max over the 32 lanes; NaN is dropped (fmaxf), as Rust's f32::max drops it.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(SOLDER_FULL_MASK, v, m));
    }
    return v;
}

// ---- non-finite values ---------------------------------------------------------------------
// Rule: NaN and ±inf travel through every kernel as through its CPU twin; a kernel never
// skips a term because of its value, only because of its index (a masked or padding key, a
// row past the launch), unless the skipped term is one the twin adds as an exact zero.

// Neither NaN nor ±inf (exponent bits not all ones).
__device__ __forceinline__ bool is_finite(float x) {
    return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

// max(a, b) that keeps NaN (fmaxf drops it): NaN if either is NaN, else fmaxf's value.
__device__ __forceinline__ float fmax_nan(float a, float b) {
    return a != a ? a : (b != b ? b : fmaxf(a, b));
}

// `warp_max` that keeps NaN: NaN on every lane if any lane holds NaN.
__device__ __forceinline__ float warp_max_nan(float v) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
        v = fmax_nan(v, __shfl_xor_sync(SOLDER_FULL_MASK, v, m));
    }
    return v;
}

// ---- the shared values of the reference ops ------------------------------------------------

// Residual stream plus a branch output (add::residual_add).
__device__ __forceinline__ float residual_value(float h, bf16 x) { return __fadd_rn(h, to_f32(x)); }

// Σ v² of a row of `len` values `val(i)`, by one warp: lane l accumulates i = l, l+32, ... in
// order with fma, then the butterfly. The order depends only on `len`.
template <class Val>
__device__ __forceinline__ float warp_sum_squares(const Val& val, unsigned len, unsigned lane) {
    float acc = 0.0f;
    for (unsigned i = lane; i < len; i += 32) {
        float v = val(i);
        acc = __fmaf_rn(v, v, acc);
    }
    return warp_sum(acc);
}

// 1 / sqrt(mean square + eps), IEEE division and square root.
__device__ __forceinline__ float inv_rms(float sum_squares, unsigned len, float eps) {
    float mean = __fdiv_rn(sum_squares, (float)len);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// RMSNorm of one value: bf16((v · inv) · w).
__device__ __forceinline__ bf16 norm_value(float v, float inv, bf16 w) {
    return to_bf16(__fmul_rn(__fmul_rn(v, inv), to_f32(w)));
}

// Zero-centred RMSNorm of one value: bf16((v · inv) · (1 + w)).
__device__ __forceinline__ bf16 norm_value_zc(float v, float inv, bf16 w) {
    return to_bf16(__fmul_rn(__fmul_rn(v, inv), __fadd_rn(1.0f, to_f32(w))));
}

// One projection output: bf16(acc + bias[o]) (bias may be null).
__device__ __forceinline__ bf16 linear_value(float acc, const bf16* bias, unsigned o) {
    return bias != nullptr ? to_bf16(__fadd_rn(acc, to_f32(bias[o]))) : to_bf16(acc);
}

// silu(g) · u in f32, stored bf16 (act::silu_mul).
__device__ __forceinline__ bf16 silu_mul_value(bf16 g, bf16 u) {
    float gf = to_f32(g);
    float uf = to_f32(u);
    float silu = __fdiv_rn(gf, __fadd_rn(1.0f, expf(-gf)));
    return to_bf16(__fmul_rn(silu, uf));
}

// ---- rope ----------------------------------------------------------------------------------

// cos and sin of the f32 angle position · inv_freq (the product rounded in f32, as the CPU
// twin does). The reduction and the polynomials run in f64 (Cody-Waite reduction by π/2, Taylor
// terms to r^16 on |r| <= π/4), so the result is the correctly rounded f32 in all but rare
// ties, with no Payne-Hanek slow path and hence no local memory (libdevice sinf/cosf have one).
__device__ __forceinline__ void rope_cos_sin(int position, float inv_freq, float* c, float* s) {
    float angle = __fmul_rn((float)position, inv_freq);
    double a = (double)angle;
    double j = rint(__dmul_rn(a, 0.63661977236758134308)); // 2/π
    const double pio2_hi = 1.5707963267948966192e+00;        // nearest double to π/2
    const double pio2_lo = 6.1232339957367660359e-17;        // π/2 − pio2_hi
    double r = fma(-j, pio2_hi, a);
    r = fma(-j, pio2_lo, r);
    double r2 = __dmul_rn(r, r);
    // sin r = r (1 − r²/3! + r⁴/5! − ... − r¹⁴/15!)
    double ps = -7.6471637318198164759e-13; // −1/15!
    ps = fma(ps, r2, 1.6059043836821614599e-10);  // 1/13!
    ps = fma(ps, r2, -2.5052108385441718775e-08); // −1/11!
    ps = fma(ps, r2, 2.7557319223985890653e-06);  // 1/9!
    ps = fma(ps, r2, -1.9841269841269841270e-04); // −1/7!
    ps = fma(ps, r2, 8.3333333333333333333e-03);  // 1/5!
    ps = fma(ps, r2, -1.6666666666666666667e-01); // −1/3!
    double sn = fma(__dmul_rn(ps, r2), r, r);
    // cos r = 1 − r²/2! + r⁴/4! − ... + r¹⁶/16!
    double pc = 4.7794773323873852974e-14;        // 1/16!
    pc = fma(pc, r2, -1.1470745597729724714e-11); // −1/14!
    pc = fma(pc, r2, 2.0876756987868098979e-09);  // 1/12!
    pc = fma(pc, r2, -2.7557319223985890653e-07); // −1/10!
    pc = fma(pc, r2, 2.4801587301587301587e-05);  // 1/8!
    pc = fma(pc, r2, -1.3888888888888888889e-03); // −1/6!
    pc = fma(pc, r2, 4.1666666666666666667e-02);  // 1/4!
    pc = fma(pc, r2, -5.0000000000000000000e-01); // −1/2!
    double cs = fma(pc, r2, 1.0);
    long long quadrant = (long long)j & 3ll;
    double cos_v, sin_v;
    if (quadrant == 0) {
        cos_v = cs;
        sin_v = sn;
    } else if (quadrant == 1) {
        cos_v = -sn;
        sin_v = cs;
    } else if (quadrant == 2) {
        cos_v = -cs;
        sin_v = -sn;
    } else {
        cos_v = sn;
        sin_v = -cs;
    }
    *c = __double2float_rn(cos_v);
    *s = __double2float_rn(sin_v);
}

// Rotate-half rope of one pair: (x1·c − x2·s, x2·c + x1·s), each stored bf16.
__device__ __forceinline__ void rope_pair(float x1, float x2, float c, float s, bf16* o1, bf16* o2) {
    *o1 = to_bf16(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
    *o2 = to_bf16(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

// ---- paged KV cache ------------------------------------------------------------------------

// Element offset of token `slot`'s k (part 0) or v (part 1) row in one layer's cache region
// `[num_pages][2][block_size][kv_heads][head_dim]`.
__device__ __forceinline__ unsigned long long cache_offset(unsigned long long page, unsigned part,
                                                           unsigned offset, unsigned block_size,
                                                           unsigned row_elems) {
    return ((page * 2ull + part) * block_size + offset) * (unsigned long long)row_elems;
}

// ---- rows of the residual stream (norm::rms_norm, norm::add_rms_norm, fused gemv) ----------

// Element i of a residual row: h[i], or h[i] + d[i] when the residual add is fused (d != null).
__device__ __forceinline__ float row_value(const float* h, const bf16* d, unsigned i) {
    return d != nullptr ? residual_value(h[i], d[i]) : h[i];
}

// 1/rms of one residual row of length k (h, plus d when d != null), by one warp. norm::rms_norm,
// norm::add_rms_norm and every fused-norm gemv call this, so all agree on every row's bits.
__device__ __forceinline__ float row_inv_rms(const float* h, const bf16* d, unsigned k, float eps,
                                             unsigned lane) {
    float ss = warp_sum_squares([&](unsigned i) { return row_value(h, d, i); }, k, lane);
    return inv_rms(ss, k, eps);
}

// ---- heads (norm::qk_norm, rope::*) --------------------------------------------------------

// One head of head_dim values, by one warp: qk-norm when w != null (the normalised values are
// rounded to bf16, as norm::qk_norm stores them; with ZC, zero-centred weights as
// norm::qk_norm_zc stores them), then rotate-half rope of the first `half` pairs when
// half > 0; the remaining dims pass through. Written to dst. The rope table holds half inverse
// frequencies then the attention scaling (YaRN's; exactly 1.0 for every other rope, so c·1 and
// s·1 are c and s), which multiplies cos and sin in f32 as transformers does.
template <bool ZC = false>
__device__ __forceinline__ void head_transform(const bf16* __restrict__ x, bf16* __restrict__ dst,
                                               unsigned head_dim, const bf16* __restrict__ w,
                                               float eps, int position,
                                               const float* __restrict__ inv_freq, unsigned half,
                                               unsigned lane) {
    float inv = 0.0f;
    if (w != nullptr) {
        float ss = warp_sum_squares([&](unsigned i) { return to_f32(x[i]); }, head_dim, lane);
        inv = inv_rms(ss, head_dim, eps);
    }
    auto value = [&](unsigned i) -> bf16 {
        if (w == nullptr) {
            return x[i];
        }
        return ZC ? norm_value_zc(to_f32(x[i]), inv, w[i]) : norm_value(to_f32(x[i]), inv, w[i]);
    };
    const float scaling = half > 0 ? inv_freq[half] : 1.0f;
    for (unsigned i = lane; i < half; i += 32) {
        float c, s;
        rope_cos_sin(position, inv_freq[i], &c, &s);
        c = __fmul_rn(c, scaling);
        s = __fmul_rn(s, scaling);
        rope_pair(to_f32(value(i)), to_f32(value(i + half)), c, s, &dst[i], &dst[i + half]);
    }
    for (unsigned i = 2 * half + lane; i < head_dim; i += 32) {
        dst[i] = value(i);
    }
}

// The per-head pass of every head kernel: one block per row (grid-stride), one warp per head
// (q heads then k heads, strided by the block's warp count). qk-norm when wq, wk != null
// (zero-centred weights with ZC); rope when positions != null; k heads go to k_out, or with
// slot_mapping != null to their cache slot together with the v head (a slot outside the cache
// is skipped; q_out is still written). With gate_out != null q is a gated projection
// (Qwen3-Next: each head `[q | gate]`, 2·head_dim wide) and each q head's gate half is copied
// to gate_out (bf16[rows·heads·head_dim]) as attn::gate_split copies it.
template <bool ZC = false>
__device__ __forceinline__ void head_pass(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
    const bf16* __restrict__ wq, const bf16* __restrict__ wk, float eps,
    const int* __restrict__ positions, const float* __restrict__ inv_freq, unsigned rotary_dim,
    const int* __restrict__ slot_mapping, bf16* __restrict__ q_out, bf16* __restrict__ k_out,
    bf16* __restrict__ cache, unsigned rows, unsigned heads, unsigned kv_heads, unsigned head_dim,
    unsigned block_size, unsigned num_pages, bf16* __restrict__ gate_out = nullptr) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned warps = blockDim.x >> 5;
    const unsigned all_heads = heads + kv_heads;
    const unsigned row_elems = kv_heads * head_dim;
    // rotary_dim is even and at most head_dim (the CPU twin refuses anything else); clamp.
    const unsigned half = positions != nullptr ? min(rotary_dim, head_dim) / 2u : 0u;
    const unsigned long long slots = (unsigned long long)num_pages * block_size;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const int position = positions != nullptr ? positions[r] : 0;
        for (unsigned hh = warp; hh < all_heads; hh += warps) {
            if (hh < heads) {
                const unsigned long long at = ((unsigned long long)r * heads + hh) * head_dim;
                const bf16* src = q + (gate_out != nullptr ? 2ull * at : at);
                head_transform<ZC>(src, q_out + at, head_dim, wq, eps, position, inv_freq, half,
                                   lane);
                if (gate_out != nullptr) {
                    for (unsigned i = lane; i < head_dim; i += 32) {
                        gate_out[at + i] = src[head_dim + i];
                    }
                }
                continue;
            }
            const unsigned kvh = hh - heads;
            const unsigned long long at = (unsigned long long)r * row_elems + (unsigned long long)kvh * head_dim;
            if (slot_mapping == nullptr) {
                head_transform<ZC>(k + at, k_out + at, head_dim, wk, eps, position, inv_freq,
                                   half, lane);
                continue;
            }
            const int slot = slot_mapping[r];
            if (slot < 0 || (unsigned long long)slot >= slots) {
                continue;
            }
            const unsigned page = (unsigned)slot / block_size;
            const unsigned offset = (unsigned)slot % block_size;
            const unsigned long long head_at = (unsigned long long)kvh * head_dim;
            bf16* k_dst = cache + cache_offset(page, 0, offset, block_size, row_elems) + head_at;
            bf16* v_dst = cache + cache_offset(page, 1, offset, block_size, row_elems) + head_at;
            head_transform<ZC>(k + at, k_dst, head_dim, wk, eps, position, inv_freq, half, lane);
            for (unsigned i = lane; i < head_dim; i += 32) {
                v_dst[i] = v[at + i];
            }
        }
    }
}

// ---- the projection dot (gemv::*, moe::*) --------------------------------------------------

// One 8-element chunk of a dot: acc = fma(x[e], w[e], acc) for e = 0..7 in order, exactly the
// inner step of `gemv_block`.
__device__ __forceinline__ float dot8(uint4 xbits, uint4 wbits, float acc) {
    float xf[8];
    float wf[8];
    widen8(xbits, xf);
    widen8(wbits, wf);
#pragma unroll
    for (unsigned e = 0; e < 8; ++e) {
        acc = __fmaf_rn(xf[e], wf[e], acc);
    }
    return acc;
}

// The dot order of every projection (gemv::*, moe::*), in segments of DOT_SEG elements: within
// segment s (elements [s·DOT_SEG, (s + 1)·DOT_SEG)) lane l accumulates with fma, in element
// order, the 8-element chunks c ≡ l (mod 32) of the segment in increasing order, from +0; the
// butterfly `warp_sum` gives the segment's sum; the dot is the segment sums added in increasing
// order, the first one as it is (`dot_fold`). Elements past k read as +0; a segment starting at
// or past k does not exist. So a dot's order depends only on k, and a dot split across blocks
// at segment boundaries (gemv's split-K: each block's segment sums, merged in segment order)
// has the bits of the dot one warp computes whole.
#define DOT_SEG 1024u
#define DOT_SEG_LANE_CHUNKS 4u // DOT_SEG / 8 / 32: chunks of 8 per lane per segment

// The running dot after segment `seg`'s sum s: s itself for the first segment, else total + s.
__device__ __forceinline__ float dot_fold(float total, float s, unsigned seg) {
    return seg == 0u ? s : __fadd_rn(total, s);
}

// dot(x, w) over k elements by one warp (every lane returns the same bits), in the segment
// order above: 16-byte loads when a pointer is 16-byte aligned (the scalar path gives the same
// bits). It is, bit for bit, the dot `gemv::lm_head` stores for the same x row and weight row.
__device__ __forceinline__ float warp_dot(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                          unsigned k, unsigned lane) {
    const bool xv = aligned16(x);
    const bool wv = aligned16(w);
    float total = 0.0f;
    for (unsigned seg = 0; seg * DOT_SEG < k; ++seg) {
        float acc = 0.0f;
#pragma unroll
        for (unsigned j = 0; j < DOT_SEG_LANE_CHUNKS; ++j) {
            const unsigned i0 = seg * DOT_SEG + (j * 32u + lane) * 8u;
            if (i0 < k) {
                const unsigned valid = min(8u, k - i0);
                acc = dot8(load8_bits(x + i0, valid, xv), load8_bits(w + i0, valid, wv), acc);
            }
        }
        total = dot_fold(total, warp_sum(acc), seg);
    }
    return total;
}

// ---- Qwen3-Next values ---------------------------------------------------------------------

// Gated DeltaNet's head geometry (gdn.cu; gemv.cu's gated-norm source finds z with it). Per-row
// sizes are 32-bit (the kernels refuse qkvz rows of 2^32 elements or more and 2^31 channels or
// more), so channel maps use 32-bit division (a 64-bit one is a call with a stack frame).
struct GdnHeads {
    unsigned nk, dk, nv, dv, ratio;
    unsigned group;    // 2·dk + 2·ratio·dv: one key head's qkvz group
    unsigned kd;       // nk·dk
    unsigned channels; // 2·kd + nv·dv
    unsigned qkvz_row; // nk·group

    // False on a geometry the CPU twin refuses, or one too wide (then the kernel does nothing).
    __device__ __forceinline__ bool init(unsigned nk_, unsigned dk_, unsigned nv_, unsigned dv_) {
        nk = nk_;
        dk = dk_;
        nv = nv_;
        dv = dv_;
        if (nk == 0u || dk == 0u || nv == 0u || dv == 0u || nv % nk != 0u) {
            return false;
        }
        ratio = nv / nk;
        const unsigned long long group_ll = 2ull * dk + 2ull * ratio * dv;
        const unsigned long long kd_ll = (unsigned long long)nk * dk;
        const unsigned long long channels_ll = 2ull * kd_ll + (unsigned long long)nv * dv;
        const unsigned long long row_ll = (unsigned long long)nk * group_ll;
        if (row_ll > 0xffffffffull || channels_ll > 0x7fffffffull) {
            return false;
        }
        group = (unsigned)group_ll;
        kd = (unsigned)kd_ll;
        channels = (unsigned)channels_ll;
        qkvz_row = (unsigned)row_ll;
        return true;
    }

    // Where conv channel c (HF's cat(query, key, value)) sits in a qkvz row.
    __device__ __forceinline__ unsigned channel_source(unsigned c) const {
        if (c < kd) {
            return (c / dk) * group + c % dk;
        }
        if (c < 2u * kd) {
            const unsigned ck = c - kd;
            return (ck / dk) * group + dk + ck % dk;
        }
        const unsigned cv = c - 2u * kd;
        const unsigned vh = cv / dv;
        return (vh / ratio) * group + 2u * dk + (vh % ratio) * dv + cv % dv;
    }

    // Where v head vh's z starts in a qkvz row.
    __device__ __forceinline__ unsigned z_source(unsigned vh) const {
        return (vh / ratio) * group + 2u * dk + ratio * dv + (vh % ratio) * dv;
    }
};


// 1 / (1 + exp(−x)), in f32.
__device__ __forceinline__ float sigmoid_f32(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

// bf16(x · sigmoid(gate)): Qwen3-Next's gated attention output (act::sigmoid_mul, and the
// attention kernels that store their output gated).
__device__ __forceinline__ bf16 sigmoid_gated(bf16 x, bf16 gate) {
    return to_bf16(__fmul_rn(to_f32(x), sigmoid_f32(to_f32(gate))));
}

// x / (1 + exp(−x)), in f32 (the SiLU inside `silu_mul_value`).
__device__ __forceinline__ float silu_f32(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
}


// ---- quantized weights (solder_circuit::format; the twin is numerics::dequant) --------------
//
// A quantized matrix is one blob: the values, then f32 scales, then (int4) u8 zero points, each
// region at the next 256-byte boundary. A weight's bf16 value is one f32 product rounded once:
// fp8 `bf16_rn(f32(e4m3(q)) * scale)`, int4 `bf16_rn(f32(q - z) * scale)`. Integer code only
// (no __nv_fp8 intrinsics), so the host emulation runs the same source.

// The start of the blob region after `bytes` bytes of the previous one.
__device__ __forceinline__ unsigned long long quant_align(unsigned long long bytes) {
    return (bytes + 255ull) & ~255ull;
}

// The f32 value of an FP8 e4m3 (e4m3fn) code: bias 7, no infinities, 0x7f/0xff the NaN.
__device__ __forceinline__ float e4m3_to_f32(unsigned q) {
    const unsigned sign = (q & 0x80u) << 24;
    const unsigned exponent = (q >> 3) & 0xfu;
    const unsigned mantissa = q & 0x7u;
    if (exponent == 0xfu && mantissa == 0x7u) {
        return __uint_as_float(0x7fc00000u);
    }
    if (exponent == 0u) { // subnormal: mantissa · 2^-9, exact
        return __uint_as_float(sign | __float_as_uint(__fmul_rn((float)mantissa, 0.001953125f)));
    }
    return __uint_as_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// One fp8 weight's bf16 bits.
__device__ __forceinline__ unsigned dequant_fp8_bits(unsigned q, float scale) {
    return bf16_bits(to_bf16(__fmul_rn(e4m3_to_f32(q), scale)));
}

// One int4 weight's bf16 bits (q, z in 0..=15).
__device__ __forceinline__ unsigned dequant_int4_bits(unsigned q, unsigned z, float scale) {
    return bf16_bits(to_bf16(__fmul_rn((float)((int)q - (int)z), scale)));
}

// 8 bf16 bit patterns packed as `load8_bits` returns them (element 2i in the low half).
__device__ __forceinline__ uint4 pack8_bits(const unsigned b[8]) {
    return make_uint4(b[0] | (b[1] << 16), b[2] | (b[3] << 16), b[4] | (b[5] << 16),
                      b[6] | (b[7] << 16));
}

// Quantized weight rows (gemv's and gemm's): `row(f, k)` of a matrix, whose `load8(i0,
// valid)` gives elements [i0, i0 + 8) dequantised, packed as `load8_bits` packs bf16 (at or
// past `valid`: +0).
//
// A whole chunk inside one scale block or group (i0 and the block or group a multiple of 8, all
// 8 elements valid) whose codes are aligned (fp8: 8 bytes, int4: 4; so for k a multiple of 8)
// takes the fast path: its codes in one load and one scale (and zero point) for the 8, instead
// of a byte load and an integer division per element. Each element's value is the same
// dequant_*_bits of the same code, zero point and scale, so the bits do not depend on the path.

// Whether the chunk [i0, i0 + 8) lies whole in one block or group of `span` elements, all valid.
__device__ __forceinline__ bool quant_chunk_whole(unsigned i0, unsigned valid, unsigned span) {
    return valid >= 8u && ((i0 | span) & 7u) == 0u;
}

// 8 fp8 codes (code e in byte e of `codes`, little endian) dequantised with one scale.
__device__ __forceinline__ uint4 dequant8_fp8(uint2 codes, float scale) {
    unsigned b[8];
#pragma unroll
    for (unsigned e = 0; e < 8u; ++e) {
        const unsigned word = e < 4u ? codes.x : codes.y;
        b[e] = dequant_fp8_bits((word >> ((e & 3u) * 8u)) & 0xffu, scale);
    }
    return pack8_bits(b);
}

// 8 int4 codes (element e in nibble e of `nibbles`, the low first) dequantised with one zero
// point and scale.
__device__ __forceinline__ uint4 dequant8_int4(unsigned nibbles, unsigned z, float scale) {
    unsigned b[8];
#pragma unroll
    for (unsigned e = 0; e < 8u; ++e) {
        b[e] = dequant_int4_bits((nibbles >> (e * 4u)) & 0xfu, z, scale);
    }
    return pack8_bits(b);
}

// Whether p is aligned to `bytes` (a power of two).
__device__ __forceinline__ bool quant_aligned(const unsigned char* p, unsigned bytes) {
    return (reinterpret_cast<unsigned long long>(p) & (unsigned long long)(bytes - 1u)) == 0ull;
}

// Row f of an fp8 e4m3 matrix: its codes and its block row of scales.
struct RowFp8 {
    const unsigned char* q;
    const float* scales;
    unsigned block_k;
    __device__ __forceinline__ uint4 load8(unsigned i0, unsigned valid) const {
        if (quant_chunk_whole(i0, valid, block_k) && quant_aligned(q + i0, 8u)) {
            return dequant8_fp8(__ldg(reinterpret_cast<const uint2*>(q + i0)),
                                scales[i0 / block_k]);
        }
        unsigned b[8];
#pragma unroll
        for (unsigned e = 0; e < 8u; ++e) {
            b[e] = e < valid ? dequant_fp8_bits(q[i0 + e], scales[(i0 + e) / block_k]) : 0u;
        }
        return pack8_bits(b);
    }
};

// Row f of an int4 matrix: its packed nibbles (the low one first) and its groups' scales and
// zero points. i0 is even (chunks of 8), so element i0 + e is nibble e % 2 of byte (i0 + e) / 2.
struct RowInt4 {
    const unsigned char* q;
    const float* scales;
    const unsigned char* zeros;
    unsigned group;
    __device__ __forceinline__ uint4 load8(unsigned i0, unsigned valid) const {
        if (quant_chunk_whole(i0, valid, group) && quant_aligned(q + (i0 >> 1), 4u)) {
            const unsigned g = i0 / group;
            return dequant8_int4(__ldg(reinterpret_cast<const unsigned*>(q + (i0 >> 1))),
                                 zeros[g], scales[g]);
        }
        unsigned b[8];
#pragma unroll
        for (unsigned e = 0; e < 8u; ++e) {
            const unsigned i = i0 + e;
            b[e] = 0u;
            if (e < valid) { // nothing past the row is read
                const unsigned nibble = ((unsigned)q[i >> 1] >> ((i & 1u) * 4u)) & 0xfu;
                b[e] = dequant_int4_bits(nibble, zeros[i / group], scales[i / group]);
            }
        }
        return pack8_bits(b);
    }
};

// An `n × k` fp8 matrix blob (circuit::format `Fp8 { block_n, block_k }`).
struct WFp8 {
    const unsigned char* blob;
    unsigned n;
    unsigned block_n;
    unsigned block_k;
    using Row = RowFp8;
    __device__ __forceinline__ RowFp8 row(unsigned f, unsigned k) const {
        const float* scales =
            reinterpret_cast<const float*>(blob + quant_align((unsigned long long)n * k));
        const unsigned cols = (k + block_k - 1u) / block_k;
        return RowFp8{blob + (unsigned long long)f * k,
                      scales + (unsigned long long)(f / block_n) * cols, block_k};
    }
};

// An `n × k` int4 matrix blob (circuit::format `Int4 { group }`).
struct WInt4 {
    const unsigned char* blob;
    unsigned n;
    unsigned group;
    using Row = RowInt4;
    __device__ __forceinline__ RowInt4 row(unsigned f, unsigned k) const {
        const unsigned groups = (k + group - 1u) / group;
        const unsigned long long scales_at = quant_align((unsigned long long)n * k / 2u);
        const unsigned long long zeros_at =
            quant_align(scales_at + (unsigned long long)n * groups * 4u);
        const unsigned long long g0 = (unsigned long long)f * groups;
        return RowInt4{blob + (unsigned long long)f * k / 2u,
                       reinterpret_cast<const float*>(blob + scales_at) + g0,
                       blob + zeros_at + g0, group};
    }
};

// ---- stacked expert matrices (moe's quantized entries and gemm's experts) -----------------
//
// A stacked blob of `[experts][n][k]` holds matrix e at e · stride (each matrix's values,
// scales and zero points as a quantized matrix lays them out, its bytes rounded up to 256),
// passed as 32-bit words (the device's bytes, little endian).

// e4m3 (fn: no infinities, S.1111.111 is NaN) → f32, exactly, in integer code.
__device__ __forceinline__ float moe_e4m3_to_f32(unsigned q) {
    const unsigned sign = (q & 0x80u) << 24;
    const unsigned e = (q >> 3) & 0xfu;
    const unsigned m = q & 7u;
    if (e == 15u && m == 7u) {
        return __uint_as_float(sign | 0x7fc00000u);
    }
    if (e != 0u) {
        return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
    }
    if (m == 0u) {
        return __uint_as_float(sign);
    }
    // Subnormal m · 2^-9: the leading bit p of m gives 2^(p − 9) · (1 + rest / 2^p).
    const unsigned p = m >= 4u ? 2u : (m >= 2u ? 1u : 0u);
    return __uint_as_float(sign | ((p + 118u) << 23) | ((m - (1u << p)) << (23u - p)));
}

__device__ __forceinline__ unsigned long long moe_align256(unsigned long long x) {
    return (x + 255ull) & ~255ull;
}

// One fp8 expert matrix [n, k] of a stacked blob: byte q of (f, i) at values[f·k + i].
struct MoeFp8Matrix {
    const unsigned char* values;
    const float* scales;
    unsigned k;
    unsigned block_n;
    unsigned block_k;
    unsigned kblocks; // ⌈k / block_k⌉

    // The byte stride between experts of an [n, k] matrix stack.
    __device__ __forceinline__ static unsigned long long stride(unsigned n, unsigned k, unsigned block_n,
                                                unsigned block_k) {
        const unsigned long long values = (unsigned long long)n * k;
        const unsigned long long scales = (unsigned long long)((n + block_n - 1u) / block_n) *
                                          ((k + block_k - 1u) / block_k);
        return moe_align256(moe_align256(values) + scales * 4ull);
    }

    __device__ __forceinline__ MoeFp8Matrix(const unsigned* blob, unsigned e, unsigned n, unsigned k_,
                            unsigned block_n_, unsigned block_k_)
        : k(k_), block_n(block_n_), block_k(block_k_), kblocks((k_ + block_k_ - 1u) / block_k_) {
        const unsigned char* base = reinterpret_cast<const unsigned char*>(blob) +
                                    (unsigned long long)e * stride(n, k_, block_n_, block_k_);
        values = base;
        scales = reinterpret_cast<const float*>(base + moe_align256((unsigned long long)n * k_));
    }

    // One weight's bf16 bits from its code and its block's scale.
    __device__ __forceinline__ static unsigned bits(unsigned code, float s) {
        return bf16_bits(to_bf16(__fmul_rn(moe_e4m3_to_f32(code), s)));
    }

    // Row f's dequantised weights i0 .. i0 + 8 as load8_bits packs bf16 (past `valid`: +0),
    // the row's codes and block row of scales found once; a chunk whole in one block on the
    // fast path (quant_chunk_whole: one load, one scale, the same bits).
    __device__ __forceinline__ uint4 load8(unsigned f, unsigned i0, unsigned valid) const {
        const unsigned char* q = values + (unsigned long long)f * k + i0;
        const float* srow = scales + (unsigned long long)(f / block_n) * kblocks;
        unsigned b[8];
        if (quant_chunk_whole(i0, valid, block_k) && quant_aligned(q, 8u)) {
            const float s = srow[i0 / block_k];
            const uint2 codes = __ldg(reinterpret_cast<const uint2*>(q));
#pragma unroll
            for (unsigned e = 0; e < 8u; ++e) {
                b[e] = bits(((e < 4u ? codes.x : codes.y) >> ((e & 3u) * 8u)) & 0xffu, s);
            }
        } else {
#pragma unroll
            for (unsigned e = 0; e < 8u; ++e) {
                b[e] = e < valid ? bits(q[e], srow[(i0 + e) / block_k]) : 0u;
            }
        }
        return pack8_bits(b);
    }
};

// One int4 expert matrix [n, k] of a stacked blob.
struct MoeInt4Matrix {
    const unsigned char* values;
    const float* scales;
    const unsigned char* zeros;
    unsigned k;
    unsigned group;
    unsigned groups; // ⌈k / group⌉ per row

    __device__ __forceinline__ static unsigned long long scales_at(unsigned n, unsigned k) {
        return moe_align256((unsigned long long)n * (k / 2u));
    }

    __device__ __forceinline__ static unsigned long long zeros_at(unsigned n, unsigned k, unsigned group) {
        const unsigned long long count = (unsigned long long)n * ((k + group - 1u) / group);
        return moe_align256(scales_at(n, k) + count * 4ull);
    }

    __device__ __forceinline__ static unsigned long long stride(unsigned n, unsigned k, unsigned group) {
        const unsigned long long count = (unsigned long long)n * ((k + group - 1u) / group);
        return moe_align256(zeros_at(n, k, group) + count);
    }

    __device__ __forceinline__ MoeInt4Matrix(const unsigned* blob, unsigned e, unsigned n, unsigned k_,
                             unsigned group_)
        : k(k_), group(group_), groups((k_ + group_ - 1u) / group_) {
        const unsigned char* base = reinterpret_cast<const unsigned char*>(blob) +
                                    (unsigned long long)e * stride(n, k_, group_);
        values = base;
        scales = reinterpret_cast<const float*>(base + scales_at(n, k_));
        zeros = base + zeros_at(n, k_, group_);
    }

    __device__ __forceinline__ unsigned short weight_bits(unsigned f, unsigned i) const {
        const unsigned byte = values[(unsigned long long)f * (k / 2u) + i / 2u];
        const int q = (int)((i & 1u) != 0u ? byte >> 4 : byte & 0xfu);
        const unsigned long long g = (unsigned long long)f * groups + i / group;
        const int z = (int)zeros[g];
        return bf16_bits(to_bf16(__fmul_rn((float)(q - z), scales[g])));
    }

    __device__ __forceinline__ unsigned pair(unsigned f, unsigned i0, unsigned valid,
                                             unsigned j) const {
        const unsigned lo = j < valid ? weight_bits(f, i0 + j) : 0u;
        const unsigned hi = j + 1u < valid ? weight_bits(f, i0 + j + 1u) : 0u;
        return lo | (hi << 16);
    }

    // Row f's dequantised weights i0 .. i0 + 8 (i0 even) as load8_bits packs bf16 (past
    // `valid`: +0); a chunk whole in one group on the fast path (quant_chunk_whole: one load,
    // one scale and zero point, weight_bits's arithmetic).
    __device__ __forceinline__ uint4 load8(unsigned f, unsigned i0, unsigned valid) const {
        const unsigned char* q = values + (unsigned long long)f * (k / 2u) + (i0 >> 1);
        if (quant_chunk_whole(i0, valid, group) && quant_aligned(q, 4u)) {
            const unsigned long long g = (unsigned long long)f * groups + i0 / group;
            return dequant8_int4(__ldg(reinterpret_cast<const unsigned*>(q)), zeros[g], scales[g]);
        }
        return make_uint4(pair(f, i0, valid, 0u), pair(f, i0, valid, 2u),
                          pair(f, i0, valid, 4u), pair(f, i0, valid, 6u));
    }
};
