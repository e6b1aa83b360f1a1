//! The printed plan of each shipped circuit at a few widths equals its golden file exactly,
//! and `RULES_DIGEST` names the rules they were blessed with; `cargo xtask plan --bless`
//! rewrites them after a reviewed change.

use solder_tests::{golden_files, GOLDEN_PLANS};

/// The first line where `want` and `got` differ, 1-based, with both versions.
fn first_difference(want: &str, got: &str) -> Option<(usize, String, String)> {
    let (mut w, mut g) = (want.lines(), got.lines());
    for line in 1.. {
        match (w.next(), g.next()) {
            (None, None) => return (want != got).then(|| (line, "<end>".into(), "<end>".into())),
            (a, b) if a == b => continue,
            (a, b) => {
                let show = |x: Option<&str>| x.map_or("<end of file>".to_string(), str::to_string);
                return Some((line, show(a), show(b)));
            }
        }
    }
    None
}

#[test]
fn first_difference_finds_the_line() {
    assert_eq!(first_difference("a\nb\n", "a\nb\n"), None);
    assert_eq!(
        first_difference("a\nb\n", "a\nc\n"),
        Some((2, "b".into(), "c".into()))
    );
    assert_eq!(first_difference("a\n", "a\nb\n").map(|d| d.0), Some(2));
    assert!(
        first_difference("a\n", "a").is_some(),
        "a missing final newline is a difference"
    );
}

#[test]
fn printed_plans_match_their_golden_files() {
    assert!(!GOLDEN_PLANS.is_empty());
    let files = golden_files();
    assert_eq!(
        files.len(),
        GOLDEN_PLANS.len() + 1,
        "every plan and RULES_DIGEST"
    );
    let mut failures = Vec::new();
    for (path, got) in files {
        let got = got.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let want = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                failures.push(format!(
                    "{}: cannot read the golden file ({e}); run `cargo xtask plan --bless`",
                    path.display()
                ));
                continue;
            }
        };
        if let Some((line, w, g)) = first_difference(&want, &got) {
            failures.push(format!(
                "{} differs from what is rendered now at line {line}:\n  golden:  {w}\n  now:     {g}\n\
                 if the change is intended, run `cargo xtask plan --bless` and review the diff",
                path.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
