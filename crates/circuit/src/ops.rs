//! The op vocabulary: every kind of node a circuit may hold, by its name in FUSIONS.toml.
//!
//! Invariant: [`OpKind::ALL`] lists every variant; names are unique and stable (rules and
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
    /// Zero-centred RMSNorm (qwen3_next): the weight applies as `1 + w`.
    RmsNormZc,
    /// Zero-centred per-head RMSNorm of q and k.
    QkNormZc,
    /// Splits q_proj's per-head `[q | gate]` output: q2 -> (q, gate).
    AttnGateSplit,
    /// x · sigmoid(gate): (x, gate) -> bf16 rows.
    SigmoidMul,
    /// Routed experts plus the sigmoid-gated shared expert: (routed, shared, gate) -> bf16.
    MoeCombine,
    /// Gated DeltaNet causal conv1d update over a per-sequence conv state, with SiLU:
    /// in_proj_qkvz rows -> mixed q/k/v channels (and the conv state edge).
    GdnConv,
    /// The gates from in_proj_ba, A_log and dt_bias: ba -> (beta, g), f32.
    GdnGates,
    /// The gated delta rule over a per-sequence f32 state: (mixed, beta, g) -> bf16 rows (and
    /// the recurrent state edge).
    GdnRecurrence,
    /// RMSNorm of each value head gated by SiLU(z): (core, qkvz) -> bf16 rows.
    GdnGatedNorm,
    /// The MTP draft head's input (qwen3_next): the zero-centred RMSNorms of the token's
    /// embedding (f32) and of the target's hidden row (bf16), side by side:
    /// (embed, hidden) -> bf16 `[n, 2 * hidden]`, embedding first.
    MtpPreFc,
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
        OpKind::RmsNormZc,
        OpKind::QkNormZc,
        OpKind::AttnGateSplit,
        OpKind::SigmoidMul,
        OpKind::MoeCombine,
        OpKind::GdnConv,
        OpKind::GdnGates,
        OpKind::GdnRecurrence,
        OpKind::GdnGatedNorm,
        OpKind::MtpPreFc,
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
            OpKind::RmsNormZc => "rms_norm_zc",
            OpKind::QkNormZc => "qk_norm_zc",
            OpKind::AttnGateSplit => "attn_gate_split",
            OpKind::SigmoidMul => "sigmoid_mul",
            OpKind::MoeCombine => "moe_combine",
            OpKind::GdnConv => "gdn_conv",
            OpKind::GdnGates => "gdn_gates",
            OpKind::GdnRecurrence => "gdn_recurrence",
            OpKind::GdnGatedNorm => "gdn_gated_norm",
            OpKind::MtpPreFc => "mtp_pre_fc",
        }
    }

    pub fn parse(name: &str) -> Option<OpKind> {
        OpKind::ALL.iter().copied().find(|k| k.as_str() == name)
    }

    pub fn names() -> Vec<&'static str> {
        OpKind::ALL.iter().map(|k| k.as_str()).collect()
    }
}
