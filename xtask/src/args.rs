//! A small flag parser: `--name value` and `--flag`, refusing anything unknown.

use std::collections::BTreeMap;

pub struct Args {
    values: BTreeMap<String, String>,
    flags: Vec<String>,
}

impl Args {
    /// `valued` take a value, `switches` do not; anything else is an error.
    pub fn parse(argv: Vec<String>, valued: &[&str], switches: &[&str]) -> Result<Args, String> {
        let mut values = BTreeMap::new();
        let mut flags = Vec::new();
        let mut it = argv.into_iter();
        while let Some(arg) = it.next() {
            let name = arg
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument `{arg}`"))?;
            if valued.contains(&name) {
                let value = it
                    .next()
                    .ok_or_else(|| format!("`--{name}` needs a value"))?;
                values.insert(name.to_string(), value);
            } else if switches.contains(&name) {
                flags.push(name.to_string());
            } else {
                return Err(format!("unknown option `--{name}`"));
            }
        }
        Ok(Args { values, flags })
    }

    pub fn value(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    pub fn number(&self, name: &str) -> Result<Option<usize>, String> {
        self.value(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("`--{name}` wants a number, got `{v}`"))
            })
            .transpose()
    }
}
