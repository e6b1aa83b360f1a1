// Host emulation of the CUDA C subset solder's kernels use, so that g++ (C++20) compiles
// crates/kernels/cuda/*.cu unchanged for the host and each kernel can be run on the CPU and
// compared, launch by launch, with its Rust twin (`cargo xtask emu`, `parity --backend emu`).
//
// Execution model: a grid's blocks run one after another; a block's threads run as fibers
// (ucontext) on the launching OS thread, each until it reaches a barrier or exits, in thread
// order. So every run is deterministic, `__shared__` is `static` storage (correct while one
// block runs at a time: launches are serialised by a lock), and threadIdx/blockIdx are
// values the scheduler sets before it resumes a fiber. A fiber switch on x86-64 is a few
// instructions (callee-saved registers and the stack pointer; ucontext elsewhere, whose
// signal-mask syscalls made it 10x slower). Barriers:
//   - `__syncthreads` / `__syncthreads_or`: every thread of the block that has not exited;
//     a thread that exits leaves the barrier (arrive-and-drop, as exited threads do on sm_70+);
//   - `__shfl_*_sync`: a per-warp exchange with a warp barrier over the warp's live lanes;
//     reading a lane that has exited is an error (undefined on a GPU).
// A barrier no live thread set can complete (lanes of a warp split between a warp exchange
// and a block barrier) fails the launch naming the kernel, block and warp; it never hangs.
// Dynamic shared memory (`extern __shared__`) is one buffer that every such name of a module
// starts at, as on a device; each block finds the launch's `shared_bytes` of it poisoned
// (every byte 0xff: a NaN in bf16 and f32), so a read before a write shows in the outputs, and
// every byte past them too, so a read past the launch's size does; a launch that wrote past
// them fails, naming the first byte. Static `__shared__` storage is poisoned too, in each block
// where a thread first reaches its declaration (the generator adds `EMU_POISON_SHARED` after
// each): a device's shared memory starts with whatever an earlier block left, never zeros.
//
// Numerics: every __f*_rn intrinsic is the exact IEEE host operation (compile with
// -ffp-contract=off and no fast-math; CUDA's default prec-div/prec-sqrt and no flush-to-zero
// match); fma/fmaf are glibc's correctly rounded ones. expf/log1pf resolve to glibc's, which is
// what Rust's f32::exp/ln_1p call, so the twins and the emulation agree; a real GPU's expf may
// differ from glibc's by an ulp or two (CUDA documents 2 ulp), which only a device run sees.
// f32 -> bf16 is round to nearest even, NaN to the canonical 0x7fff (as cvt.rn.bf16.f32).
#pragma once

// Standard headers first: the CUDA keyword macros below (__noinline__ in particular) would
// break libstdc++'s own attributes.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>

// ---- keywords ------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
// __restrict__ is a g++ keyword already.

// ---- vector types and built-in indices -----------------------------------------------------
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned x, y;
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// Plain globals, each library's own (hidden: EMU_EXPORT): launches in a module are
// serialised (emu::launch_lock) and its fibers run on the launching thread, so one set of
// indices is live at a time.
inline uint3 threadIdx{0, 0, 0};
inline uint3 blockIdx{0, 0, 0};
inline dim3 blockDim{1, 1, 1};
inline dim3 gridDim{1, 1, 1};

// ---- bf16 ----------------------------------------------------------------------------------
struct __nv_bfloat16 {
    unsigned short __x;
};
inline float __bfloat162float(__nv_bfloat16 b) {
    return std::bit_cast<float>(static_cast<unsigned>(b.__x) << 16);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned u = std::bit_cast<unsigned>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return __nv_bfloat16{0x7fffu};
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{static_cast<unsigned short>(u >> 16)};
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return __nv_bfloat16{x}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }

// ---- bit casts and IEEE intrinsics ---------------------------------------------------------
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __double2float_rn(double d) { return static_cast<float>(d); }
// expf, log1pf, fmaxf, fmaf, fma, rint: glibc's, declared globally by <cmath> (<math.h>).

// CUDA's integer min/max take mixed signedness through the usual conversions.
template <class A, class B>
    requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B>)
inline std::common_type_t<A, B> min(A a, B b) {
    using C = std::common_type_t<A, B>;
    return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <class A, class B>
    requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B>)
inline std::common_type_t<A, B> max(A a, B b) {
    using C = std::common_type_t<A, B>;
    return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}

// ---- memory --------------------------------------------------------------------------------
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
// One OS thread runs the whole grid, so a fence only has to stop the compiler.
inline void __threadfence() { std::atomic_signal_fence(std::memory_order_seq_cst); }
template <class T> inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}

// ---- the block scheduler -------------------------------------------------------------------
namespace emu {

constexpr unsigned kWarp = 32;
constexpr size_t kStackBytes = 256 * 1024;
constexpr unsigned kMaxThreads = 1024;
// sm_90's largest dynamic shared memory per block.
constexpr size_t kMaxDynamicShared = 227 * 1024;

enum class State { Ready, AtBlock, AtWarp, Done };

#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its pointer in *save, and
// resumes the stack at `load` (which a previous switch saved or `prepare` built).
extern "C" void emu_switch_stacks(void** save, void* load);
asm(R"(
    .text
    .globl emu_switch_stacks
    .hidden emu_switch_stacks
    .type emu_switch_stacks, @function
emu_switch_stacks:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_stacks, .-emu_switch_stacks
)");
struct Context {
    void* sp = nullptr;
};
#else
struct Context {
    ucontext_t ctx;
};
#endif

// A cp.async copy not yet landed: 16 bytes from src to dst, in this thread's group `group`
// (its count of commits when the copy was issued).
struct AsyncCopy {
    void* dst;
    const void* src;
    unsigned long long group;
};

struct Fiber {
    Context ctx;
    State state = State::Ready;
    void* stack = nullptr;
    unsigned long long slot = 0; // the value this lane offers to a warp exchange
    unsigned long long got = 0;  // the value it receives
    unsigned src = 0;            // the lane it reads
    uint3 idx{0, 0, 0};          // its threadIdx
    std::vector<AsyncCopy> copies; // its cp.async copies not yet landed, in issue order
    unsigned long long groups = 0; // its cp.async commits
};

struct Block {
    Context scheduler;
    Fiber fibers[kMaxThreads];
    unsigned threads = 0;
    unsigned current = 0;
    int or_acc = 0;
    int or_result = 0;
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
    char error[512] = {0};
};

// One block at a time in this module (its __shared__ storage is static).
inline std::mutex launch_lock;
inline Block block_state;

// The block being run, counted over the module's launches: a static `__shared__` variable is
// poisoned by the first thread of each block that reaches its declaration.
inline unsigned long long block_serial = 0;

// Dynamic shared memory: every `extern __shared__` name of the module points at its start.
// `uses_dynamic_shared`: whether the module declares one (set as its library loads).
alignas(16) inline unsigned char dynamic_shared[kMaxDynamicShared];
inline bool uses_dynamic_shared = false;
// What a byte of dynamic shared memory holds before the block writes it.
constexpr unsigned char kPoison = 0xff;
template <class T> inline T* dynamic_shared_as() {
    uses_dynamic_shared = true;
    return reinterpret_cast<T*>(dynamic_shared);
}

inline Fiber& self() { return block_state.fibers[block_state.current]; }

inline void switch_to(Context& save, Context& load) {
#if defined(__x86_64__)
    emu_switch_stacks(&save.sp, load.sp);
#else
    swapcontext(&save.ctx, &load.ctx);
#endif
}

inline void yield_to_scheduler() { switch_to(self().ctx, block_state.scheduler); }

inline void fail(const char* what) {
    if (block_state.error[0] == 0) {
        std::snprintf(block_state.error, sizeof block_state.error, "%s", what);
    }
}

[[noreturn]] inline void fiber_entry() {
    block_state.body(block_state.body_arg);
    self().state = State::Done;
    yield_to_scheduler();
    __builtin_unreachable(); // a finished fiber is never resumed
}

// A fresh context that starts `fiber_entry` on `stack`.
inline void prepare(Context& c, void* stack, size_t bytes) {
#if defined(__x86_64__)
    // From the top (16-aligned): a null return address for fiber_entry (so its rsp is 8 mod
    // 16, as after a call), the address `ret` jumps to, six zeroed callee-saved registers.
    void** sp = reinterpret_cast<void**>(static_cast<char*>(stack) + bytes);
    *--sp = nullptr;
    *--sp = reinterpret_cast<void*>(&fiber_entry);
    for (int i = 0; i < 6; ++i) *--sp = nullptr;
    c.sp = sp;
#else
    getcontext(&c.ctx);
    c.ctx.uc_stack.ss_sp = stack;
    c.ctx.uc_stack.ss_size = bytes;
    c.ctx.uc_link = nullptr;
    makecontext(&c.ctx, reinterpret_cast<void (*)()>(&fiber_entry), 0);
#endif
}

// Completes a warp exchange all of whose live lanes w0..w1 arrived: each lane receives the
// value its source lane offered. False (with `error` set) if a source lane has exited.
inline bool exchange_warp(unsigned w0, unsigned w1) {
    Block& b = block_state;
    for (unsigned t = w0; t < w1; ++t) {
        Fiber& f = b.fibers[t];
        if (f.state == State::Done) continue;
        const unsigned from = w0 + f.src;
        if (f.src >= kWarp || from >= w1 || b.fibers[from].state == State::Done) {
            char msg[160];
            std::snprintf(msg, sizeof msg,
                          "thread %u reads lane %u of its warp in a shuffle, which has exited or "
                          "does not exist",
                          t, f.src);
            fail(msg);
            return false;
        }
        f.got = b.fibers[from].slot;
    }
    for (unsigned t = w0; t < w1; ++t) {
        if (b.fibers[t].state == State::AtWarp) b.fibers[t].state = State::Ready;
    }
    return true;
}

// Runs one block of `threads` threads to completion; false (with `error` set) on a deadlock
// or a bad exchange. Warp by warp: a warp's lanes run in order until each is at the block
// barrier or done, its exchanges completed as they fill; then the block barrier releases.
inline bool run_block(unsigned threads, dim3 block) {
    Block& b = block_state;
    b.threads = threads;
    b.or_acc = 0;
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = b.fibers[t];
        if (f.stack == nullptr) {
            void* stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (stack == MAP_FAILED) {
                fail("cannot map a fiber stack");
                return false;
            }
            f.stack = stack;
        }
        prepare(f.ctx, f.stack, kStackBytes);
        f.state = State::Ready;
        // A copy a thread of the previous block never waited for never lands.
        f.copies.clear();
        f.groups = 0;
        f.idx = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    }
    for (;;) {
        unsigned live = 0;
        for (unsigned w0 = 0; w0 < threads; w0 += kWarp) {
            const unsigned w1 = std::min(threads, w0 + kWarp);
            for (;;) {
                for (unsigned t = w0; t < w1; ++t) {
                    Fiber& f = b.fibers[t];
                    if (f.state != State::Ready) continue;
                    threadIdx = f.idx;
                    b.current = t;
                    switch_to(b.scheduler, f.ctx);
                }
                if (b.error[0] != 0) return false;
                unsigned lanes = 0, at_warp = 0;
                for (unsigned t = w0; t < w1; ++t) {
                    const State s = b.fibers[t].state;
                    lanes += s != State::Done;
                    at_warp += s == State::AtWarp;
                }
                if (at_warp == 0) break;
                if (at_warp != lanes) {
                    char msg[200];
                    std::snprintf(msg, sizeof msg,
                                  "deadlock: in warp %u, %u live lanes wait at a warp exchange "
                                  "and %u at __syncthreads",
                                  w0 / kWarp, at_warp, lanes - at_warp);
                    fail(msg);
                    return false;
                }
                if (!exchange_warp(w0, w1)) return false;
            }
            for (unsigned t = w0; t < w1; ++t) live += b.fibers[t].state != State::Done;
        }
        if (live == 0) return true;
        // Every live thread waits at the block barrier.
        b.or_result = b.or_acc;
        b.or_acc = 0;
        for (unsigned t = 0; t < threads; ++t) {
            if (b.fibers[t].state == State::AtBlock) b.fibers[t].state = State::Ready;
        }
    }
}

template <class T> inline T exchange(T v, unsigned src_lane) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
    Fiber& f = self();
    f.slot = 0;
    std::memcpy(&f.slot, &v, sizeof(T));
    f.src = src_lane;
    f.state = State::AtWarp;
    yield_to_scheduler();
    T out;
    std::memcpy(&out, &self().got, sizeof(T));
    return out;
}

} // namespace emu

inline void __syncthreads() {
    emu::self().state = emu::State::AtBlock;
    emu::yield_to_scheduler();
}
inline int __syncthreads_or(int predicate) {
    emu::block_state.or_acc |= predicate != 0 ? 1 : 0;
    emu::self().state = emu::State::AtBlock;
    emu::yield_to_scheduler();
    return emu::block_state.or_result;
}
// `width` must be 32 (solder's kernels use whole warps); `mask` is not modelled beyond that
// every live lane of the warp takes part (a lane outside it would deadlock and be reported).
template <class T> inline T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask, int width = 32) {
    if (width != 32) emu::fail("__shfl_xor_sync with a width other than 32 is not emulated");
    const unsigned lane = (threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y) % emu::kWarp;
    return emu::exchange(v, lane ^ static_cast<unsigned>(lane_mask));
}
// Every live lane of the warp meets here (an exchange of nothing): the warp-level barrier.
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
    const unsigned lane = (threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y) % emu::kWarp;
    (void)emu::exchange(0u, lane);
}
template <class T> inline T __shfl_sync(unsigned /*mask*/, T v, int src_lane, int width = 32) {
    if (width != 32) emu::fail("__shfl_sync with a width other than 32 is not emulated");
    return emu::exchange(v, static_cast<unsigned>(src_lane) % emu::kWarp);
}

// ---- cp.async: copies held back until the thread waits for their group ---------------------
// A device may land a copy at any point before the wait that completes its group; the model
// lands it at the latest, in that wait, so shared memory read before the wait (and, by another
// thread, before the barrier after it) holds what it held before: a missing wait shows in the
// outputs as poison (every block's shared memory starts poisoned) or a stale tile. The source is
// read when the copy lands. A copy a thread never waits for never lands.
inline void emu_cp_async16(void* smem, const void* gmem) {
    if (reinterpret_cast<std::uintptr_t>(smem) % 16 != 0 ||
        reinterpret_cast<std::uintptr_t>(gmem) % 16 != 0) {
        emu::fail("cp.async: an address that is not 16-byte aligned");
        return;
    }
    emu::Fiber& f = emu::self();
    f.copies.push_back(emu::AsyncCopy{smem, gmem, f.groups});
}
inline void emu_cp_async_commit() { ++emu::self().groups; }
inline void emu_cp_async_wait(unsigned n) {
    emu::Fiber& f = emu::self();
    // Groups 0 .. groups − n − 1 complete; copies are in issue order, so their groups ascend.
    size_t landed = 0;
    while (landed < f.copies.size() && f.copies[landed].group + n < f.groups) {
        std::memcpy(f.copies[landed].dst, f.copies[landed].src, 16);
        ++landed;
    }
    f.copies.erase(f.copies.begin(), f.copies.begin() + static_cast<std::ptrdiff_t>(landed));
}

// ---- tensor cores: a host model of mma.sync m16n8k16 (bf16, f32 accumulate) and ldmatrix ---
// Both are warp-collective: each lane gathers the fragments it needs from the lanes that hold
// them through the warp exchange (so a lane that has exited, or lanes split between this and a
// block barrier, are reported as for a shuffle), then computes its own outputs. The layouts
// are PTX's (see `mma_bf16_16816` and `ldmatrix_x4` in common.cuh). The arithmetic is one
// definite order a device need not follow: each output starts at c and takes the sixteen
// exact bf16 products with fmaf in k order, so a CPU twin can predict the emulation's bytes.
namespace emu {
inline unsigned lane_id() {
    return (threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y) % kWarp;
}
inline float bf16_lo(unsigned w) { return std::bit_cast<float>(w << 16); }
inline float bf16_hi(unsigned w) { return std::bit_cast<float>(w & 0xffff0000u); }
} // namespace emu

inline void emu_mma_m16n8k16_bf16(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
    const unsigned lane = emu::lane_id();
    const unsigned g = lane >> 2, t = lane & 3;
    const unsigned long long a_lo = a[0] | (static_cast<unsigned long long>(a[1]) << 32);
    const unsigned long long a_hi = a[2] | (static_cast<unsigned long long>(a[3]) << 32);
    const unsigned long long b = b0 | (static_cast<unsigned long long>(b1) << 32);
    float rows[2][16];  // a(g, k), a(g+8, k)
    float cols[2][16];  // b(k, 2t), b(k, 2t+1)
    for (unsigned q = 0; q < 4; ++q) {
        // Lane 4g+q holds a(g, 2q..), a(g+8, 2q..) (a_lo) and a(g, 8+2q..), a(g+8, 8+2q..)
        // (a_hi); lane 4c+q holds b(2q.., c) and b(8+2q.., c).
        const unsigned long long lo = emu::exchange(a_lo, 4 * g + q);
        const unsigned long long hi = emu::exchange(a_hi, 4 * g + q);
        const unsigned long long c0 = emu::exchange(b, 4 * (2 * t) + q);
        const unsigned long long c1 = emu::exchange(b, 4 * (2 * t + 1) + q);
        for (unsigned r = 0; r < 2; ++r) {
            const unsigned low = static_cast<unsigned>(lo >> (32 * r));
            const unsigned high = static_cast<unsigned>(hi >> (32 * r));
            rows[r][2 * q] = emu::bf16_lo(low);
            rows[r][2 * q + 1] = emu::bf16_hi(low);
            rows[r][8 + 2 * q] = emu::bf16_lo(high);
            rows[r][8 + 2 * q + 1] = emu::bf16_hi(high);
        }
        const unsigned long long cs[2] = {c0, c1};
        for (unsigned c = 0; c < 2; ++c) {
            const unsigned first = static_cast<unsigned>(cs[c]);
            const unsigned second = static_cast<unsigned>(cs[c] >> 32);
            cols[c][2 * q] = emu::bf16_lo(first);
            cols[c][2 * q + 1] = emu::bf16_hi(first);
            cols[c][8 + 2 * q] = emu::bf16_lo(second);
            cols[c][8 + 2 * q + 1] = emu::bf16_hi(second);
        }
    }
    for (unsigned i = 0; i < 4; ++i) {
        const float* row = rows[i >> 1];
        const float* col = cols[i & 1];
        float acc = d[i];
        for (unsigned k = 0; k < 16; ++k) acc = std::fmaf(row[k], col[k], acc);
        d[i] = acc;
    }
}

// cvt.rna.tf32.f32: the f32 rounded to 10 mantissa bits, to nearest, ties away from zero
// (half of the dropped 13 bits' range added to the magnitude, then those bits cleared: a carry
// moves into the exponent, and past the largest finite value into infinity). The infinities
// are returned as they are, NaN as the canonical 0x7fffffff.
inline unsigned emu_cvt_rna_tf32(float x) {
    const unsigned bits = std::bit_cast<unsigned>(x);
    if (x != x) return 0x7fffffffu;
    if ((bits & 0x7f800000u) == 0x7f800000u) return bits;
    return (bits + 0x1000u) & 0xffffe000u;
}

// mma.sync m16n8k8 .tf32, f32 accumulate. Lane 4g+q holds a(g, q), a(g+8, q), a(g, q+4),
// a(g+8, q+4) and b(q, g), b(q+4, g); each output starts at c and takes the eight products with
// fmaf in k order. The hardware reads an operand's top 19 bits: so does this model.
inline void emu_mma_m16n8k8_tf32(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
    const unsigned lane = emu::lane_id();
    const unsigned g = lane >> 2, t = lane & 3;
    const unsigned long long a_lo = a[0] | (static_cast<unsigned long long>(a[1]) << 32);
    const unsigned long long a_hi = a[2] | (static_cast<unsigned long long>(a[3]) << 32);
    const unsigned long long b = b0 | (static_cast<unsigned long long>(b1) << 32);
    auto tf32 = [](unsigned w) { return std::bit_cast<float>(w & 0xffffe000u); };
    float rows[2][8];  // a(g, k), a(g+8, k)
    float cols[2][8];  // b(k, 2t), b(k, 2t+1)
    for (unsigned q = 0; q < 4; ++q) {
        const unsigned long long lo = emu::exchange(a_lo, 4 * g + q);
        const unsigned long long hi = emu::exchange(a_hi, 4 * g + q);
        const unsigned long long c0 = emu::exchange(b, 4 * (2 * t) + q);
        const unsigned long long c1 = emu::exchange(b, 4 * (2 * t + 1) + q);
        for (unsigned r = 0; r < 2; ++r) {
            rows[r][q] = tf32(static_cast<unsigned>(lo >> (32 * r)));
            rows[r][q + 4] = tf32(static_cast<unsigned>(hi >> (32 * r)));
        }
        const unsigned long long cs[2] = {c0, c1};
        for (unsigned c = 0; c < 2; ++c) {
            cols[c][q] = tf32(static_cast<unsigned>(cs[c]));
            cols[c][q + 4] = tf32(static_cast<unsigned>(cs[c] >> 32));
        }
    }
    for (unsigned i = 0; i < 4; ++i) {
        const float* row = rows[i >> 1];
        const float* col = cols[i & 1];
        float acc = d[i];
        for (unsigned k = 0; k < 8; ++k) acc = std::fmaf(row[k], col[k], acc);
        d[i] = acc;
    }
}

inline void emu_ldmatrix_x4(unsigned r[4], const __nv_bfloat16* row) {
    const unsigned lane = emu::lane_id();
    if ((reinterpret_cast<unsigned long long>(row) & 15ull) != 0) {
        emu::fail("ldmatrix: a row address that is not 16-byte aligned");
    }
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned char* p = emu::exchange(reinterpret_cast<const unsigned char*>(row), 8 * i + (lane >> 2));
        std::memcpy(&r[i], p + 4 * (lane & 3), 4);
    }
}

// ldmatrix .trans: lane (g, t) = (lane / 4, lane % 4) takes column g of rows 2t and 2t + 1.
inline void emu_ldmatrix_x4_trans(unsigned r[4], const __nv_bfloat16* row) {
    const unsigned lane = emu::lane_id();
    if ((reinterpret_cast<unsigned long long>(row) & 15ull) != 0) {
        emu::fail("ldmatrix: a row address that is not 16-byte aligned");
    }
    const unsigned g = lane >> 2, t = lane & 3;
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned char* lo = emu::exchange(reinterpret_cast<const unsigned char*>(row), 8 * i + 2 * t);
        const unsigned char* hi = emu::exchange(reinterpret_cast<const unsigned char*>(row), 8 * i + 2 * t + 1);
        unsigned short a = 0, b = 0;
        std::memcpy(&a, lo + 2 * g, 2);
        std::memcpy(&b, hi + 2 * g, 2);
        r[i] = static_cast<unsigned>(a) | (static_cast<unsigned>(b) << 16);
    }
}

// ---- launching -----------------------------------------------------------------------------
namespace emu {

// One character per parameter: H, F, I, U (pointers to bf16, float, int, unsigned; P any
// other pointer), i, u, f (int, unsigned, float by value); the Rust side checks its
// arguments against it and reads shadow mode's differences with it.
template <class P> constexpr char param_code() {
    using T = std::remove_cv_t<P>;
    if constexpr (std::is_pointer_v<T>) {
        using E = std::remove_cv_t<std::remove_pointer_t<T>>;
        if constexpr (std::is_same_v<E, __nv_bfloat16>) return 'H';
        else if constexpr (std::is_same_v<E, float>) return 'F';
        else if constexpr (std::is_same_v<E, int>) return 'I';
        else if constexpr (std::is_same_v<E, unsigned>) return 'U';
        else return 'P';
    } else if constexpr (std::is_same_v<T, int>) return 'i';
    else if constexpr (std::is_same_v<T, unsigned>) return 'u';
    else if constexpr (std::is_same_v<T, float>) return 'f';
    else static_assert(sizeof(T) == 0, "a kernel parameter type the emulation cannot pass");
}

template <class... P> struct Signature {
    static constexpr char text[sizeof...(P) + 1] = {param_code<P>()..., '\0'};
};

template <class... P> const char* signature(void (*)(P...)) { return Signature<P...>::text; }

template <class... P, size_t... I>
std::tuple<std::remove_cv_t<P>...> unpack(void** args, std::index_sequence<I...>) {
    std::tuple<std::remove_cv_t<P>...> values;
    ((std::memcpy(&std::get<I>(values), args[I], sizeof(std::get<I>(values)))), ...);
    return values;
}

// Runs the grid; 0 on success, else 1 with a message in `err`.
template <class... P>
int launch(void (*kernel)(P...), void** args, const unsigned* grid, const unsigned* block,
           unsigned shared_bytes, char* err, size_t err_len) {
    std::lock_guard<std::mutex> guard(launch_lock);
    const unsigned long long threads = 1ull * block[0] * block[1] * block[2];
    auto refuse = [&](const char* msg) {
        std::snprintf(err, err_len, "%s", msg);
        return 1;
    };
    if (threads == 0 || threads > kMaxThreads) return refuse("block of 0 or more than 1024 threads");
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return refuse("a grid dimension is 0");
    if (shared_bytes > kMaxDynamicShared) return refuse("dynamic shared memory above 227 KiB");
    using Values = std::tuple<std::remove_cv_t<P>...>;
    Values values = unpack<P...>(args, std::index_sequence_for<P...>{});
    struct Call {
        void (*kernel)(P...);
        Values* values;
    } call{kernel, &values};
    block_state.body = [](void* arg) {
        Call* c = static_cast<Call*>(arg);
        std::apply(c->kernel, *c->values);
    };
    block_state.body_arg = &call;
    block_state.error[0] = 0;
    gridDim = dim3{grid[0], grid[1], grid[2]};
    blockDim = dim3{block[0], block[1], block[2]};
    // Past the launch's bytes: poisoned once, and must stay so.
    if (uses_dynamic_shared) {
        std::memset(dynamic_shared + shared_bytes, kPoison, kMaxDynamicShared - shared_bytes);
    }
    for (unsigned z = 0; z < grid[2]; ++z) {
        for (unsigned y = 0; y < grid[1]; ++y) {
            for (unsigned x = 0; x < grid[0]; ++x) {
                blockIdx = uint3{x, y, z};
                // A block's shared memory holds nothing it can rely on.
                ++block_serial;
                if (uses_dynamic_shared) std::memset(dynamic_shared, kPoison, shared_bytes);
                if (!run_block(static_cast<unsigned>(threads), blockDim)) {
                    std::snprintf(err, err_len, "block (%u, %u, %u): %s", x, y, z,
                                  block_state.error);
                    return 1;
                }
            }
        }
    }
    if (uses_dynamic_shared) {
        for (size_t i = shared_bytes; i < kMaxDynamicShared; ++i) {
            if (dynamic_shared[i] != kPoison) {
                std::snprintf(err, err_len,
                              "a block wrote byte %zu of dynamic shared memory, past the %u "
                              "bytes the launch asked for",
                              i, shared_bytes);
                return 1;
            }
        }
    }
    return 0;
}

} // namespace emu

// The exported pair of one kernel: `emu_<module>__<kernel>` runs it, `..._sig` names its
// parameter kinds. They are the library's only visible symbols (it is built with
// -fvisibility=hidden): the emulator's globals (indices, the launch lock, `__shared__`
// storage) stay the library's own, not one process-wide copy the loader binds every
// library to, so libraries loaded apart run their launches side by side.
#define EMU_EXPORT extern "C" __attribute__((visibility("default")))
#define EMU_TRAMPOLINE(module, kernel)                                                          \
    EMU_EXPORT int emu_##module##__##kernel(void** args, const unsigned* grid,                  \
                                            const unsigned* block, unsigned shared_bytes,       \
                                            char* err, size_t err_len) {                        \
        return emu::launch(&kernel, args, grid, block, shared_bytes, err, err_len);             \
    }                                                                                           \
    EMU_EXPORT const char* emu_##module##__##kernel##__sig() { return emu::signature(&kernel); }

// `extern __shared__ T name[];` (dynamic shared memory) as the generator rewrites it: a
// pointer to the module's one buffer (`emu::dynamic_shared`), as every such name is on a
// device.
#define EMU_DYNAMIC_SHARED(T, name) static T* const name = emu::dynamic_shared_as<T>()

// After each static `__shared__` declaration (the generator adds it on the same line): the
// first thread of each block to reach it poisons the variable's bytes.
#define EMU_POISON_SHARED(name)                                                                \
    static unsigned long long name##_emu_block = 0;                                            \
    if (name##_emu_block != emu::block_serial) {                                               \
        std::memset(static_cast<void*>(&name), emu::kPoison, sizeof(name));                    \
        name##_emu_block = emu::block_serial;                                                  \
    }
