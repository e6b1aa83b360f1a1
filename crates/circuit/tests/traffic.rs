//! The traffic accounting (`solder_circuit::traffic`) against counts made by hand for a tiny
//! llama: hidden 64, intermediate 96, 3 layers, 4 heads and 2 KV heads of 16, vocab 300, KV
//! pages of 16 tokens, bf16 weights and activations, f32 residual and logits.

use std::path::Path;

use solder_circuit::traffic::{plan_traffic, LaunchTraffic, PlanTraffic};
use solder_circuit::{
    Available, BuildOptions, ExecutionPlan, Fusions, Instance, Mode, Policy, RuleSet,
};
use solder_config::{ModelConfig, ServeShape};

fn instance(tied: bool) -> Instance {
    let text = format!(
        r#"{{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 300, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": {tied}}}"#
    );
    let config = ModelConfig::from_json_str(&text, "llama-tiny.json").expect("a tiny config");
    Instance::from_config(&config, ServeShape::default()).expect("instance")
}

fn traffic(
    instance: &Instance,
    reference: bool,
    mode: Mode,
    rows: usize,
    ctx: usize,
) -> PlanTraffic {
    let mut policy = Policy::default();
    if reference {
        policy.fusions = Fusions::ReferenceOnly;
    }
    traffic_under(instance, &policy, mode, rows, ctx)
}

/// The traffic of `instance`'s plan at (`mode`, `rows`) under `policy`, the shipped rules.
fn traffic_under(
    instance: &Instance,
    policy: &Policy,
    mode: Mode,
    rows: usize,
    ctx: usize,
) -> PlanTraffic {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fusions/FUSIONS.toml");
    let rules = RuleSet::from_file(&path).expect("shipped rules");
    let plan = ExecutionPlan::build_with(
        instance,
        &rules,
        &Available::all_kernels(&rules),
        policy,
        mode,
        rows,
        BuildOptions { verify: true },
    )
    .expect("plan");
    plan_traffic(&instance.circuit, &plan, ctx)
}

fn launch<'a>(
    t: &'a PlanTraffic,
    kernel: &str,
    layer: Option<u32>,
    nth: usize,
) -> &'a LaunchTraffic {
    t.launches
        .iter()
        .filter(|l| l.kernels.iter().any(|k| k == kernel) && l.layer == layer)
        .nth(nth)
        .unwrap_or_else(|| {
            let all: Vec<_> = t.launches.iter().map(|l| (&l.kernels, l.layer)).collect();
            panic!("no launch {nth} of {kernel} in layer {layer:?}: {all:?}")
        })
}

/// (weights, activations read, activations written, state read, state written, metadata).
fn parts(l: &LaunchTraffic) -> [u64; 6] {
    [
        l.weights_read,
        l.activations_read,
        l.activations_written,
        l.state_read,
        l.state_written,
        l.meta_read,
    ]
}

/// Every slot once, but the embedding table: one row (64 bf16) gathered.
/// Per layer: two norms 2·128, q and o 2·8192, k and v 2·4096, gate/up/down 3·12288.
const LAYER_WEIGHTS: u64 = 2 * 128 + 2 * 8192 + 2 * 4096 + 3 * 12288;
const DECODE_WEIGHTS: u64 = 128 + 3 * LAYER_WEIGHTS + 128 + 300 * 64 * 2;

#[test]
fn reference_decode_launches_move_the_hand_counted_bytes() {
    let inst = instance(false);
    let t = traffic(&inst, true, Mode::Decode, 1, 100);
    // Gathers one row of the table, reads the i32 token, writes the f32 residual row.
    assert_eq!(
        parts(launch(&t, "embed::embedding", None, 0)),
        [128, 4, 256, 0, 0, 0]
    );
    // q_proj: 64x64 bf16, one bf16 row in and out.
    let q = launch(&t, "gemv::linear", Some(1), 0);
    assert_eq!(parts(q), [8192, 128, 128, 0, 0, 0]);
    // The KV write: k and v rows in, [2, 32] bf16 into the page, the slot mapping.
    assert_eq!(
        parts(launch(&t, "kv::kv_write", Some(1), 0)),
        [0, 128, 0, 0, 128, 4]
    );
    // Attention at 100 tokens of context: the 101 tokens' K and V (2 heads of 16, bf16),
    // positions, lengths and the 7 block-table entries.
    assert_eq!(
        parts(launch(&t, "attn::paged_decode", Some(2), 0)),
        [0, 128, 128, 101 * 2 * 2 * 16 * 2, 0, 4 + 4 + 7 * 4]
    );
    // The head reads the final norm's bf16 row and the row's want-logits flag, and writes
    // 300 f32 logits.
    assert_eq!(
        parts(launch(&t, "gemv::lm_head", None, 0)),
        [300 * 64 * 2, 128, 1200, 0, 0, 4]
    );
    assert_eq!(t.weights_read(), DECODE_WEIGHTS);
    assert_eq!(t.state_read(), 3 * 101 * 128);
    assert_eq!(t.state_written(), 3 * 128);
    let sum: u64 = t.launches.iter().map(LaunchTraffic::total).sum();
    assert_eq!(t.total(), sum);
    assert!((t.floor_us(1e9) - sum as f64 / 1e3).abs() < 1e-9);
}

#[test]
fn fusion_keeps_the_weights_and_saves_activation_bytes() {
    let inst = instance(false);
    let reference = traffic(&inst, true, Mode::Decode, 1, 0);
    let fused = traffic(&inst, false, Mode::Decode, 1, 0);
    assert!(fused.launches.len() < reference.launches.len());
    assert_eq!(fused.weights_read(), DECODE_WEIGHTS);
    assert_eq!(fused.state_read(), reference.state_read());
    assert!(
        fused.activations_read() + fused.activations_written()
            < reference.activations_read() + reference.activations_written()
    );
}

#[test]
fn a_tied_head_reads_the_whole_table_and_the_embedding_one_row() {
    let tied = traffic(&instance(true), true, Mode::Decode, 1, 0);
    assert_eq!(tied.weights_read(), DECODE_WEIGHTS);
    assert_eq!(launch(&tied, "embed::embedding", None, 0).weights_read, 128);
}

#[test]
fn rows_scale_activations_and_kv_but_not_weights() {
    let inst = instance(false);
    // Four sequences of 31 tokens, one new token each: weights once, KV of 32 tokens each.
    let multi = traffic(&inst, true, Mode::MultiSeq, 4, 31);
    assert_eq!(multi.weights_read(), DECODE_WEIGHTS - 128 + 4 * 128);
    let q = launch(&multi, "gemv::linear", Some(0), 0);
    assert_eq!(parts(q), [8192, 4 * 128, 4 * 128, 0, 0, 0]);
    let attn = launch(&multi, "attn::paged_decode", Some(0), 0);
    assert_eq!(attn.state_read, 4 * 32 * 128);
    assert_eq!(attn.meta_read, 4 * 4 + 4 * 4 + 4 * 2 * 4);
    // Verify: one sequence of 31 + 4 tokens, read once; one block table per row.
    let verify = traffic(&inst, true, Mode::Verify, 4, 31);
    let attn = launch(&verify, "attn::paged_causal", Some(0), 0);
    assert_eq!(attn.state_read, 35 * 128);
    assert_eq!(attn.meta_read, 4 * 4 + 4 * 4 + 4 * 3 * 4);
}

/// Qwen3-Next-80B's gated delta rule walks a sequence's rows one after another: its launch's
/// chain (`solder_circuit::chain`) is rows × key_dim row by row, chunks × the chunk's steps in
/// the chunked form (`gdn_chunked`), one row's for independent sequences; no other launch has
/// one, so only a prompt chunk's bound exceeds its roofline.
#[test]
fn the_gated_delta_rule_walks_a_sequences_rows_in_a_chain_and_its_chunks_in_a_shorter_one() {
    let instance = qwen3_next_80b();
    let chains = |mode: Mode, rows: usize, chunked: bool| {
        let mut policy = Policy::default();
        policy.levers.set("gdn_chunked", chunked).unwrap();
        let t = traffic_under(&instance, &policy, mode, rows, 512);
        let (rate, flops) = (4.8e12, 990e12);
        let longer = t.bound_us(rate, flops) > t.roofline_us(rate, flops) + 1e-6;
        let chained: Vec<u64> = t
            .launches
            .iter()
            .map(|l| l.chain)
            .filter(|&c| c > 0)
            .collect();
        (chained, longer)
    };
    // 36 Gated DeltaNet layers, key_dim 128; chunks of 16 take 2·128 + 120 + 64 + 15 steps.
    let (row_by_row, longer) = chains(Mode::Prefill, 64, false);
    assert_eq!(row_by_row, vec![64 * 128; 36]);
    assert!(longer, "64 rows' chain is past the recurrence's roofline");
    assert_eq!(chains(Mode::Prefill, 64, true).0, vec![4 * 455; 36]);
    assert_eq!(chains(Mode::Decode, 1, false), (vec![128; 36], false));
    // Independent sequences: one row's chain each, whatever the width.
    assert_eq!(chains(Mode::MultiSeq, 8, false), (vec![128; 36], false));
}

fn qwen3_next_80b() -> Instance {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/configs/qwen3-next-80b-a3b.json");
    let text = std::fs::read_to_string(&path).expect("the 80B config");
    let config = ModelConfig::from_json_str(&text, "qwen3-next-80b-a3b.json").expect("config");
    Instance::from_config(&config, ServeShape::default()).expect("instance")
}
