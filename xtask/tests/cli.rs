//! The xtask binary as a user runs it: what a shell pipeline or a bad flag sees.

use std::process::{Command, Stdio};

fn xtask() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_xtask"));
    command.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    command
}

/// Issue 19.6: `plan --all | head -1` panicked with a broken pipe.
#[test]
fn a_closed_stdout_ends_the_run_quietly() {
    let mut child = xtask()
        .args([
            "plan",
            "--config",
            "tests/fixtures/golden/llama/config.json",
            "--all",
            "--max-batch",
            "2",
            "--no-ptx-check",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes before the first line is written: every print meets EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}
