//! The functions and filters Hugging Face chat templates call beyond Jinja's builtins, as
//! transformers defines them: `raise_exception(message)` (fails the render with the
//! message), `strftime_now(format)` (the time now, UTC here: no time-zone database is
//! read), the `tojson` filter (Python's `json.dumps`, not minijinja's HTML-safe one), and
//! Python's string and dict methods (`.strip()`, `.startswith()`, `.items()`, ... through
//! minijinja-contrib's `pycompat`).

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};

/// Adds the functions, the filter and the method fallback to `env`.
pub fn install(env: &mut Environment<'_>) {
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("the template raised an exception: {message}"),
    ))
}

fn strftime_now(format: String) -> Result<Value, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    super::clock::strftime(&format, now.as_secs() as i64)
        .map(Value::from)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
}

/// `x | tojson(indent=None, ensure_ascii=False, sort_keys=False)`: transformers' filter.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let style = super::tojson::Style {
        indent,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    super::tojson::dumps(value, &style).map(Value::from)
}
