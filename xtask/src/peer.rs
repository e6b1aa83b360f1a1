//! `cargo xtask bench --peer candle`: solder and candle 0.11 on the same checkpoint, side by
//! side in one run, with the ratio of their median decode steps.

use std::path::PathBuf;
use std::process::Command;

use crate::args::Args;

pub fn run(peer: &str, args: &Args) -> Result<(), String> {
    if peer != "candle" {
        return Err(format!("unknown peer `{peer}` (known: candle)"));
    }
    // The ranges of `bench`'s own flags, checked here before either engine is started.
    let prompt = args
        .number_in("prompt-len", 1..=65536)?
        .unwrap_or(32)
        .to_string();
    let gen = args.number_in("gen", 1..=65536)?.unwrap_or(128).to_string();
    let threads = args
        .number_in("threads", crate::args::THREADS)?
        .map(|t| t.to_string());
    let dir: PathBuf = match (args.value("model"), args.value("synth")) {
        (Some(dir), None) => PathBuf::from(dir),
        (None, Some(synth)) => crate::bench::synth_checkpoint(synth)?,
        _ => return Err("give one of --model DIR or --synth NAME".into()),
    };
    let root = crate::paths::workspace_root();
    eprintln!("building the candle peer (first time: several minutes)");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(root.join("peers/candle-llama/Cargo.toml"))
        .env("CARGO_TARGET_DIR", root.join("target/peers"))
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !status.success() {
        return Err("building peers/candle-llama failed".into());
    }
    let capture = |cmd: &mut Command| -> Result<String, String> {
        let out = cmd.output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .last()
            .map(str::to_string)
            .ok_or_else(|| "no output".to_string())
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut solder = Command::new(&exe);
    solder
        .args(["bench", "--backend", "cpu", "--model"])
        .arg(&dir)
        .args(["--prompt-len", &prompt, "--gen", &gen]);
    if let Some(t) = &threads {
        solder.args(["--threads", t]);
    }
    let solder_line = capture(&mut solder)?;
    println!("{solder_line}");
    let mut best: Option<f64> = None;
    for dtype in ["bf16", "f32"] {
        let line = capture(
            Command::new(root.join("target/peers/release/candle-llama-peer"))
                .arg(&dir)
                .args(["--prompt-len", &prompt, "--gen", &gen, "--dtype", dtype]),
        )?;
        println!("{line}");
        let ms = field(&line, "ms_per_token")?;
        best = Some(best.map_or(ms, |b: f64| b.min(ms)));
    }
    let ours = field(&solder_line, "ms_per_token")?;
    let theirs = best.ok_or("no candle run")?;
    println!(
        "ratio: candle's best median step / solder's = {:.2} (above 1: solder decodes faster)",
        theirs / ours
    );
    Ok(())
}

fn field(line: &str, key: &str) -> Result<f64, String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no `{key}` in `{line}`"))
}
