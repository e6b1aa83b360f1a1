//! Bad rules files: each is refused with a message that says what is wrong and where
//! (`bad.toml` plus a line, or line:column).

use solder_circuit::RuleSet;

const SOURCE: &str = "bad.toml";

/// The message that refused `text`; panics if `text` was accepted.
fn refuse(text: &str) -> String {
    match RuleSet::from_toml_str(text, SOURCE) {
        Ok(rules) => panic!(
            "accepted a bad rules file ({} rules):\n{text}",
            rules.rules.len()
        ),
        Err(e) => e.to_string(),
    }
}

/// 1-based line of the first occurrence of `needle` in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` not in the test's text"));
    text[..at].matches('\n').count() + 1
}

/// The message names `bad.toml` at `line` (as `bad.toml:L:C`) and contains every `what`.
fn assert_at(message: &str, line: usize, what: &[&str]) {
    let prefix = format!("{SOURCE}:{line}:");
    assert!(
        message.starts_with(&prefix),
        "expected the message to start with `{prefix}`: {message}"
    );
    for w in what {
        assert!(
            message.contains(w),
            "expected `{w}` in the message: {message}"
        );
    }
}

/// A file with one rule whose body is `body` (each line of it goes after `id = "r"`).
fn one_rule(body: &str) -> String {
    format!("schema = 1\n\n[[rule]]\nid = \"r\"\n{body}\n")
}

const REF_BODY: &str =
    "pattern = [{ op = \"rms_norm\" }]\nkernel = \"norm::rms_norm\"\nnumerics = \"reference\"";

#[test]
fn control_a_good_rule_is_accepted() {
    let rules = RuleSet::from_toml_str(&one_rule(REF_BODY), SOURCE).expect("a good rule");
    assert_eq!(rules.rules.len(), 1);
    assert_eq!(
        rules.rules[0].line, 4,
        "the rule's line is the line of its id"
    );
}

#[test]
fn malformed_toml_names_line_and_column() {
    let text = "schema = 1\n\n[[rule]\nid = \"r\"\n";
    let m = refuse(text);
    assert!(m.starts_with(SOURCE), "{m}");
    assert!(
        m.contains("line 3") && m.contains("column"),
        "expected line 3 and a column: {m}"
    );
}

#[test]
fn unknown_field_in_a_rule_is_named_with_its_line() {
    let text = one_rule(&format!("{REF_BODY}\nprio = 3"));
    let m = refuse(&text);
    assert!(m.starts_with(SOURCE), "{m}");
    assert!(m.contains("prio"), "{m}");
    assert!(
        m.contains(&format!("line {}", line_of(&text, "prio"))),
        "{m}"
    );
}

#[test]
fn unknown_field_in_a_pattern_element_is_named_with_its_line() {
    let text = one_rule(
        "pattern = [{ op = \"linear\", rol = \"q_proj\" }]\nkernel = \"gemv::linear\"\nnumerics = \"reference\"",
    );
    let m = refuse(&text);
    assert!(m.starts_with(SOURCE), "{m}");
    assert!(m.contains("rol"), "{m}");
    assert!(
        m.contains(&format!("line {}", line_of(&text, "rol ="))),
        "{m}"
    );
}

#[test]
fn unknown_op_is_named_with_the_known_ones() {
    let text = one_rule(
        "pattern = [{ op = \"matmul\" }]\nkernel = \"gemv::mm\"\nnumerics = \"reference\"",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "matmul"),
        &["rule `r`", "unknown op `matmul`", "rms_norm"],
    );
}

#[test]
fn unknown_layer_kind_is_named() {
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\", layer_kind = \"sliding_attention\" }]\nkernel = \"norm::x\"\nnumerics = \"reference\"",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "layer_kind"),
        &["sliding_attention"],
    );
}

#[test]
fn duplicate_rule_id_names_both_lines() {
    let text = format!(
        "schema = 1\n\n[[rule]]\nid = \"r\"\n{REF_BODY}\n\n[[rule]]\nid = \"r\"\n{REF_BODY}\n"
    );
    // The second definition's line leads, the first's is in the message.
    assert_at(&refuse(&text), 10, &["duplicate rule id `r`", "line 4"]);
}

#[test]
fn inverted_rows_range_is_refused() {
    let text = one_rule(&format!("{REF_BODY}\nrows = [8, 2]"));
    assert_at(
        &refuse(&text),
        line_of(&text, "rows"),
        &["rows range [8, 2] is inverted"],
    );
}

#[test]
fn rows_that_are_not_a_pair_are_refused() {
    for rows in ["[1]", "[1, 2, 3]", "[]", "[0, 4]", "[-1, 4]"] {
        let text = one_rule(&format!("{REF_BODY}\nrows = {rows}"));
        assert_at(
            &refuse(&text),
            line_of(&text, "rows"),
            &["rows must be [lo, hi]"],
        );
    }
    let text = one_rule(&format!("{REF_BODY}\nrows = \"1..8\""));
    let m = refuse(&text);
    assert!(
        m.starts_with(SOURCE) && m.contains(&format!("line {}", line_of(&text, "rows"))),
        "{m}"
    );
}

#[test]
fn unknown_mode_is_named_with_the_known_ones() {
    let text = one_rule(&format!("{REF_BODY}\nmodes = [\"decode\", \"prefil\"]"));
    assert_at(
        &refuse(&text),
        line_of(&text, "modes"),
        &["unknown mode `prefil`", "multi_seq", "prefill"],
    );
}

#[test]
fn kernel_names_not_of_the_form_module_func_are_refused() {
    for kernel in ["norm", "norm::", "::f", "a::b::c", "1x::f", "no rm::f", ""] {
        let text = one_rule(&format!(
            "pattern = [{{ op = \"rms_norm\" }}]\nkernel = \"{kernel}\"\nnumerics = \"reference\""
        ));
        let m = refuse(&text);
        assert_at(
            &m,
            line_of(&text, "kernel ="),
            &["module::func", &format!("`{kernel}`")],
        );
    }
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\" }, { op = \"linear\" }]\nkernels = [\"norm::a\", \"b\"]\nnumerics = \"bit_identical\"",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "kernels"),
        &["`b`", "module::func"],
    );
}

#[test]
fn both_kernel_and_kernels_is_refused() {
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\" }]\nkernel = \"norm::a\"\nkernels = [\"norm::b\"]\nnumerics = \"reference\"",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "kernel ="),
        &["both `kernel` and `kernels`"],
    );
}

#[test]
fn no_kernel_is_refused() {
    for kernels in ["", "kernels = []"] {
        let text = one_rule(&format!(
            "pattern = [{{ op = \"rms_norm\" }}]\n{kernels}\nnumerics = \"reference\""
        ));
        assert_at(
            &refuse(&text),
            line_of(&text, "id ="),
            &["rule `r`", "names no kernel"],
        );
    }
}

#[test]
fn missing_numerics_is_refused() {
    let text = one_rule("pattern = [{ op = \"rms_norm\" }]\nkernel = \"norm::rms_norm\"");
    assert_at(
        &refuse(&text),
        line_of(&text, "id ="),
        &["missing `numerics`", "bit_identical"],
    );
}

#[test]
fn bad_numerics_string_is_refused() {
    for numerics in ["\"exact\"", "3", "[\"reference\"]"] {
        let text = one_rule(&format!(
            "pattern = [{{ op = \"rms_norm\" }}]\nkernel = \"norm::rms_norm\"\nnumerics = {numerics}"
        ));
        assert_at(
            &refuse(&text),
            line_of(&text, "numerics"),
            &["numerics", "bit_identical"],
        );
    }
}

#[test]

fn bad_numerics_string_names_the_value() {
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\" }]\nkernel = \"norm::rms_norm\"\nnumerics = \"exact\"",
    );
    assert_at(&refuse(&text), line_of(&text, "numerics"), &["exact"]);
}

#[test]
fn differs_with_an_unknown_lever_is_refused() {
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\" }]\nkernel = \"norm::fast\"\nnumerics = { differs = \"turbo\", tolerance = 0.01 }",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "numerics"),
        &["unknown lever `turbo`"],
    );
}

#[test]
fn differs_without_a_positive_tolerance_is_refused() {
    for numerics in [
        "{ differs = \"fast_exp\" }",
        "{ differs = \"fast_exp\", tolerance = 0 }",
        "{ differs = \"fast_exp\", tolerance = -0.5 }",
        "{ differs = \"fast_exp\", tolerance = 0.0 }",
    ] {
        let text = one_rule(&format!(
            "pattern = [{{ op = \"rms_norm\" }}]\nkernel = \"norm::fast\"\nnumerics = {numerics}"
        ));
        assert_at(&refuse(&text), line_of(&text, "numerics"), &["tolerance"]);
    }
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\" }]\nkernel = \"norm::fast\"\nnumerics = { differs = \"fast_exp\", tolerance = 0.1, scale = 2 }",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "numerics"),
        &["unknown numerics field `scale`"],
    );
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\" }]\nkernel = \"norm::fast\"\nnumerics = { differs = \"fast_exp\", tolerance = 0.1, by_chunk = 1 }",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "numerics"),
        &["`by_chunk` must be true or false"],
    );
}

#[test]
fn when_with_an_unknown_lever_is_refused() {
    let text = one_rule(&format!("{REF_BODY}\nwhen = {{ turbo = true }}"));
    assert_at(
        &refuse(&text),
        line_of(&text, "when"),
        &["`when` names unknown lever `turbo`"],
    );
}

#[test]
fn schema_2_is_refused() {
    let text = format!("schema = 2\n\n[[rule]]\nid = \"r\"\n{REF_BODY}\n");
    assert_at(&refuse(&text), 1, &["unsupported schema 2"]);
}

#[test]
fn missing_schema_is_refused() {
    let m = refuse(&format!("[[rule]]\nid = \"r\"\n{REF_BODY}\n"));
    assert!(m.starts_with(SOURCE) && m.contains("schema"), "{m}");
}

#[test]
fn empty_pattern_is_refused() {
    let text = one_rule("pattern = []\nkernel = \"norm::rms_norm\"\nnumerics = \"reference\"");
    assert_at(
        &refuse(&text),
        line_of(&text, "pattern"),
        &["rule `r`", "pattern is empty"],
    );
}

#[test]
fn empty_rule_id_is_refused() {
    let text = format!("schema = 1\n[[rule]]\nid = \" \"\n{REF_BODY}\n");
    assert_at(&refuse(&text), 3, &["rule id is empty"]);
}

#[test]
fn first_element_cannot_be_a_sibling() {
    let text = one_rule(
        "pattern = [{ op = \"linear\", link = \"sibling\" }, { op = \"linear\" }]\nkernel = \"gemv::two\"\nnumerics = \"bit_identical\"",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "link"),
        &["first pattern element cannot be a sibling"],
    );
}

#[test]
fn unknown_link_is_refused() {
    let text = one_rule(
        "pattern = [{ op = \"linear\" }, { op = \"linear\", link = \"cousin\" }]\nkernel = \"gemv::two\"\nnumerics = \"bit_identical\"",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "link"),
        &["unknown link `cousin`", "sibling"],
    );
}

#[test]
fn reference_rule_with_two_ops_is_refused() {
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\" }, { op = \"linear\" }]\nkernel = \"gemv::norm_linear\"\nnumerics = \"reference\"",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "pattern"),
        &["reference rule covers one op with one kernel"],
    );
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\" }]\nkernels = [\"norm::a\", \"norm::b\"]\nnumerics = \"reference\"",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "pattern"),
        &["one op with one kernel"],
    );
}

#[test]

fn error_column_counts_characters_like_toml() {
    let line = "pattern = [{ role = \"e\", op = \"matmul\" }]\nkernel = \"gemv::mm\"\nnumerics = \"reference\"";
    let ascii = refuse(&one_rule(line));
    assert!(ascii.starts_with("bad.toml:5:31:"), "control: {ascii}");
    // `é` is one character (two bytes): the column of `"matmul"` does not move.
    let accented = refuse(&one_rule(&line.replace("\"e\"", "\"é\"")));
    assert!(accented.starts_with("bad.toml:5:31:"), "{accented}");
}

#[test]
fn empty_modes_list_is_refused() {
    let text = one_rule(
        "pattern = [{ op = \"rms_norm\" }]\nkernel = \"norm::rms_norm\"\nnumerics = \"reference\"\nmodes = []",
    );
    assert_at(
        &refuse(&text),
        line_of(&text, "modes"),
        &["`modes` is empty"],
    );
}
