//! `kv` module (`crates/kernels/cuda/kv.cu`): stores k and v rows in their paged-cache slots.

use half::bf16;
use solder_circuit::ir::MetaField;
use solder_circuit::OpKind;
use solder_gpu_runtime::GpuError;

use super::args::size;
use super::decl::kernel;
use super::grid::per_row;
use super::heads::{Cache, CacheArgs, HeadPass};
use crate::kernels::emit_view::{View, R};

kernel! {
    /// k, v bf16\[rows·kv_heads·head_dim\], slot_mapping i32\[rows\] → cache (one layer's region,
    /// `[num_pages][2][block_size]\[kv_heads\]\[head_dim\]` bf16).
    pub struct KvWrite / KvWriteArgs {
        k: In<bf16>,
        v: In<bf16>,
        slot_mapping: In<i32>,
        cache: InOut<bf16>,
        rows: U32,
        kv_heads: U32,
        head_dim: U32,
        block_size: U32,
        num_pages: U32,
    }
    grid(a) = per_row(a.rows);
    KV_WRITE = "kv::kv_write" => twin kv_write, emit emit_kv_write;
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[KvWrite::DECLS];

fn kv_write(a: KvWriteArgs<'_>) -> Result<(), GpuError> {
    let (rows, kv_heads, head_dim) = (a.rows.count(), a.kv_heads.dim()?, a.head_dim.dim()?);
    let k = a.k.len(size(a.ctx, &[rows, kv_heads, head_dim])?)?;
    let v = a.v.len(k.len())?;
    let pass = HeadPass::k_only(a.ctx, k, rows, kv_heads, head_dim);
    let args = CacheArgs {
        slot_mapping: a.slot_mapping,
        cache: a.cache,
        block_size: a.block_size,
        num_pages: a.num_pages,
    };
    let (mut cache, slot_mapping) = Cache::read(args, &pass)?;
    let kn = cache.row_elems();
    for (r, s) in slot_mapping.iter().enumerate() {
        cache.store(*s, &k[r * kn..(r + 1) * kn], &v[r * kn..(r + 1) * kn]);
    }
    Ok(())
}

fn emit_kv_write(v: &View<'_>) -> R {
    let w = v.op(OpKind::KvWrite, None)?;
    Ok(vec![KvWrite {
        k: v.input(w, 0)?,
        v: v.input(w, 1)?,
        slot_mapping: v.meta(MetaField::SlotMapping),
        cache: v.state_of(w.outputs[0])?,
        rows: v.rows(),
        kv_heads: v.u32(w, "kv_heads")?,
        head_dim: v.u32(w, "head_dim")?,
        block_size: v.kv_block_size(),
        num_pages: v.kv_pages(),
    }
    .launch(KV_WRITE)])
}
