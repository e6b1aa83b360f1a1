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

/// `text` with `//` line comments and `/* */` block comments replaced by a space.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let line = rest.find("//");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                out.push(' ');
                rest = rest[l..].find('\n').map_or("", |end| &rest[l + end..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                out.push(' ');
                rest = rest[b + 2..]
                    .find("*/")
                    .map_or("", |end| &rest[b + 2 + end + 2..]);
            }
            _ => {
                out.push_str(rest);
                rest = "";
            }
        }
    }
    out
}
