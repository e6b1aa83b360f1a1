//! `meta`: the metadata region's layout, each field's range at n rows, a step's values checked,
//! encoded (padding rows on the scratch page and slot) and uploaded in one copy.

use solder_circuit::ir::MetaField;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::meta::{MetaLayout, MetaRow, StepMeta, SCRATCH_PAGE, SCRATCH_SLOT};
use solder_model_layers::MetaError;

/// Programs of up to 8 rows, block tables of 4 pages of 16 tokens.
fn layout() -> MetaLayout {
    MetaLayout::new(8, 4, 16)
}

fn i32_at(bytes: &[u8], offset: usize, index: usize) -> i32 {
    let at = offset + 4 * index;
    i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

#[test]
fn fields_are_aligned_and_block_tables_come_last() {
    let m = layout();
    let offsets = [
        m.tokens,
        m.positions,
        m.slot_mapping,
        m.seq_lens,
        m.state_slots,
        m.state_slots_out,
        m.keep_snapshots,
        m.want_logits,
        m.block_tables,
    ];
    assert_eq!(m.tokens, 0, "the region starts the workspace");
    for pair in offsets.windows(2) {
        assert!(pair[0] + 8 * 4 <= pair[1], "{offsets:?} overlap");
    }
    for offset in offsets {
        assert_eq!(offset % 256, 0, "offset {offset} is not 256-aligned");
    }
    assert!(m.block_tables + 8 * 4 * 4 <= m.bytes);
    assert_eq!(m.bytes % 256, 0);
    // A program of 3 rows reads 3 entries of each field and 3 block tables.
    assert_eq!(m.tokens(3).bytes, 12);
    let positions = m.field(MetaField::Positions, 3);
    assert_eq!((positions.offset, positions.bytes), (m.positions, 12));
    let tables = m.field(MetaField::BlockTables, 3);
    assert_eq!((tables.offset, tables.bytes), (m.block_tables, 3 * 4 * 4));
    assert_eq!(m.field(MetaField::StateSlots, 3).offset, m.state_slots);
    assert_eq!(
        m.field(MetaField::StateSlotsOut, 3).offset,
        m.state_slots_out
    );
    let keep = m.field(MetaField::KeepSnapshots, 3);
    assert_eq!((keep.offset, keep.bytes), (m.keep_snapshots, 12));
    let want = m.field(MetaField::WantLogits, 3);
    assert_eq!((want.offset, want.bytes), (m.want_logits, 12));
    assert_eq!(m.step_bytes(3), m.block_tables + 3 * 4 * 4);
}

#[test]
fn live_and_padding_rows_are_encoded_where_programs_read_them() {
    let m = layout();
    let pages = [5, 9];
    let rows = [
        MetaRow::Live {
            token: 42,
            position: 17,
            pages: &pages,
            state_slot: 3,
            state_slot_out: 7,
            snapshot: true,
            logits: true,
        },
        MetaRow::Padding,
    ];
    let meta = StepMeta::new(&m, &rows).expect("valid step");
    assert_eq!(meta.rows(), 2);
    let bytes = meta.encode();
    assert_eq!(bytes.len(), m.step_bytes(2));
    let row = |offset, index| i32_at(&bytes, offset, index);
    // Position 17 lies on the second page (9), cell 1 of 16.
    assert_eq!(
        [
            m.tokens,
            m.positions,
            m.slot_mapping,
            m.seq_lens,
            m.state_slots,
            m.state_slots_out,
            m.keep_snapshots,
            m.want_logits
        ]
        .map(|f| row(f, 0)),
        [42, 17, 9 * 16 + 1, 18, 3, 7, 1, 1]
    );
    assert_eq!(
        (0..4).map(|b| row(m.block_tables, b)).collect::<Vec<_>>(),
        [5, 9, SCRATCH_PAGE as i32, SCRATCH_PAGE as i32]
    );
    // Padding: token 0 at position 0 (length 1), on the scratch page and the scratch slot,
    // keeping no snapshot, its logits skipped.
    assert_eq!(
        [
            m.tokens,
            m.positions,
            m.slot_mapping,
            m.seq_lens,
            m.state_slots,
            m.state_slots_out,
            m.keep_snapshots,
            m.want_logits
        ]
        .map(|f| row(f, 1)),
        [
            0,
            0,
            SCRATCH_PAGE as i32 * 16,
            1,
            SCRATCH_SLOT as i32,
            SCRATCH_SLOT as i32,
            0,
            0
        ]
    );
    assert!((4..8).all(|b| row(m.block_tables, b) == SCRATCH_PAGE as i32));
}

#[test]
fn steps_the_region_cannot_carry_are_refused() {
    let m = layout();
    let pages = [1];
    let live = |position, pages| MetaRow::Live {
        token: 1,
        position,
        pages,
        state_slot: 0,
        state_slot_out: 0,
        snapshot: false,
        logits: true,
    };
    match StepMeta::new(&m, &[MetaRow::Padding; 9]) {
        Err(MetaError::TooManyRows { rows, max_rows }) => assert_eq!((rows, max_rows), (9, 8)),
        other => panic!("expected TooManyRows, got {other:?}"),
    }
    match StepMeta::new(&m, &[live(16, &pages)]) {
        Err(e @ MetaError::NoPage { .. }) => {
            assert!(e.to_string().contains("position 16"), "{e}");
        }
        other => panic!("expected NoPage, got {other:?}"),
    }
    match StepMeta::new(&m, &[MetaRow::Padding, live(0, &[1, 2, 3, 4, 5])]) {
        Err(MetaError::TooManyPages { row, pages, .. }) => assert_eq!((row, pages), (1, 5)),
        other => panic!("expected TooManyPages, got {other:?}"),
    }
    let huge = [u32::MAX];
    match StepMeta::new(&m, &[live(0, &huge)]) {
        Err(MetaError::DoesNotFit { field, .. }) => assert_eq!(field, "slot mapping"),
        other => panic!("expected DoesNotFit, got {other:?}"),
    }
}

#[test]
fn upload_writes_the_encoded_step_at_the_workspace_start() {
    let m = layout();
    let mut backend = CpuBackend::new();
    let workspace = backend.alloc(m.bytes).expect("workspace");
    let pages = [2];
    let meta = StepMeta::new(
        &m,
        &[MetaRow::Live {
            token: 7,
            position: 3,
            pages: &pages,
            state_slot: 1,
            state_slot_out: 1,
            snapshot: false,
            logits: true,
        }],
    )
    .expect("valid step");
    let stream = backend.default_stream();
    meta.upload(&mut backend, stream, workspace)
        .expect("upload");
    backend.synchronize().expect("sync");
    let mut back = vec![0u8; m.step_bytes(1)];
    backend.copy_d2h(workspace, &mut back).expect("read back");
    assert_eq!(back, meta.encode());
    assert_eq!(i32_at(&back, m.slot_mapping, 0), 2 * 16 + 3);
}
