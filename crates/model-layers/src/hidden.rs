//! The MTP draft head's buffers on an exec: the hidden rows the target's programs leave for it
//! (`Layout::hidden_offset`, written by every target program when the exec serves draft
//! programs), the head's own output rows (`Layout::draft_hidden_offset`), the chaining copy
//! between them, and one step of any program from metadata the caller builds (`StepMeta`), so
//! the draft program can run before a session drives it.
//!
//! Invariant: each call checks the exec is live and bound to `backend`, that it serves draft
//! programs, and that the rows lie within the widest program (checked
//! arithmetic: no row index wraps); nothing here writes outside the
//! two hidden regions and the metadata region.

use half::bf16;
use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use crate::bytes;
use crate::error::ExecError;
use crate::exec::CircuitExec;
use crate::meta::StepMeta;

/// Which hidden rows: the target's (the draft head's input) or the draft head's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenRows {
    Target,
    Draft,
}

impl CircuitExec {
    /// Whether the exec serves the MTP draft head's programs.
    pub fn has_draft_head(&self) -> bool {
        self.instance.draft.is_some()
    }

    fn check_draft(&self, backend: &dyn GpuBackend) -> Result<(), ExecError> {
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
    fn check_hidden_rows(
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

    fn hidden_ptr(&self, which: HiddenRows, row: usize) -> solder_gpu_runtime::DevicePtr {
        let base = match which {
            HiddenRows::Target => self.layout.hidden_offset,
            HiddenRows::Draft => self.layout.draft_hidden_offset,
        };
        self.workspace()
            .offset(base + row * self.config.hidden_size * 2)
    }

    /// The first `rows` rows of `which` hidden region (bf16 `[rows, hidden]`), as the last
    /// program that wrote them left them.
    pub fn read_hidden(
        &self,
        backend: &mut dyn GpuBackend,
        which: HiddenRows,
        rows: usize,
    ) -> Result<Vec<bf16>, ExecError> {
        self.read_hidden_at(backend, which, 0, rows)
    }

    /// Rows `first..first + rows` of `which` hidden region (a sequence's rows of a multi-row
    /// step: its place in a multi-seq or batched-verify program).
    pub fn read_hidden_at(
        &self,
        backend: &mut dyn GpuBackend,
        which: HiddenRows,
        first: usize,
        rows: usize,
    ) -> Result<Vec<bf16>, ExecError> {
        self.check_draft(backend)?;
        self.check_hidden_rows("first", first, "rows", rows)?;
        let mut raw = vec![0u8; rows * self.config.hidden_size * 2];
        backend.copy_d2h(self.hidden_ptr(which, first), &mut raw)?;
        Ok(raw
            .chunks_exact(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
            .collect())
    }

    /// Writes `values` (whole rows, bf16 `[n, hidden]`) into the target hidden region's first
    /// rows: the draft head's input for the next draft step.
    pub fn write_hidden(
        &self,
        backend: &mut dyn GpuBackend,
        values: &[bf16],
    ) -> Result<(), ExecError> {
        let hidden = self.config.hidden_size;
        if !values.len().is_multiple_of(hidden) {
            return Err(ExecError::Build(format!(
                "{} hidden values are not whole rows of {hidden}",
                values.len()
            )));
        }
        self.check_draft(backend)?;
        self.check_hidden_rows(
            "first",
            0,
            "values.len() / hidden_size",
            values.len() / hidden,
        )?;
        backend.copy_h2d(
            self.hidden_ptr(HiddenRows::Target, 0),
            bytes::bf16_bytes(values),
        )?;
        Ok(())
    }

    /// Copies the draft head's output row `from` to the draft input row `to` (device to
    /// device): how one draft step's hidden state feeds the next.
    pub fn chain_hidden(
        &self,
        backend: &mut dyn GpuBackend,
        from: usize,
        to: usize,
    ) -> Result<(), ExecError> {
        self.check_draft(backend)?;
        self.check_hidden_rows("from", from, "rows", 1)?;
        self.check_hidden_rows("to", to, "rows", 1)?;
        backend.copy_d2d(
            self.hidden_ptr(HiddenRows::Target, to),
            self.hidden_ptr(HiddenRows::Draft, from),
            self.config.hidden_size * 2,
        )?;
        Ok(())
    }

    /// One step of the (mode, rows) program with `meta` (built by the caller from its own
    /// pages, positions and slots): uploads it, runs the program (`run_step`), and returns the
    /// logits of every row, f32 `[rows, vocab]`. The caller owns the pages and slots it names;
    /// nothing is lent or checked against a session.
    pub fn step_with_meta(
        &self,
        backend: &mut dyn GpuBackend,
        mode: Mode,
        meta: &StepMeta,
    ) -> Result<Vec<f32>, ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        let rows = meta.rows();
        let program = self.program(mode, rows)?;
        meta.upload(backend, self.default_stream(), self.workspace())?;
        self.run_step(backend, program)?;
        let mut raw = vec![0u8; rows * self.config.vocab_size * 4];
        backend.copy_d2h(self.workspace().offset(self.layout.logits_offset), &mut raw)?;
        Ok(bytes::f32s_from_bytes(&raw))
    }
}
