//! A lane's clock, sans I/O and with `now` passed in: when a lane that
//! lost its link dials again (after 100 ms, then twice as long each time
//! up to 5 s), and how long its requests wait for a link before they fail
//! (`give_up`, counted from the moment the lane went down, so a request
//! that comes late in an outage waits only for what is left of it).

use std::time::{Duration, Instant};

/// The first wait before dialling a failed lane again; it doubles up to
/// [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a request that wants the lane's link does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The lane is up.
    Up,
    /// Down: wait for a link until this moment.
    Until(Instant),
    /// Down for `give_up` already: fail.
    GiveUp,
}

/// One lane's outage and redial timing.
#[derive(Debug, Clone)]
pub struct LaneClock {
    give_up: Duration,
    /// Since when the lane has had no link.
    down_since: Option<Instant>,
    /// The wait after the next failed dial.
    backoff: Duration,
}

impl LaneClock {
    /// A lane whose link is up.
    pub fn up(give_up: Duration) -> LaneClock {
        LaneClock {
            give_up,
            down_since: None,
            backoff: FIRST_BACKOFF,
        }
    }

    /// A lane with no link since `now`.
    pub fn down(give_up: Duration, now: Instant) -> LaneClock {
        LaneClock {
            down_since: Some(now),
            ..LaneClock::up(give_up)
        }
    }

    /// The link failed at `now` (a second report of the same outage keeps
    /// its start).
    pub fn lost(&mut self, now: Instant) {
        self.down_since.get_or_insert(now);
    }

    /// A link is up again: the next outage starts its backoff afresh.
    pub fn connected(&mut self) {
        self.down_since = None;
        self.backoff = FIRST_BACKOFF;
    }

    /// A dial failed at `now`: when to dial next.
    pub fn dial_failed(&mut self, now: Instant) -> Instant {
        let next = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        next
    }

    /// What a request that wants a link does at `now`.
    pub fn wait(&self, now: Instant) -> Wait {
        let Some(since) = self.down_since else {
            return Wait::Up;
        };
        let deadline = since + self.give_up;
        if now >= deadline {
            Wait::GiveUp
        } else {
            Wait::Until(deadline)
        }
    }

    pub fn give_up(&self) -> Duration {
        self.give_up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_starts_afresh_after_a_link() {
        let t0 = Instant::now();
        let mut c = LaneClock::down(Duration::from_secs(60), t0);
        let waits: Vec<u128> = (0..9)
            .map(|_| (c.dial_failed(t0) - t0).as_millis())
            .collect();
        assert_eq!(
            waits,
            vec![100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]
        );
        c.connected();
        c.lost(t0);
        assert_eq!(c.dial_failed(t0) - t0, FIRST_BACKOFF);
    }

    #[test]
    fn requests_wait_for_what_is_left_of_give_up() {
        let t0 = Instant::now();
        let give_up = Duration::from_secs(10);
        let mut c = LaneClock::up(give_up);
        assert_eq!(c.wait(t0), Wait::Up);
        c.lost(t0);
        c.lost(t0 + Duration::from_secs(3));
        let deadline = t0 + give_up;
        assert_eq!(c.wait(t0 + Duration::from_secs(4)), Wait::Until(deadline));
        assert_eq!(c.wait(deadline), Wait::GiveUp);
        c.connected();
        assert_eq!(c.wait(deadline + Duration::from_secs(100)), Wait::Up);
    }
}
