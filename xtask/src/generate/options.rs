//! `generate`'s command line: the flags, `--stop` (repeatable, taken out before the flag
//! parser, which keeps one value per flag), and the sampling a run uses — the flags' values,
//! else the checkpoint's `generation_config.json`, else greedy.

use std::path::PathBuf;

use solder_model_layers::{Sampling, SamplingParams};
use solder_text::GenerationConfig;

use crate::args::Args;

/// The options `generate` takes a value for (`stop` is handled apart: it repeats).
const OPTIONS: &[&str] = &[
    "model",
    "prompt",
    "system",
    "max-tokens",
    "temperature",
    "top-k",
    "top-p",
    "seed",
    "speculative",
    "k",
    "backend",
    "threads",
    "json",
    "rules",
];

/// The options `generate` takes as bare flags.
const FLAGS: &[&str] = &["chat", "help"];

/// What `--speculative` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Speculative {
    /// The checkpoint's own MTP head.
    Mtp,
    /// A draft model's checkpoint folder.
    Draft(PathBuf),
}

/// A parsed command line.
pub struct Options {
    pub args: Args,
    pub model: PathBuf,
    pub prompt: String,
    pub chat: bool,
    pub system: Option<String>,
    pub max_tokens: Option<usize>,
    pub stops: Vec<String>,
    pub speculative: Option<Speculative>,
    pub k: usize,
    pub json: Option<PathBuf>,
}

impl Options {
    /// `None` for `--help`.
    pub fn parse(argv: Vec<String>) -> Result<Option<Options>, String> {
        let (argv, stops) = take_stops(argv)?;
        let args = Args::parse(argv, OPTIONS, FLAGS)?;
        if args.flag("help") {
            return Ok(None);
        }
        let model = PathBuf::from(args.value("model").ok_or("give --model DIR (see --help)")?);
        let prompt = args
            .value("prompt")
            .ok_or("give --prompt TEXT (see --help)")?
            .to_string();
        let chat = args.flag("chat");
        let system = args.value("system").map(str::to_string);
        if system.is_some() && !chat {
            return Err("`--system` is the system message of a chat: give it with --chat".into());
        }
        let max_tokens = args.number_in("max-tokens", 1..=65536)?;
        let speculative = match args.value("speculative") {
            None => None,
            Some("mtp") => Some(Speculative::Mtp),
            Some(dir) if PathBuf::from(dir).join("config.json").is_file() => {
                Some(Speculative::Draft(PathBuf::from(dir)))
            }
            Some(other) => {
                return Err(format!(
                    "`--speculative {other}`: expected mtp or a draft checkpoint folder (one \
                     with a config.json)"
                ))
            }
        };
        if args.value("k").is_some() && speculative.is_none() {
            return Err(
                "`--k` is the draft length of --speculative: give it with --speculative".into(),
            );
        }
        let k = args.number_in("k", 1..=7)?.unwrap_or(4);
        let json = args.value("json").map(PathBuf::from);
        Ok(Some(Options {
            model,
            prompt,
            chat,
            system,
            max_tokens,
            stops,
            speculative,
            k,
            json,
            args,
        }))
    }

    /// The sampling of this run: `--temperature 0` is greedy; any sampling flag samples
    /// (the others from generation_config.json when it samples, else off); without flags,
    /// generation_config.json's `do_sample` decides (transformers' default: greedy).
    pub fn sampling(&self, generation: &GenerationConfig) -> Result<Sampling, String> {
        let temperature = self.args.real_in("temperature", 0.0..=100.0)?;
        let top_k = self.args.number_in("top-k", 0..=(u32::MAX as usize))?;
        let top_p = self.args.real_in("top-p", 0.0..=1.0)?;
        let seed = match self.args.value("seed") {
            None => None,
            Some(v) => Some(
                v.parse::<u64>()
                    .map_err(|_| format!("`--seed` wants a whole number 0..=2^64-1, got `{v}`"))?,
            ),
        };
        if top_p == Some(0.0) {
            return Err("`--top-p` must lie in (0, 1]: 0 keeps no token".into());
        }
        let flags = temperature.is_some() || top_k.is_some() || top_p.is_some() || seed.is_some();
        let defaults = generation.sampling();
        if !flags && defaults.is_none() {
            return Ok(Sampling::Greedy);
        }
        let (t, k, p) = defaults.unwrap_or((1.0, 0, 1.0));
        let params = SamplingParams {
            temperature: temperature.unwrap_or(t),
            top_k: top_k.map_or(k, |k| k as u32),
            top_p: top_p.unwrap_or(p),
            seed: seed.unwrap_or(0),
        };
        params.check().map_err(|e| {
            format!("the sampling parameters (flags over generation_config.json): {e}")
        })?;
        Ok(if params.temperature == 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Sampled(params)
        })
    }
}

/// `argv` without its `--stop STR` pairs, and the stop strings in order.
fn take_stops(argv: Vec<String>) -> Result<(Vec<String>, Vec<String>), String> {
    let mut rest = Vec::with_capacity(argv.len());
    let mut stops = Vec::new();
    let mut it = argv.into_iter();
    while let Some(arg) = it.next() {
        if arg == "--stop" {
            let stop = it.next().ok_or("`--stop` needs a value")?;
            if stop.is_empty() {
                return Err("`--stop` with an empty string would stop before any text".into());
            }
            stops.push(stop);
        } else {
            rest.push(arg);
        }
    }
    Ok((rest, stops))
}
