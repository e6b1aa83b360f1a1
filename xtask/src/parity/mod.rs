//! `cargo xtask parity`: proves the fused programs equal to the reference routing, byte for
//! byte, in every mode, and (with goldens) close to Hugging Face transformers.

pub(crate) mod builtin;
pub(crate) mod case;
mod claims;
mod diff;
mod differs;
pub(crate) mod execs;
pub(crate) mod golden;
mod mtp;
mod pool;
mod report;
mod rows;
pub(crate) mod run;
mod skips;
mod speculative;
mod verified;

use std::path::{Path, PathBuf};
use std::time::Instant;

use solder_circuit::RuleSet;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::cpu::CpuBackend;
use solder_gpu_runtime::GpuBackend;

use crate::args::Args;
use crate::gpu::BackendKind;
use case::{random_prompt, Case, Weights};
use golden::Golden;
use run::run_case;

/// `--tokens`: at least two (the detection run changes one halfway), and a bound that keeps
/// the widest width's KV cache (130 sequences) small on the CPU backend.
const TOKENS: std::ops::RangeInclusive<usize> = 2..=4096;

const HELP: &str =
    "usage: cargo xtask parity [--model DIR [--golden FILE] | --goldens DIR] [options]

  (no model)       the built-in tiny models of every supported family (random weights)
  --model DIR      a Hugging Face checkpoint folder (config.json, model.safetensors)
  --golden FILE    a golden file (input_ids, logits, logits_bf16) for --model
  --goldens DIR    every case folder under DIR holding config.json, model.safetensors and
                   golden.safetensors; a case that cannot run (family not yet modelled,
                   circuit unsupported) is a SKIP line and fails the run, unless allowed
  --allow-skip NAMES  golden folders (comma-separated) whose skip does not fail the run;
                   a name that is no folder, or a folder that runs, is an error; the JSON
                   lists every skip with its reason
  --json PATH      write the report as JSON
  --rules FILE     fusion rules (default fusions/FUSIONS.toml)
  --tokens T       prompt length without a golden, 2..=4096 and at most the model's
                   max_position_embeddings (default 40: more than two KV pages; the
                   built-in window and long-context cases default to their own, 100..1100;
                   a prompt past 256 tokens runs multi-seq widths 2 and 4 only)
  --threads N      CPU backend threads, 1..=1024 (default: all)
  --backend B      cpu (default), emu or cuda (an xtask built with `--features cuda`): on cuda
                   the same table, plus each model's all-rules decode run on the CPU backend
                   too: max |gpu - cpu| and both golden ratios (without a golden, max |gpu -
                   cpu| must stay within 2e-2 of the CPU logits' largest magnitude); on emu
                   every launch of both routings runs the CUDA source compiled for the host
                   (`cargo xtask emu`, built first) after its twin on the same inputs, the
                   emulation's bytes kept, so the table compares the CUDA kernels' routings;
                   then per kernel: launches, byte-identical to the twin, first difference
                   (any difference fails)
  --only NAMES     only these built-in models (comma-separated), e.g. tiny-llama
  --max-batch N    the widest multi-seq width run, 1..=128
                   (default: the serve's own; the emulation is slow, so `--max-batch 4`)
  --levers A,B     turn levers on in the all-rules routing (`solder_config::KNOWN_LEVERS`),
                   e.g. split_rope_kv (its six-launch layer) or fold_o_proj; where one lets a
                   `differs` rule apply, reference vs all rules is held to that rule's
                   tolerance (relative to the largest |logit|) instead of byte identity;
                   everything else stays byte for byte";

/// The options `parity` takes a value for.
const OPTIONS: &[&str] = &[
    "model",
    "golden",
    "goldens",
    "json",
    "rules",
    "tokens",
    "threads",
    "backend",
    "only",
    "max-batch",
    "levers",
    "allow-skip",
];

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(argv, OPTIONS, &["help"])?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    // `emu` is the CPU backend with the host emulation of the CUDA kernels in shadow mode.
    let emu = args.value("backend") == Some("emu");
    let backend_kind = match emu {
        true => BackendKind::Cpu,
        false => BackendKind::parse(args.value("backend"))
            .map_err(|e| e.replace("(known: cpu, cuda)", "(known: cpu, emu, cuda)"))?,
    };
    let only: Option<Vec<&str>> = args.value("only").map(|v| v.split(',').collect());
    // Parity runs the default serve's ladder or a cut of it: a wider width was clamped to
    // 128 without a word, so it is refused at parse like any count out of range.
    let widest = solder_config::ServeShape::default().max_batch;
    let max_batch = args.number_in("max-batch", 1..=widest)?;
    let levers = args.levers()?;
    let rules_path = args
        .value("rules")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::paths::workspace_root().join("fusions/FUSIONS.toml"));
    let rules = RuleSet::from_file(&rules_path).map_err(|e| e.to_string())?;
    // Every file the run reads: `--json` may name none of them.
    let mut inputs = crate::files::Inputs::default();
    inputs.add(&rules_path);
    let tokens_flag = args.number_in("tokens", TOKENS)?;
    let tokens = tokens_flag.unwrap_or(40);
    let threads = args.number_in("threads", crate::args::THREADS)?;
    let allow_skip: Vec<&str> = args
        .value("allow-skip")
        .map_or_else(Vec::new, |v| v.split(',').collect());
    if !allow_skip.is_empty() && args.value("goldens").is_none() {
        return Err("--allow-skip names golden folders: it needs --goldens".into());
    }
    let mut skipped: Vec<skips::Skip> = Vec::new();
    let cases = cases_of(
        &args,
        only.as_deref(),
        &allow_skip,
        (tokens_flag, tokens, max_batch),
        &mut inputs,
        &mut skipped,
    )?;

    if let Some(path) = args.value("json") {
        inputs.check_output(Path::new(path))?;
    }
    let cases: Vec<Case> = cases
        .into_iter()
        .map(|case| Case {
            max_batch,
            levers: levers.clone(),
            ..case
        })
        .collect();
    if only.is_some() && (args.value("model").is_some() || args.value("goldens").is_some()) {
        return Err("--only picks built-in models; not with --model or --goldens".into());
    }
    let (mut device, device_line) = device_of(backend_kind)?;
    let started = Instant::now();
    let (reports, crosses, failed_runs, backends) = match device.as_deref_mut() {
        Some(gpu) => {
            let mut backends = cpu_backends(1, threads, emu)?;
            let (reports, crosses, failed) = run_on_device(&cases, &rules, gpu, &mut backends[0]);
            (reports, crosses, failed, backends)
        }
        None => {
            let shape = pool::shape(cases.len(), threads);
            tracing::info!(
                cases = cases.len(),
                workers = shape.workers,
                threads = shape.threads,
                "parity: cases side by side"
            );
            let backends = cpu_backends(shape.workers, Some(shape.threads), emu)?;
            let (reports, backends) = pool::run_all(&cases, &rules, backends);
            (reports?, Vec::new(), Vec::new(), backends)
        }
    };
    for skip in &skipped {
        println!("{}", skip.line());
    }
    let cross_failed = cross_failures(&crosses, &failed_runs);
    let (emu_verdict, emu_programs) = emu_verdict(&backends, &reports);
    let pass = reports.iter().all(|r| r.passes())
        && cross_failed.is_empty()
        && failed_runs.is_empty()
        && emu_verdict.as_ref().is_none_or(|v| v.passes())
        && skipped.iter().all(|s| s.allowed);
    if let Some(path) = args.value("json") {
        let out = Path::new(path);
        report::write_json(out, &inputs, &reports, pass, &rules.digest, |doc| {
            doc["skipped"] = skips::json(&skipped);
            if let Some(line) = &device_line {
                crate::gpu::cross::annotate(doc, line, &crosses);
            }
            if let Some(verdict) = &emu_verdict {
                doc["emu"] = verdict.json();
                doc["emu"]["programs"] = serde_json::json!(emu_programs);
            }
        })?;
    }
    println!(
        "{}",
        report::verdict_line(&reports, &skipped, pass, started.elapsed().as_secs_f64())
    );
    if pass {
        Ok(())
    } else {
        Err("parity failed".into())
    }
}

/// The emulation's verdict when the CPU backends ran one (their records merged), printed
/// with the programs the table rows ran under it (the speculative and MTP checks run more).
fn emu_verdict(
    backends: &[CpuBackend],
    reports: &[run::CaseReport],
) -> (Option<crate::emu::report::EmuVerdict>, Vec<String>) {
    let records: Vec<_> = backends
        .iter()
        .filter_map(|b| b.emulation().map(|e| e.report()))
        .collect();
    let emu_verdict = (!records.is_empty())
        .then(|| crate::emu::report::EmuVerdict::of(&crate::emu::report::merged(records)));
    // What the emulated kernels below ran in: the table rows' programs (the speculative and
    // MTP checks run more).
    let emu_programs = report::programs_run(reports);
    if let Some(verdict) = &emu_verdict {
        println!("== programs the rows ran under emulation (all rules; the reference routing ran their widths too)");
        for line in &emu_programs {
            println!("  {line}");
        }
        verdict.print();
    }
    (emu_verdict, emu_programs)
}

/// A device backend and the line describing it, when there is one.
type Device = (Option<Box<dyn GpuBackend>>, Option<String>);

/// The device backend when there is one, and the line describing it (printed here).
fn device_of(backend_kind: BackendKind) -> Result<Device, String> {
    let device = crate::gpu::device_backend(backend_kind)?;
    let device_line = device.as_ref().map(|d| crate::gpu::describe(&d.facts()));
    if let Some(line) = &device_line {
        println!("{line}");
    }
    Ok((device, device_line))
}

/// `n` CPU backends on `threads` host threads each (`None`: the backend's default), each
/// with the CUDA kernels' host emulation in shadow mode under `emu` (built once; each
/// backend opens a copy of its own, `emu::open_built`).
fn cpu_backends(n: usize, threads: Option<usize>, emu: bool) -> Result<Vec<CpuBackend>, String> {
    let built = match emu {
        true => Some(crate::emu::build(&crate::paths::workspace_root(), false)?),
        false => None,
    };
    (0..n)
        .map(|copy| {
            let mut backend =
                solder_model_layers::kernels::cpu_backend(threads).map_err(|e| e.to_string())?;
            if let Some(out) = &built {
                let emulation = crate::emu::open_built(out, copy, EmuMode::Shadow)?;
                backend.set_emulation(Some(emulation));
            }
            Ok(backend)
        })
        .collect()
}

/// The cases whose GPU-vs-CPU check failed, printed with the runs that failed when any did.
fn cross_failures<'a>(
    crosses: &'a [(String, crate::gpu::cross::CrossCheck)],
    failed_runs: &[String],
) -> Vec<&'a str> {
    let cross_failed: Vec<&str> = crosses
        .iter()
        .filter(|(_, c)| !c.passes())
        .map(|(name, _)| name.as_str())
        .collect();
    if !cross_failed.is_empty() || !failed_runs.is_empty() {
        println!(
            "gpu vs cpu too far: [{}]; runs that failed: [{}]",
            cross_failed.join(", "),
            failed_runs.join(", ")
        );
    }
    cross_failed
}

/// The cases `--model`, `--goldens` or the built-ins (`only` those named) give, with
/// `(--tokens, the prompt length, --max-batch)`; a golden folder that cannot run is added to
/// `skipped` and every file read to `inputs`.
fn cases_of(
    args: &Args,
    only: Option<&[&str]>,
    allow_skip: &[&str],
    (tokens_flag, tokens, max_batch): (Option<usize>, usize, Option<usize>),
    inputs: &mut crate::files::Inputs,
    skipped: &mut Vec<skips::Skip>,
) -> Result<Vec<Case>, String> {
    Ok(match (args.value("model"), args.value("goldens")) {
        (Some(_), Some(_)) => return Err("give --model or --goldens, not both".into()),
        (Some(dir), None) => {
            inputs.add_checkpoint(Path::new(dir));
            if let Some(g) = args.value("golden") {
                inputs.add(Path::new(g));
            }
            let golden = args
                .value("golden")
                .map(|g| Golden::load(Path::new(g)))
                .transpose()?;
            vec![checkpoint_case(Path::new(dir), golden, tokens)?]
        }
        (None, Some(root)) => golden_cases(root, allow_skip, tokens, inputs, skipped)?,
        (None, None) => {
            if args.value("golden").is_some() {
                return Err("--golden needs --model".into());
            }
            if let Some(names) = only {
                for name in names {
                    builtin_named(name)?;
                }
            }
            builtin_cases(only, tokens_flag, tokens, max_batch)?
        }
    })
}

/// Every case folder under `root` holding a golden: a case that cannot run is added to
/// `skipped` (allowed where `allow_skip` names it); an error if none can run.
fn golden_cases(
    root: &str,
    allow_skip: &[&str],
    tokens: usize,
    inputs: &mut crate::files::Inputs,
    skipped: &mut Vec<skips::Skip>,
) -> Result<Vec<Case>, String> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .map_err(|e| format!("{root}: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("golden.safetensors").exists())
        .collect();
    dirs.sort();
    let mut cases = Vec::new();
    for dir in &dirs {
        inputs.add_checkpoint(dir);
        // A case that cannot run is listed, and fails the run unless allowed.
        match skips::why_it_cannot_run(dir) {
            Some(reason) => {
                let name = skips::folder_name(dir);
                // The checkpoint's weight format leads the reason (a quantized golden can be
                // refused before the loader reads it).
                let reason = match golden::checkpoint_format(&dir.join("config.json")) {
                    Ok(format) => format!("{format} checkpoint: {reason}"),
                    Err(e) => format!("{reason} ({e})"),
                };
                let allowed = allow_skip.contains(&name.as_str());
                skipped.push(skips::Skip {
                    name,
                    reason,
                    allowed,
                });
            }
            None => {
                let golden = Golden::load(&dir.join("golden.safetensors"))?;
                cases.push(checkpoint_case(dir, Some(golden), tokens)?);
                // Further goldens of the same checkpoint (another prompt): one case each.
                for (name, path) in extra_goldens(dir)? {
                    let mut case = checkpoint_case(dir, Some(Golden::load(&path)?), tokens)?;
                    case.name = name;
                    cases.push(case);
                }
            }
        }
    }
    let folders: Vec<String> = dirs.iter().map(|d| skips::folder_name(d)).collect();
    skips::check_allowed(allow_skip, &folders, skipped)?;
    if cases.is_empty() {
        let lines: Vec<String> = skipped.iter().map(skips::Skip::line).collect();
        return Err(format!(
            "no golden case under {root} can run:\n{}",
            lines.join("\n")
        ));
    }
    Ok(cases)
}

/// A golden folder's further goldens, `golden.<case>.safetensors`, by case name (sorted):
/// another prompt over the same checkpoint, kept beside it rather than in a copy of it.
fn extra_goldens(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let mut extra = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if let Some(case) = file
            .strip_prefix("golden.")
            .and_then(|rest| rest.strip_suffix(".safetensors"))
            .filter(|case| !case.is_empty())
        {
            extra.push((case.to_string(), path.clone()));
        }
    }
    extra.sort();
    Ok(extra)
}

/// The built-in models (`only` those named), each with a random prompt of its own length
/// unless `--tokens` names one.
fn builtin_cases(
    only: Option<&[&str]>,
    tokens_flag: Option<usize>,
    tokens: usize,
    max_batch: Option<usize>,
) -> Result<Vec<Case>, String> {
    builtin::BUILTINS
        .iter()
        .filter(|b| only.is_none_or(|names| names.contains(&b.name)))
        .map(|b| {
            let config = b.config()?;
            // A built-in's own length (a window or long-context case) unless the
            // flag names one for every case.
            let tokens = tokens_flag.or(b.tokens).unwrap_or(tokens);
            let prompt = random_prompt(b.seed, config.vocab_size, tokens);
            Ok(Case {
                name: b.name.to_string(),
                config,
                weights: Weights::Random { seed: b.seed },
                prompt,
                golden: None,
                max_batch,
                levers: Default::default(),
            })
        })
        .collect::<Result<_, String>>()
}

/// What running the cases on a device gave: their reports, each case's GPU-vs-CPU check,
/// and the cases whose run failed (there one failure must not hide the others').
type Ran = (
    Vec<run::CaseReport>,
    Vec<(String, crate::gpu::cross::CrossCheck)>,
    Vec<String>,
);

/// Runs every case on the device, each fused decode re-run on `backend`, printing each
/// case's table as it finishes.
fn run_on_device(
    cases: &[Case],
    rules: &RuleSet,
    gpu: &mut dyn GpuBackend,
    backend: &mut CpuBackend,
) -> Ran {
    let mut reports = Vec::new();
    let mut crosses = Vec::new();
    let mut failed_runs = Vec::new();
    for case in cases {
        let t = Instant::now();
        let report = match run_case(case, rules, gpu) {
            Ok(report) => report,
            Err(e) => {
                println!("== {}: ERROR {e}", case.name);
                failed_runs.push(case.name.clone());
                continue;
            }
        };
        report::print_case(&report, t.elapsed().as_secs_f64());
        match crate::gpu::cross::check(case, rules, backend, &report) {
            Ok(cross) => {
                crate::gpu::cross::print(&cross, report.tokens);
                crosses.push((case.name.clone(), cross));
            }
            Err(e) => {
                println!("  gpu vs cpu: ERROR {e}");
                failed_runs.push(case.name.clone());
            }
        }
        reports.push(report);
    }
    (reports, crosses, failed_runs)
}

fn checkpoint_case(dir: &Path, golden: Option<Golden>, tokens: usize) -> Result<Case, String> {
    let config = crate::files::model_config(&dir.join("config.json"))?;
    let prompt = match &golden {
        Some(g) => {
            if g.vocab != config.vocab_size {
                return Err(format!(
                    "golden vocab {} but config vocab {}",
                    g.vocab, config.vocab_size
                ));
            }
            if let Some(at) = g
                .input_ids
                .iter()
                .position(|&t| t as usize >= config.vocab_size)
            {
                return Err(format!(
                    "{}: golden input_ids[{at}] = {} is outside the vocabulary of {}",
                    dir.display(),
                    g.input_ids[at],
                    config.vocab_size
                ));
            }
            g.input_ids.clone()
        }
        None => random_prompt(7, config.vocab_size, tokens),
    };
    Ok(Case {
        name: solder_circuit::model_name(&dir.join("config.json").display().to_string()),
        config,
        weights: Weights::Checkpoint(dir.to_path_buf()),
        prompt,
        golden: golden.map(|g| g.for_checkpoint(dir)).transpose()?,
        max_batch: None,
        levers: Default::default(),
    })
}

/// One of the built-in tiny models, by name (`gpu-step`).
pub fn builtin_named(name: &str) -> Result<&'static builtin::Builtin, String> {
    builtin::BUILTINS
        .iter()
        .find(|b| b.name == name)
        .ok_or_else(|| {
            let known: Vec<&str> = builtin::BUILTINS.iter().map(|b| b.name).collect();
            format!(
                "unknown built-in model `{name}` (known: {})",
                known.join(", ")
            )
        })
}

/// Index of the largest value (first among equals).
pub fn argmax(values: &[f32]) -> usize {
    solder_model_layers::greedy(values) as usize
}

#[cfg(test)]
mod tests {
    fn parity(args: &[&str]) -> Result<(), String> {
        super::run(args.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn token_and_thread_counts_out_of_range_are_refused_before_any_model_runs() {
        let e = parity(&["--tokens", "18446744073709551615"]).unwrap_err();
        assert!(e.contains("--tokens") && e.contains("2..=4096"), "{e}");
        let e = parity(&["--tokens", "60000"]).unwrap_err();
        assert!(e.contains("--tokens"), "{e}");
        let e = parity(&["--threads", "0"]).unwrap_err();
        assert!(e.contains("--threads"), "{e}");
    }

    /// Issue 19.2: `--json D/model.safetensors` printed PASS and left the report where the
    /// checkpoint was. Every input is refused as the output, before any model runs.
    #[test]
    fn json_over_an_input_is_refused_and_the_input_untouched() {
        let fixture = crate::paths::workspace_root().join("tests/fixtures/golden/llama");
        let dir = std::env::temp_dir().join(format!("xtask-parity-json-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["config.json", "model.safetensors", "golden.safetensors"] {
            std::fs::copy(fixture.join(name), dir.join(name)).unwrap();
        }
        let rules = dir.join("R.toml");
        std::fs::copy(
            crate::paths::workspace_root().join("fusions/FUSIONS.toml"),
            &rules,
        )
        .unwrap();
        let before: Vec<Vec<u8>> = ["config.json", "model.safetensors", "golden.safetensors"]
            .iter()
            .map(|n| std::fs::read(dir.join(n)).unwrap())
            .collect();
        let d = dir.display().to_string();
        let golden = dir.join("golden.safetensors").display().to_string();
        let r = rules.display().to_string();
        for out in [
            "model.safetensors",
            "config.json",
            "golden.safetensors",
            "R.toml",
        ] {
            let json = dir.join(out).display().to_string();
            let e = parity(&[
                "--model", &d, "--golden", &golden, "--rules", &r, "--json", &json,
            ])
            .unwrap_err();
            assert!(e.contains("is an input of this run"), "{out}: {e}");
        }
        let after: Vec<Vec<u8>> = ["config.json", "model.safetensors", "golden.safetensors"]
            .iter()
            .map(|n| std::fs::read(dir.join(n)).unwrap())
            .collect();
        assert!(before == after, "an input was written");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 21.4: a golden that could not run printed SKIP and the run passed. Here the
    /// allowed names are checked before anything runs; an unallowed skip fails the run
    /// (`pass` needs every skip allowed).
    #[test]
    fn a_skipped_golden_is_named_and_allow_skip_must_name_exactly_the_skips() {
        let dir = std::env::temp_dir().join(format!("xtask-parity-skip-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (llama, fp8) = (dir.join("llama"), dir.join("fp8"));
        std::fs::create_dir_all(&llama).unwrap();
        std::fs::create_dir_all(&fp8).unwrap();
        let quantized = super::skips::tests::quantized_llama();
        std::fs::write(fp8.join("config.json"), quantized).unwrap();
        std::fs::write(fp8.join("golden.safetensors"), b"").unwrap();
        let d = dir.display().to_string();
        let e = parity(&["--goldens", &d]).unwrap_err();
        assert!(e.contains("can run") && e.contains("SKIP fp8:"), "{e}");
        assert!(
            e.contains("quantization_config.weight_block_size") && e.contains("not yet modelled"),
            "{e}"
        );
        assert!(e.contains("NOT ALLOWED"), "{e}");
        let fixture = crate::paths::workspace_root().join("tests/fixtures/golden/llama");
        for name in ["config.json", "model.safetensors", "golden.safetensors"] {
            std::fs::copy(fixture.join(name), llama.join(name)).unwrap();
        }
        let e = parity(&["--goldens", &d, "--allow-skip", "llama"]).unwrap_err();
        assert!(e.contains("--allow-skip llama: that golden runs"), "{e}");
        let e = parity(&["--goldens", &d, "--allow-skip", "fp8,fp9"]).unwrap_err();
        assert!(e.contains("--allow-skip fp9: no golden folder"), "{e}");
        let e = parity(&["--allow-skip", "fp8"]).unwrap_err();
        assert!(e.contains("needs --goldens"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 19.7: `--max-batch 4096` ran 128 wide without a word.
    #[test]
    fn a_max_batch_past_the_ladder_is_refused_not_clamped() {
        for n in ["129", "4096"] {
            let e = parity(&["--max-batch", n]).unwrap_err();
            assert!(e.contains("--max-batch") && e.contains("1..=128"), "{e}");
        }
    }

    #[test]
    fn a_device_as_rules_or_golden_is_refused_by_path() {
        let e = parity(&["--rules", "/dev/zero"]).unwrap_err();
        assert!(
            e.contains("/dev/zero") && e.contains("not a regular file"),
            "{e}"
        );
        let model = crate::paths::workspace_root().join("tests/fixtures/golden/llama");
        let model = model.display().to_string();
        let e = parity(&["--model", &model, "--golden", "/dev/zero"]).unwrap_err();
        assert!(
            e.contains("/dev/zero") && e.contains("not a regular file"),
            "{e}"
        );
    }
}
