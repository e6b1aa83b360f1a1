//! The AVX2+FMA paths: 8 CUDA lanes in one register. A lane's chunk is 8 consecutive
//! elements, so 8 lanes' chunks (64 elements) are transposed to give, per element e of the
//! chunk, one register of the 8 lanes' e-th values; `_mm256_fmadd_ps` then does each lane's
//! fma in order. A row's last block, when it is not whole, is read with +0 past the row
//! (`Row::partial_block`), and the lanes with no chunk in it keep their sums.

use std::arch::x86_64::*;

use half::bf16;

use super::{
    dot_fold, to_f32, tree_sum, warp_sum, Blocked, BLOCK, BLOCK_LANES, CHUNK, DOT_SEG, LANE_CHUNKS,
    WARP,
};

/// A row the tiles read: 8 values as f32 from an element index, or one.
pub(in crate::numerics) trait Row: Copy {
    fn len(self) -> usize;
    /// Safety: 8 values from `at` lie in the row's storage (for a plain row, `at + 8 <=
    /// self.len()`), AVX2 present.
    unsafe fn load8(self, at: usize) -> __m256;
    fn get(self, i: usize) -> f32;
    /// The 64-element block at `at` (8 lanes' chunks) as 8 registers: element e of each
    /// lane's chunk in register e.
    ///
    /// Safety: `at + 64 <= self.len()`, `at` a multiple of 64, AVX2 present.
    #[inline(always)]
    unsafe fn block(self, at: usize) -> [__m256; 8] {
        // SAFETY: the caller's promise.
        unsafe { transpose(load8x8(self, at, CHUNK)) }
    }
    /// The row's last block at `at`, not whole, as `block` gives a whole one: +0 past the
    /// row.
    ///
    /// Safety: `at < self.len() < at + 64`, `at` a multiple of 64, AVX2 present.
    #[inline(always)]
    unsafe fn partial_block(self, at: usize) -> [__m256; 8] {
        let rest = self.len() - at;
        // SAFETY: AVX present (the caller's promise of AVX2).
        let mut lanes = [unsafe { _mm256_setzero_ps() }; 8];
        for (l, lane) in lanes.iter_mut().enumerate().take(rest.div_ceil(CHUNK)) {
            let i0 = at + l * CHUNK;
            *lane = if i0 + CHUNK <= self.len() {
                // SAFETY: the chunk lies in the row.
                unsafe { self.load8(i0) }
            } else {
                let mut chunk = [0.0f32; CHUNK];
                for (i, v) in chunk.iter_mut().enumerate().take(self.len() - i0) {
                    *v = self.get(i0 + i);
                }
                // SAFETY: 8 f32 on the stack; unaligned load.
                unsafe { _mm256_loadu_ps(chunk.as_ptr()) }
            };
        }
        // SAFETY: AVX2 present (the caller's promise).
        unsafe { transpose(lanes) }
    }
}

impl Row for Blocked<'_> {
    fn len(self) -> usize {
        self.len
    }
    #[inline(always)]
    unsafe fn load8(self, at: usize) -> __m256 {
        // SAFETY: 8 f32 from `at` lie in the row's data (the caller's promise); unaligned
        // load.
        unsafe { _mm256_loadu_ps(self.data.as_ptr().add(at)) }
    }
    #[inline(always)]
    fn get(self, i: usize) -> f32 {
        Blocked::get(self, i)
    }
    /// Stored transposed: 8 loads, every 16 elements from the block's first lane or its
    /// ninth.
    #[inline(always)]
    unsafe fn block(self, at: usize) -> [__m256; 8] {
        let b = at / BLOCK * BLOCK;
        // SAFETY: the caller's promise: `at` lies in the row, and the data holds its
        // whole 128-element block. Lane (at - b) / 8 of the block: 0, or 8 for its second
        // 64 elements.
        unsafe { load8x8(self, b + (at - b) / CHUNK, BLOCK_LANES) }
    }
    /// The padded block as it is stored: +0 past the row.
    #[inline(always)]
    unsafe fn partial_block(self, at: usize) -> [__m256; 8] {
        // SAFETY: as `block`'s.
        unsafe { self.block(at) }
    }
}

/// Eight `load8`s of `row`, from `at` every `step` elements. Written out, not through a
/// closure (`std::array::from_fn`): a closure is a function of its own without the
/// caller's target features, so when it is not inlined the intrinsics inside it become
/// calls (the twins' dots ran 2.5 times slower that way).
///
/// Safety: every `load8` lies in the row's storage (`at + 7·step + 8 <= row.len()` for a
/// plain row), AVX2 present.
#[inline(always)]
pub(in crate::numerics) unsafe fn load8x8<X: Row>(row: X, at: usize, step: usize) -> [__m256; 8] {
    // SAFETY: the caller's promise.
    unsafe {
        [
            row.load8(at),
            row.load8(at + step),
            row.load8(at + 2 * step),
            row.load8(at + 3 * step),
            row.load8(at + 4 * step),
            row.load8(at + 5 * step),
            row.load8(at + 6 * step),
            row.load8(at + 7 * step),
        ]
    }
}

impl Row for &[f32] {
    fn len(self) -> usize {
        <[f32]>::len(self)
    }
    #[inline(always)]
    unsafe fn load8(self, at: usize) -> __m256 {
        // SAFETY: 8 f32 from `at` lie in the row (the caller's promise); unaligned load.
        unsafe { _mm256_loadu_ps(self.as_ptr().add(at)) }
    }
    #[inline(always)]
    fn get(self, i: usize) -> f32 {
        self[i]
    }
}

impl Row for &[bf16] {
    fn len(self) -> usize {
        <[bf16]>::len(self)
    }
    #[inline(always)]
    unsafe fn load8(self, at: usize) -> __m256 {
        // SAFETY: 8 bf16 from `at` lie in the row (the caller's promise); unaligned load.
        // bf16 → f32: zero-extend to u32, shift into the high half.
        unsafe {
            let eight = _mm_loadu_si128(self.as_ptr().add(at) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(eight)))
        }
    }
    #[inline(always)]
    fn get(self, i: usize) -> f32 {
        to_f32(self[i])
    }
}

/// The rows of an 8×8 block → its columns.
#[inline(always)]
pub(in crate::numerics) unsafe fn transpose(r: [__m256; 8]) -> [__m256; 8] {
    // SAFETY: register shuffles only (AVX, implied by the caller's AVX2).
    unsafe {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xee>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xee>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xee>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xee>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }
}

/// R×C dots in `warp_dot`'s order (`super::warp_dot_of`), each row of `x` against each
/// row of `w`.
///
/// Safety: the CPU must support AVX2 and FMA, and every row of `x` and `w` must be
/// `x[0].len()` long.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_tile<X: Row, W: Row, const R: usize, const C: usize>(
    x: [X; R],
    w: [W; C],
) -> [[f32; C]; R] {
    let len = x[0].len();
    let mut total = [[0.0f32; C]; R];
    for (seg, start) in (0..len).step_by(DOT_SEG).enumerate() {
        let mut lanes = [[[0.0f32; WARP]; C]; R];
        for group in 0..WARP / 8 {
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            let mut j = 0;
            while j < LANE_CHUNKS {
                let at = start + (j * WARP + group * 8) * CHUNK;
                if at + 8 * CHUNK > len {
                    break;
                }
                let mut wt = [[_mm256_setzero_ps(); 8]; C];
                for (c, t) in wt.iter_mut().enumerate() {
                    // SAFETY: at + 64 <= len, the length of every row (the caller's
                    // promise).
                    *t = unsafe { w[c].block(at) };
                }
                for r in 0..R {
                    // SAFETY: as above.
                    let xt = unsafe { x[r].block(at) };
                    for c in 0..C {
                        for e in 0..CHUNK {
                            acc[r][c] = _mm256_fmadd_ps(xt[e], wt[c][e], acc[r][c]);
                        }
                    }
                }
                j += 1;
            }
            // The row's last block, not whole: the group's lanes have no chunk after it.
            let at = start + (j * WARP + group * 8) * CHUNK;
            if j < LANE_CHUNKS && at < len {
                // The lanes with a chunk in it: 8·l < len - at (< 64).
                let with_chunk = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                    _mm256_set1_epi32((len - at) as i32),
                    _mm256_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56),
                ));
                let mut wt = [[_mm256_setzero_ps(); 8]; C];
                for (c, t) in wt.iter_mut().enumerate() {
                    // SAFETY: at < len < at + 64, at a multiple of 64 (every row is len
                    // long).
                    *t = unsafe { w[c].partial_block(at) };
                }
                for r in 0..R {
                    // SAFETY: as above.
                    let xt = unsafe { x[r].partial_block(at) };
                    for c in 0..C {
                        let mut sum = acc[r][c];
                        for e in 0..CHUNK {
                            sum = _mm256_fmadd_ps(xt[e], wt[c][e], sum);
                        }
                        acc[r][c] = _mm256_blendv_ps(acc[r][c], sum, with_chunk);
                    }
                }
            }
            for r in 0..R {
                for c in 0..C {
                    let lanes8 = &mut lanes[r][c][group * 8..group * 8 + 8];
                    // SAFETY: 8 writable f32; unaligned store.
                    unsafe { _mm256_storeu_ps(lanes8.as_mut_ptr(), acc[r][c]) };
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                total[r][c] = dot_fold(total[r][c], warp_sum(lanes[r][c]), seg);
            }
        }
    }
    total
}

/// `super::warp_sum_squares_of` of a row: 32 consecutive values are the 32 lanes' next
/// terms, four registers of 8 lanes.
///
/// Safety: the CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn sum_squares<X: Row>(x: X) -> f32 {
    let len = x.len();
    let full = len / WARP;
    let mut acc = [_mm256_setzero_ps(); 4];
    for t in 0..full {
        for (g, a) in acc.iter_mut().enumerate() {
            // SAFETY: t < full, so the 32 values from t·32 lie in the row.
            let v = unsafe { x.load8(t * WARP + g * 8) };
            *a = _mm256_fmadd_ps(v, v, *a);
        }
    }
    let mut lanes = [0.0f32; WARP];
    for (g, a) in acc.iter().enumerate() {
        // SAFETY: 8 writable f32 from g·8 < 32; unaligned store.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(g * 8), *a) };
    }
    for i in full * WARP..len {
        let v = x.get(i);
        lanes[i % WARP] = v.mul_add(v, lanes[i % WARP]);
    }
    tree_sum(&mut lanes, WARP)
}
