//! The one rule for waiting between tries of a failed call: start at a first delay, double after
//! each failure, never exceed a ceiling, and start over after a success.
//!
//! Every retry loop of the service uses it: the worker's attempt write and the completer's queue
//! statements (a few tries, then the job is left to its lease), the CDC source's publishes
//! (until they are durable) and its restarts after a stream error; and outside the service, the
//! fault suite's publishers (`sheaf-chaos`), which retry a publish the way a client should.

use std::time::Duration;

/// Doubling delays between `first` and `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Delays of `first`, then twice that after each failure, capped at `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The delay to wait before the next try; the one after it doubles.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// The delay the next failure will wait, without moving on.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// Back to the first delay, after a success.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_ceiling_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_millis(700));
        let delays: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [200, 400, 700, 700]);
        b.reset();
        assert_eq!(b.peek(), Duration::from_millis(200));
    }
}
