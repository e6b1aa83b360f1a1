//! The emitter of `qkv_rope_kv_mma`: the entry of the group's layout (plain, qk-norm, gated),
//! tile and weight format, with its arguments.

use super::*;

/// `launch_in_layout` for each format's arguments: the entry of `layout` (plain, qk-norm,
/// gated) among `entries[0]`, its `_narrow` variant among `entries[1]` in `narrow_config` for
/// `QkvTile::Narrow`, or its `_large` one among `entries[2]` in `qkv_rope_kv_large_grid` for
/// `QkvTile::Large`.
macro_rules! layout_launch {
    ($($args:ty),+) => {
        $(
            impl $args {
                fn launch_in_layout(
                    self,
                    entries: [[Name<$args>; 3]; 3],
                    layout: usize,
                    tile: QkvTile,
                ) -> Launch {
                    match tile {
                        QkvTile::Large => {
                            let dims = [self.heads, self.kv_heads, self.head_dim, self.rotary_dim];
                            let config = qkv_rope_kv_large_grid(dims, self.rows, layout != 0);
                            self.launch_with(entries[2][layout], config)
                        }
                        QkvTile::Narrow => {
                            let config = narrow_config(self.config());
                            self.launch_with(entries[1][layout], config)
                        }
                        QkvTile::Wide => self.launch_with(entries[0][layout], self.config()),
                    }
                }
            }
        )+
    };
}
layout_launch!(QkvRopeKvMma, QkvRopeKvMmaFp8, QkvRopeKvMmaInt4);

/// The bf16 entry of `layout` (plain, qk-norm, gated) in `tile`.
fn bf16_launch(a: QkvRopeKvMma, layout: usize, tile: QkvTile) -> Launch {
    a.launch_in_layout(
        [
            [
                QKV_ROPE_KV_MMA,
                QKV_NORM_ROPE_KV_MMA,
                QKV_GATED_NORM_ZC_ROPE_KV_MMA,
            ],
            [
                QKV_ROPE_KV_MMA_NARROW,
                QKV_NORM_ROPE_KV_MMA_NARROW,
                QKV_GATED_NORM_ZC_ROPE_KV_MMA_NARROW,
            ],
            [
                QKV_ROPE_KV_MMA_LARGE,
                QKV_NORM_ROPE_KV_MMA_LARGE,
                QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE,
            ],
        ],
        layout,
        tile,
    )
}

/// `qkv_rope_kv_mma`, or its entry for the weights' format.
pub(super) fn emit_qkv_rope_kv_mma(v: &View<'_>) -> R {
    let p = projections(v)?;
    let ([wq, wk, wv], [bq, bk, bv]) = (p.w, p.bias);
    let rope = v.op(OpKind::Rope, None)?;
    let write = v.op(OpKind::KvWrite, None)?;
    let (x, rows, k) = (v.input(p.q_op, 0)?, v.rows(), p.k);
    let (positions, inv_freq) = (v.meta(MetaField::Positions), v.inv_freq());
    let slot_mapping = v.meta(MetaField::SlotMapping);
    let (q_out, cache) = (v.output(rope, 0)?, v.state_of(write.outputs[0])?);
    let (heads, kv_heads) = (v.u32(rope, "heads")?, v.u32(rope, "kv_heads")?);
    let (head_dim, rotary_dim) = (v.u32(rope, "head_dim")?, v.u32(rope, "rotary_dim")?);
    let (block_size, num_pages) = (v.kv_block_size(), v.kv_pages());
    // qk-norm models: q and k normed in the same launch (one block per head); Qwen3-Next's
    // gated attention with its zero-centred qk-norm in the gated entry.
    let norm_op = [OpKind::QkNorm, OpKind::QkNormZc]
        .into_iter()
        .find(|kind| v.has(*kind));
    let norm = match norm_op {
        Some(_) if head_dim > NORM_HEAD_DIM_MAX => {
            return Err(v.err(format!(
                "head_dim {head_dim} is wider than the {NORM_HEAD_DIM_MAX} a qk-norm block stages"
            )))
        }
        Some(kind) => {
            let n = v.op(kind, None)?;
            Some((v.weight(n, 0)?, v.weight(n, 1)?, v.f32(n, "eps")?))
        }
        None => None,
    };
    let gate = match v.has(OpKind::AttnGateSplit) {
        true => Some(v.output(v.op(OpKind::AttnGateSplit, None)?, 1)?),
        false => None,
    };
    // The gated entry's norm is zero-centred, the qk-norm entry's plain.
    if gate.is_some() != (norm_op == Some(OpKind::QkNormZc)) {
        return Err(v.err(
            "gemm::qkv_rope_kv_mma takes a gate split only with the zero-centred qk-norm \
             (qwen3_next), and that norm only with the gate split"
                .to_string(),
        ));
    }
    let parts = QkvRopeKvParts {
        x,
        w: [wq, wk, wv],
        bias: [bq, bk, bv],
        norm,
        gate,
        positions,
        inv_freq,
        slot_mapping,
        q_out,
        cache,
        dims: [
            rows, k, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages,
        ],
    };
    let formats = p.ops.map(|op| v.weight_format(op, 0));
    let dims = [heads, kv_heads, head_dim, rotary_dim];
    let large = qkv_rope_kv_large_grid(dims, rows, norm.is_some());
    let tile = match super::super::super::large_config(v, large) {
        Some(_) => QkvTile::Large,
        None if super::super::super::narrow(v) => QkvTile::Narrow,
        None => QkvTile::Wide,
    };
    match parts.launch_tile(formats, tile) {
        Some(launch) => Ok(vec![launch]),
        None => Err(super::super::mixed_formats(
            v,
            QKV_ROPE_KV_MMA.as_str(),
            &formats,
        )),
    }
}

/// Every `qkv_rope_kv_mma` entry's arguments but the quantized weights' parameters (which
/// `launch` takes from their formats): what the emitter and the tests build a launch from.
#[derive(Debug, Clone, Copy)]
pub struct QkvRopeKvParts {
    pub x: Buf,
    /// q, k and v (bf16, or blobs of one quantized kind).
    pub w: [Buf; 3],
    pub bias: [Option<Buf>; 3],
    /// qk-norm's weights (q, k) and epsilon: the qk-norm entry.
    pub norm: Option<(Buf, Buf, f32)>,
    /// The gate halves' destination: the gated entry (with `norm`, its weights zero-centred).
    pub gate: Option<Buf>,
    pub positions: Buf,
    pub inv_freq: Buf,
    pub slot_mapping: Buf,
    pub q_out: Buf,
    pub cache: Buf,
    /// rows, k, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages.
    pub dims: [u32; 8],
}

impl QkvRopeKvParts {
    /// The launch of the entry for `formats` (all bf16, or one quantized kind), its qk-norm
    /// variant with `norm`, its gated one with `gate`; `None` when the formats mix kinds.
    pub fn launch(self, formats: [WeightFormat; 3]) -> Option<Launch> {
        self.launch_narrow(formats, false)
    }

    /// `launch`, through the layout's `_narrow` entry in the weights' format when `narrow`.
    pub fn launch_narrow(self, formats: [WeightFormat; 3], narrow: bool) -> Option<Launch> {
        let tile = if narrow {
            QkvTile::Narrow
        } else {
            QkvTile::Wide
        };
        self.launch_tile(formats, tile)
    }

    /// `launch` in `tile`.
    pub fn launch_tile(self, formats: [WeightFormat; 3], tile: QkvTile) -> Option<Launch> {
        let Self {
            x,
            w: [wq, wk, wv],
            bias: [bq, bk, bv],
            norm,
            gate,
            positions,
            inv_freq,
            slot_mapping,
            q_out,
            cache,
            dims: [rows, k, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages],
        } = self;
        let gate_out = gate;
        let (wqn, wkn, eps) = match norm {
            Some((wqn, wkn, eps)) => (Some(wqn), Some(wkn), eps),
            None => (None, None, 0.0),
        };
        // The layout: plain, qk-norm, or gated with (zero-centred) qk-norm.
        let layout = match (norm.is_some(), gate.is_some()) {
            (_, true) => 2,
            (true, false) => 1,
            (false, false) => 0,
        };
        use WeightFormat::{Bf16, Fp8, Int4};
        Some(match formats {
            [Bf16, Bf16, Bf16] => bf16_launch(
                QkvRopeKvMma {
                    x,
                    wq,
                    bq,
                    wk,
                    bk,
                    wv,
                    bv,
                    wqn,
                    wkn,
                    positions,
                    inv_freq,
                    slot_mapping,
                    q_out,
                    gate_out,
                    cache,
                    rows,
                    k,
                    heads,
                    kv_heads,
                    head_dim,
                    rotary_dim,
                    block_size,
                    num_pages,
                    eps,
                },
                layout,
                tile,
            ),
            [Fp8 {
                block_n: q_block_n,
                block_k: q_block_k,
            }, Fp8 {
                block_n: k_block_n,
                block_k: k_block_k,
            }, Fp8 {
                block_n: v_block_n,
                block_k: v_block_k,
            }] => QkvRopeKvMmaFp8 {
                x,
                wq,
                bq,
                wk,
                bk,
                wv,
                bv,
                wqn,
                wkn,
                positions,
                inv_freq,
                slot_mapping,
                q_out,
                gate_out,
                cache,
                rows,
                k,
                heads,
                kv_heads,
                head_dim,
                rotary_dim,
                block_size,
                num_pages,
                eps,
                q_block_n,
                q_block_k,
                k_block_n,
                k_block_k,
                v_block_n,
                v_block_k,
            }
            .launch_in_layout(
                [
                    [
                        QKV_ROPE_KV_MMA_FP8,
                        QKV_NORM_ROPE_KV_MMA_FP8,
                        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8,
                    ],
                    [
                        QKV_ROPE_KV_MMA_FP8_NARROW,
                        QKV_NORM_ROPE_KV_MMA_FP8_NARROW,
                        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_NARROW,
                    ],
                    [
                        QKV_ROPE_KV_MMA_FP8_LARGE,
                        QKV_NORM_ROPE_KV_MMA_FP8_LARGE,
                        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_LARGE,
                    ],
                ],
                layout,
                tile,
            ),
            [Int4 { group: q_group }, Int4 { group: k_group }, Int4 { group: v_group }] => {
                QkvRopeKvMmaInt4 {
                    x,
                    wq,
                    bq,
                    wk,
                    bk,
                    wv,
                    bv,
                    wqn,
                    wkn,
                    positions,
                    inv_freq,
                    slot_mapping,
                    q_out,
                    gate_out,
                    cache,
                    rows,
                    k,
                    heads,
                    kv_heads,
                    head_dim,
                    rotary_dim,
                    block_size,
                    num_pages,
                    eps,
                    q_group,
                    k_group,
                    v_group,
                }
                .launch_in_layout(
                    [
                        [
                            QKV_ROPE_KV_MMA_INT4,
                            QKV_NORM_ROPE_KV_MMA_INT4,
                            QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4,
                        ],
                        [
                            QKV_ROPE_KV_MMA_INT4_NARROW,
                            QKV_NORM_ROPE_KV_MMA_INT4_NARROW,
                            QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_NARROW,
                        ],
                        [
                            QKV_ROPE_KV_MMA_INT4_LARGE,
                            QKV_NORM_ROPE_KV_MMA_INT4_LARGE,
                            QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_LARGE,
                        ],
                    ],
                    layout,
                    tile,
                )
            }
            _ => return None,
        })
    }
}
