//! Text for solder: what turns a prompt into token ids and token ids back into text, read
//! from a Hugging Face checkpoint folder.
//!
//! Entry points: [`Tokenizer::from_dir`] (`tokenizer.json` through Hugging Face's
//! `tokenizers`, special tokens from `tokenizer_config.json`), [`ChatTemplate::from_dir`]
//! (the chat template rendered as transformers' `apply_chat_template` renders it),
//! [`GenerationConfig::from_dir`] (`generation_config.json` merged with `config.json`'s EOS
//! ids) and [`TextStream`] (incremental detokenisation with stop conditions).
//!
//! Parts: `files` (reading a checkpoint's text files, capped), `config`
//! (`tokenizer_config.json`), `tokenizer`, `chat` (template, context and the functions
//! Hugging Face templates call), `generation`, `stream` (`detok`: the prefix-offset /
//! read-offset method; `stops`: stop strings held back while they may still match).
//!
//! Invariants: no network and no model code here — only files in the folder given; a
//! stream never emits half a UTF-8 character, nor any text of a stop string; every error
//! names the file (or the key in it) at fault.

mod chat;
mod config;
mod error;
mod files;
mod generation;
mod stream;
mod tokenizer;

pub use chat::{ChatTemplate, Message};
pub use config::{SpecialToken, TokenizerConfig};
pub use error::TextError;
pub use generation::GenerationConfig;
pub use stream::{StopConditions, StopReason, StreamStep, TextStream};
pub use tokenizer::Tokenizer;
