//! `flash` module (`crates/kernels/cuda/flash.cu`): paged attention on the tensor cores, the
//! `tensor_cores` lever's attention in every mode (FlashAttention-2's tiling over the paged KV
//! cache: 32-key tiles staged once for up to 64 (row, head) pairs, `mma.sync` for Q·Kᵀ and P·V,
//! an online softmax per pair).
//!
//! Launch: `grid` = (heads / pack, ⌈rows / R⌉, `FLASH_SPLITS`), 128 threads; pack = the heads of
//! one kv head (1 above 64), R = `rows_per_block`: 64 / pack for programs whose rows are one
//! sequence's tokens (verify, prefill), whose blocks read every key through one row's block
//! table, and 1 for every other mode. Entries by head_dim: `paged_mma` (<= 64), `_128`, `_256`.
//!
//! Twin: `numerics::attend_mma` for each (row, head): its bytes depend on the row's keys and
//! length alone (the chunks and tiles sit at absolute key positions), never on the program's
//! width, the row's place or R — but for a non-finite value in a key staged beside the row's
//! own (see flash.cu), which the twin models too (the keys its block stages). One task per
//! (block, kv head) widens the block's staged keys and values once (`numerics::KvTiles`) for
//! all its (row, head) pairs, as the kernel stages each K and V tile once for its block.

use half::bf16;
use solder_circuit::ir::MetaField;
use solder_circuit::{Mode, OpKind};
use solder_gpu_runtime::{par_chunks_mut, GpuError, LaunchConfig};

use super::act::gate_in_place;
use super::args::{macs, size, threads_for};
use super::attn::{attn_dims, gated_out, kv_cache_of, window_of, window_start, Attention};
use super::decl::{kernel, Name};
use crate::kernels::emit_view::{View, R};
use crate::numerics::{attend_mma, FlashScratch, Kv, KvTiles, FLASH_SPLITS};

/// Threads of a block: four warps of 16 (row, head) slots each.
pub const FLASH_THREADS: u32 = 128;
/// (row, head) slots of a block.
pub const FLASH_SLOTS: u32 = 64;

/// Heads a block holds: the query heads of one kv head, or 1 when there are more than 64.
pub fn pack(heads: u32, kv_heads: u32) -> u32 {
    let group = heads / kv_heads.max(1);
    if (1..=FLASH_SLOTS).contains(&group) {
        group
    } else {
        1
    }
}

/// The launch of `rows` rows, `rows_per_block` of them per block.
fn flash_config(rows: u32, heads: u32, kv_heads: u32, rows_per_block: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [
            (heads / pack(heads, kv_heads)).max(1),
            rows.div_ceil(rows_per_block.max(1)).max(1),
            FLASH_SPLITS as u32,
        ],
        block: [FLASH_THREADS, 1, 1],
        shared_bytes: 0,
    }
}

kernel! {
    /// Paged attention on the tensor cores: q bf16\[rows·heads·head_dim\], block_tables
    /// i32\[rows·max_blocks\], seq_lens i32\[rows\] → out bf16\[rows·heads·head_dim\], through
    /// `scratch` (attn's `scratch_bytes`: chunk partials and counters, zero before the launch and
    /// after it). `window`: the layer's sliding window, 0 for none. `rows_per_block`: rows a
    /// block takes (1, or up to 64 / pack when the rows are one sequence's tokens). `gate`
    /// (bf16\[rows·heads·head_dim\], Qwen3-Next's gated attention): `out` is stored times
    /// sigmoid(gate), as `act::sigmoid_mul` stores it.
    pub struct PagedMma / PagedMmaArgs {
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
        rows_per_block: U32,
    }
    grid(a) = flash_config(a.rows, a.heads, a.kv_heads, a.rows_per_block);
    PAGED_MMA = "flash::paged_mma" => twin paged_mma, emit emit_paged_mma;
}

/// `paged_mma` for head_dim <= 128 (q staged in shared memory at that width).
pub const PAGED_MMA_128: Name<PagedMma> = Name::new("flash::paged_mma_128");
/// `paged_mma` for head_dim <= 256 (q fragments read from global memory for each tile).
pub const PAGED_MMA_256: Name<PagedMma> = Name::new("flash::paged_mma_256");

/// Entries of `paged_mma` by the head_dim they take.
pub(super) const VARIANTS: &[(&str, &str)] = &[
    (PAGED_MMA_128.as_str(), PAGED_MMA.as_str()),
    (PAGED_MMA_256.as_str(), PAGED_MMA.as_str()),
];

pub(super) const DECLS: &[&[super::KernelDecl]] = &[PagedMma::DECLS];

/// The entry for `head_dim` (the kernels take up to 256, as attn's).
pub fn entry(head_dim: u32) -> Name<PagedMma> {
    match head_dim {
        0..=64 => PAGED_MMA,
        65..=128 => PAGED_MMA_128,
        _ => PAGED_MMA_256,
    }
}

// ---- twin ----------------------------------------------------------------------------------

fn paged_mma(a: PagedMmaArgs<'_>) -> Result<(), GpuError> {
    let dims = attn_dims!(a);
    let attention = Attention::check(a.ctx, [a.q, a.cache], [a.block_tables, a.seq_lens], dims)?;
    let gate = a.gate.len(attention.out_len())?;
    let out = a.out.len(attention.out_len())?;
    attention.check_scratch(a.scratch)?;
    let pack = pack(attention.heads as u32, attention.kv_heads as u32) as usize;
    let per_block = a.rows_per_block.count();
    if per_block == 0 || per_block * pack > FLASH_SLOTS as usize {
        return Err(a.rows_per_block.bad(format!(
            "rows_per_block {per_block}: 1 to {} rows of {pack} heads fit a block's {FLASH_SLOTS} slots",
            FLASH_SLOTS as usize / pack
        )));
    }
    run(&attention, a.scale, per_block, out)?;
    if let Some(gate) = gate {
        gate_in_place(out, gate);
    }
    Ok(())
}

/// A block's staged keys and the row whose block table they are read through.
struct Staged {
    anchor: usize,
    keys: std::ops::Range<usize>,
}

/// Checks every row's length and the pages its block stages, then attends each (row, head).
fn run(at: &Attention<'_>, scale: f32, per_block: usize, out: &mut [bf16]) -> Result<(), GpuError> {
    let ctx = at.ctx;
    let (heads, head_dim, block_size, max_blocks) =
        (at.heads, at.head_dim, at.block_size, at.max_blocks);
    let capacity = size(ctx, &[max_blocks, block_size])?;
    let mut work = 0usize;
    for (r, len) in at.seq_lens.iter().enumerate() {
        if *len < 1 || *len as usize > capacity {
            return Err(ctx.fail(format!("row {r}: seq_len {len} outside 1..={capacity}")));
        }
        let len = *len as usize;
        work = work.saturating_add(macs(&[
            2,
            len - window_start(len, at.window),
            heads,
            head_dim,
        ]));
    }
    // Each block's anchor (its first longest row) and staged keys (min first .. max len).
    let mut blocks = Vec::with_capacity(at.rows.div_ceil(per_block));
    for (y, lens) in at.seq_lens.chunks(per_block).enumerate() {
        let (mut anchor, mut end, mut begin) = (y * per_block, 0usize, usize::MAX);
        for (i, len) in lens.iter().enumerate() {
            let len = *len as usize;
            if len > end {
                (anchor, end) = (y * per_block + i, len);
            }
            begin = begin.min(window_start(len, at.window));
        }
        let table = &at.block_tables[anchor * max_blocks..][..end.div_ceil(block_size)];
        if let Some((b, page)) = table
            .iter()
            .enumerate()
            .skip(begin / block_size)
            .find(|(_, p)| **p < 0 || **p as usize >= at.num_pages)
        {
            return Err(ctx.fail(format!(
                "row {anchor} (the block of rows {}..): block {b} names page {page}, the cache has {}",
                y * per_block,
                at.num_pages
            )));
        }
        blocks.push(Staged {
            anchor,
            keys: begin..end,
        });
    }

    let group = heads / at.kv_heads;
    let row_elems = at.kv_heads * head_dim;
    let (q, cache, block_tables, seq_lens, window) =
        (at.q, at.cache, at.block_tables, at.seq_lens, at.window);
    // Where token j of the anchor row r keeps its k (part 0) or v (part 1) for kv head `kvh`.
    let kv = move |r: usize, j: usize, part: usize, kvh: usize| {
        let page = block_tables[r * max_blocks + j / block_size] as usize;
        let start = ((page * 2 + part) * block_size + j % block_size) * row_elems + kvh * head_dim;
        &cache[start..start + head_dim]
    };
    // One task per (block, kv head): its keys and values widened once (`KvTiles`), then every
    // (row, head) of the block that reads them, into its own part of `parts`, then scattered
    // into `out`.
    let (kv_heads, part) = (at.kv_heads, per_block * group * head_dim);
    let mut parts = vec![bf16::ZERO; blocks.len() * kv_heads * part];
    par_chunks_mut(&mut parts, part, threads_for(ctx, work), |task, part| {
        let (y, kvh) = (task / kv_heads, task % kv_heads);
        let block = &blocks[y];
        let anchor = block.anchor;
        let (key, value) = (|j| kv(anchor, j, 0, kvh), |j| kv(anchor, j, 1, kvh));
        let tiles = KvTiles::new(block.keys.clone(), head_dim, key, value);
        let mut scratch = FlashScratch::default();
        let rows = y * per_block..((y + 1) * per_block).min(seq_lens.len());
        for (i, r) in rows.enumerate() {
            let len = seq_lens[r] as usize;
            for g in 0..group {
                let index = r * heads + kvh * group + g;
                attend_mma(
                    &q[index * head_dim..(index + 1) * head_dim],
                    (window_start(len, window)..len, block.keys.clone()),
                    scale,
                    tiles.as_ref().map_or(Kv::Each(key, value), Kv::Tiles),
                    &mut scratch,
                    &mut part[(i * group + g) * head_dim..][..head_dim],
                );
            }
        }
    });
    for (task, part) in parts.chunks_exact(part).enumerate() {
        let (y, kvh) = (task / kv_heads, task % kv_heads);
        let rows = y * per_block..((y + 1) * per_block).min(seq_lens.len());
        for (i, r) in rows.enumerate() {
            let first = (r * heads + kvh * group) * head_dim;
            out[first..first + group * head_dim]
                .copy_from_slice(&part[i * group * head_dim..(i + 1) * group * head_dim]);
        }
    }
    Ok(())
}

// ---- emitter -------------------------------------------------------------------------------

fn emit_paged_mma(v: &View<'_>) -> R {
    let a = v.op(OpKind::Attention, None)?;
    let (heads, kv_heads, head_dim) = (
        v.u32(a, "heads")?,
        v.u32(a, "kv_heads")?,
        v.u32(a, "head_dim")?,
    );
    // One sequence's tokens share key tiles; any other rows are each their own sequence.
    let rows_per_block = match v.mode().rows_as() {
        Mode::Verify => FLASH_SLOTS / pack(heads, kv_heads),
        _ => 1,
    };
    let (gate, out) = gated_out(v, a)?;
    Ok(vec![PagedMma {
        q: v.input(a, 0)?,
        cache: kv_cache_of(v, a)?,
        block_tables: v.meta(MetaField::BlockTables),
        seq_lens: v.meta(MetaField::SeqLens),
        gate,
        out,
        scratch: v.attn_scratch(heads as usize, head_dim as usize),
        rows: v.rows(),
        heads,
        kv_heads,
        head_dim,
        block_size: v.kv_block_size(),
        max_blocks: v.max_blocks(),
        num_pages: v.kv_pages(),
        window: window_of(v, a)?,
        scale: v.f32(a, "scale")?,
        rows_per_block,
    }
    .launch(entry(head_dim))])
}
