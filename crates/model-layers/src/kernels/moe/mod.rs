//! `moe` module (`crates/kernels/cuda/moe.cu`): Mixture-of-Experts routing (softmax → top-k,
//! optionally fused with the router projection), the routed expert MLP (gate·up·SiLU, then
//! down with the weighted sum), and the shared expert's gated combine (Qwen3-Next), alone or
//! with the shared expert's one-feature gate projection inside (`gate_combine_shared`).
//!
//! Expert weights are stacked row-major: gate and up `[experts]\[inter\]\[hidden\]`, down
//! `[experts]\[hidden\]\[inter\]`. Picks are `ids i32\[rows·k\]` and `weights f32\[rows·k\]`.
//!
//! Quantized experts (`solder_circuit::format`): `gate_up_silu` and `down` have `_fp8` and
//! `_int4` entries that take each stacked blob as 32-bit words plus the format's parameters
//! (block_n, block_k; group), dequantise each weight to bf16 in registers and run the bf16
//! kernel's arithmetic unchanged; their twins dequantise each chosen expert (`dequant`) and run
//! the bf16 twin's. The emitter picks the entry from the expert slots' `WeightFormat`
//! (`GATE_UP_FORMATS`, `DOWN_FORMATS`).
//!
//! Grid: routing runs one block of 256 threads per row and keeps the row's probabilities in
//! dynamic shared memory; the expert projections run blocks of 256 threads (one warp per
//! output feature) over (pick, 8 output features) for gate·up and (row, 8 output features)
//! for down, whose warp sums its row's picks in order. Picks and rows are `grid.x` (no 65535
//! limit); feature tiles past 65535 are walked grid-stride by the kernels.

pub mod dequant;
mod twin;
pub(crate) use twin::{dequant_chosen, expert_ids};

use half::bf16;
use solder_circuit::ir::Op;
use solder_circuit::{OpKind, WeightFormat};
use solder_gpu_runtime::LaunchConfig;

use super::decl::kernel;
use super::grid::{elementwise, per_row};
use crate::error::ExecError;
use crate::kernels::emit_view::{View, R};

/// Threads of a routing block (one row).
const ROUTE_THREADS: u32 = 256;
/// Output features per expert-projection block (as in `gemv`).
const FEATURES_PER_BLOCK: u32 = 8;

fn route_config(rows: u32, experts: u32) -> LaunchConfig {
    LaunchConfig {
        shared_bytes: experts.saturating_mul(4),
        ..LaunchConfig::linear(rows, ROUTE_THREADS)
    }
}

/// Blocks over (`slices`, 8-feature tiles); grid.y is capped at CUDA's 65535 (the kernels
/// walk further tiles grid-stride).
fn expert_config(features: u32, slices: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [
            slices.max(1),
            features.div_ceil(FEATURES_PER_BLOCK).clamp(1, 65_535),
            1,
        ],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

kernel! {
    /// logits f32\[rows·experts\] → softmax → the `k` largest probabilities per row (descending,
    /// ties to the lower expert id): ids i32\[rows·k\], weights f32\[rows·k\], renormalised to sum 1
    /// when `norm_topk` != 0.
    pub struct TopkSoftmax / TopkSoftmaxArgs {
        logits: In<f32>,
        ids: Out<i32>,
        weights: Out<f32>,
        rows: U32,
        experts: U32,
        k: U32,
        norm_topk: U32,
    }
    grid(a) = route_config(a.rows, a.experts);
    TOPK_SOFTMAX = "moe::topk_softmax" => twin twin::topk_softmax, emit emit_topk_softmax;
}

kernel! {
    /// The router projection of x bf16\[rows·hidden\] (w bf16\[experts·hidden\], f32 logits kept
    /// on chip) then `topk_softmax`.
    pub struct RouterTopk / RouterTopkArgs {
        x: In<bf16>,
        w: In<bf16>,
        ids: Out<i32>,
        weights: Out<f32>,
        rows: U32,
        hidden: U32,
        experts: U32,
        k: U32,
        norm_topk: U32,
    }
    grid(a) = route_config(a.rows, a.experts);
    ROUTER_TOPK = "moe::router_topk" => twin twin::router_topk, emit emit_router_topk;
}

kernel! {
    /// For each row and pick j (expert ids\[r·k + j\]): act bf16\[(r·k + j)·inter ..\] =
    /// silu(x_r · wg\[e\]ᵀ) · (x_r · wu\[e\]ᵀ), each projection stored bf16 first.
    pub struct GateUpSilu / GateUpSiluArgs {
        x: In<bf16>,
        ids: In<i32>,
        wg: In<bf16>,
        wu: In<bf16>,
        act: Out<bf16>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
    }
    grid(a) = expert_config(a.inter, a.rows.saturating_mul(a.k));
    GATE_UP_SILU = "moe::gate_up_silu" => twin twin::gate_up_silu, emit emit_gate_up_silu;
}

kernel! {
    /// out bf16\[rows·hidden\] = Σ_j weights\[r·k + j\] · (act\[r·k + j\] · wd[ids\[r·k + j\]]ᵀ),
    /// summed in f32 over the picks in order, stored bf16 once.
    pub struct Down / DownArgs {
        act: In<bf16>,
        ids: In<i32>,
        weights: In<f32>,
        wd: In<bf16>,
        out: Out<bf16>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
    }
    grid(a) = expert_config(a.hidden, a.rows);
    DOWN = "moe::down" => twin twin::down, emit emit_down;
}

kernel! {
    /// moe::down's sum from dots computed apart (`gemm::experts_down_mma`): out
    /// bf16\[rows·hidden\] = Σ_j dots\[(r·k + j)·hidden + o\] · weights\[r·k + j\], summed in f32 over
    /// the picks in order, stored bf16 once.
    pub struct DownCombine / DownCombineArgs {
        dots: In<f32>,
        ids: In<i32>,
        weights: In<f32>,
        out: Out<bf16>,
        rows: U32,
        hidden: U32,
        experts: U32,
        k: U32,
    }
    grid(a) = super::grid::elementwise(a.rows as u64 * a.hidden as u64);
    DOWN_COMBINE = "moe::down_combine" => twin twin::down_combine, emit emit_down_combine;
}

kernel! {
    /// gate_up_silu on fp8 experts: wg, wu the stacked blobs (32-bit words) of
    /// `[experts]\[inter\]\[hidden\]` in `Fp8 { block_n, block_k }`, each weight dequantised
    /// to bf16, then gate_up_silu's arithmetic.
    pub struct GateUpSiluFp8 / GateUpSiluFp8Args {
        x: In<bf16>,
        ids: In<i32>,
        wg: In<u32>,
        wu: In<u32>,
        act: Out<bf16>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
        block_n: U32,
        block_k: U32,
    }
    grid(a) = expert_config(a.inter, a.rows.saturating_mul(a.k));
    GATE_UP_SILU_FP8 = "moe::gate_up_silu_fp8" => twin twin::gate_up_silu_fp8, emit emit_gate_up_silu;
}

kernel! {
    /// gate_up_silu on int4 experts: wg, wu the stacked blobs (32-bit words) of
    /// `[experts]\[inter\]\[hidden\]` in `Int4 { group }`, each weight dequantised to bf16,
    /// then gate_up_silu's arithmetic.
    pub struct GateUpSiluInt4 / GateUpSiluInt4Args {
        x: In<bf16>,
        ids: In<i32>,
        wg: In<u32>,
        wu: In<u32>,
        act: Out<bf16>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
        group: U32,
    }
    grid(a) = expert_config(a.inter, a.rows.saturating_mul(a.k));
    GATE_UP_SILU_INT4 = "moe::gate_up_silu_int4" => twin twin::gate_up_silu_int4, emit emit_gate_up_silu;
}

kernel! {
    /// down on fp8 experts: wd the stacked blob (32-bit words) of
    /// `[experts]\[hidden\]\[inter\]` in `Fp8 { block_n, block_k }`, each weight dequantised
    /// to bf16, then down's arithmetic.
    pub struct DownFp8 / DownFp8Args {
        act: In<bf16>,
        ids: In<i32>,
        weights: In<f32>,
        wd: In<u32>,
        out: Out<bf16>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
        block_n: U32,
        block_k: U32,
    }
    grid(a) = expert_config(a.hidden, a.rows);
    DOWN_FP8 = "moe::down_fp8" => twin twin::down_fp8, emit emit_down;
}

kernel! {
    /// down on int4 experts: wd the stacked blob (32-bit words) of
    /// `[experts]\[hidden\]\[inter\]` in `Int4 { group }`, each weight dequantised to bf16,
    /// then down's arithmetic.
    pub struct DownInt4 / DownInt4Args {
        act: In<bf16>,
        ids: In<i32>,
        weights: In<f32>,
        wd: In<u32>,
        out: Out<bf16>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
        group: U32,
    }
    grid(a) = expert_config(a.hidden, a.rows);
    DOWN_INT4 = "moe::down_int4" => twin twin::down_int4, emit emit_down;
}

/// The entries a rule's kernel launches for a quantized weight format: (kernel, format kind,
/// entry). Rules name only the kernel; the emitter picks the entry from the weights' format.
pub const FORMAT_ENTRIES: &[(&str, &str, &str)] = &[
    (GATE_UP_SILU.as_str(), "fp8", GATE_UP_SILU_FP8.as_str()),
    (GATE_UP_SILU.as_str(), "int4", GATE_UP_SILU_INT4.as_str()),
    (DOWN.as_str(), "fp8", DOWN_FP8.as_str()),
    (DOWN.as_str(), "int4", DOWN_INT4.as_str()),
];

/// The weight formats `moe::gate_up_silu` reads (one entry each).
pub const GATE_UP_FORMATS: &[&str] = &["bf16", "fp8", "int4"];
/// The weight formats `moe::down` reads (one entry each).
pub const DOWN_FORMATS: &[&str] = &["bf16", "fp8", "int4"];

kernel! {
    /// out bf16\[rows·hidden\] = routed + sigmoid(gate\[r\]) · shared, in f32, stored bf16 once:
    /// the shared expert's gated contribution (gate bf16\[rows\], the shared-expert gate
    /// projection).
    pub struct CombineShared / CombineSharedArgs {
        routed: In<bf16>,
        shared: In<bf16>,
        gate: In<bf16>,
        out: Out<bf16>,
        rows: U32,
        hidden: U32,
    }
    grid(a) = elementwise(a.rows as u64 * a.hidden as u64);
    COMBINE_SHARED = "moe::combine_shared" => twin twin::combine_shared, emit emit_combine_shared;
}

kernel! {
    /// combine_shared with the shared expert's gate projection inside: gate\[r\] = bf16(x\[r\] ·
    /// wg + bg) over k elements (x bf16\[rows·k\], wg bf16\[k\], bg bf16\[1\]?: one feature,
    /// `gemv::linear`'s dot), then out = routed + sigmoid(gate\[r\]) · shared as
    /// `combine_shared`: the bytes of the two launches. One block per row.
    pub struct GateCombineShared / GateCombineSharedArgs {
        x: In<bf16>,
        wg: In<bf16>,
        bg: InOpt<bf16>,
        routed: In<bf16>,
        shared: In<bf16>,
        out: Out<bf16>,
        rows: U32,
        hidden: U32,
        k: U32,
    }
    grid(a) = per_row(a.rows);
    GATE_COMBINE_SHARED = "moe::gate_combine_shared" => twin twin::gate_combine_shared, emit emit_gate_combine_shared;
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[
    DownCombine::DECLS,
    TopkSoftmax::DECLS,
    RouterTopk::DECLS,
    GateUpSilu::DECLS,
    Down::DECLS,
    GateUpSiluFp8::DECLS,
    GateUpSiluInt4::DECLS,
    DownFp8::DECLS,
    DownInt4::DECLS,
    CombineShared::DECLS,
    GateCombineShared::DECLS,
];

// ---- emitters ------------------------------------------------------------------------------

/// Top-k dims: experts, k, renormalise.
fn topk_dims(v: &View<'_>, t: &Op) -> Result<(u32, u32, u32), ExecError> {
    Ok((v.u32(t, "experts")?, v.u32(t, "k")?, v.u32(t, "norm_topk")?))
}

fn emit_topk_softmax(v: &View<'_>) -> R {
    let t = v.op(OpKind::TopkSoftmax, None)?;
    let (experts, k, norm_topk) = topk_dims(v, t)?;
    Ok(vec![TopkSoftmax {
        logits: v.input(t, 0)?,
        ids: v.output(t, 0)?,
        weights: v.output(t, 1)?,
        rows: v.rows(),
        experts,
        k,
        norm_topk,
    }
    .launch(TOPK_SOFTMAX)])
}

fn emit_router_topk(v: &View<'_>) -> R {
    let (r, t) = (
        v.op(OpKind::Router, None)?,
        v.op(OpKind::TopkSoftmax, None)?,
    );
    let (experts, k, norm_topk) = topk_dims(v, t)?;
    Ok(vec![RouterTopk {
        x: v.input(r, 0)?,
        w: v.weight(r, 0)?,
        ids: v.output(t, 0)?,
        weights: v.output(t, 1)?,
        rows: v.rows(),
        hidden: v.u32(r, "hidden")?,
        experts,
        k,
        norm_topk,
    }
    .launch(ROUTER_TOPK)])
}

/// Expert dims: hidden, intermediate, experts, k.
pub(crate) fn expert_dims(v: &View<'_>, op: &Op) -> Result<(u32, u32, u32, u32), ExecError> {
    Ok((
        v.u32(op, "hidden")?,
        v.u32(op, "inter")?,
        v.u32(op, "experts")?,
        v.u32(op, "k")?,
    ))
}

/// The format of `op`'s expert weights `indices` (one format for all of them), refused unless
/// `formats` (the kernel's list) has it: an error naming kernel, tensor and format.
pub(crate) fn expert_format(
    v: &View<'_>,
    op: &Op,
    indices: &[usize],
    kernel: &str,
    formats: &[&str],
) -> Result<WeightFormat, ExecError> {
    let first = v.weight_slot(op, indices[0])?;
    for i in &indices[1..] {
        let other = v.weight_slot(op, *i)?;
        if other.format != first.format {
            return Err(v.err(format!(
                "{kernel}: expert weights `{}` ({}) and `{}` ({}) differ in format; one entry \
                 reads one format",
                first.name, first.format, other.name, other.format
            )));
        }
    }
    if formats.contains(&first.format.kind()) {
        Ok(first.format)
    } else {
        Err(v.err(format!(
            "{kernel} has no entry for weight `{}` in format {} (it reads {formats:?})",
            first.name, first.format
        )))
    }
}

fn emit_gate_up_silu(v: &View<'_>) -> R {
    let g = v.op(OpKind::MoeGateUp, None)?;
    let (hidden, inter, experts, k) = expert_dims(v, g)?;
    let format = expert_format(v, g, &[0, 1], GATE_UP_SILU.as_str(), GATE_UP_FORMATS)?;
    let (x, ids, wg, wu) = (
        v.input(g, 0)?,
        v.input(g, 1)?,
        v.weight(g, 0)?,
        v.weight(g, 1)?,
    );
    let (act, rows) = (v.output(g, 0)?, v.rows());
    let launch = match format {
        WeightFormat::Bf16 => GateUpSilu {
            x,
            ids,
            wg,
            wu,
            act,
            rows,
            hidden,
            inter,
            experts,
            k,
        }
        .launch(GATE_UP_SILU),
        WeightFormat::Fp8 { block_n, block_k } => GateUpSiluFp8 {
            x,
            ids,
            wg,
            wu,
            act,
            rows,
            hidden,
            inter,
            experts,
            k,
            block_n,
            block_k,
        }
        .launch(GATE_UP_SILU_FP8),
        WeightFormat::Int4 { group } => GateUpSiluInt4 {
            x,
            ids,
            wg,
            wu,
            act,
            rows,
            hidden,
            inter,
            experts,
            k,
            group,
        }
        .launch(GATE_UP_SILU_INT4),
    };
    Ok(vec![launch])
}

/// Never a group's first kernel: `gemm::experts_down_mma`'s emitter launches it after itself.
fn emit_down_combine(v: &View<'_>) -> R {
    Err(v.err(
        "moe::down_combine runs after gemm::experts_down_mma, whose emitter launches it"
            .to_string(),
    ))
}

fn emit_down(v: &View<'_>) -> R {
    let d = v.op(OpKind::MoeDown, None)?;
    let (hidden, inter, experts, k) = expert_dims(v, d)?;
    let format = expert_format(v, d, &[0], DOWN.as_str(), DOWN_FORMATS)?;
    let (act, ids, weights) = (v.input(d, 0)?, v.input(d, 1)?, v.input(d, 2)?);
    let (wd, out, rows) = (v.weight(d, 0)?, v.output(d, 0)?, v.rows());
    let launch = match format {
        WeightFormat::Bf16 => Down {
            act,
            ids,
            weights,
            wd,
            out,
            rows,
            hidden,
            inter,
            experts,
            k,
        }
        .launch(DOWN),
        WeightFormat::Fp8 { block_n, block_k } => DownFp8 {
            act,
            ids,
            weights,
            wd,
            out,
            rows,
            hidden,
            inter,
            experts,
            k,
            block_n,
            block_k,
        }
        .launch(DOWN_FP8),
        WeightFormat::Int4 { group } => DownInt4 {
            act,
            ids,
            weights,
            wd,
            out,
            rows,
            hidden,
            inter,
            experts,
            k,
            group,
        }
        .launch(DOWN_INT4),
    };
    Ok(vec![launch])
}

fn emit_combine_shared(v: &View<'_>) -> R {
    let c = v.op(OpKind::MoeCombine, None)?;
    Ok(vec![CombineShared {
        routed: v.input(c, 0)?,
        shared: v.input(c, 1)?,
        gate: v.input(c, 2)?,
        out: v.output(c, 0)?,
        rows: v.rows(),
        hidden: v.u32(c, "hidden")?,
    }
    .launch(COMBINE_SHARED)])
}

/// The shared expert's gate projection (one output feature) and the combine that reads it.
fn emit_gate_combine_shared(v: &View<'_>) -> R {
    let g = v.op(OpKind::Linear, Some("shared_expert_gate"))?;
    let c = v.op(OpKind::MoeCombine, None)?;
    let out_features = v.u32(g, "out")?;
    if out_features != 1 {
        return Err(v.err(format!(
            "op `{}` projects to {out_features} features; the shared expert's gate has one",
            g.name
        )));
    }
    Ok(vec![GateCombineShared {
        x: v.input(g, 0)?,
        wg: v.weight(g, 0)?,
        bg: v.weight_opt(g, 1),
        routed: v.input(c, 0)?,
        shared: v.input(c, 1)?,
        out: v.output(c, 0)?,
        rows: v.rows(),
        hidden: v.u32(c, "hidden")?,
        k: v.u32(g, "in")?,
    }
    .launch(GATE_COMBINE_SHARED)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_a_kernel_lists_has_its_entry_and_no_other() {
        for (kernel, formats) in [
            (GATE_UP_SILU.as_str(), GATE_UP_FORMATS),
            (DOWN.as_str(), DOWN_FORMATS),
        ] {
            let mut entries: Vec<&str> = FORMAT_ENTRIES
                .iter()
                .filter(|(k, ..)| *k == kernel)
                .map(|(_, format, _)| *format)
                .collect();
            entries.insert(0, "bf16");
            assert_eq!(entries, formats, "{kernel}");
            for (_, _, entry) in FORMAT_ENTRIES.iter().filter(|(k, ..)| *k == kernel) {
                assert!(crate::kernels::decl(entry).is_some(), "{entry} is declared");
            }
        }
    }
}
