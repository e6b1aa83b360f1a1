//! `gpu-kernels --family qkv`: the qk-norm projection with rope and the KV write
//! on the tensor cores at Qwen3-8B's and Qwen3-32B's attention shapes
//! (`gemm::qkv_norm_rope_kv_mma`) and Qwen3-Next-80B's gated one
//! (`gemm::qkv_gated_norm_zc_rope_kv_mma`, 256-wide heads), each through the 64 × 32 tile and
//! through its `_large` entry (lever `mma_large`), from the same buffers. A `_large` qk-norm
//! block stages a head's 128 rows in 32 KB (a 128-wide head) or 64 KB (256) of dynamic shared
//! memory beside its 27 KB of static: past the 48 KB a launch gets without opting in, so these
//! launches are the device's proof of the CUDA backend's opt-in as well as of the entries'
//! bytes. At each width both launches' q (and gate) outputs and KV cache must be the same
//! bytes, finite and not all zero; then each is timed alone, against its roofline.
//!
//! On the CPU backend the shapes are cut (k by 32, the heads by 8): a dry run of the harness on
//! the twins.

use solder_circuit::WeightFormat;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::kernels::gemm::{QkvRopeKvParts, QkvTile};
use solder_model_layers::kernels::{Buf, Launch};

use super::alone::{bf16_bytes, download_bf16, launch_once, time, wave, Buffers};
// The H200 peaks the plan's roofline uses.
use super::tiles::{TBPS, TFLOPS};

/// Cache slots a page.
const BLOCK_SIZE: u32 = 16;

/// One model's attention input projection: its label (and the summary row's), k, heads, kv
/// heads, head_dim, rotary dims, and whether q's weight holds each head's `[q | gate]` (zero-centred qk-norm).
#[derive(Clone, Copy)]
struct Attention {
    label: &'static str,
    short: &'static str,
    k: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rotary_dim: u32,
    gated: bool,
}

const SHAPES: [Attention; 3] = [
    Attention {
        label: "qwen3-8b",
        short: "8b",
        k: 4096,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        rotary_dim: 128,
        gated: false,
    },
    Attention {
        label: "qwen3-32b",
        short: "32b",
        k: 5120,
        heads: 64,
        kv_heads: 8,
        head_dim: 128,
        rotary_dim: 128,
        gated: false,
    },
    Attention {
        label: "qwen3-next-80b",
        short: "next",
        k: 2048,
        heads: 16,
        kv_heads: 2,
        head_dim: 256,
        rotary_dim: 64,
        gated: true,
    },
];

impl Attention {
    /// The shape cut for a dry run: k by `cut`, the heads by `cut / 4` (at least one each).
    fn cut(&self, cut: u32) -> Attention {
        let heads_by = (cut / 4).max(1);
        Attention {
            k: (self.k / cut).max(16),
            heads: (self.heads / heads_by).max(1),
            kv_heads: (self.kv_heads / heads_by).max(1),
            ..*self
        }
    }

    /// q's weight rows (each head's q, and gated its gate too).
    fn q_rows(&self) -> u32 {
        self.heads * self.head_dim * if self.gated { 2 } else { 1 }
    }

    /// Every weight row: q's, k's and v's.
    fn n(&self) -> u32 {
        self.q_rows() + 2 * self.kv_heads * self.head_dim
    }
}

/// Times every shape at every width through both tiles; prints a line each and the summary
/// line `qkv kernels: …`.
pub fn time_qkv(
    backend: &mut dyn GpuBackend,
    rows: &[u32],
    runs: usize,
    cut: u32,
) -> Result<(), String> {
    println!(
        "qk-norm q/k/v with rope and the KV write on the tensor cores{}; {runs} launches each, \
         medians",
        if cut > 1 {
            " (shapes cut: a dry run)"
        } else {
            ""
        }
    );
    println!(
        "{:>6} {:<15} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>12} {:>8}",
        "rows",
        "shape",
        "wide us",
        "large us",
        "wide/large",
        "blocks",
        "large",
        "stage KB",
        "roofline us",
        "of roof"
    );
    let mut summary = Vec::new();
    for shape in &SHAPES {
        let s = match cut {
            1 => *shape,
            _ => shape.cut(cut),
        };
        let timed =
            time_widths(backend, &s, rows, runs).map_err(|e| format!("{}: {e}", s.label))?;
        for (&r, t) in rows.iter().zip(timed) {
            let (k, n) = (f64::from(s.k), f64::from(s.n()));
            let r_ = f64::from(r);
            // Weights once, x, q (and gate) out, k and v written to the cache.
            let moved = 2.0 * (k * n + r_ * k + r_ * n);
            let roof = (moved / TBPS).max(2.0 * r_ * k * n / TFLOPS) * 1e6;
            let best = t.wide.min(t.large);
            println!(
                "{r:>6} {:<15} {:>10.1} {:>10.1} {:>10.3} {:>8} {:>8} {:>9} {roof:>12.1} {:>8.3}",
                s.label,
                t.wide,
                t.large,
                t.wide / t.large,
                t.blocks[0],
                t.blocks[1],
                t.stage_bytes / 1024,
                roof / best
            );
            summary.push((r, s.short, t.wide / t.large, roof / best));
        }
    }
    println!("{}", summary_line(&summary));
    Ok(())
}

/// `qkv kernels: …`: at the widest width, each shape's wide tile's time over the large one's
/// and the faster one's fraction of its roofline (short enough for the bundle's summary row).
fn summary_line(cases: &[(u32, &str, f64, f64)]) -> String {
    let Some(wide) = cases.iter().map(|c| c.0).max() else {
        return "qkv kernels: no widths".into();
    };
    let at = |f: fn(&(u32, &str, f64, f64)) -> f64| {
        let parts: Vec<String> = (cases.iter().filter(|c| c.0 == wide))
            .map(|c| format!("{} {:.2}", c.1, f(c)))
            .collect();
        parts.join(" ")
    };
    format!(
        "qkv kernels: wide/large@{wide} {}; of roof@{wide} {} (bytes equal)",
        at(|c| c.2),
        at(|c| c.3)
    )
}

/// One shape at one width: the two tiles' medians, blocks and the large launch's stage.
struct Timed {
    wide: f64,
    large: f64,
    /// Blocks of the wide and the large launch.
    blocks: [u32; 2],
    stage_bytes: u32,
}

/// The buffers one tile's launch writes.
#[derive(Clone, Copy)]
struct Outputs {
    q: Buf,
    gate: Option<Buf>,
    cache: Buf,
}

/// One shape at each of `widths`, both tiles from the same inputs (uploaded once, sized for
/// the widest), each into its own outputs: compared byte for byte, then timed.
fn time_widths(
    backend: &mut dyn GpuBackend,
    s: &Attention,
    widths: &[u32],
    runs: usize,
) -> Result<Vec<Timed>, String> {
    let widest = widths.iter().copied().max().unwrap_or(1);
    let (k, hd) = (s.k as usize, s.head_dim as usize);
    let nkv = (s.kv_heads * s.head_dim) as usize;
    let pages = widest.div_ceil(BLOCK_SIZE) + 1;
    let mut buffers = Buffers::new(backend);
    let x = buffers.upload(&bf16_bytes(wave(widest as usize * k, 0.5)))?;
    // Weights about ±1/√k, so each projection stays about ±1.
    let scale = 1.0 / (s.k as f32).sqrt();
    let mut weight =
        |n: usize, seed| buffers.upload(&bf16_bytes(wave(n * k, seed).map(|v| v * scale)));
    let w = [
        weight(s.q_rows() as usize, 1.5)?,
        weight(nkv, 2.5)?,
        weight(nkv, 3.5)?,
    ];
    // qk-norm's weights: about 1, or about 0 where they are zero-centred (`1 + w`).
    let centre = if s.gated { 0.0 } else { 1.0 };
    let wqn = buffers.upload(&bf16_bytes(wave(hd, 4.5).map(|v| centre + 0.25 * v)))?;
    let wkn = buffers.upload(&bf16_bytes(wave(hd, 5.5).map(|v| centre + 0.25 * v)))?;
    let ints = |v: Vec<i32>| {
        v.into_iter()
            .flat_map(i32::to_le_bytes)
            .collect::<Vec<u8>>()
    };
    // Positions spread over 32,768; rows in slot order.
    let positions = buffers.upload(&ints(
        (0..widest as i32).map(|r| (r * 613 + 7) % 32_768).collect(),
    ))?;
    let slots = buffers.upload(&ints((0..widest as i32).collect()))?;
    let half = s.rotary_dim / 2;
    let mut table: Vec<f32> = (0..half)
        .map(|i| 1.0 / 1e6f32.powf(2.0 * i as f32 / s.rotary_dim as f32))
        .collect();
    table.push(1.0); // the attention scaling
    let inv_freq = buffers.upload(
        &table
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    // q's (and the gate's) bytes a row.
    let q_row = s.heads as usize * hd * 2;
    let q_bytes = widest as usize * q_row;
    let cache_bytes = (pages * 2 * BLOCK_SIZE) as usize * nkv * 2;
    let mut outputs = || -> Result<Outputs, String> {
        Ok(Outputs {
            q: buffers.upload(&vec![0u8; q_bytes])?,
            gate: match s.gated {
                true => Some(buffers.upload(&vec![0u8; q_bytes])?),
                false => None,
            },
            cache: buffers.upload(&vec![0u8; cache_bytes])?,
        })
    };
    let outs = [outputs()?, outputs()?];
    let mut timed = Vec::new();
    for &rows in widths {
        let at = |what: String| format!("at {rows} rows: {what}");
        let r = rows as usize;
        let launch = |o: Outputs, tile| {
            QkvRopeKvParts {
                x: Buf::new(x.ptr, r * k * 2),
                w,
                bias: [None; 3],
                norm: Some((wqn, wkn, 1e-6)),
                gate: o.gate.map(|g| Buf::new(g.ptr, r * q_row)),
                positions: Buf::new(positions.ptr, r * 4),
                inv_freq,
                slot_mapping: Buf::new(slots.ptr, r * 4),
                q_out: Buf::new(o.q.ptr, r * q_row),
                cache: o.cache,
                dims: [
                    rows,
                    s.k,
                    s.heads,
                    s.kv_heads,
                    s.head_dim,
                    s.rotary_dim,
                    BLOCK_SIZE,
                    pages,
                ],
            }
            .launch_tile([WeightFormat::Bf16; 3], tile)
            .expect("three bf16 weights are one format")
        };
        let launches = [
            launch(outs[0], QkvTile::Wide),
            launch(outs[1], QkvTile::Large),
        ];
        let mut written = Vec::new();
        for (l, o) in launches.iter().zip(outs) {
            written.push(run_and_read(buffers.backend(), l, o, r * q_row).map_err(at)?);
        }
        if written[0] != written[1] {
            return Err(at(format!(
                "{}'s q, gate or cache bytes are not {}'s",
                launches[1].kernel, launches[0].kernel
            )));
        }
        let wide = time(buffers.backend(), &launches[0], runs).map_err(at)?;
        let large = time(buffers.backend(), &launches[1], runs).map_err(at)?;
        let blocks = launches
            .each_ref()
            .map(|l| l.config.grid.iter().product::<u32>());
        timed.push(Timed {
            wide,
            large,
            blocks,
            stage_bytes: launches[1].config.shared_bytes,
        });
    }
    buffers.free()?;
    Ok(timed)
}

/// Zeroes `o`, runs `launch` once and reads back its first `q_bytes` of q (and of the gate)
/// and the whole cache, as bits (`alone::download_bf16`'s values, which widen bf16 exactly);
/// refuses outputs that are not finite or are all zero.
fn run_and_read(
    backend: &mut dyn GpuBackend,
    launch: &Launch,
    o: Outputs,
    q_bytes: usize,
) -> Result<Vec<u32>, String> {
    let outputs = [
        Some(Buf::new(o.q.ptr, q_bytes)),
        o.gate.map(|g| Buf::new(g.ptr, q_bytes)),
    ];
    let outputs: Vec<Buf> = outputs.into_iter().flatten().chain([o.cache]).collect();
    for b in [o.q, o.cache].into_iter().chain(o.gate) {
        (backend.copy_h2d(b.ptr, &vec![0u8; b.bytes])).map_err(|e| e.to_string())?;
    }
    launch_once(backend, launch)?;
    let mut bits = Vec::new();
    for b in outputs {
        let v = download_bf16(backend, b)?;
        if v.iter().any(|v| !v.is_finite()) || v.iter().all(|&v| v == 0.0) {
            return Err(format!(
                "{}'s output is not finite, or all zero",
                launch.kernel
            ));
        }
        bits.extend(v.iter().map(|v| v.to_bits()));
    }
    Ok(bits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use solder_gpu_runtime::cpu::emu::EmuMode;
    use solder_model_layers::kernels::gemm::{
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE, QKV_NORM_ROPE_KV_MMA_LARGE,
    };

    /// The harness over the CUDA sources run by the host emulation (shadow mode: the twin,
    /// then the emulated kernel, whose bytes are kept): at a width of one partial row block and
    /// one of two (130 rows), each shape's two tiles write the same q, gate and cache bytes
    /// from the harness's buffers, finite and not all zero, and each launch its twin's.
    #[test]
    fn the_emulated_tiles_agree_in_the_harness() {
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
        let root = crate::paths::workspace_root();
        backend.set_emulation(Some(crate::emu::emulation(&root, EmuMode::Shadow).unwrap()));
        for shape in &SHAPES {
            let cut = Attention {
                k: 48,
                heads: 2,
                kv_heads: 1,
                ..*shape
            };
            let timed = time_widths(&mut backend, &cut, &[5, 130], 1)
                .unwrap_or_else(|e| panic!("{}: {e}", shape.label));
            assert_eq!(timed.len(), 2);
            // The large launch's stage: a head's 128 rows.
            assert_eq!(timed[1].stage_bytes, 128 * shape.head_dim * 2);
        }
        let report = backend.emulation().unwrap().report();
        for entry in [
            QKV_NORM_ROPE_KV_MMA_LARGE,
            QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE,
        ] {
            let parity = &report[entry.as_str()];
            assert!(parity.launches >= 4, "{entry:?}: {parity:?}");
            assert_eq!(parity.identical, parity.launches, "{entry:?}: {parity:?}");
        }
    }

    #[test]
    fn cut_shapes_keep_a_head_of_each_kind_and_their_head_dims() {
        for s in &SHAPES {
            let c = s.cut(32);
            assert!(c.heads >= 1 && c.kv_heads >= 1 && c.k >= 16, "{}", s.label);
            assert_eq!(
                (c.head_dim, c.rotary_dim, c.gated),
                (s.head_dim, s.rotary_dim, s.gated)
            );
            assert_eq!(s.cut(1).k, s.k);
        }
        assert_eq!(SHAPES[2].q_rows(), 2 * 16 * 256);
        assert_eq!(SHAPES[0].n(), 32 * 128 + 2 * 8 * 128);
    }
}
