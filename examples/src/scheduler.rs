//! A continuous-batching scheduler over a paged KV pool, the policy the `serve` example
//! drives a `Session` with. It follows vLLM's scheduler: first come, first served; running
//! requests before waiting ones; a request is admitted when the pool has the pages its first
//! chunk needs; prompts are fed in chunks, at most `chunk` tokens per step in all (vLLM's
//! token budget), between multi-sequence decode steps; when a decode step would need more pages than are
//! free, the most recently admitted request is preempted (its pages freed, its sequence
//! ended) and later recomputed from its prompt and the tokens it had produced, which gives
//! back the same state — the next token of a sequence depends only on its tokens.
//!
//! The scheduler holds no session: it plans a step from the free page count, the driver
//! runs the plan and reports what each request now holds (`prefilled`, `decoded`), so the
//! policy is tested here without a model.

use std::collections::VecDeque;

/// A request: its prompt's token ids and how many tokens it wants.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
}

/// A request's progress.
#[derive(Debug, Clone)]
struct Entry {
    /// The prompt, then every token produced so far.
    tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    /// Tokens in its sequence's cache (0 while waiting).
    cached: usize,
    /// Pages its sequence holds (as the session reports them).
    held: usize,
    preemptions: usize,
}

impl Entry {
    fn produced(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Decoding: everything but the last produced token is cached (that one is fed next).
    fn decoding(&self) -> bool {
        self.produced() > 0 && self.cached + 1 == self.tokens.len()
    }
}

/// A chunk of a request's tokens to prefill: `tokens[from..to]`; the last chunk (`to` = the
/// request's length) gives its next token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub req: usize,
    pub from: usize,
    pub to: usize,
    pub last: bool,
}

/// One step: requests to preempt (end their sequences first), requests admitted (each
/// needs a new sequence), prefill chunks (at most `chunk` tokens in all), then one decode
/// step feeding each decoding request its last token.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    pub preempted: Vec<usize>,
    pub admitted: Vec<usize>,
    pub prefill: Vec<Chunk>,
    pub decode: Vec<(usize, u32)>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.prefill.is_empty() && self.decode.is_empty()
    }
}

/// The waiting queue, the running set (in admission order) and every request's progress.
#[derive(Debug)]
pub struct Scheduler {
    block: usize,
    chunk: usize,
    max_running: usize,
    pool_pages: usize,
    entries: Vec<Entry>,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
}

impl Scheduler {
    /// A scheduler for a pool of `pool_pages` pages of `block` tokens, feeding at most
    /// `chunk` prompt tokens per step and running at most `max_running` requests.
    pub fn new(block: usize, chunk: usize, max_running: usize, pool_pages: usize) -> Scheduler {
        Scheduler {
            block: block.max(1),
            chunk: chunk.max(1),
            max_running: max_running.max(1),
            pool_pages,
            entries: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// Queues a request; returns its index. Refused if it could never run: an empty prompt,
    /// no tokens wanted, or more pages than the whole pool to finish.
    pub fn submit(&mut self, request: Request) -> Result<usize, String> {
        let index = self.entries.len();
        let (len, wants) = (request.prompt.len(), request.max_tokens);
        if len == 0 || wants == 0 {
            return Err(format!("request {index}: empty prompt or no tokens wanted"));
        }
        let pages = self.pages_for(len + wants);
        if pages > self.pool_pages {
            return Err(format!(
                "request {index} needs {pages} pages of {} tokens (prompt {len} + {wants} \
                 tokens); the pool has {}",
                self.block, self.pool_pages
            ));
        }
        self.entries.push(Entry {
            tokens: request.prompt,
            prompt_len: len,
            max_tokens: wants,
            cached: 0,
            held: 0,
            preemptions: 0,
        });
        self.waiting.push_back(index);
        Ok(index)
    }

    /// Whether every request has all its tokens.
    pub fn finished(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Requests running now, in admission order.
    pub fn running(&self) -> &[usize] {
        &self.running
    }

    /// The tokens request `req` has produced.
    pub fn output(&self, req: usize) -> &[u32] {
        let entry = &self.entries[req];
        &entry.tokens[entry.prompt_len..]
    }

    /// Its prompt then its output: what its sequence's cache is fed, in order.
    pub fn tokens(&self, req: usize) -> &[u32] {
        &self.entries[req].tokens
    }

    /// How many times request `req` was preempted.
    pub fn preemptions(&self, req: usize) -> usize {
        self.entries[req].preemptions
    }

    /// The next step, given the pages free in the pool now.
    pub fn plan(&mut self, free_pages: usize) -> Result<Plan, String> {
        let mut plan = Plan::default();
        let mut free = free_pages;
        // Running requests first: the decode step's new pages, preempting from the back.
        loop {
            let need: usize = self.decoding().map(|r| self.need(r, 1)).sum();
            if need <= free {
                free -= need;
                break;
            }
            // `need` sums over running requests: one is left while it is above `free`.
            let victim = self.running.pop().ok_or("no running request to preempt")?;
            free += self.entries[victim].held;
            let entry = &mut self.entries[victim];
            (entry.cached, entry.held) = (0, 0);
            entry.preemptions += 1;
            self.waiting.push_front(victim);
            plan.preempted.push(victim);
        }
        plan.decode = self
            .decoding()
            .map(|r| (r, *self.entries[r].tokens.last().unwrap()))
            .collect();
        // Then waiting ones, first come first served, while their first chunk's pages fit.
        // Never a request just preempted in this step: it would take back the pages freed.
        while self.running.len() < self.max_running {
            let Some(&next) = self.waiting.front() else {
                break;
            };
            let first = self.chunk.min(self.entries[next].tokens.len());
            if plan.preempted.contains(&next) || self.pages_for(first) > free {
                break;
            }
            free -= self.pages_for(first);
            self.waiting.pop_front();
            self.running.push(next);
            plan.admitted.push(next);
        }
        // Prefill chunks within the step's token budget, oldest request first, each as much
        // of its prompt as the free pages hold (first chunks' pages were kept for them above).
        let mut budget = self.chunk;
        for &req in &self.running {
            let entry = &self.entries[req];
            if entry.decoding() || budget == 0 {
                continue;
            }
            if plan.admitted.contains(&req) {
                free += self.pages_for(self.chunk.min(entry.tokens.len()));
            }
            let room = ((entry.held + free) * self.block).saturating_sub(entry.cached);
            let n = budget.min(entry.tokens.len() - entry.cached).min(room);
            if n == 0 {
                continue;
            }
            let to = entry.cached + n;
            free -= self.pages_for(to).saturating_sub(entry.held);
            budget -= n;
            plan.prefill.push(Chunk {
                req,
                from: entry.cached,
                to,
                last: to == entry.tokens.len(),
            });
        }
        Ok(plan)
    }

    /// A prefill chunk ran: request `req` caches `to` tokens in `held` pages and, after its
    /// last chunk, produced `next`.
    pub fn prefilled(&mut self, chunk: &Chunk, held: usize, next: Option<u32>) {
        let entry = &mut self.entries[chunk.req];
        (entry.cached, entry.held) = (chunk.to, held);
        if let Some(token) = next {
            entry.tokens.push(token);
        }
        self.retire(chunk.req);
    }

    /// A decode step ran: request `req` fed its last token, holds `held` pages and produced
    /// `next`.
    pub fn decoded(&mut self, req: usize, held: usize, next: u32) {
        let entry = &mut self.entries[req];
        (entry.cached, entry.held) = (entry.tokens.len(), held);
        entry.tokens.push(next);
        self.retire(req);
    }

    /// Requests that have all their tokens leave the running set; the driver ends their
    /// sequences (`done`).
    pub fn done(&self, req: usize) -> bool {
        let entry = &self.entries[req];
        entry.produced() >= entry.max_tokens
    }

    fn retire(&mut self, req: usize) {
        if self.done(req) {
            self.running.retain(|&r| r != req);
        }
    }

    fn decoding(&self) -> impl Iterator<Item = usize> + '_ {
        self.running
            .iter()
            .copied()
            .filter(|&r| self.entries[r].decoding())
    }

    /// New pages request `req` needs to cache `more` tokens more.
    fn need(&self, req: usize, more: usize) -> usize {
        let entry = &self.entries[req];
        self.pages_for(entry.cached + more)
            .saturating_sub(entry.held)
    }

    fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `scheduler` to the end against a simulated pool of `pool` pages (a request's
    /// pages are those its cached tokens fill), producing token `req * 1000 + i`; returns
    /// the steps taken and the widest decode step.
    fn simulate(scheduler: &mut Scheduler, pool: usize) -> (usize, usize) {
        let block = scheduler.block;
        let mut held = vec![0usize; scheduler.entries.len()];
        let (mut steps, mut widest) = (0, 0);
        while !scheduler.finished() {
            let free = pool - held.iter().sum::<usize>();
            let plan = scheduler.plan(free).expect("plan");
            for &r in &plan.preempted {
                held[r] = 0;
            }
            assert!(!plan.is_empty(), "step {steps} does nothing: {plan:?}");
            for chunk in &plan.prefill {
                held[chunk.req] = chunk.to.div_ceil(block);
                let next = chunk.last.then(|| (chunk.req * 1000 + chunk.to) as u32);
                scheduler.prefilled(chunk, held[chunk.req], next);
            }
            for &(r, fed) in &plan.decode {
                assert_eq!(Some(&fed), scheduler.tokens(r).last());
                held[r] = scheduler.tokens(r).len().div_ceil(block);
                let next = (r * 1000 + scheduler.tokens(r).len()) as u32;
                scheduler.decoded(r, held[r], next);
            }
            for (r, pages) in held.iter_mut().enumerate() {
                if scheduler.done(r) {
                    *pages = 0;
                }
            }
            assert!(held.iter().sum::<usize>() <= pool, "step {steps} overdraws");
            widest = widest.max(plan.decode.len());
            steps += 1;
        }
        (steps, widest)
    }

    fn requests(n: usize, prompt: usize, wants: usize) -> Vec<Request> {
        (0..n)
            .map(|i| Request {
                prompt: vec![i as u32; prompt + i % 5],
                max_tokens: wants,
            })
            .collect()
    }

    #[test]
    fn every_request_finishes_with_its_tokens_and_the_batch_fills() {
        let mut scheduler = Scheduler::new(4, 64, 8, 1000);
        for r in requests(20, 10, 6) {
            scheduler.submit(r).unwrap();
        }
        let (_, widest) = simulate(&mut scheduler, 1000);
        assert_eq!(widest, 8);
        for r in 0..20 {
            let len = scheduler.tokens(r).len();
            assert_eq!(scheduler.output(r).len(), 6);
            assert_eq!(
                *scheduler.output(r).last().unwrap() as usize,
                r * 1000 + len - 1
            );
            assert_eq!(scheduler.preemptions(r), 0);
        }
    }

    #[test]
    fn a_small_pool_preempts_the_newest_and_recomputes_it() {
        // Pages for about three requests at their full length, eight wanting to run.
        let mut scheduler = Scheduler::new(4, 8, 8, 12);
        for r in requests(8, 6, 8) {
            scheduler.submit(r).unwrap();
        }
        simulate(&mut scheduler, 12);
        let preempted: usize = (0..8).map(|r| scheduler.preemptions(r)).sum();
        assert!(preempted > 0);
        assert_eq!(
            scheduler.preemptions(0),
            0,
            "the oldest is never the victim"
        );
        for r in 0..8 {
            assert_eq!(scheduler.output(r).len(), 8);
        }
    }

    #[test]
    fn prompts_go_in_chunks_between_decode_steps() {
        let mut scheduler = Scheduler::new(16, 4, 4, 100);
        scheduler.submit(requests(1, 3, 10).remove(0)).unwrap();
        scheduler.submit(requests(1, 13, 2).remove(0)).unwrap();
        let first = scheduler.plan(100).unwrap();
        assert_eq!(first.admitted, [0, 1]);
        // The budget of 4: request 0's whole prompt and the first token of request 1's.
        let spans: Vec<_> = first
            .prefill
            .iter()
            .map(|c| (c.req, c.from, c.to, c.last))
            .collect();
        assert_eq!(spans, [(0, 0, 3, true), (1, 0, 1, false)]);
        scheduler.prefilled(&first.prefill[0], 1, Some(7));
        scheduler.prefilled(&first.prefill[1], 1, None);
        // Request 0 decodes while request 1's prompt goes in 4, 4, 4.
        let mut chunks = Vec::new();
        for _ in 0..3 {
            let plan = scheduler.plan(100).unwrap();
            assert_eq!(plan.decode.len(), 1);
            let [chunk] = &plan.prefill[..] else {
                panic!("one chunk: {plan:?}")
            };
            chunks.push(chunk.to - chunk.from);
            scheduler.prefilled(chunk, 1, chunk.last.then_some(9));
            scheduler.decoded(0, 1, 8);
        }
        assert_eq!(chunks, [4, 4, 4]);
    }

    #[test]
    fn a_request_larger_than_the_pool_is_refused_by_index() {
        let mut scheduler = Scheduler::new(4, 8, 8, 3);
        let error = scheduler
            .submit(Request {
                prompt: vec![1; 10],
                max_tokens: 4,
            })
            .unwrap_err();
        assert!(error.contains("request 0 needs 4 pages"), "{error}");
    }
}
