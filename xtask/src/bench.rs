//! `cargo xtask bench`: prefill T tokens, decode N greedily, report the decode rate.

use std::path::{Path, PathBuf};
use std::time::Instant;

use solder_circuit::{Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_model_layers::{greedy, Boot, CircuitExec, HostWeights, KvShape, Session, WeightSource};

use crate::args::Args;

const HELP: &str =
    "usage: cargo xtask bench [--backend cpu|cuda] (--model DIR | --synth NAME) [options]

  --backend B        cpu (default) or cuda (an xtask built with `--features cuda`; for graph
                     replays and the bandwidth floor see `gpu-bench`)

  --model DIR        a Hugging Face checkpoint folder
  --synth NAME       a random-weight model built in memory: llama-3.2-1b (the full shape),
                     llama-3.2-1b-l4 (its layer shape, 4 layers)
  --save DIR         with --synth only: write it as a checkpoint (config.json,
                     model.safetensors) and stop, so another engine can run the same weights;
                     DIR must not exist or be empty (a checkpoint is never overwritten)
  --prompt-len T     prompt tokens prefilled first, 1..=65536 (default 32)
  --gen N            tokens decoded greedily and timed, 1..=65536 (default 128); T + N must
                     fit the model's max_position_embeddings
  --threads N        CPU backend threads, 1..=1024 (default: all)
  --reference-only   run the reference routing instead of the fused plan
  --peer candle      also build and run candle 0.11 (peers/candle-llama) on the same
                     checkpoint, bf16 and f32, and print the ratios (a synth model is saved
                     under target/synth/ first)";

const SYNTH: &[(&str, usize)] = &[("llama-3.2-1b", 16), ("llama-3.2-1b-l4", 4)];

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(
        argv,
        &[
            "backend",
            "model",
            "synth",
            "save",
            "prompt-len",
            "gen",
            "threads",
            "rules",
            "peer",
        ],
        &["reference-only", "help"],
    )?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    if args.value("save").is_some() && args.value("synth").is_none() {
        return Err(
            "`--save DIR` writes a --synth model's random weights; it never rewrites a checkpoint \
             (give --synth NAME, not --model)"
                .into(),
        );
    }
    if args.value("save").is_some() && args.value("peer").is_some() {
        return Err("`--save` writes a model and stops: it does not go with --peer".into());
    }
    let backend_kind = crate::gpu::BackendKind::parse(args.value("backend"))?;
    if let Some(peer) = args.value("peer") {
        if backend_kind != crate::gpu::BackendKind::Cpu {
            return Err("--peer compares CPU engines: use it with --backend cpu".into());
        }
        return crate::peer::run(peer, &args);
    }
    let (config, weights, name) = match (args.value("model"), args.value("synth")) {
        (Some(dir), None) => {
            let dir = PathBuf::from(dir);
            let config = crate::files::model_config(&dir.join("config.json"))?;
            let name = dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("model")
                .to_string();
            (config, WeightSource::Checkpoint(dir), name)
        }
        (None, Some(synth)) => {
            let config = synth_config(synth)?;
            (config, WeightSource::Random { seed: 1 }, synth.to_string())
        }
        _ => return Err("give one of --model DIR or --synth NAME (see --help)".into()),
    };
    if let Some(out) = args.value("save") {
        return save_synth(&config, Path::new(out));
    }
    let prompt_len = args.number_in("prompt-len", 1..=65536)?.unwrap_or(32);
    let gen = args.number_in("gen", 1..=65536)?.unwrap_or(128);
    // Before the KV cache is allocated: every position must be one the model has.
    let total = prompt_len + gen;
    if total > config.max_position_embeddings {
        return Err(format!(
            "`--prompt-len {prompt_len}` + `--gen {gen}` = {total} positions, more than {name}'s \
             max_position_embeddings {}",
            config.max_position_embeddings
        ));
    }
    let rules_path = args
        .value("rules")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("fusions/FUSIONS.toml"));
    let rules = RuleSet::from_file(&rules_path).map_err(|e| e.to_string())?;
    let policy = if args.flag("reference-only") {
        Policy::reference_only()
    } else {
        Policy::default()
    };
    let kv = KvShape {
        pages: total.div_ceil(16) + 2,
        block_size: 16,
        max_seq_len: total.next_multiple_of(16),
        max_sequences: 2,
    };
    let serve = ServeShape::with_max_batch(1).map_err(|e| e.to_string())?;

    let mut cpu = None;
    let mut device = crate::gpu::device_backend(backend_kind)?;
    let backend: &mut dyn solder_gpu_runtime::GpuBackend = match device.as_deref_mut() {
        Some(device) => {
            eprintln!("{}", crate::gpu::describe(&device.facts()));
            device
        }
        None => cpu.insert(
            solder_model_layers::kernels::cpu_backend(
                args.number_in("threads", crate::args::THREADS)?,
            )
            .map_err(|e| e.to_string())?,
        ),
    };
    let started = Instant::now();
    let exec = CircuitExec::build(
        backend,
        Boot {
            config: config.clone(),
            serve,
            rules,
            policy,
            weights,
            kv,
        },
    )
    .map_err(|e| e.to_string())?;
    eprintln!("built {name} in {:.1} s", started.elapsed().as_secs_f64());
    let launches = exec.decode_program().map_err(|e| e.to_string())?.launches();

    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|i| (i as u32 * 7919 + 13) % config.vocab_size as u32)
        .collect();
    let t = Instant::now();
    let logits = session
        .prefill(backend, id, &prompt)
        .map_err(|e| e.to_string())?;
    let prefill_s = t.elapsed().as_secs_f64();
    let vocab = config.vocab_size;
    let mut token = greedy(&logits[(prompt_len - 1) * vocab..]);
    let mut step_ms = Vec::with_capacity(gen);
    for _ in 0..gen {
        let t = Instant::now();
        let logits = session
            .decode(backend, id, token)
            .map_err(|e| e.to_string())?;
        step_ms.push(t.elapsed().as_secs_f64() * 1e3);
        token = greedy(&logits);
    }
    let mean = step_ms.iter().sum::<f64>() / gen as f64;
    step_ms.sort_by(f64::total_cmp);
    let median = step_ms[gen / 2];
    eprintln!(
        "prefill {prompt_len} tokens in {:.1} ms; decode steps: median {median:.2} ms, mean {mean:.2} ms, min {:.2}, max {:.2}",
        prefill_s * 1e3,
        step_ms[0],
        step_ms[gen - 1]
    );
    println!(
        "solder decode: model={name} prefill_tokens={prompt_len} gen_tokens={gen} decode_tok_per_s={:.2} ms_per_token={median:.2} launches_per_step={launches}",
        1e3 / median
    );
    Ok(())
}

fn synth_config(name: &str) -> Result<ModelConfig, String> {
    let layers = SYNTH
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, l)| *l)
        .ok_or_else(|| {
            format!(
                "unknown synth model `{name}` (known: {})",
                SYNTH.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            )
        })?;
    let mut json = synth_base_config()?;
    json["num_hidden_layers"] = layers.into();
    ModelConfig::from_json_str(&json.to_string(), name).map_err(|e| e.to_string())
}

/// The config every synth model starts from (Llama-3.2-1B's).
fn synth_base_config() -> Result<serde_json::Value, String> {
    let path = crate::workspace_root().join("tests/fixtures/configs/llama-3.2-1b.json");
    let text = crate::files::read_text(&path)?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn synth_checkpoint(name: &str) -> Result<PathBuf, String> {
    let dir = crate::workspace_root().join("target/synth").join(name);
    if !dir.join("model.safetensors").exists() {
        save_synth(&synth_config(name)?, &dir)?;
    }
    Ok(dir)
}

/// Whether `dir` may receive a saved model: absent, or an empty folder. Anything else (a
/// file, a checkpoint, any folder with contents) is refused by path.
fn check_save_target(dir: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("--save {}: {e}", dir.display())),
        Ok(meta) if !meta.is_dir() => Err(format!(
            "--save {}: exists and is not a folder; refusing to replace it",
            dir.display()
        )),
        Ok(_) => {
            let mut entries =
                std::fs::read_dir(dir).map_err(|e| format!("--save {}: {e}", dir.display()))?;
            match entries.next() {
                None => Ok(()),
                Some(entry) => Err(format!(
                    "--save {}: the folder is not empty (it holds {}); refusing to write a \
                     model over it",
                    dir.display(),
                    entry
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .unwrap_or_else(|e| e.to_string())
                )),
            }
        }
    }
}

/// Writes `config` with random weights as a checkpoint at `dir`: into a sibling temporary
/// folder first, renamed to `dir` only once complete, so a failure leaves nothing behind.
fn save_synth(config: &ModelConfig, dir: &Path) -> Result<(), String> {
    check_save_target(dir)?;
    let instance = solder_circuit::Instance::from_config(config, ServeShape::default())
        .map_err(|e| e.to_string())?;
    let weights = HostWeights::random(&instance.circuit, 1);
    let mut json = synth_base_config()?;
    json["num_hidden_layers"] = config.num_hidden_layers.into();
    let config_text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;

    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let leaf = dir
        .file_name()
        .ok_or_else(|| format!("--save {}: names no folder", dir.display()))?;
    let tmp = parent.join(format!(
        ".{}.partial-{}",
        leaf.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        std::fs::create_dir(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let config_path = tmp.join("config.json");
        std::fs::write(&config_path, &config_text)
            .map_err(|e| format!("{}: {e}", config_path.display()))?;
        weights
            .save(&instance.circuit, &tmp.join("model.safetensors"))
            .map_err(|e| e.to_string())?;
        // An empty target folder (allowed above) goes first: rename needs the name free.
        if dir.is_dir() {
            std::fs::remove_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::rename(&tmp, dir).map_err(|e| format!("{}: {e}", dir.display()))
    })();
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    written?;
    println!(
        "wrote {} ({} bytes of weights)",
        dir.display(),
        weights.total_bytes()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir()
            .join(format!("xtask-bench-{}", std::process::id()))
            .join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn bench(args: &[&str]) -> Result<(), String> {
        run(args.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn save_without_synth_is_refused_and_the_checkpoint_untouched() {
        let dir = scratch("checkpoint");
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let d = dir.display().to_string();
        let e = bench(&["--model", &d, "--save", &d]).unwrap_err();
        assert!(e.contains("--save") && e.contains("--synth"), "{e}");
        assert_eq!(
            std::fs::read_to_string(dir.join("config.json")).unwrap(),
            "{}"
        );
    }

    #[test]
    fn save_over_a_folder_with_contents_is_refused() {
        let dir = scratch("full");
        std::fs::write(dir.join("model.safetensors"), "weights").unwrap();
        let e = bench(&[
            "--synth",
            "llama-3.2-1b-l4",
            "--save",
            &dir.display().to_string(),
        ])
        .unwrap_err();
        assert!(
            e.contains("not empty") && e.contains("model.safetensors"),
            "{e}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("model.safetensors")).unwrap(),
            "weights"
        );
        let file = dir.join("model.safetensors");
        let e = check_save_target(&file).unwrap_err();
        assert!(e.contains("not a folder"), "{e}");
    }

    #[test]
    fn an_absent_or_empty_target_is_accepted() {
        let dir = scratch("empty");
        check_save_target(&dir).unwrap();
        check_save_target(&dir.join("new")).unwrap();
    }

    #[test]
    fn counts_past_the_position_limit_are_refused_before_allocating() {
        let e = bench(&["--synth", "llama-3.2-1b", "--gen", "18446744073709551615"]).unwrap_err();
        assert!(e.contains("--gen"), "{e}");
        // A config of 512 positions and no weights: refused before the weights are read.
        let dir = scratch("positions");
        let tiny = crate::parity::builtin_named("tiny-llama")
            .unwrap()
            .config_json;
        std::fs::write(dir.join("config.json"), tiny).unwrap();
        let d = dir.display().to_string();
        let e = bench(&["--model", &d, "--prompt-len", "500", "--gen", "13"]).unwrap_err();
        assert!(e.contains("513 positions") && e.contains("512"), "{e}");
        // The peer run checks the same ranges before it saves or builds anything.
        let e = bench(&["--synth", "llama-3.2-1b", "--peer", "candle", "--gen", "0"]).unwrap_err();
        assert!(e.contains("--gen") && e.contains("1..=65536"), "{e}");
    }
}
