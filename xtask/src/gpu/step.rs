//! `gpu-step` (hidden): builds one small model's all-rules exec on the GPU and runs a few
//! steps of every kind the session has (prefill through verify, decode, a multi-seq step with
//! a padding row, one graph capture and replay), so that `compute-sanitizer` can wrap a short
//! run that still reaches every kernel the model uses.
//!
//! Prints one line per stage and the logits' checksum; fails on non-finite logits.

use std::path::PathBuf;

use crate::args::Args;

const HELP: &str =
    "usage: target/gpu-check/solder gpu-step [--model DIR | --builtin NAME] [--steps K]

  --model DIR      a Hugging Face checkpoint folder
  --builtin NAME   one of parity's built-in tiny models (default tiny-llama)
  --steps K        decode steps after a 3-token prefill, 1..=4096 and within the
                   model's max_position_embeddings (default 1)
  --rules FILE     fusion rules (default fusions/FUSIONS.toml)
  --backend B      cuda (default), or cpu: a dry run on the CPU backend (for tests)";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(
        argv,
        &["model", "builtin", "steps", "rules", "backend"],
        &["help"],
    )?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    imp::run(&args)
}

/// The rules file: `--rules`, else the workspace's.
pub fn rules_path(args: &Args) -> PathBuf {
    args.value("rules")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("fusions/FUSIONS.toml"))
}

mod imp {
    use std::path::Path;
    use std::time::Instant;

    use solder_circuit::{Mode, Policy, RuleSet};
    use solder_config::ServeShape;
    use solder_gpu_runtime::GpuBackend;
    use solder_model_layers::{greedy, Boot, CircuitExec, KvShape, Session, WeightSource};

    use crate::args::Args;

    pub fn run(args: &Args) -> Result<(), String> {
        let steps = args.number_in("steps", 1..=4096)?.unwrap_or(1);
        let (name, config, weights) = match (args.value("model"), args.value("builtin")) {
            (Some(_), Some(_)) => return Err("give --model or --builtin, not both".into()),
            (Some(dir), None) => {
                let config = crate::files::model_config(&Path::new(dir).join("config.json"))?;
                (
                    dir.to_string(),
                    config,
                    WeightSource::Checkpoint(dir.into()),
                )
            }
            (None, builtin) => {
                let name = builtin.unwrap_or("tiny-llama");
                let builtin = crate::parity::builtin_named(name)?;
                (
                    name.to_string(),
                    builtin.config()?,
                    WeightSource::Random { seed: builtin.seed },
                )
            }
        };
        let rules = RuleSet::from_file(&super::rules_path(args)).map_err(|e| e.to_string())?;
        let started = Instant::now();
        let kind = super::super::BackendKind::parse(Some(args.value("backend").unwrap_or("cuda")))?;
        let mut cpu = None;
        let mut device = super::super::device_backend(kind)?;
        let backend: &mut dyn GpuBackend = match device.as_deref_mut() {
            Some(device) => device,
            None => cpu.insert(
                solder_model_layers::kernels::cpu_backend(None).map_err(|e| e.to_string())?,
            ),
        };
        println!("{}", super::super::describe(&backend.facts()));
        let prefill = 3;
        let tokens = prefill + steps + 1;
        if tokens > config.max_position_embeddings {
            return Err(format!(
                "`--steps {steps}`: {tokens} positions, more than {name}'s max_position_embeddings {}",
                config.max_position_embeddings
            ));
        }
        let kv = KvShape {
            pages: 4 * tokens.div_ceil(16) + 2,
            block_size: 16,
            max_seq_len: tokens.next_multiple_of(16),
            max_sequences: 4,
        };
        // Widths 2 and 4 only: a short build that still has a multi-seq program.
        let serve = ServeShape::with_max_batch(4).map_err(|e| e.to_string())?;
        let mut exec = CircuitExec::build(
            backend,
            Boot {
                config: config.clone(),
                serve,
                rules,
                policy: Policy::default(),
                weights,
                kv,
            },
        )
        .map_err(|e| format!("{name}: {e}"))?;
        println!(
            "built {name} ({} programs) in {:.2} s",
            exec.programs().len(),
            started.elapsed().as_secs_f64()
        );
        let vocab = config.vocab_size as u32;
        let mut checksum = 0.0f64;
        let mut check = |stage: &str, logits: &[f32]| -> Result<u32, String> {
            if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
                return Err(format!("{name}: {stage}: logit {i} is {}", logits[i]));
            }
            checksum += logits.iter().map(|&v| v as f64).sum::<f64>();
            println!("{stage}: ok");
            Ok(greedy(&logits[logits.len() - vocab as usize..]))
        };
        let err = |e: solder_model_layers::SessionError| format!("{name}: {e}");
        {
            let mut session = Session::new(&exec);
            let id = session.add_sequence();
            let prompt: Vec<u32> = (0..prefill as u32).map(|i| (i * 31 + 7) % vocab).collect();
            let logits = session.prefill(backend, id, &prompt).map_err(err)?;
            let mut token = check("prefill (verify)", &logits)?;
            for step in 0..steps {
                let logits = session.decode(backend, id, token).map_err(err)?;
                token = check(&format!("decode step {step}"), &logits)?;
            }
            // Three sequences on the width-4 program: one padding row.
            let others: Vec<_> = (0..2).map(|_| session.add_sequence()).collect();
            let batch = [(id, token), (others[0], 1 % vocab), (others[1], 2 % vocab)];
            let logits = session.multi_seq_step(backend, &batch).map_err(err)?;
            check("multi_seq step (3 live rows of 4)", &logits.concat())?;
        }
        // The graph of the decode program over the metadata the last steps left.
        let graph = exec
            .capture(backend, Mode::Decode, 1)
            .map_err(|e| format!("{name}: capture: {e}"))?;
        exec.replay(backend, &graph)
            .map_err(|e| format!("{name}: replay: {e}"))?;
        backend.synchronize().map_err(|e| e.to_string())?;
        exec.release(backend, graph).map_err(|e| e.to_string())?;
        println!("decode graph capture and replay: ok");
        exec.free(backend).map_err(|e| e.to_string())?;
        println!(
            "gpu-step {name}: ok, logits checksum {checksum:.6e}, {:.2} s",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}
