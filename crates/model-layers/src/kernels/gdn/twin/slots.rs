//! Which state slot each row of a recurrent twin advances. A row reads its state from its
//! `slots` entry and writes the advanced state to its `out_slots` entry: the same slot
//! advances it in place; another leaves the slot read untouched (what a step that may fail
//! keeps). The twins move each unit's read state into its written slot first, then advance
//! the written slots in place, so the rest of every twin sees one slot per row.
//!
//! Refused (the GPU kernels would race or leave a row dead): a slot outside `num_slots`; rows
//! of one read slot writing different slots; two read slots writing one slot; a slot written
//! from another that some row reads; a chain-2 run returning to a slot after another's run.

use std::collections::HashMap;

use solder_gpu_runtime::{GpuError, TwinCtx};

use crate::kernels::args::Dim;

/// The slots `slots` and `out_slots` name per row, for `chain` (0: row r's own entries; 1:
/// every row on the first; 2: runs of one slot) or the pitched route (`pitched`: row r on
/// `s\[0\] + r * (s\[1\] - s\[0\])` of each array, chain 0 only), checked; then the state of
/// each read slot moved into the slot it is written to (`slot_elems` elements a slot of
/// `state`). Returns the slot each row advances in place.
pub(in crate::kernels::gdn) fn advanced_slots<T: Copy>(
    ctx: &TwinCtx<'_>,
    [slots, out_slots]: [&[i32]; 2],
    num_slots: usize,
    (chain, pitched): (Dim<'_>, bool),
    state: &mut [T],
    slot_elems: usize,
) -> Result<Vec<usize>, GpuError> {
    let (reads, writes) = if pitched {
        (
            pitched_slots(ctx, slots, num_slots, chain, "")?,
            pitched_slots(ctx, out_slots, num_slots, chain, " out")?,
        )
    } else {
        (
            row_slots(ctx, slots, num_slots, chain, "")?,
            row_slots(ctx, out_slots, num_slots, chain, " out")?,
        )
    };
    for (read, write) in moves(ctx, &reads, &writes)? {
        state.copy_within(
            read * slot_elems..(read + 1) * slot_elems,
            write * slot_elems,
        );
    }
    Ok(writes)
}

/// The slot each row names in `slots` (`chain` 0 → slots\[r\], 1 → slots\[0\], 2 → slots\[r\]
/// in runs), each checked against `num_slots`; `which` names the array in errors.
fn row_slots(
    ctx: &TwinCtx<'_>,
    slots: &[i32],
    num_slots: usize,
    chain: Dim<'_>,
    which: &str,
) -> Result<Vec<usize>, GpuError> {
    let chained = match chain.get() {
        0 => false,
        1 => true,
        2 => {
            // Runs: rows on one slot must be consecutive (each run one sequence's tokens).
            for r in 1..slots.len() {
                if slots[r] != slots[r - 1] && slots[..r - 1].contains(&slots[r]) {
                    return Err(ctx.fail(format!(
                        "chain 2: row {r} returns to{which} slot {} after another slot's run \
                         (a sequence's rows must be consecutive)",
                        slots[r]
                    )));
                }
            }
            false
        }
        v => return Err(chain.bad(format!("chain must be 0, 1 or 2, got {v}"))),
    };
    let used = if chained {
        &slots[..slots.len().min(1)]
    } else {
        slots
    };
    for (r, s) in used.iter().enumerate() {
        if *s < 0 || *s as usize >= num_slots {
            return Err(ctx.fail(format!(
                "row {r}:{which} slot {s} outside the {num_slots} state slots"
            )));
        }
    }
    Ok((0..slots.len())
        .map(|r| used[if chained { 0 } else { r }] as usize)
        .collect())
}

/// Slots `base + r * pitch` from the first two entries, each checked.
fn pitched_slots(
    ctx: &TwinCtx<'_>,
    slots: &[i32],
    num_slots: usize,
    chain: Dim<'_>,
    which: &str,
) -> Result<Vec<usize>, GpuError> {
    if chain.get() != 0 {
        return Err(chain.bad("the pitched route runs independent rows (chain 0)"));
    }
    let base = i64::from(slots.first().copied().unwrap_or(0));
    let pitch = slots.get(1).map_or(0, |s| i64::from(*s) - base);
    (0..slots.len() as i64)
        .map(|r| {
            let slot = base + r * pitch;
            if slot < 0 || slot as usize >= num_slots {
                Err(ctx.fail(format!(
                    "row {r}: pitched{which} slot {slot} outside the {num_slots} state slots"
                )))
            } else {
                Ok(slot as usize)
            }
        })
        .collect()
}

/// The (read, written) slot pairs that differ, one per pair, checked: every row reading a
/// slot writes the same slot, every slot written is written from one slot, and no slot
/// written from another is read by any row.
fn moves(
    ctx: &TwinCtx<'_>,
    reads: &[usize],
    writes: &[usize],
) -> Result<Vec<(usize, usize)>, GpuError> {
    let mut written_from: HashMap<usize, (usize, usize)> = HashMap::new();
    let mut read_into: HashMap<usize, (usize, usize)> = HashMap::new();
    let mut pairs = Vec::new();
    for (r, (&read, &write)) in reads.iter().zip(writes).enumerate() {
        if let Some(&(row, earlier)) = read_into.get(&read) {
            if earlier != write {
                return Err(ctx.fail(format!(
                    "row {r} reads slot {read} as row {row} does but writes slot {write}, not \
                     {earlier}"
                )));
            }
            continue;
        }
        if let Some(&(row, from)) = written_from.get(&write) {
            return Err(ctx.fail(format!(
                "rows {row} and {r} both write slot {write}, from slots {from} and {read}"
            )));
        }
        read_into.insert(read, (r, write));
        written_from.insert(write, (r, read));
        if read != write {
            pairs.push((r, read, write));
        }
    }
    for &(r, read, write) in &pairs {
        if let Some(&(row, _)) = read_into.get(&write) {
            return Err(ctx.fail(format!(
                "row {r} writes slot {write} (read from slot {read}), which row {row} reads"
            )));
        }
    }
    Ok(pairs
        .into_iter()
        .map(|(_, read, write)| (read, write))
        .collect())
}
