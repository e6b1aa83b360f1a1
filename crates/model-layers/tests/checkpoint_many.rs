//! A checkpoint of thousands of tiny tensors loads with each file's header parsed once
//! (issue 9: a header re-parsed per tensor made loading quadratic in the tensor count).

mod exec_support;

use std::path::Path;

use exec_support::{config, instance, write_safetensors, RawTensor, TempDir};
use safetensors::SafeTensors;
use solder_circuit::ir::Circuit;
use solder_model_layers::{Checkpoint, HostWeights};

/// A llama small enough per layer that 555 layers (4,998 tensors) stay a few MB.
fn many_layer_llama(layers: usize) -> Circuit {
    let json = format!(
        r#"{{
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": {layers},
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
        "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false
    }}"#
    );
    instance(&config(&json)).circuit
}

/// 555 layers of 9 tensors plus embedding, final norm and head: 4,998 tensors.
const LAYERS: usize = 555;

/// Saves the many-tensor model as one `model.safetensors`.
fn saved(circuit: &Circuit, weights: &HostWeights) -> TempDir {
    let dir = TempDir::new("many");
    weights
        .save(circuit, &dir.path().join("model.safetensors"))
        .expect("save");
    dir
}

/// The saved checkpoint rewritten as `shards` shards (round-robin) with their index.
fn sharded(single: &Path, shards: usize) -> TempDir {
    let dir = TempDir::new("many-sharded");
    let bytes = std::fs::read(single.join("model.safetensors")).expect("read");
    let file = SafeTensors::deserialize(&bytes).expect("parse");
    let mut parts: Vec<Vec<RawTensor>> = (0..shards).map(|_| Vec::new()).collect();
    let mut weight_map = serde_json::Map::new();
    for (i, (name, view)) in file.tensors().into_iter().enumerate() {
        let shard = i % shards;
        weight_map.insert(
            name.clone(),
            format!("model-{:05}-of-{shards:05}.safetensors", shard + 1).into(),
        );
        parts[shard].push(RawTensor {
            name,
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data: view.data().to_vec(),
        });
    }
    for (shard, tensors) in parts.iter().enumerate() {
        let name = format!("model-{:05}-of-{shards:05}.safetensors", shard + 1);
        write_safetensors(&dir.path().join(name), tensors);
    }
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        serde_json::json!({ "weight_map": weight_map }).to_string(),
    )
    .expect("index");
    dir
}

#[test]
fn thousands_of_tensors_load_with_one_header_parse_per_file() {
    let circuit = many_layer_llama(LAYERS);
    assert!(circuit.weights.len() >= 4_998, "{}", circuit.weights.len());
    let weights = HostWeights::random(&circuit, 3);
    let single = saved(&circuit, &weights);
    let split = sharded(single.path(), 3);
    for (dir, files) in [(single.path(), 1), (split.path(), 3)] {
        let start = std::time::Instant::now();
        let checkpoint = Checkpoint::open(dir).expect("open");
        let opened = start.elapsed();
        assert_eq!(checkpoint.file_count(), files);
        assert_eq!(checkpoint.names().count(), circuit.weights.len());
        let loaded = HostWeights::load(&circuit, &checkpoint).expect("load");
        // A figure to read with `--release -- --nocapture`, not asserted on (the parse count is).
        println!(
            "{} tensors in {files} files: open {:.3} s, open + load {:.3} s",
            checkpoint.names().count(),
            opened.as_secs_f64(),
            start.elapsed().as_secs_f64()
        );
        for (i, (a, b)) in loaded.slots.iter().zip(&weights.slots).enumerate() {
            assert!(a == b, "slot {i} differs");
        }
        // Thousands of lookups, and still each file's header parsed once (at open).
        assert_eq!(checkpoint.header_parses(), files, "{}", dir.display());
    }
}
