//! Helpers shared by the fuser tests: small circuits built op by op and inline rules with a
//! reference rule for every op kind.
#![allow(dead_code)]

use solder_circuit::builder::{CircuitBuilder, OpSpec, OutSpec};
use solder_circuit::ir::{Binding, Circuit, Dtype, ModelInput, NodeId, TensorId};
use solder_circuit::{
    fuse, Available, FusionPlan, Group, Mode, OpKind, Policy, RuleSet, Vocabulary,
};

/// A circuit under construction: one input, single-output ops of width 64.
pub struct Net {
    pub b: CircuitBuilder,
}

impl Net {
    pub fn new() -> Net {
        Net {
            b: CircuitBuilder::new("net", "test", 1),
        }
    }

    pub fn input(&mut self, name: &str) -> TensorId {
        self.b
            .input(OutSpec::rows(name, Dtype::F32, 64).bound(Binding::Input(ModelInput::Tokens)))
    }

    pub fn op(&mut self, kind: OpKind, name: &str, role: &str, inputs: &[TensorId]) -> TensorId {
        let spec = OpSpec::new(kind, name, role).inputs(inputs);
        self.b
            .op1(spec, OutSpec::rows(format!("{name}.out"), Dtype::Bf16, 64))
            .expect("op")
    }

    pub fn finish(self) -> Circuit {
        self.b.finish().expect("a well-formed circuit")
    }
}

/// A reference rule `ref_<op>` (kernel `ref::<op>`) for every op kind, then `extra`.
/// solder's vocabulary plus the roles and capabilities the synthetic tests use.
pub fn test_vocabulary() -> Vocabulary {
    Vocabulary::solder()
        .with_roles(["p", "q"])
        .with_capabilities(["tma"])
}

pub fn rules(extra: &str) -> RuleSet {
    let mut text = String::from("schema = 1\n");
    for k in OpKind::ALL {
        let k = k.as_str();
        text += &format!(
            "[[rule]]\nid = \"ref_{k}\"\npattern = [{{ op = \"{k}\" }}]\nkernel = \"ref::{k}\"\nnumerics = \"reference\"\n"
        );
    }
    text += extra;
    RuleSet::from_toml_str_in(&text, "inline.toml", &test_vocabulary()).expect("inline rules")
}

pub fn fuse_with(c: &Circuit, r: &RuleSet, policy: &Policy, mode: Mode, rows: usize) -> FusionPlan {
    fuse(c, r, &Available::all_kernels(r), policy, mode, rows).expect("fuse")
}

pub fn fuse_decode(c: &Circuit, r: &RuleSet) -> FusionPlan {
    fuse_with(c, r, &Policy::default(), Mode::Decode, 1)
}

pub fn node(c: &Circuit, name: &str) -> NodeId {
    c.node_ids()
        .find(|n| c.op(*n).name == name)
        .unwrap_or_else(|| panic!("no op `{name}`"))
}

pub fn tensor(c: &Circuit, name: &str) -> TensorId {
    let i = c
        .tensors
        .iter()
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("no `{name}`"));
    TensorId(i as u32)
}

pub fn group_of<'p>(plan: &'p FusionPlan, c: &Circuit, name: &str) -> &'p Group {
    plan.group(plan.group_of[node(c, name).0 as usize])
}

/// Op names of the groups with more than one node, each as "a+b+c".
pub fn multi(plan: &FusionPlan, c: &Circuit) -> Vec<String> {
    plan.groups
        .iter()
        .filter(|g| g.nodes.len() > 1)
        .map(|g| {
            g.nodes
                .iter()
                .map(|n| c.op(*n).name.as_str())
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect()
}

/// x -> a (rms_norm) -> b (linear) -> out; with `reader`, a linear `c` also reads a's output.
pub fn chain(reader: bool) -> Circuit {
    let mut n = Net::new();
    let x = n.input("x");
    let a = n.op(OpKind::RmsNorm, "a", "norm", &[x]);
    n.op(OpKind::Linear, "b", "proj", &[a]);
    if reader {
        n.op(OpKind::Linear, "c", "other", &[a]);
    }
    n.finish()
}

pub const NORM_LINEAR: &str = "[[rule]]\nid = \"norm_linear\"\npattern = [{ op = \"rms_norm\" }, { op = \"linear\" }]\nkernel = \"fz::norm_linear\"\nnumerics = \"bit_identical\"\npriority = 10\n";

pub fn with_line(rule: &str, line: &str) -> String {
    rule.replacen("priority", &format!("{line}\npriority"), 1)
}

/// x -> n (rms_norm) -> q, k, v (linear) -> rope(q, k), kv_write(k_rot, v).
pub fn qkv() -> Circuit {
    let mut n = Net::new();
    let x = n.input("x");
    let h = n.op(OpKind::RmsNorm, "n", "norm", &[x]);
    let q = n.op(OpKind::Linear, "q", "q_proj", &[h]);
    let k = n.op(OpKind::Linear, "k", "k_proj", &[h]);
    let v = n.op(OpKind::Linear, "v", "v_proj", &[h]);
    let r = n.op(OpKind::Rope, "rope", "rope", &[q, k]);
    n.op(OpKind::KvWrite, "kv", "kv_write", &[r, v]);
    n.finish()
}

pub const QKV: &str = "[[rule]]\nid = \"qkv\"\npattern = [\n  { op = \"linear\", role = \"q_proj\", keep = true },\n  { op = \"linear\", role = \"k_proj\", link = \"sibling\", keep = true },\n  { op = \"linear\", role = \"v_proj\", link = \"sibling\" },\n]\nkernel = \"fz::qkv\"\nnumerics = \"bit_identical\"\npriority = 20\n";

pub fn rule(id: &str, pattern: &str, priority: i64) -> String {
    format!(
        "[[rule]]\nid = \"{id}\"\npattern = {pattern}\nkernel = \"fz::{id}\"\nnumerics = \"bit_identical\"\npriority = {priority}\n"
    )
}
