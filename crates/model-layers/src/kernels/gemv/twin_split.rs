//! What the gemv twins check of a split launch's shape before they compute: a split-K launch
//! (grid.z > 1) or a split-head `qkv_rope_kv` launch (grid.y past the heads) carries its
//! scratch, of the words `split` says; the twins compute every dot whole and leave the
//! scratch alone, so these checks are all a split changes on the CPU.

use solder_gpu_runtime::{GpuError, TwinCtx};

use super::split;
use crate::kernels::args::OutOpt;

/// A split launch (grid.z > 1) must carry its split-K scratch of `split::scratch_words` f32
/// (the twin computes each dot whole and leaves the scratch alone); an unsplit one may pass
/// any scratch or none.
pub(super) fn check_split(
    ctx: &TwinCtx<'_>,
    scratch: OutOpt<'_, f32>,
    features: usize,
    rows: usize,
    k: usize,
    nw: u32,
) -> Result<(), GpuError> {
    let grid = ctx.config().grid;
    if grid[2] <= 1 {
        return Ok(());
    }
    let words = split::scratch_words(grid, features as u64, rows as u32, k as u32, nw);
    require_scratch(
        scratch,
        words,
        &format!("a split-K launch (grid.z = {})", grid[2]),
    )
}

/// The scratch of a split launch (`what`): present, of `words` f32 (`None`: the launch is
/// wider than a scratch slot).
fn require_scratch(
    scratch: OutOpt<'_, f32>,
    words: Option<usize>,
    what: &str,
) -> Result<(), GpuError> {
    let at = scratch.at;
    let words = words.ok_or_else(|| at.bad(format!("{what} wider than a split-K scratch slot")))?;
    match scratch.len(words)? {
        Some(_) => Ok(()),
        None => Err(at.bad(format!("{what} without its scratch"))),
    }
}

/// A split-head `qkv_rope_kv` launch (grid.y a multiple of the heads, more than one part)
/// must carry its scratch of `split::head_scratch_words`; an unsplit one may pass any or none.
pub(super) fn check_head_split(
    ctx: &TwinCtx<'_>,
    scratch: OutOpt<'_, f32>,
    rows: usize,
    all_heads: usize,
    head_dim: usize,
) -> Result<(), GpuError> {
    let mut grid = ctx.config().grid;
    if all_heads == 0 || grid[1] as usize <= all_heads {
        return Ok(());
    }
    let at = scratch.at;
    if !(grid[1] as usize).is_multiple_of(all_heads) {
        return Err(at.bad(format!(
            "grid.y {} splits {all_heads} heads unevenly",
            grid[1]
        )));
    }
    grid[1] = all_heads as u32;
    let words = split::head_scratch_words(grid, rows as u32, (all_heads * head_dim) as u64);
    require_scratch(
        scratch,
        words,
        "a split-head launch (grid.y past the heads)",
    )
}
