//! The CPU backend's device memory: a virtual address space over host buffers.
//!
//! Invariants: every base address is 256-aligned, never 0 and never reused while the backend
//! lives; an unmapped gap follows each allocation, so a range one byte too long never lands
//! in a neighbour; host storage is 64-byte aligned and never moves until the allocation is
//! freed; new memory holds the poison byte.

use std::alloc::{alloc, dealloc, Layout};
use std::collections::BTreeMap;
use std::ptr::NonNull;

use crate::error::GpuError;
use crate::types::DevicePtr;

/// The byte new memory is filled with: NaN as bf16 and as f32.
pub const POISON: u8 = 0xFF;
/// First base address: far from 0 so that small integers are never valid pointers.
const FIRST_BASE: u64 = 1 << 32;
const BASE_ALIGN: u64 = 256;
/// Unmapped bytes after each allocation.
const GAP: u64 = 4096;
const HOST_ALIGN: usize = 64;

/// Host bytes owned by one allocation.
struct HostBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl HostBuf {
    fn new(bytes: usize) -> Option<HostBuf> {
        // A zero-byte allocation still gets one byte so that its pointer is a real one.
        let layout = Layout::from_size_align(bytes.max(1), HOST_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        // SAFETY: `ptr` points to `layout.size()` freshly allocated bytes.
        unsafe { ptr.as_ptr().write_bytes(POISON, layout.size()) };
        Some(HostBuf { ptr, layout })
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: a HostBuf owns its bytes exclusively; nothing else holds its pointer beyond a
// launch, which runs on the thread that holds the backend.
unsafe impl Send for HostBuf {}

pub struct Allocation {
    pub base: u64,
    pub bytes: usize,
    /// Live captured graphs and graph execs whose work touches this allocation.
    pub graph_refs: u32,
    buf: HostBuf,
}

impl Allocation {
    pub fn end(&self) -> u64 {
        self.base + self.bytes as u64
    }

    /// The host address of device address `addr` (which lies in `base..=end`).
    pub fn host(&self, addr: u64) -> *mut u8 {
        debug_assert!(addr >= self.base && addr <= self.end());
        // SAFETY: the offset is at most `bytes`, inside (or one past) the host buffer.
        unsafe { self.buf.ptr.as_ptr().add((addr - self.base) as usize) }
    }
}

pub struct Memory {
    allocations: BTreeMap<u64, Allocation>,
    next_base: u64,
    live_bytes: usize,
}

impl Memory {
    pub fn new() -> Memory {
        Memory {
            allocations: BTreeMap::new(),
            next_base: FIRST_BASE,
            live_bytes: 0,
        }
    }

    pub fn alloc(&mut self, bytes: usize) -> Result<DevicePtr, GpuError> {
        let base = self.next_base;
        let next = (bytes as u64)
            .checked_add(base + GAP + BASE_ALIGN - 1)
            .map(|end| end / BASE_ALIGN * BASE_ALIGN)
            .ok_or(GpuError::OutOfMemory { bytes })?;
        let buf = HostBuf::new(bytes).ok_or(GpuError::OutOfMemory { bytes })?;
        self.next_base = next;
        self.live_bytes += bytes;
        self.allocations.insert(
            base,
            Allocation {
                base,
                bytes,
                graph_refs: 0,
                buf,
            },
        );
        tracing::debug!(
            base = format_args!("{base:#x}"),
            bytes,
            live_bytes = self.live_bytes,
            "cpu alloc"
        );
        Ok(DevicePtr(base))
    }

    /// Frees the allocation starting at `ptr`; refuses one a live graph captured.
    pub fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        let allocation = self
            .allocations
            .get(&ptr.0)
            .ok_or(GpuError::NotAnAllocation {
                call: "free",
                ptr: ptr.0,
            })?;
        if allocation.graph_refs > 0 {
            return Err(GpuError::CapturedByLiveGraph { ptr: ptr.0 });
        }
        let bytes = allocation.bytes;
        self.allocations.remove(&ptr.0);
        self.live_bytes -= bytes;
        tracing::debug!(
            base = format_args!("{:#x}", ptr.0),
            bytes,
            live_bytes = self.live_bytes,
            "cpu free"
        );
        Ok(())
    }

    /// The live allocation holding all of `start..start + bytes` (a zero-byte range may sit
    /// anywhere in `base..=end`).
    pub fn containing(&self, start: u64, bytes: usize) -> Option<&Allocation> {
        let end = start.checked_add(bytes as u64)?;
        let (_, allocation) = self.allocations.range(..=start).next_back()?;
        (end <= allocation.end()).then_some(allocation)
    }

    /// Like `containing`, as an `OutOfRange` error naming `what`.
    pub fn range(
        &self,
        what: &str,
        start: DevicePtr,
        bytes: usize,
    ) -> Result<&Allocation, GpuError> {
        self.containing(start.0, bytes)
            .ok_or_else(|| GpuError::OutOfRange {
                what: what.to_string(),
                start: start.0,
                end: start.0.saturating_add(bytes as u64),
            })
    }

    /// The host address of `start..start + bytes`, range-checked.
    pub fn host_range(
        &self,
        what: &str,
        start: DevicePtr,
        bytes: usize,
    ) -> Result<*mut u8, GpuError> {
        Ok(self.range(what, start, bytes)?.host(start.0))
    }

    pub fn get_mut(&mut self, base: u64) -> Option<&mut Allocation> {
        self.allocations.get_mut(&base)
    }

    pub fn live_allocations(&self) -> usize {
        self.allocations.len()
    }

    pub fn live_bytes(&self) -> usize {
        self.live_bytes
    }
}
