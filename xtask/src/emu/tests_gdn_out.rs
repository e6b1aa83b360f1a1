//! `gemv::gated_norm_linear_residual_add` (Gated DeltaNet's gated norm staged as out_proj's x)
//! through the host emulation of its CUDA source, classic and streaming (split or not): equal
//! to its twin, and to `gdn::gated_norm` then `gemv::linear_residual_add`, byte for byte (rule
//! `gdn_gated_norm_out_proj` is `bit_identical`), with several v heads per key head, a head
//! dim that is not a multiple of 8 (a staged chunk of 8 spans two heads), k past one dot
//! segment, rows past one tile, and a bias.

use solder_config::Levers;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::kernels::gdn::{GatedNorm, GATED_NORM};
use solder_model_layers::kernels::gemv::{
    GatedNormLinearResidualAdd, LinearResidualAdd, GATED_NORM_LINEAR_RESIDUAL_ADD,
    LINEAR_RESIDUAL_ADD,
};

use super::tests::{bf16_values, download, emulated, f32_values, run, upload};

/// One problem: rows, head geometry (nk, dk, nv, dv), out_proj's width, a bias or not.
struct Problem {
    rows: u32,
    heads: [u32; 4],
    n_out: u32,
    bias: bool,
}

#[test]
fn the_gated_norm_in_out_projs_staging_gives_the_bytes_of_the_norm_then_the_projection() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let mut splits = 0;
    for p in [
        // Qwen3-Next's layout in small: 2 v heads per key head, dv a multiple of 8.
        Problem {
            rows: 1,
            heads: [2, 8, 4, 16],
            n_out: 24,
            bias: false,
        },
        // dv 12: chunks of 8 straddle heads; 9 rows (two row tiles); a bias.
        Problem {
            rows: 9,
            heads: [1, 4, 3, 12],
            n_out: 19,
            bias: true,
        },
        // k = 1200, past one dot segment (a split, when the shape takes one).
        Problem {
            rows: 3,
            heads: [4, 8, 12, 100],
            n_out: 40,
            bias: false,
        },
    ] {
        splits += usize::from(check(&mut backend, &p));
    }
    assert!(splits > 0, "no streaming launch split k");
    let report = backend.emulation().unwrap().report();
    let mut names: Vec<&str> = report
        .keys()
        .map(|name| name.as_str())
        .filter(|name| name.starts_with("gemv::gated_norm_linear_residual_add"))
        .collect();
    assert!(names.len() >= 2, "classic and streaming entries: {names:?}");
    names.extend(["gdn::gated_norm", "gemv::linear_residual_add"]);
    for name in names {
        let r = &report[name];
        assert!(r.launches > 0 && r.launches == r.identical, "{name}: {r:?}");
    }
}

/// Runs `p` both ways and compares; whether its streaming launch split k.
fn check(backend: &mut CpuBackend, p: &Problem) -> bool {
    let [nk, dk, nv, dv] = p.heads;
    let (rows, n_out) = (p.rows, p.n_out);
    let k = nv * dv;
    let qkvz_row = nk * (2 * dk + 2 * (nv / nk) * dv);
    let at = format!("rows {rows}, heads {:?}, n_out {n_out}", p.heads);
    let core = upload(backend, &bf16_values(rows * k, 1.0));
    let qkvz = upload(backend, &bf16_values(rows * qkvz_row, 2.0));
    let wn = upload(backend, &bf16_values(dv, 3.0));
    let w = upload(backend, &bf16_values(n_out * k, 4.0));
    let bias = p.bias.then(|| upload(backend, &bf16_values(n_out, 5.0)));
    let h = upload(backend, &f32_values(rows * n_out, 6.0));
    let fresh = |backend: &mut CpuBackend, bytes: u32| upload(backend, &vec![0x5a; bytes as usize]);

    // The reference routing: the gated norm, then out_proj with the residual add.
    let normed = fresh(backend, rows * k * 2);
    let want_out = fresh(backend, rows * n_out * 4);
    let norm = GatedNorm {
        core,
        qkvz,
        w: wn,
        out: normed,
        rows,
        nk,
        dk,
        nv,
        dv,
        eps: 1e-6,
    }
    .launch(GATED_NORM);
    run(backend, &norm);
    let proj = LinearResidualAdd {
        x: normed,
        w,
        bias,
        h,
        h_out: want_out,
        rows,
        k,
        n_out,
        scratch: None,
    }
    .launch(LINEAR_RESIDUAL_ADD);
    run(backend, &proj);
    let want = download(backend, want_out.ptr, want_out.bytes);
    assert!(
        want.chunks_exact(4).any(|b| b != [0x5a; 4]),
        "{at}: nothing written"
    );

    let mut split = false;
    for streaming in [false, true] {
        let h_out = fresh(backend, rows * n_out * 4);
        let a = GatedNormLinearResidualAdd {
            core,
            qkvz,
            wn,
            w,
            bias,
            h,
            h_out,
            rows,
            nk,
            dk,
            nv,
            dv,
            k,
            n_out,
            eps: 1e-6,
            scratch: None,
        };
        let launch = if streaming {
            let (shape, mut a) = (a.shape(&Levers::default()), a);
            if shape.scratch_bytes > 0 {
                split = true;
                a.scratch = Some(upload(backend, &vec![0; shape.scratch_bytes]));
            }
            a.launch_in(shape)
        } else {
            a.launch(GATED_NORM_LINEAR_RESIDUAL_ADD)
        };
        run(backend, &launch);
        let got = download(backend, h_out.ptr, h_out.bytes);
        assert!(
            got == want,
            "{at}, streaming {streaming}: not the bytes of gated_norm then linear_residual_add"
        );
    }
    split
}
