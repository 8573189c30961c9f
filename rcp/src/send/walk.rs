//! The walk of what a push sends, on a blocking thread of its own, a
//! bounded way ahead of the planner that takes its items.
//!
//! A walk may start before its session is up ([`Walk::start`], then
//! [`Walk::settle`] when the session starts sending). A copy through a
//! remote shell starts it before the login: the far side logs in and
//! starts `rcp server-once` in about 0.25 s on these machines, during
//! which the cores are mostly idle, and the walk's first items are ready
//! when the session is. Until it settles the walk may be up to
//! [`EARLY_BYTES`] of items ahead; after, as far as before: [`WALK_BATCHES`]
//! batches. Either way the directories and files its items hold open stay
//! under half the sender's window ([`super::ask_ahead`]).
//!
//! What it pays on these machines is little: over the loopback sshd, an
//! unchanged `-aHAX` re-sync of 100,000 entries took 0.95x the time of a
//! walk started with the session (0.92-1.01, 10 paired runs) with room
//! for 65,536 items ahead, and 0.98x and 0.99x (0.91-1.09) in two more
//! sets with room for the whole tree (32 MiB, 26 MiB more peak memory).
//! The walk overlapped the far side's scan before too, and that scan,
//! which cannot start before the login ends, is what such a copy waits
//! for. Room for 16,384 items took 1.04x the time of 65,536: what is not
//! walked during the login competes with that scan for the cores. Where
//! a login takes longer (Kerberos, a directory service) and a walk is
//! slower (a network filesystem's metadata), it takes more off the copy.
//!
//! [`Lead`] is the bookkeeping of how far ahead the walk is, without I/O
//! or waiting; [`Walk`] runs it between the walking thread (which waits
//! for room) and the planner (which takes batches and so makes room).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Sources;
use crate::archive::Keep;
use crate::filter::Filter;
use crate::proto::EntryKind;
use crate::tree::{Changes, Item, Scope, Walker};

/// Walked items per batch at most while file data moves, and batches
/// ahead of the planner once the session is sending: together they bound
/// the items held ahead of the sender.
/// (Batches of 256 made a fresh copy of 100,000 entries 1.12x slower.)
const WALK_BATCH: usize = 32;
const WALK_BATCHES: usize = 4;
/// Walked items per batch at most while few of the files walked have
/// data sent (a re-sync of a tree that is mostly unchanged, where each
/// entry is decided in microseconds): the walking and planning threads
/// wake each other fewer times. Unchanged 100,000-entry local re-sync:
/// 0.90x the time of batches of 32 always (0.84-0.95, 10 paired runs),
/// with a fresh copy (which keeps 32) no slower.
const WALK_BATCH_QUIET: usize = 256;
/// How long walked items wait for a full batch. Handed over one by one
/// as soon as the planner had room, the entries of an unchanged tree
/// (decided in microseconds) went ten or so to a message; a millisecond
/// is nothing next to any file's data.
const WALK_HOLD: std::time::Duration = std::time::Duration::from_millis(1);
/// Items walked between two looks at the clock for [`WALK_HOLD`].
const CLOCK_EVERY: usize = 8;
/// Bytes of items (entries, names, attributes) the walk may be ahead
/// before its session sends, whatever the tree's size: about 100,000
/// items of the bench's tree.
const EARLY_BYTES: usize = 32 << 20;

/// How many walked items go in a batch: [`WALK_BATCH`] while file data
/// moves, [`WALK_BATCH_QUIET`] (at most an eighth of the window of files
/// asked about ahead, which bounds the open files) while at most one file
/// in 16 walked since the last batch had its data read. The count of
/// files with data comes from the planner and lags the walk (the answers
/// to files announced come later), so a batch's choice follows the
/// copy's recent past, not its exact present.
pub(super) struct BatchSize {
    quiet_limit: usize,
    /// Files with data when the last batch went.
    with_data: u64,
    quiet: bool,
}

impl BatchSize {
    /// A walk starts as a copy whose data moves.
    fn new(ask_ahead: usize) -> BatchSize {
        BatchSize {
            quiet_limit: (ask_ahead / 8).clamp(WALK_BATCH, WALK_BATCH_QUIET),
            with_data: 0,
            quiet: false,
        }
    }

    fn limit(&self) -> usize {
        if self.quiet {
            self.quiet_limit
        } else {
            WALK_BATCH
        }
    }

    /// A batch of `len` items went; `with_data` files have had their
    /// data read so far.
    fn sent(&mut self, len: usize, with_data: u64) {
        let since = with_data.saturating_sub(self.with_data);
        self.with_data = with_data;
        self.quiet = since.saturating_mul(16) <= len as u64;
    }
}

/// Walked items handed over and not yet taken, or a batch of them: how
/// many, the descriptors they hold open, and about the memory they take.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Lead {
    items: usize,
    fds: usize,
    bytes: usize,
}

impl Lead {
    /// A batch that holds `item` too.
    fn add(&mut self, item: &Item) {
        self.items += 1;
        // A directory's own descriptor (the items inside it hold it), a
        // file's if its attributes were read through it.
        self.fds += usize::from(item.entry.kind == EntryKind::Dir)
            + usize::from(item.file.as_ref().is_some_and(|f| f.is_open()));
        self.bytes += std::mem::size_of::<Item>()
            + 2 * item.entry.path.len()
            + item.entry.target.len()
            + item
                .xattrs
                .iter()
                .map(|x| std::mem::size_of_val(x) + x.name.len() + x.value.len())
                .sum::<usize>();
    }

    /// Whether `batch` fits beside this lead within `bounds`. With
    /// nothing ahead any batch fits: one batch alone is never held back
    /// (it could not get smaller by waiting).
    fn fits(&self, batch: Lead, bounds: Lead) -> bool {
        self.items == 0
            || (self.items + batch.items <= bounds.items
                && self.fds + batch.fds <= bounds.fds
                && self.bytes + batch.bytes <= bounds.bytes)
    }

    fn handed(&mut self, batch: Lead) {
        self.items += batch.items;
        self.fds += batch.fds;
        self.bytes += batch.bytes;
    }

    fn taken(&mut self, batch: Lead) {
        self.items -= batch.items;
        self.fds -= batch.fds;
        self.bytes -= batch.bytes;
    }
}

/// What the walking thread and the planner share.
struct Shared {
    state: Mutex<State>,
    /// Room was made, the session settled or the planner went away.
    changed: Condvar,
    fds: usize,
}

struct State {
    lead: Lead,
    /// The session does not send yet: the walk may go far ahead.
    early: bool,
    /// Nothing takes items any more (the copy stopped).
    closed: bool,
}

/// What a batch ready to go may do.
enum Room {
    Go,
    /// Not full yet and no room: it grows until it is full.
    NotNow,
    Closed,
}

impl Shared {
    /// Room for `batch`, `per_batch` the walk's batch size now; a full
    /// batch (`must`) waits for it.
    fn room(&self, batch: Lead, per_batch: usize, must: bool) -> Room {
        let mut st = self.state.lock().expect("walk lock");
        loop {
            if st.closed {
                return Room::Closed;
            }
            let bounds = if st.early {
                Lead {
                    items: usize::MAX,
                    fds: self.fds,
                    bytes: EARLY_BYTES,
                }
            } else {
                Lead {
                    items: WALK_BATCHES * per_batch,
                    fds: self.fds,
                    bytes: usize::MAX,
                }
            };
            if st.lead.fits(batch, bounds) {
                st.lead.handed(batch);
                return Room::Go;
            }
            if !must {
                return Room::NotNow;
            }
            st = self.changed.wait(st).expect("walk lock");
        }
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().expect("walk lock"));
        self.changed.notify_all();
    }
}

/// A batch of walked items (an error ends the walk) and what they hold.
type Batch = (Vec<anyhow::Result<Item>>, Lead);

/// A walk under way.
pub struct Walk {
    pub(super) items: Items,
    pub(super) thread: JoinHandle<()>,
    /// Files whose data is read so far (the planner counts them): the
    /// walk's batches grow while few are.
    pub(super) with_data: Arc<AtomicU64>,
    /// `--remove-source-files`: where the sources are, to remove them
    /// once copied.
    pub(super) origins: Option<super::Origins>,
}

impl std::fmt::Debug for Walk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Walk").finish_non_exhaustive()
    }
}

/// The planner's end of a walk.
pub(super) struct Items {
    rx: mpsc::UnboundedReceiver<Batch>,
    shared: Arc<Shared>,
}

impl Items {
    /// The next batch, which leaves the walk that much room.
    pub(super) async fn next(&mut self) -> Option<Vec<anyhow::Result<Item>>> {
        let (batch, held) = self.rx.recv().await?;
        self.shared.update(|st| st.lead.taken(held));
        Some(batch)
    }
}

impl Drop for Items {
    /// A walk waiting for room stops.
    fn drop(&mut self) {
        self.shared.update(|st| st.closed = true);
    }
}

impl Walk {
    /// Starts walking `sources` (with `recursive`, the archive metadata
    /// of `keep`, `filter`'s rules, `changes` (owners mapped, modes
    /// changed), and `scope`: `-x` and
    /// the symlinks followed) on a blocking thread; its items wait for
    /// the session (`Walk::settle`).
    pub fn start(
        sources: Sources,
        recursive: bool,
        keep: Keep,
        filter: &Arc<Filter>,
        changes: Changes,
        scope: Scope,
        helper: bool,
    ) -> Walk {
        let window = super::ask_ahead();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                lead: Lead::default(),
                early: true,
                closed: false,
            }),
            changed: Condvar::new(),
            fds: (window / 2).max(1),
        });
        let (tx, rx) = mpsc::unbounded_channel::<Batch>();
        let with_data = Arc::new(AtomicU64::new(0));
        let mut walk = Walker::new(recursive, keep, Arc::clone(filter));
        walk.change(changes);
        walk.one_file_system(scope.one_file_system);
        walk.symlinks(scope.symlinks);
        walk.prune_empty_dirs(scope.prune_empty_dirs);
        walk.ignore_missing_args(scope.ignore_missing_args);
        walk.copy_dirlinks(scope.copy_dirlinks);
        walk.with_helper(helper);
        let (walked_with_data, room) = (Arc::clone(&with_data), Arc::clone(&shared));
        let thread = tokio::task::spawn_blocking(move || {
            // The walk goes by descriptors (and absolute paths), so the
            // thread may stay in each directory while it reads the names
            // there.
            let _stay = rfabric::thread_dir::stay();
            let mut batch = Vec::new();
            let mut held = Lead::default();
            let mut first_at = std::time::Instant::now();
            let mut size = BatchSize::new(window);
            let mut emit = |item| {
                let limit = size.limit();
                if batch.is_empty() {
                    first_at = std::time::Instant::now();
                    batch.reserve(limit);
                }
                held.add(&item);
                batch.push(Ok(item));
                // (Past its first items, a batch reads the clock every few:
                // in an unchanged tree an item takes a microsecond or two.)
                let look = batch.len() < CLOCK_EVERY || batch.len() % CLOCK_EVERY == 0;
                if batch.len() < limit && (!look || first_at.elapsed() < WALK_HOLD) {
                    return Ok(());
                }
                let len = batch.len();
                match room.room(held, limit, len >= limit) {
                    Room::Go => {}
                    Room::NotNow => return Ok(()),
                    Room::Closed => anyhow::bail!("copy stopped"),
                }
                if tx.send((std::mem::take(&mut batch), held)).is_err() {
                    anyhow::bail!("copy stopped");
                }
                held = Lead::default();
                size.sent(len, walked_with_data.load(Ordering::Relaxed));
                Ok(())
            };
            let walked = match sources {
                Sources::Operands(sources) => sources.iter().try_for_each(|s| {
                    walk.by_path(s.disk.as_deref(), &s.top);
                    walk.walk(&s.parent, &s.name, &s.top, &mut emit)
                }),
                Sources::Listed { base, names, disk } => {
                    // (Only a user's own copy, which reaches files by
                    // path too, follows a symlink above a listed name.)
                    walk.follow_listed_dirlinks(disk.is_some());
                    walk.by_path(disk.map(|d| [&d[..], b"/"].concat()).as_deref(), b"");
                    walk.walk_listed(&base, &names, &mut emit)
                }
            };
            if let Err(e) = walked {
                held.items += 1;
                batch.push(Err(e));
            }
            if !batch.is_empty() && matches!(room.room(held, size.limit(), true), Room::Go) {
                let _ = tx.send((batch, held));
            }
        });
        Walk {
            items: Items { rx, shared },
            thread,
            with_data,
            origins: None,
        }
    }

    /// `--remove-source-files`: the walk's sources are where `origins`
    /// says, to be removed from there once copied.
    pub fn removing(self, origins: super::Origins) -> Walk {
        Walk {
            origins: Some(origins),
            ..self
        }
    }

    /// The session sends: from now on the walk stays as close ahead of
    /// the planner as [`WALK_BATCHES`] batches (what it is ahead already
    /// is taken first).
    pub(super) fn settle(&self) {
        self.items.shared.update(|st| st.early = false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_batches_grow_while_few_files_have_data_and_shrink_when_many_do() {
        let mut size = BatchSize::new(super::super::ASK_AHEAD);
        // A walk starts as a copy whose data moves.
        assert_eq!(size.limit(), WALK_BATCH);
        // 32 walked, none with data: an unchanged tree.
        size.sent(32, 0);
        assert_eq!(size.limit(), WALK_BATCH_QUIET);
        // One in 16 still counts as quiet (a 1% change is far below)...
        size.sent(256, 16);
        assert_eq!(size.limit(), WALK_BATCH_QUIET);
        // ...one more is not: a fresh copy's batches stay small.
        size.sent(256, 16 + 17);
        assert_eq!(size.limit(), WALK_BATCH);
        size.sent(32, 16 + 17 + 30);
        assert_eq!(size.limit(), WALK_BATCH);
        // Quiet again once the data stops.
        size.sent(32, 16 + 17 + 30);
        assert_eq!(size.limit(), WALK_BATCH_QUIET);
    }

    #[test]
    fn quiet_batches_stay_within_the_open_file_window() {
        // A low limit on open files: batches never grow past an eighth
        // of the window, nor below the usual size.
        let mut size = BatchSize::new(super::super::ASK_AHEAD_LEAST);
        size.sent(32, 0);
        assert_eq!(size.limit(), WALK_BATCH);
        let mut size = BatchSize::new(512);
        size.sent(32, 0);
        assert_eq!(size.limit(), 64);
    }

    fn lead(items: usize, fds: usize, bytes: usize) -> Lead {
        Lead { items, fds, bytes }
    }

    #[test]
    fn the_lead_stays_within_its_bounds_and_a_lone_batch_always_goes() {
        let bounds = lead(100, 4, 10_000);
        let mut ahead = Lead::default();
        // Nothing ahead: even a batch past every bound goes.
        assert!(ahead.fits(lead(500, 9, 90_000), bounds));
        ahead.handed(lead(60, 2, 6_000));
        assert!(ahead.fits(lead(40, 2, 4_000), bounds));
        assert!(!ahead.fits(lead(41, 0, 0), bounds));
        assert!(!ahead.fits(lead(1, 3, 0), bounds));
        assert!(!ahead.fits(lead(1, 0, 4_001), bounds));
        ahead.handed(lead(40, 2, 4_000));
        ahead.taken(lead(60, 2, 6_000));
        assert!(ahead.fits(lead(60, 2, 6_000), bounds));
        ahead.taken(lead(40, 2, 4_000));
        assert_eq!(ahead, Lead::default());
    }

    /// A seeded run of hand-overs and takes: the lead never passes its
    /// bounds unless it was empty, and what is handed is all taken.
    #[test]
    fn a_seeded_walk_and_planner_keep_the_lead_bounded() {
        let bounds = lead(1024, 16, 1 << 20);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n) as usize
        };
        let mut ahead = Lead::default();
        let mut queued: std::collections::VecDeque<Lead> = Default::default();
        let (mut handed, mut taken) = (0, 0);
        for _ in 0..100_000 {
            if next(2) == 0 {
                let batch = lead(1 + next(300), next(6), next(200_000));
                let was_empty = ahead == Lead::default();
                if ahead.fits(batch, bounds) {
                    ahead.handed(batch);
                    queued.push_back(batch);
                    handed += batch.items;
                    assert!(
                        was_empty
                            || (ahead.items <= bounds.items
                                && ahead.fds <= bounds.fds
                                && ahead.bytes <= bounds.bytes),
                        "{ahead:?}"
                    );
                }
            } else if let Some(batch) = queued.pop_front() {
                ahead.taken(batch);
                taken += batch.items;
            }
        }
        while let Some(batch) = queued.pop_front() {
            ahead.taken(batch);
            taken += batch.items;
        }
        assert_eq!(handed, taken);
        assert_eq!(ahead, Lead::default());
    }
}
