//! Pass 1, topo: the group graph (petgraph) and a deterministic topological order of it.
//!
//! Invariant: in the returned order every group comes after the writers of all it reads;
//! ties go to the group whose first node comes first, so the order is stable run to run.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction;

use crate::error::CircuitError;
use crate::fuser::{FusionPlan, GroupId};
use crate::ir::{Circuit, TensorId};

/// Groups as nodes (node index = group index), one edge per (writer, reader, tensor).
pub type GroupGraph = DiGraph<GroupId, TensorId>;

pub fn group_graph(circuit: &Circuit, fusion: &FusionPlan) -> GroupGraph {
    let mut graph = GroupGraph::with_capacity(fusion.groups.len(), fusion.groups.len() * 2);
    for i in 0..fusion.groups.len() {
        graph.add_node(GroupId(i as u32));
    }
    for (i, g) in fusion.groups.iter().enumerate() {
        for &t in &g.inputs {
            if let Some(writer) = circuit.producer(t) {
                let from = fusion.group_of[writer.0 as usize];
                graph.add_edge(NodeIndex::new(from.0 as usize), NodeIndex::new(i), t);
            }
        }
    }
    graph
}

/// Kahn's algorithm with a min-heap on group index.
pub fn topo_order(graph: &GroupGraph) -> Result<Vec<GroupId>, CircuitError> {
    let mut indegree: Vec<usize> = graph
        .node_indices()
        .map(|n| graph.neighbors_directed(n, Direction::Incoming).count())
        .collect();
    let mut ready: BinaryHeap<Reverse<usize>> = indegree
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == 0)
        .map(|(i, _)| Reverse(i))
        .collect();
    let mut order = Vec::with_capacity(indegree.len());
    while let Some(Reverse(i)) = ready.pop() {
        order.push(GroupId(i as u32));
        for next in graph.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
            let d = &mut indegree[next.index()];
            *d -= 1;
            if *d == 0 {
                ready.push(Reverse(next.index()));
            }
        }
    }
    if order.len() != indegree.len() {
        return Err(CircuitError::Verify {
            pass: "topo",
            message: format!(
                "the group graph has a cycle: only {} of {} groups could be ordered",
                order.len(),
                indegree.len()
            ),
        });
    }
    Ok(order)
}
