//! `attn` module (`crates/kernels/cuda/attn.cu`): paged attention over one layer's KV cache
//! region, and the gate split of Qwen3-Next's gated attention.
//!
//! Twins of `paged_decode` and `paged_causal`: the same arithmetic (`attend`), row r over its
//! sequence's first seq_lens\[r\] tokens, or with a sliding window W over the last W of them
//! (tokens `len - W..len`; the pages before are never read nor checked); causality comes from
//! the lengths. The GPU's
//! cross-block scratch is checked for its length and otherwise left alone: the twin attends in
//! one pass.

use half::bf16;
use solder_circuit::ir::{MetaField, Op};
use solder_circuit::OpKind;
use solder_gpu_runtime::{par_chunks_mut, GpuError, LaunchConfig, TwinCtx};

use super::act::gate_in_place;
use super::args::{macs, size, threads_for, Dim, In, Out};
use super::decl::{kernel, Name};
use super::grid::elementwise;
use crate::error::ExecError;
use crate::kernels::emit_view::{View, R};
use crate::numerics::{attend, AttendScratch};

pub mod fold;
pub use fold::{PagedAttentionO, PAGED_CAUSAL_O, PAGED_DECODE_O};

/// Threads of an attention block: 8 warps split one block's share of a (head, row)'s context
/// and merge in shared memory (static, about 9 KiB).
const ATTN_THREADS: u32 = 256;

/// Blocks per (head, row) (flash-decoding): a long context is cut into at most this many
/// chunks, one per block, whose partials the last block to finish merges. Must equal
/// `ATTN_SPLITS` in `crates/kernels/cuda/attn.cu`.
pub const ATTN_SPLITS: u32 = 16;

/// The largest head_dim the attention kernels take (`crates/kernels/cuda/attn.cu`
/// `ATTN_MAX_HEAD_DIM`).
pub const ATTN_MAX_HEAD_DIM: u32 = 256;

/// Bytes of the attention scratch for `rows · heads` (head, row) pairs: per pair, in
/// `(r · heads + h)` order, one u32 arrival counter, then `ATTN_SPLITS` partials of
/// `head_dim + 2` f32 (max, sum, acc\[head_dim\]). The counter sits inside its pair's slot so
/// its address does not depend on the row count: every plan of an exec shares the region and
/// no plan's partials ever cover another plan's counter.
pub fn scratch_bytes(rows: usize, heads: usize, head_dim: usize) -> usize {
    rows * heads * (1 + ATTN_SPLITS as usize * (head_dim + 2)) * 4
}

/// Scratch bytes of `circuit`'s attention ops at `max_rows` (largest heads and head_dim; zero
/// without attention). Every attention op of a circuit has the model's heads and head_dim, so
/// all of them agree on where each (head, row)'s counter lies.
pub fn scratch_max(circuit: &solder_circuit::ir::Circuit, max_rows: usize) -> usize {
    let heads = super::attrs::widest(circuit, OpKind::Attention, None, "heads");
    let head_dim = super::attrs::widest(circuit, OpKind::Attention, None, "head_dim");
    if heads == 0 || head_dim == 0 {
        return 0;
    }
    scratch_bytes(max_rows, heads, head_dim)
}

/// `ATTN_SPLITS` blocks per (head, row); the kernels read `head_dim <= 256`.
fn attn_config(rows: u32, heads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [heads.max(1), rows.max(1), ATTN_SPLITS],
        block: [ATTN_THREADS, 1, 1],
        shared_bytes: 0,
    }
}

kernel! {
    /// Paged attention: q bf16\[rows·heads·head_dim\], block_tables i32\[rows·max_blocks\],
    /// seq_lens i32\[rows\] → out bf16\[rows·heads·head_dim\], through `scratch`
    /// (`scratch_bytes`, counters zero before the launch and left zero after it).
    /// `ATTN_SPLITS` blocks of 8 warps per (head, row). `paged_decode` takes one query row per
    /// sequence; `paged_causal` (verify: row r attends to its sequence's first seq_lens\[r\]
    /// tokens) runs the same launch and arithmetic for now (sharing K/V tiles across a kv
    /// head's query rows is the follow-up). `window`: the layer's sliding window in tokens
    /// (the last `window` tokens attended), 0 for full causal attention. `gate`
    /// (bf16\[rows·heads·head_dim\], Qwen3-Next's gated attention): `out` is stored times
    /// sigmoid(gate), as `act::sigmoid_mul` stores it.
    pub struct PagedAttention / PagedAttentionArgs {
        q: In<bf16>,
        cache: In<bf16>,
        block_tables: In<i32>,
        seq_lens: In<i32>,
        gate: InOpt<bf16>,
        out: Out<bf16>,
        scratch: InOut<f32>,
        rows: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        block_size: U32,
        max_blocks: U32,
        num_pages: U32,
        window: U32,
        scale: F32,
    }
    grid(a) = attn_config(a.rows, a.heads);
    PAGED_DECODE = "attn::paged_decode" => twin paged_attention, emit emit_paged_decode;
    PAGED_CAUSAL = "attn::paged_causal" => twin paged_attention, emit emit_paged_causal;
}

kernel! {
    /// Splits a gated q projection (Qwen3-Next): q2 bf16\[rows·heads·2·head_dim\], each head
    /// `[q | gate]` → q, gate bf16\[rows·heads·head_dim\]. Elementwise.
    pub struct GateSplit / GateSplitArgs {
        q2: In<bf16>,
        q: Out<bf16>,
        gate: Out<bf16>,
        rows: U32,
        heads: U32,
        head_dim: U32,
    }
    grid(a) = elementwise(a.rows as u64 * a.heads as u64 * a.head_dim as u64);
    GATE_SPLIT = "attn::gate_split" => twin gate_split, emit emit_gate_split;
}

/// The lever that launches `paged_decode` as its `_prefetch` entry (A/B timing; the same bytes).
pub const ATTN_PREFETCH: &str = "attn_prefetch";

/// `paged_decode` with its loads issued ahead of their use (attn.cu, kPrefetch): the next
/// tile's page-table entry read (and its K/V rows asked of L2) before the tile is consumed,
/// each key's K row 4 16-byte chunks at a time, V 16 bytes a lane for 4 keys at once. The same
/// arguments, twin and bytes (the same arithmetic in the same order).
pub const PAGED_DECODE_PREFETCH: Name<PagedAttention> = Name::new("attn::paged_decode_prefetch");

/// Entries of attention kernels besides their own, with the kernel they are variants of.
pub(super) const VARIANTS: &[(&str, &str)] =
    &[(PAGED_DECODE_PREFETCH.as_str(), PAGED_DECODE.as_str())];

pub(super) const DECLS: &[&[super::KernelDecl]] = &[
    PagedAttention::DECLS,
    GateSplit::DECLS,
    fold::PagedAttentionO::DECLS,
];

// ---- twins ---------------------------------------------------------------------------------

fn paged_attention(a: PagedAttentionArgs<'_>) -> Result<(), GpuError> {
    let dims = attn_dims!(a);
    let attention = Attention::check(a.ctx, [a.q, a.cache], [a.block_tables, a.seq_lens], dims)?;
    let gate = a.gate.len(attention.out_len())?;
    let out = a.out.len(attention.out_len())?;
    attention.check_scratch(a.scratch)?;
    attention.run(a.scale, out)?;
    if let Some(gate) = gate {
        gate_in_place(out, gate);
    }
    Ok(())
}

/// The scalar arguments every attention kernel shares.
pub(super) struct AttnDims<'c> {
    pub rows: Dim<'c>,
    pub heads: Dim<'c>,
    pub kv_heads: Dim<'c>,
    pub head_dim: Dim<'c>,
    pub block_size: Dim<'c>,
    pub max_blocks: Dim<'c>,
    pub num_pages: Dim<'c>,
    pub window: Dim<'c>,
}

/// The `AttnDims` of a launch view that has every field of it (`PagedAttentionArgs`,
/// `PagedAttentionOArgs`).
macro_rules! attn_dims {
    ($a:expr) => {
        $crate::kernels::attn::AttnDims {
            rows: $a.rows,
            heads: $a.heads,
            kv_heads: $a.kv_heads,
            head_dim: $a.head_dim,
            block_size: $a.block_size,
            max_blocks: $a.max_blocks,
            num_pages: $a.num_pages,
            window: $a.window,
        }
    };
}
pub(super) use attn_dims;

/// The paged KV cache attention op `a` reads (its input 1, a KV state).
pub(super) fn kv_cache_of(v: &View<'_>, a: &Op) -> Result<super::Buf, ExecError> {
    let kv_edge = *a
        .inputs
        .get(1)
        .ok_or_else(|| v.err(format!("`{}` reads no KV state", a.name)))?;
    v.state_of(kv_edge)
}

/// An attention launch's inputs, checked (`paged_decode`/`paged_causal` and the o-fold
/// kernels share them): `run` attends every (row, head) into a bf16 output.
pub(super) struct Attention<'c> {
    pub(super) ctx: &'c TwinCtx<'c>,
    pub(super) q: &'c [bf16],
    pub(super) cache: &'c [bf16],
    pub(super) block_tables: &'c [i32],
    pub(super) seq_lens: &'c [i32],
    pub rows: usize,
    pub heads: usize,
    pub(super) kv_heads: usize,
    pub head_dim: usize,
    pub(super) block_size: usize,
    pub(super) max_blocks: usize,
    pub(super) num_pages: usize,
    pub(super) window: usize,
}

impl<'c> Attention<'c> {
    /// Checks the dimensions and the lengths of q, the cache, the block tables and seq_lens.
    pub(super) fn check(
        ctx: &'c TwinCtx<'c>,
        [q, cache]: [In<'c, bf16>; 2],
        [block_tables, seq_lens]: [In<'c, i32>; 2],
        d: AttnDims<'c>,
    ) -> Result<Attention<'c>, GpuError> {
        let rows = d.rows.count();
        let (heads, kv_heads, head_dim) = (d.heads.dim()?, d.kv_heads.dim()?, d.head_dim.dim()?);
        // The CUDA kernel keeps a head's accumulators on chip: refuse what it could not run.
        if head_dim > ATTN_MAX_HEAD_DIM as usize {
            return Err(d.head_dim.bad(format!(
                "head_dim {head_dim} above the kernels' {ATTN_MAX_HEAD_DIM}"
            )));
        }
        let (block_size, max_blocks, num_pages) =
            (d.block_size.dim()?, d.max_blocks.dim()?, d.num_pages.dim()?);
        if heads % kv_heads != 0 {
            return Err(d
                .kv_heads
                .bad(format!("kv_heads {kv_heads} does not divide heads {heads}")));
        }
        let q = q.len(size(ctx, &[rows, heads, head_dim])?)?;
        let cache = cache.len(size(ctx, &[num_pages, 2, block_size, kv_heads * head_dim])?)?;
        let block_tables = block_tables.len(size(ctx, &[rows, max_blocks])?)?;
        let seq_lens = seq_lens.len(rows)?;
        Ok(Attention {
            ctx,
            q,
            cache,
            block_tables,
            seq_lens,
            rows,
            heads,
            kv_heads,
            head_dim,
            block_size,
            max_blocks,
            num_pages,
            window: d.window.count(),
        })
    }

    /// Elements of the output: `[rows]\[heads\]\[head_dim\]`.
    pub(super) fn out_len(&self) -> usize {
        self.q.len()
    }

    /// The cross-block scratch must hold `scratch_bytes` (the twin attends in one pass and
    /// leaves it alone).
    pub(super) fn check_scratch(&self, scratch: Out<'_, f32>) -> Result<(), GpuError> {
        // Per (head, row): a u32 counter, then ATTN_SPLITS partials of head_dim + 2 f32.
        let slot_words = size(self.ctx, &[ATTN_SPLITS as usize, self.head_dim + 2])? + 1;
        scratch.len(size(self.ctx, &[self.rows, self.heads, slot_words])?)?;
        Ok(())
    }

    /// Checks every row's length and pages, then attends each (row, head) into
    /// `out\[(r · heads + h) · head_dim..\]`, rounded to bf16 (`numerics::attend`).
    pub(super) fn run(&self, scale: f32, out: &mut [bf16]) -> Result<(), GpuError> {
        let ctx = self.ctx;
        let (heads, head_dim, block_size, max_blocks) =
            (self.heads, self.head_dim, self.block_size, self.max_blocks);
        let (window, num_pages) = (self.window, self.num_pages);
        let capacity = size(ctx, &[max_blocks, block_size])?;
        let mut work = 0usize;
        for (r, len) in self.seq_lens.iter().enumerate() {
            if *len < 1 || *len as usize > capacity {
                return Err(ctx.fail(format!("row {r}: seq_len {len} outside 1..={capacity}")));
            }
            let len = *len as usize;
            let first_block = window_start(len, window) / block_size;
            let blocks = &self.block_tables[r * max_blocks..][..len.div_ceil(block_size)];
            if let Some((b, page)) = blocks
                .iter()
                .enumerate()
                .skip(first_block)
                .find(|(_, p)| **p < 0 || **p as usize >= num_pages)
            {
                return Err(ctx.fail(format!(
                    "row {r}: block {b} names page {page}, the cache has {num_pages}"
                )));
            }
            work =
                work.saturating_add(macs(&[2, len - window_start(len, window), heads, head_dim]));
        }

        let group = heads / self.kv_heads;
        let row_elems = self.kv_heads * head_dim;
        let threads = threads_for(ctx, work);
        let (q, cache, block_tables, seq_lens) =
            (self.q, self.cache, self.block_tables, self.seq_lens);
        // Where token j of row r keeps its k (part 0) or v (part 1) for kv head `kvh`.
        let at = move |r: usize, j: usize, part: usize, kvh: usize| {
            let page = block_tables[r * max_blocks + j / block_size] as usize;
            let start =
                ((page * 2 + part) * block_size + j % block_size) * row_elems + kvh * head_dim;
            &cache[start..start + head_dim]
        };
        par_chunks_mut(out, head_dim, threads, |index, out_head| {
            let (r, h) = (index / heads, index % heads);
            let kvh = h / group;
            let q_head = &q[index * head_dim..(index + 1) * head_dim];
            let mut scratch = AttendScratch::default();
            let len = seq_lens[r] as usize;
            let first = window_start(len, window);
            attend(
                q_head,
                len - first,
                scale,
                (|j| at(r, first + j, 0, kvh), |j| at(r, first + j, 1, kvh)),
                &mut scratch,
                out_head,
            );
        });
        Ok(())
    }
}

/// The first token a row of `len` tokens attends to under `window` (0: none): the last
/// `window` tokens, as the CUDA kernels.
pub(super) fn window_start(len: usize, window: usize) -> usize {
    if window == 0 {
        0
    } else {
        len.saturating_sub(window)
    }
}

/// Each head of q2 is `[q | gate]`.
fn gate_split(a: GateSplitArgs<'_>) -> Result<(), GpuError> {
    let (rows, heads, head_dim) = (a.rows.count(), a.heads.dim()?, a.head_dim.dim()?);
    let n = size(a.ctx, &[rows, heads, head_dim])?;
    let q2 = a.q2.len(size(a.ctx, &[n, 2])?)?;
    let q = a.q.len(n)?;
    let gate = a.gate.len(n)?;
    super::heads::split_gated(q2, head_dim, q, gate);
    Ok(())
}

// ---- emitters ------------------------------------------------------------------------------

fn emit_paged_decode(v: &View<'_>) -> R {
    let entry = if v.lever(ATTN_PREFETCH) {
        PAGED_DECODE_PREFETCH
    } else {
        PAGED_DECODE
    };
    attention_of(v, entry)
}

fn emit_paged_causal(v: &View<'_>) -> R {
    attention_of(v, PAGED_CAUSAL)
}

fn attention_of(v: &View<'_>, kernel: Name<PagedAttention>) -> R {
    let a = v.op(OpKind::Attention, None)?;
    let (heads, head_dim) = (v.u32(a, "heads")?, v.u32(a, "head_dim")?);
    let (gate, out) = gated_out(v, a)?;
    Ok(vec![PagedAttention {
        q: v.input(a, 0)?,
        cache: kv_cache_of(v, a)?,
        block_tables: v.meta(MetaField::BlockTables),
        seq_lens: v.meta(MetaField::SeqLens),
        gate,
        out,
        scratch: v.attn_scratch(heads as usize, head_dim as usize),
        rows: v.rows(),
        heads,
        kv_heads: v.u32(a, "kv_heads")?,
        head_dim,
        block_size: v.kv_block_size(),
        max_blocks: v.max_blocks(),
        num_pages: v.kv_pages(),
        window: window_of(v, a)?,
        scale: v.f32(a, "scale")?,
    }
    .launch(kernel)])
}

/// The group's output gate (Qwen3-Next's gated attention): the gate buffer and the
/// `sigmoid_mul` op when the group holds one, which must read attention `a`'s output; `None`
/// without one. (Its output is stored by the plain kernels, `gated_out`, and fused away in
/// the o-fold's.)
pub(super) fn gate_of<'a>(v: &View<'a>, a: &Op) -> Result<Option<(super::Buf, &'a Op)>, ExecError> {
    if !v.has(OpKind::SigmoidMul) {
        return Ok(None);
    }
    let s = v.op(OpKind::SigmoidMul, None)?;
    if v.producer_in_group(s, 0)?.name != a.name {
        return Err(v.err(format!("`{}` does not gate `{}`'s output", s.name, a.name)));
    }
    Ok(Some((v.input(s, 1)?, s)))
}

/// What an attention kernel stores: the gate and `sigmoid_mul`'s output when the group gates
/// attention `a` (`gate_of`), else no gate and `a`'s own output.
pub(super) fn gated_out(
    v: &View<'_>,
    a: &Op,
) -> Result<(Option<super::Buf>, super::Buf), ExecError> {
    Ok(match gate_of(v, a)? {
        Some((gate, s)) => (Some(gate), v.output(s, 0)?),
        None => (None, v.output(a, 0)?),
    })
}

/// An attention op's sliding window: only windowed layers' ops carry the attribute; 0 is full
/// causal attention.
pub(super) fn window_of(v: &View<'_>, a: &Op) -> Result<u32, ExecError> {
    match a.attrs.iter().any(|(key, _)| key == "window") {
        true => v.u32(a, "window"),
        false => Ok(0),
    }
}

fn emit_gate_split(v: &View<'_>) -> R {
    let g = v.op(OpKind::AttnGateSplit, None)?;
    Ok(vec![GateSplit {
        q2: v.input(g, 0)?,
        q: v.output(g, 0)?,
        gate: v.output(g, 1)?,
        rows: v.rows(),
        heads: v.u32(g, "heads")?,
        head_dim: v.u32(g, "head_dim")?,
    }
    .launch(GATE_SPLIT)])
}
