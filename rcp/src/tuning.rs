//! From the command line's [`Tuning`] to a session's [`Params`]: the
//! storage engine is chosen here, once per process, and a fallback is said
//! once on stderr (each of `rcp`, `rcp serve` and the remote side chooses
//! its own).

use rfabric::storage::{self, Kind};

use crate::cli::Tuning;
use crate::session::Params;

/// The cores this process may use: its CPU affinity mask and its
/// cgroup's CPU quota (`cpu.max`) both count (`available_parallelism`
/// reads them), so a job confined to 4 CPUs of a 64-core node gets 4.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// The runtime's worker threads of `rcp serve`, which serves sessions side
/// by side: the links, the storage completions and the protocol of each.
pub fn workers(cores: usize) -> usize {
    cores.clamp(2, 8)
}

/// The runtime's worker threads of one end of one copy (the client, and
/// the far side of remote-shell mode): one per connection it carries, up
/// to `cores`. Hashing and file work run on the blocking pool
/// ([`hashing_threads`]), so the workers only move messages and chunks;
/// tasks of one end that share a worker never wake each other across
/// threads. With one worker on each side instead of two, over ssh on
/// loopback, a 100,000-entry unchanged `-aHAX` re-sync took 0.85x the
/// time and a fresh copy of it 0.86x; a 1 GiB file 1.01x (paired runs).
pub fn copy_workers(streams: u32, cores: usize) -> usize {
    (streams as usize).clamp(1, cores.max(1))
}

/// Threads that hash chunks at once (the runtime's blocking pool): one a
/// core, so that digests spread over every core the process may use, and
/// two more for the tree walker and a slow call.
pub fn hashing_threads(cores: usize) -> usize {
    cores + 2
}

/// Chunks up to this size are hashed where they are, on the thread that
/// read or received them; larger ones on the blocking pool
/// ([`hashing_threads`]).
///
/// A hand-off costs more than hashing a small chunk. And the thread that
/// read or received a chunk has it in its core's cache; another thread
/// reads it again from memory. With many cores the pool's spread wins; on
/// two, both ends of a copy keep both cores busy already, and hashing in
/// place wins: a local copy of 1 GiB took 0.91-0.94x the CPU and
/// 0.93-0.98x the time with every chunk hashed in place (medians of three
/// sets of 12 paired runs, 2 cores).
pub fn hash_in_place_up_to(cores: usize) -> usize {
    if cores <= 2 { usize::MAX } else { 64 * 1024 }
}

/// [`hash_in_place_up_to`] for this process, worked out once.
pub fn hash_in_place() -> usize {
    static UP_TO: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *UP_TO.get_or_init(|| hash_in_place_up_to(cores()))
}

/// Raises the soft limit on open files to the hard one (at most 65536):
/// a copy holds up to `send::ask_ahead()` files open on each side, and a
/// local copy is both sides in one process, where RHEL's default soft
/// limit of 1024 is close. Failing to raise it is not an error.
pub fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let want = limit.maximum.map_or(65536, |max| max.min(65536));
    if limit.current.is_some_and(|cur| cur < want) {
        limit.current = Some(want);
        let _ = setrlimit(Resource::Nofile, limit);
    }
}

/// Open files this process's table is sized for at start
/// ([`size_file_table`]): more than a copy's window of files asked ahead
/// ([`crate::send::ASK_AHEAD`]) holds open on both sides.
const FILE_TABLE: u64 = 4096;

/// Sizes the kernel's table of this process's open files for the copy
/// ahead, while the process is still one thread: call it before the
/// runtime starts.
///
/// The table starts with room for 64 and doubles when a new descriptor
/// does not fit. In a process of several threads each doubling waits for
/// an RCU grace period (`synchronize_rcu` in `expand_files`, in RHEL 8's
/// kernel as in this one), and every thread that opens a file meanwhile
/// waits behind it. On these machines that was 10-17 ms of both cores
/// idle in each far side of a re-sync over ssh (`perf record -a`: the
/// checking threads' `open` in `synchronize_rcu_normal`). A process of
/// one thread grows its table without waiting. 4,096 descriptors take
/// 32 KiB of table. Failing (the limit is lower, or `/` cannot be
/// opened) only leaves the table to grow as before.
pub fn size_file_table() {
    use rustix::fs::{Mode, OFlags};
    use rustix::process::{Resource, getrlimit};
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(FILE_TABLE);
    let Ok(top) = i32::try_from(soft.min(FILE_TABLE).saturating_sub(1)) else {
        return;
    };
    if let Ok(root) = rustix::fs::open("/", OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) {
        // The lowest free descriptor from `top` up: the table must reach
        // it. Closed at once; the table keeps its size.
        let _ = rustix::io::fcntl_dupfd_cloexec(&root, top);
    }
}

/// Asks the kernel for no transparent huge pages in this process. Where
/// THP is `always` (RHEL's default, and these machines'), the allocator's
/// heap grows by 2 MiB pages, each zeroed whole at its first touch, and
/// given back and faulted in again as the heap breathes: on a 100,000-entry
/// unchanged local `-aHAX` re-sync that zeroing was 16-33% of the CPU
/// (perf: `clear_page_erms` under `do_huge_pmd_anonymous_page`). Without
/// huge pages: 0.94x the wall time (10 paired runs), half the peak memory
/// (29 against 57 MiB); a 1 GiB copy unchanged (1.00x). Where the kernel
/// refuses (a filter), the process runs as before.
pub fn no_huge_pages() {
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

/// The storage engine `--io-engine` asks for, probed once; when `auto`
/// cannot have io_uring it says so, once, on stderr, naming `tool`.
pub fn io_engine(t: &Tuning, tool: &str) -> anyhow::Result<Kind> {
    let chosen = storage::select(t.io_engine)?;
    if let Some(notice) = chosen.notice(tool) {
        eprintln!("{notice}");
    }
    Ok(chosen.kind)
}

/// A session's parameters from the tuning flags. `resume` starts off and
/// `streams` at one: only the copying client sets them; a server takes the
/// client's choice from its request.
pub fn params(
    t: &Tuning,
    io_engine: Kind,
    recursive: bool,
    preserve: crate::archive::Preserve,
    verify: bool,
) -> Params {
    Params {
        recursive,
        preserve,
        keep: crate::archive::Keep::default(),
        owners_allowed: true,
        verify,
        resume: false,
        policy: crate::resync::Policy::default(),
        delete: false,
        one_file_system: 0,
        symlinks: crate::tree::Symlinks::Keep,
        remove_sources: false,
        bwlimit: None,
        link_dests: std::sync::Arc::default(),
        extras: crate::proto::Extras::default(),
        dry_run: false,
        itemize: false,
        lines: crate::recv::Lines::Codes,
        filter: std::sync::Arc::default(),
        listed: None,
        chunk: t.chunk_size,
        window: t.window,
        streams: 1,
        io_engine,
        encrypt: t.encrypt,
        silence: (t.timeout > 0).then(|| std::time::Duration::from_secs(t.timeout)),
        // A server takes the client's; a client sets its own.
        digest: crate::digest::Algorithm::Sha256,
        owners: None,
        walk_helper: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_follow_the_cores_the_process_may_use() {
        assert_eq!((workers(1), hashing_threads(1)), (2, 3));
        assert_eq!((workers(4), hashing_threads(4)), (4, 6));
        assert_eq!((workers(64), hashing_threads(64)), (8, 66));
        assert!(cores() >= 1);
    }

    #[test]
    fn chunks_are_hashed_in_place_when_small_or_on_two_cores() {
        assert_eq!(hash_in_place_up_to(1), usize::MAX);
        assert_eq!(hash_in_place_up_to(2), usize::MAX);
        assert_eq!(hash_in_place_up_to(4), 64 * 1024);
        assert_eq!(hash_in_place_up_to(64), 64 * 1024);
    }
}
