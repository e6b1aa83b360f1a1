//! `TextError`: every failure of the text layer, naming the file, key or flag at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("text was asked for but {} has no tokenizer.json", dir.display())]
    NoTokenizer { dir: PathBuf },
    #[error(
        "a chat template was asked for but {} has none (no chat_template in \
         tokenizer_config.json and no chat_template.jinja)",
        dir.display()
    )]
    NoChatTemplate { dir: PathBuf },
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("{}: `{key}`: {message}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    #[error("chat template from {}: {message}", path.display())]
    Template { path: PathBuf, message: String },
    #[error("stop string {index} is empty: an empty stop string would stop before any text")]
    EmptyStop { index: usize },
    #[error("the stream already stopped ({reason}); no token may follow")]
    Ended { reason: &'static str },
}
