//! `gemv::counters_reset`: the first launch of every program (so of every captured step),
//! zeroing the arrival counters of the step's split kernels — attention's flash-decoding slots
//! (`attn::scratch_bytes`), the o fold's rows (`attn::fold::o_scratch_bytes`) and every
//! stream's gemv split slot (`split::COUNTERS`). Each split kernel also sets its counter back
//! after its merge; this reset is what keeps a grid aborted between its count and its clear
//! (a trap, a timeout, a cancelled graph) from poisoning every later step. Not a rule's
//! kernel: `program::compile` launches it before the plan's steps, on stream 0, which every
//! other stream forks from.

use solder_circuit::ir::Circuit;
use solder_circuit::OpKind;
use solder_gpu_runtime::{GpuError, LaunchConfig};

use super::split;
use crate::kernels::attn::fold::{self, O_SCRATCH_HEADER_WORDS};
use crate::kernels::attrs::widest;
use crate::kernels::decl::{kernel, Launch};
use crate::kernels::emit_view::{View, R};
use crate::kernels::Buf;

/// Blocks of the reset (grid-stride over the counters): one per SM of an H200 at most.
const RESET_BLOCKS: u64 = 132;
const RESET_THREADS: u32 = 256;

kernel! {
    /// Zeroes attn_count u32 counters attn_stride words apart from `attn`, ofold_count
    /// ofold_stride apart from `ofold`, and the first `split::COUNTERS` words of gemv_slots
    /// slots gemv_stride words apart from `gemv`; a null region is skipped. Every other word
    /// keeps its bytes.
    pub struct CountersReset / CountersResetArgs {
        attn: InOutOpt<f32>,
        attn_count: U32,
        attn_stride: U32,
        ofold: InOutOpt<f32>,
        ofold_count: U32,
        ofold_stride: U32,
        gemv: InOutOpt<f32>,
        gemv_slots: U32,
        gemv_stride: U32,
    }
    grid(a) = reset_config(
        a.attn.map_or(0, |_| a.attn_count as u64)
            + a.ofold.map_or(0, |_| a.ofold_count as u64)
            + a.gemv.map_or(0, |_| a.gemv_slots as u64 * split::COUNTERS as u64),
    );
    COUNTERS_RESET = "gemv::counters_reset" => twin counters_reset, emit emit_counters_reset;
}

fn reset_config(counters: u64) -> LaunchConfig {
    LaunchConfig {
        grid: [
            counters
                .div_ceil(RESET_THREADS as u64)
                .clamp(1, RESET_BLOCKS) as u32,
            1,
            1,
        ],
        block: [RESET_THREADS, 1, 1],
        shared_bytes: 0,
    }
}

fn counters_reset(a: CountersResetArgs<'_>) -> Result<(), GpuError> {
    let regions = [
        (a.attn, a.attn_count.count(), a.attn_stride.count(), 1),
        (a.ofold, a.ofold_count.count(), a.ofold_stride.count(), 1),
        (
            a.gemv,
            a.gemv_slots.count(),
            a.gemv_stride.count(),
            split::COUNTERS,
        ),
    ];
    for (buf, groups, stride, per) in regions {
        let Some(words) = buf.len(groups * stride)? else {
            continue;
        };
        for g in 0..groups {
            for w in &mut words[g * stride..g * stride + per.min(stride)] {
                *w = f32::from_bits(0);
            }
        }
    }
    Ok(())
}

fn emit_counters_reset(v: &View<'_>) -> R {
    Err(v.err(
        "gemv::counters_reset is launched by program::compile before a program's steps, \
         never by a rule"
            .to_string(),
    ))
}

/// The workspace's split-kernel scratch regions, each its whole extent (the layout's): the
/// attention scratch, the o-fold scratch, and every stream's gemv split slot of `gemv_slot_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct ScratchRegions {
    pub attn: Buf,
    pub o_fold: Buf,
    pub gemv: Buf,
    pub gemv_slot_bytes: usize,
}

/// The reset launch of a program of `circuit` at `rows` rows: every counter its attention,
/// o-fold and gemv split launches may use (within `regions`); `None` when it has none.
pub fn counters_reset_launch(
    circuit: &Circuit,
    rows: usize,
    regions: &ScratchRegions,
) -> Option<Launch> {
    let widest = |kind, role, key| widest(circuit, kind, role, key);
    let heads = widest(OpKind::Attention, None, "heads");
    let head_dim = widest(OpKind::Attention, None, "head_dim");
    let region = |whole: Buf, bytes: usize| {
        (bytes > 0 && bytes <= whole.bytes).then(|| Buf::new(whole.ptr, bytes))
    };
    // Attention: one counter per (row, head) slot of 1 + ATTN_SPLITS · (head_dim + 2) words.
    let attn_bytes = crate::kernels::attn::scratch_bytes(rows, heads, head_dim);
    let attn = region(regions.attn, attn_bytes);
    let attn_count = rows * heads;
    let attn_stride = (attn_bytes / 4).checked_div(attn_count).unwrap_or(0);
    // The o fold: one counter per row slot of O_SCRATCH_HEADER_WORDS + heads · n_out words.
    let n_out = widest(OpKind::Linear, Some("o_proj"), "out");
    let ofold_bytes = fold::o_scratch_bytes(rows, heads, n_out);
    let ofold = region(regions.o_fold, ofold_bytes);
    let ofold_stride = O_SCRATCH_HEADER_WORDS + heads * n_out;
    // gemv: the counters at the start of every stream's slot.
    let slot = regions.gemv_slot_bytes;
    let gemv_slots = regions.gemv.bytes.checked_div(slot).unwrap_or(0);
    let gemv = region(regions.gemv, gemv_slots * slot).filter(|_| slot >= split::COUNTERS * 4);
    if attn.is_none() && ofold.is_none() && gemv.is_none() {
        return None;
    }
    let u32_of = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    Some(
        CountersReset {
            attn,
            attn_count: u32_of(attn_count),
            attn_stride: u32_of(attn_stride),
            ofold,
            ofold_count: u32_of(rows),
            ofold_stride: u32_of(ofold_stride),
            gemv,
            gemv_slots: u32_of(gemv_slots),
            gemv_stride: u32_of(slot / 4),
        }
        .launch(COUNTERS_RESET),
    )
}
