//! `CircuitExec::build`: a program for every serve shape, stable digests, one workspace sized
//! by the layout, launch counts from the plans, fallbacks when fused kernels are absent, and
//! the same logits from every weight source and routing, recurrent snapshots kept by the verify
//! programs alone, a launch past a grid's limits refused. The launch entries and splits the
//! levers pick are `exec_launches.rs`'.

mod exec_support;

use exec_support::{
    assert_same_bytes, backend, boot, build, build_llama, config, decode_alone, kv, prompt,
    roomy_kv, rules, TempDir, TINY_LLAMA, TINY_NEXT, TINY_QWEN2,
};
use solder_circuit::{Mode, Numerics, Policy};
use solder_gpu_runtime::{CpuBackend, GpuBackend, ModuleImage};
use solder_model_layers::kernels::{self, MODULES};
use solder_model_layers::{CircuitExec, ExecError, HostWeights, ProgramStep, WeightSource};

#[test]
fn a_program_for_every_serve_shape() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut expected = vec![(Mode::Decode, 1)];
    expected.extend([2, 4, 8].map(|w| (Mode::MultiSeq, w)));
    expected.extend((2..=8).map(|k| (Mode::Verify, k)));
    expected.extend((2..=8).map(|k| (Mode::Prefill, k)));
    expected.extend([4, 8].map(|w| (Mode::VerifyBatch, w)));
    assert_eq!(exec.instance.shapes(), expected);
    assert_eq!(exec.programs().len(), expected.len());
    assert_eq!(exec.plans.len(), expected.len());
    for &(mode, rows) in &expected {
        let program = exec.program(mode, rows).unwrap();
        assert_eq!((program.mode, program.rows), (mode, rows));
        assert!(program.launches() > 0);
        assert!(exec.plan(mode, rows).is_some());
    }
    assert_eq!(exec.decode_program().unwrap().rows, 1);
    assert_eq!(exec.multi_seq_program(8).unwrap().rows, 8);
    assert_eq!(exec.verify_program(5).unwrap().rows, 5);
    match exec.multi_seq_program(16) {
        Err(e @ ExecError::NoProgram { .. }) => {
            let message = e.to_string();
            assert!(message.contains("multi_seq:8"), "{message}");
        }
        other => panic!("expected NoProgram, got {:?}", other.map(|p| p.rows)),
    }
    assert!(exec.verify_program(9).is_err());
    // A prefill program is its verify program without the LM head (and what only it needs).
    let (verify, prefill) = (
        exec.verify_program(8).unwrap(),
        exec.program(Mode::Prefill, 8).unwrap(),
    );
    assert!(
        prefill.launches() < verify.launches(),
        "{} vs {}",
        prefill.launches(),
        verify.launches()
    );
}

#[test]
fn digests_are_non_empty_and_stable_across_builds() {
    let mut backend = backend();
    let a = build_llama(&mut backend, roomy_kv());
    let b = build_llama(&mut backend, roomy_kv());
    assert!(!a.rules_digest().is_empty());
    assert!(!a.plans_digest().is_empty());
    assert_eq!(a.rules_digest(), rules().digest);
    assert_eq!(a.rules_digest(), b.rules_digest());
    assert_eq!(a.plans_digest(), b.plans_digest());
    for (pa, pb) in a.programs().iter().zip(b.programs()) {
        assert_eq!(pa.plan_digest, pb.plan_digest);
        assert_eq!(shape_of(pa), shape_of(pb));
    }
    let reference = build(
        &mut backend,
        TINY_LLAMA,
        Policy::reference_only(),
        roomy_kv(),
    );
    assert_ne!(
        reference.plans_digest(),
        a.plans_digest(),
        "the digest must see the routing"
    );
}

/// A program's launches without device pointers: kernel, grid and block, argument count.
fn shape_of(program: &solder_model_layers::Program) -> Vec<String> {
    program
        .steps
        .iter()
        .map(|step| match step {
            ProgramStep::Launch {
                stream,
                name,
                config,
                args,
                ..
            } => format!("{stream} {name} {config:?} {}", args.len()),
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn workspace_is_one_allocation_sized_by_the_layout() {
    let mut backend = backend();
    let allocations = backend.live_allocations();
    let bytes = backend.live_bytes();
    let mut exec = build_llama(&mut backend, roomy_kv());
    let layout = exec.layout.clone();
    assert_eq!(exec.workspace_bytes(), layout.workspace_bytes);
    assert_eq!(layout.max_rows, 8);
    assert_eq!(layout.max_blocks, 8);
    assert_eq!(layout.kv_block_size, 4);
    assert_eq!(layout.kv_pages, roomy_kv().pages);
    for offset in [
        layout.meta.positions,
        layout.meta.slot_mapping,
        layout.meta.seq_lens,
        layout.meta.state_slots,
        layout.meta.keep_snapshots,
        layout.meta.block_tables,
        layout.logits_offset,
        layout.arena_offset,
        layout.attn_scratch_offset,
        layout.inv_freq_offset,
    ] {
        assert_eq!(offset % 256, 0, "offset {offset} is not 256-aligned");
    }
    let widest_pool = exec.plans.iter().map(|p| p.pool_bytes).max().unwrap();
    assert!(layout.arena_bytes >= widest_pool);
    assert!(layout.logits_offset + 8 * 128 * 4 <= layout.arena_offset);
    // The attention scratch follows the arena and starts zeroed (its counters' invariant).
    assert!(layout.attn_scratch_offset >= layout.arena_offset + layout.arena_bytes);
    assert!(layout.attn_scratch_bytes > 0);
    // Then the o-fold scratch (none here) and gemv's split-K slots, one per stream.
    assert_eq!(
        layout.gemv_scratch_offset,
        layout.attn_scratch_offset + layout.attn_scratch_bytes + layout.o_scratch_bytes
    );
    let streams = exec.plans.iter().map(|p| p.num_streams).max().unwrap();
    assert!(layout.gemv_slot_bytes > 0, "tiny-llama's heads split");
    assert_eq!(layout.gemv_scratch_bytes, streams * layout.gemv_slot_bytes);
    // Then the hidden rows (none without a draft head) and a step's greedy ids, i32 a row.
    assert_eq!(
        layout.ids_offset,
        layout.gemv_scratch_offset + layout.gemv_scratch_bytes + 2 * layout.hidden_bytes
    );
    assert_eq!(
        layout.moe_scratch_offset,
        layout.ids_offset
            + (solder_model_layers::IDS_SLOTS * layout.max_rows * 4).next_multiple_of(256)
    );
    // Then the experts' down dots of the tensor cores (none: a dense model, no lever).
    assert_eq!(layout.moe_scratch_bytes, 0);
    assert_eq!(
        layout.workspace_bytes,
        layout.moe_scratch_offset + layout.moe_scratch_bytes
    );
    let zeroed =
        layout.gemv_scratch_offset + layout.gemv_scratch_bytes - layout.attn_scratch_offset;
    let mut scratch = vec![0xAAu8; zeroed];
    backend
        .copy_d2h(
            exec.workspace().offset(layout.attn_scratch_offset),
            &mut scratch,
        )
        .unwrap();
    assert!(
        scratch.iter().all(|b| *b == 0),
        "attention and split-K scratches zeroed"
    );
    // Workspace, weights and KV cache: three allocations, nothing else kept.
    assert_eq!(backend.live_allocations(), allocations + 3);
    assert_eq!(
        backend.live_bytes(),
        bytes + layout.workspace_bytes + layout.weights_bytes + layout.state_bytes
    );
    exec.free(&mut backend).unwrap();
    assert_eq!(backend.live_allocations(), allocations);
    // A second free is refused by name (issue 19 item 7: it returned Ok), and so is a run.
    assert!(matches!(exec.free(&mut backend), Err(ExecError::Freed)));
    let decode = exec.decode_program().unwrap().clone();
    assert!(matches!(
        exec.run(&mut backend, &decode),
        Err(ExecError::Freed)
    ));
}

#[test]
fn launch_counts_equal_the_plans() {
    let mut backend = backend();
    for policy in [Policy::default(), Policy::reference_only()] {
        let exec = build(&mut backend, TINY_QWEN2, policy, roomy_kv());
        for program in exec.programs() {
            let plan = exec.plan(program.mode, program.rows).unwrap();
            // One counter reset first (the model has attention), then the plan's launches.
            let first = program.steps.iter().find_map(|s| match s {
                ProgramStep::Launch { name, .. } => Some(*name),
                _ => None,
            });
            assert_eq!(first, Some(kernels::gemv::COUNTERS_RESET.as_str()));
            assert_eq!(program.launches(), plan.kernel_count_fused + 1);
            assert_eq!(program.plan_digest, plan.digest);
            assert_eq!(program.num_streams, plan.num_streams);
            assert_eq!(program.event_count, plan.event_count);
        }
    }
}

#[test]
fn reference_only_and_all_rules_give_identical_decode_logits() {
    let mut backend = backend();
    let tokens = prompt(3, 128, 6);
    for json in [TINY_LLAMA, TINY_QWEN2] {
        let reference = build(&mut backend, json, Policy::reference_only(), roomy_kv());
        let fused = build(&mut backend, json, Policy::default(), roomy_kv());
        let (r, f) = (
            reference.plan(Mode::Decode, 1).unwrap(),
            fused.plan(Mode::Decode, 1).unwrap(),
        );
        assert_eq!(r.kernel_count_fused, r.kernel_count_original);
        assert!(
            f.kernel_count_fused < r.kernel_count_fused,
            "all-rules must actually fuse"
        );
        let a = decode_alone(&mut backend, &reference, &tokens);
        let b = decode_alone(&mut backend, &fused, &tokens);
        assert_same_bytes(&a, &b, "reference vs all-rules decode");
        assert!(a.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn same_inputs_give_the_same_logits_run_after_run() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let tokens = prompt(9, 128, 5);
    let a = decode_alone(&mut backend, &exec, &tokens);
    let b = decode_alone(&mut backend, &exec, &tokens);
    assert_same_bytes(&a, &b, "two sessions over one exec");
    let mut changed = tokens.clone();
    changed[2] = (changed[2] + 1) % 128;
    let c = decode_alone(&mut backend, &exec, &changed);
    let v = 128;
    assert_same_bytes(&a[..2 * v], &c[..2 * v], "before the change");
    assert_ne!(
        exec_support::bits(&a[2 * v..3 * v]),
        exec_support::bits(&c[2 * v..3 * v]),
        "a changed token must change its logits"
    );
}

/// A CPU backend whose loaded kernels are only those of reference rules (every module is
/// loaded; the fused twins are simply not registered).
fn reference_kernels_backend() -> CpuBackend {
    let reference_kernels: Vec<String> = rules()
        .rules
        .iter()
        .filter(|r| r.numerics == Numerics::Reference)
        .flat_map(|r| r.kernels.clone())
        .collect();
    let mut backend = CpuBackend::with_threads(2);
    // Each reference kernel with its variant entries (the emitter picks those by rows).
    let twins: Vec<_> = kernels::entries()
        .into_iter()
        .filter(|(name, _)| {
            let kernel = kernels::variant_of(name).unwrap_or(name);
            reference_kernels.iter().any(|k| k == kernel)
        })
        .collect();
    backend.register_twins(&twins).unwrap();
    // The modules holding a reference kernel (a module of fused kernels only, like gemm, has
    // nothing registered to load).
    let modules = MODULES.iter().filter(|m| {
        twins
            .iter()
            .any(|(name, _)| name.split("::").next() == Some(**m))
    });
    for module in modules {
        backend
            .load_module(&ModuleImage {
                name: module,
                ptx: None,
                cubin: None,
            })
            .unwrap();
    }
    backend
}

#[test]
fn backend_without_fused_kernels_falls_back_to_reference_rules_only_when_asked() {
    let mut bare = reference_kernels_backend();
    assert!(!bare.kernel_names().iter().any(|k| k == "gemv::norm_qkv"));
    // By default a rule whose kernel the backend lacks is refused, naming it.
    let boot = exec_support::boot(
        exec_support::config(TINY_QWEN2),
        Policy::default(),
        WeightSource::Random { seed: 0x5eed },
        roomy_kv(),
    );
    let refused = CircuitExec::build(&mut bare, boot)
        .err()
        .expect("a fused kernel is missing");
    assert!(
        refused
            .to_string()
            .contains("which the backend does not have"),
        "{refused}"
    );
    let skip = Policy {
        skip_missing_kernels: true,
        ..Policy::default()
    };
    let exec = build(&mut bare, TINY_QWEN2, skip, roomy_kv());
    for plan in &exec.plans {
        for group in &plan.fusion.groups {
            assert_eq!(
                group.numerics,
                Numerics::Reference,
                "{} at {}:{} uses rule `{}`",
                group.kernels.join("+"),
                plan.mode,
                plan.rows,
                group.rule
            );
        }
        assert_eq!(plan.kernel_count_fused, plan.kernel_count_original);
    }
    let tokens = prompt(4, 128, 4);
    let fallback = decode_alone(&mut bare, &exec, &tokens);
    let mut full = backend();
    let fused = build(&mut full, TINY_QWEN2, Policy::default(), roomy_kv());
    assert_same_bytes(
        &fallback,
        &decode_alone(&mut full, &fused, &tokens),
        "fallback vs fused",
    );
}

#[test]
fn checkpoint_weights_give_the_same_logits_as_the_seeded_weights() {
    let dir = TempDir::new("exec-ckpt");
    let mut backend = backend();
    let seeded = build_llama(&mut backend, roomy_kv());
    let host = HostWeights::random(&seeded.instance.circuit, 0x5eed);
    host.save(
        &seeded.instance.circuit,
        &dir.path().join("model.safetensors"),
    )
    .unwrap();
    let from_disk = CircuitExec::build(
        &mut backend,
        boot(
            config(TINY_LLAMA),
            Policy::default(),
            WeightSource::Checkpoint(dir.path().to_path_buf()),
            roomy_kv(),
        ),
    )
    .unwrap();
    let from_host = CircuitExec::build(
        &mut backend,
        boot(
            config(TINY_LLAMA),
            Policy::default(),
            WeightSource::Host(host),
            roomy_kv(),
        ),
    )
    .unwrap();
    let tokens = prompt(5, 128, 4);
    let want = decode_alone(&mut backend, &seeded, &tokens);
    assert_same_bytes(
        &decode_alone(&mut backend, &from_disk, &tokens),
        &want,
        "checkpoint",
    );
    assert_same_bytes(
        &decode_alone(&mut backend, &from_host, &tokens),
        &want,
        "host",
    );
}

#[test]
fn build_refuses_bad_kv_shapes_and_weight_counts() {
    let mut backend = backend();
    for bad in [kv(1, 4, 32), kv(8, 0, 32), kv(8, 4, 0)] {
        let result = CircuitExec::build(
            &mut backend,
            boot(
                config(TINY_LLAMA),
                Policy::default(),
                WeightSource::Random { seed: 1 },
                bad,
            ),
        );
        assert!(
            matches!(result, Err(ExecError::Argument { .. })),
            "{bad:?} was accepted"
        );
    }
    let result = CircuitExec::build(
        &mut backend,
        boot(
            config(TINY_LLAMA),
            Policy::default(),
            WeightSource::Host(HostWeights { slots: vec![] }),
            roomy_kv(),
        ),
    );
    match result {
        Err(e @ ExecError::Build(_)) => assert!(e.to_string().contains("weight slots"), "{e}"),
        Err(other) => panic!("expected Build, got {other}"),
        Ok(_) => panic!("a build with no weights succeeded"),
    }
}

/// The tiny qwen3_next served at `serve`, random weights.
fn tiny_next_at(serve: solder_config::ServeShape) -> solder_model_layers::Boot {
    let mut boot = boot(
        config(TINY_NEXT),
        Policy::default(),
        WeightSource::Random { seed: 7 },
        roomy_kv(),
    );
    boot.serve = serve;
    boot
}

/// The Gated DeltaNet launches of a (mode, rows) program, `gdn::gated_norm` aside: each
/// kernel's name and whether it passes every optional buffer (none null).
fn gdn_launches(exec: &CircuitExec, mode: Mode, rows: usize) -> Vec<(&'static str, bool)> {
    use solder_gpu_runtime::KernelArg;
    let program = exec.program(mode, rows).expect("program");
    let launches: Vec<(&'static str, bool)> = (program.steps.iter())
        .filter_map(|step| match step {
            ProgramStep::Launch { name, args, .. }
                if name.starts_with("gdn::") && *name != "gdn::gated_norm" =>
            {
                Some((*name, !args.iter().any(|a| matches!(a, KernelArg::Null))))
            }
            _ => None,
        })
        .collect();
    assert!(!launches.is_empty(), "{mode} {rows}: no recurrent launch");
    launches
}

/// The recurrence kernel of a (mode, rows) program: `gdn::gates_chunked` or the row-by-row
/// one (`gdn::gates_recurrence`, `_pitched`).
fn gdn_recurrence_kernel(exec: &CircuitExec, mode: Mode, rows: usize) -> &'static str {
    let names: Vec<&'static str> = (gdn_launches(exec, mode, rows).into_iter())
        .map(|(name, _)| name)
        .filter(|name| name.contains("recurrence") || name.contains("chunked"))
        .collect();
    assert!(!names.is_empty(), "{mode} {rows}: no recurrence");
    assert!(
        names.iter().all(|n| *n == names[0]),
        "{mode} {rows}: {names:?}"
    );
    names[0]
}

/// The `gdn_chunked` lever runs the chunked recurrence where a prompt's chunks run and nowhere
/// else: prefill programs and the verify program wider than `speculative_rows`; decode,
/// multi-seq, the verify programs a speculative step runs and every batched verify keep the
/// row-by-row kernel. A prompt of 17 (a chunk of 16, then decode) gives the logits of the
/// lever off up to rounding, and a speculative step after it still runs.
#[test]
fn the_chunked_lever_runs_a_prompts_chunks_only() {
    chunked_lever_runs_a_prompts_chunks_only(&[], "gdn::gates_chunked");
}

/// With `tensor_cores` on too, the same programs run the chunked form on the tensor cores
/// (`gdn::gates_chunked_mma`); `tensor_cores` alone runs no chunked form.
#[test]
fn the_chunked_lever_on_the_tensor_cores_runs_a_prompts_chunks_only() {
    chunked_lever_runs_a_prompts_chunks_only(&["tensor_cores"], "gdn::gates_chunked_mma");
}

/// `gdn_chunked` with `others` on against `others` alone: `kernel` where a prompt's chunks
/// run, the row-by-row kernel everywhere else.
fn chunked_lever_runs_a_prompts_chunks_only(others: &[&str], kernel: &'static str) {
    use solder_config::ServeShape;
    use solder_model_layers::{ModelDrafter, Session};
    let mut backend = backend();
    let serve = ServeShape {
        max_batch: 4,
        multi_seq_ladder: vec![2, 4],
        verify_widths: vec![2, 4, 16],
        verify_batch_widths: vec![4, 8],
        draft_widths: Vec::new(),
        speculative_rows: 4,
    };
    let boot = |levers: &[&str]| {
        let mut boot = tiny_next_at(serve.clone());
        for lever in levers {
            boot.policy.levers.set(lever, true).expect("lever");
        }
        boot
    };
    let chunked_levers: Vec<&str> = others.iter().copied().chain(["gdn_chunked"]).collect();
    let chunked = CircuitExec::build(&mut backend, boot(&chunked_levers)).expect("build");
    let plain = CircuitExec::build(&mut backend, boot(others)).expect("build");
    for plan in &chunked.plans {
        let (mode, rows) = (plan.mode, plan.rows);
        let unchunked = gdn_recurrence_kernel(&plain, mode, rows);
        assert!(!unchunked.contains("chunked"), "{mode} {rows}: {unchunked}");
        let want = match (mode, rows) {
            (Mode::Prefill, _) | (Mode::Verify, 16) => kernel,
            _ => unchunked,
        };
        assert_eq!(
            gdn_recurrence_kernel(&chunked, mode, rows),
            want,
            "{mode} {rows}"
        );
        assert!(
            !want.contains("chunked") || !plan.keeps_snapshots,
            "{mode} {rows}"
        );
    }
    assert!(chunked.plans.iter().any(|p| p.mode == Mode::Prefill));
    let logits = |exec: &CircuitExec, backend: &mut CpuBackend| {
        let mut session = Session::new(exec);
        let id = session.add_sequence();
        let logits = (session.prefill(backend, id, &prompt(3, 128, 17))).expect("prefill");
        let mut drafter = ModelDrafter::new(exec);
        (session.speculative_step(backend, id, 5, 3, &mut drafter)).expect("k = 3");
        logits
    };
    let (got, want) = (logits(&chunked, &mut backend), logits(&plain, &mut backend));
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(&want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff <= 1e-2 * scale,
        "prompt logits differ by {diff} (largest {scale})"
    );
}

/// Whether the (mode, rows) program's recurrent launches (`gdn::conv`, the recurrence) keep
/// snapshots: all pass them, or none does (a null argument).
fn gdn_keeps_snapshots(exec: &CircuitExec, mode: Mode, rows: usize) -> bool {
    let kept: Vec<bool> = (gdn_launches(exec, mode, rows).into_iter())
        .map(|(_, all)| all)
        .collect();
    assert!(
        kept.iter().all(|k| *k == kept[0]),
        "{mode} {rows}: {kept:?}"
    );
    kept[0]
}

/// Only verify and batched-verify programs keep the recurrent state's per-row snapshots (the
/// rows a speculative step may roll back to): the layout sizes them by those programs, not by
/// the widest (here a multi-seq step of 16), and a prefill chunk's recurrent launches pass none
/// where the verify program of its width passes them. The spare slots are one per slot a step
/// can advance: no more than the sequences.
#[test]
fn recurrent_snapshots_are_kept_by_the_verify_programs_alone() {
    use solder_config::ServeShape;
    let mut backend = backend();
    let serve = ServeShape {
        max_batch: 16,
        multi_seq_ladder: vec![2, 4, 8, 16],
        verify_widths: vec![2, 3, 4],
        verify_batch_widths: vec![4, 8],
        draft_widths: Vec::new(),
        speculative_rows: solder_config::DEFAULT_SPECULATIVE_ROWS,
    };
    let mut boot = tiny_next_at(serve);
    boot.kv.max_sequences = 4;
    let exec = CircuitExec::build(&mut backend, boot).expect("build");
    let layout = &exec.layout;
    assert_eq!(layout.max_rows, 16);
    assert_eq!(layout.state_rows.snapshots, 8, "the widest batched verify");
    assert_eq!(layout.state_rows.spares, 4, "one per sequence");
    let recurrent = layout.states.iter().filter(|r| r.slot_bytes > 0);
    for region in recurrent {
        // Each part 256-aligned.
        let aligned = |slots: usize| (slots * region.slot_bytes).next_multiple_of(256);
        assert_eq!(
            (
                region.snapshot_offset - region.offset,
                region.offset + region.bytes - region.snapshot_offset
            ),
            (aligned(4 + 1 + 4), aligned(8)),
            "{region:?}"
        );
    }
    // The GDN launches (conv, the recurrence) of the prefill and the verify program of 4 rows.
    assert!(!gdn_keeps_snapshots(&exec, Mode::Prefill, 4));
    assert!(gdn_keeps_snapshots(&exec, Mode::Verify, 4));
}

/// A verify program wider than the serve's `speculative_rows` serves prompt chunks only: it
/// keeps no snapshots, so the layout keeps slots for the widest that does (chunks of 16 rows
/// cost no snapshot slots), and a speculative step is refused a program that keeps none, by
/// the width it asked for, with the sequence unchanged.
#[test]
fn verify_programs_past_speculative_rows_keep_no_snapshots() {
    use solder_config::ServeShape;
    use solder_model_layers::{ModelDrafter, Session, SessionError};
    let mut backend = backend();
    let serve = ServeShape {
        max_batch: 4,
        multi_seq_ladder: vec![2, 4],
        verify_widths: vec![2, 4, 16],
        verify_batch_widths: vec![4, 8],
        draft_widths: Vec::new(),
        speculative_rows: 4,
    };
    let exec = CircuitExec::build(&mut backend, tiny_next_at(serve.clone())).expect("build");
    assert_eq!(exec.layout.max_rows, 16);
    assert_eq!(
        exec.layout.state_rows.snapshots, 4,
        "verify and batched verify of 4"
    );
    let keeps = |mode: Mode, rows: usize| gdn_keeps_snapshots(&exec, mode, rows);
    assert!(keeps(Mode::Verify, 4) && keeps(Mode::VerifyBatch, 4));
    assert!(!keeps(Mode::Verify, 16) && !keeps(Mode::VerifyBatch, 8));
    assert!(exec.plans.iter().all(|p| p.keeps_snapshots
        == (matches!(p.mode, Mode::Verify | Mode::VerifyBatch) && p.rows <= 4)));

    // A prompt of 17 runs a chunk of 16 (no snapshots) and decode; speculation takes k <= 3.
    let same = CircuitExec::build(&mut backend, tiny_next_at(serve)).expect("build");
    let mut drafter = ModelDrafter::new(&same);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    session
        .prefill(&mut backend, id, &prompt(3, 128, 17))
        .expect("prefill");
    match session.speculative_step(&mut backend, id, 5, 4, &mut drafter) {
        Err(SessionError::DraftLength { k: 4, widest: 3 }) => {}
        other => panic!("expected k = 4 refused, got {other:?}"),
    }
    assert_eq!(session.seq_len(id).expect("seq"), 17);
    let step = session
        .speculative_step(&mut backend, id, 5, 3, &mut drafter)
        .expect("k = 3");
    let len = 17 + step.accepted + 1;
    assert_eq!(session.seq_len(id).expect("seq"), len);
    // Batched: 2 + 3 rows need the batched verify of 8, which keeps none.
    let other = session.add_sequence();
    (session.prefill(&mut backend, other, &prompt(4, 128, 5))).expect("prefill");
    let batch = [(id, 6, 1), (other, 7, 2)];
    match session.speculative_step_many(&mut backend, &batch, &mut drafter) {
        Err(SessionError::TooWide {
            asked: 5,
            widest: 4,
        }) => {}
        other => panic!("expected 5 rows refused, got {other:?}"),
    }
    assert_eq!(session.seq_len(id).expect("seq"), len);
    assert_eq!(session.seq_len(other).expect("seq"), 5);
}

/// A launch whose grid is past CUDA's limits is refused at build, naming the kernel: a tied LM
/// head of 2,097,121 tokens on the tensor cores needs 65,536 feature blocks of 32 on grid.y,
/// one more than a launch takes.
#[test]
fn a_launch_past_the_grid_limits_is_refused_naming_its_kernel() {
    let vocab_past = r#"{
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 1, "num_key_value_heads": 1, "vocab_size": 2097121,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
        "rope_theta": 10000.0, "hidden_act": "silu"
    }"#;
    let mut policy = Policy::default();
    policy.levers.set("tensor_cores", true).unwrap();
    let result = CircuitExec::build(
        &mut backend(),
        boot(
            config(vocab_past),
            policy,
            WeightSource::Random { seed: 3 },
            roomy_kv(),
        ),
    );
    match result {
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains("gemm::lm_head_mma") && text.contains("65536"),
                "{text}"
            );
        }
        Ok(_) => panic!("a grid of 65,536 feature blocks on y was built"),
    }
}
