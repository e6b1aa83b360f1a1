//! A Hugging Face checkpoint on disk: one `model.safetensors` or shards listed by
//! `model.safetensors.index.json`, memory-mapped, every file's header parsed once at open
//! (`header`) and a sharded index cross-checked against the shards' headers (`index`).
//!
//! Invariants: after `open`, every tensor name maps to exactly one file whose header and
//! data length were checked (a truncated file is refused at open, naming it); a tensor
//! lookup never re-reads a header. A folder holding both `model.safetensors` and an index
//! loads `model.safetensors`, as transformers' `from_pretrained` does.

mod header;
mod index;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::Dtype as StDtype;

use crate::error::WeightsError;
use header::ShardFile;
use index::WeightMap;

pub struct Checkpoint {
    pub dir: PathBuf,
    files: Vec<ShardFile>,
    /// Tensor name → index into `files`.
    owner: BTreeMap<String, usize>,
    header_parses: usize,
}

/// A tensor's bytes in a mapped file.
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub file: &'a Path,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint, WeightsError> {
        let single = dir.join(SINGLE);
        let index_path = dir.join(INDEX);
        // transformers checks for model.safetensors before the index (`from_pretrained`).
        // `is_file` is false for a FIFO or device: such a `model.safetensors` beside an index
        // is passed over for it; alone, it is opened below and refused by the file guard.
        let (weight_map, paths) = if single.is_file() {
            if index_path.exists() {
                tracing::warn!(
                    dir = %dir.display(),
                    "both {SINGLE} and {INDEX}: loading {SINGLE} and ignoring the index, as transformers does"
                );
            }
            (None, vec![single])
        } else if index_path.exists() {
            let weight_map = WeightMap::read(&index_path)?;
            let paths = weight_map
                .shard_names()
                .iter()
                .map(|name| dir.join(name))
                .collect();
            (Some(weight_map), paths)
        } else if single.exists() {
            (None, vec![single])
        } else {
            return Err(WeightsError::Io {
                path: dir.to_path_buf(),
                message: format!("no {SINGLE} or {INDEX}"),
            });
        };

        let mut files: Vec<ShardFile> = Vec::with_capacity(paths.len());
        let mut owner = BTreeMap::new();
        let mut header_parses = 0;
        for path in &paths {
            let file = ShardFile::open(path)?;
            header_parses += 1;
            for tensor in file.tensors.keys() {
                if let Some(first) = owner.insert(tensor.clone(), files.len()) {
                    return Err(WeightsError::TwoShards {
                        tensor: tensor.clone(),
                        first: files.get(first).map(|f| f.path.clone()).unwrap_or_default(),
                        second: file.path.clone(),
                    });
                }
            }
            files.push(file);
        }
        if let Some(weight_map) = &weight_map {
            weight_map.check(&files, &owner)?;
        }
        tracing::debug!(dir = %dir.display(), files = files.len(), tensors = owner.len(), "opened checkpoint");
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            files,
            owner,
            header_parses,
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.owner.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.owner.contains_key(name)
    }

    /// The files the checkpoint holds (one, or its shards).
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// How many file headers were parsed (a test hook: each file's once, at open).
    pub fn header_parses(&self) -> usize {
        self.header_parses
    }

    /// The file a tensor is in (for messages).
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        let file = self.owner.get(name).and_then(|&f| self.files.get(f))?;
        Some(file.path.as_path())
    }

    /// Where `name`'s bytes are: its file's index (in `open`'s order: shards by file name) and
    /// its byte offset in that file. Streaming reads the checkpoint in this order.
    pub fn position(&self, name: &str) -> Option<(usize, usize)> {
        let &file = self.owner.get(name)?;
        let entry = self.files.get(file)?.tensors.get(name)?;
        Some((file, entry.bytes.start))
    }

    /// The path of file `index` (of `position`).
    pub fn file_path(&self, index: usize) -> Option<&Path> {
        self.files.get(index).map(|f| f.path.as_path())
    }

    /// Gives back the host pages holding `name`'s bytes (read once by a streaming load).
    pub fn release(&self, name: &str) {
        let Some(&file) = self.owner.get(name) else {
            return;
        };
        if let Some(file) = self.files.get(file) {
            if let Some(entry) = file.tensors.get(name) {
                file.release(entry);
            }
        }
    }

    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>, WeightsError> {
        let missing = || WeightsError::Missing {
            tensor: name.to_string(),
            dir: self.dir.clone(),
        };
        let (key, &file_index) = self.owner.get_key_value(name).ok_or_else(missing)?;
        let file = self.files.get(file_index).ok_or_else(missing)?;
        let entry = file.tensors.get(name).ok_or_else(missing)?;
        let data = file.data(entry).ok_or_else(|| WeightsError::Format {
            path: file.path.clone(),
            message: format!("tensor `{name}`: its bytes lie outside the file"),
        })?;
        Ok(TensorRef {
            name: key,
            file: &file.path,
            dtype: entry.dtype,
            shape: entry.shape.clone(),
            data,
        })
    }
}
