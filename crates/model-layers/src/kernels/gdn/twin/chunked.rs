//! CPU twin of `gdn::chunked` and `gdn::gates_chunked`: the gated delta rule in chunks of
//! [`GDN_CHUNK`] rows (Gated DeltaNet's chunked form; the formulas are in
//! `crates/kernels/cuda/gdn.cu`, "chunked recurrence"). Every sum runs its index ascending
//! from its first term, multiplies and adds unfused, as the CUDA kernel's threads do, so the
//! two agree byte for byte; against `recurrence` the values agree up to rounding (`differs`).
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

pub(in crate::kernels::gdn) fn chunked(a: ChunkedArgs<'_>) -> Result<(), GpuError> {
    let heads = recurrence_heads(a.ctx, [a.nk, a.dk, a.nv, a.dv])?;
    let rows_nv = size(a.ctx, &[a.rows.count(), heads.nv])?;
    let (beta, g) = (a.beta.len(rows_nv)?, a.g.len(rows_nv)?);
    chunked_launch!(a, heads).run(beta, g)
}

/// `gates` then `chunked`: the rows' gates as `gates` stores them, then the chunks over them.
pub(in crate::kernels::gdn) fn gates_chunked(a: GatesChunkedArgs<'_>) -> Result<(), GpuError> {
    let heads = recurrence_heads(a.ctx, [a.nk, a.dk, a.nv, a.dv])?;
    let (beta, g) = folded_gates(a.ctx, &heads, a.rows, [a.ba, a.a_log, a.dt_bias])?;
    chunked_launch!(a, heads).run(&beta, &g)
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
    fn run(self, beta: &[f32], g: &[f32]) -> Result<(), GpuError> {
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
        let Heads {
            nv,
            dk,
            dv,
            kd,
            channels,
            ..
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
            let v = &self.mixed[row * channels + 2 * kd + head * dv..][..dv];
            for (r, v) in ks.iter_mut().zip(v) {
                *r = (to_f32(*v) - t.gamma[i] * *r) * t.beta[i];
            }
        }
        // The substitution: u_i = rhs_i − Σ_{j<i} A\[i\]\[j\]·u_j, each column's sum j ascending
        // (the loops run over columns innermost; each column's order is the kernel's).
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
        // Outputs (into rhs) and u·w.
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
}
