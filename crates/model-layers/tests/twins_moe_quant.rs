//! The `moe` expert twins on quantized experts (`gate_up_silu_fp8`, `gate_up_silu_int4`,
//! `down_fp8`, `down_int4`): their bytes equal the bf16 twins' on the experts dequantised by a
//! plain per-element loop here, at several row counts and top-k routings, with k not a
//! multiple of 128 and partial scale blocks and groups; a dequantisation with a wrong expert
//! stride or scale index gives other bytes (the comparison catches it); bad blobs are refused.

mod twins_support;

use half::bf16;
use solder_circuit::WeightFormat;
use solder_model_layers::kernels::{moe, Launch};
use solder_model_layers::numerics::to_bf16;
use twins_support::{bits_bf16, poison_bf16, rd, run, run_threads, wr, Rng};

const EXPERTS: usize = 5;
const HIDDEN: usize = 200; // not a multiple of 128: a partial block / group at the row's end
const INTER: usize = 136; // two full 64-feature tiles and a partial one
const ROUTINGS: [(usize, usize); 4] = [(1, 1), (3, 2), (8, 4), (5, 5)];

fn formats() -> [WeightFormat; 5] {
    [
        WeightFormat::Fp8 {
            block_n: 128,
            block_k: 128,
        },
        WeightFormat::Fp8 {
            block_n: 1,
            block_k: 1 << 30, // per channel: one block spans each row
        },
        WeightFormat::Fp8 {
            block_n: 48,
            block_k: 24,
        },
        WeightFormat::Int4 { group: 128 },
        WeightFormat::Int4 { group: 32 },
    ]
}

/// A stack of `experts` random `[n, k]` matrices in `format`, as the device's words; the
/// padding between regions is 0xa5 so a wrong offset reads garbage.
fn random_blob(
    rng: &mut Rng,
    format: WeightFormat,
    experts: usize,
    n: usize,
    k: usize,
) -> Vec<u32> {
    let layout = format.check(n, k).unwrap();
    let bytes = format.slot_bytes(&[experts, n, k]).unwrap();
    let mut blob = vec![0xa5u8; bytes.next_multiple_of(4)];
    for e in 0..experts {
        let m = &mut blob[e * layout.stride..e * layout.stride + layout.bytes];
        for v in &mut m[..layout.values] {
            // Any e4m3 but NaN; any two nibbles.
            *v = loop {
                let b = rng.below(256) as u8;
                if !matches!(format, WeightFormat::Fp8 { .. }) || b & 0x7f != 0x7f {
                    break b;
                }
            };
        }
        for s in 0..layout.scales {
            // Scales near 2^-6 with a full mantissa, so products round.
            let scale = (1.0 + rng.unit().abs()) / 64.0 + rng.unit() * 1e-4;
            let at = layout.scales_offset + 4 * s;
            m[at..at + 4].copy_from_slice(&scale.to_le_bytes());
        }
        for z in 0..layout.zeros {
            m[layout.zeros_offset + z] = rng.below(16) as u8;
        }
    }
    blob.chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

fn e4m3(q: u8) -> f32 {
    let sign = if q & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((q >> 3) & 15) as i32, (q & 7) as f32);
    if e == 0 {
        sign * m / 512.0
    } else {
        sign * (8.0 + m) / 8.0 * 2f32.powi(e - 7)
    }
}

/// Where a plain dequantisation reads (the true one, or a mutant).
#[derive(Clone, Copy, PartialEq)]
enum Reading {
    True,
    /// Expert e at `e * bytes` (unaligned), not `e * stride`.
    PackedStride,
    /// The scale of the next block or group along k (a wrong scale index).
    NextScale,
}

/// The stacked `[experts, n, k]` matrices of a blob dequantised element by element.
fn dequantised(
    words: &[u32],
    format: WeightFormat,
    [experts, n, k]: [usize; 3],
    reading: Reading,
) -> Vec<bf16> {
    let blob: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let layout = format.check(n, k).unwrap();
    let stride = match reading {
        Reading::PackedStride => layout.bytes,
        _ => layout.stride,
    };
    let scale = |m: &[u8], s: usize| {
        let s = match reading {
            Reading::NextScale => (s + 1) % layout.scales,
            _ => s,
        };
        let at = layout.scales_offset + 4 * s;
        f32::from_le_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]])
    };
    let mut out = Vec::with_capacity(experts * n * k);
    for e in 0..experts {
        let m = &blob[e * stride..];
        for f in 0..n {
            for i in 0..k {
                let w = match format {
                    WeightFormat::Fp8 { block_n, block_k } => {
                        let (bn, bk) = (block_n as usize, block_k as usize);
                        let s = scale(m, (f / bn) * k.div_ceil(bk) + i / bk);
                        e4m3(m[f * k + i]) * s
                    }
                    WeightFormat::Int4 { group } => {
                        let g = f * k.div_ceil(group as usize) + i / group as usize;
                        let byte = m[(f * k + i) / 2];
                        let q = if i % 2 == 0 { byte & 15 } else { byte >> 4 };
                        (q as f32 - m[layout.zeros_offset + g] as f32) * scale(m, g)
                    }
                    WeightFormat::Bf16 => unreachable!(),
                };
                out.push(to_bf16(w));
            }
        }
    }
    out
}

/// `k` distinct expert ids per row, in random order.
fn random_ids(rng: &mut Rng, rows: usize, k: usize) -> Vec<i32> {
    let mut ids = Vec::with_capacity(rows * k);
    for _ in 0..rows {
        let mut pool: Vec<i32> = (0..EXPERTS as i32).collect();
        for _ in 0..k {
            ids.push(pool.remove(rng.below(pool.len())));
        }
    }
    ids
}

struct Case {
    format: WeightFormat,
    rows: usize,
    k: usize,
    x: Vec<bf16>,
    ids: Vec<i32>,
    weights: Vec<f32>,
    act: Vec<bf16>,
    wg: Vec<u32>,
    wu: Vec<u32>,
    wd: Vec<u32>,
}

impl Case {
    fn new(seed: u64, format: WeightFormat, rows: usize, k: usize) -> Case {
        let mut rng = Rng::new(seed);
        Case {
            format,
            rows,
            k,
            x: rng.bf16s(rows * HIDDEN, 1.0),
            ids: random_ids(&mut rng, rows, k),
            weights: rng.f32s(rows * k, 1.0),
            act: rng.bf16s(rows * k * INTER, 1.0),
            wg: random_blob(&mut rng, format, EXPERTS, INTER, HIDDEN),
            wu: random_blob(&mut rng, format, EXPERTS, INTER, HIDDEN),
            wd: random_blob(&mut rng, format, EXPERTS, HIDDEN, INTER),
        }
    }

    fn dims(&self) -> (u32, u32, u32, u32, u32) {
        let d = |v: usize| v as u32;
        (d(self.rows), d(HIDDEN), d(INTER), d(EXPERTS), d(self.k))
    }

    fn gate_up_quant(&self, act: &mut [bf16]) -> Launch {
        let (rows, hidden, inter, experts, k) = self.dims();
        let (x, ids, wg, wu, act) = (
            rd(&self.x),
            rd(&self.ids),
            rd(&self.wg),
            rd(&self.wu),
            wr(act),
        );
        match self.format {
            WeightFormat::Fp8 { block_n, block_k } => moe::GateUpSiluFp8 {
                x,
                ids,
                wg,
                wu,
                act,
                rows,
                hidden,
                inter,
                experts,
                k,
                block_n,
                block_k,
            }
            .launch(moe::GATE_UP_SILU_FP8),
            WeightFormat::Int4 { group } => moe::GateUpSiluInt4 {
                x,
                ids,
                wg,
                wu,
                act,
                rows,
                hidden,
                inter,
                experts,
                k,
                group,
            }
            .launch(moe::GATE_UP_SILU_INT4),
            WeightFormat::Bf16 => unreachable!(),
        }
    }

    fn down_quant(&self, out: &mut [bf16]) -> Launch {
        let (rows, hidden, inter, experts, k) = self.dims();
        let (act, ids, weights, wd) = (
            rd(&self.act),
            rd(&self.ids),
            rd(&self.weights),
            rd(&self.wd),
        );
        let out = wr(out);
        match self.format {
            WeightFormat::Fp8 { block_n, block_k } => moe::DownFp8 {
                act,
                ids,
                weights,
                wd,
                out,
                rows,
                hidden,
                inter,
                experts,
                k,
                block_n,
                block_k,
            }
            .launch(moe::DOWN_FP8),
            WeightFormat::Int4 { group } => moe::DownInt4 {
                act,
                ids,
                weights,
                wd,
                out,
                rows,
                hidden,
                inter,
                experts,
                k,
                group,
            }
            .launch(moe::DOWN_INT4),
            WeightFormat::Bf16 => unreachable!(),
        }
    }

    /// The bf16 gate_up_silu on the experts dequantised with `reading`.
    fn gate_up_bf16(&self, reading: Reading) -> Vec<u16> {
        let (rows, hidden, inter, experts, k) = self.dims();
        let dims = [EXPERTS, INTER, HIDDEN];
        let wg = dequantised(&self.wg, self.format, dims, reading);
        let wu = dequantised(&self.wu, self.format, dims, reading);
        let mut act = poison_bf16(self.rows * self.k * INTER);
        run(moe::GateUpSilu {
            x: rd(&self.x),
            ids: rd(&self.ids),
            wg: rd(&wg),
            wu: rd(&wu),
            act: wr(&mut act),
            rows,
            hidden,
            inter,
            experts,
            k,
        }
        .launch(moe::GATE_UP_SILU));
        bits_bf16(&act)
    }

    /// The bf16 down on the experts dequantised with `reading`.
    fn down_bf16(&self, reading: Reading) -> Vec<u16> {
        let (rows, hidden, inter, experts, k) = self.dims();
        let wd = dequantised(&self.wd, self.format, [EXPERTS, HIDDEN, INTER], reading);
        let mut out = poison_bf16(self.rows * HIDDEN);
        run(moe::Down {
            act: rd(&self.act),
            ids: rd(&self.ids),
            weights: rd(&self.weights),
            wd: rd(&wd),
            out: wr(&mut out),
            rows,
            hidden,
            inter,
            experts,
            k,
        }
        .launch(moe::DOWN));
        bits_bf16(&out)
    }

    fn gate_up_quant_bits(&self, threads: usize) -> Vec<u16> {
        let mut act = poison_bf16(self.rows * self.k * INTER);
        run_threads(&self.gate_up_quant(&mut act), threads).unwrap();
        bits_bf16(&act)
    }

    fn down_quant_bits(&self, threads: usize) -> Vec<u16> {
        let mut out = poison_bf16(self.rows * HIDDEN);
        run_threads(&self.down_quant(&mut out), threads).unwrap();
        bits_bf16(&out)
    }
}

#[test]
fn quantized_experts_equal_the_bf16_twins_on_the_dequantised_experts() {
    for (fi, format) in formats().into_iter().enumerate() {
        for (ri, (rows, k)) in ROUTINGS.into_iter().enumerate() {
            let c = Case::new(100 + 10 * fi as u64 + ri as u64, format, rows, k);
            let what = format!("{format} rows {rows} k {k}");
            assert_eq!(
                c.gate_up_quant_bits(1),
                c.gate_up_bf16(Reading::True),
                "gate_up_silu {what}"
            );
            assert_eq!(
                c.down_quant_bits(1),
                c.down_bf16(Reading::True),
                "down {what}"
            );
        }
    }
}

#[test]
fn quantized_results_do_not_depend_on_the_thread_count() {
    for format in formats() {
        let c = Case::new(7, format, 8, 4);
        assert_eq!(c.gate_up_quant_bits(1), c.gate_up_quant_bits(3), "{format}");
        assert_eq!(c.down_quant_bits(1), c.down_quant_bits(4), "{format}");
    }
}

#[test]
fn a_wrong_expert_stride_or_scale_index_gives_other_bytes() {
    // The comparison above can fail: a dequantisation that reads expert e at e · bytes
    // instead of e · stride, or the next block's scale, is not the twin's.
    for format in formats() {
        let c = Case::new(11, format, 3, 3);
        let layout = format.check(INTER, HIDDEN).unwrap();
        if layout.bytes != layout.stride {
            assert_ne!(
                c.gate_up_quant_bits(1),
                c.gate_up_bf16(Reading::PackedStride),
                "{format}: stride"
            );
        }
        assert_ne!(
            c.gate_up_quant_bits(1),
            c.gate_up_bf16(Reading::NextScale),
            "{format}: scale index"
        );
        assert_ne!(
            c.down_quant_bits(1),
            c.down_bf16(Reading::NextScale),
            "{format}: scale index"
        );
    }
}

#[test]
fn short_blobs_and_bad_formats_are_refused_naming_the_kernel() {
    let refused = |launch: Launch| {
        let err = run_threads(&launch, 1).expect_err("the launch should be refused");
        assert!(err.to_string().contains(launch.kernel), "{err}");
        err.to_string()
    };
    let mut c = Case::new(3, formats()[0], 3, 2);
    c.wg.truncate(c.wg.len() - 64);
    let mut act = poison_bf16(3 * 2 * INTER);
    let err = refused(c.gate_up_quant(&mut act));
    assert!(err.contains("`wg`"), "{err}");
    assert!(act.iter().all(|v| v.is_nan()), "nothing is written");

    let mut c = Case::new(4, WeightFormat::Int4 { group: 32 }, 3, 2);
    c.format = WeightFormat::Int4 { group: 0 };
    let mut out = poison_bf16(3 * HIDDEN);
    let err = refused(c.down_quant(&mut out));
    assert!(err.contains("group is 0"), "{err}");
    let mut c = Case::new(5, formats()[0], 3, 2);
    c.ids[1] = EXPERTS as i32;
    let mut out = poison_bf16(3 * HIDDEN);
    refused(c.down_quant(&mut out));
}
