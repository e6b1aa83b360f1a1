//! The emitters pick a gemv kernel's entry from its weight slot's format, and refuse a format
//! a kernel has no entry for, naming kernel, tensor and format.

use solder_circuit::ir::{
    Attr, Binding, Circuit, Dtype, MetaField, NodeId, Op, Shape, StateId, Tensor, TensorId,
    WeightId, WeightSlot,
};
use solder_circuit::{Group, Mode, Numerics, OpKind, WeightFormat};
use solder_config::Levers;
use solder_gpu_runtime::{DevicePtr, KernelArg};

use crate::kernels::emit_view::{Operands, View};
use crate::kernels::Buf;

/// Every range at one address: what the emitters are checked for is the entry and scalars.
struct Everything {
    circuit: Circuit,
    levers: Levers,
}

fn buf() -> Buf {
    Buf::new(DevicePtr(4096), 256)
}

impl Operands for Everything {
    fn circuit(&self) -> &Circuit {
        &self.circuit
    }
    fn mode(&self) -> Mode {
        Mode::Decode
    }
    fn rows(&self) -> usize {
        1
    }
    fn levers(&self) -> &Levers {
        &self.levers
    }
    fn tensor(&self, _: TensorId) -> Option<Buf> {
        Some(buf())
    }
    fn state(&self, _: StateId) -> Buf {
        buf()
    }
    fn snapshots(&self, _: StateId) -> Option<Buf> {
        None
    }
    fn weight(&self, _: WeightId) -> Buf {
        buf()
    }
    fn meta(&self, _: MetaField) -> Buf {
        buf()
    }
    fn inv_freq(&self) -> Buf {
        buf()
    }
    fn attn_scratch(&self, _: usize, _: usize) -> Buf {
        buf()
    }
    fn o_scratch(&self, _: usize, _: usize) -> Buf {
        buf()
    }
    fn moe_scratch(&self) -> Buf {
        buf()
    }
    fn gemv_slot(&self, _: u8) -> Option<Buf> {
        None
    }
    fn state_slots(&self) -> usize {
        1
    }
    fn kv_block_size(&self) -> usize {
        16
    }
    fn kv_pages(&self) -> usize {
        1
    }
    fn max_blocks(&self) -> usize {
        1
    }
}

fn op(kind: OpKind, name: &str, io: (&[u32], &[u32], &[u32]), attrs: &[(&str, i64)]) -> Op {
    Op {
        kind,
        name: name.into(),
        role: String::new(),
        layer: None,
        layer_kind: None,
        inputs: io.0.iter().map(|t| TensorId(*t)).collect(),
        outputs: io.1.iter().map(|t| TensorId(*t)).collect(),
        weights: io.2.iter().map(|w| WeightId(*w)).collect(),
        meta: vec![],
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), Attr::Int(*v)))
            .collect(),
        branch: 0,
    }
}

/// Node 0: a linear 64 → 16 of weight `model.o.weight` (in `format`) from tensor 0 into 2;
/// node 1: a residual add of tensors 1 and 2 into 3; node 2: the LM head 64 → 32 of
/// `lm_head.weight` (in `format`) into 4. No tensor is looked at but through `Operands`.
fn circuit(format: WeightFormat) -> Circuit {
    let tensor = |name: &str, dtype, cols| Tensor {
        name: name.into(),
        dtype,
        shape: Shape::rows(&[cols]),
        binding: Binding::Arena,
    };
    let slot = |name: &str, shape: &[usize]| WeightSlot {
        name: name.into(),
        shape: shape.to_vec(),
        parts: vec![],
        dtype: Dtype::Bf16,
        format,
    };
    Circuit {
        name: "t".into(),
        family: "t".into(),
        num_layers: 1,
        tensors: vec![
            tensor("x", Dtype::Bf16, 64),
            tensor("h", Dtype::F32, 16),
            tensor("y", Dtype::Bf16, 16),
            tensor("h1", Dtype::F32, 16),
            tensor("logits", Dtype::F32, 32),
        ],
        ops: vec![
            op(
                OpKind::Linear,
                "l0.o_proj",
                (&[0], &[2], &[0]),
                &[("in", 64), ("out", 16)],
            ),
            op(OpKind::ResidualAdd, "l0.add", (&[1, 2], &[3], &[]), &[]),
            op(
                OpKind::LmHead,
                "lm_head",
                (&[0], &[4], &[1]),
                &[("hidden", 64), ("vocab", 32)],
            ),
        ],
        weights: vec![
            slot("model.o.weight", &[16, 64]),
            slot("lm_head.weight", &[32, 64]),
        ],
        states: vec![],
        producers: vec![],
        consumers: vec![],
    }
}

fn group(kernel: &str, nodes: &[u32]) -> Group {
    Group {
        rule: "r".into(),
        kernels: vec![kernel.into()],
        emitter: None,
        numerics: Numerics::Reference,
        nodes: nodes.iter().map(|n| NodeId(*n)).collect(),
        inputs: vec![],
        outputs: vec![],
        fused: vec![],
        layer: None,
        branch: 0,
    }
}

fn emit(format: WeightFormat, kernel: &str, nodes: &[u32]) -> Result<Vec<String>, String> {
    let operands = Everything {
        circuit: circuit(format),
        levers: Levers::default(),
    };
    let group = group(kernel, nodes);
    let view = View::new(&operands, &group, 0);
    let decl = crate::kernels::decl(kernel).unwrap();
    (decl.emit)(&view)
        .map(|launches| {
            launches
                .iter()
                .map(|l| {
                    let scalars: Vec<String> = l
                        .args
                        .iter()
                        .filter_map(|a| match a {
                            KernelArg::U32(v) => Some(v.to_string()),
                            _ => None,
                        })
                        .collect();
                    format!("{} {}", l.kernel, scalars.join(" "))
                })
                .collect()
        })
        .map_err(|e| e.to_string())
}

#[test]
fn linear_and_lm_head_launch_the_entry_of_their_weights_format() {
    let fp8 = WeightFormat::Fp8 {
        block_n: 128,
        block_k: 32,
    };
    let int4 = WeightFormat::Int4 { group: 64 };
    // Scalars: rows, k, n, then the format's parameters.
    let cases = [
        (fp8, "gemv::linear", 0, "gemv::linear_fp8 1 64 16 128 32"),
        (int4, "gemv::linear", 0, "gemv::linear_int4 1 64 16 64"),
        (fp8, "gemv::lm_head", 2, "gemv::lm_head_fp8 1 64 32 128 32"),
        (int4, "gemv::lm_head", 2, "gemv::lm_head_int4 1 64 32 64"),
        // The tensor cores' kernels likewise.
        (
            fp8,
            "gemm::linear_mma",
            0,
            "gemm::linear_mma_fp8 1 64 16 128 32",
        ),
        (
            int4,
            "gemm::linear_mma",
            0,
            "gemm::linear_mma_int4 1 64 16 64",
        ),
        (
            fp8,
            "gemm::lm_head_mma",
            2,
            "gemm::lm_head_mma_fp8 1 64 32 128 32",
        ),
        (
            int4,
            "gemm::lm_head_mma",
            2,
            "gemm::lm_head_mma_int4 1 64 32 64",
        ),
    ];
    for (format, kernel, node, want) in cases {
        assert_eq!(
            emit(format, kernel, &[node]).unwrap(),
            vec![want.to_string()]
        );
    }
    // bf16 keeps the kernel's own (streaming) entry.
    let bf16 = emit(WeightFormat::Bf16, "gemv::linear", &[0]).unwrap();
    assert!(bf16[0].starts_with("gemv::linear_r1 "), "{bf16:?}");
    let bf16 = emit(WeightFormat::Bf16, "gemm::linear_mma", &[0]).unwrap();
    assert_eq!(bf16, vec!["gemm::linear_mma 1 64 16".to_string()]);
}

#[test]
fn a_kernel_without_an_entry_for_the_format_is_an_error_naming_kernel_tensor_and_format() {
    let fp8 = WeightFormat::Fp8 {
        block_n: 128,
        block_k: 128,
    };
    let err = emit(fp8, "gemv::linear_residual_add", &[0, 1]).unwrap_err();
    for part in [
        "gemv::linear_residual_add",
        "model.o.weight",
        "fp8[128x128]",
        "reads only bf16",
    ] {
        assert!(err.contains(part), "`{part}` missing from: {err}");
    }
    let formats = crate::kernels::formats_read;
    assert_eq!(formats("gemv::linear"), ["bf16", "fp8", "int4"]);
    assert_eq!(formats("gemm::linear_mma"), ["bf16", "fp8", "int4"]);
    assert_eq!(formats("gemm::lm_head_mma"), ["bf16", "fp8", "int4"]);
    assert_eq!(formats("gemv::qkv"), ["bf16"]);
    assert_eq!(formats("gemm::qkv_mma"), ["bf16", "fp8", "int4"]);
    assert_eq!(formats("gemm::qkv_rope_kv_mma"), ["bf16", "fp8", "int4"]);
}
