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
pub const MMA_K_TILE: usize = 32;

/// Features one `MmaBlock` holds.
pub const MMA_BLOCK: usize = 8;

/// Up to `MMA_BLOCK` weight rows of length k, widened to f32 once and interleaved (`w[i·8 + j]`
/// is row j's element i), so each row of x takes all of them in one pass.
pub struct MmaBlock {
    w: Vec<f32>,
    k: usize,
}

impl MmaBlock {
    /// The block of `rows` (each of length `k`; at most `MMA_BLOCK`, the rest read as zero).
    pub fn new(rows: &[&[bf16]], k: usize) -> MmaBlock {
        assert!(rows.len() <= MMA_BLOCK, "an MmaBlock holds at most 8 rows");
        let mut w = vec![0.0f32; k * MMA_BLOCK];
        for (j, row) in rows.iter().enumerate() {
            for (i, v) in row[..k].iter().enumerate() {
                w[i * MMA_BLOCK + j] = to_f32(*v);
            }
        }
        MmaBlock { w, k }
    }

    /// The dot of `x` (length k) with each row of the block, in the model's order.
    #[inline]
    pub fn dots(&self, x: &[f32]) -> [f32; MMA_BLOCK] {
        #[cfg(target_arch = "x86_64")]
        if super::reduce::avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA (checked).
            return unsafe { dots_fma(&self.w, &x[..self.k]) };
        }
        dots_body(&self.w, &x[..self.k])
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
unsafe fn dots_fma(w: &[f32], x: &[f32]) -> [f32; MMA_BLOCK] {
    dots_body(w, x)
}

#[inline(always)]
fn dots_body(w: &[f32], x: &[f32]) -> [f32; MMA_BLOCK] {
    let mut acc = [0.0f32; MMA_BLOCK];
    for (a, w) in x.iter().zip(w.chunks_exact(MMA_BLOCK)) {
        for (acc, w) in acc.iter_mut().zip(w) {
            *acc = a.mul_add(*w, *acc);
        }
    }
    acc.map(|d| pad(d, x.len()))
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
        let d = MmaBlock::new(&refs, k).dots(&x);
        for (j, row) in rows.iter().enumerate() {
            assert_eq!(d[j].to_bits(), mma_dot(&x, row).to_bits(), "row {j}");
            assert_eq!(
                d[j].to_bits(),
                dots_body(&MmaBlock::new(&refs, k).w, &x)[j].to_bits()
            );
        }
        // A lone product that underflows to -0 becomes +0 through the padding (0·0 + -0).
        let tiny = [-1e-30f32];
        let w = [bf16::from_f32(1e-30)];
        assert_eq!(mma_dot(&tiny, &w).to_bits(), 0.0f32.to_bits());
    }
}
