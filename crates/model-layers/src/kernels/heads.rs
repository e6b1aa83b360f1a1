//! The per-head pass the twins of `norm::qk_norm`, `norm::qk_norm_zc`, `rope::*` and
//! `kv::kv_write` share: per row, per head, qk-norm (`rms_norm_row_bf16`, or
//! `rms_norm_zc_row_bf16` for zero-centred weights) into a bf16 head buffer, then rope
//! (`rope_head`) from it, exactly what the reference twins store between them; the k row then
//! goes to `k_out` or to its cache slot with the v row.

use half::bf16;
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::args::{size, Dim, In, Out};
use crate::numerics::{rms_norm_row_bf16, rms_norm_zc_row_bf16, rope_cos_sin, rope_head};

/// What a pass does to each head of q and k.
pub(crate) struct HeadPass<'a> {
    ctx: &'a TwinCtx<'a>,
    rows: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    q: &'a [bf16],
    k: &'a [bf16],
    /// qk-norm weights (q, k) and eps.
    norm: Option<(&'a [bf16], &'a [bf16], f32)>,
    /// The qk-norm's weights are zero-centred (each multiplies as 1 + w).
    zero_centred: bool,
    /// Rope: positions per row, inv_freq (rotary_dim / 2 entries) and the attention scaling.
    rope: Option<(&'a [i32], &'a [f32], f32)>,
}

/// q and k and the head geometry.
pub(crate) fn geometry<'a>(
    ctx: &'a TwinCtx<'a>,
    q: In<'a, bf16>,
    k: In<'a, bf16>,
    rows: Dim<'a>,
    heads: Dim<'a>,
    kv_heads: Dim<'a>,
    head_dim: Dim<'a>,
) -> Result<HeadPass<'a>, GpuError> {
    let (rows, heads, kv_heads, head_dim) =
        (rows.count(), heads.dim()?, kv_heads.dim()?, head_dim.dim()?);
    let q = q.len(size(ctx, &[rows, heads, head_dim])?)?;
    let k = k.len(size(ctx, &[rows, kv_heads, head_dim])?)?;
    Ok(HeadPass {
        ctx,
        rows,
        heads,
        kv_heads,
        head_dim,
        q,
        k,
        norm: None,
        zero_centred: false,
        rope: None,
    })
}

/// Adds qk-norm with weights `wq`, `wk` (`[head_dim]`).
pub(crate) fn with_norm<'a>(
    mut pass: HeadPass<'a>,
    wq: In<'a, bf16>,
    wk: In<'a, bf16>,
    eps: f32,
) -> Result<HeadPass<'a>, GpuError> {
    let (q_w, k_w) = (wq.len(pass.head_dim)?, wk.len(pass.head_dim)?);
    pass.norm = Some((q_w, k_w, eps));
    Ok(pass)
}

/// Adds rope at each row's position; `table` holds rotary_dim / 2 inverse frequencies then the
/// attention scaling that multiplies cos and sin.
pub(crate) fn with_rope<'a>(
    mut pass: HeadPass<'a>,
    positions: In<'a, i32>,
    table: In<'a, f32>,
    rotary_dim: Dim<'a>,
) -> Result<HeadPass<'a>, GpuError> {
    let rotary = rotary_dim.dim()?;
    if rotary % 2 != 0 || rotary > pass.head_dim {
        return Err(rotary_dim.bad(format!(
            "rotary_dim {rotary} must be even and at most head_dim {}",
            pass.head_dim
        )));
    }
    let pos = positions.len(pass.rows)?;
    let (inv_freq, scaling) = table.len(rotary / 2 + 1)?.split_at(rotary / 2);
    pass.rope = Some((pos, inv_freq, scaling[0]));
    Ok(pass)
}

impl<'a> HeadPass<'a> {
    /// A pass over rows of q (`[rows][heads][head_dim]`) and k (`[rows][kv_heads][head_dim]`)
    /// a fused twin computed itself (the caller sized them).
    pub(crate) fn over(
        ctx: &'a TwinCtx<'a>,
        q: &'a [bf16],
        k: &'a [bf16],
        [rows, heads, kv_heads, head_dim]: [usize; 4],
    ) -> HeadPass<'a> {
        debug_assert_eq!(q.len(), rows * heads * head_dim);
        debug_assert_eq!(k.len(), rows * kv_heads * head_dim);
        HeadPass {
            ctx,
            rows,
            heads,
            kv_heads,
            head_dim,
            q,
            k,
            norm: None,
            zero_centred: false,
            rope: None,
        }
    }

    /// Adds qk-norm with weights `wq`, `wk` (`[head_dim]` each, checked by the caller).
    pub(crate) fn normed_by(mut self, wq: &'a [bf16], wk: &'a [bf16], eps: f32) -> HeadPass<'a> {
        self.norm = Some((wq, wk, eps));
        self
    }

    /// Makes the qk-norm's weights zero-centred (Qwen3-Next's `1 + w`).
    pub(crate) fn zero_centred(mut self) -> HeadPass<'a> {
        self.zero_centred = true;
        self
    }

    /// A pass over k alone (the KV write): no q heads.
    pub(crate) fn k_only(
        ctx: &'a TwinCtx<'a>,
        k: &'a [bf16],
        rows: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> HeadPass<'a> {
        HeadPass {
            ctx,
            rows,
            heads: 0,
            kv_heads,
            head_dim,
            q: &[],
            k,
            norm: None,
            zero_centred: false,
            rope: None,
        }
    }

    /// Runs the pass into `q_out` and `k_out`.
    pub(crate) fn into_outputs(
        self,
        q_out: Out<'a, bf16>,
        k_out: Out<'a, bf16>,
    ) -> Result<(), GpuError> {
        let q_dst = q_out.len(self.q.len())?;
        let k_dst = k_out.len(self.k.len())?;
        let kn = self.kv_heads * self.head_dim;
        self.run(q_dst, |r, k_row| {
            k_dst[r * kn..(r + 1) * kn].copy_from_slice(k_row)
        });
        Ok(())
    }

    /// Runs the pass into `q_out`, then each row's k (and its v row) into the cache.
    pub(crate) fn into_cache(
        self,
        v: In<'a, bf16>,
        q_out: Out<'a, bf16>,
        slots: CacheArgs<'a>,
    ) -> Result<(), GpuError> {
        let v = v.len(self.k.len())?;
        self.into_cache_from(v, q_out, slots)
    }

    /// `into_cache` with the v rows (`[rows][kv_heads][head_dim]`) a fused twin computed.
    pub(crate) fn into_cache_from(
        self,
        v: &[bf16],
        q_out: Out<'a, bf16>,
        slots: CacheArgs<'a>,
    ) -> Result<(), GpuError> {
        if v.len() != self.k.len() {
            return Err(self
                .ctx
                .fail(format!("v holds {} elements, k {}", v.len(), self.k.len())));
        }
        let q_dst = q_out.len(self.q.len())?;
        let (mut cache, slot_mapping) = Cache::read(slots, &self)?;
        let kn = cache.row_elems;
        self.run(q_dst, |r, k_row| {
            cache.store(slot_mapping[r], k_row, &v[r * kn..(r + 1) * kn])
        });
        Ok(())
    }

    /// Transforms every head; q heads go to `q_out`, each row's k heads to `k_sink(row, k_row)`.
    fn run(&self, q_out: &mut [bf16], mut k_sink: impl FnMut(usize, &[bf16])) {
        let d = self.head_dim;
        let half = self.rope.map_or(0, |(_, f, _)| f.len());
        let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
        let mut normed = vec![bf16::ZERO; d];
        let mut k_row = vec![bf16::ZERO; self.kv_heads * d];
        let (qn, kn) = (self.heads * d, self.kv_heads * d);
        for r in 0..self.rows {
            if let Some((positions, inv_freq, scaling)) = self.rope {
                rope_cos_sin(positions[r], inv_freq, scaling, &mut cos, &mut sin);
            }
            let q_rows = self.q[r * qn..(r + 1) * qn].chunks_exact(d);
            for (x, out) in q_rows.zip(q_out[r * qn..(r + 1) * qn].chunks_exact_mut(d)) {
                let norm = self.norm.map(|(wq, _, eps)| (wq, eps));
                self.head(x, norm, &cos, &sin, &mut normed, out);
            }
            for (x, out) in self.k[r * kn..(r + 1) * kn]
                .chunks_exact(d)
                .zip(k_row.chunks_exact_mut(d))
            {
                let norm = self.norm.map(|(_, wk, eps)| (wk, eps));
                self.head(x, norm, &cos, &sin, &mut normed, out);
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
        let norm_row = match self.zero_centred {
            true => rms_norm_zc_row_bf16,
            false => rms_norm_row_bf16,
        };
        match (norm, self.rope.is_some()) {
            (Some((w, eps)), true) => {
                norm_row(x, w, eps, normed);
                rope_head(normed, cos, sin, out);
            }
            (Some((w, eps)), false) => norm_row(x, w, eps, out),
            (None, true) => rope_head(x, cos, sin, out),
            (None, false) => out.copy_from_slice(x),
        }
    }
}

/// Splits a gated q projection (Qwen3-Next: each head `[q | gate]`, 2·head_dim wide) into its
/// q halves and its gate halves (`attn::gate_split`'s bit copies; every gated twin runs it).
pub(crate) fn split_gated(q2: &[bf16], head_dim: usize, q: &mut [bf16], gate: &mut [bf16]) {
    debug_assert_eq!(q2.len(), 2 * q.len());
    debug_assert_eq!(q.len(), gate.len());
    for ((pair, q), g) in q2
        .chunks_exact(2 * head_dim)
        .zip(q.chunks_exact_mut(head_dim))
        .zip(gate.chunks_exact_mut(head_dim))
    {
        q.copy_from_slice(&pair[..head_dim]);
        g.copy_from_slice(&pair[head_dim..]);
    }
}

/// The arguments that place rows in a layer's paged KV cache.
pub(crate) struct CacheArgs<'a> {
    pub slot_mapping: In<'a, i32>,
    pub cache: Out<'a, bf16>,
    pub block_size: Dim<'a>,
    pub num_pages: Dim<'a>,
}

/// A layer's paged KV cache region: `[num_pages][2][block_size][kv_heads][head_dim]`.
pub(crate) struct Cache<'a> {
    data: &'a mut [bf16],
    block_size: usize,
    row_elems: usize,
}

impl<'a> Cache<'a> {
    /// The cache, with every row's slot checked against it.
    pub(crate) fn read(
        args: CacheArgs<'a>,
        pass: &HeadPass<'a>,
    ) -> Result<(Cache<'a>, &'a [i32]), GpuError> {
        let ctx = pass.ctx;
        let (block_size, num_pages) = (args.block_size.dim()?, args.num_pages.dim()?);
        let row_elems = pass.kv_heads * pass.head_dim;
        let slot_mapping = args.slot_mapping.len(pass.rows)?;
        let data = args
            .cache
            .len(size(ctx, &[num_pages, 2, block_size, row_elems])?)?;
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

    /// Elements of one row's k (or v): kv_heads · head_dim.
    pub(crate) fn row_elems(&self) -> usize {
        self.row_elems
    }

    /// Stores one row's k and v at `slot` (checked in `read`).
    pub(crate) fn store(&mut self, slot: i32, k_row: &[bf16], v_row: &[bf16]) {
        let slot = slot as usize;
        let (page, offset) = (slot / self.block_size, slot % self.block_size);
        let k_at = (page * 2 * self.block_size + offset) * self.row_elems;
        let v_at = ((page * 2 + 1) * self.block_size + offset) * self.row_elems;
        self.data[k_at..k_at + self.row_elems].copy_from_slice(k_row);
        self.data[v_at..v_at + self.row_elems].copy_from_slice(v_row);
    }
}
