//! The emitter of each kernel: which buffers, weights, metadata and attributes of the group's
//! ops go to which argument of its `ops::` function; one file per family's kernels.

mod dense;
mod moe_kernels;
mod next;

use super::View;
use crate::error::ExecError;
use crate::ops::Launch;

type R = Result<Vec<Launch>, ExecError>;

pub(super) fn emit(v: &View<'_>, emitter: &str) -> R {
    match emitter {
        "embed::embedding" => dense::embedding(v),
        "norm::rms_norm" => dense::rms_norm(v),
        "norm::add_rms_norm" => dense::add_rms_norm(v),
        "norm::qk_norm" => dense::qk_norm(v),
        "gemv::linear" => dense::linear(v),
        "gemv::lm_head" => dense::lm_head(v),
        "gemv::norm_linear" => dense::norm_linear(v),
        "gemv::qkv" | "gemv::norm_qkv" | "gemv::add_norm_qkv" => dense::qkv(v, emitter),
        "gemv::gate_up_silu" | "gemv::norm_gate_up_silu" | "gemv::add_norm_gate_up_silu" => {
            dense::gate_up(v, emitter)
        }
        "gemv::linear_residual_add" => dense::linear_residual_add(v),
        "gemv::add_norm_lm_head" => dense::add_norm_lm_head(v),
        "rope::rope" | "rope::qk_norm_rope" => dense::rope_only(v, emitter),
        "rope::rope_kv_write" | "rope::qk_norm_rope_kv_write" => dense::rope_kv_write(v, emitter),
        "kv::kv_write" => dense::kv_write(v),
        "attn::paged_decode" | "attn::paged_causal" => dense::attention(v, emitter),
        "add::residual_add" => dense::residual_add(v),
        "act::silu_mul" => dense::silu_mul(v),
        "moe::topk_softmax" => moe_kernels::topk_softmax(v),
        "moe::router_topk" => moe_kernels::router_topk(v),
        "moe::gate_up_silu" => moe_kernels::moe_gate_up(v),
        "moe::down" => moe_kernels::moe_down(v),
        "norm::rms_norm_zc" => next::rms_norm_zc(v),
        "norm::add_rms_norm_zc" => next::add_rms_norm_zc(v),
        "norm::qk_norm_zc" => next::qk_norm_zc(v),
        "attn::gate_split" => next::gate_split(v),
        "act::sigmoid_mul" => next::sigmoid_mul(v),
        "moe::combine_shared" => moe_kernels::combine_shared(v),
        "gdn::conv" => next::gdn_conv(v),
        "gdn::gates" => next::gdn_gates(v),
        "gdn::recurrence" => next::gdn_recurrence(v),
        "gdn::recurrence_pitched" => next::gdn_recurrence_pitched(v),
        "gdn::gated_norm" => next::gdn_gated_norm(v),
        other => Err(v.err(format!("no emitter for `{other}`"))),
    }
}
