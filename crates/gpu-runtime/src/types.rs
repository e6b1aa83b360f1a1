//! Handles and launch descriptions shared by every backend.

/// A device address. The CPU backend hands out addresses in a virtual space of its own; the
/// CUDA backend, real device pointers. `DevicePtr::NULL` marks an absent optional buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub const NULL: DevicePtr = DevicePtr(0);

    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }

    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelId(pub u32);

/// A copy queued by `copy_d2h_async`, until `take_readback` or `release_readback` ends it
/// (ids are never reused by a backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReadbackId(pub u32);

/// A captured (not yet instantiated) graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GraphId(pub u32);

/// An instantiated graph, ready to launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GraphExecId(pub u32);

/// How a kernel uses a buffer argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// One typed kernel argument. Buffers declare the byte range they touch and how, so the CPU
/// backend can check every launch; the CUDA backend passes the pointer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    Buffer {
        ptr: DevicePtr,
        bytes: usize,
        access: Access,
    },
    /// An optional buffer that is absent (a null pointer on the device).
    Null,
    I32(i32),
    U32(u32),
    F32(f32),
}

impl KernelArg {
    pub fn read(ptr: DevicePtr, bytes: usize) -> KernelArg {
        KernelArg::Buffer {
            ptr,
            bytes,
            access: Access::Read,
        }
    }

    pub fn write(ptr: DevicePtr, bytes: usize) -> KernelArg {
        KernelArg::Buffer {
            ptr,
            bytes,
            access: Access::Write,
        }
    }

    pub fn read_write(ptr: DevicePtr, bytes: usize) -> KernelArg {
        KernelArg::Buffer {
            ptr,
            bytes,
            access: Access::ReadWrite,
        }
    }
}

/// Grid and block dimensions and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

impl LaunchConfig {
    pub fn linear(blocks: u32, threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid: [blocks.max(1), 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
        }
    }
}

/// How a launch is ordered after the work before it on its stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LaunchOrder {
    /// The launch starts once everything before it on its stream has completed.
    #[default]
    Serial,
    /// Programmatic dependent launch (Hopper, `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`):
    /// when the work before it is a kernel, the launch may start while that kernel still runs
    /// (once its blocks have all called `griddepcontrol.launch_dependents` or exited). Only
    /// for kernels that wait for the previous grid (`griddepcontrol.wait`, common.cuh's
    /// `pdl_wait`) before they touch memory a launch writes; each waits for the previous
    /// grid's completion and memory, so results are those of a serial launch. A backend that
    /// cannot overlap launches runs it serially, which is always a valid schedule of it.
    Programmatic,
}

/// What a backend says about its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    pub backend: &'static str,
    pub name: String,
    pub memory_bytes: u64,
    /// (major, minor) on CUDA devices.
    pub compute_capability: Option<(u32, u32)>,
    pub multiprocessors: u32,
    /// Host threads the CPU backend's twins may use.
    pub host_threads: usize,
}

/// A module to load: its name (`norm`, `gemv`, ...) and, for the CUDA backend, its PTX and
/// optionally a cubin assembled from that PTX for the device's architecture, loaded first (no
/// JIT) with the PTX as the fallback when the driver refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModuleImage<'a> {
    pub name: &'a str,
    pub ptx: Option<&'a str>,
    pub cubin: Option<&'a [u8]>,
}
