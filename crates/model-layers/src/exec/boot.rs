//! What a build is given (`Boot`): the model's config, the serve shape, the rules and
//! policy, where the weights come from (`WeightSource`) and the KV cache's shape (`KvShape`,
//! each field checked against its range before anything is allocated).

use std::path::PathBuf;

use solder_circuit::{Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};

use crate::error::ExecError;
use crate::weights::HostWeights;

/// Where the weights come from.
pub enum WeightSource {
    /// A Hugging Face checkpoint folder.
    Checkpoint(PathBuf),
    /// Weights already on the host (converted).
    Host(HostWeights),
    /// Random weights from a seed (built-in models and benches).
    Random { seed: u64 },
}

/// The KV cache's shape: pages, tokens per page, and the longest sequence served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub pages: usize,
    pub block_size: usize,
    pub max_seq_len: usize,
    /// Sequences alive at once (recurrent state slots; KV pages are shared from one pool).
    pub max_sequences: usize,
}

impl KvShape {
    /// Page ids travel as i32 in the block tables the kernels read.
    pub const MAX_PAGES: usize = i32::MAX as usize;
    /// The circuit's own bound on tokens per page.
    pub const MAX_BLOCK_SIZE: usize = solder_circuit::families::MAX_KV_BLOCK_SIZE;
    /// `max_position_embeddings`' bound (`DIM_BOUNDS`): no model reaches further.
    pub const MAX_SEQ_LEN: usize = 1 << 26;
    /// Recurrent-state slots (slot ids are u32; a million live sequences is far past any
    /// serve).
    pub const MAX_SEQUENCES: usize = 1 << 20;

    /// Each field within its range, refused by name (the state allocation's size is checked
    /// at build, once the model's state is known: `layout::check_state_bytes`).
    pub fn check(&self) -> Result<(), ExecError> {
        let fields = [
            (
                "KvShape::pages",
                self.pages,
                2,
                Self::MAX_PAGES,
                "one is the scratch page",
            ),
            (
                "KvShape::block_size",
                self.block_size,
                1,
                Self::MAX_BLOCK_SIZE,
                "tokens per page",
            ),
            (
                "KvShape::max_seq_len",
                self.max_seq_len,
                1,
                Self::MAX_SEQ_LEN,
                "longest sequence",
            ),
            (
                "KvShape::max_sequences",
                self.max_sequences,
                0,
                Self::MAX_SEQUENCES,
                "state slots",
            ),
        ];
        for (field, value, min, max, what) in fields {
            if !(min..=max).contains(&value) {
                return Err(ExecError::Argument {
                    field,
                    value: value.to_string(),
                    message: format!("must be {min}..={max} ({what})"),
                });
            }
        }
        Ok(())
    }
}

/// Everything a build needs.
pub struct Boot {
    pub config: ModelConfig,
    pub serve: ServeShape,
    pub rules: RuleSet,
    pub policy: Policy,
    pub weights: WeightSource,
    pub kv: KvShape,
    /// Each weight's stored format: by default the checkpoint's own formats where a reference
    /// kernel reads them (`PrecisionSpec::Policy(Tier::Native)`), else a tier or a per-tensor
    /// table (`solder_circuit::precision`).
    pub precision: solder_circuit::precision::PrecisionSpec,
}
