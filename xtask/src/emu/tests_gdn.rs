//! `gdn::recurrence` (and its pitched route, and `gdn::gates_recurrence`, the gates folded in)
//! through the host emulation of its CUDA source:
//! equal to its twin byte for byte, outputs, state and snapshots, in every row layout — a
//! prefill chain on one slot, verify runs on several, independent rows, evenly pitched slots,
//! each advancing its slots in place and writing other slots (`out_slots`) —
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
    /// The slots the rows write (`out_slots`); None: their own slots, in place.
    out_slots: Option<Vec<i32>>,
    num_slots: u32,
    chain: u32,
    snapshots: bool,
    /// Each row's keep-snapshots flag (`MetaField::KeepSnapshots`); None: every row keeps its.
    keep: Option<Vec<i32>>,
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

fn i32_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Problem {
    /// The slots rows `rows` write.
    fn out_slots(&self, rows: std::ops::Range<usize>) -> &[i32] {
        &self.out_slots.as_ref().unwrap_or(&self.slots)[rows]
    }
}

/// The keep flags of rows `rows` of `p`, uploaded, when it has them.
fn keep_of(backend: &mut CpuBackend, p: &Problem, rows: std::ops::Range<usize>) -> Option<Buf> {
    let keep = p.keep.as_ref()?;
    Some(upload(backend, &i32_bytes(&keep[rows])))
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
    let slots = upload(backend, &i32_bytes(&p.slots[rows.clone()]));
    let out_slots = upload(backend, &i32_bytes(p.out_slots(rows.clone())));
    let keep = keep_of(backend, p, rows.clone());
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
        out_slots,
        out,
        snapshots,
        keep,
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

/// A problem of `nk` key heads of `dk`, `nv` value heads of `dv`, rows on `slots`, chained
/// by `chain` (with snapshots when chained).
fn problem(
    nk: u32,
    dk: u32,
    nv: u32,
    dv: u32,
    slots: &[i32],
    num_slots: u32,
    chain: u32,
) -> Problem {
    Problem {
        nk,
        dk,
        nv,
        dv,
        slots: slots.to_vec(),
        out_slots: None,
        num_slots,
        chain,
        snapshots: chain != 0,
        keep: None,
    }
}

/// `p` with each row's keep flag.
fn keeping(p: Problem, keep: &[i32]) -> Problem {
    assert_eq!(keep.len(), p.slots.len());
    Problem {
        keep: Some(keep.to_vec()),
        ..p
    }
}

/// `p` with the rows writing `out_slots` (in `num_slots` slots) instead of their own.
fn writing(p: Problem, out_slots: &[i32], num_slots: u32) -> Problem {
    assert_eq!(out_slots.len(), p.slots.len());
    Problem {
        out_slots: Some(out_slots.to_vec()),
        num_slots,
        ..p
    }
}

/// The row layouts every recurrence kernel is held to, each with whether it runs the pitched
/// route; the chains and runs keep some rows' snapshots and skip the others'. The last four
/// write other slots than they read (some rows still in place, on slot 0).
fn layouts() -> [(&'static str, Problem, bool); 9] {
    [
        // A prefill chain of 5 rows: dk 48 (q, k wider than a warp), dv 40 (two column
        // blocks, the second 8 columns wide), 2 v heads on one key head.
        (
            "chain",
            keeping(
                problem(1, 48, 2, 40, &[1, 1, 1, 1, 1], 3, 1),
                &[1, 0, 0, 1, 0],
            ),
            false,
        ),
        // Verify runs of 3, 2 and 1 rows on three slots, 2 key heads.
        (
            "runs",
            keeping(
                problem(2, 16, 4, 8, &[0, 0, 0, 2, 2, 1], 3, 2),
                &[0, 1, 1, 1, 0, 1],
            ),
            false,
        ),
        // Independent rows, and the pitched route on slots 0, 2, 4.
        ("rows", problem(1, 32, 2, 64, &[3, 0, 2], 4, 0), false),
        ("pitched", problem(1, 32, 2, 33, &[0, 2, 4], 5, 0), true),
        // A key head dim past 128 and up to the kernel's 256, in a chain of 3.
        ("dk 200", problem(1, 200, 1, 36, &[0, 0, 0], 1, 1), false),
        (
            "chain to",
            writing(
                keeping(
                    problem(1, 48, 2, 40, &[1, 1, 1, 1, 1], 3, 1),
                    &[1, 0, 0, 1, 0],
                ),
                &[2, 2, 2, 2, 2],
                3,
            ),
            false,
        ),
        (
            "runs to",
            writing(
                problem(2, 16, 4, 8, &[0, 0, 0, 2, 2, 1], 3, 2),
                &[0, 0, 0, 4, 4, 3],
                5,
            ),
            false,
        ),
        (
            "rows to",
            writing(problem(1, 32, 2, 64, &[3, 0, 2], 4, 0), &[4, 0, 1], 5),
            false,
        ),
        (
            "pitched to",
            writing(problem(1, 32, 2, 33, &[0, 2, 4], 5, 0), &[9, 7, 5], 10),
            true,
        ),
    ]
}

#[test]
fn the_recurrence_equals_its_twin_in_every_row_layout() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let problems = layouts().map(|(name, p, pitched)| {
        let kernel = match pitched {
            true => RECURRENCE_PITCHED,
            false => RECURRENCE,
        };
        (name, p, kernel)
    });
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
        out_slots: None,
        num_slots: 1,
        chain: 1,
        snapshots: true,
        keep: None,
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

/// `gdn::gates_recurrence` (and `_pitched`) from its CUDA source against its twin, and both
/// against `gdn::gates` then `gdn::recurrence` (`_pitched`): the same outputs, snapshots and
/// state, byte for byte, in every row layout (the rule `gdn_gates_recurrence` is
/// `bit_identical`). The gates come from a ba row of wide values, so softplus takes both of
/// its branches (above and below 20) and beta sits near 0 and 1.
#[test]
fn the_gates_folded_into_the_recurrence_give_the_bytes_of_gates_then_recurrence() {
    use solder_model_layers::kernels::gdn::{
        Gates, GatesRecurrence, GATES, GATES_RECURRENCE, GATES_RECURRENCE_PITCHED,
    };
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // The row layouts, and 3 v heads per key head (ba's [b r | a r] groups).
    let problems =
        layouts()
            .into_iter()
            .chain([("ratio 3", problem(2, 16, 6, 16, &[0, 0], 1, 1), false)]);
    for (i, (name, p, pitched)) in problems.enumerate() {
        let seed = 0.75 + i as f32;
        let x = inputs(&p, seed);
        let (rows, nv) = (p.slots.len() as u32, p.nv);
        // b, a in about ±24 (softplus past its threshold of 20 on some), a_log, dt_bias small.
        let wide: Vec<f32> = (0..rows * 2 * nv)
            .map(|i| ((i as f32 + seed) * 0.917).sin() * 24.0)
            .collect();
        let ba = upload(&mut backend, &super::tests_nan::bf16_bytes(&wide));
        let a_log = upload(&mut backend, &bf16_values(nv, seed + 0.1));
        let dt_bias = upload(&mut backend, &bf16_values(nv, seed + 0.2));
        let slots = upload(&mut backend, &i32_bytes(&p.slots));
        let out_slots = upload(&mut backend, &i32_bytes(p.out_slots(0..p.slots.len())));
        let keep = keep_of(&mut backend, &p, 0..p.slots.len());
        // The two launches, then the recurrence reading them.
        let gate_bytes = (rows * nv) as usize * 4;
        let (beta, g) = (
            upload(&mut backend, &vec![0u8; gate_bytes]),
            upload(&mut backend, &vec![0u8; gate_bytes]),
        );
        run(
            &mut backend,
            &Gates {
                ba,
                a_log,
                dt_bias,
                beta,
                g,
                rows,
                nk: p.nk,
                nv,
            }
            .launch(GATES),
        );
        let separate = Inputs {
            mixed: x.mixed.clone(),
            beta: download(&mut backend, beta.ptr, gate_bytes),
            g: download(&mut backend, g.ptr, gate_bytes),
            state: x.state.clone(),
        };
        let state = upload(&mut backend, &x.state);
        let kernel = if pitched {
            RECURRENCE_PITCHED
        } else {
            RECURRENCE
        };
        let want = launch(&mut backend, &p, &separate, state, 0..p.slots.len(), kernel);
        let want_state = download(&mut backend, state.ptr, x.state.len());
        // One launch.
        let out_bytes = (rows * nv * p.dv) as usize * 2;
        let snap_bytes = (rows * nv * p.dk * p.dv) as usize * 4;
        let out = upload(&mut backend, &vec![0x5a; out_bytes]);
        let snapshots = p
            .snapshots
            .then(|| upload(&mut backend, &vec![0xa5; snap_bytes]));
        let state = upload(&mut backend, &x.state);
        let fused = if pitched {
            GATES_RECURRENCE_PITCHED
        } else {
            GATES_RECURRENCE
        };
        let mixed = upload(&mut backend, &x.mixed);
        run(
            &mut backend,
            &GatesRecurrence {
                mixed,
                ba,
                a_log,
                dt_bias,
                state,
                slots,
                out_slots,
                out,
                snapshots,
                keep,
                rows,
                nk: p.nk,
                dk: p.dk,
                nv,
                dv: p.dv,
                num_slots: p.num_slots,
                chain: p.chain,
            }
            .launch(fused),
        );
        let got = (
            download(&mut backend, out.ptr, out_bytes),
            snapshots.map_or_else(Vec::new, |s| download(&mut backend, s.ptr, snap_bytes)),
        );
        assert!(got == want, "{name}: outputs or snapshots differ");
        assert!(
            download(&mut backend, state.ptr, x.state.len()) == want_state,
            "{name}: the state differs"
        );
        assert_ne!(want_state, x.state, "{name}: the state did not move");
        let parity = &backend.emulation().unwrap().report()[fused.as_str()];
        assert!(
            parity.launches > 0 && parity.launches == parity.identical,
            "{name}: {fused:?} {parity:?}"
        );
    }
}

/// A row whose keep flag is 0 leaves its snapshot untouched and changes nothing else: a
/// prompt's chunk run through a verify program writes no snapshots, and its outputs and state
/// are those of the same rows keeping them all.
#[test]
fn a_row_that_keeps_no_snapshot_writes_none_and_changes_nothing_else() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let all = problem(1, 32, 2, 40, &[2, 2, 2, 2], 3, 1);
    let flags = [0, 1, 0, 0];
    let x = inputs(&all, 1.5);
    let run_with = |backend: &mut CpuBackend, p: &Problem| {
        let state = upload(backend, &x.state);
        let (out, snapshots) = launch(backend, p, &x, state, 0..4, RECURRENCE);
        (out, snapshots, download(backend, state.ptr, x.state.len()))
    };
    let (out, snapshots, state) = run_with(&mut backend, &all);
    let (out_k, snapshots_k, state_k) = run_with(&mut backend, &keeping(all, &flags));
    assert!(out_k == out, "the outputs depend on the keep flags");
    assert!(state_k == state, "the state depends on the keep flags");
    let row = snapshots.len() / flags.len();
    for (r, &flag) in flags.iter().enumerate() {
        let (got, kept) = (&snapshots_k[r * row..][..row], &snapshots[r * row..][..row]);
        match flag {
            0 => assert!(got.iter().all(|&b| b == 0xa5), "row {r} wrote its snapshot"),
            _ => assert!(got == kept, "row {r}'s snapshot differs"),
        }
    }
    let parity = &backend.emulation().unwrap().report()[RECURRENCE.as_str()];
    assert_eq!(parity.launches, parity.identical, "{parity:?}");
}

/// `gdn::conv` from its CUDA source against its twin (outputs, history, snapshots) in every
/// row layout: a chain split over block rows (37 rows, 3 blocks of 16 rows; some rows keeping
/// their snapshots), a chain shorter than the history (2 rows, width 4), a history wider than a
/// block row's rows (width 20: blocks of 19 rows), verify runs and independent rows; and a chain's bytes are those of its rows
/// run one launch each, as decode runs them.
#[test]
fn the_conv_equals_its_twin_in_every_row_layout_and_a_chain_its_rows_one_by_one() {
    use solder_model_layers::kernels::gdn::{Conv, CONV};
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // (name, nk, dk, nv, dv, width, slots, num_slots, chain, keep, out slots: None in place)
    type Case = (
        &'static str,
        u32,
        u32,
        u32,
        u32,
        u32,
        Vec<i32>,
        u32,
        u32,
        Option<Vec<i32>>,
        Option<Vec<i32>>,
    );
    let cases: Vec<Case> = vec![
        (
            "chain 37",
            1,
            16,
            2,
            8,
            4,
            vec![1; 37],
            3,
            1,
            Some((0..37).map(|r| (r % 3 == 0) as i32).collect()),
            None,
        ),
        ("chain 2", 2, 8, 2, 8, 4, vec![0; 2], 1, 1, None, None),
        ("width 20", 1, 8, 1, 8, 20, vec![0; 45], 1, 1, None, None),
        (
            "runs",
            1,
            8,
            2,
            8,
            4,
            vec![0, 0, 0, 2, 2, 1],
            3,
            2,
            None,
            None,
        ),
        ("rows", 1, 8, 2, 8, 4, vec![2, 0, 1], 3, 0, None, None),
        // Writing other slots: a chain of 37 over block rows, runs, rows (slot 0 in place).
        (
            "chain 37 to",
            1,
            16,
            2,
            8,
            4,
            vec![1; 37],
            3,
            1,
            None,
            Some(vec![2; 37]),
        ),
        (
            "runs to",
            1,
            8,
            2,
            8,
            4,
            vec![0, 0, 0, 2, 2, 1],
            6,
            2,
            None,
            Some(vec![4, 4, 4, 3, 3, 5]),
        ),
        (
            "rows to",
            1,
            8,
            2,
            8,
            4,
            vec![2, 0, 1],
            5,
            0,
            None,
            Some(vec![3, 0, 4]),
        ),
    ];
    for (i, (name, nk, dk, nv, dv, width, slots, num_slots, chain, keep, to)) in
        cases.into_iter().enumerate()
    {
        let out_slots = to.clone().unwrap_or_else(|| slots.clone());
        let rows = slots.len() as u32;
        let channels = 2 * nk * dk + nv * dv;
        let qkvz_row = nk * (2 * dk + 2 * (nv / nk) * dv);
        let hist = (width - 1) * channels;
        let seed = 0.3 + i as f32;
        let qkvz = bf16_values(rows * qkvz_row, seed);
        let w = upload(&mut backend, &bf16_values(channels * width, seed + 0.1));
        let state0 = bf16_values(num_slots * hist, seed + 0.2);
        let run_rows =
            |backend: &mut CpuBackend, state: Buf, range: std::ops::Range<usize>, chain: u32| {
                let n = range.len();
                let x = upload(
                    backend,
                    &qkvz[range.start * qkvz_row as usize * 2..range.end * qkvz_row as usize * 2],
                );
                let slots_buf = upload(backend, &i32_bytes(&slots[range.clone()]));
                let out_slots_buf = upload(backend, &i32_bytes(&out_slots[range.clone()]));
                let keep_buf = keep
                    .as_ref()
                    .map(|k| upload(backend, &i32_bytes(&k[range.clone()])));
                let out_bytes = n * channels as usize * 2;
                let snap_bytes = n * hist as usize * 2;
                let out = upload(backend, &vec![0x5a; out_bytes]);
                let snapshots = upload(backend, &vec![0xa5; snap_bytes]);
                let launch = Conv {
                    qkvz: x,
                    w,
                    state,
                    slots: slots_buf,
                    out_slots: out_slots_buf,
                    out,
                    snapshots: Some(snapshots),
                    keep: keep_buf,
                    rows: n as u32,
                    nk,
                    dk,
                    nv,
                    dv,
                    kernel: width,
                    num_slots,
                    chain,
                }
                .launch(CONV);
                run(backend, &launch);
                (
                    download(backend, out.ptr, out_bytes),
                    download(backend, snapshots.ptr, snap_bytes),
                )
            };
        let state = upload(&mut backend, &state0);
        let (out, snapshots) = run_rows(&mut backend, state, 0..rows as usize, chain);
        let after = download(&mut backend, state.ptr, state0.len());
        let parity = &backend.emulation().unwrap().report()[CONV.as_str()];
        assert_eq!(parity.launches, parity.identical, "{name}: {parity:?}");
        if name == "dead chain" {
            assert!(after == state0, "{name}: a dead chain wrote the history");
            assert!(
                out.iter().all(|&b| b == 0),
                "{name}: a dead chain's outputs are not 0"
            );
            continue;
        }
        assert!(after != state0, "{name}: the history did not move");
        if to.is_some() {
            // Each slot read and written elsewhere is as it was (its run's later rows too).
            let slot_bytes = hist as usize * 2;
            for (&read, &written) in slots.iter().zip(&out_slots) {
                let (read, written) = (read as usize, written as usize);
                if read != written && !out_slots.contains(&(read as i32)) {
                    let at = read * slot_bytes..(read + 1) * slot_bytes;
                    assert!(
                        after[at.clone()] == state0[at],
                        "{name}: slot {read} written"
                    );
                }
            }
            continue;
        }
        if chain != 1 {
            continue;
        }
        // The same rows one launch each (chain 0, one row): the same outputs and history, and
        // each kept row's snapshot is the history after it.
        let state = upload(&mut backend, &state0);
        let slot_bytes = hist as usize * 2;
        let slot = slots[0] as usize;
        let mut out_1 = Vec::new();
        for r in 0..rows as usize {
            let (o, _) = run_rows(&mut backend, state, r..r + 1, 0);
            out_1.extend(o);
            let kept = keep.as_ref().is_none_or(|k| k[r] != 0);
            let got = &snapshots[r * slot_bytes..][..slot_bytes];
            let history = download(&mut backend, state.ptr, state0.len());
            match kept {
                true => assert!(
                    got == &history[slot * slot_bytes..][..slot_bytes],
                    "{name}: row {r}'s snapshot"
                ),
                false => assert!(
                    got.iter().all(|&b| b == 0xa5),
                    "{name}: row {r} wrote its snapshot"
                ),
            }
        }
        assert!(
            out == out_1,
            "{name}: the chain's outputs differ from its rows one by one"
        );
        assert!(
            after == download(&mut backend, state.ptr, state0.len()),
            "{name}: the chain's history differs from its rows one by one"
        );
    }
}
