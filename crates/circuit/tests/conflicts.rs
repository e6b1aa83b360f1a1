//! The memory pass: its sweep (`memory::conflicts`) gives exactly the adjacency of the pairwise
//! definition (`memory::conflicts_pairwise`), on one and two streams, for every family; its
//! placement reaches the bound where first-fit does not.

use std::path::Path;

use solder_circuit::planner::{liveness, memory, streams, topo};
use solder_circuit::{
    build_circuit, fuse, Available, CircuitOptions, GroupId, Mode, Policy, RuleSet,
};
use solder_config::ModelConfig;

fn same_adjacency(config_name: &str, max_streams: usize, mode: Mode, rows: usize) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rules = RuleSet::from_file(&root.join("fusions/FUSIONS.toml")).expect("rules");
    let config = ModelConfig::from_file(&root.join("tests/fixtures/configs").join(config_name))
        .expect("config");
    let circuit = build_circuit(&config, "c", CircuitOptions::default()).expect("circuit");
    let available = Available::all_kernels(&rules);
    let policy = Policy {
        max_streams,
        ..Policy::default()
    };
    let fusion = fuse(&circuit, &rules, &available, &policy, mode, rows).expect("fuse");
    let order = topo::topo_order(&topo::group_graph(&circuit, &fusion)).expect("order");
    let lifetimes = liveness::liveness(&circuit, &fusion, &order);
    let plan = streams::assign_streams(&circuit, &fusion, &order, max_streams);
    let sweep = memory::conflicts(&lifetimes, &plan);
    let pairwise = memory::conflicts_pairwise(&lifetimes, |a, b| plan.happens_before(a, b));
    assert_eq!(
        sweep, pairwise,
        "{config_name} {mode} {rows} streams {max_streams}"
    );
    plan.num_streams
}

#[test]
fn sweep_matches_the_pairwise_definition() {
    let mut two_streams = false;
    for config in [
        "golden-llama-gqa.json",
        "golden-qwen3-moe.json",
        "golden-qwen3-next.json",
        "qwen3-next-80b-a3b.json",
    ] {
        for max_streams in [1, 2, 3] {
            for (mode, rows) in [(Mode::Decode, 1), (Mode::MultiSeq, 8), (Mode::Verify, 4)] {
                two_streams |= same_adjacency(config, max_streams, mode, rows) > 1;
            }
        }
    }
    assert!(two_streams, "some plan uses a side stream");
}

/// One buffer of a synthetic single-stream plan: `bytes`, written at step `first`, last read
/// at step `last` (the group at each step is the step's index).
fn buffer(index: u32, bytes: usize, first: usize, last: usize) -> liveness::Lifetime {
    liveness::Lifetime {
        tensor: solder_circuit::ir::TensorId(index),
        bytes,
        writer: GroupId(first as u32),
        readers: vec![GroupId(last as u32)],
        first,
        last,
    }
}

/// qwen3-30b-a3b's MoE layer at decode after q/k/v took rope and the KV write (issue 18), in
/// 4 KiB units: the q/k/v launch writes h_mlp (2) and q_rot (2) while h_attn (2) and
/// experts_out (1) are still read, 28 KiB live. Every first-fit ordering places each layer
/// alike and needs 32 KiB; the bound needs consecutive layers to mirror each other, which the
/// memory pass's search finds.
#[test]
fn a_repeated_moe_layer_packs_to_its_bound() {
    const UNIT: usize = 4096;
    let mut lifetimes = vec![buffer(0, 2 * UNIT, 0, 3)];
    for layer in 0..48 {
        let base = 7 * layer + 1;
        let mut push = |bytes: usize, first: usize, last: usize| {
            let index = lifetimes.len() as u32;
            lifetimes.push(buffer(index, bytes, base + first, base + last));
        };
        if layer > 0 {
            push(2 * UNIT, 0, 2); // the previous layer's h_mlp
        }
        push(2 * UNIT, 0, 1); // q_rot
        push(2 * UNIT, 1, 2); // attn
        push(2 * UNIT, 2, 7); // h_attn
        push(UNIT, 3, 5); // post_attention_layernorm.out
        push(32, 4, 6); // expert_ids
        push(32, 4, 6); // expert_weights
        push(3 * UNIT, 5, 6); // experts_act
        push(UNIT, 6, 7); // experts_out
    }
    let steps = lifetimes.iter().map(|l| l.last).max().unwrap_or(0) + 1;
    let adjacency = memory::conflicts_pairwise(&lifetimes, |a, b| a.0 < b.0);
    let bound = memory::live_lower_bound(&lifetimes, steps);
    assert_eq!(bound, 7 * UNIT);
    let placement = memory::place(&lifetimes, &adjacency, bound);
    assert_eq!(
        (placement.pool_bytes, placement.strategy),
        (bound, "gap-search")
    );
    // Conflicting buffers disjoint, every offset aligned, inside the pool.
    for (i, l) in lifetimes.iter().enumerate() {
        let (start, end) = (
            placement.offsets[i],
            placement.offsets[i] + memory::align_up(l.bytes),
        );
        assert!(
            start % memory::ALIGN == 0 && end <= placement.pool_bytes,
            "{i}"
        );
        for &j in &adjacency[i] {
            let other = placement.offsets[j];
            let other_end = other + memory::align_up(lifetimes[j].bytes);
            assert!(end <= other || other_end <= start, "{i} and {j} overlap");
        }
    }
    // Told a bound first-fit already meets, the pass keeps first-fit's best: 32 KiB, the
    // pool before the search.
    let greedy = memory::place(&lifetimes, &adjacency, usize::MAX);
    assert_eq!(greedy.pool_bytes, 8 * UNIT, "{}", greedy.strategy);
}
