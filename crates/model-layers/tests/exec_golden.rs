//! The outside check on one project golden: the qwen2 case (tied embeddings, q/k/v biases)
//! loaded through `WeightSource::Checkpoint`, decoded teacher-forced over its `input_ids`,
//! within 1.5× of transformers' own bf16 error against its fp32 forward.

mod exec_support;

use exec_support::{backend, boot, workspace_root};
use safetensors::{Dtype, SafeTensors};
use solder_circuit::Policy;
use solder_config::ModelConfig;
use solder_model_layers::{greedy, CircuitExec, KvShape, Session, WeightSource};

fn tensor(file: &SafeTensors<'_>, name: &str, dtype: Dtype) -> (Vec<usize>, Vec<u8>) {
    let t = file
        .tensor(name)
        .unwrap_or_else(|e| panic!("golden `{name}`: {e}"));
    assert_eq!(t.dtype(), dtype, "golden `{name}` dtype");
    (t.shape().to_vec(), t.data().to_vec())
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() {
            f32::INFINITY
        } else {
            m.max(d)
        }
    })
}

#[test]
fn qwen2_golden_within_one_and_a_half_times_transformers_bf16() {
    let dir = workspace_root().join("tests/fixtures/golden/qwen2");
    let bytes = std::fs::read(dir.join("golden.safetensors")).expect("golden.safetensors");
    let golden = SafeTensors::deserialize(&bytes).expect("golden parses");
    let (ids_shape, ids) = tensor(&golden, "input_ids", Dtype::I64);
    let (logits_shape, logits) = tensor(&golden, "logits", Dtype::F32);
    let (_, logits_bf16) = tensor(&golden, "logits_bf16", Dtype::F32);
    let input_ids: Vec<u32> = ids
        .chunks_exact(8)
        .map(|b| u32::try_from(i64::from_le_bytes(b.try_into().unwrap())).unwrap())
        .collect();
    let (reference, hf_bf16) = (floats(&logits), floats(&logits_bf16));
    let tokens = ids_shape[0];
    let vocab = logits_shape[1];
    assert_eq!(logits_shape, vec![tokens, vocab]);

    let config = ModelConfig::from_file(&dir.join("config.json")).expect("config");
    assert!(config.tie_word_embeddings, "the case is meant to be tied");
    assert_eq!(config.vocab_size, vocab);
    let kv = KvShape {
        pages: tokens.div_ceil(16) + 2,
        block_size: 16,
        max_seq_len: tokens.next_multiple_of(16),
        max_sequences: 2,
    };
    let mut backend = backend();
    let exec = CircuitExec::build(
        &mut backend,
        boot(
            config,
            Policy::default(),
            WeightSource::Checkpoint(dir.clone()),
            kv,
        ),
    )
    .expect("build from the golden checkpoint");

    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let mut ours = Vec::with_capacity(tokens * vocab);
    for &t in &input_ids {
        ours.extend(session.decode(&mut backend, id, t).unwrap());
    }
    let e = max_abs_diff(&ours, &reference);
    let e_hf = max_abs_diff(&hf_bf16, &reference);
    let argmax_agree = (0..tokens)
        .filter(|&p| {
            let row = p * vocab..(p + 1) * vocab;
            greedy(&ours[row.clone()]) == greedy(&reference[row])
        })
        .count();
    eprintln!(
        "qwen2 golden: e {e:.4e}, e_hf {e_hf:.4e}, ratio {:.3}, argmax {argmax_agree}/{tokens}",
        e / e_hf
    );
    assert!(e_hf > 0.0, "the golden's bf16 logits equal its fp32 logits");
    assert!(e <= 1.5 * e_hf, "e {e} > 1.5 * e_hf {e_hf}");
}
