//! Upper bounds on every dimension a config gives, and the checks on its floats.
//!
//! Each bound is far above any published model (the reason names the largest one known) and
//! small enough that every byte count solder computes from the dims at the widest serve shape
//! fits in `u64` with room: the largest weight slot (stacked experts,
//! `num_experts * 2 * moe_intermediate_size * hidden_size` bf16) is at most 2^47 bytes, all
//! slots of 4,096 layers together under 2^61; the largest activation (the experts' output
//! `rows * num_experts_per_tok * moe_intermediate_size` bf16, rows up to `MAX_ROWS` = 2^18)
//! at most 2^43 bytes.
//!
//! Invariant: a dim above its bound is refused (by `Fields`, which reads every integer) with
//! [`ConfigError::OutOfBounds`](crate::ConfigError::OutOfBounds), naming the file, the key, the
//! value and the bound; a float that is not finite, or that rounds to 0, to a subnormal or to
//! infinity as the f32 the kernels read, is refused naming the key (`Fields::positive_f32`).

/// The largest value a dimension key may take, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DimBound {
    /// The key's own name, without its parent object (`original_max_position_embeddings`).
    pub key: &'static str,
    pub max: usize,
    pub reason: &'static str,
}

const fn bound(key: &'static str, max: usize, reason: &'static str) -> DimBound {
    DimBound { key, max, reason }
}

/// Every dimension key's bound. A key not listed here is not a size (a step, an interval, a
/// window that is only compared) and is not bounded.
pub const DIM_BOUNDS: &[DimBound] = &[
    bound("hidden_size", 1 << 16, "4x Llama-3.1-405B's 16,384"),
    bound("intermediate_size", 1 << 18, "~5x Llama-3.1-405B's 53,248"),
    bound("num_hidden_layers", 4096, "~32x Llama-3.1-405B's 126"),
    bound(
        "num_attention_heads",
        1 << 10,
        "8x the 128 of the largest published models",
    ),
    bound(
        "num_key_value_heads",
        1 << 10,
        "a divisor of num_attention_heads",
    ),
    bound("head_dim", 1 << 10, "4x the 256 of Qwen3-Next and Gemma"),
    bound("vocab_size", 1 << 22, "16x the 262,144 of Gemma 3"),
    bound(
        "max_position_embeddings",
        1 << 26,
        "6x Llama 4 Scout's 10,485,760",
    ),
    bound(
        "original_max_position_embeddings",
        1 << 26,
        "as max_position_embeddings",
    ),
    bound("num_experts", 1 << 12, "8x Qwen3-Next's 512"),
    bound("num_local_experts", 1 << 12, "as num_experts"),
    bound("num_experts_per_tok", 1 << 8, "25x Qwen3-Next's 10"),
    bound("moe_intermediate_size", 1 << 16, "~4x Mixtral's 14,336"),
    bound(
        "shared_expert_intermediate_size",
        1 << 18,
        "as intermediate_size",
    ),
    bound("linear_num_key_heads", 1 << 10, "as num_attention_heads"),
    bound("linear_num_value_heads", 1 << 10, "as num_attention_heads"),
    bound("linear_key_head_dim", 1 << 10, "as head_dim"),
    bound("linear_value_head_dim", 1 << 10, "as head_dim"),
    bound("linear_conv_kernel_dim", 256, "64x Qwen3-Next's 4"),
    bound(
        "group_size",
        1 << 18,
        "as intermediate_size: a quantization group spans at most one input row",
    ),
    bound(
        "weight_block_size",
        1 << 18,
        "as intermediate_size: a scale block spans at most a whole weight",
    ),
];

/// The bound of `key` (its own name, no parent prefix), if it is a dimension.
pub fn dim_bound(key: &str) -> Option<&'static DimBound> {
    DIM_BOUNDS.iter().find(|b| b.key == key)
}
