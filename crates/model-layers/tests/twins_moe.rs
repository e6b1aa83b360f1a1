//! The `moe` twins: routing by hand and against lm_head → topk_softmax, the expert MLP against
//! the dense twins and a plain loop, thread-count independence, and refused launches.

mod twins_support;

use half::bf16;
use solder_gpu_runtime::GpuError;
use solder_model_layers::kernels::{gemv, moe, Launch};
use solder_model_layers::numerics::{dot_bf16, to_bf16};
use twins_support::{bits_bf16, bits_f32, poison_bf16, poison_f32, rd, run, run_threads, wr, Rng};

const ROWS: [usize; 3] = [1, 3, 8];
const EXPERTS: usize = 6;
const HIDDEN: usize = 72; // not a multiple of the 16 lanes
const INTER: usize = 136; // two full 64-feature tiles and a partial one

// ---- helpers ---------------------------------------------------------------------------------

fn topk(logits: &[f32], rows: usize, experts: usize, k: usize, norm: bool) -> (Vec<i32>, Vec<f32>) {
    let (mut ids, mut weights) = (vec![-7; rows * k], poison_f32(rows * k));
    run(moe::TopkSoftmax {
        logits: rd(logits),
        ids: wr(&mut ids),
        weights: wr(&mut weights),
        rows: rows as u32,
        experts: experts as u32,
        k: k as u32,
        norm_topk: norm as u32,
    }
    .launch(moe::TOPK_SOFTMAX));
    (ids, weights)
}

fn router_launch(
    x: &[bf16],
    w: &[bf16],
    ids: &mut [i32],
    weights: &mut [f32],
    [rows, hidden, experts, k]: [usize; 4],
    norm: bool,
) -> Launch {
    moe::RouterTopk {
        x: rd(x),
        w: rd(w),
        ids: wr(ids),
        weights: wr(weights),
        rows: rows as u32,
        hidden: hidden as u32,
        experts: experts as u32,
        k: k as u32,
        norm_topk: norm as u32,
    }
    .launch(moe::ROUTER_TOPK)
}

/// `k` distinct expert ids per row, in random order.
fn random_ids(rng: &mut Rng, rows: usize, experts: usize, k: usize) -> Vec<i32> {
    let mut ids = Vec::with_capacity(rows * k);
    for _ in 0..rows {
        let mut pool: Vec<i32> = (0..experts as i32).collect();
        for _ in 0..k {
            ids.push(pool.remove(rng.below(pool.len())));
        }
    }
    ids
}

struct Mlp {
    rows: usize,
    hidden: usize,
    inter: usize,
    k: usize,
    x: Vec<bf16>,
    ids: Vec<i32>,
    weights: Vec<f32>,
    wg: Vec<bf16>,
    wu: Vec<bf16>,
    wd: Vec<bf16>,
    act: Vec<bf16>,
}

impl Mlp {
    fn new(seed: u64, rows: usize, hidden: usize, inter: usize, k: usize) -> Mlp {
        let mut rng = Rng::new(seed);
        Mlp {
            rows,
            hidden,
            inter,
            k,
            x: rng.bf16s(rows * hidden, 1.0),
            ids: random_ids(&mut rng, rows, EXPERTS, k),
            weights: rng.f32s(rows * k, 1.0),
            wg: rng.bf16s(EXPERTS * inter * hidden, 0.2),
            wu: rng.bf16s(EXPERTS * inter * hidden, 0.2),
            wd: rng.bf16s(EXPERTS * hidden * inter, 0.2),
            act: rng.bf16s(rows * k * inter, 1.0),
        }
    }

    fn gate_up(&self, act: &mut [bf16]) -> Launch {
        moe::GateUpSilu {
            x: rd(&self.x),
            ids: rd(&self.ids),
            wg: rd(&self.wg),
            wu: rd(&self.wu),
            act: wr(act),
            rows: self.rows as u32,
            hidden: self.hidden as u32,
            inter: self.inter as u32,
            experts: EXPERTS as u32,
            k: self.k as u32,
        }
        .launch(moe::GATE_UP_SILU)
    }

    fn down(&self, out: &mut [bf16]) -> Launch {
        moe::Down {
            act: rd(&self.act),
            ids: rd(&self.ids),
            weights: rd(&self.weights),
            wd: rd(&self.wd),
            out: wr(out),
            rows: self.rows as u32,
            hidden: self.hidden as u32,
            inter: self.inter as u32,
            experts: EXPERTS as u32,
            k: self.k as u32,
        }
        .launch(moe::DOWN)
    }
}

// ---- routing ---------------------------------------------------------------------------------

#[test]
fn topk_softmax_by_hand_with_a_tie() {
    // Row 0: experts 1 and 2 tie (the lower id comes first); row 1 has no tie.
    let logits = [1.0f32, 3.0, 3.0, 0.0, 0.5, -1.0, 2.0, 1.5];
    let probs = |row: &[f32]| {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = row.iter().map(|l| (l - max).exp()).collect();
        let mut sum = 0.0f32;
        for v in &e {
            sum += v;
        }
        e.iter().map(|v| v / sum).collect::<Vec<f32>>()
    };
    let (p0, p1) = (probs(&logits[..4]), probs(&logits[4..]));
    // exp(-2), 1, 1, exp(-3) over their sum 2.18512...
    assert!((p0[1] as f64 - 1.0 / (2.0 + (-2f64).exp() + (-3f64).exp())).abs() < 1e-6);

    let (ids, weights) = topk(&logits, 2, 4, 2, false);
    assert_eq!(ids, [1, 2, 2, 3]);
    assert_eq!(bits_f32(&weights), bits_f32(&[p0[1], p0[2], p1[2], p1[3]]));

    let (ids, weights) = topk(&logits, 2, 4, 2, true);
    assert_eq!(ids, [1, 2, 2, 3]);
    let s1 = p1[2] + p1[3];
    assert_eq!(
        bits_f32(&weights),
        bits_f32(&[0.5, 0.5, p1[2] / s1, p1[3] / s1])
    );

    // Every expert picked: descending, ties to the lower id; renormalised by the sum in pick
    // order.
    let (ids, weights) = topk(&logits, 2, 4, 4, true);
    assert_eq!(ids, [1, 2, 0, 3, 2, 3, 0, 1]);
    let s0 = p0[1] + p0[2] + p0[0] + p0[3];
    let s1 = p1[2] + p1[3] + p1[0] + p1[1];
    let want = [
        p0[1] / s0,
        p0[2] / s0,
        p0[0] / s0,
        p0[3] / s0,
        p1[2] / s1,
        p1[3] / s1,
        p1[0] / s1,
        p1[1] / s1,
    ];
    assert_eq!(bits_f32(&weights), bits_f32(&want));
}

#[test]
fn router_topk_equals_lm_head_then_topk_softmax() {
    let (hidden, experts, k) = (HIDDEN, 10, 3);
    for (seed, rows) in ROWS.into_iter().enumerate() {
        let mut rng = Rng::new(100 + seed as u64);
        let x = rng.bf16s(rows * hidden, 1.0);
        let w = rng.bf16s(experts * hidden, 0.5);
        let mut logits = poison_f32(rows * experts);
        run(gemv::LmHead {
            x: rd(&x),
            w: rd(&w),
            logits: wr(&mut logits),
            want: None,
            rows: rows as u32,
            k: hidden as u32,
            vocab: experts as u32,
            scratch: None,
        }
        .launch(gemv::LM_HEAD));
        for norm in [false, true] {
            let (want_ids, want_weights) = topk(&logits, rows, experts, k, norm);
            let (mut ids, mut weights) = (vec![-7; rows * k], poison_f32(rows * k));
            run(router_launch(
                &x,
                &w,
                &mut ids,
                &mut weights,
                [rows, hidden, experts, k],
                norm,
            ));
            assert_eq!(ids, want_ids, "rows {rows} norm {norm}");
            assert_eq!(
                bits_f32(&weights),
                bits_f32(&want_weights),
                "rows {rows} norm {norm}"
            );
        }
    }
}

// ---- expert MLP ------------------------------------------------------------------------------

#[test]
fn gate_up_silu_equals_the_dense_twin_per_pick() {
    for (seed, rows) in ROWS.into_iter().enumerate() {
        let m = Mlp::new(200 + seed as u64, rows, HIDDEN, INTER, 2);
        let mut act = poison_bf16(rows * m.k * INTER);
        run(m.gate_up(&mut act));
        let matrix = INTER * HIDDEN;
        for r in 0..rows {
            for j in 0..m.k {
                let e = m.ids[r * m.k + j] as usize;
                let mut want = poison_bf16(INTER);
                run(gemv::GateUpSilu {
                    x: rd(&m.x[r * HIDDEN..(r + 1) * HIDDEN]),
                    wg: rd(&m.wg[e * matrix..(e + 1) * matrix]),
                    wu: rd(&m.wu[e * matrix..(e + 1) * matrix]),
                    act: wr(&mut want),
                    rows: 1,
                    k: HIDDEN as u32,
                    inter: INTER as u32,
                    scratch: None,
                }
                .launch(gemv::GATE_UP_SILU));
                let slot = r * m.k + j;
                assert_eq!(
                    bits_bf16(&act[slot * INTER..(slot + 1) * INTER]),
                    bits_bf16(&want),
                    "rows {rows} row {r} pick {j}"
                );
            }
        }
    }
}

#[test]
fn down_equals_a_plain_weighted_sum_per_row() {
    let (hidden, inter, k) = (INTER, HIDDEN, 3); // hidden spans three tiles
    for (seed, rows) in ROWS.into_iter().enumerate() {
        let m = Mlp::new(300 + seed as u64, rows, hidden, inter, k);
        let mut out = poison_bf16(rows * hidden);
        run(m.down(&mut out));
        let mut want = poison_bf16(rows * hidden);
        for r in 0..rows {
            for o in 0..hidden {
                let mut acc = 0.0f32;
                for j in 0..k {
                    let slot = r * k + j;
                    let e = m.ids[slot] as usize;
                    let act = &m.act[slot * inter..(slot + 1) * inter];
                    let w = &m.wd[(e * hidden + o) * inter..(e * hidden + o + 1) * inter];
                    acc += dot_bf16(act, w) * m.weights[slot];
                }
                want[r * hidden + o] = to_bf16(acc);
            }
        }
        assert_eq!(bits_bf16(&out), bits_bf16(&want), "rows {rows}");
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Over 2^20 multiply-accumulates each, so the twins split the work.
    let m = Mlp::new(400, 8, 264, INTER, 4);
    let mut rng = Rng::new(401);
    let (hidden, experts, k) = (2048, 64, 8);
    let x = rng.bf16s(8 * hidden, 1.0);
    let w = rng.bf16s(experts * hidden, 0.1);
    let mut first = None;
    for threads in [1, 2, 4] {
        let mut act = poison_bf16(8 * 4 * INTER);
        run_threads(&m.gate_up(&mut act), threads).expect("gate_up_silu");
        let mut out = poison_bf16(8 * 264);
        run_threads(&m.down(&mut out), threads).expect("down");
        let (mut ids, mut weights) = (vec![-7; 8 * k], poison_f32(8 * k));
        let launch = router_launch(
            &x,
            &w,
            &mut ids,
            &mut weights,
            [8, hidden, experts, k],
            true,
        );
        run_threads(&launch, threads).expect("router_topk");
        let got = (bits_bf16(&act), bits_bf16(&out), ids, bits_f32(&weights));
        match &first {
            None => first = Some(got),
            Some(want) => assert_eq!(&got, want, "{threads} threads"),
        }
    }
}

// ---- refused launches ------------------------------------------------------------------------

/// Runs `launch`, expecting an error that names its kernel.
fn refused(launch: Launch) -> GpuError {
    let err = run_threads(&launch, 2).expect_err("the launch should be refused");
    assert!(
        err.to_string().contains(launch.kernel),
        "{err} does not name {}",
        launch.kernel
    );
    err
}

fn bad_index(err: &GpuError) -> usize {
    match err {
        GpuError::BadArgument { index, .. } => *index,
        other => panic!("expected a bad argument, got {other:?}"),
    }
}

#[test]
fn expert_ids_out_of_range_are_refused_and_nothing_is_written() {
    for bad in [EXPERTS as i32, -1] {
        let mut m = Mlp::new(500, 3, HIDDEN, INTER, 2);
        m.ids[3] = bad;
        let mut act = poison_bf16(3 * 2 * INTER);
        let err = refused(m.gate_up(&mut act));
        assert!(matches!(err, GpuError::Kernel { .. }), "{err:?}");
        assert!(err.to_string().contains("row 1 pick 1"), "{err}");
        assert!(act.iter().all(|v| v.is_nan()), "gate_up_silu wrote");
        let mut out = poison_bf16(3 * HIDDEN);
        let err = refused(m.down(&mut out));
        assert!(matches!(err, GpuError::Kernel { .. }), "{err:?}");
        assert!(out.iter().all(|v| v.is_nan()), "down wrote");
    }
}

#[test]
fn wrong_lengths_and_picks_are_refused() {
    let m = Mlp::new(600, 3, HIDDEN, INTER, 2);
    let mut act = poison_bf16(3 * 2 * INTER);
    let mut short = Mlp::new(600, 3, HIDDEN, INTER, 2);
    short.wg.pop();
    assert_eq!(bad_index(&refused(short.gate_up(&mut act))), 2);
    let mut short = Mlp::new(600, 3, HIDDEN, INTER, 2);
    short.ids.pop();
    assert_eq!(bad_index(&refused(short.gate_up(&mut act))), 1);
    let mut short_act = poison_bf16(3 * 2 * INTER - 1);
    assert_eq!(bad_index(&refused(m.gate_up(&mut short_act))), 4);

    let mut out = poison_bf16(3 * HIDDEN);
    let mut short = Mlp::new(600, 3, HIDDEN, INTER, 2);
    short.weights.pop();
    assert_eq!(bad_index(&refused(short.down(&mut out))), 2);
    let mut short = Mlp::new(600, 3, HIDDEN, INTER, 2);
    short.wd.pop();
    assert_eq!(bad_index(&refused(short.down(&mut out))), 3);
    let mut short_out = poison_bf16(3 * HIDDEN - 1);
    assert_eq!(bad_index(&refused(m.down(&mut short_out))), 4);
    assert!(
        act.iter().chain(&out).all(|v| v.is_nan()),
        "a refused launch wrote"
    );

    // k outside 1..=experts, and short routing buffers.
    let logits = Rng::new(601).f32s(2 * 4, 1.0);
    for k in [0u32, 5] {
        let (mut ids, mut weights) = (vec![0; 2 * 5], poison_f32(2 * 5));
        let launch = moe::TopkSoftmax {
            logits: rd(&logits),
            ids: wr(&mut ids),
            weights: wr(&mut weights),
            rows: 2,
            experts: 4,
            k,
            norm_topk: 1,
        }
        .launch(moe::TOPK_SOFTMAX);
        assert_eq!(bad_index(&refused(launch)), 5, "k = {k}");
    }
    let (mut ids, mut weights) = (vec![0; 2 * 2 - 1], poison_f32(2 * 2));
    let launch = moe::TopkSoftmax {
        logits: rd(&logits),
        ids: wr(&mut ids),
        weights: wr(&mut weights),
        rows: 2,
        experts: 4,
        k: 2,
        norm_topk: 0,
    }
    .launch(moe::TOPK_SOFTMAX);
    assert_eq!(bad_index(&refused(launch)), 1);
    let (mut ids, mut weights) = (vec![0; 2 * 2], poison_f32(2 * 2 - 1));
    let launch = moe::TopkSoftmax {
        logits: rd(&logits),
        ids: wr(&mut ids),
        weights: wr(&mut weights),
        rows: 2,
        experts: 4,
        k: 2,
        norm_topk: 0,
    }
    .launch(moe::TOPK_SOFTMAX);
    assert_eq!(bad_index(&refused(launch)), 2);

    let mut rng = Rng::new(602);
    let (x, short_w) = (rng.bf16s(2 * HIDDEN, 1.0), rng.bf16s(4 * HIDDEN - 1, 1.0));
    let (mut ids, mut weights) = (vec![0; 2 * 2], poison_f32(2 * 2));
    let launch = router_launch(
        &x,
        &short_w,
        &mut ids,
        &mut weights,
        [2, HIDDEN, 4, 2],
        true,
    );
    assert_eq!(bad_index(&refused(launch)), 1);
    let w = rng.bf16s(4 * HIDDEN, 1.0);
    let launch = router_launch(&x, &w, &mut ids, &mut weights, [2, HIDDEN, 4, 9], true);
    assert_eq!(bad_index(&refused(launch)), 7);
    assert!(weights.iter().all(|v| v.is_nan()), "a refused launch wrote");
}
