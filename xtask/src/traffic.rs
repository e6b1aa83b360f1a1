//! `plan --bytes`: each launch's compulsory bytes (`solder_circuit::traffic`) and the step's
//! bandwidth floor, each launch's FLOPs (`solder_circuit::flops`) and the step's roofline (each
//! launch at the slower of its bytes and its FLOPs), as a table or JSON; the same figures `gpu-bench` and `gpu-ncu-table`
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

/// The H200's dense bf16 tensor-core rate, TFLOPS: `--tflops`' default.
pub const H200_TFLOPS: f64 = 990.0;

/// The device's rates a roofline is drawn at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// DRAM bandwidth, TB/s.
    pub tbps: f64,
    /// Arithmetic, TFLOPS.
    pub tflops: f64,
}

impl Rates {
    pub const H200: Rates = Rates {
        tbps: H200_TBPS,
        tflops: H200_TFLOPS,
    };

    fn bytes_per_s(self) -> f64 {
        self.tbps * 1e12
    }

    fn flops_per_s(self) -> f64 {
        self.tflops * 1e12
    }
}

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
        ("flops", t.flops()),
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

/// One plan's table: a line per launch, then the totals, the floor and the roofline.
pub fn table(circuit: &Circuit, t: &PlanTraffic, rates: Rates) -> String {
    let (rate, flop_rate, tbps, tflops) = (
        rates.bytes_per_s(),
        rates.flops_per_s(),
        rates.tbps,
        rates.tflops,
    );
    let mut out = format!(
        "{} {} rows={} context={}: bytes each launch must move, floor at {tbps} TB/s, \
         roofline with {tflops} TFLOPS\n",
        circuit.name, t.mode, t.rows, t.context
    );
    out += &format!(
        "{:>4} {:<34} {:>5} {:>12} {:>10} {:>10} {:>12} {:>10} {:>8} {:>12} {:>9} {:>15} {:>9} {:>9}\n",
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
        "floor_us",
        "flops",
        "roof_us",
        "chain_us"
    );
    for (i, l) in t.launches.iter().enumerate() {
        out += &format!(
            "{:>4} {:<34} {:>5} {:>12} {:>10} {:>10} {:>12} {:>10} {:>8} {:>12} {:>9} {:>15} {:>9} {:>9.3}\n",
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
            floor_text(l.total(), l.floor_us(rate), 3),
            figure(l.flops),
            roof_text(l.total(), l.flops, l.roofline_us(rate, flop_rate), 3),
            l.chain_us()
        );
    }
    out += &summary(t, rates);
    out.push('\n');
    out
}

/// One line: the plan's totals, its floor and its roofline.
pub fn summary(t: &PlanTraffic, rates: Rates) -> String {
    let Rates { tbps, tflops } = rates;
    format!(
        "{:<10} rows={:<4} context={} launches={} weights={} act_read={} act_write={} \
         state_read={} state_write={} meta={} total={} bytes floor={} us at {tbps} TB/s \
         flops={} roofline={} us at {tflops} TFLOPS bound={} us with dependent chains",
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
        floor_text(t.total(), t.floor_us(rates.bytes_per_s()), 2),
        figure(t.flops()),
        roof_text(
            t.total(),
            t.flops(),
            t.roofline_us(rates.bytes_per_s(), rates.flops_per_s()),
            2
        ),
        roof_text(
            t.total(),
            t.flops(),
            t.bound_us(rates.bytes_per_s(), rates.flops_per_s()),
            2
        ),
    )
}

/// A roofline time, or `overflow` when its bytes or its FLOPs saturated.
fn roof_text(total: u64, flops: u64, roof_us: f64, decimals: usize) -> String {
    if total == u64::MAX || flops == u64::MAX {
        OVERFLOW.to_string()
    } else {
        format!("{roof_us:.decimals$}")
    }
}

/// The same figures as JSON (`plan --bytes --json`'s `traffic`).
pub fn json(t: &PlanTraffic, rates: Rates) -> serde_json::Value {
    let (rate, flop_rate) = (rates.bytes_per_s(), rates.flops_per_s());
    let roof = |total: u64, flops: u64, us: f64| {
        if total == u64::MAX || flops == u64::MAX {
            json!(OVERFLOW)
        } else {
            json!(us)
        }
    };
    json!({
        "context": t.context,
        "tbps": rates.tbps,
        "tflops": rates.tflops,
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
        "flops": figure_json(t.flops()),
        "roofline_us": roof(t.total(), t.flops(), t.roofline_us(rate, flop_rate)),
        "bound_us": roof(t.total(), t.flops(), t.bound_us(rate, flop_rate)),
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
            "flops": figure_json(l.flops),
            "roofline_us": roof(l.total(), l.flops, l.roofline_us(rate, flop_rate)),
            "chain_steps": l.chain,
            "chain_us": l.chain_us(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use solder_circuit::{Available, BuildOptions, ExecutionPlan, Instance, Mode, Policy, RuleSet};
    use solder_config::ServeShape;

    /// Llama-3.2-1B's circuit and the traffic of its plan at (`mode`, `rows`), context 0.
    fn llama_1b(mode: Mode, rows: usize) -> (Instance, PlanTraffic) {
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
            mode,
            rows,
            BuildOptions::default(),
        )
        .unwrap();
        let traffic = solder_circuit::plan_traffic(&instance.circuit, &plan, 0);
        (instance, traffic)
    }

    #[test]
    fn llama_1b_decode_floor_is_its_weights_over_the_rate() {
        let (instance, t) = llama_1b(Mode::Decode, 1);
        // 1.236 G parameters less the embedding table's 262.6 M (only one row gathered), the
        // tied head reading the table again: ~2.47 GB of bf16.
        let weights = t.weights_read() as f64;
        assert!((2.4e9..2.6e9).contains(&weights), "{weights}");
        let floor = t.floor_us(H200_TBPS * 1e12);
        assert!((500.0..560.0).contains(&floor), "{floor}");
        let text = table(&instance.circuit, &t, Rates::H200);
        assert!(text.lines().count() == t.launches.len() + 3, "{text}");
        let doc = json(&t, Rates::H200);
        assert_eq!(doc["launches"].as_array().unwrap().len(), t.launches.len());
        assert_eq!(doc["total_bytes"], t.total());
        assert_eq!(function_of("gemv::lm_head"), "lm_head");
        assert!(overflowed(&t).is_empty());

        // Issue 19.7: a saturated count printed as 18446744073709551615 bytes.
        let mut saturated = t.clone();
        saturated.launches[0].state_read = u64::MAX;
        assert_eq!(overflowed(&saturated), ["state_read", "total"]);
        let text = table(&instance.circuit, &saturated, Rates::H200);
        assert!(!text.contains(&u64::MAX.to_string()), "{text}");
        assert!(
            text.contains("state_read=overflow") && text.contains("floor=overflow"),
            "{text}"
        );
        let doc = json(&saturated, Rates::H200);
        assert_eq!(doc["state_read"], OVERFLOW);
        assert_eq!(doc["launches"][0]["total_bytes"], OVERFLOW);
        assert_eq!(doc["floor_us"], OVERFLOW);
    }

    /// Issue 24: FLOPs and the roofline. Decode is weight-bound (its roofline is its floor);
    /// a 512-row prefill chunk is compute-bound at 990 TFLOPS.
    #[test]
    fn llama_1b_decode_is_bandwidth_bound_and_a_512_row_chunk_is_compute_bound() {
        let (bw, flop_rate) = (Rates::H200.tbps * 1e12, Rates::H200.tflops * 1e12);
        let (_, decode) = llama_1b(Mode::Decode, 1);
        // Two FLOPs per parameter multiplied: 1.236 G less the gathered table, plus the tied
        // head (the table again), plus attention over one position.
        let flops = decode.flops() as f64;
        assert!((2.4e9..2.6e9).contains(&flops), "{flops}");
        let (floor, roof) = (decode.floor_us(bw), decode.roofline_us(bw, flop_rate));
        assert!((roof - floor).abs() < 1e-6 * floor, "{roof} {floor}");
        let (_, chunk) = llama_1b(Mode::Verify, 512);
        let flops = chunk.flops() as f64;
        assert!(flops > 500.0 * 2.4e9, "{flops}");
        let compute = flops / flop_rate * 1e6;
        let roof = chunk.roofline_us(bw, flop_rate);
        assert!(
            roof > chunk.floor_us(bw) && roof >= 0.9 * compute,
            "{roof} {compute}"
        );
        let text = summary(&chunk, Rates::H200);
        assert!(
            text.contains("roofline=") && text.contains("990 TFLOPS"),
            "{text}"
        );
    }
}
