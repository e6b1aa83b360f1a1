//! The parity table and JSON report.

use std::path::Path;

use serde_json::json;

use super::case::{ModeRow, RouteLog};
use super::diff::Diff;
use super::differs::ProgramKey;
use super::run::CaseReport;
use super::speculative::{SpecFigures, DRAFTERS, KS};

/// "mtp head (draft widths 1/4): 39 pairs, reference vs all rules identical, target logits
/// unchanged, golden e/e_hf 0.41; speculative k 1/2/4/7: 4 runs of 12 tokens identical to
/// plain greedy decoding; accepted 0/30".
pub fn mtp_text(m: &super::mtp::MtpFigures) -> String {
    let golden_text = |what: &str, g: super::golden::GoldenFigures| {
        format!(
            ", {what} ({}) e {:.4e} e_hf {:.4e} ratio {:.3} top1 {:.1}% {}",
            g.format,
            g.e,
            g.e_hf,
            g.ratio,
            100.0 * g.top1,
            if g.passes() { "ok" } else { "FAIL (> 1.5)" }
        )
    };
    let golden = m.golden.map_or(String::new(), |g| golden_text("golden", g))
        + &m.golden_head
            .map_or(String::new(), |g| golden_text("golden head alone", g));
    let verdict = if m.failures.is_empty() {
        "identical to plain greedy decoding".to_string()
    } else {
        format!("FAIL: {}", m.failures.join("; "))
    };
    format!(
        "mtp head: {} pairs, reference vs all rules {}, target logits with the head {}{golden}; \
         speculative k {}: {} runs of {} tokens {verdict}; accepted {}/{}",
        m.pairs,
        match &m.head_differs {
            None => diff_text(&m.ref_vs_fused),
            Some(d) => format!(
                "{} (differs rules: <= {:.3e})",
                diff_text(&m.ref_vs_fused),
                d.limit()
            ),
        },
        diff_text(&m.target_unchanged),
        KS.map(|k| k.to_string()).join("/"),
        m.runs,
        m.tokens / m.runs.max(1),
        m.accepted,
        m.proposed
    )
}

/// "speculative (all rules, greedy): k 1/2/4/7 x drafters agrees/never/random, 12 runs of 12
/// tokens identical to plain decoding; accepted agrees 40/41, never 0/30, random 9/35".
pub fn speculative_text(s: &SpecFigures) -> String {
    let accepted: Vec<String> = DRAFTERS
        .iter()
        .enumerate()
        .map(|(i, name)| format!("{name} {}/{}", s.accepted[i], s.proposed[i]))
        .collect();
    if let Some(why) = &s.skipped {
        return format!("speculative: skipped ({why})");
    }
    let verdict = if s.failures.is_empty() {
        "identical to plain greedy decoding".to_string()
    } else {
        format!("DIFFER: {}", s.failures.join("; "))
    };
    format!(
        "speculative (all rules, greedy): k {} x drafters {}: {} runs, {} tokens, {verdict}; accepted {}",
        KS.map(|k| k.to_string()).join("/"),
        DRAFTERS.join("/"),
        s.runs,
        s.tokens,
        accepted.join(", ")
    )
}

/// "verify:5, verify:3", a route arm in brackets ("multi_seq:2 (route:gdn_even_pitch)"); a
/// row whose own program never ran says so: "verify:4 (verify:8 never ran)".
pub fn programs_text(m: &ModeRow) -> String {
    let ran: Vec<String> = m.programs.iter().map(program_name).collect();
    let own = m
        .programs
        .iter()
        .any(|&(mode, rows, _)| (mode, rows) == (m.mode, m.rows));
    match own {
        true => ran.join(", "),
        false => format!(
            "{} ({}:{} never ran)",
            ran.join(", "),
            m.mode.as_str(),
            m.rows
        ),
    }
}

/// Per model, the distinct all-rules programs its table's rows ran, with the tokens each
/// row's sequences were fed: "tiny-qwen3: decode:1 (4 tokens), ..., verify:8 (8 tokens)".
pub fn programs_run(reports: &[CaseReport]) -> Vec<String> {
    reports
        .iter()
        .map(|r| {
            let mut seen: Vec<String> = Vec::new();
            for m in &r.modes {
                for program in &m.programs {
                    let item = format!("{} ({} tokens)", program_name(program), m.tokens);
                    if !seen.contains(&item) {
                        seen.push(item);
                    }
                }
            }
            format!("{}: {}", r.name, seen.join(", "))
        })
        .collect()
}

fn program_name(&(mode, rows, arm): &ProgramKey) -> String {
    match arm {
        Some(condition) => format!("{}:{rows} ({})", mode.as_str(), condition.capability()),
        None => format!("{}:{rows}", mode.as_str()),
    }
}

fn diff_text(d: &Diff) -> String {
    match d.first_position {
        None => "identical".to_string(),
        // `{:e}` of NaN prints `NaN`: a NaN is reported as one.
        Some(p) => format!("first diff at {p}, max {:.3e}", d.max_abs),
    }
}

/// "route:gdn_even_pitch (all): multi_seq rows 2 (40 of 40 steps), rows 4 (40 of 40 steps)",
/// one line per arm, routing and mode.
/// Of `rows` (each with a `differs` bound), the one whose `diff` comes nearest its own limit,
/// as (that diff, that limit): a NaN or infinite diff is the nearest; no rows, (NONE, 0).
fn nearest_limit(rows: &[&ModeRow], diff: impl Fn(&ModeRow) -> Diff) -> (Diff, f32) {
    let mut nearest = (Diff::NONE, 0.0f32, f32::NEG_INFINITY);
    for m in rows {
        let Some(differs) = &m.differs else { continue };
        let d = diff(m);
        let limit = differs.limit();
        let share = if d.identical() {
            0.0
        } else {
            let share = d.max_abs / limit;
            if share.is_nan() {
                f32::INFINITY
            } else {
                share
            }
        };
        if share > nearest.2 {
            nearest = (d, limit, share);
        }
    }
    (nearest.0, nearest.1)
}

pub fn routes_text(routes: &RouteLog) -> Vec<String> {
    let mut lines: Vec<(String, Vec<String>)> = Vec::new();
    for (&(fusions, arm, mode, rows), &steps) in &routes.steps {
        let head = format!("{arm} ({fusions}): {}", mode.as_str());
        let item = format!(
            "rows {rows} ({steps} of {} steps)",
            routes.of(fusions, mode, rows)
        );
        match lines.last_mut() {
            Some((h, items)) if *h == head => items.push(item),
            _ => lines.push((head, vec![item])),
        }
    }
    lines
        .into_iter()
        .map(|(head, items)| format!("{head} {}", items.join(", ")))
        .collect()
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
    println!("  mode        rows  live  reference vs all rules       vs each sequence alone       all rules: graph vs eager    tokens  programs run (all rules)");
    for m in &r.modes {
        println!(
            "  {:<10} {:>5} {:>5}  {:<28} {:<28} {:<28} {:>6}  {}",
            m.mode.as_str(),
            m.rows,
            m.live,
            diff_text(&m.ref_vs_fused),
            diff_text(&m.vs_decode),
            diff_text(&m.graph_vs_eager),
            m.tokens,
            programs_text(m)
        );
    }
    if !r.levers.is_empty() {
        println!("  levers (all rules): {}", r.levers.join(", "));
    }
    if let Some(d) = &r.differs {
        // Each row is held to its own programs' rules: the line names the row nearest its
        // limit, with that limit.
        let differing: Vec<&ModeRow> = r.modes.iter().filter(|m| m.differs.is_some()).collect();
        let chunked: Vec<&ModeRow> = differing
            .iter()
            .copied()
            .filter(|m| m.differs.as_ref().is_some_and(|d| !d.by_chunk.is_empty()))
            .collect();
        let (worst, limit) = nearest_limit(&differing, |m| m.ref_vs_fused);
        println!(
            "  differs rules applied: {}; rows running them: reference vs all rules max {:.3e} <= tolerance {} x max |logit| {:.3e} = {:.3e}: {}; {}",
            d.rules.join(", "),
            worst.max_abs,
            d.tolerance,
            d.scale,
            limit,
            if differing.iter().all(|m| m.ref_vs_fused_ok()) { "ok" } else { "TOO FAR" },
            if chunked.is_empty() {
                "every other row byte for byte"
            } else {
                "every other row byte for byte, and every other comparison but the next line's"
            }
        );
        if !chunked.is_empty() {
            let (worst, limit) = nearest_limit(&chunked, |m| m.vs_decode);
            println!(
                "  by chunk ({}): rows running them vs each sequence decoded alone max {:.3e} <= {:.3e}: {}",
                d.by_chunk.join(", "),
                worst.max_abs,
                limit,
                if chunked.iter().all(|m| m.vs_decode_ok()) { "ok" } else { "TOO FAR" }
            );
        }
    }
    for m in &r.modes {
        if let Some(claim) = &m.broken_claim {
            println!("  BROKEN CLAIM {claim}");
        }
    }
    println!("  graphs (all rules): {}", r.graphs);
    println!("  {}", speculative_text(&r.speculative));
    if let Some(m) = &r.mtp {
        println!("  {}", mtp_text(m));
    }
    println!(
        "  verifier: {} plans of both routings (every program and route arm) passed after every pass",
        r.verified_plans
    );
    let arms = routes_text(&r.routes);
    if arms.is_empty() {
        println!("  route arms: none ran");
    }
    for line in arms {
        println!("  route arm {line}");
    }
    for line in &r.non_finite {
        println!("  NOT FINITE {line}");
    }
    let d = &r.detection;
    println!(
        "  detection: token {} changed, logits first differ at {} ({})",
        d.changed_at,
        d.first_difference
            .map_or("no position".to_string(), |p| p.to_string()),
        detection_verdict(r)
    );
    if let Some(g) = &r.golden {
        println!(
            "  golden ({}): e {:.4e}  e_hf {:.4e}  ratio {:.3} (<= 1.5)  top1 {:.1}%  {}",
            g.format,
            g.e,
            g.e_hf,
            g.ratio,
            g.top1 * 100.0,
            if g.passes() { "ok" } else { "TOO FAR" }
        );
    }
}

/// A detection run over non-finite logits says nothing of the harness: those are named in
/// their own `NOT FINITE` lines, so it is not called broken.
pub(super) fn detection_verdict(r: &CaseReport) -> &'static str {
    if r.detection.ok() {
        "ok"
    } else if !r.non_finite.is_empty() {
        "not judged: logits not finite"
    } else {
        "HARNESS BROKEN"
    }
}

pub fn verdict_line(
    reports: &[CaseReport],
    skipped: &[super::skips::Skip],
    pass: bool,
    seconds: f64,
) -> String {
    let modes: usize = reports.iter().map(|r| r.modes.len()).sum();
    let verified: usize = reports.iter().map(|r| r.verified_plans).sum();
    let goldens: Vec<String> = reports
        .iter()
        .filter_map(|r| {
            r.golden
                .map(|g| format!("{} ({}) ratio {:.3}", r.name, g.format, g.ratio))
        })
        .collect();
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.passes())
        .map(|r| r.name.as_str())
        .collect();
    // A failed run claims nothing about its rows: the lines above say which failed.
    let compared = if !pass {
        "compared"
    } else if reports.iter().any(|r| r.differs.is_some()) {
        "byte-identical or within their differs tolerance"
    } else {
        "byte-identical"
    };
    format!(
        "{} {} models, {modes} mode runs {compared} (graph replay = eager), {verified} plans verified{}{}{}, \
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
        },
        if skipped.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = skipped
                .iter()
                .map(|s| format!("{}{}", s.name, if s.allowed { " (allowed)" } else { "" }))
                .collect();
            format!(", {} goldens skipped: {}", skipped.len(), names.join(", "))
        }
    )
}

/// JSON has no NaN or infinity: those go in as the strings `"NaN"` and `"inf"`.
fn float_json(x: f32) -> serde_json::Value {
    if x.is_finite() {
        json!(x)
    } else if x.is_nan() {
        json!("NaN")
    } else {
        json!("inf")
    }
}

fn diff_json(d: &Diff) -> serde_json::Value {
    json!({ "first_diff_position": d.first_position, "max_diff": float_json(d.max_abs) })
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
            "tokens": m.tokens,
            "programs": m.programs.iter().map(program_name).collect::<Vec<_>>(),
            "own_program_ran": m.programs.iter().any(|&(mode, rows, _)| (mode, rows) == (m.mode, m.rows)),
            "reference_vs_all": diff_json(&m.ref_vs_fused),
            "vs_decode_alone": diff_json(&m.vs_decode),
            "graph_vs_eager": diff_json(&m.graph_vs_eager),
            "differs_rules": m.differs.as_ref().map(|d| d.rules.clone()),
            "limit": m.differs.as_ref().map(|d| float_json(d.limit())),
            "ok": m.ref_vs_fused_ok() && m.broken_claim.is_none(),
            "broken_claim": m.broken_claim,
        })).collect::<Vec<_>>(),
        "detection": { "changed_at": r.detection.changed_at, "first_difference": r.detection.first_difference, "ok": r.detection.ok(), "verdict": detection_verdict(r) },
        "golden": r.golden.map(|g| json!({
            "format": g.format,
            "e": float_json(g.e),
            "e_hf": float_json(g.e_hf),
            "ratio": float_json(g.ratio),
            "top1": g.top1,
            "ok": g.passes(),
        })),
        "non_finite": r.non_finite,
        "levers": r.levers,
        "differs": r.differs.as_ref().map(|d| json!({
            "rules": d.rules,
            "by_chunk": d.by_chunk,
            "tolerance": d.tolerance,
            "scale": float_json(d.scale),
            "limit": float_json(d.limit()),
        })),
        "graphs": r.graphs,
        "speculative": {
            "ks": KS,
            "drafters": DRAFTERS,
            "runs": r.speculative.runs,
            "tokens": r.speculative.tokens,
            "proposed": r.speculative.proposed,
            "accepted": r.speculative.accepted,
            "failures": r.speculative.failures,
            "skipped": r.speculative.skipped,
            "ok": r.speculative.passes(),
        },
        "mtp": r.mtp.as_ref().map(|m| json!({
            "pairs": m.pairs,
            "reference_vs_all": diff_json(&m.ref_vs_fused),
            "target_unchanged": diff_json(&m.target_unchanged),
            "golden": m.golden.map(|g| json!({
                "format": g.format,
                "e": float_json(g.e),
                "e_hf": float_json(g.e_hf),
                "ratio": float_json(g.ratio),
                "top1": g.top1,
                "ok": g.passes(),
            })),
            "golden_head_alone": m.golden_head.map(|g| json!({
                "format": g.format,
                "e": float_json(g.e),
                "e_hf": float_json(g.e_hf),
                "ratio": float_json(g.ratio),
                "top1": g.top1,
                "ok": g.passes(),
            })),
            "runs": m.runs,
            "tokens": m.tokens,
            "proposed": m.proposed,
            "accepted": m.accepted,
            "failures": m.failures,
            "ok": m.passes(),
        })),
        "route_arms": r.routes.steps.iter().map(|(&(fusions, arm, mode, rows), &steps)| json!({
            "arm": arm,
            "fusions": fusions,
            "mode": mode.as_str(),
            "rows": rows,
            "steps": steps,
            "of_steps": r.routes.of(fusions, mode, rows),
        })).collect::<Vec<_>>(),
    })
}

/// Writes the report at `path` (`files::write_output`: never over one of `inputs`, through an
/// exclusive temporary, then renamed). `annotate` adds backend-specific figures (the GPU's
/// cross-check) before the write.
pub fn write_json(
    path: &Path,
    inputs: &crate::files::Inputs,
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
    crate::files::write_output(path, text.as_bytes(), inputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::run::tests::chunk_row;

    /// The report's differs lines name the row nearest its own limit, with that row's limit:
    /// not the largest difference against the case's strictest tolerance.
    #[test]
    fn the_row_nearest_its_own_limit_is_the_one_reported() {
        let strict = chunk_row(0.3, Some(true));
        let mut loose = chunk_row(1.5, Some(true));
        loose.differs.as_mut().unwrap().tolerance = 1.0;
        // 0.3 of a 2.0 limit against 1.5 of 4.0: the loose row is nearer (0.375 > 0.15).
        let (d, limit) = nearest_limit(&[&strict, &loose], |m| m.vs_decode);
        assert_eq!((d.max_abs, limit), (1.5, 4.0));
        let mut near = chunk_row(1.9, Some(true));
        near.differs.as_mut().unwrap().tolerance = 0.5;
        let (d, limit) = nearest_limit(&[&strict, &loose, &near], |m| m.vs_decode);
        assert_eq!((d.max_abs, limit), (1.9, 2.0));
        // NaN is the nearest of all; identical rows are never nearer than a differing one.
        let nan = chunk_row(f32::NAN, Some(true));
        let (d, _) = nearest_limit(&[&loose, &nan], |m| m.vs_decode);
        assert!(d.max_abs.is_nan());
        let same = chunk_row(0.0, Some(true));
        assert_eq!(
            nearest_limit(&[&same, &strict], |m| m.vs_decode).0.max_abs,
            0.3
        );
        assert_eq!(nearest_limit(&[], |m| m.vs_decode), (Diff::NONE, 0.0));
    }
}
