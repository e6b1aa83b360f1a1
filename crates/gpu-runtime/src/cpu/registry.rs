//! The CPU twins: registered by `module::func` name, visible as kernels once their module is
//! loaded.
//!
//! Invariants: a name is registered at most once; a [`KernelId`] indexes `kernels` and is only
//! handed out for a twin of a loaded module; modules are never unloaded, so an id stays valid.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::GpuError;
use crate::twin::TwinFn;
use crate::types::KernelId;

#[derive(Default)]
pub struct Registry {
    twins: BTreeMap<String, TwinFn>,
    loaded_modules: BTreeSet<String>,
    kernels: Vec<(String, TwinFn)>,
    by_name: HashMap<String, KernelId>,
}

/// Splits `module::func`, both parts non-empty identifiers.
fn split_name(name: &str) -> Option<(&str, &str)> {
    let (module, func) = name.split_once("::")?;
    let identifier = |part: &str| {
        !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    (identifier(module) && identifier(func)).then_some((module, func))
}

impl Registry {
    pub fn register(&mut self, name: &str, twin: TwinFn) -> Result<(), GpuError> {
        let Some((module, _)) = split_name(name) else {
            return Err(GpuError::Driver {
                call: "register_twin",
                message: format!("twin name `{name}` is not `module::func`"),
            });
        };
        if self.twins.contains_key(name) {
            return Err(GpuError::Driver {
                call: "register_twin",
                message: format!("a twin is already registered as `{name}`"),
            });
        }
        self.twins.insert(name.to_string(), twin);
        // A twin registered after its module was loaded is visible at once.
        if self.loaded_modules.contains(module) {
            self.make_visible(name, twin);
        }
        Ok(())
    }

    pub fn load_module(&mut self, module: &str) -> Result<(), GpuError> {
        let prefix = format!("{module}::");
        let twins: Vec<(String, TwinFn)> = self
            .twins
            .range(prefix.clone()..)
            .take_while(|(name, _)| name.starts_with(&prefix))
            .map(|(name, twin)| (name.clone(), *twin))
            .collect();
        if twins.is_empty() {
            return Err(GpuError::UnknownModule(module.to_string()));
        }
        self.loaded_modules.insert(module.to_string());
        for (name, twin) in twins {
            if !self.by_name.contains_key(&name) {
                self.make_visible(&name, twin);
            }
        }
        Ok(())
    }

    fn make_visible(&mut self, name: &str, twin: TwinFn) {
        let id = KernelId(self.kernels.len() as u32);
        self.kernels.push((name.to_string(), twin));
        self.by_name.insert(name.to_string(), id);
    }

    pub fn kernel(&self, name: &str) -> Result<KernelId, GpuError> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| GpuError::UnknownKernel(name.to_string()))
    }

    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.kernels.iter().map(|(name, _)| name.clone()).collect();
        names.sort();
        names
    }

    /// The name and twin of a loaded kernel.
    pub fn get(&self, id: KernelId) -> Result<(&str, TwinFn), GpuError> {
        self.kernels
            .get(id.0 as usize)
            .map(|(name, twin)| (name.as_str(), *twin))
            .ok_or(GpuError::UnknownHandle {
                what: "kernel",
                id: id.0,
            })
    }

    pub fn name(&self, id: KernelId) -> &str {
        self.kernels
            .get(id.0 as usize)
            .map_or("?", |(name, _)| name.as_str())
    }
}
