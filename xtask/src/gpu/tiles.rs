//! `gpu-kernels --family gemm`: the tensor-core projections timed alone at Llama-3.1-8B's layer
//! shapes, each against its roofline (bytes at 4.8 TB/s, FLOPs at 990 TFLOPS) and against the
//! floor its weights would set if they came from DRAM once per 64-row block, as they did while
//! the grid was issued feature blocks first (docs/PERFORMANCE.md, "Tensor-core tiles issued row
//! blocks first"). A median under that floor shows the weights were read about once.
//!
//! On the CPU backend the shapes are cut by 32 (a dry run of the harness on the twins).

use solder_gpu_runtime::GpuBackend;
use solder_model_layers::kernels::gemm::{GateUpSiluMma, LinearMma, GATE_UP_SILU_MMA, LINEAR_MMA};
use solder_model_layers::kernels::{Buf, Launch};

use super::alone::{bf16_bytes, download_bf16, launch_once, time, wave, Buffers};

/// H200 peaks the plan's roofline uses, and the L2 a weight must exceed to be re-read.
const TBPS: f64 = 4.8e12;
const TFLOPS: f64 = 990e12;
const L2_BYTES: f64 = 50e6;
/// Rows of a tensor-core block tile (gemm.cu's GEMM_BM).
const TILE_ROWS: u32 = 64;

/// One projection of Llama-3.1-8B's layer: its name, its summary label, k, features, and
/// weights (1, or gate and up).
struct Projection {
    name: &'static str,
    label: &'static str,
    k: u32,
    n: u32,
    weights: u32,
}

const PROJECTIONS: [Projection; 3] = [
    Projection {
        name: "gate_up_silu_mma",
        label: "gate_up",
        k: 4096,
        n: 14336,
        weights: 2,
    },
    Projection {
        name: "linear_mma down",
        label: "down",
        k: 14336,
        n: 4096,
        weights: 1,
    },
    Projection {
        name: "linear_mma o",
        label: "o",
        k: 4096,
        n: 4096,
        weights: 1,
    },
];

/// Times every projection at every width; prints a line each and the summary line
/// `gemm kernels: …` (each launch's median as a fraction of its roofline).
pub fn time_projections(
    backend: &mut dyn GpuBackend,
    rows: &[u32],
    runs: usize,
    cut: u32,
) -> Result<(), String> {
    println!(
        "tensor-core projections at Llama-3.1-8B's shapes{}; {runs} launches each, medians",
        if cut > 1 {
            format!(" cut by {cut} (dry run)")
        } else {
            String::new()
        }
    );
    println!(
        "{:>6} {:<18} {:>12} {:>12} {:>10} {:>14} {:>8}",
        "rows", "kernel", "median us", "roofline us", "of roof", "re-read floor", "TFLOPS"
    );
    let mut summary = Vec::new();
    for &r in rows {
        for p in &PROJECTIONS {
            let (k, n) = (p.k / cut, p.n / cut);
            let us = time_one(backend, p, r, k, n, runs)
                .map_err(|e| format!("{} at {r} rows: {e}", p.name))?;
            let weight = 2.0 * f64::from(k) * f64::from(n) * f64::from(p.weights);
            let moved = weight + 2.0 * f64::from(r) * f64::from(k + n);
            let flops = 2.0 * f64::from(r) * f64::from(k) * f64::from(n) * f64::from(p.weights);
            let roof = (moved / TBPS).max(flops / TFLOPS) * 1e6;
            let reread = match weight > L2_BYTES {
                true => f64::from(r.div_ceil(TILE_ROWS)) * weight,
                false => weight,
            };
            let floor = (reread + moved - weight) / TBPS * 1e6;
            println!(
                "{r:>6} {:<18} {us:>12.1} {roof:>12.1} {:>10.3} {floor:>14.1} {:>8.1}",
                p.name,
                roof / us,
                flops / us * 1e-6
            );
            summary.push(format!("{} {r} x{:.2}", p.label, roof / us));
        }
    }
    println!("gemm kernels: of roofline: {}", summary.join(", "));
    Ok(())
}

/// One projection at `rows`: its output checked finite and not all zero, then timed.
fn time_one(
    backend: &mut dyn GpuBackend,
    p: &Projection,
    rows: u32,
    k: u32,
    n: u32,
    runs: usize,
) -> Result<f64, String> {
    let (r, k_, n_) = (rows as usize, k as usize, n as usize);
    let mut buffers = Buffers::new(backend);
    let x = buffers.upload(&bf16_bytes(wave(r * k_, 0.5)))?;
    // Weights about ±1/√k, so each output stays about ±1.
    let scale = 1.0 / (k as f32).sqrt();
    let mut weight = |seed| buffers.upload(&bf16_bytes(wave(n_ * k_, seed).map(|v| v * scale)));
    let w = weight(1.5)?;
    let wu = match p.weights {
        2 => Some(weight(2.5)?),
        _ => None,
    };
    let out: Buf = buffers.upload(&vec![0u8; r * n_ * 2])?;
    let launch: Launch = match wu {
        Some(wu) => GateUpSiluMma {
            x,
            wg: w,
            wu,
            act: out,
            rows,
            k,
            inter: n,
        }
        .launch(GATE_UP_SILU_MMA),
        None => LinearMma {
            x,
            w,
            bias: None,
            y: out,
            rows,
            k,
            n_out: n,
        }
        .launch(LINEAR_MMA),
    };
    launch_once(buffers.backend(), &launch)?;
    let values = download_bf16(buffers.backend(), out)?;
    if values.iter().any(|v| !v.is_finite()) || values.iter().all(|&v| v == 0.0) {
        return Err("its output is not finite, or all zero".into());
    }
    let us = time(buffers.backend(), &launch, runs)?;
    buffers.free()?;
    Ok(us)
}
