//! `GenerationConfig`: `generation_config.json` (an absent file gives transformers'
//! defaults) with `config.json`'s EOS ids merged in, as transformers' `generate` stops on
//! either. `eos_token_id` may be an integer or a list in both files (and `config.json`'s
//! may sit under `text_config`).

use std::path::Path;

use serde_json::Value;

use crate::error::TextError;
use crate::files;

/// What `generate` reads of a checkpoint's generation defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// Every id that ends generation: generation_config's first, then config.json's not
    /// already named.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    /// Whether the checkpoint samples by default (transformers: false, greedy).
    pub do_sample: bool,
    /// transformers' defaults: 1.0, 50, 1.0 (used only when `do_sample`).
    pub temperature: f64,
    pub top_k: u32,
    pub top_p: f64,
    pub max_new_tokens: Option<usize>,
}

impl Default for GenerationConfig {
    fn default() -> GenerationConfig {
        GenerationConfig {
            eos_token_ids: Vec::new(),
            bos_token_id: None,
            do_sample: false,
            temperature: 1.0,
            top_k: 50,
            top_p: 1.0,
            max_new_tokens: None,
        }
    }
}

impl GenerationConfig {
    /// `dir/generation_config.json` over the defaults, and `dir/config.json`'s EOS (and,
    /// when generation_config names none, BOS) ids.
    pub fn from_dir(dir: &Path) -> Result<GenerationConfig, TextError> {
        let mut config = GenerationConfig::default();
        let path = dir.join("generation_config.json");
        if let Some(json) = files::read_json_if_present(&path)? {
            let fields = Fields {
                json: &json,
                path: &path,
            };
            config.eos_token_ids = fields.ids("eos_token_id")?;
            config.bos_token_id = fields.ids("bos_token_id")?.first().copied();
            config.do_sample = fields
                .get("do_sample", Value::as_bool, "true or false")?
                .unwrap_or(false);
            config.temperature = fields
                .get("temperature", Value::as_f64, "a number")?
                .unwrap_or(config.temperature);
            config.top_k = match fields.get("top_k", Value::as_u64, "a whole number")? {
                Some(k) => u32::try_from(k).map_err(|_| fields.error("top_k", "too large"))?,
                None => config.top_k,
            };
            config.top_p = fields
                .get("top_p", Value::as_f64, "a number")?
                .unwrap_or(config.top_p);
            config.max_new_tokens = fields
                .get("max_new_tokens", Value::as_u64, "a whole number")?
                .map(|n| n as usize);
        }
        let model_path = dir.join("config.json");
        if let Some(json) = files::read_json_if_present(&model_path)? {
            let text = json.get("text_config").filter(|t| t.is_object());
            for scope in [Some(&json), text].into_iter().flatten() {
                let fields = Fields {
                    json: scope,
                    path: &model_path,
                };
                for id in fields.ids("eos_token_id")? {
                    if !config.eos_token_ids.contains(&id) {
                        config.eos_token_ids.push(id);
                    }
                }
                if config.bos_token_id.is_none() {
                    config.bos_token_id = fields.ids("bos_token_id")?.first().copied();
                }
            }
        }
        Ok(config)
    }

    /// The checkpoint's default sampling: `Some((temperature, top_k, top_p))` when it
    /// samples by default, `None` for greedy.
    pub fn sampling(&self) -> Option<(f64, u32, f64)> {
        self.do_sample
            .then_some((self.temperature, self.top_k, self.top_p))
    }
}

/// A JSON object's fields, errors naming the file and key.
struct Fields<'a> {
    json: &'a Value,
    path: &'a Path,
}

impl Fields<'_> {
    fn error(&self, key: &str, message: &str) -> TextError {
        TextError::Key {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            message: message.to_string(),
        }
    }

    /// Field `key` read by `read` (absent or null: `None`; any other shape refused).
    fn get<T>(
        &self,
        key: &str,
        read: impl Fn(&Value) -> Option<T>,
        expected: &str,
    ) -> Result<Option<T>, TextError> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => read(value)
                .map(Some)
                .ok_or_else(|| self.error(key, &format!("expected {expected}, got {value}"))),
        }
    }

    /// A token-id field: an integer, a list of integers, or absent/null (none).
    fn ids(&self, key: &str) -> Result<Vec<u32>, TextError> {
        let id = |value: &Value| value.as_u64().and_then(|v| u32::try_from(v).ok());
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| id(v).ok_or_else(|| self.error(key, &format!("{v} is not a token id"))))
                .collect(),
            Some(value) => id(value).map(|v| vec![v]).ok_or_else(|| {
                self.error(
                    key,
                    &format!("expected a token id or a list of them, got {value}"),
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir()
            .join(format!("solder-text-generation-{}", std::process::id()))
            .join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_absent_file_gives_transformers_defaults() {
        let dir = scratch("absent");
        let config = GenerationConfig::from_dir(&dir).unwrap();
        assert_eq!(config, GenerationConfig::default());
        assert_eq!(config.sampling(), None);
    }

    #[test]
    fn eos_ids_merge_int_and_list_forms() {
        let dir = scratch("merge");
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"eos_token_id": [2, 7], "bos_token_id": 1, "do_sample": true, "temperature": 0.6, "top_p": 0.9}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("config.json"),
            r#"{"eos_token_id": 9, "text_config": {"eos_token_id": [7, 11]}}"#,
        )
        .unwrap();
        let config = GenerationConfig::from_dir(&dir).unwrap();
        assert_eq!(config.eos_token_ids, [2, 7, 9, 11]);
        assert_eq!(config.bos_token_id, Some(1));
        assert_eq!(config.sampling(), Some((0.6, 50, 0.9)));
    }

    #[test]
    fn a_bad_field_is_named_with_its_file() {
        let dir = scratch("bad");
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"eos_token_id": "two"}"#,
        )
        .unwrap();
        let e = GenerationConfig::from_dir(&dir).unwrap_err().to_string();
        assert!(
            e.contains("generation_config.json") && e.contains("eos_token_id"),
            "{e}"
        );
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"temperature": [1]}"#,
        )
        .unwrap();
        let e = GenerationConfig::from_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("`temperature`"), "{e}");
    }
}
