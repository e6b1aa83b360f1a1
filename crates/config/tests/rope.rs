//! Inverse frequencies against hand-computed values and against transformers' formulas
//! evaluated in f64.

use std::path::PathBuf;

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
