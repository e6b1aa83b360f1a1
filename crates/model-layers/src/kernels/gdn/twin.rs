//! CPU twins of the `gdn` kernels (Qwen3-Next's gated DeltaNet): `gdn::conv`, `gdn::gates`,
//! `gdn::recurrence`, `gdn::gated_norm`. Geometry and state layout: see the module doc.
//!
//! Rows run in row order on their slots, so a launch equals its rows launched one at a time in
//! sequence: with `chain` = 1 every row continues `slots\[0\]`; with `chain` = 0 rows sharing a
//! slot (padding rows on a scratch slot) follow each other; with `chain` = 2 each run of
//! consecutive rows on one slot continues it (a slot may not come back after another's run).
//! A row writing another slot than it reads (`out_slots`) has its read slot's state moved
//! there first (`slots`), then advanced in place, so the slot read is untouched. The
//! recurrence, the only heavy
//! kernel, splits into (slot, v head) tasks that own disjoint state, output and snapshot
//! ranges and walk their rows in order, so its bytes do not depend on the thread count.

mod chunked;
mod slots;

use std::collections::hash_map::{Entry, HashMap};

use half::bf16;
use solder_gpu_runtime::{par_chunks_mut, GpuError, TwinCtx};

use super::{ConvArgs, GatedNormArgs, GatesArgs, GatesRecurrenceArgs, RecurrenceArgs, GDN_MAX_DK};
use crate::kernels::args::{macs, size, threads_for, Dim, In, InOpt, Out, OutOpt};
use crate::numerics::{inv_rms, sum_squares_bf16, to_bf16, to_f32};
pub(super) use chunked::{chunked, chunked_mma, gates_chunked, gates_chunked_mma};
use slots::advanced_slots;

/// The eps of the l2-normalisation of q and k (HF's `l2norm`).
const L2NORM_EPS: f32 = 1e-6;

/// x / (1 + exp(−x)), in f32.
#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// torch's softplus (beta 1, threshold 20).
#[inline(always)]
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The head counts: both at least 1, `nv` a multiple of `nk`. Returns (nk, nv, nv / nk).
fn head_counts(nk: Dim<'_>, nv: Dim<'_>) -> Result<(usize, usize, usize), GpuError> {
    let (k_heads, v_heads) = (nk.dim()?, nv.dim()?);
    if v_heads % k_heads != 0 {
        return Err(nv.bad(format!(
            "{v_heads} value heads are not a multiple of the {k_heads} key heads"
        )));
    }
    Ok((k_heads, v_heads, v_heads / k_heads))
}

fn add(ctx: &TwinCtx<'_>, a: usize, b: usize) -> Result<usize, GpuError> {
    a.checked_add(b)
        .ok_or_else(|| ctx.fail(format!("{a} + {b} overflows the address space")))
}

/// The head geometry of a launch (the module doc).
#[derive(Debug, Clone, Copy)]
struct Heads {
    nv: usize,
    dk: usize,
    dv: usize,
    /// v heads per k head.
    ratio: usize,
    /// Width of one k head's qkvz group: 2·dk + 2·ratio·dv.
    group: usize,
    /// nk·dk.
    kd: usize,
    /// Conv channels: 2·kd + nv·dv.
    channels: usize,
    /// One qkvz row: nk·group.
    qkvz_row: usize,
}

impl Heads {
    /// The geometry of nk key heads of dk and nv value heads of dv.
    fn read(ctx: &TwinCtx<'_>, [nk, dk, nv, dv]: [Dim<'_>; 4]) -> Result<Heads, GpuError> {
        let (nk, nv, ratio) = head_counts(nk, nv)?;
        let (dk, dv) = (dk.dim()?, dv.dim()?);
        let kd = size(ctx, &[nk, dk])?;
        let group = add(ctx, size(ctx, &[2, dk])?, size(ctx, &[2, ratio, dv])?)?;
        Ok(Heads {
            nv,
            dk,
            dv,
            ratio,
            group,
            kd,
            channels: add(ctx, size(ctx, &[2, kd])?, size(ctx, &[nv, dv])?)?,
            qkvz_row: size(ctx, &[nk, group])?,
        })
    }

    /// Where conv channel `c` (HF's cat(query, key, value)) sits in a qkvz row.
    fn channel_source(&self, c: usize) -> usize {
        let (dk, dv, kd) = (self.dk, self.dv, self.kd);
        if c < kd {
            (c / dk) * self.group + c % dk
        } else if c < 2 * kd {
            let c = c - kd;
            (c / dk) * self.group + dk + c % dk
        } else {
            let c = c - 2 * kd;
            let vh = c / dv;
            (vh / self.ratio) * self.group + 2 * dk + (vh % self.ratio) * dv + c % dv
        }
    }

    /// Where v head `vh`'s z starts in a qkvz row.
    fn z_source(&self, vh: usize) -> usize {
        (vh / self.ratio) * self.group
            + 2 * self.dk
            + self.ratio * self.dv
            + (vh % self.ratio) * self.dv
    }
}

/// One channel of the conv for one token: the SiLU of the causal dot over (history, x), then
/// x enters the history.
#[inline]
fn conv_channel(w: &[bf16], hist: &mut [bf16], x: bf16) -> bf16 {
    let k = hist.len();
    let mut acc = 0.0f32;
    for (w, h) in w.iter().zip(hist.iter()) {
        acc += to_f32(*w) * to_f32(*h);
    }
    acc += to_f32(w[k]) * to_f32(x);
    hist.copy_within(1.., 0);
    hist[k - 1] = x;
    to_bf16(silu(acc))
}

pub(super) fn conv(a: ConvArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, heads) = (a.rows.count(), Heads::read(ctx, [a.nk, a.dk, a.nv, a.dv])?);
    let (kernel, num_slots) = (a.kernel.dim()?, a.num_slots.dim()?);
    if kernel < 2 {
        return Err(a.kernel.bad("the conv kernel width must be at least 2"));
    }
    let (channels, hist) = (heads.channels, kernel - 1);
    let slot_elems = size(ctx, &[channels, hist])?;
    let qkvz = a.qkvz.len(size(ctx, &[rows, heads.qkvz_row])?)?;
    let w = a.w.len(size(ctx, &[channels, kernel])?)?;
    let state = a.state.len(size(ctx, &[num_slots, slot_elems])?)?;
    let slots = [a.slots.len(rows)?, a.out_slots.len(rows)?];
    let out = a.out.len(size(ctx, &[rows, channels])?)?;
    let mut snapshots = a.snapshots.len(size(ctx, &[rows, slot_elems])?)?;
    let keep = a.keep.len(rows)?;
    let chain = (a.chain, false);
    let row_slots = advanced_slots(ctx, slots, num_slots, chain, state, slot_elems)?;
    let sources: Vec<usize> = (0..channels).map(|c| heads.channel_source(c)).collect();
    for (r, (x, o)) in qkvz
        .chunks_exact(heads.qkvz_row)
        .zip(out.chunks_exact_mut(channels))
        .enumerate()
    {
        let slot = &mut state[row_slots[r] * slot_elems..][..slot_elems];
        for (c, (o, h)) in o.iter_mut().zip(slot.chunks_exact_mut(hist)).enumerate() {
            *o = conv_channel(&w[c * kernel..][..kernel], h, x[sources[c]]);
        }
        if let Some(s) = snapshots.as_deref_mut().filter(|_| kept(keep, r)) {
            s[r * slot_elems..][..slot_elems].copy_from_slice(slot);
        }
    }
    Ok(())
}

pub(super) fn gates(a: GatesArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let rows = a.rows.count();
    let (_, nv, ratio) = head_counts(a.nk, a.nv)?;
    let ba = a.ba.len(size(ctx, &[rows, 2, nv])?)?;
    let a_log = a.a_log.len(nv)?;
    let dt_bias = a.dt_bias.len(nv)?;
    let beta = a.beta.len(size(ctx, &[rows, nv])?)?;
    let g = a.g.len(size(ctx, &[rows, nv])?)?;
    gate_values([ba, a_log, dt_bias], nv, ratio, beta, g);
    Ok(())
}

/// Every row's beta = sigmoid(b) and g = −exp(a_log) · softplus(a + dt_bias) from
/// `[ba, a_log, dt_bias]` (lengths checked): `gates`' arithmetic, and what `gates_recurrence`
/// computes where its recurrence reads them.
fn gate_values(
    [ba, a_log, dt_bias]: [&[bf16]; 3],
    nv: usize,
    ratio: usize,
    beta: &mut [f32],
    g: &mut [f32],
) {
    for ((ba, beta), g) in ba
        .chunks_exact(2 * nv)
        .zip(beta.chunks_exact_mut(nv))
        .zip(g.chunks_exact_mut(nv))
    {
        for vh in 0..nv {
            // HF views ba as [nk][b r | a r].
            let at = (vh / ratio) * 2 * ratio + vh % ratio;
            let (b, a) = (to_f32(ba[at]), to_f32(ba[at + ratio]));
            beta[vh] = 1.0 / (1.0 + (-b).exp());
            g[vh] = -(to_f32(a_log[vh]).exp()) * softplus(a + to_f32(dt_bias[vh]));
        }
    }
}

/// The per-launch inputs of the recurrence.
struct Recurrence<'a> {
    heads: Heads,
    mixed: &'a [bf16],
    beta: &'a [f32],
    g: &'a [f32],
}

/// Per-thread scratch of the recurrence.
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    acc: Vec<f32>,
    delta: Vec<f32>,
}

/// x · (1 / sqrt(Σx² + eps)), widened to f32.
fn l2norm(x: &[bf16], out: &mut [f32]) {
    let inv = 1.0 / (sum_squares_bf16(x) + L2NORM_EPS).sqrt();
    for (o, v) in out.iter_mut().zip(x) {
        *o = to_f32(*v) * inv;
    }
}

/// q and k of v head `head`'s key head from a conv output row `m`, l2-normalised, q scaled
/// by 1/sqrt(dk) (the CUDA kernels' `recurrence_qk`): what the recurrence and its chunked form
/// both read.
fn normalised_qk(heads: &Heads, m: &[bf16], head: usize, q: &mut [f32], k: &mut [f32]) {
    let (dk, kd, kh) = (heads.dk, heads.kd, head / heads.ratio);
    l2norm(&m[kh * dk..][..dk], q);
    l2norm(&m[kd + kh * dk..][..dk], k);
    let scale = (dk as f32).sqrt();
    for q in q.iter_mut() {
        *q /= scale;
    }
}

impl Recurrence<'_> {
    /// One token of v head `head` on its state `s` (`[dk]\[dv\]`), output into `out` (dv).
    fn step(&self, row: usize, head: usize, s: &mut [f32], t: &mut Scratch, out: &mut [bf16]) {
        let Heads { dv, kd, .. } = self.heads;
        let m = &self.mixed[row * self.heads.channels..][..self.heads.channels];
        normalised_qk(&self.heads, m, head, &mut t.q, &mut t.k);
        let v = &m[2 * kd + head * dv..][..dv];
        let at = row * self.heads.nv + head;
        let (decay, beta) = (self.g[at].exp(), self.beta[at]);
        for x in s.iter_mut() {
            *x *= decay;
        }
        t.acc.fill(0.0);
        for (s_row, k) in s.chunks_exact(dv).zip(&t.k) {
            for (a, x) in t.acc.iter_mut().zip(s_row) {
                *a += *x * *k;
            }
        }
        for ((d, a), v) in t.delta.iter_mut().zip(&t.acc).zip(v) {
            *d = (to_f32(*v) - *a) * beta;
        }
        for (s_row, k) in s.chunks_exact_mut(dv).zip(&t.k) {
            for (x, d) in s_row.iter_mut().zip(&t.delta) {
                *x += *k * *d;
            }
        }
        t.acc.fill(0.0);
        for (s_row, q) in s.chunks_exact(dv).zip(&t.q) {
            for (a, x) in t.acc.iter_mut().zip(s_row) {
                *a += *x * *q;
            }
        }
        for (o, a) in out.iter_mut().zip(&t.acc) {
            *o = to_bf16(*a);
        }
    }
}

/// Whether row `r` writes its snapshot: its `keep` flag is not 0, or there are no flags.
fn kept(keep: Option<&[i32]>, r: usize) -> bool {
    keep.is_none_or(|k| k[r] != 0)
}

/// One row of a head task: its output head and, when asked, where the state goes after it.
struct Step<'a> {
    row: usize,
    out: &'a mut [bf16],
    snapshot: Option<&'a mut [f32]>,
}

/// One (slot, v head) state and the rows that advance it, in row order.
struct HeadTask<'a> {
    head: usize,
    state: &'a mut [f32],
    steps: Vec<Step<'a>>,
}

/// Splits state, outputs and snapshots (of the rows `keep` keeps) into disjoint (slot, v
/// head) tasks.
fn head_tasks<'a>(
    state: &'a mut [f32],
    out: &'a mut [bf16],
    (snapshots, keep): (Option<&'a mut [f32]>, Option<&[i32]>),
    row_slots: &[usize],
    heads: &Heads,
) -> Vec<HeadTask<'a>> {
    let (nv, dv, head_elems) = (heads.nv, heads.dv, heads.dk * heads.dv);
    let mut states: Vec<Option<&'a mut [f32]>> =
        state.chunks_exact_mut(head_elems).map(Some).collect();
    let snapshots: Vec<Option<&'a mut [f32]>> = match snapshots {
        Some(s) => s.chunks_exact_mut(head_elems).map(Some).collect(),
        None => (0..row_slots.len() * nv).map(|_| None).collect(),
    };
    let mut task_of: HashMap<usize, usize> = HashMap::new();
    let mut tasks: Vec<HeadTask<'a>> = Vec::new();
    for ((i, out), snapshot) in out.chunks_exact_mut(dv).enumerate().zip(snapshots) {
        let (row, head) = (i / nv, i % nv);
        let key = row_slots[row] * nv + head;
        let snapshot = snapshot.filter(|_| kept(keep, row));
        let step = Step { row, out, snapshot };
        match task_of.entry(key) {
            Entry::Occupied(t) => tasks[*t.get()].steps.push(step),
            Entry::Vacant(t) => {
                // First sight of this (slot, head): its state range is still unclaimed.
                if let Some(state) = states[key].take() {
                    t.insert(tasks.len());
                    tasks.push(HeadTask {
                        head,
                        state,
                        steps: vec![step],
                    });
                }
            }
        }
    }
    tasks
}

pub(super) fn recurrence(a: RecurrenceArgs<'_>) -> Result<(), GpuError> {
    recurrence_on(a, false)
}

/// `gdn::recurrence`'s arguments and arithmetic, for the runtime route whose rows' slots are
/// evenly pitched: row r runs on `slots\[0\] + r * (slots\[1\] - slots\[0\])`, addressed as one
/// strided batch instead of gathered; `chain` must be 0.
pub(super) fn recurrence_pitched(a: RecurrenceArgs<'_>) -> Result<(), GpuError> {
    recurrence_on(a, true)
}

/// The `RecurrenceLaunch` of a launch view that has every field of it (`RecurrenceArgs`,
/// `GatesRecurrenceArgs`), with its checked `heads`.
macro_rules! recurrence_launch {
    ($a:expr, $heads:expr) => {
        RecurrenceLaunch {
            ctx: $a.ctx,
            heads: $heads,
            mixed: $a.mixed,
            state: $a.state,
            slots: $a.slots,
            out_slots: $a.out_slots,
            out: $a.out,
            snapshots: $a.snapshots,
            keep: $a.keep,
            rows: $a.rows,
            num_slots: $a.num_slots,
            chain: $a.chain,
        }
    };
}

fn recurrence_on(a: RecurrenceArgs<'_>, pitched: bool) -> Result<(), GpuError> {
    let heads = recurrence_heads(a.ctx, [a.nk, a.dk, a.nv, a.dv])?;
    let rows_nv = size(a.ctx, &[a.rows.count(), heads.nv])?;
    let (beta, g) = (a.beta.len(rows_nv)?, a.g.len(rows_nv)?);
    recurrence_launch!(a, heads).run(pitched, beta, g)
}

pub(super) fn gates_recurrence(a: GatesRecurrenceArgs<'_>) -> Result<(), GpuError> {
    gates_recurrence_on(a, false)
}

pub(super) fn gates_recurrence_pitched(a: GatesRecurrenceArgs<'_>) -> Result<(), GpuError> {
    gates_recurrence_on(a, true)
}

/// `gates` then `recurrence` (or `recurrence_pitched`): the rows' gates into f32 buffers as
/// `gates` stores them, then the recurrence over them.
fn gates_recurrence_on(a: GatesRecurrenceArgs<'_>, pitched: bool) -> Result<(), GpuError> {
    let heads = recurrence_heads(a.ctx, [a.nk, a.dk, a.nv, a.dv])?;
    let (beta, g) = folded_gates(a.ctx, &heads, a.rows, [a.ba, a.a_log, a.dt_bias])?;
    recurrence_launch!(a, heads).run(pitched, &beta, &g)
}

/// The gates a gates-folded kernel computes where it reads them: every row's beta and g
/// (f32\[rows·nv\] each) from `[ba, a_log, dt_bias]`, as `gates` stores them.
fn folded_gates(
    ctx: &TwinCtx<'_>,
    heads: &Heads,
    rows: Dim<'_>,
    [ba, a_log, dt_bias]: [In<'_, bf16>; 3],
) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
    let rows = rows.count();
    let ba = ba.len(size(ctx, &[rows, 2, heads.nv])?)?;
    let a_log = a_log.len(heads.nv)?;
    let dt_bias = dt_bias.len(heads.nv)?;
    let rows_nv = size(ctx, &[rows, heads.nv])?;
    let (mut beta, mut g) = (vec![0.0f32; rows_nv], vec![0.0f32; rows_nv]);
    gate_values(
        [ba, a_log, dt_bias],
        heads.nv,
        heads.ratio,
        &mut beta,
        &mut g,
    );
    Ok((beta, g))
}

/// The head geometry of a recurrence launch; the CUDA kernels keep q and k of a head in shared
/// memory, so a key head dim above `GDN_MAX_DK` is refused.
fn recurrence_heads(ctx: &TwinCtx<'_>, dims: [Dim<'_>; 4]) -> Result<Heads, GpuError> {
    let heads = Heads::read(ctx, dims)?;
    if heads.dk > GDN_MAX_DK as usize {
        return Err(dims[1].bad(format!(
            "key head dim {} above the kernels' {GDN_MAX_DK}",
            heads.dk
        )));
    }
    Ok(heads)
}

/// A recurrence launch's buffers and scalars besides its gates (`recurrence` and
/// `gates_recurrence` share them).
struct RecurrenceLaunch<'c> {
    ctx: &'c TwinCtx<'c>,
    heads: Heads,
    mixed: In<'c, bf16>,
    state: Out<'c, f32>,
    slots: In<'c, i32>,
    out_slots: In<'c, i32>,
    out: Out<'c, bf16>,
    snapshots: OutOpt<'c, f32>,
    keep: InOpt<'c, i32>,
    rows: Dim<'c>,
    num_slots: Dim<'c>,
    chain: Dim<'c>,
}

impl RecurrenceLaunch<'_> {
    /// Checks the buffers, then advances every (slot, v head) over its rows with the rows'
    /// gates `beta`, `g` (f32\[rows·nv\], lengths checked).
    fn run(self, pitched: bool, beta: &[f32], g: &[f32]) -> Result<(), GpuError> {
        let (ctx, heads) = (self.ctx, self.heads);
        let (rows, num_slots) = (self.rows.count(), self.num_slots.dim()?);
        let (nv, dk, dv) = (heads.nv, heads.dk, heads.dv);
        let slot_elems = size(ctx, &[nv, dk, dv])?;
        let mixed = self.mixed.len(size(ctx, &[rows, heads.channels])?)?;
        let state = self.state.len(size(ctx, &[num_slots, slot_elems])?)?;
        let slots = [self.slots.len(rows)?, self.out_slots.len(rows)?];
        let out = self.out.len(size(ctx, &[rows, nv, dv])?)?;
        let snapshots = self.snapshots.len(size(ctx, &[rows, slot_elems])?)?;
        let keep = self.keep.len(rows)?;
        let chain = (self.chain, pitched);
        let row_slots = advanced_slots(ctx, slots, num_slots, chain, state, slot_elems)?;
        let inputs = Recurrence {
            heads,
            mixed,
            beta,
            g,
        };
        inputs.advance(ctx, state, out, (snapshots, keep), &row_slots);
        Ok(())
    }
}

impl Recurrence<'_> {
    /// Every (slot, v head) task over its rows in order (`head_tasks`), in parallel.
    fn advance(
        &self,
        ctx: &TwinCtx<'_>,
        state: &mut [f32],
        out: &mut [bf16],
        snapshots: (Option<&mut [f32]>, Option<&[i32]>),
        row_slots: &[usize],
    ) {
        let heads = self.heads;
        let (rows, nv, dk, dv) = (row_slots.len(), heads.nv, heads.dk, heads.dv);
        let inputs = self;
        let mut tasks = head_tasks(state, out, snapshots, row_slots, &heads);
        let threads = threads_for(ctx, macs(&[rows, nv, dk, dv, 4]));
        let per_chunk = tasks.len().div_ceil(threads).max(1);
        par_chunks_mut(&mut tasks, per_chunk, threads, |_, chunk| {
            let mut scratch = Scratch {
                q: vec![0.0; dk],
                k: vec![0.0; dk],
                acc: vec![0.0; dv],
                delta: vec![0.0; dv],
            };
            for task in chunk {
                for step in &mut task.steps {
                    inputs.step(step.row, task.head, task.state, &mut scratch, step.out);
                    if let Some(s) = step.snapshot.as_deref_mut() {
                        s.copy_from_slice(task.state);
                    }
                }
            }
        });
    }
}

pub(super) fn gated_norm(a: GatedNormArgs<'_>) -> Result<(), GpuError> {
    let g = GatedNormIn {
        core: a.core,
        qkvz: a.qkvz,
        w: a.w,
        dims: [a.nk, a.dk, a.nv, a.dv],
        eps: a.eps,
    };
    let values = gated_norm_values(a.ctx, g, a.rows.count())?;
    a.out.len(values.len())?.copy_from_slice(&values);
    Ok(())
}

/// The inputs of Gated DeltaNet's gated RMSNorm: `gdn::gated_norm`'s, and the staging of
/// `gemv::gated_norm_linear_residual_add`.
pub(crate) struct GatedNormIn<'a> {
    pub core: In<'a, bf16>,
    pub qkvz: In<'a, bf16>,
    pub w: In<'a, bf16>,
    /// nk, dk, nv, dv.
    pub dims: [Dim<'a>; 4],
    pub eps: f32,
}

/// RMSNorm of each v head of `rows` rows of core (weight w) times silu(z): `\[rows·nv·dv\]`.
pub(crate) fn gated_norm_values(
    ctx: &TwinCtx<'_>,
    g: GatedNormIn<'_>,
    rows: usize,
) -> Result<Vec<bf16>, GpuError> {
    let heads = Heads::read(ctx, g.dims)?;
    let (nv, dv) = (heads.nv, heads.dv);
    let n = size(ctx, &[rows, nv, dv])?;
    let core = g.core.len(n)?;
    let qkvz = g.qkvz.len(size(ctx, &[rows, heads.qkvz_row])?)?;
    let w = g.w.len(dv)?;
    let mut out = vec![bf16::ZERO; n];
    for (i, (x, o)) in core
        .chunks_exact(dv)
        .zip(out.chunks_exact_mut(dv))
        .enumerate()
    {
        let (row, vh) = (i / nv, i % nv);
        let z = &qkvz[row * heads.qkvz_row + heads.z_source(vh)..][..dv];
        let inv = inv_rms(sum_squares_bf16(x), dv, g.eps);
        for (((o, x), w), z) in o.iter_mut().zip(x).zip(w).zip(z) {
            *o = to_bf16(((to_f32(*x) * inv) * to_f32(*w)) * silu(to_f32(*z)));
        }
    }
    Ok(out)
}
