//! No source files of a crate import each other round a circle (`a` uses `b`, `b` uses `a`, or
//! longer): what two files both need lives in a module of its own (`families::parts`,
//! `parity::case`, `weights::tensor`, ...). A module and the modules inside it are one unit
//! here (a parent declares and re-exports its children; a child reads its parent's items), so
//! only files that are neither's ancestor count.
//!
//! The imports are read from the text (`solder_tests::imports`): `use` trees and inline paths,
//! macros' `$crate::` paths included, `#[cfg(test)]` modules left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use solder_tests::imports::{imports_of, Imports, ModPath};
use solder_tests::workspace_root;

/// The circles among one crate's files: each a set of files, with the paths that tie them.
fn circles_of(src: &Path) -> Vec<Vec<String>> {
    let Imports { files, edges } = imports_of(src);

    let reach = |from: &ModPath| -> BTreeSet<ModPath> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&ModPath, BTreeSet<ModPath>> =
        files.keys().map(|m| (m, reach(m))).collect();
    let name = |m: &ModPath| {
        files[m]
            .strip_prefix(src)
            .unwrap_or(&files[m])
            .display()
            .to_string()
    };

    let mut placed = BTreeSet::new();
    let mut circles = Vec::new();
    for m in files.keys() {
        if placed.contains(m) || !reachable[m].contains(m) {
            continue;
        }
        let members: BTreeSet<&ModPath> = reachable[m]
            .iter()
            .filter(|other| reachable[*other].contains(m))
            .collect();
        let mut lines = Vec::new();
        for a in &members {
            placed.insert((*a).clone());
            for (b, path) in edges.get(*a).into_iter().flatten() {
                if members.contains(b) {
                    lines.push(format!("{} -> {}: `{path}`", name(a), name(b)));
                }
            }
        }
        circles.push(lines);
    }
    circles
}

/// The source folders of the workspace's members (`<member>/src`, from the root Cargo.toml).
fn source_dirs() -> Vec<PathBuf> {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("a [workspace] members list in Cargo.toml");
    let dirs: Vec<PathBuf> = members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|member| root.join(member).join("src"))
        .collect();
    assert!(
        dirs.len() > 5 && dirs.iter().all(|src| src.is_dir()),
        "every workspace member has a src/ folder: {dirs:?}"
    );
    dirs
}

#[test]
fn no_files_of_a_crate_import_each_other_round_a_circle() {
    let mut found = Vec::new();
    for src in source_dirs() {
        for circle in circles_of(&src) {
            found.push(format!("{}:\n  {}", src.display(), circle.join("\n  ")));
        }
    }
    assert!(
        found.is_empty(),
        "files importing each other (move what both need into a module of its own):\n{}",
        found.join("\n")
    );
}

/// The check finds a circle through `super::` and `crate::` paths, a `use` tree and an inline
/// path, and none between a module and its children.
#[test]
fn a_circle_is_found_and_a_parent_with_its_children_is_not() {
    let dir = std::env::temp_dir().join(format!("solder-circles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    let write = |path: &str, text: &str| std::fs::write(src.join(path), text).unwrap();
    write("lib.rs", "mod a;\nmod c;\npub use a::b::Thing;\n");
    write("a/mod.rs", "mod b;\nmod d;\nuse b::Thing;\n");
    // b reads its parent and a sibling; d (the sibling) reads b back inline.
    write(
        "a/b.rs",
        "use super::{d::{self, helper}, Parent};\npub struct Thing;\n",
    );
    write(
        "a/d.rs",
        "// use super::b::Thing; (a comment, not an import)\npub fn helper() {}\n\
         #[cfg(test)]\nmod tests {\n    use crate::a::b::Thing;\n}\n",
    );
    write("c.rs", "pub fn f() { let _ = crate::a::b::Thing; }\n");
    assert!(circles_of(&src).is_empty(), "{:?}", circles_of(&src));

    write(
        "a/d.rs",
        "pub fn helper() { let _ = crate::a::b::Thing; }\n",
    );
    let circles = circles_of(&src);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert_eq!(
        circles[0],
        [
            "a/b.rs -> a/d.rs: `super::d::self`",
            "a/d.rs -> a/b.rs: `crate::a::b::Thing`",
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
