//! `--bwlimit`: a copy's data held to a rate, sans I/O and without a clock
//! of its own (`now` is passed in). A token bucket: what was not used
//! builds up to a burst, and a chunk beyond what is there is owed, paid
//! by waiting before the next. Over any span the data let through is at
//! most the burst and the rate times the span, plus the one chunk that
//! made the debt.
//!
//! The side the user started paces what it controls: a sender its chunks
//! before they go to the stripers (`send::data`), a receiver (a pull) each
//! chunk before it lands, so that its slot, and the sender's credit, come
//! back no faster than the rate. Nothing of it travels: a server never
//! paces.

use std::time::{Duration, Instant};

/// The bucket: its rate, its burst, and what it holds (below zero: owed).
#[derive(Debug)]
pub struct Pace {
    rate: f64,
    burst: f64,
    held: f64,
    last: Option<Instant>,
}

impl Pace {
    /// At most `rate` bytes a second (not 0), in bursts of an eighth of a
    /// second's worth (at least 64 KiB), starting full.
    pub fn new(rate: u64) -> Pace {
        let rate = rate.max(1) as f64;
        let burst = (rate / 8.0).max(65536.0);
        Pace {
            rate,
            burst,
            held: burst,
            last: None,
        }
    }

    /// `bytes` go at `now` (after any wait this returned before): how long
    /// to wait before the next bytes go.
    pub fn take(&mut self, bytes: u64, now: Instant) -> Duration {
        if let Some(last) = self.last {
            let since = now.saturating_duration_since(last).as_secs_f64();
            self.held = (self.held + since * self.rate).min(self.burst);
        }
        self.last = Some(now);
        self.held -= bytes as f64;
        if self.held >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.held / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A sender that waits as told never gets ahead of the rate by
        /// more than the burst and one chunk, whatever its chunks and its
        /// own delays; and one that keeps under the rate is never held.
        #[test]
        fn what_goes_keeps_to_the_rate(
            rate in 1_000u64..100_000_000,
            chunks in proptest::collection::vec((1u64..4_000_000, 0u64..200_000), 1..200),
        ) {
            let start = Instant::now();
            let mut now = start;
            let mut pace = Pace::new(rate);
            let mut sent = 0u64;
            let burst = (rate as f64 / 8.0).max(65536.0);
            let most = chunks.iter().map(|c| c.0).max().unwrap_or(0) as f64;
            for (bytes, idle_us) in chunks {
                now += Duration::from_micros(idle_us);
                sent += bytes;
                let allowed = burst + most + rate as f64 * (now - start).as_secs_f64();
                prop_assert!(sent as f64 <= allowed + 1.0, "{sent} > {allowed}");
                now += pace.take(bytes, now);
            }
        }

        #[test]
        fn under_the_rate_nothing_waits(
            rate in 100_000u64..100_000_000,
            n in 1usize..100,
        ) {
            let mut pace = Pace::new(rate);
            let start = Instant::now();
            // Chunks of a tenth of a second's worth, a tenth of a second
            // apart: exactly the rate.
            let chunk = rate / 10;
            for k in 0..n {
                let now = start + Duration::from_millis(100 * k as u64);
                prop_assert_eq!(pace.take(chunk, now), Duration::ZERO);
            }
        }
    }

    #[test]
    fn a_debt_is_paid_by_waiting() {
        let start = Instant::now();
        let mut pace = Pace::new(1 << 20);
        // The burst (128 KiB) goes at once; a MiB more is owed: a second.
        let wait = pace.take((1 << 20) + (128 << 10), start);
        assert_eq!(wait, Duration::from_secs_f64(1.0));
        // Having waited, the next small chunk waits only for itself.
        let wait = pace.take(1 << 10, start + wait);
        assert!(wait <= Duration::from_millis(1), "{wait:?}");
    }
}
