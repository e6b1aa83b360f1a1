//! What `gpu-check` packs and what it may weigh: the executables (stripped of debug info and
//! symbols; the unstripped ones stay in target/ to symbolise a device backtrace) and
//! the sm_90 cubins go into one gzip'd tar, `bundle.tgz`, that run.sh unpacks into a scratch
//! folder on the device (a second or so), so that what travels is small; the budget below holds
//! the working tree plus everything carried.
//!
//! Invariant: the budget is checked on the bytes that travel (the tracked tree as the device
//! tool sends it, plus the bundle folder), and a bundle over it is an error naming each size.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The most the working tree plus the bundle may weigh: the device tool carries 64 MiB, and
/// 8 MiB of it stay free for the tree to grow between a check and a device call (the largest
/// growth seen between two checks was 1.4 MiB of fixtures). 48 MiB until the quantized and
/// YaRN goldens and the fp8/int4 entries came, 52 MiB until the pipelined GEMM's PTX left
/// 0.4 MiB; the first device run (2026-12-04) carried 51.4 MiB without trouble.
pub const BUDGET_BYTES: u64 = 56 << 20;

/// The archive's name in the bundle folder.
pub const ARCHIVE: &str = "bundle.tgz";

/// Copies `executable` into `staging/name` without its debug info and symbols (0.5 MiB of the
/// packed bundle): a device backtrace's addresses are symbolised here with `addr2line -e` on
/// the unstripped executable in target/, the same build. A missing `strip` keeps both with a
/// warning.
pub fn stage_executable(executable: &Path, staging: &Path, name: &str) -> Result<u64, String> {
    let staged = staging.join(name);
    std::fs::copy(executable, &staged).map_err(|e| format!("{}: {e}", executable.display()))?;
    match Command::new("strip")
        .arg("--strip-all")
        .arg(&staged)
        .status()
    {
        Ok(s) if s.success() => {}
        _ => tracing::warn!(
            file = %staged.display(),
            "`strip --strip-all` failed: the bundle keeps its debug info and symbols"
        ),
    }
    file_bytes(&staged)
}

/// `tar -I 'gzip -9' -cf bundle/bundle.tgz -C staging ENTRIES...`; returns the archive's
/// bytes. gzip's best level (about 1 % under its default on these executables) keeps the
/// format run.sh unpacks with `tar -xzf`.
pub fn pack(staging: &Path, entries: &[&str], bundle: &Path) -> Result<u64, String> {
    let archive = bundle.join(ARCHIVE);
    let status = Command::new("tar")
        .args(["-I", "gzip -9", "-cf"])
        .arg(&archive)
        .arg("-C")
        .arg(staging)
        .args(entries)
        .status()
        .map_err(|e| format!("cannot run tar (needed to pack the bundle): {e}"))?;
    if !status.success() {
        return Err(format!(
            "tar -I 'gzip -9' -cf {} failed ({status})",
            archive.display()
        ));
    }
    file_bytes(&archive)
}

/// The sizes that decide whether a bundle may travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weights {
    /// Tracked files and untracked files git does not ignore: what the device tool always sends.
    pub tree: u64,
    /// The bundle folder as carried (archive, script, facts).
    pub bundle: u64,
    /// The main executable, unpacked (stripped of debug info and symbols).
    pub binary: u64,
    /// The executables and cubins, unpacked.
    pub unpacked: u64,
}

impl Weights {
    pub fn travels(&self) -> u64 {
        self.tree + self.bundle
    }

    /// One line of sizes in MiB.
    pub fn describe(&self) -> String {
        format!(
            "working tree {:.1} MiB + bundle {:.1} MiB = {:.1} MiB to carry (budget {:.0} MiB, \
             device limit 64 MiB); unpacked on the device: binary {:.1} MiB, binary + tree {:.1} MiB, \
             all executables and cubins {:.1} MiB",
            mib(self.tree),
            mib(self.bundle),
            mib(self.travels()),
            mib(BUDGET_BYTES),
            mib(self.binary),
            mib(self.binary + self.tree),
            mib(self.unpacked)
        )
    }

    /// An error naming the sizes when what travels is over the budget.
    pub fn check(&self) -> Result<(), String> {
        if self.travels() > BUDGET_BYTES {
            return Err(format!(
                "the device bundle is over budget: {}",
                self.describe()
            ));
        }
        Ok(())
    }
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

pub fn file_bytes(path: &Path) -> Result<u64, String> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Bytes of every file under `dir`, recursively.
pub fn folder_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let meta = entry.metadata().map_err(|e| e.to_string())?;
        total += if meta.is_dir() {
            folder_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// Bytes of what the device tool sends besides carried paths: tracked files and untracked
/// files git does not ignore.
pub fn tree_bytes(root: &Path) -> Result<u64, String> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| format!("git ls-files: {e}"))?;
    if !out.status.success() {
        return Err("git ls-files failed".into());
    }
    Ok(out
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .filter_map(|p| std::fs::metadata(root.join(String::from_utf8_lossy(p).as_ref())).ok())
        .map(|m| m.len())
        .sum())
}

/// A fresh, empty folder (removed first if it exists).
pub fn fresh_folder(path: &Path) -> Result<PathBuf, String> {
    if path.exists() {
        std::fs::remove_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_the_budget_is_an_error_naming_every_size() {
        let fits = Weights {
            tree: 38 << 20,
            bundle: 4 << 20,
            binary: 8 << 20,
            unpacked: 14 << 20,
        };
        assert!(fits.check().is_ok());
        let over = Weights {
            bundle: 19 << 20,
            ..fits
        };
        let error = over.check().unwrap_err();
        for part in [
            "over budget",
            "working tree 38.0 MiB",
            "bundle 19.0 MiB",
            "57.0 MiB to carry",
            "budget 56 MiB",
        ] {
            assert!(error.contains(part), "{part}: {error}");
        }
    }

    /// A packed folder unpacks to the same bytes (what run.sh does on the device).
    #[test]
    fn a_packed_bundle_unpacks_to_its_files() {
        let dir = std::env::temp_dir().join(format!("solder-bundle-{}", std::process::id()));
        let staging = fresh_folder(&dir.join("staging")).unwrap();
        let bundle = fresh_folder(&dir.join("bundle")).unwrap();
        std::fs::create_dir_all(staging.join("cubin")).unwrap();
        std::fs::write(staging.join("solder"), vec![7u8; 100_000]).unwrap();
        std::fs::write(staging.join("cubin/MANIFEST"), "m").unwrap();
        let bytes = pack(&staging, &["solder", "cubin"], &bundle).unwrap();
        assert!(bytes > 0 && bytes < 10_000, "{bytes}");
        let out = fresh_folder(&dir.join("out")).unwrap();
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(bundle.join(ARCHIVE))
            .arg("-C")
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(
            std::fs::read(out.join("solder")).unwrap(),
            vec![7u8; 100_000]
        );
        assert_eq!(
            std::fs::read_to_string(out.join("cubin/MANIFEST")).unwrap(),
            "m"
        );
        assert_eq!(folder_bytes(&staging).unwrap(), 100_001);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
