//! The programs a profile covers (their launches and compulsory bytes), the match of the
//! profiled kernels to them, and the tables.

use solder_circuit::{Available, BuildOptions, ExecutionPlan, Instance, Mode, Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};

use super::Profiled;

/// One launch a profiled program must make.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// `module::func`.
    pub kernel: String,
    pub layer: Option<u32>,
    /// Its compulsory bytes (`solder_circuit::traffic`).
    pub bytes: u64,
}

/// One program's launches, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    pub mode: Mode,
    pub rows: usize,
    pub launches: Vec<Launch>,
}

/// A program whose launches were matched to profiled kernels.
pub struct Matched<'a> {
    pub program: &'a Expected,
    pub profiled: &'a [Profiled],
}

/// The plans of `programs` (`MODE:ROWS,...`) for `config`, each launch's bytes at `context`.
pub fn expected(
    config: &ModelConfig,
    rules: &RuleSet,
    programs: &str,
    context: usize,
) -> Result<Vec<Expected>, String> {
    let instance =
        Instance::from_config(config, ServeShape::default()).map_err(|e| e.to_string())?;
    let available = Available::all_kernels(rules);
    programs
        .split(',')
        .map(|item| {
            let (mode, rows) = item
                .split_once(':')
                .ok_or_else(|| format!("`--programs`: `{item}` is not MODE:ROWS"))?;
            let mode: Mode = mode
                .trim()
                .parse()
                .map_err(|e: solder_circuit::CircuitError| format!("`--programs`: {e}"))?;
            let rows: usize = rows
                .trim()
                .parse()
                .ok()
                .filter(|r| (1..=4096).contains(r))
                .ok_or_else(|| format!("`--programs`: rows `{rows}` are not 1..=4096"))?;
            let plan = ExecutionPlan::build_with(
                &instance,
                rules,
                &available,
                &Policy::default(),
                mode,
                rows,
                BuildOptions::default(),
            )
            .map_err(|e| format!("{mode}:{rows}: {e}"))?;
            let circuit = instance.circuit_for(mode).map_err(|e| e.to_string())?;
            let traffic = solder_circuit::plan_traffic(circuit, &plan, context);
            Ok(Expected {
                mode,
                rows,
                launches: from_traffic(&traffic),
            })
        })
        .collect()
}

/// One `Launch` per kernel of each launch (a group's bytes go with its first kernel).
pub fn from_traffic(traffic: &solder_circuit::PlanTraffic) -> Vec<Launch> {
    traffic
        .launches
        .iter()
        .flat_map(|l| {
            l.kernels.iter().enumerate().map(|(i, kernel)| Launch {
                kernel: kernel.clone(),
                layer: l.layer,
                bytes: if i == 0 { l.total() } else { 0 },
            })
        })
        .collect()
}

/// The profiled kernels, in ID order, split into `programs`' launches; each kernel must be
/// the launch's, and every kernel must be accounted for.
pub fn match_programs<'a>(
    profiled: &'a [Profiled],
    programs: &'a [Expected],
) -> Result<Vec<Matched<'a>>, String> {
    let wanted: usize = programs.iter().map(|p| p.launches.len()).sum();
    if profiled.len() != wanted {
        let names: Vec<String> = programs
            .iter()
            .map(|p| format!("{}:{} ({} launches)", p.mode, p.rows, p.launches.len()))
            .collect();
        return Err(format!(
            "{} kernels profiled, but {} make {wanted} launches (was the run bracketed by \
             `gpu-step --profile` under `ncu --profile-from-start off`?)",
            profiled.len(),
            names.join(" + ")
        ));
    }
    let mut at = 0;
    let mut out = Vec::new();
    for program in programs {
        let slice = &profiled[at..at + program.launches.len()];
        for (i, (launch, kernel)) in program.launches.iter().zip(slice).enumerate() {
            if crate::traffic::function_of(&launch.kernel) != profiled_kernel(&kernel.name) {
                return Err(format!(
                    "{}:{} launch {i}: the plan launches `{}`, ncu profiled `{}` (ID {})",
                    program.mode, program.rows, launch.kernel, kernel.name, kernel.id
                ));
            }
        }
        out.push(Matched {
            program,
            profiled: slice,
        });
        at += program.launches.len();
    }
    Ok(out)
}

/// The kernel (function name) a profiled function stands for: the kernel of a variant entry
/// (gemv's streaming entries, `linear_r1` for `linear`), else the function itself.
fn profiled_kernel(name: &str) -> &str {
    solder_model_layers::kernels::variants()
        .find(|(entry, _)| crate::traffic::function_of(entry) == name)
        .map_or(name, |(_, kernel)| crate::traffic::function_of(kernel))
}

/// Figures of a set of launches: time, DRAM bytes, compulsory bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Sum {
    launches: usize,
    seconds: f64,
    dram: f64,
    floor_bytes: f64,
}

impl Sum {
    fn add(&mut self, other: Sum) {
        self.launches += other.launches;
        self.seconds += other.seconds;
        self.dram += other.dram;
        self.floor_bytes += other.floor_bytes;
    }

    fn of(launch: &Launch, kernel: &Profiled) -> Sum {
        Sum {
            launches: 1,
            seconds: kernel.seconds,
            dram: kernel.dram_bytes(),
            floor_bytes: launch.bytes as f64,
        }
    }

    /// time, DRAM MB, compulsory MB, TB/s, % of peak, floor us, floor / time.
    fn line(&self, peak_tbps: f64) -> String {
        let tbps = if self.seconds > 0.0 {
            self.dram / self.seconds / 1e12
        } else {
            0.0
        };
        let floor_us = self.floor_bytes / (peak_tbps * 1e12) * 1e6;
        let us = self.seconds * 1e6;
        format!(
            "{:>5} {:>10.2} {:>10.3} {:>10.3} {:>7.3} {:>6.0}% {:>9.2} {:>7.0}%",
            self.launches,
            us,
            self.dram / 1e6,
            self.floor_bytes / 1e6,
            tbps,
            100.0 * tbps / peak_tbps,
            floor_us,
            if us > 0.0 { 100.0 * floor_us / us } else { 0.0 }
        )
    }
}

const COLUMNS: &str = "    n    time_us    dram_MB   floor_MB    TB/s  %peak  floor_us  fl/time";

/// Per program: a line per kernel (summed over its launches; per launch with `launches`),
/// then the program's total; last, one summary line per program.
pub fn render(matched: &[Matched<'_>], peak_tbps: f64, launches: bool) -> String {
    let mut out = String::new();
    let mut summary = String::new();
    for m in matched {
        let p = m.program;
        out += &format!(
            "ncu {}:{}: per kernel, against the peak {peak_tbps} TB/s and each launch's floor\n",
            p.mode, p.rows
        );
        out += &format!("{:<34} {COLUMNS}\n", "kernel");
        let pairs = p.launches.iter().zip(m.profiled);
        if launches {
            for (i, (launch, kernel)) in pairs.clone().enumerate() {
                let layer = launch.layer.map_or("-".into(), |l| l.to_string());
                out += &format!(
                    "{:<34} {}\n",
                    format!("#{i} {} l{layer}", kernel.name),
                    Sum::of(launch, kernel).line(peak_tbps)
                );
            }
        }
        let by_kernel = super::group_by(
            pairs.map(|(launch, kernel)| (kernel.name.clone(), Sum::of(launch, kernel))),
            |sum, s| sum.add(s),
        );
        let mut total = Sum::default();
        for (name, sum) in by_kernel {
            total.add(sum);
            out += &format!("{name:<34} {}\n", sum.line(peak_tbps));
        }
        let line = total.line(peak_tbps);
        out += &format!("{:<34} {line}\n\n", "total");
        summary += &format!("ncu {}:{} total {line}\n", p.mode, p.rows);
    }
    out += &format!("ncu summary ({COLUMNS})\n");
    out + &summary
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profiled(id: u64, name: &str, us: f64, read: f64, write: f64) -> Profiled {
        Profiled {
            id,
            name: name.into(),
            seconds: us * 1e-6,
            bytes_read: read,
            bytes_written: write,
        }
    }

    fn launch(kernel: &str, bytes: u64) -> Launch {
        Launch {
            kernel: kernel.into(),
            layer: Some(0),
            bytes,
        }
    }

    #[test]
    fn the_recorded_sample_against_its_plan() {
        let kernels = super::super::parse(super::super::csv::tests_sample()).unwrap();
        let programs = vec![Expected {
            mode: Mode::Decode,
            rows: 1,
            launches: vec![
                launch("embed::embedding", 8192),
                launch("gemv::add_norm_qkv", 12_000_000),
            ],
        }];
        let matched = match_programs(&kernels, &programs).unwrap();
        let text = render(&matched, 4.8, true);
        let total = text
            .lines()
            .find(|l| l.starts_with("ncu decode:1 total"))
            .unwrap();
        let f: Vec<&str> = total.split_whitespace().collect();
        // 2 launches, 6.7 us, 12.6225 MB of DRAM, 12.0082 MB compulsory, 1.884 TB/s = 39% of
        // 4.8; floor 2.50 us = 37% of the time.
        assert_eq!(
            f[3..],
            ["2", "6.70", "12.623", "12.008", "1.884", "39%", "2.50", "37%"]
        );
        assert!(text.contains("#1 add_norm_qkv l0"), "{text}");
    }

    #[test]
    fn a_kernel_out_of_place_or_a_count_off_is_named() {
        let kernels = vec![
            profiled(0, "embedding", 1.0, 10.0, 10.0),
            profiled(1, "rms_norm", 1.0, 10.0, 10.0),
        ];
        let programs = vec![Expected {
            mode: Mode::Decode,
            rows: 1,
            launches: vec![launch("embed::embedding", 1), launch("gemv::linear", 1)],
        }];
        let e = match_programs(&kernels, &programs).err().unwrap();
        assert!(
            e.contains(
                "decode:1 launch 1: the plan launches `gemv::linear`, ncu profiled `rms_norm`"
            ),
            "{e}"
        );
        let e = match_programs(&kernels[..1], &programs).err().unwrap();
        assert!(
            e.contains("1 kernels profiled, but decode:1 (2 launches) make 2"),
            "{e}"
        );
    }

    #[test]
    fn a_streaming_entry_is_matched_to_its_kernel() {
        let kernels = vec![
            profiled(0, "embedding", 1.0, 10.0, 10.0),
            profiled(1, "linear_r1", 1.0, 10.0, 10.0),
        ];
        let programs = |kernel: &str| {
            vec![Expected {
                mode: Mode::Decode,
                rows: 1,
                launches: vec![launch("embed::embedding", 1), launch(kernel, 1)],
            }]
        };
        assert!(match_programs(&kernels, &programs("gemv::linear")).is_ok());
        let e = match_programs(&kernels, &programs("gemv::lm_head"))
            .err()
            .unwrap();
        assert!(e.contains("ncu profiled `linear_r1`"), "{e}");
    }

    /// What the table expects of a profile is what the exec launches: the same plans (by
    /// digest) and one kernel launch per expected launch.
    #[test]
    fn an_execs_programs_launch_what_the_table_expects() {
        use solder_model_layers::{Boot, CircuitExec, KvShape, WeightSource};
        let rules =
            RuleSet::from_file(&crate::paths::workspace_root().join("fusions/FUSIONS.toml"))
                .unwrap();
        for name in ["tiny-llama", "tiny-qwen3-next"] {
            let builtin = crate::parity::builtin_named(name).unwrap();
            let config = builtin.config().unwrap();
            let mut cpu = solder_model_layers::kernels::cpu_backend(None).unwrap();
            let mut exec = CircuitExec::build(
                &mut cpu,
                Boot {
                    config: config.clone(),
                    serve: ServeShape::with_max_batch(4).unwrap(),
                    rules: rules.clone(),
                    policy: Policy::default(),
                    weights: WeightSource::Random { seed: 1 },
                    kv: KvShape {
                        pages: 8,
                        block_size: 16,
                        max_seq_len: 32,
                        max_sequences: 4,
                    },
                    precision: Default::default(),
                },
            )
            .unwrap();
            let programs = expected(&config, &rules, "decode:1,multi_seq:4", 5).unwrap();
            for p in &programs {
                let program = exec.program(p.mode, p.rows).unwrap();
                // The program's first launch is its counter reset, not a plan step.
                assert_eq!(
                    program.launches(),
                    p.launches.len() + 1,
                    "{name} {}:{}",
                    p.mode,
                    p.rows
                );
                let plan = exec.plan(p.mode, p.rows).unwrap();
                assert_eq!(program.plan_digest, plan.digest);
                let circuit = exec.instance.circuit_for(p.mode).unwrap();
                let traffic = solder_circuit::plan_traffic(circuit, plan, 5);
                assert_eq!(from_traffic(&traffic), p.launches, "{name}");
            }
            exec.free(&mut cpu).unwrap();
        }
    }

    #[test]
    fn llama_1b_plans_give_the_expected_launches() {
        let root = crate::paths::workspace_root();
        let config =
            crate::files::model_config(&root.join("tests/fixtures/configs/llama-3.2-1b.json"))
                .unwrap();
        let rules = RuleSet::from_file(&root.join("fusions/FUSIONS.toml")).unwrap();
        let programs = expected(&config, &rules, "decode:1,multi_seq:16", 32).unwrap();
        assert_eq!(programs.len(), 2);
        assert_eq!(programs[1].rows, 16);
        // Kernels named as ncu names them, in the plan's order, match themselves.
        let mut id = 0;
        let kernels: Vec<Profiled> = programs
            .iter()
            .flat_map(|p| p.launches.iter())
            .map(|l| {
                id += 1;
                profiled(
                    id,
                    crate::traffic::function_of(&l.kernel),
                    1.0,
                    l.bytes as f64,
                    0.0,
                )
            })
            .collect();
        let matched = match_programs(&kernels, &programs).unwrap();
        assert_eq!(matched[1].profiled.len(), programs[1].launches.len());
        assert!(expected(&config, &rules, "decode", 0)
            .unwrap_err()
            .contains("MODE:ROWS"));
    }
}
