//! A sharded checkpoint's index against its shards' headers (issue 9): every tensor the
//! index maps is in that shard, every shard tensor is in the index, none in two shards, each
//! error naming the tensor and both files; and a folder with both `model.safetensors` and an
//! index loads `model.safetensors`, as transformers does.

mod exec_support;

use std::path::Path;

use exec_support::{config, instance, write_safetensors, RawTensor, TempDir, TINY_LLAMA};
use safetensors::Dtype;
use solder_circuit::ir::Circuit;
use solder_model_layers::{Checkpoint, HostWeights, WeightsError};

const A: &str = "model-00001-of-00002.safetensors";
const B: &str = "model-00002-of-00002.safetensors";
const INDEX: &str = "model.safetensors.index.json";

fn llama(seed: u64) -> (Circuit, HostWeights) {
    let circuit = instance(&config(TINY_LLAMA)).circuit;
    let weights = HostWeights::random(&circuit, seed);
    (circuit, weights)
}

fn tensors(circuit: &Circuit, weights: &HostWeights) -> Vec<RawTensor> {
    circuit
        .weights
        .iter()
        .zip(&weights.slots)
        .map(|(slot, values)| RawTensor {
            name: slot.name.clone(),
            dtype: Dtype::BF16,
            shape: slot.shape.clone(),
            data: values.clone(),
        })
        .collect()
}

/// Shards A and B (the first tensor in B, the rest in A) and an index mapping each name of
/// `map` to its shard.
fn write_sharded(dir: &Path, tensors: Vec<RawTensor>, map: &[(String, &str)]) {
    let (b, a): (Vec<_>, Vec<_>) = tensors.into_iter().enumerate().partition(|(i, _)| *i == 0);
    let strip = |v: Vec<(usize, RawTensor)>| v.into_iter().map(|(_, t)| t).collect::<Vec<_>>();
    write_safetensors(&dir.join(A), &strip(a));
    write_safetensors(&dir.join(B), &strip(b));
    let weight_map: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .map(|(name, shard)| (name.clone(), (*shard).into()))
        .collect();
    std::fs::write(
        dir.join(INDEX),
        serde_json::json!({ "weight_map": weight_map }).to_string(),
    )
    .expect("index");
}

/// The index as the shards hold it: the first tensor in B, the rest in A.
fn true_map(tensors: &[RawTensor]) -> Vec<(String, &'static str)> {
    tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), if i == 0 { B } else { A }))
        .collect()
}

fn open_err(dir: &Path) -> WeightsError {
    match Checkpoint::open(dir) {
        Err(e) => e,
        Ok(_) => panic!("{} opened", dir.display()),
    }
}

#[test]
fn a_consistent_index_opens() {
    let dir = TempDir::new("index-ok");
    let (circuit, weights) = llama(1);
    let all = tensors(&circuit, &weights);
    let map = true_map(&all);
    write_sharded(dir.path(), all, &map);
    let checkpoint = Checkpoint::open(dir.path()).expect("open");
    assert_eq!(checkpoint.file_count(), 2);
    HostWeights::load(&circuit, &checkpoint).expect("load");
}

#[test]
fn index_mapping_a_tensor_to_the_other_shard_is_refused_naming_both() {
    let dir = TempDir::new("index-wrong");
    let (circuit, weights) = llama(1);
    let all = tensors(&circuit, &weights);
    let mut map = true_map(&all);
    let moved = map[1].0.clone(); // in A, mapped to B
    map[1].1 = B;
    write_sharded(dir.path(), all, &map);
    let err = open_err(dir.path());
    let message = err.to_string();
    match err {
        WeightsError::WrongShard {
            tensor,
            index,
            mapped,
            found,
        } => {
            assert_eq!(tensor, moved);
            assert_eq!(index, dir.path().join(INDEX));
            assert_eq!(mapped, dir.path().join(B));
            assert_eq!(found, dir.path().join(A));
        }
        other => panic!("expected WrongShard, got {other}"),
    }
    assert!(message.contains(&moved) && message.contains(A) && message.contains(B));
}

#[test]
fn index_naming_a_tensor_no_shard_holds_is_refused() {
    let dir = TempDir::new("index-ghost");
    let (circuit, weights) = llama(1);
    let all = tensors(&circuit, &weights);
    let mut map = true_map(&all);
    map.push(("model.layers.0.ghost.weight".into(), A));
    write_sharded(dir.path(), all, &map);
    match open_err(dir.path()) {
        WeightsError::NotInShard {
            tensor,
            index,
            shard,
        } => {
            assert_eq!(tensor, "model.layers.0.ghost.weight");
            assert_eq!(index, dir.path().join(INDEX));
            assert_eq!(shard, dir.path().join(A));
        }
        other => panic!("expected NotInShard, got {other}"),
    }
}

#[test]
fn shard_tensor_missing_from_the_index_is_refused() {
    let dir = TempDir::new("index-unlisted");
    let (circuit, weights) = llama(1);
    let all = tensors(&circuit, &weights);
    let mut map = true_map(&all);
    let unlisted = map.remove(2).0;
    write_sharded(dir.path(), all, &map);
    let err = open_err(dir.path());
    assert!(err.to_string().contains(&unlisted), "{err}");
    match err {
        WeightsError::NotInIndex {
            tensor,
            shard,
            index,
        } => {
            assert_eq!(tensor, unlisted);
            assert_eq!(shard, dir.path().join(A));
            assert_eq!(index, dir.path().join(INDEX));
        }
        other => panic!("expected NotInIndex, got {other}"),
    }
}

#[test]
fn a_tensor_in_two_shards_names_both_files() {
    let dir = TempDir::new("index-twice");
    let (circuit, weights) = llama(1);
    let mut all = tensors(&circuit, &weights);
    let map = true_map(&all);
    let twice = all[3].name.clone();
    all.insert(
        0,
        RawTensor {
            name: twice.clone(),
            dtype: all[3].dtype,
            shape: all[3].shape.clone(),
            data: all[3].data.clone(),
        },
    ); // now the first tensor (in B) is a copy of one in A
    write_sharded(dir.path(), all, &map);
    let err = open_err(dir.path());
    let message = err.to_string();
    match err {
        WeightsError::TwoShards {
            tensor,
            first,
            second,
        } => {
            assert_eq!(tensor, twice);
            assert_eq!(first, dir.path().join(A));
            assert_eq!(second, dir.path().join(B));
        }
        other => panic!("expected TwoShards, got {other}"),
    }
    assert!(message.contains(A) && message.contains(B), "{message}");
}

#[test]
fn a_folder_with_both_loads_model_safetensors_as_transformers_does() {
    let dir = TempDir::new("index-both");
    let (circuit, single) = llama(1);
    let (_, shards) = llama(2);
    single
        .save(&circuit, &dir.path().join("model.safetensors"))
        .expect("save");
    let all = tensors(&circuit, &shards);
    let map = true_map(&all);
    write_sharded(dir.path(), all, &map);
    let checkpoint = Checkpoint::open(dir.path()).expect("open");
    assert_eq!(checkpoint.file_count(), 1);
    let loaded = HostWeights::load(&circuit, &checkpoint).expect("load");
    for (i, (a, b)) in loaded.slots.iter().zip(&single.slots).enumerate() {
        assert!(a == b, "slot {i}: not model.safetensors' values");
    }
    // The index is not read at all: one naming absent shards does not stop the load.
    std::fs::remove_file(dir.path().join(A)).expect("remove");
    Checkpoint::open(dir.path()).expect("open without the shards");
}
