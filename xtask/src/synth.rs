//! Synth models: a published config (`tests/fixtures/configs/`) cut to a few layers, with
//! random weights, saved once as a checkpoint under `target/synth/<name>` for `bench` and its
//! peers to load the same bytes (`bench --save DIR` writes one elsewhere).
//!
//! Invariant: a checkpoint is written into a sibling temporary folder and renamed into place
//! only once complete; a target that exists and is not an empty folder is refused by path.

use std::path::{Path, PathBuf};

use solder_config::{ModelConfig, ServeShape};
use solder_model_layers::HostWeights;

/// Synth models: name, base config (tests/fixtures/configs/), layers.
pub(crate) const SYNTH: &[(&str, &str, usize)] = &[
    ("llama-3.2-1b", "llama-3.2-1b", 16),
    ("llama-3.2-1b-l4", "llama-3.2-1b", 4),
    ("llama-3.1-8b-l4", "llama-3.1-8b", 4),
    ("qwen3-next-tiny", "golden-qwen3-next", 4),
];

/// A synth model's config, by name (its `source` is the name).
pub(crate) fn synth_config(name: &str) -> Result<ModelConfig, String> {
    let json = synth_json(name)?;
    ModelConfig::from_json_str(&json.to_string(), name).map_err(|e| e.to_string())
}

/// The config.json of synth model `name`: its base config with its layer count.
fn synth_json(name: &str) -> Result<serde_json::Value, String> {
    let (base, layers) = SYNTH
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, base, l)| (*base, *l))
        .ok_or_else(|| {
            format!(
                "unknown synth model `{name}` (known: {})",
                SYNTH
                    .iter()
                    .map(|(n, _, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    let mut json = synth_base_config(base)?;
    json["num_hidden_layers"] = layers.into();
    Ok(json)
}

/// The config a synth model starts from: `tests/fixtures/configs/<base>.json`.
fn synth_base_config(base: &str) -> Result<serde_json::Value, String> {
    let path = crate::paths::workspace_root().join(format!("tests/fixtures/configs/{base}.json"));
    let text = crate::files::read_text(&path)?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

pub(crate) fn synth_checkpoint(name: &str) -> Result<PathBuf, String> {
    let dir = crate::paths::workspace_root()
        .join("target/synth")
        .join(name);
    if !dir.join("model.safetensors").exists() {
        save_synth(&synth_config(name)?, &dir)?;
    }
    Ok(dir)
}

/// Whether `dir` may receive a saved model: absent, or an empty folder. Anything else (a
/// file, a checkpoint, any folder with contents) is refused by path.
pub(crate) fn check_save_target(dir: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("--save {}: {e}", dir.display())),
        Ok(meta) if !meta.is_dir() => Err(format!(
            "--save {}: exists and is not a folder; refusing to replace it",
            dir.display()
        )),
        Ok(_) => {
            let mut entries =
                std::fs::read_dir(dir).map_err(|e| format!("--save {}: {e}", dir.display()))?;
            match entries.next() {
                None => Ok(()),
                Some(entry) => Err(format!(
                    "--save {}: the folder is not empty (it holds {}); refusing to write a \
                     model over it",
                    dir.display(),
                    entry
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .unwrap_or_else(|e| e.to_string())
                )),
            }
        }
    }
}

/// Writes `config` with random weights as a checkpoint at `dir`: into a sibling temporary
/// folder first, renamed to `dir` only once complete, so a failure leaves nothing behind.
pub(crate) fn save_synth(config: &ModelConfig, dir: &Path) -> Result<(), String> {
    check_save_target(dir)?;
    let instance = solder_circuit::Instance::from_config(config, ServeShape::default())
        .map_err(|e| e.to_string())?;
    let weights = HostWeights::random(&instance.circuit, 1);
    // `config.source` is the synth name it was made from.
    let json = synth_json(&config.source)?;
    let config_text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;

    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    // Unpredictable, created exclusively; a killed earlier save's partial folder is removed.
    let tmp = crate::files::partial_dir(dir).map_err(|e| format!("--save: {e}"))?;
    let written = (|| {
        let config_path = tmp.join("config.json");
        crate::files::write_output(
            &config_path,
            config_text.as_bytes(),
            &crate::files::Inputs::default(),
        )?;
        weights
            .save(&instance.circuit, &tmp.join("model.safetensors"))
            .map_err(|e| e.to_string())?;
        // An empty target folder (allowed above) goes first: rename needs the name free.
        if dir.is_dir() {
            std::fs::remove_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::rename(&tmp, dir).map_err(|e| format!("{}: {e}", dir.display()))
    })();
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    written?;
    println!(
        "wrote {} ({} bytes of weights)",
        dir.display(),
        weights.total_bytes()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        crate::files::scratch_dir("synth", name)
    }

    #[test]
    fn an_absent_or_empty_target_is_accepted() {
        let dir = scratch("empty");
        check_save_target(&dir).unwrap();
        check_save_target(&dir.join("new")).unwrap();
    }
}
