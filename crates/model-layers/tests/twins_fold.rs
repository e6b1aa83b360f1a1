//! The o-fold twins (`attn::paged_decode_o`, `attn::paged_causal_o`, the `fold_o_proj`
//! lever): attention → (sigmoid gate →) o projection → residual add in one launch. Not
//! byte-identical to the reference twins in sequence (per-head partial dots summed in head
//! order, not one dot over heads·head_dim), but close to them, equal to that arithmetic done by
//! hand from the numerics primitives, and independent of the thread count.

mod twins_support;

use half::bf16;
use solder_model_layers::kernels::attn::fold::o_scratch_bytes;
use solder_model_layers::kernels::attn::{PagedAttentionO, PAGED_CAUSAL_O, PAGED_DECODE_O};
use solder_model_layers::kernels::{act, add, attn, gemv, Launch, Name};
use solder_model_layers::numerics::{dot_bf16, linear_value, residual_value};
use twins_support::{
    attn_scratch, bits_f32, poison_bf16, poison_f32, rd, run, run_threads, wr, Rng,
};

/// rows, heads, kv_heads, head_dim, n_out, block, max_blocks, pages.
#[derive(Clone, Copy)]
struct Shape {
    rows: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    n_out: usize,
    block: usize,
    max_blocks: usize,
    pages: usize,
}

struct Inputs {
    s: Shape,
    q: Vec<bf16>,
    cache: Vec<bf16>,
    tables: Vec<i32>,
    lens: Vec<i32>,
    gate: Option<Vec<bf16>>,
    wo: Vec<bf16>,
    bias: Option<Vec<bf16>>,
    h: Vec<f32>,
    scale: f32,
}

impl Inputs {
    fn random(seed: u64, s: Shape, gated: bool, biased: bool) -> Inputs {
        let mut rng = Rng::new(seed);
        let in_features = s.heads * s.d;
        let lens: Vec<i32> = (0..s.rows)
            .map(|r| 1 + ((r * 7 + seed as usize) % (s.block * s.max_blocks)) as i32)
            .collect();
        Inputs {
            q: rng.bf16s(s.rows * in_features, 1.0),
            cache: rng.bf16s(s.pages * 2 * s.block * s.kv_heads * s.d, 1.0),
            tables: (0..s.rows * s.max_blocks)
                .map(|_| rng.below(s.pages) as i32)
                .collect(),
            lens,
            gate: gated.then(|| rng.bf16s(s.rows * in_features, 3.0)),
            wo: rng.bf16s(s.n_out * in_features, 0.5),
            bias: biased.then(|| rng.bf16s(s.n_out, 0.5)),
            h: rng.f32s(s.rows * s.n_out, 2.0),
            scale: 1.0 / (s.d as f32).sqrt(),
            s,
        }
    }

    fn attention(&self, kernel: Name<attn::PagedAttention>) -> Vec<bf16> {
        let s = self.s;
        let mut out = poison_bf16(self.q.len());
        let mut scratch = attn_scratch(s.rows as u32, s.heads as u32, s.d as u32);
        run(attn::PagedAttention {
            q: rd(&self.q),
            cache: rd(&self.cache),
            block_tables: rd(&self.tables),
            seq_lens: rd(&self.lens),
            gate: None,
            out: wr(&mut out),
            scratch: wr(&mut scratch),
            rows: s.rows as u32,
            heads: s.heads as u32,
            kv_heads: s.kv_heads as u32,
            head_dim: s.d as u32,
            block_size: s.block as u32,
            max_blocks: s.max_blocks as u32,
            num_pages: s.pages as u32,
            window: 0,
            scale: self.scale,
        }
        .launch(kernel));
        out
    }

    /// The reference routing: attention, (sigmoid_mul,) linear, residual_add, one launch each.
    fn reference(&self) -> Vec<f32> {
        let s = self.s;
        let in_features = s.heads * s.d;
        let mut x = self.attention(attn::PAGED_DECODE);
        if let Some(gate) = &self.gate {
            let mut gated = poison_bf16(x.len());
            run(act::Gated {
                a: rd(&x),
                b: rd(gate),
                out: wr(&mut gated),
                rows: s.rows as u32,
                width: in_features as u32,
            }
            .launch(act::SIGMOID_MUL));
            x = gated;
        }
        let mut y = poison_bf16(s.rows * s.n_out);
        run(gemv::Linear {
            x: rd(&x),
            w: rd(&self.wo),
            bias: self.bias.as_deref().map(rd),
            y: wr(&mut y),
            rows: s.rows as u32,
            k: in_features as u32,
            n_out: s.n_out as u32,
            scratch: None,
        }
        .launch(gemv::LINEAR));
        let mut out = poison_f32(s.rows * s.n_out);
        run(add::ResidualAdd {
            h: rd(&self.h),
            x: rd(&y),
            out: wr(&mut out),
            rows: s.rows as u32,
            hidden: s.n_out as u32,
        }
        .launch(add::RESIDUAL_ADD));
        out
    }

    /// The fused launch over the given outputs and scratches.
    fn fused_launch(
        &self,
        kernel: Name<PagedAttentionO>,
        h_out: &mut [f32],
        scratch: &mut [f32],
        o_scratch: &mut [f32],
    ) -> Launch {
        let s = self.s;
        PagedAttentionO {
            q: rd(&self.q),
            cache: rd(&self.cache),
            block_tables: rd(&self.tables),
            seq_lens: rd(&self.lens),
            gate: self.gate.as_deref().map(rd),
            wo: rd(&self.wo),
            bias: self.bias.as_deref().map(rd),
            h: rd(&self.h),
            h_out: wr(h_out),
            scratch: wr(scratch),
            o_scratch: wr(o_scratch),
            rows: s.rows as u32,
            heads: s.heads as u32,
            kv_heads: s.kv_heads as u32,
            head_dim: s.d as u32,
            block_size: s.block as u32,
            max_blocks: s.max_blocks as u32,
            num_pages: s.pages as u32,
            window: 0,
            scale: self.scale,
            n_out: s.n_out as u32,
        }
        .launch(kernel)
    }

    fn fused(&self, kernel: Name<PagedAttentionO>, threads: usize) -> Vec<f32> {
        let s = self.s;
        let mut out = poison_f32(s.rows * s.n_out);
        let mut scratch = attn_scratch(s.rows as u32, s.heads as u32, s.d as u32);
        let mut o_scratch = vec![0.0f32; o_scratch_bytes(s.rows, s.heads, s.n_out) / 4];
        let launch = self.fused_launch(kernel, &mut out, &mut scratch, &mut o_scratch);
        run_threads(&launch, threads).unwrap_or_else(|e| panic!("{}: {e}", launch.kernel));
        out
    }

    /// The fold's arithmetic from the primitives: the attention twin's bf16 heads (gated as
    /// sigmoid_mul stores them), one dot per head, summed in head order from +0, bias, bf16,
    /// residual.
    fn by_hand(&self) -> Vec<f32> {
        let s = self.s;
        let in_features = s.heads * s.d;
        let x = match &self.gate {
            None => self.attention(attn::PAGED_DECODE),
            Some(gate) => {
                let x = self.attention(attn::PAGED_DECODE);
                let mut gated = poison_bf16(x.len());
                run(act::Gated {
                    a: rd(&x),
                    b: rd(gate),
                    out: wr(&mut gated),
                    rows: s.rows as u32,
                    width: in_features as u32,
                }
                .launch(act::SIGMOID_MUL));
                gated
            }
        };
        let mut out = Vec::with_capacity(s.rows * s.n_out);
        for r in 0..s.rows {
            for f in 0..s.n_out {
                let mut acc = 0.0f32;
                for h in 0..s.heads {
                    let xs = &x[r * in_features + h * s.d..][..s.d];
                    let ws = &self.wo[f * in_features + h * s.d..][..s.d];
                    acc += dot_bf16(xs, ws);
                }
                let y = linear_value(acc, self.bias.as_ref().map(|b| b[f]));
                out.push(residual_value(self.h[r * s.n_out + f], y));
            }
        }
        out
    }
}

const SHAPES: [Shape; 2] = [
    // head_dim 20: not a multiple of the 16 lanes nor of 8 (the CUDA chunk)
    Shape {
        rows: 3,
        heads: 4,
        kv_heads: 2,
        d: 20,
        n_out: 40,
        block: 4,
        max_blocks: 5,
        pages: 16,
    },
    Shape {
        rows: 2,
        heads: 8,
        kv_heads: 2,
        d: 64,
        n_out: 96,
        block: 4,
        max_blocks: 6,
        pages: 12,
    },
];

#[test]
fn the_fold_is_its_own_arithmetic_and_close_to_the_reference_routing() {
    for (i, shape) in SHAPES.into_iter().enumerate() {
        for seed in 0..4u64 {
            let (gated, biased) = (seed % 2 == 1, seed >= 2);
            let inputs = Inputs::random(100 * i as u64 + seed, shape, gated, biased);
            let what = format!("shape {i} seed {seed} (gated {gated}, bias {biased})");
            close_and_by_hand(&inputs, 0.0, &what);
        }
    }
}

/// The twin equals `by_hand` bit for bit and stays within one bf16 rounding of the projection
/// (2^-7 of its magnitude, with slack) plus `slack` of the reference routing; returns how many
/// outputs differ from the reference routing's bytes.
fn close_and_by_hand(inputs: &Inputs, slack: f32, what: &str) -> usize {
    let fused = inputs.fused(PAGED_DECODE_O, 1);
    assert_eq!(
        bits_f32(&fused),
        bits_f32(&inputs.by_hand()),
        "{what}: the twin is per-head dots summed in head order"
    );
    let reference = inputs.reference();
    let mut differing = 0;
    for ((f, r), h) in fused.iter().zip(&reference).zip(&inputs.h) {
        assert!(f.is_finite() && r.is_finite(), "{what}");
        let y = (r - h).abs().max(1.0);
        assert!(
            (f - r).abs() <= y / 64.0 + slack,
            "{what}: fused {f} vs reference {r}"
        );
        differing += (f.to_bits() != r.to_bits()) as usize;
    }
    differing
}

/// Random inputs rarely move a bf16 rounding (the reordered f32 sums differ by a few f32
/// ulps), so this one makes the order matter: heads 0 and 1 see the same q and kv head, so
/// their outputs are the same bits, and their o weights are opposite and 2^12 times larger.
/// The fold's head-order sum cancels them exactly; the reference's one dot interleaves them
/// in its lanes and keeps a rounding residue, which moves some outputs.
#[test]
fn the_head_order_is_what_the_twin_sums_in() {
    let shape = SHAPES[0];
    let mut inputs = Inputs::random(41, shape, false, true);
    let (d, heads, in_features) = (shape.d, shape.heads, shape.heads * shape.d);
    for r in 0..shape.rows {
        let row = r * heads * d;
        let head0: Vec<bf16> = inputs.q[row..row + d].to_vec();
        inputs.q[row + d..row + 2 * d].copy_from_slice(&head0);
    }
    let big = 4096.0f32;
    for f in 0..shape.n_out {
        for i in 0..d {
            let w = bf16::from_f32(inputs.wo[f * in_features + i].to_f32() * big);
            inputs.wo[f * in_features + i] = w;
            inputs.wo[f * in_features + d + i] = -w;
        }
    }
    let differing = close_and_by_hand(&inputs, big / 4096.0, "cancelling heads");
    assert!(differing > 0, "no output moved: the test has no teeth");
}

#[test]
fn the_causal_form_and_every_thread_count_give_the_same_bytes() {
    let inputs = Inputs::random(7, SHAPES[1], true, true);
    let one = inputs.fused(PAGED_DECODE_O, 1);
    assert_eq!(bits_f32(&one), bits_f32(&inputs.fused(PAGED_DECODE_O, 4)));
    assert_eq!(bits_f32(&one), bits_f32(&inputs.fused(PAGED_CAUSAL_O, 3)));
}

#[test]
fn a_short_o_scratch_or_a_mismatched_residual_is_refused_by_name() {
    let inputs = Inputs::random(3, SHAPES[0], false, false);
    let s = inputs.s;
    let mut out = poison_f32(s.rows * s.n_out);
    let mut scratch = attn_scratch(s.rows as u32, s.heads as u32, s.d as u32);
    let mut o_scratch = vec![0.0f32; o_scratch_bytes(s.rows, s.heads, s.n_out) / 4 - 1];
    let launch = inputs.fused_launch(PAGED_DECODE_O, &mut out, &mut scratch, &mut o_scratch);
    let e = run_threads(&launch, 1).unwrap_err().to_string();
    assert!(
        e.contains("attn::paged_decode_o") && e.contains("o_scratch"),
        "{e}"
    );
    assert!(
        out.iter().all(|x| x.is_nan()),
        "nothing written before the checks"
    );

    let mut short = poison_f32(s.rows * s.n_out - 1);
    let mut o_scratch = vec![0.0f32; o_scratch_bytes(s.rows, s.heads, s.n_out) / 4];
    let launch = inputs.fused_launch(PAGED_DECODE_O, &mut short, &mut scratch, &mut o_scratch);
    let e = run_threads(&launch, 1).unwrap_err().to_string();
    assert!(e.contains("h_out"), "{e}");
}
