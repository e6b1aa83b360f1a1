//! Where everything lives on the device: the workspace (metadata region — its fields are
//! `meta::MetaLayout`'s —, logits, arena, attention scratch (then the o-fold scratch and gemv's
//! split-K scratch), and with a draft head the hidden
//! rows it reads and writes), the weights (each slot, then
//! constants such as rope's inv_freq) and the state (KV pages; recurrent-state slots, the
//! spare slots a step writes its new state into, their per-row snapshots).
//!
//! Invariants: every region starts on a 256-byte boundary; the workspace is sized for the
//! widest program and the largest arena of all plans, so one allocation serves every program
//! and is never moved; per-step values live only in the metadata region. The attention
//! scratch's counters (and the o-fold and split-K scratches') are zero between launches (zeroed once at
//! build, reset by each attention launch's merging blocks).

use solder_circuit::ir::{Binding, Circuit, ModelInput, StateKind};
use solder_circuit::{ExecutionPlan, WeightFormat};

use crate::bytes::{align, ALIGN};
use crate::kernels::attn;
use crate::meta::MetaLayout;

/// Steps of greedy ids the workspace holds (`Layout::ids_offset`): how many steps
/// `Session::next_tokens_ahead` enqueues before it reads their tokens back.
pub const IDS_SLOTS: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub max_rows: usize,
    /// The longest sequence served (tokens).
    pub max_seq_len: usize,
    /// Block-table entries per row: pages a sequence may hold.
    pub max_blocks: usize,
    /// The per-step metadata region (`meta`), at the workspace's start.
    pub meta: MetaLayout,
    pub logits_offset: usize,
    pub arena_offset: usize,
    pub arena_bytes: usize,
    /// Cross-block attention partials and arrival counters (`kernels::attn::scratch_bytes` for the
    /// widest plan and the largest attention op); zero bytes without attention.
    pub attn_scratch_offset: usize,
    pub attn_scratch_bytes: usize,
    /// The o-fold kernels' per-row counters and per-head partials
    /// (`kernels::attn::fold::o_scratch_max`), right after the attention scratch (zeroed with
    /// it); zero bytes when no plan folds the o projection into attention.
    pub o_scratch_offset: usize,
    pub o_scratch_bytes: usize,
    /// gemv's split-K scratch: one slot of `gemv_slot_bytes` (`kernels::gemv::split::slot_bytes`)
    /// per stream of the plan with the most streams, right after the o-fold scratch (zeroed
    /// with it: the slots' counters are zero between launches); zero bytes when nothing splits.
    pub gemv_scratch_offset: usize,
    pub gemv_slot_bytes: usize,
    pub gemv_scratch_bytes: usize,
    /// The target's final hidden rows (`ModelOutput::Hidden`, read by the draft head as
    /// `ModelInput::Hidden`) and the draft head's own (`ModelOutput::DraftHidden`), bf16
    /// `[max_rows, hidden]` each, after the attention scratches; zero bytes without a draft head.
    pub hidden_offset: usize,
    pub draft_hidden_offset: usize,
    pub hidden_bytes: usize,
    /// The greedy tokens of a step (`kernels::pick::argmax`: i32 `[max_rows]`), read back
    /// instead of the logits when every sequence of the step samples greedily: `IDS_SLOTS`
    /// slots of `max_rows` i32 (`Session::next_tokens_ahead` keeps one a step).
    pub ids_offset: usize,
    /// Each routed pick's down-projection dots, f32 `[rows·k][hidden]` at the widest plan that
    /// launches `gemm::experts_down_mma` (`kernels::gemm::experts_down_scratch_max`), summed by
    /// `moe::down_combine`; zero bytes when no plan does.
    pub moe_scratch_offset: usize,
    pub moe_scratch_bytes: usize,
    pub workspace_bytes: usize,
    /// Offset of each weight slot in the weights allocation, then of inv_freq.
    pub weight_offsets: Vec<usize>,
    pub inv_freq_offset: usize,
    pub inv_freq_len: usize,
    pub weights_bytes: usize,
    /// KV cache: pages and tokens per page.
    pub kv_pages: usize,
    pub kv_block_size: usize,
    /// Slots of the recurrent states: the scratch slot 0, one per sequence, and
    /// `spare_slots` more (a step writes each advancing sequence's state into a spare).
    pub state_slots: usize,
    /// Slots no sequence holds between steps: a step lends one to each sequence it advances
    /// as the slot its kernels write (`MetaField::StateSlotsOut`); on success the sequence
    /// keeps it and the slot it read becomes a spare, on failure the spare goes back and the
    /// slot read holds the state as it was (`StateBackup` saves in them too).
    /// `StateRows::spares` of them.
    pub spare_slots: usize,
    /// Snapshot and spare slots of each recurrent state (`StateRows`).
    pub state_rows: StateRows,
    /// The region of each state declaration in the state allocation, by `StateId`.
    pub states: Vec<StateRegion>,
    pub state_bytes: usize,
}

/// How many snapshot and spare slots each recurrent state keeps besides its sequence slots.
///
/// - `snapshots`: one per row of the widest plan whose recurrent kernels keep per-row
///   snapshots (`ExecutionPlan::keeps_snapshots`: verify and batched verify up to the serve's
///   `speculative_rows`, the rows a speculative step may roll back to); a prefill chunk, a
///   multi-seq or a decode step keeps none, nor does a verify program wider than
///   `speculative_rows` (a prompt chunk's), so a wide chunk does not size them.
/// - `spares`: one per slot a step can advance (`Layout::spare_slots`): a row advances at
///   most one slot and every slot a step advances is held by a sequence (never the scratch
///   slot), so the fewer of the widest plan's rows and the sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRows {
    pub snapshots: usize,
    pub spares: usize,
}

impl StateRows {
    pub fn of(plans: &[&ExecutionPlan], max_sequences: usize) -> StateRows {
        let max_rows = plans.iter().map(|p| p.rows).max().unwrap_or(1);
        StateRows {
            snapshots: plans
                .iter()
                .filter(|p| p.keeps_snapshots)
                .map(|p| p.rows)
                .max()
                .unwrap_or(0),
            spares: max_rows.min(max_sequences),
        }
    }
}

/// One state declaration's bytes in the state allocation: KV pages, or `state_slots` slots of
/// `slot_bytes` (the spares among them), then `StateRows::snapshots` snapshots (the state after
/// each row of a verify step) up to the region's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRegion {
    pub offset: usize,
    pub bytes: usize,
    pub slot_bytes: usize,
    pub snapshot_offset: usize,
}

impl Layout {
    pub fn new(
        circuit: &Circuit,
        plans: &[&ExecutionPlan],
        vocab: usize,
        inv_freq_len: usize,
        kv_pages: usize,
        max_seq_len: usize,
        max_sequences: usize,
    ) -> Layout {
        let max_rows = plans.iter().map(|p| p.rows).max().unwrap_or(1);
        let block_size = circuit
            .states
            .iter()
            .find_map(|s| match s.kind {
                StateKind::KvPages { block_size, .. } => Some(block_size),
                _ => None,
            })
            .unwrap_or(16);
        let max_blocks = max_seq_len.div_ceil(block_size);
        let meta = MetaLayout::new(max_rows, max_blocks, block_size);
        let logits_offset = meta.bytes;
        let arena_offset = logits_offset + align(max_rows * vocab * 4);
        let arena_bytes = align(plans.iter().map(|p| p.pool_bytes).max().unwrap_or(0));
        let attn_scratch_offset = arena_offset + arena_bytes;
        let attn_scratch_bytes = align(attn::scratch_max(circuit, max_rows));
        let o_scratch_offset = attn_scratch_offset + attn_scratch_bytes;
        let o_scratch_bytes = align(attn::fold::o_scratch_max(circuit, plans));
        let gemv_scratch_offset = o_scratch_offset + o_scratch_bytes;
        let streams = plans
            .iter()
            .map(|p| p.num_streams)
            .max()
            .unwrap_or(1)
            .max(1);
        let gemv_slot_bytes = align(crate::kernels::gemv::split::slot_bytes(circuit, plans));
        let gemv_scratch_bytes = streams * gemv_slot_bytes;
        let hidden_offset = gemv_scratch_offset + gemv_scratch_bytes;
        let hidden_bytes = align(max_rows * hidden_row_bytes(circuit));
        let draft_hidden_offset = hidden_offset + hidden_bytes;
        let ids_offset = draft_hidden_offset + hidden_bytes;
        let moe_scratch_offset = ids_offset + align(IDS_SLOTS * max_rows * 4);
        let moe_scratch_bytes = align(crate::kernels::gemm::experts_down_scratch_max(
            circuit, plans,
        ));

        let (weight_offsets, inv_freq_offset) = weight_offsets(circuit);
        let weights_bytes = inv_freq_offset + align(inv_freq_len * 4);

        let state_rows = StateRows::of(plans, max_sequences);
        let spare_slots = state_rows.spares;
        let state_slots = max_sequences + 1 + spare_slots;
        let (states, state_bytes) =
            state_regions(circuit, kv_pages, block_size, state_slots, state_rows);
        Layout {
            max_rows,
            max_seq_len,
            max_blocks,
            meta,
            logits_offset,
            arena_offset,
            arena_bytes,
            attn_scratch_offset,
            attn_scratch_bytes,
            o_scratch_offset,
            o_scratch_bytes,
            gemv_scratch_offset,
            gemv_slot_bytes,
            gemv_scratch_bytes,
            hidden_offset,
            draft_hidden_offset,
            hidden_bytes,
            ids_offset,
            moe_scratch_offset,
            moe_scratch_bytes,
            workspace_bytes: moe_scratch_offset + moe_scratch_bytes,
            weight_offsets,
            inv_freq_offset,
            inv_freq_len,
            weights_bytes,
            kv_pages,
            kv_block_size: block_size,
            state_slots,
            spare_slots,
            state_rows,
            states,
            state_bytes,
        }
    }
}

/// Each weight slot's offset in the weights allocation, then inv_freq's (after the last slot):
/// each slot's bytes in its format (`circuit::format`; a bf16 slot's elements, stacked parts
/// contiguous, as `weights::slot_bytes` counts them), 256-aligned.
fn weight_offsets(circuit: &Circuit) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(circuit.weights.len());
    let mut at = 0usize;
    for w in &circuit.weights {
        offsets.push(at);
        let bytes = match w.format {
            WeightFormat::Bf16 => Some(w.shape.iter().product::<usize>() * 2),
            format => format.slot_bytes(&w.shape),
        };
        // An overflowing format is refused before a layout is made (`check_lengths`,
        // `weights::check_checkpoint`); saturate rather than wrap regardless.
        at = align(
            at.saturating_add(bytes.unwrap_or(usize::MAX))
                .min(usize::MAX - ALIGN),
        );
    }
    (offsets, at)
}

/// One region per state declaration, and their total bytes: KV pages, or `state_slots`
/// slots (slot 0 is the scratch slot padding rows use; the spares of `rows` among them)
/// followed by the snapshot slots of `rows`.
fn state_regions(
    circuit: &Circuit,
    kv_pages: usize,
    block_size: usize,
    state_slots: usize,
    rows: StateRows,
) -> (Vec<StateRegion>, usize) {
    let mut states = Vec::with_capacity(circuit.states.len());
    let mut state_bytes = 0;
    for decl in &circuit.states {
        let region = match decl.kind {
            StateKind::KvPages {
                num_kv_heads,
                head_dim,
                dtype,
                ..
            } => StateRegion {
                offset: state_bytes,
                bytes: align(
                    kv_pages * 2 * block_size * num_kv_heads * head_dim * dtype.size_bytes(),
                ),
                slot_bytes: 0,
                snapshot_offset: state_bytes,
            },
            _ => {
                let slot = decl.kind.slot_bytes();
                let snapshot_offset = state_bytes + align(state_slots * slot);
                StateRegion {
                    offset: state_bytes,
                    bytes: snapshot_offset + align(rows.snapshots * slot) - state_bytes,
                    slot_bytes: slot,
                    snapshot_offset,
                }
            }
        };
        state_bytes += region.bytes;
        states.push(region);
    }
    (states, state_bytes)
}

/// Bytes of one row of the draft head's hidden input (`ModelInput::Hidden`); zero for a
/// circuit without one (`circuit` is the instance's `storage()`: the draft circuit when there
/// is one).
fn hidden_row_bytes(circuit: &Circuit) -> usize {
    circuit
        .tensors
        .iter()
        .find(|t| t.binding == Binding::Input(ModelInput::Hidden))
        .map_or(0, |t| t.bytes(1))
}

/// The state allocation's bytes for `kv_pages` KV pages, `max_sequences` state slots and the
/// snapshot and spare slots of `rows`, by checked arithmetic before `Layout::new` computes it
/// plainly. An overflow, or a total past `MAX_TENSOR_BYTES`, is refused naming the `KvShape`
/// field whose value makes it so (`pages` for the KV pages, `max_sequences` for the slots).
pub(crate) fn check_state_bytes(
    circuit: &Circuit,
    rows: StateRows,
    kv_pages: usize,
    max_sequences: usize,
) -> Result<usize, (&'static str, String)> {
    use solder_circuit::ir::MAX_TENSOR_BYTES;
    let product = |factors: &[usize]| {
        factors
            .iter()
            .try_fold(1usize, |acc, &f| acc.checked_mul(f))
            .and_then(|bytes| bytes.checked_next_multiple_of(ALIGN))
    };
    let too_large = |field: &'static str| {
        (
            field,
            format!("the state allocation would pass {MAX_TENSOR_BYTES} bytes"),
        )
    };
    let mut total = 0usize;
    for decl in &circuit.states {
        let (field, bytes) = match decl.kind {
            StateKind::KvPages {
                block_size,
                num_kv_heads,
                head_dim,
                dtype,
                ..
            } => (
                "pages",
                product(&[
                    kv_pages,
                    2,
                    block_size,
                    num_kv_heads,
                    head_dim,
                    dtype.size_bytes(),
                ]),
            ),
            ref kind => {
                let slot = kind.checked_slot_bytes();
                let slots = max_sequences
                    .checked_add(1)
                    .and_then(|s| s.checked_add(rows.snapshots)?.checked_add(rows.spares));
                (
                    "max_sequences",
                    slot.zip(slots).and_then(|(b, n)| product(&[b, n])),
                )
            }
        };
        total = bytes
            .and_then(|b| total.checked_add(b))
            .filter(|&t| t <= MAX_TENSOR_BYTES)
            .ok_or_else(|| too_large(field))?;
    }
    Ok(total)
}
