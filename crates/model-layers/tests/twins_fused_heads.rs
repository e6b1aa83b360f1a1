//! The fused per-head twins give the same bytes as qk_norm → rope → kv_write run in sequence
//! (Qwen3-Next's gated one as gate_split → qk_norm_zc → rope → kv_write), and
//! `gemv::qkv_rope_kv` the same bytes as (add_)norm_qkv followed by them.

mod twins_support;

use half::bf16;
use solder_model_layers::kernels::{attn, gemv, kv, norm, rope};
use twins_support::{bits_bf16, bits_f32, poison_bf16, poison_f32, rd, run, wr, Rng};

const EPS: f32 = 1e-6;
const ROWS: [usize; 3] = [1, 3, 8];

// ---- per-head kernels -------------------------------------------------------------------------

const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 24;
const BLOCK: usize = 4;
const PAGES: usize = 6;

struct HeadInputs {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    wq: Vec<bf16>,
    wk: Vec<bf16>,
    positions: Vec<i32>,
    inv_freq: Vec<f32>,
    slots: Vec<i32>,
    cache: Vec<bf16>,
    rows: usize,
    rotary: usize,
}

impl HeadInputs {
    fn new(rng: &mut Rng, rows: usize, rotary: usize) -> HeadInputs {
        let mut slots: Vec<i32> = (0..(PAGES * BLOCK) as i32).collect();
        for i in (1..slots.len()).rev() {
            slots.swap(i, rng.below(i + 1));
        }
        slots.truncate(rows);
        // The inverse frequencies, then a YaRN-like attention scaling.
        let inv_freq = (0..rotary / 2)
            .map(|i| 10000f32.powf(-((2 * i) as f32) / rotary as f32))
            .chain([1.138_629_4])
            .collect();
        HeadInputs {
            q: rng.bf16s(rows * HEADS * HEAD_DIM, 2.0),
            k: rng.bf16s(rows * KV_HEADS * HEAD_DIM, 2.0),
            v: rng.bf16s(rows * KV_HEADS * HEAD_DIM, 2.0),
            wq: rng.bf16s(HEAD_DIM, 1.5),
            wk: rng.bf16s(HEAD_DIM, 1.5),
            positions: (0..rows).map(|_| rng.below(5000) as i32).collect(),
            inv_freq,
            slots,
            cache: rng.bf16s(PAGES * 2 * BLOCK * KV_HEADS * HEAD_DIM, 1.0),
            rows,
            rotary,
        }
    }

    fn dims(&self) -> (u32, u32, u32, u32) {
        (
            self.rows as u32,
            HEADS as u32,
            KV_HEADS as u32,
            HEAD_DIM as u32,
        )
    }

    fn qk_norm(&self) -> (Vec<bf16>, Vec<bf16>) {
        let (mut qo, mut ko) = (poison_bf16(self.q.len()), poison_bf16(self.k.len()));
        let (r, h, kvh, d) = self.dims();
        run(norm::QkNorm {
            q: rd(&self.q),
            k: rd(&self.k),
            wq: rd(&self.wq),
            wk: rd(&self.wk),
            q_out: wr(&mut qo),
            k_out: wr(&mut ko),
            rows: r,
            heads: h,
            kv_heads: kvh,
            head_dim: d,
            eps: EPS,
        }
        .launch(norm::QK_NORM));
        (qo, ko)
    }

    fn rope(&self, q: &[bf16], k: &[bf16]) -> (Vec<bf16>, Vec<bf16>) {
        let (mut qo, mut ko) = (poison_bf16(q.len()), poison_bf16(k.len()));
        let (r, h, kvh, d) = self.dims();
        run(rope::Rope {
            q: rd(q),
            k: rd(k),
            positions: rd(&self.positions),
            inv_freq: rd(&self.inv_freq),
            q_out: wr(&mut qo),
            k_out: wr(&mut ko),
            rows: r,
            heads: h,
            kv_heads: kvh,
            head_dim: d,
            rotary_dim: self.rotary as u32,
        }
        .launch(rope::ROPE));
        (qo, ko)
    }

    fn kv_write(&self, k: &[bf16]) -> Vec<bf16> {
        let mut cache = self.cache.clone();
        let (r, _, kvh, d) = self.dims();
        run(kv::KvWrite {
            k: rd(k),
            v: rd(&self.v),
            slot_mapping: rd(&self.slots),
            cache: wr(&mut cache),
            rows: r,
            kv_heads: kvh,
            head_dim: d,
            block_size: BLOCK as u32,
            num_pages: PAGES as u32,
        }
        .launch(kv::KV_WRITE));
        cache
    }
}

#[test]
fn rope_fusions_match_qk_norm_rope_and_kv_write() {
    let mut rng = Rng::new(5);
    for rows in ROWS {
        for rotary in [HEAD_DIM, 16] {
            let t = HeadInputs::new(&mut rng, rows, rotary);
            let (r, h, kvh, d) = t.dims();
            let (rot, bs, pages) = (rotary as u32, BLOCK as u32, PAGES as u32);
            let what = format!("rows {rows} rotary {rotary}");

            // qk_norm → rope
            let (qn, kn) = t.qk_norm();
            let (q_ref, k_ref) = t.rope(&qn, &kn);
            let (mut qo, mut ko) = (poison_bf16(t.q.len()), poison_bf16(t.k.len()));
            run(rope::QkNormRope {
                q: rd(&t.q),
                k: rd(&t.k),
                wq: rd(&t.wq),
                wk: rd(&t.wk),
                positions: rd(&t.positions),
                inv_freq: rd(&t.inv_freq),
                q_out: wr(&mut qo),
                k_out: wr(&mut ko),
                rows: r,
                heads: h,
                kv_heads: kvh,
                head_dim: d,
                rotary_dim: rot,
                eps: EPS,
            }
            .launch(rope::QK_NORM_ROPE));
            assert_eq!(bits_bf16(&qo), bits_bf16(&q_ref), "qk_norm_rope q {what}");
            assert_eq!(bits_bf16(&ko), bits_bf16(&k_ref), "qk_norm_rope k {what}");

            // qk_norm → rope → kv_write
            let cache_ref = t.kv_write(&k_ref);
            let (mut qo, mut cache) = (poison_bf16(t.q.len()), t.cache.clone());
            run(rope::QkNormRopeKvWrite {
                q: rd(&t.q),
                k: rd(&t.k),
                v: rd(&t.v),
                wq: rd(&t.wq),
                wk: rd(&t.wk),
                positions: rd(&t.positions),
                inv_freq: rd(&t.inv_freq),
                slot_mapping: rd(&t.slots),
                q_out: wr(&mut qo),
                cache: wr(&mut cache),
                rows: r,
                heads: h,
                kv_heads: kvh,
                head_dim: d,
                rotary_dim: rot,
                block_size: bs,
                num_pages: pages,
                eps: EPS,
            }
            .launch(rope::QK_NORM_ROPE_KV_WRITE));
            assert_eq!(
                bits_bf16(&qo),
                bits_bf16(&q_ref),
                "qk_norm_rope_kv_write q {what}"
            );
            assert_eq!(
                bits_bf16(&cache),
                bits_bf16(&cache_ref),
                "qk_norm_rope_kv_write cache {what}"
            );

            // rope → kv_write
            let (q_ref, k_ref) = t.rope(&t.q, &t.k);
            let cache_ref = t.kv_write(&k_ref);
            let (mut qo, mut cache) = (poison_bf16(t.q.len()), t.cache.clone());
            run(rope::RopeKvWrite {
                q: rd(&t.q),
                k: rd(&t.k),
                v: rd(&t.v),
                positions: rd(&t.positions),
                inv_freq: rd(&t.inv_freq),
                slot_mapping: rd(&t.slots),
                q_out: wr(&mut qo),
                cache: wr(&mut cache),
                rows: r,
                heads: h,
                kv_heads: kvh,
                head_dim: d,
                rotary_dim: rot,
                block_size: bs,
                num_pages: pages,
            }
            .launch(rope::ROPE_KV_WRITE));
            assert_eq!(bits_bf16(&qo), bits_bf16(&q_ref), "rope_kv_write q {what}");
            assert_eq!(
                bits_bf16(&cache),
                bits_bf16(&cache_ref),
                "rope_kv_write cache {what}"
            );
            assert_ne!(bits_bf16(&cache), bits_bf16(&t.cache), "the write happened");
        }
    }
}

#[test]
fn gated_head_pass_matches_gate_split_qk_norm_zc_rope_kv_write() {
    let mut rng = Rng::new(6);
    for rows in ROWS {
        for rotary in [HEAD_DIM, 6] {
            let t = HeadInputs::new(&mut rng, rows, rotary);
            let (r, h, kvh, d) = t.dims();
            let what = format!("rows {rows} rotary {rotary}");
            // The gated projection: each head's q, then its gate.
            let gate_in = rng.bf16s(t.q.len(), 4.0);
            let q2: Vec<bf16> =
                t.q.chunks_exact(HEAD_DIM)
                    .zip(gate_in.chunks_exact(HEAD_DIM))
                    .flat_map(|(q, g)| q.iter().chain(g).copied())
                    .collect();

            // gate_split → qk_norm_zc → rope → kv_write
            let (mut q_split, mut gate_ref) = (poison_bf16(t.q.len()), poison_bf16(t.q.len()));
            run(attn::GateSplit {
                q2: rd(&q2),
                q: wr(&mut q_split),
                gate: wr(&mut gate_ref),
                rows: r,
                heads: h,
                head_dim: d,
            }
            .launch(attn::GATE_SPLIT));
            let (mut qn, mut kn) = (poison_bf16(t.q.len()), poison_bf16(t.k.len()));
            run(norm::QkNorm {
                q: rd(&q_split),
                k: rd(&t.k),
                wq: rd(&t.wq),
                wk: rd(&t.wk),
                q_out: wr(&mut qn),
                k_out: wr(&mut kn),
                rows: r,
                heads: h,
                kv_heads: kvh,
                head_dim: d,
                eps: EPS,
            }
            .launch(norm::QK_NORM_ZC));
            let (q_ref, k_ref) = t.rope(&qn, &kn);
            let cache_ref = t.kv_write(&k_ref);

            let (mut qo, mut gate, mut cache) = (
                poison_bf16(t.q.len()),
                poison_bf16(t.q.len()),
                t.cache.clone(),
            );
            run(rope::GatedQkNormZcRopeKvWrite {
                q2: rd(&q2),
                k: rd(&t.k),
                v: rd(&t.v),
                wq: rd(&t.wq),
                wk: rd(&t.wk),
                positions: rd(&t.positions),
                inv_freq: rd(&t.inv_freq),
                slot_mapping: rd(&t.slots),
                q_out: wr(&mut qo),
                gate_out: wr(&mut gate),
                cache: wr(&mut cache),
                rows: r,
                heads: h,
                kv_heads: kvh,
                head_dim: d,
                rotary_dim: rotary as u32,
                block_size: BLOCK as u32,
                num_pages: PAGES as u32,
                eps: EPS,
            }
            .launch(rope::GATED_QK_NORM_ZC_ROPE_KV_WRITE));
            assert_eq!(bits_bf16(&qo), bits_bf16(&q_ref), "gated q {what}");
            assert_eq!(bits_bf16(&gate), bits_bf16(&gate_ref), "gated gate {what}");
            assert_eq!(
                bits_bf16(&cache),
                bits_bf16(&cache_ref),
                "gated cache {what}"
            );
            // Zero-centred: the plain qk-norm's bytes differ.
            assert_ne!(bits_bf16(&qn), bits_bf16(&t.qk_norm().0), "zc {what}");
        }
    }
}

// ---- q/k/v projections with the head epilogue ----------------------------------------------

const HIDDEN: usize = 40;

#[test]
fn qkv_rope_kv_matches_add_norm_qkv_then_the_head_kernels() {
    let mut rng = Rng::new(11);
    let (nq, nkv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    for rows in [1, 3, 9] {
        for (add, qk, rotary) in [
            (true, false, HEAD_DIM),
            (false, false, 16),
            (true, true, 16),
            (false, true, HEAD_DIM),
        ] {
            let t = HeadInputs::new(&mut rng, rows.min(8), rotary);
            let mut t = HeadInputs {
                positions: (0..rows).map(|_| rng.below(5000) as i32).collect(),
                slots: {
                    let mut s: Vec<i32> = (0..(PAGES * BLOCK) as i32).collect();
                    for i in (1..s.len()).rev() {
                        s.swap(i, rng.below(i + 1));
                    }
                    s.truncate(rows);
                    s
                },
                rows,
                ..t
            };
            let what = format!("rows {rows} add {add} qk-norm {qk} rotary {rotary}");
            let h = rng.f32s(rows * HIDDEN, 2.0);
            let d = rng.bf16s(rows * HIDDEN, 2.0);
            let wn = rng.bf16s(HIDDEN, 1.5);
            let (wq, wk, wv) = (
                rng.bf16s(nq * HIDDEN, 0.5),
                rng.bf16s(nkv * HIDDEN, 0.5),
                rng.bf16s(nkv * HIDDEN, 0.5),
            );
            let (bq, bk, bv) = (rng.bf16s(nq, 0.5), rng.bf16s(nkv, 0.5), rng.bf16s(nkv, 0.5));
            let (r32, k32) = (rows as u32, HIDDEN as u32);

            // The reference: (add_)norm_qkv, then (qk_norm →) rope, then kv_write.
            let (mut q, mut k, mut v) = (
                poison_bf16(rows * nq),
                poison_bf16(rows * nkv),
                poison_bf16(rows * nkv),
            );
            let mut sum_ref = poison_f32(rows * HIDDEN);
            if add {
                run(gemv::AddNormQkv {
                    h: rd(&h),
                    d: rd(&d),
                    wn: rd(&wn),
                    wq: rd(&wq),
                    bq: Some(rd(&bq)),
                    wk: rd(&wk),
                    bk: Some(rd(&bk)),
                    wv: rd(&wv),
                    bv: Some(rd(&bv)),
                    h_out: Some(wr(&mut sum_ref)),
                    q: wr(&mut q),
                    k_out: wr(&mut k),
                    v: wr(&mut v),
                    rows: r32,
                    k: k32,
                    nq: nq as u32,
                    nkv: nkv as u32,
                    eps: EPS,
                    scratch: None,
                }
                .launch(gemv::ADD_NORM_QKV));
            } else {
                run(gemv::NormQkv {
                    h: rd(&h),
                    wn: rd(&wn),
                    wq: rd(&wq),
                    bq: Some(rd(&bq)),
                    wk: rd(&wk),
                    bk: Some(rd(&bk)),
                    wv: rd(&wv),
                    bv: Some(rd(&bv)),
                    q: wr(&mut q),
                    k_out: wr(&mut k),
                    v: wr(&mut v),
                    rows: r32,
                    k: k32,
                    nq: nq as u32,
                    nkv: nkv as u32,
                    eps: EPS,
                    scratch: None,
                }
                .launch(gemv::NORM_QKV));
                sum_ref.copy_from_slice(&h);
            }
            (t.q, t.k, t.v) = (q, k, v);
            let (qn, kn) = if qk {
                t.qk_norm()
            } else {
                (t.q.clone(), t.k.clone())
            };
            let (q_ref, k_ref) = t.rope(&qn, &kn);
            let cache_ref = t.kv_write(&k_ref);

            let (mut qo, mut cache, mut sum) = (
                poison_bf16(rows * nq),
                t.cache.clone(),
                poison_f32(rows * HIDDEN),
            );
            run(gemv::QkvRopeKv {
                h: rd(&h),
                d: add.then(|| rd(&d)),
                wn: rd(&wn),
                wq: rd(&wq),
                bq: Some(rd(&bq)),
                wk: rd(&wk),
                bk: Some(rd(&bk)),
                wv: rd(&wv),
                bv: Some(rd(&bv)),
                qwn: qk.then(|| rd(&t.wq)),
                kwn: qk.then(|| rd(&t.wk)),
                positions: rd(&t.positions),
                inv_freq: rd(&t.inv_freq),
                slot_mapping: rd(&t.slots),
                h_out: Some(wr(&mut sum)),
                q_out: wr(&mut qo),
                cache: wr(&mut cache),
                rows: r32,
                k: k32,
                heads: HEADS as u32,
                kv_heads: KV_HEADS as u32,
                head_dim: HEAD_DIM as u32,
                rotary_dim: rotary as u32,
                block_size: BLOCK as u32,
                num_pages: PAGES as u32,
                eps: EPS,
                qk_eps: EPS,
                scratch: None,
            }
            .launch(gemv::QKV_ROPE_KV));
            assert_eq!(bits_bf16(&qo), bits_bf16(&q_ref), "q {what}");
            assert_eq!(bits_bf16(&cache), bits_bf16(&cache_ref), "cache {what}");
            assert_eq!(bits_f32(&sum), bits_f32(&sum_ref), "h_out {what}");
            assert_ne!(bits_bf16(&cache), bits_bf16(&t.cache), "the write happened");
        }
    }
}
