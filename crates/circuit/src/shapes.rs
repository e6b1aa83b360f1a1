//! [`ProgramShapes`]: the (mode, rows) a build compiles a program for, read from a [`ServeShape`]
//! (plain data) once, and the one place that answers "which program runs n rows".
//!
//! Invariants: built only from a serve shape that passes
//! [`ServeShape::validate`](solder_config::ServeShape::validate); the list is in canonical order —
//! decode at 1 row, then multi-seq widths ascending, then verify widths ascending, then prefill
//! at every verify width (a prompt chunk with no LM head; an instance whose circuit cannot drop
//! its head removes them), then batched-verify widths ascending, then draft (the MTP head's
//! step) at 1 row and at every other `draft_widths` width ascending, when `draft_widths` asks for any — with no (mode, rows) twice;
//! every entry passes [`Mode::check_rows`](crate::Mode::check_rows). Whether the model has a draft
//! head is the instance's question
//! ([`Instance::from_config_with`](crate::Instance::from_config_with) refuses draft widths for a
//! family without one).

use solder_config::ServeShape;

use crate::error::CircuitError;
use crate::mode::Mode;

/// The capability a plan that keeps no recurrent snapshots offers its rules (`requires`):
/// prefill programs, and verify programs wider than the serve's `speculative_rows`. A rule
/// whose kernels write no snapshots (the chunked Gated DeltaNet) requires it.
pub const NO_SNAPSHOTS: &str = "plan:no_snapshots";

/// Every (mode, rows) program of a serve, in canonical order, and the widest a speculative
/// step runs (`ServeShape::speculative_rows`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramShapes {
    programs: Vec<(Mode, usize)>,
    speculative_rows: usize,
}

impl ProgramShapes {
    /// The programs `serve` asks for; refuses a shape that fails validation.
    pub fn new(serve: &ServeShape) -> Result<ProgramShapes, CircuitError> {
        serve.validate()?;
        let mut programs = vec![(Mode::Decode, 1)];
        programs.extend(serve.multi_seq_ladder.iter().map(|&w| (Mode::MultiSeq, w)));
        programs.extend(serve.verify_widths.iter().map(|&k| (Mode::Verify, k)));
        programs.extend(serve.verify_widths.iter().map(|&k| (Mode::Prefill, k)));
        programs.extend(
            serve
                .verify_batch_widths
                .iter()
                .map(|&w| (Mode::VerifyBatch, w)),
        );
        if !serve.draft_widths.is_empty() {
            // One row (each draft step after the first) and the n-row widths (several rows
            // at once: the head's catch-up over accepted tokens, or several sequences).
            programs.push((Mode::Draft, 1));
            let wider = serve.draft_widths.iter().filter(|&&w| w > 1);
            programs.extend(wider.map(|&w| (Mode::Draft, w)));
        }
        for &(mode, rows) in &programs {
            mode.check_rows(rows)?;
        }
        Ok(ProgramShapes {
            programs,
            speculative_rows: serve.speculative_rows,
        })
    }

    /// These shapes without `mode`'s programs (an instance with no circuit for them).
    pub fn without(mut self, mode: Mode) -> ProgramShapes {
        self.programs.retain(|(m, _)| *m != mode);
        self
    }

    /// Whether draft programs (the MTP head's) are asked for.
    pub fn has_draft(&self) -> bool {
        self.programs.iter().any(|(mode, _)| *mode == Mode::Draft)
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

    /// Whether the (mode, rows) program keeps its recurrent state's per-row snapshots (a plan
    /// that keeps none offers its rules [`NO_SNAPSHOTS`]): a
    /// verify or batched-verify program (`Mode::keeps_snapshots`) no wider than the serve's
    /// `speculative_rows`, the programs a speculative step may run. A wider verify program
    /// serves prompt chunks only.
    pub fn keeps_snapshots(&self, mode: Mode, rows: usize) -> bool {
        mode.keeps_snapshots() && rows <= self.speculative_rows
    }

    /// The widest `mode` program a speculative step may run (one that keeps snapshots);
    /// `None` when there is none.
    pub fn widest_speculative(&self, mode: Mode) -> Option<usize> {
        self.widths(mode)
            .filter(|&rows| self.keeps_snapshots(mode, rows))
            .last()
    }
}
