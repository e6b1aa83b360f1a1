//! The kernels a PTX text defines: CUDA cannot list a module's functions, so the backend
//! reads the `.entry` directives of the PTX it loads.
//!
//! Invariant: only defined kernels are listed (`.entry`, with or without `.visible` or
//! `.weak`); `.extern .entry` declarations and `.func` device functions are not.

/// The names of the kernels (`.entry` directives) defined in `ptx`, in order of appearance,
/// each once. Comments (`//` and `/* */`) are ignored.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    let text = strip_comments(ptx);
    let mut names: Vec<String> = Vec::new();
    // A kernel's header ends at its body's `{`; declarations end at `;`.
    for statement in text.split([';', '{', '}']) {
        let tokens: Vec<&str> = statement.split_whitespace().collect();
        for (at, _) in tokens.iter().enumerate().filter(|(_, t)| **t == ".entry") {
            let declared_only = tokens[..at]
                .iter()
                .rev()
                .take_while(|t| matches!(**t, ".visible" | ".weak" | ".extern"))
                .any(|t| *t == ".extern");
            let name: String = tokens
                .get(at + 1)
                .map(|t| {
                    t.chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '%'))
                        .collect()
                })
                .unwrap_or_default();
            if !declared_only && !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// `text` with `//` line comments and `/* */` block comments replaced by a space, in one pass
/// (a search for the next `/*` from every `//` made this quadratic: seconds on gemv's PTX,
/// whose every few lines hold a `//` comment, at every module load).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('/') {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        if let Some(after) = from.strip_prefix("//") {
            out.push(' ');
            rest = after.find('\n').map_or("", |end| &after[end..]);
        } else if let Some(after) = from.strip_prefix("/*") {
            out.push(' ');
            rest = after.find("*/").map_or("", |end| &after[end + 2..]);
        } else {
            out.push('/');
            rest = &from[1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_become_spaces_and_everything_else_stays() {
        assert_eq!(strip_comments("a // b\nc"), "a  \nc");
        assert_eq!(strip_comments("a /* b\n c */d"), "a  d");
        assert_eq!(strip_comments("x / y // z"), "x / y  ");
        assert_eq!(strip_comments("p /* open"), "p  ");
        assert_eq!(strip_comments("// only"), " ");
        assert_eq!(strip_comments("/* a */ /* b */"), "   ");
        assert_eq!(strip_comments("q // c /* not a block */\nr"), "q  \nr");
        assert_eq!(strip_comments("s /* // inside */t"), "s  t");
    }

    /// Many line comments and no block comment (gemv's PTX has one every few lines): the
    /// entries are found, with a commented-out `.entry` ignored.
    #[test]
    fn entries_among_many_line_comments() {
        let mut ptx = String::from(".version 9.0\n.target sm_90\n");
        for i in 0..20_000 {
            ptx.push_str(&format!("// line {i}\n\tadd.f32 %f1, %f2, %f3;\n"));
        }
        ptx.push_str(
            "// .visible .entry ghost(\n.visible .entry real(\n.param .u64 p\n)\n{\nret;\n}\n",
        );
        assert_eq!(ptx_entries(&ptx), ["real"]);
    }
}
