//! The projection driver every gemv twin uses: `out[r][o] = f(r, o, dot(x[r], w_row(o)))`
//! over all rows and output features, on up to `threads` threads.
//!
//! Invariant: each dot is bit-identical to `numerics::dot_bf16` of the bf16 rows (the tiles
//! only change which dots run side by side, never a dot's own order), and each output is
//! written by one thread, so results never depend on the thread count or the tiling.

use half::bf16;
use solder_gpu_runtime::par_chunks_mut;

use crate::kernels::args::{columns, scatter};
use crate::numerics::{dot_1x4, dot_4x1, dot_f32_bf16, to_f32};

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
        // One row: tile four output features at a time.
        let x0 = x.row(0);
        let per_chunk = n.div_ceil(threads * 4).max(4).next_multiple_of(4);
        par_chunks_mut(&mut out[..n], per_chunk, threads, |ci, chunk| {
            let base = ci * per_chunk;
            let mut j = 0;
            while j + 4 <= chunk.len() {
                let o = base + j;
                let d = dot_1x4(x0, [w_row(o), w_row(o + 1), w_row(o + 2), w_row(o + 3)]);
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
    // Several rows: each weight row once, against four input rows at a time.
    let by_column = columns(rows, n, threads, |o, values: &mut [T]| {
        let w = w_row(o);
        let mut r = 0;
        while r + 4 <= rows {
            let d = dot_4x1([x.row(r), x.row(r + 1), x.row(r + 2), x.row(r + 3)], w);
            for (i, v) in d.into_iter().enumerate() {
                values[r + i] = f(r + i, o, v);
            }
            r += 4;
        }
        for (i, slot) in values.iter_mut().enumerate().skip(r) {
            *slot = f(i, o, dot_f32_bf16(x.row(i), w));
        }
    });
    scatter(&by_column, rows, 0, out, n);
}
