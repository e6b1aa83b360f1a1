//! Positions to a model's limit: Qwen3-Next serves 262,144 positions. The index arithmetic a
//! step at the last of them takes — its metadata (position, slot mapping, sequence length,
//! block table of 16,384 pages), the page pool lending those pages, the KV region's size — and
//! one decode step of a tiny model planned for 262,144 positions, run on the CPU backend at
//! position 262,143 over a zeroed cache (no 262,144-token prefill).

mod exec_support;

use exec_support::*;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::meta::{MetaLayout, MetaRow, StepMeta};
use solder_model_layers::KvShape;

const POSITIONS: usize = 262_144;
const BLOCK: usize = 16;
const BLOCKS: usize = POSITIONS / BLOCK;

fn i32_at(bytes: &[u8], offset: usize, index: usize) -> i32 {
    let at = offset + 4 * index;
    i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

#[test]
fn the_last_of_262144_positions_is_encoded_where_the_kernels_read_it() {
    let m = MetaLayout::new(8, BLOCKS, BLOCK);
    assert_eq!(m.step_bytes(8), m.block_tables + 8 * BLOCKS * 4);
    assert!(m.step_bytes(8) <= m.bytes);
    // The sequence holds pages 1..=16384 (page 0 is the scratch page); a second sequence
    // holds the pages after them, so its cells pass 2^18.
    let first: Vec<u32> = (1..=BLOCKS as u32).collect();
    let second: Vec<u32> = (BLOCKS as u32 + 1..=2 * BLOCKS as u32).collect();
    let live = |position, pages| MetaRow::Live {
        token: 7,
        position,
        pages,
        state_slot: 1,
        state_slot_out: 1,
        snapshot: false,
        logits: true,
    };
    let rows = [
        live(POSITIONS - 1, &first[..]),
        live(POSITIONS - 1, &second[..]),
        MetaRow::Padding,
    ];
    let bytes = StepMeta::new(&m, &rows).unwrap().encode();
    assert_eq!(i32_at(&bytes, m.positions, 0), 262_143);
    assert_eq!(i32_at(&bytes, m.seq_lens, 0), 262_144);
    // Page 16384, cell 15 of it.
    assert_eq!(i32_at(&bytes, m.slot_mapping, 0), 16_384 * 16 + 15);
    assert_eq!(i32_at(&bytes, m.slot_mapping, 1), 32_768 * 16 + 15);
    assert_eq!(i32_at(&bytes, m.block_tables, BLOCKS - 1), 16_384);
    assert_eq!(i32_at(&bytes, m.block_tables, BLOCKS), 16_385);
    assert_eq!(i32_at(&bytes, m.block_tables, 2 * BLOCKS - 1), 32_768);
    assert_eq!(i32_at(&bytes, m.seq_lens, 2), 1, "padding row");
    // One position more needs a page the table cannot hold.
    assert!(StepMeta::new(&m, &[live(POSITIONS, &first[..])]).is_err());
}

#[test]
fn a_tiny_model_planned_for_262144_positions_decodes_at_the_last() {
    let json = TINY_LLAMA.replace(
        "\"max_position_embeddings\": 512",
        "\"max_position_embeddings\": 262144",
    );
    let config = config(&json);
    assert_eq!(config.max_position_embeddings, POSITIONS);
    let mut backend = backend();
    let kv = KvShape {
        pages: BLOCKS + 2,
        block_size: BLOCK,
        max_seq_len: POSITIONS,
        max_sequences: 2,
    };
    let exec = build(&mut backend, &json, Default::default(), kv);
    // The KV region: 16,386 pages of 2 × 16 cells of 2 kv heads × 16 dims, bf16, per layer.
    assert_eq!(exec.layout.kv_pages, BLOCKS + 2);
    assert_eq!(
        exec.layout.states[0].bytes,
        (BLOCKS + 2) * 2 * BLOCK * 2 * 16 * 2
    );
    assert!(exec.layout.state_bytes >= 2 * exec.layout.states[0].bytes);
    // A zeroed cache stands in for 262,143 tokens already written.
    backend
        .memset(exec.kv_cache(), 0, exec.layout.state_bytes)
        .unwrap();
    let pages: Vec<u32> = (1..=BLOCKS as u32).collect();
    let meta = StepMeta::new(
        &exec.layout.meta,
        &[MetaRow::Live {
            token: 5,
            position: POSITIONS - 1,
            pages: &pages,
            state_slot: 0,
            state_slot_out: 0,
            snapshot: false,
            logits: true,
        }],
    )
    .unwrap();
    let stream = backend.default_stream();
    meta.upload(&mut backend, stream, exec.workspace()).unwrap();
    let program = exec.decode_program().unwrap();
    exec.run(&mut backend, program).unwrap();
    let vocab = exec.config.vocab_size;
    let mut raw = vec![0u8; vocab * 4];
    backend
        .copy_d2h(exec.workspace().offset(exec.layout.logits_offset), &mut raw)
        .unwrap();
    let logits: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert!(logits.iter().all(|v| v.is_finite()), "{logits:?}");
    assert!(logits.iter().any(|v| *v != 0.0));
    // The step wrote its k into the last cell of page 16,384 of layer 0, and nothing before.
    let row = 2 * 16 * 2; // kv heads × head_dim × bf16
    let cell = |page: usize, offset: usize| ((page * 2) * BLOCK + offset) * row;
    let mut k = vec![0u8; row];
    backend
        .copy_d2h(exec.kv_cache().offset(cell(BLOCKS, BLOCK - 1)), &mut k)
        .unwrap();
    assert!(k.iter().any(|b| *b != 0), "no k at position 262,143");
    backend
        .copy_d2h(exec.kv_cache().offset(cell(BLOCKS, BLOCK - 2)), &mut k)
        .unwrap();
    assert!(k.iter().all(|b| *b == 0), "the cell before was written");
}
