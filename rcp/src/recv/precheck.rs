//! Entries found unchanged at the destination ahead of the receive loop,
//! on threads of their own.
//!
//! A re-sync of an unchanged tree is a walk of the destination: each file
//! announced is looked at (`statat`) and, where size and time match, its
//! mode, owner and extended attributes are compared (`llistxattr`,
//! `lgetxattr`). On the receive loop's thread alone that is one core's
//! work. Over a remote shell, once the sender's walk was done (it walks
//! during the login), that one thread was the whole copy's critical path
//! while the other core idled. On a network filesystem each of those calls
//! is a round trip, and several in flight hide their latency as well.
//!
//! So the files, symlinks and special files of a batch of entries are
//! split into contiguous runs, one per thread (a run keeps to a few
//! directories, and each thread stays in the directory of its last check,
//! `rfabric::thread_dir`), and each thread tells which of its entries are
//! there unchanged, metadata included, as the loop's own comparison would
//! find them. The checks only read. Everything an entry leads to (its
//! answer, its count, anything it changes) stays on the loop, in order.
//! An entry the checks did not clear (new, changed, unreadable, under a
//! directory the batch has yet to make) goes the loop's own way, which
//! looks again.
//!
//! With `-H`, a file's other names are linked once every file is in
//! place, on the loop's thread: in an unchanged tree that was a serial
//! tail of two lookups (and often a directory opened) for each name, with
//! every other thread idle. So the checks also look under each other
//! name: where a file of several names is there, they say which (device
//! and inode), and so they do of each file found unchanged that has
//! several names. The loop, which meets a file's first name before its
//! other names, leaves an other name as it is when it is that first
//! name's file, found unchanged ([`Cleared`]).
//!
//! A check and the loop's use of it are a few batches apart at most
//! (`CHECKED_AHEAD` in [`super`]). Between them the file may change under
//! the copy, as it may between any comparison and its result in rsync: a
//! re-sync compares, it does not lock.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::existing;
use crate::proto::EntryKind;
use crate::resync::{Decision, Policy};
use crate::staying::{Job, Staying};
use crate::tree::{Base, Fidelity};

use super::Next;

/// Batches of fewer entries to check than this are left to the loop (a
/// hand-off to the threads and back costs about as much as a few dozen
/// checks).
const FEWEST: usize = 32;

/// At most this many checking threads, however many cores.
const MOST_THREADS: usize = 8;

/// Checking threads per core. Their work is short system calls between
/// hand-offs (a batch's run in, its answer out), and with one thread a
/// core, a quarter of both cores sat idle through an unchanged re-sync
/// over ssh, the threads busy half the time each, waiting on the hand-offs
/// (`perf record -a` in 10 ms steps; `docs/rcp.md`). Two a core: that
/// re-sync of 100,000 entries took 0.48-0.55 s against 0.53-0.56 (9
/// alternating runs each, medians 0.52 and 0.54), the same local one
/// 0.34-0.38 against 0.34-0.39; eight on two cores did as well as four.
const THREADS_PER_CORE: usize = 2;

/// What an entry is compared by: the same for all of a copy's entries.
#[derive(Clone, Copy)]
pub(super) struct Rules {
    pub policy: Policy,
    pub how: Fidelity,
}

/// Test hook (`RCP_TEST_PRECHECK`), so that the integration tests know
/// the checks ran and can compare with the loop's way alone:
/// `every-batch` checks the files of every batch, however few, and says
/// at the end how many the checks cleared and how many other names of
/// files (`-H`) were left as they are by what they found; `off` checks
/// none. Only in builds with the `test-hooks` feature: a shipping binary
/// reads no such variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
enum Hook {
    EveryBatch,
    Off,
}

#[cfg(feature = "test-hooks")]
fn test_hook() -> Option<Hook> {
    match std::env::var("RCP_TEST_PRECHECK").ok()?.as_str() {
        "every-batch" => Some(Hook::EveryBatch),
        "off" => Some(Hook::Off),
        _ => None,
    }
}

#[cfg(not(feature = "test-hooks"))]
fn test_hook() -> Option<Hook> {
    None
}

/// The checking threads of one receiver.
pub(super) struct Prechecks {
    base: Arc<Base>,
    rules: Rules,
    threads: Staying,
    /// Batches with fewer entries to check are not checked.
    fewest: usize,
    /// Entries the checks found unchanged.
    cleared: Arc<AtomicU64>,
    /// Other names of files the loop left as they are, by what the
    /// checks found (only said, by the test hook).
    other_names_linked: AtomicU64,
}

impl Prechecks {
    /// One thread per core (at least two, at most [`MOST_THREADS`]);
    /// `None` where a test asked for no checks, or no thread could start
    /// (the loop then checks every entry itself).
    pub fn start(base: Arc<Base>, rules: Rules) -> Option<Prechecks> {
        let fewest = match test_hook() {
            Some(Hook::Off) => return None,
            Some(Hook::EveryBatch) => 1,
            None => FEWEST,
        };
        let count = (crate::tuning::cores() * THREADS_PER_CORE).clamp(2, MOST_THREADS);
        Some(Prechecks {
            base,
            rules,
            threads: Staying::start("rcp-check", count).ok()?,
            fewest,
            cleared: Arc::default(),
            other_names_linked: AtomicU64::new(0),
        })
    }

    /// The loop left `n` other names of files as they are, by what the
    /// checks found ([`Cleared::OtherName`]).
    pub fn other_names_linked(&self, n: u64) {
        self.other_names_linked.store(n, Ordering::Relaxed);
    }

    /// Starts checking `batch`'s entries, split among the threads.
    pub fn check(&self, batch: Vec<Next>) -> Checking {
        let files = candidates(&batch);
        let batch = Arc::new(batch);
        let mut answers = Vec::new();
        if files.len() < self.fewest {
            return Checking { batch, answers };
        }
        for (i, run) in runs(files.len(), self.threads.count())
            .into_iter()
            .enumerate()
        {
            let (done, answer) = tokio::sync::oneshot::channel();
            let positions = files[run].to_vec();
            let (base, rules, batch) = (Arc::clone(&self.base), self.rules, Arc::clone(&batch));
            let cleared = Arc::clone(&self.cleared);
            let job: Job = Box::new(move || {
                let found = check_run(&base, &rules, &batch, &positions);
                let unchanged = found
                    .iter()
                    .filter(|(_, how)| matches!(how, Cleared::Unchanged { .. }))
                    .count();
                cleared.fetch_add(unchanged as u64, Ordering::Relaxed);
                // Let go of the batch before answering: the loop takes
                // it back whole once every answer is in.
                drop(batch);
                let _ = done.send(found);
            });
            if self.threads.run(i, job) {
                answers.push(answer);
            }
        }
        Checking { batch, answers }
    }
}

/// What the checks found of one entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Cleared {
    /// Nothing the loop may go by: it looks itself.
    #[default]
    No,
    /// There unchanged; of a file that has several names there, its
    /// device and inode (its other names may be linked to it already).
    Unchanged { id: Option<FileId> },
    /// Another name of a file (`-H`), under which there is a file of
    /// several names: this one. It is linked as it would be where that
    /// is the file its first name was found unchanged as.
    OtherName(FileId),
}

/// A file's device and inode.
pub(super) type FileId = (u64, u64);

/// A batch whose entries are being checked (or, [`Checking::unchecked`],
/// are not).
pub(super) struct Checking {
    batch: Arc<Vec<Next>>,
    answers: Vec<tokio::sync::oneshot::Receiver<Vec<(usize, Cleared)>>>,
}

impl Checking {
    /// A batch no thread checks: every entry goes the loop's way.
    pub fn unchecked(batch: Vec<Next>) -> Checking {
        Checking {
            batch: Arc::new(batch),
            answers: Vec::new(),
        }
    }

    /// The batch back, once checked, and what the checks found of the
    /// entry each of its steps creates (at its position; none past the
    /// end: [`Cleared::No`]).
    pub async fn done(self) -> (Vec<Next>, Vec<Cleared>) {
        let mut cleared = Vec::new();
        if !self.answers.is_empty() {
            cleared.resize(self.batch.len(), Cleared::No);
        }
        for answer in self.answers {
            // (A thread gone answers nothing: its entries go the loop's way.)
            for (at, found) in answer.await.unwrap_or_default() {
                cleared[at] = found;
            }
        }
        // Every job let go of the batch before it answered. Only a job
        // that panicked may still hold it, for as long as its unwinding
        // takes.
        let mut batch = self.batch;
        loop {
            match Arc::try_unwrap(batch) {
                Ok(batch) => return (batch, cleared),
                Err(shared) => {
                    batch = shared;
                    std::thread::yield_now();
                }
            }
        }
    }
}

impl Drop for Prechecks {
    fn drop(&mut self) {
        if test_hook() == Some(Hook::EveryBatch) {
            use std::io::Write;
            let cleared = self.cleared.load(Ordering::Relaxed);
            let linked = self.other_names_linked.load(Ordering::Relaxed);
            // (One write: the lines stay whole where several processes,
            // a broadcast's nodes, share one stderr.)
            let line = format!(
                "rcp test: the checks cleared {cleared} entries\n\
                 rcp test: {linked} other names were there linked\n"
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

/// Positions in `batch` of the entries to check: files announced without
/// their data (a file that came with it is answered by no check),
/// symlinks, special files and other names of files.
fn candidates(batch: &[Next]) -> Vec<usize> {
    batch
        .iter()
        .enumerate()
        .filter(|(_, next)| {
            let Next::Create(ready) = next else {
                return false;
            };
            match ready.entry.kind {
                EntryKind::File => ready.end.is_none(),
                EntryKind::Symlink | EntryKind::HardLink => true,
                kind => kind.is_special(),
            }
        })
        .map(|(at, _)| at)
        .collect()
}

/// Positions in `batch` (among `positions`) of the entries the checks
/// cleared, and how. Once an entry's directory cannot be reached (not
/// made yet: the batch announces it too, as in a first copy), the entries
/// after it in that directory are not tried.
fn check_run(
    base: &Base,
    rules: &Rules,
    batch: &[Next],
    positions: &[usize],
) -> Vec<(usize, Cleared)> {
    let mut unreachable: Option<&[u8]> = None;
    let mut found = Vec::new();
    for &at in positions {
        let Next::Create(ready) = &batch[at] else {
            continue;
        };
        let path = &ready.entry.path[..];
        let parent = &path[..path.iter().rposition(|&b| b == b'/').unwrap_or(0)];
        if unreachable == Some(parent) {
            continue;
        }
        match there_unchanged(base, ready, rules) {
            Check::Cleared(how) => found.push((at, how)),
            Check::Differs => {}
            Check::NoDirectory => unreachable = Some(parent),
        }
    }
    found
}

/// `len` items split into `parts` contiguous runs as even as can be, in
/// order, none empty (fewer runs than parts when there are fewer items).
fn runs(len: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, len.max(1));
    (0..parts)
        .map(|i| len * i / parts..len * (i + 1) / parts)
        .filter(|run| !run.is_empty())
        .collect()
}

/// What a check found.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    /// There with the same data and metadata, as the loop's own comparison
    /// would find it: the loop skips it without looking again. (Or, of
    /// another name of a file, the file there under it.)
    Cleared(Cleared),
    /// Anything else (new, changed, unreadable): the loop's way.
    Differs,
    /// Its directory could not be reached.
    NoDirectory,
}

fn there_unchanged(base: &Base, ready: &super::Ready, rules: &Rules) -> Check {
    let e = &ready.entry;
    let Ok(placed) = base.place(&e.path) else {
        return Check::NoDirectory;
    };
    // (The device and inode of a regular file there, `look_in`'s status,
    // where it has several names.)
    let of_several_names = |st: Option<rustix::fs::Stat>| {
        st.filter(|st| st.st_nlink > 1)
            .map(|st| (st.st_dev, st.st_ino))
    };
    if e.kind == EntryKind::HardLink {
        return match existing::look_in(&placed, e).map(|(_, st)| of_several_names(st)) {
            Ok(Some(id)) => Check::Cleared(Cleared::OtherName(id)),
            _ => Check::Differs,
        };
    }
    if e.kind != EntryKind::File {
        // A symlink or special file: as the loop would find it.
        return if existing::in_place_in(placed, e, &ready.xattrs, rules.how) {
            Check::Cleared(Cleared::Unchanged { id: None })
        } else {
            Check::Differs
        };
    }
    let Ok((found, st)) = existing::look_in(&placed, e) else {
        return Check::Differs;
    };
    let unchanged = match rules.policy.decide(e, found) {
        Decision::Skip { metadata: false } => true,
        Decision::Skip { metadata: true } => st.as_ref().is_some_and(|st| {
            existing::metadata_right(base, &placed, e, &ready.xattrs, rules.how, st)
                .unwrap_or(false)
        }),
        Decision::Send | Decision::Compare => false,
    };
    if unchanged {
        let id = of_several_names(st);
        Check::Cleared(Cleared::Unchanged { id })
    } else {
        Check::Differs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_every_item_once_in_order_and_evenly() {
        for len in 0..100 {
            for parts in 1..10 {
                let runs = runs(len, parts);
                let flat: Vec<usize> = runs.iter().flat_map(|r| r.clone()).collect();
                assert_eq!(flat, (0..len).collect::<Vec<_>>(), "{len} in {parts}");
                assert!(runs.len() <= parts);
                assert!(runs.iter().all(|r| !r.is_empty()));
                let (short, long) = (
                    runs.iter().map(|r| r.len()).min().unwrap_or(0),
                    runs.iter().map(|r| r.len()).max().unwrap_or(0),
                );
                assert!(long - short <= 1, "{len} in {parts}: {runs:?}");
            }
        }
    }
}
