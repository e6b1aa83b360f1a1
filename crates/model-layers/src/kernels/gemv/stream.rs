//! gemv's streaming entries (`gemv_stream` in gemv.cu): which entry a launch uses (`entry`,
//! by rows and the `gemv_classic` lever) and its launch shape (`stream_config`). Each entry is
//! a variant of its classic kernel (`kernels::variants`): the same arguments, twin and bytes.

use solder_gpu_runtime::LaunchConfig;

/// Output features per block (one warp each).
pub(super) const FEATURES_PER_BLOCK: u32 = 8;
/// Input rows per block.
pub(super) const ROWS_PER_BLOCK: u32 = 8;
/// The most blocks `grid.y` may hold.
pub(super) const MAX_GRID_Y: u64 = 65_535;

/// The lever that keeps the classic entries (A/B timing; the same bytes).
pub const GEMV_CLASSIC: &str = "gemv_classic";

/// The most blocks a streaming launch has (grid.x · grid.y) when k fits the stage: 8 per SM
/// of a 132-SM H200. At the 2 blocks per SM the entries' registers allow (ptxas: 80–124 per
/// thread, `cargo xtask ptx --check`) that is 4 full waves, so the last wave's imbalance is at
/// most one block's share (1/1056 of the features), while x and the norm are staged 1056
/// times per launch instead of once per 8 features (the LM head's 16,032 classic blocks). The
/// grid function has no device facts: a device with fewer SMs runs more waves of the same
/// blocks.
const STREAM_BLOCKS: u64 = 1056;
/// Staged x elements per block, all rows together (`GEMV_STREAM_STAGE`, 32 KiB): k up to
/// 16384 / rows-per-block is staged whole, longer k in spans of that length.
const STREAM_STAGE: u32 = 16_384;

/// A streaming entry's rows per block: `_r1` (decode), `_r2`, `_r4`, `_r8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowTile {
    R1,
    R2,
    R4,
    R8,
}

impl RowTile {
    /// The smallest tile that holds `rows` rows (more than 8 rows: several blocks of 8).
    pub fn for_rows(rows: u32) -> RowTile {
        match rows {
            0 | 1 => RowTile::R1,
            2 => RowTile::R2,
            3 | 4 => RowTile::R4,
            _ => RowTile::R8,
        }
    }

    pub fn rows(self) -> u32 {
        match self {
            RowTile::R1 => 1,
            RowTile::R2 => 2,
            RowTile::R4 => 4,
            RowTile::R8 => 8,
        }
    }

    /// The position of this tile's entry in a `*_STREAM` table.
    pub fn index(self) -> usize {
        match self {
            RowTile::R1 => 0,
            RowTile::R2 => 1,
            RowTile::R4 => 2,
            RowTile::R8 => 3,
        }
    }
}

/// Which entry a gemv launch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// The classic kernel (`gemv::linear`): one block per 8 features and 8 rows.
    Classic,
    /// The streaming entry of this row tile (`gemv::linear_r1`, ...).
    Stream(RowTile),
}

/// The entry for `rows` rows: streaming by default, classic with the `gemv_classic` lever.
pub fn entry(classic: bool, rows: u32) -> Entry {
    if classic {
        Entry::Classic
    } else {
        Entry::Stream(RowTile::for_rows(rows))
    }
}

/// The x elements of one row a block of `tile` stages at once.
pub fn stage_elems(tile: RowTile) -> u32 {
    STREAM_STAGE / tile.rows()
}

/// Whether a block of `tile` stages all of k at once (else in spans, one feature per warp).
pub fn stages_whole(k: u32, tile: RowTile) -> bool {
    k <= stage_elems(tile)
}

/// A streaming launch: grid.x = row groups of the tile's rows, grid.y = feature blocks of 8
/// features (one per warp at a time), capped so grid.x · grid.y <= `STREAM_BLOCKS` when k fits
/// the stage; when it does not (k staged in spans), one block per 8 features, so each warp
/// owns one feature and no span is staged twice. At most 65535 along y (the kernel strides).
pub fn stream_config(features: u64, rows: u32, k: u32, tile: RowTile) -> LaunchConfig {
    let row_groups = rows.div_ceil(tile.rows()).max(1);
    let feature_blocks = features.div_ceil(FEATURES_PER_BLOCK as u64).max(1);
    let blocks = if !stages_whole(k, tile) {
        feature_blocks
    } else {
        feature_blocks.min((STREAM_BLOCKS / row_groups as u64).max(1))
    };
    LaunchConfig {
        grid: [row_groups, blocks.min(MAX_GRID_Y) as u32, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

/// `*_STREAM` tables (a kernel's streaming entries by `RowTile::index`) and `VARIANTS`.
macro_rules! streaming {
    ($( $konst:ident : $kind:ident = $name:literal; )+) => {
        $(
            #[doc = concat!("`", $name, "`'s streaming entries, by `RowTile::index`.")]
            pub const $konst: [Name<$kind>; 4] = [
                Name::new(concat!($name, "_r1")),
                Name::new(concat!($name, "_r2")),
                Name::new(concat!($name, "_r4")),
                Name::new(concat!($name, "_r8")),
            ];
        )+
        /// Every streaming entry with the kernel it is a variant of (same arguments, twin and
        /// bytes; another launch shape).
        pub(super) const VARIANTS: &[(&str, &str)] = &[
            $(
                (concat!($name, "_r1"), $name),
                (concat!($name, "_r2"), $name),
                (concat!($name, "_r4"), $name),
                (concat!($name, "_r8"), $name),
            )+
        ];
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_pick_the_smallest_tile_and_the_lever_the_classic_entry() {
        let tiles: Vec<u32> = (1..=9).map(|r| RowTile::for_rows(r).rows()).collect();
        assert_eq!(tiles, [1, 2, 4, 4, 8, 8, 8, 8, 8]);
        assert_eq!(entry(false, 1), Entry::Stream(RowTile::R1));
        assert_eq!(entry(false, 128), Entry::Stream(RowTile::R8));
        assert_eq!(entry(true, 1), Entry::Classic);
        assert_eq!(entry(true, 8), Entry::Classic);
    }

    #[test]
    fn the_grid_is_capped_when_k_fits_the_stage_and_one_feature_per_warp_when_it_does_not() {
        // Llama-3.2-1B's LM head at decode: 16,032 feature blocks, capped.
        let lm = stream_config(128_256, 1, 2048, RowTile::R1);
        assert_eq!(lm.grid, [1, STREAM_BLOCKS as u32, 1]);
        assert_eq!(lm.block, [256, 1, 1]);
        // q/k/v (3,072 features): 384 blocks, under the cap.
        assert_eq!(stream_config(3072, 1, 2048, RowTile::R1).grid, [1, 384, 1]);
        // 128 rows in 16 row groups share the cap.
        let wide = stream_config(128_256, 128, 2048, RowTile::R8);
        assert_eq!(wide.grid, [16, 66, 1]);
        // The down projection (k = 8192): staged whole up to 2 rows, in spans from 4 rows on,
        // where every warp owns one feature (one staging per span per block).
        assert_eq!(stream_config(2048, 2, 8192, RowTile::R2).grid, [1, 256, 1]);
        assert_eq!(stream_config(2048, 8, 8192, RowTile::R8).grid, [1, 256, 1]);
        assert_eq!(
            stream_config(600_000, 8, 8192, RowTile::R8).grid,
            [1, 65_535, 1]
        );
        // Degenerate shapes still launch one block, which returns.
        assert_eq!(stream_config(0, 0, 0, RowTile::R1).grid, [1, 1, 1]);
    }
}
