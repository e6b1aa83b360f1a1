//! Dequantisation of one weight row stored in a [`WeightFormat`] blob (the layout
//! `solder_circuit::format` fixes), and the reference quantiser tests and seeded weights use to
//! write such blobs.
//!
//! Invariant: [`dequant_row`] is the one definition of a quantized weight's bf16 value; every
//! CPU twin reading a quantized slot calls it, and the CUDA kernels (`common.cuh`'s
//! `e4m3_to_f32`, `dequant_fp8`, `dequant_int4`) do the same arithmetic: fp8
//! `bf16_rn(f32(e4m3(q)) * scale)`, int4 `bf16_rn(f32(q - z) * scale)`, one f32 product each.

use half::bf16;
use solder_circuit::WeightFormat;

use super::to_bf16;

/// The f32 value of an FP8 e4m3 (OCP "e4m3fn") code: bias 7, no infinities, 0x7f/0xff NaN
/// (returned as the canonical quiet NaN). Integer code, as the CUDA twin is.
pub fn e4m3_to_f32(q: u8) -> f32 {
    let sign = ((q as u32) & 0x80) << 24;
    let exponent = ((q >> 3) & 0xf) as u32;
    let mantissa = (q & 0x7) as u32;
    let magnitude = if exponent == 0xf && mantissa == 0x7 {
        return f32::from_bits(0x7fc0_0000);
    } else if exponent == 0 {
        // Subnormal: mantissa · 2^-9, exact in f32.
        (mantissa as f32 * (1.0 / 512.0)).to_bits()
    } else {
        ((exponent + 120) << 23) | (mantissa << 20)
    };
    f32::from_bits(sign | magnitude)
}

/// `x` rounded to the nearest e4m3fn value, ties to even; magnitudes past 448 saturate to
/// 448 (what a scale chosen from the block's maximum never reaches); NaN stays NaN.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    // Below the smallest normal (2^-6) the step is 2^-9: the code is the count of steps (8
    // steps rounds up into the first normal, whose code is 8 as well).
    if a < (2.0f32).powi(-6) {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    if a >= 464.0 {
        // 464 is halfway between 448 and 480 (the next step, which e4m3fn lacks).
        return sign | 0x7e;
    }
    let exp = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
    let mut mant = ((a / (2.0f32).powi(exp) - 1.0) * 8.0).round_ties_even() as i32;
    let mut biased = exp + 7;
    if mant == 8 {
        mant = 0;
        biased += 1;
    }
    if biased > 15 || (biased == 15 && mant == 7) {
        return sign | 0x7e;
    }
    sign | ((biased as u8) << 3) | mant as u8
}

/// Row `f` of the `n × k` matrix stored in `blob` (laid out as `format.layout(n, k)` says),
/// dequantised to bf16 into `out[..k]`. A bf16 blob is read as little-endian bf16.
///
/// Panics when `blob` is shorter than the layout or `out` shorter than `k` (callers hold a
/// blob the layout sized).
pub fn dequant_row(
    format: WeightFormat,
    blob: &[u8],
    n: usize,
    k: usize,
    f: usize,
    out: &mut [bf16],
) {
    let layout = format
        .layout(n, k)
        .expect("dequant_row: a layout check accepted");
    let out = &mut out[..k];
    match format {
        WeightFormat::Bf16 => {
            let row = &blob[f * k * 2..(f + 1) * k * 2];
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        WeightFormat::Fp8 { block_n, block_k } => {
            let (block_n, block_k) = (block_n as usize, block_k as usize);
            let scale_row = (f / block_n) * k.div_ceil(block_k);
            let row = &blob[f * k..(f + 1) * k];
            let table = e4m3_table();
            // One scale per run of `block_k` values: the same arithmetic, element by element.
            for (b, (outs, qs)) in out.chunks_mut(block_k).zip(row.chunks(block_k)).enumerate() {
                let scale = read_f32(blob, layout.scales_offset, scale_row + b);
                for (o, &q) in outs.iter_mut().zip(qs) {
                    *o = to_bf16(table[q as usize] * scale);
                }
            }
        }
        WeightFormat::Int4 { group } => {
            let group = group as usize;
            let groups = k.div_ceil(group);
            let row = &blob[f * k / 2..(f + 1) * k / 2];
            for (g, outs) in out.chunks_mut(group).enumerate() {
                let at = f * groups + g;
                let scale = read_f32(blob, layout.scales_offset, at);
                let zero = blob[layout.zeros_offset + at];
                for (j, o) in outs.iter_mut().enumerate() {
                    *o = dequant_int4(nibble(row, g * group + j), zero, scale);
                }
            }
        }
    }
}

/// Every e4m3 code's f32 value (`e4m3_to_f32`), computed once.
fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|q| e4m3_to_f32(q as u8)))
}

/// The `n × k` matrix stored in `blob`, dequantised to bf16 row by row (`dequant_row`) into
/// `out[..n * k]`, on up to `threads` threads (the bytes do not depend on the count).
pub fn dequant_matrix(
    format: WeightFormat,
    blob: &[u8],
    (n, k): (usize, usize),
    out: &mut [bf16],
    threads: usize,
) {
    if k == 0 {
        return;
    }
    // Chunks of whole rows, a few per thread.
    let rows_per_chunk = n.div_ceil(threads.max(1) * 4).max(1);
    solder_gpu_runtime::par_chunks_mut(
        &mut out[..n * k],
        rows_per_chunk * k,
        threads,
        |c, chunk| {
            dequant_rows(format, blob, (n, k), c * rows_per_chunk, chunk);
        },
    );
}

/// fp8 blocks of at least this many weights (`block_n · block_k`) share a table of the 256
/// codes' values per scale; smaller ones are dequantised weight by weight.
const FP8_TABLE_MIN: usize = 1024;

/// int4 groups of at least this many weights get a table of their 16 values.
const INT4_TABLE_MIN: usize = 64;

/// Whole rows `first..` of the matrix into `out`, each with `dequant_row`'s bits: an fp8 block
/// through a table of every code's `dequant_fp8` under its scale (built once per row block,
/// shared by its rows), an int4 group through its 16 values' `dequant_int4`; so a weight
/// costs a lookup, not a product and a rounding.
fn dequant_rows(
    format: WeightFormat,
    blob: &[u8],
    (n, k): (usize, usize),
    first: usize,
    out: &mut [bf16],
) {
    let layout = format
        .layout(n, k)
        .expect("dequant_rows: a layout check accepted");
    match format {
        WeightFormat::Fp8 { block_n, block_k }
            if block_n as usize * block_k as usize >= FP8_TABLE_MIN =>
        {
            let (block_n, block_k) = (block_n as usize, block_k as usize);
            let blocks = k.div_ceil(block_k);
            let codes = e4m3_table();
            let mut tables = vec![[bf16::ZERO; 256]; blocks];
            let mut tables_of = None;
            for (r, out) in out.chunks_exact_mut(k).enumerate() {
                let f = first + r;
                let row_block = f / block_n;
                if tables_of != Some(row_block) {
                    for (b, table) in tables.iter_mut().enumerate() {
                        let scale = read_f32(blob, layout.scales_offset, row_block * blocks + b);
                        for (v, code) in table.iter_mut().zip(codes) {
                            *v = to_bf16(code * scale);
                        }
                    }
                    tables_of = Some(row_block);
                }
                let row = &blob[f * k..(f + 1) * k];
                for ((outs, qs), table) in out
                    .chunks_mut(block_k)
                    .zip(row.chunks(block_k))
                    .zip(&tables)
                {
                    for (o, &q) in outs.iter_mut().zip(qs) {
                        *o = table[q as usize];
                    }
                }
            }
        }
        WeightFormat::Int4 { group } if group as usize >= INT4_TABLE_MIN => {
            let group = group as usize;
            let groups = k.div_ceil(group);
            for (r, out) in out.chunks_exact_mut(k).enumerate() {
                let f = first + r;
                let row = &blob[f * k / 2..(f + 1) * k / 2];
                for (g, outs) in out.chunks_mut(group).enumerate() {
                    let at = f * groups + g;
                    let scale = read_f32(blob, layout.scales_offset, at);
                    let zero = blob[layout.zeros_offset + at];
                    let table: [bf16; 16] =
                        std::array::from_fn(|q| dequant_int4(q as u8, zero, scale));
                    for (j, o) in outs.iter_mut().enumerate() {
                        *o = table[nibble(row, g * group + j) as usize];
                    }
                }
            }
        }
        _ => {
            for (r, row) in out.chunks_exact_mut(k).enumerate() {
                dequant_row(format, blob, n, k, first + r, row);
            }
        }
    }
}

/// One fp8 weight: `bf16_rn(f32(e4m3(q)) * scale)`.
#[inline]
pub fn dequant_fp8(q: u8, scale: f32) -> bf16 {
    to_bf16(e4m3_to_f32(q) * scale)
}

/// One int4 weight: `bf16_rn(f32(q - z) * scale)`.
#[inline]
pub fn dequant_int4(q: u8, zero: u8, scale: f32) -> bf16 {
    to_bf16((q as i32 - zero as i32) as f32 * scale)
}

/// Element `i` of a packed int4 row: the low nibble for even `i`.
#[inline]
fn nibble(row: &[u8], i: usize) -> u8 {
    (row[i / 2] >> ((i % 2) * 4)) & 0xf
}

fn read_f32(blob: &[u8], offset: usize, index: usize) -> f32 {
    let at = offset + index * 4;
    f32::from_le_bytes(blob[at..at + 4].try_into().expect("four bytes"))
}

/// The blob of the `n × k` row-major f32 matrix `w` quantized to `format` (absmax scales:
/// `absmax / 448` per fp8 block; per int4 group the affine scale `(max - min) / 15` and its
/// zero point). The reference quantiser for tests and seeded weights, not a checkpoint reader.
pub fn quantize_matrix(format: WeightFormat, w: &[f32], n: usize, k: usize) -> Vec<u8> {
    let layout = format
        .check(n, k)
        .unwrap_or_else(|e| panic!("quantize_matrix: {e}"));
    assert_eq!(w.len(), n * k, "quantize_matrix: {n} x {k} values");
    let mut blob = vec![0u8; layout.bytes];
    match format {
        WeightFormat::Bf16 => {
            for (b, v) in blob.chunks_exact_mut(2).zip(w) {
                b.copy_from_slice(&to_bf16(*v).to_bits().to_le_bytes());
            }
        }
        WeightFormat::Fp8 { block_n, block_k } => {
            let (block_n, block_k) = (block_n as usize, block_k as usize);
            let cols = k.div_ceil(block_k);
            for bn in 0..n.div_ceil(block_n) {
                for bk in 0..cols {
                    let rows = bn * block_n..((bn + 1) * block_n).min(n);
                    let span = bk * block_k..((bk + 1) * block_k).min(k);
                    let absmax = rows
                        .clone()
                        .flat_map(|f| w[f * k + span.start..f * k + span.end].iter())
                        .fold(0f32, |m, v| m.max(v.abs()));
                    let scale = if absmax > 0.0 { absmax / 448.0 } else { 1.0 };
                    write_f32(&mut blob, layout.scales_offset, bn * cols + bk, scale);
                    for f in rows {
                        for i in span.clone() {
                            blob[f * k + i] = f32_to_e4m3(w[f * k + i] / scale);
                        }
                    }
                }
            }
        }
        WeightFormat::Int4 { group } => {
            let group = group as usize;
            let groups = k.div_ceil(group);
            for f in 0..n {
                for g in 0..groups {
                    let span = g * group..((g + 1) * group).min(k);
                    let values = &w[f * k + span.start..f * k + span.end];
                    let lo = values.iter().fold(0f32, |m, v| m.min(*v));
                    let hi = values.iter().fold(0f32, |m, v| m.max(*v));
                    let scale = if hi > lo { (hi - lo) / 15.0 } else { 1.0 };
                    let zero = (-lo / scale).round().clamp(0.0, 15.0) as u8;
                    write_f32(&mut blob, layout.scales_offset, f * groups + g, scale);
                    blob[layout.zeros_offset + f * groups + g] = zero;
                    for i in span {
                        let q = ((w[f * k + i] / scale).round() + zero as f32).clamp(0.0, 15.0);
                        blob[(f * k + i) / 2] |= (q as u8) << ((i % 2) * 4);
                    }
                }
            }
        }
    }
    blob
}

fn write_f32(blob: &mut [u8], offset: usize, index: usize, value: f32) {
    let at = offset + index * 4;
    blob[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_through_the_tables_has_each_rows_bits() {
        // fp8 blocks with tables (128 x 128; 16 x 64: three row blocks) and without (8 x 4;
        // per-row scales 1 x 64), int4 groups with and without (64, 32); 37 rows, in chunks
        // that start inside a row block and cross one; a code of every value, NaN's included.
        let (n, k) = (37, 192);
        let w: Vec<f32> = (0..n * k)
            .map(|i| {
                // Rows of growing size: every block has its own scale.
                let row = 1.0 + (i / k) as f32 * 0.37;
                ((i * 7919 % 1000) as f32 - 500.0)
                    * 0.013
                    * row
                    * if i % 11 == 0 { 40.0 } else { 1.0 }
            })
            .collect();
        for format in [
            WeightFormat::Fp8 {
                block_n: 128,
                block_k: 128,
            },
            WeightFormat::Fp8 {
                block_n: 16,
                block_k: 64,
            },
            WeightFormat::Fp8 {
                block_n: 8,
                block_k: 4,
            },
            WeightFormat::Fp8 {
                block_n: 1,
                block_k: 64,
            },
            WeightFormat::Int4 { group: 64 },
            WeightFormat::Int4 { group: 32 },
        ] {
            let mut blob = quantize_matrix(format, &w, n, k);
            if let WeightFormat::Fp8 { .. } = format {
                // Every code once (0x7f and 0xff are NaN), in the first row.
                for (q, b) in blob[..256].iter_mut().enumerate() {
                    *b = q as u8;
                }
            }
            let mut row = vec![bf16::ZERO; k];
            // On 3 threads, chunks of 4 rows; on 1, of 10: rows 10-19 cross a row block.
            for threads in [3, 1] {
                let mut got = vec![bf16::ZERO; n * k];
                dequant_matrix(format, &blob, (n, k), &mut got, threads);
                for f in 0..n {
                    dequant_row(format, &blob, n, k, f, &mut row);
                    let want: Vec<u16> = row.iter().map(|v| v.to_bits()).collect();
                    let have: Vec<u16> = got[f * k..(f + 1) * k]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    assert_eq!(have, want, "{format:?} row {f}, {threads} threads");
                }
            }
        }
    }

    #[test]
    fn e4m3_codes_decode_to_their_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exponent 7, mantissa 0
        assert_eq!(e4m3_to_f32(0x3c), 1.5);
        assert_eq!(e4m3_to_f32(0xb9), -1.125);
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // the largest finite
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert_eq!(e4m3_to_f32(0x08), 1.0 / 64.0); // the smallest normal, 2^-6
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0); // the smallest subnormal, 2^-9
        assert_eq!(e4m3_to_f32(0x07), 7.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x85), -5.0 / 512.0);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    }

    #[test]
    fn e4m3_encoding_rounds_to_nearest_even_and_saturates() {
        for code in (0u8..=0xff).filter(|c| c & 0x7f != 0x7f) {
            assert_eq!(f32_to_e4m3(e4m3_to_f32(code)), code, "code {code:#x}");
        }
        assert_eq!(f32_to_e4m3(1000.0), 0x7e);
        assert_eq!(f32_to_e4m3(-1000.0), 0xfe);
        // 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39): the even code.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.0626), 0x39);
    }

    fn fp8_blob(format: WeightFormat, n: usize, k: usize, codes: &[u8], scales: &[f32]) -> Vec<u8> {
        let layout = format.check(n, k).unwrap();
        assert_eq!(scales.len(), layout.scales);
        let mut blob = vec![0u8; layout.bytes];
        blob[..n * k].copy_from_slice(codes);
        for (i, s) in scales.iter().enumerate() {
            write_f32(&mut blob, layout.scales_offset, i, *s);
        }
        blob
    }

    #[test]
    fn fp8_rows_take_the_scale_of_their_block_with_partial_edge_blocks() {
        // n = 3, k = 5, blocks 2 × 2: scales [2, 3] with partial last row and column blocks.
        let format = WeightFormat::Fp8 {
            block_n: 2,
            block_k: 2,
        };
        let codes = [
            0x38, 0x38, 0x38, 0x38, 0x38, // row 0: all 1.0
            0xb8, 0x3c, 0x01, 0x00, 0x7e, // row 1
            0x38, 0x38, 0x38, 0x38, 0x38, // row 2: all 1.0
        ];
        let scales = [0.5, 2.0, -3.0, 0.25, 1.0, 10.0];
        let blob = fp8_blob(format, 3, 5, &codes, &scales);
        let mut row = [bf16::ZERO; 5];
        dequant_row(format, &blob, 3, 5, 0, &mut row);
        let want = [0.5, 0.5, 2.0, 2.0, -3.0].map(bf16::from_f32);
        assert_eq!(row, want);
        dequant_row(format, &blob, 3, 5, 1, &mut row);
        // -1·0.5, 1.5·0.5, 2^-9·2 = 2^-8, 0·2, 448·(-3)
        let want = [-0.5, 0.75, 1.0 / 256.0, 0.0, -1344.0].map(bf16::from_f32);
        assert_eq!(row, want);
        dequant_row(format, &blob, 3, 5, 2, &mut row);
        assert_eq!(row, [0.25, 0.25, 1.0, 1.0, 10.0].map(bf16::from_f32));
    }

    #[test]
    fn fp8_product_is_rounded_once_to_bf16() {
        // 1.125 · 1.0078125 = 1.1337890625: in f32 exactly, rounded to bf16 (8 bits) → 1.1328125.
        assert_eq!(dequant_fp8(0x39, 1.0078125).to_f32(), 1.1328125);
        // Per-channel (block_n 1, block_k k): one scale per row.
        let format = WeightFormat::Fp8 {
            block_n: 1,
            block_k: 3,
        };
        let blob = fp8_blob(
            format,
            2,
            3,
            &[0x38, 0x40, 0xc0, 0x30, 0x38, 0x00],
            &[3.0, 0.5],
        );
        let mut row = [bf16::ZERO; 3];
        dequant_row(format, &blob, 2, 3, 0, &mut row);
        assert_eq!(row, [3.0, 6.0, -6.0].map(bf16::from_f32));
        dequant_row(format, &blob, 2, 3, 1, &mut row);
        assert_eq!(row, [0.25, 0.5, 0.0].map(bf16::from_f32));
    }

    #[test]
    fn int4_rows_unpack_nibbles_with_their_group_scale_and_zero() {
        // n = 2, k = 6, group 4: groups per row 2 (the last one partial, 2 values).
        let format = WeightFormat::Int4 { group: 4 };
        let layout = format.check(2, 6).unwrap();
        let mut blob = vec![0u8; layout.bytes];
        // Row 0 values 0..6 = [1, 2, 15, 0, 8, 9]; row 1 = [7, 7, 7, 7, 3, 12].
        blob[..6].copy_from_slice(&[0x21, 0x0f, 0x98, 0x77, 0x77, 0xc3]);
        for (i, s) in [0.5f32, 2.0, 1.0, -0.25].iter().enumerate() {
            write_f32(&mut blob, layout.scales_offset, i, *s);
        }
        blob[layout.zeros_offset..layout.zeros_offset + 4].copy_from_slice(&[8, 0, 7, 8]);
        let mut row = [bf16::ZERO; 6];
        dequant_row(format, &blob, 2, 6, 0, &mut row);
        assert_eq!(row, [-3.5, -3.0, 3.5, -4.0, 16.0, 18.0].map(bf16::from_f32));
        dequant_row(format, &blob, 2, 6, 1, &mut row);
        assert_eq!(row, [0.0, 0.0, 0.0, 0.0, 1.25, -1.0].map(bf16::from_f32));
    }

    #[test]
    fn quantized_matrices_dequantise_close_to_their_source() {
        let (n, k) = (5, 70);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        for format in [
            WeightFormat::Fp8 {
                block_n: 2,
                block_k: 32,
            },
            WeightFormat::Int4 { group: 16 },
            WeightFormat::Bf16,
        ] {
            let blob = quantize_matrix(format, &w, n, k);
            let mut row = vec![bf16::ZERO; k];
            for f in 0..n {
                dequant_row(format, &blob, n, k, f, &mut row);
                for (i, v) in row.iter().enumerate() {
                    let err = (v.to_f32() - w[f * k + i]).abs();
                    assert!(err < 0.3, "{format} ({f}, {i}): {} vs {}", v, w[f * k + i]);
                }
            }
        }
    }
}
