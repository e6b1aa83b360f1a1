//! Sizes and indices a caller hands the library are checked arithmetic, refused by the
//! argument's name with nothing changed (issue 19 items 5, 6, 7): hidden-row indices near
//! `usize::MAX`, `observe_at` past the hidden rows, `KvShape` fields that wrap a size, a
//! speculative k of `usize::MAX`, adaptive policies no step can follow, and a freed exec.

mod exec_support;

use exec_support::*;
use solder_circuit::Policy;
use solder_config::ServeShape;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{
    Boot, CircuitExec, ExecError, HiddenRows, KvShape, ModelDrafter, MtpDrafter, Session,
    SessionError, SpecPolicy, WeightSource,
};

fn draft_exec(backend: &mut CpuBackend) -> CircuitExec {
    let serve = ServeShape {
        draft_widths: vec![1],
        ..serve()
    };
    CircuitExec::build(
        backend,
        Boot {
            config: config(TINY_NEXT),
            serve,
            rules: rules(),
            policy: Policy::default(),
            weights: WeightSource::Random { seed: 7 },
            kv: roomy_kv(),
            precision: Default::default(),
        },
    )
    .expect("draft exec")
}

fn argument_field(err: &ExecError) -> &'static str {
    match err {
        ExecError::Argument { field, .. } => field,
        other => panic!("expected an Argument refusal, got {other}"),
    }
}

#[test]
fn hidden_row_indices_near_usize_max_are_refused_by_name() {
    let mut backend = backend();
    let exec = draft_exec(&mut backend);
    let before = exec
        .read_hidden(&mut backend, HiddenRows::Target, exec.layout.max_rows)
        .unwrap();
    for which in [HiddenRows::Target, HiddenRows::Draft] {
        let err = exec
            .read_hidden_at(&mut backend, which, usize::MAX, 2)
            .unwrap_err();
        assert_eq!(argument_field(&err), "first", "{err}");
        let err = exec
            .read_hidden_at(&mut backend, which, 0, usize::MAX)
            .unwrap_err();
        assert_eq!(argument_field(&err), "rows", "{err}");
        let max = exec.layout.max_rows;
        assert!(exec.read_hidden_at(&mut backend, which, max, 1).is_err());
        assert!(exec.read_hidden_at(&mut backend, which, max - 1, 1).is_ok());
    }
    let err = exec.chain_hidden(&mut backend, 0, usize::MAX).unwrap_err();
    assert_eq!(argument_field(&err), "to", "{err}");
    let err = exec.chain_hidden(&mut backend, usize::MAX, 0).unwrap_err();
    assert_eq!(argument_field(&err), "from", "{err}");
    let err = exec
        .chain_hidden(&mut backend, 0, exec.layout.max_rows)
        .unwrap_err();
    assert_eq!(argument_field(&err), "to", "{err}");
    let after = exec
        .read_hidden(&mut backend, HiddenRows::Target, exec.layout.max_rows)
        .unwrap();
    let bits = |rows: &[half::bf16]| rows.iter().map(|v| v.to_bits()).collect::<Vec<u16>>();
    assert_eq!(
        bits(&before),
        bits(&after),
        "a refused call wrote the hidden rows"
    );
}

#[test]
fn observe_at_past_the_hidden_rows_is_refused() {
    let mut backend = backend();
    let exec = draft_exec(&mut backend);
    let mut drafter = MtpDrafter::new(&exec).unwrap();
    let err = drafter
        .observe_at(&mut backend, 1, 0, usize::MAX, 2)
        .unwrap_err();
    assert!(
        matches!(
            &err,
            SessionError::Exec(ExecError::Argument { field: "first", .. })
        ),
        "{err}"
    );
    let err = drafter
        .observe_rows(1, usize::MAX, vec![half::bf16::ZERO; 64])
        .unwrap_err();
    assert!(
        matches!(&err, SessionError::Argument { field: "first", .. }),
        "{err}"
    );
    // Nothing was recorded: the first observation must still start at position 0.
    drafter
        .observe_rows(1, 0, vec![half::bf16::ZERO; 64])
        .expect("position 0");
}

fn build_with_kv(
    backend: &mut CpuBackend,
    kv: KvShape,
    json: &str,
) -> Result<CircuitExec, ExecError> {
    CircuitExec::build(
        backend,
        boot(
            config(json),
            Policy::default(),
            WeightSource::Random { seed: 1 },
            kv,
        ),
    )
}

#[test]
fn kv_shapes_that_wrap_a_size_are_refused_by_field() {
    let mut backend = backend();
    let live = backend.live_allocations();
    let cases: [(KvShape, &str, &str); 6] = [
        (kv(16, 4, usize::MAX), TINY_LLAMA, "KvShape::max_seq_len"),
        (kv(usize::MAX, 4, 32), TINY_LLAMA, "KvShape::pages"),
        (kv(16, usize::MAX, 32), TINY_LLAMA, "KvShape::block_size"),
        (kv(16, 0, 32), TINY_LLAMA, "KvShape::block_size"),
        (
            KvShape {
                max_sequences: usize::MAX,
                ..roomy_kv()
            },
            TINY_NEXT,
            "KvShape::max_sequences",
        ),
        // In range alone, past 2^48 bytes of KV pages together.
        (
            kv(KvShape::MAX_PAGES, KvShape::MAX_BLOCK_SIZE, 32),
            TINY_LLAMA,
            "KvShape::pages",
        ),
    ];
    for (shape, json, field) in cases {
        let err = build_with_kv(&mut backend, shape, json)
            .err()
            .expect("refused");
        assert_eq!(argument_field(&err), field, "{shape:?}: {err}");
        assert_eq!(
            backend.live_allocations(),
            live,
            "{shape:?}: a refused build kept memory"
        );
    }
}

#[test]
fn resize_kv_to_a_wrapping_page_count_is_refused() {
    let mut backend = backend();
    let mut exec = build_llama(&mut backend, roomy_kv());
    for pages in [usize::MAX, 0, 1, KvShape::MAX_PAGES + 1] {
        let err = exec.resize_kv(&mut backend, pages).unwrap_err();
        assert_eq!(argument_field(&err), "pages", "{pages}: {err}");
    }
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    session.decode(&mut backend, id, 3).expect("still decodes");
}

#[test]
fn a_speculative_k_of_usize_max_is_refused_not_a_panic() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let same = build_llama(&mut backend, roomy_kv());
    let mut drafter = ModelDrafter::new(&same);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    session.prefill(&mut backend, id, &[1, 2, 3]).unwrap();
    for k in [usize::MAX, usize::MAX - 1, 0, 8] {
        let err = session
            .speculative_step(&mut backend, id, 4, k, &mut drafter)
            .unwrap_err();
        assert!(
            matches!(err, SessionError::DraftLength { .. }),
            "k {k}: {err}"
        );
    }
    let err = session
        .speculative_step_many(&mut backend, &[(id, 4, usize::MAX)], &mut drafter)
        .unwrap_err();
    assert!(matches!(err, SessionError::DraftLength { .. }), "{err}");
    assert_eq!(session.seq_len(id).unwrap(), 3);
    session
        .speculative_step(&mut backend, id, 4, 2, &mut drafter)
        .expect("a valid k still runs");
}

#[test]
fn adaptive_policies_no_step_can_follow_are_refused_by_field() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let same = build_llama(&mut backend, roomy_kv());
    let mut drafter = ModelDrafter::new(&same);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    session.prefill(&mut backend, id, &[1, 2, 3]).unwrap();
    let cases = [
        (
            SpecPolicy::Adaptive {
                min: 1,
                max: usize::MAX,
            },
            "SpecPolicy::Adaptive::max",
        ),
        (
            SpecPolicy::Adaptive { min: 5, max: 2 },
            "SpecPolicy::Adaptive::min",
        ),
        (
            SpecPolicy::Adaptive { min: 0, max: 2 },
            "SpecPolicy::Adaptive::min",
        ),
        (SpecPolicy::Fixed(usize::MAX), "SpecPolicy::Fixed"),
        (SpecPolicy::Fixed(0), "SpecPolicy::Fixed"),
    ];
    // A step first, so the adaptive policy has a history and reaches its clamp.
    let k = session
        .next_k(id, SpecPolicy::Fixed(2))
        .expect("a valid policy");
    session
        .speculative_step(&mut backend, id, 4, k, &mut drafter)
        .expect("a valid policy");
    let len = session.seq_len(id).unwrap();
    for (policy, field) in cases {
        let step = session
            .next_k(id, policy)
            .and_then(|k| session.speculative_step(&mut backend, id, 4, k, &mut drafter));
        match step {
            Err(SessionError::Argument { field: got, .. }) => assert_eq!(got, field, "{policy:?}"),
            other => panic!("{policy:?}: expected a refusal naming {field}, got {other:?}"),
        }
        assert_eq!(
            session.seq_len(id).unwrap(),
            len,
            "{policy:?} moved the sequence"
        );
    }
    // `k` itself never panics, whatever the policy.
    assert_eq!(SpecPolicy::Adaptive { min: 5, max: 2 }.k(Some(0.0)), 2);
    assert_eq!(SpecPolicy::Adaptive { min: 1, max: 7 }.k(Some(f64::MAX)), 7);
    assert_eq!(SpecPolicy::Adaptive { min: 1, max: 7 }.k(Some(f64::NAN)), 1);
}

#[test]
fn a_freed_exec_refuses_steps_and_a_second_free() {
    let mut backend = backend();
    let mut exec = build_llama(&mut backend, roomy_kv());
    exec.free(&mut backend).unwrap();
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let err = session.decode(&mut backend, id, 1).unwrap_err();
    assert!(matches!(err, SessionError::Exec(ExecError::Freed)), "{err}");
    let err = session.prefill(&mut backend, id, &[1, 2]).unwrap_err();
    assert!(matches!(err, SessionError::Exec(ExecError::Freed)), "{err}");
    assert!(session.rewind_point(&mut backend, id).is_err());
    assert_eq!(session.seq_len(id).unwrap(), 0);
    drop(session);
    assert!(matches!(exec.free(&mut backend), Err(ExecError::Freed)));
}

#[test]
fn a_hand_built_config_the_parser_would_refuse_fails_the_build_by_key() {
    let mut backend = backend();
    let live = backend.live_allocations();
    type Edit = fn(&mut solder_config::ModelConfig);
    let edits: [(&str, Edit); 3] = [
        ("vocab_size", |c| c.vocab_size = 0),
        ("head_dim", |c| c.head_dim = 15),
        ("num_key_value_heads", |c| c.num_key_value_heads = 3),
    ];
    for (key, edit) in edits {
        let mut hand_built = config(TINY_LLAMA);
        edit(&mut hand_built);
        let err = CircuitExec::build(
            &mut backend,
            boot(
                hand_built,
                Policy::default(),
                WeightSource::Random { seed: 1 },
                roomy_kv(),
            ),
        )
        .err()
        .expect("refused at build");
        assert!(err.to_string().contains(key), "{key}: {err}");
        assert_eq!(backend.live_allocations(), live);
    }
}
