//! Bad launches are refused with errors naming the kernel, never a panic, and nothing is
//! written; the kernel list matches the shipped rules.

mod twins_support;

use std::collections::BTreeSet;

use half::bf16;
use solder_gpu_runtime::GpuError;
use solder_model_layers::kernels::{self, attn, embed, gemv, kv, rope, Launch};
use twins_support::{attn_scratch, bits_bf16, poison_bf16, poison_f32, rd, run_threads, wr, Rng};

/// Runs `launch`, expecting an error whose message names its kernel and contains `needle`.
fn refused(launch: Launch, needle: &str) -> GpuError {
    let err = run_threads(&launch, 2).expect_err("the launch should be refused");
    let message = err.to_string();
    assert!(
        message.contains(launch.kernel),
        "{message:?} does not name {}",
        launch.kernel
    );
    assert!(
        message.contains(needle),
        "{message:?} does not say {needle:?}"
    );
    err
}

#[test]
fn wrong_buffer_lengths_are_refused() {
    let mut rng = Rng::new(20);
    let (x, w, short_w) = (
        rng.bf16s(2 * 32, 1.0),
        rng.bf16s(8 * 32, 1.0),
        rng.bf16s(8 * 32 - 1, 1.0),
    );
    let mut y = poison_bf16(2 * 8);
    let err = refused(
        gemv::Linear {
            x: rd(&x),
            w: rd(&short_w),
            bias: None,
            y: wr(&mut y),
            rows: 2,
            k: 32,
            n_out: 8,
            scratch: None,
        }
        .launch(gemv::LINEAR),
        "expected 256",
    );
    assert!(
        matches!(err, GpuError::BadArgument { index: 1, .. }),
        "{err:?}"
    );
    let short_bias = rng.bf16s(7, 1.0);
    let err = refused(
        gemv::Linear {
            x: rd(&x),
            w: rd(&w),
            bias: Some(rd(&short_bias)),
            y: wr(&mut y),
            rows: 2,
            k: 32,
            n_out: 8,
            scratch: None,
        }
        .launch(gemv::LINEAR),
        "expected 8",
    );
    assert!(
        matches!(err, GpuError::BadArgument { index: 2, .. }),
        "{err:?}"
    );
    let mut short_y = poison_bf16(2 * 8 - 1);
    let err = refused(
        gemv::Linear {
            x: rd(&x),
            w: rd(&w),
            bias: None,
            y: wr(&mut short_y),
            rows: 2,
            k: 32,
            n_out: 8,
            scratch: None,
        }
        .launch(gemv::LINEAR),
        "expected 16",
    );
    assert!(
        matches!(err, GpuError::BadArgument { index: 3, .. }),
        "{err:?}"
    );
    // A zero dimension and dimensions whose product overflows.
    refused(
        gemv::Linear {
            x: rd(&x),
            w: rd(&w),
            bias: None,
            y: wr(&mut y),
            rows: 2,
            k: 0,
            n_out: 8,
            scratch: None,
        }
        .launch(gemv::LINEAR),
        "at least 1",
    );
    refused(
        gemv::Linear {
            x: rd(&x),
            w: rd(&w),
            bias: None,
            y: wr(&mut y),
            rows: u32::MAX,
            k: u32::MAX,
            n_out: u32::MAX,
            scratch: None,
        }
        .launch(gemv::LINEAR),
        "",
    );
    assert!(y.iter().all(|v| v.is_nan()), "nothing written");
}

#[test]
fn wrong_argument_kinds_are_refused() {
    let (x, w) = (vec![bf16::ONE; 32], vec![bf16::ONE; 32]);
    let mut y = poison_bf16(1);
    let mut launch = gemv::Linear {
        x: rd(&x),
        w: rd(&w),
        bias: None,
        y: wr(&mut y),
        rows: 1,
        k: 32,
        n_out: 1,
        scratch: None,
    }
    .launch(gemv::LINEAR);
    // Without n_out and the scratch, then n_out as an f32.
    launch.args.truncate(6);
    refused(
        launch.clone(),
        "launched with 6 arguments, the declaration has 8",
    );
    launch.args.push(solder_gpu_runtime::KernelArg::F32(1.0));
    launch.args.push(solder_gpu_runtime::KernelArg::Null);
    refused(launch.clone(), "expected u32");
    let mut extra = launch.clone();
    extra.args.push(solder_gpu_runtime::KernelArg::U32(1));
    refused(extra, "launched with 9 arguments");
    // A required buffer passed as null.
    let launch = gemv::LmHead {
        x: rd(&x),
        w: rd(&w),
        logits: wr(&mut poison_f32(1)),
        want: None,
        rows: 1,
        k: 32,
        vocab: 1,
        scratch: None,
    }
    .launch(gemv::LM_HEAD);
    let mut nulled = launch.clone();
    nulled.args[1] = solder_gpu_runtime::KernelArg::Null;
    refused(nulled, "null");
}

#[test]
fn a_split_launch_without_its_scratch_is_refused() {
    let (x, w) = (vec![bf16::ONE; 2048], vec![bf16::ONE; 8 * 2048]);
    let mut y = poison_bf16(8);
    let args = gemv::Linear {
        x: rd(&x),
        w: rd(&w),
        bias: None,
        y: wr(&mut y),
        rows: 1,
        k: 2048,
        n_out: 8,
        scratch: None,
    };
    let mut config = gemv::stream_config(8, 1, 2048, gemv::RowTile::R1);
    config.grid[2] = 2;
    refused(
        args.launch_with(gemv::LINEAR_STREAM[0], config),
        "without its scratch",
    );
    // A scratch of the wrong length.
    let mut short = poison_f32(gemv::split::COUNTERS + 2 * 8 - 1);
    let err = refused(
        gemv::Linear {
            scratch: Some(wr(&mut short)),
            ..args
        }
        .launch_with(gemv::LINEAR_STREAM[0], config),
        "expected",
    );
    assert!(
        matches!(err, GpuError::BadArgument { index: 7, .. }),
        "{err:?}"
    );
    assert!(y.iter().all(|v| v.is_nan()), "nothing written");
}

#[test]
fn token_out_of_range_is_refused() {
    let table = vec![bf16::ONE; 10 * 4];
    let mut out = poison_f32(2 * 4);
    refused(
        embed::Embedding {
            tokens: rd(&[3i32, 10]),
            table: rd(&table),
            out: wr(&mut out),
            rows: 2,
            hidden: 4,
            vocab: 10,
        }
        .launch(embed::EMBEDDING),
        "token id 10",
    );
    refused(
        embed::Embedding {
            tokens: rd(&[-1i32, 0]),
            table: rd(&table),
            out: wr(&mut out),
            rows: 2,
            hidden: 4,
            vocab: 10,
        }
        .launch(embed::EMBEDDING),
        "token id -1",
    );
    assert!(out.iter().all(|v| v.is_nan()), "nothing written");
}

#[test]
fn slots_out_of_range_are_refused_and_the_cache_is_untouched() {
    let mut rng = Rng::new(21);
    let (kv_heads, d, block, pages) = (2u32, 8u32, 4u32, 3u32);
    let row = (kv_heads * d) as usize;
    let (k, v) = (rng.bf16s(2 * row, 1.0), rng.bf16s(2 * row, 1.0));
    let original = rng.bf16s(pages as usize * 2 * block as usize * row, 1.0);
    for bad in [12, -1, i32::MAX] {
        let mut cache = original.clone();
        let slots = [0, bad];
        refused(
            kv::KvWrite {
                k: rd(&k),
                v: rd(&v),
                slot_mapping: rd(&slots),
                cache: wr(&mut cache),
                rows: 2,
                kv_heads,
                head_dim: d,
                block_size: block,
                num_pages: pages,
            }
            .launch(kv::KV_WRITE),
            &format!("slot {bad}"),
        );
        // Four inverse frequencies, then the attention scaling.
        let (q, pos, inv_freq) = (rng.bf16s(2 * 2 * row, 1.0), [0i32, 1], vec![1.0f32; 5]);
        let mut q_out = poison_bf16(q.len());
        refused(
            rope::RopeKvWrite {
                q: rd(&q),
                k: rd(&k),
                v: rd(&v),
                positions: rd(&pos),
                inv_freq: rd(&inv_freq),
                slot_mapping: rd(&slots),
                q_out: wr(&mut q_out),
                cache: wr(&mut cache),
                rows: 2,
                heads: 4,
                kv_heads,
                head_dim: d,
                rotary_dim: d,
                block_size: block,
                num_pages: pages,
            }
            .launch(rope::ROPE_KV_WRITE),
            &format!("slot {bad}"),
        );
        assert_eq!(bits_bf16(&cache), bits_bf16(&original), "cache untouched");
        assert!(q_out.iter().all(|v| v.is_nan()), "q_out untouched");
    }
    // An odd rotary_dim.
    let (q, mut q_out, mut cache) = (
        rng.bf16s(2 * 2 * row, 1.0),
        poison_bf16(2 * 2 * row),
        original.clone(),
    );
    refused(
        rope::RopeKvWrite {
            q: rd(&q),
            k: rd(&k),
            v: rd(&v),
            positions: rd(&[0i32, 1]),
            inv_freq: rd(&[1.0f32; 3]),
            slot_mapping: rd(&[0i32, 1]),
            q_out: wr(&mut q_out),
            cache: wr(&mut cache),
            rows: 2,
            heads: 4,
            kv_heads,
            head_dim: d,
            rotary_dim: 7,
            block_size: block,
            num_pages: pages,
        }
        .launch(rope::ROPE_KV_WRITE),
        "rotary_dim 7",
    );
}

#[test]
fn bad_sequence_lengths_and_pages_are_refused() {
    let (heads, kv_heads, d, block, max_blocks, pages) = (2u32, 1u32, 4u32, 2u32, 3u32, 4u32);
    let q = vec![bf16::ONE; (2 * heads * d) as usize];
    let cache = vec![bf16::ONE; (pages * 2 * block * kv_heads * d) as usize];
    let tables = [0i32, 1, 2, 3, 0, 1];
    let mut scratch = attn_scratch(2, heads, d);
    for (lens, tables, needle) in [
        ([0i32, 1], tables, "seq_len 0"),
        ([1, 7], tables, "seq_len 7"),
        ([1, -3], tables, "seq_len -3"),
        ([1, 3], [0, 1, 2, 3, 4, 1], "page 4"),
        ([5, 1], [0, 1, -1, 3, 0, 1], "page -1"),
    ] {
        for op in [attn::PAGED_DECODE, attn::PAGED_CAUSAL] {
            let mut out = poison_bf16(q.len());
            refused(
                attn::PagedAttention {
                    q: rd(&q),
                    cache: rd(&cache),
                    block_tables: rd(&tables),
                    seq_lens: rd(&lens),
                    gate: None,
                    out: wr(&mut out),
                    scratch: wr(&mut scratch),
                    rows: 2,
                    heads,
                    kv_heads,
                    head_dim: d,
                    block_size: block,
                    max_blocks,
                    num_pages: pages,
                    window: 0,
                    scale: 1.0,
                }
                .launch(op),
                needle,
            );
            assert!(out.iter().all(|v| v.is_nan()), "nothing written");
        }
    }
    // kv_heads must divide heads.
    let mut out = poison_bf16(q.len());
    refused(
        attn::PagedAttention {
            q: rd(&q),
            cache: rd(&cache),
            block_tables: rd(&tables),
            seq_lens: rd(&[1i32, 1]),
            gate: None,
            out: wr(&mut out),
            scratch: wr(&mut scratch),
            rows: 2,
            heads,
            kv_heads: 3,
            head_dim: d,
            block_size: block,
            max_blocks,
            num_pages: pages,
            window: 0,
            scale: 1.0,
        }
        .launch(attn::PAGED_DECODE),
        "does not divide",
    );
    // A page beyond a row's length is not read, so it may hold anything.
    let mut out = poison_bf16(q.len());
    let launch = attn::PagedAttention {
        q: rd(&q),
        cache: rd(&cache),
        block_tables: rd(&[0i32, 99, 99, 1, 2, -7]),
        seq_lens: rd(&[2i32, 4]),
        gate: None,
        out: wr(&mut out),
        scratch: wr(&mut scratch),
        rows: 2,
        heads,
        kv_heads,
        head_dim: d,
        block_size: block,
        max_blocks,
        num_pages: pages,
        window: 0,
        scale: 1.0,
    }
    .launch(attn::PAGED_DECODE);
    run_threads(&launch, 1).expect("unused table entries are ignored");
}

/// Every kernel a rule of fusions/FUSIONS.toml names (`kernel`, or each of `kernels`), as the
/// fuser reads them.
fn kernels_in_rules() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fusions/FUSIONS.toml");
    let rules = solder_circuit::RuleSet::from_file(std::path::Path::new(path))
        .expect("fusions/FUSIONS.toml");
    rules
        .rules
        .iter()
        .flat_map(|r| r.kernels.iter().cloned())
        .collect()
}

#[test]
fn kernel_list_matches_the_rules_and_the_twins() {
    let names = kernels::kernel_names();
    let listed: BTreeSet<String> = names.iter().map(|k| k.to_string()).collect();
    assert_eq!(listed.len(), names.len(), "a kernel is declared twice");
    let ruled: BTreeSet<String> = listed
        .iter()
        .filter(|k| !kernels::PROGRAM_KERNELS.contains(&k.as_str()))
        .filter(|k| !kernels::SESSION_KERNELS.contains(&k.as_str()))
        .filter(|k| !kernels::format_entries().any(|(entry, ..)| entry == k.as_str()))
        .cloned()
        .collect();
    assert_eq!(
        ruled,
        kernels_in_rules(),
        "kernels::registry() (less PROGRAM_KERNELS and SESSION_KERNELS) vs fusions/FUSIONS.toml"
    );
    let twin_names: Vec<&str> = kernels::twins().iter().map(|(name, _)| *name).collect();
    assert_eq!(twin_names, names, "twins() vs kernels::registry()");
}

/// Every format a rule lists is read by its kernels (the fuser never offers a kernel a format
/// it cannot read), and every quantized entry serves some rule that lists its format (none is
/// dead). A rule may list fewer formats than its kernel reads (`router` runs `gemv::lm_head`
/// on the router gate, which is never quantized).
#[test]
fn rule_formats_are_read_by_their_kernels() {
    let rules = solder_circuit::RuleSet::from_file(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fusions/FUSIONS.toml"),
    )
    .expect("rules");
    for rule in &rules.rules {
        let read: Vec<&str> = rule
            .kernels
            .iter()
            .flat_map(|k| kernels::formats_read(k))
            .collect();
        for format in &rule.formats {
            assert!(
                read.contains(format),
                "rule `{}` ({:?}) lists `{format}`, which its kernels do not read ({read:?})",
                rule.id,
                rule.kernels
            );
        }
    }
    for (entry, kernel, format) in kernels::format_entries() {
        assert!(
            rules
                .rules
                .iter()
                .any(|r| r.kernels.iter().any(|k| k == kernel) && r.formats.contains(&format)),
            "entry `{entry}` reads {format} for `{kernel}`, but no rule of `{kernel}` lists {format}"
        );
    }
}
