//! Every fused gemv/norm twin gives the same bytes as the reference twins it replaces, run in
//! sequence.

mod twins_support;

use half::bf16;
use solder_model_layers::kernels::{act, add, gemv, norm};
use twins_support::{bits_bf16, bits_f32, poison_bf16, poison_f32, rd, run, wr, Rng};

const EPS: f32 = 1e-6;
const K: usize = 72; // not a multiple of the 16 lanes: the tail is exercised
const NQ: usize = 48;
const NKV: usize = 24;
const INTER: usize = 56;
const VOCAB: usize = 50;
const ROWS: [usize; 3] = [1, 3, 8];

// ---- the reference twins, one launch each ---------------------------------------------------

fn ref_residual_add(h: &[f32], x: &[bf16], rows: usize, hidden: usize) -> Vec<f32> {
    let mut out = poison_f32(rows * hidden);
    run(add::ResidualAdd {
        h: rd(h),
        x: rd(x),
        out: wr(&mut out),
        rows: rows as u32,
        hidden: hidden as u32,
    }
    .launch(add::RESIDUAL_ADD));
    out
}

fn ref_rms_norm(x: &[f32], w: &[bf16], rows: usize, hidden: usize) -> Vec<bf16> {
    let mut out = poison_bf16(rows * hidden);
    run(norm::RmsNorm {
        x: rd(x),
        w: rd(w),
        out: wr(&mut out),
        rows: rows as u32,
        hidden: hidden as u32,
        eps: EPS,
    }
    .launch(norm::RMS_NORM));
    out
}

fn ref_linear(x: &[bf16], w: &[bf16], bias: Option<&[bf16]>, rows: usize, n: usize) -> Vec<bf16> {
    let mut y = poison_bf16(rows * n);
    let k = x.len() / rows;
    run(gemv::Linear {
        x: rd(x),
        w: rd(w),
        bias: bias.map(rd),
        y: wr(&mut y),
        rows: rows as u32,
        k: k as u32,
        n_out: n as u32,
        scratch: None,
    }
    .launch(gemv::LINEAR));
    y
}

fn ref_lm_head(x: &[bf16], w: &[bf16], rows: usize, vocab: usize) -> Vec<f32> {
    let mut y = poison_f32(rows * vocab);
    let k = x.len() / rows;
    run(gemv::LmHead {
        x: rd(x),
        w: rd(w),
        logits: wr(&mut y),
        want: None,
        rows: rows as u32,
        k: k as u32,
        vocab: vocab as u32,
        scratch: None,
    }
    .launch(gemv::LM_HEAD));
    y
}

fn ref_silu_mul(g: &[bf16], u: &[bf16], rows: usize) -> Vec<bf16> {
    let mut out = poison_bf16(g.len());
    run(act::Gated {
        a: rd(g),
        b: rd(u),
        out: wr(&mut out),
        rows: rows as u32,
        width: (g.len() / rows) as u32,
    }
    .launch(act::SILU_MUL));
    out
}

/// Weights of a q/k/v triple with optional biases.
struct Qkv {
    wq: Vec<bf16>,
    wk: Vec<bf16>,
    wv: Vec<bf16>,
    bq: Option<Vec<bf16>>,
    bk: Option<Vec<bf16>>,
    bv: Option<Vec<bf16>>,
}

impl Qkv {
    fn new(rng: &mut Rng, biased: bool) -> Qkv {
        let mut bias = |n| {
            if biased {
                Some(rng.bf16s(n, 0.5))
            } else {
                None
            }
        };
        let (bq, bk, bv) = (bias(NQ), bias(NKV), bias(NKV));
        Qkv {
            wq: rng.bf16s(NQ * K, 0.2),
            wk: rng.bf16s(NKV * K, 0.2),
            wv: rng.bf16s(NKV * K, 0.2),
            bq,
            bk,
            bv,
        }
    }

    fn reference(&self, x: &[bf16], rows: usize) -> [Vec<bf16>; 3] {
        [
            ref_linear(x, &self.wq, self.bq.as_deref(), rows, NQ),
            ref_linear(x, &self.wk, self.bk.as_deref(), rows, NKV),
            ref_linear(x, &self.wv, self.bv.as_deref(), rows, NKV),
        ]
    }
}

fn outputs(rows: usize) -> [Vec<bf16>; 3] {
    [
        poison_bf16(rows * NQ),
        poison_bf16(rows * NKV),
        poison_bf16(rows * NKV),
    ]
}

fn assert_same(fused: &[Vec<bf16>; 3], reference: &[Vec<bf16>; 3], what: &str) {
    for (i, (f, r)) in fused.iter().zip(reference).enumerate() {
        assert_eq!(bits_bf16(f), bits_bf16(r), "{what}: output {i}");
    }
}

#[test]
fn qkv_family_matches_add_norm_and_three_linears() {
    let mut rng = Rng::new(1);
    for rows in ROWS {
        for biased in [false, true] {
            let p = Qkv::new(&mut rng, biased);
            let (h, d, wn) = (
                rng.f32s(rows * K, 2.0),
                rng.bf16s(rows * K, 1.0),
                rng.bf16s(K, 1.5),
            );
            let x = rng.bf16s(rows * K, 1.0);
            let what = format!("rows {rows} bias {biased}");
            let (r32, rb) = (rows as u32, |b: &Option<Vec<bf16>>| b.as_deref().map(rd));

            let mut o = outputs(rows);
            let [q, k, v] = &mut o;
            run(gemv::Qkv {
                x: rd(&x),
                wq: rd(&p.wq),
                bq: rb(&p.bq),
                wk: rd(&p.wk),
                bk: rb(&p.bk),
                wv: rd(&p.wv),
                bv: rb(&p.bv),
                q: wr(q),
                k_out: wr(k),
                v: wr(v),
                rows: r32,
                k: K as u32,
                nq: NQ as u32,
                nkv: NKV as u32,
                scratch: None,
            }
            .launch(gemv::QKV));
            assert_same(&o, &p.reference(&x, rows), &format!("qkv {what}"));

            let mut o = outputs(rows);
            let [q, k, v] = &mut o;
            run(gemv::NormQkv {
                h: rd(&h),
                wn: rd(&wn),
                wq: rd(&p.wq),
                bq: rb(&p.bq),
                wk: rd(&p.wk),
                bk: rb(&p.bk),
                wv: rd(&p.wv),
                bv: rb(&p.bv),
                q: wr(q),
                k_out: wr(k),
                v: wr(v),
                rows: r32,
                k: K as u32,
                nq: NQ as u32,
                nkv: NKV as u32,
                eps: EPS,
                scratch: None,
            }
            .launch(gemv::NORM_QKV));
            assert_same(
                &o,
                &p.reference(&ref_rms_norm(&h, &wn, rows, K), rows),
                &format!("norm_qkv {what}"),
            );

            let sum = ref_residual_add(&h, &d, rows, K);
            let reference = p.reference(&ref_rms_norm(&sum, &wn, rows, K), rows);
            for keep in [false, true] {
                let mut h_out = poison_f32(rows * K);
                let mut o = outputs(rows);
                let [q, k, v] = &mut o;
                let h_out_buf = if keep { Some(wr(&mut h_out)) } else { None };
                run(gemv::AddNormQkv {
                    h: rd(&h),
                    d: rd(&d),
                    wn: rd(&wn),
                    wq: rd(&p.wq),
                    bq: rb(&p.bq),
                    wk: rd(&p.wk),
                    bk: rb(&p.bk),
                    wv: rd(&p.wv),
                    bv: rb(&p.bv),
                    h_out: h_out_buf,
                    q: wr(q),
                    k_out: wr(k),
                    v: wr(v),
                    rows: r32,
                    k: K as u32,
                    nq: NQ as u32,
                    nkv: NKV as u32,
                    eps: EPS,
                    scratch: None,
                }
                .launch(gemv::ADD_NORM_QKV));
                assert_same(&o, &reference, &format!("add_norm_qkv {what} keep {keep}"));
                if keep {
                    assert_eq!(
                        bits_f32(&h_out),
                        bits_f32(&sum),
                        "add_norm_qkv h_out {what}"
                    );
                }
            }
        }
    }
}

#[test]
fn gate_up_silu_family_matches_two_linears_and_silu_mul() {
    let mut rng = Rng::new(2);
    for rows in ROWS {
        let (wg, wu, wn) = (
            rng.bf16s(INTER * K, 0.2),
            rng.bf16s(INTER * K, 0.2),
            rng.bf16s(K, 1.5),
        );
        let (h, o, x) = (
            rng.f32s(rows * K, 2.0),
            rng.bf16s(rows * K, 1.0),
            rng.bf16s(rows * K, 1.0),
        );
        let reference = |x: &[bf16]| {
            ref_silu_mul(
                &ref_linear(x, &wg, None, rows, INTER),
                &ref_linear(x, &wu, None, rows, INTER),
                rows,
            )
        };
        let (r32, k32, i32_) = (rows as u32, K as u32, INTER as u32);

        let mut act = poison_bf16(rows * INTER);
        run(gemv::GateUpSilu {
            x: rd(&x),
            wg: rd(&wg),
            wu: rd(&wu),
            act: wr(&mut act),
            rows: r32,
            k: k32,
            inter: i32_,
            scratch: None,
        }
        .launch(gemv::GATE_UP_SILU));
        assert_eq!(
            bits_bf16(&act),
            bits_bf16(&reference(&x)),
            "gate_up_silu rows {rows}"
        );

        let mut act = poison_bf16(rows * INTER);
        run(gemv::NormGateUpSilu {
            h: rd(&h),
            wn: rd(&wn),
            wg: rd(&wg),
            wu: rd(&wu),
            act: wr(&mut act),
            rows: r32,
            k: k32,
            inter: i32_,
            eps: EPS,
            scratch: None,
        }
        .launch(gemv::NORM_GATE_UP_SILU));
        assert_eq!(
            bits_bf16(&act),
            bits_bf16(&reference(&ref_rms_norm(&h, &wn, rows, K))),
            "norm_gate_up_silu rows {rows}"
        );

        let sum = ref_residual_add(&h, &o, rows, K);
        let expected = reference(&ref_rms_norm(&sum, &wn, rows, K));
        for keep in [false, true] {
            let (mut act, mut h_out) = (poison_bf16(rows * INTER), poison_f32(rows * K));
            let h_out_buf = if keep { Some(wr(&mut h_out)) } else { None };
            run(gemv::AddNormGateUpSilu {
                h: rd(&h),
                o: rd(&o),
                wn: rd(&wn),
                wg: rd(&wg),
                wu: rd(&wu),
                h_out: h_out_buf,
                act: wr(&mut act),
                rows: r32,
                k: k32,
                inter: i32_,
                eps: EPS,
                scratch: None,
            }
            .launch(gemv::ADD_NORM_GATE_UP_SILU));
            assert_eq!(
                bits_bf16(&act),
                bits_bf16(&expected),
                "add_norm_gate_up_silu rows {rows} keep {keep}"
            );
            if keep {
                assert_eq!(bits_f32(&h_out), bits_f32(&sum));
            }
        }
    }
}

#[test]
fn linear_epilogues_and_norm_prologues_match() {
    let mut rng = Rng::new(3);
    for rows in ROWS {
        for biased in [false, true] {
            let (w, wn) = (rng.bf16s(NQ * K, 0.2), rng.bf16s(K, 1.5));
            let bias = if biased {
                Some(rng.bf16s(NQ, 0.5))
            } else {
                None
            };
            let (x, h, res) = (
                rng.bf16s(rows * K, 1.0),
                rng.f32s(rows * K, 2.0),
                rng.f32s(rows * NQ, 2.0),
            );
            let (r32, k32, n32) = (rows as u32, K as u32, NQ as u32);

            let mut h_out = poison_f32(rows * NQ);
            run(gemv::LinearResidualAdd {
                x: rd(&x),
                w: rd(&w),
                bias: bias.as_deref().map(rd),
                h: rd(&res),
                h_out: wr(&mut h_out),
                rows: r32,
                k: k32,
                n_out: n32,
                scratch: None,
            }
            .launch(gemv::LINEAR_RESIDUAL_ADD));
            let expected = ref_residual_add(
                &res,
                &ref_linear(&x, &w, bias.as_deref(), rows, NQ),
                rows,
                NQ,
            );
            assert_eq!(
                bits_f32(&h_out),
                bits_f32(&expected),
                "linear_residual_add rows {rows} bias {biased}"
            );

            let mut y = poison_bf16(rows * NQ);
            run(gemv::NormLinear {
                h: rd(&h),
                wn: rd(&wn),
                w: rd(&w),
                bias: bias.as_deref().map(rd),
                y: wr(&mut y),
                rows: r32,
                k: k32,
                n_out: n32,
                eps: EPS,
                scratch: None,
            }
            .launch(gemv::NORM_LINEAR));
            let expected = ref_linear(
                &ref_rms_norm(&h, &wn, rows, K),
                &w,
                bias.as_deref(),
                rows,
                NQ,
            );
            assert_eq!(
                bits_bf16(&y),
                bits_bf16(&expected),
                "norm_linear rows {rows} bias {biased}"
            );
        }
    }
}

#[test]
fn add_norm_lm_head_and_add_rms_norm_match() {
    let mut rng = Rng::new(4);
    for rows in ROWS {
        let (w, wn) = (rng.bf16s(VOCAB * K, 0.2), rng.bf16s(K, 1.5));
        let (h, d) = (rng.f32s(rows * K, 2.0), rng.bf16s(rows * K, 1.0));
        let sum = ref_residual_add(&h, &d, rows, K);
        let normed = ref_rms_norm(&sum, &wn, rows, K);

        let mut logits = poison_f32(rows * VOCAB);
        run(gemv::AddNormLmHead {
            h: rd(&h),
            d: rd(&d),
            wn: rd(&wn),
            w: rd(&w),
            logits: wr(&mut logits),
            want: None,
            rows: rows as u32,
            k: K as u32,
            vocab: VOCAB as u32,
            eps: EPS,
            scratch: None,
        }
        .launch(gemv::ADD_NORM_LM_HEAD));
        assert_eq!(
            bits_f32(&logits),
            bits_f32(&ref_lm_head(&normed, &w, rows, VOCAB)),
            "add_norm_lm_head rows {rows}"
        );

        for keep in [false, true] {
            let (mut out, mut h_out) = (poison_bf16(rows * K), poison_f32(rows * K));
            let h_out_buf = if keep { Some(wr(&mut h_out)) } else { None };
            run(norm::AddRmsNorm {
                h: rd(&h),
                x: rd(&d),
                w: rd(&wn),
                h_out: h_out_buf,
                out: wr(&mut out),
                rows: rows as u32,
                hidden: K as u32,
                eps: EPS,
            }
            .launch(norm::ADD_RMS_NORM));
            assert_eq!(
                bits_bf16(&out),
                bits_bf16(&normed),
                "add_rms_norm rows {rows} keep {keep}"
            );
            if keep {
                assert_eq!(bits_f32(&h_out), bits_f32(&sum));
            }
        }
    }
}
