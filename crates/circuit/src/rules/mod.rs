//! Fusion rules: `fusions/FUSIONS.toml` parsed, checked and digested.
//!
//! Invariants: rule ids are unique; every kernel name is `module::func`; a `reference` rule
//! covers exactly one op with one kernel; a `differs` rule names a known lever; every
//! capability and role is in the vocabulary the rules are parsed in ([`Vocabulary`]);
//! [`RuleSet::digest`] is SHA-256 over a canonical text of the rules (not the file's bytes, so
//! comments, order and `why` do not change it).

mod parse;
mod vocabulary;

pub use vocabulary::Vocabulary;

use std::fmt::Write as _;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::CircuitError;
use crate::format::WeightFormat;
use crate::ir::{LayerKind, Op};
use crate::mode::Mode;
use crate::ops::OpKind;

/// How an element joins the group grown so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// It reads an output of an earlier element of the group (data flow).
    Consumer,
    /// It reads an input that the previous element reads (a sibling, e.g. k beside q).
    Sibling,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternElem {
    pub op: OpKind,
    pub role: Option<String>,
    pub layer_kind: Option<LayerKind>,
    /// The element's outputs may also be read outside the group (so they get a buffer).
    pub keep: bool,
    pub link: Link,
}

/// What a rule promises about its results.
#[derive(Debug, Clone, PartialEq)]
pub enum Numerics {
    /// Defines the routing every other rule is compared against.
    Reference,
    /// Same bytes as the reference routing on every backend.
    BitIdentical,
    /// Different results, allowed only with `lever` on, within `tolerance` (relative). With
    /// `by_chunk`, a prompt's rows summed together in the rule's kernel also differ from the
    /// same rows decoded one at a time under the same routing (a sequence's bytes depend on
    /// how its prompt was chunked): parity holds that comparison to the tolerance too.
    Differs {
        lever: String,
        tolerance: f64,
        by_chunk: bool,
    },
}

impl Numerics {
    pub fn describe(&self) -> String {
        match self {
            Numerics::Reference => "reference".to_string(),
            Numerics::BitIdentical => "bit_identical".to_string(),
            Numerics::Differs {
                lever,
                tolerance,
                by_chunk,
            } => {
                let chunk = if *by_chunk { ", by chunk" } else { "" };
                format!("differs({lever}, tolerance {tolerance:?}{chunk})")
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub id: String,
    pub pattern: Vec<PatternElem>,
    /// Kernels the group launches, in order (one for most rules).
    pub kernels: Vec<String>,
    pub emitter: Option<String>,
    /// Modes the rule may serve; `None` means all.
    pub modes: Option<Vec<Mode>>,
    /// Inclusive range of rows; `None` means any.
    pub rows: Option<(usize, usize)>,
    /// Backend capabilities the kernels need.
    pub requires: Vec<String>,
    /// Levers that must be on (`true`) or off (`false`).
    pub when: Vec<(String, bool)>,
    pub numerics: Numerics,
    pub priority: i64,
    pub why: Option<String>,
    /// The weight format kinds its kernels read (`WeightFormat::kind`: `bf16`, `fp8`, `int4`),
    /// in `WeightFormat::KINDS` order; `["bf16"]` when the file says nothing.
    pub formats: Vec<&'static str>,
    /// Line of the rule's `id` in its file, for messages.
    pub line: usize,
}

impl Rule {
    /// Whether the rule may serve `mode`: listed, or a prefill program under a rule listing
    /// verify (the same rows; `Mode::rows_as`).
    pub fn allows_mode(&self, mode: Mode) -> bool {
        self.modes
            .as_ref()
            .is_none_or(|m| m.contains(&mode) || m.contains(&mode.rows_as()))
    }

    pub fn allows_rows(&self, rows: usize) -> bool {
        self.rows.is_none_or(|(lo, hi)| lo <= rows && rows <= hi)
    }

    /// Whether the rule's kernels read a weight matrix stored as `format`.
    pub fn reads(&self, format: WeightFormat) -> bool {
        self.formats.contains(&format.kind())
    }

    /// Whether an element of the rule's pattern matches `op` (kind, role, layer kind): the
    /// rule could cover it, formats aside.
    pub fn names_op(&self, op: &Op) -> bool {
        self.pattern.iter().any(|e| e.matches(op))
    }
}

impl PatternElem {
    /// Whether `op` has this element's kind, and its role and layer kind where it names them.
    pub fn matches(&self, op: &Op) -> bool {
        op.kind == self.op
            && self.role.as_ref().is_none_or(|r| *r == op.role)
            && self.layer_kind.is_none_or(|k| op.layer_kind == Some(k))
    }
}

/// The rules of one file, in file order, with their digest.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
    /// SHA-256 (hex) over the canonical text.
    pub digest: String,
    /// Where the rules came from (a path or a name).
    pub source: String,
}

impl RuleSet {
    /// The most bytes a rules file may hold (the shipped one is a few dozen KiB).
    pub const MAX_FILE_BYTES: u64 = 64 << 20;

    /// Reads and parses a rules file, which must be a regular file of at most
    /// `MAX_FILE_BYTES` (so `/dev/zero` or a FIFO is refused, not read without end).
    pub fn from_file(path: &Path) -> Result<RuleSet, CircuitError> {
        use solder_config::file_guard::{read_capped, FileRefusal};
        let refuse = |message: String| CircuitError::Rules {
            source_name: path.display().to_string(),
            message,
        };
        let bytes = read_capped(path, Self::MAX_FILE_BYTES).map_err(|refusal| match refusal {
            FileRefusal::Io(source) => CircuitError::RulesIo {
                path: path.to_path_buf(),
                source,
            },
            other => refuse(format!("a rules file {other}")),
        })?;
        let text = String::from_utf8(bytes).map_err(|e| refuse(format!("not UTF-8: {e}")))?;
        RuleSet::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses rules, refusing any capability or role outside solder's vocabulary.
    pub fn from_toml_str(text: &str, source: &str) -> Result<RuleSet, CircuitError> {
        RuleSet::from_toml_str_in(text, source, &Vocabulary::solder())
    }

    /// Parses rules whose capabilities and roles must lie in `vocabulary`.
    pub fn from_toml_str_in(
        text: &str,
        source: &str,
        vocabulary: &Vocabulary,
    ) -> Result<RuleSet, CircuitError> {
        let rules = parse::parse_rules(text, source)?;
        vocabulary.check(&rules, source)?;
        let digest = digest_rules(&rules);
        tracing::debug!(source, rules = rules.len(), %digest, "loaded fusion rules");
        Ok(RuleSet {
            rules,
            digest,
            source: source.to_string(),
        })
    }

    pub fn get(&self, id: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.id == id)
    }
}

/// The text the rules digest is taken over: rules sorted by id, every field but `why`
/// (`formats` only where it is not the default `["bf16"]`, so a bf16-only rule's text, and the
/// digest of a rule set of them, is what it was before rules had formats).
pub fn canonical_text(rules: &[Rule]) -> String {
    let mut sorted: Vec<&Rule> = rules.iter().collect();
    sorted.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = String::from("schema 1\n");
    for r in sorted {
        let pattern: Vec<String> = r
            .pattern
            .iter()
            .map(|e| {
                format!(
                    "{}/{}/{}/{}/{}",
                    e.op.as_str(),
                    e.role.as_deref().unwrap_or("*"),
                    e.layer_kind.map_or("*", |k| k.as_str()),
                    if e.keep { "keep" } else { "-" },
                    if e.link == Link::Sibling {
                        "sibling"
                    } else {
                        "consumer"
                    }
                )
            })
            .collect();
        let modes = r.modes.as_ref().map_or("*".to_string(), |m| {
            m.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(",")
        });
        let rows = r
            .rows
            .map_or("*".to_string(), |(lo, hi)| format!("{lo}..={hi}"));
        let when: Vec<String> = r.when.iter().map(|(l, on)| format!("{l}={on}")).collect();
        let formats = if r.formats == ["bf16"] {
            String::new()
        } else {
            format!(" formats [{}]", r.formats.join(","))
        };
        let _ = writeln!(
            out,
            "rule {} pattern [{}] kernels [{}] emitter {} modes {} rows {} requires [{}] \
             when [{}] numerics {} priority {}{formats}",
            r.id,
            pattern.join(" "),
            r.kernels.join(","),
            r.emitter.as_deref().unwrap_or("-"),
            modes,
            rows,
            r.requires.join(","),
            when.join(","),
            r.numerics.describe(),
            r.priority
        );
    }
    out
}

pub fn digest_rules(rules: &[Rule]) -> String {
    hex_sha256(canonical_text(rules).as_bytes())
}

pub(crate) fn hex_sha256(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    hash.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
