//! One launch: the argument checks (every buffer inside one live allocation, no writable
//! buffer overlapping another), the race check, and running the twin.
//!
//! Invariant: a twin runs only after all of these passed, which is what makes building its
//! [`TwinCtx`] sound.

use super::hb::{Conflict, Label, Touch};
use super::CpuBackend;
use crate::error::GpuError;
use crate::twin::{HostArg, TwinCtx};
use crate::types::{KernelArg, KernelId, LaunchConfig, StreamId};

impl CpuBackend {
    /// Range and aliasing checks of a launch; returns the ranges its buffers touch.
    pub(super) fn check_args(
        &self,
        kernel: KernelId,
        args: &[KernelArg],
    ) -> Result<Vec<Touch>, GpuError> {
        let (name, _) = self.registry.get(kernel)?;
        let mut touches = Vec::with_capacity(args.len());
        for (index, arg) in args.iter().enumerate() {
            let KernelArg::Buffer { ptr, bytes, access } = *arg else {
                continue;
            };
            let Some(allocation) = self.memory.containing(ptr.0, bytes) else {
                return Err(GpuError::OutOfRange {
                    what: format!("kernel `{name}` arg {index}"),
                    start: ptr.0,
                    end: ptr.0.saturating_add(bytes as u64),
                });
            };
            touches.push(Touch {
                alloc: allocation.base,
                start: ptr.0,
                end: ptr.0 + bytes as u64,
                write: access.writes(),
                label: Label::Arg { kernel, index },
            });
        }
        for writer in touches
            .iter()
            .filter(|touch| touch.write && touch.start < touch.end)
        {
            let overlapping = touches.iter().find(|other| {
                !std::ptr::eq(*other, writer)
                    && other.start < other.end
                    && other.start < writer.end
                    && writer.start < other.end
            });
            if let Some(other) = overlapping {
                return Err(GpuError::Aliasing {
                    kernel: name.to_string(),
                    a: arg_index(writer.label),
                    b: arg_index(other.label),
                });
            }
        }
        Ok(touches)
    }

    /// Race-checks, records and runs a checked launch now.
    pub(super) fn execute_launch(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
        touches: &[Touch],
    ) -> Result<(), GpuError> {
        self.track(stream, touches)?;
        let (name, twin) = self.registry.get(kernel)?;
        let mut host_args = Vec::with_capacity(args.len());
        for arg in args {
            host_args.push(match *arg {
                KernelArg::Buffer { ptr, bytes, access } => {
                    let allocation = self.memory.range(name, ptr, bytes)?;
                    HostArg::Buffer {
                        ptr: allocation.host(ptr.0),
                        bytes,
                        access,
                    }
                }
                KernelArg::Null => HostArg::Null,
                KernelArg::I32(v) => HostArg::I32(v),
                KernelArg::U32(v) => HostArg::U32(v),
                KernelArg::F32(v) => HostArg::F32(v),
            });
        }
        if let Some(emulation) = self.emulation.as_mut() {
            // SAFETY: as for the twin below: every buffer lies inside a live allocation that
            // nothing frees or touches during the call, none writable overlapping another.
            return unsafe { emulation.launch(name, config, &host_args, twin, self.threads) };
        }
        // SAFETY: `check_args` placed every buffer inside a live allocation (which cannot be
        // freed while the twin runs: it has no access to the backend), host storage is
        // 64-byte aligned, and no writable buffer overlaps another argument.
        let ctx = unsafe { TwinCtx::new(name, config, host_args, self.threads) };
        twin(&ctx)
    }

    /// The race check of one operation on `stream`, then its clock tick and its record.
    pub(super) fn track(&mut self, stream: StreamId, touches: &[Touch]) -> Result<(), GpuError> {
        if let Err(conflict) = self.tracker.check(stream.0, touches) {
            return Err(self.race_error(stream, conflict));
        }
        let epoch = self.tracker.tick(stream.0);
        self.tracker.record(stream.0, epoch, touches);
        Ok(())
    }

    fn race_error(&self, stream: StreamId, conflict: Conflict) -> GpuError {
        GpuError::Race {
            current: self.render(conflict.current),
            stream: stream.0,
            previous: self.render(conflict.previous),
            previous_stream: conflict.previous_stream,
            start: conflict.start,
            end: conflict.end,
        }
    }

    fn render(&self, label: Label) -> String {
        match label {
            Label::Arg { kernel, index } => {
                format!("kernel {} arg {index}", self.registry.name(kernel))
            }
            Label::Call(call) => call.to_string(),
        }
    }
}

fn arg_index(label: Label) -> usize {
    match label {
        Label::Arg { index, .. } => index,
        Label::Call(_) => 0,
    }
}
