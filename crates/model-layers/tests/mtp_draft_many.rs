//! Batched MTP drafting on the CPU: `speculative_step_many` with an `MtpDrafter` drafts every
//! sequence of the batch in one head program per draft step (`Drafter::draft_many`), and each
//! sequence's drafts, kept tokens and logits are the bytes it gets drafted alone
//! (`speculative_step`, one head program per sequence and step) — with the draft rows in one
//! program or in several chunks (a draft width narrower than the batch), drafts rejected
//! (random weights) or all accepted (so the next draft catches up over several rows), greedy or
//! sampled drafting. A draft model (`ModelDrafter`, here the target drafting for itself)
//! batches its draft steps as multi-seq steps, with the same guarantee.

mod exec_support;

use std::collections::BTreeMap;

use exec_support::*;
use solder_circuit::{Mode, Policy};
use solder_config::ServeShape;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::{
    greedy, Boot, CircuitExec, Draft, Drafter, ModelDrafter, MtpDrafter, Sampling, SamplingParams,
    SeqId, Session, SessionError, Verdict, WeightSource,
};

const PROMPT: usize = 5;
const STEPS: usize = 4;
/// Each step's k per sequence: Σ (k + 1) fits the widest batched-verify program (8 rows).
const KS: [[usize; 3]; STEPS] = [[1, 2, 2], [2, 1, 1], [1, 1, 3], [2, 2, 1]];

fn build(backend: &mut CpuBackend, draft_widths: &[usize]) -> CircuitExec {
    CircuitExec::build(
        backend,
        Boot {
            config: config(TINY_NEXT),
            serve: ServeShape {
                draft_widths: draft_widths.to_vec(),
                ..serve()
            },
            rules: rules(),
            policy: Policy::default(),
            weights: WeightSource::Random { seed: 0x3a7 },
            kv: roomy_kv(),
            precision: Default::default(),
        },
    )
    .expect("build")
}

/// Records every draft its inner drafter makes (per target sequence, in order) and, when
/// given each sequence's greedy future, proposes that instead (so every draft is accepted);
/// forwards `draft_many`, so a batched step drafts through the inner drafter's batched path.
struct Recorder<D> {
    inner: D,
    drafts: BTreeMap<SeqId, Vec<Draft>>,
    futures: Option<BTreeMap<SeqId, Vec<u32>>>,
}

impl<D: Drafter> Recorder<D> {
    fn record(&mut self, seq: SeqId, committed: usize, mut draft: Draft) -> Draft {
        self.drafts.entry(seq).or_default().push(draft.clone());
        if let Some(futures) = &self.futures {
            // `pending` is future[committed - prompt]; the drafts follow it.
            let at = committed - PROMPT + 1;
            draft.tokens = futures[&seq][at..at + draft.tokens.len()].to_vec();
            draft.probs = None;
        }
        draft
    }
}

impl<D: Drafter> Drafter for Recorder<D> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn draft(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        committed: &[u32],
        pending: u32,
        k: usize,
    ) -> Result<Draft, SessionError> {
        let draft = self.inner.draft(backend, seq, committed, pending, k)?;
        Ok(self.record(seq, committed.len(), draft))
    }

    fn draft_many(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32], u32, usize)],
    ) -> Result<Vec<Draft>, SessionError> {
        let drafts = self.inner.draft_many(backend, batch)?;
        Ok(batch
            .iter()
            .zip(drafts)
            .map(|(&(seq, committed, ..), draft)| self.record(seq, committed.len(), draft))
            .collect())
    }

    fn settle(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        verdict: Verdict,
    ) -> Result<(), SessionError> {
        self.inner.settle(backend, seq, verdict)
    }

    fn forget(&mut self, seq: SeqId) {
        self.inner.forget(seq)
    }
}

/// The drafter under test: the MTP head (which prefills, to see the target's hidden rows) or a
/// draft model.
enum Either<'e> {
    Mtp(MtpDrafter<'e>),
    Model(ModelDrafter<'e>),
}

impl Either<'_> {
    fn inner(&mut self) -> &mut dyn Drafter {
        match self {
            Either::Mtp(d) => d,
            Either::Model(d) => d,
        }
    }

    fn prefill(
        &mut self,
        backend: &mut CpuBackend,
        session: &mut Session<'_>,
        id: SeqId,
        prompt: &[u32],
    ) -> Vec<f32> {
        match self {
            Either::Mtp(d) => d.prefill(backend, session, id, prompt),
            Either::Model(_) => session.prefill(backend, id, prompt),
        }
        .expect("prefill")
    }
}

impl Drafter for Either<'_> {
    fn vocab_size(&self) -> usize {
        match self {
            Either::Mtp(d) => d.vocab_size(),
            Either::Model(d) => d.vocab_size(),
        }
    }

    fn draft(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        committed: &[u32],
        pending: u32,
        k: usize,
    ) -> Result<Draft, SessionError> {
        self.inner().draft(backend, seq, committed, pending, k)
    }

    fn draft_many(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32], u32, usize)],
    ) -> Result<Vec<Draft>, SessionError> {
        self.inner().draft_many(backend, batch)
    }

    fn settle(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        verdict: Verdict,
    ) -> Result<(), SessionError> {
        self.inner().settle(backend, seq, verdict)
    }

    fn forget(&mut self, seq: SeqId) {
        self.inner().forget(seq)
    }
}

/// What a run leaves per sequence: its tokens, the logits of its kept rows and its drafts.
type Outcome = (Vec<u32>, Vec<f32>, Vec<Draft>);

/// Each prompt's greedy continuation (for the all-accepted runs).
fn futures(backend: &mut CpuBackend, exec: &CircuitExec, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let vocab = exec.config.vocab_size;
    prompts
        .iter()
        .map(|p| {
            let mut session = Session::new(exec);
            let id = session.add_sequence();
            let logits = session.prefill(backend, id, p).expect("prefill");
            let mut future = vec![greedy(&logits[(p.len() - 1) * vocab..])];
            for _ in 0..STEPS * 4 {
                let t = *future.last().unwrap();
                future.push(greedy(&session.decode(backend, id, t).expect("decode")));
            }
            future
        })
        .collect()
}

/// Runs `prompts` through `STEPS` speculative steps with the MTP head (or, `model`, the target
/// as its own draft model) as drafter: together in batched steps (`batched`), else each alone
/// in its own session.
fn run(
    backend: &mut CpuBackend,
    exec: &CircuitExec,
    prompts: &[Vec<u32>],
    (sampling, oracle, model): (Sampling, bool, bool),
    batched: bool,
) -> Vec<Outcome> {
    let vocab = exec.config.vocab_size;
    let futures = oracle.then(|| futures(backend, exec, prompts));
    let groups: Vec<Vec<usize>> = if batched {
        vec![(0..prompts.len()).collect()]
    } else {
        (0..prompts.len()).map(|i| vec![i]).collect()
    };
    let mut outcomes: Vec<Outcome> = vec![Default::default(); prompts.len()];
    for group in groups {
        let mut drafter = Recorder {
            inner: if model {
                Either::Model(ModelDrafter::sampled(exec, sampling).expect("a drafter"))
            } else {
                Either::Mtp(MtpDrafter::sampled(exec, sampling).expect("a draft head"))
            },
            drafts: BTreeMap::new(),
            futures: None,
        };
        let mut session = Session::new(exec);
        let ids: Vec<SeqId> = group.iter().map(|_| session.add_sequence()).collect();
        let mut pending = Vec::new();
        for (&i, &id) in group.iter().zip(&ids) {
            let logits = drafter
                .inner
                .prefill(backend, &mut session, id, &prompts[i]);
            pending.push(greedy(&logits[(PROMPT - 1) * vocab..]));
            outcomes[i].0.push(pending[pending.len() - 1]);
        }
        if let Some(futures) = &futures {
            let by_seq = group
                .iter()
                .zip(&ids)
                .map(|(&i, &id)| (id, futures[i].clone()));
            drafter.futures = Some(by_seq.collect());
        }
        for ks in KS {
            let batch: Vec<(SeqId, u32, usize)> = group
                .iter()
                .zip(&ids)
                .zip(&pending)
                .map(|((&i, &id), &p)| (id, p, ks[i]))
                .collect();
            let steps = if batched {
                session
                    .speculative_step_many(backend, &batch, &mut drafter)
                    .expect("batched speculative step")
            } else {
                let (id, p, k) = batch[0];
                vec![session
                    .speculative_step(backend, id, p, k, &mut drafter)
                    .expect("speculative step")]
            };
            for ((j, &i), step) in group.iter().enumerate().zip(steps) {
                if oracle {
                    assert_eq!(step.accepted, ks[i], "the oracle's drafts are accepted");
                }
                pending[j] = *step.tokens.last().unwrap();
                outcomes[i].0.extend(&step.tokens);
                outcomes[i].1.extend(&step.logits);
            }
        }
        if let (true, Either::Model(d)) = (batched, &drafter.inner) {
            // The last step's second draft position: two sequences in one multi-seq step.
            let last = d
                .session()
                .last_program()
                .map(|(mode, rows, _)| (mode, rows));
            assert_eq!(last, Some((Mode::MultiSeq, 2)), "draft steps batched");
        }
        for (&i, id) in group.iter().zip(&ids) {
            outcomes[i].2 = drafter.drafts.remove(id).expect("drafts");
        }
    }
    outcomes
}

fn assert_batched_as_alone(draft_widths: &[usize], sampling: Sampling, oracle: bool) {
    assert_batched_as_alone_by(draft_widths, (sampling, oracle, false));
}

fn assert_batched_as_alone_by(
    draft_widths: &[usize],
    (sampling, oracle, model): (Sampling, bool, bool),
) {
    let mut backend = backend();
    let exec = build(&mut backend, draft_widths);
    let prompts: Vec<Vec<u32>> = (0..3).map(|s| prompt(40 + s, 128, PROMPT)).collect();
    let how = (sampling, oracle, model);
    let alone = run(&mut backend, &exec, &prompts, how, false);
    let together = run(&mut backend, &exec, &prompts, how, true);
    let what =
        format!("draft widths {draft_widths:?}, {sampling:?}, oracle {oracle}, model {model}");
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.2.len(), STEPS, "{what}: sequence {i}: one draft per step");
        assert_eq!(t.2, a.2, "{what}: sequence {i}: drafts");
        assert_eq!(t.0, a.0, "{what}: sequence {i}: tokens");
        assert_same_bytes(&t.1, &a.1, &format!("{what}: sequence {i}: logits"));
    }
}

fn sampled() -> Sampling {
    Sampling::Sampled(SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 5,
    })
}

#[test]
fn batched_drafts_are_each_sequences_drafts_alone() {
    // [4]: every draft step of the three sequences in one program; [2]: in chunks.
    for widths in [&[4][..], &[2]] {
        assert_batched_as_alone(widths, Sampling::Greedy, false);
        assert_batched_as_alone(widths, Sampling::Greedy, true);
        assert_batched_as_alone(widths, sampled(), true);
    }
}

#[test]
fn a_draft_model_drafts_a_batch_as_each_sequence_alone() {
    // The target drafting for itself (its drafts all accepted: multi-token catch-ups), greedy
    // and sampled (drafts rejected), its draft steps as multi-seq steps.
    assert_batched_as_alone_by(&[], (Sampling::Greedy, false, true));
    assert_batched_as_alone_by(&[], (sampled(), false, true));
}

#[test]
fn a_batched_draft_step_is_one_head_program() {
    let mut backend = backend();
    let exec = build(&mut backend, &[4]);
    let vocab = exec.config.vocab_size;
    let mut drafter = MtpDrafter::new(&exec).expect("a draft head");
    let mut session = Session::new(&exec);
    let mut batch = Vec::new();
    for s in 0..3 {
        let id = session.add_sequence();
        let p = prompt(60 + s, 128, PROMPT);
        let logits = drafter
            .prefill(&mut backend, &mut session, id, &p)
            .expect("prefill");
        batch.push((id, greedy(&logits[(PROMPT - 1) * vocab..]), 2));
    }
    let requests: Vec<(SeqId, Vec<u32>, u32, usize)> = batch
        .iter()
        .map(|&(id, p, k)| (id, session.tokens(id).unwrap().to_vec(), p, k))
        .collect();
    let requests: Vec<(SeqId, &[u32], u32, usize)> = requests
        .iter()
        .map(|(id, c, p, k)| (*id, c.as_slice(), *p, *k))
        .collect();
    let drafts = drafter
        .draft_many(&mut backend, &requests)
        .expect("draft many");
    assert!(drafts.iter().all(|d| d.tokens.len() == 2));
    // The second draft step fed the three sequences' rows to one four-row head program.
    assert_eq!(
        drafter.session().last_program(),
        Some((Mode::Draft, 4, None))
    );
    for &(id, ..) in &batch {
        drafter
            .settle(&mut backend, id, Verdict::NOTHING)
            .expect("settle");
        assert_eq!(drafter.paired(id), Some((PROMPT - 1, 1)), "taken back");
    }
    // A sequence twice is refused, and leaves the head as it was.
    let twice = [requests[0], requests[0]];
    let err = drafter.draft_many(&mut backend, &twice).unwrap_err();
    assert!(matches!(err, SessionError::DuplicateSequence(_)), "{err}");
    assert_eq!(drafter.paired(batch[0].0), Some((PROMPT - 1, 1)));
}
