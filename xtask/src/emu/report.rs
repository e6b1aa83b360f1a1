//! Shadow mode's verdict for `parity --backend emu`: per kernel, the launches the run made,
//! how many the emulated CUDA kernel wrote byte for byte as its twin did, and the first
//! difference; then the declared kernels the run never launched (unproven by it).
//!
//! Some twins do not do their CUDA kernel's arithmetic, by design (`KNOWN_DIFFERENCES`, each
//! with its reason): there the emulation may differ from the twin by rounding alone, at most
//! `KNOWN_MAX_RELATIVE` of a buffer's largest magnitude (two bf16 ulps there; a wrong index or
//! a missed term moves a value by far more). Any other difference fails. The CUDA kernels' own routings are still
//! compared byte for byte by parity's table, which runs on the emulated bytes.

use std::collections::BTreeMap;

use serde_json::json;
use solder_gpu_runtime::cpu::emu::KernelParity;

const DOT_ORDER: &str = "dot order: the twin sums 16 strided f32 lanes then a tree \
    (numerics::dot_f32_bf16), the CUDA kernel 32 lanes of 8-element chunks with fma then a \
    butterfly per 1024-element segment, the segment sums in order (common.cuh warp_dot, \
    gemv_block, gemv_stream)";
const SQUARES_ORDER: &str = "sum-of-squares order: the twin sums x*x (multiply, then add) in 16 \
    strided lanes then a tree (numerics::sum_squares_*), the CUDA kernel fma in 32 lanes then a \
    butterfly (common.cuh warp_sum_squares)";
const SOFTMAX_ORDER: &str = "softmax order: the twin sums a softmax in one pass, the CUDA \
    kernel in 32 lanes then a butterfly (attention: an online softmax per warp over 8 pieces, \
    merged, and split over blocks above 256 tokens)";

/// Kernels (`module::func`, or `module::` for all of a module) whose twin does not do the
/// CUDA kernel's arithmetic, and why.
pub const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    ("gemv::", DOT_ORDER),
    ("moe::router_topk", DOT_ORDER),
    ("moe::gate_up_silu", DOT_ORDER),
    ("moe::down", DOT_ORDER),
    ("norm::", SQUARES_ORDER),
    ("rope::qk_norm_rope", SQUARES_ORDER),
    ("rope::qk_norm_rope_kv_write", SQUARES_ORDER),
    ("attn::paged_decode", SOFTMAX_ORDER),
    ("attn::paged_causal", SOFTMAX_ORDER),
    ("moe::topk_softmax", SOFTMAX_ORDER),
];

/// The most a known difference may move a buffer: 2^-6 of its largest magnitude.
pub const KNOWN_MAX_RELATIVE: f64 = 1.0 / 64.0;

/// Why `kernel`'s twin may differ from its CUDA kernel, if it may.
pub fn known_difference(kernel: &str) -> Option<&'static str> {
    KNOWN_DIFFERENCES
        .iter()
        .find(|(name, _)| kernel == *name || (name.ends_with("::") && kernel.starts_with(name)))
        .map(|(_, why)| *why)
}

pub struct EmuVerdict {
    pub kernels: BTreeMap<String, KernelParity>,
    /// Declared kernels no launch of the run used.
    pub never_launched: Vec<String>,
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

    pub fn differing(&self) -> Vec<&str> {
        self.kernels
            .iter()
            .filter(|(_, k)| k.identical != k.launches)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Kernels that differ from their twin beyond what `KNOWN_DIFFERENCES` explains.
    pub fn unexplained(&self) -> Vec<&str> {
        self.kernels
            .iter()
            .filter(|(name, k)| {
                k.identical != k.launches
                    && (known_difference(name).is_none()
                        || k.max_relative.is_nan()
                        || k.max_relative > KNOWN_MAX_RELATIVE)
            })
            .map(|(name, _)| name.as_str())
            .collect()
    }

    pub fn passes(&self) -> bool {
        self.unexplained().is_empty()
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
        let known: Vec<&str> = self
            .differing()
            .into_iter()
            .filter(|name| !self.unexplained().contains(name))
            .collect();
        let mut reasons: Vec<&str> = KNOWN_DIFFERENCES.iter().map(|(_, why)| *why).collect();
        reasons.dedup();
        for why in reasons {
            let covered: Vec<&str> = known
                .iter()
                .copied()
                .filter(|name| known_difference(name) == Some(why))
                .collect();
            if !covered.is_empty() {
                println!("  known ({}): {why}", covered.join(", "));
            }
        }
        if !self.never_launched.is_empty() {
            println!(
                "  never launched (not proven by this run): {}",
                self.never_launched.join(", ")
            );
        }
        let differing = self.differing();
        let unexplained = self.unexplained();
        println!(
            "emu: {} kernels launched, {} identical to their twins byte for byte, {} differ within \
             a known rounding difference (max rel <= {KNOWN_MAX_RELATIVE}), {} differ unexplained{}",
            self.kernels.len(),
            self.kernels.len() - differing.len(),
            differing.len() - unexplained.len(),
            unexplained.len(),
            if unexplained.is_empty() {
                String::new()
            } else {
                format!(": {}", unexplained.join(", "))
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
                "known_difference": known_difference(name),
            })).collect::<Vec<_>>(),
            "unexplained": self.unexplained(),
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
    fn only_a_known_reduction_order_within_its_bound_may_differ() {
        let mut report = BTreeMap::new();
        report.insert("add::residual_add".to_string(), parity(3, 3, 0.0));
        report.insert("gemv::linear".to_string(), parity(3, 2, 1e-3));
        assert!(EmuVerdict::of(&report).passes());
        // A known kernel too far off, an unknown one off at all.
        report.insert("gemv::lm_head".to_string(), parity(1, 0, 0.5));
        report.insert("kv::kv_write".to_string(), parity(1, 0, 1e-9));
        let verdict = EmuVerdict::of(&report);
        assert_eq!(verdict.unexplained(), ["gemv::lm_head", "kv::kv_write"]);
        assert!(!verdict.passes());
        assert!(verdict
            .never_launched
            .contains(&"norm::rms_norm".to_string()));
        assert_eq!(known_difference("gemv::qkv_rope_kv"), Some(DOT_ORDER));
        assert_eq!(known_difference("rope::rope"), None);
    }
}
