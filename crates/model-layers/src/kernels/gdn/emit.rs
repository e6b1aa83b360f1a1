//! The emitters of the gated DeltaNet kernels: each op group's arguments read from the plan
//! (dims, state slots, the step's metadata) and its entry picked (pitched, chunked, on the
//! tensor cores).

use super::*;

/// Gated DeltaNet dims: key heads, key dim, value heads, value dim.
pub(crate) fn gdn_dims(v: &View<'_>, op: &Op) -> Result<[u32; 4], ExecError> {
    Ok([
        v.u32(op, "key_heads")?,
        v.u32(op, "key_dim")?,
        v.u32(op, "value_heads")?,
        v.u32(op, "value_dim")?,
    ])
}

/// A recurrent op's state region and, when the plan keeps them (verify and batched verify up
/// to the serve's `speculative_rows`: `ExecutionPlan::keeps_snapshots`), its per-row
/// snapshots and the step's flags saying which rows write theirs (`MetaField::KeepSnapshots`).
struct GdnState {
    state: Buf,
    snapshots: Option<Buf>,
    keep: Option<Buf>,
}

fn gdn_state(v: &View<'_>, op: &Op) -> Result<GdnState, ExecError> {
    let edge = *op
        .outputs
        .get(1)
        .ok_or_else(|| v.err(format!("`{}` has no state edge", op.name)))?;
    let snapshots = v.snapshots_of(edge)?;
    Ok(GdnState {
        state: v.state_of(edge)?,
        snapshots,
        keep: snapshots.map(|_| v.meta(MetaField::KeepSnapshots)),
    })
}

pub(super) fn emit_conv(v: &View<'_>) -> R {
    let c = v.op(OpKind::GdnConv, None)?;
    let [nk, dk, nv, dv] = gdn_dims(v, c)?;
    let GdnState {
        state,
        snapshots,
        keep,
    } = gdn_state(v, c)?;
    Ok(vec![Conv {
        qkvz: v.input(c, 0)?,
        w: v.weight(c, 0)?,
        state,
        slots: v.meta(MetaField::StateSlots),
        out_slots: v.meta(MetaField::StateSlotsOut),
        out: v.output(c, 0)?,
        snapshots,
        keep,
        rows: v.rows(),
        nk,
        dk,
        nv,
        dv,
        kernel: v.u32(c, "kernel")?,
        num_slots: v.state_slots(),
        chain: v.chain_mode(),
    }
    .launch(CONV)])
}

pub(super) fn emit_gates(v: &View<'_>) -> R {
    let g = v.op(OpKind::GdnGates, None)?;
    let [nk, _, nv, _] = gdn_dims(v, g)?;
    Ok(vec![Gates {
        ba: v.input(g, 0)?,
        a_log: v.weight(g, 0)?,
        dt_bias: v.weight(g, 1)?,
        beta: v.output(g, 0)?,
        g: v.output(g, 1)?,
        rows: v.rows(),
        nk,
        nv,
    }
    .launch(GATES)])
}

/// What both recurrence kernels take besides the gates: the group's recurrence op, its dims
/// and its state (with the snapshots when the plan keeps them, unless `pitched`: the route
/// runs independent rows only).
struct RecurrenceParts<'a> {
    op: &'a Op,
    dims: [u32; 4],
    state: GdnState,
}

impl<'a> RecurrenceParts<'a> {
    fn of(v: &View<'a>, pitched: bool) -> Result<RecurrenceParts<'a>, ExecError> {
        let op = v.op(OpKind::GdnRecurrence, None)?;
        if pitched && v.chained() {
            return Err(v.err("the pitched route runs independent rows, not a verify chain".into()));
        }
        Ok(RecurrenceParts {
            op,
            dims: gdn_dims(v, op)?,
            state: gdn_state(v, op)?,
        })
    }
}

/// The recurrence's arguments, its gates read from `gdn::gates`' outputs.
fn recurrence_of(v: &View<'_>, pitched: bool) -> Result<Recurrence, ExecError> {
    let RecurrenceParts {
        op: r,
        dims: [nk, dk, nv, dv],
        state: GdnState {
            state,
            snapshots,
            keep,
        },
    } = RecurrenceParts::of(v, pitched)?;
    Ok(Recurrence {
        mixed: v.input(r, 0)?,
        beta: v.input(r, 1)?,
        g: v.input(r, 2)?,
        state,
        slots: v.meta(MetaField::StateSlots),
        out_slots: v.meta(MetaField::StateSlotsOut),
        out: v.output(r, 0)?,
        snapshots,
        keep,
        rows: v.rows(),
        nk,
        dk,
        nv,
        dv,
        num_slots: v.state_slots(),
        chain: v.chain_mode(),
    })
}

pub(super) fn emit_recurrence(v: &View<'_>) -> R {
    Ok(vec![recurrence_of(v, false)?.launch(RECURRENCE)])
}

pub(super) fn emit_recurrence_pitched(v: &View<'_>) -> R {
    Ok(vec![recurrence_of(v, true)?.launch(RECURRENCE_PITCHED)])
}

/// Checks that the recurrence `r` reads `gates`' beta and g (the group a gates-folded kernel
/// replaces).
fn reads_gates(v: &View<'_>, r: &Op, gates: &Op) -> Result<(), ExecError> {
    for (index, output) in [(1, 0), (2, 1)] {
        if r.inputs.get(index) != gates.outputs.get(output) {
            return Err(v.err(format!(
                "`{}` does not read `{}`'s gates as its input {index}",
                r.name, gates.name
            )));
        }
    }
    Ok(())
}

/// `gates` → `recurrence` (its beta and g read inside the group) as one launch.
fn gates_recurrence_of(v: &View<'_>, pitched: bool) -> Result<GatesRecurrence, ExecError> {
    let gates = v.op(OpKind::GdnGates, None)?;
    let RecurrenceParts {
        op: r,
        dims: [nk, dk, nv, dv],
        state: GdnState {
            state,
            snapshots,
            keep,
        },
    } = RecurrenceParts::of(v, pitched)?;
    reads_gates(v, r, gates)?;
    Ok(GatesRecurrence {
        mixed: v.input(r, 0)?,
        ba: v.input(gates, 0)?,
        a_log: v.weight(gates, 0)?,
        dt_bias: v.weight(gates, 1)?,
        state,
        slots: v.meta(MetaField::StateSlots),
        out_slots: v.meta(MetaField::StateSlotsOut),
        out: v.output(r, 0)?,
        snapshots,
        keep,
        rows: v.rows(),
        nk,
        dk,
        nv,
        dv,
        num_slots: v.state_slots(),
        chain: v.chain_mode(),
    })
}

pub(super) fn emit_gates_recurrence(v: &View<'_>) -> R {
    Ok(vec![gates_recurrence_of(v, false)?.launch(GATES_RECURRENCE)])
}

pub(super) fn emit_gates_recurrence_pitched(v: &View<'_>) -> R {
    Ok(vec![
        gates_recurrence_of(v, true)?.launch(GATES_RECURRENCE_PITCHED)
    ])
}

/// The chunked kernels write no snapshots: a plan that keeps them (verify and batched verify
/// up to the serve's `speculative_rows`) is refused; their rules require a plan that keeps
/// none (`solder_circuit::shapes::NO_SNAPSHOTS`).
/// Returns the group's recurrence op, its dims and its state region.
fn chunked_parts<'a>(v: &View<'a>) -> Result<(&'a Op, [u32; 4], Buf), ExecError> {
    let RecurrenceParts { op, dims, state } = RecurrenceParts::of(v, false)?;
    if state.snapshots.is_some() {
        return Err(v.err(format!(
            "`{}`: the chunked recurrence writes no snapshots, and this plan keeps them (a \
             speculative step may run it); the chunked rules require `plan:no_snapshots`",
            op.name
        )));
    }
    Ok((op, dims, state.state))
}

pub(super) fn emit_chunked(v: &View<'_>) -> R {
    Ok(vec![chunked_of(v)?.launch(CHUNKED)])
}

pub(super) fn emit_chunked_mma(v: &View<'_>) -> R {
    let a = chunked_of(v)?;
    let config = chunked_mma_config(a.rows, a.dk, a.nv, a.dv, a.chain);
    Ok(vec![a.launch_with(CHUNKED_MMA, config)])
}

fn chunked_of(v: &View<'_>) -> Result<Chunked, ExecError> {
    let (r, [nk, dk, nv, dv], state) = chunked_parts(v)?;
    Ok(Chunked {
        mixed: v.input(r, 0)?,
        beta: v.input(r, 1)?,
        g: v.input(r, 2)?,
        state,
        slots: v.meta(MetaField::StateSlots),
        out_slots: v.meta(MetaField::StateSlotsOut),
        out: v.output(r, 0)?,
        rows: v.rows(),
        nk,
        dk,
        nv,
        dv,
        num_slots: v.state_slots(),
        chain: v.chain_mode(),
    })
}

pub(super) fn emit_gates_chunked(v: &View<'_>) -> R {
    Ok(vec![gates_chunked_of(v)?.launch(GATES_CHUNKED)])
}

pub(super) fn emit_gates_chunked_mma(v: &View<'_>) -> R {
    let a = gates_chunked_of(v)?;
    let config = chunked_mma_config(a.rows, a.dk, a.nv, a.dv, a.chain);
    Ok(vec![a.launch_with(GATES_CHUNKED_MMA, config)])
}

fn gates_chunked_of(v: &View<'_>) -> Result<GatesChunked, ExecError> {
    let gates = v.op(OpKind::GdnGates, None)?;
    let (r, [nk, dk, nv, dv], state) = chunked_parts(v)?;
    reads_gates(v, r, gates)?;
    Ok(GatesChunked {
        mixed: v.input(r, 0)?,
        ba: v.input(gates, 0)?,
        a_log: v.weight(gates, 0)?,
        dt_bias: v.weight(gates, 1)?,
        state,
        slots: v.meta(MetaField::StateSlots),
        out_slots: v.meta(MetaField::StateSlotsOut),
        out: v.output(r, 0)?,
        rows: v.rows(),
        nk,
        dk,
        nv,
        dv,
        num_slots: v.state_slots(),
        chain: v.chain_mode(),
    })
}

pub(super) fn emit_gated_norm(v: &View<'_>) -> R {
    let n = v.op(OpKind::GdnGatedNorm, None)?;
    let [nk, dk, nv, dv] = gdn_dims(v, n)?;
    Ok(vec![GatedNorm {
        core: v.input(n, 0)?,
        qkvz: v.input(n, 1)?,
        w: v.weight(n, 0)?,
        out: v.output(n, 0)?,
        rows: v.rows(),
        nk,
        dk,
        nv,
        dv,
        eps: v.f32(n, "eps")?,
    }
    .launch(GATED_NORM)])
}
