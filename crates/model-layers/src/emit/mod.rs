//! Emitting: one plan group → its launches. `emit_group` finds the group's emitter (declared
//! beside its kernel in `crate::kernels`, which sees the group through
//! `kernels::emit_view::View`) by the group's emitter kernel name in the registry, runs it over
//! the plan's `Bindings` and checks what it emitted.
//!
//! Invariants: a group emits exactly the kernels its rule names, in order (checked here; a
//! variant entry of a kernel, chosen at emit time by rows and levers, counts as the kernel);
//! every tensor the group keeps is passed to some launch (a kernel that cannot store a kept
//! intermediate is an error naming it, never a silently dropped output); every launch's grid
//! is within a CUDA launch's limits (an error naming the kernel, not a launch that fails on
//! the device).

use solder_circuit::Group;

use crate::bind::Bindings;
use crate::error::ExecError;
use crate::kernels::emit_view::View;
use crate::kernels::Launch;

/// The launches of `group` (run on `stream`), checked against its rule's kernel list.
pub fn emit_group(
    bind: &Bindings<'_>,
    group: &Group,
    stream: u8,
) -> Result<Vec<Launch>, ExecError> {
    let view = View::new(bind, group, stream);
    let emitter = group
        .emitter
        .as_deref()
        .unwrap_or(group.kernels[0].as_str());
    let decl = crate::kernels::decl(emitter)
        .ok_or_else(|| view.err(format!("no emitter for `{emitter}`")))?;
    let launches = (decl.emit)(&view)?;
    // A variant entry (gemv's streaming entries) stands for the kernel it is a variant of, and
    // a format entry (`gemv::linear_fp8`) for the kernel whose weight format it reads; a
    // variant of a format entry (`gemm::qkv_norm_rope_kv_mma_fp8`) for that entry's kernel.
    let names: Vec<&str> = launches
        .iter()
        .map(|l| {
            let entry = crate::kernels::variant_of(l.kernel).unwrap_or(l.kernel);
            crate::kernels::format_entry_of(entry).unwrap_or(entry)
        })
        .collect();
    if names != group.kernels.iter().map(String::as_str).collect::<Vec<_>>() {
        return Err(view.err(format!(
            "emitted {names:?}, the rule names {:?}",
            group.kernels
        )));
    }
    if let Some(l) = launches.iter().find(|l| !within_grid_limits(l.config.grid)) {
        return Err(view.err(format!(
            "`{}`'s grid {:?} is past a launch's limits (x at most {GRID_X_MAX}, y and z at \
             most {GRID_YZ_MAX})",
            l.kernel, l.config.grid
        )));
    }
    let passed = view.passed();
    for &t in &group.outputs {
        if !passed.contains(&t) {
            let name = &bind.circuit.tensor(t).name;
            return Err(view.err(format!(
                "the kernel cannot store `{name}`, which the plan keeps"
            )));
        }
    }
    Ok(launches)
}

/// The largest grid a CUDA launch takes: x up to 2³¹ − 1 blocks, y and z up to 65535.
const GRID_X_MAX: u32 = i32::MAX as u32;
const GRID_YZ_MAX: u32 = 65_535;

fn within_grid_limits([x, y, z]: [u32; 3]) -> bool {
    x <= GRID_X_MAX && y <= GRID_YZ_MAX && z <= GRID_YZ_MAX
}

#[cfg(test)]
mod tests {
    use super::within_grid_limits;
    use crate::kernels::gemm::gemm_grid;

    #[test]
    fn a_projections_grid_puts_its_row_blocks_on_x_and_is_refused_past_65535_feature_blocks() {
        // 512 rows × 4096 features: 8 row blocks side by side for each of 128 feature blocks.
        assert_eq!(gemm_grid(4096, 512).grid, [8, 128, 1]);
        assert_eq!(gemm_grid(0, 0).grid, [1, 1, 1]);
        assert!(within_grid_limits(gemm_grid(65_535 * 32, 8192).grid));
        assert!(!within_grid_limits(gemm_grid(65_535 * 32 + 1, 1).grid));
        assert!(within_grid_limits([i32::MAX as u32, 1, 1]));
        assert!(!within_grid_limits([1 << 31, 1, 1]));
        assert!(!within_grid_limits([1, 1, 65_536]));
    }
}
