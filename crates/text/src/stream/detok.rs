//! Incremental detokenisation by TGI's and vLLM's prefix-offset / read-offset method: the
//! text of `ids[prefix..]` minus the text of `ids[prefix..read]` is what the newest tokens
//! add, emitted only when it does not end in U+FFFD (a character whose bytes have not all
//! arrived); then `prefix` moves to `read` and `read` to the end. Decoding a window rather
//! than one token at a time keeps what decoders do at word starts (SentencePiece's leading
//! space, byte-level merges across tokens) right.

use crate::error::TextError;
use crate::tokenizer::Tokenizer;

/// Prompt tokens a stream starts with as context (vLLM's `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`).
pub const CONTEXT_TOKENS: usize = 5;

/// One sequence's detokenisation state.
pub struct Detokenizer<'t> {
    tokenizer: &'t Tokenizer,
    ids: Vec<u32>,
    /// Where the window whose text was already emitted starts, and where it ends.
    prefix: usize,
    read: usize,
}

impl<'t> Detokenizer<'t> {
    /// A detokenizer whose first window holds the last `CONTEXT_TOKENS` of `prompt` (their
    /// text is never emitted).
    pub fn new(tokenizer: &'t Tokenizer, prompt: &[u32]) -> Detokenizer<'t> {
        let context = &prompt[prompt.len().saturating_sub(CONTEXT_TOKENS)..];
        Detokenizer {
            tokenizer,
            ids: context.to_vec(),
            prefix: 0,
            read: context.len(),
        }
    }

    /// The text `id` completes: empty while a character is still partial.
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        self.ids.push(id);
        let before = self
            .tokenizer
            .decode(&self.ids[self.prefix..self.read], true)?;
        let after = self.tokenizer.decode(&self.ids[self.prefix..], true)?;
        if after.len() <= before.len() || after.ends_with('\u{fffd}') {
            return Ok(String::new());
        }
        let new = suffix_after(&after, &before).to_string();
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(new)
    }

    /// What is left undecided at the end: the text of the tokens not yet emitted, partial
    /// characters shown as U+FFFD (as decoding the whole sequence would show them).
    pub fn flush(&mut self) -> Result<String, TextError> {
        let before = self
            .tokenizer
            .decode(&self.ids[self.prefix..self.read], true)?;
        let after = self.tokenizer.decode(&self.ids[self.prefix..], true)?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(suffix_after(&after, &before).to_string())
    }
}

/// `after` past `before`: after its prefix `before`, or (a decoder that rewrote the earlier
/// text) past `before`'s length rounded down to a character boundary.
fn suffix_after<'a>(after: &'a str, before: &str) -> &'a str {
    if let Some(rest) = after.strip_prefix(before) {
        return rest;
    }
    let mut at = before.len().min(after.len());
    while !after.is_char_boundary(at) {
        at -= 1;
    }
    &after[at..]
}
