//! One function per kernel: its grid, block and argument list (`Launch`). Nothing else
//! builds a launch. Argument order is the contract with the CUDA kernel and its CPU twin
//! (`crate::twins`), which reads the arguments by the same indices.
//!
//! Invariant: buffers a kernel only reads are `KernelArg::read`, buffers it only writes
//! `write`, both `read_write`; an absent optional buffer is `KernelArg::Null`.

use solder_gpu_runtime::{DevicePtr, KernelArg, LaunchConfig};

pub mod act;
pub mod add;
pub mod attn;
pub mod embed;
pub mod gdn;
pub mod gemv;
pub mod kv;
pub mod moe;
pub mod norm;
pub mod rope;

/// Every kernel with an op function (and a CPU twin), by `module::func`.
pub const KERNELS: &[&str] = &[
    "embed::embedding",
    "norm::rms_norm",
    "norm::add_rms_norm",
    "norm::qk_norm",
    "gemv::linear",
    "gemv::lm_head",
    "gemv::norm_linear",
    "gemv::qkv",
    "gemv::norm_qkv",
    "gemv::add_norm_qkv",
    "gemv::gate_up_silu",
    "gemv::norm_gate_up_silu",
    "gemv::add_norm_gate_up_silu",
    "gemv::linear_residual_add",
    "gemv::add_norm_lm_head",
    "rope::rope",
    "rope::qk_norm_rope",
    "rope::rope_kv_write",
    "rope::qk_norm_rope_kv_write",
    "kv::kv_write",
    "attn::paged_decode",
    "attn::paged_causal",
    "add::residual_add",
    "act::silu_mul",
    "moe::topk_softmax",
    "moe::router_topk",
    "moe::gate_up_silu",
    "moe::down",
    "norm::rms_norm_zc",
    "norm::add_rms_norm_zc",
    "norm::qk_norm_zc",
    "attn::gate_split",
    "act::sigmoid_mul",
    "moe::combine_shared",
    "gdn::conv",
    "gdn::gates",
    "gdn::recurrence",
    "gdn::recurrence_pitched",
    "gdn::gated_norm",
];

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

/// Builds argument lists in order.
pub(crate) struct Args(Vec<KernelArg>);

impl Args {
    pub(crate) fn new() -> Args {
        Args(Vec::with_capacity(20))
    }

    pub(crate) fn read(mut self, b: Buf) -> Args {
        self.0.push(KernelArg::read(b.ptr, b.bytes));
        self
    }

    pub(crate) fn write(mut self, b: Buf) -> Args {
        self.0.push(KernelArg::write(b.ptr, b.bytes));
        self
    }

    pub(crate) fn read_write(mut self, b: Buf) -> Args {
        self.0.push(KernelArg::read_write(b.ptr, b.bytes));
        self
    }

    pub(crate) fn read_opt(mut self, b: Option<Buf>) -> Args {
        self.0
            .push(b.map_or(KernelArg::Null, |b| KernelArg::read(b.ptr, b.bytes)));
        self
    }

    pub(crate) fn write_opt(mut self, b: Option<Buf>) -> Args {
        self.0
            .push(b.map_or(KernelArg::Null, |b| KernelArg::write(b.ptr, b.bytes)));
        self
    }

    pub(crate) fn u32(mut self, v: u32) -> Args {
        self.0.push(KernelArg::U32(v));
        self
    }

    pub(crate) fn f32(mut self, v: f32) -> Args {
        self.0.push(KernelArg::F32(v));
        self
    }

    pub(crate) fn launch(self, kernel: &'static str, config: LaunchConfig) -> Launch {
        Launch {
            kernel,
            config,
            args: self.0,
        }
    }
}

/// Threads of a row-wise block (norms, embedding, rope, KV write).
pub(crate) const ROW_THREADS: u32 = 256;

/// One block per row.
pub(crate) fn per_row(rows: u32) -> LaunchConfig {
    LaunchConfig::linear(rows, ROW_THREADS)
}

/// Elementwise kernels: 256 threads, 4 elements each.
pub(crate) fn elementwise(elements: u64) -> LaunchConfig {
    let blocks = elements.div_ceil(4 * 256).min(u32::MAX as u64) as u32;
    LaunchConfig::linear(blocks, 256)
}
