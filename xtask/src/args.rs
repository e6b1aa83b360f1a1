//! A small flag parser: `--name value` and `--flag`, refusing anything unknown.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

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

    /// `--levers a,b`: the levers a build turns on (each refused unless `KNOWN_LEVERS` names
    /// it); none when the option is absent.
    pub fn levers(&self) -> Result<solder_config::Levers, String> {
        let mut levers = solder_config::Levers::default();
        for name in self.value("levers").into_iter().flat_map(|v| v.split(',')) {
            levers
                .set(name.trim(), true)
                .map_err(|e| format!("`--levers`: {e}"))?;
        }
        Ok(levers)
    }

    /// `--name N` where N must lie in `range` (each command's help gives the range): checked
    /// here, at parse time, so no count reaches an allocation unchecked.
    pub fn number_in(
        &self,
        name: &str,
        range: RangeInclusive<usize>,
    ) -> Result<Option<usize>, String> {
        let Some(v) = self.value(name) else {
            return Ok(None);
        };
        let n: usize = v.parse().map_err(|_| {
            format!(
                "`--{name}` wants a whole number in {}..={}, got `{v}`",
                range.start(),
                range.end()
            )
        })?;
        if !range.contains(&n) {
            return Err(format!(
                "`--{name}` must lie in {}..={}, got {n}",
                range.start(),
                range.end()
            ));
        }
        Ok(Some(n))
    }

    /// `--name X` for a real number in `range` (finite: NaN and infinities are refused).
    pub fn real_in(&self, name: &str, range: RangeInclusive<f64>) -> Result<Option<f64>, String> {
        let Some(v) = self.value(name) else {
            return Ok(None);
        };
        let x: f64 = v
            .parse()
            .map_err(|_| format!("`--{name}` wants a number, got `{v}`"))?;
        // `contains` is false for NaN, so NaN is refused here without an ordering trick.
        if !x.is_finite() || !range.contains(&x) {
            return Err(format!(
                "`--{name}` must lie in {}..={}, got `{v}`",
                range.start(),
                range.end()
            ));
        }
        Ok(Some(x))
    }
}

/// The CPU backend's `--threads` (every command that takes it).
pub const THREADS: RangeInclusive<usize> = 1..=1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pairs: &[&str]) -> Args {
        let argv = pairs.iter().map(|s| s.to_string()).collect();
        Args::parse(argv, &["tokens", "x"], &[]).unwrap()
    }

    #[test]
    fn a_number_near_u64_max_is_refused_by_flag() {
        let a = args(&["--tokens", "18446744073709551615"]);
        let e = a.number_in("tokens", 2..=4096).unwrap_err();
        assert!(e.contains("--tokens") && e.contains("2..=4096"), "{e}");
        let a = args(&["--tokens", "99999999999999999999999"]);
        assert!(a
            .number_in("tokens", 2..=4096)
            .unwrap_err()
            .contains("--tokens"));
    }

    #[test]
    fn the_range_ends_are_inclusive() {
        assert_eq!(
            args(&["--tokens", "2"]).number_in("tokens", 2..=9),
            Ok(Some(2))
        );
        assert_eq!(
            args(&["--tokens", "9"]).number_in("tokens", 2..=9),
            Ok(Some(9))
        );
        assert!(args(&["--tokens", "1"]).number_in("tokens", 2..=9).is_err());
        assert!(args(&["--tokens", "-1"])
            .number_in("tokens", 2..=9)
            .is_err());
        assert_eq!(args(&[]).number_in("tokens", 2..=9), Ok(None));
    }

    #[test]
    fn reals_refuse_nan_and_infinity() {
        for bad in ["NaN", "inf", "-inf", "0", "1e300"] {
            let e = args(&["--x", bad]).real_in("x", 0.01..=3600.0).unwrap_err();
            assert!(e.contains("--x"), "{bad}: {e}");
        }
        assert_eq!(
            args(&["--x", "2.5"]).real_in("x", 0.01..=3600.0),
            Ok(Some(2.5))
        );
    }
}
