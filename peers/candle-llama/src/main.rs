//! candle 0.11 decoding a Llama checkpoint on the CPU, timed like `cargo xtask bench`:
//! prefill T tokens (one forward), then N greedy decode steps with the KV cache; prints the
//! prefill time and the median step.
//!
//! usage: candle-llama-peer DIR [--prompt-len T] [--gen N] [--dtype bf16|f32]

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Llama, LlamaConfig};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: candle-llama-peer DIR [--prompt-len T] [--gen N] [--dtype bf16|f32]")?);
    let (mut prompt_len, mut gen, mut dtype) = (32usize, 128usize, DType::BF16);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--prompt-len" => prompt_len = value.parse()?,
            "--gen" => gen = value.parse()?,
            "--dtype" => dtype = if value == "f32" { DType::F32 } else { DType::BF16 },
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let device = Device::Cpu;
    let config: LlamaConfig = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let config = config.into_config(false);
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], dtype, &device)? };
    let model = Llama::load(vb, &config)?;
    let mut cache = Cache::new(true, dtype, &config, &device)?;
    let vocab = config.vocab_size as u32;
    let prompt: Vec<u32> = (0..prompt_len).map(|i| (i as u32 * 7919 + 13) % vocab).collect();
    let t = Instant::now();
    let logits = model.forward(&Tensor::new(prompt.as_slice(), &device)?.unsqueeze(0)?, 0, &mut cache)?;
    let prefill_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut token = logits.squeeze(0)?.argmax(0)?.to_scalar::<u32>()?;
    let mut steps = Vec::with_capacity(gen);
    for i in 0..gen {
        let t = Instant::now();
        let logits = model.forward(&Tensor::new(&[token], &device)?.unsqueeze(0)?, prompt_len + i, &mut cache)?;
        token = logits.squeeze(0)?.argmax(0)?.to_scalar::<u32>()?;
        steps.push(t.elapsed().as_secs_f64() * 1e3);
    }
    steps.sort_by(f64::total_cmp);
    let median = steps[gen / 2];
    eprintln!("prefill {prompt_len} tokens in {prefill_ms:.1} ms; decode median {median:.2} ms (min {:.2}, max {:.2})", steps[0], steps[gen - 1]);
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("model");
    println!(
        "candle decode: model={name} dtype={dtype:?} prefill_tokens={prompt_len} gen_tokens={gen} decode_tok_per_s={:.2} ms_per_token={median:.2} prefill_ms={prefill_ms:.1} prefill_tok_per_s={:.1}",
        1e3 / median,
        prompt_len as f64 * 1e3 / prefill_ms
    );
    Ok(())
}
