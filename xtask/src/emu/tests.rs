//! The emulation end to end on single launches: the libraries build, a launch runs the CUDA
//! source (its bytes are h + x, computed here), shadow mode finds it equal to the twin, and
//! a twin that disagrees is reported with its first differing element.

use half::bf16;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::{CpuBackend, DevicePtr, GpuBackend, ModuleImage};
use solder_model_layers::kernels::add::{ResidualAdd, RESIDUAL_ADD};
use solder_model_layers::kernels::gemv::{Linear, LmHead, LINEAR, LM_HEAD};
use solder_model_layers::kernels::{Buf, Launch};

pub(super) fn upload(backend: &mut CpuBackend, bytes: &[u8]) -> Buf {
    let ptr = backend.alloc(bytes.len()).unwrap();
    backend.copy_h2d(ptr, bytes).unwrap();
    Buf::new(ptr, bytes.len())
}

pub(super) fn download(backend: &mut CpuBackend, ptr: DevicePtr, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    backend.copy_d2h(ptr, &mut out).unwrap();
    out
}

fn bf16_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values
        .flat_map(|v| bf16::from_f32(v).to_le_bytes())
        .collect()
}

/// How many of a bf16 buffer's values are NaN, and how many it holds.
pub(super) fn bf16_nans(backend: &mut CpuBackend, buf: Buf) -> (usize, usize) {
    let bytes = download(backend, buf.ptr, buf.bytes);
    let values: Vec<bf16> = bytes
        .chunks_exact(2)
        .map(|b| bf16::from_le_bytes([b[0], b[1]]))
        .collect();
    (values.iter().filter(|v| v.is_nan()).count(), values.len())
}

/// The buffer a launch argument names.
pub(super) fn arg_buf(arg: &solder_gpu_runtime::KernelArg) -> Buf {
    match arg {
        solder_gpu_runtime::KernelArg::Buffer { ptr, bytes, .. } => Buf::new(*ptr, *bytes),
        other => panic!("not a buffer: {other:?}"),
    }
}

pub(super) fn run(backend: &mut CpuBackend, launch: &Launch) {
    let kernel = backend.kernel(launch.kernel).unwrap();
    let stream = backend.default_stream();
    backend
        .launch(stream, kernel, &launch.config, &launch.args)
        .unwrap();
}

pub(super) fn emulated(mode: EmuMode, backend: &mut CpuBackend) {
    let emulation = super::emulation(&crate::paths::workspace_root(), mode).unwrap();
    backend.set_emulation(Some(emulation));
}

/// residual_add over 3 rows of 70 (not a multiple of the block), emulated.
fn residual_add(backend: &mut CpuBackend) -> (Vec<u8>, Vec<f32>) {
    let (rows, hidden) = (3u32, 70u32);
    let n = (rows * hidden) as usize;
    let h: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
    let h_buf = upload(
        backend,
        &h.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    let x_bytes = bf16_bytes(x.iter().copied());
    let x_buf = upload(backend, &x_bytes);
    let out = Buf::new(backend.alloc(n * 4).unwrap(), n * 4);
    let launch = ResidualAdd {
        h: h_buf,
        x: x_buf,
        out,
        rows,
        hidden,
    }
    .launch(RESIDUAL_ADD);
    run(backend, &launch);
    let expected: Vec<f32> = h
        .iter()
        .zip(x_bytes.chunks(2))
        .map(|(h, x)| h + bf16::from_le_bytes([x[0], x[1]]).to_f32())
        .collect();
    (download(backend, out.ptr, n * 4), expected)
}

#[test]
fn residual_add_runs_the_cuda_source_and_equals_its_twin() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    let (bytes, expected) = residual_add(&mut backend);
    let expected: Vec<u8> = expected.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(bytes, expected);

    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    residual_add(&mut backend);
    let report = backend.emulation().unwrap().report();
    let add = &report["add::residual_add"];
    assert_eq!((add.launches, add.identical), (1, 1), "{add:?}");
}

/// Parity's second worker opens copy 1: libraries the loader maps apart from the built
/// ones (so their statics are apart), whose launches run and equal their twins.
#[test]
fn a_copy_of_the_libraries_is_loaded_apart_and_runs() {
    let root = crate::paths::workspace_root();
    let out = super::build(&root, false).unwrap();
    let copy = out.join("copy-1");
    let mut first = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    first.set_emulation(Some(super::open_built(&out, 0, EmuMode::Shadow).unwrap()));
    let mut second = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    second.set_emulation(Some(super::open_built(&out, 1, EmuMode::Shadow).unwrap()));
    for module in solder_kernels::MODULES {
        let (built, copied) = (
            solder_gpu_runtime::cpu::emu::library_path(&out, module),
            solder_gpu_runtime::cpu::emu::library_path(&copy, module),
        );
        assert_eq!(
            std::fs::read(&built).unwrap(),
            std::fs::read(&copied).unwrap()
        );
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let gemv = solder_gpu_runtime::cpu::emu::library_path(&copy, "gemv");
    assert!(
        maps.contains(&gemv.display().to_string()),
        "{} not mapped",
        gemv.display()
    );
    for backend in [&mut first, &mut second] {
        residual_add(backend);
        let add = &backend.emulation().unwrap().report()["add::residual_add"];
        assert_eq!((add.launches, add.identical), (1, 1), "{add:?}");
    }
}

#[test]
fn linear_equals_its_twin_with_and_without_bias_across_tiles() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // k = 300: a partial last 8-chunk and several segments; 11 rows: more than one row tile.
    let (rows, k, n_out) = (11u32, 300u32, 37u32);
    let x = upload(
        &mut backend,
        &bf16_bytes((0..rows * k).map(|i| (i as f32 * 0.7).sin())),
    );
    let w = upload(
        &mut backend,
        &bf16_bytes((0..n_out * k).map(|i| (i as f32 * 0.3).cos() * 0.1)),
    );
    let bias = upload(
        &mut backend,
        &bf16_bytes((0..n_out).map(|i| i as f32 * 0.01)),
    );
    let bytes = (rows * n_out * 2) as usize;
    let y = Buf::new(backend.alloc(bytes).unwrap(), bytes);
    for bias in [Some(bias), None] {
        let launch = Linear {
            x,
            w,
            bias,
            y,
            rows,
            k,
            n_out,
            scratch: None,
        }
        .launch(LINEAR);
        run(&mut backend, &launch);
    }
    let report = backend.emulation().unwrap().report();
    let linear = &report["gemv::linear"];
    assert_eq!((linear.launches, linear.identical), (2, 2), "{linear:?}");
}

#[test]
fn a_twin_that_disagrees_is_reported_with_its_first_differing_element() {
    let mut backend = CpuBackend::with_threads(1);
    // A wrong twin: writes +0 everywhere.
    backend
        .register_twin("add::residual_add", |ctx| {
            let out = ctx.f32s_mut(2)?;
            out.fill(0.0);
            Ok(())
        })
        .unwrap();
    backend
        .load_module(&ModuleImage {
            name: "add",
            ptx: None,
            cubin: None,
        })
        .unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let (bytes, expected) = residual_add(&mut backend);
    let expected: Vec<u8> = expected.iter().flat_map(|v| v.to_le_bytes()).collect();
    // The emulation's bytes are the ones kept.
    assert_eq!(bytes, expected);
    let add = &backend.emulation().unwrap().report()["add::residual_add"];
    assert_eq!((add.launches, add.identical), (1, 0));
    let text = add.first_mismatch.as_deref().unwrap();
    assert!(
        text.starts_with("arg 2 element 0: twin 0e0 (0x00000000), emulation 1e0 (0x3f800000)"),
        "{text}"
    );
}

/// Dot of one row as the CUDA kernels order it (common.cuh `warp_dot`, DOT_SEG): per segment
/// of 1024 elements, lane l accumulates the segment's 8-element chunks c ≡ l (mod 32) with fma
/// from +0, then the butterfly over 16, 8, 4, 2, 1; the segment sums are added in order, the
/// first as it is.
fn cuda_order_dot(x: &[bf16], w: &[bf16]) -> f32 {
    let mut total = 0.0f32;
    for (seg, (xs, ws)) in x.chunks(1024).zip(w.chunks(1024)).enumerate() {
        let mut lanes = [0.0f32; 32];
        for (lane, acc) in lanes.iter_mut().enumerate() {
            let mut i0 = lane * 8;
            while i0 < xs.len() {
                for i in i0..(i0 + 8).min(xs.len()) {
                    *acc = xs[i].to_f32().mul_add(ws[i].to_f32(), *acc);
                }
                i0 += 256;
            }
        }
        for m in [16, 8, 4, 2, 1] {
            let old = lanes;
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = old[l] + old[l ^ m];
            }
        }
        total = if seg == 0 { lanes[0] } else { total + lanes[0] };
    }
    total
}

#[test]
fn linear_and_lm_head_are_the_cuda_dot_order_as_their_twins() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // Values with full bf16 mantissas, so partial sums round and the order shows.
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    // One segment, and three (two whole, one partial): the segment sums show in the bits.
    for k in [160u32, 2600] {
        let (rows, n_out) = (1u32, 64u32);
        let x: Vec<bf16> = (0..rows * k).map(|_| bf16::from_f32(next())).collect();
        let w: Vec<bf16> = (0..n_out * k).map(|_| bf16::from_f32(next())).collect();
        let bytes = |v: &[bf16]| v.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>();
        let x_buf = upload(&mut backend, &bytes(&x));
        let w_buf = upload(&mut backend, &bytes(&w));
        let y = Buf::new(
            backend.alloc((n_out * 2) as usize).unwrap(),
            (n_out * 2) as usize,
        );
        let launch = Linear {
            x: x_buf,
            w: w_buf,
            bias: None,
            y,
            rows,
            k,
            n_out,
            scratch: None,
        }
        .launch(LINEAR);
        run(&mut backend, &launch);
        let got = download(&mut backend, y.ptr, (n_out * 2) as usize);
        let expected: Vec<bf16> = (0..n_out as usize)
            .map(|o| bf16::from_f32(cuda_order_dot(&x, &w[o * k as usize..(o + 1) * k as usize])))
            .collect();
        assert_eq!(got, bytes(&expected), "the emulation is not the CUDA order");
        // The f32 logits of the same dots show the order in every bit.
        let logits = Buf::new(
            backend.alloc((n_out * 4) as usize).unwrap(),
            (n_out * 4) as usize,
        );
        let launch = LmHead {
            x: x_buf,
            w: w_buf,
            logits,
            want: None,
            rows,
            k,
            vocab: n_out,
            scratch: None,
        }
        .launch(LM_HEAD);
        run(&mut backend, &launch);
        let got = download(&mut backend, logits.ptr, (n_out * 4) as usize);
        let expected: Vec<u8> = (0..n_out as usize)
            .flat_map(|o| {
                cuda_order_dot(&x, &w[o * k as usize..(o + 1) * k as usize]).to_le_bytes()
            })
            .collect();
        assert_eq!(got, expected, "the emulation is not the CUDA order");
    }
    // The twins do the same order (numerics::dot_bf16): shadow mode finds the same bytes.
    let report = backend.emulation().unwrap().report();
    for name in ["gemv::linear", "gemv::lm_head"] {
        let k = &report[name];
        assert_eq!(k.launches, 2, "{name}");
        assert_eq!(k.identical, 2, "{name}: {k:?}");
    }
}

#[test]
fn paged_decode_over_a_split_context_equals_its_twin() {
    use solder_model_layers::kernels::attn::{
        scratch_bytes, PagedAttention, ATTN_SPLITS, PAGED_DECODE,
    };
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // 600 tokens: three flash-decoding splits, merged by the block that arrives last.
    let (heads, kv_heads, head_dim, block_size, len) = (2u32, 1u32, 32u32, 16u32, 600u32);
    let pages = len.div_ceil(block_size);
    let mut state = 0x2545f4914f6cdd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let q = upload(
        &mut backend,
        &bf16_bytes((0..heads * head_dim).map(|_| next())),
    );
    let cache_elems = pages * 2 * block_size * kv_heads * head_dim;
    let cache = upload(&mut backend, &bf16_bytes((0..cache_elems).map(|_| next())));
    // Pages in reverse order, so the table is really read.
    let table: Vec<u8> = (0..pages)
        .rev()
        .flat_map(|p| (p as i32).to_le_bytes())
        .collect();
    let block_tables = upload(&mut backend, &table);
    let seq_lens = upload(&mut backend, &(len as i32).to_le_bytes());
    let out_bytes = (heads * head_dim * 2) as usize;
    let out = Buf::new(backend.alloc(out_bytes).unwrap(), out_bytes);
    let scratch_len = scratch_bytes(1, heads as usize, head_dim as usize);
    let scratch = upload(&mut backend, &vec![0u8; scratch_len]);
    let launch = PagedAttention {
        q,
        cache,
        block_tables,
        seq_lens,
        gate: None,
        out,
        scratch,
        rows: 1,
        heads,
        kv_heads,
        head_dim,
        block_size,
        max_blocks: pages,
        num_pages: pages,
        window: 0,
        scale: 1.0 / (head_dim as f32).sqrt(),
    }
    .launch(PAGED_DECODE);
    run(&mut backend, &launch);
    let decode = &backend.emulation().unwrap().report()["attn::paged_decode"];
    assert_eq!(decode.launches, 1);
    // The twin follows the kernel's pieces, splits and merges: the same bytes.
    assert_eq!(decode.identical, 1, "{decode:?}");
    // The arrival counters are back to zero after the merge.
    let counters = download(&mut backend, scratch.ptr, scratch_len);
    let slot = (1 + ATTN_SPLITS as usize * (head_dim as usize + 2)) * 4;
    for h in 0..heads as usize {
        assert_eq!(&counters[h * slot..h * slot + 4], &[0, 0, 0, 0], "head {h}");
    }
}
/// `bf16` bytes of `n` values from a seed (deterministic, every sign and magnitude in -1..1).
pub(super) fn bf16_values(n: u32, seed: f32) -> Vec<u8> {
    bf16_bytes((0..n).map(|i| ((i as f32 + seed) * 0.618_034).sin()))
}

pub(super) fn f32_values(n: u32, seed: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (((i as f32 + seed) * 0.377).cos() * 2.0).to_le_bytes())
        .collect()
}

/// Every path of gemv's streaming entries computes its classic kernel's bytes in the CUDA
/// source (emulated): decode and small and wide row tiles, k tiny, odd (unaligned rows,
/// the scalar loads), one and several weight tiles, staged whole or in spans (r4 past 4096,
/// r8 past 2048), the norm from shared memory or from its row, the sum stored (h_out), and a
/// grid smaller than the features (several rounds per warp).
#[test]
fn gemv_streaming_entries_equal_their_classic_kernels() {
    use solder_gpu_runtime::LaunchConfig;
    use solder_model_layers::kernels::gemv::{
        stream_config, AddNormGateUpSilu, AddNormLmHead, Linear, RowTile, ADD_NORM_GATE_UP_SILU,
        ADD_NORM_GATE_UP_SILU_STREAM, ADD_NORM_LM_HEAD, ADD_NORM_LM_HEAD_STREAM, LINEAR_STREAM,
    };
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    let few_blocks = |config: LaunchConfig| LaunchConfig {
        grid: [config.grid[0], config.grid[1].min(2), 1],
        ..config
    };
    for (rows, k, n) in [
        (1u32, 8u32, 1u32),
        (1, 2051, 37),
        (1, 4100, 20),
        (2, 300, 9),
        (3, 4100, 9),
        (4, 5000, 5),
        (8, 2051, 9),
        (9, 100, 37),
    ] {
        let at = format!("rows {rows}, k {k}, features {n}");
        let tile = RowTile::for_rows(rows);
        let x = upload(&mut backend, &bf16_values(rows * k, 1.0));
        let w = upload(&mut backend, &bf16_values(n * k, 2.0));
        let wu = upload(&mut backend, &bf16_values(n * k, 3.0));
        let bias = upload(&mut backend, &bf16_values(n, 4.0));
        let h = upload(&mut backend, &f32_values(rows * k, 5.0));
        let d = upload(&mut backend, &bf16_values(rows * k, 6.0));
        let wn = upload(&mut backend, &bf16_values(k, 7.0));
        let out = |backend: &mut CpuBackend, bytes: u32| {
            let bytes = bytes as usize;
            Buf::new(backend.alloc(bytes).unwrap(), bytes)
        };
        for shrink in [false, true] {
            let at = format!("{at}, grid shrunk: {shrink}");
            let shape = |features: u32| {
                let config = stream_config(features as u64, rows, k, tile);
                if shrink {
                    few_blocks(config)
                } else {
                    config
                }
            };
            // linear
            let (y1, y2) = (
                out(&mut backend, rows * n * 2),
                out(&mut backend, rows * n * 2),
            );
            let a = Linear {
                x,
                w,
                bias: Some(bias),
                y: y1,
                rows,
                k,
                n_out: n,
                scratch: None,
            };
            run(
                &mut backend,
                &a.launch(solder_model_layers::kernels::gemv::LINEAR),
            );
            let b = Linear { y: y2, ..a };
            run(
                &mut backend,
                &b.launch_with(LINEAR_STREAM[tile.index()], shape(n)),
            );
            let (c, s) = (
                download(&mut backend, y1.ptr, y1.bytes),
                download(&mut backend, y2.ptr, y2.bytes),
            );
            assert_eq!(c, s, "linear: {at}");
            // add + norm + gate/up + SiLU·mul, storing the sum
            let (a1, a2) = (
                out(&mut backend, rows * n * 2),
                out(&mut backend, rows * n * 2),
            );
            let (s1, s2) = (
                out(&mut backend, rows * k * 4),
                out(&mut backend, rows * k * 4),
            );
            let a = AddNormGateUpSilu {
                h,
                o: d,
                wn,
                wg: w,
                wu,
                h_out: Some(s1),
                act: a1,
                rows,
                k,
                inter: n,
                eps: 1e-5,
                scratch: None,
            };
            run(&mut backend, &a.launch(ADD_NORM_GATE_UP_SILU));
            let b = AddNormGateUpSilu {
                h_out: Some(s2),
                act: a2,
                ..a
            };
            run(
                &mut backend,
                &b.launch_with(ADD_NORM_GATE_UP_SILU_STREAM[tile.index()], shape(n)),
            );
            for (what, one, two) in [("act", a1, a2), ("h_out", s1, s2)] {
                let c = download(&mut backend, one.ptr, one.bytes);
                let s = download(&mut backend, two.ptr, two.bytes);
                assert_eq!(c, s, "add_norm_gate_up_silu {what}: {at}");
            }
            // add + norm + LM head (f32 logits: every bit of the dot shows)
            let (l1, l2) = (
                out(&mut backend, rows * n * 4),
                out(&mut backend, rows * n * 4),
            );
            let a = AddNormLmHead {
                h,
                d,
                wn,
                w,
                logits: l1,
                want: None,
                rows,
                k,
                vocab: n,
                eps: 1e-6,
                scratch: None,
            };
            run(&mut backend, &a.launch(ADD_NORM_LM_HEAD));
            let b = AddNormLmHead { logits: l2, ..a };
            run(
                &mut backend,
                &b.launch_with(ADD_NORM_LM_HEAD_STREAM[tile.index()], shape(n)),
            );
            let (c, s) = (
                download(&mut backend, l1.ptr, l1.bytes),
                download(&mut backend, l2.ptr, l2.bytes),
            );
            assert_eq!(c, s, "add_norm_lm_head: {at}");
            assert!(
                c.chunks(4).any(|v| v != [0, 0, 0, 0]),
                "add_norm_lm_head: {at}: all zero"
            );
        }
    }
}

/// Shadow mode: a streaming entry's emulated bytes equal its kernel's twin (the variant is
/// registered under the kernel's twin), reported under the entry's own name.
#[test]
fn a_streaming_entry_equals_its_kernels_twin() {
    use solder_model_layers::kernels::gemv::{stream_config, Linear, RowTile, LINEAR_STREAM};
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let (rows, k, n_out) = (3u32, 300u32, 37u32);
    let x = upload(&mut backend, &bf16_values(rows * k, 1.0));
    let w = upload(&mut backend, &bf16_values(n_out * k, 2.0));
    let bytes = (rows * n_out * 2) as usize;
    let y = Buf::new(backend.alloc(bytes).unwrap(), bytes);
    let tile = RowTile::for_rows(rows);
    let launch = Linear {
        x,
        w,
        bias: None,
        y,
        rows,
        k,
        n_out,
        scratch: None,
    }
    .launch_with(
        LINEAR_STREAM[tile.index()],
        stream_config(n_out as u64, rows, k, tile),
    );
    run(&mut backend, &launch);
    let report = backend.emulation().unwrap().report();
    let entry = &report["gemv::linear_r4"];
    assert_eq!((entry.launches, entry.identical), (1, 1), "{entry:?}");
}

/// `moe::gate_combine_shared` from its CUDA source against its twin, and against
/// `gemv::linear` (the one-feature gate) then `moe::combine_shared`: the same bytes (rule
/// `shared_gate_combine` is `bit_identical`), with and without a bias, over k past one dot
/// segment with a partial chunk, hidden not a multiple of the block, and more rows than one.
#[test]
fn the_gate_in_the_combine_gives_the_bytes_of_the_gate_projection_then_the_combine() {
    use solder_model_layers::kernels::moe::{
        CombineShared, GateCombineShared, COMBINE_SHARED, GATE_COMBINE_SHARED,
    };
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    for (rows, k, hidden, with_bias) in [
        (1u32, 2051u32, 300u32, false),
        (5, 96, 37, true),
        (3, 1024, 513, false),
    ] {
        let at = format!("rows {rows}, k {k}, hidden {hidden}, bias {with_bias}");
        let x = upload(&mut backend, &bf16_values(rows * k, 1.0));
        let wg = upload(&mut backend, &bf16_values(k, 2.0));
        let bg = with_bias.then(|| upload(&mut backend, &bf16_values(1, 3.0)));
        let routed = upload(&mut backend, &bf16_values(rows * hidden, 4.0));
        let shared = upload(&mut backend, &bf16_values(rows * hidden, 5.0));
        let zeros =
            |backend: &mut CpuBackend, elems: u32| upload(backend, &vec![0x5a; elems as usize * 2]);
        let (gate, want_out) = (
            zeros(&mut backend, rows),
            zeros(&mut backend, rows * hidden),
        );
        let two = [
            Linear {
                x,
                w: wg,
                bias: bg,
                y: gate,
                rows,
                k,
                n_out: 1,
                scratch: None,
            }
            .launch(LINEAR),
            CombineShared {
                routed,
                shared,
                gate,
                out: want_out,
                rows,
                hidden,
            }
            .launch(COMBINE_SHARED),
        ];
        for launch in &two {
            run(&mut backend, launch);
        }
        let want = download(&mut backend, want_out.ptr, want_out.bytes);
        let out = zeros(&mut backend, rows * hidden);
        let launch = GateCombineShared {
            x,
            wg,
            bg,
            routed,
            shared,
            out,
            rows,
            hidden,
            k,
        }
        .launch(GATE_COMBINE_SHARED);
        run(&mut backend, &launch);
        let got = download(&mut backend, out.ptr, out.bytes);
        assert!(
            got == want,
            "{at}: not the bytes of the gate's linear then the combine"
        );
        assert!(got.iter().any(|b| *b != 0x5a), "{at}: nothing written");
    }
    let report = backend.emulation().unwrap().report();
    for kernel in [
        "moe::gate_combine_shared",
        "moe::combine_shared",
        "gemv::linear",
    ] {
        let r = &report[kernel];
        assert!(
            r.launches > 0 && r.launches == r.identical,
            "{kernel}: {r:?}"
        );
    }
}

/// `gemv::linear_pair` from its CUDA source, classic and streaming, against its twin, and its
/// two outputs against `gemv::linear` on each weight: the same bytes (rule `gdn_in_proj` is
/// `bit_identical`), at widths that share no multiple, a partial last chunk of k, and rows
/// past one tile.
#[test]
fn a_linear_pair_gives_the_bytes_of_its_two_linears() {
    use solder_config::Levers;
    use solder_model_layers::kernels::gemv::{LinearPair, LINEAR_PAIR};
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    for (rows, k, n1, n2) in [
        (1u32, 300u32, 37u32, 6u32),
        (3, 2051, 9, 20),
        (11, 96, 5, 3),
    ] {
        let at = format!("rows {rows}, k {k}, widths {n1} and {n2}");
        let x = upload(&mut backend, &bf16_values(rows * k, 1.0));
        let (w1, w2) = (
            upload(&mut backend, &bf16_values(n1 * k, 2.0)),
            upload(&mut backend, &bf16_values(n2 * k, 3.0)),
        );
        let b1 = upload(&mut backend, &bf16_values(n1, 4.0));
        let out = |backend: &mut CpuBackend, n: u32| {
            let bytes = (rows * n * 2) as usize;
            upload(backend, &vec![0x5a; bytes])
        };
        let mut linear = |w, bias, n| {
            let y = out(&mut backend, n);
            let launch = Linear {
                x,
                w,
                bias,
                y,
                rows,
                k,
                n_out: n,
                scratch: None,
            }
            .launch(LINEAR);
            run(&mut backend, &launch);
            download(&mut backend, y.ptr, y.bytes)
        };
        let want = (linear(w1, Some(b1), n1), linear(w2, None, n2));
        for streaming in [false, true] {
            let (y1, y2) = (out(&mut backend, n1), out(&mut backend, n2));
            let a = LinearPair {
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
                scratch: None,
            };
            let launch = if streaming {
                // A split (k 2051 over few blocks) merges through a zeroed scratch.
                let (shape, mut a) = (a.shape(&Levers::default()), a);
                if shape.scratch_bytes > 0 {
                    a.scratch = Some(upload(&mut backend, &vec![0; shape.scratch_bytes]));
                }
                a.launch_in(shape)
            } else {
                a.launch(LINEAR_PAIR)
            };
            run(&mut backend, &launch);
            let got = (
                download(&mut backend, y1.ptr, y1.bytes),
                download(&mut backend, y2.ptr, y2.bytes),
            );
            assert!(
                got == want,
                "{at}, streaming {streaming}: not two linears' bytes"
            );
        }
    }
    let report = backend.emulation().unwrap().report();
    for kernel in ["gemv::linear_pair", "gemv::linear"] {
        let r = &report[kernel];
        assert!(
            r.launches > 0 && r.launches == r.identical,
            "{kernel}: {r:?}"
        );
    }
}
