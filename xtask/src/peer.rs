//! `cargo xtask bench --peer candle`: solder and candle 0.11 on the same checkpoint, side by
//! side in one run, with the ratios of their median decode steps and of their prefills (candle
//! prefills the prompt in one forward; solder in chunks of `--chunk` rows, with `--levers`).

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
    let chunk = args
        .number_in("chunk", 2..=solder_config::MAX_VERIFY_WIDTH)?
        .map(|w| w.to_string());
    args.levers()?;
    let dir: PathBuf = match (args.value("model"), args.value("synth")) {
        (Some(dir), None) => PathBuf::from(dir),
        (None, Some(synth)) => crate::synth::synth_checkpoint(synth)?,
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
    if let Some(w) = &chunk {
        solder.args(["--chunk", w]);
    }
    if let Some(levers) = args.value("levers") {
        solder.args(["--levers", levers]);
    }
    let solder_line = capture(&mut solder)?;
    println!("{solder_line}");
    // candle's best dtype, each figure on its own: (decode ms per token, prefill ms).
    let mut best: Option<(f64, f64)> = None;
    for dtype in ["bf16", "f32"] {
        let line = capture(
            Command::new(root.join("target/peers/release/candle-llama-peer"))
                .arg(&dir)
                .args(["--prompt-len", &prompt, "--gen", &gen, "--dtype", dtype]),
        )?;
        println!("{line}");
        let run = (field(&line, "ms_per_token")?, field(&line, "prefill_ms")?);
        best = Some(best.map_or(run, |(d, p)| (d.min(run.0), p.min(run.1))));
    }
    let (decode, prefill) = best.ok_or("no candle run")?;
    println!(
        "ratio: candle's best median step / solder's = {:.2} (above 1: solder decodes faster)",
        decode / field(&solder_line, "ms_per_token")?
    );
    println!(
        "ratio: candle's best prefill of {prompt} tokens / solder's = {:.2} (above 1: solder prefills faster)",
        prefill / field(&solder_line, "prefill_ms")?
    );
    Ok(())
}

fn field(line: &str, key: &str) -> Result<f64, String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no `{key}` in `{line}`"))
}
