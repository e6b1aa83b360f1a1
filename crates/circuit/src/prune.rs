//! [`without_logits`]: a step circuit cut down to what a prompt chunk whose logits nobody
//! reads needs (the circuit of [`Mode::Prefill`](crate::Mode::Prefill) programs).
//!
//! What goes: the LM head, and everything only it needs: the final norm (unless an MTP head
//! reads it as the model output `Hidden`) and the last layer's attention and MLP, which feed
//! nothing but the final norm; the last layer's q/k/v projections, rope (q and k in one op)
//! and KV write stay, as does a recurrent layer's state update.
//!
//! Invariants: the result keeps every weight slot and state declaration of the input, with the
//! same ids (so it binds to the same storage), and every op that writes persistent state or a
//! model output other than the logits, or feeds one that does, in the input's order; an op is
//! dropped only when nothing it writes reaches such a write. Ops keep their names, roles and
//! attributes, so the same rules cover them and a kept op computes the same bytes.

use crate::ir::{Binding, Circuit, ModelOutput, NodeId, Op, TensorId};

/// `circuit` without its logits: the ops only the `Logits` output needs (the LM head, a final
/// norm nothing else reads, the last layer's attention and MLP) removed, with their tensors.
/// `None` when the circuit has no logits output, or nothing is left to run without it.
pub fn without_logits(circuit: &Circuit) -> Option<Circuit> {
    let has_logits = circuit
        .tensors
        .iter()
        .any(|t| t.binding == Binding::Output(ModelOutput::Logits));
    if !has_logits {
        return None;
    }
    let live = live_ops(circuit);
    let kept: Vec<&Op> = circuit
        .ops
        .iter()
        .zip(&live)
        .filter(|(_, &l)| l)
        .map(|(op, _)| op)
        .collect();
    if kept.is_empty() {
        return None;
    }
    // Tensors kept: model inputs, and what a kept op reads or writes.
    let mut keep = vec![false; circuit.tensors.len()];
    for (i, t) in circuit.tensors.iter().enumerate() {
        keep[i] = matches!(t.binding, Binding::Input(_));
    }
    for op in &kept {
        for t in op.inputs.iter().chain(&op.outputs) {
            keep[t.0 as usize] = true;
        }
    }
    let mut new_id = vec![None; circuit.tensors.len()];
    let mut tensors = Vec::new();
    for (i, t) in circuit.tensors.iter().enumerate().filter(|(i, _)| keep[*i]) {
        new_id[i] = Some(TensorId(tensors.len() as u32));
        tensors.push(t.clone());
    }
    let remap = |t: &TensorId| new_id[t.0 as usize].expect("a kept op's tensor is kept");
    let mut out = Circuit {
        name: circuit.name.clone(),
        family: circuit.family.clone(),
        num_layers: circuit.num_layers,
        producers: vec![None; tensors.len()],
        consumers: vec![Vec::new(); tensors.len()],
        tensors,
        ops: Vec::new(),
        weights: circuit.weights.clone(),
        states: circuit.states.clone(),
    };
    for &op in &kept {
        let node = NodeId(out.ops.len() as u32);
        let mut op = op.clone();
        op.inputs = op.inputs.iter().map(remap).collect();
        op.outputs = op.outputs.iter().map(remap).collect();
        for t in &op.inputs {
            out.consumers[t.0 as usize].push(node);
        }
        for t in &op.outputs {
            out.producers[t.0 as usize] = Some(node);
        }
        out.ops.push(op);
    }
    Some(out)
}

/// Which ops a step without logits still runs: those writing state or an output other than
/// the logits, and (walking back in execution order) every op feeding a live one.
fn live_ops(circuit: &Circuit) -> Vec<bool> {
    let needed = |t: &TensorId| match circuit.tensor(*t).binding {
        Binding::State(_) => true,
        Binding::Output(output) => output != ModelOutput::Logits,
        Binding::Arena | Binding::Input(_) => false,
    };
    let mut live = vec![false; circuit.ops.len()];
    let mut read = vec![false; circuit.tensors.len()];
    for (i, op) in circuit.ops.iter().enumerate().rev() {
        live[i] = op.outputs.iter().any(|t| needed(t) || read[t.0 as usize]);
        if live[i] {
            for t in &op.inputs {
                read[t.0 as usize] = true;
            }
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::{build_circuit, CircuitOptions};
    use solder_config::ModelConfig;

    fn circuit_of(json: &str) -> Circuit {
        let config = ModelConfig::from_json_str(json, "test.json").unwrap();
        build_circuit(&config, "test", CircuitOptions::default()).unwrap()
    }

    const LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": false}"#;

    #[test]
    fn the_head_and_what_only_the_head_needs_go_and_every_state_write_stays() {
        let full = circuit_of(LLAMA);
        let pruned = without_logits(&full).unwrap();
        let names = |c: &Circuit| c.ops.iter().map(|o| o.name.clone()).collect::<Vec<_>>();
        let (full_names, kept) = (names(&full), names(&pruned));
        let dropped: Vec<&str> = full_names
            .iter()
            .filter(|n| !kept.contains(n))
            .map(String::as_str)
            .collect();
        // The last layer's attention and MLP feed nothing but the head; its q/k/v
        // projections, rope and KV write stay (the next chunk attends over them).
        for name in [
            "lm_head",
            "final_norm",
            "l1.attention",
            "l1.o_proj",
            "l1.down_proj",
        ] {
            assert!(dropped.contains(&name), "{name} kept: dropped {dropped:?}");
        }
        for name in ["l1.k_proj", "l1.v_proj", "l1.kv_write", "l0.down_proj"] {
            assert!(
                kept.iter().any(|k| k == name),
                "{name} dropped: {dropped:?}"
            );
        }
        assert!(dropped.iter().all(|n| !n.starts_with("l0.")), "{dropped:?}");
        assert!(pruned
            .tensors
            .iter()
            .all(|t| t.binding != Binding::Output(ModelOutput::Logits)));
        // Same storage: weight slots and states, ids unchanged.
        assert_eq!(pruned.weights, full.weights);
        assert_eq!(pruned.states, full.states);
    }

    #[test]
    fn producers_and_consumers_are_rebuilt_for_the_new_ids() {
        let pruned = without_logits(&circuit_of(LLAMA)).unwrap();
        for (n, op) in pruned.ops.iter().enumerate() {
            for t in &op.outputs {
                assert_eq!(pruned.producer(*t), Some(NodeId(n as u32)), "{}", op.name);
            }
            for t in &op.inputs {
                assert!(pruned.consumers(*t).contains(&NodeId(n as u32)));
                // Topological: every input is a model input or written earlier.
                assert!(pruned.producer(*t).is_none_or(|p| (p.0 as usize) < n));
            }
        }
        for (i, t) in pruned.tensors.iter().enumerate() {
            let written = pruned.producers[i].is_some();
            assert_eq!(
                written,
                !matches!(t.binding, Binding::Input(_)),
                "{}",
                t.name
            );
        }
    }

    #[test]
    fn a_final_norm_an_mtp_head_reads_stays() {
        let config = ModelConfig::from_json_str(LLAMA, "test.json").unwrap();
        let full =
            crate::families::build_target_with_hidden(&config, "test", CircuitOptions::default())
                .unwrap();
        let pruned = without_logits(&full).unwrap();
        assert!(pruned.ops.iter().any(|o| o.name == "final_norm"));
        assert!(pruned.ops.iter().all(|o| o.name != "lm_head"));
        // The final norm reads the last layer's output: all of it stays.
        assert_eq!(pruned.ops.len() + 1, full.ops.len());
    }

    #[test]
    fn a_circuit_without_logits_has_nothing_to_prune() {
        let full = circuit_of(LLAMA);
        let pruned = without_logits(&full).unwrap();
        assert_eq!(without_logits(&pruned), None);
    }
}
