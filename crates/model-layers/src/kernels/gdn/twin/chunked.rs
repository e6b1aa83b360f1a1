//! CPU twin of `gdn::chunked` and `gdn::gates_chunked`: the gated delta rule in chunks of
//! [`GDN_CHUNK`] rows (Gated DeltaNet's chunked form; the formulas are in
//! `crates/kernels/cuda/gdn.cu`, "chunked recurrence"). Every sum runs its index ascending
//! from its first term, multiplies and adds unfused, as the CUDA kernel's threads do, so the
//! two agree byte for byte; against `recurrence` the values agree up to rounding (`differs`).
//!
//! And of `gdn::chunked_mma` and `gdn::gates_chunked_mma` ([`Arith::Tf32`]): the same chunks
//! with their matrix products on the tensor cores, each product's operands rounded to TF32
//! and summed as the host emulation's `mma.sync` sums them (its accumulator's start, then each
//! exact product in k order, fused: `mma_fma`), over the kernel's padded terms (a short chunk's
//! rows, a key dim to a multiple of 16), so the twin gives the emulated kernel's bytes.
//!
//! A chunk is up to `GDN_CHUNK` consecutive rows of one (slot, v head) task, counted from the
//! task's first row (the kernel's unit: all rows with `chain` 1, a run with `chain` 2); with
//! `chain` 0 each row is its own chunk. No snapshots.

use half::bf16;
use solder_gpu_runtime::{par_chunks_mut, GpuError, TwinCtx};

use super::super::{ChunkedArgs, GatesChunkedArgs, GDN_CHUNK};
use super::{
    advanced_slots, folded_gates, head_tasks, normalised_qk, recurrence_heads, HeadTask, Heads,
};
use crate::kernels::args::{macs, size, threads_for, Dim, In, Out};
use crate::numerics::{to_bf16, to_f32};

const CHUNK: usize = GDN_CHUNK as usize;

/// The `ChunkedLaunch` of a launch view holding every field of it (`ChunkedArgs`,
/// `GatesChunkedArgs`), with its checked `heads`.
macro_rules! chunked_launch {
    ($a:expr, $heads:expr) => {
        ChunkedLaunch {
            ctx: $a.ctx,
            heads: $heads,
            mixed: $a.mixed,
            state: $a.state,
            slots: $a.slots,
            out_slots: $a.out_slots,
            out: $a.out,
            rows: $a.rows,
            num_slots: $a.num_slots,
            chain: $a.chain,
        }
    };
}

/// How a chunk's matrix products sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arith {
    /// The CUDA cores' dots (`gdn::chunked`): f32 operands, multiplies and adds unfused.
    Cuda,
    /// The tensor cores' products (`gdn::chunked_mma`): TF32 operands, each exact product
    /// added to the running f32 sum.
    Tf32,
}

pub(in crate::kernels::gdn) fn chunked(a: ChunkedArgs<'_>) -> Result<(), GpuError> {
    chunked_with(a, Arith::Cuda)
}

pub(in crate::kernels::gdn) fn chunked_mma(a: ChunkedArgs<'_>) -> Result<(), GpuError> {
    chunked_with(a, Arith::Tf32)
}

fn chunked_with(a: ChunkedArgs<'_>, arith: Arith) -> Result<(), GpuError> {
    let heads = recurrence_heads(a.ctx, [a.nk, a.dk, a.nv, a.dv])?;
    let rows_nv = size(a.ctx, &[a.rows.count(), heads.nv])?;
    let (beta, g) = (a.beta.len(rows_nv)?, a.g.len(rows_nv)?);
    chunked_launch!(a, heads).run(beta, g, arith)
}

/// `gates` then `chunked`: the rows' gates as `gates` stores them, then the chunks over them.
pub(in crate::kernels::gdn) fn gates_chunked(a: GatesChunkedArgs<'_>) -> Result<(), GpuError> {
    gates_chunked_with(a, Arith::Cuda)
}

/// `gates` then `chunked_mma`.
pub(in crate::kernels::gdn) fn gates_chunked_mma(a: GatesChunkedArgs<'_>) -> Result<(), GpuError> {
    gates_chunked_with(a, Arith::Tf32)
}

fn gates_chunked_with(a: GatesChunkedArgs<'_>, arith: Arith) -> Result<(), GpuError> {
    let heads = recurrence_heads(a.ctx, [a.nk, a.dk, a.nv, a.dv])?;
    let (beta, g) = folded_gates(a.ctx, &heads, a.rows, [a.ba, a.a_log, a.dt_bias])?;
    chunked_launch!(a, heads).run(&beta, &g, arith)
}

/// A chunked launch's buffers and scalars besides its gates.
struct ChunkedLaunch<'c> {
    ctx: &'c TwinCtx<'c>,
    heads: Heads,
    mixed: In<'c, bf16>,
    state: Out<'c, f32>,
    slots: In<'c, i32>,
    out_slots: In<'c, i32>,
    out: Out<'c, bf16>,
    rows: Dim<'c>,
    num_slots: Dim<'c>,
    chain: Dim<'c>,
}

impl ChunkedLaunch<'_> {
    /// Checks the buffers, then runs every (slot, v head) task's chunks, tasks in parallel.
    fn run(self, beta: &[f32], g: &[f32], arith: Arith) -> Result<(), GpuError> {
        let (ctx, heads) = (self.ctx, self.heads);
        let (rows, num_slots) = (self.rows.count(), self.num_slots.dim()?);
        let (nv, dk, dv) = (heads.nv, heads.dk, heads.dv);
        let slot_elems = size(ctx, &[nv, dk, dv])?;
        let mixed = self.mixed.len(size(ctx, &[rows, heads.channels])?)?;
        let state = self.state.len(size(ctx, &[num_slots, slot_elems])?)?;
        let slots = [self.slots.len(rows)?, self.out_slots.len(rows)?];
        let out = self.out.len(size(ctx, &[rows, nv, dv])?)?;
        let chain = (self.chain, false);
        let row_slots = advanced_slots(ctx, slots, num_slots, chain, state, slot_elems)?;
        let chunk = if self.chain.get() == 0 { 1 } else { CHUNK };
        let inputs = Chunks {
            heads,
            mixed,
            beta,
            g,
            arith,
        };
        let mut tasks = head_tasks(state, out, (None, None), &row_slots, &heads);
        let threads = threads_for(ctx, macs(&[rows, nv, dk, dv, 4]));
        let per_task = tasks.len().div_ceil(threads).max(1);
        par_chunks_mut(&mut tasks, per_task, threads, |_, part| {
            let mut scratch = Scratch::new(dk, dv);
            for task in part {
                inputs.task(task, chunk, &mut scratch);
            }
        });
        Ok(())
    }
}

/// The per-launch inputs of the chunks.
struct Chunks<'a> {
    heads: Heads,
    mixed: &'a [bf16],
    beta: &'a [f32],
    g: &'a [f32],
    arith: Arith,
}

/// Per-thread scratch: a chunk's normalised q and k (`[CHUNK][dk]`), its gates, its pair
/// products A and P (`[CHUNK][CHUNK]`), and per row the values of every state column
/// (`[CHUNK][dv]`): S0ᵀk then the right-hand side, S0ᵀq, u, u·w.
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    beta: [f32; CHUNK],
    big_g: [f32; CHUNK],
    gamma: [f32; CHUNK],
    w: [f32; CHUNK],
    a: [[f32; CHUNK]; CHUNK],
    p: [[f32; CHUNK]; CHUNK],
    rhs: Vec<f32>,
    qs: Vec<f32>,
    u: Vec<f32>,
    uw: Vec<f32>,
    /// The tensor-core form's TF32 operands (empty for the CUDA-core form): q and k
    /// (`[CHUNK][dk padded to 16]`), the chunk's first state (`[dk][dv]`) and u·w
    /// (`[CHUNK][dv]`), kept across chunks so a chunk allocates nothing.
    qt: Vec<f32>,
    kt: Vec<f32>,
    st: Vec<f32>,
    uwt: Vec<f32>,
}

impl Scratch {
    fn new(dk: usize, dv: usize) -> Scratch {
        Scratch {
            q: vec![0.0; CHUNK * dk],
            k: vec![0.0; CHUNK * dk],
            beta: [0.0; CHUNK],
            big_g: [0.0; CHUNK],
            gamma: [0.0; CHUNK],
            w: [0.0; CHUNK],
            a: [[0.0; CHUNK]; CHUNK],
            p: [[0.0; CHUNK]; CHUNK],
            rhs: vec![0.0; CHUNK * dv],
            qs: vec![0.0; CHUNK * dv],
            u: vec![0.0; CHUNK * dv],
            uw: vec![0.0; CHUNK * dv],
            qt: Vec::new(),
            kt: Vec::new(),
            st: Vec::new(),
            uwt: Vec::new(),
        }
    }
}

/// Σ_i a\[i\]·b\[i\], i ascending from the first term, unfused.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |acc, (x, y)| acc + x * y)
}

impl Chunks<'_> {
    /// A task's rows in chunks of up to `chunk` consecutive rows, from its first row.
    fn task(&self, task: &mut HeadTask<'_>, chunk: usize, t: &mut Scratch) {
        let mut first = 0;
        while first < task.steps.len() {
            let mut end = first + 1;
            while end < task.steps.len()
                && end - first < chunk
                && task.steps[end].row == task.steps[end - 1].row + 1
            {
                end += 1;
            }
            let rows: Vec<usize> = task.steps[first..end].iter().map(|s| s.row).collect();
            self.chunk(task.head, task.state, &rows, t);
            for (i, step) in task.steps[first..end].iter_mut().enumerate() {
                for (o, u) in step.out.iter_mut().zip(&t.rhs[i * self.heads.dv..]) {
                    *o = to_bf16(*u);
                }
            }
            first = end;
        }
    }

    /// One chunk of `rows` (consecutive, at most `CHUNK`) of v head `head` on its state `s`
    /// (`[dk][dv]`): advances `s` and leaves each row's output, unrounded, in `t.rhs`.
    fn chunk(&self, head: usize, s: &mut [f32], rows: &[usize], t: &mut Scratch) {
        self.gates_and_qk(head, rows, t);
        match self.arith {
            Arith::Cuda => self.cuda_cores(head, s, rows, t),
            Arith::Tf32 => self.tensor_cores(head, s, rows, t),
        }
    }

    /// The chunk's normalised q and k, its β, G (the running sum of g), Γ = e^G and
    /// w = e^(G_last − G).
    fn gates_and_qk(&self, head: usize, rows: &[usize], t: &mut Scratch) {
        let Heads {
            nv, dk, channels, ..
        } = self.heads;
        let l = rows.len();
        for (i, &row) in rows.iter().enumerate() {
            let m = &self.mixed[row * channels..][..channels];
            let (q, k) = (&mut t.q[i * dk..][..dk], &mut t.k[i * dk..][..dk]);
            normalised_qk(&self.heads, m, head, q, k);
            t.beta[i] = self.beta[row * nv + head];
            t.big_g[i] = self.g[row * nv + head];
        }
        for i in 1..l {
            t.big_g[i] += t.big_g[i - 1];
        }
        for i in 0..l {
            t.gamma[i] = t.big_g[i].exp();
            t.w[i] = (t.big_g[l - 1] - t.big_g[i]).exp();
        }
    }

    /// The substitution: u_i = rhs_i − Σ_{j<i} A\[i\]\[j\]·u_j for the chunk's `l` rows, each
    /// column's sum j ascending (the loops run over columns innermost; each column's order is
    /// the kernel's).
    fn substitute(dv: usize, l: usize, t: &mut Scratch) {
        for i in 0..l {
            let (done, rest) = t.u.split_at_mut(i * dv);
            let acc = &mut rest[..dv];
            acc.fill(0.0);
            for (j, u_j) in done.chunks_exact(dv).enumerate() {
                let a = t.a[i][j];
                for (acc, u) in acc.iter_mut().zip(u_j) {
                    *acc += a * u;
                }
            }
            for (acc, r) in acc.iter_mut().zip(&t.rhs[i * dv..][..dv]) {
                *acc = r - *acc;
            }
        }
    }

    /// The outputs Γ_i·S0ᵀq_i + Σ_{j≤i} P\[i\]\[j\]·u_j (into rhs) and u·w of the chunk's `l`
    /// rows, each column's sum j ascending, unfused.
    fn outputs(dv: usize, l: usize, t: &mut Scratch) {
        for i in 0..l {
            let o = &mut t.rhs[i * dv..][..dv];
            for (o, qs) in o.iter_mut().zip(&t.qs[i * dv..][..dv]) {
                *o = t.gamma[i] * qs;
            }
            for (j, u_j) in t.u[..(i + 1) * dv].chunks_exact(dv).enumerate() {
                let p = t.p[i][j];
                for (o, u) in o.iter_mut().zip(u_j) {
                    *o += p * u;
                }
            }
            for (uw, u) in t.uw[i * dv..][..dv].iter_mut().zip(&t.u[i * dv..][..dv]) {
                *uw = u * t.w[i];
            }
        }
    }

    /// The right-hand side β·(v − Γ·S0ᵀk) of `row` in place of each column's S0ᵀk.
    fn right_hand_side(&self, head: usize, row: usize, ks: &mut [f32], gamma: f32, beta: f32) {
        let Heads {
            dv, kd, channels, ..
        } = self.heads;
        let v = &self.mixed[row * channels + 2 * kd + head * dv..][..dv];
        for (r, v) in ks.iter_mut().zip(v) {
            *r = (to_f32(*v) - gamma * *r) * beta;
        }
    }

    /// The chunk's products on the CUDA cores (`gdn::chunked`).
    fn cuda_cores(&self, head: usize, s: &mut [f32], rows: &[usize], t: &mut Scratch) {
        let Heads { dk, dv, .. } = self.heads;
        let l = rows.len();
        for i in 0..l {
            let (qi, ki) = (&t.q[i * dk..][..dk], &t.k[i * dk..][..dk]);
            for j in 0..=i {
                let kj = &t.k[j * dk..][..dk];
                let decay = (t.big_g[i] - t.big_g[j]).exp();
                t.p[i][j] = dot(qi, kj) * decay;
                if j < i {
                    t.a[i][j] = (dot(ki, kj) * decay) * t.beta[i];
                }
            }
        }
        // S0ᵀk and S0ᵀq of every column, i ascending (column by column, as the kernel's
        // threads sum them).
        for (i, &row) in rows.iter().enumerate() {
            let (ks, qs) = (&mut t.rhs[i * dv..][..dv], &mut t.qs[i * dv..][..dv]);
            ks.fill(0.0);
            qs.fill(0.0);
            let (qi, ki) = (&t.q[i * dk..][..dk], &t.k[i * dk..][..dk]);
            for (x, s_row) in s.chunks_exact(dv).enumerate() {
                for ((kv, qv), sv) in ks.iter_mut().zip(qs.iter_mut()).zip(s_row) {
                    *kv += ki[x] * sv;
                    *qv += qi[x] * sv;
                }
            }
            self.right_hand_side(head, row, ks, t.gamma[i], t.beta[i]);
        }
        Self::substitute(dv, l, t);
        Self::outputs(dv, l, t);
        let last = t.gamma[l - 1];
        for (x, s_row) in s.chunks_exact_mut(dv).enumerate() {
            for sv in s_row.iter_mut() {
                *sv *= last;
            }
            for (j, uw_j) in t.uw[..l * dv].chunks_exact(dv).enumerate() {
                let k = t.k[j * dk + x];
                for (sv, uw) in s_row.iter_mut().zip(uw_j) {
                    *sv += k * uw;
                }
            }
        }
    }

    /// The chunk's products on the tensor cores (`gdn::chunked_mma`): the pair products, the
    /// first state's and the state update each a sum from its start over TF32 operands, `mma`
    /// adding each exact product in k order, over the kernel's terms: the key dim padded to a
    /// multiple of 16 and (the update) the chunk to `CHUNK` rows, the padding zero, so a sum's
    /// sign of zero is the kernel's. The substitution and the outputs as on the CUDA cores.
    fn tensor_cores(&self, head: usize, s: &mut [f32], rows: &[usize], t: &mut Scratch) {
        let Heads { dk, dv, .. } = self.heads;
        let l = rows.len();
        let kp = dk.next_multiple_of(16);
        // TF32 operands, zero past the chunk's rows and the key dim.
        let (mut qt, mut kt) = (std::mem::take(&mut t.qt), std::mem::take(&mut t.kt));
        let (mut st, mut uwt) = (std::mem::take(&mut t.st), std::mem::take(&mut t.uwt));
        qt.clear();
        kt.clear();
        qt.resize(CHUNK * kp, 0.0);
        kt.resize(CHUNK * kp, 0.0);
        for i in 0..l {
            for x in 0..dk {
                qt[i * kp + x] = tf32(t.q[i * dk + x]);
                kt[i * kp + x] = tf32(t.k[i * dk + x]);
            }
        }
        for i in 0..CHUNK {
            for j in 0..CHUNK {
                let (mut p, mut a) = (0.0, 0.0);
                if i < l && j <= i {
                    let kj = &kt[j * kp..][..kp];
                    let decay = (t.big_g[i] - t.big_g[j]).exp();
                    p = mma_dot(0.0, &qt[i * kp..][..kp], kj) * decay;
                    if j < i {
                        a = (mma_dot(0.0, &kt[i * kp..][..kp], kj) * decay) * t.beta[i];
                    }
                }
                t.p[i][j] = p;
                t.a[i][j] = a;
            }
        }
        // K·S0 and Q·S0, x ascending over the padded key dim (its rows past dk add 0·0: +0).
        st.clear();
        st.extend(s.iter().map(|v| tf32(*v)));
        for (i, &row) in rows.iter().enumerate() {
            let (ks, qs) = (&mut t.rhs[i * dv..][..dv], &mut t.qs[i * dv..][..dv]);
            ks.fill(0.0);
            qs.fill(0.0);
            for (x, s_row) in st.chunks_exact(dv).enumerate() {
                let (kx, qx) = (kt[i * kp + x], qt[i * kp + x]);
                for ((kv, qv), sv) in ks.iter_mut().zip(qs.iter_mut()).zip(s_row) {
                    *kv = mma_fma(kx, *sv, *kv);
                    *qv = mma_fma(qx, *sv, *qv);
                }
            }
            if kp > dk {
                for v in ks.iter_mut().chain(qs.iter_mut()) {
                    *v += 0.0;
                }
            }
            self.right_hand_side(head, row, ks, t.gamma[i], t.beta[i]);
        }
        Self::substitute(dv, l, t);
        Self::outputs(dv, l, t);
        t.uw[l * dv..].fill(0.0);
        // S ← S0·Γ_last + Kᵀ·(U·w) over all `CHUNK` rows.
        uwt.clear();
        uwt.extend(t.uw.iter().map(|v| tf32(*v)));
        let last = t.gamma[l - 1];
        for (x, s_row) in s.chunks_exact_mut(dv).enumerate() {
            for sv in s_row.iter_mut() {
                *sv *= last;
            }
            for (j, uw_j) in uwt.chunks_exact(dv).enumerate() {
                let k = kt[j * kp + x];
                for (sv, uw) in s_row.iter_mut().zip(uw_j) {
                    *sv = mma_fma(k, *uw, *sv);
                }
            }
        }
        (t.qt, t.kt, t.st, t.uwt) = (qt, kt, st, uwt);
    }
}

/// `x` rounded to TF32 as `mma.sync` reads the value `cvt.rna.tf32.f32` gives (the host
/// emulation's `emu_cvt_rna_tf32`, then its top 19 bits): 10 mantissa bits, to nearest, ties
/// away from zero; infinities as they are; NaN the canonical NaN's top bits.
fn tf32(x: f32) -> f32 {
    let bits = x.to_bits();
    if x.is_nan() {
        return f32::from_bits(0x7fff_e000);
    }
    if bits & 0x7f80_0000 == 0x7f80_0000 {
        return x;
    }
    f32::from_bits(bits.wrapping_add(0x1000) & 0xffff_e000)
}

/// `start` plus Σ_i a\[i\]·b\[i\], i ascending, each product added fused (`mma.sync` as the
/// host emulation sums it).
fn mma_dot(start: f32, a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .fold(start, |acc, (x, y)| mma_fma(*x, *y, acc))
}

/// fma(a, b, acc) of two TF32 values, as the host emulation's mma takes each product, in f64:
/// the product of two 11-bit significands is exact there, so the f64 sum rounds at most once,
/// and only when the smaller term is below 2^-29 of the larger. Rounded to f32 it is then the
/// fma's value: an exact sum rounds once; an inexact one rounds to the larger term, which the
/// other cannot move by half an ulp, when that term is an f32 (`acc`, or a product in the
/// normal range). What is left (a product below f32's normal range beside a far smaller acc,
/// where two roundings could split a tie, and any value not finite) goes through `mul_add`, a
/// libm call many times slower.
#[inline]
fn mma_fma(a: f32, b: f32, acc: f32) -> f32 {
    let (p, c) = (a as f64 * b as f64, acc as f64);
    let s = p + c;
    // Without short circuits: a data-dependent branch here mispredicts in the hot loops.
    let single = (p.abs() < c.abs()) | (p.abs() >= f32::MIN_POSITIVE as f64) | (c - (s - p) == 0.0);
    if s.is_finite() & single {
        s as f32
    } else {
        a.mul_add(b, acc)
    }
}
