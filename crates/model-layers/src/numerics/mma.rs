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
        for (f, row) in rows.iter().enumerate() {
            for (i, v) in row[..k].iter().enumerate() {
                w[i * width + f] = to_f32(*v);
            }
        }
        MmaPanel { w, k }
    }

    /// The dot of each of `R` rows of x (length k each) with each feature of the panel, in
    /// the model's order: `out[r][b][j]` is row r's dot with feature 8b + j.
    #[inline]
    pub fn dots<const R: usize>(&self, x: [&[f32]; R]) -> [[[f32; MMA_BLOCK]; B]; R] {
        #[cfg(target_arch = "x86_64")]
        if super::reduce::avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA (checked).
            return unsafe { dots_fma::<B, R>(&self.w, x, self.k) };
        }
        dots_body::<B, R>(&self.w, x, self.k)
    }
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
        // A lone product that underflows to -0 becomes +0 through the padding (0·0 + -0).
        let tiny = [-1e-30f32];
        let w = [bf16::from_f32(1e-30)];
        assert_eq!(mma_dot(&tiny, &w).to_bits(), 0.0f32.to_bits());
    }
}
