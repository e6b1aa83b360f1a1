//! Golden cases that cannot run: a folder under `--goldens DIR` whose family is refused as not
//! yet modelled, or whose circuit is `Unsupported`, is a `Skip` with its reason. A skip fails
//! parity unless `--allow-skip NAME` names its folder; every skip is printed and in the JSON.
//!
//! Invariant: no golden drops out of a run unseen, and none counts as a pass: an unallowed skip
//! fails the run, and an allowed name that names no golden folder, or one that runs, is an
//! error, so the allowed list stays exactly the skips.

use std::path::Path;

use serde_json::json;

/// A golden case folder that could not run.
#[derive(Debug, Clone, PartialEq)]
pub struct Skip {
    /// The folder's name under `--goldens DIR` (what `--allow-skip` names).
    pub name: String,
    pub reason: String,
    /// Named by `--allow-skip`.
    pub allowed: bool,
}

impl Skip {
    /// "SKIP qwen3_next: ... (allowed by --allow-skip)" or "... NOT ALLOWED: fails the run".
    pub fn line(&self) -> String {
        let verdict = match self.allowed {
            true => "allowed by --allow-skip".to_string(),
            false => format!(
                "NOT ALLOWED: fails the run (pass `--allow-skip {}` to accept it)",
                self.name
            ),
        };
        format!("SKIP {}: {} ({verdict})", self.name, self.reason)
    }
}

/// Why the golden case in `dir` cannot run: its family refused as not yet modelled, or its
/// circuit `Unsupported`; `None` when it can (other errors surface when the case runs).
pub fn why_it_cannot_run(dir: &Path) -> Option<String> {
    match crate::files::model_config(&dir.join("config.json")) {
        Err(e) if e.contains("not yet modelled") => Some(e),
        Ok(config) => match solder_circuit::build_circuit(&config, "probe", Default::default()) {
            Err(e @ solder_circuit::CircuitError::Unsupported { .. }) => Some(e.to_string()),
            _ => None,
        },
        Err(_) => None,
    }
}

/// The folder name of a golden case, as `--allow-skip` names it.
pub fn folder_name(dir: &Path) -> String {
    dir.file_name()
        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into())
}

/// Every `--allow-skip` name must be a golden folder that was skipped: one that names no
/// folder, or a folder that runs, is an error naming it.
pub fn check_allowed(allowed: &[&str], folders: &[String], skips: &[Skip]) -> Result<(), String> {
    for &name in allowed {
        if !folders.iter().any(|f| f == name) {
            return Err(format!(
                "--allow-skip {name}: no golden folder of that name (folders: {})",
                folders.join(", ")
            ));
        }
        if !skips.iter().any(|s| s.name == name) {
            return Err(format!(
                "--allow-skip {name}: that golden runs; drop it from --allow-skip"
            ));
        }
    }
    Ok(())
}

/// The JSON's `skipped`: every skip with its reason and whether it was allowed.
pub fn json(skips: &[Skip]) -> serde_json::Value {
    skips
        .iter()
        .map(|s| json!({ "name": s.name, "reason": s.reason, "allowed": s.allowed }))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn skip(name: &str, allowed: bool) -> Skip {
        Skip {
            name: name.into(),
            reason: "model_type `x` is not yet modelled".into(),
            allowed,
        }
    }

    #[test]
    fn an_allowed_name_must_be_a_skipped_folder() {
        let folders = vec!["llama".to_string(), "odd".to_string()];
        let skips = [skip("odd", true)];
        assert!(check_allowed(&["odd"], &folders, &skips).is_ok());
        let e = check_allowed(&["lama"], &folders, &skips).unwrap_err();
        assert!(e.contains("--allow-skip lama: no golden folder"), "{e}");
        let e = check_allowed(&["llama"], &folders, &skips).unwrap_err();
        assert!(e.contains("--allow-skip llama: that golden runs"), "{e}");
    }

    #[test]
    fn every_skip_is_a_line_and_a_json_entry_with_its_reason() {
        let skips = [skip("odd", false), skip("even", true)];
        assert!(skips[0].line().starts_with("SKIP odd: model_type"));
        assert!(skips[0].line().contains("NOT ALLOWED"));
        assert!(skips[1].line().ends_with("(allowed by --allow-skip)"));
        let doc = json(&skips);
        assert_eq!(doc[0]["name"], "odd");
        assert_eq!(doc[0]["allowed"], false);
        assert_eq!(doc[1]["reason"], "model_type `x` is not yet modelled");
    }

    /// The llama golden's config with a `quantization_config`: refused as not yet modelled.
    pub(crate) fn quantized_llama() -> String {
        let path = crate::paths::workspace_root().join("tests/fixtures/golden/llama/config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        config["quantization_config"] = serde_json::json!({ "quant_method": "fp8" });
        config.to_string()
    }

    /// CI's goldens step passes no `--allow-skip`: every shipped golden must run.
    #[test]
    fn every_shipped_golden_runs() {
        let root = crate::paths::workspace_root().join("tests/fixtures/golden");
        let mut folders = 0;
        for entry in std::fs::read_dir(&root).unwrap().flatten() {
            let dir = entry.path();
            if dir.join("golden.safetensors").exists() {
                folders += 1;
                assert_eq!(why_it_cannot_run(&dir), None, "{}", dir.display());
            }
        }
        assert!(folders >= 13, "{folders} golden folders");
    }

    #[test]
    fn a_refused_config_is_a_skip_naming_why() {
        let dir = std::env::temp_dir().join(format!("xtask-skip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), quantized_llama()).unwrap();
        let why = why_it_cannot_run(&dir).expect("a quantized checkpoint is refused");
        assert!(why.contains("not yet modelled"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
