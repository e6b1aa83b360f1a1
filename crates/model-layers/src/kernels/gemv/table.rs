//! The split-K launch-shape tables of docs/PERFORMANCE.md, printed from the declarations'
//! shapes (`shape::projection`, `shape::heads_of`) at Llama-3.2-1B's sizes, so the doc's copy
//! cannot drift (`tests/kernel_constants.rs` checks it equals `split_table()`).

use std::fmt::Write;

use solder_config::Levers;

use super::shape::{self, gemv_config, Dims};
use super::*;

/// One projection row: what it is, its kernel's classic and streaming names, rows, k,
/// features and weight rows per feature.
type Row<K> = (&'static str, Name<K>, [Name<K>; 4], u32, u32, u64, u32);

/// The levers of the table's second sizing: `split_two_waves`.
fn two_waves() -> Levers {
    let mut levers = Levers::default();
    levers
        .set(SPLIT_TWO_WAVES, true)
        .expect("split_two_waves is a known lever");
    levers
}

/// One table line of a projection launch: its splits and blocks under the default levers
/// (one wave), then under `split_two_waves`.
fn line<K>(out: &mut String, (what, classic, stream, rows, k, features, nw): Row<K>) {
    let dims = Dims {
        features,
        rows,
        k,
        nw,
    };
    let [one, two] = [Levers::default(), two_waves()].map(|levers| {
        let config = gemv_config(features, rows);
        shape::projection(classic, config, &stream, dims, &levers)
    });
    let [x, y, z] = one.config.grid;
    let _ = writeln!(
        out,
        "| {what} | `{}` | {rows} | {k} | {features} | {} | {} | {} | {} | {} |",
        one.entry.as_str(),
        x * y,
        one.splits,
        x * y * z,
        two.splits,
        x * y * two.config.grid[2]
    );
}

/// The split-K table of Llama-3.2-1B's projections (hidden 2048, intermediate 8192, vocabulary
/// 128,256, 32 q and 8 kv heads of 64), then its `qkv_rope_kv` split heads by rows.
pub fn split_table() -> String {
    let mut out = String::from(
        "| launch (Llama-3.2-1B) | entry | rows | k | features | blocks unsplit | splits \
         | blocks split | splits (`split_two_waves`) | blocks split (`split_two_waves`) |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let res = (LINEAR_RESIDUAL_ADD, LINEAR_RESIDUAL_ADD_STREAM);
    line(
        &mut out,
        (
            "o projection + residual add",
            res.0,
            res.1,
            1,
            2048,
            2048,
            1,
        ),
    );
    line(
        &mut out,
        (
            "down projection + residual add",
            res.0,
            res.1,
            1,
            8192,
            2048,
            1,
        ),
    );
    let qkv = (ADD_NORM_QKV, ADD_NORM_QKV_STREAM);
    line(&mut out, ("q/k/v", qkv.0, qkv.1, 1, 2048, 3072, 1));
    let gate_up = (ADD_NORM_GATE_UP_SILU, ADD_NORM_GATE_UP_SILU_STREAM);
    line(
        &mut out,
        ("gate/up + SiLU", gate_up.0, gate_up.1, 1, 2048, 8192, 2),
    );
    let lm = (ADD_NORM_LM_HEAD, ADD_NORM_LM_HEAD_STREAM);
    line(&mut out, ("LM head", lm.0, lm.1, 1, 2048, 128_256, 1));
    line(
        &mut out,
        ("down projection", res.0, res.1, 4, 8192, 2048, 1),
    );
    line(
        &mut out,
        ("down projection", res.0, res.1, 8, 8192, 2048, 1),
    );
    out.push_str(
        "\n| rows (`qkv_rope_kv`) | row groups | blocks unsplit | parts per head | blocks split \
         | parts (`split_two_waves`) | blocks split (`split_two_waves`) |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for rows in [1, 8, 32, 64, 128] {
        let [one, two] =
            [Levers::default(), two_waves()].map(|l| shape::heads_of(rows, 32, 8, 64, &l));
        let [x, y, _] = one.config.grid;
        let unsplit = x * y / one.splits;
        let _ = writeln!(
            out,
            "| {rows} | {x} | {unsplit} | {} | {} | {} | {} |",
            one.splits,
            x * y,
            two.splits,
            unsplit * two.splits
        );
    }
    out
}
