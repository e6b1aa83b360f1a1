//! The o-fold kernels (`attn::paged_decode_o`, `attn::paged_causal_o`) through the host
//! emulation of their CUDA source: byte-identical to their CPU twin (which does the kernel's
//! per-head dot, `numerics::dot_head`, and its attention order), close to the emulated reference chain
//! (paged_decode → linear → residual_add), with one row past 256 tokens (a flash-decoding
//! split merged by its last block before the fold) and one within a single block, gated and
//! plain; both scratches' counters are zero again after every launch.

use half::bf16;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::kernels::add::{ResidualAdd, RESIDUAL_ADD};
use solder_model_layers::kernels::attn::fold::o_scratch_bytes;
use solder_model_layers::kernels::attn::{
    scratch_bytes, PagedAttention, PagedAttentionO, PAGED_CAUSAL_O, PAGED_DECODE, PAGED_DECODE_O,
};
use solder_model_layers::kernels::gemv::{Linear, LINEAR};
use solder_model_layers::kernels::{Buf, Launch, Name};

const ROWS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;
const N_OUT: usize = 96;
const BLOCK: usize = 16;
const MAX_BLOCKS: usize = 20;
const PAGES: usize = 2 + MAX_BLOCKS * ROWS;
/// Row 0 past 256 tokens (two flash-decoding chunks), row 1 within one block.
const LENS: [i32; ROWS] = [300, 37];

struct Host {
    q: Vec<bf16>,
    cache: Vec<bf16>,
    tables: Vec<i32>,
    gate: Vec<bf16>,
    wo: Vec<bf16>,
    bias: Vec<bf16>,
    h: Vec<f32>,
}

fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 23) as f32;
            (u - 1.0) * scale
        })
        .collect()
}

fn bf16s(seed: u64, n: usize, scale: f32) -> Vec<bf16> {
    values(seed, n, scale)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

impl Host {
    fn new() -> Host {
        let in_features = HEADS * HEAD_DIM;
        // Row r's blocks on pages 1 + r·MAX_BLOCKS.. (page 0 is never named).
        let tables = (0..ROWS * MAX_BLOCKS).map(|i| 1 + i as i32).collect();
        Host {
            q: bf16s(1, ROWS * in_features, 1.0),
            cache: bf16s(2, PAGES * 2 * BLOCK * KV_HEADS * HEAD_DIM, 1.0),
            tables,
            gate: bf16s(3, ROWS * in_features, 3.0),
            wo: bf16s(4, N_OUT * in_features, 0.25),
            bias: bf16s(5, N_OUT, 0.5),
            h: values(6, ROWS * N_OUT, 2.0),
        }
    }
}

/// Little-endian bytes of host values.
trait Le: Copy {
    fn le(self) -> Vec<u8>;
}

impl Le for bf16 {
    fn le(self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}

impl Le for f32 {
    fn le(self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}

impl Le for i32 {
    fn le(self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}

fn bytes_of<T: Le>(v: &[T]) -> Vec<u8> {
    v.iter().flat_map(|x| x.le()).collect()
}

fn upload(b: &mut CpuBackend, bytes: &[u8]) -> Buf {
    let ptr = b.alloc(bytes.len()).unwrap();
    b.copy_h2d(ptr, bytes).unwrap();
    Buf::new(ptr, bytes.len())
}

fn zeroed(b: &mut CpuBackend, bytes: usize) -> Buf {
    let ptr = b.alloc(bytes).unwrap();
    b.memset(ptr, 0, bytes).unwrap();
    Buf::new(ptr, bytes)
}

fn download(b: &mut CpuBackend, buf: Buf) -> Vec<u8> {
    let mut out = vec![0u8; buf.bytes];
    b.copy_d2h(buf.ptr, &mut out).unwrap();
    out
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn run(b: &mut CpuBackend, launch: &Launch) {
    let kernel = b.kernel(launch.kernel).unwrap();
    let stream = b.default_stream();
    b.launch(stream, kernel, &launch.config, &launch.args)
        .unwrap_or_else(|e| panic!("{}: {e}", launch.kernel));
}

fn backend(emulated: bool) -> CpuBackend {
    backend_in(emulated.then_some(EmuMode::Run))
}

fn backend_in(mode: Option<EmuMode>) -> CpuBackend {
    let mut b = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    if let Some(mode) = mode {
        let emulation = super::emulation(&crate::paths::workspace_root(), mode).unwrap();
        b.set_emulation(Some(emulation));
    }
    b
}

/// The inputs uploaded, with zeroed scratches.
struct Dev {
    q: Buf,
    cache: Buf,
    tables: Buf,
    lens: Buf,
    gate: Buf,
    wo: Buf,
    bias: Buf,
    h: Buf,
    scratch: Buf,
    o_scratch: Buf,
}

fn dev(b: &mut CpuBackend, host: &Host) -> Dev {
    Dev {
        q: upload(b, &bytes_of(&host.q)),
        cache: upload(b, &bytes_of(&host.cache)),
        tables: upload(b, &bytes_of(&host.tables)),
        lens: upload(b, &bytes_of(&LENS)),
        gate: upload(b, &bytes_of(&host.gate)),
        wo: upload(b, &bytes_of(&host.wo)),
        bias: upload(b, &bytes_of(&host.bias)),
        h: upload(b, &bytes_of(&host.h)),
        scratch: zeroed(b, scratch_bytes(ROWS, HEADS, HEAD_DIM)),
        o_scratch: zeroed(b, o_scratch_bytes(ROWS, HEADS, N_OUT)),
    }
}

/// h_out of the fold, and whether every counter of both scratches is zero after it.
fn fold(
    emulated: bool,
    host: &Host,
    gated: bool,
    kernel: Name<PagedAttentionO>,
) -> (Vec<f32>, bool) {
    fold_in(&mut backend(emulated), host, gated, kernel)
}

fn fold_in(
    b: &mut CpuBackend,
    host: &Host,
    gated: bool,
    kernel: Name<PagedAttentionO>,
) -> (Vec<f32>, bool) {
    let d = dev(b, host);
    let h_out = zeroed(b, ROWS * N_OUT * 4);
    let launch = PagedAttentionO {
        q: d.q,
        cache: d.cache,
        block_tables: d.tables,
        seq_lens: d.lens,
        gate: gated.then_some(d.gate),
        wo: d.wo,
        bias: Some(d.bias),
        h: d.h,
        h_out,
        scratch: d.scratch,
        o_scratch: d.o_scratch,
        rows: ROWS as u32,
        heads: HEADS as u32,
        kv_heads: KV_HEADS as u32,
        head_dim: HEAD_DIM as u32,
        block_size: BLOCK as u32,
        max_blocks: MAX_BLOCKS as u32,
        num_pages: PAGES as u32,
        window: 0,
        scale: 1.0 / (HEAD_DIM as f32).sqrt(),
        n_out: N_OUT as u32,
    }
    .launch(kernel);
    run(b, &launch);
    let out = f32s(&download(b, h_out));
    let scratch = download(b, d.scratch);
    let o_scratch = download(b, d.o_scratch);
    let slot = |words: usize| words * 4;
    let attn_slot = slot(1 + 16 * (HEAD_DIM + 2));
    let o_slot = slot(4 + HEADS * N_OUT);
    let zero_counters = (0..ROWS * HEADS)
        .all(|i| scratch[i * attn_slot..i * attn_slot + 4] == [0; 4])
        && (0..ROWS).all(|r| o_scratch[r * o_slot..r * o_slot + 4] == [0; 4]);
    (out, zero_counters)
}

/// The emulated reference chain, ungated: paged_decode → linear → residual_add.
fn chain(host: &Host) -> Vec<f32> {
    let mut b = backend(true);
    let d = dev(&mut b, host);
    let in_features = HEADS * HEAD_DIM;
    let attn = zeroed(&mut b, ROWS * in_features * 2);
    run(
        &mut b,
        &PagedAttention {
            q: d.q,
            cache: d.cache,
            block_tables: d.tables,
            seq_lens: d.lens,
            gate: None,
            out: attn,
            scratch: d.scratch,
            rows: ROWS as u32,
            heads: HEADS as u32,
            kv_heads: KV_HEADS as u32,
            head_dim: HEAD_DIM as u32,
            block_size: BLOCK as u32,
            max_blocks: MAX_BLOCKS as u32,
            num_pages: PAGES as u32,
            window: 0,
            scale: 1.0 / (HEAD_DIM as f32).sqrt(),
        }
        .launch(PAGED_DECODE),
    );
    let y = zeroed(&mut b, ROWS * N_OUT * 2);
    run(
        &mut b,
        &Linear {
            x: attn,
            w: d.wo,
            bias: Some(d.bias),
            y,
            rows: ROWS as u32,
            k: in_features as u32,
            n_out: N_OUT as u32,
            scratch: None,
        }
        .launch(LINEAR),
    );
    let out = zeroed(&mut b, ROWS * N_OUT * 4);
    run(
        &mut b,
        &ResidualAdd {
            h: d.h,
            x: y,
            out,
            rows: ROWS as u32,
            hidden: N_OUT as u32,
        }
        .launch(RESIDUAL_ADD),
    );
    f32s(&download(&mut b, out))
}

/// Within a bf16 rounding or two of the projection (|y| = |out − h|, at least 1).
fn close(a: &[f32], b: &[f32], h: &[f32], what: &str) -> usize {
    let mut differing = 0;
    for (i, ((x, y), h)) in a.iter().zip(b).zip(h).enumerate() {
        assert!(
            x.is_finite() && y.is_finite(),
            "{what}: element {i}: {x} vs {y}"
        );
        let scale = (y - h).abs().max(1.0);
        assert!(
            (x - y).abs() <= scale / 32.0,
            "{what}: element {i}: {x} vs {y}"
        );
        differing += (x.to_bits() != y.to_bits()) as usize;
    }
    differing
}

#[test]
fn the_o_fold_cuda_source_agrees_with_its_twin_and_the_reference_chain() {
    let host = Host::new();
    for gated in [false, true] {
        let (emulated, zero) = fold(true, &host, gated, PAGED_DECODE_O);
        assert!(zero, "gated {gated}: a counter was left non-zero");
        let (twin, _) = fold(false, &host, gated, PAGED_DECODE_O);
        let moved = close(
            &emulated,
            &twin,
            &host.h,
            &format!("emulated vs twin, gated {gated}"),
        );
        assert_eq!(
            moved, 0,
            "gated {gated}: the emulated fold is not its twin's bytes"
        );
        let (causal, zero) = fold(true, &host, gated, PAGED_CAUSAL_O);
        assert!(zero);
        assert_eq!(
            causal, emulated,
            "paged_causal_o is paged_decode_o's arithmetic"
        );
    }
    let (emulated, _) = fold(true, &host, false, PAGED_DECODE_O);
    let reference = chain(&host);
    let moved = close(
        &emulated,
        &reference,
        &host.h,
        "emulated fold vs emulated chain",
    );
    eprintln!(
        "o fold: emulated vs the emulated reference chain: {moved} of {} outputs differ",
        reference.len()
    );
}

#[test]
fn shadow_mode_runs_the_o_fold_source_beside_its_twin() {
    let host = Host::new();
    let mut b = backend_in(Some(EmuMode::Shadow));
    fold_in(&mut b, &host, true, PAGED_DECODE_O);
    let report = b.emulation().unwrap().report();
    let fold = &report["attn::paged_decode_o"];
    assert_eq!((fold.launches, fold.identical), (1, 1), "{fold:?}");
}

/// Heads 0 and 1 see the same q and kv head and have opposite, 2^12 times larger o weights:
/// the CUDA source's head-order sum cancels them exactly, as the twin's does, while the
/// reference chain's one dot keeps a rounding residue. So the emulated fold equals the twin
/// and differs from the emulated chain somewhere: the source sums per head in order.
#[test]
fn the_cuda_source_sums_the_heads_in_order() {
    let mut host = Host::new();
    let in_features = HEADS * HEAD_DIM;
    for r in 0..ROWS {
        let row = r * in_features;
        let head0: Vec<bf16> = host.q[row..row + HEAD_DIM].to_vec();
        host.q[row + HEAD_DIM..row + 2 * HEAD_DIM].copy_from_slice(&head0);
    }
    for f in 0..N_OUT {
        for i in 0..HEAD_DIM {
            let w = bf16::from_f32(host.wo[f * in_features + i].to_f32() * 4096.0);
            host.wo[f * in_features + i] = w;
            host.wo[f * in_features + HEAD_DIM + i] = -w;
        }
    }
    let (emulated, zero) = fold(true, &host, false, PAGED_DECODE_O);
    assert!(zero);
    let (twin, _) = fold(false, &host, false, PAGED_DECODE_O);
    let moved = close(
        &emulated,
        &twin,
        &host.h,
        "cancelling heads: emulated vs twin",
    );
    assert_eq!(
        moved, 0,
        "cancelling heads: the emulated fold is not its twin's bytes"
    );
    let reference = chain(&host);
    let moved = emulated
        .iter()
        .zip(&reference)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    eprintln!(
        "cancelling heads: emulated fold vs emulated chain: {moved} of {} differ",
        reference.len()
    );
    assert!(
        moved > 0,
        "the emulated fold equals the one-dot chain: no head-order sum"
    );
}
