//! `docs/ARCHITECTURE.md`, the code map, and the source tree agree both ways. Every source
//! module is named in its crate's section (`## crates/<dir>`, `## xtask`) as an identifier
//! inside backticks (`name`, `parent::name`, `{a, name}`), or anywhere by its path; and every
//! module a section's bullet leads with ("- `exec::pools` — ...") and every path the doc
//! names in backticks exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use solder_tests::{rust_files, workspace_root};

/// The identifiers inside the text's backtick spans.
fn backticked_identifiers(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| {
            span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| !word.is_empty())
                .map(str::to_string)
        })
        .collect()
}

/// The module a source file is: its stem, or its folder's name for `mod.rs`; `lib.rs` and
/// `main.rs` are crate roots, not modules.
fn module_name(file: &Path) -> Option<String> {
    let stem = file.file_stem()?.to_str()?;
    match stem {
        "lib" | "main" => None,
        "mod" => Some(file.parent()?.file_name()?.to_str()?.to_string()),
        _ => Some(stem.to_string()),
    }
}

/// The doc's section whose heading starts with the word `heading` (`## crates/circuit — ...`),
/// up to the next `## `.
fn section<'a>(doc: &'a str, heading: &str) -> Option<&'a str> {
    let is_heading = |at: usize| {
        let line_start = at == 0 || doc[..at].ends_with('\n');
        let rest = &doc[at + 3..];
        line_start
            && rest.starts_with(heading)
            && rest[heading.len()..].starts_with(|c: char| c.is_whitespace())
    };
    let start = doc
        .match_indices("## ")
        .map(|(at, _)| at)
        .find(|&at| is_heading(at))?;
    let body = &doc[start + 3..];
    let end = body.find("\n## ").map_or(body.len(), |at| at + 1);
    Some(&body[..end])
}

/// The section a source file's crate is described in: `crates/<dir>` or `xtask`.
fn crate_heading(relative: &str) -> String {
    match relative.strip_prefix("crates/") {
        Some(rest) => format!("crates/{}", rest.split('/').next().unwrap_or(rest)),
        None => relative.split('/').next().unwrap_or(relative).to_string(),
    }
}

/// `(path relative to the root, module name)` of every module under `crates/*/src` and
/// `xtask/src`.
fn source_modules(root: &Path) -> Vec<(String, String)> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    dirs.sort();
    dirs.push(root.join("xtask/src"));
    let files: Vec<PathBuf> = dirs.iter().flat_map(|dir| rust_files(dir)).collect();
    files
        .iter()
        .filter_map(|file| {
            let relative = file.strip_prefix(root).ok()?.to_str()?.to_string();
            Some((relative, module_name(file)?))
        })
        .collect()
}

/// The modules `doc` names neither in their crate's section nor by path.
fn missing<'a>(modules: &'a [(String, String)], doc: &str) -> Vec<&'a (String, String)> {
    modules
        .iter()
        .filter(|(path, name)| {
            let named = section(doc, &crate_heading(path))
                .is_some_and(|text| backticked_identifiers(text).contains(name));
            !named && !doc.contains(path.as_str())
        })
        .collect()
}

#[test]
fn module_names_are_read_from_paths_and_backticks() {
    assert_eq!(module_name(Path::new("a/src/lib.rs")), None);
    assert_eq!(module_name(Path::new("a/src/main.rs")), None);
    assert_eq!(
        module_name(Path::new("a/src/planner/mod.rs")).as_deref(),
        Some("planner")
    );
    assert_eq!(
        module_name(Path::new("a/src/planner/topo.rs")).as_deref(),
        Some("topo")
    );
    let doc = "# Map\n\n## crates/xy\n\n`memory`\n\n## crates/x — `x`\n\n`parity::builtin`, \
               `planner::{topo, liveness}` and plain memory; see crates/x/src/bare.rs\n\n\
               ## crates/y\n\n`other`\n";
    let modules: Vec<(String, String)> = ["builtin", "topo", "liveness", "memory", "bare", "other"]
        .iter()
        .map(|name| (format!("crates/x/src/{name}.rs"), name.to_string()))
        .collect();
    let absent: Vec<&str> = missing(&modules, doc)
        .iter()
        .map(|(_, name)| name.as_str())
        .collect();
    // Outside backticks a word does not count, nor does a name in another crate's section
    // (`crates/xy` is not `crates/x`).
    assert_eq!(absent, ["memory", "other"]);
    assert_eq!(crate_heading("crates/x/src/a/b.rs"), "crates/x");
    assert_eq!(crate_heading("xtask/src/a.rs"), "xtask");
}

#[test]
fn every_source_module_is_named_in_the_architecture_doc() {
    let root = workspace_root();
    let doc_path = root.join("docs/ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let modules = source_modules(&root);
    assert!(
        modules.len() > 50,
        "found only {} modules under {}",
        modules.len(),
        root.display()
    );
    let absent: Vec<String> = missing(&modules, &doc)
        .iter()
        .map(|(path, name)| format!("  `{name}` ({path})"))
        .collect();
    assert!(
        absent.is_empty(),
        "{} modules are not named in docs/ARCHITECTURE.md (in their crate's section as \
         `name` in backticks, or by path):\n{}",
        absent.len(),
        absent.join("\n")
    );
}

/// The module paths a section's bullets lead with: "- `exec::pools` — ..." gives
/// `exec::pools`. A lead is a module path when it is lower-case words joined by `::`.
fn bullet_leads(section: &str) -> Vec<String> {
    section
        .lines()
        .filter_map(|line| line.strip_prefix("- `"))
        .filter_map(|rest| rest.split('`').next())
        .filter(|lead| {
            !lead.is_empty()
                && lead.split("::").all(|w| {
                    !w.is_empty()
                        && w.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                })
        })
        .map(str::to_string)
        .collect()
}

/// Whether module path `lead` (`a::b`) is a module of the crate whose sources are under `src`:
/// `src/a/b.rs` or `src/a/b/mod.rs`.
fn resolves(src: &Path, lead: &str) -> bool {
    let relative: PathBuf = lead.split("::").collect();
    src.join(&relative).with_extension("rs").is_file()
        || src.join(&relative).join("mod.rs").is_file()
}

/// The backticked spans of `doc` that are paths into the tree (`crates/...`, `xtask/...`,
/// `tests/...`, `fusions/...`, `docs/...`, `examples/...`), with any `:line` suffix dropped.
fn backticked_paths(doc: &str) -> BTreeSet<String> {
    const ROOTS: &[&str] = &[
        "crates/",
        "xtask/",
        "tests/",
        "fusions/",
        "docs/",
        "examples/",
    ];
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| ROOTS.iter().any(|root| span.starts_with(root)))
        .filter(|span| !span.contains(['*', '<', ' ']))
        .map(|span| span.split(':').next().unwrap_or(span).to_string())
        .collect()
}

/// The bullet leads of each crate section that name no module of that crate, and the
/// backticked paths that name nothing in the tree: what the doc says that is no longer so.
fn stale(root: &Path, doc: &str) -> Vec<String> {
    let mut sections: Vec<(String, PathBuf)> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|dir| dir.join("src").is_dir())
        .map(|dir| {
            let name = dir.file_name().unwrap().to_str().unwrap().to_string();
            (format!("crates/{name}"), dir.join("src"))
        })
        .collect();
    sections.sort();
    sections.push(("xtask".to_string(), root.join("xtask/src")));
    let mut out = Vec::new();
    for (heading, src) in &sections {
        let Some(text) = section(doc, heading) else {
            out.push(format!("no section `## {heading}`"));
            continue;
        };
        for lead in bullet_leads(text) {
            if !resolves(src, &lead) {
                out.push(format!(
                    "`{lead}` in `## {heading}` is no module of {}",
                    src.display()
                ));
            }
        }
    }
    for path in backticked_paths(doc) {
        if !root.join(&path).exists() {
            out.push(format!("`{path}` names nothing in the tree"));
        }
    }
    out
}

#[test]
fn bullet_leads_and_paths_are_read() {
    let text =
        "- `exec::pools` — pools\n- `Session` — a type\n- `a`, `b` and more\n  - `x` nested\n";
    assert_eq!(bullet_leads(text), ["exec::pools", "a"]);
    let doc = "see `crates/x/src/a.rs:12`, `tests/fixtures/*.json` and `xtask` or `crates/y/`";
    let paths: Vec<String> = backticked_paths(doc).into_iter().collect();
    assert_eq!(paths, ["crates/x/src/a.rs", "crates/y/"]);
}

#[test]
fn everything_the_architecture_doc_names_exists() {
    let root = workspace_root();
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let stale = stale(&root, &doc);
    assert!(
        stale.is_empty(),
        "docs/ARCHITECTURE.md names {} thing(s) the tree no longer has:\n  {}",
        stale.len(),
        stale.join("\n  ")
    );
}
