//! Errors of the compiler. Every message names the file, rule, op or tensor at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CircuitError {
    #[error("cannot read rules file {path}: {source}")]
    RulesIo {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{source_name}: {message}")]
    Rules {
        source_name: String,
        message: String,
    },
    #[error("circuit build: {0}")]
    Build(String),
    #[error("config {source_name}: {message}")]
    Unsupported {
        source_name: String,
        message: String,
    },
    #[error(
        "no rule covers op `{node}` ({op}, role `{role}`) in mode {mode} at {rows} rows: \
         add a `reference` rule for `{op}` to the rules file"
    )]
    Uncovered {
        node: String,
        op: String,
        role: String,
        mode: String,
        rows: usize,
    },
    #[error(
        "op `{node}` ({context}) reads weight `{tensor}` stored as {format}, which no rule \
         covering the op reads: {kernels} (list the format's kind in a rule's `formats` where \
         its kernel reads it, or keep the tensor bf16 with a precision table)"
    )]
    UnreadFormat {
        node: String,
        /// The op's kind, the mode and the rows.
        context: String,
        tensor: String,
        format: String,
        kernels: String,
    },
    #[error("precision: weight `{tensor}` as {format}: {message}")]
    Precision {
        tensor: String,
        format: String,
        message: String,
    },
    #[error("unknown mode `{0}` (expected one of decode, multi_seq, verify, verify_batch, draft)")]
    UnknownMode(String),
    #[error("{mode} cannot run at {rows} rows: {why}")]
    BadRows {
        mode: String,
        rows: usize,
        why: String,
    },
    #[error(transparent)]
    Config(#[from] solder_config::ConfigError),
    #[error("serve shape: `{field}` {problem}")]
    ServeShape {
        field: &'static str,
        problem: String,
    },
    #[error(
        "{source_name}:{line}: rule `{rule}` names kernel `{kernel}`, which the backend does not \
         have (load its module, remove the rule, or build with `Policy::skip_missing_kernels`)"
    )]
    MissingKernel {
        source_name: String,
        line: usize,
        rule: String,
        kernel: String,
    },
    #[error(
        "{what} `{name}` ({shape}) is too large: its bytes overflow or exceed {max} \
         (a dimension above solder_config::DIM_BOUNDS?)"
    )]
    TooLarge {
        what: String,
        name: String,
        shape: String,
        max: usize,
    },
    #[error("plan verifier failed after the {pass} pass: {message}")]
    Verify { pass: &'static str, message: String },
}
