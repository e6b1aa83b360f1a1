//! Robustness of the rules loader: no input makes it panic, the digest is canonical, and a
//! missing file is named.

use std::path::{Path, PathBuf};

use solder_circuit::{CircuitError, RuleSet};

const SOURCE: &str = "bad.toml";

const REF_BODY: &str =
    "pattern = [{ op = \"rms_norm\" }]\nkernel = \"norm::rms_norm\"\nnumerics = \"reference\"";

fn shipped_rules_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fusions/FUSIONS.toml")
}

fn shipped_text() -> String {
    std::fs::read_to_string(shipped_rules_path()).expect("fusions/FUSIONS.toml")
}

/// Parses `text`, turning a panic into a failure that shows what was fed in.
fn parses_or_errs(text: &str, what: &str) -> bool {
    match std::panic::catch_unwind(|| RuleSet::from_toml_str(text, SOURCE)) {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            let m = e.to_string();
            assert!(
                m.starts_with(SOURCE),
                "{what}: error without the file name: {m}"
            );
            false
        }
        Err(_) => panic!("{what}: the parser panicked on:\n{text}"),
    }
}

#[test]
fn no_truncation_of_the_shipped_rules_panics() {
    let text = shipped_text();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let (mut ok, mut refused) = (0, 0);
    for n in 0..=lines.len() {
        let prefix: String = lines[..n].concat();
        if parses_or_errs(&prefix, &format!("prefix of {n} lines")) {
            ok += 1
        } else {
            refused += 1
        }
    }
    // Byte truncations that cut a line, a string or a multi-byte character's neighbours.
    for cut in (0..text.len())
        .step_by(37)
        .filter(|c| text.is_char_boundary(*c))
    {
        parses_or_errs(&text[..cut], &format!("prefix of {cut} bytes"));
    }
    assert!(
        ok > 0 && refused > 0,
        "expected both accepted and refused prefixes ({ok}, {refused})"
    );
    assert!(
        parses_or_errs(&text, "the whole file"),
        "the shipped rules must parse"
    );
}

#[test]
fn no_mutation_of_the_shipped_rules_panics() {
    let text = shipped_text();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    for skip in 0..lines.len() {
        let without: String = lines
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .map(|(_, l)| *l)
            .collect();
        parses_or_errs(&without, &format!("line {} deleted", skip + 1));
    }
    let swaps = [
        ("\"reference\"", "\"referenc\""),
        ("priority = 300", "priority = \"high\""),
        ("keep = true", "keep = 1"),
        ("::", ":"),
        ("\"sibling\"", "\"consumer\""),
        ("= [", "= [["),
        ("}]", "}"),
        ("[[rule]]", "[rule]"),
        ("schema = 1", "schema = 99999999999999999999"),
        ("\"", "'"),
        ("·", "\u{0}"),
    ];
    for (from, to) in swaps {
        for (k, (at, _)) in text.match_indices(from).enumerate().take(20) {
            let mutated = format!("{}{to}{}", &text[..at], &text[at + from.len()..]);
            parses_or_errs(&mutated, &format!("occurrence {k} of `{from}` -> `{to}`"));
        }
    }
}

#[test]
fn rules_digest_is_stable_and_canonical() {
    let a = format!(
        "schema = 1\n# a comment\n[[rule]]\nid = \"a\"\n{REF_BODY}\nwhy = \"one\"\n\n\
         [[rule]]\nid = \"b\"\npattern = [{{ op = \"linear\" }}]\nkernel = \"gemv::linear\"\nnumerics = \"reference\"\npriority = 5\n"
    );
    let reordered = format!(
        "schema = 1\n[[rule]]\nid = \"b\"\npattern = [{{ op = \"linear\" }}]\nkernel = \"gemv::linear\"\n\
         numerics = \"reference\"\npriority = 5 # trailing comment\nwhy = \"added\"\n\n\
         [[rule]]\nid = \"a\"\n{REF_BODY}\nwhy = \"two, reworded\"\n"
    );
    let digest = |t: &str| {
        RuleSet::from_toml_str(t, SOURCE)
            .expect("good rules")
            .digest
    };
    let d = digest(&a);
    assert_eq!(d.len(), 64);
    assert!(d.chars().all(|c| c.is_ascii_hexdigit()), "{d}");
    assert_eq!(d, digest(&a), "same text twice");
    assert_eq!(
        d,
        RuleSet::from_toml_str(&a, "other-name.toml")
            .unwrap()
            .digest,
        "source name"
    );
    assert_eq!(
        d,
        digest(&reordered),
        "order, comments and `why` must not change the digest"
    );
    assert_ne!(
        d,
        digest(&a.replace("priority = 5", "priority = 6")),
        "a priority change"
    );
    assert_ne!(
        d,
        digest(&a.replace("gemv::linear", "gemv::linear2")),
        "a kernel change"
    );
}

#[test]
fn shipped_rules_digest_is_stable() {
    let a = RuleSet::from_file(&shipped_rules_path()).expect("shipped rules");
    let b = RuleSet::from_toml_str(&shipped_text(), "elsewhere").expect("shipped rules");
    assert_eq!(a.digest, b.digest);
    assert!(
        a.rules.len() >= 11,
        "the shipped rules have a reference rule per op"
    );
}

#[test]
fn from_file_on_a_missing_path_names_the_path() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("no-such-dir/RULES-missing.toml");
    let err = RuleSet::from_file(&path).expect_err("a missing file");
    assert!(matches!(err, CircuitError::RulesIo { .. }), "{err:?}");
    let m = err.to_string();
    assert!(
        m.contains(&path.display().to_string()),
        "the path should be named: {m}"
    );
}
