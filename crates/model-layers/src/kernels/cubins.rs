//! Cubins beside the embedded PTX: a folder of `<module>.cubin` files assembled ahead of time
//! (by `cargo xtask gpu-check`, with the pinned ptxas) and a `MANIFEST` naming, per module, the
//! SHA-256 of the PTX it was assembled from. A CUDA backend loads a module's cubin (no JIT) only
//! when that digest is the embedded PTX's own and the file has the size the manifest says;
//! anything else is a reason, logged, to JIT-compile the embedded PTX instead.
//!
//! Invariant: this module owns the manifest's format; `manifest_text` writes what `Cubins::open`
//! reads, and nothing else writes one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The manifest's file name in a cubin folder.
pub const MANIFEST: &str = "MANIFEST";
/// The manifest's first line (its format version).
const HEADER: &str = "solder cubins 1";

/// A cubin folder that could not be used at all.
#[derive(Debug, thiserror::Error)]
pub enum CubinError {
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("{path}:{line}: {message}")]
    Manifest {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// One module's line of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinEntry {
    pub module: String,
    /// SHA-256 (lowercase hex) of the PTX the cubin was assembled from.
    pub ptx_sha256: String,
    pub bytes: u64,
}

/// The manifest of a cubin folder: `arch` (e.g. `sm_90`), what assembled it, one line a module.
pub fn manifest_text(arch: &str, assembler: &str, entries: &[CubinEntry]) -> String {
    let mut text = format!("{HEADER}\narch {arch}\nassembler {assembler}\n");
    for entry in entries {
        text.push_str(&format!(
            "module {} {} {}\n",
            entry.module, entry.ptx_sha256, entry.bytes
        ));
    }
    text
}

/// An opened cubin folder: its manifest, read and checked for form.
#[derive(Debug, Clone)]
pub struct Cubins {
    dir: PathBuf,
    /// The architecture the cubins were assembled for (`sm_90`).
    pub arch: String,
    /// What assembled them (`ptxas 13.0.88`).
    pub assembler: String,
    entries: BTreeMap<String, CubinEntry>,
}

impl Cubins {
    /// Reads `dir/MANIFEST`. A missing or malformed manifest is an error naming the file (and
    /// line); a module it does not list is not (that module's PTX is JIT-compiled).
    pub fn open(dir: &Path) -> Result<Cubins, CubinError> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| CubinError::Io {
            path: path.clone(),
            message: format!("{e} (a cubin folder holds a MANIFEST beside its .cubin files)"),
        })?;
        let bad = |line: usize, message: String| CubinError::Manifest {
            path: path.clone(),
            line,
            message,
        };
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
        match lines.next() {
            Some((_, HEADER)) => {}
            other => {
                return Err(bad(
                    1,
                    format!(
                        "starts with {:?}, expected {HEADER:?}",
                        other.map_or("", |(_, l)| l)
                    ),
                ))
            }
        }
        let (mut arch, mut assembler) = (None, None);
        let mut entries = BTreeMap::new();
        for (number, line) in lines {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [] => {}
                ["arch", value] => arch = Some(value.to_string()),
                ["assembler", rest @ ..] if !rest.is_empty() => assembler = Some(rest.join(" ")),
                ["module", module, digest, bytes] => {
                    let well_formed = digest.len() == 64
                        && digest
                            .bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                    if !well_formed {
                        return Err(bad(
                            number,
                            format!("module `{module}`: `{digest}` is not a SHA-256 in hex"),
                        ));
                    }
                    let bytes = bytes.parse().map_err(|_| {
                        bad(
                            number,
                            format!("module `{module}`: `{bytes}` is not a byte count"),
                        )
                    })?;
                    let entry = CubinEntry {
                        module: module.to_string(),
                        ptx_sha256: digest.to_string(),
                        bytes,
                    };
                    if entries.insert(module.to_string(), entry).is_some() {
                        return Err(bad(number, format!("module `{module}` is listed twice")));
                    }
                }
                _ => {
                    return Err(bad(
                        number,
                        format!("`{line}`: expected `arch A`, `assembler ...` or `module NAME SHA256 BYTES`"),
                    ))
                }
            }
        }
        let arch = arch.ok_or_else(|| bad(0, "no `arch` line".into()))?;
        let assembler = assembler.ok_or_else(|| bad(0, "no `assembler` line".into()))?;
        Ok(Cubins {
            dir: dir.to_path_buf(),
            arch,
            assembler,
            entries,
        })
    }

    /// `module`'s cubin when it was assembled from `ptx_sha256` (the embedded PTX's digest) and
    /// its file is whole; otherwise why not, in words for the log.
    pub fn image(&self, module: &str, ptx_sha256: &str) -> Result<Vec<u8>, String> {
        let entry = self
            .entries
            .get(module)
            .ok_or_else(|| format!("{} lists no cubin for it", self.manifest().display()))?;
        if entry.ptx_sha256 != ptx_sha256 {
            return Err(format!(
                "its cubin was assembled from other PTX (sha256 {}…, the embedded PTX's is {}…): \
                 rebuild the bundle",
                &entry.ptx_sha256[..12],
                ptx_sha256.get(..12).unwrap_or(ptx_sha256)
            ));
        }
        let path = self.dir.join(format!("{module}.cubin"));
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if bytes.len() as u64 != entry.bytes {
            return Err(format!(
                "{}: {} bytes, the manifest says {} (a partial copy?)",
                path.display(),
                bytes.len(),
                entry.bytes
            ));
        }
        Ok(bytes)
    }

    /// Whether the cubins suit a device of compute capability `(major, minor)`: `sm_XY` cubins
    /// run only on X.Y devices.
    pub fn suits(&self, capability: (u32, u32)) -> bool {
        self.arch == format!("sm_{}{}", capability.0, capability.1)
    }

    fn manifest(&self) -> PathBuf {
        self.dir.join(MANIFEST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("solder-cubins-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    const DIGEST: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_written_manifest_reads_back_and_gives_the_matching_cubin_only() {
        let dir = folder("roundtrip");
        let cubin = b"\x7fELF-not-really".to_vec();
        std::fs::write(dir.join("norm.cubin"), &cubin).unwrap();
        let entries = [CubinEntry {
            module: "norm".into(),
            ptx_sha256: DIGEST.into(),
            bytes: cubin.len() as u64,
        }];
        std::fs::write(
            dir.join(MANIFEST),
            manifest_text("sm_90", "ptxas 13.0.88", &entries),
        )
        .unwrap();
        let cubins = Cubins::open(&dir).unwrap();
        assert_eq!(cubins.arch, "sm_90");
        assert_eq!(cubins.assembler, "ptxas 13.0.88");
        assert!(cubins.suits((9, 0)) && !cubins.suits((8, 0)));
        assert_eq!(cubins.image("norm", DIGEST).unwrap(), cubin);
        let other = DIGEST.replace('0', "1");
        assert!(cubins
            .image("norm", &other)
            .unwrap_err()
            .contains("assembled from other PTX"));
        assert!(cubins
            .image("gemv", DIGEST)
            .unwrap_err()
            .contains("lists no cubin"));
        // A truncated copy is refused, naming the sizes.
        std::fs::write(dir.join("norm.cubin"), &cubin[..4]).unwrap();
        let why = cubins.image("norm", DIGEST).unwrap_err();
        assert!(why.contains("4 bytes, the manifest says 15"), "{why}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_malformed_manifest_is_an_error_naming_the_line() {
        let dir = folder("malformed");
        let cases = [
            ("", "starts with"),
            ("solder cubins 1\narch sm_90\nassembler p\nmodule norm xyz 3\n", ":4: module `norm`"),
            (
                &format!("solder cubins 1\narch sm_90\nassembler p\nmodule norm {DIGEST} many\n"),
                "not a byte count",
            ),
            (
                &format!("solder cubins 1\narch sm_90\nassembler p\nmodule a {DIGEST} 1\nmodule a {DIGEST} 1\n"),
                "listed twice",
            ),
            ("solder cubins 1\nassembler p\n", "no `arch` line"),
            ("solder cubins 1\narch sm_90\nwhat\n", ":3: `what`"),
        ];
        for (text, expected) in cases {
            std::fs::write(dir.join(MANIFEST), text).unwrap();
            let error = Cubins::open(&dir).unwrap_err().to_string();
            assert!(error.contains(expected), "{text:?}: {error}");
            assert!(error.contains("MANIFEST"), "{error}");
        }
        std::fs::remove_file(dir.join(MANIFEST)).unwrap();
        let error = Cubins::open(&dir).unwrap_err().to_string();
        assert!(
            error.contains("MANIFEST") && error.contains("holds a MANIFEST"),
            "{error}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
