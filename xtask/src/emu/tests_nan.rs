//! NaN and ±inf through the host emulation of the CUDA kernels (issue 18): every kernel driven
//! here runs beside its CPU twin (shadow mode) on inputs holding NaN, +inf and −inf — in
//! activations and hidden states, and in weights where a weight is an input of its own — with
//! some rows clean, so both the poisoned and the finite paths run.
//!
//! The comparison is shadow mode's: every twin does its kernel's arithmetic in its order, so
//! each kernel must write the same bytes (bf16 NaN is the canonical 0x7fff on both sides:
//! `numerics::to_bf16`; f32 NaN comes out of the same host operations in the same order, and
//! two f32 NaNs count as equal whatever their bits).
//! Each test also checks that its outputs do hold NaN, so the comparison is not vacuous.
//!
//! Every declared kernel is either driven here or named in `NOT_DRIVEN` with the reason.

use half::bf16;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::kernels::{Buf, Launch};

use super::tests::{download, emulated, run, upload};

/// Kernels with no launch in this file, and why.
const NOT_DRIVEN: &[(&str, &str)] = &[(
    "gemv::counters_reset",
    "zeroes the step's integer merge counters: it reads no floating-point value",
)];

/// A value at index `i` of a stream `seed`: NaN, +inf or −inf at fixed sparse places
/// (`poisoned`), else a finite value in −1..1.
pub(super) fn value(i: usize, seed: f32, poisoned: bool) -> f32 {
    if poisoned {
        match i % 29 {
            3 => return f32::NAN,
            11 => return f32::INFINITY,
            19 => return f32::NEG_INFINITY,
            _ => {}
        }
    }
    ((i as f32 + seed) * 0.618_034).sin()
}

/// `rows` rows of `width` values; rows in `poisoned` carry NaN and ±inf.
pub(super) fn rows_of(rows: usize, width: usize, seed: f32, poisoned: &[usize]) -> Vec<f32> {
    (0..rows * width)
        .map(|i| value(i, seed, poisoned.contains(&(i / width))))
        .collect()
}

pub(super) fn bf16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(super) fn i32_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

struct Bench {
    backend: CpuBackend,
}

impl Bench {
    fn new() -> Bench {
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
        emulated(EmuMode::Shadow, &mut backend);
        Bench { backend }
    }

    fn bf16(&mut self, values: &[f32]) -> Buf {
        upload(&mut self.backend, &bf16_bytes(values))
    }

    fn f32(&mut self, values: &[f32]) -> Buf {
        upload(&mut self.backend, &f32_bytes(values))
    }

    fn i32(&mut self, values: &[i32]) -> Buf {
        upload(&mut self.backend, &i32_bytes(values))
    }

    /// A zeroed buffer of `bytes`.
    fn zeros(&mut self, bytes: usize) -> Buf {
        upload(&mut self.backend, &vec![0u8; bytes])
    }

    fn run(&mut self, launch: &Launch) {
        run(&mut self.backend, launch);
    }

    /// How many NaN values the bf16 (`elem` 2) or f32 (`elem` 4) buffer holds.
    fn nans(&mut self, buf: Buf, elem: usize) -> usize {
        let bytes = download(&mut self.backend, buf.ptr, buf.bytes);
        bytes
            .chunks_exact(elem)
            .filter(|b| match elem {
                2 => bf16::from_le_bytes([b[0], b[1]]).is_nan(),
                _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_nan(),
            })
            .count()
    }

    /// `buf` holds NaN and finite values both (the poisoned and the clean rows).
    fn mixed(&mut self, what: &str, buf: Buf, elem: usize) {
        let nans = self.nans(buf, elem);
        let n = buf.bytes / elem;
        assert!(
            nans > 0,
            "{what}: no NaN in the output, the test is vacuous"
        );
        assert!(
            nans < n,
            "{what}: every output is NaN, the clean rows are not"
        );
    }

    /// Every kernel in `kernels` ran and wrote its twin's bytes on every launch.
    fn agree(&self, kernels: &[&str]) {
        let report = self.backend.emulation().unwrap().report();
        for name in kernels {
            let k = report
                .get(*name)
                .unwrap_or_else(|| panic!("{name}: never launched"));
            assert!(k.launches > 0, "{name}: never launched");
            assert_eq!(k.identical, k.launches, "{name}: {k:?}");
        }
    }
}

/// Every kernel the tests below launch, for the coverage check.
const DRIVEN: &[&str] = &[
    "act::silu_mul",
    "act::sigmoid_mul",
    "add::residual_add",
    "moe::combine_shared",
    "moe::gate_combine_shared",
    "attn::gate_split",
    "embed::embedding",
    "kv::kv_write",
    "norm::rms_norm",
    "norm::rms_norm_zc",
    "norm::add_rms_norm",
    "norm::add_rms_norm_zc",
    "norm::qk_norm",
    "norm::qk_norm_zc",
    "norm::mtp_pre_fc_zc",
    "rope::rope",
    "rope::qk_norm_rope",
    "rope::rope_kv_write",
    "rope::qk_norm_rope_kv_write",
    "rope::gated_qk_norm_zc_rope_kv_write",
    "gemv::linear",
    "gemv::lm_head",
    "gemv::norm_linear",
    "gemv::qkv",
    "gemv::linear_pair",
    "gemv::norm_qkv",
    "gemv::add_norm_qkv",
    "gemv::gate_up_silu",
    "gemv::norm_gate_up_silu",
    "gemv::add_norm_gate_up_silu",
    "gemv::linear_residual_add",
    "gemv::gated_norm_linear_residual_add",
    "gemv::add_norm_lm_head",
    "gemv::qkv_rope_kv",
    "gemm::linear_mma",
    "gemm::linear_mma_fp8",
    "gemm::linear_mma_int4",
    "gemm::lm_head_mma_fp8",
    "gemm::lm_head_mma_int4",
    "gemv::linear_fp8",
    "gemv::linear_int4",
    "gemv::lm_head_fp8",
    "gemv::lm_head_int4",
    "gemm::lm_head_mma",
    "gemm::qkv_mma",
    "gemm::linear_pair_mma",
    "gemm::gate_up_silu_mma",
    "gemm::experts_gate_up_silu_mma",
    "gemm::experts_down_mma",
    "moe::down_combine",
    "flash::paged_mma",
    // driven in tests_pick (argmax_equals_its_twin_on_every_kind_of_row: NaN, ±inf rows)
    "pick::argmax",
    "moe::topk_softmax",
    "moe::router_topk",
    "moe::gate_up_silu",
    "moe::down",
    // driven in tests_moe_quant (quantized_experts_carry_nan_and_inf_as_their_twins)
    "moe::gate_up_silu_fp8",
    "moe::gate_up_silu_int4",
    "moe::down_fp8",
    "moe::down_int4",
    "gemm::experts_gate_up_silu_mma_fp8",
    "gemm::experts_gate_up_silu_mma_int4",
    "gemm::experts_down_mma_fp8",
    "gemm::experts_down_mma_int4",
    // driven in tests_rope_mma (qkv_rope_kv_mma_carries_nan_and_inf_as_its_twin)
    "gemm::qkv_rope_kv_mma",
    "gemm::qkv_rope_kv_mma_fp8",
    "gemm::qkv_rope_kv_mma_int4",
    // driven in tests_fused_quant (fused_quantized_entries_carry_nan_and_inf_as_their_twins)
    "gemm::qkv_mma_fp8",
    "gemm::qkv_mma_int4",
    "gemm::gate_up_silu_mma_fp8",
    "gemm::gate_up_silu_mma_int4",
    "attn::paged_decode",
    "attn::paged_causal",
    "attn::paged_decode_o",
    "attn::paged_causal_o",
    "gdn::conv",
    "gdn::gates",
    "gdn::recurrence",
    "gdn::recurrence_pitched",
    "gdn::gates_recurrence",
    "gdn::gates_recurrence_pitched",
    "gdn::chunked",
    "gdn::gates_chunked",
    "gdn::chunked_mma",
    "gdn::gates_chunked_mma",
    "gdn::gated_norm",
];

#[test]
fn every_declared_kernel_is_driven_with_nan_or_named_as_not() {
    let missing: Vec<&str> = solder_model_layers::kernels::registry()
        .map(|d| d.name)
        .filter(|n| !DRIVEN.contains(n) && !NOT_DRIVEN.iter().any(|(m, _)| m == n))
        .collect();
    assert!(
        missing.is_empty(),
        "kernels neither driven with NaN/inf nor listed in NOT_DRIVEN: {missing:?}"
    );
}

#[test]
fn elementwise_kernels_carry_nan_and_inf_as_their_twins() {
    use solder_model_layers::kernels::act::{Gated, SIGMOID_MUL, SILU_MUL};
    use solder_model_layers::kernels::add::{ResidualAdd, RESIDUAL_ADD};
    use solder_model_layers::kernels::attn::{GateSplit, GATE_SPLIT};
    use solder_model_layers::kernels::embed::{Embedding, EMBEDDING};
    use solder_model_layers::kernels::kv::{KvWrite, KV_WRITE};
    use solder_model_layers::kernels::moe::{
        CombineShared, GateCombineShared, COMBINE_SHARED, GATE_COMBINE_SHARED,
    };
    let mut b = Bench::new();
    let (rows, width) = (3usize, 70usize);
    let n = rows * width;
    let a = b.bf16(&rows_of(rows, width, 1.0, &[0, 2]));
    let g = b.bf16(&rows_of(rows, width, 2.0, &[1, 2]));
    for kernel in [SILU_MUL, SIGMOID_MUL] {
        let out = b.zeros(n * 2);
        b.run(
            &Gated {
                a,
                b: g,
                out,
                rows: rows as u32,
                width: width as u32,
            }
            .launch(kernel),
        );
        b.mixed("act", out, 2);
    }
    let h = b.f32(&rows_of(rows, width, 3.0, &[1]));
    let out = b.zeros(n * 4);
    b.run(
        &ResidualAdd {
            h,
            x: a,
            out,
            rows: rows as u32,
            hidden: width as u32,
        }
        .launch(RESIDUAL_ADD),
    );
    b.mixed("residual_add", out, 4);
    let gate = b.bf16(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
    let clean = b.bf16(&rows_of(rows, width, 4.0, &[]));
    let out = b.zeros(n * 2);
    b.run(
        &CombineShared {
            routed: clean,
            shared: g,
            gate,
            out,
            rows: rows as u32,
            hidden: width as u32,
        }
        .launch(COMBINE_SHARED),
    );
    b.mixed("combine_shared", out, 2);
    // A poisoned x row: that row's gate is NaN, the others' are not.
    let (x, wg) = (
        b.bf16(&rows_of(rows, width, 5.0, &[0])),
        b.bf16(&rows_of(1, width, 6.0, &[])),
    );
    let out = b.zeros(n * 2);
    b.run(
        &GateCombineShared {
            x,
            wg,
            bg: None,
            routed: clean,
            shared: g,
            out,
            rows: rows as u32,
            hidden: width as u32,
            k: width as u32,
        }
        .launch(GATE_COMBINE_SHARED),
    );
    b.mixed("gate_combine_shared", out, 2);
    let (heads, head_dim) = (5u32, 7u32);
    let q2 = b.bf16(&rows_of(rows, (2 * heads * head_dim) as usize, 5.0, &[0]));
    let (q, gt) = (
        b.zeros(rows * (heads * head_dim) as usize * 2),
        b.zeros(rows * (heads * head_dim) as usize * 2),
    );
    b.run(
        &GateSplit {
            q2,
            q,
            gate: gt,
            rows: rows as u32,
            heads,
            head_dim,
        }
        .launch(GATE_SPLIT),
    );
    b.mixed("gate_split", q, 2);
    // A poisoned embedding table row, gathered.
    let (vocab, hidden) = (6usize, 40usize);
    let table = b.bf16(&rows_of(vocab, hidden, 6.0, &[2, 4]));
    let tokens = b.i32(&[2, 1, 4]);
    let out = b.zeros(rows * hidden * 4);
    b.run(
        &Embedding {
            tokens,
            table,
            out,
            rows: rows as u32,
            hidden: hidden as u32,
            vocab: vocab as u32,
        }
        .launch(EMBEDDING),
    );
    b.mixed("embedding", out, 4);
    let (kv_heads, head_dim, block_size, pages) = (2u32, 8u32, 4u32, 3u32);
    let row = (kv_heads * head_dim) as usize;
    let k = b.bf16(&rows_of(rows, row, 7.0, &[0]));
    let v = b.bf16(&rows_of(rows, row, 8.0, &[2]));
    let slots = b.i32(&[0, 5, 9]);
    let cache = b.zeros((pages * 2 * block_size) as usize * row * 2);
    b.run(
        &KvWrite {
            k,
            v,
            slot_mapping: slots,
            cache,
            rows: rows as u32,
            kv_heads,
            head_dim,
            block_size,
            num_pages: pages,
        }
        .launch(KV_WRITE),
    );
    b.mixed("kv_write", cache, 2);
    b.agree(&[
        "act::silu_mul",
        "act::sigmoid_mul",
        "add::residual_add",
        "moe::combine_shared",
        "moe::gate_combine_shared",
        "attn::gate_split",
        "embed::embedding",
        "kv::kv_write",
    ]);
}

#[test]
fn norms_and_heads_carry_nan_and_inf_as_their_twins() {
    use solder_model_layers::kernels::norm::{
        AddRmsNorm, MtpPreFc, QkNorm, RmsNorm, ADD_RMS_NORM, ADD_RMS_NORM_ZC, MTP_PRE_FC_ZC,
        QK_NORM, QK_NORM_ZC, RMS_NORM, RMS_NORM_ZC,
    };
    use solder_model_layers::kernels::rope::{
        GatedQkNormZcRopeKvWrite, QkNormRope, QkNormRopeKvWrite, Rope, RopeKvWrite,
        GATED_QK_NORM_ZC_ROPE_KV_WRITE, QK_NORM_ROPE, QK_NORM_ROPE_KV_WRITE, ROPE, ROPE_KV_WRITE,
    };
    let mut b = Bench::new();
    let (rows, hidden) = (3usize, 96usize);
    let n = rows * hidden;
    let h = b.f32(&rows_of(rows, hidden, 1.0, &[0]));
    let x = b.bf16(&rows_of(rows, hidden, 2.0, &[2]));
    // A poisoned weight: its NaN and inf reach every row.
    let w = b.bf16(&rows_of(1, hidden, 3.0, &[]));
    let w_bad = b.bf16(&rows_of(1, hidden, 4.0, &[0]));
    for kernel in [RMS_NORM, RMS_NORM_ZC] {
        for weight in [w, w_bad] {
            let out = b.zeros(n * 2);
            b.run(
                &RmsNorm {
                    x: h,
                    w: weight,
                    out,
                    rows: rows as u32,
                    hidden: hidden as u32,
                    eps: 1e-6,
                }
                .launch(kernel),
            );
            if weight == w {
                b.mixed("rms_norm", out, 2);
            }
        }
    }
    for kernel in [ADD_RMS_NORM, ADD_RMS_NORM_ZC] {
        let (h_out, out) = (b.zeros(n * 4), b.zeros(n * 2));
        b.run(
            &AddRmsNorm {
                h,
                x,
                w,
                h_out: Some(h_out),
                out,
                rows: rows as u32,
                hidden: hidden as u32,
                eps: 1e-6,
            }
            .launch(kernel),
        );
        b.mixed("add_rms_norm", out, 2);
        b.mixed("add_rms_norm h_out", h_out, 4);
    }
    let out = b.zeros(n * 2 * 2);
    b.run(
        &MtpPreFc {
            e: h,
            x,
            we: w,
            wh: w_bad,
            out,
            rows: rows as u32,
            hidden: hidden as u32,
            eps: 1e-6,
        }
        .launch(MTP_PRE_FC_ZC),
    );
    b.mixed("mtp_pre_fc_zc", out, 2);

    // Heads: 2 rows, 3 q heads and 1 kv head of 32, row 1 poisoned in q, row 0 in k.
    let (rows, heads, kv_heads, head_dim) = (2u32, 3u32, 1u32, 32u32);
    let qn = (rows * heads * head_dim) as usize;
    let kn = (rows * kv_heads * head_dim) as usize;
    let q = b.bf16(&rows_of(
        rows as usize,
        (heads * head_dim) as usize,
        5.0,
        &[1],
    ));
    let k = b.bf16(&rows_of(
        rows as usize,
        (kv_heads * head_dim) as usize,
        6.0,
        &[0],
    ));
    let v = b.bf16(&rows_of(
        rows as usize,
        (kv_heads * head_dim) as usize,
        7.0,
        &[1],
    ));
    let wq = b.bf16(&rows_of(1, head_dim as usize, 8.0, &[]));
    let wk = b.bf16(&rows_of(1, head_dim as usize, 9.0, &[]));
    for kernel in [QK_NORM, QK_NORM_ZC] {
        let (q_out, k_out) = (b.zeros(qn * 2), b.zeros(kn * 2));
        b.run(
            &QkNorm {
                q,
                k,
                wq,
                wk,
                q_out,
                k_out,
                rows,
                heads,
                kv_heads,
                head_dim,
                eps: 1e-6,
            }
            .launch(kernel),
        );
        b.mixed("qk_norm q", q_out, 2);
    }
    let rotary_dim = 24u32; // partial rotary: the last 8 dims pass through
    let positions = b.i32(&[5, 17]);
    // The inverse frequencies, then a YaRN attention scaling (0.1 ln 4 + 1).
    let inv_freq: Vec<f32> = (0..rotary_dim / 2)
        .map(|i| 10000f32.powf(-(2.0 * i as f32) / rotary_dim as f32))
        .chain([1.138_629_4])
        .collect();
    let inv_freq = b.f32(&inv_freq);
    let (q_out, k_out) = (b.zeros(qn * 2), b.zeros(kn * 2));
    b.run(
        &Rope {
            q,
            k,
            positions,
            inv_freq,
            q_out,
            k_out,
            rows,
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
        }
        .launch(ROPE),
    );
    b.mixed("rope q", q_out, 2);
    let (q_out, k_out) = (b.zeros(qn * 2), b.zeros(kn * 2));
    b.run(
        &QkNormRope {
            q,
            k,
            wq,
            wk,
            positions,
            inv_freq,
            q_out,
            k_out,
            rows,
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            eps: 1e-6,
        }
        .launch(QK_NORM_ROPE),
    );
    b.mixed("qk_norm_rope k", k_out, 2);
    let (block_size, pages) = (4u32, 3u32);
    let slot_mapping = b.i32(&[1, 6]);
    let cache_bytes = (pages * 2 * block_size * kv_heads * head_dim) as usize * 2;
    let (q_out, cache) = (b.zeros(qn * 2), b.zeros(cache_bytes));
    b.run(
        &RopeKvWrite {
            q,
            k,
            v,
            positions,
            inv_freq,
            slot_mapping,
            q_out,
            cache,
            rows,
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            block_size,
            num_pages: pages,
        }
        .launch(ROPE_KV_WRITE),
    );
    b.mixed("rope_kv_write cache", cache, 2);
    let (q_out, cache) = (b.zeros(qn * 2), b.zeros(cache_bytes));
    b.run(
        &QkNormRopeKvWrite {
            q,
            k,
            v,
            wq,
            wk,
            positions,
            inv_freq,
            slot_mapping,
            q_out,
            cache,
            rows,
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            block_size,
            num_pages: pages,
            eps: 1e-6,
        }
        .launch(QK_NORM_ROPE_KV_WRITE),
    );
    b.mixed("qk_norm_rope_kv_write cache", cache, 2);
    // Qwen3-Next's gated q (each head [q | gate]), row 1 poisoned: its q, gate and k slot.
    let q2 = b.bf16(&rows_of(
        rows as usize,
        (2 * heads * head_dim) as usize,
        5.0,
        &[1],
    ));
    let (q_out, gate_out, cache) = (b.zeros(qn * 2), b.zeros(qn * 2), b.zeros(cache_bytes));
    b.run(
        &GatedQkNormZcRopeKvWrite {
            q2,
            k,
            v,
            wq,
            wk,
            positions,
            inv_freq,
            slot_mapping,
            q_out,
            gate_out,
            cache,
            rows,
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            block_size,
            num_pages: pages,
            eps: 1e-6,
        }
        .launch(GATED_QK_NORM_ZC_ROPE_KV_WRITE),
    );
    b.mixed("gated_qk_norm_zc_rope_kv_write q", q_out, 2);
    b.mixed("gated_qk_norm_zc_rope_kv_write gate", gate_out, 2);
    b.mixed("gated_qk_norm_zc_rope_kv_write cache", cache, 2);
    b.agree(&[
        "norm::rms_norm",
        "norm::rms_norm_zc",
        "norm::add_rms_norm",
        "norm::add_rms_norm_zc",
        "norm::mtp_pre_fc_zc",
        "norm::qk_norm",
        "norm::qk_norm_zc",
        "rope::rope",
        "rope::qk_norm_rope",
        "rope::rope_kv_write",
        "rope::qk_norm_rope_kv_write",
        "rope::gated_qk_norm_zc_rope_kv_write",
    ]);
}

#[test]
fn projections_carry_nan_and_inf_as_their_twins() {
    use solder_model_layers::kernels::gemv::{
        Linear, LmHead, NormLinear, LINEAR, LM_HEAD, NORM_LINEAR,
    };
    let mut b = Bench::new();
    // k = 1100: two dot segments; row 1 poisoned in x, row 2 clean; feature rows 3 and 5 of
    // the weight poisoned (every row sees them).
    let (rows, k, n_out) = (3u32, 1100u32, 9u32);
    let x = b.bf16(&rows_of(rows as usize, k as usize, 1.0, &[1]));
    let w = b.bf16(&rows_of(n_out as usize, k as usize, 2.0, &[3, 5]));
    let bias = b.bf16(&rows_of(1, n_out as usize, 3.0, &[]));
    let h = b.f32(&rows_of(rows as usize, k as usize, 4.0, &[0]));
    let wn = b.bf16(&rows_of(1, k as usize, 5.0, &[]));
    let y = b.zeros((rows * n_out) as usize * 2);
    b.run(
        &Linear {
            x,
            w,
            bias: Some(bias),
            y,
            rows,
            k,
            n_out,
            scratch: None,
        }
        .launch(LINEAR),
    );
    b.mixed("linear", y, 2);
    let logits = b.zeros((rows * n_out) as usize * 4);
    b.run(
        &LmHead {
            x,
            w,
            logits,
            want: None,
            rows,
            k,
            vocab: n_out,
            scratch: None,
        }
        .launch(LM_HEAD),
    );
    b.mixed("lm_head", logits, 4);
    let y = b.zeros((rows * n_out) as usize * 2);
    b.run(
        &NormLinear {
            h,
            wn,
            w,
            bias: None,
            y,
            rows,
            k,
            n_out,
            eps: 1e-6,
            scratch: None,
        }
        .launch(NORM_LINEAR),
    );
    b.mixed("norm_linear", y, 2);
    b.agree(&["gemv::linear", "gemv::lm_head", "gemv::norm_linear"]);
}

#[test]
fn tensor_core_projections_carry_nan_and_inf_as_their_twins() {
    use solder_model_layers::kernels::gemm::{LinearMma, LmHeadMma, LINEAR_MMA, LM_HEAD_MMA};
    let mut b = Bench::new();
    // k = 300: a partial last k tile; row 1 poisoned in x, feature rows 3 and 5 of the weight.
    let (rows, k, n_out) = (3u32, 300u32, 9u32);
    let x = b.bf16(&rows_of(rows as usize, k as usize, 1.0, &[1]));
    let w = b.bf16(&rows_of(n_out as usize, k as usize, 2.0, &[3, 5]));
    let bias = b.bf16(&rows_of(1, n_out as usize, 3.0, &[]));
    let y = b.zeros((rows * n_out) as usize * 2);
    b.run(
        &LinearMma {
            x,
            w,
            bias: Some(bias),
            y,
            rows,
            k,
            n_out,
        }
        .launch(LINEAR_MMA),
    );
    b.mixed("linear_mma", y, 2);
    let logits = b.zeros((rows * n_out) as usize * 4);
    b.run(
        &LmHeadMma {
            x,
            w,
            logits,
            want: None,
            rows,
            k,
            vocab: n_out,
        }
        .launch(LM_HEAD_MMA),
    );
    b.mixed("lm_head_mma", logits, 4);
    b.agree(&["gemm::linear_mma", "gemm::lm_head_mma"]);
}

/// The quantized entries, gemv's and the tensor cores': x's row 1 poisoned; in the weight,
/// fp8 NaN codes (0x7f) in feature row 3, an infinite scale (int4: over feature row 5's first
/// group, whose q − z of 0 makes 0·inf a NaN).
#[test]
fn quantized_projections_carry_nan_and_inf_as_their_twins() {
    use solder_circuit::WeightFormat;
    use solder_model_layers::kernels::gemm::{
        LinearMmaFp8, LinearMmaInt4, LmHeadMmaFp8, LmHeadMmaInt4, LINEAR_MMA_FP8, LINEAR_MMA_INT4,
        LM_HEAD_MMA_FP8, LM_HEAD_MMA_INT4,
    };
    use solder_model_layers::kernels::gemv::{
        LinearFp8, LinearInt4, LmHeadFp8, LmHeadInt4, LINEAR_FP8, LINEAR_INT4, LM_HEAD_FP8,
        LM_HEAD_INT4,
    };
    use solder_model_layers::numerics::dequant::quantize_matrix;
    let mut b = Bench::new();
    let (rows, k, n) = (3u32, 300u32, 9u32);
    let (block_n, block_k, group) = (4u32, 64u32, 50u32);
    let x = b.bf16(&rows_of(rows as usize, k as usize, 1.0, &[1]));
    let clean = rows_of(n as usize, k as usize, 2.0, &[]);
    let fp8 = WeightFormat::Fp8 { block_n, block_k };
    let mut blob = quantize_matrix(fp8, &clean, n as usize, k as usize);
    for i in [0usize, 7, 299] {
        blob[3 * k as usize + i] = 0x7f;
    }
    let layout = fp8.check(n as usize, k as usize).unwrap();
    // Block (2, 1)'s scale (feature rows 8.., k 64..128) +inf.
    let at = layout.scales_offset + (2 * k.div_ceil(block_k) as usize + 1) * 4;
    blob[at..at + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    let w8 = upload(&mut b.backend, &blob);
    let int4 = WeightFormat::Int4 { group };
    let mut blob = quantize_matrix(int4, &clean, n as usize, k as usize);
    let layout = int4.check(n as usize, k as usize).unwrap();
    let at = layout.scales_offset + 5 * k.div_ceil(group) as usize * 4;
    blob[at..at + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    let w4 = upload(&mut b.backend, &blob);
    let bias = Some(b.bf16(&rows_of(1, n as usize, 3.0, &[])));
    let (y_bytes, logit_bytes) = ((rows * n) as usize * 2, (rows * n) as usize * 4);
    let mut launches: Vec<(Launch, Buf, usize)> = Vec::new();
    for mma in [false, true] {
        let y = b.zeros(y_bytes);
        let launch = if mma {
            LinearMmaFp8 {
                x,
                w: w8,
                bias,
                y,
                rows,
                k,
                n_out: n,
                block_n,
                block_k,
            }
            .launch(LINEAR_MMA_FP8)
        } else {
            LinearFp8 {
                x,
                w: w8,
                bias,
                y,
                rows,
                k,
                n_out: n,
                block_n,
                block_k,
            }
            .launch(LINEAR_FP8)
        };
        launches.push((launch, y, 2));
        let y = b.zeros(y_bytes);
        let launch = if mma {
            LinearMmaInt4 {
                x,
                w: w4,
                bias,
                y,
                rows,
                k,
                n_out: n,
                group,
            }
            .launch(LINEAR_MMA_INT4)
        } else {
            LinearInt4 {
                x,
                w: w4,
                bias,
                y,
                rows,
                k,
                n_out: n,
                group,
            }
            .launch(LINEAR_INT4)
        };
        launches.push((launch, y, 2));
        let logits = b.zeros(logit_bytes);
        let launch = if mma {
            LmHeadMmaFp8 {
                x,
                w: w8,
                logits,
                want: None,
                rows,
                k,
                vocab: n,
                block_n,
                block_k,
            }
            .launch(LM_HEAD_MMA_FP8)
        } else {
            LmHeadFp8 {
                x,
                w: w8,
                logits,
                want: None,
                rows,
                k,
                vocab: n,
                block_n,
                block_k,
            }
            .launch(LM_HEAD_FP8)
        };
        launches.push((launch, logits, 4));
        let logits = b.zeros(logit_bytes);
        let launch = if mma {
            LmHeadMmaInt4 {
                x,
                w: w4,
                logits,
                want: None,
                rows,
                k,
                vocab: n,
                group,
            }
            .launch(LM_HEAD_MMA_INT4)
        } else {
            LmHeadInt4 {
                x,
                w: w4,
                logits,
                want: None,
                rows,
                k,
                vocab: n,
                group,
            }
            .launch(LM_HEAD_INT4)
        };
        launches.push((launch, logits, 4));
    }
    for (launch, out, elem) in &launches {
        b.run(launch);
        b.mixed(launch.kernel, *out, *elem);
    }
    b.agree(&[
        "gemm::linear_mma_fp8",
        "gemm::linear_mma_int4",
        "gemm::lm_head_mma_fp8",
        "gemm::lm_head_mma_int4",
        "gemv::linear_fp8",
        "gemv::linear_int4",
        "gemv::lm_head_fp8",
        "gemv::lm_head_int4",
    ]);
}

#[test]
fn fused_tensor_core_kernels_carry_nan_and_inf_as_their_twins() {
    use solder_model_layers::kernels::gemm::{
        GateUpSiluMma, LinearPairMma, QkvMma, GATE_UP_SILU_MMA, LINEAR_PAIR_MMA, QKV_MMA,
    };
    let mut b = Bench::new();
    // k = 300: a partial last k tile; row 1 poisoned in x, a feature row of q's, v's and
    // gate's weights; nq = 40 puts q's second block mid-tile.
    let (rows, k, nq, nkv, inter) = (3u32, 300u32, 40u32, 9u32, 11u32);
    let (r, kk) = (rows as usize, k as usize);
    let x = b.bf16(&rows_of(r, kk, 1.0, &[1]));
    let wq = b.bf16(&rows_of(nq as usize, kk, 2.0, &[33]));
    let wk = b.bf16(&rows_of(nkv as usize, kk, 3.0, &[]));
    let wv = b.bf16(&rows_of(nkv as usize, kk, 4.0, &[5]));
    let bq = b.bf16(&rows_of(1, nq as usize, 5.0, &[]));
    let (q, k_out, v) = (
        b.zeros((rows * nq) as usize * 2),
        b.zeros((rows * nkv) as usize * 2),
        b.zeros((rows * nkv) as usize * 2),
    );
    b.run(
        &QkvMma {
            x,
            wq,
            bq: Some(bq),
            wk,
            bk: None,
            wv,
            bv: None,
            q,
            k_out,
            v,
            rows,
            k,
            nq,
            nkv,
        }
        .launch(QKV_MMA),
    );
    b.mixed("qkv_mma q", q, 2);
    b.mixed("qkv_mma v", v, 2);
    let wg = b.bf16(&rows_of(inter as usize, kk, 6.0, &[2]));
    let wu = b.bf16(&rows_of(inter as usize, kk, 7.0, &[]));
    let act = b.zeros((rows * inter) as usize * 2);
    b.run(
        &GateUpSiluMma {
            x,
            wg,
            wu,
            act,
            rows,
            k,
            inter,
        }
        .launch(GATE_UP_SILU_MMA),
    );
    b.mixed("gate_up_silu_mma", act, 2);
    // A pair (q's and v's weights as the two matrices): poisoned rows in both outputs.
    let (y1, y2) = (
        b.zeros((rows * nq) as usize * 2),
        b.zeros((rows * nkv) as usize * 2),
    );
    b.run(
        &LinearPairMma {
            x,
            w1: wq,
            b1: Some(bq),
            w2: wv,
            b2: None,
            y1,
            y2,
            rows,
            k,
            n1: nq,
            n2: nkv,
        }
        .launch(LINEAR_PAIR_MMA),
    );
    b.mixed("linear_pair_mma y1", y1, 2);
    b.mixed("linear_pair_mma y2", y2, 2);
    b.agree(&[
        "gemm::qkv_mma",
        "gemm::linear_pair_mma",
        "gemm::gate_up_silu_mma",
    ]);
}

/// The attention rows: (seq_len, what is poisoned).
pub(super) const ATTN_ROWS: usize = 7;
pub(super) const ATTN_HEADS: u32 = 2;
pub(super) const ATTN_HEAD_DIM: usize = 32;
pub(super) const ATTN_BLOCK: usize = 16;
pub(super) const ATTN_MAX_BLOCKS: usize = 19; // 300 tokens

/// q, cache and block tables of `ATTN_ROWS` rows, each on its own pages (one kv head):
/// 0. 40 tokens, clean (finite output);
/// 1. 40 tokens, keys 0..5 NaN (the whole piece of warp 0: a tile of NaN scores only);
/// 2. 40 tokens, key 7 scores −inf (k[0] = −inf, q[0] > 0) and its v holds +inf at dim 3:
///    weight 0 times inf, NaN at dim 3 only;
/// 3. 20 tokens, q[0] = +inf and every k[0] < 0: every score −inf (the twin's 0/0);
/// 4. 300 tokens (two flash-decoding splits), v of key 280 NaN at dim 5;
/// 5. 300 tokens, key 290 scores +inf (k[0] = +inf);
/// 6. 300 tokens, clean.
pub(super) fn attention_inputs() -> (Vec<f32>, Vec<f32>, Vec<i32>, Vec<i32>) {
    let lens = [40, 40, 40, 20, 300, 300, 300];
    let d = ATTN_HEAD_DIM;
    let pages = ATTN_ROWS * ATTN_MAX_BLOCKS + 1;
    let mut q = rows_of(ATTN_ROWS * ATTN_HEADS as usize, d, 1.0, &[]);
    let mut cache: Vec<f32> = (0..pages * 2 * ATTN_BLOCK * d)
        .map(|i| value(i, 2.0, false) * 0.5)
        .collect();
    // Page of (row, token): row r owns pages 1 + r·19 .. (page 0 is never named).
    let tables: Vec<i32> = (0..ATTN_ROWS * ATTN_MAX_BLOCKS)
        .map(|i| 1 + i as i32)
        .collect();
    let at = |r: usize, j: usize, part: usize| {
        let page = 1 + r * ATTN_MAX_BLOCKS + j / ATTN_BLOCK;
        ((page * 2 + part) * ATTN_BLOCK + j % ATTN_BLOCK) * d
    };
    for h in 0..ATTN_HEADS as usize {
        for r in 0..ATTN_ROWS {
            q[(r * ATTN_HEADS as usize + h) * d] = 0.5;
        }
        q[(3 * ATTN_HEADS as usize + h) * d] = f32::INFINITY;
    }
    for j in 0..5 {
        cache[at(1, j, 0)..][..d].fill(f32::NAN);
    }
    cache[at(2, 7, 0)] = f32::NEG_INFINITY;
    cache[at(2, 7, 1) + 3] = f32::INFINITY;
    for j in 0..20 {
        cache[at(3, j, 0)] = -0.5;
    }
    cache[at(4, 280, 1) + 5] = f32::NAN;
    cache[at(5, 290, 0)] = f32::INFINITY;
    (q, cache, tables, lens.to_vec())
}

#[test]
fn attention_carries_nan_and_inf_as_its_twin() {
    use solder_model_layers::kernels::attn::fold::o_scratch_bytes;
    use solder_model_layers::kernels::attn::{
        scratch_bytes, PagedAttention, PagedAttentionO, PAGED_CAUSAL, PAGED_CAUSAL_O, PAGED_DECODE,
        PAGED_DECODE_O,
    };
    let mut b = Bench::new();
    let (q, cache, tables, lens) = attention_inputs();
    let (rows, heads, d) = (ATTN_ROWS as u32, ATTN_HEADS, ATTN_HEAD_DIM as u32);
    let pages = (ATTN_ROWS * ATTN_MAX_BLOCKS + 1) as u32;
    let (q, cache) = (b.bf16(&q), b.bf16(&cache));
    let (block_tables, seq_lens) = (b.i32(&tables), b.i32(&lens));
    let scratch = b.zeros(scratch_bytes(ATTN_ROWS, heads as usize, d as usize));
    let out_bytes = (rows * heads * d) as usize * 2;
    let plain = |out: Buf| PagedAttention {
        q,
        cache,
        block_tables,
        seq_lens,
        gate: None,
        out,
        scratch,
        rows,
        heads,
        kv_heads: 1,
        head_dim: d,
        block_size: ATTN_BLOCK as u32,
        max_blocks: ATTN_MAX_BLOCKS as u32,
        num_pages: pages,
        window: 0,
        scale: 1.0 / (d as f32).sqrt(),
    };
    for kernel in [PAGED_DECODE, PAGED_CAUSAL] {
        let out = b.zeros(out_bytes);
        b.run(&plain(out).launch(kernel));
        let bytes = download(&mut b.backend, out.ptr, out_bytes);
        let values: Vec<f32> = bytes
            .chunks_exact(2)
            .map(|v| bf16::from_le_bytes([v[0], v[1]]).to_f32())
            .collect();
        let head =
            |r: usize, h: usize| &values[(r * heads as usize + h) * d as usize..][..d as usize];
        for h in 0..heads as usize {
            let nan_dims = |r: usize| -> Vec<usize> {
                (0..d as usize)
                    .filter(|i| head(r, h)[*i].is_nan())
                    .collect()
            };
            let all: Vec<usize> = (0..d as usize).collect();
            assert!(nan_dims(0).is_empty(), "row 0 (clean): {:?}", head(0, h));
            assert_eq!(nan_dims(1), all, "row 1: a tile of NaN scores");
            assert_eq!(nan_dims(2), [3], "row 2: weight 0 times inf");
            assert_eq!(nan_dims(3), all, "row 3: every score -inf");
            assert_eq!(nan_dims(4), [5], "row 4: a NaN value in the second split");
            assert_eq!(nan_dims(5), all, "row 5: a +inf score");
            assert!(nan_dims(6).is_empty(), "row 6 (clean)");
        }
    }
    // Gated (Qwen3-Next's output gate in the store): a NaN gate at row 0's head 0, dim 1; a −inf
    // gate (sigmoid 0) at its dim 2 and a +inf one (sigmoid 1) at dim 3; every NaN attention
    // output stays NaN whatever its gate.
    let width = (heads * d) as usize;
    let mut gate_host = rows_of(ATTN_ROWS, width, 6.0, &[]);
    (gate_host[1], gate_host[2], gate_host[3]) = (f32::NAN, f32::NEG_INFINITY, f32::INFINITY);
    let poisoned_gate = b.bf16(&gate_host);
    for kernel in [PAGED_DECODE, PAGED_CAUSAL] {
        let out = b.zeros(out_bytes);
        b.run(
            &PagedAttention {
                gate: Some(poisoned_gate),
                ..plain(out)
            }
            .launch(kernel),
        );
        let bytes = download(&mut b.backend, out.ptr, out_bytes);
        let value_at = |i: usize| bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32();
        let nans: Vec<usize> = (0..width).filter(|i| value_at(*i).is_nan()).collect();
        assert_eq!(
            nans,
            [1],
            "row 0 (clean) gated: NaN only under the NaN gate"
        );
        assert_eq!(value_at(2), 0.0, "row 0: a −inf gate closes its dim");
        assert!(
            (width..2 * width).all(|i| value_at(i).is_nan()),
            "row 1 stays NaN gated"
        );
        b.mixed("paged_* gated", out, 2);
    }
    // The o-fold kernels, plain and gated; h carries a NaN in row 6's residual.
    let n_out = 48u32;
    let in_features = (heads * d) as usize;
    let wo = b.bf16(&rows_of(n_out as usize, in_features, 3.0, &[]));
    let bias = b.bf16(&rows_of(1, n_out as usize, 4.0, &[]));
    let mut h_host = rows_of(ATTN_ROWS, n_out as usize, 5.0, &[]);
    h_host[6 * n_out as usize + 2] = f32::NAN;
    let h = b.f32(&h_host);
    let gate = b.bf16(&rows_of(
        ATTN_ROWS * ATTN_HEADS as usize,
        d as usize,
        6.0,
        &[],
    ));
    let o_scratch = b.zeros(o_scratch_bytes(ATTN_ROWS, heads as usize, n_out as usize));
    for kernel in [PAGED_DECODE_O, PAGED_CAUSAL_O] {
        for gate in [None, Some(gate)] {
            let h_out = b.zeros((rows * n_out) as usize * 4);
            let base = plain(h_out);
            b.run(
                &PagedAttentionO {
                    q,
                    cache,
                    block_tables,
                    seq_lens,
                    gate,
                    wo,
                    bias: Some(bias),
                    h,
                    h_out,
                    scratch,
                    o_scratch,
                    rows,
                    heads,
                    kv_heads: 1,
                    head_dim: d,
                    block_size: base.block_size,
                    max_blocks: base.max_blocks,
                    num_pages: pages,
                    window: 0,
                    scale: base.scale,
                    n_out,
                }
                .launch(kernel),
            );
            b.mixed("paged_*_o h_out", h_out, 4);
        }
    }
    // The tensor cores' attention on the same rows, one row a block (each on its own pages):
    // its own order, so only its twin's bytes are asked of it, NaN where they are; plain and
    // gated.
    for gate in [None, Some(poisoned_gate)] {
        let out = b.zeros(out_bytes);
        let base = plain(out);
        b.run(
            &solder_model_layers::kernels::flash::PagedMma {
                q,
                cache,
                block_tables,
                seq_lens,
                gate,
                out,
                scratch,
                rows,
                heads,
                kv_heads: 1,
                head_dim: d,
                block_size: base.block_size,
                max_blocks: base.max_blocks,
                num_pages: pages,
                window: 0,
                scale: base.scale,
                rows_per_block: 1,
            }
            .launch(solder_model_layers::kernels::flash::PAGED_MMA),
        );
        b.mixed("flash::paged_mma", out, 2);
    }
    b.agree(&[
        "attn::paged_decode",
        "attn::paged_causal",
        "attn::paged_decode_o",
        "attn::paged_causal_o",
        "flash::paged_mma",
    ]);
}

#[test]
fn moe_routing_and_experts_carry_nan_and_inf_as_their_twins() {
    use solder_model_layers::kernels::moe::{
        Down, GateUpSilu, RouterTopk, TopkSoftmax, DOWN, GATE_UP_SILU, ROUTER_TOPK, TOPK_SOFTMAX,
    };
    let mut b = Bench::new();
    // 300 experts: more than a block's threads, so a thread holds two candidates.
    let (experts, k) = (300usize, 4usize);
    // Rows: clean; one NaN logit; one +inf; all −inf; some −inf (finite probabilities).
    let rows = 5usize;
    let mut logits = rows_of(rows, experts, 1.0, &[]);
    logits[experts + 17] = f32::NAN;
    logits[2 * experts + 200] = f32::INFINITY;
    logits[3 * experts..4 * experts].fill(f32::NEG_INFINITY);
    for e in (0..experts).step_by(3) {
        logits[4 * experts + e] = f32::NEG_INFINITY;
    }
    let logits = b.f32(&logits);
    for norm_topk in [0, 1] {
        let (ids, weights) = (b.zeros(rows * k * 4), b.zeros(rows * k * 4));
        b.run(
            &TopkSoftmax {
                logits,
                ids,
                weights,
                rows: rows as u32,
                experts: experts as u32,
                k: k as u32,
                norm_topk,
            }
            .launch(TOPK_SOFTMAX),
        );
        b.mixed("topk_softmax weights", weights, 4);
        // A NaN row picks the lowest ids, as the twin's scan does.
        let ids = download(&mut b.backend, ids.ptr, rows * k * 4);
        let row1: Vec<i32> = ids[k * 4..2 * k * 4]
            .chunks_exact(4)
            .map(|v| i32::from_le_bytes([v[0], v[1], v[2], v[3]]))
            .collect();
        assert_eq!(row1, [0, 1, 2, 3], "a NaN row's picks");
    }
    // The router: x row 1 poisoned (a NaN row of logits); then a poisoned expert row of w
    // (every row NaN).
    let (rows, hidden) = (3usize, 64usize);
    let x = b.bf16(&rows_of(rows, hidden, 2.0, &[1]));
    let w = b.bf16(&rows_of(experts, hidden, 3.0, &[]));
    let w_bad = b.bf16(&rows_of(experts, hidden, 3.0, &[150]));
    for weight in [w, w_bad] {
        let (ids, weights) = (b.zeros(rows * k * 4), b.zeros(rows * k * 4));
        b.run(
            &RouterTopk {
                x,
                w: weight,
                ids,
                weights,
                rows: rows as u32,
                hidden: hidden as u32,
                experts: experts as u32,
                k: k as u32,
                norm_topk: 1,
            }
            .launch(ROUTER_TOPK),
        );
        if weight == w {
            b.mixed("router_topk weights", weights, 4);
        }
    }
    // The experts: 4 experts, k = 2 picks per row, expert 2's gate matrix poisoned in one row.
    let (experts, k, inter) = (4usize, 2usize, 24usize);
    let ids = b.i32(&[0, 1, 2, 3, 1, 0]);
    let wg = b.bf16(&rows_of(experts * inter, hidden, 4.0, &[2 * inter + 5]));
    let wu = b.bf16(&rows_of(experts * inter, hidden, 5.0, &[]));
    let act = b.zeros(rows * k * inter * 2);
    b.run(
        &GateUpSilu {
            x,
            ids,
            wg,
            wu,
            act,
            rows: rows as u32,
            hidden: hidden as u32,
            inter: inter as u32,
            experts: experts as u32,
            k: k as u32,
        }
        .launch(GATE_UP_SILU),
    );
    b.mixed("moe gate_up_silu", act, 2);
    // The same picks through the tensor cores, grouped by expert.
    let act_mma = b.zeros(rows * k * inter * 2);
    b.run(
        &solder_model_layers::kernels::gemm::ExpertsGateUpSiluMma {
            x,
            ids,
            wg,
            wu,
            act: act_mma,
            rows: rows as u32,
            hidden: hidden as u32,
            inter: inter as u32,
            experts: experts as u32,
            k: k as u32,
        }
        .launch(solder_model_layers::kernels::gemm::EXPERTS_GATE_UP_SILU_MMA),
    );
    b.mixed("experts_gate_up_silu_mma", act_mma, 2);
    let act_in = b.bf16(&rows_of(rows * k, inter, 6.0, &[3]));
    let weights = b.f32(&[0.5, 0.5, f32::INFINITY, 0.25, 0.6, 0.4]);
    let wd = b.bf16(&rows_of(experts * hidden, inter, 7.0, &[]));
    let out = b.zeros(rows * hidden * 2);
    b.run(
        &Down {
            act: act_in,
            ids,
            weights,
            wd,
            out,
            rows: rows as u32,
            hidden: hidden as u32,
            inter: inter as u32,
            experts: experts as u32,
            k: k as u32,
        }
        .launch(DOWN),
    );
    b.mixed("moe down", out, 2);
    // The same down projections through the tensor cores: the picks' dots, then their sum.
    let dots = b.zeros(rows * k * hidden * 4);
    b.run(
        &solder_model_layers::kernels::gemm::ExpertsDownMma {
            act: act_in,
            ids,
            wd,
            dots,
            rows: rows as u32,
            hidden: hidden as u32,
            inter: inter as u32,
            experts: experts as u32,
            k: k as u32,
        }
        .launch(solder_model_layers::kernels::gemm::EXPERTS_DOWN_MMA),
    );
    b.mixed("experts_down_mma dots", dots, 4);
    let out_mma = b.zeros(rows * hidden * 2);
    b.run(
        &solder_model_layers::kernels::moe::DownCombine {
            dots,
            ids,
            weights,
            out: out_mma,
            rows: rows as u32,
            hidden: hidden as u32,
            experts: experts as u32,
            k: k as u32,
        }
        .launch(solder_model_layers::kernels::moe::DOWN_COMBINE),
    );
    b.mixed("down_combine", out_mma, 2);
    b.agree(&[
        "moe::topk_softmax",
        "moe::router_topk",
        "moe::gate_up_silu",
        "gemm::experts_gate_up_silu_mma",
        "moe::down",
        "gemm::experts_down_mma",
        "moe::down_combine",
    ]);
}

#[test]
fn gated_deltanet_carries_nan_and_inf_as_its_twin() {
    use solder_model_layers::kernels::gdn::{
        chunked_mma_config, Chunked, Conv, GatedNorm, Gates, GatesChunked, GatesRecurrence,
        Recurrence, CHUNKED, CHUNKED_MMA, CONV, GATED_NORM, GATES, GATES_CHUNKED,
        GATES_CHUNKED_MMA, GATES_RECURRENCE, GATES_RECURRENCE_PITCHED, RECURRENCE,
        RECURRENCE_PITCHED,
    };
    let mut b = Bench::new();
    // 1 key head of 16, 2 value heads of 8: a qkvz row is [q 16 | k 16 | v 16 | z 16].
    let (rows, nk, dk, nv, dv, kernel, num_slots) = (3u32, 1u32, 16u32, 2u32, 8u32, 4u32, 4u32);
    let qkvz_row = (nk * (2 * dk + 2 * (nv / nk) * dv)) as usize;
    let channels = (2 * nk * dk + nv * dv) as usize;
    let hist = (kernel - 1) as usize;
    let qkvz = b.bf16(&rows_of(rows as usize, qkvz_row, 1.0, &[1]));
    let wconv = b.bf16(&rows_of(channels, kernel as usize, 2.0, &[]));
    let slots = b.i32(&[1, 2, 3]);
    // Rows 0 and 2 keep their snapshots, row 1 skips its.
    let keep = b.i32(&[1, 0, 1]);
    let state = b.bf16(&rows_of(num_slots as usize, channels * hist, 3.0, &[]));
    let (out, snapshots) = (
        b.zeros(rows as usize * channels * 2),
        b.zeros(rows as usize * channels * hist * 2),
    );
    b.run(
        &Conv {
            qkvz,
            w: wconv,
            state,
            slots,
            out_slots: slots,
            out,
            snapshots: Some(snapshots),
            keep: Some(keep),
            rows,
            nk,
            dk,
            nv,
            dv,
            kernel,
            num_slots,
            chain: 0,
        }
        .launch(CONV),
    );
    b.mixed("gdn conv", out, 2);
    // Gates: ba with NaN and ±inf (softplus's and sigmoid's limits).
    let ba = b.bf16(&[
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.5,
        30.0,
        -0.25,
        f32::NEG_INFINITY,
        f32::INFINITY,
        0.1,
        0.2,
        f32::NAN,
        0.4,
    ]);
    let a_log = b.bf16(&[0.5, -1.0]);
    let dt_bias = b.bf16(&[0.25, 0.0]);
    let (beta, g) = (
        b.zeros((rows * nv) as usize * 4),
        b.zeros((rows * nv) as usize * 4),
    );
    b.run(
        &Gates {
            ba,
            a_log,
            dt_bias,
            beta,
            g,
            rows,
            nk,
            nv,
        }
        .launch(GATES),
    );
    b.mixed("gdn gates beta", beta, 4);
    b.mixed("gdn gates g", g, 4);
    // Recurrence: mixed row 1 poisoned; beta, g finite but g of (row 2, head 1) −inf (decay 0)
    // on a state holding inf (0·inf).
    let mixed = b.bf16(&rows_of(rows as usize, channels, 4.0, &[1]));
    let beta = b.f32(&rows_of(rows as usize, nv as usize, 5.0, &[]));
    let mut g_host: Vec<f32> = rows_of(rows as usize, nv as usize, 6.0, &[])
        .iter()
        .map(|v| -v.abs())
        .collect();
    g_host[2 * nv as usize + 1] = f32::NEG_INFINITY;
    let g = b.f32(&g_host);
    let head_elems = (dk * dv) as usize;
    let mut state_host = rows_of((num_slots * nv) as usize, head_elems, 7.0, &[]);
    state_host[(3 * nv as usize + 1) * head_elems + 9] = f32::INFINITY;
    for kernel in [RECURRENCE, RECURRENCE_PITCHED] {
        let state = b.f32(&state_host);
        let (out, snapshots) = (
            b.zeros((rows * nv * dv) as usize * 2),
            b.zeros(rows as usize * nv as usize * head_elems * 4),
        );
        b.run(
            &Recurrence {
                mixed,
                beta,
                g,
                state,
                slots,
                out_slots: slots,
                out,
                snapshots: Some(snapshots),
                keep: Some(keep),
                rows,
                nk,
                dk,
                nv,
                dv,
                num_slots,
                chain: 0,
            }
            .launch(kernel),
        );
        b.mixed("gdn recurrence", out, 2);
    }
    // The gates folded in: the NaN and ±inf ba above, mixed row 1 poisoned.
    for kernel in [GATES_RECURRENCE, GATES_RECURRENCE_PITCHED] {
        let state = b.f32(&state_host);
        let (out, snapshots) = (
            b.zeros((rows * nv * dv) as usize * 2),
            b.zeros(rows as usize * nv as usize * head_elems * 4),
        );
        b.run(
            &GatesRecurrence {
                mixed,
                ba,
                a_log,
                dt_bias,
                state,
                slots,
                out_slots: slots,
                out,
                snapshots: Some(snapshots),
                keep: Some(keep),
                rows,
                nk,
                dk,
                nv,
                dv,
                num_slots,
                chain: 0,
            }
            .launch(kernel),
        );
        b.mixed("gdn gates_recurrence", out, 2);
    }
    // The chunked form over the same rows, as one sequence's chain (its prefill use) and as
    // independent rows: the poisoned row 1 and the −inf gate inside a chunk; on the CUDA cores
    // and on the tensor cores.
    for (chain, mma) in [(0, false), (1, false), (0, true), (1, true)] {
        let config = chunked_mma_config(rows, dk, nv, dv, chain);
        let state = b.f32(&state_host);
        let out = b.zeros((rows * nv * dv) as usize * 2);
        let chunked = Chunked {
            mixed,
            beta,
            g,
            state,
            slots,
            out_slots: slots,
            out,
            rows,
            nk,
            dk,
            nv,
            dv,
            num_slots,
            chain,
        };
        b.run(&match mma {
            true => chunked.launch_with(CHUNKED_MMA, config),
            false => chunked.launch(CHUNKED),
        });
        b.mixed("gdn chunked", out, 2);
        let state = b.f32(&state_host);
        let out = b.zeros((rows * nv * dv) as usize * 2);
        let gates_chunked = GatesChunked {
            mixed,
            ba,
            a_log,
            dt_bias,
            state,
            slots,
            out_slots: slots,
            out,
            rows,
            nk,
            dk,
            nv,
            dv,
            num_slots,
            chain,
        };
        b.run(&match mma {
            true => gates_chunked.launch_with(GATES_CHUNKED_MMA, config),
            false => gates_chunked.launch(GATES_CHUNKED),
        });
        b.mixed("gdn gates_chunked", out, 2);
    }
    let core = b.bf16(&rows_of((rows * nv) as usize, dv as usize, 8.0, &[2]));
    let wn = b.bf16(&rows_of(1, dv as usize, 9.0, &[]));
    let out = b.zeros((rows * nv * dv) as usize * 2);
    b.run(
        &GatedNorm {
            core,
            qkvz,
            w: wn,
            out,
            rows,
            nk,
            dk,
            nv,
            dv,
            eps: 1e-6,
        }
        .launch(GATED_NORM),
    );
    b.mixed("gdn gated_norm", out, 2);
    b.agree(&[
        "gdn::conv",
        "gdn::gates",
        "gdn::recurrence",
        "gdn::recurrence_pitched",
        "gdn::gates_recurrence",
        "gdn::gates_recurrence_pitched",
        "gdn::chunked",
        "gdn::gates_chunked",
        "gdn::chunked_mma",
        "gdn::gates_chunked_mma",
        "gdn::gated_norm",
    ]);
}

#[test]
fn fused_projections_carry_nan_and_inf_as_their_twins() {
    use solder_model_layers::kernels::gemv::{
        AddNormGateUpSilu, AddNormLmHead, AddNormQkv, GateUpSilu, GatedNormLinearResidualAdd,
        LinearPair, LinearResidualAdd, NormGateUpSilu, NormQkv, Qkv, QkvRopeKv,
        ADD_NORM_GATE_UP_SILU, ADD_NORM_LM_HEAD, ADD_NORM_QKV, GATED_NORM_LINEAR_RESIDUAL_ADD,
        GATE_UP_SILU, LINEAR_PAIR, LINEAR_RESIDUAL_ADD, NORM_GATE_UP_SILU, NORM_QKV, QKV,
        QKV_ROPE_KV,
    };
    let mut b = Bench::new();
    // 3 rows of k = 96: row 0 poisoned in h, row 1 in x/d, row 2 clean.
    let (rows, k) = (3u32, 96u32);
    let (heads, kv_heads, head_dim) = (2u32, 1u32, 16u32);
    let (nq, nkv) = (heads * head_dim, kv_heads * head_dim);
    let n = (rows * k) as usize;
    let h = b.f32(&rows_of(rows as usize, k as usize, 1.0, &[0]));
    let x = b.bf16(&rows_of(rows as usize, k as usize, 2.0, &[1]));
    let wn = b.bf16(&rows_of(1, k as usize, 3.0, &[]));
    // Weights: one poisoned feature row in wq and in wg.
    let wq = b.bf16(&rows_of(nq as usize, k as usize, 4.0, &[7]));
    let wk = b.bf16(&rows_of(nkv as usize, k as usize, 5.0, &[]));
    let wv = b.bf16(&rows_of(nkv as usize, k as usize, 6.0, &[]));
    let bias = b.bf16(&rows_of(1, nq as usize, 7.0, &[]));
    let qkv_outs = |b: &mut Bench| {
        (
            b.zeros((rows * nq) as usize * 2),
            b.zeros((rows * nkv) as usize * 2),
            b.zeros((rows * nkv) as usize * 2),
        )
    };
    let (q, k_out, v) = qkv_outs(&mut b);
    b.run(
        &Qkv {
            x,
            wq,
            bq: Some(bias),
            wk,
            bk: None,
            wv,
            bv: None,
            q,
            k_out,
            v,
            rows,
            k,
            nq,
            nkv,
            scratch: None,
        }
        .launch(QKV),
    );
    b.mixed("qkv q", q, 2);
    // The sibling pair: q's poisoned weights and bias beside k's clean ones, widths 32 and 16.
    let (y1, y2, _) = qkv_outs(&mut b);
    b.run(
        &LinearPair {
            x,
            w1: wq,
            b1: Some(bias),
            w2: wk,
            b2: None,
            y1,
            y2,
            rows,
            k,
            n1: nq,
            n2: nkv,
            scratch: None,
        }
        .launch(LINEAR_PAIR),
    );
    b.mixed("linear_pair y1", y1, 2);
    b.mixed("linear_pair y2", y2, 2);
    let (q, k_out, v) = qkv_outs(&mut b);
    b.run(
        &NormQkv {
            h,
            wn,
            wq,
            bq: None,
            wk,
            bk: None,
            wv,
            bv: None,
            q,
            k_out,
            v,
            rows,
            k,
            nq,
            nkv,
            eps: 1e-6,
            scratch: None,
        }
        .launch(NORM_QKV),
    );
    b.mixed("norm_qkv k", k_out, 2);
    let (q, k_out, v) = qkv_outs(&mut b);
    let h_out = b.zeros(n * 4);
    b.run(
        &AddNormQkv {
            h,
            d: x,
            wn,
            wq,
            bq: None,
            wk,
            bk: None,
            wv,
            bv: None,
            h_out: Some(h_out),
            q,
            k_out,
            v,
            rows,
            k,
            nq,
            nkv,
            eps: 1e-6,
            scratch: None,
        }
        .launch(ADD_NORM_QKV),
    );
    b.mixed("add_norm_qkv h_out", h_out, 4);
    let inter = 24u32;
    let wg = b.bf16(&rows_of(inter as usize, k as usize, 8.0, &[3]));
    let wu = b.bf16(&rows_of(inter as usize, k as usize, 9.0, &[]));
    let act = b.zeros((rows * inter) as usize * 2);
    b.run(
        &GateUpSilu {
            x,
            wg,
            wu,
            act,
            rows,
            k,
            inter,
            scratch: None,
        }
        .launch(GATE_UP_SILU),
    );
    b.mixed("gate_up_silu", act, 2);
    let act = b.zeros((rows * inter) as usize * 2);
    b.run(
        &NormGateUpSilu {
            h,
            wn,
            wg,
            wu,
            act,
            rows,
            k,
            inter,
            eps: 1e-6,
            scratch: None,
        }
        .launch(NORM_GATE_UP_SILU),
    );
    b.mixed("norm_gate_up_silu", act, 2);
    let (act, h_out) = (b.zeros((rows * inter) as usize * 2), b.zeros(n * 4));
    b.run(
        &AddNormGateUpSilu {
            h,
            o: x,
            wn,
            wg,
            wu,
            h_out: Some(h_out),
            act,
            rows,
            k,
            inter,
            eps: 1e-6,
            scratch: None,
        }
        .launch(ADD_NORM_GATE_UP_SILU),
    );
    b.mixed("add_norm_gate_up_silu", act, 2);
    // The down projection back to k, added to the residual.
    let wd = b.bf16(&rows_of(k as usize, inter as usize, 10.0, &[]));
    let a_in = b.bf16(&rows_of(rows as usize, inter as usize, 11.0, &[1]));
    let h_out = b.zeros(n * 4);
    b.run(
        &LinearResidualAdd {
            x: a_in,
            w: wd,
            bias: None,
            h,
            h_out,
            rows,
            k: inter,
            n_out: k,
            scratch: None,
        }
        .launch(LINEAR_RESIDUAL_ADD),
    );
    b.mixed("linear_residual_add", h_out, 4);
    // Gated DeltaNet's gated norm staged as out_proj's x (nk 1, dk 4, nv 2, dv = inter / 2):
    // a poisoned core row poisons its row's sums only.
    let (nk, dk, nv, dv) = (1u32, 4u32, 2u32, inter / 2);
    let core = b.bf16(&rows_of(rows as usize, inter as usize, 13.0, &[1]));
    let qkvz_row = nk * (2 * dk + 2 * nv * dv);
    let qkvz = b.bf16(&rows_of(rows as usize, qkvz_row as usize, 14.0, &[]));
    let wg = b.bf16(&rows_of(1, dv as usize, 15.0, &[]));
    let h_out = b.zeros(n * 4);
    b.run(
        &GatedNormLinearResidualAdd {
            core,
            qkvz,
            wn: wg,
            w: wd,
            bias: None,
            h,
            h_out,
            rows,
            nk,
            dk,
            nv,
            dv,
            k: inter,
            n_out: k,
            eps: 1e-6,
            scratch: None,
        }
        .launch(GATED_NORM_LINEAR_RESIDUAL_ADD),
    );
    b.mixed("gated_norm_linear_residual_add", h_out, 4);
    let vocab = 40u32;
    let w_vocab = b.bf16(&rows_of(vocab as usize, k as usize, 12.0, &[9]));
    let logits = b.zeros((rows * vocab) as usize * 4);
    b.run(
        &AddNormLmHead {
            h,
            d: x,
            wn,
            w: w_vocab,
            logits,
            want: None,
            rows,
            k,
            vocab,
            eps: 1e-6,
            scratch: None,
        }
        .launch(ADD_NORM_LM_HEAD),
    );
    b.mixed("add_norm_lm_head", logits, 4);
    // qkv + qk-norm + rope + the KV write, residual add fused.
    let rotary_dim = 16u32;
    // The inverse frequencies, then a YaRN attention scaling.
    let inv_freq: Vec<f32> = (0..rotary_dim / 2)
        .map(|i| 10000f32.powf(-(2.0 * i as f32) / rotary_dim as f32))
        .chain([1.138_629_4])
        .collect();
    let inv_freq = b.f32(&inv_freq);
    let positions = b.i32(&[3, 9, 4]);
    let (block_size, pages) = (4u32, 3u32);
    let slot_mapping = b.i32(&[1, 6, 11]);
    let qwn = b.bf16(&rows_of(1, head_dim as usize, 13.0, &[]));
    let kwn = b.bf16(&rows_of(1, head_dim as usize, 14.0, &[]));
    let cache_bytes = (pages * 2 * block_size * nkv) as usize * 2;
    for qk_norm in [false, true] {
        let (q_out, cache, h_out) = (
            b.zeros((rows * nq) as usize * 2),
            b.zeros(cache_bytes),
            b.zeros(n * 4),
        );
        b.run(
            &QkvRopeKv {
                h,
                d: Some(x),
                wn,
                wq,
                bq: None,
                wk,
                bk: None,
                wv,
                bv: None,
                qwn: qk_norm.then_some(qwn),
                kwn: qk_norm.then_some(kwn),
                positions,
                inv_freq,
                slot_mapping,
                h_out: Some(h_out),
                q_out,
                cache,
                rows,
                k,
                heads,
                kv_heads,
                head_dim,
                rotary_dim,
                block_size,
                num_pages: pages,
                eps: 1e-6,
                qk_eps: 1e-6,
                scratch: None,
            }
            .launch(QKV_ROPE_KV),
        );
        b.mixed("qkv_rope_kv cache", cache, 2);
    }
    b.agree(&[
        "gemv::qkv",
        "gemv::linear_pair",
        "gemv::norm_qkv",
        "gemv::add_norm_qkv",
        "gemv::gate_up_silu",
        "gemv::norm_gate_up_silu",
        "gemv::add_norm_gate_up_silu",
        "gemv::linear_residual_add",
        "gemv::gated_norm_linear_residual_add",
        "gemv::add_norm_lm_head",
        "gemv::qkv_rope_kv",
    ]);
}
