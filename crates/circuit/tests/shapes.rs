//! `ProgramShapes`: the canonical order of a serve's programs (draft programs last), the
//! narrowest width for n rows, and the refusal of draft programs without a draft head.

use solder_circuit::{CircuitError, Instance, Mode, ProgramShapes};
use solder_config::{ModelConfig, ServeShape};

/// A tiny llama config of `layers` layers, named `llama-tiny.json`.
fn tiny_llama(layers: usize) -> ModelConfig {
    let json = format!(
        r#"{{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": {layers}, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 300, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_act": "silu"}}"#
    );
    ModelConfig::from_json_str(&json, "llama-tiny.json").expect("a tiny config")
}

fn served_at(max_batch: usize) -> ProgramShapes {
    ProgramShapes::new(&ServeShape::with_max_batch(max_batch).expect("valid")).expect("compiles")
}

#[test]
fn programs_are_listed_decode_then_multi_seq_then_verify_then_prefill_ascending() {
    let shapes = served_at(8);
    let mut expected = vec![(Mode::Decode, 1)];
    expected.extend([2, 4, 8].map(|w| (Mode::MultiSeq, w)));
    expected.extend((2..=8).map(|k| (Mode::Verify, k)));
    expected.extend((2..=8).map(|k| (Mode::Prefill, k)));
    expected.extend([4, 8].map(|w| (Mode::VerifyBatch, w)));
    assert_eq!(shapes.all(), expected.as_slice());
    assert_eq!(shapes.widths(Mode::MultiSeq).collect::<Vec<_>>(), [2, 4, 8]);
    assert!(shapes.contains(Mode::Verify, 5));
    assert!(!shapes.contains(Mode::MultiSeq, 3));
    // One sequence at a time: decode only, no multi-seq program.
    assert_eq!(served_at(1).all()[..1], [(Mode::Decode, 1)]);
    assert_eq!(served_at(1).widths(Mode::MultiSeq).count(), 0);
}

#[test]
fn narrowest_is_the_first_width_that_holds_n_rows() {
    let shapes = served_at(128);
    assert_eq!(shapes.narrowest(Mode::Decode, 1), Some(1));
    assert_eq!(shapes.narrowest(Mode::Decode, 2), None);
    assert_eq!(shapes.narrowest(Mode::MultiSeq, 1), Some(2));
    assert_eq!(shapes.narrowest(Mode::MultiSeq, 2), Some(2));
    assert_eq!(shapes.narrowest(Mode::MultiSeq, 3), Some(4));
    assert_eq!(shapes.narrowest(Mode::MultiSeq, 9), Some(12));
    assert_eq!(shapes.narrowest(Mode::MultiSeq, 97), Some(128));
    assert_eq!(shapes.narrowest(Mode::MultiSeq, 128), Some(128));
    // Above the widest program, and no rows at all: nothing runs it.
    assert_eq!(shapes.narrowest(Mode::MultiSeq, 129), None);
    assert_eq!(shapes.narrowest(Mode::MultiSeq, 0), None);
    assert_eq!(shapes.narrowest(Mode::Draft, 1), None);
    assert_eq!(shapes.widest(Mode::MultiSeq), Some(128));
    assert_eq!(shapes.widest(Mode::VerifyBatch), Some(32));
    assert_eq!(shapes.narrowest(Mode::VerifyBatch, 9), Some(16));
}

#[test]
fn widest_within_is_the_last_width_that_n_rows_fill() {
    let shapes = served_at(8);
    assert_eq!(shapes.widest_within(Mode::Verify, 1), None);
    assert_eq!(shapes.widest_within(Mode::Verify, 5), Some(5));
    assert_eq!(shapes.widest_within(Mode::Verify, 100), Some(8));
    assert_eq!(shapes.widest_within(Mode::MultiSeq, 7), Some(4));
}

/// The programs a speculative step may run keep their snapshots: verify and batched verify up
/// to `speculative_rows` (the default keeps every one of the default shape's); a wider verify
/// program serves prompt chunks only, and no other mode keeps any.
#[test]
fn verify_programs_up_to_speculative_rows_keep_snapshots() {
    let shapes = served_at(128);
    assert!(shapes.keeps_snapshots(Mode::Verify, 8));
    assert!(shapes.keeps_snapshots(Mode::VerifyBatch, 32));
    assert!(!shapes.keeps_snapshots(Mode::Prefill, 8));
    assert!(!shapes.keeps_snapshots(Mode::MultiSeq, 2));
    assert_eq!(shapes.widest_speculative(Mode::Verify), Some(8));
    let chunked = ServeShape {
        verify_widths: vec![2, 4, 8, 64, 512],
        speculative_rows: 8,
        ..ServeShape::default()
    };
    let shapes = ProgramShapes::new(&chunked).expect("valid");
    assert!(shapes.keeps_snapshots(Mode::Verify, 8));
    assert!(!shapes.keeps_snapshots(Mode::Verify, 64));
    assert!(!shapes.keeps_snapshots(Mode::VerifyBatch, 16));
    assert_eq!(shapes.widest_speculative(Mode::Verify), Some(8));
    assert_eq!(shapes.widest_speculative(Mode::VerifyBatch), Some(8));
    assert_eq!(shapes.widest(Mode::Verify), Some(512));
    let none = ServeShape {
        speculative_rows: 0,
        ..ServeShape::default()
    };
    let shapes = ProgramShapes::new(&none).expect("valid");
    assert_eq!(shapes.widest_speculative(Mode::Verify), None);
    assert_eq!(shapes.widest_speculative(Mode::VerifyBatch), None);
}

#[test]
fn draft_programs_follow_verify_at_one_row_and_each_draft_width() {
    let serve = ServeShape {
        draft_widths: vec![1, 2, 8],
        ..ServeShape::with_max_batch(8).expect("valid")
    };
    let shapes = ProgramShapes::new(&serve).expect("draft programs compile");
    assert!(shapes.has_draft());
    let all = shapes.all();
    let first_draft = all.iter().position(|(m, _)| *m == Mode::Draft).unwrap();
    // After every verify and batched-verify width: the last primaries.
    assert_eq!(all[first_draft - 1].0, Mode::VerifyBatch, "{all:?}");
    assert!(all[..first_draft].contains(&(Mode::Verify, 8)));
    assert_eq!(
        all[first_draft..],
        [(Mode::Draft, 1), (Mode::Draft, 2), (Mode::Draft, 8)]
    );
    // One row is always compiled, even when the widths leave it out.
    let serve = ServeShape {
        draft_widths: vec![4],
        ..ServeShape::with_max_batch(8).expect("valid")
    };
    let shapes = ProgramShapes::new(&serve).expect("compiles");
    assert_eq!(shapes.widths(Mode::Draft).collect::<Vec<_>>(), [1, 4]);
    assert!(!served_at(8).has_draft());
}

#[test]
fn draft_widths_are_refused_for_a_family_without_a_draft_head() {
    let serve = ServeShape {
        draft_widths: vec![1, 2],
        ..ServeShape::default()
    };
    // Through an instance, named with the config it was asked for.
    let config = tiny_llama(1);
    let err = Instance::from_config(&config, serve.clone()).expect_err("refused");
    assert!(matches!(err, CircuitError::Unsupported { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("llama-tiny.json") && message.contains("draft_widths"),
        "{message}"
    );
    // A hand-made instance with draft widths but no draft circuit is refused by name too.
    let circuit =
        solder_circuit::build_circuit(&config, "llama-tiny", Default::default()).expect("circuit");
    let err = Instance::new(circuit, serve).expect_err("no draft circuit");
    assert!(err.to_string().contains("draft_widths"), "{err}");
}

#[test]
fn invalid_serve_shapes_are_refused_by_name() {
    let serve = ServeShape {
        multi_seq_ladder: vec![4, 2],
        ..ServeShape::default()
    };
    let err = ProgramShapes::new(&serve).expect_err("unsorted ladder");
    assert!(err.to_string().contains("multi_seq_ladder"), "{err}");
}

#[test]
fn prefill_programs_run_the_circuit_without_its_head_or_are_not_compiled() {
    let config = tiny_llama(2);
    let serve = ServeShape::with_max_batch(8).expect("valid");
    let instance = Instance::from_config(&config, serve.clone()).expect("instance");
    let widths: Vec<usize> = instance.program_shapes().widths(Mode::Prefill).collect();
    assert_eq!(widths, serve.verify_widths);
    let prefill = instance
        .circuit_for(Mode::Prefill)
        .expect("a prefill circuit");
    assert!(prefill.ops.iter().all(|op| op.name != "lm_head"));
    assert!(instance.circuit.ops.iter().any(|op| op.name == "lm_head"));
    assert_eq!(prefill.weights, instance.storage().weights);
    // A circuit with no logits to drop serves no prefill programs, and says why if asked.
    let headless = instance.circuit_for(Mode::Prefill).unwrap().clone();
    let instance = Instance::new(headless, serve).expect("instance");
    assert_eq!(instance.program_shapes().widths(Mode::Prefill).count(), 0);
    let err = instance
        .circuit_for(Mode::Prefill)
        .expect_err("nothing to drop");
    assert!(err.to_string().contains("Logits"), "{err}");
}
