//! Shared helpers for the weights, exec and session tests: tiny configs, builds on the CPU
//! backend, temporary checkpoint folders and safetensors writers, byte comparisons, and the
//! test drafters (`drafters`).
#![allow(dead_code)]

pub mod drafters;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::Dtype;
use solder_circuit::{Instance, Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{Boot, CircuitExec, KvShape, WeightSource};

/// A llama: hidden 64, 2 layers, GQA 4/2, vocab 128, untied.
pub const TINY_LLAMA: &str = r#"{
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
    "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false
}"#;

/// A qwen2: tied embeddings, q/k/v biases, hidden 64, 2 layers, vocab 128.
pub const TINY_QWEN2: &str = r#"{
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
    "rope_theta": 1000000.0, "use_sliding_window": false, "sliding_window": null,
    "hidden_act": "silu"
}"#;

pub fn config(json: &str) -> ModelConfig {
    ModelConfig::from_json_str(json, "tiny/config.json").expect("tiny config parses")
}

/// The workspace root (two folders above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn rules() -> RuleSet {
    RuleSet::from_file(&workspace_root().join("fusions/FUSIONS.toml")).expect("FUSIONS.toml")
}

pub fn backend() -> CpuBackend {
    solder_model_layers::kernels::cpu_backend(Some(2)).expect("cpu backend")
}

/// Decode, multi_seq 2/4/8, verify 2..=8.
pub fn serve() -> ServeShape {
    ServeShape::with_max_batch(8).expect("serve shape")
}

pub fn kv(pages: usize, block_size: usize, max_seq_len: usize) -> KvShape {
    KvShape {
        pages,
        block_size,
        max_seq_len,
        max_sequences: 16,
    }
}

/// Enough pages for 9 sequences of 32 tokens in pages of 4.
pub fn roomy_kv() -> KvShape {
    kv(9 * 8 + 2, 4, 32)
}

/// The circuit of `config` (weights tests need no exec).
pub fn instance(config: &ModelConfig) -> Instance {
    Instance::from_config(config, serve()).expect("instance")
}

pub fn boot(config: ModelConfig, policy: Policy, weights: WeightSource, kv: KvShape) -> Boot {
    Boot {
        config,
        serve: serve(),
        rules: rules(),
        policy,
        weights,
        kv,
        precision: Default::default(),
    }
}

/// A tiny llama with random weights, all rules on.
pub fn build_llama(backend: &mut CpuBackend, kv: KvShape) -> CircuitExec {
    build(backend, TINY_LLAMA, Policy::default(), kv)
}

pub fn build(backend: &mut CpuBackend, json: &str, policy: Policy, kv: KvShape) -> CircuitExec {
    CircuitExec::build(
        backend,
        boot(
            config(json),
            policy,
            WeightSource::Random { seed: 0x5eed },
            kv,
        ),
    )
    .expect("build")
}

/// A prompt of `len` tokens in `0..vocab` from `seed`.
pub fn prompt(seed: u64, vocab: usize, len: usize) -> Vec<u32> {
    let mut rng = solder_model_layers::weights::SplitMix64(seed.wrapping_mul(0x2545_F491) ^ 0x5eed);
    (0..len)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// The bit patterns of `values`, for byte-for-byte comparisons with readable failures.
pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Asserts `a` and `b` are the same bytes, naming the first differing index.
pub fn assert_same_bytes(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: first difference at {i}: {} vs {}", a[i], b[i]);
    }
}

/// A fresh folder under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "solder-ml-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One tensor to write: name, dtype, shape and raw little-endian bytes.
pub struct RawTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl safetensors::View for &RawTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

pub fn write_safetensors(path: &Path, tensors: &[RawTensor]) {
    safetensors::serialize_to_file(tensors.iter().map(|t| (t.name.clone(), t)), None, path)
        .expect("write safetensors");
}

pub fn bf16_le(values: &[half::bf16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f16_le(values: &[half::f16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f32_le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A qwen3_next: one Gated DeltaNet layer then one full-attention layer, MoE with a shared
/// expert (a side stream), hidden 64, vocab 128.
pub const TINY_NEXT: &str = r#"{
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 128,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "hidden_act": "silu", "attention_bias": false,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_value_head_dim": 8,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24, "norm_topk_prob": true
}"#;

/// Logits of `prompt` decoded token by token in a fresh session (dropped before returning).
pub fn decode_alone(backend: &mut CpuBackend, exec: &CircuitExec, prompt: &[u32]) -> Vec<f32> {
    let mut session = solder_model_layers::Session::new(exec);
    let id = session.add_sequence();
    let mut out = Vec::new();
    for &t in prompt {
        out.extend(session.decode(backend, id, t).expect("decode"));
    }
    out
}
