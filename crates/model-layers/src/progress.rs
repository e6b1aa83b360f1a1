//! `Progress`: how far one long job has got (a checkpoint streamed to the device, the step
//! graphs captured), told on stderr as one line rewritten in place (`\r`: what, done of total,
//! percent, rate) when stderr is a terminal, else as `tracing` events at every tenth of the
//! total, so a log gets a few lines, not one per step.
//!
//! Invariants: the terminal line is redrawn at most every `REDRAW` (and once more, with a
//! newline, by `finish`); nothing is written to stderr when it is not a terminal; `done`
//! never passes `total` in what is shown.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// The shortest time between two redraws of the terminal line.
const REDRAW: Duration = Duration::from_millis(100);

/// What a job counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Bytes, shown in MiB or GiB.
    Bytes,
    /// Whole things, named (e.g. "graphs").
    Items(&'static str),
}

/// One job's progress, shown as it advances.
#[derive(Debug)]
pub(crate) struct Progress {
    what: &'static str,
    unit: Unit,
    total: usize,
    done: usize,
    started: Instant,
    /// The terminal line's last redraw; None when stderr is no terminal.
    drawn: Option<Option<Instant>>,
    /// Tenths of the total already told by a tracing event.
    told_tenths: usize,
}

impl Progress {
    /// A job `what` of `total` units, starting now.
    pub(crate) fn new(what: &'static str, unit: Unit, total: usize) -> Progress {
        Progress::with_terminal(what, unit, total, std::io::stderr().is_terminal())
    }

    fn with_terminal(what: &'static str, unit: Unit, total: usize, terminal: bool) -> Progress {
        Progress {
            what,
            unit,
            total,
            done: 0,
            started: Instant::now(),
            drawn: terminal.then_some(None),
            told_tenths: 0,
        }
    }

    /// `by` more units are done.
    pub(crate) fn advance(&mut self, by: usize) {
        self.done = self.done.saturating_add(by).min(self.total);
        match &mut self.drawn {
            Some(last) => {
                if last.is_none_or(|at| at.elapsed() >= REDRAW) {
                    *last = Some(Instant::now());
                    eprint!("\r{}", self.line());
                }
            }
            None => {
                let tenths = (self.done * 10).checked_div(self.total).unwrap_or(10);
                if tenths > self.told_tenths && tenths < 10 {
                    self.told_tenths = tenths;
                    self.tell();
                }
            }
        }
    }

    /// The job is over: the line drawn a last time and ended, or the last event.
    pub(crate) fn finish(self) {
        match self.drawn {
            Some(_) => eprintln!("\r{}", self.line()),
            None => self.tell(),
        }
    }

    fn tell(&self) {
        tracing::info!(
            job = self.what,
            done = self.done,
            total = self.total,
            unit = self.unit_name(),
            per_second = self.rate(),
            "progress"
        );
    }

    fn unit_name(&self) -> &'static str {
        match self.unit {
            Unit::Bytes => "bytes",
            Unit::Items(name) => name,
        }
    }

    /// Units per second so far.
    fn rate(&self) -> f64 {
        let seconds = self.started.elapsed().as_secs_f64();
        if seconds > 0.0 {
            self.done as f64 / seconds
        } else {
            0.0
        }
    }

    /// The terminal line: `what: done / total unit (pct%), rate/s`.
    fn line(&self) -> String {
        let percent = if self.total == 0 {
            100.0
        } else {
            self.done as f64 * 100.0 / self.total as f64
        };
        let (done, total, rate) = match self.unit {
            Unit::Bytes => (
                bytes(self.done as f64),
                bytes(self.total as f64),
                format!("{}/s", bytes(self.rate())),
            ),
            Unit::Items(name) => (
                self.done.to_string(),
                format!("{} {name}", self.total),
                format!("{:.1}/s", self.rate()),
            ),
        };
        format!("{}: {done} / {total} ({percent:.0}%), {rate}   ", self.what)
    }
}

/// A byte count in MiB, or GiB from 1 GiB on.
fn bytes(n: f64) -> String {
    const MIB: f64 = (1 << 20) as f64;
    const GIB: f64 = (1 << 30) as f64;
    if n >= GIB {
        format!("{:.2} GiB", n / GIB)
    } else {
        format!("{:.1} MiB", n / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_job_its_counts_and_share() {
        let mut p = Progress::with_terminal("loading weights", Unit::Bytes, 4 << 30, false);
        p.advance(1 << 30);
        let line = p.line();
        assert!(
            line.starts_with("loading weights: 1.00 GiB / 4.00 GiB (25%), "),
            "{line}"
        );
        assert!(line.contains("/s"), "{line}");
        let mut g = Progress::with_terminal("capturing graphs", Unit::Items("graphs"), 3, false);
        g.advance(5);
        assert!(
            g.line()
                .starts_with("capturing graphs: 3 / 3 graphs (100%)"),
            "{}",
            g.line()
        );
    }

    #[test]
    fn events_are_told_at_each_tenth_not_each_step() {
        let mut p = Progress::with_terminal("x", Unit::Items("things"), 1000, false);
        for _ in 0..1000 {
            p.advance(1);
        }
        // Tenths 1..=9 told while advancing; the tenth by `finish`.
        assert_eq!(p.told_tenths, 9);
        let empty = Progress::with_terminal("x", Unit::Bytes, 0, false);
        assert!(empty.line().contains("(100%)"), "{}", empty.line());
    }
}
