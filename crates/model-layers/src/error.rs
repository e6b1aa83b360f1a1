//! Errors of model-layers: weights, builds, step metadata, sessions. Each names the tensor,
//! file, row, sequence or program at fault.

use std::path::PathBuf;

use solder_circuit::CircuitError;
use solder_gpu_runtime::GpuError;

use crate::graphs::captured::CapturedGraph;

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
    #[error("tensor `{tensor}` is missing from the checkpoint in {dir}")]
    Missing { tensor: String, dir: PathBuf },
    #[error("tensor `{tensor}` in {file}: shape {found:?}, expected {expected:?}")]
    Shape {
        tensor: String,
        file: PathBuf,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor `{tensor}` in {file}: dtype {found}, expected bf16, f16 or f32")]
    Dtype {
        tensor: String,
        file: PathBuf,
        found: String,
    },
    #[error("tensor `{tensor}` in {file} is not used by the model (an unexpected weight: the checkpoint and config disagree)")]
    Unexpected { tensor: String, file: PathBuf },
    #[error("tensor `{tensor}` appears in two shards: {first} and {second}")]
    TwoShards {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("{index} maps tensor `{tensor}` to {shard}, whose header does not list it")]
    NotInShard {
        tensor: String,
        index: PathBuf,
        shard: PathBuf,
    },
    #[error("{index} maps tensor `{tensor}` to {mapped}, but it is in {found}")]
    WrongShard {
        tensor: String,
        index: PathBuf,
        mapped: PathBuf,
        found: PathBuf,
    },
    #[error("tensor `{tensor}` in {shard} is not in the weight_map of {index}")]
    NotInIndex {
        tensor: String,
        shard: PathBuf,
        index: PathBuf,
    },
    #[error(
        "host weight slot `{tensor}` holds {found} bytes, its shape {shape:?} in {format} needs {expected}"
    )]
    SlotLength {
        tensor: String,
        shape: Vec<usize>,
        format: String,
        found: usize,
        expected: usize,
    },
    /// A quantized checkpoint tensor that cannot fill its slot (format, dtype, companions).
    #[error("tensor `{tensor}` in {file}: {message}")]
    Quantized {
        tensor: String,
        file: PathBuf,
        message: String,
    },
    /// A weight slot whose format cannot hold it, or that cannot be saved.
    #[error("weight slot `{tensor}`: {message}")]
    SlotFormat { tensor: String, message: String },
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Circuit(#[from] CircuitError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("emitting group `{rule}` ({kernel}): {message}")]
    Emit {
        rule: String,
        kernel: String,
        message: String,
    },
    #[error("no {mode} program at {rows} rows (the serve shape compiles {available})")]
    NoProgram {
        mode: String,
        rows: usize,
        available: String,
    },
    #[error("{0}")]
    Build(String),
    /// A size or index a caller handed in that the exec cannot serve, by the argument's name.
    #[error("`{field}` = {value}: {message}")]
    Argument {
        field: &'static str,
        value: String,
        message: String,
    },
    #[error(
        "this exec was freed: its workspace, weights and state are gone, and nothing may run, \
         capture or free on it again"
    )]
    Freed,
    #[error(
        "this exec was built on the {built_on} and was handed the {given}: its workspace, \
         weights, state, streams and events live on the first"
    )]
    WrongBackend { built_on: String, given: String },
    #[error("graphs: {0}")]
    Graphs(String),
    #[error(
        "cannot free the workspace: {live} graph(s) that captured its programs are still alive"
    )]
    GraphsAlive { live: usize },
    #[error(
        "the {mode}:{rows} graph was captured by another exec (exec {owner}, this is exec {this}): \
         a graph replays and is released only on the exec that captured it"
    )]
    ForeignGraph {
        mode: String,
        rows: usize,
        owner: u64,
        this: u64,
        /// A graph handed to `release` comes back here, so its owner can still release it.
        graph: Option<Box<CapturedGraph>>,
    },
}

/// A step's metadata that the region cannot carry (`meta::StepMeta::new`).
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("a step of {rows} rows is wider than the metadata region's {max_rows}")]
    TooManyRows { rows: usize, max_rows: usize },
    #[error("row {row}: position {position} lies past the {pages} page(s) its sequence holds")]
    NoPage {
        row: usize,
        position: usize,
        pages: usize,
    },
    #[error("row {row}: a block table of {pages} pages is longer than the region's {max_blocks}")]
    TooManyPages {
        row: usize,
        pages: usize,
        max_blocks: usize,
    },
    #[error("row {row}: {field} {value} does not fit the i32 the kernels read")]
    DoesNotFit {
        row: usize,
        field: &'static str,
        value: usize,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("step metadata: {0}")]
    Meta(#[from] MetaError),
    #[error("token id {token} at index {index} is out of range (vocab {vocab})")]
    TokenOutOfRange {
        token: u32,
        index: usize,
        vocab: usize,
    },
    #[error("sequence {seq} would reach position {position}, past the limit {limit}")]
    PositionPastLimit {
        seq: u64,
        position: usize,
        limit: usize,
    },
    #[error("KV cache exhausted: the step needs {needed} more page(s), {free} free")]
    PagesExhausted { needed: usize, free: usize },
    #[error("recurrent state slots exhausted: the step needs {needed} more, {free} free (KvShape::max_sequences)")]
    SlotsExhausted { needed: usize, free: usize },
    #[error("no live sequence {0}")]
    UnknownSequence(u64),
    #[error("sequence {0} appears twice in one step")]
    DuplicateSequence(u64),
    #[error("a step of {asked} sequences is wider than the widest program ({widest})")]
    TooWide { asked: usize, widest: usize },
    #[error("empty input: {0}")]
    Empty(&'static str),
    #[error(
        "a speculative step of {k} draft token(s): k must be 1..={widest} (k + 1 rows must fit \
         the widest compiled verify program no wider than the serve's `speculative_rows`)"
    )]
    DraftLength { k: usize, widest: usize },
    #[error(
        "the drafter's vocabulary has {draft} tokens, the target's {target}: they must be the same"
    )]
    DraftVocab { draft: usize, target: usize },
    #[error("rewind: {0}")]
    Rewind(String),
    /// An argument a caller handed in, refused by its name.
    #[error("`{field}`: {message}")]
    Argument {
        field: &'static str,
        message: String,
    },
    #[error("{call}: a pipeline is open (Session::stop_pipeline closes it)")]
    PipelineOpen { call: &'static str },
    #[error("no pipeline is open (Session::start_pipeline opens one)")]
    NoPipeline,
    #[error("MTP draft head: {0}")]
    DraftHead(String),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// A step ran (its token is in the cache) but sequence `seq`'s next token could not be
    /// drawn from its logits.
    #[error("sequence {seq}: its next token could not be drawn: {source}")]
    SampledAt { seq: u64, source: SamplingError },
}

impl From<GpuError> for SessionError {
    fn from(e: GpuError) -> Self {
        SessionError::Exec(ExecError::Gpu(e))
    }
}

/// A sampling parameter, or a sampler call, refused: each names the parameter, row or token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("sampling temperature {0}: expected a finite number >= 0 (0 means greedy)")]
    Temperature(f64),
    #[error("sampling top_p {0}: expected a number in (0, 1] (1 turns top-p off)")]
    TopP(f64),
    #[error("an empty logits row: a vocabulary of 0 tokens has nothing to sample")]
    EmptyVocabulary,
    #[error("every one of the {vocab} logits is -inf or NaN: no token can be sampled")]
    NoFiniteLogit { vocab: usize },
    #[error("speculative verify: {found} {which} rows, expected {expected} for {k} draft tokens")]
    Rows {
        which: &'static str,
        found: usize,
        expected: usize,
        k: usize,
    },
    #[error("speculative verify: {which} row {row} has {found} entries, expected the vocabulary's {expected}")]
    RowLength {
        which: &'static str,
        row: usize,
        found: usize,
        expected: usize,
    },
    #[error("speculative verify: draft token {token} at position {position} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        position: usize,
        token: u32,
        vocab: usize,
    },
    #[error("speculative verify: {which} row {row} is not a distribution: {reason}")]
    NotADistribution {
        which: &'static str,
        row: usize,
        reason: String,
    },
    #[error("speculative verify: draft token {token} at position {position} has draft probability 0, so the draft cannot have drawn it")]
    DraftTokenImpossible { position: usize, token: u32 },
    #[error("speculative verify: {which} row {row}: {source}")]
    InRow {
        which: &'static str,
        row: usize,
        source: Box<SamplingError>,
    },
}
