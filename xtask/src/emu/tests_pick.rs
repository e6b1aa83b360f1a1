//! `pick::argmax` (the greedy tokens `Session::next_tokens` reads back instead of the logits)
//! through the host emulation of its CUDA source: equal to its twin on rows of every kind —
//! ties across threads and warps, NaN, ±inf, nothing finite — and rows past one block's grid;
//! the optional token field (steps fed on the device) gets the same ids. A kernel that writes
//! past its ids fails the launch, naming the argument (the emulation's fenced copies).

use solder_gpu_runtime::cpu::emu::{EmuMode, Emulation};
use solder_gpu_runtime::{CpuBackend, GpuBackend, LaunchConfig};
use solder_model_layers::kernels::pick::{Argmax, ARGMAX};
use solder_model_layers::numerics::greedy_id;

use super::tests::{download, emulated, run, upload};
use super::tests_mutation::build_mutant;

#[test]
fn argmax_equals_its_twin_on_every_kind_of_row() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let vocab = 1000usize;
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    // The maximum twice, in different warps (index 37 and 937): the lower index.
    let mut tie: Vec<f32> = (0..vocab).map(|i| (i as f32 * 0.37).sin()).collect();
    tie[37] = 5.0;
    tie[937] = 5.0;
    rows.push(tie);
    // NaN everywhere but two finite values; +inf in two places; nothing finite.
    let mut sparse = vec![nan; vocab];
    sparse[500] = -1.0;
    sparse[3] = -2.0;
    rows.push(sparse);
    let mut infs: Vec<f32> = (0..vocab).map(|i| i as f32).collect();
    infs[700] = inf;
    infs[300] = inf;
    rows.push(infs);
    rows.push(
        (0..vocab)
            .map(|i| if i % 2 == 0 { -inf } else { nan })
            .collect(),
    );
    let logits: Vec<u8> = rows
        .iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let count = rows.len();
    let logits = upload(&mut backend, &logits);
    let ids = upload(&mut backend, &vec![0xa5u8; count * 4]);
    let tokens = upload(&mut backend, &vec![0x5au8; count * 4]);
    let mut launch = Argmax {
        logits,
        ids,
        tokens: Some(tokens),
        rows: count as u32,
        vocab: vocab as u32,
    }
    .launch(ARGMAX);
    // Two blocks for four rows: each block takes every other row.
    launch.config = LaunchConfig {
        grid: [2, 1, 1],
        ..launch.config
    };
    run(&mut backend, &launch);
    let parity = &backend.emulation().unwrap().report()[ARGMAX.as_str()];
    assert_eq!(parity.launches, parity.identical, "{parity:?}");
    let got: Vec<i32> = download(&mut backend, ids.ptr, count * 4)
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let want: Vec<i32> = rows
        .iter()
        .map(|r| greedy_id(r).map_or(-1, |i| i as i32))
        .collect();
    assert_eq!(got, want);
    assert_eq!(want, vec![37, 500, 300, -1]);
    // The next step's token field gets the same ids.
    assert_eq!(
        download(&mut backend, tokens.ptr, count * 4),
        download(&mut backend, ids.ptr, count * 4)
    );
}

/// Each buffer reaches an emulated kernel as a copy between fences of 0xff: a mutant whose
/// rows store their ids a row block further on (past the ids' bytes, inside the fence) fails
/// the launch, naming the argument and the byte, and leaves the buffers as they were, where
/// it wrote into host memory before (compute-sanitizer's memcheck finds it on a device); the
/// original runs.
#[test]
fn an_argmax_writing_past_its_ids_fails_by_the_argument() {
    let dir = build_mutant("pick", &[("ids[r] = none", "ids[r + rows] = none")]);
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let (rows, vocab) = (3u32, 300u32);
    let logits: Vec<u8> = (0..rows * vocab)
        .flat_map(|i| ((i as f32) * 0.37).sin().to_le_bytes())
        .collect();
    let logits = upload(&mut backend, &logits);
    let ids = upload(&mut backend, &vec![0u8; rows as usize * 4]);
    let launch = Argmax {
        logits,
        ids,
        tokens: None,
        rows,
        vocab,
    }
    .launch(ARGMAX);
    let launch_in = |backend: &mut CpuBackend, emulation: Emulation| {
        backend.set_emulation(Some(emulation));
        let kernel = backend.kernel(launch.kernel).unwrap();
        let stream = backend.default_stream();
        let result = backend.launch(stream, kernel, &launch.config, &launch.args);
        backend.set_emulation(None);
        result
    };
    let mutant = Emulation::open(&dir, &["pick"], EmuMode::Run).unwrap();
    let err = launch_in(&mut backend, mutant).unwrap_err().to_string();
    // ids is argument 1; the first row's id lands 3 ids (12 bytes) past its start.
    assert!(
        err.contains("wrote byte 12 of argument 1, outside its 12 bytes"),
        "{err}"
    );
    // The failed launch left the ids as they were.
    assert_eq!(download(&mut backend, ids.ptr, 12), vec![0u8; 12]);
    let root = crate::paths::workspace_root();
    launch_in(&mut backend, super::emulation(&root, EmuMode::Run).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
}
