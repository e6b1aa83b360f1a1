//! Every shipped config either plans (the dense families) or is refused naming the family
//! as not yet modelled (qwen3_moe, qwen3_next).

use std::path::PathBuf;

use solder_circuit::{Available, BuildOptions, ExecutionPlan, Instance, Mode, Policy};
use solder_config::{ModelConfig, ServeShape};
use solder_tests::{load_rules, workspace_root, DENSE_CONFIGS};

fn config_files() -> Vec<PathBuf> {
    let dir = workspace_root().join("tests/fixtures/configs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

/// `model_type` as written in the file (no JSON crate here: the key's first string value).
fn model_type(text: &str) -> Option<&str> {
    let after = &text[text.find("\"model_type\"")? + "\"model_type\"".len()..];
    let start = after.find('"')? + 1;
    let len = after[start..].find('"')?;
    Some(&after[start..start + len])
}

#[test]
fn every_config_plans_or_is_refused_as_not_yet_modelled() {
    let rules = load_rules().expect("shipped rules");
    let available = Available::all_kernels(&rules);
    let (mut planned, mut refused) = (Vec::new(), Vec::new());
    let files = config_files();
    assert!(files.len() >= DENSE_CONFIGS.len() + 2, "{files:?}");
    for path in &files {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a name")
            .to_string();
        let text = std::fs::read_to_string(path).expect("readable");
        let kind = model_type(&text)
            .unwrap_or_else(|| panic!("{name}: no model_type"))
            .to_string();
        match ModelConfig::from_file(path) {
            Ok(config) => {
                let instance = Instance::from_config(&config, ServeShape::default())
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                for (mode, rows) in [(Mode::Decode, 1), (Mode::MultiSeq, 16), (Mode::Verify, 5)] {
                    let plan = ExecutionPlan::build_with(
                        &instance,
                        &rules,
                        &available,
                        &Policy::default(),
                        mode,
                        rows,
                        BuildOptions { verify: true },
                    )
                    .unwrap_or_else(|e| panic!("{name} {mode} rows={rows}: {e}"));
                    assert!(plan.kernel_count_fused > 0, "{name}");
                }
                planned.push(name);
            }
            Err(e) => {
                let m = e.to_string();
                assert!(
                    ["qwen3_moe", "qwen3_next"].contains(&kind.as_str()),
                    "{name} ({kind}) refused unexpectedly: {m}"
                );
                assert!(
                    m.contains("not yet modelled") && m.contains(&kind),
                    "{name}: {m}"
                );
                assert!(
                    m.contains(&path.display().to_string()),
                    "{name}: the file is named: {m}"
                );
                refused.push(name);
            }
        }
    }
    let mut dense: Vec<String> = DENSE_CONFIGS.iter().map(|s| s.to_string()).collect();
    dense.sort();
    assert_eq!(
        planned, dense,
        "the dense configs are exactly the ones that plan"
    );
    assert!(refused.len() >= 2, "{refused:?}");
}
