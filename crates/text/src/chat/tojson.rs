//! Python's `json.dumps` over template values, as transformers' `tojson` filter calls it:
//! separators `", "` and `": "` (`","` between items when indented), non-ASCII kept unless
//! `ensure_ascii`, keys in the value's order unless `sort_keys`, floats as Python's `repr`.
//! Undefined values are refused (Python cannot serialise jinja2's `Undefined` either).

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// `json.dumps`' options that templates pass.
pub struct Style {
    pub indent: Option<usize>,
    pub ensure_ascii: bool,
    pub sort_keys: bool,
}

/// `json.dumps(value, ...)`.
pub fn dumps(value: &Value, style: &Style) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, style, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson of an undefined value",
            ))
        }
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match value.as_i64() {
            Some(int) if value.is_integer() => out.push_str(&int.to_string()),
            _ => out.push_str(&python_float(f64::try_from(value.clone())?)),
        },
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style),
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort();
            }
            let mut items = Vec::with_capacity(keys.len());
            for key in keys {
                let mut item = String::new();
                let text = match key.as_str() {
                    Some(s) => s.to_string(),
                    None => dumps(&key, style)?,
                };
                write_string(&mut item, &text, style);
                item.push_str(": ");
                write_value(&mut item, &value.get_item(&key)?, style, depth + 1)?;
                items.push(item);
            }
            write_items(out, ('{', '}'), &items, style, depth);
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let mut items = Vec::new();
            for item in value.try_iter()? {
                let mut text = String::new();
                write_value(&mut text, &item, style, depth + 1)?;
                items.push(text);
            }
            write_items(out, ('[', ']'), &items, style, depth);
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson cannot serialise a value of kind {other}"),
            ))
        }
    }
    Ok(())
}

/// `[a, b]` or, indented, one item per line.
fn write_items(
    out: &mut String,
    (open, close): (char, char),
    items: &[String],
    style: &Style,
    depth: usize,
) {
    out.push(open);
    match style.indent {
        _ if items.is_empty() => {}
        None => out.push_str(&items.join(", ")),
        Some(indent) => {
            let inner = format!("\n{}", " ".repeat(indent * (depth + 1)));
            out.push_str(&inner);
            out.push_str(&items.join(&format!(",{inner}")));
            out.push('\n');
            out.push_str(&" ".repeat(indent * depth));
        }
    }
    out.push(close);
}

/// A JSON string as Python writes it: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other
/// control characters as `\u00XX`, and with `ensure_ascii` every non-ASCII character as
/// `\uXXXX` (UTF-16 surrogate pairs past the BMP).
fn write_string(out: &mut String, s: &str, style: &Style) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (style.ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr` of a float: shortest round-trip digits, `1.0` not `1`, exponents as
/// `1e+16` and `1e-05` (at least two digits), `NaN` and `Infinity` as `json.dumps` writes
/// them.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let magnitude = x.abs();
    if x == 0.0 || (1e-4..1e16).contains(&magnitude) {
        // Rust's Debug is the shortest round-trip text with a `.0` on whole numbers.
        return format!("{x:?}");
    }
    let text = format!("{x:e}");
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let (sign, digits) = match exponent.strip_prefix('-') {
        Some(digits) => ('-', digits),
        None => ('+', exponent),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain() -> Style {
        Style {
            indent: None,
            ensure_ascii: false,
            sort_keys: false,
        }
    }

    #[test]
    fn floats_read_as_python_repr() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.1), "0.1");
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(1.5e-7), "1.5e-07");
        assert_eq!(python_float(-2.5), "-2.5");
    }

    #[test]
    fn nested_values_use_python_separators() {
        let value = Value::from_pairs([
            ("b", Value::from(vec![Value::from(1), Value::from("é\n")])),
            ("a", Value::from(())),
        ]);
        // Insertion order, as Python dicts keep it; sorted on request.
        assert_eq!(
            dumps(&value, &plain()).unwrap(),
            r#"{"b": [1, "é\n"], "a": null}"#
        );
        let sorted = Style {
            sort_keys: true,
            ..plain()
        };
        assert_eq!(
            dumps(&value, &sorted).unwrap(),
            r#"{"a": null, "b": [1, "é\n"]}"#
        );
        let ascii = Style {
            ensure_ascii: true,
            ..plain()
        };
        assert_eq!(
            dumps(&Value::from("é😀"), &ascii).unwrap(),
            r#""\u00e9\ud83d\ude00""#
        );
        let indented = Style {
            indent: Some(2),
            ..plain()
        };
        assert_eq!(
            dumps(
                &Value::from(vec![Value::from(1), Value::from(2)]),
                &indented
            )
            .unwrap(),
            "[\n  1,\n  2\n]"
        );
        assert_eq!(
            dumps(&Value::from(Vec::<Value>::new()), &indented).unwrap(),
            "[]"
        );
    }
}
