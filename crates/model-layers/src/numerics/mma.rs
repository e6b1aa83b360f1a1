//! The tensor cores' dot as the emulation models `mma.sync` m16n8k16 (`cuda_emu.hpp`), which
//! `gemm.cu`'s kernels and their twins share: the accumulator starts at +0 and takes each
//! exact bf16 product with one fused multiply-add, in k order, then one `0·0` per element of
//! zero padding up to the next multiple of `MMA_K_TILE` (the kernel's last staged k tile).
//!
//! Invariant: every dot here has those bits, whichever path (AVX2+FMA or portable) runs it and
//! however many dots run side by side.

use half::bf16;

use super::to_f32;

/// k of one staged tile of `gemm.cu`: the accumulation is padded with zero products to it.
pub const MMA_K_TILE: usize = 64;

/// Features of one group of lanes in a panel (one AVX2 register of f32).
pub const MMA_BLOCK: usize = 8;

/// Rows of x a panel takes side by side where there are that many: each (row, block) pair is
/// its own chain of fused multiply-adds, so `ROWS × B` chains hide the FMA latency that one
/// chain per row would wait on.
pub const MMA_ROWS: usize = 4;

/// Up to `8·B` weight rows of length k, widened to f32 once and interleaved (`w[i·8B + f]` is
/// feature f's element i), so rows of x take all of them in one pass over k.
pub struct MmaPanel<const B: usize> {
    w: Vec<f32>,
    k: usize,
}

impl<const B: usize> MmaPanel<B> {
    /// Features of the panel.
    pub const FEATURES: usize = MMA_BLOCK * B;

    /// The panel of `rows` (each of length `k`; at most `8·B`, the rest read as zero).
    pub fn new(rows: &[&[bf16]], k: usize) -> MmaPanel<B> {
        let width = Self::FEATURES;
        assert!(
            rows.len() <= width,
            "an MmaPanel holds at most {width} rows"
        );
        let mut w = vec![0.0f32; k * width];
        // A cache line of each row at a time: its 32 values land in 32 panel rows that stay in
        // L1 until every feature has written them (row by row over all of k, each store was a
        // miss 4·width bytes from the last).
        const LINE: usize = 32;
        for i0 in (0..k).step_by(LINE) {
            let end = (i0 + LINE).min(k);
            for (f, row) in rows.iter().enumerate() {
                for (i, v) in (i0..end).zip(&row[i0..end]) {
                    w[i * width + f] = to_f32(*v);
                }
            }
        }
        MmaPanel { w, k }
    }

    /// The dot of each of `R` rows of x (length k each) with each feature of the panel, in
    /// the model's order: `out[r][b][j]` is row r's dot with feature 8b + j.
    #[inline]
    pub fn dots<const R: usize>(&self, x: [&[f32]; R]) -> [[[f32; MMA_BLOCK]; B]; R] {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked).
            return unsafe { dots_avx512::<B, R>(&self.w, x, self.k) };
        }
        #[cfg(target_arch = "x86_64")]
        if super::reduce::avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA (checked).
            return unsafe { dots_fma::<B, R>(&self.w, x, self.k) };
        }
        dots_body::<B, R>(&self.w, x, self.k)
    }
}

/// The dots of `R` rows of x (length k each) with up to 8 weight rows (`MMA_BLOCK`; the rest
/// read as zero and their dots meaningless), in the model's order, each weight widened as it
/// is read (eight k at a time in registers on AVX2): for one to three rows (decode), where
/// each weight is used R times and widening a whole panel into memory first only adds its
/// writes, its allocation and its cache misses. `out[r][j]` is row r's dot with weight row j.
#[inline]
pub fn stream_dots<const R: usize>(
    w: &[&[bf16]],
    x: [&[f32]; R],
    k: usize,
) -> [[f32; MMA_BLOCK]; R] {
    assert!(
        w.len() <= MMA_BLOCK,
        "stream_dots takes at most {MMA_BLOCK} weight rows"
    );
    #[cfg(target_arch = "x86_64")]
    if super::reduce::avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked).
        return unsafe { stream_fma::<R>(w, x, k) };
    }
    stream_body::<R>(w, x, k)
}

/// `stream_body` with the widening in registers: eight k of the (up to) eight weight rows
/// loaded, widened and transposed so that each k's eight weights sit in one register, then one
/// fused multiply-add per row of x and k (each feature's chain in k order, as the model's).
///
/// Safety: the CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn stream_fma<const R: usize>(
    w: &[&[bf16]],
    x: [&[f32]; R],
    k: usize,
) -> [[f32; MMA_BLOCK]; R] {
    use super::reduce::avx2::{transpose, Row};
    use std::arch::x86_64::{
        _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let x = x.map(|x| &x[..k]);
    assert!(
        w.iter().all(|row| row.len() >= k),
        "a weight row shorter than k"
    );
    let mut acc = [_mm256_setzero_ps(); R];
    let mut i = 0;
    while i + 8 <= k {
        let mut v = [_mm256_setzero_ps(); 8];
        for (vj, row) in v.iter_mut().zip(w) {
            // SAFETY: i + 8 <= k <= row.len(); AVX2 present (the caller's promise).
            *vj = unsafe { row.load8(i) };
        }
        // SAFETY: AVX2 present.
        let t = unsafe { transpose(v) };
        for (q, tq) in t.iter().enumerate() {
            for r in 0..R {
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(x[r][i + q]), *tq, acc[r]);
            }
        }
        i += 8;
    }
    for q in i..k {
        let mut wq = [0.0f32; MMA_BLOCK];
        for (o, row) in wq.iter_mut().zip(w) {
            *o = to_f32(row[q]);
        }
        // SAFETY: wq holds eight f32.
        let wq = unsafe { _mm256_loadu_ps(wq.as_ptr()) };
        for r in 0..R {
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(x[r][q]), wq, acc[r]);
        }
    }
    acc.map(|a| {
        let mut out = [0.0f32; MMA_BLOCK];
        // SAFETY: out holds eight f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), a) };
        out.map(|d| pad(d, k))
    })
}

/// `stream_dots` without AVX2: each feature's chain in k order, element by element.
#[inline(always)]
fn stream_body<const R: usize>(w: &[&[bf16]], x: [&[f32]; R], k: usize) -> [[f32; MMA_BLOCK]; R] {
    let mut acc = [[0.0f32; MMA_BLOCK]; R];
    for i in 0..k {
        for (j, row) in w.iter().enumerate() {
            let v = to_f32(row[i]);
            for r in 0..R {
                acc[r][j] = x[r][i].mul_add(v, acc[r][j]);
            }
        }
    }
    acc.map(|row| row.map(|d| pad(d, k)))
}

/// The dot of `x` and one weight row, in the model's order.
pub fn mma_dot(x: &[f32], w: &[bf16]) -> f32 {
    let mut acc = 0.0f32;
    for (a, b) in x.iter().zip(w) {
        acc = a.mul_add(to_f32(*b), acc);
    }
    pad(acc, x.len())
}

/// Safety: the CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_fma<const B: usize, const R: usize>(
    w: &[f32],
    x: [&[f32]; R],
    k: usize,
) -> [[[f32; MMA_BLOCK]; B]; R] {
    dots_body::<B, R>(w, x, k)
}

/// `dots_body` with AVX-512: a block pair of 16 features in one register.
///
/// Safety: the CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dots_avx512<const B: usize, const R: usize>(
    w: &[f32],
    x: [&[f32]; R],
    k: usize,
) -> [[[f32; MMA_BLOCK]; B]; R] {
    dots_body::<B, R>(w, x, k)
}

#[inline(always)]
fn dots_body<const B: usize, const R: usize>(
    w: &[f32],
    x: [&[f32]; R],
    k: usize,
) -> [[[f32; MMA_BLOCK]; B]; R] {
    let width = MMA_BLOCK * B;
    let w = &w[..k * width];
    let x = x.map(|x| &x[..k]);
    let mut acc = [[[0.0f32; MMA_BLOCK]; B]; R];
    for i in 0..k {
        let wi = &w[i * width..(i + 1) * width];
        for r in 0..R {
            let a = x[r][i];
            for b in 0..B {
                for j in 0..MMA_BLOCK {
                    acc[r][b][j] = a.mul_add(wi[b * MMA_BLOCK + j], acc[r][b][j]);
                }
            }
        }
    }
    acc.map(|row| row.map(|block| block.map(|d| pad(d, k))))
}

/// The zero products of the padding past `k` up to the next multiple of the k tile.
#[inline(always)]
fn pad(mut acc: f32, k: usize) -> f32 {
    for _ in k..k.next_multiple_of(MMA_K_TILE) {
        acc = 0.0f32.mul_add(0.0, acc);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_gives_each_rows_sequential_dot_and_the_padding_clears_negative_zero() {
        let k = 45;
        let x: Vec<f32> = (0..k).map(|i| ((i as f32) * 0.37).sin()).collect();
        let rows: Vec<Vec<bf16>> = (0..5)
            .map(|j| {
                (0..k)
                    .map(|i| bf16::from_f32(((i * j) as f32 * 0.11).cos()))
                    .collect()
            })
            .collect();
        let refs: Vec<&[bf16]> = rows.iter().map(|r| r.as_slice()).collect();
        // Rows of x side by side (4) or alone, panels of one block or of two (the second
        // partly empty): every dot is the sequential one.
        let xs: Vec<Vec<f32>> = (0..4)
            .map(|r| x.iter().map(|v| v * (r as f32 + 0.5)).collect())
            .collect();
        let x4 = [&xs[0][..], &xs[1][..], &xs[2][..], &xs[3][..]];
        let one = MmaPanel::<1>::new(&refs, k);
        let two = MmaPanel::<2>::new(&refs, k);
        let (d1, d2) = (one.dots(x4), two.dots([&xs[2][..]]));
        let portable = dots_body::<2, 4>(&two.w, x4, k);
        for (j, row) in rows.iter().enumerate() {
            for (r, x) in xs.iter().enumerate() {
                let want = mma_dot(x, row).to_bits();
                assert_eq!(d1[r][0][j].to_bits(), want, "row {r} feature {j}");
                assert_eq!(portable[r][0][j].to_bits(), want, "row {r} feature {j}");
            }
            assert_eq!(d2[0][0][j].to_bits(), mma_dot(&xs[2], row).to_bits());
        }
        assert!(d2[0][1].iter().all(|d| d.to_bits() == 0));
        // Panels of 32 (the AVX-512 width, four blocks), AVX-512 where the CPU has it and
        // portable: the same dots.
        let four = MmaPanel::<4>::new(&refs, k);
        let (d4, portable4) = (four.dots(x4), dots_body::<4, 4>(&four.w, x4, k));
        for (j, row) in rows.iter().enumerate() {
            for (r, x) in xs.iter().enumerate() {
                let want = mma_dot(x, row).to_bits();
                assert_eq!(d4[r][0][j].to_bits(), want, "row {r} feature {j}");
                assert_eq!(portable4[r][0][j].to_bits(), want, "row {r} feature {j}");
            }
        }
        // Streamed, one to three rows (k = 45: five registers of eight k and a tail; AVX2 and
        // portable): the same dots.
        let s3 = stream_dots::<3>(&refs, [&xs[0][..], &xs[1][..], &xs[3][..]], k);
        let portable = stream_body::<1>(&refs, [&xs[2][..]], k);
        for (j, row) in rows.iter().enumerate() {
            for (r, x) in [0usize, 1, 3].into_iter().enumerate() {
                assert_eq!(s3[r][j].to_bits(), mma_dot(&xs[x], row).to_bits());
            }
            assert_eq!(portable[0][j].to_bits(), mma_dot(&xs[2], row).to_bits());
        }
        // A lone product that underflows to -0 becomes +0 through the padding (0·0 + -0).
        let tiny = [-1e-30f32];
        let w = [bf16::from_f32(1e-30)];
        assert_eq!(mma_dot(&tiny, &w).to_bits(), 0.0f32.to_bits());
    }

    #[test]
    fn streamed_dots_across_blocks_of_k_are_the_sequential_ones() {
        // k = 200: 25 registers of eight k; 8 weight rows, then 3.
        let k = 200;
        let x: Vec<f32> = (0..k).map(|i| ((i as f32) * 0.71).sin() * 3.0).collect();
        let rows: Vec<Vec<bf16>> = (0..8)
            .map(|j| {
                (0..k)
                    .map(|i| bf16::from_f32(((i + 7 * j) as f32 * 0.23).cos()))
                    .collect()
            })
            .collect();
        let refs: Vec<&[bf16]> = rows.iter().map(|r| r.as_slice()).collect();
        for take in [8, 3] {
            let got = stream_dots::<1>(&refs[..take], [&x[..]], k);
            for (j, row) in rows[..take].iter().enumerate() {
                assert_eq!(
                    got[0][j].to_bits(),
                    mma_dot(&x, row).to_bits(),
                    "{take} {j}"
                );
            }
        }
    }
}
