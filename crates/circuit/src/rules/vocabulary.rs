//! The words a rule may use beyond op kinds: capabilities (`requires`) and op roles (`role`). A
//! misspelled one would otherwise make a rule match nothing, or never be allowed, without a word;
//! [`RuleSet::from_toml_str`](crate::RuleSet::from_toml_str) refuses any word outside solder's
//! vocabulary, and an engine with its own circuits or backend capabilities extends it
//! ([`with_roles`](Vocabulary::with_roles), [`with_capabilities`](Vocabulary::with_capabilities))
//! and parses with [`RuleSet::from_toml_str_in`](crate::RuleSet::from_toml_str_in).

use std::collections::BTreeSet;

use super::Rule;
use crate::error::CircuitError;
use crate::shapes::NO_SNAPSHOTS;

/// The capabilities and roles rules may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocabulary {
    pub capabilities: BTreeSet<String>,
    pub roles: BTreeSet<String>,
}

impl Vocabulary {
    /// solder's own: every runtime route's capability, a plan's [`NO_SNAPSHOTS`], and every
    /// role the families' circuits give their ops (`families::ROLES`).
    pub fn solder() -> Vocabulary {
        Vocabulary {
            capabilities: crate::routes::capabilities()
                .into_iter()
                .chain([NO_SNAPSHOTS])
                .map(str::to_string)
                .collect(),
            roles: crate::families::ROLES
                .iter()
                .map(|r| r.to_string())
                .collect(),
        }
    }

    pub fn with_capabilities<'a>(mut self, names: impl IntoIterator<Item = &'a str>) -> Self {
        self.capabilities
            .extend(names.into_iter().map(str::to_string));
        self
    }

    pub fn with_roles<'a>(mut self, names: impl IntoIterator<Item = &'a str>) -> Self {
        self.roles.extend(names.into_iter().map(str::to_string));
        self
    }

    /// Refuses the first word of `rules` outside this vocabulary, naming the file, the rule's
    /// line and id, the word and what is known.
    pub fn check(&self, rules: &[Rule], source: &str) -> Result<(), CircuitError> {
        for rule in rules {
            let unknown = |what: &str, word: &str, known: &BTreeSet<String>| {
                let known: Vec<&str> = known.iter().map(String::as_str).collect();
                CircuitError::Rules {
                    source_name: format!("{source}:{}", rule.line),
                    message: format!(
                        "rule `{}` names unknown {what} `{word}` (known: {})",
                        rule.id,
                        known.join(", ")
                    ),
                }
            };
            if let Some(c) = rule
                .requires
                .iter()
                .find(|c| !self.capabilities.contains(*c))
            {
                return Err(unknown("capability", c, &self.capabilities));
            }
            if let Some(role) = rule
                .pattern
                .iter()
                .filter_map(|e| e.role.as_ref())
                .find(|r| !self.roles.contains(*r))
            {
                return Err(unknown("role", role, &self.roles));
            }
        }
        Ok(())
    }
}
