//! `RuleSet::from_file` reads only a regular file under its size cap, and says which path it
//! refused (issue 9: `plan --rules /dev/zero` read without limit).

use std::path::PathBuf;

use solder_circuit::RuleSet;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("solder-rules-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_device_is_refused_by_path() {
    let message = RuleSet::from_file("/dev/zero".as_ref())
        .unwrap_err()
        .to_string();
    assert!(message.contains("/dev/zero"), "{message}");
    assert!(message.contains("not a regular file"), "{message}");
}

#[test]
fn a_folder_is_refused() {
    let dir = std::env::temp_dir();
    let message = RuleSet::from_file(&dir).unwrap_err().to_string();
    assert!(message.contains("not a regular file"), "{message}");
}

#[test]
fn a_file_over_the_cap_is_refused_before_it_is_read() {
    let path = scratch("huge.toml");
    // Sparse: the length is what is checked, so the test writes nothing.
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(RuleSet::MAX_FILE_BYTES + 1).unwrap();
    let message = RuleSet::from_file(&path).unwrap_err().to_string();
    std::fs::remove_file(&path).unwrap();
    assert!(message.contains("huge.toml"), "{message}");
    assert!(message.contains("may hold"), "{message}");
}

#[test]
fn the_shipped_rules_still_load() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fusions/FUSIONS.toml");
    RuleSet::from_file(&path).unwrap();
}
