//! Received files made durable together, where the filesystem allows.
//!
//! A received file gets its final name only once its data is on disk
//! ([`super::PartFile::commit`]): a crash never leaves a final name over
//! missing data. One `fdatasync` per file does that with a journal commit
//! (or log force) and a device cache flush for every file: 400 µs a file
//! on XFS here, so that a fresh copy of 10,000 small files into XFS took
//! 1.1-1.3 s against rsync's 0.64 s (rsync syncs nothing), and 0.56 s
//! with the syncs left out.
//!
//! On the filesystems whose `syncfs` writes back every dirty page and
//! inode and then commits the journal with a cache flush (XFS, ext2/3/4,
//! btrfs), files are made durable in rounds instead, a group commit:
//! * a file whose data and metadata are written joins the next round to
//!   start, never the running one, which may have begun before its last
//!   write;
//! * a round is one `syncfs`; files that finish while it runs wait for the
//!   next, which starts as soon as it ends, so a round takes all the files
//!   finished during the one before;
//! * then each file asks for its own writeback errors
//!   ([`rfabric::storage::writeback_errors`]: `syncfs` reports none before
//!   Linux 5.8, and after it those of the whole filesystem) before it is
//!   placed. A round that fails leaves each of its files to its own
//!   `fdatasync`, which reports that file's error or makes it durable.
//!
//! The price: `syncfs` writes back all the filesystem holds dirty, other
//! programs' files too, so where others keep a filesystem busy a round
//! lasts as long as their writeback. Per-file syncs wait as long there,
//! their journal commits queued behind the same writeback: beside a `dd`
//! filling the same XFS, 10,000 files took 13.0-14.5 s in rounds and
//! 12.8-35.1 s with an `fdatasync` each. Elsewhere (NFS, Lustre, GPFS, FUSE:
//! what `syncfs` promises there is each filesystem's own) every file has
//! its own `fdatasync`, as before.
//!
//! [`Rounds`] is the bookkeeping, without I/O; [`Together`] runs it for
//! one filesystem.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// Filesystems whose `syncfs` makes every file on them durable.
pub(super) fn syncs_whole(f_type: u64) -> bool {
    const XFS_MAGIC: u64 = 0x5846_5342;
    const EXT_MAGIC: u64 = 0xef53; // ext2, ext3 and ext4 alike
    const BTRFS_MAGIC: u64 = 0x9123_683e;
    matches!(f_type, XFS_MAGIC | EXT_MAGIC | BTRFS_MAGIC)
}

/// Test hook (`RCP_TEST_DURABILITY`), so that the integration tests reach
/// the ways a file is made durable that a healthy disk of theirs never
/// takes: `each-file` gives every file an `fdatasync` of its own where
/// rounds would be used (as on NFS or Lustre), `rounds-fail` makes every
/// round fail as if `syncfs` had (each file then syncs itself). Only in
/// builds with the `test-hooks` feature: a shipping binary reads no such
/// variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hook {
    EachFile,
    RoundsFail,
}

#[cfg(feature = "test-hooks")]
pub(super) fn test_hook() -> Option<Hook> {
    match std::env::var("RCP_TEST_DURABILITY").ok()?.as_str() {
        "each-file" => Some(Hook::EachFile),
        "rounds-fail" => Some(Hook::RoundsFail),
        _ => None,
    }
}

#[cfg(not(feature = "test-hooks"))]
pub(super) fn test_hook() -> Option<Hook> {
    None
}

/// The rounds of one filesystem: which round a file waits for, when the
/// next one starts, and what a waiting file learns.
#[derive(Debug, Default)]
pub(crate) struct Rounds {
    /// Rounds started (the running one included); rounds count from 1.
    started: u64,
    /// Rounds ended.
    ended: u64,
    /// The latest round a file waits for.
    wanted: u64,
    /// The latest round that ended with its `syncfs` done.
    last_good: u64,
}

/// What a file joining the rounds does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Join {
    /// No round was running: round `n` starts now; the caller starts it,
    /// and waits for it.
    Start(u64),
    /// A round is running: wait for round `n`, the one after it.
    Wait(u64),
}

impl Rounds {
    fn running(&self) -> bool {
        self.started > self.ended
    }

    /// A file whose writes are done joins the next round to start.
    pub(crate) fn join(&mut self) -> Join {
        let round = self.started + 1;
        self.wanted = round;
        if self.running() {
            Join::Wait(round)
        } else {
            self.started = round;
            Join::Start(round)
        }
    }

    /// The running round ended (`good`: its `syncfs` succeeded). Returns
    /// the round that starts now, if files wait for one.
    pub(crate) fn end(&mut self, good: bool) -> Option<u64> {
        debug_assert!(self.running());
        self.ended = self.started;
        if good {
            self.last_good = self.ended;
        }
        (self.wanted > self.ended).then(|| {
            self.started += 1;
            self.started
        })
    }

    /// What a file waiting for `round` learns: nothing yet (`None`), its
    /// data durable (`Some(true)`: that round or a later one, begun later
    /// still, succeeded), or that it must sync itself (`Some(false)`).
    pub(crate) fn outcome(&self, round: u64) -> Option<bool> {
        (self.ended >= round).then_some(self.last_good >= round)
    }
}

/// The rounds of one filesystem, run: each `syncfs` on a blocking thread,
/// waiting files woken when it ends.
#[derive(Debug)]
pub(crate) struct Together {
    /// A directory on the filesystem (what `syncfs` is given).
    fs: Arc<OwnedFd>,
    rounds: Mutex<Rounds>,
    /// The count of rounds ended, for the waiting files.
    ended: tokio::sync::watch::Sender<u64>,
}

impl Together {
    pub(crate) fn new(fs: OwnedFd) -> Together {
        Together {
            fs: Arc::new(fs),
            rounds: Mutex::default(),
            ended: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Waits for a round that begins after this call: `true` once one has
    /// made everything written before the call durable, `false` if it
    /// failed (the caller then syncs its file itself).
    pub(crate) async fn durable(self: &Arc<Self>) -> bool {
        // (Subscribed first: a round that ends between the look below and
        // the wait still wakes it.)
        let mut ended = self.ended.subscribe();
        let join = self.rounds.lock().expect("rounds lock").join();
        let round = match join {
            Join::Start(round) => {
                self.run(round);
                round
            }
            Join::Wait(round) => round,
        };
        loop {
            if let Some(good) = self.rounds.lock().expect("rounds lock").outcome(round) {
                return good;
            }
            if ended.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Runs round `first` and those wanted after it, one after another,
    /// on a task of its own: a file that started a round and was then
    /// cancelled leaves the others' rounds running.
    fn run(self: &Arc<Self>, first: u64) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut round = Some(first);
            while round.is_some() {
                let fs = Arc::clone(&me.fs);
                let good = tokio::task::spawn_blocking(move || {
                    test_hook() != Some(Hook::RoundsFail) && rustix::fs::syncfs(&*fs).is_ok()
                })
                .await
                .unwrap_or(false);
                let mut rounds = me.rounds.lock().expect("rounds lock");
                round = rounds.end(good);
                let ended = rounds.ended;
                drop(rounds);
                me.ended.send_replace(ended);
            }
        });
    }

    /// Rounds ended so far.
    #[cfg(test)]
    pub(crate) fn rounds_ended(&self) -> u64 {
        *self.ended.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_file_starts_a_round_and_later_ones_wait_for_the_next() {
        let mut r = Rounds::default();
        assert_eq!(r.join(), Join::Start(1));
        // Finished while round 1 runs: round 1 may have begun before
        // their last write, so they wait for round 2.
        assert_eq!(r.join(), Join::Wait(2));
        assert_eq!(r.join(), Join::Wait(2));
        assert_eq!(r.outcome(1), None);
        // Round 1 ends; round 2 starts at once for the two.
        assert_eq!(r.end(true), Some(2));
        assert_eq!(r.outcome(1), Some(true));
        assert_eq!(r.outcome(2), None);
        // Joining now waits for round 3, not the running 2.
        assert_eq!(r.join(), Join::Wait(3));
        assert_eq!(r.end(true), Some(3));
        assert_eq!(r.outcome(2), Some(true));
        // Nobody waits after round 3: the rounds stop.
        assert_eq!(r.end(true), None);
        assert_eq!(r.outcome(3), Some(true));
        // The next file starts round 4 itself.
        assert_eq!(r.join(), Join::Start(4));
    }

    #[test]
    fn a_failed_round_sends_its_files_to_their_own_sync() {
        let mut r = Rounds::default();
        assert_eq!(r.join(), Join::Start(1));
        assert_eq!(r.join(), Join::Wait(2));
        assert_eq!(r.end(false), Some(2));
        assert_eq!(r.outcome(1), Some(false));
        assert_eq!(r.end(true), None);
        assert_eq!(r.outcome(2), Some(true));
        // A file of round 1 that looks only now: round 2 began after its
        // writes too, and succeeded.
        assert_eq!(r.outcome(1), Some(true));
        assert_eq!(r.join(), Join::Start(3));
        assert_eq!(r.end(false), None);
        assert_eq!(r.outcome(3), Some(false));
    }

    /// Seeded walks of joins and ends: a round a file waits for always
    /// starts after it joined, and every round started ends.
    #[test]
    fn no_file_waits_for_a_round_begun_before_it_joined() {
        let mut seed = 0x5eed_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let mut r = Rounds::default();
            let mut waiting: Vec<(u64, u64)> = Vec::new(); // (round, started when it joined)
            for _ in 0..200 {
                if next() % 3 == 0 && r.running() {
                    let good = next() % 5 != 0;
                    let ended = r.started;
                    let _ = r.end(good);
                    for &(round, _) in &waiting {
                        if round <= ended {
                            assert!(r.outcome(round).is_some());
                        }
                    }
                    waiting.retain(|&(round, _)| round > ended);
                } else {
                    let started_before = r.started;
                    let round = match r.join() {
                        Join::Start(n) | Join::Wait(n) => n,
                    };
                    assert!(round > started_before, "joined a round already begun");
                    waiting.push((round, started_before));
                }
            }
            while r.running() {
                let _ = r.end(true);
            }
            assert!(
                waiting
                    .iter()
                    .all(|&(round, _)| r.outcome(round) == Some(true))
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn files_finishing_together_share_rounds() {
        let t = test_support::Scratch::new("together");
        let dir = rustix::fs::open(
            t.path(""),
            rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let together = Arc::new(Together::new(dir));
        let files: Vec<_> = (0..64)
            .map(|i| {
                let together = Arc::clone(&together);
                let path = t.path(&format!("f{i}"));
                tokio::spawn(async move {
                    std::fs::write(&path, vec![i as u8; 5000]).unwrap();
                    let file = std::fs::File::open(&path).unwrap();
                    let good = together.durable().await;
                    rfabric::storage::writeback_errors(&file).unwrap();
                    good
                })
            })
            .collect();
        for f in files {
            assert!(f.await.unwrap(), "a round failed");
        }
        // The first file's round runs alone; the other 63 files, finished
        // meanwhile, share the rounds after it.
        let rounds = together.rounds_ended();
        assert!((2..64).contains(&rounds), "{rounds} rounds for 64 files");
    }
}
