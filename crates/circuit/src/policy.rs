//! What a build may use: which rules ([`Fusions`]), which levers, how many streams ([`Policy`]),
//! and which kernels and capabilities the backend offers ([`Available`]).

use std::collections::BTreeSet;

use solder_config::Levers;

use crate::rules::RuleSet;

/// Which rules a build applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fusions {
    /// Every rule allowed by mode, rows, policy and kernels.
    All,
    /// Only `reference` rules: the routing every other plan is compared against.
    ReferenceOnly,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub fusions: Fusions,
    pub levers: Levers,
    /// Streams a plan may use; 1 puts everything on the model's stream.
    pub max_streams: usize,
    /// A rule the build would apply but whose kernel the backend lacks is skipped (logged)
    /// instead of refused (`CircuitError::MissingKernel`). Off by default: a missing kernel
    /// silently costs launches otherwise.
    pub skip_missing_kernels: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            fusions: Fusions::All,
            levers: Levers::default(),
            max_streams: 2,
            skip_missing_kernels: false,
        }
    }
}

impl Policy {
    pub fn reference_only() -> Policy {
        Policy {
            fusions: Fusions::ReferenceOnly,
            ..Policy::default()
        }
    }
}

/// The kernels the loaded modules contain and the backend's capabilities.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Available {
    pub kernels: BTreeSet<String>,
    pub capabilities: BTreeSet<String>,
}

impl Available {
    /// Every kernel the rules name, no capabilities: what a backend with a full kernel set
    /// offers (the CPU backend registers a twin for each).
    pub fn all_kernels(rules: &RuleSet) -> Available {
        let kernels = rules
            .rules
            .iter()
            .flat_map(|r| r.kernels.iter().cloned())
            .collect();
        Available {
            kernels,
            capabilities: BTreeSet::new(),
        }
    }

    pub fn with_capability(mut self, capability: &str) -> Available {
        self.capabilities.insert(capability.to_string());
        self
    }
}
