//! `plan --bytes`: each launch's compulsory bytes (`solder_circuit::traffic`) and the step's
//! bandwidth floor, as a table or JSON; the same figures `gpu-bench` and `gpu-ncu-table`
//! relate their measurements to.
//!
//! Invariant: a count that overflowed is never printed as a figure. `solder_circuit::traffic`
//! saturates instead of wrapping, so `u64::MAX` marks a count (and every sum over it) that
//! overflowed: it prints as `overflow` (in JSON the string `"overflow"`, like parity's `"NaN"`),
//! and `plan --bytes` then fails naming the plan and the count (`overflowed`).

use serde_json::json;
use solder_circuit::ir::Circuit;
use solder_circuit::traffic::{LaunchTraffic, PlanTraffic};

/// The H200's HBM3e bandwidth, TB/s: `--tbps`' default.
pub const H200_TBPS: f64 = 4.8;

/// The kernel a launch runs, without its module (what profilers name it).
pub fn function_of(kernel: &str) -> &str {
    kernel.rsplit("::").next().unwrap_or(kernel)
}

/// What a saturated count prints as.
pub const OVERFLOW: &str = "overflow";

/// `x`, or `overflow` when it saturated.
fn figure(x: u64) -> String {
    if x == u64::MAX {
        OVERFLOW.to_string()
    } else {
        x.to_string()
    }
}

/// The floor of `total` bytes, or `overflow`.
fn floor_text(total: u64, floor_us: f64, decimals: usize) -> String {
    if total == u64::MAX {
        OVERFLOW.to_string()
    } else {
        format!("{floor_us:.decimals$}")
    }
}

fn figure_json(x: u64) -> serde_json::Value {
    if x == u64::MAX {
        json!(OVERFLOW)
    } else {
        json!(x)
    }
}

/// The plan's counts that overflowed, by name (empty: every figure is real).
pub fn overflowed(t: &PlanTraffic) -> Vec<&'static str> {
    [
        ("weights_read", t.weights_read()),
        ("activations_read", t.activations_read()),
        ("activations_written", t.activations_written()),
        ("state_read", t.state_read()),
        ("state_written", t.state_written()),
        ("meta_read", t.meta_read()),
        ("total", t.total()),
    ]
    .into_iter()
    .filter(|&(_, x)| x == u64::MAX)
    .map(|(name, _)| name)
    .collect()
}

fn kernels(l: &LaunchTraffic) -> String {
    l.kernels.join("+")
}

fn layer(l: &LaunchTraffic) -> String {
    l.layer.map_or("-".into(), |l| l.to_string())
}

/// One plan's table: a line per launch, then the totals and the floor at `tbps`.
pub fn table(circuit: &Circuit, t: &PlanTraffic, tbps: f64) -> String {
    let rate = tbps * 1e12;
    let mut out = format!(
        "{} {} rows={} context={}: bytes each launch must move, floor at {tbps} TB/s\n",
        circuit.name, t.mode, t.rows, t.context
    );
    out += &format!(
        "{:>4} {:<34} {:>5} {:>12} {:>10} {:>10} {:>12} {:>10} {:>8} {:>12} {:>9}\n",
        "#",
        "kernel",
        "layer",
        "weights",
        "act_read",
        "act_write",
        "state_read",
        "state_wr",
        "meta",
        "total",
        "floor_us"
    );
    for (i, l) in t.launches.iter().enumerate() {
        out += &format!(
            "{:>4} {:<34} {:>5} {:>12} {:>10} {:>10} {:>12} {:>10} {:>8} {:>12} {:>9}\n",
            i,
            kernels(l),
            layer(l),
            figure(l.weights_read),
            figure(l.activations_read),
            figure(l.activations_written),
            figure(l.state_read),
            figure(l.state_written),
            figure(l.meta_read),
            figure(l.total()),
            floor_text(l.total(), l.floor_us(rate), 3)
        );
    }
    out += &summary(t, tbps);
    out.push('\n');
    out
}

/// One line: the plan's totals and its floor.
pub fn summary(t: &PlanTraffic, tbps: f64) -> String {
    format!(
        "{:<10} rows={:<4} context={} launches={} weights={} act_read={} act_write={} \
         state_read={} state_write={} meta={} total={} bytes floor={} us at {tbps} TB/s",
        t.mode.as_str(),
        t.rows,
        t.context,
        t.launches.len(),
        figure(t.weights_read()),
        figure(t.activations_read()),
        figure(t.activations_written()),
        figure(t.state_read()),
        figure(t.state_written()),
        figure(t.meta_read()),
        figure(t.total()),
        floor_text(t.total(), t.floor_us(tbps * 1e12), 2)
    )
}

/// The same figures as JSON (`plan --bytes --json`'s `traffic`).
pub fn json(t: &PlanTraffic, tbps: f64) -> serde_json::Value {
    let rate = tbps * 1e12;
    json!({
        "context": t.context,
        "tbps": tbps,
        "weights_read": figure_json(t.weights_read()),
        "weights_read_by_format": t
            .weights_read_by_format()
            .into_iter()
            .map(|(format, bytes)| (format.to_string(), figure_json(bytes)))
            .collect::<serde_json::Map<String, serde_json::Value>>(),
        "activations_read": figure_json(t.activations_read()),
        "activations_written": figure_json(t.activations_written()),
        "state_read": figure_json(t.state_read()),
        "state_written": figure_json(t.state_written()),
        "meta_read": figure_json(t.meta_read()),
        "total_bytes": figure_json(t.total()),
        "floor_us": if t.total() == u64::MAX { json!(OVERFLOW) } else { json!(t.floor_us(rate)) },
        "overflowed": overflowed(t),
        "launches": t.launches.iter().enumerate().map(|(i, l)| json!({
            "index": i,
            "rule": l.rule,
            "kernels": l.kernels,
            "layer": l.layer,
            "weights_read": figure_json(l.weights_read),
            "activations_read": figure_json(l.activations_read),
            "activations_written": figure_json(l.activations_written),
            "state_read": figure_json(l.state_read),
            "state_written": figure_json(l.state_written),
            "meta_read": figure_json(l.meta_read),
            "total_bytes": figure_json(l.total()),
            "floor_us": if l.total() == u64::MAX { json!(OVERFLOW) } else { json!(l.floor_us(rate)) },
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use solder_circuit::{Available, BuildOptions, ExecutionPlan, Instance, Mode, Policy, RuleSet};
    use solder_config::ServeShape;

    #[test]
    fn llama_1b_decode_floor_is_its_weights_over_the_rate() {
        let root = crate::paths::workspace_root();
        let config =
            crate::files::model_config(&root.join("tests/fixtures/configs/llama-3.2-1b.json"))
                .unwrap();
        let rules = RuleSet::from_file(&root.join("fusions/FUSIONS.toml")).unwrap();
        let instance = Instance::from_config(&config, ServeShape::default()).unwrap();
        let plan = ExecutionPlan::build_with(
            &instance,
            &rules,
            &Available::all_kernels(&rules),
            &Policy::default(),
            Mode::Decode,
            1,
            BuildOptions::default(),
        )
        .unwrap();
        let t = solder_circuit::plan_traffic(&instance.circuit, &plan, 0);
        // 1.236 G parameters less the embedding table's 262.6 M (only one row gathered), the
        // tied head reading the table again: ~2.47 GB of bf16.
        let weights = t.weights_read() as f64;
        assert!((2.4e9..2.6e9).contains(&weights), "{weights}");
        let floor = t.floor_us(H200_TBPS * 1e12);
        assert!((500.0..560.0).contains(&floor), "{floor}");
        let text = table(&instance.circuit, &t, H200_TBPS);
        assert!(text.lines().count() == t.launches.len() + 3, "{text}");
        let doc = json(&t, H200_TBPS);
        assert_eq!(doc["launches"].as_array().unwrap().len(), t.launches.len());
        assert_eq!(doc["total_bytes"], t.total());
        assert_eq!(function_of("gemv::lm_head"), "lm_head");
        assert!(overflowed(&t).is_empty());

        // Issue 19.7: a saturated count printed as 18446744073709551615 bytes.
        let mut saturated = t.clone();
        saturated.launches[0].state_read = u64::MAX;
        assert_eq!(overflowed(&saturated), ["state_read", "total"]);
        let text = table(&instance.circuit, &saturated, H200_TBPS);
        assert!(!text.contains(&u64::MAX.to_string()), "{text}");
        assert!(
            text.contains("state_read=overflow") && text.contains("floor=overflow"),
            "{text}"
        );
        let doc = json(&saturated, H200_TBPS);
        assert_eq!(doc["state_read"], OVERFLOW);
        assert_eq!(doc["launches"][0]["total_bytes"], OVERFLOW);
        assert_eq!(doc["floor_us"], OVERFLOW);
    }
}
