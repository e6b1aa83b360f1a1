//! `cargo xtask bench`: prefill T tokens, decode N greedily, report the decode rate; by
//! default each step runs twice, eagerly and as a graph replay, on two sequences fed the
//! same tokens (alternating, so both see the same machine), and both medians and their ratio
//! are printed; the two sequences' logits must be identical bytes. The capture of the whole
//! ladder (`capture_all`) is timed first.

use std::path::{Path, PathBuf};
use std::time::Instant;

use solder_circuit::{Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_model_layers::{greedy, Boot, CircuitExec, GraphPolicy, KvShape, Session, WeightSource};

use crate::args::Args;
use crate::synth::{save_synth, synth_config};

const HELP: &str =
    "usage: cargo xtask bench [--backend cpu|cuda] (--model DIR | --synth NAME) [options]

  --backend B        cpu (default) or cuda (an xtask built with `--features cuda`; for graph
                     replays and the bandwidth floor see `gpu-bench`)

  --model DIR        a Hugging Face checkpoint folder
  --synth NAME       a random-weight model built in memory: llama-3.2-1b (the full shape),
                     llama-3.2-1b-l4 (its layer shape, 4 layers), llama-3.1-8b-l4 (Llama-3.1-8B's
                     layer shape, 4 layers; the full 8B does not fit this machine's memory),
                     qwen3-next-tiny (a 4-layer Qwen3-Next of hidden 128 with an MTP head)
  --quant Q          with --synth only: the model as a quantized checkpoint of it would store
                     it, every projection quantized, lm_head bf16: fp8 (block 128x128),
                     fp8-channel, fp8-tensor, int4 (group 128) or int4-channel
  --save DIR         with --synth only: write it as a checkpoint (config.json,
                     model.safetensors) and stop, so another engine can run the same weights;
                     DIR must not exist or be empty (a checkpoint is never overwritten)
  --prompt-len T     prompt tokens prefilled first, 1..=65536 (default 32)
  --gen N            tokens decoded greedily and timed, 1..=65536 (default 128); T + N must
                     fit the model's max_position_embeddings
  --threads N        CPU backend threads, 1..=1024 (default: all)
  --reference-only   run the reference routing instead of the fused plan
  --rules FILE       fusion rules (default fusions/FUSIONS.toml): an A/B of a rule is this
                     file with the rule taken out against the default, in one binary
  --levers A,B       turn levers on (`solder_config::KNOWN_LEVERS`): `split_rope_kv` times the
                     six-launch layer (rope and the KV write in their own launch) against the
                     default five-launch one
  --graphs G         both (default: every step eagerly and as a graph replay, side by side),
                     graph, or eager
  --chunk W          prefill chunk: a verify program of W rows, 2..=512, beside the default
                     verify widths (2..8), so the prompt runs W tokens a step (default 8)
  --prefill-logits L last (default: `Session::prefill_last`, the last position's logits; every
                     chunk before the last runs a prefill program, no LM head) or all
                     (`Session::prefill`: every position's logits, every chunk a verify program)
  --mixed N          with --chunk W: N sequences decode (greedy, from 8-token prompts) while a
                     prompt of --prompt-len tokens is fed W at a time beside them, every
                     step a `Session::mixed_step` (one batched-verify program of W + N rows);
                     prints the mixed steps' median and the rows per second
  --ladder           compile the whole default serve ladder (decode, multi-seq 2..128,
                     verify 2..8) instead of batch 1 only, so `capture_all` times all of it
  --speculative D    greedy speculative decoding drafted by D: self (the target drafting for
                     itself: acceptance 1.0), random (its shape, other random weights), mtp
                     (the model's own MTP head: qwen3_next), a synth name or a checkpoint
                     folder (same vocabulary); prints tokens per verify step, acceptance per
                     draft position, target steps saved, tokens/s and ms per token beside plain
                     decoding (the tokens must match)
  --k K              draft tokens per speculative step, 1..=7 (default 4)
  --batch N          with --speculative: N sequences at once, 1..=64 (default 1): plain
                     decoding by multi-seq steps, speculative by batched verify steps (and
                     batched drafting: the MTP head drafts all N in one program per step)
  --peer candle      also build and run candle 0.11 (peers/candle-llama) on the same
                     checkpoint, bf16 and f32, and print the ratios of the decode steps and
                     of the prefills (a synth model is saved under target/synth/ first);
                     solder runs with the given --chunk, --levers and --threads";

/// How the timed steps run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Graphs {
    Both,
    Graph,
    Eager,
}

/// The options `bench` takes a value for.
const OPTIONS: &[&str] = &[
    "backend",
    "chunk",
    "prefill-logits",
    "model",
    "synth",
    "save",
    "prompt-len",
    "gen",
    "threads",
    "rules",
    "peer",
    "graphs",
    "speculative",
    "k",
    "batch",
    "levers",
    "quant",
    "mixed",
];

/// The options `bench` takes as bare flags.
const FLAGS: &[&str] = &["reference-only", "ladder", "help"];

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(argv, OPTIONS, FLAGS)?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    check_save(&args)?;
    let backend_kind = crate::gpu::BackendKind::parse(args.value("backend"))?;
    if let Some(peer) = args.value("peer") {
        if backend_kind != crate::gpu::BackendKind::Cpu {
            return Err("--peer compares CPU engines: use it with --backend cpu".into());
        }
        return crate::peer::run(peer, &args);
    }
    let (config, weights, name) = model_of(&args)?;
    if let Some(out) = args.value("save") {
        return save_synth(&config, Path::new(out));
    }
    let prompt_len = args.number_in("prompt-len", 1..=65536)?.unwrap_or(32);
    let gen = args.number_in("gen", 1..=65536)?.unwrap_or(128);
    let k = args.number_in("k", 1..=7)?.unwrap_or(4);
    let batch = args.number_in("batch", 1..=64)?.unwrap_or(1);
    let speculative = args.value("speculative");
    if batch > 1 && speculative.is_none() {
        return Err("`--batch N` runs speculative decoding: give --speculative D too".into());
    }
    let mixed = mixed_of(&args)?;
    if mixed.is_some() && speculative.is_some() {
        return Err("`--mixed` times plain mixed steps: it does not go with --speculative".into());
    }
    let total = positions(&args, (prompt_len, gen, k), &config, &name)?;
    let rules_path = args
        .value("rules")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::paths::workspace_root().join("fusions/FUSIONS.toml"));
    let rules = RuleSet::from_file(&rules_path).map_err(|e| e.to_string())?;
    let policy = policy_of(&args)?;
    let kv = KvShape {
        // Two sequences (eager and graph, or plain and speculative) of `total` tokens per
        // batch sequence, one more for a draft head's KV, and the scratch page (with
        // `--mixed N`: N + 1 sequences).
        pages: 2 * (batch + mixed.map_or(0, |(n, _)| n)) * total.div_ceil(16)
            + 2
            + if speculative.is_some() {
                batch * total.div_ceil(16)
            } else {
                0
            },
        block_size: 16,
        max_seq_len: total.next_multiple_of(16),
        max_sequences: 2 * batch + mixed.map_or(0, |(n, _)| n),
    };
    let graphs = graphs_of(&args)?;
    let all_logits = match args.value("prefill-logits").unwrap_or("last") {
        "last" => false,
        "all" => true,
        other => return Err(format!("`--prefill-logits {other}`: expected last or all")),
    };
    let serve = if let Some(draft) = speculative {
        crate::speculate::serve(batch, k, draft == "mtp")?
    } else if let Some((n, width)) = mixed {
        let mut serve = ServeShape::with_max_batch(n + 1).map_err(|e| e.to_string())?;
        serve.verify_batch_widths.push(width + n);
        serve.verify_batch_widths.sort_unstable();
        serve.verify_batch_widths.dedup();
        serve
    } else if args.flag("ladder") {
        ServeShape::default()
    } else {
        ServeShape::with_max_batch(1).map_err(|e| e.to_string())?
    };
    let serve = with_chunk(
        serve,
        args.number_in("chunk", 2..=solder_config::MAX_VERIFY_WIDTH)?,
    )?;

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
            precision: Default::default(),
        },
    )
    .map_err(|e| e.to_string())?;
    eprintln!("built {name} in {:.1} s", started.elapsed().as_secs_f64());
    let launches = exec.decode_program().map_err(|e| e.to_string())?.launches();
    if let Some(draft) = speculative {
        let source = crate::speculate::DraftSource::parse(draft, &config, synth_config)?;
        // Sequence s's prompt: the bench prompt's tokens shifted by s (each its own text).
        let prompts: Vec<Vec<u32>> = (0..batch as u32)
            .map(|s| {
                (0..prompt_len)
                    .map(|i| (i as u32 * 7919 + 13 + s * 101) % config.vocab_size as u32)
                    .collect()
            })
            .collect();
        let rules = RuleSet::from_file(&rules_path).map_err(|e| e.to_string())?;
        return crate::speculate::run(backend, &exec, source, &rules, kv, &prompts, gen, k, &name);
    }
    if graphs != Graphs::Eager {
        capture(&exec, backend, &name)?;
    }
    if let Some((n, width)) = mixed {
        exec.set_graph_policy(match graphs {
            Graphs::Eager => GraphPolicy::Never,
            _ => GraphPolicy::Always,
        });
        return timed_mixed(&exec, backend, (n, width), prompt_len, &name);
    }

    // One sequence per path, fed the same tokens: the eager one and the graph one.
    let paths: Vec<GraphPolicy> = match graphs {
        Graphs::Both => vec![GraphPolicy::Never, GraphPolicy::Always],
        Graphs::Graph => vec![GraphPolicy::Always],
        Graphs::Eager => vec![GraphPolicy::Never],
    };
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|i| (i as u32 * 7919 + 13) % config.vocab_size as u32)
        .collect();
    let Timed {
        prefill_ms,
        mut step_ms,
        digest,
    } = timed_decode(&exec, backend, &paths, &prompt, (gen, all_logits))?;
    print_timings(
        &name,
        (prompt_len, gen, launches),
        &paths,
        &prefill_ms,
        &mut step_ms,
    )?;
    // The bytes this run computed: two runs of the same model and prompt whose levers promise
    // the same bytes (`mma_large`, `mma_narrow`) print the same digest.
    println!("solder logits: model={name} logits_fnv={digest:016x}");
    Ok(())
}

/// `--save DIR` goes only with `--synth` (it never rewrites a checkpoint) and not with `--peer`.
fn check_save(args: &Args) -> Result<(), String> {
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
    Ok(())
}

/// The model to time: `--model DIR` (a checkpoint) or `--synth NAME` (random weights), with
/// its name.
fn model_of(args: &Args) -> Result<(ModelConfig, WeightSource, String), String> {
    Ok(match (args.value("model"), args.value("synth")) {
        (Some(_), None) if args.value("quant").is_some() => {
            return Err(
                "`--quant` quantizes a --synth model's random weights; a checkpoint \
                        keeps its own formats (its config.json's quantization_config)"
                    .into(),
            )
        }
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
            let mut config = synth_config(synth)?;
            let mut name = synth.to_string();
            if let Some(quant) = args.value("quant") {
                config.quantization = Some(crate::plan::quantization_of(quant)?);
                name = format!("{synth} ({quant})");
            }
            (config, WeightSource::Random { seed: 1 }, name)
        }
        _ => return Err("give one of --model DIR or --synth NAME (see --help)".into()),
    })
}

/// The positions a run takes, `--prompt-len` + `--gen` (+ k + 1 when speculative), refused
/// before the KV cache is allocated when past the model's `max_position_embeddings`.
fn positions(
    args: &Args,
    (prompt_len, gen, k): (usize, usize, usize),
    config: &ModelConfig,
    name: &str,
) -> Result<usize, String> {
    // Before the KV cache is allocated: every position must be one the model has (a
    // speculative step may feed k + 1 tokens past the last one kept).
    let total = prompt_len
        + gen
        + if args.value("speculative").is_some() {
            k + 1
        } else {
            0
        };
    if total > config.max_position_embeddings {
        return Err(format!(
            "`--prompt-len {prompt_len}` + `--gen {gen}` (+ k + 1 when speculative) = {total} positions, more than {name}'s \
             max_position_embeddings {}",
            config.max_position_embeddings
        ));
    }
    Ok(total)
}

/// `--chunk W`: a verify program of W rows beside the shape's own (the widest the prompt fills
/// runs each prefill step).
fn with_chunk(mut serve: ServeShape, chunk: Option<usize>) -> Result<ServeShape, String> {
    if let Some(w) = chunk {
        if !serve.verify_widths.contains(&w) {
            serve.verify_widths.push(w);
            serve.verify_widths.sort_unstable();
        }
        serve.validate().map_err(|e| format!("--chunk {w}: {e}"))?;
    }
    Ok(serve)
}

/// The policy: `--levers` over the default or, with `--reference-only`, the reference one.
fn policy_of(args: &Args) -> Result<Policy, String> {
    Ok(Policy {
        levers: args.levers()?,
        ..if args.flag("reference-only") {
            Policy::reference_only()
        } else {
            Policy::default()
        }
    })
}

/// `--graphs`: both paths (default), graph replay only, or eager only.
fn graphs_of(args: &Args) -> Result<Graphs, String> {
    Ok(match args.value("graphs").unwrap_or("both") {
        "both" => Graphs::Both,
        "graph" => Graphs::Graph,
        "eager" => Graphs::Eager,
        other => return Err(format!("`--graphs {other}`: expected both, graph or eager")),
    })
}

/// One sequence per path fed the same prompt (every position's logits read back with
/// `all_logits`, else the last one's) and `gen` greedy steps, each path's logits checked
/// finite and equal across paths: each path's prefill ms and its decode steps' ms, and the
/// FNV-1a digest of the first path's logits bits (its prefill's last row, then each step's).
fn timed_decode(
    exec: &CircuitExec,
    backend: &mut dyn solder_gpu_runtime::GpuBackend,
    paths: &[GraphPolicy],
    prompt: &[u32],
    (gen, all_logits): (usize, bool),
) -> Result<Timed, String> {
    let vocab = exec.config.vocab_size;
    let mut digest = Fnv::default();
    let mut session = Session::new(exec);
    let ids: Vec<_> = paths.iter().map(|_| session.add_sequence()).collect();
    let mut prefill_ms = Vec::new();
    let mut token = 0;
    for (&id, &path) in ids.iter().zip(paths) {
        exec.set_graph_policy(path);
        let t = Instant::now();
        let logits = match all_logits {
            true => session.prefill(backend, id, prompt),
            false => session.prefill_last(backend, id, prompt),
        }
        .map_err(|e| e.to_string())?;
        prefill_ms.push(t.elapsed().as_secs_f64() * 1e3);
        finite("prefill", &logits, vocab)?;
        let last = &logits[logits.len() - vocab..];
        if id == ids[0] {
            digest.f32s(last);
        }
        token = greedy(last);
    }
    let mut step_ms = vec![Vec::with_capacity(gen); paths.len()];
    for step in 0..gen {
        let mut logits_of = Vec::with_capacity(paths.len());
        for (p, (&id, &path)) in ids.iter().zip(paths).enumerate() {
            exec.set_graph_policy(path);
            let t = Instant::now();
            let logits = session
                .decode(backend, id, token)
                .map_err(|e| e.to_string())?;
            step_ms[p].push(t.elapsed().as_secs_f64() * 1e3);
            finite(&format!("decode step {step}"), &logits, vocab)?;
            logits_of.push(logits);
        }
        if logits_of.windows(2).any(|w| !same_bits(&w[0], &w[1])) {
            return Err(format!(
                "decode step {step}: the graph replay's logits differ from the eager run's"
            ));
        }
        digest.f32s(&logits_of[0]);
        token = greedy(&logits_of[0]);
    }
    Ok(Timed {
        prefill_ms,
        step_ms,
        digest: digest.0,
    })
}

/// `timed_decode`'s measures: each path's prefill ms and decode steps' ms, and the digest.
struct Timed {
    prefill_ms: Vec<f64>,
    step_ms: Vec<Vec<f64>>,
    digest: u64,
}

/// FNV-1a (64 bits) over f32 bit patterns, little-endian.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn f32s(&mut self, values: &[f32]) {
        for byte in values.iter().flat_map(|v| v.to_bits().to_le_bytes()) {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// `--mixed N` (with `--chunk W`): N decoding sequences and the chunk width, N + W at most
/// `MAX_VERIFY_WIDTH` rows.
fn mixed_of(args: &Args) -> Result<Option<(usize, usize)>, String> {
    let Some(n) = args.number_in("mixed", 1..=64)? else {
        return Ok(None);
    };
    let width = args
        .number_in("chunk", 2..=solder_config::MAX_VERIFY_WIDTH)?
        .ok_or("`--mixed N` feeds the prompt in chunks: give --chunk W too")?;
    if n + width > solder_config::MAX_VERIFY_WIDTH {
        return Err(format!(
            "`--mixed {n}` + `--chunk {width}` rows: more than the {} a step takes",
            solder_config::MAX_VERIFY_WIDTH
        ));
    }
    Ok(Some((n, width)))
}

/// `--mixed`: `n` sequences prefilled with 8 tokens each, then decoded greedily while a prompt
/// of `prompt_len` tokens is fed `width` at a time beside them, each step one
/// `Session::mixed_step`; prints the steps' median, range and rows per second.
fn timed_mixed(
    exec: &CircuitExec,
    backend: &mut dyn solder_gpu_runtime::GpuBackend,
    (n, width): (usize, usize),
    prompt_len: usize,
    name: &str,
) -> Result<(), String> {
    let vocab = exec.config.vocab_size as u32;
    let mut session = Session::new(exec);
    let mut live = Vec::with_capacity(n);
    for s in 0..n as u32 {
        let id = session.add_sequence();
        let prompt: Vec<u32> = (0..8).map(|i| (i * 7919 + 13 + s * 101) % vocab).collect();
        let next = session
            .prefill_next(backend, id, &prompt)
            .map_err(|e| e.to_string())?;
        live.push((id, next));
    }
    let late = session.add_sequence();
    let prompt: Vec<u32> = (0..prompt_len as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let mut times = Vec::new();
    for chunk in prompt.chunks(width) {
        let t = Instant::now();
        let next = session
            .mixed_step(backend, &live, (late, chunk))
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        for ((_, token), next) in live.iter_mut().zip(next) {
            *token = next;
        }
    }
    let steps = times.len();
    times.sort_by(f64::total_cmp);
    let median = times[steps / 2];
    println!(
        "solder mixed: model={name} decode_seqs={n} chunk={width} steps={steps} \
         mixed_step_ms={median:.1} min={:.1} max={:.1} rows_per_s={:.1}",
        times[0],
        times[steps - 1],
        (n + width) as f64 * 1e3 / median
    );
    Ok(())
}

/// Captures every program's graph and prints what it took.
fn capture(
    exec: &CircuitExec,
    backend: &mut dyn solder_gpu_runtime::GpuBackend,
    name: &str,
) -> Result<(), String> {
    exec.set_graph_policy(GraphPolicy::Always);
    let report = exec.capture_all(backend).map_err(|e| e.to_string())?;
    println!(
        "solder capture: model={name} programs={} launches={} capture_ms={:.3} us_per_launch={:.3}",
        report.captured,
        report.launches,
        report.time.as_secs_f64() * 1e3,
        report.time.as_secs_f64() * 1e6 / report.launches.max(1) as f64
    );
    Ok(())
}

/// Prints each path's decode-step median, mean and range, the prefill times, and the
/// headline line (the last path's median: graph replay unless `--graphs eager`).
fn print_timings(
    name: &str,
    (prompt_len, gen, launches): (usize, usize, usize),
    paths: &[GraphPolicy],
    prefill_ms: &[f64],
    step_ms: &mut [Vec<f64>],
) -> Result<(), String> {
    let mut medians = Vec::new();
    for (times, path) in step_ms.iter_mut().zip(paths) {
        let mean = times.iter().sum::<f64>() / gen as f64;
        times.sort_by(f64::total_cmp);
        let median = times[gen / 2];
        let label = if *path == GraphPolicy::Never {
            "eager"
        } else {
            "graph"
        };
        eprintln!(
            "{label}: decode steps median {median:.2} ms, mean {mean:.2} ms, min {:.2}, max {:.2}",
            times[0],
            times[gen - 1]
        );
        medians.push((label, median));
    }
    eprintln!(
        "prefill {prompt_len} tokens in {} ms",
        prefill_ms
            .iter()
            .map(|ms| format!("{ms:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    // The headline figure is the last path's: graph replay unless --graphs eager.
    let (_, median) = *medians.last().ok_or("no path ran")?;
    let side_by_side = match medians.as_slice() {
        [(_, eager), (_, graph)] => format!(
            " eager_ms={eager:.3} graph_ms={graph:.3} graph_over_eager={:.3}",
            graph / eager
        ),
        _ => String::new(),
    };
    // The prefill of the same path (each path prefills its own sequence).
    let prefill = *prefill_ms.last().ok_or("no path ran")?;
    println!(
        "solder decode: model={name} prefill_tokens={prompt_len} gen_tokens={gen} decode_tok_per_s={:.2} ms_per_token={median:.2} launches_per_step={launches} prefill_ms={prefill:.1} prefill_tok_per_s={:.1}{side_by_side}",
        1e3 / median,
        prompt_len as f64 * 1e3 / prefill
    );
    Ok(())
}

/// Refuses to time a model whose logits are not finite (NaN or infinite weights, say): the
/// first such value is named by run, position and vocabulary index. Checked outside the
/// timed region.
fn finite(run: &str, logits: &[f32], vocab: usize) -> Result<(), String> {
    match logits.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(at) => Err(format!(
            "{run}: logits not finite at position {}, vocab index {}: {} (are the weights \
             finite?); no timing is reported for it",
            at / vocab.max(1),
            at % vocab.max(1),
            logits[at]
        )),
    }
}

/// Whether two runs' logits are the same bytes.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::check_save_target;

    fn scratch(name: &str) -> PathBuf {
        crate::files::scratch_dir("bench", name)
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

    /// Issue 19.7: `bench` timed a checkpoint with NaN weights without a word.
    #[test]
    fn non_finite_logits_are_refused_not_timed() {
        let dir = crate::parity::run::tests::nan_lm_head_checkpoint(5);
        let d = dir.display().to_string();
        let ran = bench(&[
            "--model",
            &d,
            "--prompt-len",
            "2",
            "--gen",
            "2",
            "--threads",
            "1",
            "--graphs",
            "eager",
        ]);
        let _ = std::fs::remove_dir_all(&dir);
        let e = ran.unwrap_err();
        assert!(
            e.contains("prefill") && e.contains("vocab index 5") && e.contains("NaN"),
            "{e}"
        );
    }

    #[test]
    fn mixed_steps_need_a_chunk_that_fits_beside_their_rows() {
        let synth = ["--synth", "llama-3.2-1b"];
        let e = bench(&[&synth[..], &["--mixed", "4"]].concat()).unwrap_err();
        assert!(e.contains("--chunk"), "{e}");
        let e = bench(&[&synth[..], &["--mixed", "8", "--chunk", "508"]].concat()).unwrap_err();
        assert!(e.contains("--mixed 8") && e.contains("512"), "{e}");
        let e = bench(&[&synth[..], &["--mixed", "65", "--chunk", "8"]].concat()).unwrap_err();
        assert!(e.contains("--mixed"), "{e}");
        let speculative = ["--mixed", "2", "--chunk", "8", "--speculative", "self"];
        let e = bench(&[&synth[..], &speculative].concat()).unwrap_err();
        assert!(e.contains("--speculative"), "{e}");
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
        let e = bench(&[
            "--synth",
            "llama-3.2-1b",
            "--peer",
            "candle",
            "--chunk",
            "513",
        ])
        .unwrap_err();
        assert!(e.contains("--chunk") && e.contains("2..=512"), "{e}");
        let e = bench(&[
            "--synth",
            "llama-3.2-1b",
            "--peer",
            "candle",
            "--levers",
            "warp_drive",
        ])
        .unwrap_err();
        assert!(e.contains("--levers") && e.contains("warp_drive"), "{e}");
    }
}
