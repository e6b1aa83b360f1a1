//! `plan --bytes`: each launch's compulsory bytes (`solder_circuit::traffic`) and the step's
//! bandwidth floor, as a table or JSON; the same figures `gpu-bench` and `gpu-ncu-table`
//! relate their measurements to.

use serde_json::json;
use solder_circuit::ir::Circuit;
use solder_circuit::traffic::{LaunchTraffic, PlanTraffic};

/// The H200's HBM3e bandwidth, TB/s: `--tbps`' default.
pub const H200_TBPS: f64 = 4.8;

/// The kernel a launch runs, without its module (what profilers name it).
pub fn function_of(kernel: &str) -> &str {
    kernel.rsplit("::").next().unwrap_or(kernel)
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
            "{:>4} {:<34} {:>5} {:>12} {:>10} {:>10} {:>12} {:>10} {:>8} {:>12} {:>9.3}\n",
            i,
            kernels(l),
            layer(l),
            l.weights_read,
            l.activations_read,
            l.activations_written,
            l.state_read,
            l.state_written,
            l.meta_read,
            l.total(),
            l.floor_us(rate)
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
         state_read={} state_write={} meta={} total={} bytes floor={:.2} us at {tbps} TB/s",
        t.mode.as_str(),
        t.rows,
        t.context,
        t.launches.len(),
        t.weights_read(),
        t.activations_read(),
        t.activations_written(),
        t.state_read(),
        t.state_written(),
        t.meta_read(),
        t.total(),
        t.floor_us(tbps * 1e12)
    )
}

/// The same figures as JSON (`plan --bytes --json`'s `traffic`).
pub fn json(t: &PlanTraffic, tbps: f64) -> serde_json::Value {
    let rate = tbps * 1e12;
    json!({
        "context": t.context,
        "tbps": tbps,
        "weights_read": t.weights_read(),
        "activations_read": t.activations_read(),
        "activations_written": t.activations_written(),
        "state_read": t.state_read(),
        "state_written": t.state_written(),
        "meta_read": t.meta_read(),
        "total_bytes": t.total(),
        "floor_us": t.floor_us(rate),
        "launches": t.launches.iter().enumerate().map(|(i, l)| json!({
            "index": i,
            "rule": l.rule,
            "kernels": l.kernels,
            "layer": l.layer,
            "weights_read": l.weights_read,
            "activations_read": l.activations_read,
            "activations_written": l.activations_written,
            "state_read": l.state_read,
            "state_written": l.state_written,
            "meta_read": l.meta_read,
            "total_bytes": l.total(),
            "floor_us": l.floor_us(rate),
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
        let root = crate::workspace_root();
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
    }
}
