//! Checkpoints on disk → `HostWeights`: single files, shards, dtype conversion, and every
//! refusal naming the tensor and file at fault.

mod exec_support;

use std::path::Path;

use exec_support::{
    config, f16_le, f32_le, instance, write_safetensors, RawTensor, TempDir, TINY_LLAMA, TINY_QWEN2,
};
use half::{bf16, f16};
use safetensors::Dtype;
use solder_circuit::ir::Circuit;
use solder_model_layers::weights::bf16_from_bytes;
use solder_model_layers::{Checkpoint, HostWeights, WeightsError};

fn llama() -> (Circuit, HostWeights) {
    let circuit = instance(&config(TINY_LLAMA)).circuit;
    let weights = HostWeights::random(&circuit, 11);
    (circuit, weights)
}

/// Every slot as a bf16 tensor.
fn bf16_tensors(circuit: &Circuit, weights: &HostWeights) -> Vec<RawTensor> {
    circuit
        .weights
        .iter()
        .zip(&weights.slots)
        .map(|(slot, bytes)| RawTensor {
            name: slot.name.clone(),
            dtype: Dtype::BF16,
            shape: slot.shape.clone(),
            data: bytes.clone(),
        })
        .collect()
}

fn load(dir: &Path, circuit: &Circuit) -> Result<HostWeights, WeightsError> {
    HostWeights::load(circuit, &Checkpoint::open(dir)?)
}

fn assert_same_weights(a: &HostWeights, b: &HostWeights) {
    assert_eq!(a.slots.len(), b.slots.len());
    for (i, (x, y)) in a.slots.iter().zip(&b.slots).enumerate() {
        assert_eq!(x, y, "slot {i} differs");
    }
}

#[test]
fn single_file_loads_the_saved_values() {
    let dir = TempDir::new("single");
    let (circuit, weights) = llama();
    weights
        .save(&circuit, &dir.path().join("model.safetensors"))
        .unwrap();
    assert!(
        !dir.path().join("model.safetensors.tmp").exists(),
        "save leaves no temporary file"
    );
    let loaded = load(dir.path(), &circuit).unwrap();
    assert_same_weights(&loaded, &weights);
    assert_eq!(loaded.total_bytes(), weights.total_bytes());
}

#[test]
fn sharded_checkpoint_loads_the_same_values() {
    let dir = TempDir::new("sharded");
    let (circuit, weights) = llama();
    let shards = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let (mut first, mut second) = (Vec::new(), Vec::new());
    let mut weight_map = serde_json::Map::new();
    for (i, tensor) in bf16_tensors(&circuit, &weights).into_iter().enumerate() {
        let shard = shards[i % 2];
        weight_map.insert(tensor.name.clone(), shard.into());
        if i % 2 == 0 {
            first.push(tensor)
        } else {
            second.push(tensor)
        }
    }
    write_safetensors(&dir.path().join(shards[0]), &first);
    write_safetensors(&dir.path().join(shards[1]), &second);
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();

    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(checkpoint.names().count(), circuit.weights.len());
    assert_eq!(
        checkpoint.file_of(&second[0].name),
        Some(dir.path().join(shards[1]).as_path())
    );
    let loaded = HostWeights::load(&circuit, &checkpoint).unwrap();
    assert_same_weights(&loaded, &weights);
}

#[test]
fn a_tensor_in_two_shards_is_refused() {
    let dir = TempDir::new("twice");
    let (circuit, weights) = llama();
    let tensors = bf16_tensors(&circuit, &weights);
    write_safetensors(&dir.path().join("a.safetensors"), &tensors);
    write_safetensors(&dir.path().join("b.safetensors"), &tensors[..1]);
    let index = serde_json::json!({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let err = Checkpoint::open(dir.path()).err().expect("refused");
    let message = err.to_string();
    assert!(
        message.contains(&tensors[0].name) && message.contains("two shards"),
        "{message}"
    );
}

#[test]
fn f16_and_f32_tensors_are_converted_to_bf16() {
    let dir = TempDir::new("convert");
    let (circuit, weights) = llama();
    let mut expected = Vec::new();
    let mut rounded = 0;
    let tensors: Vec<RawTensor> = circuit
        .weights
        .iter()
        .zip(&weights.slots)
        .enumerate()
        .map(|(i, (slot, values))| {
            // Values with more mantissa bits than bf16 holds, so the conversion must round.
            let wide: Vec<f32> = bf16_from_bytes(values)
                .iter()
                .enumerate()
                .map(|(j, v)| v.to_f32() * (1.0 + (j % 7) as f32 * 1.3e-3))
                .collect();
            let (dtype, data, want): (Dtype, Vec<u8>, Vec<bf16>) = if i % 2 == 0 {
                let want = wide.iter().map(|&v| bf16::from_f32(v)).collect();
                (Dtype::F32, f32_le(&wide), want)
            } else {
                let halfs: Vec<f16> = wide.iter().map(|&v| f16::from_f32(v)).collect();
                let want = halfs.iter().map(|h| bf16::from_f32(h.to_f32())).collect();
                (Dtype::F16, f16_le(&halfs), want)
            };
            rounded += wide
                .iter()
                .filter(|&&v| bf16::from_f32(v).to_f32() != v)
                .count();
            expected.push(want);
            RawTensor {
                name: slot.name.clone(),
                dtype,
                shape: slot.shape.clone(),
                data,
            }
        })
        .collect();
    assert!(rounded > 0, "the test values must need rounding");
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    let loaded = load(dir.path(), &circuit).unwrap();
    assert_same_weights(&loaded, &HostWeights::from_bf16(expected));

    // Round to nearest, not truncation: 1 + 2^-8 + 2^-9 is nearer 1 + 2^-7 than 1.
    let probe = 1.0 + 2f32.powi(-8) + 2f32.powi(-9);
    let slot = &circuit.weights[0];
    let n: usize = slot.shape.iter().product();
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &std::iter::once(RawTensor {
            name: slot.name.clone(),
            dtype: Dtype::F32,
            shape: slot.shape.clone(),
            data: f32_le(&vec![probe; n]),
        })
        .chain(bf16_tensors(&circuit, &weights).into_iter().skip(1))
        .collect::<Vec<_>>(),
    );
    let loaded = load(dir.path(), &circuit).unwrap();
    assert_eq!(loaded.bf16_values(0)[0].to_f32(), 1.0 + 2f32.powi(-7));
}

#[test]
fn missing_tensor_is_named() {
    let dir = TempDir::new("missing");
    let (circuit, weights) = llama();
    let mut tensors = bf16_tensors(&circuit, &weights);
    let gone = tensors.remove(3).name;
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    match load(dir.path(), &circuit) {
        Err(WeightsError::Missing {
            tensor,
            dir: where_,
        }) => {
            assert_eq!(tensor, gone);
            assert_eq!(where_, dir.path());
        }
        Err(other) => panic!("expected Missing, got {other}"),
        Ok(_) => panic!("a checkpoint without `{gone}` loaded"),
    }
}

#[test]
fn unexpected_tensor_is_named_with_its_file() {
    let dir = TempDir::new("unexpected");
    let (circuit, weights) = llama();
    let mut tensors = bf16_tensors(&circuit, &weights);
    let bogus = "model.layers.0.self_attn.bogus_proj.weight";
    tensors.push(RawTensor {
        name: bogus.into(),
        dtype: Dtype::BF16,
        shape: vec![4],
        data: vec![0; 8],
    });
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    match load(dir.path(), &circuit) {
        Err(e @ WeightsError::Unexpected { .. }) => {
            let message = e.to_string();
            let WeightsError::Unexpected { tensor, file } = e else {
                unreachable!()
            };
            assert_eq!(tensor, bogus);
            assert_eq!(file, dir.path().join("model.safetensors"));
            assert!(message.contains(bogus), "{message}");
        }
        Err(other) => panic!("expected Unexpected, got {other}"),
        Ok(_) => panic!("an unexpected tensor was accepted"),
    }
}

#[test]
fn wrong_shape_names_tensor_file_found_and_expected() {
    let dir = TempDir::new("shape");
    let (circuit, weights) = llama();
    let mut tensors = bf16_tensors(&circuit, &weights);
    let (index, target) = tensors
        .iter_mut()
        .enumerate()
        .find(|(_, t)| t.shape.len() == 2 && t.shape[0] != t.shape[1])
        .expect("a non-square matrix");
    let expected = target.shape.clone();
    target.shape.reverse(); // same bytes, transposed shape
    let name = target.name.clone();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    match load(dir.path(), &circuit) {
        Err(WeightsError::Shape {
            tensor,
            file,
            found,
            expected: want,
        }) => {
            assert_eq!(tensor, name);
            assert_eq!(tensor, circuit.weights[index].name);
            assert_eq!(file, dir.path().join("model.safetensors"));
            assert_eq!(found, vec![expected[1], expected[0]]);
            assert_eq!(want, expected);
        }
        Err(other) => panic!("expected Shape, got {other}"),
        Ok(_) => panic!("a transposed tensor was accepted"),
    }
}

#[test]
fn integer_dtype_is_refused() {
    let dir = TempDir::new("dtype");
    let (circuit, weights) = llama();
    let mut tensors = bf16_tensors(&circuit, &weights);
    let target = &mut tensors[0];
    let n: usize = target.shape.iter().product();
    target.dtype = Dtype::I32;
    target.data = vec![0; n * 4];
    let name = target.name.clone();
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    match load(dir.path(), &circuit) {
        Err(WeightsError::Dtype {
            tensor,
            file,
            found,
        }) => {
            assert_eq!(tensor, name);
            assert_eq!(file, dir.path().join("model.safetensors"));
            assert!(found.contains("I32"), "found {found}");
        }
        Err(other) => panic!("expected Dtype, got {other}"),
        Ok(_) => panic!("an I32 tensor was accepted"),
    }
}

#[test]
fn truncated_file_is_refused_at_open_naming_it() {
    let dir = TempDir::new("truncated");
    let (circuit, weights) = llama();
    let path = dir.path().join("model.safetensors");
    weights.save(&circuit, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let err = Checkpoint::open(dir.path())
        .err()
        .expect("a truncated file opened");
    assert!(
        matches!(&err, WeightsError::Format { path: p, .. } if p == &path),
        "{err:?}"
    );
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn index_naming_a_missing_shard_is_refused_naming_it() {
    let dir = TempDir::new("noshard");
    let (circuit, weights) = llama();
    let tensors = bf16_tensors(&circuit, &weights);
    write_safetensors(
        &dir.path().join("model-00001-of-00002.safetensors"),
        &tensors,
    );
    let mut weight_map = serde_json::Map::new();
    for (i, t) in tensors.iter().enumerate() {
        let shard = if i == 0 {
            "model-00002-of-00002.safetensors"
        } else {
            "model-00001-of-00002.safetensors"
        };
        weight_map.insert(t.name.clone(), shard.into());
    }
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        serde_json::json!({ "weight_map": weight_map }).to_string(),
    )
    .unwrap();
    let err = Checkpoint::open(dir.path()).err().expect("opened");
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
}

#[test]
fn index_shard_outside_the_folder_is_refused() {
    let dir = TempDir::new("escape");
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"a": "../model.safetensors"}}"#,
    )
    .unwrap();
    let err = Checkpoint::open(dir.path()).err().expect("opened");
    assert!(matches!(err, WeightsError::Format { .. }), "{err:?}: {err}");
}

#[test]
fn empty_folder_is_refused_naming_it() {
    let dir = TempDir::new("empty");
    let err = Checkpoint::open(dir.path()).err().expect("opened");
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
}

#[test]
fn tied_config_has_one_embedding_slot_and_no_lm_head() {
    let tied = instance(&config(TINY_QWEN2)).circuit;
    let names: Vec<&str> = tied.weights.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(
        names
            .iter()
            .filter(|n| **n == "model.embed_tokens.weight")
            .count(),
        1,
        "{names:?}"
    );
    assert!(!names.contains(&"lm_head.weight"), "{names:?}");
    let untied = instance(&config(TINY_LLAMA)).circuit;
    assert!(untied.weights.iter().any(|w| w.name == "lm_head.weight"));
}

#[test]
fn tied_checkpoint_carrying_a_copy_of_the_embedding_as_lm_head_loads() {
    let dir = TempDir::new("tied");
    let circuit = instance(&config(TINY_QWEN2)).circuit;
    let weights = HostWeights::random(&circuit, 5);
    let mut tensors = bf16_tensors(&circuit, &weights);
    let embed = tensors
        .iter()
        .find(|t| t.name == "model.embed_tokens.weight")
        .expect("embedding");
    let (shape, mut data) = (embed.shape.clone(), embed.data.clone());
    tensors.push(RawTensor {
        name: "lm_head.weight".into(),
        dtype: Dtype::BF16,
        shape: shape.clone(),
        data: data.clone(),
    });
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    assert_same_weights(&load(dir.path(), &circuit).unwrap(), &weights);
    // A head that is not a copy contradicts tie_word_embeddings: refused, naming both.
    data[0] ^= 0x40;
    tensors.pop();
    tensors.push(RawTensor {
        name: "lm_head.weight".into(),
        dtype: Dtype::BF16,
        shape,
        data,
    });
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    match load(dir.path(), &circuit) {
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("lm_head.weight") && msg.contains("model.embed_tokens.weight"),
                "{msg}"
            );
        }
        Ok(_) => panic!("a tied checkpoint whose lm_head.weight differs loaded"),
    }
}

#[test]
fn rotary_inv_freq_buffers_are_tolerated() {
    let dir = TempDir::new("invfreq");
    let (circuit, weights) = llama();
    let mut tensors = bf16_tensors(&circuit, &weights);
    for name in [
        "model.rotary_emb.inv_freq",
        "model.layers.0.self_attn.rotary_emb.inv_freq",
    ] {
        tensors.push(RawTensor {
            name: name.into(),
            dtype: Dtype::F32,
            shape: vec![8],
            data: f32_le(&[1.0; 8]),
        });
    }
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    assert_same_weights(&load(dir.path(), &circuit).unwrap(), &weights);
}

#[test]
fn a_missing_tensor_is_refused_before_any_plan_is_built() {
    // A backend without the fused kernels would fail planning (MissingKernel) under the
    // default policy: the weights error must come first, so it is checked before planning.
    use solder_circuit::Policy;
    use solder_gpu_runtime::{CpuBackend, GpuBackend, ModuleImage};
    use solder_model_layers::{CircuitExec, ExecError, WeightSource};
    let dir = TempDir::new("missing-before-plans");
    let (circuit, weights) = llama();
    let mut tensors = bf16_tensors(&circuit, &weights);
    let gone = tensors.remove(3).name;
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    let mut bare = CpuBackend::with_threads(1);
    let twins: Vec<_> = solder_model_layers::kernels::entries()
        .into_iter()
        .filter(|(name, _)| !name.starts_with("gemv::add_norm"))
        .collect();
    bare.register_twins(&twins).unwrap();
    for module in solder_model_layers::kernels::MODULES {
        bare.load_module(&ModuleImage {
            name: module,
            ptx: None,
            cubin: None,
        })
        .unwrap();
    }
    let boot = exec_support::boot(
        config(TINY_LLAMA),
        Policy::default(),
        WeightSource::Checkpoint(dir.path().to_path_buf()),
        exec_support::roomy_kv(),
    );
    match CircuitExec::build(&mut bare, boot) {
        Err(ExecError::Weights(WeightsError::Missing { tensor, .. })) => assert_eq!(tensor, gone),
        Err(other) => panic!("expected the missing tensor first, got {other}"),
        Ok(_) => panic!("built without `{gone}`"),
    }
}
