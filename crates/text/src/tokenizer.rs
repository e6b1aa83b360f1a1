//! `Tokenizer`: a checkpoint's `tokenizer.json` through Hugging Face's `tokenizers` (the
//! same code transformers' fast tokenizers run), with the special tokens
//! `tokenizer_config.json` names resolved to ids.
//!
//! Invariant: every special token the config names is in the tokenizer's vocabulary (one
//! that is not is refused by key when the tokenizer is loaded).

use std::path::{Path, PathBuf};
use std::str::FromStr as _;

use crate::config::TokenizerConfig;
use crate::error::TextError;
use crate::files;

/// A loaded tokenizer and its special tokens.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `tokenizer.json`: what errors name.
    path: PathBuf,
    config: TokenizerConfig,
    bos: Option<u32>,
    eos: Option<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// `dir/tokenizer.json`, with `dir/tokenizer_config.json`'s special tokens when present.
    /// A folder without `tokenizer.json` is refused by `TextError::NoTokenizer`.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TextError> {
        let path = dir.join("tokenizer.json");
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TextError::NoTokenizer {
                    dir: dir.to_path_buf(),
                })
            }
            _ => {}
        }
        let text = files::read_text(&path)?;
        let inner = tokenizers::Tokenizer::from_str(&text).map_err(|e| TextError::Tokenizer {
            path: path.clone(),
            message: format!("not a tokenizer this version of `tokenizers` loads: {e}"),
        })?;
        let config = TokenizerConfig::from_dir(dir)?;
        let id_of = |key: &str| -> Result<Option<u32>, TextError> {
            let Some(content) = config.special(key) else {
                return Ok(None);
            };
            inner
                .token_to_id(content)
                .map(Some)
                .ok_or_else(|| TextError::Key {
                    path: config.path.clone(),
                    key: key.to_string(),
                    message: format!("`{content}` is not in {}", path.display()),
                })
        };
        let (bos, eos) = (id_of("bos_token")?, id_of("eos_token")?);
        Ok(Tokenizer {
            inner,
            path,
            config,
            bos,
            eos,
        })
    }

    /// The token ids of `text`; `add_special_tokens` runs the tokenizer's post-processor
    /// (a BOS, for tokenizers that add one), as transformers' `encode` does by default. A
    /// rendered chat is encoded without it: the template wrote its special tokens.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| self.fail(format!("encoding failed: {e}")))
    }

    /// The text of `ids`; `skip_special_tokens` leaves out special tokens' text (what a
    /// stream shows; transformers' `decode` keeps them by default). Ids outside the
    /// vocabulary contribute nothing.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| self.fail(format!("decoding {} ids failed: {e}", ids.len())))
    }

    /// One more than the largest id the tokenizer can produce (added tokens included): a
    /// model's vocabulary must be at least this wide.
    pub fn id_limit(&self) -> usize {
        self.inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&id| id as usize + 1)
    }

    /// The id of a token's text (a special token's, say).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// What `tokenizer_config.json` said (special tokens, chat template).
    pub fn config(&self) -> &TokenizerConfig {
        &self.config
    }

    /// The `tokenizer.json` it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn fail(&self, message: String) -> TextError {
        TextError::Tokenizer {
            path: self.path.clone(),
            message,
        }
    }
}
