//! `parity --backend cuda`'s cross-check: each model's all-rules decode run again on the CPU
//! backend, so a GPU kernel that computes something else than its CPU twin shows even where no
//! golden exists.
//!
//! The criterion on the GPU is the golden one (`e <= 1.5 * e_hf`) where a golden exists; where
//! none does, `max |gpu - cpu|` over the CPU logits' largest magnitude must stay within
//! `TOLERANCE`. NaN or infinity never passes.

use solder_circuit::{Policy, RuleSet};
use solder_gpu_runtime::CpuBackend;

use crate::parity::case::Case;
use crate::parity::execs::{build_exec, decode_all};
use crate::parity::golden::GoldenFigures;
use crate::parity::run::CaseReport;

/// `max |gpu - cpu| / max |cpu|` allowed without a golden.
pub const TOLERANCE: f32 = TOLERANCE_F64 as f32;
const TOLERANCE_F64: f64 = 2e-2;

pub struct CrossCheck {
    pub max_abs: f32,
    /// The largest `|logit|` of the CPU run.
    pub cpu_max_magnitude: f32,
    pub relative: f32,
    pub golden_gpu: Option<GoldenFigures>,
    pub golden_cpu: Option<GoldenFigures>,
}

impl CrossCheck {
    pub fn passes(&self) -> bool {
        match self.golden_gpu {
            Some(golden) => golden.passes(),
            None => self.relative.is_finite() && self.relative <= TOLERANCE,
        }
    }
}

/// Runs `case`'s all-rules decode on `cpu`, with the levers the GPU run had on, and compares
/// it with the GPU's (`gpu_report`).
pub fn check(
    case: &Case,
    rules: &RuleSet,
    cpu: &mut CpuBackend,
    gpu_report: &CaseReport,
) -> Result<CrossCheck, String> {
    // The same levers as the GPU's all-rules routing (`parity --levers`).
    let mut levers = solder_config::Levers::default();
    for name in &gpu_report.levers {
        levers.set(name, true).map_err(|e| e.to_string())?;
    }
    let policy = Policy {
        levers,
        ..Policy::default()
    };
    let mut exec = build_exec(case, rules, cpu, policy)?;
    let cpu_logits = decode_all(&exec, cpu, &case.prompt)?;
    exec.free(cpu).map_err(|e| e.to_string())?;
    if let Some(at) = crate::parity::golden::non_finite(&cpu_logits, case.config.vocab_size) {
        return Err(format!(
            "{}: the CPU backend's decode logits are not finite {at}",
            case.name
        ));
    }
    let gpu_logits = &gpu_report.decode_logits;
    if gpu_logits.len() != cpu_logits.len() {
        return Err(format!(
            "{}: {} GPU logits but {} CPU logits",
            case.name,
            gpu_logits.len(),
            cpu_logits.len()
        ));
    }
    let (max_abs, cpu_max_magnitude, relative) = distance(gpu_logits, &cpu_logits);
    Ok(CrossCheck {
        max_abs,
        cpu_max_magnitude,
        relative,
        golden_gpu: gpu_report.golden,
        golden_cpu: case
            .golden
            .as_ref()
            .map(|g| g.compare(&cpu_logits))
            .transpose()
            .map_err(|e| format!("{}: {e}", case.name))?,
    })
}

/// `max |gpu - cpu|`, `max |cpu|` and their ratio; a NaN anywhere counts as infinitely far.
pub(crate) fn distance(gpu: &[f32], cpu: &[f32]) -> (f32, f32, f32) {
    let worst = |acc: f32, v: f32| {
        if v.is_nan() {
            f32::INFINITY
        } else {
            acc.max(v)
        }
    };
    let max_abs = gpu
        .iter()
        .zip(cpu)
        .map(|(g, c)| (g - c).abs())
        .fold(0.0f32, worst);
    let cpu_max_magnitude = cpu.iter().map(|c| c.abs()).fold(0.0f32, worst);
    let relative = if cpu_max_magnitude > 0.0 {
        max_abs / cpu_max_magnitude
    } else if max_abs == 0.0 {
        0.0
    } else {
        f32::INFINITY
    };
    (max_abs, cpu_max_magnitude, relative)
}

/// The cross-check's lines under the case's parity table.
pub fn print(cross: &CrossCheck, tokens: usize) {
    let criterion = if cross.golden_gpu.is_some() {
        "the golden decides"
    } else if cross.passes() {
        "ok"
    } else {
        "TOO FAR"
    };
    println!(
        "  gpu vs cpu: all-rules decode of {tokens} tokens, max |gpu - cpu| {:.3e} = {:.3e} of max |cpu| {:.3e} (<= {TOLERANCE:e} without a golden): {criterion}",
        cross.max_abs, cross.relative, cross.cpu_max_magnitude
    );
    if let (Some(gpu), Some(cpu)) = (cross.golden_gpu, cross.golden_cpu) {
        println!(
            "  golden ratio: gpu {:.3} (top1 {:.1}%), cpu {:.3} (top1 {:.1}%); on the gpu e <= 1.5 * e_hf: {}",
            gpu.ratio,
            gpu.top1 * 100.0,
            cpu.ratio,
            cpu.top1 * 100.0,
            if gpu.passes() { "ok" } else { "TOO FAR" }
        );
    }
}

/// Adds the backend and each model's cross-check to the JSON report.
pub fn annotate(doc: &mut serde_json::Value, device: &str, checks: &[(String, CrossCheck)]) {
    let finite = |v: f32| {
        if v.is_finite() {
            serde_json::json!(v)
        } else {
            serde_json::json!("inf")
        }
    };
    doc["backend"] = serde_json::json!("cuda");
    doc["device"] = serde_json::json!(device);
    if let Some(models) = doc["models"].as_array_mut() {
        for model in models {
            let Some((_, cross)) = checks.iter().find(|(name, _)| model["model"] == *name) else {
                continue;
            };
            model["gpu_vs_cpu"] = serde_json::json!({
                "max_abs": finite(cross.max_abs),
                "cpu_max_magnitude": finite(cross.cpu_max_magnitude),
                "relative": finite(cross.relative),
                "tolerance_without_golden": TOLERANCE_F64,
                "golden_ratio_gpu": cross.golden_gpu.map(|g| finite(g.ratio)),
                "golden_ratio_cpu": cross.golden_cpu.map(|g| finite(g.ratio)),
                "ok": cross.passes(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cross(gpu: &[f32], cpu: &[f32]) -> CrossCheck {
        let (max_abs, cpu_max_magnitude, relative) = distance(gpu, cpu);
        CrossCheck {
            max_abs,
            cpu_max_magnitude,
            relative,
            golden_gpu: None,
            golden_cpu: None,
        }
    }

    #[test]
    fn relative_to_the_largest_cpu_logit() {
        let c = cross(&[1.0, -3.9, 0.5], &[1.0, -4.0, 0.5]);
        assert!((c.max_abs - 0.1).abs() < 1e-6);
        assert_eq!(c.cpu_max_magnitude, 4.0);
        assert!((c.relative - 0.025).abs() < 1e-6);
        assert!(!c.passes(), "2.5e-2 is over the tolerance");
        assert!(cross(&[1.0, -3.95, 0.5], &[1.0, -4.0, 0.5]).passes());
    }

    #[test]
    fn nan_never_passes() {
        let c = cross(&[f32::NAN, 1.0], &[0.0, 1.0]);
        assert_eq!(c.max_abs, f32::INFINITY);
        assert!(!c.passes());
        assert!(!cross(&[0.0], &[f32::NAN]).passes());
    }

    #[test]
    fn all_zero_logits_agree() {
        assert!(cross(&[0.0, 0.0], &[0.0, 0.0]).passes());
        assert!(!cross(&[0.0, 1e-9], &[0.0, 0.0]).passes());
    }
}
