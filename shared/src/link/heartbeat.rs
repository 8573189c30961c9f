//! Heartbeats, sans I/O and without the clock: the link's driver ticks
//! this once per [`BEAT`] and passes what it counted since (control
//! frames it posted, completions it heard from the peer); the answer says
//! whether to send a beat and whether the peer has been silent too long.
//!
//! Why a link beats:
//! - **A lost frame shows at once.** After the seal, every control frame
//!   carries the next frame sequence number under its tag, so a frame left
//!   out on the path fails the check of the frame after it. If the lost
//!   frame was the last one before this side waits for an answer, no frame
//!   comes after it and both sides would wait for ever; a beat (a
//!   standalone credit update, which costs the peer no credit) is the frame
//!   after it, within one beat.
//! - **A peer that is gone is noticed.** A peer whose host died says
//!   nothing, and TCP without keepalive waits for hours. A live peer's
//!   driver beats whenever it has sent nothing for a beat, however busy
//!   its application is (hashing a large file, waiting on a disk), so a
//!   peer that sent nothing at all for the silence limit is taken for gone.
#![forbid(unsafe_code)]

use std::time::Duration;

/// How often the driver ticks: a side that posted no control frame for a
/// whole beat sends one.
pub const BEAT: Duration = Duration::from_secs(1);

/// How long a peer may send nothing before the link fails, unless set.
pub const DEFAULT_SILENCE: Duration = Duration::from_secs(60);

/// What a tick asks of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tick {
    /// Post a standalone credit update: nothing went out this beat.
    pub beat: bool,
    /// The peer sent nothing for this long, the silence limit or more.
    pub silent: Option<Duration>,
}

/// One side's heartbeat state.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    /// Beats of silence that fail the link (`None`: never).
    limit: Option<u32>,
    posted: u64,
    heard: u64,
    quiet_beats: u32,
}

impl Heartbeat {
    /// A heartbeat that fails the link after `silence` without a word from
    /// the peer (rounded up to whole beats; `None`: never).
    pub fn new(silence: Option<Duration>) -> Heartbeat {
        let limit = silence.map(|s| {
            let beats = s.as_nanos().div_ceil(BEAT.as_nanos()).max(1);
            u32::try_from(beats).unwrap_or(u32::MAX)
        });
        Heartbeat {
            limit,
            posted: 0,
            heard: 0,
            quiet_beats: 0,
        }
    }

    /// One beat has passed; `posted` and `heard` are the driver's running
    /// counts of control frames posted and of completions heard.
    pub fn tick(&mut self, posted: u64, heard: u64) -> Tick {
        let beat = posted == self.posted;
        self.posted = posted;
        if heard == self.heard {
            self.quiet_beats = self.quiet_beats.saturating_add(1);
        } else {
            self.heard = heard;
            self.quiet_beats = 0;
        }
        let silent = match self.limit {
            Some(limit) if self.quiet_beats >= limit => Some(BEAT * self.quiet_beats),
            _ => None,
        };
        Tick { beat, silent }
    }

    /// A beat was posted (it counts as a posted frame next tick).
    pub fn beat_posted(&mut self) {
        self.posted += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_that_sends_nothing_beats_and_one_that_sends_does_not() {
        let mut h = Heartbeat::new(None);
        assert!(h.tick(0, 0).beat, "nothing posted in the first beat");
        h.beat_posted();
        // The beat itself is the only frame in the driver's count.
        assert!(h.tick(1, 0).beat);
        h.beat_posted();
        assert!(!h.tick(5, 0).beat, "frames went out this beat");
        assert!(h.tick(5, 0).beat);
    }

    #[test]
    fn silence_fails_only_after_the_limit_and_any_word_resets_it() {
        let mut h = Heartbeat::new(Some(Duration::from_millis(2500)));
        // 2.5 s rounds up to 3 beats.
        assert_eq!(h.tick(0, 0).silent, None);
        assert_eq!(h.tick(0, 0).silent, None);
        assert_eq!(h.tick(0, 1).silent, None, "the peer spoke");
        assert_eq!(h.tick(0, 1).silent, None);
        assert_eq!(h.tick(0, 1).silent, None);
        assert_eq!(h.tick(0, 1).silent, Some(BEAT * 3));
        assert_eq!(h.tick(0, 1).silent, Some(BEAT * 4));
    }

    #[test]
    fn without_a_limit_silence_never_fails() {
        let mut h = Heartbeat::new(None);
        for _ in 0..10_000 {
            assert_eq!(h.tick(0, 0).silent, None);
        }
    }

    #[test]
    fn a_tiny_limit_is_one_beat() {
        let mut h = Heartbeat::new(Some(Duration::from_nanos(1)));
        assert_eq!(h.tick(0, 0).silent, Some(BEAT));
    }
}
