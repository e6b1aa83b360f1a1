//! Bad launches are refused with errors naming the kernel, never a panic, and nothing is
//! written; the kernel list matches the shipped rules.

mod twins_support;

use std::collections::BTreeSet;

use half::bf16;
use solder_gpu_runtime::GpuError;
use solder_model_layers::ops::{attn, embed, gemv, kv, rope, Launch, KERNELS};
use solder_model_layers::twins;
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
        gemv::linear(rd(&x), rd(&short_w), None, wr(&mut y), 2, 32, 8),
        "expected 256",
    );
    assert!(
        matches!(err, GpuError::BadArgument { index: 1, .. }),
        "{err:?}"
    );
    let short_bias = rng.bf16s(7, 1.0);
    let err = refused(
        gemv::linear(rd(&x), rd(&w), Some(rd(&short_bias)), wr(&mut y), 2, 32, 8),
        "expected 8",
    );
    assert!(
        matches!(err, GpuError::BadArgument { index: 2, .. }),
        "{err:?}"
    );
    let mut short_y = poison_bf16(2 * 8 - 1);
    let err = refused(
        gemv::linear(rd(&x), rd(&w), None, wr(&mut short_y), 2, 32, 8),
        "expected 16",
    );
    assert!(
        matches!(err, GpuError::BadArgument { index: 3, .. }),
        "{err:?}"
    );
    // A zero dimension and dimensions whose product overflows.
    refused(
        gemv::linear(rd(&x), rd(&w), None, wr(&mut y), 2, 0, 8),
        "at least 1",
    );
    refused(
        gemv::linear(
            rd(&x),
            rd(&w),
            None,
            wr(&mut y),
            u32::MAX,
            u32::MAX,
            u32::MAX,
        ),
        "",
    );
    assert!(y.iter().all(|v| v.is_nan()), "nothing written");
}

#[test]
fn wrong_argument_kinds_are_refused() {
    let (x, w) = (vec![bf16::ONE; 32], vec![bf16::ONE; 32]);
    let mut y = poison_bf16(1);
    let mut launch = gemv::linear(rd(&x), rd(&w), None, wr(&mut y), 1, 32, 1);
    launch.args.pop();
    refused(launch.clone(), "missing");
    launch.args.push(solder_gpu_runtime::KernelArg::F32(1.0));
    refused(launch.clone(), "expected u32");
    // A required buffer passed as null.
    let launch = gemv::lm_head(rd(&x), rd(&w), wr(&mut poison_f32(1)), 1, 32, 1);
    let mut nulled = launch.clone();
    nulled.args[1] = solder_gpu_runtime::KernelArg::Null;
    refused(nulled, "null");
}

#[test]
fn token_out_of_range_is_refused() {
    let table = vec![bf16::ONE; 10 * 4];
    let mut out = poison_f32(2 * 4);
    refused(
        embed::embedding(rd(&[3i32, 10]), rd(&table), wr(&mut out), 2, 4, 10),
        "token id 10",
    );
    refused(
        embed::embedding(rd(&[-1i32, 0]), rd(&table), wr(&mut out), 2, 4, 10),
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
            kv::kv_write(
                rd(&k),
                rd(&v),
                rd(&slots),
                wr(&mut cache),
                2,
                kv_heads,
                d,
                block,
                pages,
            ),
            &format!("slot {bad}"),
        );
        let (q, pos, inv_freq) = (rng.bf16s(2 * 2 * row, 1.0), [0i32, 1], vec![1.0f32; 4]);
        let mut q_out = poison_bf16(q.len());
        refused(
            rope::rope_kv_write(
                rd(&q),
                rd(&k),
                rd(&v),
                rd(&pos),
                rd(&inv_freq),
                rd(&slots),
                wr(&mut q_out),
                wr(&mut cache),
                2,
                4,
                kv_heads,
                d,
                d,
                block,
                pages,
            ),
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
        rope::rope_kv_write(
            rd(&q),
            rd(&k),
            rd(&v),
            rd(&[0i32, 1]),
            rd(&[1.0f32; 3]),
            rd(&[0i32, 1]),
            wr(&mut q_out),
            wr(&mut cache),
            2,
            4,
            kv_heads,
            d,
            7,
            block,
            pages,
        ),
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
        for op in [attn::paged_decode, attn::paged_causal] {
            let mut out = poison_bf16(q.len());
            refused(
                op(
                    rd(&q),
                    rd(&cache),
                    rd(&tables),
                    rd(&lens),
                    wr(&mut out),
                    wr(&mut scratch),
                    2,
                    heads,
                    kv_heads,
                    d,
                    block,
                    max_blocks,
                    pages,
                    1.0,
                ),
                needle,
            );
            assert!(out.iter().all(|v| v.is_nan()), "nothing written");
        }
    }
    // kv_heads must divide heads.
    let mut out = poison_bf16(q.len());
    refused(
        attn::paged_decode(
            rd(&q),
            rd(&cache),
            rd(&tables),
            rd(&[1i32, 1]),
            wr(&mut out),
            wr(&mut scratch),
            2,
            heads,
            3,
            d,
            block,
            max_blocks,
            pages,
            1.0,
        ),
        "does not divide",
    );
    // A page beyond a row's length is not read, so it may hold anything.
    let mut out = poison_bf16(q.len());
    let launch = attn::paged_decode(
        rd(&q),
        rd(&cache),
        rd(&[0i32, 99, 99, 1, 2, -7]),
        rd(&[2i32, 4]),
        wr(&mut out),
        wr(&mut scratch),
        2,
        heads,
        kv_heads,
        d,
        block,
        max_blocks,
        pages,
        1.0,
    );
    run_threads(&launch, 1).expect("unused table entries are ignored");
}

/// Kernels named by `kernel = "..."` lines of the shipped rules.
fn kernels_in_rules() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fusions/FUSIONS.toml");
    let text = std::fs::read_to_string(path).expect("fusions/FUSIONS.toml");
    text.lines()
        .filter_map(|line| {
            let rest = line
                .trim()
                .strip_prefix("kernel")?
                .trim_start()
                .strip_prefix('=')?;
            Some(rest.trim().trim_matches('"').to_string())
        })
        .collect()
}

#[test]
fn kernel_list_matches_the_rules_and_the_twins() {
    let listed: BTreeSet<String> = KERNELS.iter().map(|k| k.to_string()).collect();
    assert_eq!(listed.len(), KERNELS.len(), "KERNELS has duplicates");
    assert_eq!(
        listed,
        kernels_in_rules(),
        "ops::KERNELS vs fusions/FUSIONS.toml"
    );
    let twin_names: Vec<&str> = twins::twins().iter().map(|(name, _)| *name).collect();
    assert_eq!(twin_names, KERNELS, "twins() vs ops::KERNELS");
}
