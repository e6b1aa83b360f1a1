//! The tensor-core projections (`gemm::linear_mma`, `gemm::lm_head_mma`, the fused
//! `gemm::qkv_mma`, `gemm::linear_pair_mma`, `gemm::gate_up_silu_mma`, and the routed experts'
//! `gemm::experts_gate_up_silu_mma`): the CUDA source,
//! run through the emulation's model of `mma.sync` and `ldmatrix`, equals its twin byte for
//! byte at shapes off every tile (rows, features and k not multiples of the block's 64 × 32 ×
//! 32, k not a multiple of 8, so the scalar staging path), and a kernel that hands `ldmatrix`
//! the wrong rows is caught.

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::kernels::gemm::{
    ExpertsGateUpSiluMma, GateUpSiluMma, LinearMma, LinearPairMma, LmHeadMma, QkvMma,
    EXPERTS_GATE_UP_SILU_MMA, GATE_UP_SILU_MMA, LINEAR_MMA, LINEAR_PAIR_MMA, LM_HEAD_MMA, QKV_MMA,
};
use solder_model_layers::kernels::{Buf, Launch};

use super::tests::{emulated, run, upload};
use super::tests_mutation::{assert_caught, build_mutant, values};

/// Uploads `rows` inputs, an `n × k` weight (and a bias for the linear), and the launch.
fn gemm_launch(
    backend: &mut CpuBackend,
    (rows, k, n): (u32, u32, u32),
    logits: bool,
    seed: u64,
) -> Launch {
    let x = upload(backend, &values(rows * k, seed));
    let w = upload(backend, &values(n * k, seed ^ 0x5555));
    let bytes = (rows * n) as usize * if logits { 4 } else { 2 };
    let out = Buf::new(backend.alloc(bytes).unwrap(), bytes);
    if logits {
        LmHeadMma {
            x,
            w,
            logits: out,
            want: None,
            rows,
            k,
            vocab: n,
        }
        .launch(LM_HEAD_MMA)
    } else {
        let bias = seed
            .is_multiple_of(2)
            .then(|| upload(backend, &values(n, seed ^ 0xaaaa)));
        LinearMma {
            x,
            w,
            bias,
            y: out,
            rows,
            k,
            n_out: n,
        }
        .launch(LINEAR_MMA)
    }
}

#[test]
fn tensor_core_projections_equal_their_twins_off_every_tile() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // (rows, k, n): one row; a partial k tile and feature block with k % 8 != 0 (the scalar
    // staging); whole tiles; two row blocks with a partial one; k of four tiles (the pipelined
    // staging past its first tile), odd n.
    let shapes = [
        (1u32, 64u32, 32u32),
        (5, 40, 37),
        (64, 96, 64),
        (70, 256, 33),
        (17, 100, 9),
    ];
    let mut launches = 0u64;
    for (i, shape) in shapes.into_iter().enumerate() {
        for logits in [false, true] {
            let l = gemm_launch(&mut backend, shape, logits, 0x1234 + i as u64);
            run(&mut backend, &l);
            launches += 1;
        }
    }
    let report = backend.emulation().unwrap().report();
    let mut seen = 0;
    for entry in [LINEAR_MMA.as_str(), LM_HEAD_MMA.as_str()] {
        let parity = &report[entry];
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
        seen += parity.launches;
    }
    assert_eq!(seen, launches);
}

/// A `qkv_mma` launch of `rows` rows: q of `nq` features, k and v of `nkv` (biases on an even
/// seed), and a `gate_up_silu_mma` launch of `inter` features, both over `k`.
fn fused_launches(
    backend: &mut CpuBackend,
    (rows, k, nq, nkv, inter): (u32, u32, u32, u32, u32),
    seed: u64,
) -> [Launch; 2] {
    let x = upload(backend, &values(rows * k, seed));
    let mut weight = |n: u32, salt: u64| upload(backend, &values(n * k, seed ^ salt));
    let (wq, wk, wv) = (weight(nq, 0x11), weight(nkv, 0x22), weight(nkv, 0x33));
    let (wg, wu) = (weight(inter, 0x44), weight(inter, 0x55));
    let mut bias = |n: u32, salt: u64| {
        seed.is_multiple_of(2)
            .then(|| upload(backend, &values(n, seed ^ salt)))
    };
    let (bq, bk, bv) = (bias(nq, 0x66), bias(nkv, 0x77), bias(nkv, 0x88));
    let mut out = |n: u32| {
        let bytes = (rows * n) as usize * 2;
        Buf::new(backend.alloc(bytes).unwrap(), bytes)
    };
    let (q, k_out, v, act) = (out(nq), out(nkv), out(nkv), out(inter));
    [
        QkvMma {
            x,
            wq,
            bq,
            wk,
            bk,
            wv,
            bv,
            q,
            k_out,
            v,
            rows,
            k,
            nq,
            nkv,
        }
        .launch(QKV_MMA),
        GateUpSiluMma {
            x,
            wg,
            wu,
            act,
            rows,
            k,
            inter,
        }
        .launch(GATE_UP_SILU_MMA),
    ]
}

#[test]
fn fused_tensor_core_kernels_equal_their_twins_off_every_tile() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // (rows, k, nq, nkv, inter): q/k/v blocks that split mid-tile (nq, nkv off 32), the scalar
    // staging (k % 8 != 0), two row blocks with a partial one, whole tiles.
    let shapes = [
        (1u32, 64u32, 64u32, 32u32, 32u32),
        (5, 40, 37, 9, 45),
        (70, 96, 96, 40, 33),
        (17, 100, 8, 8, 70),
    ];
    for (i, shape) in shapes.into_iter().enumerate() {
        for l in fused_launches(&mut backend, shape, 0x4321 + i as u64) {
            run(&mut backend, &l);
        }
    }
    let report = backend.emulation().unwrap().report();
    for entry in [QKV_MMA.as_str(), GATE_UP_SILU_MMA.as_str()] {
        let parity = &report[entry];
        assert_eq!(parity.launches, shapes.len() as u64, "{entry}: {parity:?}");
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
    }
}

/// A tile whose zero chunks (the k padding past k) are never stored reads whatever shared
/// memory held: zeros in a freshly loaded emulation's static storage, which hid it, but a
/// device's shared memory starts with an earlier block's bytes; the emulation poisons static
/// shared memory in each block, so the mutant differs from the twin at one k tile of 40.
#[test]
fn a_tile_that_leaves_its_k_padding_unstored_differs_from_the_twin() {
    let dir = build_mutant(
        "gemm",
        &[(
            "*reinterpret_cast<uint4*>(&s[c / chunks][(c % chunks) * 8]) = v[i];",
            "if ((v[i].x | v[i].y | v[i].z | v[i].w) != 0u) \
             *reinterpret_cast<uint4*>(&s[c / chunks][(c % chunks) * 8]) = v[i];",
        )],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let l = gemm_launch(&mut backend, (3, 40, 32), false, 9);
    assert_caught(&dir, "gemm", &mut backend, &l);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_tensor_core_kernel_loading_the_wrong_weight_rows_differs_from_the_twin() {
    // The B fragments' ldmatrix addresses with the two 8-feature halves of a pair swapped:
    // features 8-15 of each pair get the dots of features 0-7 and back.
    let dir = build_mutant(
        "gemm",
        &[(
            "&ws[i][p * 16 + (lane >> 4) * 8 + (lane & 7)]",
            "&ws[i][p * 16 + (1u - (lane >> 4)) * 8 + (lane & 7)]",
        )],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let l = gemm_launch(&mut backend, (3, 64, 32), false, 8);
    assert_caught(&dir, "gemm", &mut backend, &l);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fused_tensor_core_kernels_picking_the_wrong_weight_differ_from_their_twins() {
    // qkv_mma's v blocks read k's weight; gate_up_silu_mma's epilogue takes silu(up) · gate.
    let dir = build_mutant(
        "gemm",
        &[
            ("        ws[0] = w[2];\n", "        ws[0] = w[1];\n"),
            (
                "silu_mul_value(linear_value(v[0], nullptr, f), linear_value(v[1], nullptr, f))",
                "silu_mul_value(linear_value(v[1], nullptr, f), linear_value(v[0], nullptr, f))",
            ),
        ],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    for l in fused_launches(&mut backend, (3, 64, 32, 32, 32), 9) {
        assert_caught(&dir, "gemm", &mut backend, &l);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `gemm::linear_pair_mma` against its twin and against `gemm::linear_mma` on each weight: the
/// same bytes (each output is `linear_mma`'s), with the first matrix's last block partial (its
/// features off 32), one or two row blocks, a bias on one side only. A mutant whose second
/// blocks read the first matrix differs from the twin.
#[test]
fn a_tensor_core_pair_gives_the_bytes_of_its_two_linear_mma_launches() {
    let pair = |backend: &mut CpuBackend, (rows, k, n1, n2): (u32, u32, u32, u32), seed: u64| {
        let x = upload(backend, &values(rows * k, seed));
        let w1 = upload(backend, &values(n1 * k, seed ^ 0x11));
        let w2 = upload(backend, &values(n2 * k, seed ^ 0x22));
        let b1 = upload(backend, &values(n1, seed ^ 0x33));
        let mut out = |n: u32| {
            let bytes = (rows * n) as usize * 2;
            Buf::new(backend.alloc(bytes).unwrap(), bytes)
        };
        let (y1, y2, z1, z2) = (out(n1), out(n2), out(n1), out(n2));
        let single = |w, bias, y, n_out| {
            LinearMma {
                x,
                w,
                bias,
                y,
                rows,
                k,
                n_out,
            }
            .launch(LINEAR_MMA)
        };
        let launches = [
            LinearPairMma {
                x,
                w1,
                b1: Some(b1),
                w2,
                b2: None,
                y1,
                y2,
                rows,
                k,
                n1,
                n2,
            }
            .launch(LINEAR_PAIR_MMA),
            single(w1, Some(b1), z1, n1),
            single(w2, None, z2, n2),
        ];
        (launches, [(y1, z1), (y2, z2)])
    };
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    for (i, shape) in [(1u32, 64u32, 40u32, 8u32), (70, 100, 96, 33)]
        .into_iter()
        .enumerate()
    {
        let (launches, outputs) = pair(&mut backend, shape, 0x77 + i as u64);
        for l in &launches {
            run(&mut backend, l);
        }
        for (got, want) in outputs {
            assert_eq!(
                super::tests::download(&mut backend, got.ptr, got.bytes),
                super::tests::download(&mut backend, want.ptr, want.bytes),
                "{shape:?}: not linear_mma's bytes"
            );
        }
    }
    let report = backend.emulation().unwrap().report();
    let parity = &report[LINEAR_PAIR_MMA.as_str()];
    assert_eq!((parity.launches, parity.identical), (2, 2), "{parity:?}");

    let dir = build_mutant(
        "gemm",
        &[(
            "        ws[0] = GemmBf16{w2};\n",
            "        ws[0] = GemmBf16{w1};\n",
        )],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let (launches, _) = pair(&mut backend, (3, 64, 32, 32), 9);
    assert_caught(&dir, "gemm", &mut backend, &launches[0]);
    std::fs::remove_dir_all(&dir).ok();
}

/// An `experts_gate_up_silu_mma` launch: `rows` rows, `k` picks each among `experts` (distinct
/// per row, spread unevenly), hidden and inter off every tile.
pub(super) fn experts_launch(
    backend: &mut CpuBackend,
    (rows, k, experts): (u32, u32, u32),
    (hidden, inter): (u32, u32),
    seed: u64,
) -> Launch {
    let x = upload(backend, &values(rows * hidden, seed));
    let wg = upload(backend, &values(experts * inter * hidden, seed ^ 0x11));
    let wu = upload(backend, &values(experts * inter * hidden, seed ^ 0x22));
    let ids = upload(
        backend,
        &super::tests_nan::i32_bytes(&pick_ids(rows, k, experts)),
    );
    let bytes = (rows * k * inter) as usize * 2;
    let act = Buf::new(backend.alloc(bytes).unwrap(), bytes);
    ExpertsGateUpSiluMma {
        x,
        ids,
        wg,
        wu,
        act,
        rows,
        hidden,
        inter,
        experts,
        k,
    }
    .launch(EXPERTS_GATE_UP_SILU_MMA)
}

/// `k` distinct picks per row among `experts`, spread unevenly.
fn pick_ids(rows: u32, k: u32, experts: u32) -> Vec<i32> {
    (0..rows)
        .flat_map(|r| {
            let first = (r * 3 + r / 7) % experts;
            (0..k).map(move |j| ((first + j * (1 + r % (experts - 1).max(1))) % experts) as i32)
        })
        .collect()
}

#[test]
fn the_experts_down_kernels_equal_their_twins_with_picks_over_several_tiles() {
    use solder_model_layers::kernels::gemm::{ExpertsDownMma, EXPERTS_DOWN_MMA};
    use solder_model_layers::kernels::moe::{DownCombine, DOWN_COMBINE};
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // (rows, k, experts), (hidden, inter): as the gate/up cases, the down matrix
    // [hidden][inter] (inter the dot's length, off 8 in the last case).
    let cases = [
        ((1u32, 1u32, 3u32), (64u32, 32u32)),
        ((75, 2, 2), (37, 40)),
        ((130, 1, 2), (37, 40)),
        ((20, 2, 8), (70, 96)),
        ((33, 4, 6), (9, 100)),
        // More than 64 picks of an expert still waiting at the last window of ids.
        ((128, 2, 4), (37, 40)),
        ((200, 3, 5), (37, 40)),
    ];
    for (i, ((rows, k, experts), (hidden, inter))) in cases.into_iter().enumerate() {
        let seed = 0x99 + i as u64;
        let act = upload(&mut backend, &values(rows * k * inter, seed));
        let wd = upload(&mut backend, &values(experts * hidden * inter, seed ^ 0x33));
        let weights: Vec<u8> = (0..rows * k)
            .flat_map(|s| (0.25 + (s % 5) as f32 * 0.125).to_le_bytes())
            .collect();
        let weights = upload(&mut backend, &weights);
        let ids = upload(
            &mut backend,
            &super::tests_nan::i32_bytes(&pick_ids(rows, k, experts)),
        );
        let dots_bytes = (rows * k * hidden) as usize * 4;
        let dots = Buf::new(backend.alloc(dots_bytes).unwrap(), dots_bytes);
        let out_bytes = (rows * hidden) as usize * 2;
        let out = Buf::new(backend.alloc(out_bytes).unwrap(), out_bytes);
        let down = ExpertsDownMma {
            act,
            ids,
            wd,
            dots,
            rows,
            hidden,
            inter,
            experts,
            k,
        };
        run(&mut backend, &down.launch(EXPERTS_DOWN_MMA));
        let combine = DownCombine {
            dots,
            ids,
            weights,
            out,
            rows,
            hidden,
            experts,
            k,
        };
        run(&mut backend, &combine.launch(DOWN_COMBINE));
    }
    let report = backend.emulation().unwrap().report();
    for kernel in [EXPERTS_DOWN_MMA.as_str(), DOWN_COMBINE.as_str()] {
        let parity = &report[kernel];
        assert_eq!(parity.launches, cases.len() as u64, "{kernel}: {parity:?}");
        assert_eq!(parity.launches, parity.identical, "{kernel}: {parity:?}");
    }
}

#[test]
fn the_experts_tensor_core_kernel_equals_its_twin_with_picks_over_several_tiles() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // (rows, k, experts), (hidden, inter): one pick; 75 picks of each of 2 experts (a full
    // tile and a last partial one); 130 rows picking 1 of 2 (a window that overfills a tile:
    // the rest carried to the next); 8 experts some of which nobody picks; hidden off 8 (the
    // scalar staging).
    let cases = [
        ((1u32, 1u32, 3u32), (64u32, 32u32)),
        ((75, 2, 2), (40, 37)),
        ((130, 1, 2), (40, 37)),
        ((20, 2, 8), (96, 70)),
        ((33, 4, 6), (100, 9)),
        // More than 64 picks of an expert still waiting at the last window of ids.
        ((128, 2, 4), (40, 37)),
        ((200, 3, 5), (40, 37)),
    ];
    for (i, (picks, dims)) in cases.into_iter().enumerate() {
        let l = experts_launch(&mut backend, picks, dims, 0x77 + i as u64);
        run(&mut backend, &l);
    }
    let report = backend.emulation().unwrap().report();
    let parity = &report[EXPERTS_GATE_UP_SILU_MMA.as_str()];
    assert_eq!(parity.launches, cases.len() as u64, "{parity:?}");
    assert_eq!(parity.launches, parity.identical, "{parity:?}");
}

#[test]
fn an_experts_kernel_dropping_the_picks_past_a_full_tile_differs_from_its_twin() {
    // The picks gathered past a full tile of 64 are not carried to the next one.
    let dir = build_mutant(
        "gemm",
        &[(
            "if (threadIdx.x < waiting - take) picks[threadIdx.x] = picks[take + threadIdx.x];",
            "",
        )],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let l = experts_launch(&mut backend, (130, 1, 2), (40, 37), 5);
    assert_caught(&dir, "gemm", &mut backend, &l);
    std::fs::remove_dir_all(&dir).ok();
}
