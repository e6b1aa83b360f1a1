//! `CircuitExec::build`: a program for every serve shape, stable digests, one workspace sized
//! by the layout, launch counts from the plans, fallbacks when fused kernels are absent, and
//! the same logits from every weight source and routing.

mod exec_support;

use exec_support::{
    assert_same_bytes, backend, boot, build, build_llama, config, kv, prompt, roomy_kv, rules,
    TempDir, TINY_LLAMA, TINY_QWEN2,
};
use solder_circuit::{Mode, Numerics, Policy};
use solder_gpu_runtime::{CpuBackend, GpuBackend, ModuleImage};
use solder_model_layers::kernels::{self, MODULES};
use solder_model_layers::{
    CircuitExec, ExecError, HostWeights, ProgramStep, Session, WeightSource,
};

/// Teacher-forced decode of `tokens`, one per step: `[T * V]`.
fn decode_all(exec: &CircuitExec, backend: &mut CpuBackend, tokens: &[u32]) -> Vec<f32> {
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let mut logits = Vec::new();
    for &t in tokens {
        logits.extend(session.decode(backend, id, t).unwrap());
    }
    logits
}

#[test]
fn a_program_for_every_serve_shape() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut expected = vec![(Mode::Decode, 1)];
    expected.extend([2, 4, 8].map(|w| (Mode::MultiSeq, w)));
    expected.extend((2..=8).map(|k| (Mode::Verify, k)));
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
    assert_eq!(
        layout.workspace_bytes,
        layout.gemv_scratch_offset + layout.gemv_scratch_bytes
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
        let a = decode_all(&reference, &mut backend, &tokens);
        let b = decode_all(&fused, &mut backend, &tokens);
        assert_same_bytes(&a, &b, "reference vs all-rules decode");
        assert!(a.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn same_inputs_give_the_same_logits_run_after_run() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let tokens = prompt(9, 128, 5);
    let a = decode_all(&exec, &mut backend, &tokens);
    let b = decode_all(&exec, &mut backend, &tokens);
    assert_same_bytes(&a, &b, "two sessions over one exec");
    let mut changed = tokens.clone();
    changed[2] = (changed[2] + 1) % 128;
    let c = decode_all(&exec, &mut backend, &changed);
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
    for module in MODULES {
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
    let fallback = decode_all(&exec, &mut bare, &tokens);
    let mut full = backend();
    let fused = build(&mut full, TINY_QWEN2, Policy::default(), roomy_kv());
    assert_same_bytes(
        &fallback,
        &decode_all(&fused, &mut full, &tokens),
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
    let want = decode_all(&seeded, &mut backend, &tokens);
    assert_same_bytes(
        &decode_all(&from_disk, &mut backend, &tokens),
        &want,
        "checkpoint",
    );
    assert_same_bytes(
        &decode_all(&from_host, &mut backend, &tokens),
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

/// The `gemv::*` launches of a program: (entry name, grid).
fn gemv_launches(program: &solder_model_layers::Program) -> Vec<(&'static str, [u32; 3])> {
    program
        .steps
        .iter()
        .filter_map(|step| match step {
            ProgramStep::Launch { name, config, .. }
                if name.starts_with("gemv::")
                    && *name != kernels::gemv::COUNTERS_RESET.as_str() =>
            {
                Some((*name, config.grid))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn gemv_entries_follow_the_rows_and_the_gemv_classic_lever() {
    let mut backend = backend();
    let streaming = build_llama(&mut backend, roomy_kv());
    let mut policy = Policy::default();
    policy.levers.set("gemv_classic", true).unwrap();
    let classic = build(&mut backend, TINY_LLAMA, policy, roomy_kv());
    // Same rules, same plans: the entry is an emit-time choice.
    assert_eq!(streaming.plans_digest(), classic.plans_digest());
    for (mode, rows, tile) in [
        (Mode::Decode, 1, "_r1"),
        (Mode::MultiSeq, 2, "_r2"),
        (Mode::MultiSeq, 4, "_r4"),
        (Mode::Verify, 3, "_r4"),
        (Mode::MultiSeq, 8, "_r8"),
        (Mode::Verify, 5, "_r8"),
    ] {
        let at = format!("{mode}:{rows}");
        let s = gemv_launches(streaming.program(mode, rows).unwrap());
        let c = gemv_launches(classic.program(mode, rows).unwrap());
        assert!(!s.is_empty(), "{at}: no gemv launch");
        assert_eq!(s.len(), c.len(), "{at}");
        for ((entry, grid), (kernel, _)) in s.iter().zip(&c) {
            if *kernel == "gemv::qkv_rope_kv" {
                // Its blocks own whole heads: no streaming entry.
                assert_eq!(entry, kernel, "{at}");
                continue;
            }
            assert_eq!(
                kernels::variant_of(kernel),
                None,
                "{at}: `{kernel}` under gemv_classic"
            );
            assert_eq!(*entry, format!("{kernel}{tile}"), "{at}");
            assert_eq!(kernels::variant_of(entry), Some(*kernel), "{at}");
            let row_tile: u32 = tile[2..].parse().unwrap();
            assert_eq!(
                grid[0],
                (rows as u32).div_ceil(row_tile),
                "{at}: `{entry}` row groups"
            );
            assert!(
                grid[0] * grid[1] <= 1056,
                "{at}: `{entry}` grid {grid:?} over the cap"
            );
        }
    }
    // And the same bytes on the CPU (each variant runs its kernel's twin).
    let tokens = prompt(7, streaming.config.vocab_size, 6);
    let a = decode_all(&streaming, &mut backend, &tokens);
    let b = decode_all(&classic, &mut backend, &tokens);
    assert_same_bytes(&a, &b, "streaming vs gemv_classic");
}

/// The `attn_prefetch` lever: the same plans; decode-attention launches become
/// `attn::paged_decode_prefetch` (a variant of `paged_decode`), verify keeps `paged_causal`.
#[test]
fn attn_prefetch_lever_picks_the_prefetch_entry() {
    let mut backend = backend();
    let plain = build_llama(&mut backend, roomy_kv());
    let mut policy = Policy::default();
    policy.levers.set("attn_prefetch", true).unwrap();
    let prefetch = build(&mut backend, TINY_LLAMA, policy, roomy_kv());
    assert_eq!(plain.plans_digest(), prefetch.plans_digest());
    let attn = |program: &solder_model_layers::Program| -> Vec<&'static str> {
        program
            .steps
            .iter()
            .filter_map(|step| match step {
                ProgramStep::Launch { name, .. } if name.starts_with("attn::") => Some(*name),
                _ => None,
            })
            .collect()
    };
    for (mode, rows) in [(Mode::Decode, 1), (Mode::MultiSeq, 4), (Mode::Verify, 3)] {
        let at = format!("{mode}:{rows}");
        let a = attn(plain.program(mode, rows).unwrap());
        let b = attn(prefetch.program(mode, rows).unwrap());
        assert!(!a.is_empty(), "{at}: no attention launch");
        assert_eq!(a.len(), b.len(), "{at}");
        for (kernel, entry) in a.iter().zip(&b) {
            if *kernel == kernels::attn::PAGED_DECODE.as_str() {
                assert_eq!(
                    *entry,
                    kernels::attn::PAGED_DECODE_PREFETCH.as_str(),
                    "{at}"
                );
                assert_eq!(kernels::variant_of(entry), Some(*kernel), "{at}");
            } else {
                assert_eq!(entry, kernel, "{at}");
            }
        }
        if mode == Mode::Decode {
            assert!(
                b.contains(&kernels::attn::PAGED_DECODE_PREFETCH.as_str()),
                "{at}"
            );
        }
    }
    // And the same bytes on the CPU (the variant runs paged_decode's twin).
    let tokens = prompt(7, plain.config.vocab_size, 6);
    let x = decode_all(&plain, &mut backend, &tokens);
    let y = decode_all(&prefetch, &mut backend, &tokens);
    assert_same_bytes(&x, &y, "paged_decode vs attn_prefetch");
}

/// Hidden 1088: every projection's dot spans two 1024-element segments.
const WIDE_LLAMA: &str = r#"{
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 1088, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 17, "num_key_value_heads": 1, "vocab_size": 128,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
    "rope_theta": 10000.0, "hidden_act": "silu"
}"#;

#[test]
fn few_block_projections_split_into_their_streams_slot_unless_gemv_unsplit() {
    let mut backend = backend();
    let split = build(&mut backend, WIDE_LLAMA, Policy::default(), roomy_kv());
    let mut policy = Policy::default();
    policy.levers.set("gemv_unsplit", true).unwrap();
    let unsplit = build(&mut backend, WIDE_LLAMA, policy, roomy_kv());
    assert_eq!(
        split.plans_digest(),
        unsplit.plans_digest(),
        "a launch shape, not a plan"
    );
    let layout = &split.layout;
    assert!(
        layout.gemv_slot_bytes > 0,
        "a 2-segment dot needs a split-K slot"
    );
    let region = layout.gemv_scratch_offset..layout.gemv_scratch_offset + layout.gemv_scratch_bytes;
    let at = |ptr: solder_gpu_runtime::DevicePtr| ptr.0 - split.workspace().0;
    for (mode, rows) in [(Mode::Decode, 1), (Mode::MultiSeq, 2), (Mode::Verify, 5)] {
        let program = split.program(mode, rows).unwrap();
        let mut splits = 0;
        for step in &program.steps {
            let ProgramStep::Launch {
                name,
                config,
                args,
                stream,
                ..
            } = step
            else {
                continue;
            };
            if *name == "gemv::qkv_rope_kv" {
                // 17 + 2 heads, one row group: each head in 8 parts of 8 features.
                assert_eq!(config.grid[1], 19 * 8, "{mode}:{rows} split heads");
                assert!(
                    matches!(
                        args.last(),
                        Some(solder_gpu_runtime::KernelArg::Buffer { .. })
                    ),
                    "{mode}:{rows}: split heads without their scratch"
                );
                splits += 1;
                continue;
            }
            if !name.starts_with("gemv::") || *name == kernels::gemv::COUNTERS_RESET.as_str() {
                continue;
            }
            match (config.grid[2], args.last()) {
                (1, Some(solder_gpu_runtime::KernelArg::Null)) => {}
                (z, Some(solder_gpu_runtime::KernelArg::Buffer { ptr, bytes, .. })) if z > 1 => {
                    splits += 1;
                    let start = at(*ptr) as usize;
                    let slot = region.start + *stream as usize * layout.gemv_slot_bytes;
                    assert_eq!(start, slot, "{mode}:{rows} `{name}`: its stream's slot");
                    assert!(start + bytes <= region.end, "{mode}:{rows} `{name}`");
                }
                other => panic!("{mode}:{rows} `{name}`: grid.z and scratch disagree: {other:?}"),
            }
        }
        assert!(splits > 0, "{mode}:{rows}: no split launch");
        let unsplit_program = unsplit.program(mode, rows).unwrap();
        for step in &unsplit_program.steps {
            match step {
                ProgramStep::Launch { name, config, .. } if name.starts_with("gemv::") => {
                    assert_eq!(
                        config.grid[2], 1,
                        "{mode}:{rows} `{name}` under gemv_unsplit"
                    );
                    if *name == "gemv::qkv_rope_kv" {
                        assert_eq!(config.grid[1], 19, "{mode}:{rows} heads under gemv_unsplit");
                    }
                }
                _ => {}
            }
        }
    }
    // The same bytes on the CPU (the twin computes each dot whole either way).
    let tokens = prompt(11, split.config.vocab_size, 4);
    let a = decode_all(&split, &mut backend, &tokens);
    let b = decode_all(&unsplit, &mut backend, &tokens);
    assert_same_bytes(&a, &b, "split-K vs gemv_unsplit");
}

/// Counters an aborted grid left set (attention's flash-decoding slots and gemv's split
/// slots) are zero again after the next step, eager or replayed from a captured graph: the
/// program's first launch, `gemv::counters_reset`, zeroes them, and the checker accepts it.
/// The logits are the clean run's.
#[test]
fn poisoned_counters_are_reset_by_the_next_step_eager_and_replayed() {
    let mut backend = backend();
    let mut exec = build(&mut backend, WIDE_LLAMA, Policy::default(), roomy_kv());
    let tokens = prompt(3, 128, 3);
    let clean = decode_all(&exec, &mut backend, &tokens);
    let layout = &exec.layout;
    assert!(layout.gemv_slot_bytes > 0 && layout.attn_scratch_bytes > 0);
    // Row 0's first two attention slot counters (heads 0 and 1), stream 0's split counters.
    let attn_slot = kernels::attn::scratch_bytes(1, 1, 64);
    let counters: Vec<(solder_gpu_runtime::DevicePtr, usize)> = [
        (layout.attn_scratch_offset, 4),
        (layout.attn_scratch_offset + attn_slot, 4),
        (
            layout.gemv_scratch_offset,
            kernels::gemv::split::COUNTERS * 4,
        ),
    ]
    .into_iter()
    .map(|(at, bytes)| (exec.workspace().offset(at), bytes))
    .collect();
    let poison = |backend: &mut CpuBackend| {
        for &(ptr, bytes) in &counters {
            backend.copy_h2d(ptr, &vec![0x03; bytes]).unwrap();
        }
    };
    let all_zero = |backend: &mut CpuBackend, at: &str| {
        for &(ptr, bytes) in &counters {
            let mut got = vec![0u8; bytes];
            backend.copy_d2h(ptr, &mut got).unwrap();
            assert!(got.iter().all(|b| *b == 0), "{at}: a counter is still set");
        }
    };
    // Eager: every step starts with the reset.
    {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let mut logits = Vec::new();
        for &t in &tokens {
            poison(&mut backend);
            logits.extend(session.decode(&mut backend, id, t).unwrap());
            all_zero(&mut backend, "eager");
        }
        assert_same_bytes(&logits, &clean, "poisoned counters, eager");
    }
    // Captured: the reset is part of the graph.
    let graph = exec.capture(&mut backend, Mode::Decode, 1).unwrap();
    poison(&mut backend);
    exec.replay(&mut backend, &graph).unwrap();
    all_zero(&mut backend, "replayed");
}
