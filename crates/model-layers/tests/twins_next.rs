//! The Qwen3-Next twins outside `gdn`: the zero-centred norms against f64 and (fused) against
//! the reference twins byte for byte, the gated q split's layout, the sigmoid gates' values.

mod twins_support;

use half::bf16;
use solder_gpu_runtime::GpuError;
use solder_model_layers::kernels::{act, add, attn, moe, norm, Launch};
use twins_support::{bits_bf16, bits_f32, poison_bf16, poison_f32, rd, run, run_threads, wr, Rng};

const EPS: f32 = 1e-6;
const HIDDEN: usize = 72; // not a multiple of the 16 lanes: the tail is exercised

/// |got − want| within bf16 rounding (plus f32 noise) of every element.
fn assert_close(got: &[bf16], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f64();
        assert!(
            (g - w).abs() <= 1e-2 * w.abs() + 1e-4,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Zero-centred RMSNorm of one row in f64.
fn naive_norm_zc(x: &[f64], w: &[bf16], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, g)| v * inv * (1.0 + g.to_f64()))
        .collect()
}

fn rms_norm_zc(x: &[f32], w: &[bf16], rows: usize) -> Vec<bf16> {
    let mut out = poison_bf16(x.len());
    run(norm::RmsNorm {
        x: rd(x),
        w: rd(w),
        out: wr(&mut out),
        rows: rows as u32,
        hidden: HIDDEN as u32,
        eps: EPS,
    }
    .launch(norm::RMS_NORM_ZC));
    out
}

#[test]
fn rms_norm_zc_matches_f64() {
    let mut rng = Rng::new(1);
    let rows = 3;
    let (x, w) = (rng.f32s(rows * HIDDEN, 2.0), rng.bf16s(HIDDEN, 0.5));
    let out = rms_norm_zc(&x, &w, rows);
    let want: Vec<f64> = x
        .chunks_exact(HIDDEN)
        .flat_map(|row| {
            let row: Vec<f64> = row.iter().map(|v| *v as f64).collect();
            naive_norm_zc(&row, &w, EPS as f64)
        })
        .collect();
    assert_close(&out, &want, "rms_norm_zc");
    // A zero weight is the identity scale (1 + 0), unlike plain RMSNorm.
    let zero = vec![bf16::ZERO; HIDDEN];
    let unit = rms_norm_zc(&x, &zero, rows);
    let mut plain = poison_bf16(x.len());
    let ones = vec![bf16::ONE; HIDDEN];
    run(norm::RmsNorm {
        x: rd(&x),
        w: rd(&ones),
        out: wr(&mut plain),
        rows: rows as u32,
        hidden: HIDDEN as u32,
        eps: EPS,
    }
    .launch(norm::RMS_NORM));
    assert_eq!(bits_bf16(&unit), bits_bf16(&plain));
}

#[test]
fn add_rms_norm_zc_equals_residual_add_then_rms_norm_zc() {
    let mut rng = Rng::new(2);
    for rows in [1usize, 3] {
        let n = rows * HIDDEN;
        let (h, x, w) = (rng.f32s(n, 2.0), rng.bf16s(n, 1.0), rng.bf16s(HIDDEN, 0.5));
        let mut sum = poison_f32(n);
        run(add::ResidualAdd {
            h: rd(&h),
            x: rd(&x),
            out: wr(&mut sum),
            rows: rows as u32,
            hidden: HIDDEN as u32,
        }
        .launch(add::RESIDUAL_ADD));
        let want = rms_norm_zc(&sum, &w, rows);
        for keep_sum in [false, true] {
            let (mut h_out, mut out) = (poison_f32(n), poison_bf16(n));
            let h_out_buf = if keep_sum { Some(wr(&mut h_out)) } else { None };
            run(norm::AddRmsNorm {
                h: rd(&h),
                x: rd(&x),
                w: rd(&w),
                h_out: h_out_buf,
                out: wr(&mut out),
                rows: rows as u32,
                hidden: HIDDEN as u32,
                eps: EPS,
            }
            .launch(norm::ADD_RMS_NORM_ZC));
            let what = format!("rows {rows} h_out {keep_sum}");
            assert_eq!(bits_bf16(&out), bits_bf16(&want), "{what}: out");
            if keep_sum {
                assert_eq!(bits_f32(&h_out), bits_f32(&sum), "{what}: h_out");
            }
        }
    }
}

#[test]
fn qk_norm_zc_matches_f64_per_head() {
    let mut rng = Rng::new(3);
    let (rows, heads, kv_heads, d) = (2usize, 4usize, 2usize, 20usize);
    let q = rng.bf16s(rows * heads * d, 2.0);
    let k = rng.bf16s(rows * kv_heads * d, 2.0);
    let (wq, wk) = (rng.bf16s(d, 0.5), rng.bf16s(d, 0.5));
    let (mut q_out, mut k_out) = (poison_bf16(q.len()), poison_bf16(k.len()));
    run(norm::QkNorm {
        q: rd(&q),
        k: rd(&k),
        wq: rd(&wq),
        wk: rd(&wk),
        q_out: wr(&mut q_out),
        k_out: wr(&mut k_out),
        rows: rows as u32,
        heads: heads as u32,
        kv_heads: kv_heads as u32,
        head_dim: d as u32,
        eps: EPS,
    }
    .launch(norm::QK_NORM_ZC));
    let naive = |x: &[bf16], w: &[bf16]| -> Vec<f64> {
        x.chunks_exact(d)
            .flat_map(|head| {
                let head: Vec<f64> = head.iter().map(|v| v.to_f64()).collect();
                naive_norm_zc(&head, w, EPS as f64)
            })
            .collect()
    };
    assert_close(&q_out, &naive(&q, &wq), "q");
    assert_close(&k_out, &naive(&k, &wk), "k");
}

#[test]
fn gate_split_takes_each_heads_halves() {
    let (rows, heads, d) = (2usize, 3usize, 4usize);
    // q2[r][h][j] = r·100 + h·10 + j (j < 2d): q gets j < d, the gate j ≥ d.
    let q2: Vec<bf16> = (0..rows * heads * 2 * d)
        .map(|i| {
            let (r, h, j) = (i / (heads * 2 * d), i / (2 * d) % heads, i % (2 * d));
            bf16::from_f32((r * 100 + h * 10 + j) as f32)
        })
        .collect();
    let (mut q, mut gate) = (poison_bf16(rows * heads * d), poison_bf16(rows * heads * d));
    run(attn::GateSplit {
        q2: rd(&q2),
        q: wr(&mut q),
        gate: wr(&mut gate),
        rows: rows as u32,
        heads: heads as u32,
        head_dim: d as u32,
    }
    .launch(attn::GATE_SPLIT));
    for r in 0..rows {
        for h in 0..heads {
            for j in 0..d {
                let at = (r * heads + h) * d + j;
                let base = (r * 100 + h * 10) as f32;
                assert_eq!(q[at].to_f32(), base + j as f32, "q[{r}][{h}][{j}]");
                assert_eq!(
                    gate[at].to_f32(),
                    base + (d + j) as f32,
                    "gate[{r}][{h}][{j}]"
                );
            }
        }
    }
}

#[test]
fn sigmoid_mul_values() {
    let mut rng = Rng::new(4);
    let (rows, width) = (3usize, 40usize);
    let (mut x, mut gate) = (rng.bf16s(rows * width, 3.0), rng.bf16s(rows * width, 6.0));
    // sigmoid(0) = 1/2 exactly.
    x[0] = bf16::from_f32(3.0);
    gate[0] = bf16::ZERO;
    let mut out = poison_bf16(x.len());
    run(act::Gated {
        a: rd(&x),
        b: rd(&gate),
        out: wr(&mut out),
        rows: rows as u32,
        width: width as u32,
    }
    .launch(act::SIGMOID_MUL));
    assert_eq!(out[0].to_f32(), 1.5);
    let want: Vec<f64> = x
        .iter()
        .zip(&gate)
        .map(|(x, g)| x.to_f64() * sigmoid(g.to_f64()))
        .collect();
    assert_close(&out, &want, "sigmoid_mul");
}

#[test]
fn combine_shared_values() {
    let mut rng = Rng::new(5);
    let (rows, hidden) = (3usize, 40usize);
    let (routed, shared) = (rng.bf16s(rows * hidden, 2.0), rng.bf16s(rows * hidden, 2.0));
    let mut gate = rng.bf16s(rows, 4.0);
    gate[1] = bf16::ZERO;
    let mut out = poison_bf16(routed.len());
    run(moe::CombineShared {
        routed: rd(&routed),
        shared: rd(&shared),
        gate: rd(&gate),
        out: wr(&mut out),
        rows: rows as u32,
        hidden: hidden as u32,
    }
    .launch(moe::COMBINE_SHARED));
    let want: Vec<f64> = (0..rows * hidden)
        .map(|i| routed[i].to_f64() + sigmoid(gate[i / hidden].to_f64()) * shared[i].to_f64())
        .collect();
    // Cancellation in routed + shared can leave a tiny result: compare against the inputs' scale.
    for (i, (g, w)) in out.iter().zip(&want).enumerate() {
        assert!(
            (g.to_f64() - w).abs() <= 2e-2,
            "combine_shared[{i}]: {g} vs {w}"
        );
    }
    // Row 1 (gate 0): routed + shared / 2, rounded once.
    for j in 0..hidden {
        let at = hidden + j;
        let exact = routed[at].to_f32() + 0.5 * shared[at].to_f32();
        assert_eq!(
            out[at].to_bits(),
            bf16::from_f32(exact).to_bits(),
            "row 1 [{j}]"
        );
    }
}

fn refused(launch: Launch, index: usize) {
    let err = run_threads(&launch, 2).expect_err("the launch should be refused");
    assert!(err.to_string().contains(launch.kernel), "{err}");
    assert!(
        matches!(err, GpuError::BadArgument { index: i, .. } if i == index),
        "{err:?}"
    );
}

#[test]
fn wrong_lengths_are_refused() {
    let mut rng = Rng::new(6);
    let (x, w, short_w) = (
        rng.f32s(2 * HIDDEN, 1.0),
        rng.bf16s(HIDDEN, 1.0),
        rng.bf16s(HIDDEN - 1, 1.0),
    );
    let mut out = poison_bf16(2 * HIDDEN);
    refused(
        norm::RmsNorm {
            x: rd(&x),
            w: rd(&short_w),
            out: wr(&mut out),
            rows: 2,
            hidden: HIDDEN as u32,
            eps: EPS,
        }
        .launch(norm::RMS_NORM_ZC),
        1,
    );
    let xb = rng.bf16s(2 * HIDDEN, 1.0);
    let mut h_out = poison_f32(2 * HIDDEN - 1);
    refused(
        norm::AddRmsNorm {
            h: rd(&x),
            x: rd(&xb),
            w: rd(&w),
            h_out: Some(wr(&mut h_out)),
            out: wr(&mut out),
            rows: 2,
            hidden: HIDDEN as u32,
            eps: EPS,
        }
        .launch(norm::ADD_RMS_NORM_ZC),
        3,
    );
    let q2 = rng.bf16s(2 * 3 * 8 - 1, 1.0);
    let (mut q, mut gate) = (poison_bf16(2 * 3 * 4), poison_bf16(2 * 3 * 4));
    refused(
        attn::GateSplit {
            q2: rd(&q2),
            q: wr(&mut q),
            gate: wr(&mut gate),
            rows: 2,
            heads: 3,
            head_dim: 4,
        }
        .launch(attn::GATE_SPLIT),
        0,
    );
    let short_gate = rng.bf16s(1, 1.0);
    refused(
        moe::CombineShared {
            routed: rd(&xb),
            shared: rd(&xb),
            gate: rd(&short_gate),
            out: wr(&mut out),
            rows: 2,
            hidden: HIDDEN as u32,
        }
        .launch(moe::COMBINE_SHARED),
        2,
    );
    assert!(out.iter().all(|v| v.is_nan()), "a refused launch wrote");
}
