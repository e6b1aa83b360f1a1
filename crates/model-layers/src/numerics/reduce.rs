//! The reductions of the twins, in the CUDA kernels' own order (common.cuh), fma included, so
//! a twin and its emulated CUDA kernel agree byte for byte.
//!
//! Invariants: every function here is the portable definition of one CUDA reduction order
//! (`warp_sum`, `warp_dot` / `dot8` / `dot_fold`, `warp_sum_squares`, the o-fold's head dot,
//! topk_softmax's strided sum); an AVX2+FMA path, where there is one, gives the portable
//! path's bits (`f32::mul_add` is a correctly rounded fma, as `__fmaf_rn` is). No order
//! depends on the thread count or on how the work is split. Without FMA hardware `mul_add` is
//! libm's `fmaf`: the same bits, slower.

use half::bf16;

use super::to_f32;

/// Lanes of a CUDA warp: every reduction's partial sums.
pub const WARP: usize = 32;
/// Elements of one dot segment (common.cuh `DOT_SEG`).
pub const DOT_SEG: usize = 1024;
/// Elements one lane takes at a time in a dot (common.cuh `dot8`).
pub const CHUNK: usize = 8;
/// Chunks each lane takes per segment (common.cuh `DOT_SEG_LANE_CHUNKS`).
const LANE_CHUNKS: usize = DOT_SEG / CHUNK / WARP;

/// The butterfly `warp_sum` over the first `width` lanes (a power of two): at step m lane i
/// adds lane i^m, so lane 0 ends with this tree (width/2, ..., 1), and every lane with the same
/// bits (a + b == b + a exactly).
#[inline(always)]
fn tree_sum(lanes: &mut [f32; WARP], width: usize) -> f32 {
    let mut step = width / 2;
    while step > 0 {
        for i in 0..step {
            lanes[i] += lanes[i + step];
        }
        step /= 2;
    }
    lanes[0]
}

/// common.cuh `warp_sum` of 32 lane values.
#[inline(always)]
pub fn warp_sum(mut lanes: [f32; WARP]) -> f32 {
    tree_sum(&mut lanes, WARP)
}

/// common.cuh `dot_fold`: the running dot after segment `seg`'s sum `s`.
#[inline(always)]
fn dot_fold(total: f32, s: f32, seg: usize) -> f32 {
    if seg == 0 {
        s
    } else {
        total + s
    }
}

/// common.cuh `dot8` of one lane's chunk i0..i0 + valid: acc = fma(x\[i\], w\[i\], acc) in
/// order. Past `valid` the kernel reads +0 (`load8_bits`), and fma(+0, +0, acc) is acc + 0,
/// which turns −0 into +0 and leaves every other value as it is; once is as good as 8 times.
#[inline(always)]
fn chunk_fma(
    mut acc: f32,
    i0: usize,
    valid: usize,
    x: &impl Fn(usize) -> f32,
    w: &impl Fn(usize) -> f32,
) -> f32 {
    for i in i0..i0 + valid {
        acc = x(i).mul_add(w(i), acc);
    }
    if valid < CHUNK {
        acc += 0.0;
    }
    acc
}

/// common.cuh `warp_dot` of `len` elements x(i)·w(i): per segment of DOT_SEG elements lane l
/// accumulates the chunks c ≡ l (mod 32) in order (`chunk_fma`), `warp_sum` gives the segment's
/// sum, the segment sums are folded in order (`dot_fold`).
#[inline(always)]
fn warp_dot_of(len: usize, x: impl Fn(usize) -> f32, w: impl Fn(usize) -> f32) -> f32 {
    let mut total = 0.0f32;
    for (seg, start) in (0..len).step_by(DOT_SEG).enumerate() {
        let mut lanes = [0.0f32; WARP];
        for j in 0..LANE_CHUNKS {
            for (l, acc) in lanes.iter_mut().enumerate() {
                let i0 = start + (j * WARP + l) * CHUNK;
                if i0 < len {
                    *acc = chunk_fma(*acc, i0, (len - i0).min(CHUNK), &x, &w);
                }
            }
        }
        total = dot_fold(total, warp_sum(lanes), seg);
    }
    total
}

/// Σ a\[i\]·b\[i\] over the shorter length in the order of common.cuh `warp_dot` (every gemv and
/// moe projection, lm_head, the router).
#[inline]
pub fn dot_bf16(a: &[bf16], b: &[bf16]) -> f32 {
    let len = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        let (a, b) = (&a[..len], &b[..len]);
        // SAFETY: the CPU supports AVX2 and FMA (checked); both rows are `len` long.
        return unsafe { avx2::dot_tile::<&[bf16], &[bf16], 1, 1>([a], [b]) }[0][0];
    }
    dot_bf16_lanes(a, b)
}

/// The definition of `dot_bf16`, without run-time dispatch (the AVX2 path must equal it).
#[inline]
pub fn dot_bf16_lanes(a: &[bf16], b: &[bf16]) -> f32 {
    let len = a.len().min(b.len());
    warp_dot_of(len, |i| to_f32(a[i]), |i| to_f32(b[i]))
}

/// Σ a\[i\]·b\[i\] with `a` in f32 (a widened bf16 row), in `dot_bf16`'s order.
#[inline]
pub fn dot_f32_bf16(a: &[f32], b: &[bf16]) -> f32 {
    let len = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        let (a, b) = (&a[..len], &b[..len]);
        // SAFETY: the CPU supports AVX2 and FMA (checked); both rows are `len` long.
        return unsafe { avx2::dot_tile::<&[f32], &[bf16], 1, 1>([a], [b]) }[0][0];
    }
    warp_dot_of(len, |i| a[i], |i| to_f32(b[i]))
}

/// Four dots of one f32 row (a widened bf16 row) against four bf16 rows; each is bit-identical
/// to `dot_f32_bf16(x, w[c])`, hence to `dot_bf16` of the bf16 row `x` came from.
#[inline]
pub fn dot_1x4(x: &[f32], w: [&[bf16]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() && w.iter().all(|r| r.len() == x.len()) {
        // SAFETY: the CPU supports AVX2 and FMA (checked); lengths are equal.
        return unsafe { avx2::dot_tile::<&[f32], &[bf16], 1, 4>([x], w) }[0];
    }
    w.map(|row| dot_f32_bf16(x, row))
}

/// Four dots of four f32 rows against one bf16 row (see `dot_1x4`).
#[inline]
pub fn dot_4x1(x: [&[f32]; 4], w: &[bf16]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() && x.iter().all(|r| r.len() == w.len()) {
        // SAFETY: the CPU supports AVX2 and FMA (checked); lengths are equal.
        let d = unsafe { avx2::dot_tile::<&[f32], &[bf16], 4, 1>(x, [w]) };
        return [d[0][0], d[1][0], d[2][0], d[3][0]];
    }
    x.map(|row| dot_f32_bf16(row, w))
}

/// Lanes of one `Blocked` block: half a warp, one AVX-512 register of f32.
const BLOCK_LANES: usize = 16;
/// Elements of one block of `BLOCK_LANES` lanes' chunks: what a `Blocked` row stores
/// transposed.
const BLOCK: usize = BLOCK_LANES * CHUNK;

/// An f32 row stored by `transpose_blocks`, a `BLOCK`-element block at a time, each block
/// transposed: element e of the chunk at `b + l·8` (lane l of the block's 16) at `b + e·16 +
/// l`, so the 16 lanes' e-th values are one AVX-512 load, or two of 8 lanes each. The last
/// block is padded with +0 to a whole one (`blocked_len`), so every block loads alike. The
/// dots' tiles then read a row without transposing it, however many times they read it.
#[derive(Clone, Copy)]
pub struct Blocked<'a> {
    data: &'a [f32],
    len: usize,
}

impl<'a> Blocked<'a> {
    /// The row of `len` elements that `transpose_blocks` wrote into `data`.
    ///
    /// Panics if `data` is not `blocked_len(len)` long.
    pub fn new(data: &'a [f32], len: usize) -> Blocked<'a> {
        assert_eq!(
            data.len(),
            blocked_len(len),
            "Blocked: a row of {len} is stored in blocked_len({len}) values"
        );
        Blocked { data, len }
    }

    /// The row's length.
    pub fn len(self) -> usize {
        self.len
    }

    /// Whether the row is empty.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    /// Element `i` (< `len`) of the row as it was before `transpose_blocks`.
    #[inline(always)]
    pub fn get(self, i: usize) -> f32 {
        let (b, at) = (i / BLOCK * BLOCK, i % BLOCK);
        self.data[b + (at % CHUNK) * BLOCK_LANES + at / CHUNK]
    }
}

/// What a `Blocked` row of `len` elements takes: whole blocks.
pub fn blocked_len(len: usize) -> usize {
    len.next_multiple_of(BLOCK)
}

/// `row` into `out` (`blocked_len(row.len())` long) as a `Blocked` row; the last block's
/// elements past the row are +0.
///
/// Panics if `out` is not `blocked_len(row.len())` long.
pub fn transpose_blocks(row: &[f32], out: &mut [f32]) {
    assert_eq!(
        out.len(),
        blocked_len(row.len()),
        "transpose_blocks: a row of {} into blocked_len of it",
        row.len()
    );
    for (src, dst) in row.chunks(BLOCK).zip(out.chunks_exact_mut(BLOCK)) {
        dst.fill(0.0);
        for (i, v) in src.iter().enumerate() {
            dst[(i % CHUNK) * BLOCK_LANES + i / CHUNK] = *v;
        }
    }
}

/// R×C dots of `Blocked` rows of one length, each bit-identical to `dot_f32_bf16` (and
/// `dot_bf16`) of the rows they were made from. With AVX-512 the R×C tile runs at once, 16
/// lanes a register (a tile of 4×4 keeps its 16 accumulators and a step's 8 operands in 24 of
/// the 32 registers); with AVX2 one column at a time, 16 lanes in two registers (4×1: 8
/// accumulators).
#[inline]
pub fn dot_blocked<const R: usize, const C: usize>(
    x: [Blocked<'_>; R],
    w: [Blocked<'_>; C],
) -> [[f32; C]; R] {
    let len = x.first().map_or(0, |r| r.len());
    assert!(
        x.iter().all(|r| r.len() == len) && w.iter().all(|r| r.len() == len),
        "dot_blocked: rows of different lengths"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked).
            return unsafe { blocked_tile_avx512(x, w) };
        }
        if avx2_fma() {
            let mut out = [[0.0f32; C]; R];
            for (c, wc) in w.into_iter().enumerate() {
                // SAFETY: the CPU supports AVX2 and FMA (checked).
                let d = unsafe { blocked_tile_avx2(x, [wc]) };
                for r in 0..R {
                    out[r][c] = d[r][0];
                }
            }
            return out;
        }
    }
    blocked_tile(x, w)
}

/// `warp_dot_of` of R×C `Blocked` rows of one length, through `blocked_segments`: lanes 0-15
/// and 16-31 of a segment are two passes, each over the segment's whole blocks of its 16 lanes
/// (`Blocked`'s layout: element e of the 16 lanes' chunks is 16 consecutive values), one fused
/// multiply-add per lane and element in the lane's order, as `chunk_fma`; a row's last block,
/// when it is not whole, runs the same way on its +0 padding (`partial_block`).
/// Portable: 16 scalar lanes.
fn blocked_tile<const R: usize, const C: usize>(
    x: [Blocked<'_>; R],
    w: [Blocked<'_>; C],
) -> [[f32; C]; R] {
    blocked_segments(x, w, |xs, ws, b0, blocks, part| {
        for j in 0..blocks {
            for e in 0..CHUNK {
                let at = b0 + j * WARP * CHUNK + e * BLOCK_LANES;
                for r in 0..R {
                    for c in 0..C {
                        for (l, acc) in part[r][c].iter_mut().enumerate() {
                            *acc = xs[r][at + l].mul_add(ws[c][at + l], *acc);
                        }
                    }
                }
            }
        }
    })
}

/// The 16 lanes' accumulators of an R×C tile.
type TileLanes<const R: usize, const C: usize> = [[[f32; BLOCK_LANES]; C]; R];

/// The frame of the blocked tiles: per segment and half warp, `blocks(xs, ws, b0, n, acc)`
/// runs the n whole 128-element blocks at b0, b0 + 256, … of the rows `xs` and `ws` (the
/// half's lanes' chunks j = 0..n) on the 16 lanes' accumulators (`acc[r][c]`, from +0), in
/// that order, adding to what `acc` holds; a block that is not whole (a row's last) follows
/// through `partial_block`, and the half's lanes have no chunk after it; then the butterfly
/// and the segment fold.
#[inline(always)]
fn blocked_segments<const R: usize, const C: usize>(
    x: [Blocked<'_>; R],
    w: [Blocked<'_>; C],
    mut blocks: impl FnMut([&[f32]; R], [&[f32]; C], usize, usize, &mut TileLanes<R, C>),
) -> [[f32; C]; R] {
    let len = x[0].len();
    let (xs, ws) = (x.map(|r| r.data), w.map(|r| r.data));
    let mut total = [[0.0f32; C]; R];
    for (seg, start) in (0..len).step_by(DOT_SEG).enumerate() {
        let mut lanes = [[[0.0f32; WARP]; C]; R];
        for half in 0..WARP / BLOCK_LANES {
            let lane_lo = half * BLOCK_LANES;
            let mut acc = [[[0.0f32; BLOCK_LANES]; C]; R];
            // Lane lane_lo's chunk j is a block start, as every 16 lanes' chunks are.
            let b0 = start + lane_lo * CHUNK;
            let mut j = 0;
            while j < LANE_CHUNKS && b0 + j * WARP * CHUNK + BLOCK <= len {
                j += 1;
            }
            blocks(xs, ws, b0, j, &mut acc);
            let at = b0 + j * WARP * CHUNK;
            if j < LANE_CHUNKS && at < len {
                partial_block(xs, ws, at, len, &mut acc, &mut blocks);
            }
            for r in 0..R {
                for c in 0..C {
                    lanes[r][c][lane_lo..lane_lo + BLOCK_LANES].copy_from_slice(&acc[r][c]);
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

/// A row's last block when it is not whole (`len - at` < 128 elements, padded with +0 by
/// `transpose_blocks`), run as a whole one. A lane whose chunk is partial reads +0 past the
/// row, as the kernel does (`chunk_fma`); a lane with no chunk there keeps its sums, because
/// the kernel's lane skips a chunk past the row, where fma(+0, +0, −0) would give +0.
#[inline(always)]
fn partial_block<const R: usize, const C: usize>(
    xs: [&[f32]; R],
    ws: [&[f32]; C],
    at: usize,
    len: usize,
    acc: &mut TileLanes<R, C>,
    blocks: &mut impl FnMut([&[f32]; R], [&[f32]; C], usize, usize, &mut TileLanes<R, C>),
) {
    let with_chunk = (len - at).div_ceil(CHUNK);
    let mut kept = [[[0.0f32; BLOCK_LANES]; C]; R];
    for r in 0..R {
        for c in 0..C {
            kept[r][c][with_chunk..].copy_from_slice(&acc[r][c][with_chunk..]);
        }
    }
    blocks(xs, ws, at, 1, acc);
    for r in 0..R {
        for c in 0..C {
            acc[r][c][with_chunk..].copy_from_slice(&kept[r][c][with_chunk..]);
        }
    }
}

/// `blocked_tile` with AVX-512: the 16 lanes of a block in one register, the R×C tile's
/// accumulators in registers through a block's 8 elements.
///
/// Safety: the CPU must support AVX-512F; every row is `x[0].len()` long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn blocked_tile_avx512<const R: usize, const C: usize>(
    x: [Blocked<'_>; R],
    w: [Blocked<'_>; C],
) -> [[f32; C]; R] {
    use std::arch::x86_64::*;
    blocked_segments(x, w, |xs, ws, b0, blocks, part| {
        // SAFETY: AVX-512F present (the caller's promise); each block lies in every row's
        // data (blocked_segments passes blocks below the rows' length, and a `Blocked` row's
        // data is whole blocks); unaligned loads and stores of 16 f32.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); C]; R];
            for r in 0..R {
                for c in 0..C {
                    acc[r][c] = _mm512_loadu_ps(part[r][c].as_ptr());
                }
            }
            for j in 0..blocks {
                for e in 0..CHUNK {
                    let at = b0 + j * WARP * CHUNK + e * BLOCK_LANES;
                    let mut wv = [_mm512_setzero_ps(); C];
                    for c in 0..C {
                        wv[c] = _mm512_loadu_ps(ws[c].as_ptr().add(at));
                    }
                    for r in 0..R {
                        let xv = _mm512_loadu_ps(xs[r].as_ptr().add(at));
                        for c in 0..C {
                            acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
                        }
                    }
                }
            }
            for r in 0..R {
                for c in 0..C {
                    _mm512_storeu_ps(part[r][c].as_mut_ptr(), acc[r][c]);
                }
            }
        }
    })
}

/// `blocked_tile` with AVX2 and FMA: the 16 lanes of a block in two registers.
///
/// Safety: the CPU must support AVX2 and FMA; every row is `x[0].len()` long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // h names a register half, as r and c name the tile's
unsafe fn blocked_tile_avx2<const R: usize, const C: usize>(
    x: [Blocked<'_>; R],
    w: [Blocked<'_>; C],
) -> [[f32; C]; R] {
    use std::arch::x86_64::*;
    blocked_segments(x, w, |xs, ws, b0, blocks, part| {
        // SAFETY: as blocked_tile_avx512's, with AVX2 and FMA; loads of 8 f32.
        unsafe {
            let mut acc = [[[_mm256_setzero_ps(); 2]; C]; R];
            for r in 0..R {
                for c in 0..C {
                    for (h, v) in acc[r][c].iter_mut().enumerate() {
                        *v = _mm256_loadu_ps(part[r][c].as_ptr().add(h * 8));
                    }
                }
            }
            for j in 0..blocks {
                for e in 0..CHUNK {
                    let at = b0 + j * WARP * CHUNK + e * BLOCK_LANES;
                    for h in 0..2 {
                        let mut wv = [_mm256_setzero_ps(); C];
                        for c in 0..C {
                            wv[c] = _mm256_loadu_ps(ws[c].as_ptr().add(at + h * 8));
                        }
                        for r in 0..R {
                            let xv = _mm256_loadu_ps(xs[r].as_ptr().add(at + h * 8));
                            for c in 0..C {
                                acc[r][c][h] = _mm256_fmadd_ps(xv, wv[c], acc[r][c][h]);
                            }
                        }
                    }
                }
            }
            for r in 0..R {
                for c in 0..C {
                    for (h, v) in acc[r][c].iter().enumerate() {
                        _mm256_storeu_ps(part[r][c].as_mut_ptr().add(h * 8), *v);
                    }
                }
            }
        }
    })
}

/// Four dots of one `Blocked` row against four bf16 rows of its length, each bit-identical to
/// `dot_f32_bf16` of the row it was made from (`dot_1x4` without transposing the row again
/// for every four weight rows).
#[inline]
pub fn dot_blocked_1x4(x: Blocked<'_>, w: [&[bf16]; 4]) -> [f32; 4] {
    assert!(
        w.iter().all(|r| r.len() == x.len()),
        "dot_blocked_1x4: rows of different lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked); every row is `x.len()` long.
        return unsafe { avx2::dot_tile::<Blocked<'_>, &[bf16], 1, 4>([x], w) }[0];
    }
    w.map(|row| warp_dot_of(x.len(), |i| x.get(i), |i| to_f32(row[i])))
}

/// The definition of `dot_blocked`, without run-time dispatch (the AVX2 path must equal it).
pub fn dot_blocked_lanes<const R: usize, const C: usize>(
    x: [Blocked<'_>; R],
    w: [Blocked<'_>; C],
) -> [[f32; C]; R] {
    std::array::from_fn(|r| {
        std::array::from_fn(|c| {
            let len = x[r].len().min(w[c].len());
            warp_dot_of(len, |i| x[r].get(i), |i| w[c].get(i))
        })
    })
}

/// The per-head dot of the o-fold (attn.cu `o_fold_epilogue`): lane c takes chunk c of the
/// head (at most 32 chunks: head_dim <= 256) with fma from +0 (`chunk_fma`), then the butterfly
/// over the smallest power-of-two group of lanes holding every chunk.
#[inline]
pub fn dot_head(a: &[bf16], b: &[bf16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked).
        return unsafe { dot_head_fma(a, b) };
    }
    dot_head_body(a, b)
}

/// Safety: the CPU must support FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn dot_head_fma(a: &[bf16], b: &[bf16]) -> f32 {
    dot_head_body(a, b)
}

#[inline(always)]
fn dot_head_body(a: &[bf16], b: &[bf16]) -> f32 {
    let len = a.len().min(b.len());
    let chunks = len.div_ceil(CHUNK);
    assert!(
        chunks <= WARP,
        "dot_head: {len} elements, at most {}",
        WARP * CHUNK
    );
    let (x, w) = (|i| to_f32(a[i]), |i| to_f32(b[i]));
    let mut lanes = [0.0f32; WARP];
    for (c, acc) in lanes.iter_mut().enumerate().take(chunks) {
        let i0 = c * CHUNK;
        *acc = chunk_fma(0.0, i0, (len - i0).min(CHUNK), &x, &w);
    }
    tree_sum(&mut lanes, chunks.max(1).next_power_of_two())
}

/// common.cuh `warp_sum_squares` of `len` values v(i): lane l accumulates i = l, l + 32, ...
/// with fma(v, v, acc) in order, then `warp_sum`.
#[inline(always)]
fn warp_sum_squares_of(len: usize, v: impl Fn(usize) -> f32) -> f32 {
    let mut lanes = [0.0f32; WARP];
    for i in 0..len {
        let x = v(i);
        lanes[i % WARP] = x.mul_add(x, lanes[i % WARP]);
    }
    warp_sum(lanes)
}

/// Σ x\[i\]² in the order of common.cuh `warp_sum_squares` (every norm).
#[inline]
pub fn sum_squares_f32(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked).
        return unsafe { avx2::sum_squares(x) };
    }
    warp_sum_squares_of(x.len(), |i| x[i])
}

/// Σ x\[i\]² of bf16 values, in `sum_squares_f32`'s order (equal to it of the widened row).
#[inline]
pub fn sum_squares_bf16(x: &[bf16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked).
        return unsafe { avx2::sum_squares(x) };
    }
    warp_sum_squares_of(x.len(), |i| to_f32(x[i]))
}

/// The portable definition of `sum_squares_f32`, without run-time dispatch (the AVX2 path
/// must equal it).
pub fn sum_squares_f32_lanes(x: &[f32]) -> f32 {
    warp_sum_squares_of(x.len(), |i| x[i])
}

/// Sum of `values` added into 32 strided lanes (value e into lane e mod 32, in order,
/// from +0), then `warp_sum`: the softmax denominator of moe.cu `topk_softmax`.
pub fn warp_strided_sum(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; WARP];
    for (e, v) in values.iter().enumerate() {
        lanes[e % WARP] += *v;
    }
    warp_sum(lanes)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! The AVX2+FMA paths: 8 CUDA lanes in one register. A lane's chunk is 8 consecutive
    //! elements, so 8 lanes' chunks (64 elements) are transposed to give, per element e of the
    //! chunk, one register of the 8 lanes' e-th values; `_mm256_fmadd_ps` then does each lane's
    //! fma in order. A row's last block, when it is not whole, is read with +0 past the row
    //! (`Row::partial_block`), and the lanes with no chunk in it keep their sums.
    use std::arch::x86_64::*;

    use half::bf16;

    use super::{
        dot_fold, to_f32, tree_sum, warp_sum, Blocked, BLOCK, BLOCK_LANES, CHUNK, DOT_SEG,
        LANE_CHUNKS, WARP,
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
    pub(in crate::numerics) unsafe fn load8x8<X: Row>(
        row: X,
        at: usize,
        step: usize,
    ) -> [__m256; 8] {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 4×4 tile from every build of `blocked_tile` this CPU runs, and the dispatch.
    fn every_build(x: [Blocked<'_>; 4], w: [Blocked<'_>; 4]) -> Vec<(&'static str, [[f32; 4]; 4])> {
        let mut got = vec![("portable", blocked_tile(x, w))];
        #[cfg(target_arch = "x86_64")]
        {
            if avx2_fma() {
                // SAFETY: the CPU supports AVX2 and FMA (checked).
                got.push(("avx2", unsafe { blocked_tile_avx2(x, w) }));
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports AVX-512F (checked).
                got.push(("avx512", unsafe { blocked_tile_avx512(x, w) }));
            }
        }
        got.push(("dispatch", dot_blocked(x, w)));
        got
    }

    /// Every build of `blocked_tile` this CPU runs (portable, AVX2, AVX-512) gives
    /// `dot_blocked_lanes`' bits, 4×4 and 1×4 and 4×1, at lengths with a partial segment, a
    /// whole 64-element block past the last 128-element one (576, 1000), and no whole block.
    #[test]
    fn every_build_of_the_blocked_tile_gives_the_definitions_bits() {
        let mut seed = 0x9e37_79b9u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            to_f32(bf16::from_f32((seed % 2001) as f32 / 1000.0 - 1.0))
        };
        for len in [5, 64, 100, 128, 192, 576, 1000, 1024, 1100, 2048, 2600] {
            let rows: Vec<Vec<f32>> = (0..8)
                .map(|_| {
                    let wide: Vec<f32> = (0..len).map(|_| next()).collect();
                    let mut out = vec![f32::NAN; blocked_len(len)];
                    transpose_blocks(&wide, &mut out);
                    out
                })
                .collect();
            let x = [0, 1, 2, 3].map(|r| Blocked::new(&rows[r], len));
            let w = [4, 5, 6, 7].map(|r| Blocked::new(&rows[r], len));
            let want = dot_blocked_lanes(x, w);
            let got = every_build(x, w);
            let one_by_four = dot_blocked([x[2]], w)[0];
            let four_by_one = dot_blocked(x, [w[1]]);
            for (path, d) in got {
                for r in 0..4 {
                    for c in 0..4 {
                        let bits = want[r][c].to_bits();
                        assert_eq!(d[r][c].to_bits(), bits, "{path} len {len} ({r}, {c})");
                    }
                }
            }
            for c in 0..4 {
                assert_eq!(
                    one_by_four[c].to_bits(),
                    want[2][c].to_bits(),
                    "1x4 len {len}"
                );
            }
            for r in 0..4 {
                assert_eq!(
                    four_by_one[r][0].to_bits(),
                    want[r][1].to_bits(),
                    "4x1 len {len}"
                );
            }
        }
    }

    /// Products too small for f32 leave every lane at −0; a lane with no chunk in the row's
    /// last, partial block keeps its −0 (the kernel skips that chunk), so the dot is −0 on
    /// every build, as the definition's. At 320 the second half of the first half warp's
    /// lanes has no chunk in the partial block at 256.
    #[test]
    fn a_lane_with_no_chunk_in_the_partial_block_keeps_its_negative_zero() {
        for len in [320, 1024 + 320, 264] {
            let wide = |v: f32| vec![to_f32(bf16::from_f32(v)); len];
            let blocked = |row: Vec<f32>| {
                let mut out = vec![f32::NAN; blocked_len(len)];
                transpose_blocks(&row, &mut out);
                out
            };
            let (xr, wr) = (blocked(wide(-1e-30)), blocked(wide(1e-30)));
            let (x, w) = ([Blocked::new(&xr, len); 4], [Blocked::new(&wr, len); 4]);
            let want = dot_blocked_lanes(x, w)[0][0];
            assert_eq!(
                want.to_bits(),
                (-0.0f32).to_bits(),
                "len {len}: the definition"
            );
            let got = every_build(x, w);
            for (path, d) in got {
                assert_eq!(d[3][2].to_bits(), want.to_bits(), "{path} len {len}");
            }
        }
    }
}
