//! Inverse frequencies against hand-computed values, against transformers' formulas
//! evaluated in f64, and (YaRN) against the bits transformers itself computes.

mod common;

use std::path::PathBuf;

use serde_json::json;
use solder_config::{ModelConfig, Rope, RopeScaling};

fn rel_close(actual: f32, expected: f64, tolerance: f64) -> bool {
    ((actual as f64 - expected) / expected).abs() <= tolerance
}

#[test]
fn default_inv_freq_theta_10000_dim_8() {
    let rope = Rope {
        theta: 10000.0,
        scaling: RopeScaling::Default,
        partial_rotary_factor: 1.0,
    };
    // 10000^(-2i/8) for i = 0..4.
    let expected = [1.0, 0.1, 0.01, 0.001];
    let inv_freq = rope.inv_freq(8);
    assert_eq!(inv_freq.len(), 4);
    for (i, (actual, expected)) in inv_freq.iter().zip(expected).enumerate() {
        assert!(
            rel_close(*actual, expected, 1e-6),
            "entry {i}: {actual} vs {expected}"
        );
    }
    assert_eq!(rope.attention_scaling(), 1.0);
}

#[test]
fn partial_rotary_factor_shortens_inv_freq() {
    let rope = Rope {
        theta: 10000.0,
        scaling: RopeScaling::Default,
        partial_rotary_factor: 0.25,
    };
    assert_eq!(rope.rotary_dim(32), 8);
    assert_eq!(
        rope.inv_freq(32),
        Rope {
            partial_rotary_factor: 1.0,
            ..rope.clone()
        }
        .inv_freq(8)
    );
}

enum Band {
    Low,
    Medium,
    High,
}

/// transformers' `_compute_llama3_parameters` for one entry, in f64.
fn llama3_f64(i: usize, dim: usize, theta: f64) -> (f64, Band) {
    let (factor, low, high, old) = (32.0, 1.0, 4.0, 8192.0);
    let inv_freq = 1.0 / theta.powf((2 * i) as f64 / dim as f64);
    let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
    if wavelen < old / high {
        (inv_freq, Band::High)
    } else if wavelen > old / low {
        (inv_freq / factor, Band::Low)
    } else {
        let smooth = (old / wavelen - low) / (high - low);
        (
            (1.0 - smooth) * inv_freq / factor + smooth * inv_freq,
            Band::Medium,
        )
    }
}

#[test]
fn llama3_inv_freq_matches_transformers_for_llama_3_2_1b() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/configs/llama-3.2-1b.json");
    let config = ModelConfig::from_file(&path).expect("llama-3.2-1b loads");
    let inv_freq = config.rope.inv_freq(config.head_dim);
    assert_eq!(inv_freq.len(), 32);
    let default = Rope {
        scaling: RopeScaling::Default,
        ..config.rope.clone()
    }
    .inv_freq(config.head_dim);

    // With theta 5e5 and dim 64: entries 0..=14 are high frequency, 15..=17 medium, 18.. low.
    let (high, band) = llama3_f64(0, 64, 500000.0);
    assert!(matches!(band, Band::High));
    assert_eq!(
        inv_freq[0], default[0],
        "a high-frequency entry is unchanged"
    );
    assert!(rel_close(inv_freq[0], high, 1e-6));

    let (medium, band) = llama3_f64(16, 64, 500000.0);
    assert!(matches!(band, Band::Medium));
    assert!(
        rel_close(inv_freq[16], medium, 1e-6),
        "{} vs {medium}",
        inv_freq[16]
    );
    assert!(
        inv_freq[16] < default[16] && inv_freq[16] > default[16] / 32.0,
        "smoothed between"
    );

    let (low, band) = llama3_f64(31, 64, 500000.0);
    assert!(matches!(band, Band::Low));
    assert_eq!(
        inv_freq[31],
        default[31] / 32.0,
        "a low-frequency entry is divided by factor"
    );
    assert!(rel_close(inv_freq[31], low, 1e-6));

    for (i, actual) in inv_freq.iter().enumerate() {
        let (expected, _) = llama3_f64(i, 64, 500000.0);
        assert!(
            rel_close(*actual, expected, 1e-6),
            "entry {i}: {actual} vs {expected}"
        );
    }
}

/// One YaRN block and what transformers 5.24.0 computes for it: `_compute_yarn_parameters`'s
/// inv_freq (f32 bits, in order) and `emb.cos() * attention_scaling`'s factor as f32.
struct YarnCase {
    name: &'static str,
    /// Entries where torch's `base ** x` (Sleef's `powf`, within 1 ulp) is not the correctly
    /// rounded power that `f32::powf` gives: the default rope shares that pow, so there these
    /// entries may differ by 1 ulp (every other entry is exact).
    pow_differs: &'static [usize],
    head_dim: usize,
    max_position_embeddings: usize,
    partial_rotary_factor: f64,
    rope_parameters: &'static str,
    inv_freq_bits: &'static str,
    attention_scaling_bits: u32,
}

/// Made with `ROPE_INIT_FUNCTIONS["yarn"](LlamaConfig(...))` in transformers 5.24.0 (torch
/// 2.15, CPU): the golden's block, Qwen3's published 128k block, DeepSeek's equal
/// `mscale`/`mscale_all_dim` (attention factor 1), unequal ones, gpt-oss's `truncate: false`,
/// and an explicit `attention_factor` with betas 16/2, partial rotary 0.5 and no
/// `original_max_position_embeddings` (transformers takes `max_position_embeddings`).
const YARN_CASES: &[YarnCase] = &[
    YarnCase {
        name: "golden",
        pow_differs: &[],
        head_dim: 32,
        max_position_embeddings: 128,
        partial_rotary_factor: 1.0,
        rope_parameters: r#"{"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32}"#,
        inv_freq_bits: "3f800000 3e86f161 3d361887 3c99940d 3c0186e3 3b5a7bf2 3ab8449c 3a1b690d 3983126f 38dd1725 383a7753 379d43a4 3704a2b2 365fba4f 35bcb0c1 351f23e4",
        attention_scaling_bits: 0x3f91be9c,
    },
    YarnCase {
        name: "qwen3_128k",
        pow_differs: &[37],
        head_dim: 128,
        max_position_embeddings: 131072,
        partial_rotary_factor: 1.0,
        rope_parameters: r#"{"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768}"#,
        inv_freq_bits: "3f800000 3f4e4bad 3f263de0 3f05f6ef 3ed7e89b 3eadfcff 3e8c3504 3e61f835 3e361887 3e12bd91 3dec7fd6 3dbe94c6 3d99940d 3d778513 3d47763f 3d20bc1d 3d0186e3 3cd0c1a8 3ca8398b 3c879008 3c5a7bf2 3c301052 3c0de12d 3be4aa46 3bb02377 3b876388 3b4fa550 3b1ed248 3af241df 3ab82bc0 3a8b8207 3a527db8 3a1e0eb2 39ec1968 39af3d02 39811c3e 393c93be 39083e38 38c23e9a 38881d0a 383a7753 38164324 37f22ce2 37c327b5 379d43a4 377d75d4 374c3fbe 372497ab 3704a2b2 36d5c441 36ac431d 368ad0ed 365fba4f 36344a0e 361148e3 35ea2732 35bcb0c1 35980e02 35751070 35457bab 351f23e4 35003dec 34ceaf79 34a68e4c",
        attention_scaling_bits: 0x3f91be9c,
    },
    YarnCase {
        name: "mscale",
        pow_differs: &[],
        head_dim: 64,
        max_position_embeddings: 163840,
        partial_rotary_factor: 1.0,
        rope_parameters: r#"{"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}"#,
        inv_freq_bits: "3f800000 3f3ff911 3f0ff59a 3ed7e89b 3ea1e89b 3e72d423 3e361887 3e088d77 3dcccccd 3d99940d 3d6655c2 3d1fc5ba 3cdc321b 3c968dc3 3c4bf283 3c088d77 3bb43959 3b697066 3b136a16 3ab3a2cd 3a4f3e37 39d99312 393a7753 380bd471 37d1b717 379d43a3 376bdcf0 3730df51 3704a2b3 36c6ecdd 36952c42 365fba4f",
        attention_scaling_bits: 0x3f800000,
    },
    YarnCase {
        name: "mscale_unequal",
        pow_differs: &[],
        head_dim: 64,
        max_position_embeddings: 163840,
        partial_rotary_factor: 1.0,
        rope_parameters: r#"{"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5}"#,
        inv_freq_bits: "3f800000 3f3ff911 3f0ff59a 3ed7e89b 3ea1e89b 3e72d423 3e361887 3e088d77 3dcccccd 3d99940d 3d6655c2 3d1fc5ba 3cdc321b 3c968dc3 3c4bf283 3c088d77 3bb43959 3b697066 3b136a16 3ab3a2cd 3a4f3e37 39d99312 393a7753 380bd471 37d1b717 379d43a3 376bdcf0 3730df51 3704a2b3 36c6ecdd 36952c42 365fba4f",
        attention_scaling_bits: 0x3f93eeb3,
    },
    YarnCase {
        name: "no_truncate",
        pow_differs: &[6, 10],
        head_dim: 64,
        max_position_embeddings: 131072,
        partial_rotary_factor: 1.0,
        rope_parameters: r#"{"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false}"#,
        inv_freq_bits: "3f800000 3f306535 3ef316a2 3ea77faa 3e66d3fa 3e1f0cfd 3ddb2f9f 3d970764 3d502194 3d01ddd5 3c9e646f 3c3dec94 3bdea840 3b7cfe14 3b093803 3a89f778 39ef543c 390799b9 3820adc6 37dd6dfc 37989328 375242fa 3710e12c 36c7a82b 3689928c 363d9647 3602a245 35b40668 35781728 352af200 34eb93eb 34a252d3",
        attention_scaling_bits: 0x3fac5c86,
    },
    YarnCase {
        name: "fallback_partial",
        pow_differs: &[],
        head_dim: 64,
        max_position_embeddings: 8192,
        partial_rotary_factor: 0.5,
        rope_parameters: r#"{"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "attention_factor": 1.25, "beta_fast": 16, "beta_slow": 2, "partial_rotary_factor": 0.5, "original_max_position_embeddings": 8192}"#,
        inv_freq_bits: "3f800000 3f0ff59a 3ea1e89b 3e361887 3dcccccd 3d6655c2 3d0186e3 3c91ad39 3c1374bd 3b936a16 3b1111f4 3a8bd97e 3a03126f 39936a16 3925cb60 38ba7753",
        attention_scaling_bits: 0x3fa00000,
    },
];

fn yarn_config(case: &YarnCase) -> ModelConfig {
    let block: serde_json::Value = serde_json::from_str(case.rope_parameters).expect("JSON");
    let (head_dim, max_pos, partial) = (
        case.head_dim,
        case.max_position_embeddings,
        case.partial_rotary_factor,
    );
    common::llama_with(|m| {
        m.remove("rope_theta");
        m.insert("head_dim".into(), json!(head_dim));
        m.insert("max_position_embeddings".into(), json!(max_pos));
        m.insert("partial_rotary_factor".into(), json!(partial));
        m.insert("rope_parameters".into(), block);
    })
    .unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

#[test]
fn yarn_inv_freq_matches_transformers_bits() {
    for case in YARN_CASES {
        let config = yarn_config(case);
        let expected: Vec<u32> = case
            .inv_freq_bits
            .split(' ')
            .map(|word| u32::from_str_radix(word, 16).expect("hex"))
            .collect();
        let actual: Vec<u32> = config
            .rope
            .inv_freq(config.head_dim)
            .iter()
            .map(|f| f.to_bits())
            .collect();
        assert_eq!(actual.len(), expected.len(), "{}", case.name);
        for (i, (a, e)) in actual.iter().zip(&expected).enumerate() {
            let ulps = a.abs_diff(*e);
            let allowed = u32::from(case.pow_differs.contains(&i));
            assert!(
                ulps <= allowed,
                "{} entry {i}: {a:08x} vs transformers' {e:08x}",
                case.name
            );
        }
        assert_eq!(
            config.rope.attention_scaling().to_bits(),
            case.attention_scaling_bits,
            "{}: attention scaling",
            case.name
        );
        let table = config.rope.kernel_table(config.head_dim);
        assert_eq!(table.len(), expected.len() + 1);
        assert_eq!(table.last(), Some(&config.rope.attention_scaling()));
    }
}

#[test]
fn yarn_without_original_context_takes_max_position_embeddings() {
    let case = &YARN_CASES[YARN_CASES.len() - 1];
    let config = yarn_config(case);
    assert!(matches!(
        config.rope.scaling,
        RopeScaling::Yarn { original_max_position_embeddings: 8192, beta_fast, beta_slow, truncate: true, .. }
            if beta_fast == 16.0 && beta_slow == 2.0
    ));
}

#[test]
fn yarn_factor_null_takes_the_context_ratio() {
    // DeepSeek-V3's convention: factor = max_position_embeddings / original (128 / 32 here).
    let golden = yarn_config(&YARN_CASES[0]);
    let null_factor = common::llama_with(|m| {
        m.remove("rope_theta");
        m.insert("max_position_embeddings".into(), json!(128));
        m.insert(
            "rope_parameters".into(),
            json!({"rope_type": "yarn", "rope_theta": 1e6, "factor": null,
                   "original_max_position_embeddings": 32}),
        );
    })
    .expect("factor null loads");
    assert_eq!(null_factor.rope, golden.rope);
}

#[test]
fn legacy_yarn_rope_scaling_reads_as_rope_parameters() {
    // Qwen3's model card: `"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    // "original_max_position_embeddings": 32768}` beside `rope_theta`.
    let modern = yarn_config(&YARN_CASES[1]);
    for type_key in ["type", "rope_type"] {
        let legacy = common::llama_with(|m| {
            m.insert("rope_theta".into(), json!(1e6));
            m.insert("head_dim".into(), json!(128));
            m.insert("max_position_embeddings".into(), json!(131072));
            m.insert(
                "rope_scaling".into(),
                json!({type_key: "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
            );
        })
        .expect("legacy yarn loads");
        assert_eq!(legacy.rope, modern.rope, "{type_key}");
    }
}

#[test]
fn default_and_llama3_scale_cos_sin_by_exactly_one() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/configs/llama-3.2-1b.json");
    let config = ModelConfig::from_file(&path).expect("llama-3.2-1b loads");
    let table = config.rope.kernel_table(config.head_dim);
    assert_eq!(&table[..32], &config.rope.inv_freq(config.head_dim)[..]);
    assert_eq!(table[32].to_bits(), 1.0f32.to_bits());
}
