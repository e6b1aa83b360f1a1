//! The `api` target: sequences of library calls with hostile arguments against the CPU
//! backend. A case opens a session on one of two tiny models (a KV-only llama and a
//! qwen3_next with recurrent state and an MTP draft head), feeds a few sequences, then makes
//! calls whose ids, lengths, token ids, k, policies, rewind points and hidden-row indices are
//! drawn from the edges (0, 1, the limits, past them, `usize::MAX`). After every refused call
//! every sequence of the session must be byte for byte as before it: length, tokens, block
//! table, free pages, its KV cells and its recurrent state. A panic or a refused call that
//! changed a sequence is a finding; the input written for it is the case's call log.

use solder_circuit::Policy;
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::{
    Boot, CircuitExec, HiddenRows, KvShape, ModelDrafter, RewindPoint, SeqId, Session, SpecPolicy,
    WeightSource,
};

use super::mutate::Rng;
use super::targets::Outcome;

/// The backend and the two execs every case runs on (built once per run).
pub struct Api {
    backend: CpuBackend,
    execs: Vec<CircuitExec>,
}

impl Api {
    pub fn build(rules: &solder_circuit::RuleSet) -> Result<Api, String> {
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(2))
            .map_err(|e| format!("cpu backend: {e}"))?;
        let mut execs = Vec::new();
        for (name, draft_widths) in [("tiny-llama", vec![]), ("tiny-qwen3-next", vec![1])] {
            let builtin = crate::parity::builtin::BUILTINS
                .iter()
                .find(|b| b.name == name)
                .ok_or_else(|| format!("no builtin {name}"))?;
            let config: ModelConfig = builtin.config()?;
            let serve = ServeShape {
                draft_widths,
                ..ServeShape::with_max_batch(4).map_err(|e| e.to_string())?
            };
            let boot = Boot {
                config,
                serve,
                rules: rules.clone(),
                policy: Policy::default(),
                weights: WeightSource::Random { seed: builtin.seed },
                kv: KvShape {
                    pages: 40,
                    block_size: 4,
                    max_seq_len: 24,
                    max_sequences: 6,
                },
                precision: Default::default(),
            };
            execs.push(CircuitExec::build(&mut backend, boot).map_err(|e| format!("{name}: {e}"))?);
        }
        Ok(Api { backend, execs })
    }
}

/// What a sequence holds, as bytes: compared before and after every refused call.
#[derive(PartialEq, Eq, Debug)]
struct SeqState {
    len: usize,
    tokens: Vec<u32>,
    table: Vec<u32>,
    kv_cells: Vec<u8>,
    recurrent: Vec<Vec<u8>>,
}

/// Every live sequence of `ids` in `session` (ended ones are skipped), and the free pages.
fn snapshot(
    session: &Session<'_>,
    exec: &CircuitExec,
    backend: &mut CpuBackend,
    ids: &[SeqId],
) -> Result<(usize, Vec<(SeqId, SeqState)>), String> {
    let c = &exec.config;
    let row = c.num_key_value_heads * c.head_dim * 2;
    let block = exec.layout.kv_block_size;
    let mut out = Vec::new();
    for &id in ids {
        let Ok(len) = session.seq_len(id) else {
            continue;
        };
        let table = session.block_table(id).map_err(|e| e.to_string())?.to_vec();
        let mut kv_cells = Vec::new();
        for region in exec.layout.states.iter().filter(|r| r.slot_bytes == 0) {
            for p in 0..len {
                let page = table[p / block] as usize;
                for kv in 0..2 {
                    let at = region.offset + ((page * 2 + kv) * block + p % block) * row;
                    let mut cell = vec![0u8; row];
                    backend
                        .copy_d2h(exec.kv_cache().offset(at), &mut cell)
                        .map_err(|e| e.to_string())?;
                    kv_cells.extend(cell);
                }
            }
        }
        let point = session
            .rewind_point(backend, id)
            .map_err(|e| e.to_string())?;
        let state = SeqState {
            len,
            tokens: session.tokens(id).map_err(|e| e.to_string())?.to_vec(),
            table,
            kv_cells,
            recurrent: point.state_bytes().to_vec(),
        };
        out.push((id, state));
    }
    Ok((session.free_page_count(), out))
}

/// A size or index from the edges: small, at the model's limits, just past them, or near
/// `usize::MAX`.
fn edge(rng: &mut Rng, limit: usize) -> usize {
    match rng.below(9) {
        0 => 0,
        1 => 1,
        2 => limit.saturating_sub(1),
        3 => limit,
        4 => limit.saturating_add(1),
        5 => usize::MAX,
        6 => usize::MAX - 1,
        7 => rng.next() as usize,
        _ => rng.below(limit.saturating_add(2)),
    }
}

/// A token id: mostly valid, sometimes at or past the vocabulary.
fn token(rng: &mut Rng, vocab: usize) -> u32 {
    match rng.below(8) {
        0 => vocab as u32,
        1 => u32::MAX,
        _ => rng.below(vocab) as u32,
    }
}

/// A sequence id: one of the case's, one never made, or an edge.
fn seq_id(rng: &mut Rng, ids: &[SeqId]) -> SeqId {
    match rng.below(6) {
        0 => u64::MAX,
        1 => 0,
        _ => ids[rng.below(ids.len())],
    }
}

fn tokens(rng: &mut Rng, vocab: usize, max: usize) -> Vec<u32> {
    let n = rng.below(max + 1);
    (0..n).map(|_| token(rng, vocab)).collect()
}

/// One case: a session, up to three sequences fed a few tokens, then up to ten hostile calls.
pub fn api_case(api: &mut Api, rng: &mut Rng) -> (Vec<u8>, Outcome) {
    let Api { backend, execs } = api;
    let exec = &execs[rng.below(execs.len())];
    let mut log = format!("exec {}\n", exec.instance.circuit.name);
    let outcome = run_calls(exec, backend, rng, &mut log);
    (log.into_bytes(), outcome)
}

fn run_calls(
    exec: &CircuitExec,
    backend: &mut CpuBackend,
    rng: &mut Rng,
    log: &mut String,
) -> Outcome {
    let vocab = exec.config.vocab_size;
    let mut calls = Calls {
        exec,
        drafter: ModelDrafter::new(exec),
        session: Session::new(exec),
        ids: Vec::new(),
        points: Vec::new(),
    };
    let mut other = Session::new(exec);
    let foreign_id = other.add_sequence();
    let _ = other.prefill(backend, foreign_id, &[1, 2]);
    for _ in 0..1 + rng.below(3) {
        let id = calls.session.add_sequence();
        let feed: Vec<u32> = (0..rng.below(4)).map(|_| rng.below(vocab) as u32).collect();
        if !feed.is_empty() && calls.session.prefill(backend, id, &feed).is_err() {
            return Outcome::Broken(format!("the setup prefill of {feed:?} failed"));
        }
        calls.ids.push(id);
    }
    let mut refused = false;
    if let Ok(point) = other.rewind_point(backend, foreign_id) {
        calls.points.push(point);
    }
    for call in 0..1 + rng.below(10) {
        let before = match snapshot(&calls.session, exec, backend, &calls.ids) {
            Ok(s) => s,
            Err(e) => return Outcome::Broken(format!("snapshot: {e}")),
        };
        let Some((what, result)) = calls.call(backend, rng) else {
            continue;
        };
        log.push_str(&format!(
            "{call}: {what} -> {}\n",
            match &result {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("refused: {e}"),
            }
        ));
        let Err(refusal) = result else {
            continue;
        };
        refused = true;
        let after = match snapshot(&calls.session, exec, backend, &calls.ids) {
            Ok(s) => s,
            Err(e) => return Outcome::Broken(format!("snapshot: {e}")),
        };
        if after != before {
            let changed: Vec<SeqId> = before
                .1
                .iter()
                .filter(|(id, s)| after.1.iter().find(|(a, _)| a == id).map(|(_, t)| t) != Some(s))
                .map(|(id, _)| *id)
                .collect();
            return Outcome::Broken(format!(
                "call {call}, {what}, was refused ({refusal}) but changed sequence(s) {changed:?} \
                 (free pages {} -> {})",
                before.0, after.0
            ));
        }
    }
    if refused {
        Outcome::Refused
    } else {
        Outcome::Accepted
    }
}

/// What the hostile calls act on: the session under test, its drafter, its sequences and the
/// rewind points taken (the first may be another session's).
struct Calls<'e> {
    exec: &'e CircuitExec,
    // Dropped before the session, as the drafter of a session is.
    drafter: ModelDrafter<'e>,
    session: Session<'e>,
    ids: Vec<SeqId>,
    points: Vec<RewindPoint>,
}

impl Calls<'_> {
    /// One random call, drawn from `rng`, as `(what it was, its result)`; none when a rewind
    /// has no point to go to.
    fn call(
        &mut self,
        backend: &mut CpuBackend,
        rng: &mut Rng,
    ) -> Option<(String, Result<(), String>)> {
        match rng.below(13) {
            choice @ (0..=3 | 9) => Some(self.feed(choice, backend, rng)),
            choice @ 4..=8 => self.sequence(choice, backend, rng),
            choice @ (10 | 11) => Some(self.hidden(choice, backend, rng)),
            _ => {
                self.ids.push(self.session.add_sequence());
                Some(("add_sequence()".to_string(), Ok(())))
            }
        }
    }

    /// A call that feeds tokens: decode, prefill, multi_seq_step, verify or verify_batch.
    fn feed(
        &mut self,
        choice: usize,
        backend: &mut CpuBackend,
        rng: &mut Rng,
    ) -> (String, Result<(), String>) {
        let vocab = self.exec.config.vocab_size;
        let max_len = self.exec.layout.max_seq_len;
        let max_rows = self.exec.layout.max_rows;
        match choice {
            0 => {
                let (id, t) = (seq_id(rng, &self.ids), token(rng, vocab));
                (
                    format!("decode({id}, {t})"),
                    self.session
                        .decode(backend, id, t)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                )
            }
            1 => {
                let id = seq_id(rng, &self.ids);
                let t = tokens(rng, vocab, max_len + 2);
                (
                    format!("prefill({id}, {} tokens)", t.len()),
                    self.session
                        .prefill(backend, id, &t)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                )
            }
            2 => {
                let batch: Vec<(SeqId, u32)> = (0..rng.below(6))
                    .map(|_| (seq_id(rng, &self.ids), token(rng, vocab)))
                    .collect();
                (
                    format!("multi_seq_step({batch:?})"),
                    self.session
                        .multi_seq_step(backend, &batch)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                )
            }
            3 => {
                let id = seq_id(rng, &self.ids);
                let t = tokens(rng, vocab, max_rows + 2);
                (
                    format!("verify({id}, {t:?})"),
                    self.session
                        .verify(backend, id, &t)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                )
            }
            _ => {
                let batch: Vec<(SeqId, Vec<u32>)> = (0..rng.below(4))
                    .map(|_| (seq_id(rng, &self.ids), tokens(rng, vocab, 4)))
                    .collect();
                let refs: Vec<(SeqId, &[u32])> =
                    batch.iter().map(|(id, t)| (*id, t.as_slice())).collect();
                (
                    format!("verify_batch({batch:?})"),
                    self.session
                        .verify_batch(backend, &refs)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                )
            }
        }
    }

    /// A call on a sequence's state: truncate_to, rewind, speculative_step (a fixed k or
    /// `next_k`) or end_sequence; none when a rewind has no point to go to.
    fn sequence(
        &mut self,
        choice: usize,
        backend: &mut CpuBackend,
        rng: &mut Rng,
    ) -> Option<(String, Result<(), String>)> {
        let vocab = self.exec.config.vocab_size;
        let max_len = self.exec.layout.max_seq_len;
        let max_rows = self.exec.layout.max_rows;
        match choice {
            4 => {
                let (id, len) = (seq_id(rng, &self.ids), edge(rng, max_len));
                Some((
                    format!("truncate_to({id}, {len})"),
                    self.session.truncate_to(id, len).map_err(|e| e.to_string()),
                ))
            }
            5 => {
                let id = seq_id(rng, &self.ids);
                if let Ok(point) = self.session.rewind_point(backend, id) {
                    self.points.push(point);
                }
                if self.points.is_empty() {
                    return None;
                }
                let point = self.points[rng.below(self.points.len())].clone();
                Some((
                    format!("rewind(point of {} at {})", point.seq(), point.len()),
                    self.session
                        .rewind(backend, &point)
                        .map_err(|e| e.to_string()),
                ))
            }
            6 => {
                let (id, pending, k) = (
                    seq_id(rng, &self.ids),
                    token(rng, vocab),
                    edge(rng, max_rows),
                );
                Some((
                    format!("speculative_step({id}, {pending}, k {k})"),
                    self.session
                        .speculative_step(backend, id, pending, k, &mut self.drafter)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                ))
            }
            7 => {
                let policy = if rng.below(3) == 0 {
                    SpecPolicy::Fixed(edge(rng, max_rows))
                } else {
                    SpecPolicy::Adaptive {
                        min: edge(rng, max_rows),
                        max: edge(rng, max_rows),
                    }
                };
                let (id, pending) = (seq_id(rng, &self.ids), token(rng, vocab));
                Some((
                    format!("speculative_step({id}, {pending}, next_k({policy:?}))"),
                    self.session
                        .next_k(id, policy)
                        .and_then(|k| {
                            self.session.speculative_step(
                                backend,
                                id,
                                pending,
                                k,
                                &mut self.drafter,
                            )
                        })
                        .map(drop)
                        .map_err(|e| e.to_string()),
                ))
            }
            _ => {
                let id = seq_id(rng, &self.ids);
                let result = self.session.end_sequence(id).map_err(|e| e.to_string());
                Some((format!("end_sequence({id})"), result))
            }
        }
    }

    /// A call on the exec's hidden rows: read_hidden_at or chain_hidden.
    fn hidden(
        &self,
        choice: usize,
        backend: &mut CpuBackend,
        rng: &mut Rng,
    ) -> (String, Result<(), String>) {
        let max_rows = self.exec.layout.max_rows;
        match choice {
            10 => {
                let which = if rng.below(2) == 0 {
                    HiddenRows::Target
                } else {
                    HiddenRows::Draft
                };
                let (first, rows) = (edge(rng, max_rows), edge(rng, max_rows));
                (
                    format!("read_hidden_at({which:?}, {first}, {rows})"),
                    self.exec
                        .read_hidden_at(backend, which, first, rows)
                        .map(drop)
                        .map_err(|e| e.to_string()),
                )
            }
            _ => {
                let (from, to) = (edge(rng, max_rows), edge(rng, max_rows));
                (
                    format!("chain_hidden({from}, {to})"),
                    self.exec
                        .chain_hidden(backend, from, to)
                        .map_err(|e| e.to_string()),
                )
            }
        }
    }
}
