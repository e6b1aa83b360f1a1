//! The set-up solder's examples share: the command line, the backend, a `CircuitExec` built
//! from a checkpoint folder, and tiny seeded checkpoints written on the fly when no folder is
//! given, so every example runs with no GPU and no download.
//!
//! An engine does the same three things before its first step: pick a backend, read
//! `config.json`, and build the exec (which compiles every program the serve shape asks for
//! and uploads the weights); everything after that is a `Session`.

pub mod scheduler;

use std::path::{Path, PathBuf};

use half::bf16;
use solder_circuit::{Instance, Policy, RuleSet};
use solder_config::{Family, ModelConfig, ServeShape};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{greedy, Boot, CircuitExec, HostWeights, KvShape, Session, WeightSource};

pub type Result<T> = std::result::Result<T, Failure>;

/// Any error, kept as its message: `main` returning it prints the message and exits with 1.
pub struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(error: E) -> Failure {
        Failure(error.to_string())
    }
}

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `[CHECKPOINT...] [--tokens N] [--k N] [--cuda]`.
pub struct Args {
    pub checkpoints: Vec<PathBuf>,
    pub tokens: usize,
    pub k: usize,
    pub cuda: bool,
}

impl Args {
    /// Parses the command line; `tokens` and `k` are the defaults (small: CI runs these).
    pub fn parse(usage: &str, tokens: usize, k: usize) -> Result<Args> {
        let mut args = Args {
            checkpoints: Vec::new(),
            tokens,
            k,
            cuda: false,
        };
        let mut argv = std::env::args().skip(1);
        while let Some(arg) = argv.next() {
            let mut number = |flag: &str| -> Result<usize> {
                let value = argv.next().ok_or(format!("{flag} needs a number"))?;
                Ok(value.parse().map_err(|e| format!("{flag} {value}: {e}"))?)
            };
            match arg.as_str() {
                "--tokens" => args.tokens = number("--tokens")?,
                "--k" => args.k = number("--k")?,
                "--cuda" => args.cuda = true,
                "-h" | "--help" => {
                    println!("usage: {usage}");
                    std::process::exit(0);
                }
                flag if flag.starts_with('-') => return Err(format!("unknown flag {flag}").into()),
                path => args.checkpoints.push(PathBuf::from(path)),
            }
        }
        if args.tokens == 0 {
            return Err("--tokens 0: generate at least one token".into());
        }
        Ok(args)
    }
}

/// The CPU backend (the reference executor: every kernel's CPU twin), or CUDA device 0 with
/// `--cuda` (built with `--features cuda`; the driver JIT-compiles the embedded PTX).
pub fn backend(cuda: bool) -> Result<Box<dyn GpuBackend>> {
    if cuda {
        #[cfg(feature = "cuda")]
        return Ok(Box::new(solder_model_layers::kernels::cuda_backend(
            0, None,
        )?));
        #[cfg(not(feature = "cuda"))]
        return Err("--cuda needs the `cuda` feature: cargo run --features cuda ...".into());
    }
    Ok(Box::new(solder_model_layers::kernels::cpu_backend(None)?))
}

/// The shipped fusion rules, compiled in (a build checks each rule it applies).
pub fn rules() -> Result<RuleSet> {
    let text = include_str!("../../fusions/FUSIONS.toml");
    Ok(RuleSet::from_toml_str(text, "fusions/FUSIONS.toml")?)
}

/// A KV cache for `sequences` sequences of up to `max_len` tokens, in pages of 16 (page 0 is
/// the scratch page).
pub fn kv_shape(sequences: usize, max_len: usize) -> KvShape {
    KvShape {
        pages: sequences * max_len.div_ceil(16) + 1,
        block_size: 16,
        max_seq_len: max_len,
        max_sequences: sequences,
    }
}

/// Builds every program `serve` asks for over the checkpoint in `dir` (`config.json` and
/// `model.safetensors` or its shards), with the default fusion policy.
pub fn build(
    backend: &mut dyn GpuBackend,
    dir: &Path,
    serve: ServeShape,
    kv: KvShape,
) -> Result<CircuitExec> {
    Ok(CircuitExec::build(backend, boot(dir, serve, kv)?)?)
}

/// What `build` builds from: the checkpoint in `dir`, the shipped rules, the default policy
/// (`Boot::with_kv_budget` then sizes the KV pool from a byte budget).
pub fn boot(dir: &Path, serve: ServeShape, kv: KvShape) -> Result<Boot> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    Ok(Boot {
        config,
        serve,
        rules: rules()?,
        policy: Policy::default(),
        weights: WeightSource::Checkpoint(dir.to_path_buf()),
        kv,
        precision: Default::default(),
    })
}

/// Plain greedy decoding in a fresh session: prefill `prompt`, then `n` decode steps. Returns
/// the `n + 1` tokens after the prompt (the last one sampled, not fed): the reference the
/// speculative examples must equal token for token.
pub fn greedy_reference(
    backend: &mut dyn GpuBackend,
    exec: &CircuitExec,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<u32>> {
    let mut session = Session::new(exec);
    let seq = session.add_sequence();
    let logits = session.prefill_last(backend, seq, prompt)?;
    let mut tokens = vec![greedy(&logits)];
    for _ in 0..n {
        let next = session.decode(backend, seq, *tokens.last().unwrap())?;
        tokens.push(greedy(&next));
    }
    Ok(tokens)
}

/// A prompt of `len` token ids below `vocab` (what a tokenizer would hand over).
pub fn prompt(seed: u32, len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (seed.wrapping_mul(31) + i * 17 + 3) % vocab as u32)
        .collect()
}

/// Fails the example (exit code 1) with `what` unless `ok`.
pub fn check(ok: bool, what: &str) -> Result<()> {
    if ok {
        println!("check passed: {what}");
        Ok(())
    } else {
        Err(format!("check FAILED: {what}").into())
    }
}

/// A llama: hidden 64, GQA 4/2, vocab 128, `layers` layers.
pub fn tiny_llama_json(layers: usize) -> String {
    format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": {layers},
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
    "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false}}"#
    )
}

/// A qwen3_next with its MTP head: one Gated DeltaNet layer, one full-attention layer, MoE
/// with a shared expert, hidden 64, vocab 128.
pub const TINY_QWEN3_NEXT: &str = r#"{
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

/// A checkpoint folder written here, removed when dropped.
pub struct TinyCheckpoint(pub PathBuf);

impl Drop for TinyCheckpoint {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        // The per-process parent goes with its last checkpoint (fails while others remain).
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Writes `json` and random weights from `seed` (every tensor of the model, its MTP head's
/// too for qwen3_next) as a checkpoint in a fresh temporary folder.
pub fn write_tiny(name: &str, json: &str, seed: u64) -> Result<TinyCheckpoint> {
    let circuit = tiny_instance(json)?;
    let circuit = circuit.storage();
    write_weights(name, json, circuit, HostWeights::random(circuit, seed))
}

/// A tiny qwen3_next whose MTP head is set up to predict what the target will: every layer's
/// output projection scaled to 1/20 (a near-bigram model, context still moving its choices), and
/// the head reading only the embedding of the token it is given (`mtp.fc` = [I | 0]) under the
/// target's final norm. Its drafts are often accepted, as a trained head's are, so speculative
/// steps keep drafts and roll back the rest; random weights otherwise (from `seed`).
pub fn write_tiny_mtp(name: &str, json: &str, seed: u64) -> Result<TinyCheckpoint> {
    let instance = tiny_instance(json)?;
    let circuit = instance.storage();
    let random = HostWeights::random(circuit, seed);
    let mut slots: Vec<Vec<bf16>> = (0..random.slots.len())
        .map(|i| random.bf16_values(i))
        .collect();
    let slot = |name: &str| -> Result<usize> {
        let found = circuit.weights.iter().position(|w| w.name == name);
        Ok(found.ok_or(format!("no weight slot {name}"))?)
    };
    for (i, w) in circuit.weights.iter().enumerate() {
        let outputs = ["o_proj.weight", "out_proj.weight", "down_proj.weight"];
        if std::iter::once(&w.name)
            .chain(&w.parts)
            .any(|n| outputs.iter().any(|o| n.ends_with(o)))
        {
            for v in &mut slots[i] {
                *v = bf16::from_f32(v.to_f32() * 0.05);
            }
        }
    }
    let hidden = circuit.weights[slot("model.norm.weight")?].shape[0];
    let fc = &mut slots[slot("mtp.fc.weight")?];
    for (at, v) in fc.iter_mut().enumerate() {
        let (row, column) = (at / (2 * hidden), at % (2 * hidden));
        *v = bf16::from_f32(if row == column { 1.0 } else { 0.0 });
    }
    // Zero-centred norms: a weight of 0 scales by 1.
    slots[slot("mtp.pre_fc_norm_embedding.weight")?].fill(bf16::ZERO);
    slots[slot("mtp.norm.weight")?] = slots[slot("model.norm.weight")?].clone();
    write_weights(name, json, circuit, HostWeights::from_bf16(slots))
}

/// A layer-skip draft of the checkpoint `target` (of `target_json`): `draft_json`, the same
/// config with fewer layers, over the target's own weights for the layers it keeps.
pub fn write_layer_skip_draft(
    target: &Path,
    target_json: &str,
    draft_json: &str,
) -> Result<TinyCheckpoint> {
    let (big, small) = (tiny_instance(target_json)?, tiny_instance(draft_json)?);
    let (big, small) = (big.storage(), small.storage());
    let checkpoint = solder_model_layers::Checkpoint::open(target)?;
    let all = HostWeights::load(big, &checkpoint)?;
    // Every slot of the draft names a tensor the target has (its embedding, first layers, head).
    let slots = small
        .weights
        .iter()
        .map(|slot| {
            let at = big.weights.iter().position(|w| w.name == slot.name);
            at.map(|i| all.slots[i].clone())
                .ok_or(format!("the target has no {}", slot.name))
        })
        .collect::<std::result::Result<_, _>>()?;
    write_weights("tiny-llama-draft", draft_json, small, HostWeights { slots })
}

/// The instance whose `storage()` slots a checkpoint of `json` holds: a qwen3_next's with its
/// MTP head (`mtp.*`), as the released checkpoints ship it.
fn tiny_instance(json: &str) -> Result<Instance> {
    let config = ModelConfig::from_json_str(json, "tiny/config.json")?;
    let serve = ServeShape {
        draft_widths: match config.family {
            Family::Qwen3Next => vec![1],
            _ => vec![],
        },
        ..ServeShape::default()
    };
    Ok(Instance::from_config(&config, serve)?)
}

fn write_weights(
    name: &str,
    json: &str,
    circuit: &solder_circuit::ir::Circuit,
    weights: HostWeights,
) -> Result<TinyCheckpoint> {
    // The folder's name becomes the model's name in messages.
    let parent = std::env::temp_dir().join(format!("solder-examples-{}", std::process::id()));
    let dir = parent.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let checkpoint = TinyCheckpoint(dir);
    std::fs::write(checkpoint.0.join("config.json"), json)?;
    weights.save(circuit, &checkpoint.0.join("model.safetensors"))?;
    Ok(checkpoint)
}
