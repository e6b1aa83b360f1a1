//! The `_pipe` entries of the tensor-core projections (gemm.cu `gemm_pipe`, lever `mma_pipe`:
//! `gemm_large`'s tiles with three 64-k tiles in flight in dynamic shared memory, filled by
//! cp.async) through the host emulation of their CUDA source. The emulation holds each cp.async
//! copy back until the thread waits for its group (`cuda_emu.hpp`), and every block's shared
//! memory starts poisoned, so a tile read before its copies landed shows in the bytes. Checked
//! here: each entry writes the bytes of its wide kernel and of its `_large` entry, and equals
//! its twin, with fewer k tiles than stages and many more, k off 8 (the stages fetched through
//! registers), several row and feature blocks (the last partial), and an LM head whose `want`
//! flags skip a row block; a wait that lets the tile being read still be in flight is caught;
//! a launch that asks for less shared memory than its stages fails by its bytes. The `_pipe`
//! entries of the launches of several matrices (`qkv_mma_pipe`, `linear_pair_mma_pipe`) run in
//! `tests_large`, beside their `_large` ones.

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::kernels::gemm::{
    large_grid, pipe_of, pipe_shared_bytes, GateUpSiluMma, LinearMma, LmHeadMma, GATE_UP_SILU_MMA,
    GATE_UP_SILU_MMA_LARGE, GATE_UP_SILU_MMA_PIPE, LINEAR_MMA, LINEAR_MMA_LARGE, LINEAR_MMA_PIPE,
    LM_HEAD_MMA, LM_HEAD_MMA_LARGE, LM_HEAD_MMA_PIPE, PIPES,
};
use solder_model_layers::kernels::{Buf, Launch};

use super::tests::{download, emulated, run, upload};
use super::tests_mutation::{assert_caught, build_mutant, values};

/// (rows, k, n): one row and one k tile (fewer tiles than stages); k off 8 (the register path)
/// over two tiles, two row blocks, n off 64; three row blocks (the last partial), k ending
/// mid-tile over nine tiles (every stage reused), three feature blocks (the last of two).
const SHAPES: [(u32, u32, u32); 3] = [(1, 64, 32), (130, 100, 70), (300, 536, 130)];

#[test]
fn pipe_entries_write_the_bytes_of_the_wide_ones() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let mut compared = 0;
    for (i, (rows, k, n)) in SHAPES.into_iter().enumerate() {
        let seed = 0x7070 + i as u64;
        let x = upload(&mut backend, &values(rows * k, seed));
        let w = upload(&mut backend, &values(n * k, seed ^ 0x11));
        let w2 = upload(&mut backend, &values(n * k, seed ^ 0x22));
        let bias = upload(&mut backend, &values(n, seed ^ 0x33));
        // Rows 0 and 1 of every 3 wanted, and none of the second row block's (its block
        // returns before it stages a tile).
        let want: Vec<u8> = (0..rows)
            .flat_map(|r| i32::from(r % 3 != 2 && !(128..256).contains(&r)).to_le_bytes())
            .collect();
        let want = upload(&mut backend, &want);
        let fresh =
            |backend: &mut _, size: u32| upload(backend, &vec![0x5a; (rows * n * size) as usize]);
        let large = large_grid(n, rows);
        // Each kernel through its wide, `_large` and `_pipe` entries, each into its own output.
        let mut runs: Vec<([Buf; 3], [Launch; 3])> = Vec::new();
        let y = [0; 3].map(|_| fresh(&mut backend, 2));
        let linear = |y| LinearMma {
            x,
            w,
            bias: Some(bias),
            y,
            rows,
            k,
            n_out: n,
        };
        let (entry, config) = pipe_of(LINEAR_MMA_LARGE, large).unwrap();
        runs.push((
            y,
            [
                linear(y[0]).launch(LINEAR_MMA),
                linear(y[1]).launch_with(LINEAR_MMA_LARGE, large),
                linear(y[2]).launch_with(entry, config),
            ],
        ));
        let act = [0; 3].map(|_| fresh(&mut backend, 2));
        let gate_up = |act| GateUpSiluMma {
            x,
            wg: w,
            wu: w2,
            act,
            rows,
            k,
            inter: n,
        };
        let (entry, config) = pipe_of(GATE_UP_SILU_MMA_LARGE, large).unwrap();
        runs.push((
            act,
            [
                gate_up(act[0]).launch(GATE_UP_SILU_MMA),
                gate_up(act[1]).launch_with(GATE_UP_SILU_MMA_LARGE, large),
                gate_up(act[2]).launch_with(entry, config),
            ],
        ));
        let logits = [0; 3].map(|_| fresh(&mut backend, 4));
        let head = |logits| LmHeadMma {
            x,
            w,
            logits,
            want: Some(want),
            rows,
            k,
            vocab: n,
        };
        let (entry, config) = pipe_of(LM_HEAD_MMA_LARGE, large).unwrap();
        runs.push((
            logits,
            [
                head(logits[0]).launch(LM_HEAD_MMA),
                head(logits[1]).launch_with(LM_HEAD_MMA_LARGE, large),
                head(logits[2]).launch_with(entry, config),
            ],
        ));
        for (outs, launches) in runs {
            for l in &launches {
                run(&mut backend, l);
            }
            let [wide, large, pipe] = outs.map(|b| download(&mut backend, b.ptr, b.bytes));
            let kernel = launches[2].kernel;
            assert!(
                wide.iter().any(|&b| b != 0x5a),
                "({rows}, {k}, {n}) {kernel}: nothing written"
            );
            assert!(wide == large, "({rows}, {k}, {n}) {}", launches[1].kernel);
            assert!(wide == pipe, "({rows}, {k}, {n}) {kernel}");
            compared += 1;
        }
    }
    assert_eq!(compared, 3 * SHAPES.len());
    let report = backend.emulation().unwrap().report();
    for entry in [
        LINEAR_MMA_PIPE.as_str(),
        GATE_UP_SILU_MMA_PIPE.as_str(),
        LM_HEAD_MMA_PIPE.as_str(),
    ] {
        let parity = &report[entry];
        assert_eq!(parity.launches, SHAPES.len() as u64, "{entry}: {parity:?}");
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
    }
}

/// Every `_pipe` entry stands in for a `_large` one of the same kernel, and asks for the
/// stages of its weights (gate and up's two).
#[test]
fn every_pipe_entry_stands_in_for_a_large_one() {
    let config = large_grid(256, 512);
    assert_eq!(PIPES.len(), 5);
    for &(pipe, large, kernel, weights) in &PIPES {
        assert_eq!(pipe, large.replace("_large", "_pipe"), "{pipe}");
        assert_eq!(large.strip_suffix("_large"), Some(kernel), "{large}");
        let expected = if kernel == GATE_UP_SILU_MMA.as_str() {
            2
        } else {
            1
        };
        assert_eq!(weights, expected, "{pipe}");
    }
    let (entry, piped) = pipe_of(GATE_UP_SILU_MMA_LARGE, config).unwrap();
    assert_eq!(entry.as_str(), GATE_UP_SILU_MMA_PIPE.as_str());
    assert_eq!((piped.grid, piped.block), (config.grid, config.block));
    assert_eq!(piped.shared_bytes, 110_592);
    assert_eq!(pipe_shared_bytes(1), 82_944);
}

/// A wait that lets the newest two groups stay in flight (`wait_group 2` for 1) reads tile t
/// before its copies landed: the emulation lands them at the wait that completes them, so the
/// mutant multiplies a stage still poisoned (or holding tile t − 3) and differs from the twin.
#[test]
fn a_pipe_that_reads_a_tile_still_in_flight_differs_from_the_twin() {
    let dir = build_mutant(
        "gemm",
        &[(
            "cp_async_wait<GEMM_PIPE_STAGES - 2u>();",
            "cp_async_wait<GEMM_PIPE_STAGES - 1u>();",
        )],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let (rows, k, n) = (130u32, 256u32, 64u32);
    let x = upload(&mut backend, &values(rows * k, 7));
    let w = upload(&mut backend, &values(n * k, 8));
    let y = upload(&mut backend, &vec![0u8; (rows * n * 2) as usize]);
    let (entry, config) = pipe_of(LINEAR_MMA_LARGE, large_grid(n, rows)).unwrap();
    let l = LinearMma {
        x,
        w,
        bias: None,
        y,
        rows,
        k,
        n_out: n,
    }
    .launch_with(entry, config);
    assert_caught(&dir, "gemm", &mut backend, &l);
    std::fs::remove_dir_all(&dir).ok();
}

/// The emulation gives a launch the dynamic shared memory it asks for: gate/up's `_pipe` entry
/// asking for one weight's stages (as `linear_mma_pipe` does) fails by its bytes.
#[test]
fn a_gate_up_pipe_asking_for_one_weights_stages_fails_by_its_bytes() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    // Three k tiles: the third stage, past one weight's three, is filled.
    let (rows, k, n) = (130u32, 192u32, 64u32);
    let x = upload(&mut backend, &values(rows * k, 9));
    let w = upload(&mut backend, &values(n * k, 10));
    let act = upload(&mut backend, &vec![0u8; (rows * n * 2) as usize]);
    let (entry, mut config) = pipe_of(GATE_UP_SILU_MMA_LARGE, large_grid(n, rows)).unwrap();
    let l = GateUpSiluMma {
        x,
        wg: w,
        wu: w,
        act,
        rows,
        k,
        inter: n,
    };
    run(&mut backend, &l.launch_with(entry, config));
    config.shared_bytes = pipe_shared_bytes(1);
    let launch = l.launch_with(entry, config);
    let kernel = backend.kernel(launch.kernel).unwrap();
    let stream = backend.default_stream();
    let err = backend
        .launch(stream, kernel, &launch.config, &launch.args)
        .unwrap_err()
        .to_string();
    let bytes = format!(
        "past the {} bytes the launch asked for",
        pipe_shared_bytes(1)
    );
    assert!(err.contains(&bytes), "{err}");
}
