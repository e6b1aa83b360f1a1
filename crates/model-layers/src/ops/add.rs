//! `add` module: the residual add.

use super::{elementwise, Args, Buf, Launch};

/// out f32[rows·hidden] = h f32 + x bf16.
pub fn residual_add(h: Buf, x: Buf, out: Buf, rows: u32, hidden: u32) -> Launch {
    Args::new()
        .read(h)
        .read(x)
        .write(out)
        .u32(rows)
        .u32(hidden)
        .launch(
            "add::residual_add",
            elementwise(rows as u64 * hidden as u64),
        )
}
