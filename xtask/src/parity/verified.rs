//! The plan verifier in parity, which release builds skip by default.
//!
//! `CircuitExec::build` plans with the default `BuildOptions`, so parity rebuilds the plan of
//! every program the exec holds (primaries and route arms) with the verifier on after every
//! pass, from the same instance, rules, policy and kernels, and requires the program's plan
//! digest. Invariant: every program parity compares comes from a plan the verifier passed.

use solder_circuit::{Available, BuildOptions, ExecutionPlan, Policy, RuleSet};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::CircuitExec;

/// Verifies the plan of each of `exec`'s programs; returns how many were verified.
pub fn verify_exec_plans(
    exec: &CircuitExec,
    rules: &RuleSet,
    policy: &Policy,
    backend: &dyn GpuBackend,
) -> Result<usize, String> {
    // What `CircuitExec::build` offers the fuser: the backend's kernels, no capabilities.
    let available = Available {
        kernels: backend.kernel_names().into_iter().collect(),
        ..Available::default()
    };
    let circuit = &exec.instance.circuit.name;
    let mut verified = 0;
    for program in exec.programs().iter().chain(exec.arms()) {
        let offered = match program.arm {
            Some(condition) => available.clone().with_capability(condition.capability()),
            None => available.clone(),
        };
        let what = match program.arm {
            Some(condition) => format!(
                "{circuit} {} rows={} (route arm {})",
                program.mode,
                program.rows,
                condition.capability()
            ),
            None => format!("{circuit} {} rows={}", program.mode, program.rows),
        };
        let plan = ExecutionPlan::build_with(
            &exec.instance,
            rules,
            &offered,
            policy,
            program.mode,
            program.rows,
            BuildOptions { verify: true },
        )
        .map_err(|e| format!("{what}: the plan verifier: {e}"))?;
        if plan.digest != program.plan_digest {
            return Err(format!(
                "{what}: the verified plan has digest {} but the exec's program {}: \
                 the exec planned with other inputs than parity verified",
                &plan.digest[..16],
                &program.plan_digest[..16]
            ));
        }
        verified += 1;
    }
    Ok(verified)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::builtin_named;
    use crate::parity::case::{random_prompt, Case, Weights};
    use crate::parity::execs::build_exec;

    /// The tiny qwen3_next model: its multi-seq programs have route arms.
    fn next_case() -> Case {
        let builtin = builtin_named("tiny-qwen3-next").unwrap();
        let config = builtin.config().unwrap();
        let prompt = random_prompt(builtin.seed, config.vocab_size, 4);
        Case {
            name: builtin.name.to_string(),
            config,
            weights: Weights::Random { seed: builtin.seed },
            prompt,
            golden: None,
            max_batch: None,
            levers: Default::default(),
        }
    }

    #[test]
    fn every_program_and_route_arm_is_verified() {
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
        let rules =
            RuleSet::from_file(&crate::paths::workspace_root().join("fusions/FUSIONS.toml"))
                .unwrap();
        let exec = build_exec(&next_case(), &rules, &mut backend, Policy::default()).unwrap();
        assert!(!exec.arms().is_empty(), "the case must exercise route arms");
        let verified = verify_exec_plans(&exec, &rules, &Policy::default(), &backend).unwrap();
        assert_eq!(verified, exec.programs().len() + exec.arms().len());
    }

    #[test]
    fn a_plan_other_than_the_exec_ran_is_refused() {
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
        let rules =
            RuleSet::from_file(&crate::paths::workspace_root().join("fusions/FUSIONS.toml"))
                .unwrap();
        let exec = build_exec(&next_case(), &rules, &mut backend, Policy::default()).unwrap();
        // Verifying under the reference policy rebuilds different plans than the exec holds.
        let error =
            verify_exec_plans(&exec, &rules, &Policy::reference_only(), &backend).unwrap_err();
        assert!(error.contains("decode rows=1"), "{error}");
        assert!(error.contains("the verified plan has digest"), "{error}");
    }
}
