//! Duplicate keys in a JSON document. serde_json (like most parsers) keeps the last of two
//! equal keys in one object without a word, so a `config.json` or a safetensors header that
//! names `vocab_size` or a tensor twice would load whichever came last. [`first_duplicate`]
//! walks the document once, without building it, and refuses the first key seen twice in
//! one object, naming it; the callers run it before they parse.
//!
//! Invariant: it accepts exactly the documents serde_json accepts that have no object with
//! two equal keys; its recursion is serde_json's own (depth-limited to 128).

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Ok if `text` is JSON with no object holding a key twice; else serde_json's error (with its
/// line and column) whose message names the key, or the syntax error.
pub fn first_duplicate(text: &[u8]) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(text);
    Walk.deserialize(&mut de)?;
    de.end()
}

/// One JSON value, walked: every object's keys checked, nothing kept.
#[derive(Clone, Copy)]
struct Walk;

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Walk)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format_args!(
                    "duplicate key `{key}` in one object (a second value would silently replace \
                     the first)"
                )));
            }
            map.next_value_seed(Walk)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::first_duplicate;

    #[test]
    fn duplicates_are_named_at_any_depth() {
        first_duplicate(br#"{"a": 1, "b": {"a": [1, {"c": null}]}, "d": "x"}"#).unwrap();
        let top = first_duplicate(br#"{"vocab_size": 1, "vocab_size": 2}"#).unwrap_err();
        assert!(top.to_string().contains("`vocab_size`"), "{top}");
        let deep = first_duplicate(br#"{"a": [{"x": 1, "x": 1}]}"#).unwrap_err();
        assert!(deep.to_string().contains("`x`"), "{deep}");
        assert!(first_duplicate(b"{\"a\": 1} trailing").is_err());
        assert!(first_duplicate(b"{\"a\": ").is_err());
    }
}
