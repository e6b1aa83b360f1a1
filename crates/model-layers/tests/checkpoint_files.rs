//! A sharded checkpoint's index and every shard pass the file guard configs and rules pass
//! (issue 19 item 3): a FIFO, `/dev/zero` or a folder in their place is refused by path
//! before a byte is read, and so is an index longer than its cap (a sparse 3 GiB file).
//! Each open runs on a thread with a deadline, so a hang fails the test instead of stalling.

mod exec_support;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use exec_support::{config, instance, write_safetensors, RawTensor, TempDir, TINY_LLAMA};
use safetensors::Dtype;
use solder_model_layers::{Checkpoint, HostWeights};

const SHARD: &str = "model-00001-of-00001.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// A one-shard checkpoint of the tiny llama with its index.
fn write_checkpoint(dir: &Path) {
    let circuit = instance(&config(TINY_LLAMA)).circuit;
    let weights = HostWeights::random(&circuit, 3);
    let tensors: Vec<RawTensor> = circuit
        .weights
        .iter()
        .zip(&weights.slots)
        .map(|(slot, values)| RawTensor {
            name: slot.name.clone(),
            dtype: Dtype::BF16,
            shape: slot.shape.clone(),
            data: values.clone(),
        })
        .collect();
    write_safetensors(&dir.join(SHARD), &tensors);
    let map: serde_json::Map<String, serde_json::Value> = tensors
        .iter()
        .map(|t| (t.name.clone(), SHARD.into()))
        .collect();
    std::fs::write(
        dir.join(INDEX),
        serde_json::json!({ "weight_map": map }).to_string(),
    )
    .unwrap();
}

/// `Checkpoint::open(dir)`'s error text, or a panic if it opens or takes over 20 s.
fn refusal(dir: PathBuf) -> String {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = Checkpoint::open(&dir)
            .map(|_| ())
            .map_err(|e| e.to_string());
        let _ = tx.send(result);
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Err(message)) => message,
        Ok(Ok(())) => panic!("the checkpoint opened"),
        Err(_) => panic!("Checkpoint::open did not return within 20 s (it read a FIFO?)"),
    }
}

fn mkfifo(path: &Path) -> bool {
    std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn the_checkpoint_opens_as_written() {
    let dir = TempDir::new("files-ok");
    write_checkpoint(dir.path());
    Checkpoint::open(dir.path()).expect("open");
}

#[test]
fn an_index_that_is_a_fifo_is_refused_without_blocking() {
    let dir = TempDir::new("files-index-fifo");
    write_checkpoint(dir.path());
    std::fs::remove_file(dir.path().join(INDEX)).unwrap();
    if !mkfifo(&dir.path().join(INDEX)) {
        eprintln!("no mkfifo: skipped");
        return;
    }
    let message = refusal(dir.path().to_path_buf());
    assert!(message.contains(INDEX), "{message}");
    assert!(message.contains("not a regular file"), "{message}");
}

#[test]
fn a_shard_that_is_a_fifo_is_refused_without_blocking() {
    let dir = TempDir::new("files-shard-fifo");
    write_checkpoint(dir.path());
    std::fs::remove_file(dir.path().join(SHARD)).unwrap();
    if !mkfifo(&dir.path().join(SHARD)) {
        eprintln!("no mkfifo: skipped");
        return;
    }
    let message = refusal(dir.path().to_path_buf());
    assert!(message.contains(SHARD), "{message}");
    assert!(message.contains("not a regular file"), "{message}");
}

#[test]
fn an_index_linked_to_dev_zero_is_refused_before_a_read() {
    let dir = TempDir::new("files-index-zero");
    write_checkpoint(dir.path());
    std::fs::remove_file(dir.path().join(INDEX)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join(INDEX)).unwrap();
    let message = refusal(dir.path().to_path_buf());
    assert!(message.contains(INDEX), "{message}");
    assert!(message.contains("not a regular file"), "{message}");
}

#[test]
fn a_shard_linked_to_a_device_or_a_folder_is_refused() {
    for (tag, target) in [("zero", "/dev/zero"), ("folder", "/")] {
        let dir = TempDir::new(&format!("files-shard-{tag}"));
        write_checkpoint(dir.path());
        std::fs::remove_file(dir.path().join(SHARD)).unwrap();
        std::os::unix::fs::symlink(target, dir.path().join(SHARD)).unwrap();
        let message = refusal(dir.path().to_path_buf());
        assert!(message.contains(SHARD), "{tag}: {message}");
        assert!(message.contains("not a regular file"), "{tag}: {message}");
    }
}

#[test]
fn a_single_file_that_is_a_device_is_refused_by_name() {
    let dir = TempDir::new("files-single-zero");
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("model.safetensors")).unwrap();
    let message = refusal(dir.path().to_path_buf());
    assert!(message.contains("model.safetensors"), "{message}");
    assert!(message.contains("not a regular file"), "{message}");
}

#[test]
fn a_sparse_3_gib_index_is_refused_by_its_length() {
    let dir = TempDir::new("files-index-sparse");
    write_checkpoint(dir.path());
    let index = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(INDEX))
        .unwrap();
    // Sparse: the length is what is checked, so nothing is written.
    index.set_len(3 << 30).unwrap();
    let message = refusal(dir.path().to_path_buf());
    assert!(message.contains(INDEX), "{message}");
    assert!(message.contains("larger than"), "{message}");
}

#[test]
fn a_tensor_named_twice_in_a_header_is_refused_by_name() {
    let dir = TempDir::new("files-dup-header");
    // Two entries for `w` over the same bytes: safetensors' own checks pass (the offsets
    // still cover the data), and a map keeps whichever came last.
    let header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0u8; 8]);
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    let message = refusal(dir.path().to_path_buf());
    assert!(message.contains("model.safetensors"), "{message}");
    assert!(message.contains("duplicate key `w`"), "{message}");
}

#[test]
fn a_tensor_mapped_twice_in_the_index_is_refused_by_name() {
    let dir = TempDir::new("files-dup-index");
    write_checkpoint(dir.path());
    let text = std::fs::read_to_string(dir.path().join(INDEX)).unwrap();
    let doubled = text.replacen(
        "{\"weight_map\":{",
        "{\"weight_map\":{\"lm_head.weight\":\"elsewhere.safetensors\",",
        1,
    );
    assert_ne!(doubled, text);
    std::fs::write(dir.path().join(INDEX), doubled).unwrap();
    let message = refusal(dir.path().to_path_buf());
    assert!(message.contains(INDEX), "{message}");
    assert!(
        message.contains("duplicate key `lm_head.weight`"),
        "{message}"
    );
}
