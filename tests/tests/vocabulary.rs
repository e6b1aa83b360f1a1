//! The rules' vocabulary stays true: every role the families give their ops is in
//! `families::ROLES`, and every listed role is given by some shipped config's circuit (the
//! qwen3_next configs' MTP draft circuits included).

use std::collections::BTreeSet;

use solder_circuit::families::ROLES;

#[test]
fn roles_are_exactly_those_the_shipped_circuits_use() {
    let mut used = BTreeSet::new();
    for name in solder_tests::DENSE_CONFIGS
        .iter()
        .chain(solder_tests::MOE_CONFIGS)
    {
        let instance = solder_tests::load_instance(name).unwrap();
        used.extend(instance.circuit.ops.iter().map(|op| op.role.clone()));
        if instance.circuit.family == "qwen3_next" {
            let with_draft = solder_tests::load_instance_with_draft(name, &[1]).unwrap();
            let draft = with_draft
                .draft
                .as_ref()
                .expect("a qwen3_next draft circuit");
            used.extend(draft.ops.iter().map(|op| op.role.clone()));
        }
    }
    let listed: BTreeSet<String> = ROLES.iter().map(|r| r.to_string()).collect();
    let unlisted: Vec<_> = used.difference(&listed).collect();
    let unused: Vec<_> = listed.difference(&used).collect();
    assert!(
        unlisted.is_empty(),
        "roles missing from families::ROLES: {unlisted:?}"
    );
    assert!(
        unused.is_empty(),
        "families::ROLES lists roles no circuit uses: {unused:?}"
    );
}

#[test]
fn the_shipped_rules_use_only_the_vocabulary() {
    // `load_rules` parses FUSIONS.toml with solder's vocabulary, which refuses unknown words.
    let rules = solder_tests::load_rules().unwrap();
    assert!(rules
        .rules
        .iter()
        .any(|r| r.requires.iter().any(|c| c == "route:gdn_even_pitch")));
}
