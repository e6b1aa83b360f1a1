//! `generate` on a tiny random-weight checkpoint (tiny-llama's shape, vocabulary widened to
//! the text fixture's 288 tokens) with solder-text's byte-level BPE fixture beside it.

use std::path::{Path, PathBuf};

use solder_config::ServeShape;
use solder_model_layers::{greedy, HostWeights, Session};
use solder_text::{GenerationConfig, Tokenizer};

use super::options::Options;

/// The fixture solder-text's tests use (tokenizer.json, tokenizer_config.json with
/// SmolLM2's chat template, generation_config.json naming <|im_end|>).
fn text_fixture() -> PathBuf {
    crate::paths::workspace_root().join("crates/text/tests/fixtures/chatml-bpe")
}

/// A checkpoint folder of tiny-llama with a 288-token vocabulary and the text fixture.
fn tiny_checkpoint(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("xtask-generate-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let builtin = crate::parity::builtin_named("tiny-llama").unwrap();
    let mut json: serde_json::Value = serde_json::from_str(builtin.config_json).unwrap();
    json["vocab_size"] = 288.into();
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    let config = crate::files::model_config(&dir.join("config.json")).unwrap();
    let instance = solder_circuit::Instance::from_config(&config, ServeShape::default()).unwrap();
    HostWeights::random(&instance.circuit, builtin.seed)
        .save(&instance.circuit, &dir.join("model.safetensors"))
        .unwrap();
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(text_fixture().join(file), dir.join(file)).unwrap();
    }
    dir
}

fn generate(args: &[&str]) -> Result<(), String> {
    super::run(args.iter().map(|s| s.to_string()).collect())
}

/// `generate` with `args` plus `--json`; the JSON it wrote.
fn generate_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    // Beside the checkpoint: a *.json inside it is one of the run's inputs.
    let json = dir.with_extension("out.json");
    let mut all = vec!["--model", dir.to_str().unwrap(), "--threads", "1"];
    all.extend(args);
    all.extend(["--json", json.to_str().unwrap()]);
    generate(&all).unwrap();
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

fn ids(json: &serde_json::Value, key: &str) -> Vec<u32> {
    json[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Plain greedy decoding through `Session` on an exec built as `generate` builds it.
fn greedy_ids(dir: &Path, prompt: &[u32], count: usize) -> Vec<u32> {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let rules = solder_circuit::RuleSet::from_file(
        &crate::paths::workspace_root().join("fusions/FUSIONS.toml"),
    )
    .unwrap();
    let config = super::load::config_of(dir).unwrap();
    let mut exec = super::load::build(
        &mut backend,
        dir,
        config,
        &rules,
        prompt.len() + count,
        false,
    )
    .unwrap();
    let vocab = exec.config.vocab_size;
    let mut out = Vec::new();
    {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let logits = session.prefill(&mut backend, id, prompt).unwrap();
        let mut token = greedy(&logits[(prompt.len() - 1) * vocab..]);
        out.push(token);
        while out.len() < count {
            token = greedy(&session.decode(&mut backend, id, token).unwrap());
            out.push(token);
        }
    }
    exec.free(&mut backend).unwrap();
    out
}

#[test]
fn greedy_generation_is_plain_greedy_decoding_and_stops_at_the_limit() {
    let dir = tiny_checkpoint("greedy");
    let json = generate_json(&dir, &["--prompt", "hello world", "--max-tokens", "7"]);
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let prompt = ids(&json, "prompt_ids");
    assert_eq!(prompt, tokenizer.encode("hello world", true).unwrap());
    let got = ids(&json, "ids");
    let want = greedy_ids(&dir, &prompt, 7);
    assert_eq!(got, want);
    assert_eq!(json["stop_reason"], "length");
    assert_eq!(json["text"], tokenizer.decode(&got, true).unwrap().as_str());
    assert!(json["prompt_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(json["decode_tokens_per_s"].as_f64().unwrap() > 0.0);

    // The same run drafted by a model (the checkpoint itself): the same tokens.
    let d = dir.display().to_string();
    let spec = generate_json(
        &dir,
        &[
            "--prompt",
            "hello world",
            "--max-tokens",
            "7",
            "--speculative",
            &d,
            "--k",
            "3",
        ],
    );
    assert_eq!(ids(&spec, "ids"), want);
    assert_eq!(spec["stop_reason"], "length");

    // An EOS id from generation_config.json ends it there, the id kept, its text not shown.
    let eos = want[2];
    let at = want.iter().position(|&t| t == eos).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        format!("{{\"eos_token_id\": [{eos}]}}"),
    )
    .unwrap();
    let json = generate_json(&dir, &["--prompt", "hello world", "--max-tokens", "7"]);
    assert_eq!(ids(&json, "ids"), want[..=at]);
    assert_eq!(json["stop_reason"], "eos");
    assert_eq!(
        json["text"],
        tokenizer.decode(&want[..at], true).unwrap().as_str()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_chat_is_rendered_and_encoded_without_added_specials() {
    let dir = tiny_checkpoint("chat");
    let json = generate_json(
        &dir,
        &[
            "--prompt",
            "hi",
            "--chat",
            "--system",
            "Be brief.",
            "--max-tokens",
            "2",
        ],
    );
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(
        ids(&json, "prompt_ids"),
        tokenizer.encode(rendered, false).unwrap()
    );
    assert_eq!(ids(&json, "ids").len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn refusals_name_the_file_or_flag() {
    let dir = tiny_checkpoint("refusals");
    let d = dir.display().to_string();
    let e = generate(&["--model", &d, "--prompt", "x", "--system", "s"]).unwrap_err();
    assert!(e.contains("--system") && e.contains("--chat"), "{e}");
    let e = generate(&["--model", &d, "--prompt", "x", "--stop", ""]).unwrap_err();
    assert!(e.contains("--stop"), "{e}");
    let e = generate(&["--model", &d, "--prompt", "x", "--max-tokens", "600"]).unwrap_err();
    assert!(
        e.contains("max_position_embeddings") && e.contains("--max-tokens 600"),
        "{e}"
    );
    let config = dir.join("config.json").display().to_string();
    let e = generate(&[
        "--model",
        &d,
        "--prompt",
        "x",
        "--max-tokens",
        "1",
        "--json",
        &config,
    ])
    .unwrap_err();
    assert!(e.contains("--json") && e.contains("config.json"), "{e}");
    let e = generate(&[
        "--model",
        &d,
        "--prompt",
        "x",
        "--speculative",
        "mtp",
        "--max-tokens",
        "1",
    ])
    .unwrap_err();
    assert!(e.contains("--speculative mtp") && e.contains("MTP"), "{e}");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let e = generate(&["--model", &d, "--prompt", "x"]).unwrap_err();
    assert!(
        e.contains(&format!("text was asked for but {d} has no tokenizer.json")),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sampling_comes_from_flags_then_generation_config() {
    use solder_model_layers::{Sampling, SamplingParams};
    let options = |args: &[&str]| {
        let mut argv = vec!["--model", "m", "--prompt", "p"];
        argv.extend(args);
        Options::parse(argv.iter().map(|s| s.to_string()).collect())
            .unwrap()
            .unwrap()
    };
    let greedy_config = GenerationConfig::default();
    let sampling_config = GenerationConfig {
        do_sample: true,
        temperature: 0.7,
        top_k: 20,
        top_p: 0.8,
        ..GenerationConfig::default()
    };
    assert_eq!(options(&[]).sampling(&greedy_config), Ok(Sampling::Greedy));
    let from_config = SamplingParams {
        temperature: 0.7,
        top_k: 20,
        top_p: 0.8,
        seed: 0,
    };
    assert_eq!(
        options(&[]).sampling(&sampling_config),
        Ok(Sampling::Sampled(from_config))
    );
    assert_eq!(
        options(&["--temperature", "0"]).sampling(&sampling_config),
        Ok(Sampling::Greedy)
    );
    assert_eq!(
        options(&["--top-k", "5", "--seed", "9"]).sampling(&sampling_config),
        Ok(Sampling::Sampled(SamplingParams {
            top_k: 5,
            seed: 9,
            ..from_config
        }))
    );
    // Flags on a greedy checkpoint: the others off.
    assert_eq!(
        options(&["--temperature", "0.5"]).sampling(&greedy_config),
        Ok(Sampling::Sampled(SamplingParams {
            temperature: 0.5,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }))
    );
    let e = options(&["--top-p", "0"])
        .sampling(&greedy_config)
        .unwrap_err();
    assert!(e.contains("--top-p"), "{e}");
    let stops = options(&["--stop", "a", "--stop", "b"]).stops;
    assert_eq!(stops, ["a", "b"]);
}

#[test]
fn sampled_generation_repeats_with_its_seed() {
    let dir = tiny_checkpoint("sampled");
    let args = [
        "--prompt",
        "café",
        "--max-tokens",
        "5",
        "--temperature",
        "1.5",
        "--seed",
        "7",
    ];
    let first = generate_json(&dir, &args);
    let again = generate_json(&dir, &args);
    assert_eq!(ids(&first, "ids"), ids(&again, "ids"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--speculative mtp` on the Qwen3-Next fixture with an MTP head (vocabulary 384, wide
/// enough for the text fixture's 288 ids): greedy, so exactly plain generation's ids.
#[test]
fn mtp_drafted_generation_is_plain_generation() {
    let golden = crate::paths::workspace_root().join("tests/fixtures/golden/qwen3_next_mtp");
    let dir = std::env::temp_dir()
        .join(format!("xtask-generate-{}", std::process::id()))
        .join("mtp");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(golden.join(file), dir.join(file)).unwrap();
    }
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(text_fixture().join(file), dir.join(file)).unwrap();
    }
    let args = ["--prompt", "hello world café", "--max-tokens", "9"];
    let plain = generate_json(&dir, &args);
    let mut with_mtp = args.to_vec();
    with_mtp.extend(["--speculative", "mtp", "--k", "3"]);
    let drafted = generate_json(&dir, &with_mtp);
    assert_eq!(ids(&drafted, "ids"), ids(&plain, "ids"));
    assert_eq!(drafted["text"], plain["text"]);
    assert_eq!(drafted["stop_reason"], plain["stop_reason"]);
    let _ = std::fs::remove_dir_all(&dir);
}
