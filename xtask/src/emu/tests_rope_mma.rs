//! `gemm::qkv_rope_kv_mma` (q/k/v on the tensor cores, rope and the KV write in the epilogue)
//! under the host emulation: the CUDA source writes its twin's bytes (shadow mode) in every
//! head layout (rotary halves that are and are not a multiple of the 16-feature rope blocks,
//! partial rotary with pass-through features, GQA, one row, a partial and a second row tile,
//! the scalar staging of k off 8), the slots no row takes left alone, and so do its fp8 and
//! int4 entries (each weight in its own blocks or group); with qk-norm too (one block per head,
//! up to the 256-wide head the stage holds), and gated (Qwen3-Next: q's weight holding each
//! head's `[q | gate]`, the gate half stored, zero-centred qk-norm); a kernel that ropes a pair
//! with its values swapped differs, and so do one that norms k with q's weights, one that
//! norms a gated head with plain weights and one that stores a gate's features reversed (the
//! checks can fail); NaN and ±inf carry as the twin carries them. The `_large` entries (lever
//! `mma_large`: 128 rows × 32 rotary pairs a block; with qk-norm a head's 128 rows staged)
//! write their twin's bytes too in every layout, over one, two and three row blocks; one whose
//! second four warps rope the first four's pairs differs, and so does a qk-norm one that
//! stages one m fragment of each warp's rows. A qk-norm launch of any tile that asks for half
//! its stage's dynamic shared memory fails, naming the bytes.

use solder_circuit::WeightFormat;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::kernels::gemm::{
    qkv_rope_kv_large_grid, QkvRopeKvParts, QkvTile, QKV_GATED_NORM_ZC_ROPE_KV_MMA,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8, QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_LARGE,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_NARROW, QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_LARGE, QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_NARROW,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE, QKV_GATED_NORM_ZC_ROPE_KV_MMA_NARROW,
    QKV_NORM_ROPE_KV_MMA, QKV_NORM_ROPE_KV_MMA_FP8, QKV_NORM_ROPE_KV_MMA_FP8_LARGE,
    QKV_NORM_ROPE_KV_MMA_FP8_NARROW, QKV_NORM_ROPE_KV_MMA_INT4, QKV_NORM_ROPE_KV_MMA_INT4_LARGE,
    QKV_NORM_ROPE_KV_MMA_INT4_NARROW, QKV_NORM_ROPE_KV_MMA_LARGE, QKV_NORM_ROPE_KV_MMA_NARROW,
    QKV_ROPE_KV_MMA, QKV_ROPE_KV_MMA_FP8, QKV_ROPE_KV_MMA_FP8_LARGE, QKV_ROPE_KV_MMA_FP8_NARROW,
    QKV_ROPE_KV_MMA_INT4, QKV_ROPE_KV_MMA_INT4_LARGE, QKV_ROPE_KV_MMA_INT4_NARROW,
    QKV_ROPE_KV_MMA_LARGE, QKV_ROPE_KV_MMA_NARROW,
};
use solder_model_layers::kernels::{Buf, Launch};
use solder_model_layers::numerics::dequant::quantize_matrix;

use super::tests::{arg_buf, bf16_nans, emulated, run, upload};
use super::tests_mutation::{assert_caught, build_mutant, values};
use super::tests_nan::{bf16_bytes, rows_of};
use super::tests_quant::matrix;

/// (rows, k, heads, kv_heads, head_dim, rotary_dim).
type Shape = (u32, u32, u32, u32, u32, u32);

const BLOCK_SIZE: u32 = 4;

/// The entry's layout: rope blocks, qk-norm's one block per head, or that with a gated q and
/// zero-centred qk-norm weights.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    Rope,
    Norm,
    Gated,
}

const LAYOUTS: [Layout; 3] = [Layout::Rope, Layout::Norm, Layout::Gated];

/// The launch over x (`rows` × k) and seeded weights: biases on q and k for even seeds; rows'
/// positions spread up to 4,000; the cache filled with seeded bytes (the slots no row takes
/// keep them).
fn launch(backend: &mut CpuBackend, shape: Shape, x: Buf, seed: u64, layout: Layout) -> Launch {
    launch_in(backend, shape, x, seed, [WeightFormat::Bf16; 3], layout)
}

/// `launch` with q, k and v stored in `formats` (bf16, or one quantized kind); with a qk-norm
/// `layout`, qk-norm's seeded weights and eps 1e-6 (the one-block-per-head layout); gated, q's
/// weight (and bias) twice as tall and a gate output.
fn launch_in(
    backend: &mut CpuBackend,
    shape: Shape,
    x: Buf,
    seed: u64,
    formats: [WeightFormat; 3],
    layout: Layout,
) -> Launch {
    parts(backend, shape, x, seed, formats, layout)
        .launch(formats)
        .expect("bf16 or one quantized kind")
}

/// `launch_in`'s arguments.
fn parts(
    backend: &mut CpuBackend,
    shape: Shape,
    x: Buf,
    seed: u64,
    formats: [WeightFormat; 3],
    layout: Layout,
) -> QkvRopeKvParts {
    let (rows, k, heads, kv_heads, head_dim, rotary_dim) = shape;
    let (norm, gated) = (layout != Layout::Rope, layout == Layout::Gated);
    let mut norm_weight = |salt: u64| norm.then(|| upload(backend, &values(head_dim, seed ^ salt)));
    let (wqn, wkn, eps) = (norm_weight(0x44), norm_weight(0x55), 1e-6);
    let (nq, nkv) = (heads * head_dim, kv_heads * head_dim);
    // q's weight rows: each head's q and, gated, its gate.
    let nq_rows = if gated { 2 * nq } else { nq };
    let mut weight = |i: usize, n: u32, salt: u64| match formats[i] {
        WeightFormat::Bf16 => upload(backend, &values(n * k, seed ^ salt)),
        format => {
            let m = matrix(n as usize, k as usize, seed ^ salt);
            upload(
                backend,
                &quantize_matrix(format, &m, n as usize, k as usize),
            )
        }
    };
    let (wq, wk, wv) = (
        weight(0, nq_rows, 0x11),
        weight(1, nkv, 0x22),
        weight(2, nkv, 0x33),
    );
    let with_bias = seed.is_multiple_of(2);
    let mut bias = |n: u32, salt: u64| with_bias.then(|| upload(backend, &values(n, seed ^ salt)));
    let (bq, bk, bv) = (bias(nq_rows, 0x66), bias(nkv, 0x77), None);
    let positions: Vec<i32> = (0..rows as i32).map(|r| (r * 613 + 7) % 4001).collect();
    let half = rotary_dim / 2;
    let mut table: Vec<f32> = (0..half)
        .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / rotary_dim as f32))
        .collect();
    // The attention scaling.
    table.push(if with_bias { 1.0 } else { 1.25 });
    // Slots in reverse row order over more pages than the rows fill: rows cross pages, and the
    // slots no row takes keep their bytes.
    let pages = rows.div_ceil(BLOCK_SIZE) + 2;
    let slots = (pages * BLOCK_SIZE) as i32;
    let slot_mapping: Vec<i32> = (0..rows as i32).map(|r| slots - 2 - r).collect();
    let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let positions = upload(backend, &bytes(&positions));
    let inv_freq = upload(
        backend,
        &table
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let slot_mapping = upload(backend, &bytes(&slot_mapping));
    let cache = upload(backend, &values(pages * 2 * BLOCK_SIZE * nkv, seed ^ 0x99));
    let q_bytes = (rows * nq) as usize * 2;
    let q_out = Buf::new(backend.alloc(q_bytes).unwrap(), q_bytes);
    let gate = gated.then(|| Buf::new(backend.alloc(q_bytes).unwrap(), q_bytes));
    QkvRopeKvParts {
        x,
        w: [wq, wk, wv],
        bias: [bq, bk, bv],
        norm: wqn.zip(wkn).map(|(wqn, wkn)| (wqn, wkn, eps)),
        gate,
        positions,
        inv_freq,
        slot_mapping,
        q_out,
        cache,
        dims: [
            rows, k, heads, kv_heads, head_dim, rotary_dim, BLOCK_SIZE, pages,
        ],
    }
}

fn seeded(backend: &mut CpuBackend, shape: Shape, seed: u64, layout: Layout) -> Launch {
    let x = upload(backend, &values(shape.0 * shape.1, seed));
    launch(backend, shape, x, seed, layout)
}

/// head_dim 64, rotary 64 (two whole rope blocks); 48 and 40 (a partial rope block, 8
/// pass-through features); 32 and 16 (one rope block half full, 16 pass-through); 128 and 128.
const SHAPES: [Shape; 4] = [
    (1, 64, 2, 1, 64, 64),
    (5, 40, 3, 1, 48, 40),
    (70, 100, 4, 2, 32, 16),
    (17, 96, 1, 1, 128, 128),
];

/// With qk-norm too: the widest head the stage holds, a quarter of it rotary (qwen3_next's).
const NORM_SHAPE: Shape = (9, 64, 2, 1, 256, 64);

#[test]
fn qkv_rope_kv_mma_equals_its_twin_in_every_head_layout() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    for layout in LAYOUTS {
        let shapes = SHAPES
            .into_iter()
            .chain((layout != Layout::Rope).then_some(NORM_SHAPE));
        for (i, shape) in shapes.enumerate() {
            for seed in [2u64, 3] {
                let l = seeded(&mut backend, shape, seed + 16 * i as u64, layout);
                run(&mut backend, &l);
            }
        }
    }
    let report = backend.emulation().unwrap().report();
    let shapes = SHAPES.len() as u64;
    for (entry, launches) in [
        (QKV_ROPE_KV_MMA.as_str(), 2 * shapes),
        (QKV_NORM_ROPE_KV_MMA.as_str(), 2 * (shapes + 1)),
        (QKV_GATED_NORM_ZC_ROPE_KV_MMA.as_str(), 2 * (shapes + 1)),
    ] {
        let parity = &report[entry];
        assert_eq!(
            (parity.launches, parity.identical),
            (launches, launches),
            "{entry}: {parity:?}"
        );
    }
}

/// The `_narrow` entries (lever `mma_narrow`: 16 rows a pass, the epilogue fed through shared
/// memory, a qk-norm head staged 16 rows at a time in a quarter of the wide launch's dynamic
/// shared memory) write their twin's bytes in every layout, over one pass, several (17 rows)
/// and two row blocks of passes (70 rows), up to the 256-wide head.
#[test]
fn qkv_rope_kv_mma_narrow_entries_equal_their_twin_in_every_head_layout() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    for layout in LAYOUTS {
        let shapes = SHAPES
            .into_iter()
            .chain((layout != Layout::Rope).then_some(NORM_SHAPE));
        for (i, shape) in shapes.enumerate() {
            let seed = 5 + 16 * i as u64;
            let x = upload(&mut backend, &values(shape.0 * shape.1, seed));
            let formats = [WeightFormat::Bf16; 3];
            let wide = parts(&mut backend, shape, x, seed, formats, layout)
                .launch(formats)
                .unwrap();
            let l = parts(&mut backend, shape, x, seed, formats, layout)
                .launch_narrow(formats, true)
                .unwrap();
            assert_eq!(l.kernel, format!("{}_narrow", wide.kernel));
            assert_eq!(l.config.grid, wide.config.grid);
            assert_eq!(4 * l.config.shared_bytes, wide.config.shared_bytes);
            run(&mut backend, &l);
        }
    }
    let report = backend.emulation().unwrap().report();
    let shapes = SHAPES.len() as u64;
    for (entry, launches) in [
        (QKV_ROPE_KV_MMA_NARROW.as_str(), shapes),
        (QKV_NORM_ROPE_KV_MMA_NARROW.as_str(), shapes + 1),
        (QKV_GATED_NORM_ZC_ROPE_KV_MMA_NARROW.as_str(), shapes + 1),
    ] {
        let parity = &report[entry];
        assert_eq!(
            (parity.launches, parity.identical),
            (launches, launches),
            "{entry}: {parity:?}"
        );
    }
}

/// Past the 64-row tile: two row blocks of 128 (the second of two rows) with a head of 160 whose
/// 96 rotary features are one whole and one half-full large rope block and 64 pass-through
/// features one block; three (the last partial), 64-wide heads of 64 rotary, 2 KV heads.
const LARGE_SHAPES: [Shape; 2] = [(130, 100, 3, 1, 160, 96), (300, 72, 2, 2, 64, 64)];

/// With qk-norm past the 64-row tile: two row blocks of 128 (the second of 2 rows) of the
/// widest head the stage holds (64 KB of 128 staged rows: the launch opts in past 48 KB on a
/// device).
const LARGE_NORM_SHAPE: Shape = (130, 64, 2, 1, 256, 64);

/// The `_large` entries (lever `mma_large`: gemm_large's 128 rows; a rope block 32 pairs with
/// each warp's 32 columns 16 of them; with qk-norm a head a block, its 64-feature tiles staged
/// 128 rows at a time) write their twin's bytes in every layout, over the head layouts above (a
/// rotary half of 20, 8 and 32 features: a partial block; of 64: two) and past one row block,
/// in their own grid.
#[test]
fn qkv_rope_kv_mma_large_entries_equal_their_twin() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let formats = [WeightFormat::Bf16; 3];
    let mut launches = 0u64;
    for (entry, layout) in [
        (QKV_ROPE_KV_MMA_LARGE, Layout::Rope),
        (QKV_NORM_ROPE_KV_MMA_LARGE, Layout::Norm),
        (QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE, Layout::Gated),
    ] {
        let norm = layout != Layout::Rope;
        let shapes = SHAPES
            .into_iter()
            .chain(LARGE_SHAPES)
            .chain(norm.then_some(NORM_SHAPE))
            .chain(norm.then_some(LARGE_NORM_SHAPE));
        for (i, shape) in shapes.enumerate() {
            let seed = 6 + 16 * i as u64;
            let x = upload(&mut backend, &values(shape.0 * shape.1, seed));
            let l = parts(&mut backend, shape, x, seed, formats, layout)
                .launch_tile(formats, QkvTile::Large)
                .unwrap();
            let (rows, _, heads, kv_heads, head_dim, rotary_dim) = shape;
            let grid = qkv_rope_kv_large_grid([heads, kv_heads, head_dim, rotary_dim], rows, norm);
            assert_eq!((l.kernel, l.config), (entry.as_str(), grid));
            // A qk-norm block's stage: 128 rows of the head.
            let stage = if norm { 128 * head_dim * 2 } else { 0 };
            assert_eq!(l.config.shared_bytes, stage, "{}", l.kernel);
            run(&mut backend, &l);
            launches += 1;
        }
    }
    let report = backend.emulation().unwrap().report();
    let mut seen = 0;
    for entry in [
        QKV_ROPE_KV_MMA_LARGE,
        QKV_NORM_ROPE_KV_MMA_LARGE,
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE,
    ] {
        let parity = &report[entry.as_str()];
        assert_eq!(parity.launches, parity.identical, "{entry:?}: {parity:?}");
        seen += parity.launches;
    }
    assert_eq!(seen, launches);
}

/// The emulation gives a launch the dynamic shared memory it asks for, no more (as a device
/// does): a qk-norm launch that asks for half its stage fails in every tile, naming the bytes
/// (the stage's rows past the half are written past them), and the launch as emitted runs.
#[test]
fn a_qk_norm_launch_asking_for_half_its_stage_fails_by_its_bytes() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    let formats = [WeightFormat::Bf16; 3];
    let shape = LARGE_NORM_SHAPE;
    for tile in [QkvTile::Wide, QkvTile::Narrow, QkvTile::Large] {
        let x = upload(&mut backend, &values(shape.0 * shape.1, 5));
        let mut l = parts(&mut backend, shape, x, 5, formats, Layout::Norm)
            .launch_tile(formats, tile)
            .unwrap();
        run(&mut backend, &l);
        l.config.shared_bytes /= 2;
        let kernel = backend.kernel(l.kernel).unwrap();
        let stream = backend.default_stream();
        let err = backend
            .launch(stream, kernel, &l.config, &l.args)
            .unwrap_err()
            .to_string();
        let bytes = format!(
            "past the {} bytes the launch asked for",
            l.config.shared_bytes
        );
        assert!(err.contains(&bytes), "{}: {err}", l.kernel);
    }
}

#[test]
fn a_large_rope_block_whose_second_warps_rope_the_first_pairs_differs_from_the_twin() {
    // Warps 4-7 hold tile columns 32-63 (pairs 16-31 of the block) but rope them as pairs
    // 0-15 (the inverse frequencies and destinations of warps 0-3's).
    let edit = (
        "return col0 / 2u + j * 8u + 2u * t + (e & 1u);",
        "return j * 8u + 2u * t + (e & 1u);",
    );
    mutant_differs_in(edit, LARGE_SHAPES[1], 51, Layout::Rope, QkvTile::Large);
}

/// gemm built with `edit` differs from the twin on one launch of `shape` in `layout`'s entry,
/// and the unmutated build does not.
fn mutant_differs(edit: (&str, &str), shape: Shape, seed: u64, layout: Layout) {
    mutant_differs_in(edit, shape, seed, layout, QkvTile::Wide);
}

/// `mutant_differs` through `tile`'s entry (bf16 weights).
fn mutant_differs_in(edit: (&str, &str), shape: Shape, seed: u64, layout: Layout, tile: QkvTile) {
    let dir = build_mutant("gemm", &[edit]);
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let x = upload(&mut backend, &values(shape.0 * shape.1, seed));
    let formats = [WeightFormat::Bf16; 3];
    let l = parts(&mut backend, shape, x, seed, formats, layout)
        .launch_tile(formats, tile)
        .unwrap();
    assert_caught(&dir, "gemm", &mut backend, &l);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_rope_epilogue_with_a_pair_swapped_differs_from_the_twin() {
    let edit = (
        "rope_pair(to_f32(x1), to_f32(x2), c, sn, &dst[i], &dst[i + geo.half]);",
        "rope_pair(to_f32(x2), to_f32(x1), c, sn, &dst[i], &dst[i + geo.half]);",
    );
    mutant_differs(edit, SHAPES[1], 41, Layout::Rope);
}

#[test]
fn a_large_qk_norm_block_that_stages_one_m_fragment_differs_from_the_twin() {
    // Each warp stages the rows of its first 16 alone (the large tile's second m fragment, rows
    // 16-31 of the warp's 32, keeps the stage's stale values).
    let edit = (
        "const unsigned r = at.row(m, e);",
        "const unsigned r = at.row(0u, e);",
    );
    mutant_differs_in(edit, LARGE_SHAPES[0], 53, Layout::Norm, QkvTile::Large);
}

#[test]
fn a_qk_norm_epilogue_with_k_normed_by_q_weights_differs_from_the_twin() {
    let edit = (
        "const bf16* wn = is_q ? norm_w[0] : norm_w[1];",
        "const bf16* wn = norm_w[0];",
    );
    mutant_differs(edit, SHAPES[0], 43, Layout::Norm);
}

#[test]
fn a_gated_epilogue_with_plain_qk_norm_weights_differs_from_the_twin() {
    let edit = (
        "head_transform<true>(&gemm_head_stage[r * hd], dst, hd, wn, eps, positions[row],",
        "head_transform<false>(&gemm_head_stage[r * hd], dst, hd, wn, eps, positions[row],",
    );
    mutant_differs(edit, SHAPES[0], 45, Layout::Gated);
}

#[test]
fn a_gated_epilogue_with_a_gate_reversed_differs_from_the_twin() {
    let edit = (
        "gate_row[i] = gemm_head_stage[r * hd + i];",
        "gate_row[i] = gemm_head_stage[r * hd + (hd - 1u - i)];",
    );
    mutant_differs(edit, SHAPES[2], 47, Layout::Gated);
}

/// x's row 1 poisoned (NaN, ±inf): its q row and its k and v slot carry NaN, the other rows do
/// not, as in the twin.
#[test]
fn qkv_rope_kv_mma_carries_nan_and_inf_as_its_twin() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let shape = (3u32, 64u32, 2u32, 1u32, 48u32, 40u32);
    let x = upload(&mut backend, &bf16_bytes(&rows_of(3, 64, 1.0, &[1])));
    let formats = [
        [WeightFormat::Bf16; 3],
        [WeightFormat::Fp8 {
            block_n: 16,
            block_k: 32,
        }; 3],
        [WeightFormat::Int4 { group: 32 }; 3],
    ];
    for formats in formats {
        for layout in LAYOUTS {
            let l = launch_in(&mut backend, shape, x, 8, formats, layout);
            run(&mut backend, &l);
            carries_nan(&mut backend, &l, layout == Layout::Gated);
        }
    }
    let report = backend.emulation().unwrap().report();
    let entries = [
        QKV_ROPE_KV_MMA.as_str(),
        QKV_ROPE_KV_MMA_FP8.as_str(),
        QKV_ROPE_KV_MMA_INT4.as_str(),
        QKV_NORM_ROPE_KV_MMA.as_str(),
        QKV_NORM_ROPE_KV_MMA_FP8.as_str(),
        QKV_NORM_ROPE_KV_MMA_INT4.as_str(),
        QKV_GATED_NORM_ZC_ROPE_KV_MMA.as_str(),
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8.as_str(),
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4.as_str(),
    ];
    for entry in entries {
        let parity = &report[entry];
        assert_eq!(
            (parity.launches, parity.identical),
            (1, 1),
            "{entry}: {parity:?}"
        );
    }
}

/// q_out and the cache (arguments 12 and 14), and with `gated` the gate (13), of `l` hold NaN
/// and finite values both.
fn carries_nan(backend: &mut CpuBackend, l: &Launch, gated: bool) {
    let gate = gated.then_some(13usize);
    for index in [12usize, 14].into_iter().chain(gate) {
        let (nan, all) = bf16_nans(backend, arg_buf(&l.args[index]));
        assert!(
            nan > 0,
            "{} argument {index}: no NaN, the test is vacuous",
            l.kernel
        );
        assert!(nan < all, "{} argument {index}: every value NaN", l.kernel);
    }
}

/// q, k and v in fp8 blocks of 128 × 128, 3 × 40 and one per-tensor block, or int4 groups of
/// 128, 20 and 32, at the head layouts above and at k = 300 (three of a quantized `_narrow`
/// entry's 128-k stages, the last partial): the twin's bytes (k even for int4), through the
/// wide entries, their `_narrow` variants (lever `mma_narrow`) and their `_large` ones (lever
/// `mma_large`) alike.
#[test]
fn qkv_rope_kv_mma_quantized_entries_equal_their_twins() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let mut launches = 0u64;
    let stages = (17, 300, 2, 1, 64, 32);
    for (i, shape) in SHAPES.into_iter().chain([stages]).enumerate() {
        let (_, k, _, kv_heads, head_dim, _) = shape;
        let fp8 = |block_n, block_k| WeightFormat::Fp8 { block_n, block_k };
        let int4 = |group| WeightFormat::Int4 { group };
        for formats in [
            [fp8(128, 128), fp8(3, 40), fp8(kv_heads * head_dim, k)],
            [int4(128), int4(20), int4(32)],
        ] {
            let seed = 5 + 16 * i as u64;
            let x = upload(&mut backend, &values(shape.0 * k, seed));
            for layout in LAYOUTS {
                for tile in [QkvTile::Wide, QkvTile::Narrow, QkvTile::Large] {
                    let l = parts(&mut backend, shape, x, seed, formats, layout)
                        .launch_tile(formats, tile)
                        .expect("one quantized kind");
                    let suffix = match tile {
                        QkvTile::Wide => {
                            !l.kernel.ends_with("_narrow") && !l.kernel.ends_with("_large")
                        }
                        QkvTile::Narrow => l.kernel.ends_with("_narrow"),
                        QkvTile::Large => l.kernel.ends_with("_large"),
                    };
                    assert!(suffix, "{tile:?}: {}", l.kernel);
                    run(&mut backend, &l);
                    launches += 1;
                }
            }
        }
    }
    let report = backend.emulation().unwrap().report();
    let mut seen = 0u64;
    let entries = [
        QKV_ROPE_KV_MMA_FP8,
        QKV_ROPE_KV_MMA_FP8_NARROW,
        QKV_ROPE_KV_MMA_FP8_LARGE,
        QKV_NORM_ROPE_KV_MMA_FP8,
        QKV_NORM_ROPE_KV_MMA_FP8_NARROW,
        QKV_NORM_ROPE_KV_MMA_FP8_LARGE,
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8,
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_NARROW,
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_LARGE,
    ]
    .map(|e| e.as_str())
    .into_iter()
    .chain(
        [
            QKV_ROPE_KV_MMA_INT4,
            QKV_ROPE_KV_MMA_INT4_NARROW,
            QKV_ROPE_KV_MMA_INT4_LARGE,
            QKV_NORM_ROPE_KV_MMA_INT4,
            QKV_NORM_ROPE_KV_MMA_INT4_NARROW,
            QKV_NORM_ROPE_KV_MMA_INT4_LARGE,
            QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4,
            QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_NARROW,
            QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_LARGE,
        ]
        .map(|e| e.as_str()),
    );
    for entry in entries {
        let parity = &report[entry];
        assert!(parity.launches > 0, "{entry} not run");
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
        seen += parity.launches;
    }
    assert_eq!(seen, launches);
}
