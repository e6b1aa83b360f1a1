//! What a crate's source files import from each other, read from their text, for the tests
//! that hold the tree to its structure (`no_import_circles`, `model_layers_layers`): every `use`
//! of `crate::`, `super::` or `self::` paths (braces expanded) and every such path written
//! inline (a macro's `$crate::` paths are its file's), resolved to the deepest module file it
//! names. A module and the modules inside it are one unit (a parent declares and re-exports its
//! children; a child reads its parent's items), so only files that are neither's ancestor are
//! tied. Tests import what they check: a `#[cfg(test)]` module, inline or in a file of its own,
//! is not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::rust_files;

/// A crate's files by module, and what each imports from files that neither contain it nor
/// lie inside it: `edges[a][b]` is the first path `a` names in `b`.
pub struct Imports {
    pub files: BTreeMap<ModPath, PathBuf>,
    pub edges: BTreeMap<ModPath, BTreeMap<ModPath, String>>,
}

/// The imports among the files of the crate whose source folder is `src`.
pub fn imports_of(src: &Path) -> Imports {
    let files: BTreeMap<ModPath, PathBuf> = rust_files(src)
        .into_iter()
        .map(|file| (module_path(src, &file), file))
        .collect();

    let mut code: BTreeMap<&ModPath, String> = BTreeMap::new();
    let mut tests = BTreeSet::new();
    for (module, file) in &files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let (kept, test_files) = without_tests(&code_of(&text));
        tests.extend(test_files.into_iter().map(|name| {
            let mut child = module.clone();
            child.push(name);
            child
        }));
        code.insert(module, kept);
    }

    // Edges between files neither of which contains the other; test files read nothing.
    let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
    for (module, text) in code {
        if tests.iter().any(|t| module.starts_with(t)) {
            continue;
        }
        for path in paths_named(&text) {
            let Some(target) = resolve(&path, module, &files) else {
                continue;
            };
            if target.starts_with(module) || module.starts_with(&target) {
                continue;
            }
            edges
                .entry(module.clone())
                .or_default()
                .entry(target)
                .or_insert(path);
        }
    }
    Imports { files, edges }
}

/// A module's path inside its crate: `src/a/b.rs` and `src/a/b/mod.rs` are `[a, b]`; the
/// crate root is `[]`.
pub type ModPath = Vec<String>;

fn module_path(src: &Path, file: &Path) -> ModPath {
    let relative = file.strip_prefix(src).expect("a file under src");
    let mut parts: ModPath = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The text without `//` comments (doc comments name paths that are not imports).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The code without its `#[cfg(test)]` inline modules, and the names of its `#[cfg(test)]`
/// file modules (`#[cfg(test)] mod quant_emit_tests;`).
fn without_tests(code: &str) -> (String, Vec<String>) {
    let mut kept = String::new();
    let mut test_files = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..at]);
        let after = rest[at + "#[cfg(test)]".len()..].trim_start();
        let Some(declared) = after.strip_prefix("mod ") else {
            rest = after;
            continue;
        };
        let name: String = declared
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let body = declared.trim_start()[name.len()..].trim_start();
        if let Some(tail) = body.strip_prefix(';') {
            test_files.push(name);
            rest = tail;
        } else if let Some(inner) = body.strip_prefix('{') {
            let mut depth = 1usize;
            let end = inner
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(inner.len(), |(i, _)| i + 1);
            rest = &inner[end..];
        } else {
            rest = after;
        }
    }
    kept.push_str(rest);
    (kept, test_files)
}

/// `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e` (whitespace already removed).
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.to_string()];
    };
    let prefix = &tree[..open];
    let inner = tree[open + 1..]
        .strip_suffix('}')
        .unwrap_or(&tree[open + 1..]);
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|item| !item.is_empty())
        .flat_map(|item| {
            expand(item)
                .into_iter()
                .map(move |p| format!("{prefix}{p}"))
        })
        .collect()
}

/// Every `crate::`, `super::` or `self::` path the code names: in `use` trees, and inline.
fn paths_named(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    // `use` statements, braces expanded.
    while let Some(at) = rest.find("use ") {
        let before_ok = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || c == ')' || c == ';' || c == '{');
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if before_ok {
            let tree: String = after[..end]
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            paths.extend(expand(&tree));
        }
        rest = &after[end.min(after.len())..];
    }
    // Inline paths (`crate::bench::synth_checkpoint(...)`).
    for root in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(root) {
            let starts_word = code[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
            if !starts_word {
                continue;
            }
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            paths.push(path);
        }
    }
    paths
}

/// The module a path names from `module`, as deep as a file of the crate goes.
fn resolve(path: &str, module: &ModPath, files: &BTreeMap<ModPath, PathBuf>) -> Option<ModPath> {
    let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
    let mut at: ModPath = match segments.peek().copied() {
        Some("crate") => {
            segments.next();
            Vec::new()
        }
        Some("super") | Some("self") => module.clone(),
        _ => return None,
    };
    // A file's own `super::` is its parent; `mod.rs`'s module is its folder's.
    while let Some(&segment) = segments.peek() {
        match segment {
            "super" => {
                at.pop()?;
                segments.next();
            }
            "self" => {
                segments.next();
            }
            _ => break,
        }
    }
    for segment in segments {
        let mut deeper = at.clone();
        deeper.push(segment.to_string());
        if !files.contains_key(&deeper) {
            break;
        }
        at = deeper;
    }
    Some(at)
}
