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

/// out bf16[rows·width] = x · sigmoid(gate) (the gated attention output of Qwen3-Next).
pub fn sigmoid_mul(x: Buf, gate: Buf, out: Buf, rows: u32, width: u32) -> Launch {
    Args::new()
        .read(x)
        .read(gate)
        .write(out)
        .u32(rows)
        .u32(width)
        .launch("act::sigmoid_mul", elementwise(rows as u64 * width as u64))
}
