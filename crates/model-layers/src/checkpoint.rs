//! A Hugging Face checkpoint on disk: one `model.safetensors` or shards listed by
//! `model.safetensors.index.json`, memory-mapped, every file's header validated at open.
//!
//! Invariant: after `open`, every tensor name maps to exactly one file whose header and data
//! length were checked (a truncated file is refused at open, naming it).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::error::WeightsError;

pub struct Checkpoint {
    pub dir: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name → index into `files`.
    index: BTreeMap<String, usize>,
}

/// A tensor's bytes in a mapped file.
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub file: &'a Path,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint, WeightsError> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(|e| WeightsError::Io {
                path: index_path.clone(),
                message: e.to_string(),
            })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| WeightsError::Format {
                    path: index_path.clone(),
                    message: e.to_string(),
                })?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| WeightsError::Format {
                    path: index_path.clone(),
                    message: "no `weight_map` object".to_string(),
                })?;
            let mut names: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            if names.len() != map.len() {
                return Err(WeightsError::Format {
                    path: index_path,
                    message: "a `weight_map` value is not a file name".into(),
                });
            }
            names.sort();
            names.dedup();
            names
        } else if single.exists() {
            vec!["model.safetensors".to_string()]
        } else {
            return Err(WeightsError::Io {
                path: dir.to_path_buf(),
                message: "no model.safetensors or model.safetensors.index.json".to_string(),
            });
        };

        let mut files = Vec::new();
        let mut index = BTreeMap::new();
        for name in shard_names {
            if name.contains('/') || name.contains("..") {
                return Err(WeightsError::Format {
                    path: index_path.clone(),
                    message: format!("shard `{name}` is not a file in the checkpoint folder"),
                });
            }
            let path = dir.join(&name);
            let file = File::open(&path).map_err(|e| WeightsError::Io {
                path: path.clone(),
                message: e.to_string(),
            })?;
            // SAFETY: the mapping is read-only; a file changed under us while mapped is outside
            // what solder promises (as for every engine that maps checkpoints).
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| WeightsError::Io {
                path: path.clone(),
                message: e.to_string(),
            })?;
            let tensors = SafeTensors::deserialize(&mmap).map_err(|e| WeightsError::Format {
                path: path.clone(),
                message: format!("not a valid safetensors file (truncated?): {e}"),
            })?;
            for tensor_name in tensors.names() {
                if index.insert(tensor_name.to_string(), files.len()).is_some() {
                    return Err(WeightsError::Format {
                        path: path.clone(),
                        message: format!("tensor `{tensor_name}` appears in two shards"),
                    });
                }
            }
            files.push((path, mmap));
        }
        tracing::debug!(dir = %dir.display(), files = files.len(), tensors = index.len(), "opened checkpoint");
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            files,
            index,
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The file a tensor is in (for messages).
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        self.index.get(name).map(|&f| self.files[f].0.as_path())
    }

    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>, WeightsError> {
        let (&file_index, key) = self
            .index
            .get_key_value(name)
            .map(|(k, v)| (v, k))
            .ok_or_else(|| WeightsError::Missing {
                tensor: name.to_string(),
                dir: self.dir.clone(),
            })?;
        let (path, mmap) = &self.files[file_index];
        let tensors = SafeTensors::deserialize(mmap).map_err(|e| WeightsError::Format {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let view = tensors.tensor(name).map_err(|e| WeightsError::Format {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Ok(TensorRef {
            name: key,
            file: path,
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data: view.data(),
        })
    }
}
