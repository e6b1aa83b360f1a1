//! Where xtask finds the workspace: every path a command reads or writes is joined onto
//! [`workspace_root`].
//!
//! Invariant: nothing in xtask names the workspace's location another way (no
//! `CARGO_MANIFEST_DIR` arithmetic elsewhere), so the bundled binary, which runs from a copy of
//! the tree, finds the same files as `cargo xtask`.

use std::path::PathBuf;

/// The workspace root: the current directory when it holds `fusions/FUSIONS.toml` (the
/// bundled binary runs from a copy of the tree, where the build's paths do not exist), else
/// the folder above xtask's own.
pub fn workspace_root() -> PathBuf {
    if let Ok(cwd) = std::env::current_dir() {
        if cwd.join("fusions/FUSIONS.toml").is_file() {
            return cwd;
        }
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}
