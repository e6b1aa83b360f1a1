//! `cargo xtask generate`: text from a checkpoint folder. Encodes the prompt (`--chat`: the
//! checkpoint's chat template, encoded without the post-processor's specials, as
//! transformers does), prefills, decodes, streams the text to stdout as tokens are decided,
//! and stops at an EOS id (generation_config.json's, config.json's and the tokenizer's, as
//! vLLM does), a `--stop` string, or `--max-tokens`; tokens per second go to stderr.
//!
//! Parts: `options` (flags, sampling defaults), `load` (the execs), `decode` (plain
//! generation: the session samples each token, `prefill_next`/`next_tokens`), `speculative`
//! (`--speculative mtp|DIR`), `output` (ids, the text stream, stdout), `report` (stderr
//! figures, `--json`).

mod decode;
mod load;
mod options;
mod output;
mod report;
mod speculative;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use solder_circuit::RuleSet;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{Sampling, Session};
use solder_text::{ChatTemplate, GenerationConfig, Message, StopConditions, TextStream, Tokenizer};

use options::{Options, Speculative};
use output::Output;
use report::Report;
use speculative::SpecDrafter;

const HELP: &str = "usage: cargo xtask generate --model DIR --prompt TEXT [options]

  --model DIR          a Hugging Face checkpoint folder: config.json, model.safetensors,
                       tokenizer.json (tokenizer_config.json, generation_config.json if any)
  --prompt TEXT        the prompt (encoded with the tokenizer's special tokens, BOS if any)
  --chat               render the prompt as a user message through the checkpoint's chat
                       template (with the assistant turn opened)
  --system TEXT        with --chat: a system message before it
  --max-tokens N       tokens generated at most, 1..=65536 (default: generation_config's
                       max_new_tokens, else 256)
  --temperature T      0 is greedy; with --top-k K (0: off), --top-p P (1: off), --seed S.
                       Any of them samples (the others from generation_config.json when it
                       samples, else off); without them generation_config.json decides
                       (do_sample), else greedy
  --stop STR           stop when STR appears in the text (not printed); repeatable
  --speculative D      speculative decoding drafted by D: mtp (the checkpoint's MTP head) or
                       a draft checkpoint folder with the same vocabulary
  --k K                drafts per verify step, 1..=7 (default 4)
  --backend B          cpu (default) or cuda (an xtask built with `--features cuda`)
  --threads N          CPU backend threads (default: all)
  --rules FILE         fusion rules (default fusions/FUSIONS.toml)
  --json FILE          write {prompt_ids, ids, text, stop_reason, prompt_tokens_per_s,
                       decode_tokens_per_s} to FILE";

/// Tokens generated when neither `--max-tokens` nor generation_config.json says.
const DEFAULT_MAX_TOKENS: usize = 256;

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let Some(options) = Options::parse(argv)? else {
        println!("{HELP}");
        return Ok(());
    };
    let model = &options.model;
    let tokenizer = Tokenizer::from_dir(model).map_err(|e| e.to_string())?;
    let generation = GenerationConfig::from_dir(model).map_err(|e| e.to_string())?;
    let prompt_ids = encode_prompt(&options, &tokenizer)?;
    let config = load::config_of(model)?;
    if tokenizer.id_limit() > config.vocab_size {
        return Err(format!(
            "{} has ids up to {}, past the model's vocab_size {} ({})",
            tokenizer.path().display(),
            tokenizer.id_limit() - 1,
            config.vocab_size,
            model.join("config.json").display()
        ));
    }
    let sampling = options.sampling(&generation)?;
    let max_tokens = options
        .max_tokens
        .or(generation.max_new_tokens)
        .unwrap_or(DEFAULT_MAX_TOKENS);
    let k = options.speculative.as_ref().map(|_| options.k);
    let positions = load::positions(prompt_ids.len(), max_tokens, k, &config)?;
    let mut eos_ids = generation.eos_token_ids.clone();
    eos_ids.extend(tokenizer.eos_id().filter(|id| !eos_ids.contains(id)));
    let conditions = StopConditions {
        eos_ids,
        stop_strings: options.stops.clone(),
    };
    let stream = TextStream::new(&tokenizer, &prompt_ids, conditions).map_err(|e| e.to_string())?;
    let mut output = Output::new(stream, max_tokens);
    eprintln!("{} prompt tokens; {}", prompt_ids.len(), describe(sampling));

    let rules_path = options
        .args
        .value("rules")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::paths::workspace_root().join("fusions/FUSIONS.toml"));
    let rules = RuleSet::from_file(&rules_path).map_err(|e| e.to_string())?;
    let backend_kind = crate::gpu::BackendKind::parse(options.args.value("backend"))?;
    let mut cpu = None;
    let mut device = crate::gpu::device_backend(backend_kind)?;
    let backend: &mut dyn GpuBackend = match device.as_deref_mut() {
        Some(device) => device,
        None => cpu.insert(
            solder_model_layers::kernels::cpu_backend(
                options.args.number_in("threads", crate::args::THREADS)?,
            )
            .map_err(|e| e.to_string())?,
        ),
    };
    let mtp = options.speculative == Some(Speculative::Mtp);
    let mut exec = load::build(backend, model, config, &rules, positions, mtp)?;
    let ran = generate(
        backend,
        &exec,
        &rules,
        &options,
        (&prompt_ids, sampling, positions),
        &mut output,
    );
    exec.free(backend).map_err(|e| e.to_string())?;
    let (stop, timings, speculative) = ran?;
    let report = Report {
        prompt_ids: &prompt_ids,
        ids: &output.ids,
        text: output.text(),
        stop,
        timings,
        speculative,
    };
    report.print();
    match &options.json {
        Some(path) => report.write(path, model),
        None => Ok(()),
    }
}

/// The prompt's ids: the rendered chat without added specials (the template wrote them),
/// or the plain prompt with them. An empty encoding is refused (nothing to prefill).
fn encode_prompt(options: &Options, tokenizer: &Tokenizer) -> Result<Vec<u32>, String> {
    let ids = if options.chat {
        let template = ChatTemplate::from_dir(&options.model).map_err(|e| e.to_string())?;
        let mut messages = Vec::new();
        if let Some(system) = &options.system {
            messages.push(Message::new("system", system));
        }
        messages.push(Message::new("user", &options.prompt));
        let text = template
            .render(&messages, true)
            .map_err(|e| e.to_string())?;
        tokenizer.encode(&text, false)
    } else {
        tokenizer.encode(&options.prompt, true)
    }
    .map_err(|e| e.to_string())?;
    if ids.is_empty() {
        return Err("`--prompt` encodes to no tokens: there is nothing to prefill".into());
    }
    Ok(ids)
}

type Generated = (
    solder_text::StopReason,
    output::Timings,
    Option<speculative::SpecCounts>,
);

/// Plain or speculative generation on `exec` (a draft model's exec built and freed here).
fn generate(
    backend: &mut dyn GpuBackend,
    exec: &solder_model_layers::CircuitExec,
    rules: &RuleSet,
    options: &Options,
    (prompt, sampling, positions): (&[u32], Sampling, usize),
    output: &mut Output<'_>,
) -> Result<Generated, String> {
    let mut session = Session::new(exec);
    match &options.speculative {
        None => {
            let (stop, timings) = decode::run(&mut session, backend, prompt, sampling, output)?;
            Ok((stop, timings, None))
        }
        Some(Speculative::Mtp) => {
            let mut drafter = SpecDrafter::mtp(exec, sampling)?;
            let (stop, timings, counts) = speculative::run(
                &mut session,
                backend,
                prompt,
                (options.k, sampling),
                &mut drafter,
                output,
            )?;
            Ok((stop, timings, Some(counts)))
        }
        Some(Speculative::Draft(dir)) => {
            let config = load::config_of(dir)?;
            let mut draft = load::build(backend, dir, config, rules, positions, false)?;
            let ran = (|| {
                let mut drafter = SpecDrafter::model(exec, &draft, sampling)?;
                speculative::run(
                    &mut session,
                    backend,
                    prompt,
                    (options.k, sampling),
                    &mut drafter,
                    output,
                )
            })();
            draft.free(backend).map_err(|e| e.to_string())?;
            let (stop, timings, counts) = ran?;
            Ok((stop, timings, Some(counts)))
        }
    }
}

/// The sampling in words, for stderr.
fn describe(sampling: Sampling) -> String {
    match sampling {
        Sampling::Greedy => "greedy".into(),
        Sampling::Sampled(p) => format!(
            "sampling: temperature {} top_k {} top_p {} seed {}",
            p.temperature, p.top_k, p.top_p, p.seed
        ),
    }
}
