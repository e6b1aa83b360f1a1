//! The arithmetic every CPU twin is made of: bf16 storage, f32 arithmetic, round-to-nearest-even
//! when a value is stored as bf16.
//!
//! Invariant: a fused twin computes each value it shares with the reference twins it replaces
//! through the same primitive here, in the same order, so the two routings give the same bytes.
//! Reductions use a fixed order (16 lane accumulators, a fixed pairwise tree, then the tail
//! sequentially) and plain multiply-then-add (Rust never contracts to FMA), so no result
//! depends on the thread count or on how the work is split.

use half::bf16;

/// Lane accumulators of every reduction.
pub const LANES: usize = 16;

/// bf16 → f32, exactly, by a shift (vectorises, unlike a call into `half`).
#[inline(always)]
pub fn to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// f32 → bf16, round to nearest even; every NaN becomes the canonical NaN 0x7fff, as the GPU's
/// `cvt.rn.bf16.f32` (and the host emulation's) stores it, so a NaN's bytes match too.
#[inline(always)]
pub fn to_bf16(x: f32) -> bf16 {
    if x.is_nan() {
        bf16::from_bits(0x7fff)
    } else {
        bf16::from_f32(x)
    }
}

/// Combines the lanes in a fixed pairwise tree: 16 → 8 → 4 → 2 → 1.
#[inline(always)]
fn combine(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// Σ a\[i\]·b\[i\] over the shorter length, in the lane order.
///
/// On x86-64 with AVX2 the same code is compiled with AVX2 enabled (chosen at run time): the
/// operations and their order are unchanged, so the bits are too.
#[inline]
pub fn dot_bf16(a: &[bf16], b: &[bf16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked above).
        return unsafe { dot_bf16_avx2(a, b) };
    }
    dot_bf16_lanes(a, b)
}

/// `dot_bf16_lanes` in AVX2 intrinsics: lanes 0..8 and 8..16 of the accumulator are two
/// 8-wide registers; the same multiplies and adds per lane, then the same tree and tail.
///
/// Safety: the CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_bf16_avx2(a: &[bf16], b: &[bf16]) -> f32 {
    use std::arch::x86_64::*;
    let len = a.len().min(b.len());
    let chunks = len / LANES;
    let (pa, pb) = (a.as_ptr() as *const u16, b.as_ptr() as *const u16);
    // bf16 → f32: zero-extend 8 u16 to u32, shift into the high half. `p` must have 8 bf16
    // of one slice behind it.
    let widen = |p: *const u16| {
        // SAFETY: 8 readable u16 at `p` (every call below); the load takes unaligned addresses.
        let eight = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(eight)))
    };
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for c in 0..chunks {
        // SAFETY: c < chunks, so the LANES (16) elements from c * LANES lie inside both
        // slices: these are the chunk's two halves of 8.
        let (xa, xb, xa8, xb8) = unsafe {
            let (xa, xb) = (pa.add(c * LANES), pb.add(c * LANES));
            (xa, xb, xa.add(8), xb.add(8))
        };
        lo = _mm256_add_ps(lo, _mm256_mul_ps(widen(xa), widen(xb)));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(widen(xa8), widen(xb8)));
    }
    let mut acc = [0.0f32; LANES];
    // SAFETY: `acc` holds LANES (16) f32; the unaligned stores write 0..8 and 8..16.
    unsafe {
        _mm256_storeu_ps(acc.as_mut_ptr(), lo);
        _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi);
    }
    let mut sum = combine(acc);
    for i in chunks * LANES..len {
        sum += to_f32(a[i]) * to_f32(b[i]);
    }
    sum
}

/// The definition of `dot_bf16`, without run-time dispatch (the AVX2 path must equal it).
#[inline(always)]
pub fn dot_bf16_lanes(a: &[bf16], b: &[bf16]) -> f32 {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += to_f32(x[i]) * to_f32(y[i]);
        }
    }
    let mut sum = combine(acc);
    for (x, y) in ta.iter().zip(tb) {
        sum += to_f32(*x) * to_f32(*y);
    }
    sum
}

/// Σ a\[i\]·b\[i\] with `a` in f32, in the lane order.
#[inline]
pub fn dot_f32_bf16(a: &[f32], b: &[bf16]) -> f32 {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * to_f32(y[i]);
        }
    }
    let mut sum = combine(acc);
    for (x, y) in ta.iter().zip(tb) {
        sum += *x * to_f32(*y);
    }
    sum
}

/// Σ x\[i\]², in the lane order.
#[inline]
pub fn sum_squares_f32(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i] * c[i];
        }
    }
    let mut sum = combine(acc);
    for v in tail {
        sum += *v * *v;
    }
    sum
}

/// Σ x\[i\]² of bf16 values, in the lane order (equal to `sum_squares_f32` of the widened row).
#[inline]
pub fn sum_squares_bf16(x: &[bf16]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            let v = to_f32(c[i]);
            acc[i] += v * v;
        }
    }
    let mut sum = combine(acc);
    for v in tail {
        let v = to_f32(*v);
        sum += v * v;
    }
    sum
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

/// One projection output: bf16(acc + bias).
#[inline(always)]
pub fn linear_value(acc: f32, bias: Option<bf16>) -> bf16 {
    match bias {
        Some(b) => to_bf16(acc + to_f32(b)),
        None => to_bf16(acc),
    }
}

/// One row of a projection: y\[o\] = bf16(dot(x, w\[o\]) + bias\[o\]), `w` is `[y.len()]\[x.len()\]`.
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

/// The rotary tables of one position: cos/sin of position · inv_freq\[i\].
pub fn rope_cos_sin(position: i32, inv_freq: &[f32], cos: &mut [f32], sin: &mut [f32]) {
    for ((f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        let angle = (position as f32) * *f;
        *c = angle.cos();
        *s = angle.sin();
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

/// Softmax attention of one query head over `seq_len` keys and values.
///
/// s_j = dot(q, k_j) · scale; p_j = exp(s_j − max); out\[d\] = (Σ_j p_j · v_j\[d\]) / Σ_j p_j, every
/// sum sequential over j. `scores` and `acc` are scratch (resized here).
pub fn attend<'k>(
    q: &[bf16],
    seq_len: usize,
    scale: f32,
    (key, value): (impl Fn(usize) -> &'k [bf16], impl Fn(usize) -> &'k [bf16]),
    scores: &mut Vec<f32>,
    acc: &mut Vec<f32>,
    out: &mut [bf16],
) {
    scores.clear();
    scores.extend((0..seq_len).map(|j| dot_bf16(q, key(j)) * scale));
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    acc.clear();
    acc.resize(out.len(), 0.0);
    for (j, p) in scores.iter().enumerate() {
        axpy_bf16(acc, *p, value(j));
    }
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = to_bf16(*a / sum);
    }
}

/// Four dots of one f32 row (a widened bf16 row) against four bf16 rows; each is bit-identical
/// to `dot_f32_bf16(x, w\[c\])`, hence to `dot_bf16` of the bf16 row `x` came from. Four
/// independent accumulator pairs hide the add latency that bounds a single dot.
#[inline]
pub fn dot_1x4(x: &[f32], w: [&[bf16]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && w.iter().all(|r| r.len() == x.len()) {
        // SAFETY: the CPU supports AVX2 (checked above); lengths are equal.
        return unsafe { dot_tile_avx2::<1, 4>([x], w) }[0];
    }
    w.map(|row| dot_f32_bf16(x, row))
}

/// Four dots of four f32 rows against one bf16 row (see `dot_1x4`).
#[inline]
pub fn dot_4x1(x: [&[f32]; 4], w: &[bf16]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && x.iter().all(|r| r.len() == w.len()) {
        // SAFETY: the CPU supports AVX2 (checked above); lengths are equal.
        let d = unsafe { dot_tile_avx2::<4, 1>(x, [w]) };
        return [d[0][0], d[1][0], d[2][0], d[3][0]];
    }
    x.map(|row| dot_f32_bf16(row, w))
}

/// R×C dots in AVX2, each pair with the lane order of `dot_f32_bf16`: lanes 0..8 and 8..16
/// in two registers, the same multiply then add, the same tree, the same tail.
///
/// Safety: the CPU must support AVX2, and every row of `x` and `w` must be `x\[0\].len()` long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_tile_avx2<const R: usize, const C: usize>(
    x: [&[f32]; R],
    w: [&[bf16]; C],
) -> [[f32; C]; R] {
    use std::arch::x86_64::*;
    let len = x[0].len();
    let chunks = len / LANES;
    // `p` must have 8 bf16 of one row behind it.
    let widen = |p: *const u16| {
        // SAFETY: 8 readable u16 at `p` (every call below); the load takes unaligned addresses.
        let eight = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(eight)))
    };
    let mut lo = [[_mm256_setzero_ps(); C]; R];
    let mut hi = [[_mm256_setzero_ps(); C]; R];
    for ch in 0..chunks {
        let at = ch * LANES;
        let mut wl = [_mm256_setzero_ps(); C];
        let mut wh = [_mm256_setzero_ps(); C];
        for c in 0..C {
            // SAFETY: every row is `len` long (the caller's promise) and at + LANES <= len, so
            // both halves of 8 from `at` lie inside the row.
            let (p, p8) = unsafe {
                let p = (w[c].as_ptr() as *const u16).add(at);
                (p, p.add(8))
            };
            wl[c] = widen(p);
            wh[c] = widen(p8);
        }
        for r in 0..R {
            // SAFETY: as for `w`: the 16 f32 from `at` lie inside the row; unaligned loads.
            let (xl, xh) = unsafe {
                let p = x[r].as_ptr().add(at);
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
            };
            for c in 0..C {
                lo[r][c] = _mm256_add_ps(lo[r][c], _mm256_mul_ps(xl, wl[c]));
                hi[r][c] = _mm256_add_ps(hi[r][c], _mm256_mul_ps(xh, wh[c]));
            }
        }
    }
    let mut out = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut acc = [0.0f32; LANES];
            // SAFETY: `acc` holds LANES (16) f32; the unaligned stores write 0..8 and 8..16.
            unsafe {
                _mm256_storeu_ps(acc.as_mut_ptr(), lo[r][c]);
                _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi[r][c]);
            }
            let mut sum = combine(acc);
            for i in chunks * LANES..len {
                sum += x[r][i] * to_f32(w[c][i]);
            }
            out[r][c] = sum;
        }
    }
    out
}
