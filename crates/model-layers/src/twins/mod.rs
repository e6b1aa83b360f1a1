//! CPU twins: the host implementation of every kernel in `crate::ops::KERNELS`, registered
//! under the same `module::func` name and reading the same argument list by index.
//!
//! Invariants: a twin checks every dimension, buffer length and index (token ids, slots, page
//! ids, sequence lengths) before it writes, and returns an error naming the kernel instead of
//! panicking; a fused twin runs the reference twins' primitives (`crate::numerics`) in the
//! same order, so its bytes equal the reference routing's; results never depend on the
//! number of host threads.

use solder_gpu_runtime::{CpuBackend, GpuError, TwinFn};

mod args;
mod attn;
mod basic;
mod gdn;
mod gemv;
mod heads;
mod matvec;
mod moe;
mod next;

/// Every twin with its kernel name, in `ops::KERNELS` order.
pub fn twins() -> Vec<(&'static str, TwinFn)> {
    vec![
        ("embed::embedding", basic::embedding as TwinFn),
        ("norm::rms_norm", basic::rms_norm),
        ("norm::add_rms_norm", basic::add_rms_norm),
        ("norm::qk_norm", heads::qk_norm),
        ("gemv::linear", gemv::linear),
        ("gemv::lm_head", gemv::lm_head),
        ("gemv::norm_linear", gemv::norm_linear),
        ("gemv::qkv", gemv::qkv),
        ("gemv::norm_qkv", gemv::norm_qkv),
        ("gemv::add_norm_qkv", gemv::add_norm_qkv),
        ("gemv::gate_up_silu", gemv::gate_up_silu),
        ("gemv::norm_gate_up_silu", gemv::norm_gate_up_silu),
        ("gemv::add_norm_gate_up_silu", gemv::add_norm_gate_up_silu),
        ("gemv::linear_residual_add", gemv::linear_residual_add),
        ("gemv::add_norm_lm_head", gemv::add_norm_lm_head),
        ("rope::rope", heads::rope),
        ("rope::qk_norm_rope", heads::qk_norm_rope),
        ("rope::rope_kv_write", heads::rope_kv_write),
        ("rope::qk_norm_rope_kv_write", heads::qk_norm_rope_kv_write),
        ("kv::kv_write", heads::kv_write),
        ("attn::paged_decode", attn::paged_attention),
        ("attn::paged_causal", attn::paged_attention),
        ("add::residual_add", basic::residual_add),
        ("act::silu_mul", basic::silu_mul),
        ("moe::topk_softmax", moe::topk_softmax),
        ("moe::router_topk", moe::router_topk),
        ("moe::gate_up_silu", moe::gate_up_silu),
        ("moe::down", moe::down),
        ("norm::rms_norm_zc", next::rms_norm_zc),
        ("norm::add_rms_norm_zc", next::add_rms_norm_zc),
        ("norm::qk_norm_zc", next::qk_norm_zc),
        ("attn::gate_split", next::gate_split),
        ("act::sigmoid_mul", next::sigmoid_mul),
        ("moe::combine_shared", next::combine_shared),
        ("gdn::conv", gdn::conv),
        ("gdn::gates", gdn::gates),
        ("gdn::recurrence", gdn::recurrence),
        ("gdn::recurrence_pitched", gdn::recurrence_pitched),
        ("gdn::gated_norm", gdn::gated_norm),
    ]
}

/// The twin of `kernel`, if there is one.
pub fn twin(kernel: &str) -> Option<TwinFn> {
    twins()
        .into_iter()
        .find(|(name, _)| *name == kernel)
        .map(|(_, f)| f)
}

/// Registers every twin with the CPU backend.
pub fn register_all(backend: &mut CpuBackend) -> Result<(), GpuError> {
    for (name, f) in twins() {
        backend.register_twin(name, f)?;
    }
    Ok(())
}
