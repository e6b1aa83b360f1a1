//! Host memory of a build from a checkpoint: streamed (`WeightSource::Checkpoint`) against the
//! former flow (a whole `HostWeights` loaded, then uploaded). A measurement, not a test (it
//! writes a ~380 MB checkpoint); each step runs in its own process so its peak is its own:
//!
//! ```text
//! export SOLDER_MEMORY_DIR=/tmp/solder-mem
//! T="cargo run -p solder-model-layers --example stream_memory"
//! SOLDER_LOAD_MODE=write  $T
//! SOLDER_LOAD_MODE=host   /usr/bin/time -v $T   # Maximum resident set size
//! SOLDER_LOAD_MODE=stream /usr/bin/time -v $T
//! ```
//!
//! On the CPU backend the device allocation is host memory too: the floor is one model's
//! bytes; the streamed build must stay under 1.5 of them above the process's start.

#[path = "../tests/exec_support/mod.rs"]
mod exec_support;

use std::path::PathBuf;

use exec_support::{backend, boot, kv};
use solder_circuit::{Instance, Policy};
use solder_config::ModelConfig;
use solder_model_layers::{Checkpoint, CircuitExec, HostWeights, WeightSource};

/// A llama of ~190M parameters (~380 MB in bf16), sharded by `save` into one file.
const MEDIUM_LLAMA: &str = r#"{
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8,
    "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
    "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false
}"#;

/// `VmHWM` (peak resident set) and `VmRSS` of this process, in bytes.
fn memory() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| {
                v.trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse::<usize>()
                    .ok()
            })
            .expect(name)
            * 1024
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn main() {
    let dir = PathBuf::from(std::env::var("SOLDER_MEMORY_DIR").expect("SOLDER_MEMORY_DIR"));
    let mode = std::env::var("SOLDER_LOAD_MODE").unwrap_or_else(|_| "stream".into());
    let config = ModelConfig::from_json_str(MEDIUM_LLAMA, "medium/config.json").expect("config");
    let serve = exec_support::serve();
    let instance = Instance::from_config(&config, serve).expect("instance");
    let circuit = &instance.circuit;
    if mode == "write" {
        std::fs::create_dir_all(&dir).expect("dir");
        let weights = HostWeights::random(circuit, 1);
        weights
            .save(circuit, &dir.join("model.safetensors"))
            .expect("save");
        return;
    }
    let (_, start) = memory();
    let source = match mode.as_str() {
        "host" => {
            let checkpoint = Checkpoint::open(&dir).expect("open");
            WeightSource::Host(HostWeights::load(circuit, &checkpoint).expect("load"))
        }
        _ => WeightSource::Checkpoint(dir.clone()),
    };
    let mut backend = backend();
    let exec = CircuitExec::build(
        &mut backend,
        boot(config, Policy::default(), source, kv(4, 16, 64)),
    )
    .expect("build");
    let model = exec.layout.weights_bytes;
    let (peak, _) = memory();
    eprintln!(
        "{mode}: weights {:.1} MB, peak above start {:.1} MB ({:.2}x the weights)",
        model as f64 / 1e6,
        (peak - start) as f64 / 1e6,
        (peak - start) as f64 / model as f64
    );
    if mode == "stream" && (peak - start) >= model * 3 / 2 {
        eprintln!(
            "a streamed build peaked {} bytes above its start for {model} bytes of weights",
            peak - start
        );
        std::process::exit(1);
    }
}
