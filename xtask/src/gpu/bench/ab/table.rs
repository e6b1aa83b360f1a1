//! The A/B figures: one row per (variant, width), printed as one table (each width's
//! baseline first, every time also as a ratio to it and as a share of the variant's floor),
//! the summary lines `run.sh` reads, and the JSON.

use super::Variant;

/// How a variant's logits compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bytes {
    /// Eager, replayed and session logits equal those of the variant it keeps the bytes of
    /// (`Variant::same_as`: the baseline, or `tensor_cores` for `tensor_cores+mma_narrow`),
    /// byte for byte.
    Same,
    /// A variant with a `differs` lever and no `same_as`: its eager, replayed and session
    /// logits agree with each other (the baseline's are not expected).
    OwnOnly,
    /// A difference where none is allowed: what differed, and where.
    Differ(String),
}

impl Bytes {
    fn word(&self) -> &'static str {
        match self {
            Bytes::Same => "same",
            Bytes::OwnOnly => "own",
            Bytes::Differ(_) => "DIFFER",
        }
    }
}

/// One variant at one width.
#[derive(Debug, Clone)]
pub struct AbRow {
    /// Index into `AbFigures::variants` (0 is the baseline).
    pub variant: usize,
    pub rows: usize,
    pub launches: usize,
    /// The variant's plan's bytes over the copy bandwidth (`solder_circuit::traffic`).
    pub floor_us: f64,
    pub eager_us: f64,
    pub eager_runs: usize,
    pub graph_us: f64,
    pub graph_runs: usize,
    pub bytes: Bytes,
}

/// The whole A/B run.
#[derive(Debug, Clone)]
pub struct AbFigures {
    pub model: String,
    pub device: String,
    pub copy_bytes_per_s: f64,
    pub context: usize,
    pub variants: Vec<Variant>,
    pub rows: Vec<AbRow>,
    /// Variants that failed (index, what failed), left out from then on.
    pub failures: Vec<(usize, String)>,
}

impl AbFigures {
    /// The baseline's row at `rows`.
    fn baseline(&self, rows: usize) -> Option<&AbRow> {
        self.rows.iter().find(|r| r.variant == 0 && r.rows == rows)
    }

    fn ratios(&self, row: &AbRow) -> (f64, f64) {
        self.baseline(row.rows).map_or((f64::NAN, f64::NAN), |b| {
            (row.graph_us / b.graph_us, row.eager_us / b.eager_us)
        })
    }

    /// The table, then a summary line per width: `ab rows N graph: ...`.
    pub fn table(&self) -> String {
        let mut out = format!(
            "gpu-bench A/B {}: {} variants, context {}, copy bandwidth {:.0} GB/s (read + write); x base = time / the baseline's at the same rows, fl/ = the variant's floor / time\n",
            self.model,
            self.variants.len(),
            self.context,
            self.copy_bytes_per_s / 1e9
        );
        out += &format!(
            "{:<28} {:>5} {:>8} {:>9} {:>10} {:>7} {:>8} {:>10} {:>7} {:>8}  {}\n",
            "variant",
            "rows",
            "launches",
            "floor_us",
            "graph_us",
            "x base",
            "fl/graph",
            "eager_us",
            "x base",
            "fl/eager",
            "bytes"
        );
        for row in &self.rows {
            let (graph_ratio, eager_ratio) = self.ratios(row);
            let share = |us: f64| format!("{:.0}%", 100.0 * row.floor_us / us);
            out += &format!(
                "{:<28} {:>5} {:>8} {:>9.1} {:>10.1} {:>7.3} {:>8} {:>10.1} {:>7.3} {:>8}  {}\n",
                self.variants[row.variant].name,
                row.rows,
                row.launches,
                row.floor_us,
                row.graph_us,
                graph_ratio,
                share(row.graph_us),
                row.eager_us,
                eager_ratio,
                share(row.eager_us),
                row.bytes.word()
            );
        }
        for line in self.differences() {
            out += &format!("DIFFER {line}\n");
        }
        for (v, why) in &self.failures {
            out += &format!("FAILED {}: {why}\n", self.variants[*v].name);
        }
        let mut widths: Vec<usize> = self.rows.iter().map(|r| r.rows).collect();
        widths.dedup();
        for rows in widths {
            out += &self.summary(rows);
            out.push('\n');
        }
        out
    }

    /// `ab rows N graph: bytes same; best pdl; baseline 812.3 us; pdl 0.930x; ...` (the
    /// verdicts first: run.sh's summary row keeps the first 110 characters).
    fn summary(&self, rows: usize) -> String {
        let at: Vec<&AbRow> = self.rows.iter().filter(|r| r.rows == rows).collect();
        let mut parts = Vec::new();
        for row in &at {
            let name = &self.variants[row.variant].name;
            if row.variant == 0 {
                parts.push(format!("{name} {:.1} us", row.graph_us));
            } else {
                parts.push(format!("{name} {:.3}x", self.ratios(row).0));
            }
        }
        let best = at
            .iter()
            .min_by(|a, b| a.graph_us.total_cmp(&b.graph_us))
            .map_or("none", |r| self.variants[r.variant].name.as_str());
        let bytes = if at.iter().any(|r| matches!(r.bytes, Bytes::Differ(_))) {
            "DIFFER"
        } else {
            "same"
        };
        let failed: Vec<&str> = self
            .failures
            .iter()
            .map(|(v, _)| self.variants[*v].name.as_str())
            .collect();
        if !failed.is_empty() {
            parts.push(format!("failed {}", failed.join(", ")));
        }
        format!(
            "ab rows {rows} graph: bytes {bytes}; best {best}; {}",
            parts.join("; ")
        )
    }

    /// Every forbidden difference, naming the variant and width.
    pub fn differences(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter_map(|r| match &r.bytes {
                Bytes::Differ(what) => Some(format!(
                    "{} at {} rows: {what}",
                    self.variants[r.variant].name, r.rows
                )),
                _ => None,
            })
            .collect()
    }

    /// What fails the run: every forbidden difference and every failed variant.
    pub fn problems(&self) -> Vec<String> {
        let mut out = self.differences();
        out.extend(
            self.failures
                .iter()
                .map(|(v, why)| format!("{} failed: {why}", self.variants[*v].name)),
        );
        out
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "device": self.device,
            "copy_bytes_per_s": self.copy_bytes_per_s,
            "context": self.context,
            "failures": self.failures.iter().map(|(v, why)| serde_json::json!({
                "variant": self.variants[*v].name,
                "error": why,
            })).collect::<Vec<_>>(),
            "variants": self.variants.iter().map(|v| serde_json::json!({
                "name": v.name,
                "levers": v.levers,
                "bit_identical": v.bit_identical,
            })).collect::<Vec<_>>(),
            "rows": self.rows.iter().map(|r| {
                let (graph_ratio, eager_ratio) = self.ratios(r);
                serde_json::json!({
                    "variant": self.variants[r.variant].name,
                    "rows": r.rows,
                    "launches_per_step": r.launches,
                    "floor_us": r.floor_us,
                    "graph_us_median": r.graph_us,
                    "graph_runs": r.graph_runs,
                    "graph_ratio_to_baseline": graph_ratio,
                    "floor_percent_of_graph": 100.0 * r.floor_us / r.graph_us,
                    "eager_us_median": r.eager_us,
                    "eager_runs": r.eager_runs,
                    "eager_ratio_to_baseline": eager_ratio,
                    "floor_percent_of_eager": 100.0 * r.floor_us / r.eager_us,
                    "bytes": match &r.bytes {
                        Bytes::Differ(what) => format!("differ: {what}"),
                        other => other.word().to_string(),
                    },
                })
            }).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> AbFigures {
        let variant = |name: &str, bit_identical| Variant {
            name: name.into(),
            levers: if name == "baseline" {
                vec![]
            } else {
                vec![name.into()]
            },
            bit_identical,
            same_as: bit_identical.then_some(0),
        };
        let row = |variant, rows, graph_us, bytes| AbRow {
            variant,
            rows,
            launches: 82,
            floor_us: 500.0,
            eager_us: 2.0 * graph_us,
            eager_runs: 60,
            graph_us,
            graph_runs: 60,
            bytes,
        };
        AbFigures {
            model: "m".into(),
            device: "d".into(),
            copy_bytes_per_s: 4e12,
            context: 32,
            variants: vec![variant("baseline", true), variant("pdl", true)],
            rows: vec![
                row(0, 1, 800.0, Bytes::Same),
                row(1, 1, 720.0, Bytes::Same),
                row(0, 8, 1000.0, Bytes::Same),
                row(1, 8, 1100.0, Bytes::Differ("vs baseline: element 3".into())),
            ],
            failures: vec![],
        }
    }

    #[test]
    fn rows_relate_to_the_baseline_and_the_floor() {
        let table = figures().table();
        let pdl_1 = table
            .lines()
            .find(|l| l.starts_with("pdl ") && l.split_whitespace().nth(1) == Some("1"))
            .unwrap();
        let fields: Vec<&str> = pdl_1.split_whitespace().collect();
        assert_eq!(
            fields,
            [
                "pdl", "1", "82", "500.0", "720.0", "0.900", "69%", "1440.0", "0.900", "35%",
                "same"
            ]
        );
        assert!(
            table.contains("ab rows 1 graph: bytes same; best pdl; baseline 800.0 us; pdl 0.900x")
        );
        assert!(table.contains(
            "ab rows 8 graph: bytes DIFFER; best baseline; baseline 1000.0 us; pdl 1.100x"
        ));
        assert!(table.contains("DIFFER pdl at 8 rows: vs baseline: element 3"));
    }

    #[test]
    fn the_json_names_variants_and_ratios() {
        let json = figures().json();
        assert_eq!(json["variants"][1]["levers"][0], "pdl");
        assert_eq!(json["rows"][1]["graph_ratio_to_baseline"], 0.9);
        assert_eq!(json["rows"][3]["bytes"], "differ: vs baseline: element 3");
        assert_eq!(figures().differences().len(), 1);
    }
}
