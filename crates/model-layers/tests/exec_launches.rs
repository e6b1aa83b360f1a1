//! The launch entries and split shapes the levers pick at emit time (`gemv_classic`,
//! `attn_prefetch`, `gemv_unsplit`, `mma_narrow`): the same plans and the same bytes either way, split-K
//! scratch in each stream's own slot, and counters an aborted grid left set reset by the next
//! step.

mod exec_support;

use exec_support::{
    assert_same_bytes, backend, build, build_llama, decode_alone, prompt, roomy_kv, TINY_LLAMA,
};
use solder_circuit::{Mode, Policy};
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::kernels;
use solder_model_layers::{ProgramStep, Session};

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
    let a = decode_alone(&mut backend, &streaming, &tokens);
    let b = decode_alone(&mut backend, &classic, &tokens);
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
    let x = decode_alone(&mut backend, &plain, &tokens);
    let y = decode_alone(&mut backend, &prefetch, &tokens);
    assert_same_bytes(&x, &y, "paged_decode vs attn_prefetch");
}

/// The `mma_narrow` lever (with `tensor_cores`): the same plans; in every program of at most
/// 16 rows each bf16 `linear_mma`, `lm_head_mma`, `gate_up_silu_mma` and `qkv_rope_kv_mma`
/// launch becomes its
/// `_narrow` entry (a variant, the same grid), wider programs keep the wide entries; the same
/// bytes.
#[test]
fn mma_narrow_lever_picks_the_narrow_entries_at_decode_widths() {
    let mut backend = backend();
    // Programs up to 8 rows, and a 24-row verify (past one 16-row pass).
    let build = |backend: &mut CpuBackend, levers: &[&str]| {
        let mut policy = Policy::default();
        for lever in levers {
            policy.levers.set(lever, true).unwrap();
        }
        let mut serve = exec_support::serve();
        serve.verify_widths.push(24);
        let boot = solder_model_layers::Boot {
            serve,
            ..exec_support::boot(
                exec_support::config(TINY_LLAMA),
                policy,
                solder_model_layers::WeightSource::Random { seed: 0x5eed },
                exec_support::kv(2 * 40 + 2, 4, 160),
            )
        };
        solder_model_layers::CircuitExec::build(backend, boot).expect("build")
    };
    let wide = build(&mut backend, &["tensor_cores"]);
    let narrow = build(&mut backend, &["tensor_cores", "mma_narrow"]);
    assert_eq!(wide.plans_digest(), narrow.plans_digest());
    let launches = |program: &solder_model_layers::Program| -> Vec<(&'static str, [u32; 3])> {
        program
            .steps
            .iter()
            .filter_map(|step| match step {
                ProgramStep::Launch { name, config, .. } => Some((*name, config.grid)),
                _ => None,
            })
            .collect()
    };
    let (mut narrowed, mut kept) = (0, 0);
    for (a, b) in wide.programs().iter().zip(narrow.programs()) {
        let at = format!("{}:{}", a.mode, a.rows);
        assert_eq!((a.mode, a.rows), (b.mode, b.rows), "{at}");
        let narrow_width = a.rows <= kernels::gemm::NARROW_ROWS as usize;
        let (a, b) = (launches(a), launches(b));
        assert_eq!(a.len(), b.len(), "{at}");
        for ((kernel, grid), (entry, entry_grid)) in a.iter().zip(&b) {
            assert_eq!(grid, entry_grid, "{at}: `{entry}`");
            let narrowed_kernel = [
                kernels::gemm::LINEAR_MMA.as_str(),
                kernels::gemm::LM_HEAD_MMA.as_str(),
                kernels::gemm::GATE_UP_SILU_MMA.as_str(),
                kernels::gemm::QKV_ROPE_KV_MMA.as_str(),
            ]
            .contains(kernel);
            if narrowed_kernel && narrow_width {
                assert_eq!(*entry, format!("{kernel}_narrow"), "{at}");
                assert_eq!(kernels::variant_of(entry), Some(*kernel), "{at}");
                narrowed += 1;
            } else {
                assert_eq!(entry, kernel, "{at}");
                kept += usize::from(narrowed_kernel);
            }
        }
    }
    let widths: Vec<_> = wide.programs().iter().map(|p| (p.mode, p.rows)).collect();
    assert!(
        narrowed > 0 && kept > 0,
        "narrowed {narrowed}, kept {kept}: {widths:?}"
    );
    // And the same bytes on the CPU (the variants run their kernels' twins).
    let tokens = prompt(7, wide.config.vocab_size, 6);
    let x = decode_alone(&mut backend, &wide, &tokens);
    let y = decode_alone(&mut backend, &narrow, &tokens);
    assert_same_bytes(&x, &y, "tensor_cores vs tensor_cores + mma_narrow");
}

/// Hidden 1056 and 17 heads of 64: every projection's dot but the down projection's spans two
/// 1024-element segments, and the o projection's 132 feature blocks are half a wave: it splits.
const WIDE_LLAMA: &str = r#"{
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 1056, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 17, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 128,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
    "rope_theta": 10000.0, "hidden_act": "silu"
}"#;

/// The `mma_large` lever (with `tensor_cores`): the same plans; in every program of at least
/// 128 rows each tensor-core launch with a `_large` entry whose large grid has a block for
/// every SM (`gemm::large_fits_grid`) becomes that entry in its own grid (128 rows × 64
/// features a block, 256 threads); narrower programs and narrower projections keep theirs. A
/// llama of hidden 64 with 8,448 intermediate features and tokens (264 large blocks at 136
/// rows) takes gate/up and the LM head large, o and down not; a 150-token prompt (a 136-row
/// chunk, then 14 rows) gives the same bytes.
#[test]
fn mma_large_lever_picks_the_large_entries_at_prefill_widths() {
    let json = TINY_LLAMA
        .replace("\"intermediate_size\": 128", "\"intermediate_size\": 8448")
        .replace("\"vocab_size\": 128", "\"vocab_size\": 8448");
    let enlarged = large_lever_entries(&json);
    assert_eq!(
        enlarged,
        [
            kernels::gemm::GATE_UP_SILU_MMA.as_str(),
            kernels::gemm::LM_HEAD_MMA.as_str()
        ]
    );
}

/// The `mma_pipe` lever (with `tensor_cores` and `mma_large`) on the llama of
/// `mma_large_lever_picks_the_large_entries_at_prefill_widths`, whose gate/up and LM head go
/// large: both go through their `_pipe` entries ([`pipe_lever_entries`]).
#[test]
fn mma_pipe_lever_takes_the_pipe_entries_where_mma_large_takes_large_ones() {
    let json = TINY_LLAMA
        .replace("\"intermediate_size\": 128", "\"intermediate_size\": 8448")
        .replace("\"vocab_size\": 128", "\"vocab_size\": 8448");
    assert_eq!(
        pipe_lever_entries(&json),
        [
            kernels::gemm::GATE_UP_SILU_MMA.as_str(),
            kernels::gemm::LM_HEAD_MMA.as_str()
        ]
    );
}

/// The same for Gated DeltaNet's two input projections: the qwen3_next of
/// `mma_large_lever_picks_the_large_pair_entry_at_prefill_widths` takes `linear_pair_mma_pipe`.
#[test]
fn mma_pipe_lever_takes_the_pipe_pair_entry() {
    assert_eq!(
        pipe_lever_entries(&wide_pair_next()),
        [kernels::gemm::LINEAR_PAIR_MMA.as_str()]
    );
}

/// Builds the model of `json` with `tensor_cores`, with `mma_pipe` too, with `mma_large`, and
/// with both: the same plans; every launch of a `_large` entry that has a `_pipe` one
/// (`gemm::PIPES`) becomes it, in the same grid with its stages' dynamic shared memory, and
/// every other launch is as it was; without `mma_large`, `mma_pipe` changes nothing; a
/// 150-token prompt gives the same bytes. Returns the kernels that took a `_pipe` entry.
fn pipe_lever_entries(json: &str) -> Vec<&'static str> {
    let mut backend = backend();
    let build = |backend: &mut CpuBackend, levers: &[&str]| wide_build(backend, json, levers);
    let launches = |exec: &solder_model_layers::CircuitExec| {
        exec.programs()
            .iter()
            .flat_map(|p| {
                p.steps.iter().filter_map(|step| match step {
                    ProgramStep::Launch { name, config, .. } => Some((*name, *config)),
                    _ => None,
                })
            })
            .collect::<Vec<_>>()
    };
    let wide = build(&mut backend, &["tensor_cores"]);
    let unpaired = build(&mut backend, &["tensor_cores", "mma_pipe"]);
    let large = build(&mut backend, &["tensor_cores", "mma_large"]);
    let piped = build(&mut backend, &["tensor_cores", "mma_large", "mma_pipe"]);
    assert_eq!(large.plans_digest(), piped.plans_digest());
    assert_eq!(
        launches(&wide),
        launches(&unpaired),
        "mma_pipe without mma_large"
    );
    let (a, b) = (launches(&large), launches(&piped));
    assert_eq!(a.len(), b.len());
    let mut taken = std::collections::BTreeSet::new();
    for ((entry, config), (piped_entry, piped_config)) in a.iter().zip(&b) {
        match kernels::gemm::PIPES.iter().find(|p| p.1 == *entry) {
            Some(&(pipe, _, kernel, weights)) => {
                assert_eq!(*piped_entry, pipe, "{entry}");
                assert_eq!(
                    (piped_config.grid, piped_config.block),
                    (config.grid, config.block),
                    "{pipe}"
                );
                assert_eq!(
                    piped_config.shared_bytes,
                    kernels::gemm::pipe_shared_bytes(weights),
                    "{pipe}"
                );
                assert_eq!(kernels::variant_of(pipe), Some(kernel), "{pipe}");
                taken.insert(kernel);
            }
            None => assert_eq!((entry, config), (piped_entry, piped_config)),
        }
    }
    let tokens = prompt(7, large.config.vocab_size, 150);
    let (x, _) = chunked_logits(&mut backend, &large, &tokens);
    let (y, _) = chunked_logits(&mut backend, &piped, &tokens);
    assert_same_bytes(&x, &y, "mma_large vs mma_large + mma_pipe");
    taken.into_iter().collect()
}

/// The same for Gated DeltaNet's two input projections (`linear_pair_mma`): a qwen3_next whose
/// in_proj_qkvz has 4,128 features (64 value heads of 32) and in_proj_ba 128, so the pair's
/// large grid holds 65 + 2 feature blocks, 134 at 136 rows.
#[test]
fn mma_large_lever_picks_the_large_pair_entry_at_prefill_widths() {
    let enlarged = large_lever_entries(&wide_pair_next());
    assert_eq!(enlarged, [kernels::gemm::LINEAR_PAIR_MMA.as_str()]);
}

/// The tiny qwen3_next with 64 value heads of 32: an in_proj_qkvz of 4,128 features.
fn wide_pair_next() -> String {
    exec_support::TINY_NEXT
        .replace(
            "\"linear_num_value_heads\": 4",
            "\"linear_num_value_heads\": 64",
        )
        .replace(
            "\"linear_value_head_dim\": 8",
            "\"linear_value_head_dim\": 32",
        )
}

/// The same for q/k/v with rope and the KV write (`qkv_rope_kv_mma`, the plain layout): a llama
/// of 64 heads of 64 (and 2 KV heads), whose large grid holds 64 + 2 rope blocks and 2 v blocks,
/// 136 at 136 rows.
#[test]
fn mma_large_lever_picks_the_large_rope_entry_at_prefill_widths() {
    let json = TINY_LLAMA.replace(
        "\"num_attention_heads\": 4",
        "\"num_attention_heads\": 64, \"head_dim\": 64",
    );
    let enlarged = large_lever_entries(&json);
    assert_eq!(enlarged, [kernels::gemm::QKV_ROPE_KV_MMA.as_str()]);
}

/// The same for q/k/v with qk-norm, rope and the KV write (`qkv_norm_rope_kv_mma`, a head a
/// block, its 128 rows staged in shared memory): a qwen3 of 64 heads of 128 (and 2 KV heads),
/// whose large grid holds 64 + 2 head blocks and 4 v blocks, 140 at 136 rows.
#[test]
fn mma_large_lever_picks_the_large_qk_norm_entry_at_prefill_widths() {
    let json = TINY_LLAMA
        .replace(
            "\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\"",
            "\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\"",
        )
        .replace(
            "\"num_attention_heads\": 4",
            "\"num_attention_heads\": 64, \"head_dim\": 128",
        )
        .replace(", \"mlp_bias\": false", "");
    let enlarged = large_lever_entries(&json);
    assert_eq!(enlarged, [kernels::gemm::QKV_NORM_ROPE_KV_MMA.as_str()]);
}

/// The model of `json` (random weights) with `levers` on and verify widths 64 and 136 added to
/// the serve ladder, so a 136-row program runs the prefill-width tiles.
fn wide_build(
    backend: &mut CpuBackend,
    json: &str,
    levers: &[&str],
) -> solder_model_layers::CircuitExec {
    let mut policy = Policy::default();
    for lever in levers {
        policy.levers.set(lever, true).unwrap();
    }
    let mut serve = exec_support::serve();
    serve.verify_widths.extend([64, 136]);
    let boot = solder_model_layers::Boot {
        serve,
        ..exec_support::boot(
            exec_support::config(json),
            policy,
            solder_model_layers::WeightSource::Random { seed: 0x5eed },
            exec_support::kv(2 * 40 + 2, 4, 160),
        )
    };
    solder_model_layers::CircuitExec::build(backend, boot).expect("build")
}

/// The logits of `tokens` prefilled as a 136-token chunk then the rest, and the rows of the
/// program the first chunk ran.
fn chunked_logits(
    backend: &mut CpuBackend,
    exec: &solder_model_layers::CircuitExec,
    tokens: &[u32],
) -> (Vec<f32>, Option<usize>) {
    let mut session = solder_model_layers::Session::new(exec);
    let id = session.add_sequence();
    let mut out = session
        .prefill(backend, id, &tokens[..136])
        .expect("prefill");
    let ran = session.last_program().map(|(_, rows, _)| rows);
    out.extend(
        session
            .prefill(backend, id, &tokens[136..])
            .expect("prefill"),
    );
    (out, ran)
}

/// Builds the model of `json` with `tensor_cores` and with `tensor_cores,mma_large` (verify
/// widths 64 and 136 added), checks the launches program by program (the same plans; a launch
/// either its kernel's or, at 128 rows or more, that kernel's `_large` entry in a large grid
/// that fits) and that a 150-token prompt gives the same bytes; returns the kernels that took
/// their `_large` entries somewhere.
fn large_lever_entries(json: &str) -> Vec<&'static str> {
    let mut backend = backend();
    let build = |backend: &mut CpuBackend, levers: &[&str]| wide_build(backend, json, levers);
    let wide = build(&mut backend, &["tensor_cores"]);
    let large = build(&mut backend, &["tensor_cores", "mma_large"]);
    assert_eq!(wide.plans_digest(), large.plans_digest());
    type Launched = (&'static str, [u32; 3], [u32; 3]);
    let launches = |program: &solder_model_layers::Program| -> Vec<Launched> {
        program
            .steps
            .iter()
            .filter_map(|step| match step {
                ProgramStep::Launch { name, config, .. } => {
                    Some((*name, config.grid, config.block))
                }
                _ => None,
            })
            .collect()
    };
    // The kernels whose one matrix's features the wide grid gives (⌈features/32⌉ blocks), so
    // whether they fit is checked exactly; the others' (several matrices) is their emitters'.
    let single = [
        kernels::gemm::LINEAR_MMA.as_str(),
        kernels::gemm::LM_HEAD_MMA.as_str(),
        kernels::gemm::GATE_UP_SILU_MMA.as_str(),
    ];
    let mut enlarged = std::collections::BTreeSet::new();
    let mut kept = 0;
    for (a, b) in wide.programs().iter().zip(large.programs()) {
        let at = format!("{}:{}", a.mode, a.rows);
        assert_eq!((a.mode, a.rows), (b.mode, b.rows), "{at}");
        let rows = a.rows as u32;
        let (a, b) = (launches(a), launches(b));
        assert_eq!(a.len(), b.len(), "{at}");
        for ((kernel, grid, block), (entry, entry_grid, entry_block)) in a.iter().zip(&b) {
            // A qk-norm entry is itself a variant of the plain one, and so is its `_large` entry.
            let base = kernels::variant_of(kernel).unwrap_or(kernel);
            let has_large = kernels::gemm::large_variants()
                .any(|(large, _)| large.strip_suffix("_large") == Some(*kernel));
            let features = grid[1] * kernels::gemm::GEMM_FEATURES;
            let fits = kernels::gemm::large_fits(rows, features);
            if entry == kernel {
                assert_eq!((entry_grid, entry_block), (grid, block), "{at}");
                assert!(!(single.contains(kernel) && fits), "{at}: `{kernel}` kept");
                kept += usize::from(has_large);
                continue;
            }
            assert!(has_large, "{at}: `{kernel}` became `{entry}`");
            assert_eq!(*entry, format!("{kernel}_large"), "{at}");
            assert_eq!(kernels::variant_of(entry), Some(base), "{at}");
            let config = solder_gpu_runtime::LaunchConfig {
                grid: *entry_grid,
                block: *entry_block,
                shared_bytes: 0,
            };
            assert!(
                kernels::gemm::large_fits_grid(rows, &config),
                "{at}: `{entry}`"
            );
            assert_eq!(entry_grid[0], rows.div_ceil(128), "{at}: `{entry}`");
            assert_eq!(entry_block[0], kernels::gemm::GEMM_LARGE_THREADS, "{at}");
            if single.contains(kernel) {
                assert_eq!(entry_grid[1], grid[1].div_ceil(2), "{at}: `{entry}`");
                assert_eq!(config, kernels::gemm::large_grid(features, rows), "{at}");
            } else {
                // Each matrix's blocks of 64: at least half the wide grid's blocks of 32, at
                // most as many.
                assert!(entry_grid[1] >= grid[1].div_ceil(2), "{at}: `{entry}`");
                assert!(entry_grid[1] <= grid[1], "{at}: `{entry}`");
            }
            enlarged.insert(*kernel);
        }
    }
    assert!(kept > 0);
    // And the same bytes on the CPU (the variants run their kernels' twins), through a prompt
    // whose first chunk runs the 136-row program.
    let tokens = prompt(7, wide.config.vocab_size, 150);
    let (x, _) = chunked_logits(&mut backend, &wide, &tokens);
    let (y, ran) = chunked_logits(&mut backend, &large, &tokens);
    assert_eq!(ran, Some(136), "the first chunk's program");
    assert_same_bytes(&x, &y, "tensor_cores vs tensor_cores + mma_large");
    enlarged.into_iter().collect()
}

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
        let mut split_kernels = std::collections::BTreeSet::new();
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
                    split_kernels.insert(name.rsplit_once('_').map_or(*name, |(kernel, _)| kernel));
                    let start = at(*ptr) as usize;
                    let slot = region.start + *stream as usize * layout.gemv_slot_bytes;
                    assert_eq!(start, slot, "{mode}:{rows} `{name}`: its stream's slot");
                    assert!(start + bytes <= region.end, "{mode}:{rows} `{name}`");
                }
                other => panic!("{mode}:{rows} `{name}`: grid.z and scratch disagree: {other:?}"),
            }
        }
        assert!(splits > 0, "{mode}:{rows}: no split launch");
        // Under the default one-wave sizing, the o projection (132 feature blocks, half a wave),
        // gate/up and the LM head (32 blocks each) all split.
        assert_eq!(
            split_kernels.into_iter().collect::<Vec<_>>(),
            [
                "gemv::add_norm_gate_up_silu",
                "gemv::add_norm_lm_head",
                "gemv::linear"
            ],
            "{mode}:{rows}: the split kernels"
        );
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
    let a = decode_alone(&mut backend, &split, &tokens);
    let b = decode_alone(&mut backend, &unsplit, &tokens);
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
    let clean = decode_alone(&mut backend, &exec, &tokens);
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
