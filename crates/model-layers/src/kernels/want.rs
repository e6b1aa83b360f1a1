//! The rows an LM head computes: those whose want-logits flag (the step's
//! `MetaField::WantLogits`, an i32 per row) is not 0; every row when a launch has no flags (a
//! router, the MTP head's fc). The kernels skip the other rows and leave their logits rows as
//! they were; a twin computes the wanted rows alone, gathered, so each row's bytes are the ones
//! it has in any batch (a row's dots do not depend on the other rows: parity's batch
//! invariance), and leaves the others as the kernels do.

/// Runs `f(x rows, row count, out rows)` over the rows of `x` (`[rows]\[k\]`) and `out`
/// (`[rows]\[n\]`) that `want` flags, gathered into their own buffers and scattered back; the
/// rows not flagged keep `out`'s values. `f` runs on `x` and `out` themselves when every row is
/// flagged, and not at all when none is.
pub(crate) fn on_wanted_rows<X: Copy, O: Copy, E>(
    want: Option<&[i32]>,
    (x, k): (&[X], usize),
    (out, n): (&mut [O], usize),
    rows: usize,
    f: impl FnOnce(&[X], usize, &mut [O]) -> Result<(), E>,
) -> Result<(), E> {
    let Some(want) = want else {
        return f(x, rows, out);
    };
    let picked: Vec<usize> = (0..rows).filter(|&r| want[r] != 0).collect();
    if picked.len() == rows {
        return f(x, rows, out);
    }
    if picked.is_empty() {
        return Ok(());
    }
    let xs: Vec<X> = picked
        .iter()
        .flat_map(|&r| x[r * k..(r + 1) * k].iter().copied())
        .collect();
    let mut ys: Vec<O> = picked
        .iter()
        .flat_map(|&r| out[r * n..(r + 1) * n].iter().copied())
        .collect();
    f(&xs, picked.len(), &mut ys)?;
    for (&r, y) in picked.iter().zip(ys.chunks_exact(n.max(1))) {
        out[r * n..(r + 1) * n].copy_from_slice(&y[..n]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::on_wanted_rows;

    /// Row r's output is a function of row r alone, so the gathered run must put each wanted
    /// row's result where the whole run would, and leave the others.
    #[test]
    fn only_the_wanted_rows_are_computed_and_stored_in_place() {
        let (rows, k, n) = (5, 3, 2);
        let x: Vec<f32> = (0..rows * k).map(|i| i as f32).collect();
        let row_sums = |x: &[f32], rows: usize, out: &mut [f32]| -> Result<(), ()> {
            for r in 0..rows {
                let s: f32 = x[r * k..(r + 1) * k].iter().sum();
                out[r * n] = s;
                out[r * n + 1] = -s;
            }
            Ok(())
        };
        let mut all = vec![7.0f32; rows * n];
        on_wanted_rows(None, (&x, k), (&mut all, n), rows, row_sums).unwrap();
        for want in [[1, 0, 0, 1, 0], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1], [0; 5]] {
            let mut out = vec![7.0f32; rows * n];
            let mut calls = 0;
            on_wanted_rows(Some(&want), (&x, k), (&mut out, n), rows, |x, r, o| {
                calls += 1;
                row_sums(x, r, o)
            })
            .unwrap();
            assert_eq!(calls, usize::from(want.iter().any(|&w| w != 0)), "{want:?}");
            for r in 0..rows {
                let expect = if want[r] != 0 {
                    &all[r * n..][..n]
                } else {
                    &[7.0, 7.0][..]
                };
                assert_eq!(&out[r * n..][..n], expect, "{want:?} row {r}");
            }
        }
    }
}
