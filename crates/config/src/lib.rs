//! `solder-config` owns what solder reads about a model and a serve before it compiles
//! anything: [`ModelConfig`] parsed from a Hugging Face `config.json` (dense llama, mistral,
//! qwen2, qwen3; qwen3_moe with routed experts; qwen3_next with Gated DeltaNet layers, gated
//! attention and a shared expert; sliding-window attention per layer, `layer_windows`, as
//! transformers 5 assigns it; the [`Quantization`] of a quantized checkpoint), the rope's
//! inverse frequencies, the [`Levers`] a build may turn on, and the [`ServeShape`] whose widths
//! get programs.
//!
//! Invariants:
//! - No GPU and no I/O beyond reading the one file [`ModelConfig::from_file`] is handed.
//! - Every top-level key of a config, and every key inside its `quantization_config`, is
//!   classified (used, or ignored with a reason) or the load is refused; nothing is dropped
//!   silently. A feature solder does not model (a quantization method or setting other than
//!   weight-only fp8 e4m3 block/channel/tensor scales and 4-bit AWQ GEMM / GPTQ, another rope
//!   type, another activation, a bias, another layer type) refuses the load, and so does a
//!   window of 0 or past `max_position_embeddings`.
//! - No input panics: every refusal is a [`ConfigError`] naming the file and the key.
//! - Every dimension is at most its [`DIM_BOUNDS`] entry and every float a normal f32, so no
//!   size computed from a config overflows.

#![forbid(unsafe_code)]

mod bounds;
mod error;
mod family;
mod features;
mod fields;
pub mod file_guard;
mod hybrid;
pub mod json_keys;
mod keys;
mod levers;
mod model;
mod moe;
mod quant;
mod rope;
mod serve;
mod shape;
mod window;

pub use bounds::{dim_bound, DimBound, DIM_BOUNDS};
pub use error::ConfigError;
pub use family::Family;
pub use hybrid::{LayerType, LinearAttnConfig};
pub use keys::{KeyClass, KeyReport};
pub use levers::{Levers, KNOWN_LEVERS};
pub use model::{ModelConfig, MAX_CONFIG_BYTES};
pub use moe::MoeConfig;
pub use quant::{Fp8Strategy, Quantization};
pub use rope::{Rope, RopeScaling};
pub use serve::{
    ServeShape, DEFAULT_MULTI_SEQ_LADDER, DEFAULT_SPECULATIVE_ROWS, MAX_BATCH, MAX_ROWS,
    MAX_VERIFY_WIDTH,
};
