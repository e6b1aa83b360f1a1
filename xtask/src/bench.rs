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
  --save DIR         with --synth: write it as a checkpoint (config.json, model.safetensors)
                     and stop, so another engine can run the same weights
  --prompt-len T     prompt tokens prefilled first (default 32)
  --gen N            tokens decoded greedily and timed (default 128)
  --threads N        CPU backend threads (default: all)
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
            let config =
                ModelConfig::from_file(&dir.join("config.json")).map_err(|e| e.to_string())?;
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
    let prompt_len = args.number("prompt-len")?.unwrap_or(32).max(1);
    let gen = args.number("gen")?.unwrap_or(128).max(1);
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
    let total = prompt_len + gen;
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
            solder_model_layers::kernels::cpu_backend(args.number("threads")?)
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
    let path = crate::workspace_root().join("tests/fixtures/configs/llama-3.2-1b.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut json: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    json["num_hidden_layers"] = layers.into();
    ModelConfig::from_json_str(&json.to_string(), name).map_err(|e| e.to_string())
}

pub fn synth_checkpoint(name: &str) -> Result<PathBuf, String> {
    let dir = crate::workspace_root().join("target/synth").join(name);
    if !dir.join("model.safetensors").exists() {
        save_synth(&synth_config(name)?, &dir)?;
    }
    Ok(dir)
}

fn save_synth(config: &ModelConfig, dir: &Path) -> Result<(), String> {
    let instance = solder_circuit::Instance::from_config(config, ServeShape::default())
        .map_err(|e| e.to_string())?;
    let weights = HostWeights::random(&instance.circuit, 1);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = crate::workspace_root().join("tests/fixtures/configs/llama-3.2-1b.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut json: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    json["num_hidden_layers"] = config.num_hidden_layers.into();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    weights
        .save(&instance.circuit, &dir.join("model.safetensors"))
        .map_err(|e| e.to_string())?;
    println!(
        "wrote {} ({} bytes of weights)",
        dir.display(),
        weights.total_bytes()
    );
    Ok(())
}
