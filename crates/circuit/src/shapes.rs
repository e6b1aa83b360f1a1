//! `ProgramShapes`: the (mode, rows) a build compiles a program for, read from a `ServeShape`
//! (plain data) once, and the one place that answers "which program runs n rows".
//!
//! Invariants: built only from a serve shape that passes `ServeShape::validate` and asks for
//! no shape nothing compiles (draft programs are refused until the draft head exists); the
//! list is in canonical order — decode at 1 row, then multi-seq widths ascending, then verify
//! widths ascending, then batched-verify widths ascending — with no (mode, rows) twice; every
//! entry passes `Mode::check_rows`.

use solder_config::ServeShape;

use crate::error::CircuitError;
use crate::mode::Mode;

/// Every (mode, rows) program of a serve, in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramShapes {
    programs: Vec<(Mode, usize)>,
}

impl ProgramShapes {
    /// The programs `serve` asks for; refuses a shape that fails validation or names widths
    /// of a mode nothing compiles yet.
    pub fn new(serve: &ServeShape) -> Result<ProgramShapes, CircuitError> {
        serve.validate()?;
        if !serve.draft_widths.is_empty() {
            return Err(CircuitError::ServeShape {
                field: "draft_widths",
                problem: format!(
                    "asks for draft programs at widths {:?}, but draft programs are not \
                     compiled yet (the speculative decoding issue adds them): leave \
                     `draft_widths` empty",
                    serve.draft_widths
                ),
            });
        }
        let mut programs = vec![(Mode::Decode, 1)];
        programs.extend(serve.multi_seq_ladder.iter().map(|&w| (Mode::MultiSeq, w)));
        programs.extend(serve.verify_widths.iter().map(|&k| (Mode::Verify, k)));
        programs.extend(
            serve
                .verify_batch_widths
                .iter()
                .map(|&w| (Mode::VerifyBatch, w)),
        );
        for &(mode, rows) in &programs {
            mode.check_rows(rows)?;
        }
        Ok(ProgramShapes { programs })
    }

    /// Every (mode, rows), in canonical order.
    pub fn all(&self) -> &[(Mode, usize)] {
        &self.programs
    }

    /// The compiled widths of `mode`, ascending (empty for a mode with no program).
    pub fn widths(&self, mode: Mode) -> impl Iterator<Item = usize> + '_ {
        self.programs
            .iter()
            .filter(move |(m, _)| *m == mode)
            .map(|&(_, rows)| rows)
    }

    /// Whether a program is compiled for exactly (mode, rows).
    pub fn contains(&self, mode: Mode, rows: usize) -> bool {
        self.programs.contains(&(mode, rows))
    }

    /// The narrowest `mode` program that holds `n` rows (padding the rest); `None` when `n` is
    /// zero or wider than every `mode` program.
    pub fn narrowest(&self, mode: Mode, n: usize) -> Option<usize> {
        if n == 0 {
            return None;
        }
        self.widths(mode).find(|&rows| rows >= n)
    }

    /// The widest `mode` program that `n` rows fill without padding; `None` when every
    /// `mode` program is wider than `n`.
    pub fn widest_within(&self, mode: Mode, n: usize) -> Option<usize> {
        self.widths(mode).filter(|&rows| rows <= n).last()
    }

    /// The widest `mode` program.
    pub fn widest(&self, mode: Mode) -> Option<usize> {
        self.widths(mode).last()
    }
}
