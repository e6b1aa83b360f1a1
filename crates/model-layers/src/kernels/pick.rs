//! `pick` module (`crates/kernels/cuda/pick.cu`): a step's greedy tokens on the device. No rule
//! names it: the session launches it after a step whose sequences all sample greedily
//! (`Session::next_tokens`), and reads back one id a row instead of the row's logits.

use solder_gpu_runtime::GpuError;

use super::args::{size, threads_for};
use super::decl::kernel;
use super::grid::per_row;
use crate::kernels::emit_view::{View, R};
use crate::numerics::greedy_id;

kernel! {
    /// logits f32\[rows·vocab\] → ids i32\[rows\]: each row's arg-max (the lowest index among
    /// equal maxima; NaN never wins), -1 for a row with no logit but -inf and NaN; `tokens`
    /// (the next step's token field, when steps feed each other) gets the same ids.
    pub struct Argmax / ArgmaxArgs {
        logits: In<f32>,
        ids: Out<i32>,
        tokens: OutOpt<i32>,
        rows: U32,
        vocab: U32,
    }
    grid(a) = per_row(a.rows);
    ARGMAX = "pick::argmax" => twin argmax, emit emit_argmax;
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[Argmax::DECLS];

fn argmax(a: ArgmaxArgs<'_>) -> Result<(), GpuError> {
    let (rows, vocab) = (a.rows.count(), a.vocab.dim()?);
    let logits = a.logits.len(size(a.ctx, &[rows, vocab])?)?;
    let ids = a.ids.len(rows)?;
    let threads = threads_for(a.ctx, rows.saturating_mul(vocab));
    solder_gpu_runtime::par_chunks_mut(ids, 1, threads, |r, id| {
        id[0] = greedy_id(&logits[r * vocab..(r + 1) * vocab]).map_or(-1, |i| i as i32);
    });
    if let Some(tokens) = a.tokens.len(rows)? {
        tokens.copy_from_slice(ids);
    }
    Ok(())
}

/// Never a plan group's kernel (no rule names it); the session builds its launch itself.
fn emit_argmax(v: &View<'_>) -> R {
    Err(v.err("pick::argmax is launched by the session after a step, never by a rule".to_string()))
}

#[cfg(test)]
mod tests {
    use crate::numerics::greedy_id;
    use crate::sampling::{greedy, Sampler};

    #[test]
    fn the_twin_is_the_host_greedy_sampler_on_every_kind_of_row() {
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let rows: Vec<Vec<f32>> = vec![
            vec![0.5, 2.0, -1.0, 2.0],     // a tie: the lower index
            vec![nan, -3.0, nan, -2.5],    // NaN never wins
            vec![-inf, -inf, 1e-30, -inf], // one finite logit
            vec![-inf, nan, -inf],         // nothing finite: refused
            vec![nan, nan],                // all NaN: refused
            vec![1.0, inf, 3.0, inf],      // +inf wins, the first of them
            vec![-inf, inf, nan],          // +inf among the rest
            vec![-0.0, 0.0],               // -0 and +0 are equal: the lower index
            (0..1000)
                .map(|i| ((i * 7919) % 1009) as f32 * 0.25)
                .collect(),
        ];
        for row in &rows {
            let host = Sampler::greedy().sample(row).ok();
            assert_eq!(greedy_id(row), host, "{row:?}");
            if let Some(token) = host {
                assert_eq!(token, greedy(row));
            }
        }
    }
}
