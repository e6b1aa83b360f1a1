//! The programmatic-dependent-launch check of `ptx --check`: under the `pdl` lever a kernel may
//! start while the previous one on its stream still runs, so every `.entry` must execute
//! `griddepcontrol.wait` (common.cuh's `pdl_wait`) before it writes memory. A kernel without
//! it races with its predecessor, and a kernel that completes without waiting lets its
//! successor start before the grid before it has finished.
//!
//! What is read off the PTX text: each `.entry` body must contain `griddepcontrol.wait`, and no
//! global store, atomic or reduction may come before the first one in the text. (A weight load
//! before the wait is allowed: weights are never written by a launch.)
//!
//! Invariant: every kernel of every module waits; there are no exemptions.

/// One `.entry`'s finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// No `griddepcontrol.wait` in the body.
    NoWait,
    /// A global store, atomic or reduction (the instruction named) before the first wait.
    WriteBeforeWait(String),
}

/// `(module::func, finding)` for every `.entry` of one module's PTX that breaks the rule.
pub fn findings(module: &str, text: &str) -> Vec<(String, Finding)> {
    entry_bodies(text)
        .into_iter()
        .filter_map(|(name, body)| {
            finding_of(&body).map(|finding| (format!("{module}::{name}"), finding))
        })
        .collect()
}

/// The failures of every module (`(module, ptx text)`): one line per kernel that breaks the rule.
pub fn check(modules: &[(String, String)]) -> Vec<String> {
    let mut failures = Vec::new();
    for (module, text) in modules {
        for (kernel, finding) in findings(module, text) {
            failures.push(match finding {
                Finding::NoWait => format!(
                    "kernel `{kernel}` never waits for the previous grid (no griddepcontrol.wait: \
                     call pdl_wait() at its entry), so it races under the `pdl` lever"
                ),
                Finding::WriteBeforeWait(op) => format!(
                    "kernel `{kernel}` writes memory (`{op}`) before griddepcontrol.wait: \
                     call pdl_wait() before any store"
                ),
            });
        }
    }
    failures
}

fn finding_of(body: &str) -> Option<Finding> {
    if !body.contains("griddepcontrol.wait") {
        return Some(Finding::NoWait);
    }
    for line in body.lines() {
        let mut op = line.trim();
        // A predicate guard (`@%p1 st.global ...`, `@!%p1 ...`) precedes the opcode.
        if op.starts_with('@') {
            op = op
                .split_once(char::is_whitespace)
                .map_or("", |(_, rest)| rest.trim_start());
        }
        if op.starts_with("griddepcontrol.wait") {
            return None;
        }
        if op.starts_with("st.global")
            || op.starts_with("st.volatile.global")
            || op.starts_with("st.relaxed")
            || op.starts_with("st.release")
            || op.starts_with("atom.")
            || op.starts_with("red.")
        {
            let opcode = op.split_whitespace().next().unwrap_or(op);
            return Some(Finding::WriteBeforeWait(opcode.to_string()));
        }
    }
    None
}

/// `(name, body)` of every `.entry`: the text between the brace that opens its body and the one
/// that closes it (nested scopes counted).
fn entry_bodies(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = find_entry(rest) {
        let after = &rest[at..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        // The parameter list closes before the body opens.
        let Some(open) = after
            .find(')')
            .and_then(|p| after[p..].find('{').map(|b| p + b))
        else {
            break;
        };
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((name, after[open + 1..end].to_string()));
        rest = &after[end.min(after.len())..];
    }
    out
}

/// The byte offset just past the next `.entry ` keyword that starts a line.
fn find_entry(text: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let lead = line.len() - trimmed.len();
        for prefix in [".visible .entry ", ".entry "] {
            if trimmed.starts_with(prefix) {
                return Some(offset + lead + prefix.len());
            }
        }
        offset += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "\
.version 8.8
.target sm_90
.address_size 64

\t// .globl\twaits
.visible .entry waits(
\t.param .u64 .ptr .global .align 1 waits_param_0
)
.maxntid 256, 1, 1
{
\t.reg .b64 \t%rd<3>;
\tld.global.nc.u16 \t%rs1, [%rd1];
\t// begin inline asm
\tgriddepcontrol.wait;
\t// end inline asm
\t{ .reg .b16 tmp; mov.b16 tmp, 0; }
\tst.global.f32 \t[%rd2], %f1;
\tret;
}
\t// .globl\tnever
.visible .entry never(
\t.param .u64 never_param_0
)
{
\t{ .reg .b16 tmp; }
\tst.global.f32 \t[%rd2], %f1;
\tret;
}
.visible .entry early(
\t.param .u64 early_param_0
)
{
\t@%p1 st.global.f32 \t[%rd2], %f1;
\tgriddepcontrol.wait;
\tret;
}
";

    #[test]
    fn each_entry_must_wait_before_it_writes() {
        let found = findings("m", PTX);
        assert_eq!(
            found,
            vec![
                ("m::never".to_string(), Finding::NoWait),
                (
                    "m::early".to_string(),
                    Finding::WriteBeforeWait("st.global.f32".into())
                ),
            ]
        );
    }

    #[test]
    fn check_names_each_kernel_that_does_not_wait() {
        let failures = check(&[("m".to_string(), PTX.to_string())]);
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(
            failures[0].contains("`m::never` never waits"),
            "{failures:?}"
        );
        assert!(failures[1].contains("`m::early` writes memory (`st.global.f32`)"));
        let waiting = PTX.split("\t// .globl\tnever").next().unwrap().to_string();
        assert!(check(&[("m".to_string(), waiting)]).is_empty());
    }

    /// The checked-in PTX of every module passes.
    #[test]
    fn the_checked_in_ptx_waits_in_every_kernel() {
        let modules: Vec<(String, String)> = solder_kernels::ptx_modules()
            .iter()
            .map(|(module, text)| (module.to_string(), text.to_string()))
            .collect();
        let failures = check(&modules);
        assert!(failures.is_empty(), "{failures:#?}");
    }
}
