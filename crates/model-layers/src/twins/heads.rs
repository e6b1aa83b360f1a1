//! Twins of the per-head kernels: `norm::qk_norm`, `rope::rope`, `kv::kv_write` and their
//! fusions `rope::qk_norm_rope`, `rope::rope_kv_write`, `rope::qk_norm_rope_kv_write`.
//!
//! One pass (`HeadPass`) serves them all: per row, per head, qk-norm (`rms_norm_row_bf16`)
//! into a bf16 head buffer, then rope (`rope_head`) from it, exactly what the reference twins
//! store between them; the k row then goes to `k_out` or to its cache slot with the v row.

use half::bf16;
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::args::{bf16_in, bf16_out, dim, f32_in, i32_in, rows, size};
use crate::numerics::{rms_norm_row_bf16, rope_cos_sin, rope_head};

/// What a pass does to each head of q and k.
struct HeadPass<'a> {
    rows: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    q: &'a [bf16],
    k: &'a [bf16],
    /// qk-norm weights (q, k) and eps.
    norm: Option<(&'a [bf16], &'a [bf16], f32)>,
    /// Rope: positions per row and inv_freq (rotary_dim / 2 entries).
    rope: Option<(&'a [i32], &'a [f32])>,
}

impl HeadPass<'_> {
    /// Transforms every head; q heads go to `q_out`, each row's k heads to `k_sink(row, k_row)`.
    fn run(&self, q_out: &mut [bf16], mut k_sink: impl FnMut(usize, &[bf16])) {
        let d = self.head_dim;
        let half = self.rope.map_or(0, |(_, f)| f.len());
        let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
        let mut normed = vec![bf16::ZERO; d];
        let mut k_row = vec![bf16::ZERO; self.kv_heads * d];
        let (qn, kn) = (self.heads * d, self.kv_heads * d);
        for r in 0..self.rows {
            if let Some((positions, inv_freq)) = self.rope {
                rope_cos_sin(positions[r], inv_freq, &mut cos, &mut sin);
            }
            let q_rows = self.q[r * qn..(r + 1) * qn].chunks_exact(d);
            for (x, out) in q_rows.zip(q_out[r * qn..(r + 1) * qn].chunks_exact_mut(d)) {
                self.head(
                    x,
                    self.norm.map(|(wq, _, eps)| (wq, eps)),
                    &cos,
                    &sin,
                    &mut normed,
                    out,
                );
            }
            for (x, out) in self.k[r * kn..(r + 1) * kn]
                .chunks_exact(d)
                .zip(k_row.chunks_exact_mut(d))
            {
                self.head(
                    x,
                    self.norm.map(|(_, wk, eps)| (wk, eps)),
                    &cos,
                    &sin,
                    &mut normed,
                    out,
                );
            }
            k_sink(r, &k_row);
        }
    }

    fn head(
        &self,
        x: &[bf16],
        norm: Option<(&[bf16], f32)>,
        cos: &[f32],
        sin: &[f32],
        normed: &mut [bf16],
        out: &mut [bf16],
    ) {
        match (norm, self.rope.is_some()) {
            (Some((w, eps)), true) => {
                rms_norm_row_bf16(x, w, eps, normed);
                rope_head(normed, cos, sin, out);
            }
            (Some((w, eps)), false) => rms_norm_row_bf16(x, w, eps, out),
            (None, true) => rope_head(x, cos, sin, out),
            (None, false) => out.copy_from_slice(x),
        }
    }
}

/// Reads q, k (indices 0, 1) and the head geometry starting at `dims`.
fn geometry<'a>(ctx: &TwinCtx<'a>, dims: usize) -> Result<HeadPass<'a>, GpuError> {
    let (rows, heads, kv_heads, head_dim) = (
        rows(ctx, dims)?,
        dim(ctx, dims + 1)?,
        dim(ctx, dims + 2)?,
        dim(ctx, dims + 3)?,
    );
    let q = bf16_in(ctx, 0, size(ctx, &[rows, heads, head_dim])?)?;
    let k = bf16_in(ctx, 1, size(ctx, &[rows, kv_heads, head_dim])?)?;
    Ok(HeadPass {
        rows,
        heads,
        kv_heads,
        head_dim,
        q,
        k,
        norm: None,
        rope: None,
    })
}

fn with_norm<'a>(
    ctx: &TwinCtx<'a>,
    mut pass: HeadPass<'a>,
    wq: usize,
    eps: usize,
) -> Result<HeadPass<'a>, GpuError> {
    let (q_w, k_w) = (
        bf16_in(ctx, wq, pass.head_dim)?,
        bf16_in(ctx, wq + 1, pass.head_dim)?,
    );
    pass.norm = Some((q_w, k_w, ctx.f32(eps)?));
    Ok(pass)
}

/// Positions at `positions`, inv_freq at `positions + 1`, rotary_dim at `rotary`.
fn with_rope<'a>(
    ctx: &TwinCtx<'a>,
    mut pass: HeadPass<'a>,
    positions: usize,
    rotary: usize,
) -> Result<HeadPass<'a>, GpuError> {
    let rotary_dim = dim(ctx, rotary)?;
    if rotary_dim % 2 != 0 || rotary_dim > pass.head_dim {
        return Err(ctx.bad(
            rotary,
            format!(
                "rotary_dim {rotary_dim} must be even and at most head_dim {}",
                pass.head_dim
            ),
        ));
    }
    let pos = i32_in(ctx, positions, pass.rows)?;
    let inv_freq = f32_in(ctx, positions + 1, rotary_dim / 2)?;
    pass.rope = Some((pos, inv_freq));
    Ok(pass)
}

/// A layer's paged KV cache region: `[num_pages][2][block_size][kv_heads][head_dim]`.
struct Cache<'a> {
    data: &'a mut [bf16],
    block_size: usize,
    row_elems: usize,
}

impl<'a> Cache<'a> {
    /// Reads the cache at `cache`, block_size and num_pages at `bs`, `bs + 1`, and checks the
    /// slots at `slots` against it.
    fn read(
        ctx: &TwinCtx<'a>,
        cache: usize,
        slots: usize,
        bs: usize,
        pass: &HeadPass<'_>,
    ) -> Result<(Cache<'a>, &'a [i32]), GpuError> {
        let (block_size, num_pages) = (dim(ctx, bs)?, dim(ctx, bs + 1)?);
        let row_elems = pass.kv_heads * pass.head_dim;
        let slot_mapping = i32_in(ctx, slots, pass.rows)?;
        let data = bf16_out(
            ctx,
            cache,
            size(ctx, &[num_pages, 2, block_size, row_elems])?,
        )?;
        let total = num_pages * block_size;
        for (r, s) in slot_mapping.iter().enumerate() {
            if *s < 0 || *s as usize >= total {
                return Err(ctx.fail(format!(
                    "row {r}: slot {s} outside the cache's {total} slots"
                )));
            }
        }
        Ok((
            Cache {
                data,
                block_size,
                row_elems,
            },
            slot_mapping,
        ))
    }

    /// Stores one row's k and v at `slot` (checked in `read`).
    fn store(&mut self, slot: i32, k_row: &[bf16], v_row: &[bf16]) {
        let slot = slot as usize;
        let (page, offset) = (slot / self.block_size, slot % self.block_size);
        let k_at = (page * 2 * self.block_size + offset) * self.row_elems;
        let v_at = ((page * 2 + 1) * self.block_size + offset) * self.row_elems;
        self.data[k_at..k_at + self.row_elems].copy_from_slice(k_row);
        self.data[v_at..v_at + self.row_elems].copy_from_slice(v_row);
    }
}

/// Runs `pass` with q_out at `q_out` and k_out at `q_out + 1`.
fn to_outputs(ctx: &TwinCtx<'_>, pass: HeadPass<'_>, q_out: usize) -> Result<(), GpuError> {
    let q_dst = bf16_out(ctx, q_out, pass.q.len())?;
    let k_dst = bf16_out(ctx, q_out + 1, pass.k.len())?;
    let kn = pass.kv_heads * pass.head_dim;
    pass.run(q_dst, |r, k_row| {
        k_dst[r * kn..(r + 1) * kn].copy_from_slice(k_row)
    });
    Ok(())
}

/// Runs `pass` with q_out at `q_out`, then each row's k (and v, argument 2) into the cache.
fn to_cache(
    ctx: &TwinCtx<'_>,
    pass: HeadPass<'_>,
    slots: usize,
    q_out: usize,
    bs: usize,
) -> Result<(), GpuError> {
    let v = bf16_in(ctx, 2, pass.k.len())?;
    let q_dst = bf16_out(ctx, q_out, pass.q.len())?;
    let (mut cache, slot_mapping) = Cache::read(ctx, q_out + 1, slots, bs, &pass)?;
    let kn = cache.row_elems;
    pass.run(q_dst, |r, k_row| {
        cache.store(slot_mapping[r], k_row, &v[r * kn..(r + 1) * kn])
    });
    Ok(())
}

/// `norm::qk_norm(q, k, wq, wk, q_out, k_out, rows, heads, kv_heads, head_dim, eps)`.
pub(crate) fn qk_norm(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let pass = with_norm(ctx, geometry(ctx, 6)?, 2, 10)?;
    to_outputs(ctx, pass, 4)
}

/// `rope::rope(q, k, positions, inv_freq, q_out, k_out, rows, heads, kv_heads, head_dim,
/// rotary_dim)`.
pub(crate) fn rope(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let pass = with_rope(ctx, geometry(ctx, 6)?, 2, 10)?;
    to_outputs(ctx, pass, 4)
}

/// `rope::qk_norm_rope(q, k, wq, wk, positions, inv_freq, q_out, k_out, rows, heads,
/// kv_heads, head_dim, rotary_dim, eps)` = qk_norm → rope.
pub(crate) fn qk_norm_rope(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let pass = with_norm(ctx, geometry(ctx, 8)?, 2, 13)?;
    let pass = with_rope(ctx, pass, 4, 12)?;
    to_outputs(ctx, pass, 6)
}

/// `kv::kv_write(k, v, slot_mapping, cache, rows, kv_heads, head_dim, block_size, num_pages)`.
pub(crate) fn kv_write(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, kv_heads, head_dim) = (rows(ctx, 4)?, dim(ctx, 5)?, dim(ctx, 6)?);
    let k = bf16_in(ctx, 0, size(ctx, &[rows, kv_heads, head_dim])?)?;
    let v = bf16_in(ctx, 1, k.len())?;
    let pass = HeadPass {
        rows,
        heads: 0,
        kv_heads,
        head_dim,
        q: &[],
        k,
        norm: None,
        rope: None,
    };
    let (mut cache, slot_mapping) = Cache::read(ctx, 3, 2, 7, &pass)?;
    let kn = cache.row_elems;
    for (r, s) in slot_mapping.iter().enumerate() {
        cache.store(*s, &k[r * kn..(r + 1) * kn], &v[r * kn..(r + 1) * kn]);
    }
    Ok(())
}

/// `rope::rope_kv_write(q, k, v, positions, inv_freq, slot_mapping, q_out, cache, rows,
/// heads, kv_heads, head_dim, rotary_dim, block_size, num_pages)` = rope → kv_write.
pub(crate) fn rope_kv_write(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let pass = with_rope(ctx, geometry(ctx, 8)?, 3, 12)?;
    to_cache(ctx, pass, 5, 6, 13)
}

/// `rope::qk_norm_rope_kv_write(q, k, v, wq, wk, positions, inv_freq, slot_mapping, q_out,
/// cache, rows, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages, eps)` =
/// qk_norm → rope → kv_write.
pub(crate) fn qk_norm_rope_kv_write(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let pass = with_norm(ctx, geometry(ctx, 10)?, 3, 17)?;
    let pass = with_rope(ctx, pass, 5, 14)?;
    to_cache(ctx, pass, 7, 8, 15)
}
