//! `flash::paged_mma` (the `tensor_cores` lever's attention) through the host emulation of its
//! CUDA source (`mma.sync`, `ldmatrix` and its transposed form): equal to its twin byte for
//! byte at every entry (head_dim 32, 64, 128 and 256, dims past head_dim padded), for decode
//! rows each with its own pages (one row a block) and for one sequence's consecutive tokens
//! (many rows a block, a padding row among them), with chunks merged across blocks, GQA and a
//! sliding window; every counter is zero after each launch; and a token's bytes are the same
//! whether it runs alone or among a prefill chunk's rows (the lever's batch invariance).

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::kernels::attn::{scratch_bytes, ATTN_SPLITS};
use solder_model_layers::kernels::flash::{entry, pack, PagedMma, FLASH_SLOTS};
use solder_model_layers::kernels::Buf;

use super::tests::{download, emulated, run, upload};
use super::tests_nan::{bf16_bytes, i32_bytes};

/// One launch's problem: sequences of `seq_len` tokens each in their own pages (page 0 is
/// the scratch page), and rows that each read one sequence at a length (or padding).
struct Problem {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    window: u32,
    /// Tokens of each sequence.
    seqs: Vec<u32>,
    /// Each row: (sequence, length), or `None` for a padding row (length 1, scratch page).
    rows: Vec<Option<(usize, u32)>>,
    /// Rows a block takes.
    per_block: u32,
}

/// Deterministic values in -1..1.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// Runs `p` with queries `q` (rows·heads·head_dim values) over a cache drawn from `seed`,
/// returns the output bytes (the emulation compares them with the twin's).
fn launch(backend: &mut CpuBackend, p: &Problem, q: &[f32], seed: u64) -> Vec<u8> {
    let rows = p.rows.len() as u32;
    let bs = p.block_size;
    let max_blocks = p.seqs.iter().map(|s| s.div_ceil(bs)).max().unwrap_or(1);
    // Pages: each sequence's in reverse order after the scratch page, so the table is read.
    let mut next_page = 1u32;
    let tables_of: Vec<Vec<i32>> = p
        .seqs
        .iter()
        .map(|s| {
            let n = s.div_ceil(bs);
            let pages: Vec<i32> = (0..n).rev().map(|i| (next_page + i) as i32).collect();
            next_page += n;
            pages
        })
        .collect();
    let pages = next_page;
    let mut tables = vec![0i32; (rows * max_blocks) as usize];
    let mut lens = Vec::new();
    for (r, row) in p.rows.iter().enumerate() {
        match row {
            Some((s, len)) => {
                let table = &tables_of[*s];
                tables[r * max_blocks as usize..][..table.len()].copy_from_slice(table);
                lens.push(*len as i32);
            }
            None => lens.push(1),
        }
    }
    let row_elems = p.kv_heads * p.head_dim;
    assert_eq!(q.len(), (rows * p.heads * p.head_dim) as usize);
    let q = upload(backend, &bf16_bytes(q));
    let cache = upload(
        backend,
        &bf16_bytes(&values(
            (pages * 2 * bs * row_elems) as usize,
            seed ^ 0x9e37,
        )),
    );
    let block_tables = upload(backend, &i32_bytes(&tables));
    let seq_lens = upload(backend, &i32_bytes(&lens));
    let out_bytes = (rows * p.heads * p.head_dim) as usize * 2;
    let out = upload(backend, &vec![0xa5u8; out_bytes]);
    let scratch_len = scratch_bytes(rows as usize, p.heads as usize, p.head_dim as usize);
    let scratch: Buf = upload(backend, &vec![0u8; scratch_len]);
    run(
        backend,
        &PagedMma {
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
            block_size: bs,
            max_blocks,
            num_pages: pages,
            window: p.window,
            scale: 1.0 / (p.head_dim as f32).sqrt(),
            rows_per_block: p.per_block,
        }
        .launch(entry(p.head_dim)),
    );
    let words = download(backend, scratch.ptr, scratch_len);
    let slot = (1 + ATTN_SPLITS as usize * (p.head_dim as usize + 2)) * 4;
    for pair in 0..(rows * p.heads) as usize {
        assert_eq!(
            &words[pair * slot..pair * slot + 4],
            &[0, 0, 0, 0],
            "counter {pair}"
        );
    }
    download(backend, out.ptr, out_bytes)
}

/// The prefill block size of a shape: 64 slots of `pack` heads.
fn per_block(heads: u32, kv_heads: u32) -> u32 {
    FLASH_SLOTS / pack(heads, kv_heads)
}

#[test]
fn paged_mma_equals_its_twin_at_every_entry_and_row_layout() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let decode = |heads, kv_heads, head_dim, window, lens: &[u32]| Problem {
        heads,
        kv_heads,
        head_dim,
        block_size: 16,
        window,
        seqs: lens.to_vec(),
        rows: lens
            .iter()
            .enumerate()
            .map(|(s, l)| Some((s, *l)))
            .collect(),
        per_block: 1,
    };
    // One sequence's tokens start..end, then `padding` padding rows, `per_block` rows a block.
    let chunk = |heads, kv_heads, head_dim, window, (start, end): (u32, u32), padding| Problem {
        heads,
        kv_heads,
        head_dim,
        block_size: 16,
        window,
        seqs: vec![end],
        rows: (start + 1..=end)
            .map(|l| Some((0, l)))
            .chain((0..padding).map(|_| None))
            .collect(),
        per_block: per_block(heads, kv_heads),
    };
    let problems = [
        // Decode rows: one tile, a partial tile, three chunks merged (700 keys), GQA 2.
        ("decode", decode(4, 2, 64, 0, &[1, 45, 700])),
        // head_dim 32 (half the entry's dims zero), a sliding window over two chunks' edge.
        ("decode window", decode(2, 1, 32, 100, &[300, 90])),
        // A prefill chunk of 70 tokens at 230..300 (two row blocks of 16, chunks of 256:
        // the later rows have two), 2 padding rows, 4 heads on one kv head.
        ("chunk", chunk(4, 1, 32, 0, (230, 300), 2)),
        // A windowed chunk: rows whose windows start in different tiles.
        ("chunk window", chunk(2, 2, 64, 40, (100, 140), 0)),
        // The 128 entry (q staged) and the 256 entry (two passes of 128 dims), odd head_dims.
        ("decode 128", decode(2, 1, 120, 0, &[33, 290])),
        ("chunk 256", chunk(2, 1, 200, 0, (250, 262), 1)),
    ];
    for (i, (name, p)) in problems.iter().enumerate() {
        let seed = 0x51ed + i as u64;
        let q = values(p.rows.len() * (p.heads * p.head_dim) as usize, seed);
        launch(&mut backend, p, &q, seed);
        let kernel = entry(p.head_dim).as_str();
        let parity = &backend.emulation().unwrap().report()[kernel];
        assert_eq!(
            parity.launches, parity.identical,
            "{name}: {kernel} {parity:?}"
        );
    }
}

#[test]
fn a_tokens_bytes_do_not_depend_on_the_rows_beside_it() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    // Tokens 280..300 of one sequence as a chunk (one block of 16 rows and part of another)
    // against each token alone (a decode row): the same q row and keys, so the same bytes.
    let (heads, kv_heads, head_dim) = (4u32, 2u32, 64u32);
    let seed = 0x77;
    let chunk = Problem {
        heads,
        kv_heads,
        head_dim,
        block_size: 16,
        window: 0,
        seqs: vec![300],
        rows: (281..=300).map(|l| Some((0, l))).collect(),
        per_block: per_block(heads, kv_heads),
    };
    let width = (heads * head_dim) as usize;
    let q = values(chunk.rows.len() * width, seed);
    let all = launch(&mut backend, &chunk, &q, seed);
    for (r, len) in [(0usize, 281u32), (7, 288), (19, 300)] {
        let alone = Problem {
            rows: vec![Some((0, len))],
            per_block: 1,
            seqs: vec![300],
            ..chunk
        };
        let out = launch(&mut backend, &alone, &q[r * width..(r + 1) * width], seed);
        assert_eq!(
            out,
            all[r * width * 2..(r + 1) * width * 2],
            "token {}",
            len - 1
        );
    }
}
