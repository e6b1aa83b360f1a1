//! An exec's three allocations (`Memory`): the workspace (arena, metadata region, scratch,
//! hidden rows), the weights and the state (KV pages and recurrent-state slots) — how a build
//! sizes and fills them, and how `CircuitExec::resize_kv` moves the state allocation to a
//! pool of another size.
//!
//! Invariants: the workspace and the weights are allocated once and never move (a captured
//! graph names them for the exec's life); only the state allocation moves, and only after
//! every program is rebound to the new one and every graph that named the old one is
//! destroyed. A resize that fails leaves the exec as it was, but for the destroyed graphs.

use std::sync::Mutex;

use solder_circuit::ir::Circuit;
use solder_circuit::{ExecutionPlan, Instance};
use solder_config::Quantization;
use solder_gpu_runtime::{DevicePtr, GpuBackend};

use super::boot::KvShape;
use super::compile::{compile_all, Targets};
use super::owned::{Memory, Owned};
use super::pools::Pools;
use super::CircuitExec;
use crate::bytes;
use crate::checkpoint::Checkpoint;
use crate::error::ExecError;
use crate::layout::{check_state_bytes, Layout, StateRows};
use crate::program::Program;
use crate::weights::HostWeights;

/// The layout of every plan the workspace serves, route arms included: the arena is sized
/// for the largest of them, so an arm never overwrites what lies past the arena. The state
/// allocation's size is checked first, refused by the `KvShape` field at fault.
pub(super) fn size(
    instance: &Instance,
    served: &[&ExecutionPlan],
    vocab_size: usize,
    inv_freq_len: usize,
    kv: &KvShape,
) -> Result<Layout, ExecError> {
    let rows = StateRows::of(served, kv.max_sequences);
    check_state_bytes(instance.storage(), rows, kv.pages, kv.max_sequences).map_err(
        |(field, message)| {
            let (field, value) = match field {
                "pages" => ("KvShape::pages", kv.pages),
                _ => ("KvShape::max_sequences", kv.max_sequences),
            };
            ExecError::Argument {
                field,
                value: value.to_string(),
                message,
            }
        },
    )?;
    Ok(Layout::new(
        instance.storage(),
        served,
        vocab_size,
        inv_freq_len,
        kv.pages,
        kv.max_seq_len,
        kv.max_sequences,
    ))
}

/// Where a build's weights come from once checked: host bytes (seeded, or given), or a
/// checkpoint streamed to the device part by part (`weights::stream`).
pub(super) enum Weights<'a> {
    Host(HostWeights),
    Checkpoint {
        checkpoint: Checkpoint,
        circuit: &'a Circuit,
        quantization: Option<&'a Quantization>,
    },
}

/// Allocates the workspace (its counters zeroed), the weights and the state, and uploads the
/// weights (a host copy is dropped once uploaded; a checkpoint is streamed, never held whole
/// on the host) and rope's inv_freq.
pub(super) fn allocate(
    backend: &mut dyn GpuBackend,
    owned: &mut Owned,
    layout: &Layout,
    source: Weights<'_>,
    inv_freq: &[f32],
) -> Result<Memory, ExecError> {
    let workspace = owned.alloc(backend, layout.workspace_bytes)?;
    // The attention kernels' arrival counters (and the o-fold kernels' and gemv's split-K
    // counters, right after them) start at zero; each launch leaves them so.
    let scratch_bytes =
        layout.attn_scratch_bytes + layout.o_scratch_bytes + layout.gemv_scratch_bytes;
    if scratch_bytes > 0 {
        backend.memset(
            workspace.offset(layout.attn_scratch_offset),
            0,
            scratch_bytes,
        )?;
    }
    let weights = owned.alloc(backend, layout.weights_bytes)?;
    let kv = owned.alloc(backend, layout.state_bytes)?;
    match source {
        Weights::Host(host) => {
            for (slot, offset) in host.slots.iter().zip(&layout.weight_offsets) {
                backend.copy_h2d(weights.offset(*offset), slot)?;
            }
        }
        Weights::Checkpoint {
            checkpoint,
            circuit,
            quantization,
        } => {
            crate::weights::stream::stream(
                circuit,
                &checkpoint,
                quantization,
                |slot, offset, part| -> Result<(), ExecError> {
                    let at = layout.weight_offsets[slot] + offset;
                    backend.copy_h2d(weights.offset(at), part)?;
                    Ok(())
                },
            )?;
        }
    }
    backend.copy_h2d(
        weights.offset(layout.inv_freq_offset),
        &bytes::f32_bytes(inv_freq),
    )?;
    Ok(Memory {
        workspace,
        weights,
        kv,
    })
}

impl CircuitExec {
    /// `resize_kv` once the exec is known live and bound to `backend`: the checks, the new
    /// layout, the new state allocation and the programs rebound to it, the stale graphs
    /// destroyed, then the swap.
    pub(super) fn resize_state(
        &mut self,
        backend: &mut dyn GpuBackend,
        pages: usize,
    ) -> Result<(), ExecError> {
        self.check_resizable(pages)?;
        let layout = self.layout_at(pages)?;
        let mut fresh = Owned::default();
        let kv = fresh.alloc(backend, layout.state_bytes)?;
        // Every graph baked the old allocation and page count: destroyed before it is freed.
        let rebound = self
            .rebind(backend, &layout, kv)
            .and_then(|programs| self.graphs.invalidate(backend).map(|()| programs));
        let (programs, arms) = match rebound {
            Ok(both) => both,
            Err(e) => {
                if let Err(cleanup) = fresh.release(backend) {
                    tracing::warn!(%cleanup, "resize_kv could not free the state allocation it made");
                }
                return Err(e);
            }
        };
        self.swap_state(backend, fresh, kv, &layout);
        self.pools = Mutex::new(Pools::new(&layout, kv));
        self.programs = programs;
        self.arms = arms;
        self.layout = layout;
        Ok(())
    }

    /// Grows the KV pool to `pages` pages keeping what sequences hold: a new state
    /// allocation, each state region's contents copied to the same place in it (a KV region
    /// is page-major, so its old pages keep their ids; the recurrent slots, spares and
    /// snapshots keep theirs), every program rebound, every graph destroyed (recaptured at next
    /// use), and the pools extended by the new pages. All or nothing: on failure the exec is
    /// as it was, but for the destroyed graphs.
    pub(super) fn grow_state(
        &mut self,
        backend: &mut dyn GpuBackend,
        pages: usize,
    ) -> Result<(), ExecError> {
        if pages < self.layout.kv_pages {
            return Err(ExecError::Argument {
                field: "pages",
                value: pages.to_string(),
                message: format!(
                    "grow_kv: the pool only grows (it holds {} pages)",
                    self.layout.kv_pages
                ),
            });
        }
        self.check_capacity(pages)?;
        let layout = self.layout_at(pages)?;
        let mut fresh = Owned::default();
        let kv = fresh.alloc(backend, layout.state_bytes)?;
        let grown = self
            .copy_states(backend, &layout, kv)
            .and_then(|()| self.rebind(backend, &layout, kv))
            .and_then(|programs| self.graphs.invalidate(backend).map(|()| programs));
        let (programs, arms) = match grown {
            Ok(both) => both,
            Err(e) => {
                if let Err(cleanup) = fresh.release(backend) {
                    tracing::warn!(%cleanup, "grow_kv could not free the state allocation it made");
                }
                return Err(e);
            }
        };
        self.swap_state(backend, fresh, kv, &layout);
        let pools = self.pools.get_mut().unwrap_or_else(|e| e.into_inner());
        pools.pages.extend_to(pages);
        pools.slots.rebase(kv);
        self.programs = programs;
        self.arms = arms;
        self.layout = layout;
        Ok(())
    }

    /// Copies every state region of the current allocation into `kv` laid out as `layout`
    /// (regions only grow: the old bytes land at the start of the new region).
    fn copy_states(
        &self,
        backend: &mut dyn GpuBackend,
        layout: &Layout,
        kv: DevicePtr,
    ) -> Result<(), ExecError> {
        // The copies read what queued steps wrote.
        backend.synchronize()?;
        for (old, new) in self.layout.states.iter().zip(&layout.states) {
            let bytes = old.bytes.min(new.bytes);
            backend.copy_d2d(
                kv.offset(new.offset),
                self.memory.kv.offset(old.offset),
                bytes,
            )?;
        }
        backend.synchronize()?;
        Ok(())
    }

    /// Refuses a resize while a handle from `capture` lives or a sequence holds a page or
    /// slot, and a page count out of range or whose state allocation is too large.
    fn check_resizable(&self, pages: usize) -> Result<(), ExecError> {
        if let Some(held) = self.pools().held() {
            return Err(ExecError::Build(format!(
                "resize_kv: {held} still lent; end every sequence first"
            )));
        }
        self.check_capacity(pages)
    }

    /// Refuses a resize or growth while a handle from `capture` lives, and a page count out
    /// of range or whose state allocation is too large.
    fn check_capacity(&self, pages: usize) -> Result<(), ExecError> {
        if self.graphs.handles_out() > 0 {
            return Err(ExecError::GraphsAlive {
                live: self.graphs.handles_out(),
            });
        }
        if !(2..=KvShape::MAX_PAGES).contains(&pages) {
            return Err(ExecError::Argument {
                field: "pages",
                value: pages.to_string(),
                message: format!(
                    "resize_kv: must be 2..={} (one is the scratch page)",
                    KvShape::MAX_PAGES
                ),
            });
        }
        check_state_bytes(
            self.instance.storage(),
            self.layout.state_rows,
            pages,
            self.layout.state_slots - 1 - self.layout.spare_slots,
        )
        .map_err(|(_, message)| ExecError::Argument {
            field: "pages",
            value: pages.to_string(),
            message: format!("resize_kv: {message}"),
        })?;
        Ok(())
    }

    /// The layout at `pages` pages, refused if anything but the state allocation would move.
    fn layout_at(&self, pages: usize) -> Result<Layout, ExecError> {
        let served: Vec<&ExecutionPlan> = self.plans.iter().chain(&self.arm_plans).collect();
        let layout = Layout::new(
            self.instance.storage(),
            &served,
            self.config.vocab_size,
            self.layout.inv_freq_len,
            pages,
            self.layout.max_seq_len,
            self.layout.state_slots - 1 - self.layout.spare_slots,
        );
        if layout.workspace_bytes != self.layout.workspace_bytes
            || layout.weights_bytes != self.layout.weights_bytes
        {
            return Err(ExecError::Build(format!(
                "resize_kv to {pages} pages changes the workspace or weights layout \
                 ({} -> {} workspace bytes): only the state allocation may move",
                self.layout.workspace_bytes, layout.workspace_bytes
            )));
        }
        Ok(layout)
    }

    /// Every program and arm compiled again against `layout` and the state allocation `kv`.
    fn rebind(
        &self,
        backend: &mut dyn GpuBackend,
        layout: &Layout,
        kv: DevicePtr,
    ) -> Result<(Vec<Program>, Vec<Program>), ExecError> {
        let targets = Targets {
            layout,
            memory: Memory { kv, ..self.memory },
            levers: &self.levers,
        };
        let arms = self
            .arms
            .iter()
            .zip(&self.arm_plans)
            .filter_map(|(p, plan)| p.arm.map(|c| (c, plan)));
        compile_all(
            backend,
            &self.instance,
            &targets,
            &self.plans,
            arms,
            self.launch_order,
        )
    }

    /// Hands the exec the new state allocation `kv` (recorded in `fresh`) and frees the old
    /// one; an old one that cannot be freed stays owned, for `free` to retry.
    fn swap_state(
        &mut self,
        backend: &mut dyn GpuBackend,
        mut fresh: Owned,
        kv: DevicePtr,
        layout: &Layout,
    ) {
        let old = self.memory.kv;
        self.owned.allocations.retain(|&p| p != old);
        self.owned.allocations.append(&mut fresh.allocations);
        if let Err(e) = backend.free(old) {
            tracing::warn!(error = %e, "resize_kv could not free the old state allocation; free() retries it");
            self.owned.allocations.push(old);
        }
        tracing::info!(
            from = self.layout.kv_pages,
            to = layout.kv_pages,
            state_bytes = layout.state_bytes,
            "resized the KV pool"
        );
        self.memory.kv = kv;
    }
}
