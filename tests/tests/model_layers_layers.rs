//! `solder-model-layers` imports downward only, as `docs/ARCHITECTURE.md` draws it:
//!
//! ```text
//! session ─► exec ─► graphs ─► program ─► emit ─► bind ─► layout ─► kernels ─► numerics
//!    │         └──► weights ─► checkpoint, numerics
//!    └──► sampling                          (meta, error, bytes, progress: below all)
//! ```
//!
//! A room may import what its arrows reach, and every room but the four at the bottom may
//! import those four (`meta` itself reads `bytes` and `error`). One exception, by design:
//! `error` carries back a `graphs::captured::CapturedGraph`, a handle that imports nothing of
//! the crate, so naming it brings no layer above along. The imports are read as
//! `no_import_circles` reads them (`solder_tests::imports`).

use std::collections::BTreeSet;

use solder_tests::imports::{imports_of, ModPath};
use solder_tests::workspace_root;

/// Each room and the rooms it imports directly, as the diagram draws them.
const ARROWS: &[(&str, &[&str])] = &[
    ("session", &["exec", "sampling"]),
    ("exec", &["graphs", "weights"]),
    ("graphs", &["program"]),
    ("program", &["emit"]),
    ("emit", &["bind"]),
    ("bind", &["layout"]),
    ("layout", &["kernels"]),
    ("kernels", &["numerics"]),
    ("weights", &["checkpoint", "numerics"]),
    ("checkpoint", &[]),
    ("sampling", &[]),
    ("numerics", &[]),
    ("meta", &["bytes", "error"]),
    ("error", &[]),
    ("bytes", &[]),
    ("progress", &[]),
];

/// The rooms every room above them may import.
const BELOW_ALL: [&str; 4] = ["meta", "error", "bytes", "progress"];

/// The one file below its room's layer: imported by `error`, importing nothing of the crate.
const LEAF: [&str; 2] = ["graphs", "captured"];

/// The rooms `room` may import: what its arrows reach, and the bottom rooms.
fn reach(room: &str) -> BTreeSet<&'static str> {
    let arrows = |r: &str| {
        ARROWS
            .iter()
            .find(|(name, _)| *name == r)
            .map_or(&[][..], |(_, to)| *to)
    };
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = arrows(room).to_vec();
    while let Some(next) = stack.pop() {
        if seen.insert(next) {
            stack.extend(arrows(next));
        }
    }
    if !BELOW_ALL.contains(&room) {
        seen.extend(BELOW_ALL);
    }
    seen
}

#[test]
fn model_layers_imports_only_downward() {
    let src = workspace_root().join("crates/model-layers/src");
    let imports = imports_of(&src);
    let room = |m: &ModPath| m.first().cloned();

    let mut unplaced = BTreeSet::new();
    let mut upward = Vec::new();
    for module in imports.files.keys() {
        let Some(from) = room(module) else {
            continue;
        };
        if !ARROWS.iter().any(|(name, _)| *name == from) {
            unplaced.insert(from.clone());
        }
    }
    for (module, targets) in &imports.edges {
        let Some(from) = room(module) else {
            continue;
        };
        let allowed = reach(&from);
        for (target, path) in targets {
            let Some(to) = room(target) else {
                continue;
            };
            let leaf = target.iter().map(String::as_str).eq(LEAF);
            if to == from || allowed.contains(to.as_str()) || (from == "error" && leaf) {
                continue;
            }
            let name = |m: &ModPath| {
                let file = &imports.files[m];
                file.strip_prefix(&src)
                    .unwrap_or(file)
                    .display()
                    .to_string()
            };
            upward.push(format!(
                "{} -> {}: `{path}` ({from} may import {allowed:?})",
                name(module),
                name(target)
            ));
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules at the crate's top with no place in the diagram (add them to it, and to \
         docs/ARCHITECTURE.md's): {unplaced:?}"
    );
    assert!(
        upward.is_empty(),
        "imports against the diagram:\n{}",
        upward.join("\n")
    );

    // The leaf stays one: it imports nothing of the crate, not even its own room.
    let leaf: ModPath = LEAF.iter().map(|s| s.to_string()).collect();
    let text = std::fs::read_to_string(&imports.files[&leaf]).expect("graphs/captured.rs");
    assert!(
        !text.contains("crate::") && !text.contains("super::"),
        "graphs::captured imports from the crate, so `error` naming it would import a layer above"
    );
}
