//! The twins' arithmetic against naive f64 implementations, hand-checkable attention cases,
//! and results independent of the host thread count.

mod twins_support;

use half::bf16;
use solder_model_layers::kernels::{act, attn, gemv, norm, rope, Launch};
use solder_model_layers::numerics::{
    axpy_bf16, dot_bf16, dot_bf16_lanes, sum_squares_bf16, sum_squares_f32, to_f32,
};
use twins_support::{
    attn_scratch, bits_bf16, bits_f32, f64s, poison_bf16, poison_f32, rd, run, run_threads, wr, Rng,
};

fn b(x: f32) -> bf16 {
    bf16::from_f32(x)
}

/// |got − want| ≤ rel·|want| + abs for every element.
fn assert_close(got: &[f64], want: &[f64], rel: f64, abs: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * w.abs() + abs,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

#[test]
fn reductions_match_f64_for_every_tail_length() {
    let mut rng = Rng::new(10);
    for len in [0, 1, 5, 15, 16, 17, 31, 33, 100, 257] {
        let (a, c) = (rng.bf16s(len, 1.0), rng.bf16s(len, 1.0));
        let want: f64 = a.iter().zip(&c).map(|(x, y)| x.to_f64() * y.to_f64()).sum();
        assert_close(
            &[dot_bf16(&a, &c) as f64],
            &[want],
            1e-5,
            1e-5,
            &format!("dot len {len}"),
        );
        // The run-time dispatched path (AVX2 where present) gives the definition's bits.
        assert_eq!(
            dot_bf16(&a, &c).to_bits(),
            dot_bf16_lanes(&a, &c).to_bits(),
            "dot len {len}"
        );
        let mut acc: Vec<f32> = rng.f32s(len, 1.0);
        let expected: Vec<u32> = acc
            .iter()
            .zip(&a)
            .map(|(s, x)| (s + 0.75 * to_f32(*x)).to_bits())
            .collect();
        axpy_bf16(&mut acc, 0.75, &a);
        assert_eq!(
            acc.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            expected,
            "axpy len {len}"
        );
        let widened: Vec<f32> = a.iter().map(|x| to_f32(*x)).collect();
        assert_eq!(
            sum_squares_bf16(&a).to_bits(),
            sum_squares_f32(&widened).to_bits()
        );
        let ss: f64 = a.iter().map(|x| x.to_f64() * x.to_f64()).sum();
        assert_close(
            &[sum_squares_f32(&widened) as f64],
            &[ss],
            1e-5,
            1e-6,
            "sum of squares",
        );
    }
}

#[test]
fn rms_norm_matches_f64() {
    let mut rng = Rng::new(11);
    let (rows, hidden, eps) = (3, 100, 1e-5f32);
    let (x, w) = (rng.f32s(rows * hidden, 3.0), rng.bf16s(hidden, 2.0));
    let mut out = poison_bf16(rows * hidden);
    run(norm::RmsNorm {
        x: rd(&x),
        w: rd(&w),
        out: wr(&mut out),
        rows: rows as u32,
        hidden: hidden as u32,
        eps,
    }
    .launch(norm::RMS_NORM));
    let mut want = Vec::new();
    for row in x.chunks(hidden) {
        let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / hidden as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        want.extend(
            row.iter()
                .zip(&w)
                .map(|(v, g)| *v as f64 * inv * g.to_f64()),
        );
    }
    assert_close(&f64s(&out), &want, 1.0 / 128.0, 1e-6, "rms_norm");
}

#[test]
fn linear_and_lm_head_match_f64() {
    let mut rng = Rng::new(12);
    let (rows, k, n) = (3, 70, 20);
    let (x, w, bias) = (
        rng.bf16s(rows * k, 1.0),
        rng.bf16s(n * k, 0.3),
        rng.bf16s(n, 1.0),
    );
    let naive = |with_bias: bool| -> Vec<f64> {
        let mut y = Vec::new();
        for r in 0..rows {
            for o in 0..n {
                let dot: f64 = (0..k)
                    .map(|i| x[r * k + i].to_f64() * w[o * k + i].to_f64())
                    .sum();
                y.push(dot + if with_bias { bias[o].to_f64() } else { 0.0 });
            }
        }
        y
    };
    let mut y = poison_bf16(rows * n);
    run(gemv::Linear {
        x: rd(&x),
        w: rd(&w),
        bias: Some(rd(&bias)),
        y: wr(&mut y),
        rows: rows as u32,
        k: k as u32,
        n_out: n as u32,
        scratch: None,
    }
    .launch(gemv::LINEAR));
    assert_close(
        &f64s(&y),
        &naive(true),
        1.0 / 128.0,
        1e-4,
        "linear with bias",
    );
    let mut logits = poison_f32(rows * n);
    run(gemv::LmHead {
        x: rd(&x),
        w: rd(&w),
        logits: wr(&mut logits),
        want: None,
        rows: rows as u32,
        k: k as u32,
        vocab: n as u32,
        scratch: None,
    }
    .launch(gemv::LM_HEAD));
    let got: Vec<f64> = logits.iter().map(|v| *v as f64).collect();
    assert_close(&got, &naive(false), 1e-5, 1e-5, "lm_head");
}

#[test]
fn silu_mul_matches_f64() {
    let mut rng = Rng::new(13);
    let (g, u) = (rng.bf16s(64, 6.0), rng.bf16s(64, 2.0));
    let mut out = poison_bf16(64);
    run(act::Gated {
        a: rd(&g),
        b: rd(&u),
        out: wr(&mut out),
        rows: 2,
        width: 32,
    }
    .launch(act::SILU_MUL));
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(g, u)| g.to_f64() / (1.0 + (-g.to_f64()).exp()) * u.to_f64())
        .collect();
    assert_close(&f64s(&out), &want, 1.0 / 128.0, 1e-6, "silu_mul");
}

#[test]
fn rope_rotates_by_a_known_angle_and_copies_the_rest() {
    // head_dim 6, rotary_dim 4: pairs (0, 2) and (1, 3) rotate; dims 4 and 5 are copied.
    let half_pi = std::f32::consts::FRAC_PI_2;
    let inv_freq = [half_pi, half_pi / 3.0, 1.0]; // position 1: 90° and 30°; scaling 1
    let q: Vec<bf16> = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0].map(b).to_vec();
    let k: Vec<bf16> = [0.5, -1.0, 0.25, 2.0, 7.0, -7.0].map(b).to_vec();
    let (mut qo, mut ko) = (poison_bf16(6), poison_bf16(6));
    run(rope::Rope {
        q: rd(&q),
        k: rd(&k),
        positions: rd(&[1i32]),
        inv_freq: rd(&inv_freq),
        q_out: wr(&mut qo),
        k_out: wr(&mut ko),
        rows: 1,
        heads: 1,
        kv_heads: 1,
        head_dim: 6,
        rotary_dim: 4,
    }
    .launch(rope::ROPE));
    let rotate = |x: &[bf16]| -> Vec<f64> {
        let x = f64s(x);
        let (c0, s0) = (0.0, 1.0);
        let (c1, s1) = ((std::f64::consts::PI / 6.0).cos(), 0.5);
        vec![
            x[0] * c0 - x[2] * s0,
            x[1] * c1 - x[3] * s1,
            x[2] * c0 + x[0] * s0,
            x[3] * c1 + x[1] * s1,
            x[4],
            x[5],
        ]
    };
    assert_close(&f64s(&qo), &rotate(&q), 1.0 / 128.0, 1e-6, "rope q");
    assert_close(&f64s(&ko), &rotate(&k), 1.0 / 128.0, 1e-6, "rope k");
    assert_eq!(bits_bf16(&qo[4..]), bits_bf16(&q[4..]));
}

#[test]
fn rope_scales_cos_and_sin_by_the_tables_last_entry() {
    // YaRN's attention scaling: the rotated dims come out scaled, the rest are copied.
    let half_pi = std::f32::consts::FRAC_PI_2;
    let q: Vec<bf16> = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0].map(b).to_vec();
    let k: Vec<bf16> = [0.5, -1.0, 0.25, 2.0, 7.0, -7.0].map(b).to_vec();
    let roped = |scaling: f32| {
        let inv_freq = [half_pi, half_pi / 3.0, scaling];
        let (mut qo, mut ko) = (poison_bf16(6), poison_bf16(6));
        run(rope::Rope {
            q: rd(&q),
            k: rd(&k),
            positions: rd(&[1i32]),
            inv_freq: rd(&inv_freq),
            q_out: wr(&mut qo),
            k_out: wr(&mut ko),
            rows: 1,
            heads: 1,
            kv_heads: 1,
            head_dim: 6,
            rotary_dim: 4,
        }
        .launch(rope::ROPE));
        (f64s(&qo), f64s(&ko))
    };
    let (q1, k1) = roped(1.0);
    let (q2, k2) = roped(2.0);
    for (one, two) in [(&q1, &q2), (&k1, &k2)] {
        let doubled: Vec<f64> = one[..4].iter().map(|x| 2.0 * x).collect();
        // ×2 is exact in f32 and in bf16: the same bits, doubled.
        assert_eq!(&two[..4], &doubled[..]);
        assert_eq!(&two[4..], &one[4..]);
    }
}

/// A cache `[pages][2][block][kv_heads][head_dim]` with every token's k and v given.
fn cache_with(
    pages: usize,
    block: usize,
    kv_heads: usize,
    d: usize,
    put: &[(usize, usize, Vec<f32>, Vec<f32>)],
) -> Vec<bf16> {
    let mut cache = vec![b(0.0); pages * 2 * block * kv_heads * d];
    for (slot, kvh, k, v) in put {
        let (page, off) = (slot / block, slot % block);
        for (part, src) in [(0, k), (1, v)] {
            let at = (((page * 2 + part) * block + off) * kv_heads + kvh) * d;
            for (i, x) in src.iter().enumerate() {
                cache[at + i] = b(*x);
            }
        }
    }
    cache
}

fn attention(
    kernel: &str,
    q: &[bf16],
    cache: &[bf16],
    tables: &[i32],
    lens: &[i32],
    dims: [usize; 6],
    scale: f32,
) -> Vec<bf16> {
    windowed_attention(kernel, q, cache, tables, lens, dims, scale, 0)
}

/// `attention` with a sliding `window` (0: none).
#[allow(clippy::too_many_arguments)]
fn windowed_attention(
    kernel: &str,
    q: &[bf16],
    cache: &[bf16],
    tables: &[i32],
    lens: &[i32],
    dims: [usize; 6],
    scale: f32,
    window: u32,
) -> Vec<bf16> {
    let [rows, heads, kv_heads, d, block, max_blocks] = dims.map(|x| x as u32);
    let pages = (cache.len() / (2 * (block * kv_heads * d) as usize)) as u32;
    let mut out = poison_bf16(q.len());
    let mut scratch = attn_scratch(rows, heads, d);
    let op = if kernel == "decode" {
        attn::PAGED_DECODE
    } else {
        attn::PAGED_CAUSAL
    };
    run(attn::PagedAttention {
        q: rd(q),
        cache: rd(cache),
        block_tables: rd(tables),
        seq_lens: rd(lens),
        gate: None,
        out: wr(&mut out),
        scratch: wr(&mut scratch),
        rows,
        heads,
        kv_heads,
        head_dim: d,
        block_size: block,
        max_blocks,
        num_pages: pages,
        window,
        scale,
    }
    .launch(op));
    out
}

#[test]
fn a_windowed_row_attends_to_its_last_window_tokens_only() {
    // block_size 1: token j on page tables[j]. A row of 9 tokens under a window of 3 is the
    // row of its last 3 tokens without one; its first 6 pages are never read, not even checked
    // (-1 there is no page).
    let (d, pages) = (8, 12);
    let mut rng = Rng::new(7);
    let cache = rng.bf16s(pages * 2 * d, 1.0);
    let q = rng.bf16s(d, 1.0);
    let tables: Vec<i32> = vec![5, 2, 9, 1, 11, 3, 7, 4, 10];
    let mut hidden = tables.clone();
    hidden[..6].fill(-1);
    for kernel in ["decode", "causal"] {
        let dims = [1, 1, 1, d, 1, 9];
        let windowed = windowed_attention(kernel, &q, &cache, &hidden, &[9], dims, 0.3, 3);
        let last: Vec<i32> = tables[6..].iter().copied().chain([0; 6]).collect();
        let alone = attention(kernel, &q, &cache, &last, &[3], dims, 0.3);
        assert_eq!(bits_bf16(&windowed), bits_bf16(&alone), "{kernel}");
        // A window at least the row's length is no window; without one, all 9 are read.
        let wide = windowed_attention(kernel, &q, &cache, &tables, &[9], dims, 0.3, 9);
        let full = attention(kernel, &q, &cache, &tables, &[9], dims, 0.3);
        assert_eq!(bits_bf16(&wide), bits_bf16(&full), "{kernel}");
        assert_ne!(bits_bf16(&full), bits_bf16(&windowed), "{kernel}");
    }
}

#[test]
fn attention_with_equal_scores_averages_the_values() {
    // One row, one head, block_size 1: token 0 on page 3, token 1 on page 1.
    let d = 4;
    let cache = cache_with(
        4,
        1,
        1,
        d,
        &[
            (3, 0, vec![1.0, 1.0, 0.0, 0.0], vec![1.0, 2.0, -4.0, 8.0]),
            (1, 0, vec![1.0, 1.0, 0.0, 0.0], vec![3.0, 4.0, 0.0, 0.5]),
        ],
    );
    let q: Vec<bf16> = [0.5, 0.25, 9.0, 9.0].map(b).to_vec();
    for kernel in ["decode", "causal"] {
        let out = attention(kernel, &q, &cache, &[3, 1], &[2], [1, 1, 1, d, 1, 2], 0.5);
        assert_eq!(f64s(&out), vec![2.0, 3.0, -2.0, 4.25], "{kernel}");
    }
}

#[test]
fn attention_maps_query_heads_to_their_kv_head() {
    // heads 4, kv_heads 2: heads 0, 1 read kv head 0, heads 2, 3 read kv head 1. seq_len 1,
    // so each output is exactly its kv head's v.
    let d = 2;
    let cache = cache_with(
        2,
        2,
        2,
        d,
        &[
            (2, 0, vec![1.0, 0.0], vec![10.0, 11.0]),
            (2, 1, vec![0.0, 1.0], vec![20.0, 21.0]),
        ],
    );
    let q: Vec<bf16> = (0..8).map(|i| b(i as f32)).collect();
    let out = attention("decode", &q, &cache, &[1, 0], &[1], [1, 4, 2, d, 2, 2], 1.0);
    assert_eq!(
        f64s(&out),
        vec![10.0, 11.0, 10.0, 11.0, 20.0, 21.0, 20.0, 21.0]
    );
}

#[test]
fn attention_matches_f64_on_random_pages() {
    let mut rng = Rng::new(14);
    let (rows, heads, kv_heads, d, block, max_blocks, pages) = (3, 4, 2, 20, 4, 5, 16);
    let q = rng.bf16s(rows * heads * d, 1.0);
    let cache = rng.bf16s(pages * 2 * block * kv_heads * d, 1.0);
    let tables: Vec<i32> = (0..rows * max_blocks)
        .map(|_| rng.below(pages) as i32)
        .collect();
    let lens = [1, 7, 20];
    let scale = 1.0 / (d as f32).sqrt();
    let out = attention(
        "causal",
        &q,
        &cache,
        &tables,
        &lens,
        [rows, heads, kv_heads, d, block, max_blocks],
        scale,
    );
    let mut want = Vec::new();
    for r in 0..rows {
        for h in 0..heads {
            let kvh = h / (heads / kv_heads);
            let at = |j: usize, part: usize| {
                (((tables[r * max_blocks + j / block] as usize * 2 + part) * block + j % block)
                    * kv_heads
                    + kvh)
                    * d
            };
            let qh = &q[(r * heads + h) * d..][..d];
            let s: Vec<f64> = (0..lens[r] as usize)
                .map(|j| {
                    (0..d)
                        .map(|i| qh[i].to_f64() * cache[at(j, 0) + i].to_f64())
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = p.iter().sum();
            want.extend((0..d).map(|i| {
                p.iter()
                    .enumerate()
                    .map(|(j, pj)| pj * cache[at(j, 1) + i].to_f64())
                    .sum::<f64>()
                    / sum
            }));
        }
    }
    assert_close(&f64s(&out), &want, 1.0 / 128.0, 1e-4, "attention");
}

// ---- thread-count independence ----------------------------------------------------------------

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let mut rng = Rng::new(15);
    let (rows, k, n, inter, vocab) = (3, 256, 1536, 1024, 6000);
    let x = rng.bf16s(rows * k, 1.0);
    let h = rng.f32s(rows * k, 2.0);
    let res = rng.f32s(rows * n, 2.0);
    let (w, bias, wn) = (rng.bf16s(n * k, 0.2), rng.bf16s(n, 0.5), rng.bf16s(k, 1.5));
    let (wg, wu) = (rng.bf16s(inter * k, 0.2), rng.bf16s(inter * k, 0.2));
    let wl = rng.bf16s(vocab * k, 0.2);
    let (r, k32) = (rows as u32, k as u32);
    let check_bf16 =
        |what: &str, len: usize, build: &dyn Fn(solder_model_layers::kernels::Buf) -> Launch| {
            let runs: Vec<Vec<u16>> = [1, 2, 4]
                .iter()
                .map(|t| {
                    let mut out = poison_bf16(len);
                    run_threads(&build(wr(&mut out)), *t).unwrap();
                    bits_bf16(&out)
                })
                .collect();
            assert!(runs[0] == runs[1] && runs[0] == runs[2], "{what}");
        };
    let check_f32 =
        |what: &str, len: usize, build: &dyn Fn(solder_model_layers::kernels::Buf) -> Launch| {
            let runs: Vec<Vec<u32>> = [1, 2, 4]
                .iter()
                .map(|t| {
                    let mut out = poison_f32(len);
                    run_threads(&build(wr(&mut out)), *t).unwrap();
                    bits_f32(&out)
                })
                .collect();
            assert!(runs[0] == runs[1] && runs[0] == runs[2], "{what}");
        };
    check_bf16("linear", rows * n, &|y| {
        gemv::Linear {
            x: rd(&x),
            w: rd(&w),
            bias: Some(rd(&bias)),
            y,
            rows: r,
            k: k32,
            n_out: n as u32,
            scratch: None,
        }
        .launch(gemv::LINEAR)
    });
    check_bf16("norm_linear", rows * n, &|y| {
        gemv::NormLinear {
            h: rd(&h),
            wn: rd(&wn),
            w: rd(&w),
            bias: None,
            y,
            rows: r,
            k: k32,
            n_out: n as u32,
            eps: 1e-6,
            scratch: None,
        }
        .launch(gemv::NORM_LINEAR)
    });
    check_bf16("gate_up_silu", rows * inter, &|y| {
        gemv::GateUpSilu {
            x: rd(&x),
            wg: rd(&wg),
            wu: rd(&wu),
            act: y,
            rows: r,
            k: k32,
            inter: inter as u32,
            scratch: None,
        }
        .launch(gemv::GATE_UP_SILU)
    });
    check_f32("linear_residual_add", rows * n, &|y| {
        gemv::LinearResidualAdd {
            x: rd(&x),
            w: rd(&w),
            bias: None,
            h: rd(&res),
            h_out: y,
            rows: r,
            k: k32,
            n_out: n as u32,
            scratch: None,
        }
        .launch(gemv::LINEAR_RESIDUAL_ADD)
    });
    check_f32("lm_head", rows * vocab, &|y| {
        gemv::LmHead {
            x: rd(&x),
            w: rd(&wl),
            logits: y,
            want: None,
            rows: r,
            k: k32,
            vocab: vocab as u32,
            scratch: None,
        }
        .launch(gemv::LM_HEAD)
    });
    check_f32("lm_head one row", vocab, &|y| {
        gemv::LmHead {
            x: rd(&x[..k]),
            w: rd(&wl),
            logits: y,
            want: None,
            rows: 1,
            k: k32,
            vocab: vocab as u32,
            scratch: None,
        }
        .launch(gemv::LM_HEAD)
    });
    // q/k/v: one split across the three matrices.
    let (nq, nkv) = (1024, 256);
    let (wq, wk, wv) = (
        rng.bf16s(nq * k, 0.2),
        rng.bf16s(nkv * k, 0.2),
        rng.bf16s(nkv * k, 0.2),
    );
    let qkv_runs: Vec<(Vec<u16>, Vec<u16>, Vec<u16>)> = [1, 2, 4]
        .iter()
        .map(|t| {
            let (mut q, mut kk, mut v) = (
                poison_bf16(rows * nq),
                poison_bf16(rows * nkv),
                poison_bf16(rows * nkv),
            );
            let launch = gemv::Qkv {
                x: rd(&x),
                wq: rd(&wq),
                bq: None,
                wk: rd(&wk),
                bk: None,
                wv: rd(&wv),
                bv: None,
                q: wr(&mut q),
                k_out: wr(&mut kk),
                v: wr(&mut v),
                rows: r,
                k: k32,
                nq: nq as u32,
                nkv: nkv as u32,
                scratch: None,
            }
            .launch(gemv::QKV);
            run_threads(&launch, *t).unwrap();
            (bits_bf16(&q), bits_bf16(&kk), bits_bf16(&v))
        })
        .collect();
    assert!(
        qkv_runs[0] == qkv_runs[1] && qkv_runs[0] == qkv_runs[2],
        "qkv"
    );

    // Attention: 4 rows × 8 heads over 1000 tokens of head_dim 64.
    let (heads, kv_heads, d, block, max_blocks, pages) = (8, 2, 64, 16, 64, 256);
    let q = rng.bf16s(4 * heads * d, 1.0);
    let cache = rng.bf16s(pages * 2 * block * kv_heads * d, 1.0);
    let tables: Vec<i32> = (0..4 * max_blocks)
        .map(|_| rng.below(pages) as i32)
        .collect();
    let lens = [1000, 3, 1024, 517];
    let mut scratch = attn_scratch(4, heads as u32, d as u32);
    let scratch = wr(&mut scratch);
    check_bf16("paged_decode", q.len(), &|o| {
        attn::PagedAttention {
            q: rd(&q),
            cache: rd(&cache),
            block_tables: rd(&tables),
            seq_lens: rd(&lens),
            gate: None,
            out: o,
            scratch,
            rows: 4,
            heads: heads as u32,
            kv_heads: kv_heads as u32,
            head_dim: d as u32,
            block_size: block as u32,
            max_blocks: max_blocks as u32,
            num_pages: pages as u32,
            window: 0,
            scale: 0.125,
        }
        .launch(attn::PAGED_DECODE)
    });
}
