//! The CPU twins of `qkv_rope_kv_mma` and its format entries: the projections as `qkv_mma`
//! stores them, then `rope_kv_write`'s pass (qk-norm and gated as theirs), the quantized
//! entries on the dequantised matrices.

use super::*;

/// Every entry's arguments but the weights (the same names in each).
struct RopeKv<'a> {
    ctx: &'a solder_gpu_runtime::TwinCtx<'a>,
    x: In<'a, bf16>,
    biases: [InOpt<'a, bf16>; 3],
    /// qk-norm's weights (both or neither) and epsilon.
    norm: (InOpt<'a, bf16>, InOpt<'a, bf16>, f32),
    positions: In<'a, i32>,
    inv_freq: In<'a, f32>,
    slot_mapping: In<'a, i32>,
    q_out: Out<'a, bf16>,
    /// The gated entries' gate halves.
    gate_out: OutOpt<'a, bf16>,
    cache: Out<'a, bf16>,
    /// rows, k, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages.
    dims: [Dim<'a>; 8],
}

macro_rules! rope_kv {
    ($a:ident) => {
        RopeKv {
            ctx: $a.ctx,
            x: $a.x,
            biases: [$a.bq, $a.bk, $a.bv],
            norm: ($a.wqn, $a.wkn, $a.eps),
            positions: $a.positions,
            inv_freq: $a.inv_freq,
            slot_mapping: $a.slot_mapping,
            q_out: $a.q_out,
            gate_out: $a.gate_out,
            cache: $a.cache,
            dims: [
                $a.rows,
                $a.k,
                $a.heads,
                $a.kv_heads,
                $a.head_dim,
                $a.rotary_dim,
                $a.block_size,
                $a.num_pages,
            ],
        }
    };
}

impl RopeKv<'_> {
    /// This entry is a gated one (q's weight holds each head's `[q | gate]`).
    fn gated(&self) -> bool {
        gated(self.ctx.kernel())
    }

    /// (k, q's weight rows (each head's q and, gated, its gate), k's and v's width).
    fn widths(&self) -> Result<(usize, usize, usize), GpuError> {
        let [_, k, heads, kv_heads, head_dim, ..] = self.dims;
        let head_dim = head_dim.dim()?;
        let q_parts = if self.gated() { 2 } else { 1 };
        Ok((
            k.dim()?,
            size(self.ctx, &[heads.dim()?, q_parts, head_dim])?,
            size(self.ctx, &[kv_heads.dim()?, head_dim])?,
        ))
    }

    /// The projections against the bf16 matrices `w` (q, k, v) as `qkv_mma` stores them, then
    /// `rope_kv_write`'s pass (`qk_norm_rope_kv_write`'s with qk-norm, and gated
    /// `gated_qk_norm_zc_rope_kv_write`'s) into q_out (gate_out) and the cache.
    fn run(self, w: [&[bf16]; 3]) -> Result<(), GpuError> {
        let ctx = self.ctx;
        let gated = self.gated();
        let [rows, _, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages] = self.dims;
        let rows = rows.count();
        let (k, nq, nkv) = self.widths()?;
        let x = self.x.len(size(ctx, &[rows, k])?)?;
        let mut q = vec![bf16::ZERO; size(ctx, &[rows, nq])?];
        let mut kr = vec![bf16::ZERO; size(ctx, &[rows, nkv])?];
        let mut v = vec![bf16::ZERO; size(ctx, &[rows, nkv])?];
        let outputs = [(&mut q, nq), (&mut kr, nkv), (&mut v, nkv)];
        for ((y, n), (w, bias)) in outputs.into_iter().zip(w.into_iter().zip(self.biases)) {
            let w = w.get(..size(ctx, &[n, k])?).ok_or_else(|| {
                ctx.fail(format!("a weight holds {} elements, want {n}·{k}", w.len()))
            })?;
            let bias = bias.len(n)?;
            linear_dots(ctx, x, w, bias, [rows, k, n], y);
        }
        let dims = [rows, heads.dim()?, kv_heads.dim()?, head_dim.dim()?];
        let hd = dims[3];
        // A gated entry splits each head's [q | gate] as attn::gate_split does.
        let q = match (gated, self.gate_out.len(size(ctx, &[rows, dims[1], hd])?)?) {
            (true, Some(gate)) => {
                let mut q_half = vec![bf16::ZERO; gate.len()];
                split_gated(&q, hd, &mut q_half, gate);
                q_half
            }
            (false, None) => q,
            (true, None) => return Err(ctx.fail("a gated entry takes gate_out")),
            (false, Some(_)) => {
                return Err(ctx
                    .fail("gate_out is the gated entries' (gemm::qkv_gated_norm_zc_rope_kv_mma)"))
            }
        };
        let mut pass = HeadPass::over(ctx, &q, &kr, dims);
        let (wqn, wkn, eps) = self.norm;
        // The qk-norm entries take both weights, the plain ones neither.
        let normed = normed(ctx.kernel());
        match (wqn.len(hd)?, wkn.len(hd)?) {
            (Some(_), Some(_)) if normed && hd > NORM_HEAD_DIM_MAX as usize => {
                return Err(ctx.fail(format!(
                    "head_dim {hd} is wider than the {NORM_HEAD_DIM_MAX} a qk-norm block stages"
                )))
            }
            (Some(wqn), Some(wkn)) if normed => {
                pass = pass.normed_by(wqn, wkn, eps);
                if gated {
                    pass = pass.zero_centred();
                }
            }
            (None, None) if !normed => {}
            _ => {
                return Err(ctx.fail(match normed {
                    true => "a qk-norm entry takes both wqn and wkn",
                    false => "wqn and wkn are the qk-norm entries' (gemm::qkv_norm_rope_kv_mma)",
                }))
            }
        }
        let pass = with_rope(pass, self.positions, self.inv_freq, rotary_dim)?;
        let cache = CacheArgs {
            slot_mapping: self.slot_mapping,
            cache: self.cache,
            block_size,
            num_pages,
        };
        pass.into_cache_from(&v, self.q_out, cache)
    }
}

pub(super) fn qkv_rope_kv_mma(a: QkvRopeKvMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (wq, wk, wv) = (a.wq, a.wk, a.wv);
    let c = rope_kv!(a);
    let (k, nq, nkv) = c.widths()?;
    let (wq, wk, wv) = (
        wq.len(size(ctx, &[nq, k])?)?,
        wk.len(size(ctx, &[nkv, k])?)?,
        wv.len(size(ctx, &[nkv, k])?)?,
    );
    c.run([wq, wk, wv])
}

/// The twin of a quantized entry: the bf16 twin on the matrices `numerics::dequant` gives.
fn quant_run(c: RopeKv<'_>, w: [(In<'_, u8>, WeightFormat); 3]) -> Result<(), GpuError> {
    let (k, nq, nkv) = c.widths()?;
    let [(wq, fq), (wk, fk), (wv, fv)] = w;
    let (wq, wk, wv) = (
        dequantised(c.ctx, wq, fq, nq, k)?,
        dequantised(c.ctx, wk, fk, nkv, k)?,
        dequantised(c.ctx, wv, fv, nkv, k)?,
    );
    c.run([&wq, &wk, &wv])
}

pub(super) fn qkv_rope_kv_mma_fp8(a: QkvRopeKvMmaFp8Args<'_>) -> Result<(), GpuError> {
    let w = [
        (a.wq, fp8(a.q_block_n, a.q_block_k)),
        (a.wk, fp8(a.k_block_n, a.k_block_k)),
        (a.wv, fp8(a.v_block_n, a.v_block_k)),
    ];
    quant_run(rope_kv!(a), w)
}

pub(super) fn qkv_rope_kv_mma_int4(a: QkvRopeKvMmaInt4Args<'_>) -> Result<(), GpuError> {
    let w = [
        (a.wq, int4(a.q_group)),
        (a.wk, int4(a.k_group)),
        (a.wv, int4(a.v_group)),
    ];
    quant_run(rope_kv!(a), w)
}
