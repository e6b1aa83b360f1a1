//! Shared helpers of solder's cross-crate tests (in `tests/`), also used by `cargo xtask plan
//! --bless`: where fixtures live, the list of golden printed plans and how each is rendered.

#![forbid(unsafe_code)]

pub mod imports;

use std::path::PathBuf;

use solder_circuit::{Available, BuildOptions, ExecutionPlan, Instance, Mode, Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};

pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Every `.rs` file under `dir`, depth first, in name order.
pub fn rust_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    let mut files = Vec::new();
    for path in entries {
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|x| x == "rs") {
            files.push(path);
        }
    }
    files
}

/// The `*.json` files of the workspace folder `dir` (e.g. `tests/fixtures/configs`), sorted.
pub fn json_files(dir: &str) -> Vec<PathBuf> {
    let dir = workspace_root().join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

/// `tests/fixtures/configs/<name>.json`: copies of `../shared/configs` and the golden
/// checkpoints' configs (as `golden-<case>.json`).
pub fn config_path(name: &str) -> PathBuf {
    workspace_root()
        .join("tests/fixtures/configs")
        .join(format!("{name}.json"))
}

pub fn rules_path() -> PathBuf {
    workspace_root().join("fusions/FUSIONS.toml")
}

/// The dense configs shipped with the project.
pub const DENSE_CONFIGS: &[&str] = &[
    "llama-3.1-8b",
    "llama-3.2-1b",
    "mistral-7b-v0.1",
    "qwen3-0.6b",
    "qwen3-8b",
    "golden-llama-gqa",
    "golden-qwen3-dense",
];

/// The shipped mixture-of-experts configs.
pub const MOE_CONFIGS: &[&str] = &[
    "qwen3-30b-a3b",
    "golden-qwen3-moe",
    "qwen3-next-80b-a3b",
    "golden-qwen3-next",
];

pub fn load_instance(name: &str) -> Result<Instance, String> {
    let config = ModelConfig::from_file(&config_path(name)).map_err(|e| e.to_string())?;
    Instance::from_config(&config, ServeShape::default()).map_err(|e| e.to_string())
}

/// `load_instance` with draft programs (the MTP head's) at `draft_widths` as well.
pub fn load_instance_with_draft(name: &str, draft_widths: &[usize]) -> Result<Instance, String> {
    let config = ModelConfig::from_file(&config_path(name)).map_err(|e| e.to_string())?;
    let serve = ServeShape {
        draft_widths: draft_widths.to_vec(),
        ..ServeShape::default()
    };
    Instance::from_config(&config, serve).map_err(|e| e.to_string())
}

/// The programs a config is planned at to show it serves: decode, a multi-seq width, a verify
/// width and a prefill width (its circuit without the LM head).
pub const SERVE_SAMPLE: [(Mode, usize); 4] = [
    (Mode::Decode, 1),
    (Mode::MultiSeq, 16),
    (Mode::Verify, 5),
    (Mode::Prefill, 5),
];

/// Each `SERVE_SAMPLE` program of `instance` under every kernel the rules name and the default
/// policy, the plan verifier on between passes; an error names the program, or says it has no
/// kernels.
pub fn plan_serve_sample(instance: &Instance, rules: &RuleSet) -> Result<(), String> {
    let available = Available::all_kernels(rules);
    for (mode, rows) in SERVE_SAMPLE {
        let plan = ExecutionPlan::build_with(
            instance,
            rules,
            &available,
            &Policy::default(),
            mode,
            rows,
            BuildOptions { verify: true },
        )
        .map_err(|e| format!("{mode} rows={rows}: {e}"))?;
        if plan.kernel_count_fused == 0 {
            return Err(format!("{mode} rows={rows}: no kernels"));
        }
    }
    Ok(())
}

pub fn load_rules() -> Result<RuleSet, String> {
    RuleSet::from_file(&rules_path()).map_err(|e| e.to_string())
}

/// One golden printed plan: `tests/golden/plans/<model>.<mode>-<rows>.txt`.
#[derive(Debug, Clone, Copy)]
pub struct GoldenPlan {
    pub model: &'static str,
    pub mode: Mode,
    pub rows: usize,
}

/// Dense llama and qwen3, then MoE (qwen3_moe) and Next (qwen3_next: Gated DeltaNet, the shared
/// expert on a side stream).
pub const GOLDEN_PLANS: &[GoldenPlan] = &[
    GoldenPlan {
        model: "llama-3.2-1b",
        mode: Mode::Decode,
        rows: 1,
    },
    GoldenPlan {
        model: "llama-3.2-1b",
        mode: Mode::MultiSeq,
        rows: 8,
    },
    GoldenPlan {
        model: "llama-3.2-1b",
        mode: Mode::Verify,
        rows: 4,
    },
    // Verify's rows without the LM head: the last layer keeps only its q/k/v projections,
    // rope and KV write.
    GoldenPlan {
        model: "llama-3.2-1b",
        mode: Mode::Prefill,
        rows: 4,
    },
    // Sliding window 4096 in every layer: each attention step prints ` window=4096`.
    GoldenPlan {
        model: "mistral-7b-v0.1",
        mode: Mode::Decode,
        rows: 1,
    },
    GoldenPlan {
        model: "qwen3-0.6b",
        mode: Mode::Decode,
        rows: 1,
    },
    GoldenPlan {
        model: "qwen3-0.6b",
        mode: Mode::MultiSeq,
        rows: 128,
    },
    GoldenPlan {
        model: "golden-llama-gqa",
        mode: Mode::Decode,
        rows: 1,
    },
    GoldenPlan {
        model: "golden-qwen3-dense",
        mode: Mode::Verify,
        rows: 3,
    },
    GoldenPlan {
        model: "qwen3-30b-a3b",
        mode: Mode::Decode,
        rows: 1,
    },
    GoldenPlan {
        model: "qwen3-30b-a3b",
        mode: Mode::MultiSeq,
        rows: 8,
    },
    GoldenPlan {
        model: "qwen3-30b-a3b",
        mode: Mode::Verify,
        rows: 4,
    },
    GoldenPlan {
        model: "qwen3-next-80b-a3b",
        mode: Mode::Decode,
        rows: 1,
    },
    GoldenPlan {
        model: "qwen3-next-80b-a3b",
        mode: Mode::MultiSeq,
        rows: 8,
    },
    GoldenPlan {
        model: "qwen3-next-80b-a3b",
        mode: Mode::Verify,
        rows: 4,
    },
    GoldenPlan {
        model: "qwen3-next-80b-a3b",
        mode: Mode::Draft,
        rows: 1,
    },
    GoldenPlan {
        model: "qwen3-next-80b-a3b",
        mode: Mode::Draft,
        rows: 4,
    },
];

impl GoldenPlan {
    pub fn path(&self) -> PathBuf {
        workspace_root()
            .join("tests/golden/plans")
            .join(format!("{}.{}-{}.txt", self.model, self.mode, self.rows))
    }

    /// The plan's printout with the shipped rules, all fusions, default policy; verified.
    /// Without the rules digest (`RULES_DIGEST` holds it), so a rules edit that changes no plan
    /// rewrites no plan file.
    pub fn render(&self) -> Result<String, String> {
        // A draft plan needs the draft head: the serve asks for draft programs at its rows.
        let instance = if self.mode == Mode::Draft {
            load_instance_with_draft(self.model, &[self.rows])?
        } else {
            load_instance(self.model)?
        };
        let rules = load_rules()?;
        let available = Available::all_kernels(&rules);
        let plan = ExecutionPlan::build_with(
            &instance,
            &rules,
            &available,
            &Policy::default(),
            self.mode,
            self.rows,
            BuildOptions { verify: true },
        )
        .map_err(|e| e.to_string())?;
        Ok(plan
            .display(instance.circuit_for(self.mode).map_err(|e| e.to_string())?)
            .without_rules_digest()
            .to_string())
    }
}

/// `tests/golden/plans/RULES_DIGEST`: the digest of the rules the golden plans were blessed
/// with, in one place, so a rules change always shows in review as a one-line diff here.
pub fn rules_digest_path() -> PathBuf {
    workspace_root().join("tests/golden/plans/RULES_DIGEST")
}

/// The text `RULES_DIGEST` holds for the shipped rules.
pub fn render_rules_digest() -> Result<String, String> {
    Ok(format!(
        "# rules_digest of fusions/FUSIONS.toml for the plans here (cargo xtask plan --bless)\n{}\n",
        load_rules()?.digest
    ))
}

/// Every golden file and the text it must hold: each printed plan, then `RULES_DIGEST`.
pub fn golden_files() -> Vec<(PathBuf, Result<String, String>)> {
    GOLDEN_PLANS
        .iter()
        .map(|golden| (golden.path(), golden.render()))
        .chain(std::iter::once((
            rules_digest_path(),
            render_rules_digest(),
        )))
        .collect()
}
