//! Every file xtask opens itself: a regular file (not a device, FIFO or folder) under a size
//! cap, refused with an error naming the path before anything is read. Configs go through
//! `ModelConfig::from_file`, which makes the same check.

use std::io::Read as _;
use std::path::Path;

use solder_config::ModelConfig;

/// JSON and TOML (configs, reports, rules): the shipped ones are kilobytes.
pub const TEXT_CAP: u64 = 64 << 20;
/// Golden logits files, read whole (`T * V * 4 * 2` bytes: 64 tokens of a 150k vocabulary
/// are 77 MB).
pub const GOLDEN_CAP: u64 = 1 << 30;

/// The size of `path`, which must be a regular file of at most `cap` bytes.
pub fn check_regular(path: &Path, cap: u64) -> Result<u64, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    if meta.len() > cap {
        return Err(format!(
            "{}: {} bytes, more than the {cap} xtask reads from such a file",
            path.display(),
            meta.len()
        ));
    }
    Ok(meta.len())
}

/// The bytes of `path` (checked by `check_regular`; one byte past the cap is refused too,
/// for a file that grows while read).
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, String> {
    check_regular(path, cap)?;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(cap + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > cap {
        return Err(format!("{}: more than {cap} bytes", path.display()));
    }
    Ok(bytes)
}

pub fn read_text(path: &Path) -> Result<String, String> {
    String::from_utf8(read_capped(path, TEXT_CAP)?)
        .map_err(|e| format!("{}: not UTF-8: {e}", path.display()))
}

/// `ModelConfig::from_file`, which itself reads only a regular file under its own cap
/// (`solder_config::MAX_CONFIG_BYTES`), with its error as text.
pub fn model_config(path: &Path) -> Result<ModelConfig, String> {
    ModelConfig::from_file(path).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_folders_are_refused_by_path() {
        let e = model_config(Path::new("/dev/zero")).unwrap_err();
        assert!(
            e.contains("/dev/zero") && e.contains("not a regular file"),
            "{e}"
        );
        let e = read_text(&std::env::temp_dir()).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_file_over_the_cap_is_refused() {
        let path = std::env::temp_dir().join(format!("xtask-files-{}.json", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(TEXT_CAP + 1).unwrap();
        let e = read_text(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(e.contains("more than"), "{e}");
    }
}
