//! The per-step metadata: the one owner of the workspace's metadata region — where each field
//! lies (`MetaLayout`), the byte range a program of n rows reads of each (`Bindings::meta`
//! asks here), and one step's values (`StepMeta`): checked, encoded and uploaded.
//!
//! The region holds i32 arrays: tokens, positions, slot mapping (the KV cell a row writes:
//! `page * block_size + position % block_size`), sequence lengths (`position + 1`), state
//! slots (the recurrent-state slot a row's kernels read), state slots out (the slot they write
//! the advanced state to: the same slot, in place, or another, so the one read survives the
//! step), keep-snapshots flags (1 where the recurrent kernels
//! write the state after the row to its snapshot: a speculative verify row the step may roll
//! back to; 0 elsewhere, so a prompt's chunk or a mixed step writes none), want-logits flags (1
//! where the step reads the row's logits; 0 where the LM head skips the row: padding, a prompt
//! chunk's rows nobody reads), then block tables
//! (`max_blocks` pages per row). Block tables come last so that one copy of a step's prefix
//! carries every field of its rows.
//!
//! Invariants: every field starts on a 256-byte boundary inside the region, which starts at
//! the workspace's offset 0; a program of n rows reads only the first n entries of each field
//! (and n block tables); a padding row is token 0 at position 0 (length 1) on the scratch page
//! and the scratch state slot, and unused block-table entries name the scratch page, so
//! padding and short sequences only ever touch page 0 and slot 0, which no sequence owns.

use solder_circuit::ir::MetaField;
use solder_gpu_runtime::{DevicePtr, GpuBackend, GpuError, StreamId};

use crate::bytes::align;
use crate::bytes::put_i32s;
use crate::error::MetaError;

/// The KV page padding rows and unused block-table entries name; the page pool never lends it.
pub const SCRATCH_PAGE: u32 = 0;
/// The recurrent-state slot padding rows use; the slot pool never lends it.
pub const SCRATCH_SLOT: u32 = 0;

/// Where each field of the metadata region lies, for programs of up to `max_rows` rows with
/// block tables of `max_blocks` pages of `block_size` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaLayout {
    pub max_rows: usize,
    pub max_blocks: usize,
    pub block_size: usize,
    pub tokens: usize,
    pub positions: usize,
    pub slot_mapping: usize,
    pub seq_lens: usize,
    pub state_slots: usize,
    pub state_slots_out: usize,
    pub keep_snapshots: usize,
    pub want_logits: usize,
    pub block_tables: usize,
    /// The region's size (the next workspace region starts here).
    pub bytes: usize,
}

/// A byte range of the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaRange {
    pub offset: usize,
    pub bytes: usize,
}

impl MetaLayout {
    pub fn new(max_rows: usize, max_blocks: usize, block_size: usize) -> MetaLayout {
        let row_i32 = align(max_rows * 4);
        MetaLayout {
            max_rows,
            max_blocks,
            block_size,
            tokens: 0,
            positions: row_i32,
            slot_mapping: 2 * row_i32,
            seq_lens: 3 * row_i32,
            state_slots: 4 * row_i32,
            state_slots_out: 5 * row_i32,
            keep_snapshots: 6 * row_i32,
            want_logits: 7 * row_i32,
            block_tables: 8 * row_i32,
            bytes: 8 * row_i32 + align(max_rows * max_blocks * 4),
        }
    }

    /// The token ids a program of `rows` rows reads (the model's `Tokens` input).
    pub fn tokens(&self, rows: usize) -> MetaRange {
        MetaRange {
            offset: self.tokens,
            bytes: rows * 4,
        }
    }

    /// The bytes of `field` a program of `rows` rows reads.
    pub fn field(&self, field: MetaField, rows: usize) -> MetaRange {
        let (offset, bytes) = match field {
            MetaField::Positions => (self.positions, rows * 4),
            MetaField::SlotMapping => (self.slot_mapping, rows * 4),
            MetaField::SeqLens => (self.seq_lens, rows * 4),
            MetaField::StateSlots => (self.state_slots, rows * 4),
            MetaField::StateSlotsOut => (self.state_slots_out, rows * 4),
            MetaField::KeepSnapshots => (self.keep_snapshots, rows * 4),
            MetaField::WantLogits => (self.want_logits, rows * 4),
            MetaField::BlockTables => (self.block_tables, rows * self.max_blocks * 4),
        };
        MetaRange { offset, bytes }
    }

    /// The bytes a step of `rows` rows uploads: from the region's start through its rows'
    /// block tables, the last field.
    pub fn step_bytes(&self, rows: usize) -> usize {
        self.block_tables + rows * self.max_blocks * 4
    }
}

/// One row of a step: a sequence's token, or padding.
#[derive(Debug, Clone, Copy)]
pub enum MetaRow<'a> {
    /// `token` at `position` of a sequence holding `pages` (its block table, in order) and
    /// recurrent-state slot `state_slot` (the scratch slot for a model without one), whose
    /// advanced state the recurrent kernels write to `state_slot_out` (`state_slot` itself to
    /// advance it in place); with
    /// `snapshot`, a verify program's recurrent kernels keep the state after this row (a
    /// speculative row the step may roll back to: `MetaField::KeepSnapshots`); with `logits`,
    /// the step reads the row's logits (`MetaField::WantLogits`: without, the LM head skips it).
    Live {
        token: u32,
        position: usize,
        pages: &'a [u32],
        state_slot: u32,
        state_slot_out: u32,
        snapshot: bool,
        logits: bool,
    },
    /// Fills a program wider than the step.
    Padding,
}

/// The metadata of one step, checked against the layout and ready to encode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepMeta {
    layout: MetaLayout,
    tokens: Vec<i32>,
    positions: Vec<i32>,
    slot_mapping: Vec<i32>,
    seq_lens: Vec<i32>,
    state_slots: Vec<i32>,
    state_slots_out: Vec<i32>,
    keep_snapshots: Vec<i32>,
    want_logits: Vec<i32>,
    /// `rows * max_blocks` pages, unused entries the scratch page.
    block_tables: Vec<i32>,
}

impl StepMeta {
    /// The metadata of a step of `rows`, one per program row; refuses more rows than the
    /// layout holds, a position on a page the sequence does not hold, a block table longer
    /// than `max_blocks`, and values an i32 cannot carry.
    pub fn new(layout: &MetaLayout, rows: &[MetaRow<'_>]) -> Result<StepMeta, MetaError> {
        if rows.len() > layout.max_rows {
            return Err(MetaError::TooManyRows {
                rows: rows.len(),
                max_rows: layout.max_rows,
            });
        }
        let n = rows.len();
        let mut meta = StepMeta {
            layout: *layout,
            tokens: Vec::with_capacity(n),
            positions: Vec::with_capacity(n),
            slot_mapping: Vec::with_capacity(n),
            seq_lens: Vec::with_capacity(n),
            state_slots: Vec::with_capacity(n),
            state_slots_out: Vec::with_capacity(n),
            keep_snapshots: Vec::with_capacity(n),
            want_logits: Vec::with_capacity(n),
            block_tables: vec![SCRATCH_PAGE as i32; n * layout.max_blocks],
        };
        for (row, entry) in rows.iter().enumerate() {
            match *entry {
                MetaRow::Live {
                    token,
                    position,
                    pages,
                    state_slot,
                    state_slot_out,
                    snapshot,
                    logits,
                } => {
                    meta.push_live(row, token, position, pages, [state_slot, state_slot_out])?;
                    meta.keep_snapshots.push(i32::from(snapshot));
                    meta.want_logits.push(i32::from(logits));
                }
                MetaRow::Padding => meta.push_padding(),
            }
        }
        Ok(meta)
    }

    fn push_live(
        &mut self,
        row: usize,
        token: u32,
        position: usize,
        pages: &[u32],
        [state_slot, state_slot_out]: [u32; 2],
    ) -> Result<(), MetaError> {
        let (block_size, max_blocks) = (self.layout.block_size, self.layout.max_blocks);
        if pages.len() > max_blocks {
            return Err(MetaError::TooManyPages {
                row,
                pages: pages.len(),
                max_blocks,
            });
        }
        let page = *pages.get(position / block_size).ok_or(MetaError::NoPage {
            row,
            position,
            pages: pages.len(),
        })?;
        let cell = page as usize * block_size + position % block_size;
        self.tokens.push(fits(row, "token", token as usize)?);
        self.positions.push(fits(row, "position", position)?);
        self.slot_mapping.push(fits(row, "slot mapping", cell)?);
        self.seq_lens
            .push(fits(row, "sequence length", position + 1)?);
        self.state_slots
            .push(fits(row, "state slot", state_slot as usize)?);
        self.state_slots_out
            .push(fits(row, "state slot out", state_slot_out as usize)?);
        let table = &mut self.block_tables[row * max_blocks..][..pages.len()];
        for (entry, &page) in table.iter_mut().zip(pages) {
            *entry = fits(row, "page", page as usize)?;
        }
        Ok(())
    }

    fn push_padding(&mut self) {
        self.tokens.push(0);
        self.positions.push(0);
        self.slot_mapping
            .push((SCRATCH_PAGE as usize * self.layout.block_size) as i32);
        self.seq_lens.push(1);
        self.state_slots.push(SCRATCH_SLOT as i32);
        self.state_slots_out.push(SCRATCH_SLOT as i32);
        self.keep_snapshots.push(0);
        self.want_logits.push(0);
    }

    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// The region's first `step_bytes(rows)` bytes: each field's rows at its offset; entries
    /// past the step's rows and the gaps between fields are zero.
    pub fn encode(&self) -> Vec<u8> {
        let m = &self.layout;
        let mut bytes = vec![0u8; m.step_bytes(self.rows())];
        for (offset, values) in [
            (m.tokens, &self.tokens),
            (m.positions, &self.positions),
            (m.slot_mapping, &self.slot_mapping),
            (m.seq_lens, &self.seq_lens),
            (m.state_slots, &self.state_slots),
            (m.state_slots_out, &self.state_slots_out),
            (m.keep_snapshots, &self.keep_snapshots),
            (m.want_logits, &self.want_logits),
            (m.block_tables, &self.block_tables),
        ] {
            put_i32s(&mut bytes[offset..], values);
        }
        bytes
    }

    /// Copies the encoded step into the metadata region of `workspace`, in one copy ordered
    /// on `stream` before the program that reads it.
    pub fn upload(
        &self,
        backend: &mut dyn GpuBackend,
        stream: StreamId,
        workspace: DevicePtr,
    ) -> Result<(), GpuError> {
        backend.copy_h2d_async(stream, workspace, &self.encode())
    }
}

/// `value` as the i32 the kernels read, or the error naming the row and field.
fn fits(row: usize, field: &'static str, value: usize) -> Result<i32, MetaError> {
    i32::try_from(value).map_err(|_| MetaError::DoesNotFit { row, field, value })
}
