//! The one check every file solder reads by path goes through before a byte is read: a
//! regular file (not a device, FIFO, socket or folder) of at most a cap the caller states.
//! Configs, rules, a checkpoint's index and every shard use it, so `/dev/zero` or a FIFO is
//! refused instead of read without end, and a sparse 3 GiB index is refused by its length.
//!
//! Invariant: [`read_capped`] never holds more than `cap + 1` bytes, and [`open_regular`] hands
//! back only a handle whose own metadata (checked after the open, so a file swapped for a
//! FIFO between the check and the open is caught) says a regular file within the cap.

use std::fs::File;
use std::io::Read as _;
use std::path::Path;

/// Why a file was not read. Its text does not name the path: the caller's error does.
#[derive(Debug, thiserror::Error)]
pub enum FileRefusal {
    #[error("cannot be read: {0}")]
    Io(#[from] std::io::Error),
    #[error("is not a regular file (a device, FIFO or folder is never read)")]
    NotRegular,
    #[error("is {len} bytes, larger than the {cap} bytes such a file may hold")]
    TooLarge { len: u64, cap: u64 },
}

fn check_meta(meta: &std::fs::Metadata, cap: u64) -> Result<u64, FileRefusal> {
    if !meta.is_file() {
        return Err(FileRefusal::NotRegular);
    }
    if meta.len() > cap {
        return Err(FileRefusal::TooLarge {
            len: meta.len(),
            cap,
        });
    }
    Ok(meta.len())
}

/// The length of `path`, which must be a regular file of at most `cap` bytes (nothing is
/// opened: a FIFO is refused without blocking).
pub fn check_regular(path: &Path, cap: u64) -> Result<u64, FileRefusal> {
    check_meta(&std::fs::metadata(path)?, cap)
}

/// `path` opened for reading once `check_regular` passed, and checked again through the
/// handle; returns the handle and its length.
pub fn open_regular(path: &Path, cap: u64) -> Result<(File, u64), FileRefusal> {
    check_regular(path, cap)?;
    let file = File::open(path)?;
    let len = check_meta(&file.metadata()?, cap)?;
    Ok((file, len))
}

/// The bytes of `path` (checked by `open_regular`); a file that grew past the cap while read
/// is refused too (one byte past it is read, never more).
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, FileRefusal> {
    let (file, len) = open_regular(path, cap)?;
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    let read = bytes.len() as u64;
    if read > cap {
        return Err(FileRefusal::TooLarge { len: read, cap });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_folders_are_refused_before_a_read() {
        for path in ["/dev/zero", "/", "/dev/null"] {
            let refused = read_capped(Path::new(path), 1 << 20).unwrap_err();
            assert!(
                matches!(refused, FileRefusal::NotRegular),
                "{path}: {refused}"
            );
        }
    }

    #[test]
    fn a_file_over_the_cap_is_refused_by_its_length() {
        let dir = std::env::temp_dir().join(format!("solder-guard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big");
        let file = File::create(&path).unwrap();
        // Sparse: a length, no blocks.
        file.set_len(3 << 30).unwrap();
        let refused = read_capped(&path, 64 << 20).unwrap_err();
        assert!(
            matches!(refused, FileRefusal::TooLarge { len, .. } if len == 3 << 30),
            "{refused}"
        );
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(read_capped(&path, 3).unwrap(), b"abc");
        assert!(read_capped(&path, 2).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
