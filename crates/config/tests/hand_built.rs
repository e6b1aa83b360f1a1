//! A hand-built `ModelConfig` (its fields are public) is held by `check_bounds` to the
//! structure the parser checks key by key (issue 19 item 7): vocab 0, kv heads not dividing
//! heads, an odd head_dim, top-k above the expert count, linear value heads not a multiple of
//! key heads and the like are refused by key, before any compiler sizes a buffer from them.

mod common;

use common::{llama_with, moe_with, next_with};
use solder_config::{ConfigError, ModelConfig};

type Edit = fn(&mut ModelConfig);

fn refused_key(config: &ModelConfig) -> String {
    match config.check_bounds() {
        Err(ConfigError::InvalidValue { key, .. }) => key,
        Err(other) => panic!("expected an InvalidValue refusal, got {other}"),
        Ok(()) => panic!("the hand-built config was accepted"),
    }
}

#[test]
fn the_parsed_configs_pass() {
    for config in [
        llama_with(|_| {}).unwrap(),
        moe_with(|_| {}).unwrap(),
        next_with(|_| {}).unwrap(),
    ] {
        config.check_bounds().expect("as parsed");
    }
}

#[test]
fn dense_dimensions_are_refused_by_key() {
    let base = llama_with(|_| {}).unwrap();
    let cases: [(&str, Edit); 6] = [
        ("vocab_size", |c| c.vocab_size = 0),
        ("hidden_size", |c| c.hidden_size = 0),
        ("num_key_value_heads", |c| {
            c.num_key_value_heads = c.num_attention_heads - 1
        }),
        ("num_key_value_heads", |c| c.num_key_value_heads = 0),
        ("head_dim", |c| c.head_dim = 15),
        ("layer_types", |c| {
            c.layer_types.pop();
        }),
    ];
    for (key, edit) in cases {
        let mut config = base.clone();
        edit(&mut config);
        assert_eq!(refused_key(&config), key);
    }
}

#[test]
fn moe_top_k_above_the_experts_is_refused() {
    let mut config = moe_with(|_| {}).unwrap();
    let moe = config.moe.as_mut().unwrap();
    moe.experts_per_token = moe.num_experts + 1;
    assert_eq!(refused_key(&config), "num_experts_per_tok");
    config.moe.as_mut().unwrap().experts_per_token = 0;
    assert_eq!(refused_key(&config), "num_experts_per_tok");
    let mut config = moe_with(|_| {}).unwrap();
    config.moe.as_mut().unwrap().decoder_sparse_step = 0;
    assert_eq!(refused_key(&config), "decoder_sparse_step");
}

#[test]
fn linear_value_heads_not_a_multiple_of_key_heads_are_refused() {
    let mut config = next_with(|_| {}).unwrap();
    let la = config.linear_attn.as_mut().unwrap();
    la.num_value_heads = la.num_key_heads + 1;
    assert_eq!(refused_key(&config), "linear_num_value_heads");
    let mut config = next_with(|_| {}).unwrap();
    config.linear_attn.as_mut().unwrap().num_key_heads = 0;
    assert_eq!(refused_key(&config), "linear_num_key_heads");
}
