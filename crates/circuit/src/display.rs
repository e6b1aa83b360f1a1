//! Text and DOT renderings of an [`ExecutionPlan`] (the golden plan files are the text form).

use std::fmt::Write as _;

use crate::ir::{Binding, Circuit, TensorId};
use crate::plan::{ExecutionPlan, StepKind};

/// `ExecutionPlan` with its circuit, for names in the printout.
pub struct PlanDisplay<'a> {
    pub plan: &'a ExecutionPlan,
    pub circuit: &'a Circuit,
    rules_digest: bool,
}

impl ExecutionPlan {
    pub fn display<'a>(&'a self, circuit: &'a Circuit) -> PlanDisplay<'a> {
        PlanDisplay {
            plan: self,
            circuit,
            rules_digest: true,
        }
    }

    /// Graphviz DOT: groups as boxes coloured by stream, kept edges labelled with their
    /// tensor and bytes.
    pub fn to_dot(&self, circuit: &Circuit) -> String {
        const COLORS: [&str; 4] = ["lightblue", "lightsalmon", "palegreen", "khaki"];
        let mut out = format!(
            "digraph \"{} {} rows={}\" {{\n  node [shape=box, style=filled];\n",
            self.circuit, self.mode, self.rows
        );
        for (pos, g) in self.order.iter().enumerate() {
            let group = self.group(*g);
            let stream = self.stream_of[g.0 as usize] as usize;
            let nodes: Vec<&str> = group
                .nodes
                .iter()
                .map(|n| circuit.op(*n).name.as_str())
                .collect();
            let _ = writeln!(
                out,
                "  g{} [label=\"{pos}: {}\\n{}\", fillcolor={}];",
                g.0,
                group.kernels.join(" + "),
                nodes.join(" "),
                COLORS[stream % COLORS.len()]
            );
        }
        for (gi, group) in self.fusion.groups.iter().enumerate() {
            for &t in &group.inputs {
                if let Some(p) = circuit.producer(t) {
                    let from = self.fusion.group_of[p.0 as usize];
                    let tensor = circuit.tensor(t);
                    let _ = writeln!(
                        out,
                        "  g{} -> g{gi} [label=\"{} {}B\"];",
                        from.0,
                        tensor.name,
                        tensor.bytes(self.rows)
                    );
                }
            }
        }
        out.push_str("}\n");
        out
    }
}

impl PlanDisplay<'_> {
    /// The printout without its `rules_digest` line: the golden files' form, so that a rules
    /// edit that changes no plan rewrites none of them (the plan digest covers what the rules
    /// decided).
    pub fn without_rules_digest(self) -> Self {
        PlanDisplay {
            rules_digest: false,
            ..self
        }
    }

    fn tensor(&self, t: TensorId) -> String {
        let tensor = self.circuit.tensor(t);
        match tensor.binding {
            Binding::Arena => match self.plan.buffer_of(t) {
                Some(b) => format!("{}@{}", tensor.name, b.offset),
                None => tensor.name.clone(),
            },
            _ => format!("{}[{}]", tensor.name, tensor.binding.as_str()),
        }
    }
}

impl std::fmt::Display for PlanDisplay<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.plan;
        writeln!(f, "plan {} {} rows={}", p.circuit, p.mode, p.rows)?;
        writeln!(f, "  plan_digest  {}", p.digest)?;
        if self.rules_digest {
            writeln!(f, "  rules_digest {}", p.rules_digest)?;
        }
        writeln!(
            f,
            "  kernels {} -> {} fused, {} per layer, {} streams, {} events, {} steps",
            p.kernel_count_original,
            p.kernel_count_fused,
            p.launches_per_layer,
            p.num_streams,
            p.event_count,
            p.total_steps()
        )?;
        let ratio = if p.live_lower_bound == 0 {
            1.0
        } else {
            p.pool_bytes as f64 / p.live_lower_bound as f64
        };
        writeln!(
            f,
            "  pool_bytes {} live_lower_bound {} ratio {:.4} ({} buffers, {})",
            p.pool_bytes,
            p.live_lower_bound,
            ratio,
            p.buffers.len(),
            p.placement
        )?;
        // Only for a quantized plan: a bf16 plan's printout is what it was before formats.
        if p.has_quantized_weights() {
            let formats: Vec<String> = p
                .weight_bytes
                .iter()
                .map(|w| format!("{} {} B ({} slots)", w.format, w.bytes, w.slots))
                .collect();
            writeln!(f, "  weights {}", formats.join(", "))?;
        }
        writeln!(f, "steps:")?;
        for (i, step) in p.steps.iter().enumerate() {
            match step.kind {
                StepKind::Launch(g) => {
                    let group = p.group(g);
                    let nodes: Vec<&str> = group
                        .nodes
                        .iter()
                        .map(|n| self.circuit.op(*n).name.as_str())
                        .collect();
                    let reads: Vec<String> = group.inputs.iter().map(|t| self.tensor(*t)).collect();
                    let writes: Vec<String> =
                        group.outputs.iter().map(|t| self.tensor(*t)).collect();
                    writeln!(
                        f,
                        "  {i:>4} s{} {} [{}] reads {} writes {}{}{}",
                        step.stream,
                        group.kernels.join("+"),
                        nodes.join(" "),
                        reads.join(","),
                        writes.join(","),
                        self.circuit.windows_note(&group.nodes),
                        self.circuit.formats_note(&group.nodes)
                    )?;
                }
                StepKind::Record(e) => writeln!(f, "  {i:>4} s{} record e{}", step.stream, e.0)?,
                StepKind::Wait(e) => writeln!(f, "  {i:>4} s{} wait e{}", step.stream, e.0)?,
            }
        }
        writeln!(f, "buffers:")?;
        for b in &p.buffers {
            writeln!(
                f,
                "  {:<28} {} {:<12} {:>10} B @ {:<10} live {}..{}",
                b.name,
                b.dtype.as_str(),
                b.shape.to_string(),
                b.bytes,
                b.offset,
                b.first,
                b.last
            )?;
        }
        Ok(())
    }
}
