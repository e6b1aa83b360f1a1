//! Shadow mode's verdict for `parity --backend emu`: per kernel, the launches the run made,
//! how many the emulated CUDA kernel wrote byte for byte as its twin did, and the first
//! difference; then the declared kernels the run never launched (unproven by it).
//!
//! Every twin does its CUDA kernel's arithmetic in the kernel's order, fma included
//! (`numerics::reduce`: `warp_dot`, `warp_sum_squares`, the o-fold's head dot, topk_softmax's
//! sum; `numerics::attention`: attention's online softmax, its pieces and splits), so every
//! emulated kernel must write its twin's bytes: any difference fails, and the CPU backend
//! predicts the GPU's bytes wherever the GPU's `expf` is glibc's (the host emulation's). There
//! is no list of known differences; a kernel whose order a twin cannot follow would need one,
//! by full name, with a per-element bound derived from the two orders and a test that a
//! one-term mutation of the kernel exceeds it. The CUDA kernels' own routings are still
//! compared byte for byte by parity's table, which runs on the emulated bytes.

use std::collections::BTreeMap;

use serde_json::json;
use solder_gpu_runtime::cpu::emu::KernelParity;

pub struct EmuVerdict {
    pub kernels: BTreeMap<String, KernelParity>,
    /// Declared kernels no launch of the run used.
    pub never_launched: Vec<String>,
}

/// Several shadow-mode records as one (parity's workers keep one each): per kernel the
/// launches and identical launches summed, the largest relative difference, and the first
/// mismatch of the first record holding one.
pub fn merged<'a>(
    reports: impl IntoIterator<Item = &'a BTreeMap<String, KernelParity>>,
) -> BTreeMap<String, KernelParity> {
    let mut all: BTreeMap<String, KernelParity> = BTreeMap::new();
    for report in reports {
        for (name, k) in report {
            let sum = all.entry(name.clone()).or_default();
            sum.launches += k.launches;
            sum.identical += k.identical;
            sum.max_relative = sum.max_relative.max(k.max_relative);
            if sum.first_mismatch.is_none() {
                sum.first_mismatch.clone_from(&k.first_mismatch);
            }
        }
    }
    all
}

impl EmuVerdict {
    pub fn of(report: &BTreeMap<String, KernelParity>) -> EmuVerdict {
        let never_launched = solder_model_layers::kernels::registry()
            .map(|decl| decl.name.to_string())
            .filter(|name| !report.contains_key(name))
            .collect();
        EmuVerdict {
            kernels: report.clone(),
            never_launched,
        }
    }

    /// Kernels whose emulation differs from their twin: every one fails the run.
    pub fn differing(&self) -> Vec<&str> {
        self.kernels
            .iter()
            .filter(|(_, k)| k.identical != k.launches)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    pub fn passes(&self) -> bool {
        self.differing().is_empty()
    }

    pub fn print(&self) {
        println!("== emulated CUDA kernels vs twins (every launch, same inputs, writable bytes compared)");
        let width = self
            .kernels
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(6)
            .max(6);
        println!(
            "  {:width$}  {:>8}  {:>9}  {:>8}  first difference",
            "kernel", "launches", "identical", "max rel"
        );
        for (name, k) in &self.kernels {
            let ulps = match k.max_relative {
                0.0 => "0".to_string(),
                r if r.is_finite() => format!("{r:.1e}"),
                _ => "inf".to_string(),
            };
            println!(
                "  {name:width$}  {:>8}  {:>9}  {ulps:>8}  {}",
                k.launches,
                k.identical,
                k.first_mismatch.as_deref().unwrap_or("-")
            );
        }
        if !self.never_launched.is_empty() {
            println!(
                "  never launched (not proven by this run): {}",
                self.never_launched.join(", ")
            );
        }
        let differing = self.differing();
        println!(
            "emu: {} kernels launched, {} identical to their twins byte for byte, {} differ{}",
            self.kernels.len(),
            self.kernels.len() - differing.len(),
            differing.len(),
            if differing.is_empty() {
                String::new()
            } else {
                format!(": {}", differing.join(", "))
            }
        );
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "pass": self.passes(),
            "kernels": self.kernels.iter().map(|(name, k)| json!({
                "kernel": name,
                "launches": k.launches,
                "identical": k.identical,
                "first_mismatch": k.first_mismatch,
                "max_relative": k.max_relative,
            })).collect::<Vec<_>>(),
            "differing": self.differing(),
            "never_launched": self.never_launched,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parity(launches: u64, identical: u64, max_relative: f64) -> KernelParity {
        KernelParity {
            launches,
            identical,
            first_mismatch: (identical < launches).then(|| "arg 0 element 0".to_string()),
            max_relative,
        }
    }

    #[test]
    fn any_difference_fails() {
        let mut report = BTreeMap::new();
        report.insert("add::residual_add".to_string(), parity(3, 3, 0.0));
        report.insert("gemv::linear".to_string(), parity(3, 3, 0.0));
        assert!(EmuVerdict::of(&report).passes());
        // The smallest difference fails, in a reduction kernel as anywhere.
        report.insert("gemv::lm_head".to_string(), parity(2, 1, 1e-9));
        report.insert("attn::paged_decode".to_string(), parity(1, 0, 1e-9));
        let verdict = EmuVerdict::of(&report);
        assert_eq!(verdict.differing(), ["attn::paged_decode", "gemv::lm_head"]);
        assert!(!verdict.passes());
        assert!(verdict
            .never_launched
            .contains(&"norm::rms_norm".to_string()));
    }

    /// Two workers' records: a kernel one of them saw differ still fails the merged verdict,
    /// whichever worker ran it.
    #[test]
    fn merged_records_sum_launches_and_keep_a_difference() {
        let mut a = BTreeMap::new();
        a.insert("gemv::linear".to_string(), parity(3, 3, 0.0));
        a.insert("norm::rms_norm".to_string(), parity(2, 2, 0.0));
        let mut b = BTreeMap::new();
        b.insert("gemv::linear".to_string(), parity(4, 3, 0.5));
        b.insert("attn::paged_decode".to_string(), parity(1, 1, 0.0));
        let all = merged([&a, &b]);
        assert_eq!(all.len(), 3);
        let linear = &all["gemv::linear"];
        assert_eq!((linear.launches, linear.identical), (7, 6));
        assert_eq!(linear.max_relative, 0.5);
        assert!(linear.first_mismatch.is_some());
        assert_eq!(all["norm::rms_norm"], parity(2, 2, 0.0));
        assert_eq!(EmuVerdict::of(&all).differing(), ["gemv::linear"]);
        assert!(EmuVerdict::of(&merged([&a])).passes());
    }
}
