//! Where decided tokens go: the generated ids, the text stream (EOS, stop strings), stdout
//! as the text is decided, and the token limit.

use std::io::Write as _;
use std::time::Duration;

use solder_text::{StopReason, TextStream};

/// The tokens of one run and the text they made.
pub struct Output<'t> {
    stream: TextStream<'t>,
    pub ids: Vec<u32>,
    max_tokens: usize,
}

/// Time spent choosing tokens: the prefill (to the first token) and the decode steps after.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    pub prefill: Duration,
    pub decode: Duration,
    /// Tokens the decode steps (or speculative steps) decided.
    pub decode_tokens: usize,
}

impl<'t> Output<'t> {
    pub fn new(stream: TextStream<'t>, max_tokens: usize) -> Output<'t> {
        Output {
            stream,
            ids: Vec::new(),
            max_tokens,
        }
    }

    /// Takes the next decided token, prints the text it completes; why generation is over
    /// once it is (EOS, a stop string, or the limit).
    pub fn take(&mut self, id: u32) -> Result<Option<StopReason>, String> {
        self.ids.push(id);
        let step = self.stream.push(id).map_err(|e| e.to_string())?;
        print_now(&step.text)?;
        if step.stop.is_some() {
            return Ok(step.stop);
        }
        if self.ids.len() >= self.max_tokens {
            let end = self
                .stream
                .finish(StopReason::Length)
                .map_err(|e| e.to_string())?;
            print_now(&end.text)?;
            return Ok(end.stop);
        }
        Ok(None)
    }

    /// Everything printed.
    pub fn text(&self) -> &str {
        self.stream.text()
    }
}

/// `text` on stdout now (a stream is read as it comes).
fn print_now(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))
}
