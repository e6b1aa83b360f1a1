//! The pinned CUDA wheels: found in `target/cuda-wheels`, or installed there with pip
//! (`--no-deps`, so nothing but the three pins lands in the folder), and the re-exec that puts
//! their libraries on `LD_LIBRARY_PATH` for the dynamic loader.
//!
//! Invariant: a newer wheel emits PTX the device driver (CUDA 13.0) rejects, so the folder holds
//! exactly these versions or is reinstalled.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const NVRTC_PIN: &str = "13.0.88";
pub const RUNTIME_PIN: &str = "13.0.96";
pub const NVCC_PIN: &str = "13.0.88";

/// (distribution name as in its dist-info folder, pip requirement).
const WHEELS: [(&str, &str, &str); 3] = [
    ("nvidia_cuda_nvrtc", "nvidia-cuda-nvrtc", NVRTC_PIN),
    ("nvidia_cuda_runtime", "nvidia-cuda-runtime", RUNTIME_PIN),
    ("nvidia_cuda_nvcc", "nvidia-cuda-nvcc", NVCC_PIN),
];

/// Set in the re-executed process so that it never loops.
const REEXEC_MARK: &str = "SOLDER_PTX_REEXEC";

pub struct Toolchain {
    /// `<wheels>/nvidia/cu13/include` (cuda_bf16.h).
    pub include: PathBuf,
    /// `<wheels>/nvidia/cu13/lib` (libnvrtc.so.13, libnvrtc-builtins.so.13.0).
    pub lib: PathBuf,
    /// `<wheels>/nvidia/cu13/bin/ptxas`.
    pub ptxas: PathBuf,
}

impl Toolchain {
    /// The wheels under `<root>/target/cuda-wheels`, installed first when absent or not exactly
    /// the pinned versions.
    pub fn ensure(root: &Path) -> Result<Toolchain, String> {
        let folder = root.join("target").join("cuda-wheels");
        if !pinned(&folder) {
            install(&folder)?;
            if !pinned(&folder) {
                return Err(format!(
                    "{} still does not hold exactly the pinned wheels after pip install",
                    folder.display()
                ));
            }
        }
        let cu13 = folder.join("nvidia").join("cu13");
        let tools = Toolchain {
            include: cu13.join("include"),
            lib: cu13.join("lib"),
            ptxas: cu13.join("bin").join("ptxas"),
        };
        for needed in [
            tools.include.join("cuda_bf16.h"),
            tools.lib.join("libnvrtc.so.13"),
            tools.ptxas.clone(),
        ] {
            if !needed.exists() {
                return Err(format!(
                    "{} is missing from the wheels in {}; delete the folder to reinstall",
                    needed.display(),
                    folder.display()
                ));
            }
        }
        Ok(tools)
    }
}

/// Whether `folder` holds the three pinned wheels and no other distribution.
fn pinned(folder: &Path) -> bool {
    let Ok(entries) = fs::read_dir(folder) else {
        return false;
    };
    let mut dist_infos: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".dist-info"))
        .collect();
    dist_infos.sort();
    let mut want: Vec<String> = WHEELS
        .iter()
        .map(|(dist, _, version)| format!("{dist}-{version}.dist-info"))
        .collect();
    want.sort();
    dist_infos == want
}

fn install(folder: &Path) -> Result<(), String> {
    if folder.exists() {
        eprintln!(
            "{} does not hold exactly the pinned CUDA wheels: reinstalling",
            folder.display()
        );
        fs::remove_dir_all(folder)
            .map_err(|e| format!("cannot remove {}: {e}", folder.display()))?;
    }
    let requirements: Vec<String> = WHEELS
        .iter()
        .map(|(_, name, version)| format!("{name}=={version}"))
        .collect();
    eprintln!(
        "installing {} into {}",
        requirements.join(" "),
        folder.display()
    );
    let mut tried = Vec::new();
    for python in ["python3", "python"] {
        let status = Command::new(python)
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
            .arg(folder)
            .args(&requirements)
            .status();
        match status {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => tried.push(format!("`{python} -m pip install` exited with {s}")),
            Err(e) => tried.push(format!("`{python}` could not be started: {e}")),
        }
    }
    Err(format!(
        "cannot install the pinned CUDA wheels ({}) into {}: {}",
        requirements.join(" "),
        folder.display(),
        tried.join("; ")
    ))
}

/// Re-runs this process with the wheel's lib folder first on LD_LIBRARY_PATH (libnvrtc loads
/// libnvrtc-builtins by name), unless this already is that process. Returns only in the
/// process that should do the work; otherwise exits with the child's status.
pub fn reexec_with_library_path(tools: &Toolchain) -> Result<(), String> {
    if std::env::var_os(REEXEC_MARK).is_some() {
        return Ok(());
    }
    let mut paths: Vec<PathBuf> = vec![tools.lib.clone()];
    if let Some(existing) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&existing));
    }
    let joined: OsString =
        std::env::join_paths(paths).map_err(|e| format!("bad LD_LIBRARY_PATH: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let status = Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", joined)
        .env(REEXEC_MARK, "1")
        .status()
        .map_err(|e| format!("cannot re-run {}: {e}", exe.display()))?;
    std::process::exit(status.code().unwrap_or(1));
}
