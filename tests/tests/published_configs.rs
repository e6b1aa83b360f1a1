//! Issue 23: the published `config.json` files of the families' common checkpoints
//! (`tests/fixtures/configs/published`, provenance in its README) load unchanged — every key
//! they carry is used or ignored by name, none refused as unknown — and plan: decode, a
//! multi-seq width and a verify width, each verified between passes.

use solder_circuit::Instance;
use solder_config::{ModelConfig, ServeShape};
use solder_tests::{json_files, load_rules, plan_serve_sample};

#[test]
fn every_published_config_loads_unchanged_and_plans() {
    let rules = load_rules().expect("shipped rules");
    let files = json_files("tests/fixtures/configs/published");
    assert!(files.len() >= 19, "{files:?}");
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let config = match ModelConfig::from_file(path) {
            Ok(config) => config,
            Err(e) => {
                failures.push(format!("{name}: refused: {e}"));
                continue;
            }
        };
        let instance = match Instance::from_config(&config, ServeShape::default()) {
            Ok(instance) => instance,
            Err(e) => {
                failures.push(format!("{name}: no circuit: {e}"));
                continue;
            }
        };
        if let Err(e) = plan_serve_sample(&instance, &rules) {
            failures.push(format!("{name} {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
