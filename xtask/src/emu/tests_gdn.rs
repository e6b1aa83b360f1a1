//! `gdn::recurrence` (and its pitched route) through the host emulation of its CUDA source:
//! equal to its twin byte for byte, outputs, state and snapshots, in every row layout — a
//! prefill chain on one slot, verify runs on several, independent rows, evenly pitched slots —
//! with a head's columns split over several one-warp blocks (dv not a multiple of 32), q and k
//! wider than a warp, and a key head dim past 128. And a chain's bytes are those of its rows
//! run one launch each, as decode runs them.

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::kernels::gdn::{Recurrence, RECURRENCE, RECURRENCE_PITCHED};
use solder_model_layers::kernels::{Buf, Name};

use super::tests::{bf16_values, download, emulated, run, upload};

/// One recurrence problem: geometry, the rows' slots and how they chain.
struct Problem {
    nk: u32,
    dk: u32,
    nv: u32,
    dv: u32,
    slots: Vec<i32>,
    num_slots: u32,
    chain: u32,
    snapshots: bool,
}

/// The buffers of one launch; `rows` of `p` starting at `first` (the inputs are laid out for
/// every row of `p`).
struct Inputs {
    mixed: Vec<u8>,
    beta: Vec<u8>,
    g: Vec<u8>,
    state: Vec<u8>,
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(|v| v.to_le_bytes()).collect()
}

fn inputs(p: &Problem, seed: f32) -> Inputs {
    let rows = p.slots.len() as u32;
    let channels = 2 * p.nk * p.dk + p.nv * p.dv;
    let gates = rows * p.nv;
    let state = p.num_slots * p.nv * p.dk * p.dv;
    Inputs {
        mixed: bf16_values(rows * channels, seed),
        // beta in (0, 1), g ≤ 0: a decay in (0, 1].
        beta: f32_bytes((0..gates).map(|i| 0.5 + 0.45 * ((i as f32 + seed) * 0.71).sin())),
        g: f32_bytes((0..gates).map(|i| -0.3 * ((i as f32 + seed) * 0.53).cos().abs())),
        state: f32_bytes((0..state).map(|i| ((i as f32 + seed) * 0.29).sin() * 0.5)),
    }
}

/// Runs rows `rows` of `p` (their slots) in one launch on `state`; returns (out, snapshots).
fn launch(
    backend: &mut CpuBackend,
    p: &Problem,
    x: &Inputs,
    state: Buf,
    rows: std::ops::Range<usize>,
    kernel: Name<Recurrence>,
) -> (Vec<u8>, Vec<u8>) {
    let channels = (2 * p.nk * p.dk + p.nv * p.dv) as usize;
    let n = rows.len();
    let mixed = upload(
        backend,
        &x.mixed[rows.start * channels * 2..rows.end * channels * 2],
    );
    let nv = p.nv as usize;
    let beta = upload(backend, &x.beta[rows.start * nv * 4..rows.end * nv * 4]);
    let g = upload(backend, &x.g[rows.start * nv * 4..rows.end * nv * 4]);
    let slots = upload(
        backend,
        &p.slots[rows.clone()]
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let out_bytes = n * nv * p.dv as usize * 2;
    let snap_bytes = n * nv * (p.dk * p.dv) as usize * 4;
    let out = upload(backend, &vec![0x5a; out_bytes]);
    let snapshots = p
        .snapshots
        .then(|| upload(backend, &vec![0xa5; snap_bytes]));
    let launch = Recurrence {
        mixed,
        beta,
        g,
        state,
        slots,
        out,
        snapshots,
        rows: n as u32,
        nk: p.nk,
        dk: p.dk,
        nv: p.nv,
        dv: p.dv,
        num_slots: p.num_slots,
        chain: p.chain,
    }
    .launch(kernel);
    run(backend, &launch);
    (
        download(backend, out.ptr, out_bytes),
        snapshots.map_or_else(Vec::new, |s| download(backend, s.ptr, snap_bytes)),
    )
}

#[test]
fn the_recurrence_equals_its_twin_in_every_row_layout() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let problem = |nk, dk, nv, dv, slots: &[i32], num_slots, chain| Problem {
        nk,
        dk,
        nv,
        dv,
        slots: slots.to_vec(),
        num_slots,
        chain,
        snapshots: chain != 0,
    };
    let problems = [
        // A prefill chain of 5 rows: dk 48 (q, k wider than a warp), dv 40 (two column
        // blocks, the second 8 columns wide), 2 v heads on one key head.
        (
            "chain",
            problem(1, 48, 2, 40, &[1, 1, 1, 1, 1], 3, 1),
            RECURRENCE,
        ),
        // Verify runs of 3, 2 and 1 rows on three slots, 2 key heads.
        (
            "runs",
            problem(2, 16, 4, 8, &[0, 0, 0, 2, 2, 1], 3, 2),
            RECURRENCE,
        ),
        // Independent rows, and the pitched route on slots 0, 2, 4.
        ("rows", problem(1, 32, 2, 64, &[3, 0, 2], 4, 0), RECURRENCE),
        (
            "pitched",
            problem(1, 32, 2, 33, &[0, 2, 4], 5, 0),
            RECURRENCE_PITCHED,
        ),
        // A key head dim past 128 and up to the kernel's 256, in a chain of 3.
        (
            "dk 200",
            problem(1, 200, 1, 36, &[0, 0, 0], 1, 1),
            RECURRENCE,
        ),
    ];
    for (i, (name, p, kernel)) in problems.iter().enumerate() {
        let x = inputs(p, 0.25 + i as f32);
        let state = upload(&mut backend, &x.state);
        launch(&mut backend, p, &x, state, 0..p.slots.len(), *kernel);
        let parity = &backend.emulation().unwrap().report()[kernel.as_str()];
        assert_eq!(
            parity.launches, parity.identical,
            "{name}: {kernel:?} {parity:?}"
        );
    }
}

/// A prefill chain leaves the state, outputs and snapshots that its rows leave decoded one
/// launch each (chain 0, one row) — the batch invariance that lets a prompt be fed in chunks.
#[test]
fn a_chain_gives_the_bytes_of_its_rows_decoded_one_by_one() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    let chain = Problem {
        nk: 1,
        dk: 64,
        nv: 2,
        dv: 48,
        slots: vec![0; 6],
        num_slots: 1,
        chain: 1,
        snapshots: true,
    };
    let x = inputs(&chain, 0.5);
    let state = upload(&mut backend, &x.state);
    let (out, snapshots) = launch(&mut backend, &chain, &x, state, 0..6, RECURRENCE);
    let chained_state = download(&mut backend, state.ptr, x.state.len());
    let decode = Problem { chain: 0, ..chain };
    let state = upload(&mut backend, &x.state);
    let (mut out_1, mut snapshots_1) = (Vec::new(), Vec::new());
    for r in 0..6 {
        let (o, _) = launch(&mut backend, &decode, &x, state, r..r + 1, RECURRENCE);
        out_1.extend(o);
        // Decode takes no snapshots: the state after row r is its snapshot.
        snapshots_1.extend(download(&mut backend, state.ptr, x.state.len()));
    }
    assert!(out == out_1, "the chain's outputs differ from decode's");
    assert!(
        snapshots == snapshots_1,
        "the chain's snapshots differ from decode's states"
    );
    assert!(
        chained_state == download(&mut backend, state.ptr, x.state.len()),
        "the chain's final state differs from decode's"
    );
    assert_ne!(chained_state, x.state, "the chain moved the state");
}
