//! A llama-architecture GGUF (as llama.cpp's `convert_hf_to_gguf.py` writes it) back to a
//! Hugging Face checkpoint folder: `model.safetensors` (bf16, Hugging Face names, llama.cpp's
//! q/k row permutation undone), `config.json`, `generation_config.json`, and a byte-level BPE
//! `tokenizer.json` + `tokenizer_config.json` (with the chat template) from the GGUF's
//! `tokenizer.ggml.*` metadata.
//!
//! The permutation: llama.cpp stores each head's q/k rows interleaved (row `2i + half` holds
//! Hugging Face's row `half · d/2 + i`, d the head's rows); Hugging Face's rotate-half rope
//! wants them split, so row `h·d + half·d/2 + i` here reads GGUF row `h·d + 2i + half` — the
//! inverse transformers' GGUF loader applies (`_reverse_permute_weights`).

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Map, Value as Json};

use super::gguf::{Gguf, Value};

/// GGUF tensor names (llama.cpp's) and their Hugging Face names, per layer or global.
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// The shape read from the GGUF's `llama.*` metadata.
struct Dims {
    layers: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
}

fn dims(g: &Gguf) -> Result<Dims, String> {
    let arch = g.str("general.architecture")?;
    if arch != "llama" {
        return Err(format!(
            "general.architecture `{arch}`: only llama GGUFs are converted"
        ));
    }
    Ok(Dims {
        layers: g.u64("llama.block_count")? as usize,
        hidden: g.u64("llama.embedding_length")? as usize,
        heads: g.u64("llama.attention.head_count")? as usize,
        kv_heads: g.u64("llama.attention.head_count_kv")? as usize,
    })
}

/// Hugging Face's name of GGUF tensor `name`.
fn hf_name(name: &str) -> Result<String, String> {
    match name {
        "token_embd.weight" => return Ok("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Ok("model.norm.weight".into()),
        "output.weight" => return Ok("lm_head.weight".into()),
        _ => {}
    }
    let rest = name
        .strip_prefix("blk.")
        .ok_or_else(|| format!("tensor `{name}` has no Hugging Face name here"))?;
    let (layer, rest) = rest
        .split_once('.')
        .ok_or_else(|| format!("tensor `{name}`"))?;
    let (part, suffix) = rest
        .split_once('.')
        .ok_or_else(|| format!("tensor `{name}`"))?;
    let hf = LAYER_NAMES
        .iter()
        .find(|(g, _)| *g == part)
        .map(|(_, h)| h)
        .ok_or_else(|| format!("tensor `{name}` has no Hugging Face name here"))?;
    Ok(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// Undoes llama.cpp's q/k permutation over `heads` heads of a `[rows, cols]` matrix.
pub fn unpermute(values: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let d = rows / heads;
    let half = d / 2;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for part in 0..2 {
            for i in 0..half {
                let to = h * d + part * half + i;
                let from = h * d + 2 * i + part;
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&values[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

fn bf16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect()
}

/// Writes `model.safetensors` into `dir`.
fn write_weights(g: &Gguf, dims: &Dims, dir: &Path) -> Result<usize, String> {
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (i, t) in g.tensors.iter().enumerate() {
        let name = hf_name(&t.name)?;
        let mut values = g.dequantise(t)?;
        let heads = if t.name.ends_with(".attn_q.weight") {
            Some(dims.heads)
        } else if t.name.ends_with(".attn_k.weight") {
            Some(dims.kv_heads)
        } else {
            None
        };
        if let Some(heads) = heads {
            let [rows, cols] = t.shape[..] else {
                return Err(format!("tensor `{}` is not a matrix", t.name));
            };
            values = unpermute(&values, rows, cols, heads);
        }
        tracing::debug!(tensor = %name, shape = ?t.shape, "converted");
        if i % 40 == 0 {
            tracing::info!("{}/{} tensors", i, g.tensors.len());
        }
        tensors.push((name, t.shape.clone(), bf16_bytes(&values)));
    }
    let expected =
        3 + dims.layers * LAYER_NAMES.len() - usize::from(g.tensor("output.weight").is_none());
    if tensors.len() != expected {
        return Err(format!(
            "{} tensors, {expected} expected for {} layers",
            tensors.len(),
            dims.layers
        ));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::BF16, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| format!("{name}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(tensors.len())
}

/// `config.json`: the GGUF's shape, and the keys SmolLM2's published config carries beside
/// them (`is_llama_config`, `rope_interleaved`, `pretraining_tp`, …), as it is published.
fn config(g: &Gguf, dims: &Dims) -> Result<Json, String> {
    let vocab = g
        .get("tokenizer.ggml.tokens")?
        .as_array()
        .map(<[Value]>::len)
        .ok_or("metadata `tokenizer.ggml.tokens` is not an array")?;
    let id = |key: &str| g.u64(key).ok();
    Ok(json!({
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": id("tokenizer.ggml.bos_token_id"),
        "eos_token_id": id("tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "hidden_size": dims.hidden,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": g.u64("llama.feed_forward_length")?,
        "is_llama_config": true,
        "max_position_embeddings": g.u64("llama.context_length")?,
        "mlp_bias": false,
        "model_type": "llama",
        "num_attention_heads": dims.heads,
        "num_hidden_layers": dims.layers,
        "num_key_value_heads": dims.kv_heads,
        "pad_token_id": id("tokenizer.ggml.padding_token_id"),
        "pretraining_tp": 1,
        "rms_norm_eps": g.f64("llama.attention.layer_norm_rms_epsilon")? as f32 as f64,
        "rope_interleaved": false,
        "rope_scaling": null,
        "rope_theta": g.f64("llama.rope.freq_base")?,
        "tie_word_embeddings": g.tensor("output.weight").is_none(),
        "torch_dtype": "bfloat16",
        "transformers_version": "4.42.3",
        "unk_token_id": id("tokenizer.ggml.unknown_token_id"),
        "use_cache": true,
        "vocab_size": vocab,
    }))
}

fn strings<'g>(g: &'g Gguf, key: &str) -> Result<Vec<&'g str>, String> {
    g.get(key)?
        .as_array()
        .ok_or_else(|| format!("metadata `{key}` is not an array"))?
        .iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| format!("metadata `{key}`: not strings"))
        })
        .collect()
}

/// `tokenizer.json`: byte-level BPE over the GGUF's tokens and merges; control tokens
/// (`token_type` 3) and user-defined ones (4) are added tokens, specials the former. The
/// pre-tokenizer for `tokenizer.ggml.pre` `smollm` is SmolLM2's published one: single digits
/// split off, then GPT-2's byte-level split.
fn tokenizer(g: &Gguf) -> Result<Json, String> {
    let model = g.str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(format!(
            "tokenizer.ggml.model `{model}`: only byte-level BPE (gpt2) is converted"
        ));
    }
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let merges = strings(g, "tokenizer.ggml.merges")?;
    let types: Vec<u64> = g
        .get("tokenizer.ggml.token_type")?
        .as_array()
        .ok_or("metadata `tokenizer.ggml.token_type` is not an array")?
        .iter()
        .map(|v| v.as_u64().unwrap_or(1))
        .collect();
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        vocab.insert((*token).to_string(), json!(id));
        let ty = types.get(id).copied().unwrap_or(1);
        if ty == 3 || ty == 4 {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == 3,
            }));
        }
    }
    let pre = g.str("tokenizer.ggml.pre").unwrap_or("default");
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let pre_tokenizer = match pre {
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level]}),
        "gpt-2" | "default" => byte_level,
        other => {
            return Err(format!(
                "tokenizer.ggml.pre `{other}`: its split rule is not known here"
            ))
        }
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}

/// `tokenizer_config.json` (special tokens by content, the chat template) and
/// `generation_config.json` (bos, eos, pad ids).
fn tokenizer_config(g: &Gguf) -> Result<(Json, Json), String> {
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let token = |key: &str| -> Json {
        g.u64(key)
            .ok()
            .and_then(|id| tokens.get(id as usize))
            .map_or(Json::Null, |t| json!(t))
    };
    let mut config = json!({
        "add_prefix_space": false,
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "clean_up_tokenization_spaces": false,
        "model_max_length": g.u64("llama.context_length")?,
        "tokenizer_class": "GPT2Tokenizer",
    });
    if let Ok(template) = g.str("tokenizer.chat_template") {
        config["chat_template"] = json!(template);
    }
    let id = |key: &str| g.u64(key).ok();
    let generation = json!({
        "bos_token_id": id("tokenizer.ggml.bos_token_id"),
        "eos_token_id": id("tokenizer.ggml.eos_token_id"),
        "pad_token_id": id("tokenizer.ggml.padding_token_id"),
    });
    Ok((config, generation))
}

fn write_json(dir: &Path, name: &str, value: &Json) -> Result<(), String> {
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(value).map_err(|e| format!("{name}: {e}"))?;
    std::fs::write(&path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes the Hugging Face checkpoint of `g` into the (empty) folder `dir`.
pub fn convert(g: &Gguf, dir: &Path) -> Result<(), String> {
    let dims = dims(g)?;
    let count = write_weights(g, &dims, dir)?;
    write_json(dir, "config.json", &config(g, &dims)?)?;
    write_json(dir, "tokenizer.json", &tokenizer(g)?)?;
    let (tokenizer_config, generation) = tokenizer_config(g)?;
    write_json(dir, "tokenizer_config.json", &tokenizer_config)?;
    write_json(dir, "generation_config.json", &generation)?;
    tracing::info!("{count} tensors written to {}", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp's permute: w.reshape(heads, 2, d/2, cols).swapaxes(1, 2).
        let (heads, d, cols) = (3, 4, 2);
        let hf: Vec<f32> = (0..heads * d * cols).map(|v| v as f32).collect();
        let mut gguf = vec![0.0; hf.len()];
        for h in 0..heads {
            for part in 0..2 {
                for i in 0..d / 2 {
                    let from = h * d + part * d / 2 + i;
                    let to = h * d + 2 * i + part;
                    gguf[to * cols..(to + 1) * cols]
                        .copy_from_slice(&hf[from * cols..(from + 1) * cols]);
                }
            }
        }
        assert_eq!(unpermute(&gguf, heads * d, cols, heads), hf);
    }

    #[test]
    fn names_map_to_hugging_face() {
        assert_eq!(
            hf_name("blk.7.attn_q.weight").unwrap(),
            "model.layers.7.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_name("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert!(hf_name("blk.0.ssm_a").unwrap_err().contains("ssm_a"));
    }
}
