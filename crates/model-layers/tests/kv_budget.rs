//! Issue 23: the KV pool sized from a budget at boot (`Boot::with_kv_budget`): a byte budget
//! becomes the whole pages it holds at the model's bytes per page, the built exec lends
//! exactly those, and a fraction of free memory is refused by name where the backend cannot
//! say how much is free (the CPU backend).

mod exec_support;

use exec_support::*;
use solder_circuit::Policy;
use solder_model_layers::{kv_page_bytes, CircuitExec, KvBudget, Session, WeightSource};

#[test]
fn a_byte_budget_sizes_the_pool_the_exec_lends() {
    let mut backend = backend();
    let boot = || {
        boot(
            config(TINY_LLAMA),
            Policy::default(),
            WeightSource::Random { seed: 3 },
            kv(0, 4, 32),
        )
    };
    let page_bytes = kv_page_bytes(&instance_with_block(4).circuit);
    let budget = KvBudget::Bytes(40 * page_bytes + page_bytes / 2);
    let sized = boot().with_kv_budget(budget, &backend).expect("budget");
    assert_eq!(sized.kv.pages, 40);
    let exec = CircuitExec::build(&mut backend, sized).expect("build");
    let session = Session::new(&exec);
    assert_eq!(
        session.free_page_count(),
        39,
        "every page but the scratch page"
    );

    // Too small for one sequence of 32 tokens (8 pages and the scratch page): refused by name.
    let small = boot()
        .with_kv_budget(KvBudget::Bytes(8 * page_bytes), &backend)
        .err()
        .expect("refused");
    let message = small.to_string();
    assert!(message.contains("KvBudget::Bytes"), "{message}");
    // The CPU backend cannot say what is free.
    let fraction = boot()
        .with_kv_budget(KvBudget::FreeFraction(0.9), &backend)
        .err()
        .expect("refused");
    let message = fraction.to_string();
    assert!(
        message.contains("KvBudget::FreeFraction") && message.contains("free memory"),
        "{message}"
    );
}

fn instance_with_block(block: usize) -> solder_circuit::Instance {
    let options = solder_circuit::CircuitOptions {
        kv_block_size: block,
    };
    solder_circuit::Instance::from_config_with(&config(TINY_LLAMA), serve(), options)
        .expect("instance")
}
