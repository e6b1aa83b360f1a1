//! `model.safetensors.index.json`: the weight map of a sharded checkpoint, and its
//! cross-check against the shards' headers.
//!
//! Invariant: a checkpoint whose index passes `check` maps every tensor to the one shard
//! whose header lists it, and lists every tensor of every shard.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use solder_config::file_guard::{read_capped, FileRefusal};

use super::header::ShardFile;
use crate::error::WeightsError;

/// The largest index read (a 1,000-shard model's is well under 1 MiB).
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// The index's weight map: tensor name → shard file name.
pub struct WeightMap {
    pub path: PathBuf,
    pub shards: BTreeMap<String, String>,
}

impl WeightMap {
    pub fn read(path: &Path) -> Result<WeightMap, WeightsError> {
        let format = |message: String| WeightsError::Format {
            path: path.to_path_buf(),
            message,
        };
        let bytes = read_capped(path, MAX_INDEX_BYTES).map_err(|refusal| match refusal {
            FileRefusal::Io(e) => WeightsError::Io {
                path: path.to_path_buf(),
                message: e.to_string(),
            },
            other => format(format!("the index {other}")),
        })?;
        // A tensor mapped twice would resolve last-wins: refused, naming it.
        solder_config::json_keys::first_duplicate(&bytes).map_err(|e| format(e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| format(e.to_string()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| format("no `weight_map` object".to_string()))?;
        let mut shards = BTreeMap::new();
        for (tensor, shard) in map {
            let shard = shard.as_str().ok_or_else(|| {
                format(format!(
                    "the `weight_map` value of `{tensor}` is not a file name"
                ))
            })?;
            if shard.contains('/') || shard.contains('\\') || shard.contains("..") {
                return Err(format(format!(
                    "shard `{shard}` (of `{tensor}`) is not a file in the checkpoint folder"
                )));
            }
            shards.insert(tensor.clone(), shard.to_string());
        }
        Ok(WeightMap {
            path: path.to_path_buf(),
            shards,
        })
    }

    /// The shard file names, sorted, once each.
    pub fn shard_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shards.values().cloned().collect();
        names.sort();
        names.dedup();
        names
    }

    /// Every tensor the index maps to a shard is in that shard's header, and every tensor
    /// of a shard's header is in the index, mapped to that shard. `files` are the shards
    /// `shard_names` listed, opened, in that order; `owner` maps each tensor to its file.
    pub fn check(
        &self,
        files: &[ShardFile],
        owner: &BTreeMap<String, usize>,
    ) -> Result<(), WeightsError> {
        let names = self.shard_names();
        let path_of = |shard: &str| {
            names
                .iter()
                .position(|n| n == shard)
                .and_then(|i| files.get(i))
                .map(|f| f.path.clone())
        };
        for (tensor, shard) in &self.shards {
            let mapped = path_of(shard).unwrap_or_else(|| PathBuf::from(shard));
            let found = owner.get(tensor).and_then(|&i| files.get(i));
            match found {
                Some(file) if file.path == mapped => {}
                Some(file) => {
                    return Err(WeightsError::WrongShard {
                        tensor: tensor.clone(),
                        index: self.path.clone(),
                        mapped,
                        found: file.path.clone(),
                    })
                }
                None => {
                    return Err(WeightsError::NotInShard {
                        tensor: tensor.clone(),
                        index: self.path.clone(),
                        shard: mapped,
                    })
                }
            }
        }
        for (tensor, &file) in owner {
            if !self.shards.contains_key(tensor) {
                let shard = files.get(file).map(|f| f.path.clone()).unwrap_or_default();
                return Err(WeightsError::NotInIndex {
                    tensor: tensor.clone(),
                    shard,
                    index: self.path.clone(),
                });
            }
        }
        Ok(())
    }
}
