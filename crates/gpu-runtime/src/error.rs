//! Errors of the runtime. Each names the call, kernel, argument or allocation at fault.

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("out of device memory: asked {bytes} bytes")]
    OutOfMemory { bytes: usize },
    #[error("{call}: address {ptr:#x} is not the start of a live allocation")]
    NotAnAllocation { call: &'static str, ptr: u64 },
    #[error("{what}: bytes {start:#x}..{end:#x} are not inside one live allocation")]
    OutOfRange { what: String, start: u64, end: u64 },
    #[error("kernel `{kernel}`: argument {index}: {message}")]
    BadArgument {
        kernel: String,
        index: usize,
        message: String,
    },
    #[error("kernel `{kernel}`: writable argument {a} overlaps argument {b}")]
    Aliasing { kernel: String, a: usize, b: usize },
    #[error(
        "race: {current} on stream {stream} touches bytes {start:#x}..{end:#x} that {previous} \
         on stream {previous_stream} used with no event ordering the two"
    )]
    Race {
        current: String,
        stream: u32,
        previous: String,
        previous_stream: u32,
        start: u64,
        end: u64,
    },
    #[error("no kernel `{0}` in the loaded modules")]
    UnknownKernel(String),
    #[error("no module `{0}` (the backend has no kernels for it)")]
    UnknownModule(String),
    #[error("kernel `{kernel}` failed: {message}")]
    Kernel { kernel: String, message: String },
    #[error("unknown {what} handle {id}")]
    UnknownHandle { what: &'static str, id: u32 },
    #[error("readback {readback}: {asked} bytes asked for, its copy holds {holds}")]
    ReadbackLength {
        readback: u32,
        asked: usize,
        holds: usize,
    },
    #[error("cannot free {ptr:#x}: a live graph captured work on it (destroy the graph first)")]
    CapturedByLiveGraph { ptr: u64 },
    #[error("graph capture: {0}")]
    Capture(String),
    #[error("{call}: {message}")]
    Driver { call: &'static str, message: String },
    #[error("no CUDA driver could be loaded: {0}")]
    NoDriver(String),
}

impl GpuError {
    /// The refusal of `call`, a copy or memset queued on stream `stream` while that stream
    /// captures: graphs hold launches only (the CPU and checked backends' one wording).
    pub(crate) fn queued_while_capturing(call: &str, stream: u32) -> GpuError {
        GpuError::Capture(format!(
            "{call} on stream {stream} while it is capturing (graphs hold launches only)"
        ))
    }
}
