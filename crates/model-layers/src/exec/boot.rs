//! What a build is given (`Boot`): the model's config, the serve shape, the rules and
//! policy, where the weights come from (`WeightSource`) and the KV cache's shape (`KvShape`,
//! each field checked against its range before anything is allocated).

use std::path::PathBuf;

use solder_circuit::{CircuitOptions, Instance, Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::GpuBackend;

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

/// How many KV pages to allocate: a count, or a byte budget that `resolve` turns into pages
/// by the bytes one page takes in every attention layer (K and V; the recurrent-state region
/// is not counted). vLLM sizes its pool the same way (`gpu_memory_utilization` of the free
/// memory, divided by one block's bytes across layers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// Exactly this many pages (the scratch page among them).
    Pages(usize),
    /// As many pages as fit in this many bytes.
    Bytes(usize),
    /// As many pages as fit in this fraction (0, 1] of the device's free memory.
    FreeFraction(f64),
}

impl KvBudget {
    /// The page count this budget holds at `page_bytes` per page, given the device's free
    /// bytes (`None`: the backend cannot say, and a `FreeFraction` is refused by name).
    /// Refused, naming the budget, when it holds fewer than `min_pages` (the scratch page and
    /// the pages one sequence of the widest program needs: `KvShape::min_pages`).
    pub fn resolve(
        &self,
        page_bytes: usize,
        min_pages: usize,
        free_bytes: Option<usize>,
    ) -> Result<usize, ExecError> {
        let refuse = |field: &'static str, value: String, message: String| ExecError::Argument {
            field,
            value,
            message,
        };
        if page_bytes == 0 {
            return Err(refuse(
                "KvBudget",
                format!("{self:?}"),
                "the model has no attention layer, so a KV page takes no bytes".into(),
            ));
        }
        let (field, value, pages) = match *self {
            KvBudget::Pages(pages) => ("KvBudget::Pages", pages.to_string(), pages),
            KvBudget::Bytes(bytes) => ("KvBudget::Bytes", bytes.to_string(), bytes / page_bytes),
            KvBudget::FreeFraction(fraction) => {
                let value = fraction.to_string();
                if !(fraction > 0.0 && fraction <= 1.0) {
                    return Err(refuse(
                        "KvBudget::FreeFraction",
                        value,
                        "must be in (0, 1]".into(),
                    ));
                }
                let Some(free) = free_bytes else {
                    return Err(refuse(
                        "KvBudget::FreeFraction",
                        value,
                        "this backend does not report its free memory; give Pages or Bytes".into(),
                    ));
                };
                let bytes = (free as f64 * fraction) as usize;
                ("KvBudget::FreeFraction", value, bytes / page_bytes)
            }
        };
        if pages < min_pages {
            return Err(refuse(
                field,
                value,
                format!(
                    "holds {pages} KV page(s) of {page_bytes} bytes; one sequence of the widest \
                     program needs {min_pages} (the scratch page among them)"
                ),
            ));
        }
        Ok(pages.min(KvShape::MAX_PAGES))
    }
}

/// Bytes one KV page takes across every attention layer of `circuit`: each layer's K and V
/// for `block_size` tokens (the recurrent-state slots are not pages and are not counted).
pub fn kv_page_bytes(circuit: &solder_circuit::ir::Circuit) -> usize {
    circuit
        .states
        .iter()
        .map(|decl| match decl.kind {
            solder_circuit::ir::StateKind::KvPages {
                block_size,
                num_kv_heads,
                head_dim,
                dtype,
                ..
            } => 2 * block_size * num_kv_heads * head_dim * dtype.size_bytes(),
            _ => 0,
        })
        .sum()
}

impl KvShape {
    /// Pages the pool must hold to serve one sequence of `max_seq_len` tokens: its pages and
    /// the scratch page.
    pub fn min_pages(&self) -> usize {
        self.max_seq_len.div_ceil(self.block_size.max(1)) + 1
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

impl Boot {
    /// Sizes the KV pool (`kv.pages`) from `budget`: the pages that fit at the bytes one page
    /// takes across the model's attention layers (`kv_page_bytes`, at `kv.block_size`). A
    /// `FreeFraction` is of the memory `backend` reports free less the weights' bytes, which
    /// the build has yet to allocate (vLLM subtracts what the model takes the same way; the
    /// workspace, a few MiB to a few hundred, is left to the fraction's headroom); refused by
    /// name where the backend cannot say (the CPU backend). Refused, naming the budget, below
    /// the pages one sequence of `kv.max_seq_len` tokens needs.
    pub fn with_kv_budget(
        mut self,
        budget: KvBudget,
        backend: &dyn GpuBackend,
    ) -> Result<Boot, ExecError> {
        let options = CircuitOptions {
            kv_block_size: self.kv.block_size,
        };
        let instance = Instance::from_config_precision(
            &self.config,
            self.serve.clone(),
            options,
            &self.precision,
            &self.rules,
        )?;
        let circuit = &instance.circuit;
        let page_bytes = kv_page_bytes(circuit);
        let weights: usize = circuit.weights.iter().map(|w| w.bytes()).sum();
        let free = backend
            .free_memory()
            .map(|free| free.saturating_sub(weights));
        self.kv.pages = budget.resolve(page_bytes, self.kv.min_pages(), free)?;
        tracing::info!(
            ?budget,
            page_bytes,
            pages = self.kv.pages,
            "KV pool sized from its budget"
        );
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_budget_becomes_whole_pages_or_is_refused_by_name() {
        let shape = KvShape {
            pages: 0,
            block_size: 16,
            max_seq_len: 100,
            max_sequences: 1,
        };
        let min = shape.min_pages();
        assert_eq!(min, 8, "7 pages of 16 for 100 tokens, and the scratch page");
        assert_eq!(
            KvBudget::Bytes(10 * 1024 + 1023)
                .resolve(1024, min, None)
                .unwrap(),
            10
        );
        assert_eq!(KvBudget::Pages(9).resolve(1024, min, None).unwrap(), 9);
        assert_eq!(
            KvBudget::FreeFraction(0.5)
                .resolve(1024, min, Some(40 * 1024))
                .unwrap(),
            20
        );
        let refused = KvBudget::Bytes(7 * 1024)
            .resolve(1024, min, None)
            .unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains("KvBudget::Bytes") && message.contains("needs 8"),
            "{message}"
        );
        let unknown = KvBudget::FreeFraction(0.9)
            .resolve(1024, min, None)
            .unwrap_err();
        assert!(unknown.to_string().contains("free memory"), "{unknown}");
        for fraction in [0.0, 1.5, f64::NAN] {
            assert!(KvBudget::FreeFraction(fraction)
                .resolve(1024, min, Some(1 << 30))
                .is_err());
        }
    }
}
