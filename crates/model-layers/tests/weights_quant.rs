//! Quantized checkpoints → slot bytes: FP8 block (`weight_scale_inv`), compressed-tensors FP8
//! (`weight_scale`), AWQ and GPTQ int4 repacked into `circuit::format`'s layouts, dequantised
//! for a bf16 slot, and every refusal naming the tensor; seeded quantized weights; and a
//! streamed build equal to one from the dequantised host weights.

mod exec_support;

use exec_support::{
    assert_same_bytes, backend, boot, config, decode_alone, f16_le, f32_le, instance, prompt,
    roomy_kv, write_safetensors, RawTensor, TempDir, TINY_LLAMA,
};
use half::{bf16, f16};
use safetensors::Dtype;
use solder_circuit::ir::Circuit;
use solder_circuit::{Policy, WeightFormat};
use solder_config::{Fp8Strategy, Quantization};
use solder_model_layers::weights::fp8::e4m3_to_f32;
use solder_model_layers::weights::SplitMix64;
use solder_model_layers::{Checkpoint, CircuitExec, HostWeights, WeightSource, WeightsError};

/// The slot the tests quantize: `[64, 128]` (n = 64 output features, k = 128 inputs).
const DOWN: &str = "model.layers.0.mlp.down_proj";
const N: usize = 64;
const K: usize = 128;

fn circuit_with(format: WeightFormat) -> (Circuit, usize) {
    let mut circuit = instance(&config(TINY_LLAMA)).circuit;
    let slot = circuit
        .weights
        .iter()
        .position(|w| w.name == format!("{DOWN}.weight"))
        .expect("down_proj slot");
    assert_eq!(circuit.weights[slot].shape, [N, K]);
    circuit.weights[slot].format = format;
    (circuit, slot)
}

/// Every slot but `DOWN` as BF16 tensors, then `quantized`.
fn write(dir: &TempDir, circuit: &Circuit, quantized: Vec<RawTensor>) {
    let seeded = HostWeights::random(&instance(&config(TINY_LLAMA)).circuit, 5);
    let mut tensors: Vec<RawTensor> = circuit
        .weights
        .iter()
        .zip(&seeded.slots)
        .filter(|(slot, _)| slot.name != format!("{DOWN}.weight"))
        .map(|(slot, bytes)| raw(&slot.name, Dtype::BF16, slot.shape.clone(), bytes.clone()))
        .collect();
    tensors.extend(quantized);
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
}

fn raw(name: &str, dtype: Dtype, shape: Vec<usize>, data: Vec<u8>) -> RawTensor {
    RawTensor {
        name: name.into(),
        dtype,
        shape,
        data,
    }
}

fn load(
    dir: &TempDir,
    circuit: &Circuit,
    quant: Option<&Quantization>,
) -> Result<HostWeights, WeightsError> {
    HostWeights::load_quantized(circuit, &Checkpoint::open(dir.path())?, quant)
}

fn fp8_block(block: [usize; 2]) -> Quantization {
    Quantization::Fp8Block {
        block,
        not_converted: vec![],
    }
}

/// Random finite e4m3 codes (never NaN) and scales.
fn fp8_codes(seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    (0..N * K)
        .map(|_| {
            let b = (rng.next_u64() & 0xff) as u8;
            if b & 0x7f == 0x7f {
                0x38
            } else {
                b
            }
        })
        .collect()
}

fn scales(seed: u64, count: usize) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    // Values exact in bf16 and f16: the conversion to f32 must not change them.
    (0..count)
        .map(|_| f32::from((rng.next_u64() % 64) as u8 + 1) / 512.0)
        .collect()
}

fn align(x: usize) -> usize {
    x.div_ceil(256) * 256
}

/// The fp8 blob `circuit::format` defines: codes, then f32 scales at the next 256 bytes.
fn fp8_blob(codes: &[u8], scales: &[f32]) -> Vec<u8> {
    let mut blob = codes.to_vec();
    blob.resize(align(codes.len()), 0);
    blob.extend(f32_le(scales));
    blob
}

fn fp8_dequant(codes: &[u8], scales: &[f32], bn: usize, bk: usize) -> Vec<u8> {
    let cols = K.div_ceil(bk);
    (0..N * K)
        .flat_map(|at| {
            let (f, i) = (at / K, at % K);
            let w = e4m3_to_f32(codes[at]) * scales[(f / bn) * cols + i / bk];
            bf16::from_f32(w).to_le_bytes()
        })
        .collect()
}

#[test]
fn fp8_block_scales_in_every_float_dtype_fill_the_blob_with_partial_edge_blocks() {
    let (bn, bk) = (48, 48); // 64 / 48 and 128 / 48 leave partial blocks at both edges
    let (rows, cols) = (N.div_ceil(bn), K.div_ceil(bk));
    let format = WeightFormat::Fp8 {
        block_n: bn as u32,
        block_k: bk as u32,
    };
    let (circuit, slot) = circuit_with(format);
    let codes = fp8_codes(1);
    let s = scales(2, rows * cols);
    let quant = fp8_block([bn, bk]);
    for (dtype, data) in [
        (Dtype::F32, f32_le(&s)),
        (
            Dtype::BF16,
            s.iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        (
            Dtype::F16,
            f16_le(&s.iter().map(|v| f16::from_f32(*v)).collect::<Vec<_>>()),
        ),
    ] {
        let dir = TempDir::new("fp8-block");
        write(
            &dir,
            &circuit,
            vec![
                raw(
                    &format!("{DOWN}.weight"),
                    Dtype::F8_E4M3,
                    vec![N, K],
                    codes.clone(),
                ),
                raw(
                    &format!("{DOWN}.weight_scale_inv"),
                    dtype,
                    vec![rows, cols],
                    data,
                ),
            ],
        );
        let loaded = load(&dir, &circuit, Some(&quant)).expect("fp8 block loads");
        assert_eq!(loaded.slots[slot], fp8_blob(&codes, &s), "{dtype:?} scales");
        loaded.check_lengths(&circuit).unwrap();

        // The same checkpoint into a bf16 slot: dequantised at load.
        let (plain, slot) = circuit_with(WeightFormat::Bf16);
        let loaded = load(&dir, &plain, Some(&quant)).expect("fp8 dequantises");
        assert_eq!(loaded.slots[slot], fp8_dequant(&codes, &s, bn, bk));
    }
}

#[test]
fn compressed_tensors_fp8_channel_and_tensor_scales() {
    let codes = fp8_codes(3);
    let channel = scales(4, N);
    let cases = [
        (Fp8Strategy::Channel, vec![N, 1], channel.clone(), 1, K),
        (Fp8Strategy::Tensor, vec![], vec![0.125], N, K),
        (Fp8Strategy::Tensor, vec![1], vec![0.25], N, K),
    ];
    for (strategy, shape, s, bn, bk) in cases {
        let format = WeightFormat::Fp8 {
            block_n: bn as u32,
            block_k: bk as u32,
        };
        let (circuit, slot) = circuit_with(format);
        let quant = Quantization::Fp8Compressed {
            strategy,
            targets: vec!["Linear".into()],
            ignore: vec!["lm_head".into()],
        };
        let dir = TempDir::new("fp8-ct");
        let weight = raw(
            &format!("{DOWN}.weight"),
            Dtype::F8_E4M3,
            vec![N, K],
            codes.clone(),
        );
        let scale = raw(
            &format!("{DOWN}.weight_scale"),
            Dtype::F32,
            shape.clone(),
            f32_le(&s),
        );
        write(&dir, &circuit, vec![weight, scale]);
        let loaded = load(&dir, &circuit, Some(&quant)).expect("compressed fp8 loads");
        assert_eq!(
            loaded.slots[slot],
            fp8_blob(&codes, &s),
            "{strategy:?} {shape:?}"
        );

        // A static activation scale is refused by name.
        let dir = TempDir::new("fp8-ct-static");
        let weight = raw(
            &format!("{DOWN}.weight"),
            Dtype::F8_E4M3,
            vec![N, K],
            codes.clone(),
        );
        let scale = raw(
            &format!("{DOWN}.weight_scale"),
            Dtype::F32,
            shape,
            f32_le(&s),
        );
        let input = raw(
            &format!("{DOWN}.input_scale"),
            Dtype::F32,
            vec![1],
            f32_le(&[1.0]),
        );
        write(&dir, &circuit, vec![weight, scale, input]);
        match load(&dir, &circuit, Some(&quant)) {
            Err(WeightsError::Quantized {
                tensor, message, ..
            }) => {
                assert_eq!(tensor, format!("{DOWN}.input_scale"));
                assert!(message.contains("static activation"), "{message}");
            }
            Err(other) => panic!("expected the input_scale refused, got {other}"),
            Ok(_) => panic!("a static activation scale loaded"),
        }
    }
}

/// Hand-made int4 values: q[f][i], z[g][f], s[g][f] for group `g`.
struct Int4Case {
    q: Vec<u8>,
    z: Vec<u8>,
    s: Vec<f32>,
    group: usize,
}

impl Int4Case {
    fn new(seed: u64, group: usize) -> Int4Case {
        let mut rng = SplitMix64(seed);
        let groups = K / group;
        Int4Case {
            q: (0..N * K).map(|_| (rng.next_u64() & 15) as u8).collect(),
            z: (0..groups * N)
                .map(|_| (rng.next_u64() & 15) as u8)
                .collect(),
            s: scales(seed + 1, groups * N),
            group,
        }
    }

    fn groups(&self) -> usize {
        K / self.group
    }

    /// The Int4 blob: row f's k values two per byte (low nibble first), then f32 scales
    /// `[n, groups]`, then u8 zeros `[n, groups]`.
    fn blob(&self) -> Vec<u8> {
        let g = self.groups();
        let mut blob: Vec<u8> = (0..N * K / 2)
            .map(|b| self.q[2 * b] | (self.q[2 * b + 1] << 4))
            .collect();
        blob.resize(align(blob.len()), 0);
        for f in 0..N {
            for j in 0..g {
                blob.extend(self.s[j * N + f].to_le_bytes());
            }
        }
        blob.resize(align(blob.len()), 0);
        for f in 0..N {
            for j in 0..g {
                blob.push(self.z[j * N + f]);
            }
        }
        blob
    }

    fn dequant(&self) -> Vec<u8> {
        (0..N * K)
            .flat_map(|at| {
                let (f, i) = (at / K, at % K);
                let j = (i / self.group) * N + f;
                let w = (f32::from(self.q[at]) - f32::from(self.z[j])) * self.s[j];
                bf16::from_f32(w).to_le_bytes()
            })
            .collect()
    }

    fn scales_f16(&self) -> Vec<u8> {
        f16_le(&self.s.iter().map(|v| f16::from_f32(*v)).collect::<Vec<_>>())
    }

    /// AWQ GEMM: qweight `[k, n/8]`, feature 8c + ORDER[j] in nibble j; qzeros likewise.
    fn awq(&self) -> Vec<RawTensor> {
        const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
        let pack = |value: &dyn Fn(usize) -> u8| -> u32 {
            (0..8).fold(0u32, |w, j| w | (u32::from(value(ORDER[j])) << (4 * j)))
        };
        let mut qweight = Vec::new();
        for i in 0..K {
            for c in 0..N / 8 {
                qweight.extend(pack(&|o| self.q[(8 * c + o) * K + i]).to_le_bytes());
            }
        }
        let mut qzeros = Vec::new();
        for g in 0..self.groups() {
            for c in 0..N / 8 {
                qzeros.extend(pack(&|o| self.z[g * N + 8 * c + o]).to_le_bytes());
            }
        }
        vec![
            raw(
                &format!("{DOWN}.qweight"),
                Dtype::I32,
                vec![K, N / 8],
                qweight,
            ),
            raw(
                &format!("{DOWN}.qzeros"),
                Dtype::I32,
                vec![self.groups(), N / 8],
                qzeros,
            ),
            raw(
                &format!("{DOWN}.scales"),
                Dtype::F16,
                vec![self.groups(), N],
                self.scales_f16(),
            ),
        ]
    }

    /// GPTQ: qweight `[k/8, n]`, input 8r + j in nibble j; qzeros `[groups, n/8]` stored as
    /// z - 1 (v1) or z (v2); g_idx `[k]`.
    fn gptq(&self, v2: bool, g_idx: &[i32]) -> Vec<RawTensor> {
        let mut qweight = Vec::new();
        for r in 0..K / 8 {
            for f in 0..N {
                let w = (0..8).fold(0u32, |w, j| {
                    w | (u32::from(self.q[f * K + 8 * r + j]) << (4 * j))
                });
                qweight.extend(w.to_le_bytes());
            }
        }
        let mut qzeros = Vec::new();
        for g in 0..self.groups() {
            for c in 0..N / 8 {
                let w = (0..8).fold(0u32, |w, j| {
                    let z = self.z[g * N + 8 * c + j];
                    let stored = if v2 { z } else { z.wrapping_sub(1) & 15 };
                    w | (u32::from(stored) << (4 * j))
                });
                qzeros.extend(w.to_le_bytes());
            }
        }
        let g_idx: Vec<u8> = g_idx.iter().flat_map(|g| g.to_le_bytes()).collect();
        vec![
            raw(
                &format!("{DOWN}.qweight"),
                Dtype::I32,
                vec![K / 8, N],
                qweight,
            ),
            raw(
                &format!("{DOWN}.qzeros"),
                Dtype::I32,
                vec![self.groups(), N / 8],
                qzeros,
            ),
            raw(
                &format!("{DOWN}.scales"),
                Dtype::F16,
                vec![self.groups(), N],
                self.scales_f16(),
            ),
            raw(&format!("{DOWN}.g_idx"), Dtype::I32, vec![K], g_idx),
        ]
    }
}

fn awq(group: usize) -> Quantization {
    Quantization::Awq {
        group_size: group,
        zero_point: true,
        not_converted: vec![],
    }
}

fn gptq(group: usize, v2: bool) -> Quantization {
    Quantization::Gptq {
        group_size: group,
        sym: false,
        v2,
        not_converted: vec![],
    }
}

#[test]
fn awq_repacks_into_the_int4_layout_and_dequantises_for_a_bf16_slot() {
    let case = Int4Case::new(7, 32);
    let (circuit, slot) = circuit_with(WeightFormat::Int4 { group: 32 });
    let dir = TempDir::new("awq");
    write(&dir, &circuit, case.awq());
    let loaded = load(&dir, &circuit, Some(&awq(32))).expect("awq loads");
    assert_eq!(loaded.slots[slot], case.blob());
    let (plain, slot) = circuit_with(WeightFormat::Bf16);
    let loaded = load(&dir, &plain, Some(&awq(32))).expect("awq dequantises");
    assert_eq!(loaded.slots[slot], case.dequant());
}

#[test]
fn gptq_v1_and_v2_zeros_and_act_order_refused() {
    let case = Int4Case::new(9, 64);
    let in_order: Vec<i32> = (0..K as i32).map(|i| i / 64).collect();
    let (circuit, slot) = circuit_with(WeightFormat::Int4 { group: 64 });
    for v2 in [false, true] {
        let dir = TempDir::new("gptq");
        write(&dir, &circuit, case.gptq(v2, &in_order));
        let loaded = load(&dir, &circuit, Some(&gptq(64, v2))).expect("gptq loads");
        assert_eq!(loaded.slots[slot], case.blob(), "v2 = {v2}");
    }
    let mut shuffled = in_order.clone();
    shuffled.swap(0, K - 1);
    let dir = TempDir::new("gptq-act-order");
    write(&dir, &circuit, case.gptq(false, &shuffled));
    match load(&dir, &circuit, Some(&gptq(64, false))) {
        Err(WeightsError::Quantized {
            tensor, message, ..
        }) => {
            assert_eq!(tensor, format!("{DOWN}.g_idx"));
            assert!(message.contains("act-order"), "{message}");
        }
        Err(other) => panic!("expected act-order refused, got {other}"),
        Ok(_) => panic!("an act-order checkpoint loaded"),
    }
}

fn refused<T>(result: Result<T, WeightsError>, tensor: &str, words: &[&str]) {
    match result {
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains(tensor), "{text} names {tensor}");
            for w in words {
                assert!(text.contains(w), "{text} says {w}");
            }
        }
        Ok(_) => panic!("loaded; expected a refusal naming {tensor}"),
    }
}

#[test]
fn mismatched_formats_are_refused_by_name() {
    let weight = format!("{DOWN}.weight");
    // A quantized slot whose checkpoint tensor is plain bf16.
    let (circuit, _) = circuit_with(WeightFormat::Int4 { group: 32 });
    let dir = TempDir::new("plain-for-int4");
    let plain = raw(&weight, Dtype::BF16, vec![N, K], vec![0; N * K * 2]);
    write(&dir, &circuit, vec![plain]);
    refused(
        load(&dir, &circuit, Some(&awq(32))),
        &weight,
        &["BF16", "int4[g32]"],
    );

    // A bf16 weight beside a scale tensor.
    let (bf16_slot, _) = circuit_with(WeightFormat::Bf16);
    let dir = TempDir::new("orphan-scale");
    let plain = raw(&weight, Dtype::BF16, vec![N, K], vec![0; N * K * 2]);
    let scale = raw(
        &format!("{DOWN}.weight_scale"),
        Dtype::F32,
        vec![],
        f32_le(&[1.0]),
    );
    write(&dir, &bf16_slot, vec![plain, scale]);
    refused(
        load(&dir, &bf16_slot, None),
        &weight,
        &["weight_scale`", "BF16"],
    );

    // AWQ tensors for an fp8 slot; a group other than the slot's.
    let case = Int4Case::new(11, 32);
    let dir = TempDir::new("awq-for-fp8");
    write(&dir, &circuit, case.awq());
    let (fp8_slot, _) = circuit_with(WeightFormat::Fp8 {
        block_n: 1,
        block_k: K as u32,
    });
    let qweight = format!("{DOWN}.qweight");
    refused(
        load(&dir, &fp8_slot, Some(&awq(32))),
        &qweight,
        &["int4[g32]", "fp8"],
    );
    let (g64, _) = circuit_with(WeightFormat::Int4 { group: 64 });
    refused(
        load(&dir, &g64, Some(&awq(32))),
        &qweight,
        &["int4[g32]", "int4[g64]"],
    );
    // Packed int4 with no quantization_config, or an fp8 one.
    refused(
        load(&dir, &circuit, None),
        &qweight,
        &["quantization_config"],
    );
    refused(
        load(&dir, &circuit, Some(&fp8_block([128, 128]))),
        &qweight,
        &["`fp8`"],
    );

    // F8_E4M3 without a config; block scales of the wrong shape; a missing scale tensor.
    let codes = fp8_codes(12);
    let dir = TempDir::new("fp8-bad");
    let f8 = raw(&weight, Dtype::F8_E4M3, vec![N, K], codes.clone());
    let bad = raw(
        &format!("{DOWN}.weight_scale_inv"),
        Dtype::F32,
        vec![2, 2],
        f32_le(&[1.0; 4]),
    );
    write(&dir, &circuit, vec![f8, bad]);
    refused(
        load(&dir, &circuit, None),
        &weight,
        &["F8_E4M3", "quantization_config"],
    );
    let (fp8, _) = circuit_with(WeightFormat::Fp8 {
        block_n: 128,
        block_k: 128,
    });
    refused(
        load(&dir, &fp8, Some(&fp8_block([128, 128]))),
        &format!("{DOWN}.weight_scale_inv"),
        &["[1, 1]"],
    );
    let dir = TempDir::new("fp8-no-scale");
    write(
        &dir,
        &circuit,
        vec![raw(&weight, Dtype::F8_E4M3, vec![N, K], codes)],
    );
    refused(
        load(&dir, &fp8, Some(&fp8_block([128, 128]))),
        &format!("{DOWN}.weight_scale_inv"),
        &["missing"],
    );
}

#[test]
fn seeded_quantized_weights_fit_their_slots_and_are_not_saved() {
    let (circuit, slot) = circuit_with(WeightFormat::Int4 { group: 32 });
    let weights = HostWeights::random(&circuit, 3);
    weights
        .check_lengths(&circuit)
        .expect("quantized random weights fit");
    assert_eq!(
        weights.slots[slot].len(),
        align(N * K / 2) + align(N * 4 * 4) + N * 4
    );
    let dir = TempDir::new("save-quantized");
    refused(
        weights.save(&circuit, &dir.path().join("model.safetensors")),
        &format!("{DOWN}.weight"),
        &["int4[g32]", "bf16"],
    );
    // bf16 slots keep today's random bytes exactly.
    let plain = instance(&config(TINY_LLAMA)).circuit;
    let a = HostWeights::random(&plain, 3);
    for (i, bytes) in a.slots.iter().enumerate().filter(|(i, _)| *i != slot) {
        assert_eq!(bytes, &weights.slots[i], "slot {i}");
    }
}

/// A build streaming an FP8 checkpoint into bf16 slots decodes exactly as one given the
/// dequantised weights on the host.
#[test]
fn a_streamed_fp8_checkpoint_decodes_as_its_dequantised_host_weights() {
    let (circuit, slot) = circuit_with(WeightFormat::Bf16);
    let codes: Vec<u8> = fp8_codes(13).iter().map(|c| c & 0xb7).collect(); // small values
    let s = scales(14, 1);
    let dir = TempDir::new("stream-fp8");
    write(
        &dir,
        &circuit,
        vec![
            raw(
                &format!("{DOWN}.weight"),
                Dtype::F8_E4M3,
                vec![N, K],
                codes.clone(),
            ),
            raw(
                &format!("{DOWN}.weight_scale"),
                Dtype::F32,
                vec![],
                f32_le(&s),
            ),
        ],
    );
    let quant = Quantization::Fp8Compressed {
        strategy: Fp8Strategy::Tensor,
        targets: vec!["Linear".into()],
        ignore: vec![],
    };
    let host = load(&dir, &circuit, Some(&quant)).expect("host load");
    assert_eq!(host.slots[slot], fp8_dequant(&codes, &s, N, K));
    let mut quantized = config(TINY_LLAMA);
    quantized.quantization = Some(quant);
    let mut backend = backend();
    // The bf16 tier: every slot bf16, the fp8 tensor dequantised at load (the checkpoint
    // stores only one linear quantized, which the native policy would refuse).
    let mut streamed_boot = boot(
        quantized,
        Policy::default(),
        WeightSource::Checkpoint(dir.path().to_path_buf()),
        roomy_kv(),
    );
    streamed_boot.precision = solder_circuit::PrecisionSpec::Policy(solder_circuit::Tier::Bf16);
    let streamed = CircuitExec::build(&mut backend, streamed_boot).expect("streamed build");
    let from_host = CircuitExec::build(
        &mut backend,
        boot(
            config(TINY_LLAMA),
            Policy::default(),
            WeightSource::Host(host),
            roomy_kv(),
        ),
    )
    .expect("host build");
    let tokens = prompt(3, 128, 4);
    assert_same_bytes(
        &decode_alone(&mut backend, &streamed, &tokens),
        &decode_alone(&mut backend, &from_host, &tokens),
        "streamed vs host",
    );
}

/// A stacked slot (qwen3_next's experts) holds one blob per expert at the format's stride:
/// the seeded quantized blobs, written back as per-expert FP8 tensors, load byte for byte.
#[test]
fn stacked_fp8_experts_load_at_the_format_stride() {
    use exec_support::TINY_NEXT;
    let mut circuit = instance(&config(TINY_NEXT)).circuit;
    let format = WeightFormat::Fp8 {
        block_n: 16,
        block_k: 16,
    };
    let index = circuit
        .weights
        .iter()
        .position(|w| w.parts.len() > 1)
        .expect("a stacked experts slot");
    circuit.weights[index].format = format;
    let slot = circuit.weights[index].clone();
    let [experts, n, k] = slot.shape[..] else {
        panic!("experts slot shape {:?}", slot.shape);
    };
    let layout = format.layout(n, k).unwrap();
    assert!(
        layout.stride > layout.bytes,
        "the test needs padding between experts"
    );
    let seeded = HostWeights::random(&circuit, 8);
    let blob = &seeded.slots[index];
    assert_eq!(blob.len(), experts * layout.stride);
    let mut tensors: Vec<RawTensor> = Vec::new();
    for (i, (decl, bytes)) in circuit.weights.iter().zip(&seeded.slots).enumerate() {
        if i == index {
            for (e, part) in decl.parts.iter().enumerate() {
                let at = e * layout.stride;
                let codes = blob[at..at + layout.values].to_vec();
                let scales = blob[at + layout.scales_offset..at + layout.bytes].to_vec();
                let rows = n.div_ceil(16);
                tensors.push(raw(part, Dtype::F8_E4M3, vec![n, k], codes));
                let scale = part.replace(".weight", ".weight_scale_inv");
                tensors.push(raw(&scale, Dtype::F32, vec![rows, k.div_ceil(16)], scales));
            }
        } else if decl.parts.is_empty() {
            tensors.push(raw(
                &decl.name,
                Dtype::BF16,
                decl.shape.clone(),
                bytes.clone(),
            ));
        } else {
            let per = decl.shape[1..].iter().product::<usize>() * 2;
            for (part, chunk) in decl.parts.iter().zip(bytes.chunks(per)) {
                tensors.push(raw(
                    part,
                    Dtype::BF16,
                    decl.shape[1..].to_vec(),
                    chunk.to_vec(),
                ));
            }
        }
    }
    let dir = TempDir::new("stacked-fp8");
    write_safetensors(&dir.path().join("model.safetensors"), &tensors);
    let loaded = load(&dir, &circuit, Some(&fp8_block([16, 16]))).expect("stacked fp8 loads");
    assert_eq!(loaded.slots, seeded.slots);
}
