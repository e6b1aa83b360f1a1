//! Reading a checkpoint's text files: a regular file (not a folder, device or FIFO) under a
//! size cap, refused by path before anything is read, then parsed as JSON.

use std::io::Read as _;
use std::path::Path;

use crate::error::TextError;

/// The most bytes read from one file: large tokenizer.json files (Qwen's, Gemma's) are tens
/// of megabytes.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// The text of `path`: a regular UTF-8 file of at most `MAX_FILE_BYTES`.
pub fn read_text(path: &Path) -> Result<String, TextError> {
    let fail = |message: String| TextError::File {
        path: path.to_path_buf(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(fail(format!(
            "{} bytes, more than the {MAX_FILE_BYTES} read from a text file",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| fail(e.to_string()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(fail(format!("more than {MAX_FILE_BYTES} bytes")));
    }
    String::from_utf8(bytes).map_err(|e| fail(format!("not UTF-8: {e}")))
}

/// `path` parsed as JSON; `None` when the file does not exist (an optional file).
pub fn read_json_if_present(path: &Path) -> Result<Option<serde_json::Value>, TextError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(TextError::File {
                path: path.to_path_buf(),
                message: e.to_string(),
            })
        }
        Ok(_) => {}
    }
    let text = read_text(path)?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TextError::File {
            path: path.to_path_buf(),
            message: format!("not JSON: {e}"),
        })
}
