//! Softmax attention of one (row, head) in the order of attn.cu `attention_block`, so the twin
//! and the CUDA kernels (`attn::paged_decode`, its prefetch variant, `attn::paged_causal` and
//! their o-fold forms) agree byte for byte.
//!
//! The order, a function of the attended length n alone: S = clamp(⌈n / 256⌉, 1, 16) splits of
//! ⌈n / S⌉ tokens; each split cut into 8 pieces of ⌈len / 8⌉ (one per warp); a piece runs an
//! online softmax 32 keys at a time (score s = (q · k, fma in dim order) · scale; tile max kept
//! NaN-safe; p = exp(s − m), corr = exp(m_old − m); l = l·corr + warp_sum(p); acc = acc·corr,
//! then acc = fma(p_j, v_j, acc) key by key); the pieces merged in warp order, then the splits
//! in split order (fma with exp(m − M)); out = bf16(num / den).
//!
//! Invariant: every float operation and its operands are the kernel's; `expf` is glibc's in
//! both the twin (`f32::exp`) and the host emulation.

use half::bf16;

use super::reduce::{warp_sum, CHUNK, WARP};
use super::{to_bf16, to_f32};

const ATTN_WARPS: usize = 8;
const ATTN_SPLITS: usize = 16;
const ATTN_SPLIT_MIN_TOKENS: usize = 256;

/// max(a, b) keeping NaN (common.cuh `fmax_nan`).
#[inline(always)]
pub(super) fn fmax_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else {
        a.max(b)
    }
}

/// Scratch of `attend`, reused across heads.
#[derive(Default)]
pub struct AttendScratch {
    /// Per warp of a split: its piece's acc (head_dim each).
    warp_acc: Vec<f32>,
    /// Per split: its merged num (head_dim each), max and den.
    split_num: Vec<f32>,
    split_max: Vec<f32>,
    split_den: Vec<f32>,
}

/// Softmax attention of one query head over `seq_len` keys and values, stored bf16 in `out`
/// (`head_dim` = `out.len()` values), in the CUDA kernels' order (see the module doc).
pub fn attend<'k>(
    q: &[bf16],
    seq_len: usize,
    scale: f32,
    (key, value): (impl Fn(usize) -> &'k [bf16], impl Fn(usize) -> &'k [bf16]),
    scratch: &mut AttendScratch,
    out: &mut [bf16],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA (checked above).
        return unsafe { attend_fma(q, seq_len, scale, (key, value), scratch, out) };
    }
    attend_body(q, seq_len, scale, (key, value), scratch, out)
}

/// `attend_body` compiled with FMA, so each `mul_add` is one instruction.
///
/// Safety: the CPU must support FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn attend_fma<'k>(
    q: &[bf16],
    seq_len: usize,
    scale: f32,
    kv: (impl Fn(usize) -> &'k [bf16], impl Fn(usize) -> &'k [bf16]),
    scratch: &mut AttendScratch,
    out: &mut [bf16],
) {
    attend_body(q, seq_len, scale, kv, scratch, out)
}

#[inline(always)]
fn attend_body<'k>(
    q: &[bf16],
    n: usize,
    scale: f32,
    (key, value): (impl Fn(usize) -> &'k [bf16], impl Fn(usize) -> &'k [bf16]),
    scratch: &mut AttendScratch,
    out: &mut [bf16],
) {
    let head_dim = out.len();
    if n == 0 {
        out.fill(to_bf16(0.0));
        return;
    }
    let splits = n.div_ceil(ATTN_SPLIT_MIN_TOKENS).clamp(1, ATTN_SPLITS);
    let split_chunk = n.div_ceil(splits);
    scratch.split_num.clear();
    scratch.split_num.resize(splits * head_dim, 0.0);
    scratch.split_max.clear();
    scratch.split_den.clear();
    scratch.warp_acc.resize(ATTN_WARPS * head_dim, 0.0);
    for s in 0..splits {
        let split_begin = (s * split_chunk).min(n);
        let split_end = (split_begin + split_chunk).min(n);
        let chunk = (split_end - split_begin).div_ceil(ATTN_WARPS);
        let mut warp_m = [f32::NEG_INFINITY; ATTN_WARPS];
        let mut warp_l = [0.0f32; ATTN_WARPS];
        for w in 0..ATTN_WARPS {
            let begin = (split_begin + w * chunk).min(split_end);
            let end = (begin + chunk).min(split_end);
            let acc = &mut scratch.warp_acc[w * head_dim..(w + 1) * head_dim];
            (warp_m[w], warp_l[w]) = piece(q, begin..end, scale, (&key, &value), acc);
        }
        // The warps' partials merged in warp order.
        let max_all = warp_m
            .iter()
            .fold(f32::NEG_INFINITY, |m, x| fmax_nan(m, *x));
        let weight = warp_m.map(|m| (m != f32::NEG_INFINITY).then(|| (m - max_all).exp()));
        let mut den = 0.0f32;
        for (l, e) in warp_l.iter().zip(&weight) {
            if let Some(e) = e {
                den = l.mul_add(*e, den);
            }
        }
        let num = &mut scratch.split_num[s * head_dim..(s + 1) * head_dim];
        for (d, slot) in num.iter_mut().enumerate() {
            let mut total = 0.0f32;
            for (w, e) in weight.iter().enumerate() {
                let a = scratch.warp_acc[w * head_dim + d];
                match e {
                    Some(e) => total = a.mul_add(*e, total),
                    None if !a.is_finite() => total = a.mul_add(0.0, total),
                    None => {}
                }
            }
            *slot = total;
        }
        scratch.split_max.push(max_all);
        scratch.split_den.push(den);
    }
    if splits == 1 {
        let den = scratch.split_den[0];
        for (o, num) in out.iter_mut().zip(&scratch.split_num[..head_dim]) {
            *o = to_bf16(*num / den);
        }
        return;
    }
    // The splits merged in split order.
    let max_split = (scratch.split_max.iter()).fold(f32::NEG_INFINITY, |m, x| fmax_nan(m, *x));
    let mut den = 0.0f32;
    for (m, l) in scratch.split_max.iter_mut().zip(&scratch.split_den) {
        *m = if *m == f32::NEG_INFINITY {
            0.0
        } else {
            (*m - max_split).exp()
        };
        den = l.mul_add(*m, den);
    }
    for (d, o) in out.iter_mut().enumerate() {
        let mut num = 0.0f32;
        for (t, e) in scratch.split_max.iter().enumerate() {
            let a = scratch.split_num[t * head_dim + d];
            if *e != 0.0 || !a.is_finite() {
                num = a.mul_add(*e, num);
            }
        }
        *o = to_bf16(num / den);
    }
}

/// One warp's online softmax over keys `range`: returns (max, sum) and leaves Σ p·v in `acc`.
#[inline(always)]
fn piece<'k>(
    q: &[bf16],
    range: std::ops::Range<usize>,
    scale: f32,
    (key, value): (&impl Fn(usize) -> &'k [bf16], &impl Fn(usize) -> &'k [bf16]),
    acc: &mut [f32],
) -> (f32, f32) {
    let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
    acc.fill(0.0);
    for base in range.clone().step_by(WARP) {
        let keys = (range.end - base).min(WARP);
        let mut s = [f32::NEG_INFINITY; WARP];
        scores(
            q,
            std::array::from_fn(|lane| key(base + lane.min(keys - 1))),
            &mut s[..keys],
        );
        for slot in &mut s[..keys] {
            *slot *= scale;
        }
        let tile_max = s.iter().fold(f32::NEG_INFINITY, |m, x| fmax_nan(m, *x));
        let m_new = fmax_nan(m, tile_max);
        let p = s.map(|s| {
            if s == f32::NEG_INFINITY {
                0.0
            } else {
                (s - m_new).exp()
            }
        });
        let corr = if m == f32::NEG_INFINITY {
            0.0
        } else {
            (m - m_new).exp()
        };
        l = (l * corr) + warp_sum(p);
        for a in acc.iter_mut() {
            *a *= corr;
        }
        for (j, pj) in p.iter().enumerate().take(keys) {
            let v = value(base + j);
            if *pj == 0.0 {
                // Weight 0: the kernel adds 0·v only where v is not finite (then NaN).
                for (a, x) in acc.iter_mut().zip(v) {
                    let x = to_f32(*x);
                    if !x.is_finite() {
                        *a = pj.mul_add(x, *a);
                    }
                }
            } else {
                for (a, x) in acc.iter_mut().zip(v) {
                    *a = pj.mul_add(to_f32(*x), *a);
                }
            }
        }
        m = m_new;
    }
    (m, l)
}

/// The tile's q · k_lane for the first `out.len()` lanes (attn.cu: fma in dim order from +0,
/// the last 8-dim step padded with zeros, which turn −0 into +0), the keys' chains interleaved
/// so they run side by side. Every one of the `WARP` key rows is read (a partial tile's caller
/// repeats its last key in the lanes past it).
#[inline(always)]
fn scores(q: &[bf16], keys: [&[bf16]; WARP], out: &mut [f32]) {
    let n = out.len();
    out.fill(0.0);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::reduce::avx2_fma() && keys.iter().all(|k| k.len() >= q.len()) {
        // A partial group of 8 keys runs whole, its lanes past `n` computed and dropped: each
        // lane's chain is its own, so the kept ones are the scalar loop's bits (a tile's last
        // keys were a quarter of its time, one key at a time).
        let whole = n.div_ceil(8) * 8;
        if whole == n {
            // SAFETY: AVX2 and FMA present (checked); every key row holds q.len() values.
            done = unsafe { scores_avx2(q, &keys, out) };
        } else {
            let mut lanes = [0.0f32; WARP];
            // SAFETY: as above; whole <= WARP keys, each row checked.
            unsafe { scores_avx2(q, &keys, &mut lanes[..whole]) };
            out.copy_from_slice(&lanes[..n]);
            done = n;
        }
    }
    for (d, qd) in q.iter().enumerate() {
        let qd = to_f32(*qd);
        for (s, k) in out.iter_mut().zip(&keys[..n]).skip(done) {
            *s = qd.mul_add(to_f32(k[d]), *s);
        }
    }
    if !q.len().is_multiple_of(CHUNK) {
        for s in out.iter_mut() {
            *s += 0.0;
        }
    }
}

/// The first ⌊n / 8⌋·8 keys' scores of `scores` (the rest is left to it): 8 keys in one
/// register, each 8-dim step of their rows transposed so that register e holds dim e of the 8
/// keys, then fma with q\[e\] broadcast, dim by dim in order; the head's last partial step
/// scalar. Returns how many keys it did.
///
/// Safety: the CPU must support AVX2 and FMA; every key row holds at least q.len() values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2(q: &[bf16], keys: &[&[bf16]; WARP], out: &mut [f32]) -> usize {
    use std::arch::x86_64::*;

    use super::reduce::avx2::{transpose, Row};
    let n = out.len() / 8 * 8;
    let full = q.len() / CHUNK * CHUNK;
    for g in (0..n).step_by(8) {
        let mut acc = _mm256_setzero_ps();
        for d0 in (0..full).step_by(CHUNK) {
            // SAFETY: d0 + 8 <= q.len() <= every key row's length (the caller's promise).
            // Written out, not `std::array::from_fn`: a closure would not carry AVX2
            // (`reduce::avx2::load8x8`).
            let kt = unsafe {
                transpose([
                    keys[g].load8(d0),
                    keys[g + 1].load8(d0),
                    keys[g + 2].load8(d0),
                    keys[g + 3].load8(d0),
                    keys[g + 4].load8(d0),
                    keys[g + 5].load8(d0),
                    keys[g + 6].load8(d0),
                    keys[g + 7].load8(d0),
                ])
            };
            for (e, k) in kt.iter().enumerate() {
                acc = _mm256_fmadd_ps(_mm256_set1_ps(to_f32(q[d0 + e])), *k, acc);
            }
        }
        // SAFETY: 8 writable f32 from g (g + 8 <= n <= out.len()); unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(g), acc) };
        for d in full..q.len() {
            let qd = to_f32(q[d]);
            for (s, k) in out[g..g + 8].iter_mut().zip(&keys[g..g + 8]) {
                *s = qd.mul_add(to_f32(k[d]), *s);
            }
        }
    }
    n
}
