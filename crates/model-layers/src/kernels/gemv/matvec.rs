//! The projection driver every gemv twin uses: `out[r][o] = f(r, o, dot(x[r], w_row(o)))`
//! over all rows and output features, on up to `threads` threads.
//!
//! Several rows: the input rows' and each weight row's blocks transposed once
//! (`numerics::Blocked`), so the tiles' loads need no shuffles, and the weight rows taken a
//! panel at a time against every input row, in tiles of four input rows by four weight rows, so
//! an input row is read once a panel rather than once a weight row.
//!
//! Invariant: each dot is bit-identical to `numerics::dot_bf16` of the bf16 rows (the tiles
//! only change which dots run side by side, never a dot's own order), and each output is
//! written by one thread, so results never depend on the thread count or the tiling.

use half::bf16;
use solder_gpu_runtime::par_chunks_mut;

use crate::kernels::args::scatter;
use crate::numerics::{
    blocked_len, dot_blocked, dot_blocked_1x4, dot_f32_bf16, to_f32, transpose_blocks, Blocked,
};

/// Weight rows widened and transposed together, each read against every input row.
const PANEL: usize = 8;

/// Input rows widened to f32 once per launch (exact), so each weight row is widened once.
pub(crate) struct Widened {
    data: Vec<f32>,
    k: usize,
}

impl Widened {
    pub fn new(x: &[bf16], k: usize) -> Widened {
        Widened {
            data: x.iter().map(|v| to_f32(*v)).collect(),
            k,
        }
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.k..(r + 1) * self.k]
    }

    fn rows(&self) -> usize {
        self.data.len().checked_div(self.k).unwrap_or(0)
    }

    /// Every row as a `Blocked` row (`transpose_blocks`), one after the other, each
    /// `blocked_len(k)` long.
    fn blocked(&self) -> Vec<f32> {
        let kb = blocked_len(self.k);
        let mut out = vec![0.0f32; self.rows() * kb];
        if self.k > 0 {
            for (row, dst) in self.data.chunks_exact(self.k).zip(out.chunks_exact_mut(kb)) {
                transpose_blocks(row, dst);
            }
        }
        out
    }
}

/// The dots of R input rows (from row `r`) with a panel's `cols` weight rows, four at a time
/// and then one: `put(row, column, dot)`.
fn panel_dots<'p, const R: usize>(
    xs: [Blocked<'_>; R],
    r: usize,
    cols: usize,
    wb: &impl Fn(usize) -> Blocked<'p>,
    put: &mut impl FnMut(usize, usize, f32),
) {
    let mut c = 0;
    while c + 4 <= cols {
        let d = dot_blocked(xs, [wb(c), wb(c + 1), wb(c + 2), wb(c + 3)]);
        for (i, row) in d.into_iter().enumerate() {
            for (j, v) in row.into_iter().enumerate() {
                put(r + i, c + j, v);
            }
        }
        c += 4;
    }
    for c in c..cols {
        let d = dot_blocked(xs, [wb(c)]);
        for (i, v) in d.into_iter().enumerate() {
            put(r + i, c, v[0]);
        }
    }
}

pub(crate) fn for_each_dot<'w, T: Copy + Default + Send>(
    threads: usize,
    x: &Widened,
    n: usize,
    w_row: impl Fn(usize) -> &'w [bf16] + Sync,
    f: impl Fn(usize, usize, f32) -> T + Sync,
    out: &mut [T],
) {
    let rows = x.rows();
    if rows == 0 || n == 0 {
        return;
    }
    if rows == 1 {
        // One row, its blocks transposed once: tile four output features at a time.
        let x0 = x.row(0);
        let mut xt = vec![0.0f32; blocked_len(x0.len())];
        transpose_blocks(x0, &mut xt);
        let xb = Blocked::new(&xt, x0.len());
        let per_chunk = n.div_ceil(threads * 4).max(4).next_multiple_of(4);
        par_chunks_mut(&mut out[..n], per_chunk, threads, |ci, chunk| {
            let base = ci * per_chunk;
            let mut j = 0;
            while j + 4 <= chunk.len() {
                let o = base + j;
                let d = dot_blocked_1x4(xb, [w_row(o), w_row(o + 1), w_row(o + 2), w_row(o + 3)]);
                for (i, v) in d.into_iter().enumerate() {
                    chunk[j + i] = f(0, o + i, v);
                }
                j += 4;
            }
            for (i, slot) in chunk.iter_mut().enumerate().skip(j) {
                *slot = f(0, base + i, dot_f32_bf16(x0, w_row(base + i)));
            }
        });
        return;
    }
    // Several rows: panels of weight rows, each widened and transposed once, against four
    // input rows at a time; column-major `[n][rows]` results, then scattered.
    let (k, kb) = (x.k, blocked_len(x.k));
    let xt = x.blocked();
    let xb = |r: usize| Blocked::new(&xt[r * kb..(r + 1) * kb], k);
    let mut by_column = vec![T::default(); rows * n];
    let per_chunk = n.div_ceil(threads * 4).max(1).next_multiple_of(PANEL);
    par_chunks_mut(&mut by_column, per_chunk * rows, threads, |ci, chunk| {
        let mut panel = vec![0.0f32; PANEL * kb];
        let mut wide = vec![0.0f32; k];
        for (pi, values) in chunk.chunks_mut(PANEL * rows).enumerate() {
            let first = ci * per_chunk + pi * PANEL;
            let cols = values.len() / rows;
            for c in 0..cols {
                for (d, s) in wide.iter_mut().zip(w_row(first + c)) {
                    *d = to_f32(*s);
                }
                transpose_blocks(&wide, &mut panel[c * kb..(c + 1) * kb]);
            }
            let wb = |c: usize| Blocked::new(&panel[c * kb..(c + 1) * kb], k);
            let mut put = |r: usize, c: usize, v: f32| values[c * rows + r] = f(r, first + c, v);
            // Tiles of 4 input rows × 4 weight rows, then the rows left one at a time.
            let mut r = 0;
            while r + 4 <= rows {
                let xs = [xb(r), xb(r + 1), xb(r + 2), xb(r + 3)];
                panel_dots(xs, r, cols, &wb, &mut put);
                r += 4;
            }
            for r in r..rows {
                panel_dots([xb(r)], r, cols, &wb, &mut put);
            }
        }
    });
    scatter(&by_column, rows, 0, out, n);
}
