//! The fused tensor-core kernels (`gemm::qkv_rope_kv_mma` and its qk-norm entries
//! `gemm::qkv_norm_rope_kv_mma` and `gemm::qkv_gated_norm_zc_rope_kv_mma`, `gemm::qkv_mma`,
//! `gemm::gate_up_silu_mma`, `gemm::linear_pair_mma`) write the bytes of the launches they
//! replace (`gemm::linear_mma` ×3 and `rope::rope_kv_write`, `rope::qk_norm_rope_kv_write` or
//! `rope::gated_qk_norm_zc_rope_kv_write`, ×3, ×2 and `act::silu_mul`, ×2; `flash::paged_mma`
//! storing qwen3_next's output gate, `act::sigmoid_mul`): a program built with every rule
//! and one built without the fused rules give the same logits at decode, across a chunk of two
//! row tiles (64 + 8 rows) and through the headless prefill program, for a model without
//! biases (llama), one with q/k/v biases (qwen2), one with qk-norm (qwen3) and qwen3_next (its
//! gated attention's q/k/v, its shared experts' gate/up); and their
//! quantized entries (`qkv_mma_fp8`, `gate_up_silu_mma_int4`, ...) those of
//! `linear_mma_fp8`/`_int4`, on an fp8 (block 16 × 16) llama and qwen3 and an int4 (AWQ, group
//! 32) qwen2.

mod exec_support;

use exec_support::{assert_same_bytes, backend, config, prompt, TINY_LLAMA, TINY_NEXT, TINY_QWEN2};
use solder_circuit::{Mode, Policy, RuleSet};
use solder_config::{ModelConfig, Quantization};
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{Boot, CircuitExec, ProgramStep, Session, WeightSource};

const FUSED: [&str; 8] = [
    "qkv_rope_kv_tensor_cores",
    "qkv_norm_rope_kv_tensor_cores",
    "qkv_gated_norm_zc_rope_kv_tensor_cores",
    "qkv_tensor_cores",
    "gate_up_silu_tensor_cores",
    "shared_gate_up_silu_tensor_cores",
    "gated_attention_tensor_cores",
    "gdn_in_proj_tensor_cores",
];

/// A qwen3: qk-norm, head_dim 32 (hidden 64, 4 heads, GQA 4/2), vocab 128, untied.
const TINY_QWEN3: &str = r#"{
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 128,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
    "rope_theta": 1000000.0, "hidden_act": "silu", "attention_bias": false
}"#;
const CHUNK: usize = 72;

fn build(backend: &mut CpuBackend, model: &ModelConfig, rules: RuleSet) -> CircuitExec {
    let mut policy = Policy::default();
    policy.levers.set("tensor_cores", true).unwrap();
    let mut serve = exec_support::serve();
    serve.verify_widths.push(CHUNK);
    let boot = Boot {
        serve,
        rules,
        ..exec_support::boot(
            model.clone(),
            policy,
            WeightSource::Random { seed: 0x7c0e },
            exec_support::kv(2 * 40 + 2, 4, 160),
        )
    };
    CircuitExec::build(backend, boot).expect("build")
}

/// The kernel entries the (mode, rows) program launches, in order.
fn kernels(exec: &CircuitExec, mode: Mode, rows: usize) -> Vec<String> {
    let program = exec.program(mode, rows).expect("planned");
    program
        .steps
        .iter()
        .filter_map(|step| match step {
            ProgramStep::Launch { name, .. } => Some(name.to_string()),
            _ => None,
        })
        .collect()
}

/// Every position's logits of a 75-token prompt (a 72-row chunk and a 3-row one), then the
/// last position's logits of the same prompt through the headless prefill program, then two
/// decode steps after each.
fn run(exec: &CircuitExec, backend: &mut CpuBackend) -> Vec<f32> {
    let tokens = prompt(11, 128, 75);
    let mut session = Session::new(exec);
    let (all, headless) = (session.add_sequence(), session.add_sequence());
    let mut out = session.prefill(backend, all, &tokens).unwrap();
    out.extend(session.prefill_last(backend, headless, &tokens).unwrap());
    for t in [5, 9] {
        out.extend(session.decode(backend, all, t).unwrap());
        out.extend(session.decode(backend, headless, t).unwrap());
    }
    out
}

/// The tiny models: bf16 llama, qwen2 and qwen3, an fp8 llama and qwen3 and an int4 qwen2; and
/// the suffix of their fused kernels' entries.
fn models() -> Vec<(&'static str, ModelConfig, &'static str)> {
    let quantized = |json: &str, q: Quantization| {
        let mut c = config(json);
        c.quantization = Some(q);
        c
    };
    let fp8 = || Quantization::Fp8Block {
        block: [16, 16],
        not_converted: Vec::new(),
    };
    vec![
        ("llama", config(TINY_LLAMA), ""),
        ("qwen2", config(TINY_QWEN2), ""),
        ("qwen3", config(TINY_QWEN3), ""),
        ("qwen3-next", config(TINY_NEXT), ""),
        ("qwen3 fp8", quantized(TINY_QWEN3, fp8()), "_fp8"),
        (
            "llama fp8",
            quantized(
                TINY_LLAMA,
                Quantization::Fp8Block {
                    block: [16, 16],
                    not_converted: Vec::new(),
                },
            ),
            "_fp8",
        ),
        (
            "qwen2 int4",
            quantized(
                TINY_QWEN2,
                Quantization::Awq {
                    group_size: 32,
                    zero_point: true,
                    not_converted: Vec::new(),
                },
            ),
            "_int4",
        ),
    ]
}

#[test]
fn fused_tensor_core_kernels_write_the_bytes_of_the_launches_they_replace() {
    let mut backend = backend();
    for (name, model, entry) in models() {
        let rules = exec_support::rules();
        let mut unfused = rules.clone();
        unfused.rules.retain(|r| !FUSED.contains(&r.id.as_str()));
        assert_eq!(unfused.rules.len() + FUSED.len(), rules.rules.len());
        let (mut fused, mut single) = (
            build(&mut backend, &model, rules),
            build(&mut backend, &model, unfused),
        );
        // (mode, rows, MLPs): the prefill program drops the last layer's MLP, not its q/k/v.
        for (mode, rows, mlps) in [
            (Mode::Decode, 1, 2),
            (Mode::Verify, CHUNK, 2),
            (Mode::Prefill, CHUNK, 1),
        ] {
            let (f, s) = (kernels(&fused, mode, rows), kernels(&single, mode, rows));
            if name == "qwen3-next" {
                // Its attention layer's q (with the gate), k, v, the gate split, zero-centred
                // qk-norm, rope and the KV write in one launch (3 saved: linear_mma ×3 and
                // gated_qk_norm_zc_rope_kv_write); each shared expert's gate/up+SiLU·mul in one
                // launch (2 saved); the output gate stored by flash::paged_mma (1 saved); its
                // Gated DeltaNet layer's two input projections in one launch (1 saved).
                let qkv = format!("gemm::qkv_gated_norm_zc_rope_kv_mma{entry}");
                let gate_up = "gemm::gate_up_silu_mma";
                let pair = "gemm::linear_pair_mma";
                for (kernel, count) in [(qkv.as_str(), 1), (gate_up, mlps), (pair, 1)] {
                    let launched = f.iter().filter(|k| *k == kernel).count();
                    assert_eq!(launched, count, "{name} {mode:?}: {kernel} in {f:?}");
                    assert!(!s.iter().any(|k| k == kernel), "{name} {mode:?}");
                }
                // (The headless prefill prunes the last layer's attention output, so its gate.)
                let gated = "act::sigmoid_mul";
                let gates = s.iter().filter(|k| *k == gated).count();
                assert!(!f.iter().any(|k| k == gated), "{name} {mode:?}: {f:?}");
                assert!(
                    gates == 1 || mode == Mode::Prefill,
                    "{name} {mode:?}: {s:?}"
                );
                assert_eq!(
                    f.len() + 3 + gates + 2 * mlps + 1,
                    s.len(),
                    "{name} {mode:?}: {f:?}"
                );
                continue;
            }
            // q/k/v, (qk-norm,) rope and the KV write in one launch of the format's entry.
            let stem = match name.starts_with("qwen3") {
                true => "qkv_norm_rope_kv_mma",
                false => "qkv_rope_kv_mma",
            };
            let (qkv, qkv_launches) = (format!("gemm::{stem}{entry}"), 1);
            let gate_up = format!("gemm::gate_up_silu_mma{entry}");
            for (kernel, count) in [(&qkv, 2), (&gate_up, mlps)] {
                let launched = f.iter().filter(|k| *k == kernel).count();
                assert_eq!(launched, count, "{name} {mode:?}: {kernel} in {f:?}");
                assert!(!s.contains(kernel), "{name} {mode:?}");
            }
            // q/k/v (+ rope_kv_write) 4 → qkv_launches, gate/up/silu_mul 3 → 1.
            assert_eq!(
                f.len() + 2 * (4 - qkv_launches) + 2 * mlps,
                s.len(),
                "{name} {mode:?}: {f:?}"
            );
        }
        let want = run(&single, &mut backend);
        let got = run(&fused, &mut backend);
        assert_same_bytes(
            &got,
            &want,
            &format!("{name}: fused vs single tensor-core launches"),
        );
        fused.free(&mut backend).unwrap();
        single.free(&mut backend).unwrap();
    }
}
