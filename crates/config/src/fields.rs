//! Typed reads of one JSON object's keys. Every error names the file and the full key path
//! (`rope_scaling.factor`, not `factor`), and says which JSON type was expected.

use serde_json::{Map, Value};

use crate::bounds::dim_bound;
use crate::ConfigError;

/// One JSON object of a config file, read key by key.
pub(crate) struct Fields<'a> {
    file: &'a str,
    /// `""` at the top level, `"rope_scaling."` inside a nested object.
    prefix: String,
    map: &'a Map<String, Value>,
}

/// A short description of a JSON value for "found ..." in messages.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(_) => format!("string {value}"),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

impl<'a> Fields<'a> {
    pub(crate) fn new(file: &'a str, prefix: &str, map: &'a Map<String, Value>) -> Self {
        Fields {
            file,
            prefix: prefix.to_string(),
            map,
        }
    }

    pub(crate) fn file(&self) -> &'a str {
        self.file
    }

    /// The key as messages name it, with its parent object's prefix.
    pub(crate) fn key_name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &'a str> {
        self.map.keys().map(String::as_str)
    }

    /// The value of `key`; `null` reads as absent, as transformers reads `None` as "use the
    /// default".
    pub(crate) fn value(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn missing(&self, key: &str) -> ConfigError {
        ConfigError::MissingKey {
            file: self.file.to_string(),
            key: self.key_name(key),
        }
    }

    pub(crate) fn wrong_type(
        &self,
        key: &str,
        expected: &'static str,
        found: &Value,
    ) -> ConfigError {
        ConfigError::WrongType {
            file: self.file.to_string(),
            key: self.key_name(key),
            expected,
            found: describe(found),
        }
    }

    pub(crate) fn unsupported(
        &self,
        key: &str,
        value: &Value,
        reason: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Unsupported {
            file: self.file.to_string(),
            key: self.key_name(key),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid(
        &self,
        key: &str,
        value: impl ToString,
        expected: impl Into<String>,
    ) -> ConfigError {
        ConfigError::InvalidValue {
            file: self.file.to_string(),
            key: self.key_name(key),
            value: value.to_string(),
            expected: expected.into(),
        }
    }

    /// A required key: absent is "missing", `null` is a type error.
    fn required(&self, key: &str, expected: &'static str) -> Result<&'a Value, ConfigError> {
        match self.map.get(key) {
            None => Err(self.missing(key)),
            Some(Value::Null) => Err(self.wrong_type(key, expected, &Value::Null)),
            Some(value) => Ok(value),
        }
    }

    /// Every integer read goes through here, so every dimension key meets its bound
    /// (`bounds::DIM_BOUNDS`) wherever it is read.
    fn as_usize(&self, key: &str, value: &Value) -> Result<usize, ConfigError> {
        const EXPECTED: &str = "a non-negative integer";
        let n = value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.wrong_type(key, EXPECTED, value))?;
        self.bounded(key, n)
    }

    fn as_f64(&self, key: &str, value: &Value) -> Result<f64, ConfigError> {
        value
            .as_f64()
            .ok_or_else(|| self.wrong_type(key, "a number", value))
    }

    pub(crate) fn req_usize(&self, key: &str) -> Result<usize, ConfigError> {
        let value = self.required(key, "a non-negative integer")?;
        self.as_usize(key, value)
    }

    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        self.value(key).map(|v| self.as_usize(key, v)).transpose()
    }

    pub(crate) fn req_f64(&self, key: &str) -> Result<f64, ConfigError> {
        let value = self.required(key, "a number")?;
        self.as_f64(key, value)
    }

    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        self.value(key).map(|v| self.as_f64(key, v)).transpose()
    }

    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        self.value(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.wrong_type(key, "a boolean", v))
            })
            .transpose()
    }

    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        self.value(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.wrong_type(key, "a string", v))
            })
            .transpose()
    }

    pub(crate) fn req_str(&self, key: &str) -> Result<&'a str, ConfigError> {
        let value = self.required(key, "a string")?;
        value
            .as_str()
            .ok_or_else(|| self.wrong_type(key, "a string", value))
    }

    /// A nested object, read with this key as the prefix of its own keys.
    pub(crate) fn opt_object(&self, key: &str) -> Result<Option<Fields<'a>>, ConfigError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Fields {
                file: self.file,
                prefix: format!("{}.", self.key_name(key)),
                map,
            })),
            Some(other) => Err(self.wrong_type(key, "an object", other)),
        }
    }

    /// An array of strings (`architectures`, `layer_types`).
    pub(crate) fn opt_str_array(&self, key: &str) -> Result<Option<Vec<&'a str>>, ConfigError> {
        const EXPECTED: &str = "an array of strings";
        let Some(value) = self.value(key) else {
            return Ok(None);
        };
        let items = value
            .as_array()
            .ok_or_else(|| self.wrong_type(key, EXPECTED, value))?;
        items
            .iter()
            .map(|item| {
                item.as_str()
                    .ok_or_else(|| self.wrong_type(key, EXPECTED, value))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An array of non-negative integers (`mlp_only_layers`).
    pub(crate) fn opt_usize_array(&self, key: &str) -> Result<Option<Vec<usize>>, ConfigError> {
        const EXPECTED: &str = "an array of non-negative integers";
        let Some(value) = self.value(key) else {
            return Ok(None);
        };
        let items = value
            .as_array()
            .ok_or_else(|| self.wrong_type(key, EXPECTED, value))?;
        items
            .iter()
            .map(|item| {
                item.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.wrong_type(key, EXPECTED, value))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// `value` of `key`, refused when above the key's bound.
    pub(crate) fn bounded(&self, key: &str, value: usize) -> Result<usize, ConfigError> {
        match dim_bound(key) {
            Some(b) if value > b.max => Err(ConfigError::OutOfBounds {
                file: self.file().to_string(),
                key: self.key_name(key),
                value: value.to_string(),
                max: b.max,
                reason: b.reason,
            }),
            _ => Ok(value),
        }
    }

    /// A float the kernels read as f32 and that must be positive: finite, above 0, and a normal
    /// f32 (1e-50 rounds to 0 and 1e39 to infinity; subnormals flush to 0 on the GPU).
    pub(crate) fn positive_f32(&self, key: &str, value: f64) -> Result<f64, ConfigError> {
        if !(value.is_finite() && value > 0.0) {
            return Err(self.invalid(key, value, "a finite positive number"));
        }
        if !(value as f32).is_normal() {
            return Err(self.invalid(
                key,
                value,
                format!(
                    "a positive number that f32 holds (it rounds to {}; f32 spans {:e}..{:e})",
                    value as f32,
                    f32::MIN_POSITIVE,
                    f32::MAX
                ),
            ));
        }
        Ok(value)
    }
}
