//! gemv's split-K through the host emulation of its CUDA source: a streaming launch split over
//! k (grid.z) stores the classic kernel's bytes — f32 logits and residual sums, where every bit
//! of a dot shows, and the gate/up product with its stored residual sum — for one and several
//! row groups, whole and partial segments, more splits than segments (empty splits), a grid
//! with several features per warp, split ranges staged whole or still in spans (8 rows of
//! k = 4100), and the split count the host policy picks; every counter is
//! zero again after each launch. Blocks run one at a time here, in grid order, so the last
//! split to count in is always the highest grid.z index; the merge reads every segment sum
//! back from the scratch whichever split is last, so the arrival order has no path into the
//! bits (the device bundle's racecheck checks the protocol itself).

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::{CpuBackend, GpuBackend, LaunchConfig};
use solder_model_layers::kernels::gemv::split::{self, COUNTERS, SLOT_BYTES};
use solder_model_layers::kernels::gemv::{
    stage_elems, stream_config, AddNormGateUpSilu, AddNormLmHead, CountersReset, LinearResidualAdd,
    RowTile, ADD_NORM_GATE_UP_SILU, ADD_NORM_GATE_UP_SILU_STREAM, ADD_NORM_LM_HEAD,
    ADD_NORM_LM_HEAD_STREAM, COUNTERS_RESET, LINEAR_RESIDUAL_ADD, LINEAR_RESIDUAL_ADD_STREAM,
};
use solder_model_layers::kernels::Buf;

use super::tests::{bf16_values, download, emulated, f32_values, run, upload};

fn out(backend: &mut CpuBackend, bytes: u32) -> Buf {
    let bytes = bytes as usize;
    Buf::new(backend.alloc(bytes).unwrap(), bytes)
}

/// The scratch slot, zeroed, as a launch of `grid` over this shape sees it.
fn slot(
    backend: &mut CpuBackend,
    grid: [u32; 3],
    features: u32,
    rows: u32,
    k: u32,
    nw: u32,
) -> Buf {
    let words = split::scratch_words(grid, features as u64, rows, k, nw)
        .expect("the shape fits a split-K slot");
    let ptr = backend.alloc(SLOT_BYTES).unwrap();
    backend.copy_h2d(ptr, &vec![0u8; SLOT_BYTES]).unwrap();
    Buf::new(ptr, words * 4)
}

fn counters_are_zero(backend: &mut CpuBackend, scratch: Buf, at: &str) {
    let counters = download(backend, scratch.ptr, COUNTERS * 4);
    assert!(
        counters.iter().all(|b| *b == 0),
        "{at}: a counter was left set"
    );
}

/// The grids a shape is tried at: unsplit, 2 and 3 splits, one split per segment, more splits
/// than segments, and 2 splits with at most 2 feature blocks (several features per warp).
fn grids(features: u32, rows: u32, k: u32, tile: RowTile) -> Vec<(String, LaunchConfig)> {
    let base = stream_config(features as u64, rows, k, tile);
    let segments = split::segments(k);
    let mut out = vec![("unsplit".to_string(), base)];
    for z in [2, 3, segments, segments + 2] {
        let mut c = base;
        c.grid[2] = z;
        out.push((format!("{z} splits"), c));
    }
    let mut few = base;
    few.grid[1] = few.grid[1].min(2);
    few.grid[2] = 2;
    out.push(("2 splits, 2 feature blocks".to_string(), few));
    out
}

#[test]
fn split_launches_store_the_classic_bytes() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    for (rows, k, n) in [
        (1u32, 3000u32, 37u32),
        (1, 8192, 20),
        (2, 5000, 5),
        (3, 2051, 9),
        (8, 2048, 9),
        (8, 4100, 9),
        (9, 1500, 11),
    ] {
        let tile = RowTile::for_rows(rows);
        let x = upload(&mut backend, &bf16_values(rows * k, 1.0));
        let w = upload(&mut backend, &bf16_values(n * k, 2.0));
        let wu = upload(&mut backend, &bf16_values(n * k, 3.0));
        let bias = upload(&mut backend, &bf16_values(n, 4.0));
        let h = upload(&mut backend, &f32_values(rows * k, 5.0));
        let d = upload(&mut backend, &bf16_values(rows * k, 6.0));
        let wn = upload(&mut backend, &bf16_values(k, 7.0));
        let hn = upload(&mut backend, &f32_values(rows * n, 8.0));

        // The classic kernels' bytes.
        let logits = out(&mut backend, rows * n * 4);
        let lm = AddNormLmHead {
            h,
            d,
            wn,
            w,
            logits,
            want: None,
            rows,
            k,
            vocab: n,
            eps: 1e-6,
            scratch: None,
        };
        run(&mut backend, &lm.launch(ADD_NORM_LM_HEAD));
        let want_logits = download(&mut backend, logits.ptr, logits.bytes);
        let (act, sum) = (
            out(&mut backend, rows * n * 2),
            out(&mut backend, rows * k * 4),
        );
        let gu = AddNormGateUpSilu {
            h,
            o: d,
            wn,
            wg: w,
            wu,
            h_out: Some(sum),
            act,
            rows,
            k,
            inter: n,
            eps: 1e-5,
            scratch: None,
        };
        run(&mut backend, &gu.launch(ADD_NORM_GATE_UP_SILU));
        let want_act = download(&mut backend, act.ptr, act.bytes);
        let want_sum = download(&mut backend, sum.ptr, sum.bytes);
        let res_out = out(&mut backend, rows * n * 4);
        let res = LinearResidualAdd {
            x,
            w,
            bias: Some(bias),
            h: hn,
            h_out: res_out,
            rows,
            k,
            n_out: n,
            scratch: None,
        };
        run(&mut backend, &res.launch(LINEAR_RESIDUAL_ADD));
        let want_res = download(&mut backend, res_out.ptr, res_out.bytes);

        for (what, config) in grids(n, rows, k, tile) {
            let at = format!("rows {rows}, k {k}, features {n}, {what}");
            let split = config.grid[2] > 1;
            let scratch = |backend: &mut CpuBackend, nw| {
                split.then(|| slot(backend, config.grid, n, rows, k, nw))
            };

            let logits = out(&mut backend, rows * n * 4);
            let s = scratch(&mut backend, 1);
            let a = AddNormLmHead {
                logits,
                want: None,
                scratch: s,
                ..lm
            };
            run(
                &mut backend,
                &a.launch_with(ADD_NORM_LM_HEAD_STREAM[tile.index()], config),
            );
            let got = download(&mut backend, logits.ptr, logits.bytes);
            assert_eq!(got, want_logits, "add_norm_lm_head logits: {at}");
            if let Some(s) = s {
                counters_are_zero(&mut backend, s, &format!("add_norm_lm_head: {at}"));
            }

            let (act, sum) = (
                out(&mut backend, rows * n * 2),
                out(&mut backend, rows * k * 4),
            );
            let s = scratch(&mut backend, 2);
            let a = AddNormGateUpSilu {
                h_out: Some(sum),
                act,
                scratch: s,
                ..gu
            };
            run(
                &mut backend,
                &a.launch_with(ADD_NORM_GATE_UP_SILU_STREAM[tile.index()], config),
            );
            assert_eq!(
                download(&mut backend, act.ptr, act.bytes),
                want_act,
                "add_norm_gate_up_silu act: {at}"
            );
            assert_eq!(
                download(&mut backend, sum.ptr, sum.bytes),
                want_sum,
                "add_norm_gate_up_silu h_out: {at}"
            );
            if let Some(s) = s {
                counters_are_zero(&mut backend, s, &format!("add_norm_gate_up_silu: {at}"));
            }

            let h_out = out(&mut backend, rows * n * 4);
            let s = scratch(&mut backend, 1);
            let a = LinearResidualAdd {
                h_out,
                scratch: s,
                ..res
            };
            run(
                &mut backend,
                &a.launch_with(LINEAR_RESIDUAL_ADD_STREAM[tile.index()], config),
            );
            assert_eq!(
                download(&mut backend, h_out.ptr, h_out.bytes),
                want_res,
                "linear_residual_add: {at}"
            );
            if let Some(s) = s {
                counters_are_zero(&mut backend, s, &format!("linear_residual_add: {at}"));
            }
        }
    }
}

/// The split count the host picks for a decode-shaped launch (few feature blocks, long k),
/// run in shadow mode: the twin accepts the launch with its scratch, and the emulated bytes
/// are the classic kernel's.
#[test]
fn the_host_policy_splits_a_tall_launch_and_keeps_its_bytes() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let (rows, k, n) = (1u32, 4096u32, 64u32);
    let tile = RowTile::for_rows(rows);
    let mut config = stream_config(n as u64, rows, k, tile);
    let z = split::splits(
        config.grid,
        n as u64,
        rows,
        k,
        1,
        stage_elems(tile),
        split::Sizing::TwoWaves,
    );
    assert_eq!(
        z, 4,
        "8 blocks of 64 features over 4 segments: one split per segment"
    );
    config.grid[2] = z;
    let x = upload(&mut backend, &bf16_values(rows * k, 1.0));
    let w = upload(&mut backend, &bf16_values(n * k, 2.0));
    let h = upload(&mut backend, &f32_values(rows * n, 3.0));
    let (want, got) = (
        out(&mut backend, rows * n * 4),
        out(&mut backend, rows * n * 4),
    );
    let a = LinearResidualAdd {
        x,
        w,
        bias: None,
        h,
        h_out: want,
        rows,
        k,
        n_out: n,
        scratch: None,
    };
    run(&mut backend, &a.launch(LINEAR_RESIDUAL_ADD));
    let s = slot(&mut backend, config.grid, n, rows, k, 1);
    let b = LinearResidualAdd {
        h_out: got,
        scratch: Some(s),
        ..a
    };
    run(
        &mut backend,
        &b.launch_with(LINEAR_RESIDUAL_ADD_STREAM[tile.index()], config),
    );
    assert_eq!(
        download(&mut backend, got.ptr, got.bytes),
        download(&mut backend, want.ptr, want.bytes)
    );
    counters_are_zero(&mut backend, s, "linear_residual_add, host policy");
    let report = backend.emulation().unwrap().report();
    let entry = &report["gemv::linear_residual_add_r1"];
    assert_eq!(entry.launches, 1, "{entry:?}");
}

/// `qkv_rope_kv` with its heads split over 2, 3 (uneven: parts of 22, 22 and 20 features) and 8
/// blocks stores the one-block bytes — q roped (after qk-norm, and without it), k and v in their
/// cache slots, the residual sum — for one and two row groups; the counters are zero after. So
/// does its `_ahead` entry (lever `qkv_norm_ahead`), unsplit and in 8 parts, on both of its
/// norm paths (one pass through shared memory; row_inv_rms_ahead past 8192 values).
#[test]
fn split_heads_store_the_one_block_bytes() {
    use solder_model_layers::kernels::gemv::{QkvRopeKv, QKV_ROPE_KV, QKV_ROPE_KV_AHEAD};
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    let (heads, kv_heads, head_dim) = (3u32, 1u32, 64u32);
    let (block_size, pages) = (4u32, 8u32);
    let all_heads = heads + 2 * kv_heads;
    let (nq, nkv) = (heads * head_dim, kv_heads * head_dim);
    let features = nq + 2 * nkv;
    // k 1100 at 9 rows: 8 rows · 1100 values do not fit the one-pass norm (the `_ahead`
    // entry's row_inv_rms_ahead path).
    for (rows, k) in [(1u32, 200u32), (3, 200), (9, 200), (9, 1100)] {
        let h = upload(&mut backend, &f32_values(rows * k, 1.0));
        let d = upload(&mut backend, &bf16_values(rows * k, 2.0));
        let wn = upload(&mut backend, &bf16_values(k, 3.0));
        let wq = upload(&mut backend, &bf16_values(nq * k, 4.0));
        let wk = upload(&mut backend, &bf16_values(nkv * k, 5.0));
        let wv = upload(&mut backend, &bf16_values(nkv * k, 6.0));
        let bq = upload(&mut backend, &bf16_values(nq, 7.0));
        let qwn = upload(&mut backend, &bf16_values(head_dim, 8.0));
        let kwn = upload(&mut backend, &bf16_values(head_dim, 9.0));
        let positions: Vec<u8> = (0..rows as i32)
            .flat_map(|r| (3 * r + 1).to_le_bytes())
            .collect();
        let positions = upload(&mut backend, &positions);
        // The inverse frequencies, then the attention scaling (1 but for YaRN).
        let inv_freq: Vec<u8> = (0..head_dim / 2)
            .map(|i| 10000f32.powf(-2.0 * i as f32 / head_dim as f32))
            .chain([1.0])
            .flat_map(f32::to_le_bytes)
            .collect();
        let inv_freq = upload(&mut backend, &inv_freq);
        // Row r writes slot 2r + 1 (inside the cache's 32 slots).
        let slots: Vec<u8> = (0..rows as i32)
            .flat_map(|r| (2 * r + 1).to_le_bytes())
            .collect();
        let slots = upload(&mut backend, &slots);
        let cache_bytes = pages * 2 * block_size * nkv * 2;
        for qk in [false, true] {
            let launch_with = |backend: &mut CpuBackend, parts: u32, ahead: bool| {
                let (q_out, sum) = (out(backend, rows * nq * 2), out(backend, rows * k * 4));
                let cache = upload(backend, &vec![0u8; cache_bytes as usize]);
                let a = QkvRopeKv {
                    h,
                    d: Some(d),
                    wn,
                    wq,
                    bq: Some(bq),
                    wk,
                    bk: None,
                    wv,
                    bv: None,
                    qwn: qk.then_some(qwn),
                    kwn: qk.then_some(kwn),
                    positions,
                    inv_freq,
                    slot_mapping: slots,
                    h_out: Some(sum),
                    q_out,
                    cache,
                    rows,
                    k,
                    heads,
                    kv_heads,
                    head_dim,
                    rotary_dim: head_dim,
                    block_size,
                    num_pages: pages,
                    eps: 1e-5,
                    qk_eps: 1e-6,
                    scratch: None,
                };
                let mut config = a.config();
                let scratch = (parts > 1).then(|| {
                    let words =
                        split::head_scratch_words(config.grid, rows, features as u64).unwrap();
                    let ptr = backend.alloc(SLOT_BYTES).unwrap();
                    backend.copy_h2d(ptr, &vec![0u8; SLOT_BYTES]).unwrap();
                    Buf::new(ptr, words * 4)
                });
                config.grid[1] *= parts;
                let a = QkvRopeKv { scratch, ..a };
                let entry = if ahead {
                    QKV_ROPE_KV_AHEAD
                } else {
                    QKV_ROPE_KV
                };
                run(backend, &a.launch_with(entry, config));
                if let Some(s) = scratch {
                    counters_are_zero(
                        backend,
                        s,
                        &format!("qkv_rope_kv rows {rows}, {parts} parts"),
                    );
                }
                [q_out, sum, cache].map(|b| download(backend, b.ptr, b.bytes))
            };
            let want = launch_with(&mut backend, 1, false);
            assert!(want[0].iter().any(|b| *b != 0), "rows {rows}: q all zero");
            assert_eq!(all_heads, 5);
            for (parts, ahead) in [(1u32, true), (2, false), (3, false), (8, false), (8, true)] {
                let got = launch_with(&mut backend, parts, ahead);
                for (what, (g, w)) in ["q", "h_out", "cache"].iter().zip(got.iter().zip(&want)) {
                    assert_eq!(
                        g, w,
                        "qkv_rope_kv {what}: rows {rows}, k {k}, qk-norm {qk}, {parts} parts, \
                         ahead {ahead}"
                    );
                }
            }
        }
    }
}

/// A counter left set by an aborted grid (a split that counted in and never finished): the
/// next split launch merges too early and stores wrong bytes; with the step's
/// `gemv::counters_reset` before it (the first launch of every program) it stores the classic
/// bytes again. Every other word of the slot keeps its bytes through the reset.
#[test]
fn a_poisoned_counter_is_cleared_by_the_step_reset() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let (rows, k, n) = (1u32, 3000u32, 37u32);
    let tile = RowTile::for_rows(rows);
    let lm = AddNormLmHead {
        h: upload(&mut backend, &f32_values(rows * k, 5.0)),
        d: upload(&mut backend, &bf16_values(rows * k, 6.0)),
        wn: upload(&mut backend, &bf16_values(k, 7.0)),
        w: upload(&mut backend, &bf16_values(n * k, 2.0)),
        logits: out(&mut backend, rows * n * 4),
        want: None,
        rows,
        k,
        vocab: n,
        eps: 1e-6,
        scratch: None,
    };
    run(&mut backend, &lm.launch(ADD_NORM_LM_HEAD));
    let want = download(&mut backend, lm.logits.ptr, lm.logits.bytes);

    let mut config = stream_config(n as u64, rows, k, tile);
    config.grid[2] = 2;
    let scratch = slot(&mut backend, config.grid, n, rows, k, 1);
    let whole = Buf::new(scratch.ptr, SLOT_BYTES);
    // Every counter as if one split had counted in, every partial stale (0x7f7f7f7f).
    let poison = |backend: &mut CpuBackend| {
        let mut bytes: Vec<u8> = (0..COUNTERS).flat_map(|_| 1u32.to_le_bytes()).collect();
        bytes.resize(SLOT_BYTES, 0x7f);
        backend.copy_h2d(scratch.ptr, &bytes).unwrap();
    };
    let split = |backend: &mut CpuBackend| {
        let logits = out(backend, rows * n * 4);
        let a = AddNormLmHead {
            logits,
            want: None,
            scratch: Some(scratch),
            ..lm
        };
        run(
            backend,
            &a.launch_with(ADD_NORM_LM_HEAD_STREAM[tile.index()], config),
        );
        download(backend, logits.ptr, logits.bytes)
    };
    assert_eq!(split(&mut backend), want, "a clean slot");

    poison(&mut backend);
    assert_ne!(
        split(&mut backend),
        want,
        "a poisoned counter merges too early"
    );

    poison(&mut backend);
    let partials = download(
        &mut backend,
        scratch.ptr.offset(COUNTERS * 4),
        SLOT_BYTES - COUNTERS * 4,
    );
    let reset = CountersReset {
        attn: None,
        attn_count: 0,
        attn_stride: 0,
        ofold: None,
        ofold_count: 0,
        ofold_stride: 0,
        gemv: Some(whole),
        gemv_slots: 1,
        gemv_stride: (SLOT_BYTES / 4) as u32,
    };
    run(&mut backend, &reset.launch(COUNTERS_RESET));
    counters_are_zero(&mut backend, scratch, "after the reset");
    assert_eq!(
        download(
            &mut backend,
            scratch.ptr.offset(COUNTERS * 4),
            SLOT_BYTES - COUNTERS * 4
        ),
        partials,
        "the reset touches only the counters"
    );
    assert_eq!(split(&mut backend), want, "the reset clears the poison");
    counters_are_zero(&mut backend, scratch, "after the split launch");
    // Shadow mode: the reset's twin and its CUDA source wrote the same bytes.
    let parity = &backend.emulation().unwrap().report()["gemv::counters_reset"];
    assert_eq!((parity.launches, parity.identical), (1, 1), "{parity:?}");
}
