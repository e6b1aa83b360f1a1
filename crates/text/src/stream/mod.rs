//! `TextStream`: a generated sequence's text as its tokens are decided — `detok` turns
//! tokens into text without ever emitting half a UTF-8 character, `stops` holds text back
//! while it may still become a stop string — and why generation stopped (`StopReason`).
//!
//! An EOS id ends the stream with `eos` (its text is not emitted, nor held text lost: it is
//! released); a stop string ends it with `stop` (the text before it emitted); the caller's
//! limit ends it with `length` through `finish`. After a stop, no token may be pushed.

mod detok;
mod stops;

use crate::error::TextError;
use crate::tokenizer::Tokenizer;
use detok::Detokenizer;
use stops::StopMatcher;

/// Why generation stopped (vLLM's and the OpenAI API's finish reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-sequence id was generated.
    Eos,
    /// A stop string appeared in the text.
    Stop,
    /// The token limit was reached.
    Length,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::Stop => "stop",
            StopReason::Length => "length",
        }
    }
}

/// What ends a stream besides its length: EOS ids and stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopConditions {
    pub eos_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
}

/// What one pushed token gave: text to show now, and whether the stream stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStep {
    pub text: String,
    pub stop: Option<StopReason>,
}

/// One sequence's text stream.
pub struct TextStream<'t> {
    detok: Detokenizer<'t>,
    stops: StopMatcher,
    eos_ids: Vec<u32>,
    /// Everything emitted so far.
    text: String,
    stopped: Option<StopReason>,
}

impl<'t> TextStream<'t> {
    /// A stream of the tokens that follow `prompt` (its last few tokens are context for the
    /// first window, never emitted). An empty stop string is refused by index.
    pub fn new(
        tokenizer: &'t Tokenizer,
        prompt: &[u32],
        conditions: StopConditions,
    ) -> Result<TextStream<'t>, TextError> {
        if let Some(index) = conditions.stop_strings.iter().position(String::is_empty) {
            return Err(TextError::EmptyStop { index });
        }
        Ok(TextStream {
            detok: Detokenizer::new(tokenizer, prompt),
            stops: StopMatcher::new(conditions.stop_strings),
            eos_ids: conditions.eos_ids,
            text: String::new(),
            stopped: None,
        })
    }

    /// The next generated token.
    pub fn push(&mut self, id: u32) -> Result<StreamStep, TextError> {
        if let Some(reason) = self.stopped {
            return Err(TextError::Ended {
                reason: reason.as_str(),
            });
        }
        if self.eos_ids.contains(&id) {
            return self.finish(StopReason::Eos);
        }
        let new = self.detok.push(id)?;
        let released = self.stops.feed(&new);
        let stop = released.stopped.then_some(StopReason::Stop);
        self.stopped = stop;
        Ok(self.emit(released.text, stop))
    }

    /// Ends the stream for `reason` (the caller's `length`, or `eos`): releases the text
    /// held for stop strings and any partial character's bytes (as U+FFFD). Once stopped,
    /// it releases nothing more.
    pub fn finish(&mut self, reason: StopReason) -> Result<StreamStep, TextError> {
        if let Some(reason) = self.stopped {
            return Ok(StreamStep {
                text: String::new(),
                stop: Some(reason),
            });
        }
        self.stopped = Some(reason);
        let tail = self.detok.flush()?;
        let mut text = self.stops.feed(&tail);
        if text.stopped {
            // A stop string completed by the last partial bytes: still a stop.
            self.stopped = Some(StopReason::Stop);
            return Ok(self.emit(text.text, Some(StopReason::Stop)));
        }
        text.text.push_str(&self.stops.flush());
        Ok(self.emit(text.text, Some(reason)))
    }

    /// Everything the stream has emitted.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Why it stopped, once it has.
    pub fn stopped(&self) -> Option<StopReason> {
        self.stopped
    }

    fn emit(&mut self, text: String, stop: Option<StopReason>) -> StreamStep {
        self.text.push_str(&text);
        StreamStep { text, stop }
    }
}
