//! Property test: random DAG circuits with random fusion rules, planned at several (mode,
//! rows) and stream counts. Every plan must verify, and the test checks on its own that
//! buffers live together (in the linear order, and under the steps' happens-before) never
//! share bytes. Deterministic: each case prints its seed; rerun one with `SOLDER_SEED=<n>`,
//! or more cases with `SOLDER_CASES=<n>`.

use std::fmt::Write as _;

use solder_circuit::builder::{CircuitBuilder, OpSpec, OutSpec};
use solder_circuit::ir::{
    Binding, Circuit, Dtype, LayerKind, ModelInput, ModelOutput, StateKind, TensorId,
};
use solder_circuit::planner::memory::ALIGN;
use solder_circuit::verify::verify_plan;
use solder_circuit::{
    Available, BuildOptions, ExecutionPlan, GroupId, Instance, Mode, OpKind, Policy, RuleSet,
    StepKind, Vocabulary,
};
use solder_config::ServeShape;

const CASES: u64 = 600;
const KINDS: &[OpKind] = &[
    OpKind::RmsNorm,
    OpKind::Linear,
    OpKind::ResidualAdd,
    OpKind::SiluMul,
    OpKind::Rope,
    OpKind::Attention,
];
const ROLES: &[&str] = &["r0", "r1", "r2"];
const WIDTHS: &[usize] = &[1, 8, 64, 100, 256, 1000, 4096];
const DTYPES: &[Dtype] = &[Dtype::Bf16, Dtype::F32, Dtype::F16, Dtype::I32];

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

fn random_circuit(rng: &mut Rng, seed: u64) -> Circuit {
    let mut b = CircuitBuilder::new(format!("random-{seed}"), "random", 2);
    let mut pool: Vec<TensorId> = Vec::new();
    for i in 0..1 + rng.below(2) {
        let spec = OutSpec::rows(format!("in{i}"), Dtype::I32, rng.pick(WIDTHS));
        pool.push(b.input(spec.bound(Binding::Input(ModelInput::Tokens))));
    }
    let ops = 3 + rng.below(22);
    for i in 0..ops {
        let kind = rng.pick(KINDS);
        let mut inputs = Vec::new();
        for _ in 0..1 + rng.below(3) {
            // Mostly recent tensors, so chains form; sometimes any earlier one.
            let t = if rng.percent(65) {
                pool[pool.len() - 1 - rng.below(pool.len().min(4))]
            } else {
                pool[rng.below(pool.len())]
            };
            if !inputs.contains(&t) {
                inputs.push(t);
            }
        }
        let branch = if rng.percent(50) {
            0
        } else {
            1 + rng.below(3) as u8
        };
        let mut spec = OpSpec::new(kind, format!("op{i}"), rng.pick(ROLES))
            .inputs(&inputs)
            .branch(branch);
        if rng.percent(80) {
            spec = spec.layer(rng.below(2) as u32, LayerKind::FullAttention);
        }
        let mut outs = Vec::new();
        for o in 0..if rng.percent(20) { 2 } else { 1 } {
            let mut out =
                OutSpec::rows(format!("op{i}.out{o}"), rng.pick(DTYPES), rng.pick(WIDTHS));
            if i == ops - 1 && o == 0 && rng.percent(50) {
                out = out.bound(Binding::Output(ModelOutput::Logits));
            } else if rng.percent(5) {
                let kind = StateKind::KvPages {
                    layer: 0,
                    block_size: 16,
                    num_kv_heads: 1,
                    head_dim: 8,
                    dtype: Dtype::Bf16,
                };
                out = out.bound(Binding::State(b.state(format!("state{i}.{o}"), kind)));
            }
            outs.push(out);
        }
        pool.extend(b.op(spec, &outs).expect("a random op"));
    }
    b.finish().expect("a well-formed random circuit")
}

fn random_rules(rng: &mut Rng, circuit: &Circuit) -> String {
    let mut text = String::from("schema = 1\n");
    for k in OpKind::ALL {
        let k = k.as_str();
        let _ = write!(text, "[[rule]]\nid = \"ref_{k}\"\npattern = [{{ op = \"{k}\" }}]\nkernel = \"ref::{k}\"\nnumerics = \"reference\"\n");
    }
    let used: Vec<OpKind> = circuit.ops.iter().map(|o| o.kind).collect();
    for r in 0..rng.below(7) {
        let mut elems = Vec::new();
        for e in 0..2 + rng.below(3) {
            let mut elem = format!("{{ op = \"{}\"", rng.pick(&used).as_str());
            if rng.percent(25) {
                let _ = write!(elem, ", role = \"{}\"", rng.pick(ROLES));
            }
            if rng.percent(40) {
                elem += ", keep = true";
            }
            if e > 0 && rng.percent(25) {
                elem += ", link = \"sibling\"";
            }
            elems.push(elem + " }");
        }
        let _ = write!(
            text,
            "[[rule]]\nid = \"fz{r}\"\npattern = [{}]\nkernel = \"fz::r{r}\"\n",
            elems.join(", ")
        );
        let _ = writeln!(text, "priority = {}", rng.below(100));
        if rng.percent(15) {
            text += "modes = [\"multi_seq\", \"verify\"]\n";
        }
        if rng.percent(15) {
            let lo = 1 + rng.below(16);
            let _ = writeln!(text, "rows = [{lo}, {}]", lo + rng.below(64));
        }
        text += match rng.below(10) {
            0 => "numerics = { differs = \"fast_exp\", tolerance = 0.01 }\n",
            1 => "numerics = \"bit_identical\"\nwhen = { fast_exp = true }\n",
            _ => "numerics = \"bit_identical\"\n",
        };
    }
    text
}

/// Vector clock of each group at its launch, from the steps alone.
fn clocks_from_steps(plan: &ExecutionPlan) -> Vec<Vec<u32>> {
    let n = plan.num_streams;
    let mut now = vec![vec![0u32; n]; n];
    let mut events = vec![vec![0u32; n]; plan.event_count];
    let mut clocks = vec![vec![0u32; n]; plan.fusion.groups.len()];
    for step in &plan.steps {
        let s = step.stream as usize;
        match step.kind {
            StepKind::Launch(g) => {
                now[s][s] += 1;
                clocks[g.0 as usize] = now[s].clone();
            }
            StepKind::Record(e) => events[e.0 as usize] = now[s].clone(),
            StepKind::Wait(e) => {
                let theirs = events[e.0 as usize].clone();
                now[s]
                    .iter_mut()
                    .zip(theirs)
                    .for_each(|(a, b)| *a = (*a).max(b));
            }
        }
    }
    clocks
}

#[derive(Default)]
struct Seen {
    plans: usize,
    multi_stream: usize,
    fused_groups: usize,
    shared_offsets: usize,
}

fn check_plan(c: &Circuit, plan: &ExecutionPlan, max_streams: usize, seen: &mut Seen, at: &str) {
    assert!(
        plan.num_streams <= max_streams.max(1),
        "{at}: {} streams",
        plan.num_streams
    );
    if max_streams == 1 {
        assert_eq!((plan.num_streams, plan.event_count), (1, 0), "{at}");
    }
    let mut covered = vec![0; c.ops.len()];
    for (gi, g) in plan.fusion.groups.iter().enumerate() {
        for n in &g.nodes {
            covered[n.0 as usize] += 1;
            assert_eq!(
                plan.fusion.group_of[n.0 as usize],
                GroupId(gi as u32),
                "{at}"
            );
        }
    }
    assert!(covered.iter().all(|k| *k == 1), "{at}: cover {covered:?}");
    let clocks = clocks_from_steps(plan);
    let hb = |a: GroupId, b: GroupId| {
        let s = plan.stream_of[a.0 as usize] as usize;
        a != b && clocks[a.0 as usize][s] <= clocks[b.0 as usize][s]
    };
    for (gi, g) in plan.fusion.groups.iter().enumerate() {
        for &t in &g.inputs {
            if let Some(p) = c.producer(t) {
                let writer = plan.fusion.group_of[p.0 as usize];
                assert!(
                    hb(writer, GroupId(gi as u32)),
                    "{at}: `{}` read unordered",
                    c.tensor(t).name
                );
            }
        }
    }
    for (i, a) in plan.buffers.iter().enumerate() {
        assert_eq!(
            a.bytes,
            c.tensor(a.tensor).bytes(plan.rows),
            "{at}: `{}`",
            a.name
        );
        assert!(
            a.offset % ALIGN == 0 && a.offset + a.bytes <= plan.pool_bytes,
            "{at}: `{}`",
            a.name
        );
        for b in &plan.buffers[i + 1..] {
            let share = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            if !share {
                continue;
            }
            seen.shared_offsets += usize::from(a.offset == b.offset);
            let linear_overlap = a.first <= b.last && b.first <= a.last;
            assert!(
                !linear_overlap,
                "{at}: `{}` [{}, {}] and `{}` [{}, {}] share bytes",
                a.name, a.first, a.last, b.name, b.first, b.last
            );
            let uses = |x: &solder_circuit::Buffer| {
                if x.readers.is_empty() {
                    vec![x.writer]
                } else {
                    x.readers.clone()
                }
            };
            let ordered = uses(a).iter().all(|&u| hb(u, b.writer))
                || uses(b).iter().all(|&u| hb(u, a.writer));
            assert!(
                ordered,
                "{at}: `{}` and `{}` share bytes and may run at the same time",
                a.name, b.name
            );
        }
    }
    seen.plans += 1;
    seen.multi_stream += usize::from(plan.num_streams > 1);
    seen.fused_groups += plan
        .fusion
        .groups
        .iter()
        .filter(|g| g.nodes.len() > 1)
        .count();
}

fn run_case(seed: u64, seen: &mut Seen) {
    let mut rng = Rng(seed);
    let circuit = random_circuit(&mut rng, seed);
    let text = random_rules(&mut rng, &circuit);
    let vocabulary = Vocabulary::solder().with_roles(ROLES.iter().copied());
    let rules = RuleSet::from_toml_str_in(&text, "random.toml", &vocabulary)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
    let available = Available::all_kernels(&rules);
    let mut policy = Policy::default();
    policy
        .levers
        .set("fast_exp", rng.percent(50))
        .expect("a known lever");
    let shapes = [
        (Mode::Decode, 1),
        (Mode::MultiSeq, 2 + rng.below(127)),
        (Mode::Verify, 2 + rng.below(7)),
    ];
    let instance = Instance::new(circuit, ServeShape::default()).unwrap();
    for (mode, rows) in shapes {
        for max_streams in [1, 2, 4] {
            let at = format!("seed {seed} {mode} rows={rows} max_streams={max_streams}");
            let policy = Policy {
                max_streams,
                ..policy.clone()
            };
            let plan = ExecutionPlan::build_with(
                &instance,
                &rules,
                &available,
                &policy,
                mode,
                rows,
                BuildOptions { verify: true },
            )
            .unwrap_or_else(|e| panic!("{at}: {e}\nrules:\n{text}"));
            verify_plan(&instance.circuit, &plan, &available)
                .unwrap_or_else(|e| panic!("{at}: {e}"));
            check_plan(&instance.circuit, &plan, max_streams, seen, &at);
        }
    }
}

#[test]
fn random_circuits_always_give_verified_non_overlapping_plans() {
    let seeds: Vec<u64> = match std::env::var("SOLDER_SEED") {
        Ok(s) => vec![s.parse().expect("SOLDER_SEED is a number")],
        Err(_) => {
            let cases =
                std::env::var("SOLDER_CASES").map_or(CASES, |n| n.parse().expect("a count"));
            (0..cases).map(|i| 0x5eed_0000 + i).collect()
        }
    };
    let mut seen = Seen::default();
    for seed in &seeds {
        run_case(*seed, &mut seen);
    }
    eprintln!(
        "{} plans, {} multi-stream, {} fused groups, {} buffers sharing an offset",
        seen.plans, seen.multi_stream, seen.fused_groups, seen.shared_offsets
    );
    if seeds.len() > 1 {
        // The generator must exercise what the checks are about.
        assert!(
            seen.multi_stream * 4 > seen.plans,
            "too few multi-stream plans: {}",
            seen.multi_stream
        );
        assert!(
            seen.fused_groups > 100,
            "too few fused groups: {}",
            seen.fused_groups
        );
        assert!(
            seen.shared_offsets > 100,
            "too little buffer reuse: {}",
            seen.shared_offsets
        );
    }
}
