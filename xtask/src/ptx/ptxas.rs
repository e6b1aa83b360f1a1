//! ptxas from the nvcc wheel: assembles each module for sm_90 with `-v` and reads the per-kernel
//! resource lines (registers, shared memory, stack frame, spills); also lists `.entry` names.
//! The modules are assembled side by side (`assemble_each`), the reports read in module order.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use super::toolchain::Toolchain;

/// One kernel's resources as ptxas reports them.
#[derive(Debug, Default, Clone)]
pub struct KernelResources {
    pub module: String,
    pub name: String,
    pub registers: u32,
    pub smem_bytes: u32,
    pub stack_frame: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Threads per block from the PTX's `.maxntid` (`__launch_bounds__`).
    pub threads: Option<u32>,
    /// Whether the kernel names a dynamic shared array (launch-time bytes on top of `smem`).
    pub dynamic_smem: bool,
}

/// `module::func` of every `.entry` in the modules' PTX under `dir`.
pub fn entries(dir: &Path, modules: &[String]) -> Result<Vec<String>, String> {
    let mut all = Vec::new();
    for module in modules {
        let path = dir.join(format!("{module}.ptx"));
        let text = fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        all.extend(entries_of(module, &text));
    }
    Ok(all)
}

/// `module::func` of every `.entry` in one module's PTX text.
pub fn entries_of(module: &str, text: &str) -> Vec<String> {
    let mut all = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        let rest = line
            .strip_prefix(".visible .entry ")
            .or_else(|| line.strip_prefix(".entry "));
        if let Some(rest) = rest {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            all.push(format!("{module}::{name}"));
        }
    }
    all
}

/// Runs `ptxas -arch=sm_90 [-v] <dir>/<module>.ptx -o <dir>/<module>.cubin` for every module,
/// side by side (`crate::jobs`, the largest PTX first; one ptxas uses one thread), and returns
/// each run's output in `modules`' order.
pub fn assemble_each(
    ptxas: &Path,
    dir: &Path,
    modules: &[String],
    verbose: bool,
) -> Result<Vec<Output>, String> {
    let ptx = |m: &String| dir.join(format!("{m}.ptx"));
    crate::jobs::side_by_side(
        modules,
        |m| fs::metadata(ptx(m)).map_or(0, |f| f.len()),
        |m| {
            let mut command = Command::new(ptxas);
            command.arg("-arch=sm_90");
            if verbose {
                command.arg("-v");
            }
            command
                .arg(ptx(m))
                .arg("-o")
                .arg(dir.join(format!("{m}.cubin")))
                .output()
                .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))
        },
    )
    .into_iter()
    .collect()
}

/// Assembles every module; the resources of every kernel, in module then ptxas order.
pub fn assemble_all(
    tools: &Toolchain,
    dir: &Path,
    modules: &[String],
) -> Result<Vec<KernelResources>, String> {
    let mut report = Vec::new();
    let outputs = assemble_each(&tools.ptxas, dir, modules, true)?;
    for (module, output) in modules.iter().zip(outputs) {
        let ptx = dir.join(format!("{module}.ptx"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if !output.status.success() {
            return Err(format!(
                "ptxas failed on crates/kernels/ptx/{module}.ptx ({}):\n{}",
                output.status,
                text.trim_end()
            ));
        }
        let mut kernels = parse(module, &text);
        let ptx_text =
            fs::read_to_string(&ptx).map_err(|e| format!("cannot read {}: {e}", ptx.display()))?;
        let bounds = super::occupancy::launch_bounds(&ptx_text);
        for k in &mut kernels {
            if let Some(&(threads, dynamic)) = bounds.get(&k.name) {
                k.threads = threads;
                k.dynamic_smem = dynamic;
            }
        }
        report.extend(kernels);
    }
    Ok(report)
}

/// Reads ptxas -v output:
/// `ptxas info    : Function properties for NAME`
/// `    N bytes stack frame, N bytes spill stores, N bytes spill loads`
/// `ptxas info    : Used N registers, used N barriers, N bytes smem, N bytes cmem[0]`
fn parse(module: &str, text: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if let Some(name) = quoted_after(line, "Compiling entry function '") {
            kernels.push(KernelResources {
                module: module.to_string(),
                name,
                ..Default::default()
            });
            current = Some(kernels.len() - 1);
        } else if let Some(name) = line
            .split("Function properties for ")
            .nth(1)
            .map(|s| s.trim().to_string())
        {
            current = kernels.iter().position(|k| k.name == name);
        } else if let Some(i) = current {
            let k = &mut kernels[i];
            if line.contains("bytes stack frame") {
                k.stack_frame = number_before(line, "bytes stack frame");
                k.spill_stores = number_before(line, "bytes spill stores");
                k.spill_loads = number_before(line, "bytes spill loads");
            } else if line.contains("Used ") && line.contains("registers") {
                k.registers = number_before(line, "registers");
                k.smem_bytes = number_before(line, "bytes smem");
            }
        }
    }
    kernels
}

fn quoted_after(line: &str, prefix: &str) -> Option<String> {
    let rest = line.split(prefix).nth(1)?;
    Some(rest.split('\'').next()?.to_string())
}

/// The integer just before `label` in `line` (0 when absent).
fn number_before(line: &str, label: &str) -> u32 {
    let Some(at) = line.find(label) else {
        return 0;
    };
    line[..at]
        .split(|c: char| !c.is_ascii_digit())
        .rfind(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The table printed by `--check`: resources, then occupancy per SM (`occupancy`).
pub fn table(report: &[KernelResources]) -> String {
    let mut out = format!(
        "{:<32} {:>5} {:>10} {:>6} {:>7} {:>7} {:>7} {:>6} {:>8} {:>5}  {}\n",
        "kernel (sm_90)",
        "regs",
        "smem B",
        "stack",
        "spill>",
        "spill<",
        "threads",
        "blk/SM",
        "warps/SM",
        "occ",
        "bound by"
    );
    for k in report {
        let occupancy = k
            .threads
            .and_then(|t| super::occupancy::occupancy(t, k.registers, k.smem_bytes));
        let (threads, blocks, warps, percent, limiter) = match (k.threads, occupancy) {
            (Some(t), Some(o)) => (
                t.to_string(),
                o.blocks_per_sm.to_string(),
                o.warps_per_sm.to_string(),
                format!("{:.0}%", o.percent()),
                o.limiter,
            ),
            _ => (
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "no .maxntid",
            ),
        };
        let dynamic = if k.dynamic_smem {
            " (+ dynamic shared)"
        } else {
            ""
        };
        out.push_str(&format!(
            "{:<32} {:>5} {:>10} {:>6} {:>7} {:>7} {:>7} {:>6} {:>8} {:>5}  {limiter}{dynamic}\n",
            format!("{}::{}", k.module, k.name),
            k.registers,
            k.smem_bytes,
            k.stack_frame,
            k.spill_stores,
            k.spill_loads,
            threads,
            blocks,
            warps,
            percent
        ));
    }
    out.truncate(out.trim_end().len());
    out
}

/// Spills and stack frames, one message each.
pub fn violations(report: &[KernelResources]) -> Vec<String> {
    let mut out = Vec::new();
    for k in report {
        if k.spill_stores != 0 || k.spill_loads != 0 {
            out.push(format!(
                "{}::{} spills registers ({} bytes stored, {} loaded)",
                k.module, k.name, k.spill_stores, k.spill_loads
            ));
        }
        if k.stack_frame != 0 {
            out.push(format!(
                "{}::{} has a {}-byte local-memory stack frame",
                k.module, k.name, k.stack_frame
            ));
        }
        if let Some(message) = resident_mismatch(k) {
            out.push(message);
        }
    }
    out
}

/// The host's one-wave split sizing (the default; lever `split_two_waves` times the other)
/// assumes `split::RESIDENT_BLOCKS_PER_SM` blocks per SM for gemv's streaming entries and
/// `qkv_rope_kv` with its `_ahead` entry (model-layers `kernels::gemv::split`); a register
/// count that changes it must change the constant too.
fn resident_mismatch(k: &KernelResources) -> Option<String> {
    use solder_model_layers::kernels::gemv::split::RESIDENT_BLOCKS_PER_SM;
    // qkv_rope_kv and its `_ahead` entry (lever `qkv_norm_ahead`), split by the same sizing.
    let sized = k.module == "gemv"
        && (k.name.starts_with("qkv_rope_kv")
            || ["_r1", "_r2", "_r4", "_r8"]
                .iter()
                .any(|tile| k.name.ends_with(tile)));
    let blocks = k
        .threads
        .and_then(|t| super::occupancy::occupancy(t, k.registers, k.smem_bytes))?
        .blocks_per_sm;
    (sized && blocks as u64 != RESIDENT_BLOCKS_PER_SM).then(|| {
        format!(
            "{}::{} runs {blocks} blocks per SM ({} registers), where split sizing assumes \
             {RESIDENT_BLOCKS_PER_SM} (kernels::gemv::split::RESIDENT_BLOCKS_PER_SM)",
            k.module, k.name, k.registers
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ptxas_verbose_output() {
        let text = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'linear' for 'sm_90'\n\
ptxas info    : Function properties for linear\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 96 registers, used 1 barriers, 32800 bytes smem, 400 bytes cmem[0]\n";
        let kernels = parse("gemv", text);
        let k = &kernels[0];
        assert_eq!(k.name, "linear");
        assert_eq!(
            (
                k.registers,
                k.smem_bytes,
                k.stack_frame,
                k.spill_stores,
                k.spill_loads
            ),
            (96, 32800, 8, 4, 12)
        );
        assert_eq!(violations(&kernels).len(), 2);
    }

    #[test]
    fn the_table_prints_occupancy_from_registers_shared_and_threads() {
        let kernel = |name: &str, registers, smem_bytes, threads| KernelResources {
            module: "gemv".into(),
            name: name.into(),
            registers,
            smem_bytes,
            threads,
            ..Default::default()
        };
        let text = table(&[
            kernel("gate_up_silu", 134, 0, Some(256)),
            kernel("unbounded", 32, 0, None),
        ]);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[1],
            [
                "gemv::gate_up_silu",
                "134",
                "0",
                "0",
                "0",
                "0",
                "256",
                "1",
                "8",
                "12%",
                "registers"
            ]
        );
        assert_eq!(lines[2][6..], ["-", "-", "-", "-", "no", ".maxntid"]);
    }

    #[test]
    fn split_sized_entries_must_run_the_resident_blocks_per_sm() {
        let kernel = |name: &str, registers| KernelResources {
            module: "gemv".into(),
            name: name.into(),
            registers,
            threads: Some(256),
            ..Default::default()
        };
        assert!(violations(&[kernel("linear_r1", 100), kernel("qkv_rope_kv", 96)]).is_empty());
        // 80 registers: 3 blocks per SM, so the sizing constant would be stale; so for the
        // `_ahead` entry of qkv_rope_kv.
        assert_eq!(violations(&[kernel("linear_r1", 80)]).len(), 1);
        assert_eq!(violations(&[kernel("qkv_rope_kv_ahead", 80)]).len(), 1);
        // Classic entries are not split-sized.
        assert!(violations(&[kernel("gate_up_silu", 146)]).is_empty());
    }
}
