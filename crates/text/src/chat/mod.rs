//! `ChatTemplate`: a checkpoint's chat template rendered as transformers'
//! `apply_chat_template` renders it — Jinja with `trim_blocks` and `lstrip_blocks` on,
//! `keep_trailing_newline` off, no auto-escaping; `messages`, `add_generation_prompt` and the
//! special-token map (`bos_token`, `eos_token`, ...) in the context; the functions and filters
//! Hugging Face templates call (`functions`).
//!
//! Where the template comes from: `chat_template.jinja` beside `tokenizer_config.json` when
//! present (transformers: "takes priority over template entries in the tokenizer config"),
//! else `tokenizer_config.json`'s `chat_template` (a string, or the `default` of a list).
//!
//! Invariant: the template is compiled when loaded, so a syntax error is refused by file
//! before any prompt is rendered; every error names the file the template came from.

mod clock;
mod functions;
mod tojson;

use std::path::{Path, PathBuf};

use minijinja::{AutoEscape, Environment, Value};

use crate::config::TokenizerConfig;
use crate::error::TextError;
use crate::files;

/// The name the template is registered under in its environment.
const NAME: &str = "chat_template";

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant` (templates may know others).
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A compiled chat template and the special tokens its context carries.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The file the template came from.
    path: PathBuf,
    /// `bos_token`, `eos_token`, ... and `additional_special_tokens`, as transformers'
    /// `special_tokens_map`.
    specials: Vec<(String, Value)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The chat template of checkpoint folder `dir` (see the module doc for where it is
    /// looked for); a folder with none is refused by `TextError::NoChatTemplate`.
    pub fn from_dir(dir: &Path) -> Result<ChatTemplate, TextError> {
        let config = TokenizerConfig::from_dir(dir)?;
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            let source = files::read_text(&jinja)?;
            return ChatTemplate::new(source, jinja, &config);
        }
        match &config.chat_template {
            Some(source) => ChatTemplate::new(source.clone(), config.path.clone(), &config),
            None => Err(TextError::NoChatTemplate {
                dir: dir.to_path_buf(),
            }),
        }
    }

    /// `source` compiled, read from `path` (what errors name), with `config`'s special
    /// tokens in its context.
    pub fn new(
        source: String,
        path: PathBuf,
        config: &TokenizerConfig,
    ) -> Result<ChatTemplate, TextError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| template_error(&path, e))?;
        env.set_syntax(syntax);
        // transformers' sandboxed environment escapes nothing, whatever the file is called.
        env.set_auto_escape_callback(|_| AutoEscape::None);
        functions::install(&mut env);
        env.add_template_owned(NAME, source)
            .map_err(|e| template_error(&path, e))?;
        let mut specials: Vec<(String, Value)> = config
            .special
            .iter()
            .map(|t| (t.key.to_string(), Value::from(t.content.clone())))
            .collect();
        if !config.additional_special.is_empty() {
            specials.push((
                "additional_special_tokens".into(),
                config.additional_special.iter().cloned().collect(),
            ));
        }
        Ok(ChatTemplate {
            env,
            path,
            specials,
        })
    }

    /// The prompt text of `messages`; `add_generation_prompt` ends it with the opening of
    /// an assistant turn (when the template honours it).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let messages: Value = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.clone())),
                    ("content", Value::from(m.content.clone())),
                ])
            })
            .collect();
        let mut context: Vec<(String, Value)> = self.specials.clone();
        context.push(("messages".into(), messages));
        context.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| template_error(&self.path, e))?;
        template
            .render(Value::from_pairs(context))
            .map_err(|e| template_error(&self.path, e))
    }

    /// The file the template came from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A template error with its cause chain (minijinja puts the line in the detail).
fn template_error(path: &Path, error: minijinja::Error) -> TextError {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    TextError::Template {
        path: path.to_path_buf(),
        message,
    }
}
