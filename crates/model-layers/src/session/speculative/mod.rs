//! Speculative decoding: a drafter proposes k tokens, one verify program of k + 1 rows checks
//! them, the longest accepted prefix plus the target's own next token is kept, and the rest
//! is rolled back.
//!
//! Words: a **draft** is the k tokens a drafter proposes to follow a sequence's pending token
//! in one speculative step (`Draft`: the tokens and, when drafted by sampling, the
//! distributions they were drawn from); k is the **draft length**. A **drafter** is whatever
//! proposes drafts (`Drafter`); the built-in ones are a **draft model** (`ModelDrafter`: a
//! second, smaller model with its own exec) and the **MTP head** (`MtpDrafter`: Qwen3-Next's
//! multi-token-prediction head on the target's own exec; its program is the one circuit calls
//! `Mode::Draft`, run by `Session::mtp_step`). "Draft" names nothing else here.
//!
//! Entry points: `Session::speculative_step` (one sequence, a verify program) and
//! `Session::speculative_step_many` (several sequences, each with its own k, one
//! batched-verify program); `Session::next_k` gives the k a `SpecPolicy` chooses from the
//! sequence's acceptance history. Acceptance is greedy by default (keep while a draft equals
//! the target's arg-max), or the sequence's sampler (`Session::set_sampling`): speculative
//! sampling's accept/resample rule (`sampling::accept`), so sampled output has exactly the
//! target's distribution.
//!
//! Rollback, one story told at two levels:
//! - the **target** sequence rolls back inside the step: the rejected rows' KV cells lie past
//!   its new length (never read again) and its recurrent state becomes the snapshot the
//!   chained kernels wrote after the last kept row (`state::rewind`, private); the verify
//!   writes each sequence's new state into a spare slot it takes only once every acceptance
//!   succeeded (`state::spares`, private), so a step refused or failed leaves the slot it
//!   holds, and the sequence, as they were;
//! - the **drafter** is told the `Verdict` (tokens kept, where their rows lay) in `settle`
//!   and takes back what it fed past them with the public rollback every engine has:
//!   `Session::rewind` to a `RewindPoint` taken before the draft, or `Session::truncate_to`
//!   for a sequence without recurrent state.
//!
//! Parts: `drafter` (`Draft`, `Verdict`, the `Drafter` trait and its protocol), `policy`
//! (`SpecPolicy`, `Acceptances`, `SpeculativeStep`), `step` (the step), `model_drafter`,
//! `mtp` (the built-in drafters, on public API only).

mod drafter;
mod model_drafter;
mod mtp;
mod policy;
mod step;

pub use drafter::{Draft, Drafter, Verdict};
pub use model_drafter::ModelDrafter;
pub use mtp::MtpDrafter;
pub use policy::{Acceptances, SpecPolicy, SpeculativeStep};
pub(crate) use step::step;
