//! Shadow mode catches a wrong CUDA kernel: a copy of a module's source with one term of one
//! sum dropped, compiled as the modules are, differs from the twin (issue 21 found such a gemv
//! passing as rounding). Since every twin does its kernel's order, the unmutated kernels are
//! byte-identical (`tests`, `tests_nan`), so any difference is the mutation's.

use std::path::{Path, PathBuf};
use std::process::Command;

use half::bf16;
use solder_gpu_runtime::cpu::emu::{library_path, EmuMode, Emulation, KernelParity};
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::kernels::attn::{scratch_bytes, PagedAttention, PAGED_DECODE};
use solder_model_layers::kernels::gemv::{Linear, LINEAR};
use solder_model_layers::kernels::{Buf, Launch};

use super::tests::{run, upload};

/// Builds `module` from its source with each `from` (which must occur exactly once, in the
/// module's source or else in common.cuh) replaced by its `to`, into a fresh folder; returns
/// the folder.
pub(super) fn build_mutant(module: &str, edits: &[(&str, &str)]) -> PathBuf {
    // One folder per call: tests of one module run side by side.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = crate::paths::workspace_root();
    let path = super::generate::source_path(&root, module);
    let mut source = std::fs::read_to_string(&path).unwrap();
    // An edit not in the module's source applies to common.cuh, copied beside the mutant: the
    // module's `#include "common.cuh"` finds the copy first.
    let common_path = root.join(solder_kernels::CUDA_DIR).join("common.cuh");
    let mut common = std::fs::read_to_string(&common_path).unwrap();
    let mut common_edited = false;
    for (from, to) in edits {
        match source.matches(from).count() {
            1 => source = source.replace(from, to),
            0 => {
                assert_eq!(
                    common.matches(from).count(),
                    1,
                    "{module}: `{from}` is once in neither {module}.cu nor common.cuh"
                );
                common = common.replace(from, to);
                common_edited = true;
            }
            _ => panic!("{module}: `{from}` is not unique"),
        }
    }
    let dir = std::env::temp_dir().join(format!(
        "solder-emu-mutant-{module}-{}-{call}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    if common_edited {
        std::fs::write(dir.join("common.cuh"), common).unwrap();
    }
    let mutant = dir.join(format!("{module}.cu"));
    std::fs::write(&mutant, source).unwrap();
    // The unit over the mutant (included, or copied in when its dynamic shared memory is
    // rewritten).
    let text = super::generate::unit_at(&root, module, &mutant)
        .unwrap()
        .text;
    let cpp = dir.join(format!("{module}.cpp"));
    std::fs::write(&cpp, text).unwrap();
    let output = Command::new(super::CXX)
        .args(super::CXX_FLAGS)
        .arg("-I")
        .arg(root.join(super::generate::EMU_DIR))
        .arg("-I")
        .arg(root.join(solder_kernels::CUDA_DIR))
        .arg(&cpp)
        .arg("-o")
        .arg(library_path(&dir, module))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    dir
}

/// Runs `launch` (built on `backend`'s buffers) in shadow mode against the emulation of
/// `module` in `dir`, then against the unmutated modules; returns the kernel's two records.
pub(super) fn shadow(
    dir: &Path,
    module: &str,
    backend: &mut CpuBackend,
    launch: &Launch,
) -> (KernelParity, KernelParity) {
    let mut record = |emulation: Emulation| {
        backend.set_emulation(Some(emulation));
        run(backend, launch);
        let report = backend.emulation().unwrap().report().clone();
        backend.set_emulation(None);
        report[launch.kernel].clone()
    };
    let mutant = record(Emulation::open(dir, &[module], EmuMode::Shadow).unwrap());
    let original =
        record(super::emulation(&crate::paths::workspace_root(), EmuMode::Shadow).unwrap());
    (mutant, original)
}

/// `shadow`, asserting that the mutant's one launch differs from the twin and the unmutated
/// build's does not (the test can fail, and fails for the mutation alone).
pub(super) fn assert_caught(dir: &Path, module: &str, backend: &mut CpuBackend, launch: &Launch) {
    let (mutant, original) = shadow(dir, module, backend, launch);
    assert_eq!((mutant.launches, mutant.identical), (1, 0), "{mutant:?}");
    assert_eq!(
        (original.launches, original.identical),
        (1, 1),
        "{original:?}"
    );
}

pub(super) fn values(n: u32, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..n)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            bf16::from_f32(v).to_le_bytes()
        })
        .collect()
}

#[test]
fn a_gemv_dot_missing_its_last_term_differs_from_the_twin() {
    // The mutation issue 21 tried: the last term of every dot with k > 1024 dropped (its x
    // read as 0), in both bodies (the classic block and the streaming entries).
    const CLASSIC: &str = "widen8(*reinterpret_cast<const uint4*>(&xs[rr][local]), xf);";
    const STREAM: &str = "widen8(*reinterpret_cast<const uint4*>(&xs[rr * SPAN + at]), xf);";
    let drop_last = |at: &str| {
        format!(
            "if (k > 1024u && {at} <= k - 1u && k - 1u < {at} + 8u) {{ xf[k - 1u - ({at})] = 0.0f; }}"
        )
    };
    let classic = format!("{CLASSIC}\n{}", drop_last("seg_base + local"));
    let stream = format!("{STREAM}\n{}", drop_last("kb + local"));
    let dir = build_mutant("gemv", &[(CLASSIC, &classic), (STREAM, &stream)]);
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let (rows, k, n_out) = (2u32, 2600u32, 64u32);
    let x = upload(&mut backend, &values(rows * k, 0x9e3779b97f4a7c15));
    let w = upload(&mut backend, &values(n_out * k, 0x2545f4914f6cdd1d));
    let bytes = (rows * n_out * 2) as usize;
    let y = Buf::new(backend.alloc(bytes).unwrap(), bytes);
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
    .launch(LINEAR);
    assert_caught(&dir, "gemv", &mut backend, &launch);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn attention_missing_one_key_per_tile_differs_from_the_twin() {
    // The first key of every 32-key tile left out of Σ p·v (still in the softmax's sum).
    let dir = build_mutant(
        "attn",
        &[(
            "for (unsigned jj = 0; jj < 32u; ++jj) {",
            "for (unsigned jj = 1; jj < 32u; ++jj) {",
        )],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    // 600 tokens: three flash-decoding splits.
    let (heads, kv_heads, head_dim, block_size, len) = (2u32, 1u32, 32u32, 16u32, 600u32);
    let pages = len.div_ceil(block_size);
    let q = upload(&mut backend, &values(heads * head_dim, 7));
    let cache_elems = pages * 2 * block_size * kv_heads * head_dim;
    let cache = upload(&mut backend, &values(cache_elems, 11));
    let table: Vec<u8> = (0..pages).flat_map(|p| (p as i32).to_le_bytes()).collect();
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
    assert_caught(&dir, "attn", &mut backend, &launch);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_output_gate_applied_before_attentions_rounding_differs_from_the_twin() {
    // Qwen3-Next's gate multiplied into attention's f32 output, not into the bf16 value attention
    // stores (act::sigmoid_mul's input): one rounding where the reference routing has two.
    use solder_model_layers::kernels::flash::{PagedMma, PAGED_MMA};
    let attn = build_mutant(
        "attn",
        &[(
            "out[q_at + d] = fold.gate != nullptr ? sigmoid_gated(o, fold.gate[q_at + d]) : o;",
            "out[q_at + d] = fold.gate != nullptr ? to_bf16(__fmul_rn(empty ? 0.0f : \
             __fdiv_rn(num, den), sigmoid_f32(to_f32(fold.gate[q_at + d])))) : o;",
        )],
    );
    let flash = build_mutant(
        "flash",
        &[
            (
                "store_gated(out, gate, at[s] + d, to_bf16(o));",
                "out[at[s] + d] = gate != nullptr ? to_bf16(__fmul_rn(o, \
                 sigmoid_f32(to_f32(gate[at[s] + d])))) : to_bf16(o);",
            ),
            (
                "store_gated(out, gate, at[s] + d, to_bf16(__fdiv_rn(num, merge_den[m])));",
                "out[at[s] + d] = gate != nullptr ? to_bf16(__fmul_rn(__fdiv_rn(num, \
                 merge_den[m]), sigmoid_f32(to_f32(gate[at[s] + d])))) : \
                 to_bf16(__fdiv_rn(num, merge_den[m]));",
            ),
        ],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    // One row of 600 tokens (several splits and chunks), two heads on one kv head.
    let (heads, kv_heads, head_dim, block_size, len) = (2u32, 1u32, 64u32, 16u32, 600u32);
    let pages = len.div_ceil(block_size);
    let q = upload(&mut backend, &values(heads * head_dim, 7));
    let gate = upload(&mut backend, &values(heads * head_dim, 13));
    let cache_elems = pages * 2 * block_size * kv_heads * head_dim;
    let cache = upload(&mut backend, &values(cache_elems, 11));
    let table: Vec<u8> = (0..pages).flat_map(|p| (p as i32).to_le_bytes()).collect();
    let block_tables = upload(&mut backend, &table);
    let out_bytes = (heads * head_dim * 2) as usize;
    let scratch_len = scratch_bytes(1, heads as usize, head_dim as usize);
    let scratch = upload(&mut backend, &vec![0u8; scratch_len]);
    // At 600 tokens (chunks merged) and at 40 (one chunk: flash's other store).
    for len in [len, 40] {
        let seq_lens = upload(&mut backend, &(len as i32).to_le_bytes());
        let out = Buf::new(backend.alloc(out_bytes).unwrap(), out_bytes);
        let launches = [
            (
                &attn,
                "attn",
                PagedAttention {
                    q,
                    cache,
                    block_tables,
                    seq_lens,
                    gate: Some(gate),
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
                .launch(PAGED_DECODE),
            ),
            (
                &flash,
                "flash",
                PagedMma {
                    q,
                    cache,
                    block_tables,
                    seq_lens,
                    gate: Some(gate),
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
                    rows_per_block: 1,
                }
                .launch(PAGED_MMA),
            ),
        ];
        for (dir, module, launch) in &launches {
            let (mutant, original) = shadow(dir, module, &mut backend, launch);
            assert_eq!(
                (mutant.launches, mutant.identical),
                (1, 0),
                "{module} at {len}: {mutant:?}"
            );
            assert_eq!(
                (original.launches, original.identical),
                (1, 1),
                "{module} at {len}: {original:?}"
            );
        }
    }
    std::fs::remove_dir_all(&attn).ok();
    std::fs::remove_dir_all(&flash).ok();
}
