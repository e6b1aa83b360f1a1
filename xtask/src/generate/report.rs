//! What a run reports: tokens per second on stderr (prefill and decode apart) and, with
//! `--json FILE`, `{prompt_ids, ids, text, stop_reason, prompt_tokens_per_s,
//! decode_tokens_per_s}` written whole (a temporary beside FILE renamed over it, never over
//! one of the run's inputs: `files::write_output`).

use std::path::Path;

use solder_text::StopReason;

use super::output::Timings;
use super::speculative::SpecCounts;

/// One run's results.
pub struct Report<'a> {
    pub prompt_ids: &'a [u32],
    pub ids: &'a [u32],
    pub text: &'a str,
    pub stop: StopReason,
    pub timings: Timings,
    pub speculative: Option<SpecCounts>,
}

impl Report<'_> {
    /// Prompt tokens per second of the prefill (to the first token).
    fn prompt_rate(&self) -> f64 {
        self.prompt_ids.len() as f64 / self.timings.prefill.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Tokens per second of the steps after the prefill; none when no step ran.
    fn decode_rate(&self) -> Option<f64> {
        (self.timings.decode_tokens > 0).then(|| {
            self.timings.decode_tokens as f64
                / self.timings.decode.as_secs_f64().max(f64::MIN_POSITIVE)
        })
    }

    /// The figures on stderr, after the text.
    pub fn print(&self) {
        eprintln!();
        let decode = match self.decode_rate() {
            Some(rate) => format!(
                "decode {} tokens in {:.1} ms ({rate:.2} tokens/s)",
                self.timings.decode_tokens,
                self.timings.decode.as_secs_f64() * 1e3
            ),
            None => "no decode step".to_string(),
        };
        let speculative = match self.speculative {
            Some(c) if c.steps > 0 => format!(
                "; {} verify steps, {}/{} drafts accepted",
                c.steps, c.accepted, c.proposed
            ),
            _ => String::new(),
        };
        eprintln!(
            "prefill {} tokens in {:.1} ms ({:.2} tokens/s); {decode}; stop: {}{speculative}",
            self.prompt_ids.len(),
            self.timings.prefill.as_secs_f64() * 1e3,
            self.prompt_rate(),
            self.stop.as_str()
        );
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "prompt_ids": self.prompt_ids,
            "ids": self.ids,
            "text": self.text,
            "stop_reason": self.stop.as_str(),
            "prompt_tokens_per_s": self.prompt_rate(),
            "decode_tokens_per_s": self.decode_rate(),
        })
    }

    /// Writes the JSON to `path`, refusing to write over the checkpoint's files.
    pub fn write(&self, path: &Path, model: &Path) -> Result<(), String> {
        let mut inputs = crate::files::Inputs::default();
        inputs.add_checkpoint(model);
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ] {
            inputs.add(&model.join(name));
        }
        let text = serde_json::to_string_pretty(&self.to_json()).map_err(|e| e.to_string())?;
        crate::files::write_output(path, format!("{text}\n").as_bytes(), &inputs)
            .map_err(|e| format!("--json {}: {e}", path.display()))
    }
}
