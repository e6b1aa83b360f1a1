//! The built-in tiny models: one per supported family, generated in-process from fixed
//! configs and seeds, so `cargo xtask parity` needs no files; and the sliding-window and
//! long-context cases (`tokens`): a Mistral whose window of 16 every layer shares, decoded over
//! six windows (its KV pages recycled: the pool is smaller than its sequences), a Qwen2 whose
//! layer 0 attends over everything and layer 1 over 16 (five windows), and two prompts past
//! 1,024 tokens (flash-decoding splits a context above 256 over several blocks): a
//! full-attention Llama and a Mistral whose 300-token window itself spans two splits; a
//! Llama whose hidden size (1,088) spans two of the CUDA kernels' 1,024-element dot segments;
//! and a Mistral of head_dim 64 whose `fold_o_proj` programs change bytes, so a `differs`
//! rule falsely claimed `bit_identical` fails on it.

use solder_config::ModelConfig;

pub struct Builtin {
    pub name: &'static str,
    pub seed: u64,
    pub config_json: &'static str,
    /// The prompt length when `--tokens` is not given (`None`: the flag's default, 40).
    pub tokens: Option<usize>,
}

pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "tiny-llama",
        seed: 0x11a3a,
        config_json: r#"{
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
            "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
            "hidden_act": "silu", "attention_bias": false, "mlp_bias": false
        }"#,
        tokens: None,
    },
    Builtin {
        name: "tiny-mistral",
        seed: 0x3157,
        config_json: r#"{
            "architectures": ["MistralForCausalLM"], "model_type": "mistral",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
            "rope_theta": 1000000.0, "sliding_window": null, "hidden_act": "silu"
        }"#,
        tokens: None,
    },
    Builtin {
        name: "tiny-qwen2",
        seed: 0x9e2,
        config_json: r#"{
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "rope_theta": 1000000.0, "use_sliding_window": false, "sliding_window": null,
            "hidden_act": "silu"
        }"#,
        tokens: None,
    },
    Builtin {
        name: "tiny-qwen3",
        seed: 0x9e3,
        config_json: r#"{
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "use_sliding_window": false, "sliding_window": null, "hidden_act": "silu",
            "attention_bias": false
        }"#,
        tokens: None,
    },
    Builtin {
        name: "tiny-qwen3-moe",
        seed: 0x30e,
        config_json: r#"{
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
            "rope_theta": 1000000.0, "use_sliding_window": false, "sliding_window": null,
            "hidden_act": "silu", "attention_bias": false,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
            "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [1]
        }"#,
        tokens: None,
    },
    Builtin {
        name: "tiny-qwen3-next",
        seed: 0x4e7,
        config_json: r#"{
            "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            "hidden_act": "silu", "attention_bias": false,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_value_head_dim": 16,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48, "norm_topk_prob": true,
            "decoder_sparse_step": 1, "mlp_only_layers": [3]
        }"#,
        tokens: None,
    },
    Builtin {
        name: "tiny-mistral-window",
        seed: 0x3158,
        config_json: r#"{
            "architectures": ["MistralForCausalLM"], "model_type": "mistral",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
            "rope_theta": 10000.0, "sliding_window": 16, "hidden_act": "silu"
        }"#,
        tokens: Some(96),
    },
    Builtin {
        name: "tiny-qwen2-window",
        seed: 0x9e4,
        config_json: r#"{
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "rope_theta": 10000.0, "use_sliding_window": true, "sliding_window": 16,
            "max_window_layers": 1, "hidden_act": "silu"
        }"#,
        tokens: Some(80),
    },
    Builtin {
        name: "tiny-llama-long",
        seed: 0x11a3b,
        config_json: r#"{
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
            "rope_theta": 10000.0, "hidden_act": "silu"
        }"#,
        tokens: Some(1040),
    },
    Builtin {
        name: "tiny-mistral-long",
        seed: 0x3159,
        config_json: r#"{
            "architectures": ["MistralForCausalLM"], "model_type": "mistral",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
            "rope_theta": 10000.0, "sliding_window": 300, "hidden_act": "silu"
        }"#,
        tokens: Some(1040),
    },
    Builtin {
        // The one built-in whose `fold_o_proj` programs are not byte-identical to the
        // reference (head_dim 64: each head's partial o projection rounds apart from the
        // single dot), so a `bit_identical` claim on a folding rule fails here (`--levers
        // fold_o_proj`).
        name: "tiny-mistral-fold",
        seed: 0x3158,
        config_json: r#"{
            "architectures": ["MistralForCausalLM"], "model_type": "mistral",
            "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
            "rope_theta": 1000000.0, "sliding_window": null, "hidden_act": "silu"
        }"#,
        tokens: None,
    },
    Builtin {
        // Dots of two 1024-element segments (hidden 1056, 17 heads of 64): the CUDA dot
        // order's segment sums, and gemv's split-K in the o, gate/up and LM head launches of
        // the emitted programs and split heads in q/k/v: 1056 features are 132 blocks, half a
        // wave of resident blocks, so even the o projection splits under the one-wave sizing.
        name: "tiny-llama-wide",
        seed: 0x11a3c,
        config_json: r#"{
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 1056, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 17, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 256,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
            "rope_theta": 10000.0, "hidden_act": "silu"
        }"#,
        tokens: Some(24),
    },
];

impl Builtin {
    pub fn config(&self) -> Result<ModelConfig, String> {
        ModelConfig::from_json_str(self.config_json, self.name).map_err(|e| e.to_string())
    }
}
