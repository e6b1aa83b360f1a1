//! `gpu-kernels` (hidden): single kernels timed alone at a real model's shape, for the
//! per-kernel figures a whole program's timing hides. Three families (`--family`): `gemm`, the
//! tensor-core projections against their roofline (`gpu::tiles`); `qkv`, the qk-norm q/k/v
//! launch with rope and the KV write through the 64 × 32 tile and the `_large` one, whose
//! stage needs the opt-in past 48 KB of shared memory (`gpu::qkv`); and `gdn`, Gated DeltaNet's
//! recurrence over one sequence's prompt chunk (chain 1) at Qwen3-Next-80B's shape, row by row
//! (`gdn::gates_recurrence`) against its chunked form (`gdn::gates_chunked`, the `gdn_chunked`
//! lever) and the chunked form's products on the tensor cores (`gdn::gates_chunked_mma`, with
//! `tensor_cores`), each launch timed alone (synchronize, launch, synchronize), the median per
//! width, and the chunked outputs' largest difference from the row-by-row ones (they agree up
//! to rounding).
//!
//! On the CPU backend (`--backend cpu`, the default) it is a dry run of the harness: the twins'
//! times mean nothing for a GPU, the agreement does.

use super::alone::{bf16_bytes, download_bf16, launch_once, time, wave, Buffers};
use super::{device_backend, BackendKind};
use crate::args::Args;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::kernels::gdn::{
    chunked_mma_config, GatesChunked, GatesRecurrence, GATES_CHUNKED, GATES_CHUNKED_MMA,
    GATES_RECURRENCE,
};

const HELP: &str =
    "usage: solder gpu-kernels [--backend cpu|cuda] [--family gdn|gemm|qkv|all] [--rows LIST]
                          [--runs N]

  gdn: Gated DeltaNet's recurrence over one sequence's chunk of each of --rows rows (default
  16,128,512) at Qwen3-Next-80B's shape (16 key heads, 32 value heads, head dims 128): the row-
  by-row kernel (gdn::gates_recurrence) against the chunked form (gdn::gates_chunked) and its
  products on the tensor cores (gdn::gates_chunked_mma), each launch timed alone; per width the
  median microseconds of each, microseconds per row, the ratios to the row-by-row kernel, and
  each chunked output's largest difference relative to the largest output.

  gemm: the tensor-core projections (gemm::gate_up_silu_mma, gemm::linear_mma as down and as o)
  at Llama-3.1-8B's shapes and each of --rows rows, each launch timed alone: the median against
  the roofline (4.8 TB/s, 990 TFLOPS) and against the floor of weights read once per 64 rows,
  the CUDA-core kernel of the same projection (gemv::gate_up_silu, gemv::linear), the `_large`
  entry (lever mma_large: 128 x 64 tiles, the same bytes), at up to 16 rows the `_narrow`
  entry (lever mma_narrow: passes of 16 rows, the same bytes) and past 16 rows the `_pipe` entry
  (lever mma_pipe: the _large tiles, three k tiles in flight through cp.async, the same bytes)
  from the same buffers, their outputs compared first. On the CPU backend the shapes are cut
  by 32.

  qkv: the qk-norm q/k/v launch with rope and the KV write (gemm::qkv_norm_rope_kv_mma) at
  Qwen3-8B's and Qwen3-32B's attention shapes and Qwen3-Next-80B's gated one
  (gemm::qkv_gated_norm_zc_rope_kv_mma, 256-wide heads) and each of --rows rows, through the
  64 x 32 tile and its _large entry (lever mma_large; its stage of a head's 128 rows needs
  32 or 64 KB of dynamic shared memory, past the 48 KB a launch gets without opting in): their
  q, gate and cache bytes compared first, then each launch timed alone against its roofline.
  On the CPU backend the shapes are cut (k by 32, the heads by 8).

  --backend B   cpu (default: a dry run of the harness on the twins) or cuda
  --family F    gdn, gemm, qkv or all (default)
  --rows LIST   chunk widths, comma-separated, 1..=4096 each
  --runs N      timed launches per kernel and width, 1..=1000 (default 20)
  --cut N       the gemm and qkv shapes cut by N, 1..=64 (default 1 on cuda, 32 on cpu): a
                quick pass over every tile, as under compute-sanitizer";

/// Qwen3-Next-80B's Gated DeltaNet: key heads, key dim, value heads, value dim.
const SHAPE: [u32; 4] = [16, 128, 32, 128];

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(
        argv,
        &["backend", "family", "rows", "runs", "cut"],
        &["help"],
    )?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    let kind = BackendKind::parse(args.value("backend"))?;
    let (gdn, gemm, qkv) = match args.value("family").unwrap_or("all") {
        "gdn" => (true, false, false),
        "gemm" => (false, true, false),
        "qkv" => (false, false, true),
        "all" => (true, true, true),
        other => return Err(format!("--family: `{other}` is not gdn, gemm, qkv or all")),
    };
    let rows = match args.value("rows") {
        None => vec![16, 128, 512],
        Some(list) => list
            .split(',')
            .map(|w| match w.trim().parse::<u32>() {
                Ok(n) if (1..=4096).contains(&n) => Ok(n),
                _ => Err(format!("--rows: `{w}` is not a width in 1..=4096")),
            })
            .collect::<Result<Vec<u32>, String>>()?,
    };
    let runs = match args.value("runs") {
        None => 20,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => n,
            _ => return Err(format!("--runs: `{v}` is not a count in 1..=1000")),
        },
    };
    let cut = match (args.value("cut"), kind) {
        (None, BackendKind::Cpu) => 32,
        (None, _) => 1,
        (Some(v), _) => match v.parse::<u32>() {
            Ok(n) if (1..=64).contains(&n) => n,
            _ => return Err(format!("--cut: `{v}` is not a divisor in 1..=64")),
        },
    };
    let mut backend: Box<dyn GpuBackend> = match device_backend(kind)? {
        Some(device) => device,
        None => Box::new(
            solder_model_layers::kernels::cpu_backend(None)
                .map_err(|e| format!("cpu backend: {e}"))?,
        ),
    };
    let backend = backend.as_mut();
    println!("{}", super::describe(&backend.facts()));
    if gemm {
        super::tiles::time_projections(backend, &rows, runs, cut)?;
    }
    if qkv {
        super::qkv::time_qkv(backend, &rows, runs, cut)?;
    }
    if !gdn {
        return Ok(());
    }
    let [nk, dk, nv, dv] = SHAPE;
    println!(
        "gdn recurrence, one sequence's chunk: {nk} key heads, {nv} value heads, dk {dk}, dv {dv}; \
         {runs} launches each, medians"
    );
    println!(
        "{:>6} {:>14} {:>11} {:>11} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "rows",
        "row-by-row us",
        "chunked us",
        "mma us",
        "us/row",
        "us/row",
        "us/row",
        "ratio",
        "mma ratio",
        "max diff"
    );
    let (mut ratios, mut mma_ratios) = (Vec::new(), Vec::new());
    for &n in &rows {
        let (line, [ratio, mma]) =
            time_width(backend, n, runs).map_err(|e| format!("{n} rows: {e}"))?;
        println!("{line}");
        ratios.push(format!("{n} rows x{ratio:.3}"));
        mma_ratios.push(format!("{n} rows x{mma:.3}"));
    }
    println!(
        "gdn kernels: chunked / row by row: {}; on the tensor cores: {}",
        ratios.join(", "),
        mma_ratios.join(", ")
    );
    Ok(())
}

/// One width: the three kernels from the same state, the chunked outputs compared with the
/// row-by-row ones, then each timed. Returns the table's line and the chunked forms' ratios to
/// the row-by-row kernel (CUDA cores, tensor cores).
fn time_width(
    backend: &mut dyn GpuBackend,
    rows: u32,
    runs: usize,
) -> Result<(String, [f64; 2]), String> {
    let [nk, dk, nv, dv] = SHAPE;
    let r = rows as usize;
    let channels = (2 * nk * dk + nv * dv) as usize;
    let state_elems = (nv * dk * dv) as usize;
    let mut buffers = Buffers::new(backend);
    let mixed = buffers.upload(&bf16_bytes(wave(r * channels, 0.5)))?;
    // b and a about ±3: beta in (0.05, 0.95), decays over the whole range.
    let ba = buffers.upload(&bf16_bytes(wave(r * 2 * nv as usize, 1.5).map(|v| 3.0 * v)))?;
    let a_log = buffers.upload(&bf16_bytes(wave(nv as usize, 2.5).map(|v| 0.5 * v)))?;
    let dt_bias = buffers.upload(&bf16_bytes(wave(nv as usize, 3.5)))?;
    let slots = buffers.upload(&vec![0u8; r * 4])?;
    let initial: Vec<u8> = wave(state_elems, 4.5)
        .flat_map(|v| (0.5 * v).to_le_bytes())
        .collect();
    let out_bytes = r * (nv * dv) as usize * 2;
    let mut launches = Vec::new();
    let mut outputs = Vec::new();
    for form in 0..3 {
        let state = buffers.upload(&initial)?;
        let out = buffers.upload(&vec![0u8; out_bytes])?;
        let chunked = GatesChunked {
            mixed,
            ba,
            a_log,
            dt_bias,
            state,
            slots,
            out_slots: slots,
            out,
            rows,
            nk,
            dk,
            nv,
            dv,
            num_slots: 1,
            chain: 1,
        };
        let launch = match form {
            0 => GatesRecurrence {
                mixed,
                ba,
                a_log,
                dt_bias,
                state,
                slots,
                out_slots: slots,
                out,
                snapshots: None,
                keep: None,
                rows,
                nk,
                dk,
                nv,
                dv,
                num_slots: 1,
                chain: 1,
            }
            .launch(GATES_RECURRENCE),
            1 => chunked.launch(GATES_CHUNKED),
            _ => chunked.launch_with(GATES_CHUNKED_MMA, chunked_mma_config(rows, dk, nv, dv, 1)),
        };
        launch_once(buffers.backend(), &launch)?;
        outputs.push(download_bf16(buffers.backend(), out)?);
        launches.push(launch);
    }
    let scale = outputs[0].iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let mut relative = 0.0f32;
    for (name, out) in [
        ("chunked form", &outputs[1]),
        ("tensor-core form", &outputs[2]),
    ] {
        let diff = (outputs[0].iter().zip(out)).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        let r = if scale > 0.0 { diff / scale } else { diff };
        if !r.is_finite() || r > 2e-2 {
            return Err(format!(
                "the {name}'s outputs differ from the recurrence's by {r:.3e} of the largest: \
                 more than rounding"
            ));
        }
        relative = relative.max(r);
    }
    let mut us = [0.0f64; 3];
    for (us, launch) in us.iter_mut().zip(&launches) {
        *us = time(buffers.backend(), launch, runs)?;
    }
    buffers.free()?;
    let [row_by_row, chunked, mma] = us;
    let ratios = [chunked / row_by_row, mma / row_by_row];
    let per_row = |t: f64| t / rows as f64;
    let line = format!(
        "{rows:>6} {row_by_row:>14.1} {chunked:>11.1} {mma:>11.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3} \
         {:>9.3} {relative:>9.2e}",
        per_row(row_by_row),
        per_row(chunked),
        per_row(mma),
        ratios[0],
        ratios[1],
    );
    Ok((line, ratios))
}

#[cfg(test)]
mod tests {
    /// The harness on the CPU twins (every family): the recurrence's three kernels (row by
    /// row, chunked on the CUDA cores and on the tensor cores) run and agree, each projection's
    /// output is finite and not all zero, each q/k/v tile writes the other's bytes, and a line
    /// per width is printed.
    #[test]
    fn the_dry_run_times_every_kernel_and_they_agree() {
        super::run(vec![
            "--rows".into(),
            "3,17".into(),
            "--runs".into(),
            "1".into(),
        ])
        .expect("dry run");
    }

    #[test]
    fn bad_widths_and_runs_are_refused_by_name() {
        let err = super::run(vec!["--rows".into(), "0".into()]).unwrap_err();
        assert!(err.contains("--rows"), "{err}");
        let err = super::run(vec!["--runs".into(), "x".into()]).unwrap_err();
        assert!(err.contains("--runs"), "{err}");
        let err = super::run(vec!["--family".into(), "gemv".into()]).unwrap_err();
        assert!(err.contains("--family"), "{err}");
    }
}
