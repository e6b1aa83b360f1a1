//! Which unused checkpoint tensors loading tolerates, by whole name (issue 9): rotary
//! `inv_freq` buffers only at the names transformers writes, qwen3_next's `mtp.*` only for
//! that family; and host weight slots length-checked before upload.

mod exec_support;

use exec_support::{
    backend, boot, config, f32_le, instance, roomy_kv, write_safetensors, RawTensor, TempDir,
    TINY_LLAMA, TINY_NEXT,
};
use half::bf16;
use safetensors::Dtype;
use solder_circuit::ir::Circuit;
use solder_circuit::Policy;
use solder_model_layers::weights::Unused;
use solder_model_layers::{
    Checkpoint, CircuitExec, ExecError, HostWeights, WeightSource, WeightsError,
};

/// Every slot of `json`'s circuit as a checkpoint tensor (stacked slots as their parts).
fn model(json: &str) -> (Circuit, Vec<RawTensor>) {
    let circuit = instance(&config(json)).circuit;
    let weights = HostWeights::random(&circuit, 4);
    let mut tensors = Vec::new();
    for (slot, values) in circuit.weights.iter().zip(&weights.slots) {
        if slot.parts.is_empty() {
            tensors.push(raw(&slot.name, slot.shape.clone(), values));
        } else {
            let shape = slot.shape[1..].to_vec();
            let per: usize = shape.iter().product::<usize>() * 2;
            for (part, chunk) in slot.parts.iter().zip(values.chunks(per)) {
                tensors.push(raw(part, shape.clone(), chunk));
            }
        }
    }
    (circuit, tensors)
}

fn raw(name: &str, shape: Vec<usize>, bytes: &[u8]) -> RawTensor {
    RawTensor {
        name: name.into(),
        dtype: Dtype::BF16,
        shape,
        data: bytes.to_vec(),
    }
}

fn extra(name: &str) -> RawTensor {
    RawTensor {
        name: name.into(),
        dtype: Dtype::F32,
        shape: vec![4],
        data: f32_le(&[1.0; 4]),
    }
}

/// What loading makes of `tensors` plus `extras`: the tolerated unused tensors, or the error.
fn classify(
    circuit: &Circuit,
    tensors: &[RawTensor],
    extras: &[&str],
) -> Result<Unused, WeightsError> {
    let dir = TempDir::new("names");
    let all: Vec<RawTensor> = tensors
        .iter()
        .map(|t| RawTensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            data: t.data.clone(),
        })
        .chain(extras.iter().map(|name| extra(name)))
        .collect();
    write_safetensors(&dir.path().join("model.safetensors"), &all);
    let checkpoint = Checkpoint::open(dir.path())?;
    let unused = Unused::of(circuit, &checkpoint)?;
    HostWeights::load(circuit, &checkpoint)?;
    Ok(unused)
}

fn assert_refused(result: Result<Unused, WeightsError>, name: &str) {
    match result {
        Err(e @ WeightsError::Unexpected { .. }) => {
            assert!(e.to_string().contains(name), "{e}");
            let WeightsError::Unexpected { tensor, .. } = e else {
                unreachable!()
            };
            assert_eq!(tensor, name);
        }
        Err(other) => panic!("`{name}`: expected Unexpected, got {other}"),
        Ok(unused) => panic!("`{name}` was tolerated: {unused:?}"),
    }
}

#[test]
fn inv_freq_is_tolerated_only_at_the_names_transformers_writes() {
    let (circuit, tensors) = model(TINY_LLAMA);
    let unused = classify(
        &circuit,
        &tensors,
        &[
            "model.rotary_emb.inv_freq",
            "model.layers.0.self_attn.rotary_emb.inv_freq",
            "model.layers.1.self_attn.rotary_emb.inv_freq",
        ],
    )
    .expect("transformers' names load");
    assert_eq!(unused.derived, 3);
    for name in [
        "evil.rotary_emb.inv_freq",
        "rotary_emb.inv_freq",
        "xmodel.rotary_emb.inv_freq",
        "model.layers.2.self_attn.rotary_emb.inv_freq", // two layers: 0 and 1
        "model.layers.01.self_attn.rotary_emb.inv_freq",
        "model.layers.-1.self_attn.rotary_emb.inv_freq",
        "model.layers.0.mlp.rotary_emb.inv_freq",
        "model.layers.0.self_attn.rotary_emb.inv_freq.extra",
    ] {
        assert_refused(classify(&circuit, &tensors, &[name]), name);
    }
}

const MTP: &[&str] = &[
    "mtp.fc.weight",
    "mtp.norm.weight",
    "mtp.layers.0.self_attn.q_proj.weight",
];

#[test]
fn qwen3_next_ignores_its_mtp_tensors_and_counts_them() {
    let (circuit, tensors) = model(TINY_NEXT);
    let unused = classify(&circuit, &tensors, MTP).expect("mtp.* is ignored for qwen3_next");
    assert_eq!(unused.mtp, MTP.len());
    // Only the `mtp.` prefix: other unexpected names are still refused.
    for name in ["model.mtp.fc.weight", "mtpx.fc.weight"] {
        assert_refused(classify(&circuit, &tensors, &[name]), name);
    }
}

#[test]
fn other_families_refuse_mtp_tensors_by_name() {
    let (circuit, tensors) = model(TINY_LLAMA);
    assert_refused(classify(&circuit, &tensors, &MTP[..1]), MTP[0]);
}

fn build_with(slots: Vec<Vec<u8>>) -> Result<CircuitExec, ExecError> {
    let mut backend = backend();
    CircuitExec::build(
        &mut backend,
        boot(
            config(TINY_LLAMA),
            Policy::default(),
            WeightSource::Host(HostWeights { slots }),
            roomy_kv(),
        ),
    )
}

#[test]
fn host_slots_of_the_wrong_length_are_refused_before_upload() {
    let circuit = instance(&config(TINY_LLAMA)).circuit;
    let good = HostWeights::random(&circuit, 6);
    good.check_lengths(&circuit).expect("random weights fit");
    for delta in [1isize, -1] {
        let mut slots = good.slots.clone();
        let expected = slots[0].len();
        if delta > 0 {
            slots[0].extend(bf16::ONE.to_le_bytes()); // would spill into the next slot
        } else {
            slots[0].truncate(expected - 2);
        }
        match build_with(slots) {
            Err(ExecError::Weights(WeightsError::SlotLength {
                tensor,
                found,
                expected: want,
                ..
            })) => {
                assert_eq!(tensor, circuit.weights[0].name);
                assert_eq!(found, expected.wrapping_add_signed(2 * delta));
                assert_eq!(want, expected);
            }
            Err(other) => panic!("expected SlotLength, got {other}"),
            Ok(_) => panic!("a slot {delta:+} elements long was uploaded"),
        }
    }
}
