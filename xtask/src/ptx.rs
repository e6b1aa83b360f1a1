//! `cargo xtask ptx [--check]`: compiles every `crates/kernels/cuda/*.cu` with NVRTC for `compute_90` into
//! `crates/kernels/ptx/<module>.ptx.deflate` (checked in deflated, `solder_kernels::pack_ptx`;
//! embedded by the runtime). `--unpack DIR` writes the checked-in PTX as plain text for reading.
//!
//! `--check` regenerates into a temporary folder and fails on any difference from the
//! checked-in PTX, on a `.cu` without its `.ptx` (or the reverse), on a kernel that
//! `fusions/FUSIONS.toml` names but no PTX defines, on a kernel that does not wait for the
//! previous grid before it writes (`pdl`: `griddepcontrol.wait`, needed under the `pdl` lever),
//! and on any register spill or local-memory
//! stack frame in `ptxas -arch=sm_90 -v`; it prints registers, shared memory and occupancy
//! (blocks and warps per SM, `occupancy`) per kernel.
//!
//! Invariants: the toolchain is exactly the pinned wheels in `target/cuda-wheels` (installed
//! there by this command, never into the system); the same sources give the same PTX bytes.

mod nvrtc;
mod occupancy;
mod pdl;
mod ptxas;
mod toolchain;

use std::fs;
use std::path::{Path, PathBuf};

use crate::args::Args;
use crate::paths::workspace_root;

const USAGE: &str = "usage: cargo xtask ptx [--check]

  (no option)  regenerate crates/kernels/ptx/<module>.ptx.deflate (the PTX, deflated) from
               crates/kernels/cuda/<module>.cu
  --check      regenerate into a temp folder, fail on any difference from the checked-in PTX,
               assemble every module with ptxas -arch=sm_90 -v, fail on spills, stack frames,
               a FUSIONS.toml kernel missing from the PTX or a kernel that writes before
               griddepcontrol.wait (pdl_wait), and print a resource table
  --unpack DIR write the checked-in PTX as plain DIR/<module>.ptx (no toolchain needed)";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let args = Args::parse(argv, &["unpack"], &["check"])?;
    let root = workspace_root();
    let ptx_dir = root.join(solder_kernels::PTX_DIR);
    if let Some(dir) = args.value("unpack") {
        return unpack_to(&ptx_dir, Path::new(dir));
    }
    let tools = toolchain::Toolchain::ensure(&root)?;
    // The loader reads LD_LIBRARY_PATH only at start: re-run this command with it set.
    toolchain::reexec_with_library_path(&tools)?;

    let kernels_dir = root.join(solder_kernels::CUDA_DIR);
    let sources = sources(&kernels_dir)?;
    if args.flag("check") {
        check(&root, &tools, &sources, &ptx_dir)
    } else {
        fs::create_dir_all(&ptx_dir)
            .map_err(|e| format!("cannot create {}: {e}", ptx_dir.display()))?;
        let written = generate(&tools, &kernels_dir, &sources, &ptx_dir)?;
        remove_stale(&ptx_dir, &sources)?;
        for path in written {
            println!("wrote {}", relative(&root, &path));
        }
        Ok(())
    }
}

/// Module names (file stems) of `crates/kernels/cuda/*.cu`, sorted.
fn sources(kernels_dir: &Path) -> Result<Vec<String>, String> {
    let entries = fs::read_dir(kernels_dir)
        .map_err(|e| format!("cannot read {}: {e}", kernels_dir.display()))?;
    let mut modules = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "cu") {
            if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                modules.push(stem.to_string());
            }
        }
    }
    modules.sort();
    if modules.is_empty() {
        return Err(format!("no .cu files in {}", kernels_dir.display()));
    }
    Ok(modules)
}

/// Compiles every module: (module, its PTX text).
fn compile_all(
    tools: &toolchain::Toolchain,
    kernels_dir: &Path,
    modules: &[String],
) -> Result<Vec<(String, String)>, String> {
    let version = nvrtc::version()?;
    let mut compiled = Vec::new();
    for module in modules {
        let cu = kernels_dir.join(format!("{module}.cu"));
        let source =
            fs::read_to_string(&cu).map_err(|e| format!("cannot read {}: {e}", cu.display()))?;
        let ptx = nvrtc::compile(tools, kernels_dir, module, &source, version)?;
        compiled.push((module.clone(), ptx));
    }
    Ok(compiled)
}

/// Compiles every module into `out_dir` as it is checked in (`<module>.ptx.deflate`); returns
/// the written paths.
fn generate(
    tools: &toolchain::Toolchain,
    kernels_dir: &Path,
    modules: &[String],
    out_dir: &Path,
) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    for (module, ptx) in compile_all(tools, kernels_dir, modules)? {
        let path = out_dir.join(solder_kernels::packed_ptx_file(&module));
        let packed = solder_kernels::pack_ptx(&ptx);
        crate::files::write_output(&path, &packed, &crate::files::Inputs::default())?;
        written.push(path);
    }
    Ok(written)
}

/// Writes `compiled` into `dir` as plain `<module>.ptx` (what ptxas and the checks read).
fn write_plain(dir: &Path, compiled: &[(String, String)]) -> Result<(), String> {
    for (module, ptx) in compiled {
        let path = dir.join(format!("{module}.ptx"));
        fs::write(&path, ptx).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The checked-in PTX of `module` as text.
fn read_packed(ptx_dir: &Path, module: &str) -> Result<String, String> {
    let path = ptx_dir.join(solder_kernels::packed_ptx_file(module));
    let bytes = fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    solder_kernels::unpack_ptx(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// `cargo xtask ptx --unpack DIR`: every checked-in module as plain `DIR/<module>.ptx`.
fn unpack_to(ptx_dir: &Path, dir: &Path) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let modules = ptx_files(ptx_dir)?;
    if modules.is_empty() {
        return Err(format!(
            "no *{} in {}: run `cargo xtask ptx`",
            solder_kernels::PACKED_PTX_SUFFIX,
            ptx_dir.display()
        ));
    }
    for module in modules {
        let text = read_packed(ptx_dir, &module)?;
        let path = dir.join(format!("{module}.ptx"));
        crate::files::write_output(&path, text.as_bytes(), &crate::files::Inputs::default())?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Removes checked-in PTX files whose `.cu` is gone, and plain `ptx/*.ptx` left from before
/// the PTX was checked in deflated.
fn remove_stale(ptx_dir: &Path, modules: &[String]) -> Result<(), String> {
    let mut stale: Vec<PathBuf> = ptx_files(ptx_dir)?
        .into_iter()
        .filter(|m| !modules.contains(m))
        .map(|m| ptx_dir.join(solder_kernels::packed_ptx_file(&m)))
        .collect();
    if let Ok(entries) = fs::read_dir(ptx_dir) {
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.extension().is_some_and(|x| x == "ptx") {
                stale.push(path);
            }
        }
    }
    for path in stale {
        fs::remove_file(&path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
        println!("removed stale {}", path.display());
    }
    Ok(())
}

/// The modules whose packed PTX is in `ptx_dir`, sorted.
fn ptx_files(ptx_dir: &Path) -> Result<Vec<String>, String> {
    let mut modules = Vec::new();
    let Ok(entries) = fs::read_dir(ptx_dir) else {
        return Ok(modules);
    };
    for entry in entries {
        let name = entry.map_err(|e| e.to_string())?.file_name();
        if let Some(module) = name.to_str().and_then(solder_kernels::packed_ptx_module) {
            modules.push(module.to_string());
        }
    }
    modules.sort();
    Ok(modules)
}

fn check(
    root: &Path,
    tools: &toolchain::Toolchain,
    modules: &[String],
    ptx_dir: &Path,
) -> Result<(), String> {
    let temp = std::env::temp_dir().join(format!("solder-ptx-check-{}", std::process::id()));
    fs::create_dir_all(&temp).map_err(|e| format!("cannot create {}: {e}", temp.display()))?;
    let failures = check_in(root, tools, modules, ptx_dir, &temp);
    let _ = fs::remove_dir_all(&temp);
    let failures = failures?;
    if failures.is_empty() {
        println!(
            "ptx check passed: {} modules, NVRTC {} (nvidia-cuda-nvrtc=={}), ptxas {}",
            modules.len(),
            nvrtc::version_text()?,
            toolchain::NVRTC_PIN,
            toolchain::NVCC_PIN
        );
        Ok(())
    } else {
        Err(format!("ptx check failed:\n  {}", failures.join("\n  ")))
    }
}

/// The check's findings, with fresh PTX and cubins written to `temp`.
fn check_in(
    root: &Path,
    tools: &toolchain::Toolchain,
    modules: &[String],
    ptx_dir: &Path,
    temp: &Path,
) -> Result<Vec<String>, String> {
    let mut failures = Vec::new();
    let compiled = compile_all(tools, &root.join(solder_kernels::CUDA_DIR), modules)?;
    write_plain(temp, &compiled)?;
    // 1. The checked-in PTX is what the sources give.
    for (module, fresh) in &compiled {
        let path = ptx_dir.join(solder_kernels::packed_ptx_file(module));
        match read_packed(ptx_dir, module) {
            Err(e) if !path.exists() => failures.push(format!(
                "{} is missing ({e}): run `cargo xtask ptx`",
                relative(root, &path)
            )),
            Err(e) => failures.push(format!("{e}: run `cargo xtask ptx`")),
            Ok(old) if old != *fresh => failures.push(format!(
                "{} differs from crates/kernels/cuda/{module}.cu's NVRTC output ({}): run `cargo xtask ptx`",
                relative(root, &path),
                first_difference(&old, fresh)
            )),
            Ok(_) => {}
        }
    }
    for stale in ptx_files(ptx_dir)?
        .into_iter()
        .filter(|m| !modules.contains(m))
    {
        failures.push(format!(
            "crates/kernels/ptx/{} has no crates/kernels/cuda/{stale}.cu",
            solder_kernels::packed_ptx_file(&stale)
        ));
    }
    // 2. Every kernel the rules name is defined; ops kernels without PTX are reported.
    let entries = ptxas::entries(temp, modules)?;
    for kernel in required_kernels(root)? {
        if !entries.contains(&kernel) {
            failures.push(format!(
                "kernel `{kernel}` is named in fusions/FUSIONS.toml but no crates/kernels/ptx/*.ptx defines it"
            ));
        }
    }
    for kernel in solder_model_layers::kernels::kernel_names() {
        if !entries.iter().any(|e| e == kernel) {
            failures.push(format!(
                "kernel `{kernel}` is declared (with a CPU twin) but no crates/kernels/ptx/*.ptx defines it"
            ));
        }
    }
    for (variant, kernel) in solder_model_layers::kernels::variants() {
        if !entries.iter().any(|e| e == variant) {
            failures.push(format!(
                "entry `{variant}` (a variant of `{kernel}`) is declared but no crates/kernels/ptx/*.ptx defines it"
            ));
        }
    }
    // 3. Programmatic dependent launch: every kernel waits for the previous grid (`pdl`).
    let pdl_failures = pdl::check(&compiled);
    if pdl_failures.is_empty() {
        println!("pdl: every kernel waits (griddepcontrol.wait) before it writes");
    }
    failures.extend(pdl_failures);
    // 4. ptxas: no spills, no stack frames; the table.
    let report = ptxas::assemble_all(tools, temp, modules)?;
    println!("{}", ptxas::table(&report));
    failures.extend(ptxas::violations(&report));
    Ok(failures)
}

/// `module::func` of every `.entry` in the PTX embedded in this binary
/// (`solder_kernels::ptx_modules`), which is what a device loads.
pub fn embedded_entries() -> std::collections::BTreeSet<String> {
    solder_kernels::ptx_modules()
        .iter()
        .flat_map(|(module, text)| ptxas::entries_of(module, text))
        .collect()
}

/// `module::func` of every kernel FUSIONS.toml names.
fn required_kernels(root: &Path) -> Result<Vec<String>, String> {
    let path = root.join("fusions").join("FUSIONS.toml");
    let rules = solder_circuit::rules::RuleSet::from_file(&path).map_err(|e| e.to_string())?;
    let mut kernels: Vec<String> = rules
        .rules
        .iter()
        .flat_map(|r| r.kernels.iter().cloned())
        .collect();
    kernels.sort();
    kernels.dedup();
    Ok(kernels)
}

/// "line N: `old`  vs  `new`" of the first differing line.
fn first_difference(old: &str, new: &str) -> String {
    let (mut a, mut b) = (old.lines(), new.lines());
    let mut line = 1;
    loop {
        match (a.next(), b.next()) {
            (Some(x), Some(y)) if x == y => line += 1,
            (x, y) => {
                return format!(
                    "first difference at line {line}: checked in `{}`, generated `{}`",
                    x.unwrap_or("<end of file>").trim(),
                    y.unwrap_or("<end of file>").trim()
                )
            }
        }
    }
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Assembles the PTX embedded in this binary for sm_90 with the pinned ptxas (installed into
/// `target/cuda-wheels` first if absent) into `out/<module>.cubin`, and writes `out/MANIFEST`
/// naming the digest of the PTX each came from (`solder_model_layers::kernels::cubins`).
/// Returns the cubins' total bytes.
pub fn assemble_cubins(out: &Path) -> Result<u64, String> {
    use solder_model_layers::kernels::cubins::{manifest_text, CubinEntry, MANIFEST};
    let tools = toolchain::Toolchain::ensure(&workspace_root())?;
    fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let modules = solder_kernels::ptx_modules();
    for (module, text) in modules {
        let ptx = out.join(format!("{module}.ptx"));
        crate::files::write_output(&ptx, text.as_bytes(), &crate::files::Inputs::default())?;
    }
    let names: Vec<String> = modules
        .iter()
        .map(|(module, _)| module.to_string())
        .collect();
    let outputs = ptxas::assemble_each(&tools.ptxas, out, &names, false);
    for module in &names {
        let _ = fs::remove_file(out.join(format!("{module}.ptx")));
    }
    let mut entries = Vec::new();
    for (module, output) in names.iter().zip(outputs?) {
        let cubin = out.join(format!("{module}.cubin"));
        if !output.status.success() {
            return Err(format!(
                "ptxas -arch=sm_90 failed on the embedded {module}.ptx ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim_end()
            ));
        }
        let bytes = fs::metadata(&cubin)
            .map_err(|e| format!("{}: {e}", cubin.display()))?
            .len();
        entries.push(CubinEntry {
            module: module.clone(),
            ptx_sha256: solder_kernels::ptx_sha256(module)
                .ok_or_else(|| format!("module `{module}` has no digest"))?
                .to_string(),
            bytes,
        });
    }
    let assembler = format!("ptxas {}", toolchain::NVCC_PIN);
    let manifest = out.join(MANIFEST);
    let text = manifest_text("sm_90", &assembler, &entries);
    crate::files::write_output(&manifest, text.as_bytes(), &crate::files::Inputs::default())?;
    Ok(entries.iter().map(|e| e.bytes).sum())
}
