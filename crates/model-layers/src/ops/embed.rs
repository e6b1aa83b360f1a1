//! `embed` module: gathers embedding rows into the f32 residual stream.

use super::{per_row, Args, Buf, Launch};

/// tokens i32[rows], table bf16[vocab·hidden] → out f32[rows·hidden].
pub fn embedding(tokens: Buf, table: Buf, out: Buf, rows: u32, hidden: u32, vocab: u32) -> Launch {
    Args::new()
        .read(tokens)
        .read(table)
        .write(out)
        .u32(rows)
        .u32(hidden)
        .u32(vocab)
        .launch("embed::embedding", per_row(rows))
}
