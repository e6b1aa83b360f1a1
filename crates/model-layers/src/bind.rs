//! `Bindings`: device ranges of everything a plan's groups name — arena buffers at their
//! offsets, the model's own buffers (tokens, logits), metadata fields, weight slots, KV
//! regions and constants — for one (mode, rows).

use solder_circuit::ir::{
    Binding, Circuit, MetaField, ModelInput, ModelOutput, StateId, TensorId, WeightId,
};
use solder_circuit::{ExecutionPlan, Mode};
use solder_config::Levers;
use solder_gpu_runtime::DevicePtr;

use crate::kernels::emit_view::Operands;
use crate::kernels::gemv::ScratchRegions;
use crate::kernels::Buf;
use crate::layout::Layout;

pub struct Bindings<'a> {
    pub circuit: &'a Circuit,
    pub plan: &'a ExecutionPlan,
    pub layout: &'a Layout,
    pub workspace: DevicePtr,
    pub weights: DevicePtr,
    pub kv: DevicePtr,
    /// The build's levers: emit-time entry choices that keep the plan and the bytes (e.g.
    /// `gemv_classic`) read them here.
    pub levers: &'a Levers,
}

impl Bindings<'_> {
    pub fn rows(&self) -> usize {
        self.plan.rows
    }

    /// The device range of a tensor at this plan's rows; `None` when it has no storage (a
    /// fused edge, never stored).
    pub fn tensor(&self, t: TensorId) -> Option<Buf> {
        let tensor = self.circuit.tensor(t);
        let bytes = tensor.bytes(self.rows());
        match tensor.binding {
            Binding::Arena => self.plan.buffer_of(t).map(|b| Buf {
                ptr: self.workspace.offset(self.layout.arena_offset + b.offset),
                bytes: b.bytes,
            }),
            Binding::Input(ModelInput::Tokens) => Some(Buf {
                ptr: self
                    .workspace
                    .offset(self.layout.meta.tokens(self.rows()).offset),
                bytes,
            }),
            Binding::Output(ModelOutput::Logits) => Some(Buf {
                ptr: self.workspace.offset(self.layout.logits_offset),
                bytes,
            }),
            // The target writes its final hidden rows where the draft head reads them.
            Binding::Input(ModelInput::Hidden) | Binding::Output(ModelOutput::Hidden) => {
                Some(Buf {
                    ptr: self.workspace.offset(self.layout.hidden_offset),
                    bytes,
                })
            }
            Binding::Output(ModelOutput::DraftHidden) => Some(Buf {
                ptr: self.workspace.offset(self.layout.draft_hidden_offset),
                bytes,
            }),
            Binding::State(state) => Some(self.state(state)),
        }
    }

    /// A state's region: a layer's KV pages, or its sequence slots.
    pub fn state(&self, state: StateId) -> Buf {
        let r = &self.layout.states[state.0 as usize];
        let bytes = if r.slot_bytes == 0 {
            r.bytes
        } else {
            r.slot_bytes * self.layout.state_slots
        };
        Buf {
            ptr: self.kv.offset(r.offset),
            bytes,
        }
    }

    /// The per-row snapshots of a recurrent state (one slot's bytes per row of this plan),
    /// when the plan keeps them (`ExecutionPlan::keeps_snapshots`; the layout has room for the
    /// widest plan that does).
    pub fn snapshots(&self, state: StateId) -> Option<Buf> {
        if !self.plan.keeps_snapshots {
            return None;
        }
        let r = &self.layout.states[state.0 as usize];
        debug_assert!(
            self.rows() <= self.layout.state_rows.snapshots,
            "{} rows of snapshots, the layout keeps {}",
            self.rows(),
            self.layout.state_rows.snapshots
        );
        Some(Buf {
            ptr: self.kv.offset(r.snapshot_offset),
            bytes: r.slot_bytes * self.rows(),
        })
    }

    pub fn weight(&self, w: WeightId) -> Buf {
        let slot = &self.circuit.weights[w.0 as usize];
        Buf {
            ptr: self
                .weights
                .offset(self.layout.weight_offsets[w.0 as usize]),
            // The slot's stored bytes: dense bf16, or its quantized blob(s) (`circuit::format`).
            bytes: slot.bytes(),
        }
    }

    /// A metadata field's bytes at this plan's rows (`MetaLayout::field`).
    pub fn meta(&self, field: MetaField) -> Buf {
        let range = self.layout.meta.field(field, self.rows());
        Buf {
            ptr: self.workspace.offset(range.offset),
            bytes: range.bytes,
        }
    }

    /// The attention scratch of an attention op with `heads` and `head_dim` at this plan's
    /// rows (`kernels::attn::scratch_bytes`): the start of the workspace's scratch region, whose
    /// (head, row) slots lie where every plan puts them.
    pub fn attn_scratch(&self, heads: usize, head_dim: usize) -> Buf {
        let bytes = crate::kernels::attn::scratch_bytes(self.rows(), heads, head_dim);
        debug_assert!(
            bytes <= self.layout.attn_scratch_bytes,
            "attention scratch of {bytes} bytes exceeds the layout's {}",
            self.layout.attn_scratch_bytes
        );
        Buf {
            ptr: self.workspace.offset(self.layout.attn_scratch_offset),
            bytes,
        }
    }

    /// The o-fold scratch of `heads` heads and `n_out` features at this plan's rows
    /// (`kernels::attn::fold::o_scratch_bytes`): the start of the workspace's o-fold region,
    /// whose per-row slots lie where every plan puts them.
    pub fn o_scratch(&self, heads: usize, n_out: usize) -> Buf {
        let bytes = crate::kernels::attn::fold::o_scratch_bytes(self.rows(), heads, n_out);
        debug_assert!(
            bytes <= self.layout.o_scratch_bytes,
            "o-fold scratch of {bytes} bytes exceeds the layout's {}",
            self.layout.o_scratch_bytes
        );
        Buf {
            ptr: self.workspace.offset(self.layout.o_scratch_offset),
            bytes,
        }
    }

    /// The gemv split-K scratch slot of `stream` (`kernels::gemv::split`): each stream has
    /// its own slot, so launches on concurrent streams never share counters. `None` when the
    /// workspace has no slot for it.
    pub fn gemv_slot(&self, stream: u8) -> Option<Buf> {
        let slot = self.layout.gemv_slot_bytes;
        let at = stream as usize * slot;
        if slot == 0 || at + slot > self.layout.gemv_scratch_bytes {
            return None;
        }
        Some(Buf {
            ptr: self.workspace.offset(self.layout.gemv_scratch_offset + at),
            bytes: slot,
        })
    }

    /// The workspace's split-kernel scratch regions, whole (what the counters reset zeroes).
    pub fn scratch_regions(&self) -> ScratchRegions {
        let whole = |offset: usize, bytes: usize| Buf::new(self.workspace.offset(offset), bytes);
        let l = self.layout;
        ScratchRegions {
            attn: whole(l.attn_scratch_offset, l.attn_scratch_bytes),
            o_fold: whole(l.o_scratch_offset, l.o_scratch_bytes),
            gemv: whole(l.gemv_scratch_offset, l.gemv_scratch_bytes),
            gemv_slot_bytes: l.gemv_slot_bytes,
        }
    }

    pub fn inv_freq(&self) -> Buf {
        Buf {
            ptr: self.weights.offset(self.layout.inv_freq_offset),
            bytes: self.layout.inv_freq_len * 4,
        }
    }
}

impl Operands for Bindings<'_> {
    fn circuit(&self) -> &Circuit {
        self.circuit
    }

    fn mode(&self) -> Mode {
        self.plan.mode
    }

    fn rows(&self) -> usize {
        Bindings::rows(self)
    }

    fn levers(&self) -> &Levers {
        self.levers
    }

    fn tensor(&self, t: TensorId) -> Option<Buf> {
        Bindings::tensor(self, t)
    }

    fn state(&self, state: StateId) -> Buf {
        Bindings::state(self, state)
    }

    fn snapshots(&self, state: StateId) -> Option<Buf> {
        Bindings::snapshots(self, state)
    }

    fn weight(&self, w: WeightId) -> Buf {
        Bindings::weight(self, w)
    }

    fn meta(&self, field: MetaField) -> Buf {
        Bindings::meta(self, field)
    }

    fn inv_freq(&self) -> Buf {
        Bindings::inv_freq(self)
    }

    fn attn_scratch(&self, heads: usize, head_dim: usize) -> Buf {
        Bindings::attn_scratch(self, heads, head_dim)
    }

    fn o_scratch(&self, heads: usize, n_out: usize) -> Buf {
        Bindings::o_scratch(self, heads, n_out)
    }

    fn moe_scratch(&self) -> Buf {
        Buf::new(
            self.workspace.offset(self.layout.moe_scratch_offset),
            self.layout.moe_scratch_bytes,
        )
    }

    fn gemv_slot(&self, stream: u8) -> Option<Buf> {
        Bindings::gemv_slot(self, stream)
    }

    fn state_slots(&self) -> usize {
        self.layout.state_slots
    }

    fn kv_block_size(&self) -> usize {
        self.layout.kv_block_size
    }

    fn kv_pages(&self) -> usize {
        self.layout.kv_pages
    }

    fn max_blocks(&self) -> usize {
        self.layout.max_blocks
    }
}
