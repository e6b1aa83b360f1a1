//! CPU twins of the `moe` kernels.
//!
//! Routing: a row's softmax in f32 (max, exp, moe.cu's sum in 32 strided lanes, divide), then the top k by
//! repeated selection (descending, ties to the lower expert id); the fused router gets its
//! logits from the driver `gemv::lm_head` uses, so its bytes equal that routing's.
//!
//! Expert MLP: the (row, pick) slots are grouped by expert so each chosen expert's weights are
//! read once per launch, and each group is split into fixed tiles of output features. Every
//! output is computed by one tile with `dot_bf16`'s arithmetic and, for `down`, summed over the
//! picks in pick order afterwards, so results depend neither on the thread count nor on the
//! grouping.

use half::bf16;
use solder_gpu_runtime::{par_chunks_mut, GpuError, TwinCtx};

use solder_circuit::WeightFormat;

use super::dequant;
use super::{
    CombineSharedArgs, DownArgs, DownCombineArgs, DownFp8Args, DownInt4Args, GateCombineSharedArgs,
    GateUpSiluArgs, GateUpSiluFp8Args, GateUpSiluInt4Args, RouterTopkArgs, TopkSoftmaxArgs,
};
use crate::kernels::act::sigmoid;
use crate::kernels::args::{macs, size, threads_for, Dim, In, Out};
use crate::kernels::gemv::matvec::{for_each_dot, Widened};
use crate::numerics::{linear_value, silu_mul_value, to_bf16, to_f32, warp_strided_sum};

/// Output features per work tile of the expert projections (fixed, so the split never
/// depends on the thread count).
const TILE_FEATURES: usize = 64;

/// The picks per row of a routing launch: 1 ≤ k ≤ experts.
fn picks(k: Dim<'_>, experts: usize) -> Result<usize, GpuError> {
    match k.count() {
        n if (1..=experts).contains(&n) => Ok(n),
        n => Err(k.bad(format!(
            "k = {n} picks per row, expected 1..={experts} (the expert count)"
        ))),
    }
}

/// Scratch of one routing pass, reused across rows.
#[derive(Default)]
struct Router {
    probs: Vec<f32>,
    taken: Vec<bool>,
}

impl Router {
    /// Softmax of one row of logits, then its top `ids.len()` experts and their weights.
    fn row(&mut self, logits: &[f32], norm_topk: bool, ids: &mut [i32], weights: &mut [f32]) {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        self.probs.clear();
        self.probs.extend(logits.iter().map(|l| (*l - max).exp()));
        let sum = warp_strided_sum(&self.probs);
        for p in &mut self.probs {
            *p /= sum;
        }
        self.taken.clear();
        self.taken.resize(logits.len(), false);
        for (id, weight) in ids.iter_mut().zip(weights.iter_mut()) {
            // Strictly greater replaces, scanning upwards: a tie keeps the lower id.
            let mut best: Option<usize> = None;
            for (i, p) in self.probs.iter().enumerate() {
                if !self.taken[i] && best.is_none_or(|b| *p > self.probs[b]) {
                    best = Some(i);
                }
            }
            let Some(b) = best else { break };
            self.taken[b] = true;
            *id = b as i32;
            *weight = self.probs[b];
        }
        if norm_topk {
            let mut picked = 0.0f32;
            for w in weights.iter() {
                picked += *w;
            }
            for w in weights.iter_mut() {
                *w /= picked;
            }
        }
    }

    /// Routes every row of `logits` (`[rows]\[experts\]`).
    fn rows(
        logits: &[f32],
        experts: usize,
        k: usize,
        norm_topk: bool,
        ids: &mut [i32],
        weights: &mut [f32],
    ) {
        let mut router = Router::default();
        for ((row, ids), weights) in logits
            .chunks_exact(experts)
            .zip(ids.chunks_exact_mut(k))
            .zip(weights.chunks_exact_mut(k))
        {
            router.row(row, norm_topk, ids, weights);
        }
    }
}

pub(super) fn topk_softmax(a: TopkSoftmaxArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, experts) = (a.rows.count(), a.experts.dim()?);
    let (k, norm_topk) = (picks(a.k, experts)?, a.norm_topk.get() != 0);
    let logits = a.logits.len(size(ctx, &[rows, experts])?)?;
    let ids = a.ids.len(size(ctx, &[rows, k])?)?;
    let weights = a.weights.len(size(ctx, &[rows, k])?)?;
    Router::rows(logits, experts, k, norm_topk, ids, weights);
    Ok(())
}

/// lm_head → topk_softmax, the logits kept in a local buffer.
pub(super) fn router_topk(a: RouterTopkArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, hidden, experts) = (a.rows.count(), a.hidden.dim()?, a.experts.dim()?);
    let (k, norm_topk) = (picks(a.k, experts)?, a.norm_topk.get() != 0);
    let x = a.x.len(size(ctx, &[rows, hidden])?)?;
    let w = a.w.len(size(ctx, &[experts, hidden])?)?;
    let ids = a.ids.len(size(ctx, &[rows, k])?)?;
    let weights = a.weights.len(size(ctx, &[rows, k])?)?;
    let mut logits = vec![0.0f32; rows * experts];
    let threads = threads_for(ctx, macs(&[rows, hidden, experts]));
    for_each_dot(
        threads,
        &Widened::new(x, hidden),
        experts,
        |o| &w[o * hidden..(o + 1) * hidden],
        |_, _, d| d,
        &mut logits,
    );
    Router::rows(&logits, experts, k, norm_topk, ids, weights);
    Ok(())
}

/// The expert of every slot (r·k + j), refusing ids outside `0..experts`.
pub(crate) fn expert_ids(
    ctx: &TwinCtx<'_>,
    ids: &[i32],
    k: usize,
    experts: usize,
) -> Result<Vec<usize>, GpuError> {
    ids.iter()
        .enumerate()
        .map(|(slot, id)| match usize::try_from(*id) {
            Ok(e) if e < experts => Ok(e),
            _ => Err(ctx.fail(format!(
                "row {} pick {}: expert id {id} outside 0..{experts}",
                slot / k,
                slot % k
            ))),
        })
        .collect()
}

/// The slots that chose one expert (ascending) and their input rows, widened once.
struct Group {
    expert: usize,
    slots: Vec<usize>,
    xs: Widened,
}

/// One group per chosen expert, in expert order; `input(slot)` is the slot's input row.
fn groups<'a>(
    slot_experts: &[usize],
    experts: usize,
    width: usize,
    input: impl Fn(usize) -> &'a [bf16],
) -> Vec<Group> {
    let mut by_expert = vec![Vec::new(); experts];
    for (slot, e) in slot_experts.iter().enumerate() {
        by_expert[*e].push(slot);
    }
    by_expert
        .into_iter()
        .enumerate()
        .filter(|(_, slots)| !slots.is_empty())
        .map(|(expert, slots)| {
            let rows: Vec<bf16> = slots.iter().flat_map(|s| input(*s)).copied().collect();
            Group {
                expert,
                xs: Widened::new(&rows, width),
                slots,
            }
        })
        .collect()
}

/// Output features `first..first + count` of one group: `values` is `[slots]\[count\]`.
struct Tile<'g, T> {
    group: &'g Group,
    first: usize,
    count: usize,
    values: Vec<T>,
}

/// Fills every tile of every group (`features` outputs each) with `fill`, on up to `threads`
/// threads.
fn run_tiles<'g, T: Send>(
    groups: &'g [Group],
    features: usize,
    threads: usize,
    fill: impl Fn(&Group, usize, usize) -> Vec<T> + Sync,
) -> Vec<Tile<'g, T>> {
    let mut tiles: Vec<Tile<'g, T>> = groups
        .iter()
        .flat_map(|group| {
            (0..features).step_by(TILE_FEATURES).map(move |first| Tile {
                group,
                first,
                count: TILE_FEATURES.min(features - first),
                values: Vec::new(),
            })
        })
        .collect();
    let per_chunk = tiles.len().div_ceil(threads * 4).max(1);
    par_chunks_mut(&mut tiles, per_chunk, threads, |_, chunk| {
        for t in chunk {
            t.values = fill(t.group, t.first, t.count);
        }
    });
    tiles
}

/// Per slot, the dense gate_up_silu of the chosen expert's matrices.
pub(super) fn gate_up_silu(a: GateUpSiluArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, hidden, inter) = (a.rows.count(), a.hidden.dim()?, a.inter.dim()?);
    let (experts, k) = (a.experts.dim()?, a.k.dim()?);
    let x = a.x.len(size(ctx, &[rows, hidden])?)?;
    let ids = a.ids.len(size(ctx, &[rows, k])?)?;
    let wg = a.wg.len(size(ctx, &[experts, inter, hidden])?)?;
    let wu = a.wu.len(size(ctx, &[experts, inter, hidden])?)?;
    let act = a.act.len(size(ctx, &[rows, k, inter])?)?;
    let slot_experts = expert_ids(ctx, ids, k, experts)?;
    gate_up_core(
        ctx,
        ExpertDims {
            rows,
            hidden,
            inter,
            experts,
            k,
        },
        x,
        &slot_experts,
        |e| &wg[e * inter * hidden..(e + 1) * inter * hidden],
        |e| &wu[e * inter * hidden..(e + 1) * inter * hidden],
        act,
    );
    Ok(())
}

/// The expert kernels' dims.
#[derive(Clone, Copy)]
struct ExpertDims {
    rows: usize,
    hidden: usize,
    inter: usize,
    experts: usize,
    k: usize,
}

/// gate_up_silu's arithmetic with the bf16 gate and up matrices `[inter][hidden]` of each
/// chosen expert from `gate(e)` and `up(e)`.
fn gate_up_core<'w>(
    ctx: &TwinCtx<'_>,
    d: ExpertDims,
    x: &[bf16],
    slot_experts: &[usize],
    gate: impl Fn(usize) -> &'w [bf16] + Sync,
    up: impl Fn(usize) -> &'w [bf16] + Sync,
    act: &mut [bf16],
) {
    let ExpertDims {
        rows,
        hidden,
        inter,
        experts,
        k,
    } = d;
    let groups = groups(slot_experts, experts, hidden, |s| {
        &x[(s / k) * hidden..(s / k + 1) * hidden]
    });
    let threads = threads_for(ctx, macs(&[rows, k, 2, inter, hidden]));
    let tiles = run_tiles(&groups, inter, threads, |group, first, count| {
        let (g, u) = (gate(group.expert), up(group.expert));
        // Gate then up as one projection of 2·count features, each stored bf16 as the
        // reference does.
        let mut both = vec![bf16::ZERO; group.slots.len() * 2 * count];
        for_each_dot(
            1,
            &group.xs,
            2 * count,
            |c| {
                let (w, i) = if c < count { (g, c) } else { (u, c - count) };
                &w[(first + i) * hidden..(first + i + 1) * hidden]
            },
            |_, _, d| linear_value(d, None),
            &mut both,
        );
        both.chunks_exact(2 * count)
            .flat_map(|gu| (0..count).map(move |i| silu_mul_value(gu[i], gu[count + i])))
            .collect()
    });
    for t in &tiles {
        for (values, slot) in t.values.chunks_exact(t.count).zip(&t.group.slots) {
            let at = slot * inter + t.first;
            act[at..at + t.count].copy_from_slice(values);
        }
    }
}

/// Per row, the f32 sum over picks in order of dot(act slot, wd\[e\] row) · weight, stored bf16.
pub(super) fn down(a: DownArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, hidden, inter) = (a.rows.count(), a.hidden.dim()?, a.inter.dim()?);
    let (experts, k) = (a.experts.dim()?, a.k.dim()?);
    let act = a.act.len(size(ctx, &[rows, k, inter])?)?;
    let ids = a.ids.len(size(ctx, &[rows, k])?)?;
    let weights = a.weights.len(size(ctx, &[rows, k])?)?;
    let wd = a.wd.len(size(ctx, &[experts, hidden, inter])?)?;
    let out = a.out.len(size(ctx, &[rows, hidden])?)?;
    let slot_experts = expert_ids(ctx, ids, k, experts)?;
    let d = ExpertDims {
        rows,
        hidden,
        inter,
        experts,
        k,
    };
    down_core(
        ctx,
        d,
        act,
        &slot_experts,
        weights,
        |e| &wd[e * hidden * inter..(e + 1) * hidden * inter],
        out,
    );
    Ok(())
}

/// down's sum from the picks' dots: per row and output, Σ_j dot · weight in pick order (f32,
/// each product rounded, then added), stored bf16.
pub(super) fn down_combine(a: DownCombineArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, hidden) = (a.rows.count(), a.hidden.dim()?);
    let (experts, k) = (a.experts.dim()?, a.k.dim()?);
    let dots = a.dots.len(size(ctx, &[rows, k, hidden])?)?;
    let ids = a.ids.len(size(ctx, &[rows, k])?)?;
    let weights = a.weights.len(size(ctx, &[rows, k])?)?;
    let out = a.out.len(size(ctx, &[rows, hidden])?)?;
    expert_ids(ctx, ids, k, experts)?;
    combine(ctx, dots, weights, (hidden, k), out);
    Ok(())
}

/// Each row's sum over its k picks in order of dot · weight (f32), stored bf16: down's last
/// step, shared by `down` and `down_combine`.
fn combine(
    ctx: &TwinCtx<'_>,
    dots: &[f32],
    weights: &[f32],
    (hidden, k): (usize, usize),
    out: &mut [bf16],
) {
    let threads = threads_for(ctx, out.len().saturating_mul(k));
    par_chunks_mut(out, hidden, threads, |r, row| {
        for (o, y) in row.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for j in 0..k {
                acc += dots[(r * k + j) * hidden + o] * weights[r * k + j];
            }
            *y = to_bf16(acc);
        }
    });
}

/// down's arithmetic with the bf16 matrix `[hidden][inter]` of each chosen expert from
/// `matrix(e)`.
fn down_core<'w>(
    ctx: &TwinCtx<'_>,
    d: ExpertDims,
    act: &[bf16],
    slot_experts: &[usize],
    weights: &[f32],
    matrix: impl Fn(usize) -> &'w [bf16] + Sync,
    out: &mut [bf16],
) {
    let ExpertDims {
        rows,
        hidden,
        inter,
        experts,
        k,
    } = d;
    let groups = groups(slot_experts, experts, inter, |s| {
        &act[s * inter..(s + 1) * inter]
    });
    let threads = threads_for(ctx, macs(&[rows, k, hidden, inter]));
    let tiles = run_tiles(&groups, hidden, threads, |group, first, count| {
        let wd = matrix(group.expert);
        let mut dots = vec![0.0f32; group.slots.len() * count];
        for_each_dot(
            1,
            &group.xs,
            count,
            |o| &wd[(first + o) * inter..(first + o + 1) * inter],
            |_, _, d| d,
            &mut dots,
        );
        dots
    });
    // Every slot's projection, `[rows·k][hidden]`, then each row's sum in pick order.
    let mut dots = vec![0.0f32; rows * k * hidden];
    for t in &tiles {
        for (values, slot) in t.values.chunks_exact(t.count).zip(&t.group.slots) {
            let at = slot * hidden + t.first;
            dots[at..at + t.count].copy_from_slice(values);
        }
    }
    combine(ctx, &dots, weights, (hidden, k), out);
}

// ---- quantized experts ---------------------------------------------------------------------

/// A stacked quantized blob (words) checked against `format` and `[experts, n, k]`, and each
/// chosen expert's matrix dequantised to bf16 (empty for the others).
pub(crate) fn dequant_chosen(
    blob: In<'_, u32>,
    format: WeightFormat,
    [experts, n, k]: [usize; 3],
    slot_experts: &[usize],
) -> Result<Vec<Vec<bf16>>, GpuError> {
    let (layout, bytes) =
        dequant::stack_layout(format, experts, n, k).map_err(|e| blob.at.bad(e))?;
    let words = blob.len(bytes.div_ceil(4))?;
    let mut chosen = vec![false; experts];
    for e in slot_experts {
        chosen[*e] = true;
    }
    Ok(chosen
        .iter()
        .enumerate()
        .map(|(e, c)| {
            if *c {
                let bytes = dequant::matrix_bytes(words, &layout, e);
                dequant::dequant_matrix(format, &layout, &bytes, n, k)
            } else {
                Vec::new()
            }
        })
        .collect())
}

/// gate_up_silu on quantized experts: each chosen expert's matrices dequantised to bf16, then
/// gate_up_silu's arithmetic unchanged.
#[allow(clippy::too_many_arguments)]
fn gate_up_quant(
    ctx: &TwinCtx<'_>,
    format: WeightFormat,
    x: In<'_, bf16>,
    ids: In<'_, i32>,
    wg: In<'_, u32>,
    wu: In<'_, u32>,
    act: Out<'_, bf16>,
    dims: [Dim<'_>; 5],
) -> Result<(), GpuError> {
    let [rows, hidden, inter, experts, k] = dims;
    let (rows, hidden, inter) = (rows.count(), hidden.dim()?, inter.dim()?);
    let (experts, k) = (experts.dim()?, k.dim()?);
    let x = x.len(size(ctx, &[rows, hidden])?)?;
    let ids = ids.len(size(ctx, &[rows, k])?)?;
    let slot_experts = expert_ids(ctx, ids, k, experts)?;
    let g = dequant_chosen(wg, format, [experts, inter, hidden], &slot_experts)?;
    let u = dequant_chosen(wu, format, [experts, inter, hidden], &slot_experts)?;
    let act = act.len(size(ctx, &[rows, k, inter])?)?;
    let d = ExpertDims {
        rows,
        hidden,
        inter,
        experts,
        k,
    };
    gate_up_core(ctx, d, x, &slot_experts, |e| &g[e], |e| &u[e], act);
    Ok(())
}

pub(super) fn gate_up_silu_fp8(a: GateUpSiluFp8Args<'_>) -> Result<(), GpuError> {
    let format = WeightFormat::Fp8 {
        block_n: a.block_n.get(),
        block_k: a.block_k.get(),
    };
    let dims = [a.rows, a.hidden, a.inter, a.experts, a.k];
    gate_up_quant(a.ctx, format, a.x, a.ids, a.wg, a.wu, a.act, dims)
}

pub(super) fn gate_up_silu_int4(a: GateUpSiluInt4Args<'_>) -> Result<(), GpuError> {
    let format = WeightFormat::Int4 {
        group: a.group.get(),
    };
    let dims = [a.rows, a.hidden, a.inter, a.experts, a.k];
    gate_up_quant(a.ctx, format, a.x, a.ids, a.wg, a.wu, a.act, dims)
}

/// down on quantized experts: each chosen expert's matrix dequantised to bf16, then down's
/// arithmetic unchanged.
#[allow(clippy::too_many_arguments)]
fn down_quant(
    ctx: &TwinCtx<'_>,
    format: WeightFormat,
    act: In<'_, bf16>,
    ids: In<'_, i32>,
    weights: In<'_, f32>,
    wd: In<'_, u32>,
    out: Out<'_, bf16>,
    dims: [Dim<'_>; 5],
) -> Result<(), GpuError> {
    let [rows, hidden, inter, experts, k] = dims;
    let (rows, hidden, inter) = (rows.count(), hidden.dim()?, inter.dim()?);
    let (experts, k) = (experts.dim()?, k.dim()?);
    let act = act.len(size(ctx, &[rows, k, inter])?)?;
    let ids = ids.len(size(ctx, &[rows, k])?)?;
    let weights = weights.len(size(ctx, &[rows, k])?)?;
    let slot_experts = expert_ids(ctx, ids, k, experts)?;
    let m = dequant_chosen(wd, format, [experts, hidden, inter], &slot_experts)?;
    let out = out.len(size(ctx, &[rows, hidden])?)?;
    let d = ExpertDims {
        rows,
        hidden,
        inter,
        experts,
        k,
    };
    down_core(ctx, d, act, &slot_experts, weights, |e| &m[e], out);
    Ok(())
}

pub(super) fn down_fp8(a: DownFp8Args<'_>) -> Result<(), GpuError> {
    let format = WeightFormat::Fp8 {
        block_n: a.block_n.get(),
        block_k: a.block_k.get(),
    };
    let dims = [a.rows, a.hidden, a.inter, a.experts, a.k];
    down_quant(a.ctx, format, a.act, a.ids, a.weights, a.wd, a.out, dims)
}

pub(super) fn down_int4(a: DownInt4Args<'_>) -> Result<(), GpuError> {
    let format = WeightFormat::Int4 {
        group: a.group.get(),
    };
    let dims = [a.rows, a.hidden, a.inter, a.experts, a.k];
    down_quant(a.ctx, format, a.act, a.ids, a.weights, a.wd, a.out, dims)
}

/// out = bf16(routed + sigmoid(gate\[r\]) · shared).
pub(super) fn combine_shared(a: CombineSharedArgs<'_>) -> Result<(), GpuError> {
    let (rows, hidden) = (a.rows.count(), a.hidden.dim()?);
    let n = size(a.ctx, &[rows, hidden])?;
    let gate = a.gate.len(rows)?;
    shared_combine(
        a.routed.len(n)?,
        a.shared.len(n)?,
        gate,
        a.out.len(n)?,
        hidden,
    );
    Ok(())
}

/// gate\[r\] = bf16(x\[r\] · wg + bg) (the driver and rounding of `gemv::linear`), then
/// `combine_shared`.
pub(super) fn gate_combine_shared(a: GateCombineSharedArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, hidden, k) = (a.rows.count(), a.hidden.dim()?, a.k.dim()?);
    let n = size(ctx, &[rows, hidden])?;
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let wg = a.wg.len(k)?;
    let bias = a.bg.len(1)?.map(|b| b[0]);
    let mut gate = vec![bf16::ZERO; rows];
    for_each_dot(
        threads_for(ctx, macs(&[rows, k])),
        &Widened::new(x, k),
        1,
        |_| wg,
        |_, _, d| linear_value(d, bias),
        &mut gate,
    );
    shared_combine(
        a.routed.len(n)?,
        a.shared.len(n)?,
        &gate,
        a.out.len(n)?,
        hidden,
    );
    Ok(())
}

/// out = bf16(routed + sigmoid(gate\[r\]) · shared), row by row.
fn shared_combine(
    routed: &[bf16],
    shared: &[bf16],
    gate: &[bf16],
    out: &mut [bf16],
    hidden: usize,
) {
    for (((o, a), b), g) in out
        .chunks_exact_mut(hidden)
        .zip(routed.chunks_exact(hidden))
        .zip(shared.chunks_exact(hidden))
        .zip(gate)
    {
        let s = sigmoid(to_f32(*g));
        for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
            *o = to_bf16(to_f32(*a) + s * to_f32(*b));
        }
    }
}
