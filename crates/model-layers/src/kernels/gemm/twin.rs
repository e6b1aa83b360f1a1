//! The twins of `linear_mma` and `lm_head_mma`, and the dot driver every tensor-core twin uses
//! (`each_dot`, `linear_dots`): each dot in the `mma.sync` model's order, panels of features on
//! the context's threads.

use super::*;

/// `out[r][o] = f(o, dot)` for every row and feature, each dot in the `mma.sync` model's order
/// (`numerics::MmaPanel`): panels of features on the context's threads. From four rows, each
/// panel is widened once and taken against every row while it is in cache: four rows at a time
/// against panels of 16 features (32 with AVX-512; eight chains of fused multiply-adds side by
/// side). Under
/// four rows (decode), each weight is used once per row, so it is widened as it is read
/// (`numerics::stream_dots`, panels of 8): a widened panel in memory would only add its
/// writes, its allocation and its cache misses.
pub(in crate::kernels) fn each_dot<T: Copy + Send>(
    ctx: &solder_gpu_runtime::TwinCtx<'_>,
    x: &[bf16],
    w: &[bf16],
    shape: [usize; 3],
    f: impl Fn(usize, f32) -> T,
    out: &mut [T],
) {
    let [rows, k, n] = shape;
    if rows == 0 || n == 0 {
        return;
    }
    if rows >= MMA_ROWS && wide_panels() {
        panel_each_dot::<4, T>(ctx, (x, w), shape, f, out);
    } else if rows >= MMA_ROWS {
        panel_each_dot::<2, T>(ctx, (x, w), shape, f, out);
    } else {
        panel_dots(ctx, x, shape, MMA_BLOCK, f, out, |first, x_rows, dots| {
            let m = (n - first).min(MMA_BLOCK);
            let w_rows: [&[bf16]; MMA_BLOCK] = std::array::from_fn(|j| {
                if j < m {
                    &w[(first + j) * k..][..k]
                } else {
                    &[]
                }
            });
            let w_rows = &w_rows[..m];
            let got: &[[f32; MMA_BLOCK]] = match *x_rows {
                [a] => &stream_dots(w_rows, [a], k),
                [a, b] => &stream_dots(w_rows, [a, b], k),
                [a, b, c] => &stream_dots(w_rows, [a, b, c], k),
                _ => unreachable!("streamed dots take one to three rows"),
            };
            dots.copy_from_slice(got.as_flattened());
        });
    }
}

/// Whether the panels are 32 features wide (AVX-512: four rows against two registers of 16
/// features, eight chains side by side) rather than 16 (AVX2: against two of 8).
fn wide_panels() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `each_dot` over panels of `8·B` features (`panel_rows`).
fn panel_each_dot<const B: usize, T: Copy + Send>(
    ctx: &solder_gpu_runtime::TwinCtx<'_>,
    (x, w): (&[bf16], &[bf16]),
    shape: [usize; 3],
    f: impl Fn(usize, f32) -> T,
    out: &mut [T],
) {
    let [_, k, n] = shape;
    let width = MmaPanel::<B>::FEATURES;
    panel_dots(ctx, x, shape, width, f, out, |first, x_rows, dots| {
        panel_rows::<B>(w, (n, k), first, x_rows, dots)
    });
}

/// The dots of every row of x with the `8·B` features from `first` (`panel_dots`' `dots`):
/// the panel widened once, four rows at a time against it, then any last rows one by one.
fn panel_rows<const B: usize>(
    w: &[bf16],
    (n, k): (usize, usize),
    first: usize,
    x_rows: &[&[f32]],
    dots: &mut [f32],
) {
    let width = MmaPanel::<B>::FEATURES;
    let w_rows: Vec<&[bf16]> = (first..(first + width).min(n))
        .map(|o| &w[o * k..(o + 1) * k])
        .collect();
    let panel = MmaPanel::<B>::new(&w_rows, k);
    let mut r = 0;
    while r < x_rows.len() {
        let take = if x_rows.len() - r >= MMA_ROWS {
            MMA_ROWS
        } else {
            1
        };
        let mut put = |i: usize, d: &[[f32; MMA_BLOCK]; B]| {
            dots[(r + i) * width..(r + i + 1) * width].copy_from_slice(d.as_flattened());
        };
        if take == MMA_ROWS {
            let got = panel.dots::<MMA_ROWS>(std::array::from_fn(|i| x_rows[r + i]));
            got.iter().enumerate().for_each(|(i, d)| put(i, d));
        } else {
            put(0, &panel.dots([x_rows[r]])[0]);
        }
        r += take;
    }
}

/// `y[r][o]` = `linear_value` of row r's dot with weight row o plus `bias[o]`, each dot in
/// `each_dot`'s order: what `linear_mma` and every tensor-core projection storing bf16 store.
pub(in crate::kernels) fn linear_dots(
    ctx: &solder_gpu_runtime::TwinCtx<'_>,
    x: &[bf16],
    w: &[bf16],
    bias: Option<&[bf16]>,
    shape: [usize; 3],
    y: &mut [bf16],
) {
    each_dot(
        ctx,
        x,
        w,
        shape,
        |o, d| linear_value(d, bias.map(|b| b[o])),
        y,
    );
}

/// `each_dot`'s driver over panels of `width` features: x widened once, the panels shared out
/// to the context's threads, `dots(first, x_rows, out)` filling `out[r·width + j]` with row r's
/// dot with feature `first + j` (features past n ignored), then `f` over every dot.
fn panel_dots<T: Copy + Send>(
    ctx: &solder_gpu_runtime::TwinCtx<'_>,
    x: &[bf16],
    [rows, k, n]: [usize; 3],
    width: usize,
    f: impl Fn(usize, f32) -> T,
    out: &mut [T],
    dots: impl Fn(usize, &[&[f32]], &mut [f32]) + Sync,
) {
    let threads = threads_for(ctx, macs(&[rows, k, n]));
    let xs: Vec<f32> = x.iter().map(|v| to_f32(*v)).collect();
    let x_rows: Vec<&[f32]> = (0..rows).map(|r| &xs[r * k..(r + 1) * k]).collect();
    // by_panel[p][r][j]: feature width·p + j of row r.
    let panels = n.div_ceil(width);
    let mut by_panel = vec![0.0f32; panels * rows * width];
    let per = panels.div_ceil(threads.max(1) * 4).max(1);
    par_chunks_mut(&mut by_panel, per * rows * width, threads, |ci, chunk| {
        for (pi, panel) in chunk.chunks_mut(rows * width).enumerate() {
            dots((ci * per + pi) * width, &x_rows, panel);
        }
    });
    for (r, row) in out.chunks_exact_mut(n).enumerate() {
        for (o, v) in row.iter_mut().enumerate() {
            let (p, j) = (o / width, o % width);
            *v = f(o, by_panel[(p * rows + r) * width + j]);
        }
    }
}

pub(super) fn linear_mma(a: LinearMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?);
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let w = a.w.len(size(ctx, &[n, k])?)?;
    let bias = a.bias.len(n)?;
    let y = a.y.len(size(ctx, &[rows, n])?)?;
    linear_dots(ctx, x, w, bias, [rows, k, n], y);
    Ok(())
}

pub(super) fn lm_head_mma(a: LmHeadMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, vocab) = (a.rows.count(), a.k.dim()?, a.vocab.dim()?);
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let w = a.w.len(size(ctx, &[vocab, k])?)?;
    let out = a.logits.len(size(ctx, &[rows, vocab])?)?;
    let want = a.want.len(rows)?;
    on_wanted_rows(want, (x, k), (out, vocab), rows, |x, rows, out| {
        each_dot(ctx, x, w, [rows, k, vocab], |_, d| d, out);
        Ok(())
    })
}
