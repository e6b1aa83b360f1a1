//! The fuser: a deterministic greedy cover of every node by exactly one rule group.
//!
//! Invariants of a returned [`FusionPlan`]: every node is in exactly one group; every group's
//! kernels are available; an edge is fused (never stored) exactly when its writer and all
//! its readers are in one group and it is an arena tensor; contracting the groups leaves the
//! graph acyclic.

use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;

use crate::error::CircuitError;
use crate::ir::{Binding, Circuit, NodeId, TensorId, WeightSlot};
use crate::mode::Mode;
use crate::policy::{Available, Fusions, Policy};
use crate::rules::{hex_sha256, Link, Numerics, PatternElem, Rule, RuleSet};

/// Index of a group in `FusionPlan::groups`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId(pub u32);

/// Nodes that one rule covers together, launched as the rule's kernels.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub rule: String,
    pub kernels: Vec<String>,
    pub emitter: Option<String>,
    pub numerics: Numerics,
    /// In execution order.
    pub nodes: Vec<NodeId>,
    /// Tensors read from outside the group, by id.
    pub inputs: Vec<TensorId>,
    /// Tensors written and kept (read outside, or model-bound), by id.
    pub outputs: Vec<TensorId>,
    /// Edges written and read only inside the group: never stored.
    pub fused: Vec<TensorId>,
    /// Layer of the group's last node (a cross-layer group counts in the later layer).
    pub layer: Option<u32>,
    /// Branch hint of the group's first node.
    pub branch: u8,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FusionPlan {
    pub mode: Mode,
    pub rows: usize,
    /// Ordered by first node.
    pub groups: Vec<Group>,
    /// Group of each node, indexed by `NodeId`.
    pub group_of: Vec<GroupId>,
    /// Launches under reference routing (one per op).
    pub kernel_count_original: usize,
    pub kernel_count_fused: usize,
    pub rules_digest: String,
    /// SHA-256 over `canonical_text`.
    pub digest: String,
}

impl FusionPlan {
    pub fn group(&self, id: GroupId) -> &Group {
        &self.groups[id.0 as usize]
    }

    /// Groups whose last node lies in `layer`: the launches of one decoder layer.
    pub fn launches_in_layer(&self, layer: u32) -> usize {
        self.groups
            .iter()
            .filter(|g| g.layer == Some(layer))
            .map(|g| g.kernels.len())
            .sum()
    }

    /// Groups, their kernels and nodes, and kept edges with format and shape; no rule ids.
    pub fn canonical_text(&self, circuit: &Circuit) -> String {
        let mut out = format!("fusion {} rows={}\n", self.mode, self.rows);
        for (i, g) in self.groups.iter().enumerate() {
            let nodes: Vec<&str> = g
                .nodes
                .iter()
                .map(|n| circuit.op(*n).name.as_str())
                .collect();
            // The emitter decides the launches' arguments, so it is part of the plan.
            let emitter = g
                .emitter
                .as_deref()
                .map(|e| format!(" emitter={e}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "group {i} kernels={}{emitter} nodes={}{}{}",
                g.kernels.join(","),
                nodes.join(","),
                circuit.windows_note(&g.nodes),
                circuit.formats_note(&g.nodes)
            );
        }
        for g in &self.groups {
            for &t in &g.outputs {
                let t = circuit.tensor(t);
                let _ = writeln!(
                    out,
                    "edge {} {} {} {}",
                    t.name,
                    t.dtype.as_str(),
                    t.shape,
                    t.binding.as_str()
                );
            }
        }
        out
    }
}

/// The rules a build may apply in this mode, at these rows, under this policy and kernel
/// set, in the order the fuser tries them: priority (high first), then id. A rule allowed in
/// every other respect whose kernel the backend lacks is an error unless the policy skips
/// such rules.
pub fn allowed_rules<'r>(
    rules: &'r RuleSet,
    available: &Available,
    policy: &Policy,
    mode: Mode,
    rows: usize,
) -> Result<Vec<&'r Rule>, CircuitError> {
    let allowed: Vec<&Rule> = rules
        .rules
        .iter()
        .filter(|r| r.allows_mode(mode) && r.allows_rows(rows))
        .filter(|r| {
            r.requires
                .iter()
                .all(|c| available.capabilities.contains(c))
        })
        .filter(|r| {
            r.when
                .iter()
                .all(|(lever, on)| policy.levers.is_on(lever) == *on)
        })
        .filter(|r| match (&r.numerics, policy.fusions) {
            (Numerics::Reference, _) => true,
            (_, Fusions::ReferenceOnly) => false,
            (Numerics::BitIdentical, Fusions::All) => true,
            (Numerics::Differs { lever, .. }, Fusions::All) => policy.levers.is_on(lever),
        })
        .collect();
    let mut kept = Vec::with_capacity(allowed.len());
    for rule in allowed {
        match rule
            .kernels
            .iter()
            .find(|k| !available.kernels.contains(*k))
        {
            None => kept.push(rule),
            Some(kernel) if policy.skip_missing_kernels => {
                tracing::debug!(rule = %rule.id, %kernel, "rule skipped: kernel missing");
            }
            Some(kernel) => {
                return Err(CircuitError::MissingKernel {
                    source_name: rules.source.clone(),
                    line: rule.line,
                    rule: rule.id.clone(),
                    kernel: kernel.clone(),
                })
            }
        }
    }
    kept.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.id.cmp(&b.id)));
    Ok(kept)
}

/// Covers every node of `circuit` with exactly one group of an allowed rule.
pub fn fuse(
    circuit: &Circuit,
    rules: &RuleSet,
    available: &Available,
    policy: &Policy,
    mode: Mode,
    rows: usize,
) -> Result<FusionPlan, CircuitError> {
    mode.check_rows(rows)?;
    let allowed = allowed_rules(rules, available, policy, mode, rows)?;
    let mut cover = Cover::new(circuit);
    for rule in &allowed {
        for start in circuit.node_ids() {
            if cover.is_covered(start) || !matches(circuit, &rule.pattern[0], start) {
                continue;
            }
            if let Some(nodes) = cover.grow(rule, start) {
                // A rule never takes a chain holding a weight its kernels cannot read, nor
                // one whose weights mix format kinds (a kernel's entry reads one kind).
                let reads_all = nodes
                    .iter()
                    .all(|&n| unread_weights(circuit, rule, n).next().is_none());
                if reads_all
                    && one_format_kind(circuit, &nodes)
                    && cover.closed(rule, &nodes)
                    && !cover.makes_cycle(&nodes)
                {
                    cover.assign(rule, nodes);
                }
            }
        }
    }
    if let Some(node) = circuit.node_ids().find(|n| !cover.is_covered(*n)) {
        return Err(uncovered(circuit, &allowed, node, (mode, rows)));
    }
    Ok(cover.into_plan(circuit, rules, mode, rows))
}

fn matches(circuit: &Circuit, elem: &PatternElem, node: NodeId) -> bool {
    elem.matches(circuit.op(node))
}

/// The weight matrices `node` reads (slots of two or more dims; vectors, such as norm weights
/// and biases, are always bf16) whose format `rule` does not read.
fn unread_weights<'c, 'r>(
    circuit: &'c Circuit,
    rule: &'r Rule,
    node: NodeId,
) -> impl Iterator<Item = &'c WeightSlot> + use<'c, 'r> {
    circuit
        .op(node)
        .weights
        .iter()
        .map(|w| &circuit.weights[w.0 as usize])
        .filter(move |slot| slot.shape.len() >= 2 && !rule.reads(slot.format))
}

/// Whether the weight matrices `nodes` read share one format kind (`WeightFormat::kind`): a
/// fused kernel's format entry reads one (`gemm::qkv_mma_fp8` reads q, k and v as fp8), so a
/// chain mixing kinds is left to rules of fewer ops.
fn one_format_kind(circuit: &Circuit, nodes: &[NodeId]) -> bool {
    let mut kinds = nodes
        .iter()
        .flat_map(|&n| circuit.op(n).weights.iter())
        .map(|w| &circuit.weights[w.0 as usize])
        .filter(|slot| slot.shape.len() >= 2)
        .map(|slot| slot.format.kind());
    match kinds.next() {
        Some(first) => kinds.all(|kind| kind == first),
        None => true,
    }
}

/// The error for an uncovered `node`: by format when a rule that names its op was kept off it
/// only by a weight's format (naming the tensor, the format and those rules' kernels), else
/// `Uncovered`.
fn uncovered(
    circuit: &Circuit,
    allowed: &[&Rule],
    node: NodeId,
    (mode, rows): (Mode, usize),
) -> CircuitError {
    let op = circuit.op(node);
    let naming: Vec<&Rule> = allowed.iter().copied().filter(|r| r.names_op(op)).collect();
    let blocked = naming
        .iter()
        .find_map(|r| unread_weights(circuit, r, node).next());
    match blocked {
        Some(slot)
            if naming
                .iter()
                .all(|r| unread_weights(circuit, r, node).next().is_some()) =>
        {
            let kernels: Vec<String> = naming
                .iter()
                .map(|r| {
                    format!(
                        "rule `{}` ({}) reads {}",
                        r.id,
                        r.kernels.join("+"),
                        r.formats.join("/")
                    )
                })
                .collect();
            CircuitError::UnreadFormat {
                node: op.name.clone(),
                context: format!("{} in mode {mode} at {rows} rows", op.kind.as_str()),
                tensor: slot.name.clone(),
                format: slot.format.to_string(),
                kernels: kernels.join("; "),
            }
        }
        _ => CircuitError::Uncovered {
            node: op.name.clone(),
            op: op.kind.as_str().to_string(),
            role: op.role.clone(),
            mode: mode.as_str().to_string(),
            rows,
        },
    }
}

/// The fuser's working state: which nodes are covered, by which provisional group.
struct Cover<'c> {
    circuit: &'c Circuit,
    owner: Vec<Option<usize>>,
    groups: Vec<(&'c str, Vec<NodeId>)>,
    /// Smallest and largest node index of each group, to bound the cycle search.
    group_min: Vec<u32>,
    group_max: Vec<u32>,
    /// The largest `group_max` of the groups whose `group_min` is at most a node index.
    reach: PrefixMax,
    rules: Vec<Rule>,
}

/// A Fenwick tree of maxima over node indices: raise one entry, read the maximum of a
/// prefix, both in O(log n), so the cycle search's bound costs no pass over every group.
struct PrefixMax {
    tree: Vec<u32>,
}

impl PrefixMax {
    fn new(len: usize) -> Self {
        PrefixMax {
            tree: vec![0; len + 1],
        }
    }

    fn raise(&mut self, index: u32, value: u32) {
        let mut i = index as usize + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].max(value);
            i += i & i.wrapping_neg();
        }
    }

    /// The maximum raised at indices `0..=index` (0 when none).
    fn max_upto(&self, index: u32) -> u32 {
        let mut i = (index as usize + 1).min(self.tree.len() - 1);
        let mut best = 0;
        while i > 0 {
            best = best.max(self.tree[i]);
            i -= i & i.wrapping_neg();
        }
        best
    }
}

impl<'c> Cover<'c> {
    fn new(circuit: &'c Circuit) -> Self {
        Cover {
            circuit,
            owner: vec![None; circuit.ops.len()],
            groups: Vec::new(),
            group_min: Vec::new(),
            group_max: Vec::new(),
            reach: PrefixMax::new(circuit.ops.len()),
            rules: Vec::new(),
        }
    }

    fn is_covered(&self, node: NodeId) -> bool {
        self.owner[node.0 as usize].is_some()
    }

    /// Grows `rule`'s pattern from `start`, taking for each element the first uncovered
    /// matching node in execution order.
    fn grow(&self, rule: &Rule, start: NodeId) -> Option<Vec<NodeId>> {
        let c = self.circuit;
        let mut nodes = vec![start];
        for elem in &rule.pattern[1..] {
            let mut candidates: BTreeSet<NodeId> = BTreeSet::new();
            match elem.link {
                Link::Consumer => {
                    for n in &nodes {
                        for &t in &c.op(*n).outputs {
                            candidates.extend(c.consumers(t));
                        }
                    }
                }
                Link::Sibling => {
                    let prev = *nodes.last()?;
                    for &t in &c.op(prev).inputs {
                        candidates.extend(c.consumers(t));
                    }
                }
            }
            let next = candidates.into_iter().find(|&cand| {
                !self.is_covered(cand) && !nodes.contains(&cand) && matches(c, elem, cand)
            })?;
            nodes.push(next);
        }
        Some(nodes)
    }

    /// No output of a non-`keep` element (other than the last) is read outside the group.
    fn closed(&self, rule: &Rule, nodes: &[NodeId]) -> bool {
        let c = self.circuit;
        let last = nodes.len() - 1;
        nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != last && !rule.pattern[*i].keep)
            .all(|(_, n)| {
                c.op(*n).outputs.iter().all(|&t| {
                    !matches!(c.tensor(t).binding, Binding::Output(_))
                        && c.consumers(t).iter().all(|r| nodes.contains(r))
                })
            })
    }

    /// Would contracting `nodes` (with the groups already formed) make a cycle? Searches
    /// forward from the group's outside readers for a path back into it.
    fn makes_cycle(&self, nodes: &[NodeId]) -> bool {
        let c = self.circuit;
        let inside: HashSet<NodeId> = nodes.iter().copied().collect();
        // Past `bound`, nothing leads back: every group reaching below it ends at or before it.
        let mut bound = nodes.iter().map(|n| n.0).max().unwrap_or(0);
        // The furthest group that starts at or before the bound and ends past it moves the
        // bound to its end, until none does (a prefix maximum, not a pass over every group).
        loop {
            let grown = self.reach.max_upto(bound);
            if grown <= bound {
                break;
            }
            bound = grown;
        }
        // Only the nodes visited, not a flag per op: a search is local, the circuit is not.
        let mut seen: HashSet<NodeId> = HashSet::new();
        let mut stack: Vec<NodeId> = Vec::new();
        let push_readers = |n: NodeId, stack: &mut Vec<NodeId>| {
            for &t in &c.op(n).outputs {
                stack.extend(c.consumers(t).iter().copied());
            }
        };
        for &n in nodes {
            for &t in &c.op(n).outputs {
                stack.extend(
                    c.consumers(t)
                        .iter()
                        .copied()
                        .filter(|r| !inside.contains(r)),
                );
            }
        }
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            if inside.contains(&n) {
                return true;
            }
            match self.owner[n.0 as usize] {
                Some(g) if self.group_min[g] <= bound => {
                    for &m in &self.groups[g].1 {
                        seen.insert(m);
                        push_readers(m, &mut stack);
                    }
                }
                None if n.0 <= bound => push_readers(n, &mut stack),
                _ => {}
            }
        }
        false
    }

    fn assign(&mut self, rule: &'c Rule, nodes: Vec<NodeId>) {
        let g = self.groups.len();
        for n in &nodes {
            self.owner[n.0 as usize] = Some(g);
        }
        let (min, max) = (
            nodes.iter().map(|n| n.0).min().unwrap_or(0),
            nodes.iter().map(|n| n.0).max().unwrap_or(0),
        );
        self.group_min.push(min);
        self.group_max.push(max);
        self.reach.raise(min, max);
        self.rules.push(rule.clone());
        self.groups.push((rule.id.as_str(), nodes));
    }

    fn into_plan(self, circuit: &Circuit, rules: &RuleSet, mode: Mode, rows: usize) -> FusionPlan {
        let mut order: Vec<usize> = (0..self.groups.len()).collect();
        order.sort_by_key(|&g| self.group_min[g]);
        let mut renumber = vec![0u32; order.len()];
        for (new, &old) in order.iter().enumerate() {
            renumber[old] = new as u32;
        }
        let mut group_of = vec![GroupId(0); circuit.ops.len()];
        for (n, owner) in self.owner.iter().enumerate() {
            if let Some(g) = owner {
                group_of[n] = GroupId(renumber[*g]);
            }
        }
        let groups: Vec<Group> = order
            .iter()
            .map(|&g| {
                let mut nodes = self.groups[g].1.clone();
                nodes.sort();
                make_group(circuit, &self.rules[g], nodes)
            })
            .collect();
        let kernel_count_fused = groups.iter().map(|g| g.kernels.len()).sum();
        let mut plan = FusionPlan {
            mode,
            rows,
            groups,
            group_of,
            kernel_count_original: circuit.ops.len(),
            kernel_count_fused,
            rules_digest: rules.digest.clone(),
            digest: String::new(),
        };
        plan.digest = hex_sha256(plan.canonical_text(circuit).as_bytes());
        plan
    }
}

fn make_group(circuit: &Circuit, rule: &Rule, nodes: Vec<NodeId>) -> Group {
    let inside: HashSet<NodeId> = nodes.iter().copied().collect();
    let mut inputs = BTreeSet::new();
    let mut outputs = BTreeSet::new();
    let mut fused = BTreeSet::new();
    for &n in &nodes {
        let op = circuit.op(n);
        for &t in &op.inputs {
            if circuit.producer(t).is_none_or(|p| !inside.contains(&p)) {
                inputs.insert(t);
            }
        }
        for &t in &op.outputs {
            let readers = circuit.consumers(t);
            let internal = circuit.tensor(t).binding == Binding::Arena
                && !readers.is_empty()
                && readers.iter().all(|r| inside.contains(r));
            if internal {
                fused.insert(t);
            } else {
                outputs.insert(t);
            }
        }
    }
    let first = circuit.op(nodes[0]);
    let last = nodes.last().map(|n| circuit.op(*n)).unwrap_or(first);
    Group {
        rule: rule.id.clone(),
        kernels: rule.kernels.clone(),
        emitter: rule.emitter.clone(),
        numerics: rule.numerics.clone(),
        inputs: inputs.into_iter().collect(),
        outputs: outputs.into_iter().collect(),
        fused: fused.into_iter().collect(),
        layer: last.layer,
        branch: first.branch,
        nodes,
    }
}
