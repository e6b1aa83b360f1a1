//! `act` module: activations.

use super::{elementwise, Args, Buf, Launch};

/// out bf16[rows·width] = silu(g) · u.
pub fn silu_mul(g: Buf, u: Buf, out: Buf, rows: u32, width: u32) -> Launch {
    Args::new()
        .read(g)
        .read(u)
        .write(out)
        .u32(rows)
        .u32(width)
        .launch("act::silu_mul", elementwise(rows as u64 * width as u64))
}
