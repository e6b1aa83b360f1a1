//! Building what `generate` runs on: the target exec from the checkpoint (as `bench
//! --model` and `parity --model` build theirs: `Boot` + `CircuitExec::build`), sized for one
//! sequence of the prompt and the tokens asked for, and a draft model's exec for
//! `--speculative DIR`.

use std::path::Path;
use std::time::Instant;

use solder_circuit::{Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{Boot, CircuitExec, KvShape, WeightSource};

/// KV block size (as bench and parity use).
const BLOCK: usize = 16;

/// MTP draft programs compiled for `--speculative mtp` (as parity's MTP checks do).
const DRAFT_WIDTHS: [usize; 1] = [4];

/// The model config of checkpoint `dir`.
pub fn config_of(dir: &Path) -> Result<ModelConfig, String> {
    crate::files::model_config(&dir.join("config.json"))
}

/// A KV cache for `sequences` sequences of `positions` tokens.
pub fn kv_for(positions: usize, sequences: usize) -> KvShape {
    KvShape {
        pages: sequences * (positions.div_ceil(BLOCK) + 1) + 2,
        block_size: BLOCK,
        max_seq_len: positions.next_multiple_of(BLOCK),
        max_sequences: sequences,
    }
}

/// The exec of checkpoint `dir` (`config`) on `backend`, serving one sequence (and with
/// `mtp`, its draft head's programs and the head's own sequence).
pub fn build(
    backend: &mut dyn GpuBackend,
    dir: &Path,
    config: ModelConfig,
    rules: &RuleSet,
    positions: usize,
    mtp: bool,
) -> Result<CircuitExec, String> {
    // Draft widths are bounded by the serve's batch.
    let max_batch = if mtp { DRAFT_WIDTHS[0] } else { 1 };
    let mut serve = ServeShape::with_max_batch(max_batch).map_err(|e| e.to_string())?;
    if mtp {
        serve.draft_widths = DRAFT_WIDTHS.to_vec();
    }
    let sequences = if mtp { 2 } else { 1 };
    let started = Instant::now();
    let exec = CircuitExec::build(
        backend,
        Boot {
            config,
            serve,
            rules: rules.clone(),
            policy: Policy::default(),
            weights: WeightSource::Checkpoint(dir.to_path_buf()),
            kv: kv_for(positions, sequences),
            precision: Default::default(),
        },
    )
    .map_err(|e| {
        let flag = if mtp { "--speculative mtp: " } else { "" };
        format!("{flag}{}: {e}", dir.display())
    })?;
    eprintln!(
        "built {} in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(exec)
}

/// The positions a run takes: the prompt, the tokens asked for, and k + 1 past them when
/// speculative (a verify step may feed that far); refused past the model's
/// `max_position_embeddings` before anything is allocated.
pub fn positions(
    prompt: usize,
    max_tokens: usize,
    speculative_k: Option<usize>,
    config: &ModelConfig,
) -> Result<usize, String> {
    let total = prompt + max_tokens + speculative_k.map_or(0, |k| k + 1);
    if total > config.max_position_embeddings {
        return Err(format!(
            "the prompt's {prompt} tokens + `--max-tokens {max_tokens}`{} = {total} positions, \
             more than the model's max_position_embeddings {}",
            if speculative_k.is_some() {
                " + k + 1"
            } else {
                ""
            },
            config.max_position_embeddings
        ));
    }
    Ok(total)
}
