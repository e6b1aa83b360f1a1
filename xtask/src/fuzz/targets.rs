//! What the fuzz suite feeds, and what it asks of each answer. Every target has a seed corpus
//! (the shipped configs, the shipped rules, a tiny model's real checkpoint) that its inputs are
//! mutated from, plus arbitrary bytes. An accepted input goes one stage deeper (a config is
//! planned, rules plan a tiny model, a checkpoint's tensors are all read and loaded); a refused
//! one must be refused by an error that names the input.

use std::path::{Path, PathBuf};

use serde_json::Value;
use solder_circuit::{Available, ExecutionPlan, Instance, Mode, Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_model_layers::{Checkpoint, HostWeights};

use super::mutate::{mutate_bytes, mutate_json, mutate_toml, random_bytes, Rng};

/// The name inputs are given, which an error must mention.
pub const CONFIG_NAME: &str = "fuzz-config.json";
pub const RULES_NAME: &str = "fuzz-rules.toml";
pub const CHECKPOINT_FILE: &str = "model.safetensors";

/// How one case ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    /// Refused by an error that names the input.
    Refused,
    /// Refused, but the error does not say which input: a finding.
    Unnamed(String),
    /// A library call broke a promise (a refused call changed a sequence): a finding.
    Broken(String),
}

/// The inputs every target mutates.
pub struct Corpus {
    configs: Vec<Value>,
    rules: String,
    checkpoint: Vec<u8>,
    /// A tiny model's config and rules, for the deeper stages.
    tiny: ModelConfig,
    shipped_rules: RuleSet,
}

impl Corpus {
    /// The shipped rules, parsed (what the `api` target's execs are built with).
    pub fn shipped_rules(&self) -> &RuleSet {
        &self.shipped_rules
    }

    pub fn load(root: &Path, scratch: &Path) -> Result<Corpus, String> {
        let mut configs = Vec::new();
        let dir = root.join("tests/fixtures/configs");
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        for p in &paths {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            configs.push(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?);
        }
        for builtin in crate::parity::builtin::BUILTINS {
            configs.push(serde_json::from_str(builtin.config_json).map_err(|e| e.to_string())?);
        }
        let rules_path = root.join("fusions/FUSIONS.toml");
        let rules = std::fs::read_to_string(&rules_path)
            .map_err(|e| format!("{}: {e}", rules_path.display()))?;
        let shipped_rules =
            RuleSet::from_toml_str(&rules, "FUSIONS.toml").map_err(|e| e.to_string())?;
        let tiny = crate::parity::builtin::BUILTINS[0].config()?;
        let instance = Instance::from_config(
            &tiny,
            ServeShape::with_max_batch(2).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        let weights = HostWeights::random(&instance.circuit, 7);
        let seed_dir = scratch.join("seed-checkpoint");
        std::fs::create_dir_all(&seed_dir).map_err(|e| format!("{}: {e}", seed_dir.display()))?;
        let seed_file = seed_dir.join(CHECKPOINT_FILE);
        weights
            .save(&instance.circuit, &seed_file)
            .map_err(|e| e.to_string())?;
        let checkpoint =
            std::fs::read(&seed_file).map_err(|e| format!("{}: {e}", seed_file.display()))?;
        Ok(Corpus {
            configs,
            rules,
            checkpoint,
            tiny,
            shipped_rules,
        })
    }
}

/// Mutated, byte-mutated, or arbitrary: 70 / 20 / 10.
fn choose(rng: &mut Rng) -> u8 {
    match rng.below(10) {
        0 => 2,
        1 | 2 => 1,
        _ => 0,
    }
}

fn named(message: String, name: &str) -> Outcome {
    if message.contains(name) {
        Outcome::Refused
    } else {
        Outcome::Unnamed(message)
    }
}

/// A mutated config: parsed, and when accepted, planned (decode) with the shipped rules.
pub fn config_case(corpus: &Corpus, rng: &mut Rng) -> (Vec<u8>, Outcome) {
    let seed = rng.pick(&corpus.configs);
    let bytes = match choose(rng) {
        0 => mutate_json(seed, rng).to_string().into_bytes(),
        1 => mutate_bytes(seed.to_string().as_bytes(), rng),
        _ => random_bytes(rng, 512),
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if std::env::var_os("SOLDER_FUZZ_TRACE").is_some() {
        eprintln!("{text}");
    }
    let outcome = match ModelConfig::from_json_str(&text, CONFIG_NAME) {
        Err(e) => named(e.to_string(), CONFIG_NAME),
        Ok(config) => {
            // Deeper: the accepted config must plan or be refused, never panic.
            if let Ok(serve) = ServeShape::with_max_batch(2) {
                if let Ok(instance) = Instance::from_config(&config, serve) {
                    let available = Available::all_kernels(&corpus.shipped_rules);
                    let _ = ExecutionPlan::build(
                        &instance,
                        &corpus.shipped_rules,
                        &available,
                        &Policy::default(),
                        Mode::Decode,
                        1,
                    );
                }
            }
            Outcome::Accepted
        }
    };
    (bytes, outcome)
}

/// Mutated rules: parsed, and when accepted, used to plan the tiny model.
pub fn rules_case(corpus: &Corpus, rng: &mut Rng) -> (Vec<u8>, Outcome) {
    let bytes = match choose(rng) {
        0 => mutate_toml(&corpus.rules, rng).into_bytes(),
        1 => mutate_bytes(corpus.rules.as_bytes(), rng),
        _ => random_bytes(rng, 512),
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let outcome = match RuleSet::from_toml_str(&text, RULES_NAME) {
        Err(e) => named(e.to_string(), RULES_NAME),
        Ok(rules) => {
            if let Ok(serve) = ServeShape::with_max_batch(4) {
                if let Ok(instance) = Instance::from_config(&corpus.tiny, serve) {
                    let available = Available::all_kernels(&rules);
                    for (mode, rows) in [(Mode::Decode, 1), (Mode::MultiSeq, 4), (Mode::Verify, 2)]
                    {
                        let _ = ExecutionPlan::build(
                            &instance,
                            &rules,
                            &available,
                            &Policy::default(),
                            mode,
                            rows,
                        );
                    }
                }
            }
            Outcome::Accepted
        }
    };
    (bytes, outcome)
}

/// Splits a safetensors file into its header JSON and the rest.
fn split_header(file: &[u8]) -> Option<(Value, &[u8])> {
    let len = u64::from_le_bytes(file.get(..8)?.try_into().ok()?) as usize;
    let header = file.get(8..8usize.checked_add(len)?)?;
    Some((serde_json::from_slice(header).ok()?, &file[8 + len..]))
}

/// A mutated checkpoint: its header mutated structurally (shapes, dtypes, offsets), or its
/// bytes; opened, every tensor read, and the tiny model's weights loaded from it.
pub fn checkpoint_case(corpus: &Corpus, rng: &mut Rng, dir: &Path) -> (Vec<u8>, Outcome) {
    let bytes = match choose(rng) {
        0 => match split_header(&corpus.checkpoint) {
            Some((header, data)) => {
                let header = mutate_json(&header, rng).to_string().into_bytes();
                let mut out = (header.len() as u64).to_le_bytes().to_vec();
                if rng.below(8) == 0 {
                    out = (rng.next() >> rng.below(64)).to_le_bytes().to_vec();
                }
                out.extend_from_slice(&header);
                let keep = if rng.below(4) == 0 {
                    rng.below(data.len() + 1)
                } else {
                    data.len()
                };
                out.extend_from_slice(&data[..keep]);
                out
            }
            None => corpus.checkpoint.clone(),
        },
        1 => mutate_bytes(&corpus.checkpoint, rng),
        _ => random_bytes(rng, 256),
    };
    let file = dir.join(CHECKPOINT_FILE);
    if let Err(e) = std::fs::write(&file, &bytes) {
        return (
            bytes,
            Outcome::Unnamed(format!("cannot write {}: {e}", file.display())),
        );
    }
    let outcome = match Checkpoint::open(dir) {
        Err(e) => named(e.to_string(), CHECKPOINT_FILE),
        Ok(checkpoint) => {
            let names: Vec<String> = checkpoint.names().map(str::to_string).collect();
            let mut outcome = Outcome::Accepted;
            for name in &names {
                if let Err(e) = checkpoint.tensor(name) {
                    outcome = named(e.to_string(), name);
                }
            }
            if let Ok(serve) = ServeShape::with_max_batch(2) {
                if let Ok(instance) = Instance::from_config(&corpus.tiny, serve) {
                    if let Err(e) = HostWeights::load(&instance.circuit, &checkpoint) {
                        let message = e.to_string();
                        if !message.contains(CHECKPOINT_FILE)
                            && !names.iter().any(|n| message.contains(n.as_str()))
                        {
                            outcome = Outcome::Unnamed(message);
                        }
                    }
                }
            }
            outcome
        }
    };
    (bytes, outcome)
}
