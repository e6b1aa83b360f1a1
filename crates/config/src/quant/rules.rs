//! How each key inside `quantization_config` is checked, for every method's reader (`parse`,
//! `compressed`): a table of keys used or ignored with a reason, and the keys that must hold one
//! value or be off. Every refusal names `quantization_config.<key>`.

use serde_json::{json, Value};

use crate::fields::Fields;
use crate::{ConfigError, KeyClass, KeyReport};

/// How a key inside `quantization_config` is treated.
#[derive(Clone, Copy)]
pub(super) enum Rule {
    Used,
    Ignored(&'static str),
}

/// Checks every key of `block` against `table`, appending each one's report; an unknown key
/// refuses the load, naming it and the method.
pub(super) fn classify(
    block: &Fields<'_>,
    table: &[(&str, Rule)],
    method: &str,
    reports: &mut Vec<KeyReport>,
) -> Result<(), ConfigError> {
    for key in block.keys() {
        let Some((_, rule)) = table.iter().find(|(name, _)| *name == key) else {
            return Err(ConfigError::UnknownKey {
                file: block.file().to_string(),
                key: block.key_name(key),
                family: format!("quant_method `{method}`"),
            });
        };
        let class = match rule {
            Rule::Used => KeyClass::Used,
            Rule::Ignored(reason) => KeyClass::Ignored(reason),
        };
        reports.push(KeyReport {
            key: block.key_name(key),
            class,
        });
    }
    Ok(())
}

/// A string key that must be one of `allowed` (`default` when absent or null).
pub(super) fn one_of<'a>(
    block: &Fields<'a>,
    key: &str,
    default: &'a str,
    allowed: &[&str],
    reason: &str,
) -> Result<&'a str, ConfigError> {
    let value = block.opt_str(key)?.unwrap_or(default);
    if allowed.contains(&value) {
        Ok(value)
    } else {
        Err(block.unsupported(key, &json!(value), reason))
    }
}

/// A boolean key that must equal `wanted` when given.
pub(super) fn must_be(
    block: &Fields<'_>,
    key: &str,
    wanted: bool,
    reason: &str,
) -> Result<(), ConfigError> {
    match block.opt_bool(key)? {
        Some(value) if value != wanted => Err(block.unsupported(key, &json!(value), reason)),
        _ => Ok(()),
    }
}

/// A key that must be off: absent, null, false, or an empty object or array.
pub(super) fn must_be_unset(
    block: &Fields<'_>,
    key: &str,
    reason: &str,
) -> Result<(), ConfigError> {
    match block.value(key) {
        None | Some(Value::Bool(false)) => Ok(()),
        Some(Value::Object(map)) if map.is_empty() => Ok(()),
        Some(Value::Array(items)) if items.is_empty() => Ok(()),
        Some(value) => Err(block.unsupported(key, value, reason)),
    }
}
