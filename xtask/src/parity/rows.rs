//! The mode rows of a parity case: each prompt decoded alone (the baseline), then decode,
//! multi-seq, verify and batched-verify rows comparing the reference routing with all rules
//! (replayed and eagerly), and the detection run.
//!
//! Invariant: the rows run in the report's order; each row's all-rules programs are taken
//! from the route log right after it, so a broken claim is blamed on that row's programs.

use solder_circuit::Mode;
use solder_config::ServeShape;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::GraphPolicy;

use super::case::{random_prompt, Case, Detection, FiniteCheck, ModeRow, RouteLog, Routing, R};
use super::claims::Blame;
use super::diff::Diff;
use super::differs::{max_abs, Differs, ProgramKey};
use super::execs::{
    decode_logged, multi_seq, prefill_chunks, prefill_positions, verify_batched, verify_chunks,
};

/// Every mode row in the report's order: decode, multi-seq, verify, prefill, batched verify.
/// `[fused_alone, fused_eager]` is prompt 0 decoded alone under all rules (replayed, eagerly).
pub(super) fn mode_rows(
    base: &Baseline,
    serve: &ServeShape,
    [fused_alone, fused_eager]: [&[f32]; 2],
    differs: bool,
    backend: &mut dyn GpuBackend,
    log: &mut RowLog,
) -> R<Vec<ModeRow>> {
    let programs = log.0.take_ran();
    let mut modes = vec![decode_row(
        base,
        [fused_alone, fused_eager],
        &programs,
        backend,
    )?];
    modes.extend(multi_seq_rows(base, serve, backend, log)?);
    // Each verify width runs its own program: a prompt shorter than the widest width would
    // send every wider row through the same narrower one (a chunk shorter than K prefills).
    let verify = VerifyPrompt::new(
        base.blame.case,
        serve,
        [base.reference, base.fused],
        backend,
        &base.prompts[0],
        [&base.alone[0], &base.alone_fused[0]],
        differs,
    )?;
    modes.extend(verify_rows(base, &verify, serve, backend, log)?);
    modes.extend(prefill_rows(base, &verify, serve, backend, log)?);
    modes.extend(verify_batch_rows(base, serve, backend, log)?);
    Ok(modes)
}

/// Each prompt decoded alone: the baseline every batched row is compared with.
pub(super) struct Alone {
    /// Every prompt, reference routing.
    pub(super) alone: Vec<Vec<f32>>,
    /// Prompt 0, all rules, replaying graphs.
    pub(super) fused_alone: Vec<f32>,
    /// Every prompt under all rules where a `differs` rule applies, else `alone`.
    pub(super) alone_fused: Vec<Vec<f32>>,
    /// Prompt 0, all rules, eagerly.
    pub(super) fused_eager: Vec<f32>,
    /// max |logit| of `alone`.
    pub(super) scale: f32,
    /// The all-rules exec's `differs` rules at `scale`.
    pub(super) differs: Option<Differs>,
}

/// Decodes every prompt alone under the reference routing and prompt 0 under all rules
/// (replayed, then eagerly); with a `differs` rule, every prompt under all rules too.
pub(super) fn decode_alone(
    model: &str,
    [reference, fused]: [Routing; 2],
    prompts: &[Vec<u32>],
    backend: &mut dyn GpuBackend,
    (routes, finite): &mut RowLog,
) -> R<Alone> {
    tracing::info!(model = %model, "decoding {} prompts alone (reference routing)", prompts.len());
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| decode_logged(reference, backend, p, routes))
        .collect::<R<_>>()?;
    for (s, logits) in alone.iter().enumerate() {
        finite.check(&format!("reference decode rows 1, sequence {s}"), logits);
    }
    let fused_alone = decode_logged(fused, backend, &prompts[0], routes)?;
    finite.check("all-rules decode rows 1", &fused_alone);
    // With a `differs` rule the all-rules routing is its own batch-invariance reference: every
    // prompt decoded alone under it too (byte identity with the reference routing is moot).
    let scale = max_abs(&alone);
    let differs = Differs::of(fused.exec, scale);
    let alone_fused: Vec<Vec<f32>> = match &differs {
        None => alone.clone(),
        Some(_) => std::iter::once(Ok(fused_alone.clone()))
            .chain(
                prompts[1..]
                    .iter()
                    .map(|p| decode_logged(fused, backend, p, routes)),
            )
            .collect::<R<_>>()?,
    };
    let fused_eager = eagerly(fused, |r| {
        decode_logged(r, backend, &prompts[0], &mut RouteLog::default())
    })?;
    Ok(Alone {
        alone,
        fused_alone,
        alone_fused,
        fused_eager,
        scale,
        differs,
    })
}

/// What every mode row of a case compares against: the two routings, the prompts, each
/// prompt's logits decoded alone under each routing, and who a broken claim is blamed on.
pub(super) struct Baseline<'a> {
    pub(super) reference: Routing<'a>,
    pub(super) fused: Routing<'a>,
    pub(super) prompts: &'a [Vec<u32>],
    pub(super) alone: &'a [Vec<f32>],
    pub(super) alone_fused: &'a [Vec<f32>],
    pub(super) blame: &'a Blame<'a>,
    pub(super) vocab: usize,
}

/// The route log and the finite check every mode row adds to.
pub(super) type RowLog<'l, 'a> = (&'l mut RouteLog, &'l mut FiniteCheck<'a>);

/// The decode row: prompt 0 decoded alone under all rules (`[replayed, eagerly]`) against the
/// reference routing, judged over the all-rules `programs` it ran.
fn decode_row(
    base: &Baseline,
    [fused_alone, fused_eager]: [&[f32]; 2],
    programs: &[ProgramKey],
    backend: &mut dyn GpuBackend,
) -> R<ModeRow> {
    let vocab = base.vocab;
    let mut row = ModeRow {
        mode: Mode::Decode,
        rows: 1,
        live: 1,
        tokens: base.prompts[0].len(),
        programs: Vec::new(),
        ref_vs_fused: Diff::of(&base.alone[0], fused_alone, vocab),
        vs_decode: Diff::of(fused_alone, &base.alone_fused[0], vocab),
        graph_vs_eager: Diff::of(fused_alone, fused_eager, vocab),
        differs: None,
        broken_claim: None,
    };
    base.blame
        .judge(&mut row, programs, backend, &base.alone[..1], &|r, b| {
            Ok(vec![decode_logged(
                r,
                b,
                &base.prompts[0],
                &mut RouteLog::default(),
            )?])
        })?;
    Ok(row)
}

/// One multi-seq row per width of the ladder, and the widest again with padding rows (one
/// more live sequence than the width below).
fn multi_seq_rows(
    base: &Baseline,
    serve: &ServeShape,
    backend: &mut dyn GpuBackend,
    (routes, finite): &mut RowLog,
) -> R<Vec<ModeRow>> {
    let (reference, fused, prompts) = (base.reference, base.fused, base.prompts);
    let widest = serve.multi_seq_ladder.last().copied().unwrap_or(1);
    let mut widths: Vec<(usize, usize)> = serve.multi_seq_ladder.iter().map(|&w| (w, w)).collect();
    if serve.multi_seq_ladder.len() >= 2 {
        // The widest width again with padding rows: one more live sequence than the width below.
        let below = serve.multi_seq_ladder[serve.multi_seq_ladder.len() - 2];
        widths.push((widest, below + 1));
    }
    let mut rows = Vec::new();
    for (width, live) in widths {
        tracing::info!(model = %base.blame.case.name, width, live, "multi_seq");
        let r = multi_seq(reference, backend, &prompts[..live], routes)?;
        let f = multi_seq(fused, backend, &prompts[..live], routes)?;
        let fe = eagerly(fused, |r| {
            multi_seq(r, backend, &prompts[..live], &mut RouteLog::default())
        })?;
        let label = format!("multi_seq rows {width} ({live} live)");
        let mut row = per_sequence_row(
            Mode::MultiSeq,
            width,
            &label,
            [&r, &f, &fe],
            [base.alone, base.alone_fused],
            finite,
        );
        base.blame
            .judge(&mut row, &routes.take_ran(), backend, &r, &|routing, b| {
                multi_seq(routing, b, &prompts[..live], &mut RouteLog::default())
            })?;
        rows.push(row);
    }
    Ok(rows)
}

/// One verify row per verify width: `verify.prompt` fed in chunks of k tokens.
fn verify_rows(
    base: &Baseline,
    verify: &VerifyPrompt,
    serve: &ServeShape,
    backend: &mut dyn GpuBackend,
    log: &mut RowLog,
) -> R<Vec<ModeRow>> {
    let widths = (Mode::Verify, serve.verify_widths.clone());
    chunk_rows(base, verify, widths, verify_chunks, backend, log)
}

/// Prefill rows at the narrowest and widest verify widths (the remainders run the widths
/// between): `verify.prompt` in chunks through the prefill programs (no logits), one token
/// decoded after each; those positions' logits against the prompt decoded alone.
fn prefill_rows(
    base: &Baseline,
    verify: &VerifyPrompt,
    serve: &ServeShape,
    backend: &mut dyn GpuBackend,
    log: &mut RowLog,
) -> R<Vec<ModeRow>> {
    let shapes = base.fused.exec.instance.program_shapes();
    let mut widths: Vec<usize> = [serve.verify_widths.first(), serve.verify_widths.last()]
        .into_iter()
        .flatten()
        .copied()
        .filter(|&k| shapes.contains(Mode::Prefill, k))
        .collect();
    widths.dedup();
    chunk_rows(
        base,
        verify,
        (Mode::Prefill, widths),
        prefill_chunks,
        backend,
        log,
    )
}

/// A run of `verify.prompt` in chunks of k tokens under a routing: the logits it returns.
type ChunkRun = fn(Routing, &mut dyn GpuBackend, &[u32], usize, &mut RouteLog) -> R<Vec<f32>>;

/// One row of `mode` per width: `verify.prompt` fed by `run` in chunks of k tokens under both
/// routings (and eagerly), against the prompt decoded alone at the positions `run` returns
/// logits for (every one for verify; `prefill_positions` for prefill).
fn chunk_rows(
    base: &Baseline,
    verify: &VerifyPrompt,
    (mode, widths): (Mode, Vec<usize>),
    run: ChunkRun,
    backend: &mut dyn GpuBackend,
    (routes, finite): &mut RowLog,
) -> R<Vec<ModeRow>> {
    let (reference, fused, vocab) = (base.reference, base.fused, base.vocab);
    let prompt = &verify.prompt;
    let mut rows = Vec::new();
    for k in widths {
        let positions = match mode {
            Mode::Prefill => prefill_positions(prompt.len(), k),
            _ => (0..prompt.len()).collect(),
        };
        let at = |logits: &[f32]| -> Vec<f32> {
            let row = |p: usize| &logits[p * vocab..(p + 1) * vocab];
            positions.iter().flat_map(|&p| row(p)).copied().collect()
        };
        let r = run(reference, backend, prompt, k, routes)?;
        let f = run(fused, backend, prompt, k, routes)?;
        let fe = eagerly(fused, |r| {
            run(r, backend, prompt, k, &mut RouteLog::default())
        })?;
        finite.check(&format!("reference {mode} rows {k}"), &r);
        finite.check(&format!("all-rules {mode} rows {k}"), &f);
        let mut row = ModeRow {
            mode,
            rows: k,
            live: 1,
            tokens: prompt.len(),
            programs: Vec::new(),
            ref_vs_fused: Diff::of(&r, &f, vocab),
            vs_decode: Diff::of(&f, &at(&verify.alone_fused), vocab).merge(Diff::of(
                &r,
                &at(&verify.alone),
                vocab,
            )),
            graph_vs_eager: Diff::of(&f, &fe, vocab),
            differs: None,
            broken_claim: None,
        };
        base.blame.judge(
            &mut row,
            &routes.take_ran(),
            backend,
            &[r],
            &|routing, b| Ok(vec![run(routing, b, prompt, k, &mut RouteLog::default())?]),
        )?;
        rows.push(row);
    }
    Ok(rows)
}

/// Batched verify: m sequences (prompts 0..m) fed k tokens each per step, every width.
fn verify_batch_rows(
    base: &Baseline,
    serve: &ServeShape,
    backend: &mut dyn GpuBackend,
    (routes, finite): &mut RowLog,
) -> R<Vec<ModeRow>> {
    let (reference, fused, prompts) = (base.reference, base.fused, base.prompts);
    let mut rows = Vec::new();
    for &width in &serve.verify_batch_widths {
        let m = (width / 2).clamp(1, prompts.len());
        let k = width / m;
        let r = verify_batched(reference, backend, &prompts[..m], k, routes)?;
        let f = verify_batched(fused, backend, &prompts[..m], k, routes)?;
        let fe = eagerly(fused, |r| {
            verify_batched(r, backend, &prompts[..m], k, &mut RouteLog::default())
        })?;
        let label = format!("verify_batch rows {width} ({m} x {k})");
        let mut row = per_sequence_row(
            Mode::VerifyBatch,
            width,
            &label,
            [&r, &f, &fe],
            [base.alone, base.alone_fused],
            finite,
        );
        base.blame
            .judge(&mut row, &routes.take_ran(), backend, &r, &|routing, b| {
                verify_batched(routing, b, &prompts[..m], k, &mut RouteLog::default())
            })?;
        rows.push(row);
    }
    Ok(rows)
}

/// The detection run: prompt 0 with its middle token changed, decoded under all rules, must
/// first differ from `fused_alone` at that token.
pub(super) fn detection_run(
    base: &Baseline,
    fused_alone: &[f32],
    backend: &mut dyn GpuBackend,
    (routes, finite): &mut RowLog,
) -> R<Detection> {
    let vocab = base.vocab;
    let changed_at = base.prompts[0].len() / 2;
    let mut changed = base.prompts[0].clone();
    changed[changed_at] = (changed[changed_at] + 1) % vocab as u32;
    let changed_logits = decode_logged(base.fused, backend, &changed, routes)?;
    finite.check("all-rules decode rows 1 (detection run)", &changed_logits);
    Ok(Detection {
        changed_at,
        first_difference: Diff::of(&changed_logits, fused_alone, vocab).first_position,
    })
}

/// The prompt the verify rows feed, and it decoded alone under both routings: the case's
/// prompt, or, where it is shorter than the widest verify width, that prompt extended to the
/// widest width (when the model's positions allow), so that every width runs its own program.
pub(super) struct VerifyPrompt {
    prompt: Vec<u32>,
    /// Decoded alone, reference routing.
    alone: Vec<f32>,
    /// Decoded alone, all-rules routing.
    alone_fused: Vec<f32>,
}

impl VerifyPrompt {
    pub(super) fn new(
        case: &Case,
        serve: &ServeShape,
        [reference, fused]: [Routing; 2],
        backend: &mut dyn GpuBackend,
        prompt: &[u32],
        [alone, alone_fused]: [&[f32]; 2],
        differs: bool,
    ) -> R<VerifyPrompt> {
        let widest = serve.verify_widths.last().copied().unwrap_or(1);
        let tokens = widest.min(case.config.max_position_embeddings);
        if prompt.len() >= tokens {
            return Ok(VerifyPrompt {
                prompt: prompt.to_vec(),
                alone: alone.to_vec(),
                alone_fused: alone_fused.to_vec(),
            });
        }
        let vocab = case.config.vocab_size;
        let mut extended = prompt.to_vec();
        extended.extend(random_prompt(VERIFY_SEED, vocab, tokens - prompt.len()));
        let mut routes = RouteLog::default();
        let alone = decode_logged(reference, backend, &extended, &mut routes)?;
        // As for every row: with a `differs` rule the all-rules routing is its own reference.
        let alone_fused = match differs {
            true => decode_logged(fused, backend, &extended, &mut routes)?,
            false => alone.clone(),
        };
        Ok(VerifyPrompt {
            prompt: extended,
            alone,
            alone_fused,
        })
    }
}

/// The seed of the tokens that extend a prompt shorter than the widest verify width.
const VERIFY_SEED: u64 = 0x7e41f;

/// The row of a mode whose runs give one logits vector per sequence: `[reference, all rules,
/// all rules eagerly]`, each sequence compared across them and with it decoded alone (`[under
/// the reference routing, under all rules]`), every vector checked finite (named by `label`
/// and sequence).
fn per_sequence_row(
    mode: Mode,
    rows: usize,
    label: &str,
    [r, f, fe]: [&[Vec<f32>]; 3],
    [alone, alone_fused]: [&[Vec<f32>]; 2],
    finite: &mut FiniteCheck<'_>,
) -> ModeRow {
    let vocab = finite.vocab;
    let mut row = ModeRow {
        mode,
        rows,
        live: r.len(),
        tokens: r.first().map_or(0, |logits| logits.len() / vocab),
        programs: Vec::new(),
        ref_vs_fused: Diff::NONE,
        vs_decode: Diff::NONE,
        graph_vs_eager: Diff::NONE,
        differs: None,
        broken_claim: None,
    };
    for s in 0..r.len() {
        for (routing, logits) in [("reference", &r[s]), ("all-rules", &f[s])] {
            finite.check(&format!("{routing} {label}, sequence {s}"), logits);
        }
        row.ref_vs_fused = row.ref_vs_fused.merge(Diff::of(&r[s], &f[s], vocab));
        row.graph_vs_eager = row.graph_vs_eager.merge(Diff::of(&f[s], &fe[s], vocab));
        row.vs_decode = row
            .vs_decode
            .merge(Diff::of(&f[s], &alone_fused[s], vocab))
            .merge(Diff::of(&r[s], &alone[s], vocab));
    }
    row
}

/// `run` with the routing's exec running its steps eagerly, then back to replaying graphs.
pub(super) fn eagerly<T>(routing: Routing, run: impl FnOnce(Routing) -> R<T>) -> R<T> {
    routing.exec.set_graph_policy(GraphPolicy::Never);
    let out = run(routing);
    routing.exec.set_graph_policy(GraphPolicy::Always);
    out
}
