//! The CUDA sources at the last of 262,144 positions (Qwen3-Next's limit), run on the host
//! beside their twins (shadow mode): a tiny llama planned for 262,144 positions decodes at
//! position 262,143 over a zeroed cache, so attention's 16 chunks of 16,384 tokens, its
//! block table of 16,384 pages and the KV write into page 16,384 all go through the kernels'
//! own index arithmetic, and each launch's bytes are compared with its twin's.

use solder_circuit::{Policy, RuleSet};
use solder_config::ServeShape;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::meta::{MetaRow, StepMeta};
use solder_model_layers::{Boot, CircuitExec, KvShape, WeightSource};

use super::report::EmuVerdict;

const POSITIONS: usize = 262_144;
const BLOCK: usize = 16;

#[test]
fn the_cuda_sources_decode_at_position_262143_as_their_twins() {
    let root = crate::paths::workspace_root();
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(2)).unwrap();
    backend.set_emulation(Some(super::emulation(&root, EmuMode::Shadow).unwrap()));
    let builtin = crate::parity::builtin_named("tiny-llama").unwrap();
    let mut config = builtin.config().unwrap();
    config.max_position_embeddings = POSITIONS;
    let blocks = POSITIONS / BLOCK;
    let boot = Boot {
        config,
        serve: ServeShape::with_max_batch(1).unwrap(),
        rules: RuleSet::from_file(&root.join("fusions/FUSIONS.toml")).unwrap(),
        policy: Policy::default(),
        weights: WeightSource::Random { seed: builtin.seed },
        kv: KvShape {
            pages: blocks + 2,
            block_size: BLOCK,
            max_seq_len: POSITIONS,
            max_sequences: 2,
        },
        precision: Default::default(),
    };
    let mut exec = CircuitExec::build(&mut backend, boot).unwrap();
    // A zeroed cache stands in for the 262,143 tokens before: only the last one's k and v are
    // not zero, so a chunk the CUDA source skipped or read twice changes the softmax's sum.
    backend
        .memset(exec.kv_cache(), 0, exec.layout.state_bytes)
        .unwrap();
    let pages: Vec<u32> = (1..=blocks as u32).collect();
    let meta = StepMeta::new(
        &exec.layout.meta,
        &[MetaRow::Live {
            token: 5,
            position: POSITIONS - 1,
            pages: &pages,
            state_slot: 0,
            state_slot_out: 0,
            snapshot: false,
            logits: true,
        }],
    )
    .unwrap();
    let stream = backend.default_stream();
    meta.upload(&mut backend, stream, exec.workspace()).unwrap();
    let program = exec.decode_program().unwrap();
    exec.run(&mut backend, program).unwrap();
    let mut raw = vec![0u8; exec.config.vocab_size * 4];
    backend
        .copy_d2h(exec.workspace().offset(exec.layout.logits_offset), &mut raw)
        .unwrap();
    assert!(raw
        .chunks_exact(4)
        .all(|b| f32::from_le_bytes(b.try_into().unwrap()).is_finite()));
    let report = backend.emulation().unwrap().report();
    let verdict = EmuVerdict::of(report);
    verdict.print();
    assert!(
        report.keys().any(|k| k.starts_with("attn::")),
        "no attention launch: {:?}",
        report.keys()
    );
    assert!(verdict.passes(), "differing: {:?}", verdict.differing());
    exec.free(&mut backend).unwrap();
}
