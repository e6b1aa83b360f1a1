//! `cargo xtask emu`: builds the host emulation of the CUDA kernels, one shared library per
//! module, `target/emu/libsolder_emu_<module>.so`, from `crates/kernels/cuda/<module>.cu`
//! (unchanged) and `crates/kernels/emu/cuda_emu.hpp` with g++ (C++20). `parity --backend
//! emu` runs on it (`solder_gpu_runtime::cpu::emu`).
//!
//! Invariants: a library is rebuilt exactly when its inputs changed (the generated source,
//! every file it includes, the compiler and its flags: their digest is kept beside it); a
//! library is written under a temporary name and renamed, so a reader never loads half of
//! one; no g++ is an error naming g++, never a silent skip.

mod generate;
pub mod report;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use solder_gpu_runtime::cpu::emu::{library_path, EmuMode, Emulation};

use crate::args::Args;

const HELP: &str = "usage: cargo xtask emu [--force]

  builds target/emu/libsolder_emu_<module>.so for every kernel module: the CUDA sources
  compiled unchanged for the host with g++ -std=c++20 -O2 -ffp-contract=off (threads of a
  block as fibers, blocks one after another; crates/kernels/emu/cuda_emu.hpp), rebuilt only
  when an input changed. `cargo xtask parity --backend emu` uses them.
  --force    rebuild every module";

/// The compiler and its flags (part of each library's digest).
pub(crate) const CXX: &str = "g++";
pub(crate) const CXX_FLAGS: &[&str] = &[
    "-std=c++20",
    "-O2",
    // Exact IEEE operations: no contraction into fma, no fast-math; CUDA C's casts between
    // pointer types are legal there, so no strict-aliasing assumptions either.
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-fPIC",
    "-shared",
    // Only the kernels' trampolines are exported (`EMU_EXPORT`): the emulator's inline
    // globals would otherwise be unique symbols, one per process for every library.
    "-fvisibility=hidden",
    "-w",
];

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(argv, &[], &["force", "help"])?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    build(&crate::paths::workspace_root(), args.flag("force")).map(|_| ())
}

/// The folder the libraries are built in.
pub fn dir(root: &Path) -> PathBuf {
    root.join("target").join("emu")
}

/// Builds what is stale (every module with `force`); returns the libraries' folder.
pub fn build(root: &Path, force: bool) -> Result<PathBuf, String> {
    // One build at a time in this process (tests); other processes write other partials.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = BUILDING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let started = Instant::now();
    let out = dir(root);
    let src_dir = out.join("src");
    std::fs::create_dir_all(&src_dir).map_err(|e| format!("{}: {e}", src_dir.display()))?;
    let version = compiler_version()?;
    let mut jobs = Vec::new();
    let mut fresh = 0;
    for module in solder_kernels::MODULES {
        let unit = generate::unit(root, module)?;
        let digest = digest(&unit, &version);
        let library = library_path(&out, module);
        let stamp = out.join(format!("libsolder_emu_{module}.digest"));
        let current = std::fs::read_to_string(&stamp).unwrap_or_default();
        if !force && current.trim() == digest && library.is_file() {
            fresh += 1;
            continue;
        }
        let source = src_dir.join(format!("{module}.cpp"));
        crate::files::write_output(
            &source,
            unit.text.as_bytes(),
            &crate::files::Inputs::default(),
        )?;
        jobs.push((module, source, library, stamp, digest));
    }
    // g++ over the stale modules side by side (the largest source first), each writing an
    // unpredictable name beside its library, renamed over it once built.
    let built = crate::jobs::side_by_side(
        &jobs,
        |(_, source, ..)| std::fs::metadata(source).map_or(0, |f| f.len()),
        |(_, source, library, ..)| {
            let partial = crate::files::temporary_beside(library);
            let output = Command::new(CXX)
                .args(CXX_FLAGS)
                .arg("-I")
                .arg(root.join(generate::EMU_DIR))
                .arg("-I")
                .arg(root.join(solder_kernels::CUDA_DIR))
                .arg(source)
                .arg("-o")
                .arg(&partial)
                .output();
            (partial, output)
        },
    );
    // A failure leaves no partial behind, and no library of this build renamed in.
    let failed = jobs
        .iter()
        .zip(&built)
        .find_map(|((module, ..), (_, output))| match output {
            Err(e) => Some(no_compiler(e)),
            Ok(o) if !o.status.success() => Some(format!(
                "emu: g++ failed on module `{module}` ({}):\n{}",
                generate::source_path(root, module).display(),
                String::from_utf8_lossy(&o.stderr)
            )),
            Ok(_) => None,
        });
    if let Some(error) = failed {
        for (partial, _) in &built {
            let _ = std::fs::remove_file(partial);
        }
        return Err(error);
    }
    for ((_, _, library, stamp, digest), (partial, _)) in jobs.iter().zip(&built) {
        std::fs::rename(partial, library).map_err(|e| format!("{}: {e}", library.display()))?;
        crate::files::write_output(stamp, digest.as_bytes(), &crate::files::Inputs::default())?;
    }
    println!(
        "emu: {} modules built, {fresh} up to date, in {} ({:.1} s)",
        jobs.len(),
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(out)
}

/// Builds what is stale and opens the emulation of every module. A parameter named
/// `scratch` (attention's flash-decoding partials, gemv's split-K partials) or `o_scratch`
/// (the o-fold kernels' per-head partials) is not compared in
/// shadow mode, in a kernel or any variant entry of it: the twin computes in one pass and
/// leaves it alone.
#[cfg(test)]
pub fn emulation(root: &Path, mode: EmuMode) -> Result<Emulation, String> {
    open_built(&build(root, false)?, 0, mode)
}

/// Opens the emulation `build` left in `out`, with every kernel's scratch arguments as
/// `emulation` names them. Copy 0 loads the built libraries; copy `n` loads copies of them
/// made in `out/copy-n`, a file the loader has not seen, so its statics (each module's
/// launch lock, `__shared__` storage and indices) are its own: parity's workers open one
/// copy each and run their launches side by side, not one module launch at a time.
pub fn open_built(out: &Path, copy: usize, mode: EmuMode) -> Result<Emulation, String> {
    let dir = match copy {
        0 => out.to_path_buf(),
        n => copy_libraries(out, n)?,
    };
    let mut emulation =
        Emulation::open(&dir, solder_kernels::MODULES, mode).map_err(|e| e.to_string())?;
    for decl in solder_model_layers::kernels::registry() {
        let variants = solder_model_layers::kernels::variants()
            .filter(|(_, base)| *base == decl.name)
            .map(|(variant, _)| variant);
        for name in std::iter::once(decl.name).chain(variants) {
            for (index, param) in decl.params.iter().enumerate() {
                if param.name == "scratch" || param.name == "o_scratch" {
                    emulation.scratch_argument(name, index);
                }
            }
        }
    }
    Ok(emulation)
}

/// Every module's library in `out` copied to `out/copy-n` (each written beside its name,
/// then renamed over it: a process that has the last copy loaded keeps it); that folder.
fn copy_libraries(out: &Path, n: usize) -> Result<PathBuf, String> {
    let dir = out.join(format!("copy-{n}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for module in solder_kernels::MODULES {
        let (from, to) = (library_path(out, module), library_path(&dir, module));
        let partial = crate::files::temporary_beside(&to);
        std::fs::copy(&from, &partial)
            .and_then(|_| std::fs::rename(&partial, &to))
            .map_err(|e| format!("emu: copying {} to {}: {e}", from.display(), to.display()))?;
    }
    Ok(dir)
}

fn no_compiler(e: &std::io::Error) -> String {
    format!(
        "emu: cannot run `{CXX}` ({e}): the host emulation of the CUDA kernels needs g++ 12 or \
         newer (C++20) on PATH (Debian/Ubuntu: apt-get install g++)"
    )
}

fn compiler_version() -> Result<String, String> {
    let output = Command::new(CXX)
        .arg("--version")
        .output()
        .map_err(|e| no_compiler(&e))?;
    if !output.status.success() {
        return Err(format!("emu: `{CXX} --version` failed"));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// Hex digest of the unit's text, every file it includes, the compiler and the flags.
fn digest(unit: &generate::Unit, version: &str) -> String {
    let mut hasher = DefaultHasher::new();
    unit.text.hash(&mut hasher);
    unit.inputs.hash(&mut hasher);
    version.hash(&mut hasher);
    CXX_FLAGS.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

#[cfg(test)]
mod semantics;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests_flash;
#[cfg(test)]
mod tests_fold;
#[cfg(test)]
mod tests_fused_quant;
#[cfg(test)]
mod tests_gdn;
#[cfg(test)]
mod tests_gdn_chunked;
#[cfg(test)]
mod tests_gdn_out;
#[cfg(test)]
mod tests_gemm;
#[cfg(test)]
mod tests_large;
#[cfg(test)]
mod tests_moe_quant;
#[cfg(test)]
mod tests_mutation;
#[cfg(test)]
mod tests_nan;
#[cfg(test)]
mod tests_narrow;
#[cfg(test)]
mod tests_pick;
#[cfg(test)]
mod tests_pipe;
#[cfg(test)]
mod tests_positions;
#[cfg(test)]
mod tests_prefetch;
#[cfg(test)]
mod tests_quant;
#[cfg(test)]
mod tests_rope_mma;
#[cfg(test)]
mod tests_split;
#[cfg(test)]
mod tests_want;
