//! `attn::paged_decode_prefetch` (lever `attn_prefetch`) against `attn::paged_decode`, both run
//! from their CUDA source: the prefetch entry only moves loads (the next tile's page-table entry
//! and K/V rows ahead, K issued 4 chunks at a time, V 16 bytes a lane for 4 keys at once), so
//! it must store the same bytes on every shape — one tile, several tiles, flash-decoding splits,
//! GQA, sliding windows, head dims with a partial K batch or chunk (the scalar load path), pages
//! missing from the block table — and on NaN and ±inf inputs (`tests_nan`'s attention rows).

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::kernels::attn::{
    scratch_bytes, PagedAttention, PAGED_DECODE, PAGED_DECODE_PREFETCH,
};
use solder_model_layers::kernels::{variant_of, Buf};

use super::tests::{download, emulated, run, upload};
use super::tests_nan::{
    attention_inputs, bf16_bytes, i32_bytes, rows_of, value, ATTN_BLOCK, ATTN_HEADS, ATTN_HEAD_DIM,
    ATTN_MAX_BLOCKS, ATTN_ROWS,
};

/// One attention problem: everything `PagedAttention` takes besides the buffers it writes.
struct Problem {
    q: Vec<f32>,
    cache: Vec<f32>,
    tables: Vec<i32>,
    lens: Vec<i32>,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks: u32,
    pages: u32,
    window: u32,
}

/// The output bytes of `paged_decode` and of `paged_decode_prefetch` on `p`; the scratch
/// counters must be zero after each.
fn both(backend: &mut CpuBackend, p: &Problem) -> [Vec<u8>; 2] {
    let rows = p.lens.len() as u32;
    let q = upload(backend, &bf16_bytes(&p.q));
    let cache = upload(backend, &bf16_bytes(&p.cache));
    let block_tables = upload(backend, &i32_bytes(&p.tables));
    let seq_lens = upload(backend, &i32_bytes(&p.lens));
    let scratch_len = scratch_bytes(rows as usize, p.heads as usize, p.head_dim as usize);
    let out_bytes = (rows * p.heads * p.head_dim) as usize * 2;
    [PAGED_DECODE, PAGED_DECODE_PREFETCH].map(|kernel| {
        let out = upload(backend, &vec![0xa5u8; out_bytes]);
        let scratch: Buf = upload(backend, &vec![0u8; scratch_len]);
        run(
            backend,
            &PagedAttention {
                q,
                cache,
                block_tables,
                seq_lens,
                gate: None,
                out,
                scratch,
                rows,
                heads: p.heads,
                kv_heads: p.kv_heads,
                head_dim: p.head_dim,
                block_size: p.block_size,
                max_blocks: p.max_blocks,
                num_pages: p.pages,
                window: p.window,
                scale: 1.0 / (p.head_dim as f32).sqrt(),
            }
            .launch(kernel),
        );
        let counters = download(backend, scratch.ptr, scratch_len);
        let words = 1 + 16 * (p.head_dim as usize + 2);
        for slot in counters.chunks_exact(words * 4) {
            assert_eq!(
                slot[..4],
                [0u8; 4],
                "{}: a counter left set",
                kernel.as_str()
            );
        }
        download(backend, out.ptr, out_bytes)
    })
}

/// Rows of lengths `lens` (each on its own pages, page 0 unnamed), random finite inputs.
fn problem(lens: &[i32], heads: u32, kv_heads: u32, head_dim: u32, window: u32) -> Problem {
    let block_size = 16u32;
    let longest = *lens.iter().max().unwrap() as u32;
    let max_blocks = longest.div_ceil(block_size).max(1);
    let rows = lens.len();
    let pages = (rows as u32 * max_blocks + 1) as usize;
    let d = head_dim as usize;
    let q = rows_of(rows * heads as usize, d, 1.5, &[]);
    let cache: Vec<f32> = (0..pages * 2 * block_size as usize * kv_heads as usize * d)
        .map(|i| value(i, 2.5, false) * 2.0)
        .collect();
    // Row r's pages, in a scrambled order (tables are not monotone in practice either).
    let tables: Vec<i32> = (0..rows * max_blocks as usize)
        .map(|i| 1 + ((i * 7) % (rows * max_blocks as usize)) as i32)
        .collect();
    Problem {
        q,
        cache,
        tables,
        lens: lens.to_vec(),
        heads,
        kv_heads,
        head_dim,
        block_size,
        max_blocks,
        pages: pages as u32,
        window,
    }
}

#[test]
fn prefetch_entry_is_a_variant_of_paged_decode() {
    assert_eq!(
        variant_of(PAGED_DECODE_PREFETCH.as_str()),
        Some(PAGED_DECODE.as_str())
    );
}

/// 0, 1, 17 (one tile), 300 and 600 tokens (two and three flash-decoding splits; several
/// tiles per warp), full causal and windowed, MHA and GQA, head dims 64 and 128 (whole K
/// batches), 40 (a partial batch), 36 (the scalar path: rows not 16-byte multiples) and 256
/// (the largest, four batches); a row whose table names a page past the pool and one with a
/// negative entry (keys skipped).
#[test]
fn prefetch_stores_paged_decode_bytes() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    let lens = [1, 17, 300, 600, 0, 45];
    let cases = [
        (4, 4, 64, 0),
        (4, 2, 128, 0),
        (6, 2, 40, 0),
        (2, 1, 36, 0),
        (2, 2, 256, 0),
        (4, 2, 64, 100),
        (4, 1, 128, 250),
        (2, 1, 40, 17),
    ];
    for (heads, kv_heads, head_dim, window) in cases {
        let mut p = problem(&lens, heads, kv_heads, head_dim, window);
        // Row 5 (45 tokens): its second page is missing (-1), its third past the pool.
        let mb = p.max_blocks as usize;
        p.tables[5 * mb + 1] = -1;
        p.tables[5 * mb + 2] = p.pages as i32 + 3;
        let [plain, prefetch] = both(&mut backend, &p);
        assert!(
            plain.chunks_exact(2).any(|b| b != [0, 0]),
            "vacuous: every output is zero"
        );
        assert!(
            plain == prefetch,
            "heads {heads}, kv_heads {kv_heads}, head_dim {head_dim}, window {window}: \
             first difference at byte {:?}",
            plain.iter().zip(&prefetch).position(|(a, b)| a != b)
        );
    }
}

/// `tests_nan`'s attention rows (a tile of NaN scores, weight 0 times inf, every score −inf,
/// a NaN value in the second split, a +inf score, clean rows): the same bytes, NaN included,
/// and NaN present.
#[test]
fn prefetch_carries_nan_and_inf_as_paged_decode() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    let (q, cache, tables, lens) = attention_inputs();
    assert_eq!(lens.len(), ATTN_ROWS);
    let p = Problem {
        q,
        cache,
        tables,
        lens,
        heads: ATTN_HEADS,
        kv_heads: 1,
        head_dim: ATTN_HEAD_DIM as u32,
        block_size: ATTN_BLOCK as u32,
        max_blocks: ATTN_MAX_BLOCKS as u32,
        pages: (ATTN_ROWS * ATTN_MAX_BLOCKS + 1) as u32,
        window: 0,
    };
    let [plain, prefetch] = both(&mut backend, &p);
    let nans = plain
        .chunks_exact(2)
        .filter(|b| half::bf16::from_le_bytes([b[0], b[1]]).is_nan())
        .count();
    assert!(nans > 0 && nans < plain.len() / 2, "NaN in {nans} outputs");
    assert!(
        plain == prefetch,
        "first difference at byte {:?}",
        plain.iter().zip(&prefetch).position(|(a, b)| a != b)
    );
}
