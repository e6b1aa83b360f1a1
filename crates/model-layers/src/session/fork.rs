//! Forks and parking. `Session::fork` starts a sequence from another's state: the child shares
//! the parent's full KV pages (the pool counts their holders; a page returns with its last),
//! gets a copy of the partial last page (copied at the fork, so no later write ever lands in
//! a shared page while both histories only grow), a copy of the token history, of the
//! recurrent-state slot (a fresh slot, its regions copied) and of the sampler.
//! `Session::park` / `ParkedSession::resume` let go of the exec's borrow while keeping every
//! sequence, so the exec can `grow_kv` while sequences live.

use std::collections::BTreeMap;

use solder_circuit::ir::StateKind;
use solder_gpu_runtime::GpuBackend;

use super::{SeqId, Sequence, Session};
use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::exec::Fill;

/// A session's sequences without the exec's borrow: what `Session::park` leaves, for
/// `resume` on the same exec (grown or not).
pub struct ParkedSession {
    exec_id: u64,
    id: u64,
    seqs: BTreeMap<SeqId, Sequence>,
    next_id: SeqId,
    routes: bool,
}

impl ParkedSession {
    /// The session again on `exec`, every sequence where it was; refused on another exec.
    pub fn resume(self, exec: &CircuitExec) -> Result<Session<'_>, SessionError> {
        if exec.id() != self.exec_id {
            return Err(SessionError::Argument {
                field: "ParkedSession::resume",
                message: "the session was parked on another exec".into(),
            });
        }
        let mut session = Session::new(exec);
        session.id = self.id;
        session.seqs = self.seqs;
        session.next_id = self.next_id;
        session.routes = self.routes;
        Ok(session)
    }
}

/// Forks and parking.
impl<'e> Session<'e> {
    /// Keeps every sequence (pages and slots stay lent) and lets go of the exec, so it can
    /// grow (`CircuitExec::grow_kv`) before `ParkedSession::resume`. An open pipeline is
    /// closed as `stop_pipeline` closes it, but its stream and events stay with the backend
    /// (stop it first to free them).
    pub fn park(mut self) -> ParkedSession {
        super::pipeline::abandon(&mut self);
        let seqs = std::mem::take(&mut self.seqs);
        ParkedSession {
            exec_id: self.exec.id(),
            id: self.id,
            seqs,
            next_id: self.next_id,
            routes: self.routes,
        }
    }

    /// A new sequence with `id`'s state: its full pages shared, its partial last page, token
    /// history, recurrent slot and sampler copied. All or nothing: refused, with nothing lent,
    /// when too few pages or slots are free.
    pub fn fork(&mut self, backend: &mut dyn GpuBackend, id: SeqId) -> Result<SeqId, SessionError> {
        self.exec.check_usable(backend)?;
        self.refuse_piped("fork")?;
        let parent = self
            .seqs
            .get(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        let block_size = self.exec.layout.kv_block_size;
        let full = parent.len / block_size;
        let partial = parent.pages.len() > full;
        let mut child = Sequence {
            len: parent.len,
            tokens: parent.tokens.clone(),
            sampler: parent.sampler.clone(),
            ..Sequence::default()
        };
        let mut pools = self.exec.pools();
        pools.pages.check(usize::from(partial))?;
        if parent.slot.is_some() {
            pools.slots.check(1)?;
        }
        let slot = match parent.slot {
            Some(from) => {
                let stream = self.exec.default_stream();
                Some(pools.slots.take(backend, stream, Fill::CopyOf(from))?)
            }
            None => None,
        };
        child.slot = slot;
        child.pages = pools.pages.share(&parent.pages, full);
        if partial {
            let from = parent.pages[full];
            let fresh = pools.pages.grow(&mut child.pages, (full + 1) * block_size);
            let copied = fresh.and_then(|_| copy_page(self.exec, backend, from, child.pages[full]));
            if let Err(e) = copied {
                pools.pages.shrink(&mut child.pages, 0);
                if let Some(slot) = child.slot {
                    pools.slots.give_back(slot);
                }
                return Err(e);
            }
        }
        drop(pools);
        let child_id = self.next_id;
        self.next_id += 1;
        self.seqs.insert(child_id, child);
        Ok(child_id)
    }
}

/// Copies KV page `from` to page `to` in every attention layer's region (a region is
/// page-major: page p at p times one page's bytes), by copies queued on the exec's default
/// stream, before the next step (the host does not wait).
fn copy_page(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    from: u32,
    to: u32,
) -> Result<(), SessionError> {
    let kv = exec.kv_cache();
    let decls = &exec.instance.storage().states;
    for (decl, region) in decls.iter().zip(&exec.layout.states) {
        if let StateKind::KvPages {
            block_size,
            num_kv_heads,
            head_dim,
            dtype,
            ..
        } = decl.kind
        {
            let page_bytes = 2 * block_size * num_kv_heads * head_dim * dtype.size_bytes();
            backend.copy_d2d_async(
                exec.default_stream(),
                kv.offset(region.offset + to as usize * page_bytes),
                kv.offset(region.offset + from as usize * page_bytes),
                page_bytes,
            )?;
        }
    }
    Ok(())
}
