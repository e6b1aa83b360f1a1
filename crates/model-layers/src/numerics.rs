//! The arithmetic every CPU twin is made of: bf16 storage, f32 arithmetic, round-to-nearest-even
//! when a value is stored as bf16.
//!
//! Invariant: a fused twin computes each value it shares with the reference twins it replaces
//! through the same primitive here, in the same order, so the two routings give the same bytes.
//! Reductions (`reduce`) follow the CUDA kernels' own order, fma included, so a twin and its
//! CUDA kernel agree byte for byte; elementwise arithmetic is plain IEEE operations (Rust never
//! contracts to FMA). No result depends on the thread count or on how the work is split.

use half::bf16;

/// bf16 → f32, exactly, by a shift (vectorises, unlike a call into `half`).
#[inline(always)]
pub fn to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// f32 → bf16, round to nearest even; every NaN becomes the canonical NaN 0x7fff, as the GPU's
/// `cvt.rn.bf16.f32` (and the host emulation's) stores it, so a NaN's bytes match too.
///
/// Branch-free (the rounding is a carry: `x + 0x7fff + lsb`, then the high half), so a loop of
/// conversions vectorises and random low bits cost no mispredicted branches; the bits are
/// `half`'s `bf16::from_f32` for every non-NaN input (test `to_bf16_is_halfs_rounding`).
#[inline(always)]
pub fn to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    bf16::from_bits(if x.is_nan() { 0x7fff } else { rounded })
}

mod attention;
pub mod dequant;
mod flash;
mod mma;
mod reduce;

pub use attention::{attend, AttendScratch};
pub use flash::{attend_mma, flash_chunk, FlashScratch, Kv, KvTiles, FLASH_KEYS, FLASH_SPLITS};
pub use mma::{mma_dot, stream_dots, MmaPanel, MMA_BLOCK, MMA_K_TILE, MMA_ROWS};

pub use reduce::{
    blocked_len, dot_1x4, dot_4x1, dot_bf16, dot_bf16_lanes, dot_blocked, dot_blocked_1x4,
    dot_blocked_lanes, dot_f32_bf16, dot_head, sum_squares_bf16, sum_squares_f32,
    sum_squares_f32_lanes, transpose_blocks, warp_strided_sum, warp_sum, Blocked, CHUNK, DOT_SEG,
    WARP,
};

/// A logits row's greedy token: the arg-max, the lowest index among equal maxima, NaN never;
/// `None` when the row holds nothing but -inf and NaN (pick.cu `argmax`, and the host's
/// `sampling::greedy` on the rows its sampler accepts).
pub fn greedy_id(row: &[f32]) -> Option<u32> {
    let mut best: Option<(f32, usize)> = None;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(b, _)| v > b) {
            best = Some((v, i));
        }
    }
    best.filter(|(v, _)| *v != f32::NEG_INFINITY)
        .map(|(_, i)| i as u32)
}

/// 1 / sqrt(mean square + eps) of a row whose sum of squares is `ss`.
#[inline]
pub fn inv_rms(ss: f32, len: usize, eps: f32) -> f32 {
    1.0 / (ss / len as f32 + eps).sqrt()
}

/// RMSNorm of an f32 row: out\[i\] = bf16((x\[i\] · inv) · w\[i\]).
pub fn rms_norm_row(x: &[f32], w: &[bf16], eps: f32, out: &mut [bf16]) {
    let inv = inv_rms(sum_squares_f32(x), x.len(), eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = to_bf16((*v * inv) * to_f32(*g));
    }
}

/// RMSNorm of a bf16 row (qk-norm, one head): out\[i\] = bf16((x\[i\] · inv) · w\[i\]).
pub fn rms_norm_row_bf16(x: &[bf16], w: &[bf16], eps: f32, out: &mut [bf16]) {
    let inv = inv_rms(sum_squares_bf16(x), x.len(), eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = to_bf16((to_f32(*v) * inv) * to_f32(*g));
    }
}

/// Zero-centred RMSNorm of a bf16 row (Qwen3-Next's qk-norm, one head):
/// out\[i\] = bf16((x\[i\] · inv) · (1 + w\[i\])).
pub fn rms_norm_zc_row_bf16(x: &[bf16], w: &[bf16], eps: f32, out: &mut [bf16]) {
    let inv = inv_rms(sum_squares_bf16(x), x.len(), eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = to_bf16((to_f32(*v) * inv) * (1.0 + to_f32(*g)));
    }
}

/// One projection output: bf16(acc + bias).
#[inline(always)]
pub fn linear_value(acc: f32, bias: Option<bf16>) -> bf16 {
    match bias {
        Some(b) => to_bf16(acc + to_f32(b)),
        None => to_bf16(acc),
    }
}

/// One row of a projection: y\[o\] = bf16(dot(x, w\[o\]) + bias\[o\]), `w` is `[y.len()][x.len()]`.
pub fn linear_row(x: &[bf16], w: &[bf16], bias: Option<&[bf16]>, y: &mut [bf16]) {
    let k = x.len();
    for (o, out) in y.iter_mut().enumerate() {
        *out = linear_value(dot_bf16(x, &w[o * k..(o + 1) * k]), bias.map(|b| b[o]));
    }
}

/// One row of the LM head: logits\[o\] = dot(x, w\[o\]).
pub fn lm_head_row(x: &[bf16], w: &[bf16], logits: &mut [f32]) {
    let k = x.len();
    for (o, out) in logits.iter_mut().enumerate() {
        *out = dot_bf16(x, &w[o * k..(o + 1) * k]);
    }
}

/// Residual stream plus a branch output.
#[inline(always)]
pub fn residual_value(h: f32, x: bf16) -> f32 {
    h + to_f32(x)
}

/// out\[i\] = h\[i\] + x\[i\].
pub fn residual_row(h: &[f32], x: &[bf16], out: &mut [f32]) {
    for ((o, a), b) in out.iter_mut().zip(h).zip(x) {
        *o = residual_value(*a, *b);
    }
}

/// silu(g) · u, in f32, stored bf16.
#[inline(always)]
pub fn silu_mul_value(g: bf16, u: bf16) -> bf16 {
    let (g, u) = (to_f32(g), to_f32(u));
    to_bf16((g / (1.0 + (-g).exp())) * u)
}

/// The rotary tables of one position: cos/sin of position · inv_freq\[i\], times `scaling`
/// (YaRN's attention scaling, in f32 as transformers; 1.0 leaves them unchanged).
pub fn rope_cos_sin(
    position: i32,
    inv_freq: &[f32],
    scaling: f32,
    cos: &mut [f32],
    sin: &mut [f32],
) {
    for ((f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        let angle = (position as f32) * *f;
        *c = angle.cos() * scaling;
        *s = angle.sin() * scaling;
    }
}

/// Rotate-half rope of one head over its first `2 · cos.len()` dims; the rest are copied.
pub fn rope_head(x: &[bf16], cos: &[f32], sin: &[f32], out: &mut [bf16]) {
    let half = cos.len();
    for i in 0..half {
        let (x1, x2) = (to_f32(x[i]), to_f32(x[i + half]));
        let (c, s) = (cos[i], sin[i]);
        out[i] = to_bf16(x1 * c - x2 * s);
        out[i + half] = to_bf16(x2 * c + x1 * s);
    }
    out[2 * half..].copy_from_slice(&x[2 * half..]);
}

/// acc\[i\] += p · x\[i\], elementwise (so any vector width gives the same bits).
#[inline]
pub fn axpy_bf16(acc: &mut [f32], p: f32, x: &[bf16]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked above).
        return unsafe { axpy_bf16_avx2(acc, p, x) };
    }
    axpy_bf16_plain(acc, p, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn axpy_bf16_avx2(acc: &mut [f32], p: f32, x: &[bf16]) {
    axpy_bf16_plain(acc, p, x)
}

#[inline(always)]
fn axpy_bf16_plain(acc: &mut [f32], p: f32, x: &[bf16]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a += p * to_f32(*v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_bf16_is_halfs_rounding() {
        // Every 997th bit pattern (all exponents, both signs, every low-bit class) and the
        // edges: ties to even both ways, the largest finite rounding to infinity, infinities,
        // subnormals, zeros; every NaN to 0x7fff.
        let edges = [
            0x3f80_8000u32, // a tie, even below: stays
            0x3f81_8000,    // a tie, odd below: rounds up
            0x3f80_8001,
            0x3f80_7fff,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x0000_8000,
            0x0001_8000,
            0x8000_0000,
            0,
        ];
        let patterns = (0..=u32::MAX).step_by(997).chain(edges);
        for b in patterns {
            let x = f32::from_bits(b);
            let want = if x.is_nan() {
                0x7fff
            } else {
                bf16::from_f32(x).to_bits()
            };
            assert_eq!(to_bf16(x).to_bits(), want, "{b:#010x}");
        }
        assert_eq!(to_bf16(f32::from_bits(0x7fc0_0001)).to_bits(), 0x7fff);
        assert_eq!(to_bf16(f32::from_bits(0xff80_0001)).to_bits(), 0x7fff);
    }
}
