//! The `gdn` twins against naive implementations of HF's Qwen3NextGatedDeltaNet (written here
//! from the reference: `fix_query_key_value_ordering`, `causal_conv1d_update`,
//! `torch_recurrent_gated_delta_rule`, `Qwen3NextRMSNormGated`), and the state contract: a
//! chained launch equals its rows launched one at a time, snapshots are the states between
//! them, the thread count changes no byte, and bad slots are refused.

mod twins_support;

use half::bf16;
use solder_gpu_runtime::GpuError;
use solder_model_layers::kernels::{gdn, Launch};
use twins_support::{bits_bf16, bits_f32, poison_bf16, poison_f32, rd, run, run_threads, wr, Rng};

const EPS: f32 = 1e-6;
const KERNEL: usize = 4;

/// Head geometry: `nk` key heads of `dk`, `nv` value heads of `dv`.
#[derive(Debug, Clone, Copy)]
struct Geo {
    nk: usize,
    dk: usize,
    nv: usize,
    dv: usize,
}

/// nk = 2, nv = 4 (two v heads per k head), dk = 4, dv = 3.
const SMALL: Geo = Geo {
    nk: 2,
    dk: 4,
    nv: 4,
    dv: 3,
};

impl Geo {
    fn r(&self) -> usize {
        self.nv / self.nk
    }
    fn group(&self) -> usize {
        2 * self.dk + 2 * self.r() * self.dv
    }
    fn p(&self) -> usize {
        self.nk * self.group()
    }
    fn kd(&self) -> usize {
        self.nk * self.dk
    }
    fn c(&self) -> usize {
        2 * self.kd() + self.nv * self.dv
    }
    fn state(&self) -> usize {
        self.nv * self.dk * self.dv
    }
    fn u(&self) -> [u32; 4] {
        [self.nk, self.dk, self.nv, self.dv].map(|v| v as u32)
    }
}

fn assert_close(got: &[bf16], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f64();
        assert!(
            (g - w).abs() <= 1e-2 * w.abs() + 1e-3,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

// ---- HF's layout, written out -------------------------------------------------------------

/// One qkvz row viewed as [nk][q dk | k dk | v r·dv | z r·dv]: cat(query, key, value) (the conv
/// input) and z, both with the v heads in order.
fn hf_split(g: Geo, row: &[bf16]) -> (Vec<bf16>, Vec<bf16>) {
    let (dk, rdv) = (g.dk, g.r() * g.dv);
    let (mut q, mut k, mut v, mut z) = (vec![], vec![], vec![], vec![]);
    for group in row.chunks_exact(g.group()) {
        q.extend_from_slice(&group[..dk]);
        k.extend_from_slice(&group[dk..2 * dk]);
        v.extend_from_slice(&group[2 * dk..2 * dk + rdv]);
        z.extend_from_slice(&group[2 * dk + rdv..]);
    }
    q.extend(k);
    q.extend(v);
    (q, z)
}

// ---- gdn::conv ------------------------------------------------------------------------------

/// causal_conv1d_update of one token: window = (history, x) per channel, SiLU, in f64; the
/// history (`[C][K − 1]`) shifts.
fn naive_conv(g: Geo, w: &[bf16], hist: &mut [bf16], x: &[bf16]) -> Vec<f64> {
    let h = KERNEL - 1;
    (0..g.c())
        .map(|c| {
            let hc = &mut hist[c * h..(c + 1) * h];
            let window: Vec<f64> = hc.iter().chain([&x[c]]).map(|v| v.to_f64()).collect();
            let acc: f64 = (0..KERNEL)
                .map(|j| w[c * KERNEL + j].to_f64() * window[j])
                .sum();
            hc.copy_within(1.., 0);
            hc[h - 1] = x[c];
            acc * sigmoid(acc)
        })
        .collect()
}

/// Inputs of conv launches on `SMALL`.
struct Conv {
    qkvz: Vec<bf16>,
    w: Vec<bf16>,
    state: Vec<bf16>,
    num_slots: usize,
}

impl Conv {
    fn new(seed: u64, rows: usize, num_slots: usize) -> Conv {
        let mut rng = Rng::new(seed);
        let slot = SMALL.c() * (KERNEL - 1);
        Conv {
            qkvz: rng.bf16s(rows * SMALL.p(), 2.0),
            w: rng.bf16s(SMALL.c() * KERNEL, 0.8),
            state: rng.bf16s(num_slots * slot, 2.0),
            num_slots,
        }
    }

    fn slot_elems(&self) -> usize {
        SMALL.c() * (KERNEL - 1)
    }

    /// Launches rows `rows` of qkvz on `state`, each row's slot advanced in place; returns
    /// (out, snapshots).
    fn launch(
        &self,
        rows: std::ops::Range<usize>,
        state: &mut [bf16],
        slots: &[i32],
        chain: u32,
        snapshots: bool,
    ) -> Result<(Vec<bf16>, Vec<bf16>), GpuError> {
        self.launch_to(rows, state, [slots, slots], chain, snapshots)
    }

    /// `launch`, each row reading `slots[0]` and writing `slots[1]`.
    fn launch_to(
        &self,
        rows: std::ops::Range<usize>,
        state: &mut [bf16],
        [slots, out_slots]: [&[i32]; 2],
        chain: u32,
        snapshots: bool,
    ) -> Result<(Vec<bf16>, Vec<bf16>), GpuError> {
        let n = rows.len();
        let qkvz = &self.qkvz[rows.start * SMALL.p()..rows.end * SMALL.p()];
        let mut out = poison_bf16(n * SMALL.c());
        let mut snaps = poison_bf16(n * self.slot_elems());
        let [nk, dk, nv, dv] = SMALL.u();
        let launch = gdn::Conv {
            qkvz: rd(qkvz),
            w: rd(&self.w),
            state: wr(state),
            slots: rd(slots),
            out_slots: rd(out_slots),
            out: wr(&mut out),
            snapshots: snapshots.then(|| wr(&mut snaps)),
            keep: None,
            rows: n as u32,
            nk,
            dk,
            nv,
            dv,
            kernel: KERNEL as u32,
            num_slots: self.num_slots as u32,
            chain,
        }
        .launch(gdn::CONV);
        run_threads(&launch, 2)?;
        Ok((out, snaps))
    }
}

#[test]
fn conv_matches_causal_conv1d_update_with_hf_channel_order() {
    let rows = 3;
    let c = Conv::new(1, rows, 4);
    let slots = [2i32, 0, 3];
    let mut state = c.state.clone();
    let (out, _) = c.launch(0..rows, &mut state, &slots, 0, false).unwrap();
    let mut want_state = c.state.clone();
    let se = c.slot_elems();
    for (r, s) in slots.iter().enumerate() {
        let (x, _) = hf_split(SMALL, &c.qkvz[r * SMALL.p()..(r + 1) * SMALL.p()]);
        let hist = &mut want_state[*s as usize * se..(*s as usize + 1) * se];
        let want = naive_conv(SMALL, &c.w, hist, &x);
        assert_close(
            &out[r * SMALL.c()..(r + 1) * SMALL.c()],
            &want,
            &format!("row {r}"),
        );
    }
    assert_eq!(bits_bf16(&state), bits_bf16(&want_state), "state");
}

#[test]
fn conv_chain_equals_single_row_launches_and_snapshots_are_the_states_between() {
    let rows = 3;
    let c = Conv::new(2, rows, 3);
    let se = c.slot_elems();
    // Chained: only slots[0] counts.
    let mut chained = c.state.clone();
    let (out, snaps) = c
        .launch(0..rows, &mut chained, &[1, 0, 2], 1, true)
        .unwrap();
    let mut stepped = c.state.clone();
    for r in 0..rows {
        let (o, _) = c.launch(r..r + 1, &mut stepped, &[1], 0, false).unwrap();
        let at = r * SMALL.c();
        assert_eq!(
            bits_bf16(&out[at..at + SMALL.c()]),
            bits_bf16(&o),
            "row {r}"
        );
        assert_eq!(
            bits_bf16(&snaps[r * se..(r + 1) * se]),
            bits_bf16(&stepped[se..2 * se]),
            "snapshot {r}"
        );
    }
    assert_eq!(bits_bf16(&chained), bits_bf16(&stepped), "final state");
    // Other slots are untouched.
    assert_eq!(bits_bf16(&chained[..se]), bits_bf16(&c.state[..se]));
}

// ---- gdn::gates -----------------------------------------------------------------------------

#[test]
fn gates_split_ba_like_hf_and_match_f64() {
    let mut rng = Rng::new(3);
    let (rows, nk, nv) = (2usize, 2usize, 6usize);
    let r = nv / nk;
    let mut ba = rng.bf16s(rows * 2 * nv, 3.0);
    ba[r] = bf16::from_f32(25.0); // row 0, v head 0's a: softplus past its threshold
    let (a_log, dt_bias) = (rng.bf16s(nv, 1.0), rng.bf16s(nv, 1.0));
    let (mut beta, mut g) = (poison_f32(rows * nv), poison_f32(rows * nv));
    run(gdn::Gates {
        ba: rd(&ba),
        a_log: rd(&a_log),
        dt_bias: rd(&dt_bias),
        beta: wr(&mut beta),
        g: wr(&mut g),
        rows: rows as u32,
        nk: nk as u32,
        nv: nv as u32,
    }
    .launch(gdn::GATES));
    for row in 0..rows {
        // HF: view [nk][2r], split [r | r], reshape to nv.
        let (mut b, mut a) = (vec![], vec![]);
        for group in ba[row * 2 * nv..(row + 1) * 2 * nv].chunks_exact(2 * r) {
            b.extend_from_slice(&group[..r]);
            a.extend_from_slice(&group[r..]);
        }
        for vh in 0..nv {
            let x = a[vh].to_f64() + dt_bias[vh].to_f64();
            let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
            let want_g = -a_log[vh].to_f64().exp() * softplus;
            let want_beta = sigmoid(b[vh].to_f64());
            let (got_b, got_g) = (beta[row * nv + vh] as f64, g[row * nv + vh] as f64);
            assert!((got_b - want_beta).abs() < 1e-6, "beta {row} {vh}");
            assert!(
                (got_g - want_g).abs() <= 1e-5 * want_g.abs() + 1e-6,
                "g {row} {vh}"
            );
        }
    }
}

// ---- gdn::recurrence ------------------------------------------------------------------------

/// torch_recurrent_gated_delta_rule (l2-normalised q, k) of one token, in f64, on a state
/// `[nv][dk][dv]`.
fn naive_recurrence(g: Geo, mixed: &[bf16], beta: &[f32], gate: &[f32], s: &mut [f64]) -> Vec<f64> {
    let (dk, dv, kd) = (g.dk, g.dv, g.kd());
    let l2 = |x: &[bf16]| -> Vec<f64> {
        let x: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
        x.iter().map(|v| v * inv).collect()
    };
    let mut out = vec![0.0; g.nv * dv];
    for h in 0..g.nv {
        let kh = h / g.r(); // repeat_interleave
        let q: Vec<f64> = l2(&mixed[kh * dk..(kh + 1) * dk])
            .iter()
            .map(|v| v / (dk as f64).sqrt())
            .collect();
        let k = l2(&mixed[kd + kh * dk..kd + (kh + 1) * dk]);
        let v = &mixed[2 * kd + h * dv..2 * kd + (h + 1) * dv];
        let s = &mut s[h * dk * dv..(h + 1) * dk * dv];
        let decay = (gate[h] as f64).exp();
        s.iter_mut().for_each(|x| *x *= decay);
        for j in 0..dv {
            let kv_mem: f64 = (0..dk).map(|i| s[i * dv + j] * k[i]).sum();
            let delta = (v[j].to_f64() - kv_mem) * beta[h] as f64;
            for i in 0..dk {
                s[i * dv + j] += k[i] * delta;
            }
            out[h * dv + j] = (0..dk).map(|i| s[i * dv + j] * q[i]).sum();
        }
    }
    out
}

/// Inputs of recurrence launches.
struct Rec {
    g: Geo,
    mixed: Vec<bf16>,
    beta: Vec<f32>,
    gate: Vec<f32>,
    state: Vec<f32>,
    num_slots: usize,
}

impl Rec {
    fn new(seed: u64, g: Geo, rows: usize, num_slots: usize) -> Rec {
        let mut rng = Rng::new(seed);
        Rec {
            g,
            mixed: rng.bf16s(rows * g.c(), 1.0),
            beta: rng.f32s(rows * g.nv, 0.5).iter().map(|v| v + 0.5).collect(),
            gate: rng.f32s(rows * g.nv, 0.5).iter().map(|v| v - 0.5).collect(),
            state: rng.f32s(num_slots * g.state(), 0.5),
            num_slots,
        }
    }

    fn launch(
        &self,
        rows: std::ops::Range<usize>,
        state: &mut [f32],
        slots: &[i32],
        chain: u32,
        snapshots: bool,
        threads: usize,
    ) -> Result<(Vec<bf16>, Vec<f32>), GpuError> {
        self.launch_to(rows, state, [slots, slots], (chain, snapshots), threads)
    }

    /// `launch`, each row reading `slots[0]` and writing `slots[1]`.
    fn launch_to(
        &self,
        rows: std::ops::Range<usize>,
        state: &mut [f32],
        [slots, out_slots]: [&[i32]; 2],
        (chain, snapshots): (u32, bool),
        threads: usize,
    ) -> Result<(Vec<bf16>, Vec<f32>), GpuError> {
        let (n, g) = (rows.len(), self.g);
        let mixed = &self.mixed[rows.start * g.c()..rows.end * g.c()];
        let beta = &self.beta[rows.start * g.nv..rows.end * g.nv];
        let gate = &self.gate[rows.start * g.nv..rows.end * g.nv];
        let mut out = poison_bf16(n * g.nv * g.dv);
        let mut snaps = poison_f32(n * g.state());
        let [nk, dk, nv, dv] = g.u();
        let launch = gdn::Recurrence {
            mixed: rd(mixed),
            beta: rd(beta),
            g: rd(gate),
            state: wr(state),
            slots: rd(slots),
            out_slots: rd(out_slots),
            out: wr(&mut out),
            snapshots: snapshots.then(|| wr(&mut snaps)),
            keep: None,
            rows: n as u32,
            nk,
            dk,
            nv,
            dv,
            num_slots: self.num_slots as u32,
            chain,
        }
        .launch(gdn::RECURRENCE);
        run_threads(&launch, threads)?;
        Ok((out, snaps))
    }
}

#[test]
fn recurrence_matches_the_hf_delta_rule() {
    for g in [
        SMALL,
        Geo {
            nk: 1,
            dk: 20,
            nv: 2,
            dv: 18,
        },
    ] {
        let rows = 4;
        let rec = Rec::new(4, g, rows, 2);
        let mut state = rec.state.clone();
        let (out, _) = rec
            .launch(0..rows, &mut state, &[1; 4], 1, false, 1)
            .unwrap();
        let mut s: Vec<f64> = rec.state[g.state()..].iter().map(|v| *v as f64).collect();
        for r in 0..rows {
            let want = naive_recurrence(
                g,
                &rec.mixed[r * g.c()..(r + 1) * g.c()],
                &rec.beta[r * g.nv..(r + 1) * g.nv],
                &rec.gate[r * g.nv..(r + 1) * g.nv],
                &mut s,
            );
            let at = r * g.nv * g.dv;
            assert_close(&out[at..at + g.nv * g.dv], &want, &format!("{g:?} row {r}"));
        }
        for (i, (got, want)) in state[g.state()..].iter().zip(&s).enumerate() {
            assert!(
                (*got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "state[{i}]"
            );
        }
        assert_eq!(
            bits_f32(&state[..g.state()]),
            bits_f32(&rec.state[..g.state()])
        );
    }
}

#[test]
fn recurrence_chain_equals_single_row_launches_and_snapshots_are_the_states_between() {
    let (rows, g) = (5, SMALL);
    let rec = Rec::new(5, g, rows, 3);
    let se = g.state();
    let mut chained = rec.state.clone();
    let (out, snaps) = rec
        .launch(0..rows, &mut chained, &[2, 0, 0, 0, 0], 1, true, 1)
        .unwrap();
    let mut stepped = rec.state.clone();
    for r in 0..rows {
        let (o, _) = rec
            .launch(r..r + 1, &mut stepped, &[2], 0, false, 1)
            .unwrap();
        let at = r * g.nv * g.dv;
        assert_eq!(
            bits_bf16(&out[at..at + g.nv * g.dv]),
            bits_bf16(&o),
            "row {r}"
        );
        assert_eq!(
            bits_f32(&snaps[r * se..(r + 1) * se]),
            bits_f32(&stepped[2 * se..]),
            "snapshot {r}"
        );
    }
    assert_eq!(bits_f32(&chained), bits_f32(&stepped), "final state");
}

#[test]
fn recurrence_rows_on_their_own_slots_equal_single_row_launches() {
    let (rows, g) = (4, SMALL);
    let rec = Rec::new(6, g, rows, 4);
    // Distinct slots, then two rows sharing slot 0 (padding rows on a scratch slot).
    for slots in [[3i32, 0, 2, 1], [1, 0, 3, 0]] {
        let mut multi = rec.state.clone();
        let (out, snaps) = rec.launch(0..rows, &mut multi, &slots, 0, true, 1).unwrap();
        let mut stepped = rec.state.clone();
        for (r, s) in slots.iter().enumerate() {
            let (o, _) = rec
                .launch(r..r + 1, &mut stepped, &[*s], 0, false, 1)
                .unwrap();
            let at = r * g.nv * g.dv;
            assert_eq!(
                bits_bf16(&out[at..at + g.nv * g.dv]),
                bits_bf16(&o),
                "{slots:?} row {r}"
            );
            let slot = *s as usize * g.state();
            assert_eq!(
                bits_f32(&snaps[r * g.state()..(r + 1) * g.state()]),
                bits_f32(&stepped[slot..slot + g.state()]),
                "{slots:?} snapshot {r}"
            );
        }
        assert_eq!(bits_f32(&multi), bits_f32(&stepped), "{slots:?} state");
    }
}

#[test]
fn recurrence_does_not_depend_on_the_thread_count() {
    // 4 rows · 4 heads · 128 · 128 · 4 passes = 2^20 multiply-adds: the parallel path.
    let g = Geo {
        nk: 2,
        dk: 128,
        nv: 4,
        dv: 128,
    };
    let rows = 4;
    let rec = Rec::new(7, g, rows, 4);
    for (slots, chain) in [([3i32, 1, 0, 2], 0u32), ([2, 2, 2, 2], 1)] {
        let mut first: Option<(Vec<u16>, Vec<u32>, Vec<u32>)> = None;
        for threads in [1, 2, 4] {
            let mut state = rec.state.clone();
            let (out, snaps) = rec
                .launch(0..rows, &mut state, &slots, chain, true, threads)
                .unwrap();
            let got = (bits_bf16(&out), bits_f32(&state), bits_f32(&snaps));
            match &first {
                None => first = Some(got),
                Some(want) => assert!(&got == want, "chain {chain}: {threads} threads differ"),
            }
        }
    }
}

// ---- gdn::gated_norm ------------------------------------------------------------------------

#[test]
fn gated_norm_matches_rms_norm_gated() {
    let mut rng = Rng::new(8);
    let (rows, g) = (3usize, SMALL);
    let (core, qkvz, w) = (
        rng.bf16s(rows * g.nv * g.dv, 2.0),
        rng.bf16s(rows * g.p(), 3.0),
        rng.bf16s(g.dv, 1.5),
    );
    let mut out = poison_bf16(core.len());
    let [nk, dk, nv, dv] = g.u();
    run(gdn::GatedNorm {
        core: rd(&core),
        qkvz: rd(&qkvz),
        w: rd(&w),
        out: wr(&mut out),
        rows: rows as u32,
        nk,
        dk,
        nv,
        dv,
        eps: EPS,
    }
    .launch(gdn::GATED_NORM));
    let mut want = vec![];
    for r in 0..rows {
        let (_, z) = hf_split(g, &qkvz[r * g.p()..(r + 1) * g.p()]);
        for vh in 0..g.nv {
            let x: Vec<f64> = core[(r * g.nv + vh) * g.dv..][..g.dv]
                .iter()
                .map(|v| v.to_f64())
                .collect();
            let inv =
                1.0 / (x.iter().map(|v| v * v).sum::<f64>() / g.dv as f64 + EPS as f64).sqrt();
            for j in 0..g.dv {
                let z = z[vh * g.dv + j].to_f64();
                want.push(x[j] * inv * w[j].to_f64() * z * sigmoid(z));
            }
        }
    }
    assert_close(&out, &want, "gated_norm");
}

// ---- refusals -------------------------------------------------------------------------------

fn refused_kernel(result: Result<impl Sized, GpuError>, needle: &str) {
    match result {
        Err(GpuError::Kernel { kernel, message }) => {
            assert!(kernel.starts_with("gdn::"), "{kernel}");
            assert!(
                message.contains(needle),
                "{message:?} does not say {needle:?}"
            );
        }
        Err(other) => panic!("expected a kernel failure, got {other:?}"),
        Ok(_) => panic!("the launch should be refused"),
    }
}

fn refused_arg(result: Result<impl Sized, GpuError>, index: usize) {
    match result {
        Err(GpuError::BadArgument { index: i, .. }) => assert_eq!(i, index),
        Err(other) => panic!("expected a bad argument {index}, got {other:?}"),
        Ok(_) => panic!("the launch should be refused"),
    }
}

#[test]
fn bad_slots_chain_and_heads_are_refused_without_writing() {
    let c = Conv::new(9, 2, 2);
    let mut state = c.state.clone();
    refused_kernel(c.launch(0..2, &mut state, &[0, 2], 0, true), "slot 2");
    refused_kernel(c.launch(0..2, &mut state, &[-1, 0], 1, false), "slot -1");
    refused_arg(c.launch(0..2, &mut state, &[0, 1], 3, false), 15);
    assert_eq!(bits_bf16(&state), bits_bf16(&c.state), "conv state written");
    // Chain 2 (verify_batch): a slot may not come back after another slot's run.
    let c3 = Conv::new(9, 3, 2);
    let mut state = c3.state.clone();
    refused_kernel(
        c3.launch(0..3, &mut state, &[0, 1, 0], 2, false),
        "returns to slot 0",
    );
    assert_eq!(
        bits_bf16(&state),
        bits_bf16(&c3.state),
        "conv state written"
    );

    let rec = Rec::new(10, SMALL, 2, 2);
    let mut state = rec.state.clone();
    refused_kernel(rec.launch(0..2, &mut state, &[1, 5], 0, true, 2), "slot 5");
    refused_kernel(rec.launch(0..2, &mut state, &[7, 0], 1, true, 2), "slot 7");
    assert_eq!(
        bits_f32(&state),
        bits_f32(&rec.state),
        "recurrence state written"
    );

    // 3 value heads over 2 key heads; a short state buffer.
    let mut out = poison_bf16(2 * 3 * SMALL.dv);
    let launch: Launch = gdn::Recurrence {
        mixed: rd(&rec.mixed),
        beta: rd(&rec.beta),
        g: rd(&rec.gate),
        state: wr(&mut state),
        slots: rd(&[0i32, 1]),
        out_slots: rd(&[0i32, 1]),
        out: wr(&mut out),
        snapshots: None,
        keep: None,
        rows: 2,
        nk: 2,
        dk: SMALL.dk as u32,
        nv: 3,
        dv: SMALL.dv as u32,
        num_slots: 2,
        chain: 0,
    }
    .launch(gdn::RECURRENCE);
    refused_arg(run_threads(&launch, 1), 12);
    let mut short = rec.state[1..].to_vec();
    let mut out = poison_bf16(2 * SMALL.nv * SMALL.dv);
    let [nk, dk, nv, dv] = SMALL.u();
    let launch = gdn::Recurrence {
        mixed: rd(&rec.mixed),
        beta: rd(&rec.beta),
        g: rd(&rec.gate),
        state: wr(&mut short),
        slots: rd(&[0i32, 1]),
        out_slots: rd(&[0i32, 1]),
        out: wr(&mut out),
        snapshots: None,
        keep: None,
        rows: 2,
        nk,
        dk,
        nv,
        dv,
        num_slots: 2,
        chain: 0,
    }
    .launch(gdn::RECURRENCE);
    refused_arg(run_threads(&launch, 1), 3);
    assert!(out.iter().all(|v| v.is_nan()), "a refused launch wrote");
}

#[test]
fn chain_2_runs_each_sequence_s_rows_in_order_on_its_slot() {
    // Rows 0-1 are one sequence on slot 1, row 2 another on slot 0: the same bytes as the run
    // chained alone (chain 1) and the single row on its own (chain 0).
    let c = Conv::new(11, 3, 2);
    let mut runs = c.state.clone();
    let (out, snaps) = c
        .launch(0..3, &mut runs, &[1, 1, 0], 2, true)
        .expect("runs");
    let mut alone = c.state.clone();
    let (mut want_out, mut want_snaps) = c.launch(0..2, &mut alone, &[1, 1], 1, true).expect("run");
    let (o, s) = c.launch(2..3, &mut alone, &[0], 0, true).expect("row");
    want_out.extend(o);
    want_snaps.extend(s);
    assert_eq!(bits_bf16(&out), bits_bf16(&want_out), "conv out");
    assert_eq!(bits_bf16(&snaps), bits_bf16(&want_snaps), "conv snapshots");
    assert_eq!(bits_bf16(&runs), bits_bf16(&alone), "conv state");

    let rec = Rec::new(12, SMALL, 3, 2);
    let mut runs = rec.state.clone();
    let (out, snaps) = rec
        .launch(0..3, &mut runs, &[1, 1, 0], 2, true, 2)
        .expect("runs");
    let mut alone = rec.state.clone();
    let (mut want_out, mut want_snaps) = rec
        .launch(0..2, &mut alone, &[1, 1], 1, true, 2)
        .expect("run");
    let (o, s) = rec.launch(2..3, &mut alone, &[0], 0, true, 2).expect("row");
    want_out.extend(o);
    want_snaps.extend(s);
    assert_eq!(bits_bf16(&out), bits_bf16(&want_out), "recurrence out");
    assert_eq!(
        bits_f32(&snaps),
        bits_f32(&want_snaps),
        "recurrence snapshots"
    );
    assert_eq!(bits_f32(&runs), bits_f32(&alone), "recurrence state");
}

// ---- state written to other slots (`out_slots`) ----------------------------------------------

/// The slot ranges of `state` (`se` elements a slot) named by `slots`, in order.
fn slot_bits<T: Copy, B>(state: &[T], se: usize, slots: &[i32], bits: fn(&[T]) -> B) -> Vec<B> {
    slots
        .iter()
        .map(|&s| bits(&state[s as usize * se..][..se]))
        .collect()
}

#[test]
fn rows_writing_other_slots_give_the_in_place_bytes_there_and_leave_the_slots_read() {
    // (read, written, chain): independent rows (one padding pair in place on slot 0), a chain,
    // and verify runs; slots 0..8.
    let cases: [(&[i32], &[i32], u32); 3] = [
        (&[2, 0, 3, 0], &[5, 0, 7, 0], 0),
        (&[3, 3, 3, 3], &[6, 6, 6, 6], 1),
        (&[1, 1, 4, 4], &[2, 2, 7, 7], 2),
    ];
    for (i, &(reads, writes, chain)) in cases.iter().enumerate() {
        let rows = reads.len();
        let moved: Vec<i32> = (0..8).filter(|s| !writes.contains(s)).collect();
        let c = Conv::new(20 + i as u64, rows, 8);
        let se = c.slot_elems();
        let mut in_place = c.state.clone();
        let want = c
            .launch(0..rows, &mut in_place, reads, chain, true)
            .unwrap();
        let mut state = c.state.clone();
        let got = c
            .launch_to(0..rows, &mut state, [reads, writes], chain, true)
            .unwrap();
        assert_eq!(bits_bf16(&got.0), bits_bf16(&want.0), "case {i}: conv out");
        assert_eq!(
            bits_bf16(&got.1),
            bits_bf16(&want.1),
            "case {i}: conv snapshots"
        );
        assert_eq!(
            slot_bits(&state, se, writes, bits_bf16),
            slot_bits(&in_place, se, reads, bits_bf16),
            "case {i}: conv slots written"
        );
        assert_eq!(
            slot_bits(&state, se, &moved, bits_bf16),
            slot_bits(&c.state, se, &moved, bits_bf16),
            "case {i}: conv slots not written (the slots read among them)"
        );

        let rec = Rec::new(30 + i as u64, SMALL, rows, 8);
        let se = SMALL.state();
        let mut in_place = rec.state.clone();
        let want = rec
            .launch(0..rows, &mut in_place, reads, chain, true, 2)
            .unwrap();
        let mut state = rec.state.clone();
        let got = rec
            .launch_to(0..rows, &mut state, [reads, writes], (chain, true), 2)
            .unwrap();
        assert_eq!(
            bits_bf16(&got.0),
            bits_bf16(&want.0),
            "case {i}: recurrence out"
        );
        assert_eq!(
            bits_f32(&got.1),
            bits_f32(&want.1),
            "case {i}: recurrence snapshots"
        );
        assert_eq!(
            slot_bits(&state, se, writes, bits_f32),
            slot_bits(&in_place, se, reads, bits_f32),
            "case {i}: recurrence slots written"
        );
        assert_eq!(
            slot_bits(&state, se, &moved, bits_f32),
            slot_bits(&rec.state, se, &moved, bits_f32),
            "case {i}: recurrence slots not written"
        );
    }
}

#[test]
fn slots_written_that_would_race_are_refused_without_writing() {
    // (read, written, the error's words)
    let cases: [(&[i32], &[i32], &str); 5] = [
        (&[1, 2], &[3, 3], "both write slot 3"),
        (&[1, 2], &[3, 1], "which row 0 reads"),
        (&[1, 2], &[2, 3], "which row 1 reads"),
        (&[0, 0], &[0, 3], "writes slot 3, not 0"),
        (&[1, 2], &[3, 4], "out slot 4 outside"),
    ];
    let c = Conv::new(40, 2, 4);
    let rec = Rec::new(41, SMALL, 2, 4);
    for (reads, writes, needle) in cases {
        let mut state = c.state.clone();
        refused_kernel(
            c.launch_to(0..2, &mut state, [reads, writes], 0, true),
            needle,
        );
        assert_eq!(
            bits_bf16(&state),
            bits_bf16(&c.state),
            "{needle}: conv state written"
        );
        let mut state = rec.state.clone();
        refused_kernel(
            rec.launch_to(0..2, &mut state, [reads, writes], (0, true), 2),
            needle,
        );
        assert_eq!(
            bits_f32(&state),
            bits_f32(&rec.state),
            "{needle}: state written"
        );
    }
}
