//! The parity table and JSON report.

use std::path::Path;

use serde_json::json;

use super::run::{CaseReport, Diff};

fn diff_text(d: &Diff) -> String {
    match d.first_position {
        None => "identical".to_string(),
        Some(p) => format!("first diff at {p}, max {:.3e}", d.max_abs),
    }
}

pub fn print_case(r: &CaseReport, seconds: f64) {
    println!(
        "== {} ({}, {} tokens, vocab {}) in {seconds:.1} s",
        r.name, r.family, r.tokens, r.vocab
    );
    println!(
        "  {:<10} {:<18} {:>8} {:>12} {:>16}",
        "fusions", "decode plan", "launches", "pool_bytes", "live_lower_bound"
    );
    for v in &r.variants {
        println!(
            "  {:<10} {:<18} {:>8} {:>12} {:>16}",
            v.fusions,
            &v.plan_digest[..16],
            v.launches_per_step,
            v.pool_bytes,
            v.live_lower_bound
        );
    }
    println!("  mode        rows  live  reference vs all rules               vs each sequence decoded alone");
    for m in &r.modes {
        println!(
            "  {:<10} {:>5} {:>5}  {:<36} {}",
            m.mode.as_str(),
            m.rows,
            m.live,
            diff_text(&m.ref_vs_fused),
            diff_text(&m.vs_decode)
        );
    }
    println!(
        "  verifier: {} plans of both routings (every program and route arm) passed after every pass",
        r.verified_plans
    );
    let d = &r.detection;
    println!(
        "  detection: token {} changed, logits first differ at {} ({})",
        d.changed_at,
        d.first_difference
            .map_or("no position".to_string(), |p| p.to_string()),
        if d.ok() { "ok" } else { "HARNESS BROKEN" }
    );
    if let Some(g) = &r.golden {
        println!(
            "  golden: e {:.4e}  e_hf {:.4e}  ratio {:.3} (<= 1.5)  top1 {:.1}%  {}",
            g.e,
            g.e_hf,
            g.ratio,
            g.top1 * 100.0,
            if g.passes() { "ok" } else { "TOO FAR" }
        );
    }
}

pub fn verdict_line(reports: &[CaseReport], pass: bool, seconds: f64) -> String {
    let modes: usize = reports.iter().map(|r| r.modes.len()).sum();
    let verified: usize = reports.iter().map(|r| r.verified_plans).sum();
    let goldens: Vec<String> = reports
        .iter()
        .filter_map(|r| r.golden.map(|g| format!("{} ratio {:.3}", r.name, g.ratio)))
        .collect();
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.passes())
        .map(|r| r.name.as_str())
        .collect();
    format!(
        "{} {} models, {modes} mode runs byte-identical, {verified} plans verified{}{}, \
         {seconds:.1} s",
        if pass { "PASS" } else { "FAIL" },
        reports.len(),
        if goldens.is_empty() {
            String::new()
        } else {
            format!(", goldens: {}", goldens.join("; "))
        },
        if failed.is_empty() {
            String::new()
        } else {
            format!(", failed: {}", failed.join(", "))
        }
    )
}

fn diff_json(d: &Diff) -> serde_json::Value {
    json!({ "first_diff_position": d.first_position, "max_diff": if d.max_abs.is_finite() { json!(d.max_abs) } else { json!("inf") } })
}

fn case_json(r: &CaseReport) -> serde_json::Value {
    json!({
        "model": r.name,
        "family": r.family,
        "tokens": r.tokens,
        "vocab": r.vocab,
        "verdict": if r.passes() { "pass" } else { "fail" },
        "variants": r.variants.iter().map(|v| json!({
            "fusions": v.fusions,
            "plan_digest": v.plan_digest,
            "plans_digest": v.plans_digest,
            "launches_per_step": v.launches_per_step,
            "pool_bytes": v.pool_bytes,
            "live_lower_bound": v.live_lower_bound,
        })).collect::<Vec<_>>(),
        "modes": r.modes.iter().map(|m| json!({
            "mode": m.mode.as_str(),
            "rows": m.rows,
            "live": m.live,
            "reference_vs_all": diff_json(&m.ref_vs_fused),
            "vs_decode_alone": diff_json(&m.vs_decode),
        })).collect::<Vec<_>>(),
        "detection": { "changed_at": r.detection.changed_at, "first_difference": r.detection.first_difference, "ok": r.detection.ok() },
        "golden": r.golden.map(|g| json!({ "e": g.e, "e_hf": g.e_hf, "ratio": g.ratio, "top1": g.top1 })),
    })
}

/// Writes beside the target, then renames: a failed write never leaves half a report.
/// `annotate` adds backend-specific figures (the GPU's cross-check) before the write.
pub fn write_json(
    path: &Path,
    reports: &[CaseReport],
    pass: bool,
    rules_digest: &str,
    annotate: impl FnOnce(&mut serde_json::Value),
) -> Result<(), String> {
    let mut doc = json!({
        "verdict": if pass { "pass" } else { "fail" },
        "rules_digest": rules_digest,
        "models": reports.iter().map(case_json).collect::<Vec<_>>(),
    });
    if let [only] = reports {
        let case = case_json(only);
        doc["variants"] = case["variants"].clone();
        doc["golden"] = case["golden"].clone();
        doc["modes"] = case["modes"].clone();
    }
    annotate(&mut doc);
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}
