//! The memory pass's sweep (`memory::conflicts`) gives exactly the adjacency of the pairwise
//! definition (`memory::conflicts_pairwise`), on one and two streams, for every family.

use std::path::Path;

use solder_circuit::planner::{liveness, memory, streams, topo};
use solder_circuit::{build_circuit, fuse, Available, CircuitOptions, Mode, Policy, RuleSet};
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
