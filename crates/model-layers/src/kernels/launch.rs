//! What an emitter hands the program: launches (`Launch`: a kernel by name, its
//! configuration and arguments) over device byte ranges (`Buf`).

use solder_gpu_runtime::{DevicePtr, KernelArg, LaunchConfig};

/// A device byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buf {
    pub ptr: DevicePtr,
    pub bytes: usize,
}

impl Buf {
    pub fn new(ptr: DevicePtr, bytes: usize) -> Buf {
        Buf { ptr, bytes }
    }
}

/// One kernel launch: the kernel by `module::func`, its configuration and arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub kernel: &'static str,
    pub config: LaunchConfig,
    pub args: Vec<KernelArg>,
}
