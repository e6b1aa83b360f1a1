//! `gpu-kernels --family gemm`: the tensor-core projections timed alone at Llama-3.1-8B's layer
//! shapes, each against its roofline (bytes at 4.8 TB/s, FLOPs at 990 TFLOPS) and against the
//! floor its weights would set if they came from DRAM once per 64-row block, as they did while
//! the grid was issued feature blocks first (docs/PERFORMANCE.md, "Tensor-core tiles issued row
//! blocks first"). A median under that floor shows the weights were read about once. Beside
//! each, the CUDA-core kernel the same projection runs without the `tensor_cores` lever
//! (`gemv::gate_up_silu`, `gemv::linear`, in the entry its emitter picks at that width), from
//! the same buffers: their outputs agree up to rounding, and the ratio says from which width
//! the lever pays (the lever holds at every width: a width threshold would change a sequence's
//! bytes with its program's width). And the same projection through its `_large` entry
//! (gemm.cu `gemm_large`, lever `mma_large`: 128 × 64 tiles of eight warps), whose outputs must
//! be the tensor-core kernel's bytes: its median, and the 64 × 32 tile's over it. At decode
//! widths (up to `gemm::NARROW_ROWS`) the same through the `_narrow` entry (gemm.cu
//! `gemm_narrow`, lever `mma_narrow`: passes of 16 rows, 256 k staged at a time), whose outputs
//! must be those bytes too: its median, and the CUDA-core kernel's over it (whether the narrow
//! tile catches gemv where the 64-row tile did not). Past them, the same through the `_pipe`
//! entry (gemm.cu `gemm_pipe`, lever `mma_pipe`: the `_large` tiles with three k tiles in flight
//! through cp.async), those bytes too: its median, and the `_large` entry's over it.
//!
//! On the CPU backend the shapes are cut by 32 (a dry run of the harness on the twins); `--cut`
//! cuts them on a device too (a quick pass under compute-sanitizer).

use solder_config::Levers;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::kernels::gemm::{
    large_grid, pipe_of, GateUpSiluMma, LinearMma, GATE_UP_SILU_MMA, GATE_UP_SILU_MMA_LARGE,
    GATE_UP_SILU_MMA_NARROW, LINEAR_MMA, LINEAR_MMA_LARGE, LINEAR_MMA_NARROW, NARROW_ROWS,
};
use solder_model_layers::kernels::gemv::{GateUpSilu, Linear, GEMV_UNSPLIT};
use solder_model_layers::kernels::{Buf, Launch};

use super::alone::{bf16_bytes, download_bf16, launch_once, time, wave, Buffers};

/// H200 peaks the plan's roofline uses, and the L2 a weight must exceed to be re-read.
pub(super) const TBPS: f64 = 4.8e12;
pub(super) const TFLOPS: f64 = 990e12;
const L2_BYTES: f64 = 50e6;
/// Rows of a tensor-core block tile (gemm.cu's GEMM_BM).
const TILE_ROWS: u32 = 64;

/// One projection of Llama-3.1-8B's layer: its name, its summary label (short: `gu` gate/up,
/// `dn` down, `o`), k, features, and weights (1, or gate and up).
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
        label: "gu",
        k: 4096,
        n: 14336,
        weights: 2,
    },
    Projection {
        name: "linear_mma down",
        label: "dn",
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

/// Times every projection at every width; prints a line each and the summary lines
/// `gemm kernels: …` (each tensor-core launch's median as a fraction of its roofline, and the
/// CUDA-core kernel's time over it) and `gemm tiles: …` (the tiles' medians over each other).
pub fn time_projections(
    backend: &mut dyn GpuBackend,
    rows: &[u32],
    runs: usize,
    cut: u32,
) -> Result<(), String> {
    println!(
        "tensor-core projections at Llama-3.1-8B's shapes{}; {runs} launches each, medians",
        if cut > 1 {
            format!(" cut by {cut}")
        } else {
            String::new()
        }
    );
    println!(
        "{:>6} {:<18} {:>10} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>12} {:>8} {:>14} {:>8} {:>9}",
        "rows",
        "kernel",
        "mma us",
        "gemv us",
        "gemv/mma",
        "large us",
        "mma/large",
        "pipe us",
        "large/pipe",
        "narrow us",
        "gemv/narrow",
        "roofline us",
        "of roof",
        "re-read floor",
        "TFLOPS",
        "max diff"
    );
    let mut summary: Vec<Case> = Vec::new();
    for p in &PROJECTIONS {
        let (k, n) = (p.k / cut, p.n / cut);
        let timed =
            time_widths(backend, p, rows, k, n, runs).map_err(|e| format!("{}: {e}", p.name))?;
        for (&r, t) in rows.iter().zip(timed) {
            let weight = 2.0 * f64::from(k) * f64::from(n) * f64::from(p.weights);
            let moved = weight + 2.0 * f64::from(r) * f64::from(k + n);
            let flops = 2.0 * f64::from(r) * f64::from(k) * f64::from(n) * f64::from(p.weights);
            let roof = (moved / TBPS).max(flops / TFLOPS) * 1e6;
            let reread = match weight > L2_BYTES {
                true => f64::from(r.div_ceil(TILE_ROWS)) * weight,
                false => weight,
            };
            let floor = (reread + moved - weight) / TBPS * 1e6;
            // The narrow tile's columns, at decode widths only; the pipe's past them.
            let (narrow, gemv_over_narrow) = match t.narrow {
                Some(us) => (format!("{us:.1}"), format!("{:.3}", t.gemv / us)),
                None => ("-".into(), "-".into()),
            };
            let (pipe, large_over_pipe) = match t.pipe {
                Some(us) => (format!("{us:.1}"), format!("{:.3}", t.large / us)),
                None => ("-".into(), "-".into()),
            };
            println!(
                "{r:>6} {:<18} {:>10.1} {:>10.1} {:>9.3} {:>10.1} {:>10.3} {pipe:>10} {large_over_pipe:>10} {narrow:>10} {gemv_over_narrow:>11} {roof:>12.1} {:>8.3} {floor:>14.1} {:>8.1} {:>9.2e}",
                p.name,
                t.mma,
                t.gemv,
                t.gemv / t.mma,
                t.large,
                t.mma / t.large,
                roof / t.mma,
                flops / t.mma * 1e-6,
                t.diff
            );
            summary.push(Case {
                rows: r,
                label: p.label,
                of_roof: roof / t.mma,
                gemv_over_mma: t.gemv / t.mma,
                mma_over_large: t.mma / t.large,
                large_over_pipe: t.pipe.map(|us| t.large / us),
                gemv_over_narrow: t.narrow.map(|us| t.gemv / us),
            });
        }
    }
    let [kernels, tiles] = summary_lines(&summary);
    println!("{kernels}");
    println!("{tiles}");
    Ok(())
}

/// One projection at one width, for the summary row.
struct Case {
    rows: u32,
    label: &'static str,
    /// The tensor-core median as a fraction of the roofline.
    of_roof: f64,
    /// The CUDA-core median over the tensor cores'.
    gemv_over_mma: f64,
    /// The 64 × 32 tile's median over the `_large` entry's.
    mma_over_large: f64,
    /// The `_large` entry's median over the `_pipe` entry's (past decode widths).
    large_over_pipe: Option<f64>,
    /// The CUDA-core median over the `_narrow` entry's (decode widths).
    gemv_over_narrow: Option<f64>,
}

/// `gemm kernels: …`: the tensor cores' fraction of the roofline at the widest width, and the
/// CUDA cores' time over the `_narrow` entry's at the narrowest (over the 64 × 32 tile's where
/// that width is past the narrow tile's); `gemm tiles: …`: the 64 × 32 tile's time over the
/// `_large` entry's and the `_large` entry's over the `_pipe` entry's at the widest width. Each
/// short enough for a row of the bundle's summary (110 characters).
fn summary_lines(cases: &[Case]) -> [String; 2] {
    let (Some(wide), Some(narrow)) = (
        cases.iter().map(|c| c.rows).max(),
        cases.iter().map(|c| c.rows).min(),
    ) else {
        return [
            "gemm kernels: no widths".into(),
            "gemm tiles: no widths".into(),
        ];
    };
    let at = |rows: u32, f: fn(&Case) -> f64| {
        let parts: Vec<String> = cases
            .iter()
            .filter(|c| c.rows == rows)
            .map(|c| format!("{} {:.2}", c.label, f(c)))
            .collect();
        parts.join(" ")
    };
    let tile = match narrow <= NARROW_ROWS {
        true => "narrow",
        false => "mma",
    };
    [
        format!(
            "gemm kernels: roof@{wide} {}; gemv/{tile}@{narrow} {}",
            at(wide, |c| c.of_roof),
            at(narrow, |c| c.gemv_over_narrow.unwrap_or(c.gemv_over_mma))
        ),
        format!(
            "gemm tiles: mma/large@{wide} {}; large/pipe@{wide} {}",
            at(wide, |c| c.mma_over_large),
            at(wide, |c| c.large_over_pipe.unwrap_or(f64::NAN))
        ),
    ]
}

/// One projection's medians: the tensor cores', the CUDA cores', the `_large` entry's, the
/// `_narrow` entry's (decode widths), the `_pipe` entry's (past them), and the first two's
/// outputs' largest difference relative to the largest output.
struct Timed {
    mma: f64,
    gemv: f64,
    large: f64,
    narrow: Option<f64>,
    pipe: Option<f64>,
    diff: f32,
}

/// One projection at each of `widths`, both kernels from the same buffers (the weights
/// uploaded once, x and the outputs sized for the widest): at each width their outputs checked
/// finite, not all zero and equal up to rounding (the `_large` entry's: the tensor-core
/// kernel's bytes), then each timed.
fn time_widths(
    backend: &mut dyn GpuBackend,
    p: &Projection,
    widths: &[u32],
    k: u32,
    n: u32,
    runs: usize,
) -> Result<Vec<Timed>, String> {
    let widest = widths.iter().copied().max().unwrap_or(1) as usize;
    let (k_, n_) = (k as usize, n as usize);
    let mut buffers = Buffers::new(backend);
    let x = buffers.upload(&bf16_bytes(wave(widest * k_, 0.5)))?;
    // Weights about ±1/√k, so each output stays about ±1.
    let scale = 1.0 / (k as f32).sqrt();
    let mut weight = |seed| buffers.upload(&bf16_bytes(wave(n_ * k_, seed).map(|v| v * scale)));
    let w = weight(1.5)?;
    let wu = match p.weights {
        2 => Some(weight(2.5)?),
        _ => None,
    };
    let mut outs = Vec::new();
    for _ in 0..5 {
        outs.push(buffers.upload(&vec![0u8; widest * n_ * 2])?);
    }
    let outs: [Buf; 5] = outs.try_into().expect("five outputs");
    let mut timed = Vec::new();
    for &rows in widths {
        let at = |what: String| format!("at {rows} rows: {what}");
        // The first `rows` rows of x and of each output: a launch's buffers are its own size.
        let r = rows as usize;
        let x = Buf::new(x.ptr, r * k_ * 2);
        let outs = outs.map(|o| Buf::new(o.ptr, r * n_ * 2));
        let [mma, gemv, large, narrow, pipe] = launches(x, w, wu, outs, rows, k, n);
        let [o_mma, o_gemv, o_large, o_narrow, o_pipe] = outs;
        // The `_narrow` entry only at the widths its lever takes it, the `_pipe` one past them.
        let decode = rows <= NARROW_ROWS;
        let (fourth, o_fourth) = if decode {
            (narrow, o_narrow)
        } else {
            (pipe, o_pipe)
        };
        let launches = [mma, gemv, large, fourth];
        let mut values = Vec::new();
        // Zeroed first, so a launch that writes nothing is not read as a wider one's output.
        let zeros = vec![0u8; r * n_ * 2];
        for (launch, out) in launches.iter().zip([o_mma, o_gemv, o_large, o_fourth]) {
            (buffers.backend().copy_h2d(out.ptr, &zeros)).map_err(|e| at(e.to_string()))?;
            launch_once(buffers.backend(), launch).map_err(at)?;
            let v = download_bf16(buffers.backend(), out).map_err(at)?;
            if v.iter().any(|v| !v.is_finite()) || v.iter().all(|&v| v == 0.0) {
                return Err(at(format!(
                    "{}'s output is not finite, or all zero",
                    launch.kernel
                )));
            }
            values.push(v);
        }
        let largest = values[1].iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff =
            (values[0].iter().zip(&values[1])).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        let diff = diff / largest;
        if !diff.is_finite() || diff > 2e-2 {
            return Err(at(format!(
                "the tensor cores' outputs differ from the CUDA cores' by {diff:.3e} of the \
                 largest: more than rounding"
            )));
        }
        // The other tiles of the tensor-core kernel: its bytes.
        for (launch, v) in launches.iter().zip(&values).skip(2) {
            if v.iter()
                .map(|v| v.to_bits())
                .ne(values[0].iter().map(|v| v.to_bits()))
            {
                return Err(at(format!(
                    "{}'s outputs are not {}'s bytes",
                    launch.kernel, launches[0].kernel
                )));
            }
        }
        let mma = time(buffers.backend(), &launches[0], runs).map_err(at)?;
        let gemv = time(buffers.backend(), &launches[1], runs).map_err(at)?;
        let large = time(buffers.backend(), &launches[2], runs).map_err(at)?;
        let fourth = time(buffers.backend(), &launches[3], runs).map_err(at)?;
        let (narrow, pipe) = if decode {
            (Some(fourth), None)
        } else {
            (None, Some(fourth))
        };
        timed.push(Timed {
            mma,
            gemv,
            large,
            narrow,
            pipe,
            diff,
        });
    }
    buffers.free()?;
    Ok(timed)
}

/// The tensor-core launch into `outs[0]`, the CUDA-core one into `outs[1]`, the tensor-core
/// kernel's `_large` entry into `outs[2]`, its `_narrow` entry into `outs[3]` and its `_pipe`
/// entry (in the large grid, with its stages' shared memory) into `outs[4]`: gate and up with
/// SiLU·mul when there is an up weight, else a plain projection. The CUDA-core launch takes the
/// entry and split its emitter picks at `rows`, unsplit where that split would need the step's
/// split-K scratch (a kernel timed alone has none).
fn launches(
    x: Buf,
    w: Buf,
    wu: Option<Buf>,
    outs: [Buf; 5],
    rows: u32,
    k: u32,
    n: u32,
) -> [Launch; 5] {
    let unsplit = {
        let mut levers = Levers::default();
        levers.set(GEMV_UNSPLIT, true).expect("a known lever");
        levers
    };
    let pick = |scratch: usize| match scratch {
        0 => Levers::default(),
        _ => unsplit.clone(),
    };
    match wu {
        Some(wu) => {
            let gemv = GateUpSilu {
                x,
                wg: w,
                wu,
                act: outs[1],
                rows,
                k,
                inter: n,
                scratch: None,
            };
            let shape = gemv.shape(&pick(gemv.shape(&Levers::default()).scratch_bytes));
            let pipe = pipe_of(GATE_UP_SILU_MMA_LARGE, large_grid(n, rows)).expect("a _pipe entry");
            let mma = |act| GateUpSiluMma {
                x,
                wg: w,
                wu,
                act,
                rows,
                k,
                inter: n,
            };
            [
                mma(outs[0]).launch(GATE_UP_SILU_MMA),
                gemv.launch_in(shape),
                mma(outs[2]).launch_with(GATE_UP_SILU_MMA_LARGE, large_grid(n, rows)),
                mma(outs[3]).launch(GATE_UP_SILU_MMA_NARROW),
                mma(outs[4]).launch_with(pipe.0, pipe.1),
            ]
        }
        None => {
            let gemv = Linear {
                x,
                w,
                bias: None,
                y: outs[1],
                rows,
                k,
                n_out: n,
                scratch: None,
            };
            let shape = gemv.shape(&pick(gemv.shape(&Levers::default()).scratch_bytes));
            let pipe = pipe_of(LINEAR_MMA_LARGE, large_grid(n, rows)).expect("a _pipe entry");
            let mma = |y| LinearMma {
                x,
                w,
                bias: None,
                y,
                rows,
                k,
                n_out: n,
            };
            [
                mma(outs[0]).launch(LINEAR_MMA),
                gemv.launch_in(shape),
                mma(outs[2]).launch_with(LINEAR_MMA_LARGE, large_grid(n, rows)),
                mma(outs[3]).launch(LINEAR_MMA_NARROW),
                mma(outs[4]).launch_with(pipe.0, pipe.1),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use solder_gpu_runtime::cpu::emu::EmuMode;
    use solder_model_layers::kernels::gemm::{GATE_UP_SILU_MMA_PIPE, LINEAR_MMA_PIPE};

    /// The harness over the CUDA sources run by the host emulation (shadow mode: the twin, then
    /// the emulated kernel, whose bytes are kept), at Llama-3.1-8B's projections cut by 64 (k 64
    /// to 224: one to four k tiles): at one row the `_narrow` entry, at 130 rows (two row blocks)
    /// the `_pipe` one, each writing the 64 × 32 kernel's bytes from the harness's buffers, as
    /// does the `_large` entry, and each launch its twin's.
    #[test]
    fn the_emulated_tiles_agree_in_the_harness() {
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
        let root = crate::paths::workspace_root();
        backend.set_emulation(Some(crate::emu::emulation(&root, EmuMode::Shadow).unwrap()));
        for p in &PROJECTIONS {
            let timed = time_widths(&mut backend, p, &[1, 130], p.k / 64, p.n / 64, 1)
                .unwrap_or_else(|e| panic!("{}: {e}", p.name));
            assert!(
                timed[0].narrow.is_some() && timed[0].pipe.is_none(),
                "{}",
                p.name
            );
            assert!(
                timed[1].pipe.is_some() && timed[1].narrow.is_none(),
                "{}",
                p.name
            );
        }
        let report = backend.emulation().unwrap().report();
        for (entry, launches) in [
            (LINEAR_MMA_PIPE.as_str(), 2),
            (GATE_UP_SILU_MMA_PIPE.as_str(), 1),
        ] {
            let parity = &report[entry];
            // The checked launch and the two timed ones, per projection.
            assert_eq!(parity.launches, 3 * launches, "{entry}: {parity:?}");
            assert_eq!(parity.identical, parity.launches, "{entry}: {parity:?}");
        }
    }
}
