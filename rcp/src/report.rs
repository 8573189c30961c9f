//! What the user sees: a progress bar on a terminal, a summary at the end
//! (human or `--json`).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Totals of one copy.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub bytes: u64,
    pub files: u64,
    /// Data bytes carried by each stream (link) of the session.
    pub stream_bytes: Vec<u64>,
    /// Some entry failed.
    pub failed: bool,
}

/// A byte counter shown as a bar on stderr when it is a terminal.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn new(show: bool) -> Progress {
        use std::io::IsTerminal;
        if !show || !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{bytes} {binary_bytes_per_sec} {elapsed} {msg}")
                .expect("valid template"),
        );
        Progress { bar: Some(bar) }
    }

    pub fn hidden() -> Progress {
        Progress { bar: None }
    }

    pub fn add(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
