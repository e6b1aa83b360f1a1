//! [`Levers`]: the named runtime switches a build may turn on. Invariant: only names listed in
//! [`KNOWN_LEVERS`] are ever enabled, so a rule gated on a lever can trust the name.

use std::collections::BTreeSet;

use crate::ConfigError;

/// Every lever solder knows, with what turning it on does.
pub const KNOWN_LEVERS: &[(&str, &str)] = &[
    (
        "fast_exp",
        "reserved for a `differs` rule with an approximate exponential in softmax and SiLU: no \
         rule or kernel uses it yet, so turning it on changes nothing",
    ),
    (
        "split_rope_kv",
        "rope (and qk-norm) and the KV write in their own launch after q/k/v, not in the \
         projection's epilogue: the six-launch layer, kept for A/B timing; same logits",
    ),
    (
        "pdl",
        "programmatic dependent launch: each kernel may start while the previous one on its \
         stream drains; same bytes",
    ),
    (
        "fold_o_proj",
        "o projection folded into attention: 4 launches per dense layer; per-head partial dots \
         summed in head order, so logits differ in the last bits",
    ),
    (
        "gemv_classic",
        "the classic gemv entries (one block per 8 features and 8 rows, norm recomputed per \
         block) instead of the streaming ones (a capped grid of persistent blocks per row \
         tile): kept for A/B timing; same plans, same logits",
    ),
    (
        "gemv_unsplit",
        "every gemv launch unsplit: no split-K over grid.z for streaming launches with few \
         blocks (each dot's segment sums merged in order by the last split), no split heads \
         for qkv_rope_kv (one block per head): kept for A/B timing; same plans, same logits",
    ),
    (
        "qkv_norm_ahead",
        "qkv_rope_kv's entry that asks L2 for its weight rows before waiting on the previous \
         launch and computes the row norm from one pass of independent loads (the same order): \
         kept for A/B timing; same plans, same logits",
    ),
    (
        "attn_prefetch",
        "paged_decode's entry that issues its loads ahead of their use (the next tile's \
         page-table entry and K/V rows before the tile is consumed, K 4 16-byte chunks at a \
         time, V 16 bytes a lane for 4 keys at once): kept for A/B timing; same plans, same \
         logits",
    ),
    (
        "split_two_waves",
        "split-K and split heads sized to 528 blocks (4 per SM: two waves at the 2 blocks per SM \
         ptxas's registers give the streaming entries and qkv_rope_kv) instead of one wave of \
         264 resident blocks, the default since the device measured it faster: kept for A/B \
         timing; same plans, same logits",
    ),
    (
        "mma_large",
        "the tensor-core projections gemm::linear_mma, lm_head_mma, gate_up_silu_mma, qkv_mma, \
         qkv_rope_kv_mma and its qk-norm layouts (bf16, fp8 and int4 weights) and \
         linear_pair_mma (not the MoE experts) of programs of at least 128 rows \
         (prefill chunks, wide batches) whose large grid has a block for each of the 132 SMs \
         through their _large entries (tiles of 128 rows x 64 features in blocks of eight \
         warps, each warp 32 rows x 32 features: twice the arithmetic per staged byte and per \
         shared-memory read of the 64 x 32 tile, and a quantized weight dequantised once per \
         128 rows): kept for A/B timing with tensor_cores; same plans, same logits",
    ),
    (
        "mma_pipe",
        "with mma_large, the bf16 projections gemm::linear_mma, gate_up_silu_mma, lm_head_mma, \
         qkv_mma and linear_pair_mma it takes through their _large entries through their _pipe \
         entries instead: the same 128 x 64 tiles and warps, with three 64-k tiles in flight a \
         block in dynamic shared memory (81 KB, 108 KB for gate/up; opted in past 48 KB), \
         filled by cp.async, where _large stages one tile at a time through registers: kept for \
         A/B timing of prefill chunks; same plans, same logits",
    ),
    (
        "mma_narrow",
        "the tensor-core projections (gemm::linear_mma, lm_head_mma, gate_up_silu_mma, \
         linear_pair_mma, qkv_rope_kv_mma and its qk-norm layouts; bf16, fp8 and int4 weights; \
         not the MoE experts') of programs of at most 16 rows through their _narrow entries \
         (16 rows a pass, a warp per 8 features, k 256 a stage for bf16 and 128 for quantized \
         weights: more weight bytes in flight a block, no mma.sync on absent rows): kept for \
         A/B timing of decode widths with tensor_cores; same plans, same logits",
    ),
    (
        "tensor_cores",
        "projections (linear, LM head; an MoE router stays on gemv) on the tensor cores \
         (gemm::linear_mma, gemm::lm_head_mma: mma.sync m16n8k16; q/k/v and gate/up+SiLU·mul \
         fused as gemm::qkv_mma, gemm::gate_up_silu_mma; bf16 routed experts' gate/up as \
         gemm::experts_gate_up_silu_mma) at every width, instead of \
         gemv's CUDA-core dots: sums in another order, so logits differ in the last bits \
         (`differs`); a sequence's bytes still do not depend on the width or row it runs in",
    ),
    (
        "gdn_chunked",
        "Gated DeltaNet's recurrence of a prompt's chunks (prefill programs, and verify \
         programs wider than the serve's speculative_rows) in its chunked form (gdn::chunked, \
         gdn::gates_chunked: chunks of 16 rows, their pair dots, outputs and state columns in \
         parallel, only a substitution over the chunk's rows in order) instead of row by row: \
         the same values in exact arithmetic, summed in another order, so logits differ in the \
         last bits (`differs`); decode, speculative verify and wide steps keep the recurrence; \
         with tensor_cores on too, the chunks' pair, first-state and update products run on \
         the tensor cores (gdn::gates_chunked_mma: mma.sync m16n8k8, TF32 operands); a \
         prompt's bytes depend on its chunking (`by_chunk`)",
    ),
];

/// The set of levers turned on; all off by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Levers {
    /// Names borrowed from `KNOWN_LEVERS`; a BTreeSet keeps `enabled()` sorted.
    enabled: BTreeSet<&'static str>,
}

impl Levers {
    /// Turns `name` on or off; an unknown name is refused with the list of known ones.
    pub fn set(&mut self, name: &str, on: bool) -> Result<(), ConfigError> {
        let Some((known, _)) = KNOWN_LEVERS.iter().find(|(known, _)| *known == name) else {
            let known: Vec<&str> = KNOWN_LEVERS.iter().map(|(known, _)| *known).collect();
            return Err(ConfigError::UnknownLever {
                name: name.to_string(),
                known: known.join(", "),
            });
        };
        if on {
            self.enabled.insert(known);
        } else {
            self.enabled.remove(known);
        }
        Ok(())
    }

    pub fn is_on(&self, name: &str) -> bool {
        self.enabled.contains(name)
    }

    pub fn is_known(name: &str) -> bool {
        KNOWN_LEVERS.iter().any(|(known, _)| *known == name)
    }

    /// The levers turned on, sorted by name.
    pub fn enabled(&self) -> impl Iterator<Item = &str> {
        self.enabled.iter().copied()
    }
}
