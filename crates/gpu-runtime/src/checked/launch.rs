//! A launch's argument checks (every buffer inside one live allocation made through the
//! layer, no writable buffer overlapping another argument), the race check around a
//! forwarded operation, and the errors that name what is at fault.
//!
//! Invariant: an operation is recorded in the tracker only after the inner backend accepted
//! it.

use super::Checked;
use crate::backend::GpuBackend;
use crate::cpu::hb::{Conflict, Label, Touch};
use crate::error::GpuError;
use crate::types::{DevicePtr, KernelArg, KernelId};

impl<B: GpuBackend> Checked<B> {
    /// The name of `kernel` (looked up only to report an error).
    pub(super) fn kernel_name(&self, kernel: KernelId) -> String {
        self.inner
            .kernel_names()
            .into_iter()
            .find(|name| self.inner.kernel(name).ok() == Some(kernel))
            .unwrap_or_else(|| format!("#{}", kernel.0))
    }

    /// Range and aliasing checks of a launch; returns the ranges its buffers touch.
    pub(super) fn check_args(
        &self,
        kernel: KernelId,
        args: &[KernelArg],
    ) -> Result<Vec<Touch>, GpuError> {
        let mut touches = Vec::with_capacity(args.len());
        for (index, arg) in args.iter().enumerate() {
            let KernelArg::Buffer { ptr, bytes, access } = *arg else {
                continue;
            };
            let Some(base) = self.memory.containing(ptr.0, bytes) else {
                return Err(GpuError::OutOfRange {
                    what: format!("kernel `{}` arg {index}", self.kernel_name(kernel)),
                    start: ptr.0,
                    end: ptr.0.saturating_add(bytes as u64),
                });
            };
            touches.push(Touch {
                alloc: base,
                start: ptr.0,
                end: ptr.0 + bytes as u64,
                write: access.writes(),
                label: Label::Arg { kernel, index },
            });
        }
        for (a, writer) in touches.iter().enumerate() {
            if !writer.write || writer.start >= writer.end {
                continue;
            }
            let overlapping = touches.iter().enumerate().find(|(b, other)| {
                *b != a
                    && other.start < other.end
                    && other.start < writer.end
                    && writer.start < other.end
            });
            if let Some((_, other)) = overlapping {
                return Err(GpuError::Aliasing {
                    kernel: self.kernel_name(kernel),
                    a: arg_index(writer.label),
                    b: arg_index(other.label),
                });
            }
        }
        Ok(touches)
    }

    /// One touch of `call` on `dst..dst + bytes`, range-checked.
    pub(super) fn call_touch(
        &self,
        call: &'static str,
        dst: DevicePtr,
        bytes: usize,
        write: bool,
    ) -> Result<Touch, GpuError> {
        let base = self
            .memory
            .containing(dst.0, bytes)
            .ok_or_else(|| GpuError::OutOfRange {
                what: call.to_string(),
                start: dst.0,
                end: dst.0.saturating_add(bytes as u64),
            })?;
        Ok(Touch {
            alloc: base,
            start: dst.0,
            end: dst.0 + bytes as u64,
            write,
            label: Label::Call(call),
        })
    }

    /// Checks a synchronous call (it waits for all work, so it cannot race) before it is
    /// forwarded: no capture may be active and every range must be inside an allocation.
    pub(super) fn check_sync(
        &self,
        call: &'static str,
        ranges: &[(DevicePtr, usize)],
    ) -> Result<(), GpuError> {
        self.graphs.refuse_during_capture(call)?;
        for (ptr, bytes) in ranges {
            self.call_touch(call, *ptr, *bytes, true)?;
        }
        Ok(())
    }

    /// Race-checks `touches` on `lane`, forwards the operation, and records it once the
    /// inner backend accepted it.
    pub(super) fn checked_forward(
        &mut self,
        lane: u32,
        touches: &[Touch],
        forward: impl FnOnce(&mut B) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        if let Err(conflict) = self.tracker.check(lane, touches) {
            return Err(self.race_error(lane, conflict));
        }
        forward(&mut self.inner)?;
        let epoch = self.tracker.tick(lane);
        self.tracker.record(lane, epoch, touches);
        Ok(())
    }

    pub(super) fn race_error(&self, lane: u32, conflict: Conflict) -> GpuError {
        GpuError::Race {
            current: self.render(conflict.current),
            stream: self.lane_streams[lane as usize].0,
            previous: self.render(conflict.previous),
            previous_stream: self.lane_streams[conflict.previous_stream as usize].0,
            start: conflict.start,
            end: conflict.end,
        }
    }

    pub(super) fn render(&self, label: Label) -> String {
        match label {
            Label::Arg { kernel, index } => {
                format!("kernel {} arg {index}", self.kernel_name(kernel))
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
