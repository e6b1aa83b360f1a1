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
pub(super) mod avx2;

#[cfg(test)]
mod tests;
