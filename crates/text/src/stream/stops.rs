//! Stop strings: text is held back while it could still be the start of a stop string; when
//! one appears, the text before its first occurrence is released and the stream stops (the
//! stop string itself is never emitted, as vLLM's `include_stop_str_in_output=False`).
//!
//! Invariant: the held text is the shortest suffix of the unreleased text that may still
//! begin a stop string, so a match always lies inside held text plus new text.

/// Stop strings and the text held back for them.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What feeding text released.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    pub text: String,
    /// A stop string matched: `text` is everything before it and the stream is over.
    pub stopped: bool,
}

impl StopMatcher {
    /// Matches `stops` (none empty: checked by the stream).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops,
            held: String::new(),
        }
    }

    /// Adds `text` after what is held; releases what can no longer be part of a stop.
    pub fn feed(&mut self, text: &str) -> Released {
        let mut pending = std::mem::take(&mut self.held);
        pending.push_str(text);
        // The earliest occurrence of any stop string ends the text.
        let first = self
            .stops
            .iter()
            .filter_map(|stop| pending.find(stop.as_str()))
            .min();
        if let Some(at) = first {
            pending.truncate(at);
            return Released {
                text: pending,
                stopped: true,
            };
        }
        let hold_from = pending
            .char_indices()
            .map(|(at, _)| at)
            .find(|&at| {
                let tail = &pending[at..];
                self.stops.iter().any(|stop| stop.starts_with(tail))
            })
            .unwrap_or(pending.len());
        self.held = pending.split_off(hold_from);
        Released {
            text: pending,
            stopped: false,
        }
    }

    /// Releases everything held (the stream ended for another reason).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(text: &str, stopped: bool) -> Released {
        Released {
            text: text.to_string(),
            stopped,
        }
    }

    #[test]
    fn a_possible_start_is_held_and_a_false_start_released() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.feed("hello ST"), released("hello ", false));
        assert_eq!(m.feed("AR"), released("STAR", false));
        assert_eq!(m.feed("S"), released("", false));
        assert_eq!(m.feed("TO"), released("", false));
        assert_eq!(m.feed("P and more"), released("", true));
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_flush_releases_held_text() {
        let mut m = StopMatcher::new(vec!["world".into(), "lo w".into()]);
        assert_eq!(m.feed("hello world"), released("hel", true));
        let mut m = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(m.feed("café"), released("caf", false));
        assert_eq!(m.flush(), "é");
    }
}
