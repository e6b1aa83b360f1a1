//! The MTP draft head's buffers in an exec's workspace: the hidden rows the target's programs
//! leave for it (`Layout::hidden_offset`, written by every target program when the exec
//! serves draft programs) and the head's own output rows (`Layout::draft_hidden_offset`).
//! `CircuitExec::{read_hidden, read_hidden_at, write_hidden, chain_hidden}` go through the
//! checks and addresses here.
//!
//! Invariant: every access checks the exec is live and bound to the backend, that it serves
//! draft programs, and that the rows lie within the widest program (checked arithmetic: no
//! row index wraps); nothing here addresses outside the two hidden regions.

use half::bf16;
use solder_gpu_runtime::{DevicePtr, GpuBackend};

use super::CircuitExec;
use crate::error::ExecError;

/// Which hidden rows: the target's (the draft head's input) or the draft head's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenRows {
    Target,
    Draft,
}

impl CircuitExec {
    /// Refuses unless the exec is live, bound to `backend` and serves draft programs.
    pub(super) fn check_draft(&self, backend: &dyn GpuBackend) -> Result<(), ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        if !self.has_draft_head() {
            return Err(ExecError::Build(format!(
                "{} serves no draft programs (no MTP draft head: its serve shape has no \
                 draft_widths)",
                self.instance.circuit.name
            )));
        }
        Ok(())
    }

    /// Rows `first..first + rows` lie within the hidden regions' rows (checked arithmetic:
    /// `first` near `usize::MAX` is refused, not wrapped), refused by the argument's name.
    pub(super) fn check_hidden_rows(
        &self,
        first_field: &'static str,
        first: usize,
        rows_field: &'static str,
        rows: usize,
    ) -> Result<(), ExecError> {
        let max = self.layout.max_rows;
        if rows > max {
            return Err(ExecError::Argument {
                field: rows_field,
                value: rows.to_string(),
                message: format!("the hidden regions hold {max} rows (the widest program's)"),
            });
        }
        match first.checked_add(rows) {
            Some(end) if end <= max => Ok(()),
            _ => Err(ExecError::Argument {
                field: first_field,
                value: first.to_string(),
                message: format!(
                    "{rows} row(s) from row {first} lie past the {max} rows the hidden regions hold"
                ),
            }),
        }
    }

    /// The address of `row` of `which` hidden region (checked by the caller).
    pub(super) fn hidden_ptr(&self, which: HiddenRows, row: usize) -> DevicePtr {
        let base = match which {
            HiddenRows::Target => self.layout.hidden_offset,
            HiddenRows::Draft => self.layout.draft_hidden_offset,
        };
        self.workspace()
            .offset(base + row * self.config.hidden_size * 2)
    }
}

/// bf16 values from their little-endian bytes.
pub(super) fn bf16s_from_bytes(raw: &[u8]) -> Vec<bf16> {
    raw.chunks_exact(2)
        .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
        .collect()
}
