//! `tokenizer_config.json`: the special tokens (each a string or an `{"content": ..}`
//! object, as transformers writes `AddedToken`s) and the chat template (a string, or a list
//! of `{name, template}` of which `default` is taken). An absent file gives neither.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::TextError;
use crate::files;

/// The special-token keys transformers' `special_tokens_map` holds, in its order.
const SPECIAL_KEYS: &[&str] = &[
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// One special token named by `tokenizer_config.json`: its text (its id comes from the
/// tokenizer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// The key that names it (`bos_token`, `eos_token`, ...).
    pub key: &'static str,
    pub content: String,
}

/// What `tokenizer_config.json` says that the text layer reads.
#[derive(Debug, Clone, Default)]
pub struct TokenizerConfig {
    /// The file read (or that would have been, when absent).
    pub path: PathBuf,
    /// Special tokens present, in `SPECIAL_KEYS` order.
    pub special: Vec<SpecialToken>,
    /// `additional_special_tokens`, as texts.
    pub additional_special: Vec<String>,
    /// The default chat template, when the file has one.
    pub chat_template: Option<String>,
}

impl TokenizerConfig {
    /// `dir/tokenizer_config.json`; an absent file is an empty config.
    pub fn from_dir(dir: &Path) -> Result<TokenizerConfig, TextError> {
        let path = dir.join("tokenizer_config.json");
        let Some(json) = files::read_json_if_present(&path)? else {
            return Ok(TokenizerConfig {
                path,
                ..TokenizerConfig::default()
            });
        };
        let key_error = |key: &str, message: &str| TextError::Key {
            path: path.clone(),
            key: key.to_string(),
            message: message.to_string(),
        };
        if !json.is_object() {
            return Err(TextError::File {
                path,
                message: "not a JSON object".into(),
            });
        }
        let mut special = Vec::new();
        for &key in SPECIAL_KEYS {
            match json.get(key) {
                None | Some(Value::Null) => {}
                Some(value) => special.push(SpecialToken {
                    key,
                    content: token_text(value).ok_or_else(|| {
                        key_error(
                            key,
                            "expected a string or an object with a string `content`",
                        )
                    })?,
                }),
            }
        }
        let additional_special = match json.get("additional_special_tokens") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    token_text(item).ok_or_else(|| {
                        key_error(
                            "additional_special_tokens",
                            "expected strings or objects with a string `content`",
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(key_error("additional_special_tokens", "expected a list")),
        };
        let chat_template = match json.get("chat_template") {
            None | Some(Value::Null) => None,
            Some(value) => {
                Some(default_template(value).map_err(|m| key_error("chat_template", &m))?)
            }
        };
        Ok(TokenizerConfig {
            path,
            special,
            additional_special,
            chat_template,
        })
    }

    /// The text of special token `key` (`"bos_token"`, ...), when the file names one.
    pub fn special(&self, key: &str) -> Option<&str> {
        self.special
            .iter()
            .find(|t| t.key == key)
            .map(|t| t.content.as_str())
    }
}

/// A token as transformers writes it: `"<s>"` or `{"content": "<s>", ...}`.
fn token_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Object(map) => map.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The default template of a `chat_template` value: the string, or the `default` entry of a
/// list of `{name, template}`.
fn default_template(value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(entries) => {
            let mut names = Vec::new();
            for entry in entries {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(template)) => return Ok(template.to_string()),
                    (Some(name), Some(_)) => names.push(name.to_string()),
                    _ => {
                        return Err(
                            "each entry of a list must be {\"name\": .., \"template\": ..}".into(),
                        )
                    }
                }
            }
            Err(format!(
                "no template named `default` (it names: {})",
                names.join(", ")
            ))
        }
        _ => Err("expected a string or a list of {name, template}".into()),
    }
}
