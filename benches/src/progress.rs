//! A progress bar on stderr: `\r` redraws on a terminal, a line per quarter otherwise (CI logs).

use std::io::{IsTerminal as _, Write as _};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counts done units out of a total and draws at most ten times a second.
#[derive(Debug)]
pub struct Progress {
    label: String,
    total: u64,
    done: AtomicU64,
    started: Instant,
    tty: bool,
    drawn: Mutex<(Instant, u64)>,
}

impl Progress {
    /// A bar for `total` units, drawn at once.
    pub fn new(label: impl Into<String>, total: u64) -> Self {
        let progress = Progress {
            label: label.into(),
            total: total.max(1),
            done: AtomicU64::new(0),
            started: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            drawn: Mutex::new((Instant::now(), 0)),
        };
        progress.draw(0, true);
        progress
    }

    /// Adds `n` done units.
    pub fn inc(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        self.draw(done, false);
    }

    /// Units done so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Draws the final state and ends the line.
    pub fn finish(&self) {
        let done = self.done.load(Ordering::Relaxed);
        let drawn = self.drawn.lock().map_or(u64::MAX, |d| d.1);
        if self.tty {
            self.draw(done, true);
            eprintln!();
        } else if drawn != done {
            self.draw(done, true);
        }
    }

    fn draw(&self, done: u64, force: bool) {
        let Ok(mut drawn) = self.drawn.try_lock() else {
            return;
        };
        let quarter = |d: u64| d * 4 / self.total;
        let due = if self.tty {
            drawn.0.elapsed() >= Duration::from_millis(100)
        } else {
            quarter(done) > quarter(drawn.1)
        };
        if !force && !due {
            return;
        }
        *drawn = (Instant::now(), done);
        let shown = done.min(self.total);
        let width = 30;
        let filled = (shown * width / self.total) as usize;
        let line = format!(
            "{:<34} [{}{}] {shown}/{} {:>3}% {:>6.1}s",
            self.label,
            "#".repeat(filled),
            ".".repeat(width as usize - filled),
            self.total,
            shown * 100 / self.total,
            self.started.elapsed().as_secs_f64()
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }
}
