//! The one error type of the crate. Every message names the file (or the serve field, or the
//! lever) at fault, the key, and what was expected, so a refusal can be fixed from the message.

/// Why a model config, serve shape or lever setting was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read model config {file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("model config {file}: {problem}")]
    NotAConfigFile { file: String, problem: String },

    #[error("invalid JSON in {file} at line {line}, column {column}: {message}")]
    Json {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },

    #[error("{file}: the top level must be a JSON object, found {found}")]
    NotAnObject { file: String, found: String },

    #[error("{file}: missing required key `{key}`")]
    MissingKey { file: String, key: String },

    #[error("{file}: key `{key}` must be {expected}, found {found}")]
    WrongType {
        file: String,
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error("unknown key `{key}` in {file} (not a {family} config key solder knows)")]
    UnknownKey {
        file: String,
        key: String,
        family: String,
    },

    #[error(
        "{file}: key `model_type` = \"{model_type}\" is not supported \
         (solder models llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_next)"
    )]
    UnknownModelType { file: String, model_type: String },

    #[error(
        "{file}: key `model_type` = \"{model_type}\": the {model_type} family not yet modelled \
         (solder models llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_next)"
    )]
    FamilyNotModelled { file: String, model_type: String },

    #[error("{file}: key `{key}` = {value} is refused: {reason}")]
    Unsupported {
        file: String,
        key: String,
        value: String,
        reason: String,
    },

    #[error("{file}: key `{key}` = {value} is invalid: expected {expected}")]
    InvalidValue {
        file: String,
        key: String,
        value: String,
        expected: String,
    },

    #[error("{file}: key `{key}` = {value} is above its bound {max} ({reason}): refused so that every size computed from it fits")]
    OutOfBounds {
        file: String,
        key: String,
        value: String,
        max: usize,
        reason: &'static str,
    },

    #[error("serve shape: `{field}` {problem}")]
    ServeShape {
        field: &'static str,
        problem: String,
    },

    #[error("unknown lever `{name}` (known levers: {known})")]
    UnknownLever { name: String, known: String },
}
