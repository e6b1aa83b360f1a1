// `gdn` module: the gated DeltaNet (linear attention) layers of Qwen3-Next: the causal
// depthwise conv over the q/k/v channels, the per-head gates, the gated delta rule recurrence
// and the gated RMSNorm of its output.
//
// Geometry: nk key heads of dk, nv value heads of dv (nv a multiple of nk, ratio = nv / nk), a
// qkvz row of nk groups `[q dk | k dk | v ratio·dv | z ratio·dv]`, a conv channel row
// `[q kd | k kd | v vd]` (kd = nk·dk, vd = nv·dv). State lives in slots (slots i32[rows]): the
// conv history bf16 `[num_slots][C][kernel − 1]` (oldest first), the recurrent state f32
// `[num_slots][nv][dk][dv]`. A row's unit reads its state from its slot and writes the advanced
// state to its out slot (out_slots i32[rows], indexed as slots): the same slot advances it in
// place, another leaves the slot read untouched (a failed step's state is still there). A
// unit's later rows continue from the state its earlier rows advanced (held in registers and
// shared memory, or, in the conv, read back from the out slot). chain = 0: row r is its own
// sequence on slots[r]; chain = 1: the
// rows are consecutive tokens of one sequence on slots[0], run in order; chain = 2
// (verify_batch): each run of consecutive rows on one slot is one sequence's consecutive
// tokens, run in order by the block row of the run's first row (runs in parallel). Snapshots
// (optional) receive the row's slot state after the row, for the rows whose keep flag
// (keep i32[rows], optional: every row without it; the step's keep-snapshots metadata) is not
// 0: a verify program keeps them in a speculative step only.
//
// Launch (ops/gdn.rs):
//  - conv: grid (⌈C/256⌉, rows, or ⌈rows/16⌉ row blocks with chain 1), 256 threads, one thread
//    per channel (conv_chain: with chain 1 the rows split over block rows);
//  - gates: elementwise over rows·nv;
//  - recurrence, recurrence_pitched (and gates_recurrence, _pitched: gates folded in): grid (nv·⌈dv/32⌉, rows, or 1 with chain 1), one warp;
//    lane t of block (head, tile) owns state column j = 32·tile + t of the head (a column of S
//    evolves on its own: kv_mem[j], delta[j], the update and out[j] read only column j), so no
//    cross-thread reduction touches the state; dk <= 256 (the block's columns staged in 32 KB
//    of shared memory);
//  - chunked, gates_chunked (the `gdn_chunked` lever) and chunked_mma, gates_chunked_mma (its
//    products on the tensor cores, with `tensor_cores`): grid (nv·⌈dv/jc⌉, row blocks as the
//    recurrence's), 256 threads, jc = 32 state columns a block (8 past dk 128), dynamic shared
//    memory under 48 KB (see "chunked recurrence");
//  - gated_norm: one warp per (row, v head), 8 per block.
//
// chain = 0 with several rows on one slot (padding rows on a scratch slot): the CPU twin runs
// them in order; here only the first row on a slot (the lowest r) advances the state, the later
// ones write zeros to their outputs and snapshots and touch no state, so the result is
// deterministic and no block races another on a slot. With chain = 2 the same holds per run:
// only the first run on a slot advances it (the CPU twin refuses a slot in two runs). A slot
// outside 0..num_slots, or an out slot outside it (refused by the CPU twin), is treated the same
// way. The twin also refuses out slots that would race (two units writing one slot, or one
// writing a slot another reads); here they are undefined.
#include "common.cuh"

// Programmatic dependent launch (common.cuh): every kernel here waits for the previous grid at
// entry, before any early return or buffer access, then lets the next launch be scheduled at
// once (its blocks run only their weight prologue before their own wait, so the earliest
// trigger hides the most of its launch behind this kernel; it never makes a write visible
// sooner).

#define GDN_MAX_DK 256u
#define GDN_L2NORM_EPS 1e-6f

// Head geometry: `GdnHeads` (common.cuh, shared with gemv's gated-norm source).

// Whether row r (chain 0) is the first row on its slot, by the whole block: true when no row
// r' < r has slots[r'] == slot. Every thread of the block must call it.
__device__ __forceinline__ bool first_on_slot(const int* __restrict__ slots, unsigned r, int slot) {
    int dup = 0;
    for (unsigned i = threadIdx.x; i < r; i += blockDim.x) {
        dup |= slots[i] == slot ? 1 : 0;
    }
    return __syncthreads_or(dup) == 0;
}

__device__ __forceinline__ bool slot_ok(int slot, unsigned num_slots) {
    return slot >= 0 && (unsigned)slot < num_slots;
}

// ---- conv ----------------------------------------------------------------------------------

// A dead row's channel (no live slot): zero output and snapshot, the history untouched.
__device__ __forceinline__ void conv_dead(bf16* o, bf16* snap, unsigned hist) {
    const bf16 zero = to_bf16(0.0f);
    *o = zero;
    if (snap != nullptr) {
        for (unsigned i = 0; i < hist; ++i) {
            snap[i] = zero;
        }
    }
}

// One row of the conv for this thread's channels (c = blockIdx.x·blockDim.x + t, grid-stride
// over grid.x): the SiLU of the causal dot over (history, x), the history read from slot
// `from`, then written with x entered to slot `to` (the same slot: in place; the shift runs
// ascending, so it reads each entry before it is overwritten). With `live` false: zeros to out
// and the snapshot, the state untouched.
__device__ __forceinline__ void conv_row(const GdnHeads& g, const bf16* __restrict__ qkvz,
                                         const bf16* __restrict__ w, bf16* __restrict__ state,
                                         bf16* __restrict__ out, bf16* __restrict__ snapshots,
                                         unsigned r, int from, int to, bool live,
                                         unsigned kernel) {
    const unsigned hist = kernel - 1u;
    const unsigned long long slot_elems = (unsigned long long)g.channels * hist;
    // `snapshots` is null here for a row whose keep flag is 0 (`kept_snapshots`).
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < g.channels;
         c += gridDim.x * blockDim.x) {
        bf16* o = out + (unsigned long long)r * g.channels + c;
        bf16* snap = snapshots != nullptr
                         ? snapshots + (unsigned long long)r * slot_elems + (unsigned long long)c * hist
                         : nullptr;
        if (!live) {
            conv_dead(o, snap, hist);
            continue;
        }
        const unsigned long long channel = (unsigned long long)c * hist;
        const bf16* hin = state + (unsigned long long)from * slot_elems + channel;
        bf16* h = state + (unsigned long long)to * slot_elems + channel;
        const bf16* wc = w + (unsigned long long)c * kernel;
        const bf16 x = qkvz[(unsigned long long)r * g.qkvz_row + g.channel_source(c)];
        float acc = 0.0f;
        for (unsigned i = 0; i < hist; ++i) {
            acc = __fadd_rn(acc, __fmul_rn(to_f32(wc[i]), to_f32(hin[i])));
        }
        acc = __fadd_rn(acc, __fmul_rn(to_f32(wc[hist]), to_f32(x)));
        for (unsigned i = 0; i + 1u < hist; ++i) {
            h[i] = hin[i + 1u];
        }
        h[hist - 1u] = x;
        if (snap != nullptr) {
            for (unsigned i = 0; i < hist; ++i) {
                snap[i] = h[i];
            }
        }
        *o = to_bf16(silu_f32(acc));
    }
}

// The snapshots row r writes to: `snapshots` unless its keep flag is 0 (keep null: every row
// keeps its snapshot), else null.
template <typename T>
__device__ __forceinline__ T* kept_snapshots(T* snapshots, const int* __restrict__ keep,
                                             unsigned r) {
    return keep != nullptr && keep[r] == 0 ? nullptr : snapshots;
}

// chain 1: the rows are one sequence's consecutive tokens on slots[0] (its new history to
// out_slots[0]). The conv is not
// recurrent: row r's dot reads the inputs of rows r − hist .. r (those before row 0 from the
// history), so the rows split over block rows: block row y takes rows [y·span, y·span +
// span), span = max(⌈rows / grid.y⌉, hist), each thread its channels' rows in order. Row r's
// dot, output and snapshot are conv_row's (the history it would hold then: the inputs of rows
// r − hist .. r − 1, oldest first). Only block row 0 reads the history (span >= hist), and its
// threads write the new one (the last hist inputs) after their own reads, so no block races
// another on it (nor reads a history another block row writes: the out slot is read only
// through the old history's entries, and only by block row 0, before its writes).
__device__ __forceinline__ void conv_chain(const GdnHeads& g, const bf16* __restrict__ qkvz,
                                           const bf16* __restrict__ w, bf16* __restrict__ state,
                                           const int* __restrict__ slots,
                                           const int* __restrict__ out_slots,
                                           bf16* __restrict__ out,
                                           bf16* __restrict__ snapshots,
                                           const int* __restrict__ keep, unsigned rows,
                                           unsigned kernel, unsigned num_slots) {
    const unsigned hist = kernel - 1u;
    const unsigned span = max((rows - 1u) / gridDim.y + 1u, hist);
    const unsigned long long r0 = (unsigned long long)blockIdx.y * span;
    if (r0 >= rows) {
        return;
    }
    const unsigned r1 = (unsigned)min(r0 + span, (unsigned long long)rows);
    const int slot = slots[0];
    const int to = out_slots[0];
    const bool live = slot_ok(slot, num_slots) && slot_ok(to, num_slots);
    const unsigned long long slot_elems = (unsigned long long)g.channels * hist;
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < g.channels;
         c += gridDim.x * blockDim.x) {
        const unsigned long long channel = (unsigned long long)c * hist;
        const bf16* h = live ? state + (unsigned long long)slot * slot_elems + channel : nullptr;
        const unsigned src = g.channel_source(c);
        const bf16* wc = w + (unsigned long long)c * kernel;
        // Input of row j (j < 0: the history's, oldest first).
        auto input = [&](long long j) -> bf16 {
            return j < 0 ? h[hist + j] : qkvz[(unsigned long long)j * g.qkvz_row + src];
        };
        for (unsigned r = (unsigned)r0; r < r1; ++r) {
            bf16* o = out + (unsigned long long)r * g.channels + c;
            bf16* snap = kept_snapshots(snapshots, keep, r);
            snap = snap != nullptr ? snap + (unsigned long long)r * slot_elems +
                                         (unsigned long long)c * hist
                                   : nullptr;
            if (!live) {
                conv_dead(o, snap, hist);
                continue;
            }
            float acc = 0.0f;
            for (unsigned i = 0; i < hist; ++i) {
                acc = __fadd_rn(acc, __fmul_rn(to_f32(wc[i]), to_f32(input((long long)r - hist + i))));
            }
            acc = __fadd_rn(acc, __fmul_rn(to_f32(wc[hist]), to_f32(input(r))));
            if (snap != nullptr) {
                for (unsigned i = 0; i < hist; ++i) {
                    snap[i] = input((long long)r + 1 - hist + i);
                }
            }
            *o = to_bf16(silu_f32(acc));
        }
        if (live && blockIdx.y == 0u) {
            // Ascending: entry i takes row rows − hist + i's input, which (before row 0) is
            // entry rows + i of the old history, not yet overwritten when written in place.
            bf16* hout = state + (unsigned long long)to * slot_elems + channel;
            for (unsigned i = 0; i < hist; ++i) {
                hout[i] = input((long long)rows - hist + i);
            }
        }
    }
}

// Depthwise causal conv (width `kernel` >= 2) + SiLU of each row's q/k/v channels, gathered
// from qkvz bf16[rows·nk·group]; w bf16[C·kernel]; state bf16 (read-write; each unit reads
// slots', writes out_slots' entry); out bf16[rows·C];
// snapshots bf16[rows·C·(kernel − 1)] (optional), for the rows `keep` keeps. A thread owns a
// channel's history, so with chain the block row walks the rows in order with no
// synchronisation.
extern "C" __global__ void __launch_bounds__(256) conv(
    const bf16* __restrict__ qkvz, const bf16* __restrict__ w, bf16* __restrict__ state,
    const int* __restrict__ slots, const int* __restrict__ out_slots, bf16* __restrict__ out,
    bf16* __restrict__ snapshots,
    const int* __restrict__ keep, unsigned rows, unsigned nk, unsigned dk, unsigned nv,
    unsigned dv, unsigned kernel, unsigned num_slots, unsigned chain) {
    pdl_wait();
    pdl_launch_dependents();
    GdnHeads g;
    if (!g.init(nk, dk, nv, dv) || kernel < 2u || rows == 0u) {
        return;
    }
    if (chain == 1u) {
        conv_chain(g, qkvz, w, state, slots, out_slots, out, snapshots, keep, rows, kernel,
                   num_slots);
        return;
    }
    // Each block row takes its units grid-stride: a unit is a row (chain 0) or a run of rows on
    // one slot (chain 2), walked in order from its first row; a block row skips starts inside
    // another's run. The run's first row reads the slot, the later ones the out slot (what the
    // row before wrote there: the same thread's channels, so no synchronisation).
    for (unsigned start = blockIdx.y; start < rows; start += gridDim.y) {
        const int slot = slots[start];
        if (chain == 2u && start > 0u && slots[start - 1u] == slot) {
            continue;
        }
        const int to = out_slots[start];
        const bool live = first_on_slot(slots, start, slot) && slot_ok(slot, num_slots) &&
                          slot_ok(to, num_slots);
        unsigned r = start;
        do {
            conv_row(g, qkvz, w, state, out, kept_snapshots(snapshots, keep, r), r,
                     r == start ? slot : to, to, live, kernel);
            ++r;
        } while (r < rows && chain == 2u && slots[r] == slot);
    }
}

// ---- gates ---------------------------------------------------------------------------------

// torch's softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplus_f32(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

// Row `row`, v head vh's gates from ba bf16[rows·2·nv] (HF's in_proj_ba, viewed as
// [nk][b ratio | a ratio]), a_log, dt_bias bf16[nv]: beta = sigmoid(b), g = −exp(a_log) ·
// softplus(a + dt_bias). `gates` stores them; `gates_recurrence` computes them where the
// recurrence reads them.
struct GdnGates {
    float beta, g;
};

__device__ __forceinline__ GdnGates gdn_gate_values(const bf16* __restrict__ ba,
                                                    const bf16* __restrict__ a_log,
                                                    const bf16* __restrict__ dt_bias,
                                                    unsigned long long row, unsigned vh,
                                                    unsigned nv, unsigned ratio) {
    const unsigned long long at =
        row * 2ull * nv + (unsigned long long)(vh / ratio) * 2ull * ratio + vh % ratio;
    const float b = to_f32(ba[at]);
    const float a = to_f32(ba[at + ratio]);
    const float decay = expf(to_f32(a_log[vh]));
    return {sigmoid_f32(b), __fmul_rn(-decay, softplus_f32(__fadd_rn(a, to_f32(dt_bias[vh]))))};
}

// ba bf16[rows·2·nv], a_log, dt_bias bf16[nv] → beta, g f32[rows·nv] (gdn_gate_values).
// Elementwise: 256 threads, 4 elements each, grid-stride.
extern "C" __global__ void __launch_bounds__(256) gates(const bf16* __restrict__ ba,
                                                        const bf16* __restrict__ a_log,
                                                        const bf16* __restrict__ dt_bias,
                                                        float* __restrict__ beta,
                                                        float* __restrict__ g, unsigned rows,
                                                        unsigned nk, unsigned nv) {
    pdl_wait();
    pdl_launch_dependents();
    if (nk == 0u || nv == 0u || nv % nk != 0u) {
        return;
    }
    const unsigned ratio = nv / nk;
    const unsigned long long n = (unsigned long long)rows * nv;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x * 4ull;
    for (unsigned long long base = (unsigned long long)blockIdx.x * blockDim.x * 4ull; base < n;
         base += stride) {
#pragma unroll
        for (unsigned e = 0; e < 4; ++e) {
            unsigned long long i = base + (unsigned long long)e * blockDim.x + threadIdx.x;
            if (i < n) {
                const unsigned long long row = i / nv;
                const unsigned vh = (unsigned)(i - row * nv);
                const GdnGates v = gdn_gate_values(ba, a_log, dt_bias, row, vh, nv, ratio);
                beta[i] = v.beta;
                g[i] = v.g;
            }
        }
    }
}

// ---- recurrence ----------------------------------------------------------------------------

// Where the recurrence finds a row's gates: stored by `gates` (beta, g f32[rows·nv]), or
// computed from ba, a_log and dt_bias (gates_recurrence: `gates` folded in, the same values).
struct GdnGateSource {
    const float* beta;
    const float* g;
    const bf16* ba;
    const bf16* a_log;
    const bf16* dt_bias;

    __device__ __forceinline__ GdnGates at(const GdnHeads& hd, unsigned r, unsigned head) const {
        const unsigned long long i = (unsigned long long)r * hd.nv + head;
        if (ba == nullptr) {
            return {beta[i], g[i]};
        }
        return gdn_gate_values(ba, a_log, dt_bias, r, head, hd.nv, hd.ratio);
    }
};

// A recurrence block is one warp owning 32 state columns of one v head: column j of S evolves
// on its own (kv_mem[j], delta[j], the update and out[j] read only column j), so the columns
// of a head split across blocks with no reduction between them, and each lane runs its column
// in the twin's order whatever the split.
#define GDN_COLUMNS 32u

// q and k of row `m` (key head kh) into q_s, k_s, by the warp: l2-normalised (eps 1e-6,
// Σx² in `warp_sum_squares` order), q scaled by 1/sqrt(dk).
__device__ __forceinline__ void recurrence_qk(const GdnHeads& hd, const bf16* __restrict__ m,
                                              unsigned kh, float* q_s, float* k_s,
                                              unsigned lane) {
    const unsigned dk = hd.dk;
    const float scale = __fsqrt_rn((float)dk);
    for (unsigned w = 0; w < 2u; ++w) {
        const bf16* src = m + (w == 0u ? 0ull : hd.kd) + (unsigned long long)kh * dk;
        float* dst = w == 0u ? q_s : k_s;
        const float ss = warp_sum_squares([&](unsigned i) { return to_f32(src[i]); }, dk, lane);
        const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, GDN_L2NORM_EPS)));
        for (unsigned i = lane; i < dk; i += 32u) {
            const float v = __fmul_rn(to_f32(src[i]), inv);
            dst[i] = w == 0u ? __fdiv_rn(v, scale) : v;
        }
    }
}

// kv = Σ_i (S[i][j]·decay)·k[i], i ascending, unfused: the first pass of a row. `col` is the
// lane's column, stride GDN_COLUMNS in shared memory.
__device__ __forceinline__ float recurrence_kv(const float* col, unsigned dk, float decay,
                                               const float* k_s) {
    float kv = 0.0f;
#pragma unroll 4
    for (unsigned i = 0; i < dk; ++i) {
        const float x = __fmul_rn(col[i * GDN_COLUMNS], decay);
        kv = __fadd_rn(kv, __fmul_rn(x, k_s[i]));
    }
    return kv;
}

// A unit's rows [start, end) of v head `head` for this lane's column j (every lane of the warp
// calls it; `live` and `has_col` = j < dv are what differ): per row, S ← S·exp(g); kv =
// Σ_i S[i][j]·k[i]; delta = (v[j] − kv)·beta; S[i][j] += k[i]·delta; out[j] = bf16(Σ_i
// S[i][j]·q[i]) (i ascending), multiplies and adds unfused in the CPU twin's order. The
// column is copied into shared memory (`cols`, [dk][GDN_COLUMNS]) at the unit's first row and
// back after its last, so a chain of rows reads the state from global memory once. A row's
// second pass also runs the next row's first (its kv over the values just written): two
// independent chains of adds, so a lane's latency per row is about one pass, not two; the next
// row's q and k are normalised into the other half of the double buffer first. A dead unit
// writes zeros to its outputs and snapshots and touches no state. The column is read from
// `s_in` and written back to `s_out` (the same state, in place, or the head's state in the
// unit's out slot).
__device__ __forceinline__ void recurrence_unit(
    const GdnHeads& hd, const bf16* __restrict__ mixed, const GdnGateSource& gates,
    const float* s_in, float* s_out, bf16* __restrict__ out,
    float* __restrict__ snapshots, const int* __restrict__ keep, unsigned start, unsigned end,
    unsigned head, unsigned j, bool live, float (*cols)[GDN_COLUMNS], float (*q_s)[GDN_MAX_DK],
    float (*k_s)[GDN_MAX_DK]) {
    const unsigned dk = hd.dk;
    const unsigned dv = hd.dv;
    const unsigned lane = threadIdx.x & 31u;
    const bool has_col = j < dv;
    const unsigned long long head_elems = (unsigned long long)dk * dv;
    auto row_out = [&](unsigned r) { return out + ((unsigned long long)r * hd.nv + head) * dv; };
    auto row_snap = [&](unsigned r) -> float* {
        float* snap = kept_snapshots(snapshots, keep, r);
        return snap != nullptr ? snap + ((unsigned long long)r * hd.nv + head) * head_elems + j
                               : nullptr;
    };
    if (!live) {
        if (has_col) {
            for (unsigned r = start; r < end; ++r) {
                row_out(r)[j] = to_bf16(0.0f);
                float* snap = row_snap(r);
                if (snap != nullptr) {
                    for (unsigned i = 0; i < dk; ++i) {
                        snap[(unsigned long long)i * dv] = 0.0f;
                    }
                }
            }
        }
        return;
    }
    const unsigned kh = head / hd.ratio;
    auto row_mixed = [&](unsigned r) { return mixed + (unsigned long long)r * hd.channels; };
    float* col = &cols[0][lane];
    __syncwarp(); // the previous unit's readers are done with cols and buffer 0
    if (has_col) {
        for (unsigned i = 0; i < dk; ++i) {
            col[i * GDN_COLUMNS] = s_in[(unsigned long long)i * dv + j];
        }
    }
    recurrence_qk(hd, row_mixed(start), kh, q_s[0], k_s[0], lane);
    __syncwarp();
    GdnGates gate = gates.at(hd, start, head);
    float decay = expf(gate.g);
    float kv = has_col ? recurrence_kv(col, dk, decay, k_s[0]) : 0.0f;
    for (unsigned r = start; r < end; ++r) {
        const unsigned cur = (r - start) & 1u;
        const bool has_next = r + 1u < end;
        float next_decay = 0.0f;
        GdnGates next_gate = gate;
        if (has_next) {
            // Buffer cur ^ 1 was last read by row r − 1's second pass.
            recurrence_qk(hd, row_mixed(r + 1u), kh, q_s[cur ^ 1u], k_s[cur ^ 1u], lane);
            __syncwarp();
            next_gate = gates.at(hd, r + 1u, head);
            next_decay = expf(next_gate.g);
        }
        if (has_col) {
            const float* q = q_s[cur];
            const float* k = k_s[cur];
            const float* k_next = k_s[cur ^ 1u];
            const bf16* v = row_mixed(r) + 2ull * hd.kd + (unsigned long long)head * dv;
            const float delta = __fmul_rn(__fsub_rn(to_f32(v[j]), kv), gate.beta);
            float* snap = row_snap(r);
            float acc = 0.0f;
            float kv_next = 0.0f;
#pragma unroll 4
            for (unsigned i = 0; i < dk; ++i) {
                const float x = __fadd_rn(__fmul_rn(col[i * GDN_COLUMNS], decay),
                                          __fmul_rn(k[i], delta));
                col[i * GDN_COLUMNS] = x;
                if (snap != nullptr) {
                    snap[(unsigned long long)i * dv] = x;
                }
                acc = __fadd_rn(acc, __fmul_rn(x, q[i]));
                if (has_next) {
                    const float y = __fmul_rn(x, next_decay);
                    kv_next = __fadd_rn(kv_next, __fmul_rn(y, k_next[i]));
                }
            }
            row_out(r)[j] = to_bf16(acc);
            kv = kv_next;
        }
        decay = next_decay;
        gate = next_gate;
        __syncwarp(); // buffer cur is free for row r + 2
    }
    if (has_col) {
        for (unsigned i = 0; i < dk; ++i) {
            s_out[(unsigned long long)i * dv + j] = col[i * GDN_COLUMNS];
        }
    }
}

// A recurrent kernel's unit of rows: a row (chain 0, pitched), all rows (chain 1) or a run of
// rows on one slot (chain 2), walked in order from its first row `start`. `skip`: `start` lies
// inside another unit's run (chain 2); `live`: the unit advances its slot (the first unit on
// it, the slot and the out slot in range); `slot`, `to`: the slot it reads and the one it
// writes; `end`: one past its last row. Every thread of the block calls it with the same
// arguments (first_on_slot synchronises the block).
struct GdnUnit {
    bool skip, live;
    int slot, to;
    unsigned end;
};

// Row `start`'s entry of evenly pitched `slots`: slots[0] + start·(slots[1] − slots[0]), or −1
// outside 0..num_slots.
__device__ __forceinline__ int pitched_slot(const int* __restrict__ slots, unsigned start,
                                            unsigned rows, unsigned num_slots) {
    const long long base = slots[0];
    const long long pitch = rows > 1u ? (long long)slots[1] - base : 0ll;
    const long long sl = base + (long long)start * pitch;
    return (sl < 0 || sl >= (long long)num_slots) ? -1 : (int)sl;
}

__device__ __forceinline__ GdnUnit gdn_unit(const int* __restrict__ slots,
                                            const int* __restrict__ out_slots, unsigned start,
                                            unsigned rows, unsigned num_slots, unsigned chain,
                                            bool pitched) {
    if (chain == 2u && start > 0u && slots[start - 1u] == slots[start]) {
        return {true, false, -1, -1, start};
    }
    int slot, to;
    bool first_row;
    if (chain == 1u) {
        slot = slots[0];
        to = out_slots[0];
        first_row = true;
    } else if (pitched) {
        slot = pitched_slot(slots, start, rows, num_slots);
        to = pitched_slot(out_slots, start, rows, num_slots);
        // Distinct slots unless the pitch is 0.
        first_row = (rows > 1u && slots[1] != slots[0]) || start == 0u;
    } else {
        slot = slots[start];
        to = out_slots[start];
        first_row = first_on_slot(slots, start, slot);
    }
    unsigned end = start + 1u;
    while (end < rows && (chain == 1u || (chain == 2u && slots[end] == slots[start]))) {
        ++end;
    }
    return {false, first_row && slot_ok(slot, num_slots) && slot_ok(to, num_slots), slot, to,
            end};
}

// Head `head`'s state in slot `slot` of `state` (nv heads of dk·dv).
__device__ __forceinline__ float* head_state(float* state, int slot, unsigned nv, unsigned head,
                                             unsigned long long head_elems) {
    return state + ((unsigned long long)slot * nv + head) * head_elems;
}

// The body of both recurrence kernels; `pitched`: row r's slot is slots[0] + r·(slots[1] −
// slots[0]), its out slot likewise of out_slots (chain 0 only). Block x is (v head, column
// tile), block y a row (chain 0, 2) or the only one (chain 1).
__device__ __forceinline__ void recurrence_run(
    const bf16* __restrict__ mixed, const GdnGateSource& gates, float* __restrict__ state,
    const int* __restrict__ slots, const int* __restrict__ out_slots, bf16* __restrict__ out,
    float* __restrict__ snapshots, const int* __restrict__ keep, unsigned rows, unsigned nk,
    unsigned dk, unsigned nv, unsigned dv, unsigned num_slots, unsigned chain, bool pitched) {
    __shared__ float cols[GDN_MAX_DK][GDN_COLUMNS];
    __shared__ float q_s[2][GDN_MAX_DK];
    __shared__ float k_s[2][GDN_MAX_DK];
    GdnHeads hd;
    if (!hd.init(nk, dk, nv, dv) || dk > GDN_MAX_DK || rows == 0u || blockDim.x != GDN_COLUMNS) {
        return;
    }
    const unsigned tiles = (dv - 1u) / GDN_COLUMNS + 1u;
    const unsigned head = blockIdx.x / tiles;
    if (head >= nv) {
        return;
    }
    const unsigned j = (blockIdx.x - head * tiles) * GDN_COLUMNS + threadIdx.x;
    const unsigned long long head_elems = (unsigned long long)dk * dv;
    if (chain == 1u && blockIdx.y != 0u) {
        return;
    }
    const unsigned stride = chain == 1u ? rows : gridDim.y;
    for (unsigned start = chain == 1u ? 0u : blockIdx.y; start < rows; start += stride) {
        const GdnUnit unit = gdn_unit(slots, out_slots, start, rows, num_slots, chain, pitched);
        if (unit.skip) {
            continue;
        }
        const float* s_in =
            unit.live ? head_state(state, unit.slot, nv, head, head_elems) : nullptr;
        float* s_out = unit.live ? head_state(state, unit.to, nv, head, head_elems) : nullptr;
        recurrence_unit(hd, mixed, gates, s_in, s_out, out, snapshots, keep, start, unit.end,
                        head, j, unit.live, cols, q_s, k_s);
    }
}

// The gated delta rule with l2-normalised q and k: mixed bf16[rows·C] (the conv output), beta,
// g f32[rows·nv], state f32 (read-write), out bf16[rows·nv·dv], snapshots f32[rows·nv·dk·dv]
// (optional), for the rows `keep` keeps.
extern "C" __global__ void __launch_bounds__(32) recurrence(
    const bf16* __restrict__ mixed, const float* __restrict__ beta, const float* __restrict__ g,
    float* __restrict__ state, const int* __restrict__ slots, const int* __restrict__ out_slots,
    bf16* __restrict__ out, float* __restrict__ snapshots, const int* __restrict__ keep,
    unsigned rows, unsigned nk,
    unsigned dk, unsigned nv, unsigned dv, unsigned num_slots, unsigned chain) {
    pdl_wait();
    pdl_launch_dependents();
    const GdnGateSource gates = {beta, g, nullptr, nullptr, nullptr};
    recurrence_run(mixed, gates, state, slots, out_slots, out, snapshots, keep, rows, nk, dk,
                   nv, dv, num_slots, chain, false);
}

// `recurrence` (chain 0) on evenly pitched slots: row r's state is slot slots[0] + r·(slots[1] −
// slots[0]). The same `recurrence_unit` per (row, head), so on such slots it is byte-identical
// to `recurrence`.
extern "C" __global__ void __launch_bounds__(32) recurrence_pitched(
    const bf16* __restrict__ mixed, const float* __restrict__ beta, const float* __restrict__ g,
    float* __restrict__ state, const int* __restrict__ slots, const int* __restrict__ out_slots,
    bf16* __restrict__ out, float* __restrict__ snapshots, const int* __restrict__ keep,
    unsigned rows, unsigned nk,
    unsigned dk, unsigned nv, unsigned dv, unsigned num_slots, unsigned chain) {
    pdl_wait();
    pdl_launch_dependents();
    const GdnGateSource gates = {beta, g, nullptr, nullptr, nullptr};
    recurrence_run(mixed, gates, state, slots, out_slots, out, snapshots, keep, rows, nk, dk,
                   nv, dv, num_slots, chain, true);
}

// `gates` folded into `recurrence`: ba bf16[rows·2·nv], a_log, dt_bias bf16[nv] in place of
// beta and g, each row's gates computed where the recurrence reads them (gdn_gate_values, the
// values `gates` stores), so the bytes of gates then recurrence, in one launch.
extern "C" __global__ void __launch_bounds__(32) gates_recurrence(
    const bf16* __restrict__ mixed, const bf16* __restrict__ ba, const bf16* __restrict__ a_log,
    const bf16* __restrict__ dt_bias, float* __restrict__ state, const int* __restrict__ slots,
    const int* __restrict__ out_slots, bf16* __restrict__ out, float* __restrict__ snapshots,
    const int* __restrict__ keep,
    unsigned rows, unsigned nk, unsigned dk, unsigned nv, unsigned dv, unsigned num_slots,
    unsigned chain) {
    pdl_wait();
    pdl_launch_dependents();
    const GdnGateSource gates = {nullptr, nullptr, ba, a_log, dt_bias};
    recurrence_run(mixed, gates, state, slots, out_slots, out, snapshots, keep, rows, nk, dk,
                   nv, dv, num_slots, chain, false);
}

// gates_recurrence on evenly pitched slots (as recurrence_pitched is to recurrence).
extern "C" __global__ void __launch_bounds__(32) gates_recurrence_pitched(
    const bf16* __restrict__ mixed, const bf16* __restrict__ ba, const bf16* __restrict__ a_log,
    const bf16* __restrict__ dt_bias, float* __restrict__ state, const int* __restrict__ slots,
    const int* __restrict__ out_slots, bf16* __restrict__ out, float* __restrict__ snapshots,
    const int* __restrict__ keep,
    unsigned rows, unsigned nk, unsigned dk, unsigned nv, unsigned dv, unsigned num_slots,
    unsigned chain) {
    pdl_wait();
    pdl_launch_dependents();
    const GdnGateSource gates = {nullptr, nullptr, ba, a_log, dt_bias};
    recurrence_run(mixed, gates, state, slots, out_slots, out, snapshots, keep, rows, nk, dk,
                   nv, dv, num_slots, chain, true);
}

// ---- chunked recurrence (the `gdn_chunked` lever) ------------------------------------------

// The gated delta rule over chunks of GDN_CHUNK rows: Gated DeltaNet's chunked form (the WY /
// UT transform of Yang et al., "Gated Delta Networks", as flash-linear-attention's chunk
// kernels use it). Within a chunk of L rows from the state S0, with G the running sum of the
// rows' g (G_0 = g_0, G_t = G_{t−1} + g_t) and Γ_t = exp(G_t):
//   u_t = β_t·(v_t − Γ_t·S0ᵀk_t) − Σ_{s<t} A[t][s]·u_s,   A[t][s] = ((k_t·k_s)·e^{G_t−G_s})·β_t
//   o_t = Γ_t·S0ᵀq_t + Σ_{s≤t} P[t][s]·u_s,               P[t][s] = (q_t·k_s)·e^{G_t−G_s}
//   S   = S0·Γ_{L−1} + Σ_s k_s·(u_s·e^{G_{L−1}−G_s})ᵀ
// u_t is the recurrence's delta_t: in exact arithmetic the row-by-row recurrence's values, in
// floating point another order (`differs`). q and k are normalised as the recurrence does it
// (recurrence_qk); every sum runs its index ascending from its first term, multiplies and adds
// unfused, as the twin (gdn/chunked.rs) does. A chunk's pair dots, S0 dots, outputs and state
// columns run in parallel over the block (256 threads); only the substitution for u walks the chunk's rows
// (over dots of at most GDN_CHUNK − 1 terms, not dk). Chunks start at a unit's first row. No
// snapshots: its rules run it in programs that keep none (a prompt's chunks).
//
// Launch (ops/gdn.rs): grid (nv·⌈dv/jc⌉, row blocks as recurrence), GDN_CHUNK_THREADS threads,
// jc = gdn_chunk_columns(dk) state columns per block, gdn_chunk_shared_bytes(dk) of dynamic
// shared memory (under 48 KB up to dk 256). Block (head, tile) owns the tile's state columns;
// it recomputes the chunk's pair dots, which every tile of the head needs.
#define GDN_CHUNK 16u
#define GDN_CHUNK_THREADS 256u
// State entries a thread updates at once (independent chains of adds).
#define GDN_CHUNK_GROUP 8u

__device__ __forceinline__ unsigned gdn_chunk_columns(unsigned dk) {
    return dk <= 128u ? 32u : 8u;
}

extern __shared__ float gdn_chunk_smem[];

// A chunked block's shared memory: q, k [C][dk + 1] (an odd pitch: a pair dot's threads read
// rows dk apart without bank conflicts); the state tile [dk][jc]; A, P [C][C]; rhs (then
// u·w), qs (S0ᵀq), u [C][jc]; G, Γ, β, w [C].
struct GdnChunkSmem {
    unsigned pitch;
    float *q, *k, *s, *a, *p, *rhs, *qs, *u, *G, *gam, *beta, *w;

    __device__ __forceinline__ void carve(float* base, unsigned dk, unsigned jc) {
        pitch = dk + 1u;
        q = base;
        k = q + GDN_CHUNK * pitch;
        s = k + GDN_CHUNK * pitch;
        a = s + dk * jc;
        p = a + GDN_CHUNK * GDN_CHUNK;
        rhs = p + GDN_CHUNK * GDN_CHUNK;
        qs = rhs + GDN_CHUNK * jc;
        u = qs + GDN_CHUNK * jc;
        G = u + GDN_CHUNK * jc;
        gam = G + GDN_CHUNK;
        beta = gam + GDN_CHUNK;
        w = beta + GDN_CHUNK;
    }
};

// Two dots against one vector, (Σ_i a0[i]·b[i·stride], Σ_i a1[i]·b[i·stride]), each i
// ascending from 0, unfused: two independent chains of adds in one loop, so a thread's latency
// is about one dot's.
struct ChunkDots {
    float d0, d1;
};

__device__ __forceinline__ ChunkDots chunk_dots(const float* a0, const float* a1, const float* b,
                                                unsigned n, unsigned stride) {
    float acc0 = 0.0f;
    float acc1 = 0.0f;
#pragma unroll 4
    for (unsigned i = 0; i < n; ++i) {
        const float x = b[i * stride];
        acc0 = __fadd_rn(acc0, __fmul_rn(a0[i], x));
        acc1 = __fadd_rn(acc1, __fmul_rn(a1[i], x));
    }
    return {acc0, acc1};
}

// Row t, tile column c of a chunk from its S0 dot kd = S0ᵀk_t: the substitution's right-hand
// side β_t·(v_t − Γ_t·S0ᵀk_t) into rhs[t·pitch + c].
__device__ __forceinline__ void chunk_rhs_at(float* rhs, const float* gam, const float* beta,
                                             const bf16* __restrict__ mixed, const GdnHeads& hd,
                                             unsigned c0, unsigned head, unsigned j0,
                                             unsigned pitch, unsigned t, unsigned c, float kd) {
    const bf16* v = mixed + (unsigned long long)(c0 + t) * hd.channels + 2ull * hd.kd +
                    (unsigned long long)head * hd.dv + j0 + c;
    rhs[t * pitch + c] = __fmul_rn(__fsub_rn(to_f32(*v), __fmul_rn(gam[t], kd)), beta[t]);
}

// Row t, tile column c of a chunk from its two S0 dots d (S0ᵀk_t, S0ᵀq_t): the right-hand side
// into rhs, S0ᵀq_t into qs.
__device__ __forceinline__ void chunk_rhs(const GdnChunkSmem& m, const bf16* __restrict__ mixed,
                                          const GdnHeads& hd, unsigned c0, unsigned head,
                                          unsigned j0, unsigned jc, unsigned t, unsigned c,
                                          ChunkDots d) {
    chunk_rhs_at(m.rhs, m.gam, m.beta, mixed, hd, c0, head, j0, jc, t, c, d.d0);
    m.qs[t * jc + c] = d.d1;
}

// A unit's rows [start, end) of v head `head`, state columns [j0, j0 + cols) (the block's
// tile, jc wide in shared memory), chunk by chunk. A dead unit writes zeros to its outputs and
// touches no state.
__device__ __forceinline__ void chunked_unit(const GdnHeads& hd, const bf16* __restrict__ mixed,
                                             const GdnGateSource& gates, const float* st_in,
                                             float* st_out, bf16* __restrict__ out, unsigned start,
                                             unsigned end, unsigned head, unsigned j0,
                                             unsigned jc, bool live, const GdnChunkSmem& m) {
    const unsigned dk = hd.dk;
    const unsigned dv = hd.dv;
    const unsigned cols = min(jc, dv - j0);
    const unsigned tid = threadIdx.x;
    const unsigned T = GDN_CHUNK_THREADS;
    const unsigned P = m.pitch;
    auto row_out = [&](unsigned r) {
        return out + ((unsigned long long)r * hd.nv + head) * dv + j0;
    };
    if (!live) {
        for (unsigned r = start; r < end; ++r) {
            for (unsigned c = tid; c < cols; c += T) {
                row_out(r)[c] = to_bf16(0.0f);
            }
        }
        return;
    }
    __syncthreads(); // the previous unit's readers are done with the shared memory
    for (unsigned e = tid; e < dk * cols; e += T) {
        const unsigned i = e / cols;
        const unsigned c = e - i * cols;
        m.s[i * jc + c] = st_in[(unsigned long long)i * dv + j0 + c];
    }
    const unsigned kh = head / hd.ratio;
    const unsigned warp = tid >> 5;
    const unsigned lane = tid & 31u;
    for (unsigned c0 = start; c0 < end; c0 += GDN_CHUNK) {
        const unsigned L = min(GDN_CHUNK, end - c0);
        __syncthreads(); // the previous chunk is done with q, k, the gates and u
        for (unsigned t = warp; t < L; t += T / 32u) {
            recurrence_qk(hd, mixed + (unsigned long long)(c0 + t) * hd.channels, kh,
                          m.q + t * P, m.k + t * P, lane);
        }
        if (tid < L) {
            const GdnGates gate = gates.at(hd, c0 + tid, head);
            m.beta[tid] = gate.beta;
            m.G[tid] = gate.g;
        }
        __syncthreads();
        if (tid == 0u) {
            for (unsigned t = 1u; t < L; ++t) {
                m.G[t] = __fadd_rn(m.G[t - 1u], m.G[t]);
            }
        }
        __syncthreads();
        if (tid < L) {
            m.gam[tid] = expf(m.G[tid]);
            m.w[tid] = expf(__fsub_rn(m.G[L - 1u], m.G[tid]));
        }
        // The pair dots: (t, s) for s ≤ t, numbered row by row.
        for (unsigned e = tid; e < L * (L + 1u) / 2u; e += T) {
            unsigned t = 0u;
            while ((t + 1u) * (t + 2u) / 2u <= e) {
                ++t;
            }
            const unsigned s = e - t * (t + 1u) / 2u;
            const float decay = expf(__fsub_rn(m.G[t], m.G[s]));
            const ChunkDots d = chunk_dots(m.q + t * P, m.k + t * P, m.k + s * P, dk, 1u);
            m.p[t * GDN_CHUNK + s] = __fmul_rn(d.d0, decay);
            if (s < t) {
                m.a[t * GDN_CHUNK + s] = __fmul_rn(__fmul_rn(d.d1, decay), m.beta[t]);
            }
        }
        __syncthreads();
        // S0ᵀk_t and S0ᵀq_t for the tile's columns: the substitution's right-hand sides. A
        // thread takes its entries two at a time, their four dots (each i ascending, unfused)
        // in one loop.
        for (unsigned e = tid; e < L * cols; e += 2u * T) {
            const unsigned t0 = e / cols;
            const unsigned ca = e - t0 * cols;
            const bool two = e + T < L * cols;
            const unsigned t1 = two ? (e + T) / cols : t0;
            const unsigned cb = two ? e + T - t1 * cols : ca;
            const float* ka = m.k + t0 * P;
            const float* qa = m.q + t0 * P;
            const float* kb = m.k + t1 * P;
            const float* qb = m.q + t1 * P;
            const float* sa = m.s + ca;
            const float* sb = m.s + cb;
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
            for (unsigned i = 0; i < dk; ++i) {
                const float xa = sa[i * jc];
                const float xb = sb[i * jc];
                d[0] = __fadd_rn(d[0], __fmul_rn(ka[i], xa));
                d[1] = __fadd_rn(d[1], __fmul_rn(qa[i], xa));
                d[2] = __fadd_rn(d[2], __fmul_rn(kb[i], xb));
                d[3] = __fadd_rn(d[3], __fmul_rn(qb[i], xb));
            }
            chunk_rhs(m, mixed, hd, c0, head, j0, jc, t0, ca, {d[0], d[1]});
            if (two) {
                chunk_rhs(m, mixed, hd, c0, head, j0, jc, t1, cb, {d[2], d[3]});
            }
        }
        __syncthreads();
        if (tid < cols) {
            for (unsigned t = 0u; t < L; ++t) {
                float acc = 0.0f;
                for (unsigned s = 0u; s < t; ++s) {
                    acc = __fadd_rn(acc, __fmul_rn(m.a[t * GDN_CHUNK + s], m.u[s * jc + tid]));
                }
                m.u[t * jc + tid] = __fsub_rn(m.rhs[t * jc + tid], acc);
            }
        }
        __syncthreads();
        for (unsigned e = tid; e < L * cols; e += T) {
            const unsigned t = e / cols;
            const unsigned c = e - t * cols;
            float acc = __fmul_rn(m.gam[t], m.qs[t * jc + c]);
            for (unsigned s = 0u; s <= t; ++s) {
                acc = __fadd_rn(acc, __fmul_rn(m.p[t * GDN_CHUNK + s], m.u[s * jc + c]));
            }
            row_out(c0 + t)[c] = to_bf16(acc);
            m.rhs[t * jc + c] = __fmul_rn(m.u[t * jc + c], m.w[t]);
        }
        __syncthreads();
        // S ← S0·Γ_{L−1} + Σ_s k_s·(u_s·w_s)ᵀ: a thread's entries GDN_CHUNK_GROUP at a time,
        // one independent chain of L adds each.
        const float last = m.gam[L - 1u];
        for (unsigned base = tid; base < dk * cols; base += T * GDN_CHUNK_GROUP) {
            float acc[GDN_CHUNK_GROUP];
            unsigned row[GDN_CHUNK_GROUP];
            unsigned col[GDN_CHUNK_GROUP];
#pragma unroll
            for (unsigned g = 0u; g < GDN_CHUNK_GROUP; ++g) {
                const unsigned e = base + g * T;
                const bool valid = e < dk * cols;
                row[g] = valid ? e / cols : 0u;
                col[g] = valid ? e - row[g] * cols : 0u;
                acc[g] = valid ? __fmul_rn(m.s[row[g] * jc + col[g]], last) : 0.0f;
            }
            for (unsigned s = 0u; s < L; ++s) {
#pragma unroll
                for (unsigned g = 0u; g < GDN_CHUNK_GROUP; ++g) {
                    acc[g] = __fadd_rn(acc[g],
                                       __fmul_rn(m.k[s * P + row[g]], m.rhs[s * jc + col[g]]));
                }
            }
#pragma unroll
            for (unsigned g = 0u; g < GDN_CHUNK_GROUP; ++g) {
                if (base + g * T < dk * cols) {
                    m.s[row[g] * jc + col[g]] = acc[g];
                }
            }
        }
    }
    // Each thread stores the state entries it updated.
    for (unsigned e = tid; e < dk * cols; e += T) {
        const unsigned i = e / cols;
        const unsigned c = e - i * cols;
        st_out[(unsigned long long)i * dv + j0 + c] = m.s[i * jc + c];
    }
}

// ---- chunked recurrence on the tensor cores (`gdn_chunked` with `tensor_cores`) -----------

// The chunked form above with its large matrix products on the tensor cores (mma.sync
// m16n8k8, TF32 in, f32 accumulate), as flash-linear-attention's chunk kernels put them there:
// the pair dots Q·Kᵀ and K·Kᵀ, the chunk's first state's products K·S0 and Q·S0, and the state
// update S0·Γ_{L−1} + Kᵀ·(U·w) (about 97% of a chunk's multiply-adds at dk = 128). The state
// stays f32 in shared memory and in the cache: each product reads its operands rounded to TF32
// (`to_tf32`, 10 mantissa bits, not bf16's 7) and sums in f32 (the update from S0·Γ_{L−1}).
// The gates, the decays, the right-hand sides, the substitution and the outputs' causal sums
// Γ_t·S0ᵀq_t + Σ_{s≤t} P[t][s]·u_s (16 terms at most) are the CUDA-core form's arithmetic.
// Every product runs a key dim padded to 16 and (the update) whole chunks of GDN_CHUNK rows,
// the padding zero, so a product's sum runs over the same terms in the same order whatever the
// chunk's length: the twin (gdn/twin/chunked.rs, `Arith::Tf32`) sums them as the host
// emulation's mma does (cuda_emu.hpp), byte for byte; a device sums a tensor-core product in
// its own order (`differs`).
//
// Launch: chunked's grid and threads; chunk_mma_shared_bytes(dk) (ops/gdn.rs) of dynamic shared
// (under 48 KB up to GDN_MAX_DK). Warps take the products' 8-column (or, for the state update,
// 16 × 8) tiles in turn; a tile's k steps are one warp's chain of mma.sync.
#define GDN_MMA_PAIR_PITCH 20u

// A tensor-core chunked block's shared memory: q, k [GDN_CHUNK][kp + 4] (kp = dk padded to
// 16: a fragment's eight rows of four words fall in 32 banks); the state tile [kp][sp], sp =
// jc | 8 (a B fragment's four rows of eight words, likewise); P, A [GDN_CHUNK][20]; rhs (then
// u·w), qs, u [GDN_CHUNK][sp]; G, Γ, β, w [GDN_CHUNK].
struct GdnChunkMmaSmem {
    unsigned kp, qp, sp;
    float *q, *k, *s, *p, *a, *rhs, *qs, *u, *G, *gam, *beta, *w;

    __device__ __forceinline__ void carve(float* base, unsigned dk, unsigned jc) {
        kp = (dk + 15u) & ~15u;
        qp = kp + 4u;
        sp = jc | 8u;
        q = base;
        k = q + GDN_CHUNK * qp;
        s = k + GDN_CHUNK * qp;
        p = s + kp * sp;
        a = p + GDN_CHUNK * GDN_MMA_PAIR_PITCH;
        rhs = a + GDN_CHUNK * GDN_MMA_PAIR_PITCH;
        qs = rhs + GDN_CHUNK * sp;
        u = qs + GDN_CHUNK * sp;
        G = u + GDN_CHUNK * sp;
        gam = G + GDN_CHUNK;
        beta = gam + GDN_CHUNK;
        w = beta + GDN_CHUNK;
    }
};

// d (16 × 8) = rows [16][pitch] (A, row-major) · cols (B as its columns: B(k, n) =
// cols[n·pitch + k]) over k < kp, each operand rounded to TF32: Q·Kᵀ and K·Kᵀ.
__device__ __forceinline__ void chunk_mma_rows_cols(float d[4], const float* rows,
                                                    const float* cols, unsigned pitch,
                                                    unsigned kp, unsigned g, unsigned t) {
    for (unsigned kk = 0; kk < kp; kk += 8u) {
        const unsigned a[4] = {to_tf32(rows[g * pitch + kk + t]),
                               to_tf32(rows[(g + 8u) * pitch + kk + t]),
                               to_tf32(rows[g * pitch + kk + t + 4u]),
                               to_tf32(rows[(g + 8u) * pitch + kk + t + 4u])};
        mma_tf32_1688(d, a, to_tf32(cols[g * pitch + kk + t]),
                      to_tf32(cols[g * pitch + kk + t + 4u]));
    }
}

// d (16 × 8) += rows [16][pitch] (A) · b [k][b_pitch] (B row-major, its 8 columns from b) over
// k < kn, each operand rounded to TF32: K·S0 and Q·S0.
__device__ __forceinline__ void chunk_mma_rows_b(float d[4], const float* rows, unsigned pitch,
                                                 const float* b, unsigned b_pitch, unsigned kn,
                                                 unsigned g, unsigned t) {
    for (unsigned kk = 0; kk < kn; kk += 8u) {
        const unsigned a[4] = {to_tf32(rows[g * pitch + kk + t]),
                               to_tf32(rows[(g + 8u) * pitch + kk + t]),
                               to_tf32(rows[g * pitch + kk + t + 4u]),
                               to_tf32(rows[(g + 8u) * pitch + kk + t + 4u])};
        mma_tf32_1688(d, a, to_tf32(b[(kk + t) * b_pitch + g]),
                      to_tf32(b[(kk + t + 4u) * b_pitch + g]));
    }
}

// The fragment's four outputs' (row, column) in its 16 × 8 tile: (g, 2t), (g, 2t+1), (g+8, 2t),
// (g+8, 2t+1).
__device__ __forceinline__ unsigned mma_row(unsigned i, unsigned g) { return g + 8u * (i >> 1); }
__device__ __forceinline__ unsigned mma_col(unsigned i, unsigned t) { return 2u * t + (i & 1u); }

// A unit's rows [start, end) of v head `head`, state columns [j0, j0 + cols), chunk by chunk,
// the products on the tensor cores. A dead unit writes zeros to its outputs.
__device__ __forceinline__ void chunked_mma_unit(const GdnHeads& hd,
                                                 const bf16* __restrict__ mixed,
                                                 const GdnGateSource& gates, const float* st_in,
                                                 float* st_out, bf16* __restrict__ out,
                                                 unsigned start, unsigned end, unsigned head,
                                                 unsigned j0, unsigned jc, bool live,
                                                 const GdnChunkMmaSmem& m) {
    const unsigned dk = hd.dk;
    const unsigned dv = hd.dv;
    const unsigned cols = min(jc, dv - j0);
    const unsigned tid = threadIdx.x;
    const unsigned T = GDN_CHUNK_THREADS;
    const unsigned warps = T / 32u;
    const unsigned warp = tid >> 5;
    const unsigned lane = tid & 31u;
    const unsigned g = lane >> 2;
    const unsigned t4 = lane & 3u;
    const unsigned kp = m.kp, QP = m.qp, SP = m.sp, PP = GDN_MMA_PAIR_PITCH;
    const unsigned nt = jc / 8u;
    auto row_out = [&](unsigned r) {
        return out + ((unsigned long long)r * hd.nv + head) * dv + j0;
    };
    if (!live) {
        for (unsigned r = start; r < end; ++r) {
            for (unsigned c = tid; c < cols; c += T) {
                row_out(r)[c] = to_bf16(0.0f);
            }
        }
        return;
    }
    __syncthreads(); // the previous unit's readers are done with the shared memory
    // The state tile, zero past the key dim and the tile's columns.
    for (unsigned e = tid; e < kp * jc; e += T) {
        const unsigned i = e / jc;
        const unsigned c = e - i * jc;
        m.s[i * SP + c] = i < dk && c < cols ? st_in[(unsigned long long)i * dv + j0 + c] : 0.0f;
    }
    const unsigned kh = head / hd.ratio;
    for (unsigned c0 = start; c0 < end; c0 += GDN_CHUNK) {
        const unsigned L = min(GDN_CHUNK, end - c0);
        __syncthreads(); // the previous chunk is done with q, k, the gates and u
        for (unsigned t = warp; t < GDN_CHUNK; t += warps) {
            if (t < L) {
                recurrence_qk(hd, mixed + (unsigned long long)(c0 + t) * hd.channels, kh,
                              m.q + t * QP, m.k + t * QP, lane);
            }
            for (unsigned i = (t < L ? dk : 0u) + lane; i < kp; i += 32u) {
                m.q[t * QP + i] = 0.0f;
                m.k[t * QP + i] = 0.0f;
            }
        }
        if (tid < L) {
            const GdnGates gate = gates.at(hd, c0 + tid, head);
            m.beta[tid] = gate.beta;
            m.G[tid] = gate.g;
        }
        __syncthreads();
        if (tid == 0u) {
            for (unsigned t = 1u; t < L; ++t) {
                m.G[t] = __fadd_rn(m.G[t - 1u], m.G[t]);
            }
        }
        __syncthreads();
        if (tid < L) {
            m.gam[tid] = expf(m.G[tid]);
            m.w[tid] = expf(__fsub_rn(m.G[L - 1u], m.G[tid]));
        }
        __syncthreads();
        // The products against q and k, a warp a tile: K·S0 and Q·S0 (nt tiles each, into the
        // right-hand sides and qs), then Q·Kᵀ and K·Kᵀ (two tiles each, into P and A).
        for (unsigned tile = warp; tile < 2u * nt + 4u; tile += warps) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (tile < 2u * nt) {
                const bool by_q = tile >= nt;
                const unsigned n0 = (tile - (by_q ? nt : 0u)) * 8u;
                chunk_mma_rows_b(d, by_q ? m.q : m.k, QP, m.s + n0, SP, kp, g, t4);
                for (unsigned i = 0; i < 4u; ++i) {
                    const unsigned r = mma_row(i, g);
                    const unsigned c = n0 + mma_col(i, t4);
                    const bool valid = r < L && c < cols;
                    if (by_q) {
                        m.qs[r * SP + c] = valid ? d[i] : 0.0f;
                    } else if (valid) {
                        chunk_rhs_at(m.rhs, m.gam, m.beta, mixed, hd, c0, head, j0, SP, r, c,
                                     d[i]);
                    } else {
                        m.rhs[r * SP + c] = 0.0f;
                    }
                }
            } else {
                const unsigned pair = tile - 2u * nt;
                const bool by_k = pair >= 2u;
                const unsigned n0 = (pair & 1u) * 8u;
                chunk_mma_rows_cols(d, by_k ? m.k : m.q, m.k + n0 * QP, QP, kp, g, t4);
                for (unsigned i = 0; i < 4u; ++i) {
                    const unsigned r = mma_row(i, g);
                    const unsigned s = n0 + mma_col(i, t4);
                    float v = 0.0f;
                    if (r < L && s <= r && (!by_k || s < r)) {
                        const float decay = expf(__fsub_rn(m.G[r], m.G[s]));
                        v = __fmul_rn(d[i], decay);
                        v = by_k ? __fmul_rn(v, m.beta[r]) : v;
                    }
                    (by_k ? m.a : m.p)[r * PP + s] = v;
                }
            }
        }
        __syncthreads();
        // The substitution, a thread a column: u_t = rhs_t − Σ_{s<t} A[t][s]·u_s; rows past the
        // chunk zero.
        if (tid < jc) {
            for (unsigned t = 0u; t < GDN_CHUNK; ++t) {
                float acc = 0.0f;
                for (unsigned s = 0u; s < t && t < L; ++s) {
                    acc = __fadd_rn(acc, __fmul_rn(m.a[t * PP + s], m.u[s * SP + tid]));
                }
                m.u[t * SP + tid] = t < L ? __fsub_rn(m.rhs[t * SP + tid], acc) : 0.0f;
            }
        }
        __syncthreads();
        // The outputs Γ_t·S0ᵀq_t + Σ_{s≤t} P[t][s]·u_s on the CUDA cores, as the CUDA-core form
        // sums them: a causal sum of at most 16 terms (on the tensor cores a row would take
        // 0·u_s from the later rows, and 0·NaN would carry a later row's NaN back to it); u·w
        // into rhs (the state update's operand), zero past the chunk.
        for (unsigned e = tid; e < GDN_CHUNK * jc; e += T) {
            const unsigned t = e / jc;
            const unsigned c = e - t * jc;
            if (t < L && c < cols) {
                float acc = __fmul_rn(m.gam[t], m.qs[t * SP + c]);
                for (unsigned s = 0u; s <= t; ++s) {
                    acc = __fadd_rn(acc, __fmul_rn(m.p[t * PP + s], m.u[s * SP + c]));
                }
                row_out(c0 + t)[c] = to_bf16(acc);
            }
            m.rhs[t * SP + c] = t < L ? __fmul_rn(m.u[t * SP + c], m.w[t]) : 0.0f;
        }
        __syncthreads();
        // S ← S0·Γ_{L−1} + Kᵀ·(U·w): a warp a 16 × 8 tile of the state, each entry held by one
        // lane from its read to its write.
        const float last = m.gam[L - 1u];
        for (unsigned tile = warp; tile < (kp / 16u) * nt; tile += warps) {
            const unsigned m0 = (tile / nt) * 16u;
            const unsigned n0 = (tile - (tile / nt) * nt) * 8u;
            float d[4];
            for (unsigned i = 0; i < 4u; ++i) {
                d[i] = __fmul_rn(m.s[(m0 + mma_row(i, g)) * SP + n0 + mma_col(i, t4)], last);
            }
            for (unsigned kk = 0; kk < GDN_CHUNK; kk += 8u) {
                const unsigned a[4] = {to_tf32(m.k[(kk + t4) * QP + m0 + g]),
                                       to_tf32(m.k[(kk + t4) * QP + m0 + g + 8u]),
                                       to_tf32(m.k[(kk + t4 + 4u) * QP + m0 + g]),
                                       to_tf32(m.k[(kk + t4 + 4u) * QP + m0 + g + 8u])};
                mma_tf32_1688(d, a, to_tf32(m.rhs[(kk + t4) * SP + n0 + g]),
                              to_tf32(m.rhs[(kk + t4 + 4u) * SP + n0 + g]));
            }
            for (unsigned i = 0; i < 4u; ++i) {
                m.s[(m0 + mma_row(i, g)) * SP + n0 + mma_col(i, t4)] = d[i];
            }
        }
    }
    __syncthreads();
    for (unsigned e = tid; e < dk * cols; e += T) {
        const unsigned i = e / cols;
        const unsigned c = e - i * cols;
        st_out[(unsigned long long)i * dv + j0 + c] = m.s[i * SP + c];
    }
}

// The shared memory a chunked block carves: the CUDA-core form's or (MMA) the tensor cores'.
template <bool MMA> struct ChunkSmemOf {
    using type = GdnChunkSmem;
};
template <> struct ChunkSmemOf<true> {
    using type = GdnChunkMmaSmem;
};

// The body of the chunked kernels, on the CUDA cores or (MMA) the tensor cores. Block x is
// (v head, column tile), block y a row (chain 0, 2) or the only one (chain 1).
template <bool MMA>
__device__ __forceinline__ void chunked_run(const bf16* __restrict__ mixed,
                                            const GdnGateSource& gates, float* __restrict__ state,
                                            const int* __restrict__ slots,
                                            const int* __restrict__ out_slots,
                                            bf16* __restrict__ out,
                                            unsigned rows, unsigned nk, unsigned dk, unsigned nv,
                                            unsigned dv, unsigned num_slots, unsigned chain) {
    GdnHeads hd;
    if (!hd.init(nk, dk, nv, dv) || dk > GDN_MAX_DK || rows == 0u ||
        blockDim.x != GDN_CHUNK_THREADS) {
        return;
    }
    const unsigned jc = gdn_chunk_columns(dk);
    const unsigned tiles = (dv - 1u) / jc + 1u;
    const unsigned head = blockIdx.x / tiles;
    if (head >= nv || (chain == 1u && blockIdx.y != 0u)) {
        return;
    }
    const unsigned j0 = (blockIdx.x - head * tiles) * jc;
    const unsigned long long head_elems = (unsigned long long)dk * dv;
    using Smem = typename ChunkSmemOf<MMA>::type;
    Smem m;
    m.carve(gdn_chunk_smem, dk, jc);
    const unsigned stride = chain == 1u ? rows : gridDim.y;
    for (unsigned start = chain == 1u ? 0u : blockIdx.y; start < rows; start += stride) {
        const GdnUnit unit = gdn_unit(slots, out_slots, start, rows, num_slots, chain, false);
        if (unit.skip) {
            continue;
        }
        const float* s_in =
            unit.live ? head_state(state, unit.slot, nv, head, head_elems) : nullptr;
        float* s_out = unit.live ? head_state(state, unit.to, nv, head, head_elems) : nullptr;
        if constexpr (MMA) {
            chunked_mma_unit(hd, mixed, gates, s_in, s_out, out, start, unit.end, head, j0, jc,
                             unit.live, m);
        } else {
            chunked_unit(hd, mixed, gates, s_in, s_out, out, start, unit.end, head, j0, jc,
                         unit.live, m);
        }
    }
}

// The gated delta rule in chunks: recurrence's arguments without snapshots (mixed bf16[rows·C],
// beta, g f32[rows·nv], state f32 read-write, out bf16[rows·nv·dv]).
extern "C" __global__ void __launch_bounds__(GDN_CHUNK_THREADS) chunked(
    const bf16* __restrict__ mixed, const float* __restrict__ beta, const float* __restrict__ g,
    float* __restrict__ state, const int* __restrict__ slots, const int* __restrict__ out_slots,
    bf16* __restrict__ out, unsigned rows, unsigned nk, unsigned dk, unsigned nv, unsigned dv,
    unsigned num_slots, unsigned chain) {
    pdl_wait();
    pdl_launch_dependents();
    const GdnGateSource gates = {beta, g, nullptr, nullptr, nullptr};
    chunked_run<false>(mixed, gates, state, slots, out_slots, out, rows, nk, dk, nv, dv,
                       num_slots, chain);
}

// `gates` folded into `chunked` (as gates_recurrence folds them into recurrence).
extern "C" __global__ void __launch_bounds__(GDN_CHUNK_THREADS) gates_chunked(
    const bf16* __restrict__ mixed, const bf16* __restrict__ ba, const bf16* __restrict__ a_log,
    const bf16* __restrict__ dt_bias, float* __restrict__ state, const int* __restrict__ slots,
    const int* __restrict__ out_slots, bf16* __restrict__ out, unsigned rows, unsigned nk,
    unsigned dk, unsigned nv, unsigned dv, unsigned num_slots, unsigned chain) {
    pdl_wait();
    pdl_launch_dependents();
    const GdnGateSource gates = {nullptr, nullptr, ba, a_log, dt_bias};
    chunked_run<false>(mixed, gates, state, slots, out_slots, out, rows, nk, dk, nv, dv,
                       num_slots, chain);
}

// `chunked` with its products on the tensor cores: the same arguments.
extern "C" __global__ void __launch_bounds__(GDN_CHUNK_THREADS) chunked_mma(
    const bf16* __restrict__ mixed, const float* __restrict__ beta, const float* __restrict__ g,
    float* __restrict__ state, const int* __restrict__ slots, const int* __restrict__ out_slots,
    bf16* __restrict__ out, unsigned rows, unsigned nk, unsigned dk, unsigned nv, unsigned dv,
    unsigned num_slots, unsigned chain) {
    pdl_wait();
    pdl_launch_dependents();
    const GdnGateSource gates = {beta, g, nullptr, nullptr, nullptr};
    chunked_run<true>(mixed, gates, state, slots, out_slots, out, rows, nk, dk, nv, dv,
                      num_slots, chain);
}

// `gates_chunked` with its products on the tensor cores: the same arguments.
extern "C" __global__ void __launch_bounds__(GDN_CHUNK_THREADS) gates_chunked_mma(
    const bf16* __restrict__ mixed, const bf16* __restrict__ ba, const bf16* __restrict__ a_log,
    const bf16* __restrict__ dt_bias, float* __restrict__ state, const int* __restrict__ slots,
    const int* __restrict__ out_slots, bf16* __restrict__ out, unsigned rows, unsigned nk,
    unsigned dk, unsigned nv, unsigned dv, unsigned num_slots, unsigned chain) {
    pdl_wait();
    pdl_launch_dependents();
    const GdnGateSource gates = {nullptr, nullptr, ba, a_log, dt_bias};
    chunked_run<true>(mixed, gates, state, slots, out_slots, out, rows, nk, dk, nv, dv,
                      num_slots, chain);
}

// ---- gated norm ----------------------------------------------------------------------------

// RMSNorm of each v head of core bf16[rows·nv·dv] (weight w bf16[dv]) times silu(z), z the
// head's slice of qkvz bf16[rows·nk·group] → out bf16[rows·nv·dv] = bf16(((x · inv) · w) ·
// silu(z)). One warp per (row, v head) (grid-stride), Σx² in `warp_sum_squares` order.
extern "C" __global__ void __launch_bounds__(256) gated_norm(const bf16* __restrict__ core,
                                                             const bf16* __restrict__ qkvz,
                                                             const bf16* __restrict__ w,
                                                             bf16* __restrict__ out,
                                                             unsigned rows, unsigned nk,
                                                             unsigned dk, unsigned nv,
                                                             unsigned dv, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    GdnHeads hd;
    if (!hd.init(nk, dk, nv, dv)) {
        return;
    }
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warps = blockDim.x >> 5;
    const unsigned long long heads = (unsigned long long)rows * nv;
    for (unsigned long long i = (unsigned long long)blockIdx.x * warps + (threadIdx.x >> 5);
         i < heads; i += (unsigned long long)gridDim.x * warps) {
        const unsigned long long row = i / nv;
        const unsigned vh = (unsigned)(i - row * nv);
        const bf16* x = core + i * dv;
        const bf16* z = qkvz + row * hd.qkvz_row + hd.z_source(vh);
        bf16* o = out + i * dv;
        const float ss = warp_sum_squares([&](unsigned e) { return to_f32(x[e]); }, dv, lane);
        const float inv = inv_rms(ss, dv, eps);
        for (unsigned e = lane; e < dv; e += 32) {
            const float y = __fmul_rn(__fmul_rn(to_f32(x[e]), inv), to_f32(w[e]));
            o[e] = to_bf16(__fmul_rn(y, silu_f32(to_f32(z[e]))));
        }
    }
}
