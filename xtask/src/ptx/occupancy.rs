//! Occupancy on sm_90 from what ptxas and the PTX say: each kernel's registers and static
//! shared memory (ptxas -v), and its thread count (the PTX's `.maxntid`, from
//! `__launch_bounds__`). Limits per SM: 65,536 registers allocated in units of 256 per warp,
//! 228 KiB of shared memory with 1 KiB reserved per block, 64 warps, 32 blocks.
//!
//! A kernel that uses dynamic shared memory (an `.extern .shared` array its body names) is
//! marked: its launch adds bytes the table cannot know.

use std::collections::BTreeMap;

const REGISTERS_PER_SM: u32 = 65_536;
const REGISTER_UNIT_PER_WARP: u32 = 256;
const SHARED_PER_SM: u32 = 228 * 1024;
const SHARED_RESERVED_PER_BLOCK: u32 = 1024;
const WARPS_PER_SM: u32 = 64;
const BLOCKS_PER_SM: u32 = 32;

/// What one block of a kernel may keep resident per SM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupancy {
    pub blocks_per_sm: u32,
    pub warps_per_sm: u32,
    /// What bounds `blocks_per_sm`: registers, shared, warps or blocks.
    pub limiter: &'static str,
}

impl Occupancy {
    /// Resident warps over the SM's 64, in percent.
    pub fn percent(&self) -> f64 {
        100.0 * self.warps_per_sm as f64 / WARPS_PER_SM as f64
    }
}

/// Occupancy of a block of `threads` using `registers` per thread and `smem_bytes` of shared
/// memory; `None` for no threads.
pub fn occupancy(threads: u32, registers: u32, smem_bytes: u32) -> Option<Occupancy> {
    if threads == 0 {
        return None;
    }
    let warps = threads.div_ceil(32);
    let per_warp =
        (registers.max(1) * 32).div_ceil(REGISTER_UNIT_PER_WARP) * REGISTER_UNIT_PER_WARP;
    let by_registers = REGISTERS_PER_SM / per_warp / warps;
    let by_shared = SHARED_PER_SM / (smem_bytes + SHARED_RESERVED_PER_BLOCK);
    let by_warps = WARPS_PER_SM / warps;
    // On a tie the hardware caps (warps, blocks) are named: resources only bind below them.
    let (blocks, limiter) = [
        (by_warps, "warps"),
        (BLOCKS_PER_SM, "blocks"),
        (by_registers, "registers"),
        (by_shared, "shared"),
    ]
    .into_iter()
    .min_by_key(|(n, _)| *n)?;
    Some(Occupancy {
        blocks_per_sm: blocks,
        warps_per_sm: blocks * warps,
        limiter,
    })
}

/// Per `.entry` of one module's PTX: its `.maxntid` thread count (product of the three) and
/// whether its body names a dynamic shared array.
pub fn launch_bounds(ptx: &str) -> BTreeMap<String, (Option<u32>, bool)> {
    let dynamic: Vec<&str> = ptx
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".extern .shared "))
        .filter_map(|rest| rest.split_whitespace().last())
        .map(|name| name.trim_end_matches(';').trim_end_matches("[]"))
        .collect();
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in ptx.lines() {
        let line = line.trim();
        let rest = line
            .strip_prefix(".visible .entry ")
            .or_else(|| line.strip_prefix(".entry "));
        if let Some(rest) = rest {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            out.insert(name.clone(), (None, false));
            current = Some(name);
            continue;
        }
        let Some(entry) = current.as_ref().and_then(|n| out.get_mut(n)) else {
            continue;
        };
        if let Some(dims) = line.strip_prefix(".maxntid ") {
            let product = dims
                .split(',')
                .map(|d| d.trim().trim_end_matches(';').parse::<u32>().ok())
                .try_fold(1u32, |acc, d| d.map(|d| acc * d));
            entry.0 = product;
        } else if dynamic.iter().any(|d| line.contains(d)) {
            entry.1 = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupancy_by_hand() {
        // 256 threads = 8 warps. 134 registers: 134·32 = 4288 → 4352 per warp, 15 warps fit,
        // one block: registers bound it.
        let o = occupancy(256, 134, 0).unwrap();
        assert_eq!(
            (o.blocks_per_sm, o.warps_per_sm, o.limiter),
            (1, 8, "registers")
        );
        // 32 registers: 1024 per warp, 64 warps, 8 blocks of 8 warps (registers and warps tie;
        // the warp cap is named).
        let o = occupancy(256, 32, 0).unwrap();
        assert_eq!(
            (o.blocks_per_sm, o.warps_per_sm, o.limiter),
            (8, 64, "warps")
        );
        assert_eq!(o.percent(), 100.0);
        // 40 KiB of shared memory: 233,472 / 41,984 = 5 blocks.
        let o = occupancy(128, 32, 40 * 1024).unwrap();
        assert_eq!(
            (o.blocks_per_sm, o.warps_per_sm, o.limiter),
            (5, 20, "shared")
        );
        // 32 threads, few registers: the 32-block limit.
        let o = occupancy(32, 16, 0).unwrap();
        assert_eq!((o.blocks_per_sm, o.limiter), (32, "blocks"));
        // 1024 threads at 64 registers: 2048 per warp, 32 warps, one block.
        assert_eq!(occupancy(1024, 64, 0).unwrap().blocks_per_sm, 1);
        assert!(occupancy(0, 32, 0).is_none());
    }

    #[test]
    fn reads_maxntid_and_dynamic_shared_from_ptx() {
        let ptx = ".extern .shared .align 16 .b8 route_probs[];\n\
.visible .entry topk(\n\t.param .u64 topk_param_0\n)\n.maxntid 256, 1, 1\n{\n\tmov.u64 %rd1, route_probs;\n}\n\
.visible .entry down(\n\t.param .u64 down_param_0\n)\n.maxntid 128, 2, 1\n{\n\tret;\n}\n\
.visible .entry free(\n)\n{\n\tret;\n}\n";
        let bounds = launch_bounds(ptx);
        assert_eq!(bounds["topk"], (Some(256), true));
        assert_eq!(bounds["down"], (Some(256), false));
        assert_eq!(bounds["free"], (None, false));
    }
}
