//! One safetensors file, mapped, its header parsed once into a table of its tensors.
//!
//! Invariant: every entry's byte range lies inside the mapping (the header's offsets were
//! checked against the file's length when it was parsed).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use solder_config::file_guard::{open_regular, FileRefusal};

use crate::error::WeightsError;

/// The largest safetensors file mapped: 1 TiB (published shards are a few GiB; the cap only
/// refuses a length nothing real has).
pub const MAX_SHARD_BYTES: u64 = 1 << 40;

/// Where one tensor's bytes are in its file.
pub struct TensorEntry {
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    /// Byte range in the whole file (header included).
    pub bytes: Range<usize>,
}

/// A mapped safetensors file and its parsed header.
pub struct ShardFile {
    pub path: PathBuf,
    pub mmap: Mmap,
    pub tensors: BTreeMap<String, TensorEntry>,
}

impl ShardFile {
    /// Maps `path` and parses its header (the only parse of it a checkpoint makes).
    pub fn open(path: &Path) -> Result<ShardFile, WeightsError> {
        let io = |e: std::io::Error| WeightsError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        // A FIFO, device or folder is refused before it is opened (a FIFO's open blocks).
        let (file, _len) =
            open_regular(path, MAX_SHARD_BYTES).map_err(|refusal| match refusal {
                FileRefusal::Io(e) => io(e),
                other => WeightsError::Format {
                    path: path.to_path_buf(),
                    message: format!("a checkpoint file {other}"),
                },
            })?;
        // SAFETY: the mapping is read-only; a file changed under us while mapped is outside
        // what solder promises (as for every engine that maps checkpoints).
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|e| WeightsError::Format {
                path: path.to_path_buf(),
                message: format!("not a valid safetensors file (truncated?): {e}"),
            })?;
        // safetensors parses the header with serde_json, which keeps the last of two equal
        // keys: a tensor named twice is refused, naming it, not resolved last-wins.
        let header = mmap
            .get(8..8usize.saturating_add(header_len))
            .unwrap_or_default();
        solder_config::json_keys::first_duplicate(header).map_err(|e| WeightsError::Format {
            path: path.to_path_buf(),
            message: format!("header: {e}"),
        })?;
        // The 8-byte length prefix, then the header, then the data the offsets index.
        let data_start = 8usize.saturating_add(header_len);
        let mut tensors = BTreeMap::new();
        for (name, info) in metadata.tensors() {
            let (start, end) = info.data_offsets;
            let bytes = data_start.saturating_add(start)..data_start.saturating_add(end);
            if bytes.start > bytes.end || bytes.end > mmap.len() {
                return Err(WeightsError::Format {
                    path: path.to_path_buf(),
                    message: format!(
                        "tensor `{name}`: data offsets {start}..{end} lie outside the file"
                    ),
                });
            }
            let entry = TensorEntry {
                dtype: info.dtype,
                shape: info.shape.clone(),
                bytes,
            };
            tensors.insert(name, entry);
        }
        Ok(ShardFile {
            path: path.to_path_buf(),
            mmap,
            tensors,
        })
    }

    /// The bytes of `entry` (a range `open` checked).
    pub fn data(&self, entry: &TensorEntry) -> Option<&[u8]> {
        self.mmap.get(entry.bytes.clone())
    }

    /// Drops the resident pages of `entry`'s bytes (and of the pages it shares with its
    /// neighbours): a streaming load has converted it and will not read it again, so its host
    /// memory is given back; a later read faults the same bytes in from the file again.
    pub fn release(&self, entry: &TensorEntry) {
        // SAFETY: the mapping is read-only and backed by the file (MAP_SHARED): MADV_DONTNEED
        // only evicts pages, which read back unchanged from the file (the file not changing
        // under us is the mapping's own premise, in `open`).
        let released = unsafe {
            self.mmap.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                entry.bytes.start,
                entry.bytes.len(),
            )
        };
        if let Err(e) = released {
            tracing::debug!(path = %self.path.display(), error = %e, "madvise(DONTNEED) refused; pages stay resident");
        }
    }
}
