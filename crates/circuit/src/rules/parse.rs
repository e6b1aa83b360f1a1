//! TOML → [`Rule`]s, with every semantic check and messages carrying `file:line:column`.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use solder_config::Levers;
use toml::Spanned;

use super::{Link, Numerics, PatternElem, Rule};
use crate::error::CircuitError;
use crate::format::WeightFormat;
use crate::ir::LayerKind;
use crate::mode::Mode;
use crate::ops::OpKind;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    schema: Spanned<i64>,
    #[serde(default, rename = "rule")]
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: Spanned<String>,
    pattern: Spanned<Vec<RawElem>>,
    kernel: Option<Spanned<String>>,
    kernels: Option<Spanned<Vec<String>>>,
    emitter: Option<String>,
    modes: Option<Spanned<Vec<String>>>,
    rows: Option<Spanned<Vec<i64>>>,
    #[serde(default)]
    requires: Vec<String>,
    when: Option<Spanned<BTreeMap<String, bool>>>,
    numerics: Option<Spanned<toml::Value>>,
    #[serde(default)]
    priority: i64,
    why: Option<String>,
    formats: Option<Spanned<Vec<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawElem {
    op: Spanned<String>,
    role: Option<String>,
    layer_kind: Option<Spanned<String>>,
    #[serde(default)]
    keep: bool,
    link: Option<Spanned<String>>,
}

/// Resolves byte offsets to `file:line:column` for messages.
struct Locator<'a> {
    text: &'a str,
    source: &'a str,
}

impl Locator<'_> {
    fn line_col(&self, offset: usize) -> (usize, usize) {
        let before = self.text.get(..offset).unwrap_or(self.text);
        let line = before.matches('\n').count() + 1;
        // Columns count characters, as toml's own messages do.
        let col = before[before.rfind('\n').map_or(0, |nl| nl + 1)..]
            .chars()
            .count()
            + 1;
        (line, col)
    }

    fn err(&self, offset: usize, message: String) -> CircuitError {
        let (line, col) = self.line_col(offset);
        CircuitError::Rules {
            source_name: format!("{}:{line}:{col}", self.source),
            message,
        }
    }
}

pub(super) fn parse_rules(text: &str, source: &str) -> Result<Vec<Rule>, CircuitError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| CircuitError::Rules {
        source_name: source.to_string(),
        message: e.to_string().trim_end().to_string(),
    })?;
    let at = Locator { text, source };
    if *raw.schema.get_ref() != 1 {
        return Err(at.err(
            raw.schema.span().start,
            format!(
                "unsupported schema {} (this solder reads schema 1)",
                raw.schema.get_ref()
            ),
        ));
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut rules = Vec::with_capacity(raw.rules.len());
    for r in raw.rules {
        let rule = parse_rule(r, &at)?;
        if let Some(first) = seen.insert(rule.id.clone(), rule.line) {
            return Err(CircuitError::Rules {
                source_name: format!("{}:{}", source, rule.line),
                message: format!(
                    "duplicate rule id `{}` (first defined at line {first})",
                    rule.id
                ),
            });
        }
        rules.push(rule);
    }
    Ok(rules)
}

/// Builds the error for a problem at a byte offset within one rule.
type Fail<'a> = dyn Fn(usize, String) -> CircuitError + 'a;

fn parse_rule(r: RawRule, at: &Locator) -> Result<Rule, CircuitError> {
    let id_at = r.id.span().start;
    let id = r.id.into_inner();
    let line = at.line_col(id_at).0;
    let fail = |offset: usize, what: String| at.err(offset, format!("rule `{id}`: {what}"));
    if id.trim().is_empty() {
        return Err(at.err(id_at, "rule id is empty".to_string()));
    }

    let pattern_at = r.pattern.span().start;
    let pattern = parse_pattern(r.pattern.into_inner(), pattern_at, &fail)?;
    let kernels = parse_kernels(r.kernel, r.kernels, id_at, &fail)?;
    let modes = parse_modes(r.modes, &fail)?;
    let rows = parse_rows(r.rows, &fail)?;
    let when = parse_when(r.when, &fail)?;
    let formats = parse_formats(r.formats, &fail)?;

    let numerics = match r.numerics {
        None => {
            return Err(fail(
                id_at,
                "missing `numerics` (one of \"reference\", \"bit_identical\", \
                 { differs = \"<lever>\", tolerance = <rel> })"
                    .to_string(),
            ))
        }
        Some(n) => {
            let start = n.span().start;
            parse_numerics(n.get_ref()).map_err(|what| fail(start, what))?
        }
    };
    if numerics == Numerics::Reference && (pattern.len() != 1 || kernels.len() != 1) {
        return Err(fail(
            pattern_at,
            "a reference rule covers one op with one kernel".to_string(),
        ));
    }

    Ok(Rule {
        id,
        pattern,
        kernels,
        emitter: r.emitter,
        modes,
        rows,
        requires: r.requires,
        when,
        numerics,
        priority: r.priority,
        why: r.why,
        formats,
        line,
    })
}

/// The rule's `pattern`: non-empty, each element checked in order.
fn parse_pattern(
    raw_pattern: Vec<RawElem>,
    pattern_at: usize,
    fail: &Fail,
) -> Result<Vec<PatternElem>, CircuitError> {
    if raw_pattern.is_empty() {
        return Err(fail(pattern_at, "pattern is empty".to_string()));
    }
    raw_pattern
        .into_iter()
        .enumerate()
        .map(|(i, e)| parse_elem(i, e, fail))
        .collect()
}

/// One pattern element: its op, optional layer kind, and link to the element before it.
fn parse_elem(i: usize, e: RawElem, fail: &Fail) -> Result<PatternElem, CircuitError> {
    let op = OpKind::parse(e.op.get_ref()).ok_or_else(|| {
        fail(
            e.op.span().start,
            format!(
                "unknown op `{}` (known ops: {})",
                e.op.get_ref(),
                OpKind::names().join(", ")
            ),
        )
    })?;
    let layer_kind = match e.layer_kind {
        None => None,
        Some(k) => Some(LayerKind::parse(k.get_ref()).ok_or_else(|| {
            fail(
                k.span().start,
                format!("unknown layer_kind `{}`", k.get_ref()),
            )
        })?),
    };
    let link = match e
        .link
        .as_ref()
        .map(|l| (l.get_ref().as_str(), l.span().start))
    {
        None | Some(("consumer", _)) => Link::Consumer,
        Some(("sibling", at)) if i == 0 => {
            return Err(fail(
                at,
                "the first pattern element cannot be a sibling".to_string(),
            ))
        }
        Some(("sibling", _)) => Link::Sibling,
        Some((other, at)) => {
            return Err(fail(
                at,
                format!("unknown link `{other}` (expected consumer or sibling)"),
            ))
        }
    };
    Ok(PatternElem {
        op,
        role: e.role,
        layer_kind,
        keep: e.keep,
        link,
    })
}

/// The rule's kernels from exactly one of `kernel` / `kernels`, each `module::func`.
fn parse_kernels(
    kernel: Option<Spanned<String>>,
    kernels: Option<Spanned<Vec<String>>>,
    id_at: usize,
    fail: &Fail,
) -> Result<Vec<String>, CircuitError> {
    let kernels = match (kernel, kernels) {
        (Some(k), None) => vec![(k.span().start, k.into_inner())],
        (None, Some(ks)) if !ks.get_ref().is_empty() => {
            let start = ks.span().start;
            ks.into_inner().into_iter().map(|k| (start, k)).collect()
        }
        (Some(k), Some(_)) => {
            return Err(fail(
                k.span().start,
                "has both `kernel` and `kernels`".to_string(),
            ))
        }
        _ => {
            return Err(fail(
                id_at,
                "names no kernel (`kernel = \"module::func\"`)".to_string(),
            ))
        }
    };
    for (offset, k) in &kernels {
        if !is_kernel_name(k) {
            return Err(fail(
                *offset,
                format!("kernel name `{k}` is not of the form `module::func`"),
            ));
        }
    }
    Ok(kernels.into_iter().map(|(_, k)| k).collect())
}

/// The rule's optional `modes`: non-empty when present, each a known [`Mode`].
fn parse_modes(
    modes: Option<Spanned<Vec<String>>>,
    fail: &Fail,
) -> Result<Option<Vec<Mode>>, CircuitError> {
    let Some(m) = modes else {
        return Ok(None);
    };
    let start = m.span().start;
    if m.get_ref().is_empty() {
        return Err(fail(
            start,
            "`modes` is empty: the rule could never apply (omit it for every mode)".to_string(),
        ));
    }
    let mut modes = Vec::new();
    for name in m.into_inner() {
        let mode: Mode = name.parse().map_err(|_| {
            fail(
                start,
                format!(
                    "unknown mode `{name}` (expected one of {})",
                    Mode::ALL
                        .iter()
                        .map(|m| m.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
        modes.push(mode);
    }
    Ok(Some(modes))
}

/// The rule's optional `rows = [lo, hi]` range, with `1 <= lo <= hi`.
fn parse_rows(
    rows: Option<Spanned<Vec<i64>>>,
    fail: &Fail,
) -> Result<Option<(usize, usize)>, CircuitError> {
    let Some(rows) = rows else {
        return Ok(None);
    };
    let start = rows.span().start;
    match rows.get_ref().as_slice() {
        &[lo, hi] if lo >= 1 && lo <= hi => Ok(Some((lo as usize, hi as usize))),
        &[lo, hi] if lo >= 1 => Err(fail(start, format!("rows range [{lo}, {hi}] is inverted"))),
        other => Err(fail(
            start,
            format!("rows must be [lo, hi] with 1 <= lo <= hi, got {other:?}"),
        )),
    }
}

/// The rule's optional `when` table: each key a known lever.
fn parse_when(
    when: Option<Spanned<BTreeMap<String, bool>>>,
    fail: &Fail,
) -> Result<Vec<(String, bool)>, CircuitError> {
    let mut out = Vec::new();
    if let Some(w) = when {
        let start = w.span().start;
        for (lever, on) in w.into_inner() {
            if !Levers::is_known(&lever) {
                return Err(fail(start, format!("`when` names unknown lever `{lever}`")));
            }
            out.push((lever, on));
        }
    }
    Ok(out)
}

/// The rule's optional `formats`: non-empty, each a `WeightFormat::KINDS` name, no repeats;
/// `["bf16"]` when absent. Kept in `KINDS` order, so the digest does not depend on the file's.
fn parse_formats(
    formats: Option<Spanned<Vec<String>>>,
    fail: &Fail,
) -> Result<Vec<&'static str>, CircuitError> {
    let Some(f) = formats else {
        return Ok(vec!["bf16"]);
    };
    let start = f.span().start;
    let names = f.into_inner();
    if names.is_empty() {
        return Err(fail(
            start,
            "`formats` is empty: the rule could read no weight (omit it for [\"bf16\"])"
                .to_string(),
        ));
    }
    for (i, name) in names.iter().enumerate() {
        if !WeightFormat::KINDS.contains(&name.as_str()) {
            return Err(fail(
                start,
                format!(
                    "unknown weight format `{name}` in `formats` (known: {})",
                    WeightFormat::KINDS.join(", ")
                ),
            ));
        }
        if names[..i].contains(name) {
            return Err(fail(start, format!("`formats` lists `{name}` twice")));
        }
    }
    Ok(WeightFormat::KINDS
        .into_iter()
        .filter(|k| names.iter().any(|n| n == k))
        .collect())
}

fn parse_numerics(value: &toml::Value) -> Result<Numerics, String> {
    match value {
        toml::Value::String(s) if s == "reference" => Ok(Numerics::Reference),
        toml::Value::String(s) if s == "bit_identical" => Ok(Numerics::BitIdentical),
        toml::Value::String(s) => Err(format!(
            "unknown numerics \"{s}\" (expected \"reference\", \"bit_identical\" or \
             {{ differs = \"<lever>\", tolerance = <rel>[, by_chunk = true] }})"
        )),
        toml::Value::Table(t) => {
            let lever = t
                .get("differs")
                .and_then(|v| v.as_str())
                .ok_or_else(|| "numerics table needs `differs = \"<lever>\"`".to_string())?;
            let tolerance = match t.get("tolerance") {
                Some(toml::Value::Float(f)) if *f > 0.0 && f.is_finite() => *f,
                _ => return Err("numerics `differs` needs `tolerance = <positive float>`".into()),
            };
            let by_chunk = match t.get("by_chunk") {
                None => false,
                Some(toml::Value::Boolean(b)) => *b,
                Some(_) => return Err("numerics `by_chunk` must be true or false".into()),
            };
            if let Some(extra) = t
                .keys()
                .find(|k| !["differs", "tolerance", "by_chunk"].contains(&k.as_str()))
            {
                return Err(format!("unknown numerics field `{extra}`"));
            }
            if !Levers::is_known(lever) {
                return Err(format!("numerics `differs` names unknown lever `{lever}`"));
            }
            Ok(Numerics::Differs {
                lever: lever.to_string(),
                tolerance,
                by_chunk,
            })
        }
        other => Err(format!(
            "numerics must be \"reference\", \"bit_identical\" or {{ differs = \"<lever>\", \
             tolerance = <rel> }}, got a {}",
            other.type_str()
        )),
    }
}

fn is_kernel_name(name: &str) -> bool {
    let ident = |s: &str| {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    match name.split_once("::") {
        Some((module, func)) => ident(module) && ident(func),
        None => false,
    }
}
