//! Issue 9, integer overflow in the compiler: sizes are computed with checked arithmetic, the
//! builder refuses a tensor, weight or state whose bytes overflow or exceed
//! `MAX_TENSOR_BYTES`, a hand-built config outside the bounds is refused by key, and a config
//! at the bounds plans at the widest rows with exact byte counts.

use std::path::Path;

use solder_circuit::builder::{CircuitBuilder, OpSpec, OutSpec};
use solder_circuit::ir::{
    Binding, Dtype, ModelInput, Shape, StateKind, Tensor, MAX_ROWS, MAX_TENSOR_BYTES,
};
use solder_circuit::{
    build_circuit, Available, BuildOptions, CircuitError, CircuitOptions, ExecutionPlan, Instance,
    Mode, OpKind, Policy, RuleSet,
};
use solder_config::{dim_bound, ModelConfig, ServeShape, MAX_BATCH};

fn tokens(cols: usize) -> OutSpec {
    OutSpec::rows("tokens", Dtype::I32, cols).bound(Binding::Input(ModelInput::Tokens))
}

fn too_large(err: CircuitError, name: &str) {
    assert!(matches!(err, CircuitError::TooLarge { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&format!("`{name}`")), "{message}");
}

#[test]
fn bytes_never_wrap() {
    // hidden_size 2^63 once planned 0-byte buffers: 2^63 * 4 wrapped to 0.
    let tensor = Tensor {
        name: "x".into(),
        dtype: Dtype::F32,
        shape: Shape::rows(&[1 << 63]),
        binding: Binding::Arena,
    };
    assert_eq!(tensor.checked_bytes(1), None);
    assert_eq!(tensor.bytes(1), usize::MAX);
    let rows_overflow = Tensor {
        shape: Shape::rows(&[4]),
        ..tensor
    };
    assert_eq!(rows_overflow.checked_bytes(1 << 62), None);
    assert_eq!(rows_overflow.checked_bytes(8), Some(128));
    let state = StateKind::GdnRecurrent {
        layer: 0,
        heads: 1 << 32,
        key_dim: 1 << 32,
        value_dim: 1,
    };
    assert_eq!(state.checked_slot_bytes(), None);
    assert_eq!(state.slot_bytes(), usize::MAX);
}

#[test]
fn builder_refuses_an_output_too_large() {
    let mut b = CircuitBuilder::new("big", "test", 1);
    let x = b.input(tokens(1));
    for cols in [1usize << 62, MAX_TENSOR_BYTES / MAX_ROWS] {
        let err = b
            .op1(
                OpSpec::new(OpKind::Embedding, format!("embed{cols}"), "embed_tokens").inputs(&[x]),
                OutSpec::rows("h", Dtype::F32, cols),
            )
            .expect_err("too large");
        too_large(err, "h");
    }
    // The largest that fits is accepted.
    b.op1(
        OpSpec::new(OpKind::Embedding, "embed", "embed_tokens").inputs(&[x]),
        OutSpec::rows("h", Dtype::F32, MAX_TENSOR_BYTES / MAX_ROWS / 4),
    )
    .expect("fits");
}

#[test]
fn builder_refuses_an_input_weight_or_state_too_large() {
    let mut b = CircuitBuilder::new("big", "test", 1);
    b.input(tokens(1 << 62));
    too_large(b.finish().expect_err("input too large"), "tokens");

    let mut b = CircuitBuilder::new("big", "test", 1);
    too_large(b.weight("w", &[1 << 40, 1 << 40]).expect_err("weight"), "w");
    let parts = (0..4).map(|e| format!("e{e}")).collect();
    too_large(
        b.weight_stacked("experts", parts, &[1 << 31, 1 << 31])
            .expect_err("stacked"),
        "experts",
    );
    b.state(
        "kv.0",
        StateKind::KvPages {
            layer: 0,
            block_size: 16,
            num_kv_heads: 1 << 40,
            head_dim: 1 << 40,
            dtype: Dtype::Bf16,
        },
    );
    too_large(b.finish().expect_err("state too large"), "kv.0");
}

#[test]
fn rows_above_max_rows_are_refused() {
    for mode in [Mode::MultiSeq, Mode::Verify, Mode::VerifyBatch] {
        assert!(mode.check_rows(MAX_ROWS).is_ok());
        let err = mode.check_rows(MAX_ROWS + 1).expect_err("too many rows");
        assert!(err.to_string().contains("MAX_ROWS"), "{err}");
        assert!(mode.check_rows(1 << 62).is_err());
    }
}

fn llama(dims: &str) -> ModelConfig {
    let text = format!(
        r#"{{"model_type": "llama", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", {dims}}}"#
    );
    ModelConfig::from_json_str(&text, "bounds.json").expect("a config")
}

const TINY: &str = r#""hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
    "max_position_embeddings": 256"#;

#[test]
fn a_hand_built_config_outside_the_bounds_is_refused_by_key() {
    let tiny = llama(TINY);
    type Edit = fn(&mut ModelConfig);
    let cases: [(&str, Edit); 5] = [
        ("hidden_size", |c| c.hidden_size = 1 << 63),
        ("vocab_size", |c| c.vocab_size = 1 << 40),
        ("head_dim", |c| c.head_dim = 1 << 62),
        ("rms_norm_eps", |c| c.rms_norm_eps = 1e-50),
        ("rope_theta", |c| c.rope.theta = f64::NAN),
    ];
    for (key, edit) in cases {
        let mut config = tiny.clone();
        edit(&mut config);
        let err =
            build_circuit(&config, "big", CircuitOptions::default()).expect_err("out of bounds");
        let message = err.to_string();
        assert!(
            message.contains(&format!("`{key}`")) && message.contains("bounds.json"),
            "{message}"
        );
    }
    let err = build_circuit(
        &tiny,
        "big",
        CircuitOptions {
            kv_block_size: 1 << 40,
        },
    )
    .expect_err("block too large");
    assert!(err.to_string().contains("kv_block_size"), "{err}");
}

fn at_bound(key: &str) -> usize {
    dim_bound(key).expect("bounded").max
}

/// Every dim at its bound but the layer count (2, to keep the test fast; 4,096 layers load
/// in `solder-config`'s tests), planned at the widest rows a plan may have.
#[test]
fn a_config_at_the_bounds_plans_without_overflow() {
    let dims = format!(
        r#""hidden_size": {}, "intermediate_size": {}, "num_hidden_layers": 2,
        "num_attention_heads": {}, "num_key_value_heads": {}, "head_dim": {},
        "vocab_size": {}, "max_position_embeddings": {}"#,
        at_bound("hidden_size"),
        at_bound("intermediate_size"),
        at_bound("num_attention_heads"),
        at_bound("num_key_value_heads"),
        at_bound("head_dim"),
        at_bound("vocab_size"),
        at_bound("max_position_embeddings"),
    );
    let config = llama(&dims);
    let serve = ServeShape::with_max_batch(MAX_BATCH).expect("widest batch");
    let instance =
        Instance::from_config_with(&config, serve, CircuitOptions::default()).expect("instance");
    let rules = RuleSet::from_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fusions/FUSIONS.toml"),
    )
    .expect("shipped rules");
    let available = Available::all_kernels(&rules);
    let plan = ExecutionPlan::build_with(
        &instance,
        &rules,
        &available,
        &Policy::default(),
        Mode::MultiSeq,
        MAX_ROWS,
        BuildOptions { verify: true },
    )
    .expect("plans at the bounds");
    // Every buffer's bytes are exact, and the logits (rows * vocab f32) are the largest.
    for buffer in &plan.buffers {
        let tensor = instance.circuit.tensor(buffer.tensor);
        assert_eq!(
            Some(buffer.bytes),
            tensor.checked_bytes(MAX_ROWS),
            "{}",
            buffer.name
        );
        assert!(buffer.bytes > 0, "{}", buffer.name);
    }
    let widest = MAX_ROWS * at_bound("intermediate_size") * 2;
    assert!(
        plan.pool_bytes >= widest,
        "pool {} < {widest}",
        plan.pool_bytes
    );
    assert!(plan.pool_bytes < 1 << 50, "pool {}", plan.pool_bytes);
    for slot in &instance.circuit.weights {
        let bytes = slot.shape.iter().product::<usize>() * 2;
        assert!(bytes <= MAX_TENSOR_BYTES, "{}", slot.name);
    }
}

/// A circuit's fields are public: one edited past the builder's checks is refused by the
/// planner by name (it used to plan 0-byte buffers, or overflow in the placement).
#[test]
fn planner_refuses_a_hand_edited_tensor_too_large() {
    let config = llama(TINY);
    let rules = RuleSet::from_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fusions/FUSIONS.toml"),
    )
    .expect("shipped rules");
    let available = Available::all_kernels(&rules);
    for dims in [vec![1usize << 63], vec![1 << 40, 1 << 30], vec![1 << 47]] {
        let mut instance =
            Instance::from_config_with(&config, ServeShape::default(), CircuitOptions::default())
                .expect("instance");
        let index = instance
            .circuit
            .tensors
            .iter()
            .position(|t| t.binding == Binding::Arena && t.shape.per_row)
            .expect("an arena tensor");
        instance.circuit.tensors[index].shape.dims = dims.clone();
        let name = instance.circuit.tensors[index].name.clone();
        let err = ExecutionPlan::build_with(
            &instance,
            &rules,
            &available,
            &Policy::default(),
            Mode::MultiSeq,
            8,
            BuildOptions { verify: true },
        )
        .expect_err("too large");
        too_large(err, &name);
    }
}
