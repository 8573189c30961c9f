//! Where a connection to a local export is served: on threads of its own
//! while it is quiet, on the runtime while it is busy (and never moved
//! with `--nbd-threads 0`, which keeps it on the runtime).
//!
//! Why both. Measured on 2 virtual cores (docs/rblock.md):
//! * A lone request (a client with one request at a time) is answered
//!   sooner by a thread asleep in `read` on the socket: the client's send
//!   wakes it and the kernel moves it to the client's core. The runtime's
//!   threads sleep in `epoll_wait` and stay where they are (p50 34 µs on
//!   the threads, 41 on the runtime, nbdkit 32).
//! * A client that keeps many small requests in flight is served with far
//!   fewer wake-ups by the runtime: its worker mostly finds the next
//!   request there when it looks, while on the threads every request finds
//!   a thread asleep in `read` and wakes it (3.1 context switches a request
//!   against 0.16; two fio jobs at iodepth 32: 86-96k IOPS on the threads,
//!   148-162k on the runtime, nbdkit 90-120k).
//!
//! What tells them apart: a client with one request at a time never sends
//! the next before it has the answer, so a request that arrives while
//! another of its connection is unanswered (or with others in one read)
//! is the mark of a busy connection. Only small requests count (at most
//! [`BURST_LEN`]): large writes overlap on the threads' cores, which move
//! them from the socket to the file at least as fast as the runtime.
//!
//! Large reads are the runtime's whatever their pace: one read longer
//! than [`BURST_LEN`] moves a connection there, and keeps it there as an
//! overlapped small request does. Measured (1 MiB reads sent from the
//! page cache, docs/rblock.md): one at a time, 5.9 GB/s on the runtime
//! against 3.4-3.5 on the threads (p50 142-144 µs against 173-179); at a
//! fixed 1 GB/s, 120 µs of the server's CPU a request against 275, the
//! threads making as many context switches but 4,341 migrations against
//! 30 (each request is served by the next thread in turn, woken on
//! whichever core it slept).
//!
//! Which runtime ([`runtime_for`]): a connection that leaves busy with
//! requests of at most [`ONE_THREAD_LEN`] goes to a single-threaded
//! runtime (`single_threaded.rs`), where its requests never wait for a
//! wake-up across threads; one that leaves for longer reads goes to the
//! shared one, where one connection's reads run on several cores at
//! once. Measured (docs/rblock.md): two fio jobs of 4 KiB reads at
//! iodepth 32, 1.3x the IOPS on single-threaded runtimes; nbdcopy's four
//! connections of 256 KiB reads, 0.8x as fast there.
//!
//! [`Pace`] decides from what it is told, with the time passed in; the
//! two serving loops tell it each request they take and hand the
//! connection over when it says so (`connection.rs`).

use std::time::{Duration, Instant};

use super::burst::BURST_LEN;
use crate::nbd::consts::cmd;
use crate::nbd::transmission::Request;

/// Small requests taken overlapped within [`Rules::busy_within`] that make
/// a connection on threads busy.
const BUSY: u32 = 32;
/// The span in which [`BUSY`] overlapped small requests must come.
const BUSY_WITHIN: Duration = Duration::from_millis(20);
/// A connection on the runtime with neither an overlapped small request
/// nor a large read for this long is quiet again.
const QUIET_AFTER: Duration = Duration::from_millis(100);

/// When a connection moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rules {
    pub(super) busy: u32,
    pub(super) busy_within: Duration,
    pub(super) quiet_after: Duration,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            busy: BUSY,
            busy_within: BUSY_WITHIN,
            quiet_after: QUIET_AFTER,
        }
    }
}

/// Where a connection is being served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Threads,
    Runtime,
}

/// Which runtime a connection leaving its threads goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Runtime {
    /// The shared one, a worker per core.
    Shared,
    /// One of the single-threaded runtimes, the connection's own.
    Single,
}

/// Requests at most this long are served on a single-threaded runtime
/// when they keep a connection busy. Measured on either side of it: 4
/// KiB requests gained there, nbdcopy's 256 KiB reads lost; the bound
/// between is a choice (64 KiB, where a cached read is still tried in
/// place, `Storage::may_read_now`), not a measurement.
pub(super) const ONE_THREAD_LEN: u32 = 64 * 1024;

/// The runtime a connection leaving its threads goes to, by the longest
/// request (`longest` bytes) of the take that made it leave: a
/// single-threaded one for requests of at most [`ONE_THREAD_LEN`], the
/// shared one for longer (a large read, or nbdcopy's 256 KiB ones).
pub(super) fn runtime_for(longest: u32) -> Runtime {
    if longest <= ONE_THREAD_LEN {
        Runtime::Single
    } else {
        Runtime::Shared
    }
}

/// How a stay in one mode ended.
pub(super) enum Stay<W> {
    /// The connection is over.
    Over,
    /// It moves to the other mode: what it holds unread (to be read before
    /// the socket), and the socket (`W`: as the mode left it).
    Moves { pending: Vec<u8>, wire: W },
}

/// A connection's pace, as far as it decides where it is served.
#[derive(Debug, Clone)]
pub(super) struct Pace {
    rules: Rules,
    mode: Mode,
    /// On threads: when the current span of overlapped small requests
    /// began, and how many it holds. On the runtime: when the last one
    /// was taken (or the connection arrived there).
    since: Instant,
    overlapped: u32,
}

/// What one take of requests looked like.
#[derive(Debug, Clone, Copy)]
pub(super) struct Took {
    /// Requests taken together (a burst, or one).
    pub(super) requests: u32,
    /// Whether they were all small (at most [`BURST_LEN`]; a burst is
    /// only of small ones).
    pub(super) small: bool,
    /// Whether one of them was a read longer than that ([`large_read`]).
    pub(super) large_read: bool,
    /// Whether another request of the connection was unanswered when they
    /// were taken.
    pub(super) behind_others: bool,
}

/// Whether `req` is a read longer than [`BURST_LEN`]: the runtime's,
/// even alone.
pub(super) fn large_read(req: &Request) -> bool {
    req.kind == cmd::READ && req.length > BURST_LEN
}

impl Pace {
    /// A connection just arrived in `mode` at `now`.
    pub(super) fn new(rules: Rules, mode: Mode, now: Instant) -> Pace {
        Pace {
            rules,
            mode,
            since: now,
            overlapped: 0,
        }
    }

    /// Requests taken at `now`: true when the connection should move to
    /// the other mode (after the requests taken so far are answered); from
    /// its threads, to the runtime [`runtime_for`] says.
    pub(super) fn took(&mut self, now: Instant, took: Took) -> bool {
        let overlapped = took.small && (took.requests > 1 || took.behind_others);
        match self.mode {
            Mode::Threads => {
                if took.large_read {
                    return true;
                }
                if !overlapped {
                    return false;
                }
                if now.saturating_duration_since(self.since) > self.rules.busy_within {
                    self.since = now;
                    self.overlapped = 0;
                }
                self.overlapped = self.overlapped.saturating_add(took.requests);
                self.overlapped >= self.rules.busy
            }
            Mode::Runtime => {
                if overlapped || took.large_read {
                    self.since = now;
                    return false;
                }
                now.saturating_duration_since(self.since) >= self.rules.quiet_after
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONE: Took = Took {
        requests: 1,
        small: true,
        large_read: false,
        behind_others: false,
    };
    const BEHIND: Took = Took {
        requests: 1,
        small: true,
        large_read: false,
        behind_others: true,
    };
    const LARGE_WRITE_BEHIND: Took = Took {
        requests: 1,
        small: false,
        large_read: false,
        behind_others: true,
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_large_read_moves_a_connection_to_the_runtime_at_once_and_keeps_it_there() {
        let req = |kind, length| Request {
            flags: 0,
            kind,
            cookie: 1,
            offset: 0,
            length,
        };
        assert!(large_read(&req(cmd::READ, BURST_LEN + 1)));
        assert!(!large_read(&req(cmd::READ, BURST_LEN)));
        assert!(!large_read(&req(cmd::WRITE, 32 << 20)));
        let lone_large_read = Took {
            requests: 1,
            small: false,
            large_read: true,
            behind_others: false,
        };
        let t0 = Instant::now();
        let rules = Rules::default();
        let mut pace = Pace::new(rules, Mode::Threads, t0);
        assert!(pace.took(t0, lone_large_read));
        let mut pace = Pace::new(rules, Mode::Runtime, t0);
        for i in 1..100u32 {
            assert!(!pace.took(t0 + rules.quiet_after / 2 * i, lone_large_read));
        }
        let last = t0 + rules.quiet_after / 2 * 99;
        assert!(pace.took(last + rules.quiet_after, LONE));
    }

    #[test]
    fn small_requests_go_to_a_runtime_of_one_thread_and_longer_ones_to_the_shared_one() {
        assert_eq!(runtime_for(0), Runtime::Single);
        assert_eq!(runtime_for(4096), Runtime::Single);
        assert_eq!(runtime_for(ONE_THREAD_LEN), Runtime::Single);
        assert_eq!(runtime_for(ONE_THREAD_LEN + 1), Runtime::Shared);
        // nbdcopy's requests, small for a burst but not for one thread.
        assert_eq!(runtime_for(BURST_LEN), Runtime::Shared);
        assert_eq!(runtime_for(32 << 20), Runtime::Shared);
    }

    #[test]
    fn lone_requests_never_move_a_connection_off_its_threads() {
        let t0 = Instant::now();
        let mut pace = Pace::new(Rules::default(), Mode::Threads, t0);
        for i in 0..100_000u64 {
            assert!(!pace.took(t0 + Duration::from_micros(30 * i), LONE));
        }
    }

    #[test]
    fn large_writes_in_flight_together_stay_on_the_threads() {
        let t0 = Instant::now();
        let mut pace = Pace::new(Rules::default(), Mode::Threads, t0);
        for i in 0..10_000u64 {
            assert!(!pace.took(t0 + Duration::from_micros(i), LARGE_WRITE_BEHIND));
        }
    }

    #[test]
    fn small_requests_behind_others_move_it_to_the_runtime_once_there_are_enough_in_a_span() {
        let t0 = Instant::now();
        let mut pace = Pace::new(Rules::default(), Mode::Threads, t0);
        for i in 0..BUSY - 1 {
            assert!(!pace.took(t0 + Duration::from_micros(i.into()), BEHIND));
            // Lone ones in between neither count nor reset the span.
            assert!(!pace.took(t0 + Duration::from_micros(i.into()), LONE));
        }
        assert!(pace.took(t0 + ms(1), BEHIND));
    }

    #[test]
    fn a_burst_counts_each_of_its_requests() {
        let t0 = Instant::now();
        let mut pace = Pace::new(Rules::default(), Mode::Threads, t0);
        let burst = |n| Took {
            requests: n,
            small: true,
            large_read: false,
            behind_others: false,
        };
        assert!(!pace.took(t0, burst(BUSY - 1)));
        assert!(pace.took(t0, burst(2)));
    }

    #[test]
    fn overlaps_spread_thinner_than_the_span_allows_do_not_move_it() {
        let t0 = Instant::now();
        let rules = Rules::default();
        let mut pace = Pace::new(rules, Mode::Threads, t0);
        // One overlapped request every span and a bit: the count starts
        // over each time.
        for i in 0..1_000u32 {
            let at = t0 + (rules.busy_within + ms(1)) * i;
            assert!(!pace.took(at, BEHIND));
        }
        // Bunched within one span, they do.
        let later = t0 + ms(100_000);
        let moved = (0..BUSY).map(|_| pace.took(later, BEHIND)).last();
        assert_eq!(moved, Some(true));
    }

    #[test]
    fn the_runtime_gives_it_back_after_a_quiet_span_and_not_before() {
        let t0 = Instant::now();
        let rules = Rules::default();
        let mut pace = Pace::new(rules, Mode::Runtime, t0);
        // Busy: every overlapped request restarts the quiet span.
        for i in 0..1_000u64 {
            let at = t0 + ms(i);
            assert!(!pace.took(at, if i % 10 == 0 { BEHIND } else { LONE }));
        }
        let last_overlap = t0 + ms(990);
        // Large writes in flight together do not keep it busy.
        assert!(!pace.took(last_overlap + ms(50), LARGE_WRITE_BEHIND));
        assert!(!pace.took(last_overlap + rules.quiet_after - ms(1), LONE));
        assert!(pace.took(last_overlap + rules.quiet_after, LONE));
    }

    #[test]
    fn the_quiet_span_starts_when_the_connection_arrives_on_the_runtime() {
        let t0 = Instant::now();
        let rules = Rules::default();
        let mut pace = Pace::new(rules, Mode::Runtime, t0 + ms(500));
        assert!(!pace.took(t0 + ms(550), LONE));
        assert!(pace.took(t0 + ms(500) + rules.quiet_after, LONE));
    }
}
