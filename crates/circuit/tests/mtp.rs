//! The MTP draft head's circuit (qwen3_next): it extends the target's weight slots and state
//! declarations, names the checkpoint's `mtp.*` tensors, reads the target's kept final hidden
//! rows after the token's embedding (concatenation order), and plans in every draft width.

use std::path::PathBuf;

use solder_circuit::ir::{Binding, ModelInput, ModelOutput, StateKind};
use solder_circuit::{
    Available, BuildOptions, ExecutionPlan, Instance, Mode, OpKind, Policy, RuleSet,
};
use solder_config::{ModelConfig, ServeShape};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn next_80b(draft_widths: &[usize]) -> Instance {
    let config =
        ModelConfig::from_file(&root().join("tests/fixtures/configs/qwen3-next-80b-a3b.json"))
            .expect("config");
    let serve = ServeShape {
        draft_widths: draft_widths.to_vec(),
        ..ServeShape::with_max_batch(8).expect("serve")
    };
    Instance::from_config(&config, serve).expect("instance")
}

#[test]
fn the_draft_circuit_extends_the_target_and_names_the_mtp_tensors() {
    let instance = next_80b(&[1, 4]);
    let (target, draft) = (&instance.circuit, instance.draft.as_ref().expect("draft"));
    // The target's slots and states first, with the same ids.
    assert_eq!(draft.weights[..target.weights.len()], target.weights[..]);
    assert_eq!(draft.states[..target.states.len()], target.states[..]);
    assert!(std::ptr::eq(instance.storage(), draft));
    let names: Vec<&str> = draft.weights[target.weights.len()..]
        .iter()
        .map(|w| w.name.as_str())
        .collect();
    for name in [
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.fc.weight",
        "mtp.layers.0.input_layernorm.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.self_attn.q_norm.weight",
        "mtp.layers.0.post_attention_layernorm.weight",
        "mtp.layers.0.mlp.gate.weight",
        "mtp.layers.0.mlp.experts.*.gate_proj.weight",
        "mtp.layers.0.mlp.shared_expert.down_proj.weight",
        "mtp.layers.0.mlp.shared_expert_gate.weight",
        "mtp.norm.weight",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    // Only the head's own tensors are new: the embedding and the LM head are the target's.
    assert!(names.iter().all(|n| n.starts_with("mtp.")), "{names:?}");
    let fc = draft
        .weights
        .iter()
        .find(|w| w.name == "mtp.fc.weight")
        .unwrap();
    assert_eq!(fc.shape, [2048, 4096]);
    let experts = draft
        .weights
        .iter()
        .find(|w| w.name == "mtp.layers.0.mlp.experts.*.up_proj.weight")
        .unwrap();
    assert_eq!(experts.parts.len(), 512);
    assert_eq!(
        experts.parts[7],
        "mtp.layers.0.mlp.experts.7.up_proj.weight"
    );
    // Its own KV cache: one more full-attention layer, numbered after the target's 48.
    let extra = &draft.states[target.states.len()..];
    assert_eq!(extra.len(), 1);
    assert!(matches!(
        extra[0].kind,
        StateKind::KvPages { layer: 48, .. }
    ));
}

#[test]
fn the_head_reads_the_embedding_then_the_kept_hidden_rows() {
    let instance = next_80b(&[1]);
    let draft = instance.draft.as_ref().unwrap();
    let pre = draft
        .ops
        .iter()
        .find(|op| op.kind == OpKind::MtpPreFc)
        .expect("pre-fc op");
    let binding = |i: usize| draft.tensor(pre.inputs[i]).binding;
    let embed = draft.producer(pre.inputs[0]).map(|n| draft.op(n).kind);
    assert_eq!(embed, Some(OpKind::Embedding), "the embedding first");
    assert_eq!(binding(1), Binding::Input(ModelInput::Hidden));
    let outputs: Vec<Binding> = draft.tensors.iter().map(|t| t.binding).collect();
    assert!(outputs.contains(&Binding::Output(ModelOutput::DraftHidden)));
    assert!(outputs.contains(&Binding::Output(ModelOutput::Logits)));
    // The target keeps its final norm's output only when a draft head is served.
    let kept = |i: &Instance| {
        i.circuit
            .tensors
            .iter()
            .any(|t| t.binding == Binding::Output(ModelOutput::Hidden))
    };
    assert!(kept(&instance));
    assert!(!kept(&next_80b(&[])));
    assert!(next_80b(&[]).circuit_for(Mode::Draft).is_err());
}

#[test]
fn every_program_of_a_draft_serve_plans_and_verifies() {
    let instance = next_80b(&[4]);
    let rules = RuleSet::from_file(&root().join("fusions/FUSIONS.toml")).expect("rules");
    let available = Available::all_kernels(&rules);
    for (mode, rows) in instance.shapes() {
        let plan = ExecutionPlan::build_with(
            &instance,
            &rules,
            &available,
            &Policy::default(),
            mode,
            rows,
            BuildOptions { verify: true },
        )
        .unwrap_or_else(|e| panic!("{mode} at {rows}: {e}"));
        if mode == Mode::Draft {
            // The head's one layer, fused like the target's full-attention layers.
            assert!(plan.launches_per_layer > 0, "{mode} {rows}");
            assert!(plan.kernel_count_fused < plan.kernel_count_original);
        }
    }
    assert_eq!(
        instance
            .shapes()
            .iter()
            .filter(|(m, _)| *m == Mode::Draft)
            .count(),
        2
    );
}
