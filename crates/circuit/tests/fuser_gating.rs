//! The fuser's rule selection: priority then id, reference-only builds, available kernels,
//! capabilities, levers, modes and rows, and what happens when no rule covers an op.

mod common;

use common::*;
use solder_circuit::{fuse, Available, CircuitError, Mode, OpKind, Policy, RuleSet};

#[test]
fn priority_then_id_decides_between_overlapping_rules() {
    let c = chain(false);
    let pat = "[{ op = \"rms_norm\" }, { op = \"linear\" }]";
    let winner = |extra: &str| {
        group_of(&fuse_decode(&c, &rules(extra)), &c, "a")
            .rule
            .clone()
    };
    assert_eq!(
        winner(&(rule("zeta", pat, 20) + &rule("alpha", pat, 10))),
        "zeta"
    );
    assert_eq!(
        winner(&(rule("alpha", pat, 10) + &rule("zeta", pat, 20))),
        "zeta"
    );
    assert_eq!(
        winner(&(rule("zeta", pat, 10) + &rule("alpha", pat, 10))),
        "alpha"
    );
    // A higher-priority rule takes the shared node even when a lower one would cover more.
    let mut n = Net::new();
    let x = n.input("x");
    let a = n.op(OpKind::RmsNorm, "a", "norm", &[x]);
    let b = n.op(OpKind::Linear, "b", "proj", &[a]);
    n.op(OpKind::ResidualAdd, "d", "add", &[x, b]);
    let c = n.finish();
    let lin_add = "[{ op = \"linear\" }, { op = \"residual_add\" }]";
    let three = "[{ op = \"rms_norm\" }, { op = \"linear\" }, { op = \"residual_add\" }]";
    let plan = fuse_decode(
        &c,
        &rules(&(rule("big", three, 5) + &rule("lin_add", lin_add, 50))),
    );
    assert_eq!(multi(&plan, &c), ["b+d"]);
    let plan = fuse_decode(
        &c,
        &rules(&(rule("big", three, 60) + &rule("lin_add", lin_add, 50))),
    );
    assert_eq!(multi(&plan, &c), ["a+b+d"]);
}

#[test]
fn reference_only_applies_only_reference_rules() {
    let c = qkv();
    let r = rules(&(QKV.to_string() + NORM_LINEAR));
    assert!(
        !multi(&fuse_decode(&c, &r), &c).is_empty(),
        "control: all rules fuse something"
    );
    let plan = fuse_with(&c, &r, &Policy::reference_only(), Mode::Decode, 1);
    assert!(multi(&plan, &c).is_empty());
    assert!(
        plan.groups.iter().all(|g| g.rule.starts_with("ref_")),
        "{:?}",
        plan.groups
    );
    assert_eq!(plan.kernel_count_fused, c.ops.len());
}

#[test]
fn rule_whose_kernel_is_missing_is_refused_unless_the_policy_skips_it() {
    let c = chain(false);
    let r = rules(NORM_LINEAR);
    let mut available = Available::all_kernels(&r);
    assert!(available.kernels.remove("fz::norm_linear"));
    // Refused by default, naming the rule and the kernel: a dropped fusion costs launches.
    let err = fuse(&c, &r, &available, &Policy::default(), Mode::Decode, 1).expect_err("missing");
    assert!(
        matches!(&err, CircuitError::MissingKernel { rule, kernel, .. }
            if kernel == "fz::norm_linear" && !rule.is_empty()),
        "{err}"
    );
    assert!(err.to_string().contains("fz::norm_linear"), "{err}");
    let skip = Policy {
        skip_missing_kernels: true,
        ..Policy::default()
    };
    let plan = fuse(&c, &r, &available, &skip, Mode::Decode, 1).expect("fuse");
    assert!(multi(&plan, &c).is_empty());
    // A rule that does not apply (reference-only build) needs no kernel.
    let reference = Policy::reference_only();
    fuse(&c, &r, &available, &reference, Mode::Decode, 1).expect("reference routing");
    // Without the reference kernel of an op, nothing covers it.
    assert!(available.kernels.remove("ref::linear"));
    let err = fuse(&c, &r, &available, &skip, Mode::Decode, 1).expect_err("uncovered");
    assert!(
        matches!(&err, CircuitError::Uncovered { node, .. } if node == "b"),
        "{err}"
    );
}

#[test]
fn unknown_capability_or_role_is_refused_by_name() {
    let typo = with_line(NORM_LINEAR, "requires = [\"route:gdn_even_pich\"]");
    let err = RuleSet::from_toml_str(&format!("schema = 1\n{typo}"), "inline.toml")
        .expect_err("a misspelled capability");
    let message = err.to_string();
    assert!(
        message.contains("route:gdn_even_pich") && message.contains("capability"),
        "{message}"
    );
    assert!(
        message.contains("route:gdn_even_pitch"),
        "lists the known: {message}"
    );
    let role = "schema = 1\n[[rule]]\nid = \"r\"\npattern = [{ op = \"linear\", role = \"q_prj\" }]\nkernel = \"gemv::linear\"\nnumerics = \"reference\"\n";
    let err = RuleSet::from_toml_str(role, "inline.toml").expect_err("a misspelled role");
    let message = err.to_string();
    assert!(
        message.contains("`q_prj`") && message.contains("inline.toml:3"),
        "{message}"
    );
    // The shipped vocabulary knows the real words.
    let fine = role.replace("q_prj", "q_proj");
    RuleSet::from_toml_str(&fine, "inline.toml").expect("a known role");
}

#[test]
fn requires_capability_gates_a_rule() {
    let c = chain(false);
    let r = rules(&with_line(NORM_LINEAR, "requires = [\"tma\"]"));
    let plain = Available::all_kernels(&r);
    let plan = fuse(&c, &r, &plain, &Policy::default(), Mode::Decode, 1).unwrap();
    assert!(multi(&plan, &c).is_empty(), "no `tma` capability");
    let tma = plain.clone().with_capability("tma");
    let plan = fuse(&c, &r, &tma, &Policy::default(), Mode::Decode, 1).unwrap();
    assert_eq!(multi(&plan, &c), ["a+b"]);
}

fn fast_exp(on: bool, policy: Policy) -> Policy {
    let mut policy = policy;
    policy.levers.set("fast_exp", on).expect("a known lever");
    policy
}

#[test]
fn when_levers_gate_a_rule() {
    let c = chain(false);
    let fuses = |rule_text: &str, on: bool| {
        let plan = fuse_with(
            &c,
            &rules(rule_text),
            &fast_exp(on, Policy::default()),
            Mode::Decode,
            1,
        );
        !multi(&plan, &c).is_empty()
    };
    let needs_on = with_line(NORM_LINEAR, "when = { fast_exp = true }");
    let needs_off = with_line(NORM_LINEAR, "when = { fast_exp = false }");
    assert!(!fuses(&needs_on, false) && fuses(&needs_on, true));
    assert!(fuses(&needs_off, false) && !fuses(&needs_off, true));
}

#[test]
fn differs_rule_applies_only_with_its_lever_on() {
    let c = chain(false);
    let r = rules(&NORM_LINEAR.replace(
        "numerics = \"bit_identical\"",
        "numerics = { differs = \"fast_exp\", tolerance = 0.01 }",
    ));
    let fuses =
        |policy: Policy| !multi(&fuse_with(&c, &r, &policy, Mode::Decode, 1), &c).is_empty();
    assert!(!fuses(Policy::default()), "lever off");
    assert!(fuses(fast_exp(true, Policy::default())), "lever on");
    assert!(
        !fuses(fast_exp(true, Policy::reference_only())),
        "reference-only, lever on"
    );
}

#[test]
fn modes_and_rows_gate_a_rule() {
    let c = chain(false);
    let r = rules(&with_line(
        NORM_LINEAR,
        "modes = [\"multi_seq\", \"verify\"]\nrows = [4, 8]",
    ));
    let fuses = |mode: Mode, rows: usize| {
        !multi(&fuse_with(&c, &r, &Policy::default(), mode, rows), &c).is_empty()
    };
    let expect = [
        (Mode::Decode, 1, false),
        (Mode::MultiSeq, 2, false),
        (Mode::MultiSeq, 3, false),
        (Mode::MultiSeq, 4, true),
        (Mode::MultiSeq, 8, true),
        (Mode::MultiSeq, 9, false),
        (Mode::MultiSeq, 12, false),
        (Mode::Verify, 4, true),
        (Mode::VerifyBatch, 4, false),
    ];
    for (mode, rows, want) in expect {
        assert_eq!(fuses(mode, rows), want, "{mode} at {rows} rows");
    }
}

#[test]
fn op_with_no_reference_rule_is_uncovered_and_named() {
    let c = chain(false);
    let text = "schema = 1\n[[rule]]\nid = \"n\"\npattern = [{ op = \"rms_norm\" }]\nkernel = \"ref::n\"\nnumerics = \"reference\"\n";
    let r = RuleSet::from_toml_str(text, "inline.toml").unwrap();
    let err = fuse(
        &c,
        &r,
        &Available::all_kernels(&r),
        &Policy::default(),
        Mode::Decode,
        1,
    )
    .expect_err("b has no rule");
    match &err {
        CircuitError::Uncovered {
            node,
            op,
            role,
            mode,
            rows,
        } => {
            assert_eq!(
                (node.as_str(), op.as_str(), role.as_str()),
                ("b", "linear", "proj")
            );
            assert_eq!((mode.as_str(), *rows), ("decode", 1));
        }
        other => panic!("expected Uncovered, got {other:?}"),
    }
    let m = err.to_string();
    assert!(m.contains("`b`") && m.contains("linear"), "{m}");
}

#[test]
fn decode_at_two_rows_is_refused() {
    let c = chain(false);
    let r = rules("");
    let err = fuse(
        &c,
        &r,
        &Available::all_kernels(&r),
        &Policy::default(),
        Mode::Decode,
        2,
    )
    .expect_err("decode runs one row");
    assert!(
        matches!(err, CircuitError::BadRows { rows: 2, .. }),
        "{err:?}"
    );
}
