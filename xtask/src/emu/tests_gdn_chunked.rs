//! `gdn::chunked` and `gdn::gates_chunked` (the `gdn_chunked` lever) and their tensor-core
//! forms `gdn::chunked_mma` and `gdn::gates_chunked_mma` (with `tensor_cores`): the CUDA source
//! through the host emulation equal to its twin byte for byte (outputs and state) in every row
//! layout, over several chunks and a short last one, with a head's columns split over several
//! blocks and a key head dim past 128 (the narrower tile); and the twins equal to the
//! row-by-row recurrence up to rounding over long chains, where an error in a chunk's algebra
//! (a pair product, a decay, the substitution, the state update) shows as a difference far
//! above it.

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::kernels::gdn::{
    chunked_mma_config, Chunked, GatesChunked, Recurrence, CHUNKED, CHUNKED_MMA, GATES_CHUNKED,
    GATES_CHUNKED_MMA, RECURRENCE,
};
use solder_model_layers::kernels::Buf;

use super::tests::{bf16_values, download, emulated, run, upload};

/// One chunked problem: geometry, the rows' slots, how they chain.
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
}

impl Problem {
    fn rows(&self) -> u32 {
        self.slots.len() as u32
    }

    fn channels(&self) -> u32 {
        2 * self.nk * self.dk + self.nv * self.dv
    }

    fn state_elems(&self) -> usize {
        (self.num_slots * self.nv * self.dk * self.dv) as usize
    }

    fn out_bytes(&self) -> usize {
        (self.rows() * self.nv * self.dv) as usize * 2
    }
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(|v| v.to_le_bytes()).collect()
}

fn i32_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The uploaded inputs of `p`: mixed rows, beta in (0.05, 0.95), g in [−0.3, 0] (a decay
/// per row in (0.74, 1], so a chain of 40 rows decays its state to about e^−6 at the least).
struct Inputs {
    mixed: Buf,
    beta: Buf,
    g: Buf,
    slots: Buf,
    out_slots: Buf,
    state: Vec<u8>,
}

fn inputs(backend: &mut CpuBackend, p: &Problem, seed: f32) -> Inputs {
    let gates = p.rows() * p.nv;
    Inputs {
        mixed: upload(backend, &bf16_values(p.rows() * p.channels(), seed)),
        beta: upload(
            backend,
            &f32_bytes((0..gates).map(|i| 0.5 + 0.45 * ((i as f32 + seed) * 0.71).sin())),
        ),
        g: upload(
            backend,
            &f32_bytes((0..gates).map(|i| -0.3 * ((i as f32 + seed) * 0.53).cos().abs())),
        ),
        slots: upload(backend, &i32_bytes(&p.slots)),
        out_slots: upload(
            backend,
            &i32_bytes(p.out_slots.as_ref().unwrap_or(&p.slots)),
        ),
        state: f32_bytes((0..p.state_elems()).map(|i| ((i as f32 + seed) * 0.29).sin() * 0.5)),
    }
}

/// Which kernel runs the rows.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    /// `gdn::recurrence` without snapshots.
    Recurrence,
    /// `gdn::chunked`.
    Chunked,
    /// `gdn::chunked_mma`.
    ChunkedMma,
}

/// `form`'s kernel over every row of `p` from the initial state; returns (out, state after).
fn launch(backend: &mut CpuBackend, p: &Problem, x: &Inputs, form: Form) -> (Vec<u8>, Vec<u8>) {
    let state = upload(backend, &x.state);
    let out = upload(backend, &vec![0x5a; p.out_bytes()]);
    let (rows, nk, dk, nv, dv, num_slots, chain) =
        (p.rows(), p.nk, p.dk, p.nv, p.dv, p.num_slots, p.chain);
    let (mixed, beta, g, slots, out_slots) = (x.mixed, x.beta, x.g, x.slots, x.out_slots);
    let chunked = Chunked {
        mixed,
        beta,
        g,
        state,
        slots,
        out_slots,
        out,
        rows,
        nk,
        dk,
        nv,
        dv,
        num_slots,
        chain,
    };
    let launch = match form {
        Form::Chunked => chunked.launch(CHUNKED),
        Form::ChunkedMma => {
            chunked.launch_with(CHUNKED_MMA, chunked_mma_config(rows, dk, nv, dv, chain))
        }
        Form::Recurrence => Recurrence {
            mixed,
            beta,
            g,
            state,
            slots,
            out_slots,
            out,
            snapshots: None,
            keep: None,
            rows,
            nk,
            dk,
            nv,
            dv,
            num_slots,
            chain,
        }
        .launch(RECURRENCE),
    };
    run(backend, &launch);
    (
        download(backend, out.ptr, p.out_bytes()),
        download(backend, state.ptr, x.state.len()),
    )
}

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

/// The row layouts the chunked kernels are held to; the last two write other slots than they
/// read.
fn layouts() -> [(&'static str, Problem); 7] {
    [
        // A prompt's chunk of 37 rows: chunks of 16, 16 and 5; dk 48 (q and k wider than a
        // warp), dv 40 (two column tiles, the second 8 wide), 2 v heads on one key head.
        ("chain", problem(1, 48, 2, 40, &[1; 37], 3, 1)),
        // Runs of 18, 2 and 1 rows on three slots (chain 2), 2 key heads.
        ("runs", {
            let mut slots = vec![0; 18];
            slots.extend([2, 2, 1]);
            problem(2, 16, 4, 8, &slots, 3, 2)
        }),
        // Independent rows: a chunk of one row each.
        ("rows", problem(1, 32, 2, 64, &[3, 0, 2], 4, 0)),
        // A key head dim past 128 (8 columns a block) in a chain of 20.
        ("dk 200", problem(1, 200, 1, 36, &[0; 20], 1, 1)),
        // A chain of exactly one chunk, 3 v heads per key head.
        ("one chunk", problem(2, 16, 6, 16, &[0; 16], 1, 1)),
        (
            "chain to",
            writing(problem(1, 48, 2, 40, &[1; 37], 3, 1), &[2; 37], 3),
        ),
        ("runs to", {
            let mut slots = vec![0; 18];
            slots.extend([2, 2, 1]);
            let mut out = vec![4; 18];
            out.extend([3, 3, 1]);
            writing(problem(2, 16, 4, 8, &slots, 3, 2), &out, 5)
        }),
    ]
}

#[test]
fn the_chunked_recurrence_equals_its_twin_in_every_row_layout() {
    chunked_equals_its_twin(Form::Chunked);
}

#[test]
fn the_tensor_core_chunked_recurrence_equals_its_twin_in_every_row_layout() {
    chunked_equals_its_twin(Form::ChunkedMma);
}

fn chunked_equals_its_twin(form: Form) {
    let kernel = match form {
        Form::ChunkedMma => CHUNKED_MMA,
        _ => CHUNKED,
    };
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    for (i, (name, p)) in layouts().into_iter().enumerate() {
        let x = inputs(&mut backend, &p, 0.25 + i as f32);
        let (_, state) = launch(&mut backend, &p, &x, form);
        assert!(state != x.state, "{name}: the state did not move");
        let parity = &backend.emulation().unwrap().report()[kernel.as_str()];
        assert_eq!(
            parity.launches, parity.identical,
            "{name}: {kernel:?} {parity:?}"
        );
    }
}

/// `gdn::gates_chunked` from its CUDA source against its twin, and both against the gates
/// computed by `gdn::gates_recurrence`'s arithmetic then `gdn::chunked`: one launch, the same
/// bytes. b and a span about ±24, so softplus takes both branches.
#[test]
fn the_gates_folded_into_the_chunks_give_the_bytes_of_gates_then_chunks() {
    gates_folded(Form::Chunked);
}

/// The same for the tensor-core forms: `gdn::gates_chunked_mma` against `gates` then
/// `gdn::chunked_mma`.
#[test]
fn the_gates_folded_into_the_tensor_core_chunks_give_the_bytes_of_gates_then_chunks() {
    gates_folded(Form::ChunkedMma);
}

fn gates_folded(form: Form) {
    use solder_model_layers::kernels::gdn::{Gates, GATES};
    let kernel = match form {
        Form::ChunkedMma => GATES_CHUNKED_MMA,
        _ => GATES_CHUNKED,
    };
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    for (i, (name, p)) in layouts().into_iter().enumerate() {
        let seed = 0.75 + i as f32;
        let x = inputs(&mut backend, &p, seed);
        let (rows, nv) = (p.rows(), p.nv);
        let wide: Vec<f32> = (0..rows * 2 * nv)
            .map(|i| ((i as f32 + seed) * 0.917).sin() * 24.0)
            .collect();
        let ba = upload(&mut backend, &super::tests_nan::bf16_bytes(&wide));
        let a_log = upload(&mut backend, &bf16_values(nv, seed + 0.1));
        let dt_bias = upload(&mut backend, &bf16_values(nv, seed + 0.2));
        run(
            &mut backend,
            &Gates {
                ba,
                a_log,
                dt_bias,
                beta: x.beta,
                g: x.g,
                rows,
                nk: p.nk,
                nv,
            }
            .launch(GATES),
        );
        let want = launch(&mut backend, &p, &x, form);
        let state = upload(&mut backend, &x.state);
        let out = upload(&mut backend, &vec![0x5a; p.out_bytes()]);
        let gates_chunked = GatesChunked {
            mixed: x.mixed,
            ba,
            a_log,
            dt_bias,
            state,
            slots: x.slots,
            out_slots: x.out_slots,
            out,
            rows,
            nk: p.nk,
            dk: p.dk,
            nv,
            dv: p.dv,
            num_slots: p.num_slots,
            chain: p.chain,
        };
        let config = chunked_mma_config(rows, p.dk, nv, p.dv, p.chain);
        let launch = match form {
            Form::ChunkedMma => gates_chunked.launch_with(kernel, config),
            _ => gates_chunked.launch(kernel),
        };
        run(&mut backend, &launch);
        let got = (
            download(&mut backend, out.ptr, p.out_bytes()),
            download(&mut backend, state.ptr, x.state.len()),
        );
        assert!(got == want, "{name}: outputs or state differ");
        let parity = &backend.emulation().unwrap().report()[kernel.as_str()];
        assert_eq!(
            parity.launches, parity.identical,
            "{name}: {kernel:?} {parity:?}"
        );
    }
}

fn bf16s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// max |a − b| / max |b|.
fn relative(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// The twins: over chains of 40 rows (chunks of 16, 16, 8), runs and independent rows, the
/// chunked outputs are the recurrence's to within bf16 rounding and the state to within f32
/// rounding. A wrong decay, pair product or substitution term moves them by far more.
#[test]
fn the_chunked_form_is_the_recurrence_up_to_rounding() {
    chunked_form_is_the_recurrence(Form::Chunked, 1e-2, 1e-5);
}

/// The tensor-core form likewise, to within TF32 rounding of its products' operands (2^-11
/// relative each): the outputs within bf16's, the state within 2e-3 of its largest value.
#[test]
fn the_tensor_core_chunked_form_is_the_recurrence_up_to_tf32_rounding() {
    chunked_form_is_the_recurrence(Form::ChunkedMma, 1e-2, 2e-3);
}

fn chunked_form_is_the_recurrence(form: Form, out_tolerance: f32, state_tolerance: f32) {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(2)).unwrap();
    let cases = [
        ("chain", problem(2, 64, 4, 48, &[0; 40], 1, 1)),
        ("runs", {
            let mut slots = vec![1; 23];
            slots.extend([0; 17]);
            problem(1, 32, 2, 32, &slots, 2, 2)
        }),
        ("rows", problem(1, 32, 2, 32, &[1, 0, 2], 3, 0)),
    ];
    for (i, (name, p)) in cases.into_iter().enumerate() {
        let x = inputs(&mut backend, &p, 1.25 + i as f32);
        let (out_c, state_c) = launch(&mut backend, &p, &x, form);
        let (out_r, state_r) = launch(&mut backend, &p, &x, Form::Recurrence);
        let (out, state) = (
            relative(&bf16s(&out_c), &bf16s(&out_r)),
            relative(&f32s(&state_c), &f32s(&state_r)),
        );
        println!("{form:?} {name}: outputs {out:.3e}, state {state:.3e} of the largest");
        assert!(
            out < out_tolerance,
            "{name}: outputs differ by {out} of the largest"
        );
        assert!(
            state < state_tolerance,
            "{name}: the state differs by {state} of the largest"
        );
        // The outputs' bf16 rounding may hide the difference; the f32 state shows it.
        assert!(
            state_c != state_r,
            "{name}: the same state bytes: not another order?"
        );
    }
}

/// The emulation is not blind to the tensor-core form's rounding: gdn built with the state
/// update reading u·w truncated to TF32 (its top 19 bits, as the mma reads an operand not
/// passed through `cvt.rna`) instead of rounded differs from the twin; the unmutated build
/// does not.
#[test]
fn a_tensor_core_chunk_reading_an_operand_unrounded_differs_from_the_twin() {
    use super::tests_mutation::{assert_caught, build_mutant};
    let edit = (
        "mma_tf32_1688(d, a, to_tf32(m.rhs[(kk + t4) * SP + n0 + g]),",
        "mma_tf32_1688(d, a, __float_as_uint(m.rhs[(kk + t4) * SP + n0 + g]),",
    );
    let dir = build_mutant("gdn", &[edit]);
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let (_, p) = layouts().into_iter().next().unwrap();
    let x = inputs(&mut backend, &p, 0.5);
    let state = upload(&mut backend, &x.state);
    let out = upload(&mut backend, &vec![0x5a; p.out_bytes()]);
    let launch = Chunked {
        mixed: x.mixed,
        beta: x.beta,
        g: x.g,
        state,
        slots: x.slots,
        out_slots: x.out_slots,
        out,
        rows: p.rows(),
        nk: p.nk,
        dk: p.dk,
        nv: p.nv,
        dv: p.dv,
        num_slots: p.num_slots,
        chain: p.chain,
    }
    .launch_with(
        CHUNKED_MMA,
        chunked_mma_config(p.rows(), p.dk, p.nv, p.dv, p.chain),
    );
    assert_caught(&dir, "gdn", &mut backend, &launch);
    std::fs::remove_dir_all(&dir).ok();
}
