//! The fuser on small hand-built circuits and inline rules: what fuses, what is refused for
//! outside readers or cycles, which edges are fused, and the plan digest.

mod common;

use common::*;
use solder_circuit::ir::{Binding, Circuit, TensorId};
use solder_circuit::{FusionPlan, Mode, OpKind, Policy};

#[test]
fn chain_fuses_when_its_intermediate_is_read_only_inside() {
    let c = chain(false);
    let plan = fuse_decode(&c, &rules(NORM_LINEAR));
    assert_eq!(multi(&plan, &c), ["a+b"]);
    let g = group_of(&plan, &c, "a");
    assert_eq!(g.rule, "norm_linear");
    assert_eq!(g.kernels, ["fz::norm_linear"]);
    assert_eq!(g.fused, [tensor(&c, "a.out")]);
    assert_eq!(g.outputs, [tensor(&c, "b.out")]);
    assert_eq!(g.inputs, [tensor(&c, "x")]);
    assert_eq!(
        (plan.kernel_count_original, plan.kernel_count_fused),
        (2, 1)
    );
}

#[test]
fn chain_is_refused_when_a_non_keep_intermediate_is_read_outside() {
    let c = chain(true);
    let plan = fuse_decode(&c, &rules(NORM_LINEAR));
    assert!(multi(&plan, &c).is_empty(), "{:?}", multi(&plan, &c));
    assert!(plan.groups.iter().all(|g| g.fused.is_empty()));
    assert_eq!(plan.kernel_count_fused, 3);
}

#[test]
fn keep_allows_an_outside_reader_and_the_kept_edge_is_a_group_output() {
    let c = chain(true);
    let rule = NORM_LINEAR.replace(
        "{ op = \"rms_norm\" }",
        "{ op = \"rms_norm\", keep = true }",
    );
    let plan = fuse_decode(&c, &rules(&rule));
    assert_eq!(multi(&plan, &c), ["a+b"]);
    let g = group_of(&plan, &c, "a");
    assert!(
        g.fused.is_empty(),
        "a.out is read by c, so it is stored: {:?}",
        g.fused
    );
    assert_eq!(g.outputs, [tensor(&c, "a.out"), tensor(&c, "b.out")]);
    assert_eq!(group_of(&plan, &c, "c").inputs, [tensor(&c, "a.out")]);
}

#[test]
fn sibling_link_groups_q_k_v() {
    let c = qkv();
    let plan = fuse_decode(&c, &rules(QKV));
    assert_eq!(multi(&plan, &c), ["q+k+v"]);
    let g = group_of(&plan, &c, "k");
    assert_eq!(g.inputs, [tensor(&c, "n.out")]);
    assert!(g.fused.is_empty(), "q, k and v are all read outside");
    // Without `sibling`, k does not read q's output, so the chain cannot grow.
    let plan = fuse_decode(&c, &rules(&QKV.replace("link = \"sibling\", ", "")));
    assert!(multi(&plan, &c).is_empty(), "{:?}", multi(&plan, &c));
}

/// a -> b -> c and a -> c; with `detour` false, b reads x instead of a's output.
fn diamond(detour: bool) -> Circuit {
    let mut n = Net::new();
    let x = n.input("x");
    let a = n.op(OpKind::RmsNorm, "a", "norm", &[x]);
    let b = n.op(OpKind::Linear, "b", "mid", &[if detour { a } else { x }]);
    n.op(OpKind::ResidualAdd, "c", "add", &[a, b]);
    n.finish()
}

#[test]
fn chain_that_would_make_a_cycle_is_refused() {
    let rule = "[[rule]]\nid = \"a_c\"\npattern = [{ op = \"rms_norm\", keep = true }, { op = \"residual_add\" }]\nkernel = \"fz::a_c\"\nnumerics = \"bit_identical\"\npriority = 10\n";
    let r = rules(rule);
    let c = diamond(true);
    let plan = fuse_decode(&c, &r);
    assert!(
        multi(&plan, &c).is_empty(),
        "fusing a and c around b is a cycle: {:?}",
        multi(&plan, &c)
    );
    // Control: with b beside the pair rather than between it, the pair fuses.
    let c = diamond(false);
    assert_eq!(multi(&fuse_decode(&c, &r), &c), ["a+c"]);
}

#[test]
fn chain_that_would_make_a_cycle_through_an_earlier_group_is_refused() {
    // p and q form a group first; a -> q and p -> c, so a group {a, c} would sit both
    // before and after {p, q} although no path a -> ... -> c exists between single ops.
    let mut n = Net::new();
    let x = n.input("x");
    let p = n.op(OpKind::Linear, "p", "p", &[x]);
    let a = n.op(OpKind::RmsNorm, "a", "norm", &[x]);
    n.op(OpKind::Linear, "q", "q", &[p, a]);
    n.op(OpKind::ResidualAdd, "c", "add", &[a, p]);
    let c = n.finish();
    let pq = "[{ op = \"linear\", role = \"p\", keep = true }, { op = \"linear\", role = \"q\" }]";
    let ac = "[{ op = \"rms_norm\", keep = true }, { op = \"residual_add\" }]";
    let plan = fuse_decode(&c, &rules(&(rule("pq", pq, 50) + &rule("ac", ac, 10))));
    assert_eq!(
        multi(&plan, &c),
        ["p+q"],
        "{{a, c}} would make a cycle with {{p, q}}"
    );
    // Control: each alone fuses.
    assert_eq!(
        multi(&fuse_decode(&c, &rules(&rule("ac", ac, 10))), &c),
        ["a+c"]
    );
    assert_eq!(
        multi(&fuse_decode(&c, &rules(&rule("pq", pq, 10))), &c),
        ["p+q"]
    );
}

/// Every edge is fused exactly when it is an arena tensor written and only read in one group.
fn assert_fused_edges_are_internal(c: &Circuit, plan: &FusionPlan) {
    for (gi, g) in plan.groups.iter().enumerate() {
        let written: Vec<TensorId> = g
            .nodes
            .iter()
            .flat_map(|n| c.op(*n).outputs.clone())
            .collect();
        for t in written {
            let readers = c.consumers(t);
            let internal = c.tensor(t).binding == Binding::Arena
                && !readers.is_empty()
                && readers
                    .iter()
                    .all(|r| plan.group_of[r.0 as usize].0 as usize == gi);
            let name = &c.tensor(t).name;
            assert_eq!(
                g.fused.contains(&t),
                internal,
                "group {gi}: `{name}` fused?"
            );
            assert_eq!(
                g.outputs.contains(&t),
                !internal,
                "group {gi}: `{name}` kept?"
            );
        }
        assert!(g
            .fused
            .iter()
            .chain(&g.outputs)
            .all(|t| c.producer(*t).is_some_and(|p| g.nodes.contains(&p))));
    }
}

#[test]
fn fused_edges_are_exactly_the_internal_ones() {
    let all = QKV.to_string()
        + NORM_LINEAR
        + &rule("rope_kv", "[{ op = \"rope\" }, { op = \"kv_write\" }]", 5);
    for c in [
        chain(false),
        chain(true),
        qkv(),
        diamond(true),
        diamond(false),
    ] {
        for policy in [Policy::default(), Policy::reference_only()] {
            assert_fused_edges_are_internal(
                &c,
                &fuse_with(&c, &rules(&all), &policy, Mode::Decode, 1),
            );
        }
    }
    let c = qkv();
    let plan = fuse_decode(&c, &rules(&all));
    assert_eq!(
        group_of(&plan, &c, "kv").fused,
        [tensor(&c, "rope.out")],
        "control"
    );
}

#[test]
fn plan_digest_is_stable_and_ignores_rule_ids() {
    let c = qkv();
    let all = QKV.to_string() + NORM_LINEAR;
    let at = |text: &str, mode: Mode, rows: usize| {
        fuse_with(&c, &rules(text), &Policy::default(), mode, rows)
    };
    let a = at(&all, Mode::MultiSeq, 4);
    assert_eq!(a.digest.len(), 64);
    assert_eq!(a.digest, at(&all, Mode::MultiSeq, 4).digest, "two builds");
    assert_eq!(
        a.digest,
        fuse_with(&qkv(), &rules(&all), &Policy::default(), Mode::MultiSeq, 4).digest
    );
    assert_ne!(a.digest, at(&all, Mode::MultiSeq, 8).digest, "other rows");
    let renamed = all.replace("id = \"qkv\"", "id = \"q_k_v_renamed\"");
    let b = at(&renamed, Mode::MultiSeq, 4);
    assert_ne!(
        a.rules_digest, b.rules_digest,
        "the rules digest covers ids"
    );
    assert_eq!(a.digest, b.digest, "the plan digest does not");
    let reference = fuse_with(
        &c,
        &rules(&all),
        &Policy::reference_only(),
        Mode::MultiSeq,
        4,
    );
    assert_ne!(a.digest, reference.digest, "another grouping");
}
