//! The op vocabulary: every kind of node a circuit may hold, by its name in FUSIONS.toml.
//!
//! Invariant: `OpKind::ALL` lists every variant; names are unique and stable (rules and
//! digests refer to them).

/// Kinds of op. Adding one means adding a `reference` rule for it in FUSIONS.toml.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// tokens -> hidden rows (f32), gathered from the embedding table.
    Embedding,
    /// f32 rows -> bf16 normalised rows.
    RmsNorm,
    /// bf16 rows -> bf16 rows through one weight matrix (and optional bias).
    Linear,
    /// Per-head RMSNorm of q and k (qwen3): (q, k) -> (q, k).
    QkNorm,
    /// Rotary position embedding of q and k at each row's position: (q, k) -> (q, k).
    Rope,
    /// Writes each row's k and v into its KV page slot: (k, v) -> kv state.
    KvWrite,
    /// Paged attention of q over the cache: (q, kv state) -> bf16 rows.
    Attention,
    /// f32 residual rows + bf16 rows -> f32 rows.
    ResidualAdd,
    /// silu(gate) * up: (gate, up) -> bf16 rows.
    SiluMul,
    /// bf16 rows -> f32 logits through the output head.
    LmHead,
    /// bf16 rows -> f32 router logits, one per expert (MoE).
    Router,
    /// Router logits -> the top-k experts (i32 ids) and their f32 weights: softmax, top-k
    /// (ties to the lower expert id), optional renormalisation.
    TopkSoftmax,
    /// Each row's chosen experts' gate/up projections and SiLU·mul: (x, ids) -> bf16
    /// `[n, k * moe_intermediate]`.
    MoeGateUp,
    /// Each row's chosen experts' down projections, weighted and summed in top-k order:
    /// (act, ids, weights) -> bf16 rows.
    MoeDown,
}

impl OpKind {
    pub const ALL: &'static [OpKind] = &[
        OpKind::Embedding,
        OpKind::RmsNorm,
        OpKind::Linear,
        OpKind::QkNorm,
        OpKind::Rope,
        OpKind::KvWrite,
        OpKind::Attention,
        OpKind::ResidualAdd,
        OpKind::SiluMul,
        OpKind::LmHead,
        OpKind::Router,
        OpKind::TopkSoftmax,
        OpKind::MoeGateUp,
        OpKind::MoeDown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Embedding => "embedding",
            OpKind::RmsNorm => "rms_norm",
            OpKind::Linear => "linear",
            OpKind::QkNorm => "qk_norm",
            OpKind::Rope => "rope",
            OpKind::KvWrite => "kv_write",
            OpKind::Attention => "attention",
            OpKind::ResidualAdd => "residual_add",
            OpKind::SiluMul => "silu_mul",
            OpKind::LmHead => "lm_head",
            OpKind::Router => "router",
            OpKind::TopkSoftmax => "topk_softmax",
            OpKind::MoeGateUp => "moe_gate_up",
            OpKind::MoeDown => "moe_down",
        }
    }

    pub fn parse(name: &str) -> Option<OpKind> {
        OpKind::ALL.iter().copied().find(|k| k.as_str() == name)
    }

    pub fn names() -> Vec<&'static str> {
        OpKind::ALL.iter().map(|k| k.as_str()).collect()
    }
}
