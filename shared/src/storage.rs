//! The storage engine: every file and block-device operation of both tools
//! (reads into pool buffers or onto vectors, writes from owned buffers or
//! landed chunks, syncs, `fallocate`, a commit's sync-then-rename) through
//! one interface, on one of two engines.
//!
//! * **Ownership.** An operation takes its buffer and the file it works on
//!   (an `Arc` of anything with an fd) and hands the buffer back with the
//!   result. A future dropped while the kernel or a pool thread still works
//!   on its operation leaves both with the operation, which lets go of
//!   them only when it is done: memory the kernel may still read or write
//!   is never freed or reused (a landed chunk keeps its slot, so its credit
//!   cannot go back early), and a file is never closed, nor its number
//!   reused for another, under an operation.
//! * **io_uring** (`uring`): submitted from the calling task; cached data
//!   is copied inline during submission, the rest completes on the
//!   kernel's workers and is reaped through an eventfd.
//! * **threads** (`threads`): a bounded process-wide pool doing the plain
//!   system calls of Linux 4.18, reads of cached data tried on the calling
//!   thread first (`RWF_NOWAIT`).
//! * **Choice** ([`select`]): `auto` probes io_uring once per process
//!   (setup, then `IORING_REGISTER_PROBE` for each opcode used) and uses
//!   threads when it is missing or refused, with the reason for the user.
//!   RHEL 8 and 9.0–9.2 kernels have no io_uring; 9.3+ and 10 refuse it by
//!   default: there the threads engine is what runs.
//!
//! Both engines pass one conformance suite (`shared/tests/storage_engines.rs`).

mod buf;
mod cachestat;
mod probe;
mod threads;
mod uring;
mod writeback;

use std::ffi::CString;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::oneshot;

pub use buf::IoBuf;
pub use cachestat::cached_pages;
pub use threads::pread_append;
pub use writeback::writeback_errors;

use crate::memory::{BufferPool, PoolBuf};
use threads::Threads;
use uring::Uring;

/// What the user asks for (`--io-engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum EngineChoice {
    /// io_uring where the kernel allows it, else threads.
    Auto,
    /// io_uring only (an error where the kernel refuses it).
    #[cfg_attr(feature = "clap", value(name = "io_uring"))]
    IoUring,
    /// A pool of threads doing plain system calls (any kernel).
    Threads,
}

impl EngineChoice {
    /// The name users type.
    pub fn name(self) -> &'static str {
        match self {
            EngineChoice::Auto => "auto",
            EngineChoice::IoUring => "io_uring",
            EngineChoice::Threads => "threads",
        }
    }
}

/// The engine a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    IoUring,
    Threads,
}

impl Kind {
    /// The name users see (`--json`'s `io_engine`, start-up lines).
    pub fn name(self) -> &'static str {
        match self {
            Kind::IoUring => "io_uring",
            Kind::Threads => "threads",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The engine [`select`] chose, and why not io_uring when `auto` fell back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub kind: Kind,
    pub fallback: Option<String>,
}

impl Selection {
    /// The one line a tool prints when `auto` did not get io_uring.
    pub fn notice(&self, tool: &str) -> Option<String> {
        self.fallback_note().map(|note| format!("{tool}: {note}"))
    }

    /// The same without the tool's name (for a log line that has it).
    pub fn fallback_note(&self) -> Option<String> {
        self.fallback.as_ref().map(|why| {
            format!(
                "using the threads storage engine: {why}. \
                 To allow io_uring see \"io_uring on RHEL\" in the README \
                 (or pass --io-engine threads to silence this)"
            )
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(
        "--io-engine io_uring: {0}; use --io-engine auto or threads, or allow \
         io_uring (see \"io_uring on RHEL\" in the README)"
    )]
    UringRefused(String),
}

/// Whether io_uring is usable in this process (probed on the first call).
fn uring_here() -> Result<(), String> {
    static PROBED: OnceLock<Result<(), String>> = OnceLock::new();
    PROBED.get_or_init(probe::uring_usable).clone()
}

/// Chooses the engine for `choice`: io_uring is probed once per process.
pub fn select(choice: EngineChoice) -> Result<Selection, StorageError> {
    let threads = |fallback| Selection {
        kind: Kind::Threads,
        fallback,
    };
    match choice {
        EngineChoice::Threads => Ok(threads(None)),
        EngineChoice::IoUring => uring_here()
            .map(|()| Selection {
                kind: Kind::IoUring,
                fallback: None,
            })
            .map_err(StorageError::UringRefused),
        EngineChoice::Auto => Ok(match uring_here() {
            Ok(()) => Selection {
                kind: Kind::IoUring,
                fallback: None,
            },
            Err(why) => threads(Some(why)),
        }),
    }
}

/// What carries one operation (see [`Engine::exec`]).
enum Exec<'a> {
    Ring(Uring),
    Pool(&'a Threads),
}

/// `[at, at + len)` cut to what fits in `total` bytes: the range an
/// engine is handed, so that it never has to check it again.
fn within(total: usize, at: usize, len: usize) -> (usize, usize) {
    let at = at.min(total);
    (at, len.min(total - at))
}

/// A file an operation keeps open until it is done.
type Held = Arc<dyn AsFd + Send + Sync>;

fn held<F: AsFd + Send + Sync + 'static>(file: &Arc<F>) -> Held {
    Arc::clone(file) as Held
}

/// What a write hands back.
#[derive(Debug)]
pub struct Written<B> {
    pub buf: B,
    pub result: std::io::Result<usize>,
    /// It completed while it was being submitted (io_uring): no worker
    /// thread, the kernel's or ours, was involved.
    pub inline: bool,
}

/// A read started by [`Engine::read_append_many`]; cached data has usually
/// been copied by the time it is handed out (io_uring).
#[derive(Debug)]
pub struct Appending {
    rx: oneshot::Receiver<(Vec<u8>, std::io::Result<usize>)>,
}

impl Appending {
    /// The buffer and the bytes read if the read has completed, else the
    /// read still under way.
    pub fn try_finish(mut self) -> Result<(Vec<u8>, std::io::Result<usize>), Appending> {
        self.rx.try_recv().map_err(|_| self)
    }

    /// The buffer and the bytes read, once the read has completed.
    pub async fn finish(self) -> (Vec<u8>, std::io::Result<usize>) {
        self.rx.await.expect("every operation is answered")
    }
}

/// Buffered (not durable) writes up to this size may be done on the
/// calling thread (see [`Engine::write_now`]).
pub const INLINE_WRITE: usize = 256 * 1024;

/// Small buffered writes in a row that io_uring hands to its kernel workers
/// before the engine does such writes itself.
const PUNTS_TO_SWITCH: u32 = 64;

/// A handle to a storage engine; clone freely. Needs a tokio runtime.
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Inner,
    small_writes: Arc<SmallWrites>,
}

/// How the io_uring engine does small buffered writes. Where the
/// filesystem cannot write to the page cache without blocking (ext4 and
/// tmpfs on the kernels tested here), the ring hands every write to one of
/// its kernel workers: the same copy, plus two thread hops. After
/// [`PUNTS_TO_SWITCH`] such hand-offs in a row the engine writes small
/// buffered writes with `pwrite` on the calling thread instead (as the
/// threads engine always does).
#[derive(Debug, Default)]
struct SmallWrites {
    here: AtomicBool,
    punted_in_a_row: AtomicU32,
}

impl SmallWrites {
    fn note(&self, inline: bool) {
        if inline {
            self.punted_in_a_row.store(0, Ordering::Relaxed);
        } else if self.punted_in_a_row.fetch_add(1, Ordering::Relaxed) + 1 >= PUNTS_TO_SWITCH {
            self.here.store(true, Ordering::Relaxed);
        }
    }
}

#[derive(Debug, Clone)]
enum Inner {
    /// One ring of its own.
    Ring(Uring),
    /// The ring of whichever runtime thread submits.
    ThreadRings,
    Threads(Threads),
}

impl Engine {
    /// An engine of `kind` with a ring of its own (io_uring), whose fixed
    /// buffers are `fixed`'s once enough was read into them (reads into
    /// them then skip the kernel's page pinning).
    pub fn start(kind: Kind, fixed: Option<&Arc<BufferPool>>) -> std::io::Result<Engine> {
        let inner = match kind {
            Kind::IoUring => Inner::Ring(Uring::start(fixed)?),
            Kind::Threads => Inner::Threads(Threads::start()),
        };
        Ok(Engine::with(inner))
    }

    /// An engine of `kind` for servers whose tasks run on every runtime
    /// thread: with io_uring each thread submits to a ring of its own, made
    /// on first use, so tasks never wait for each other's inline copies.
    /// The calling thread's ring is made now, to report a failure here.
    pub fn per_thread(kind: Kind) -> std::io::Result<Engine> {
        let inner = match kind {
            Kind::IoUring => {
                Uring::local()?;
                Inner::ThreadRings
            }
            Kind::Threads => Inner::Threads(Threads::start()),
        };
        Ok(Engine::with(inner))
    }

    fn with(inner: Inner) -> Engine {
        Engine {
            inner,
            small_writes: Arc::default(),
        }
    }

    /// Small buffered writes are done on the calling thread (always on the
    /// threads engine; on io_uring once the ring kept handing them to its
    /// workers).
    pub fn writes_small_here(&self) -> bool {
        match self.inner {
            Inner::Threads(_) => true,
            _ => self.small_writes.here.load(Ordering::Relaxed),
        }
    }

    /// Writes `data` (a borrowed slice: nothing is in flight after this
    /// returns) at `offset` right here, if it is a write this engine does
    /// on the calling thread anyway: buffered, at most [`INLINE_WRITE`],
    /// and [`Engine::writes_small_here`]. None if it has to go through
    /// [`Engine::write`]. A short count is not an error.
    pub fn write_now(
        &self,
        file: &impl AsFd,
        offset: u64,
        data: &[u8],
    ) -> Option<std::io::Result<usize>> {
        if data.len() > INLINE_WRITE {
            return None;
        }
        match &self.inner {
            Inner::Threads(t) => t.write_here(file.as_fd(), data, offset),
            _ if self.small_writes.here.load(Ordering::Relaxed) => {
                match rustix::io::pwrite(file, data, offset) {
                    Err(rustix::io::Errno::INTR) => None,
                    r => Some(r.map_err(Into::into)),
                }
            }
            _ => None,
        }
    }

    pub fn kind(&self) -> Kind {
        match self.inner {
            Inner::Ring(_) | Inner::ThreadRings => Kind::IoUring,
            Inner::Threads(_) => Kind::Threads,
        }
    }

    /// Threads of the threads engine's pool (starting it), for reports.
    pub fn pool_threads() -> usize {
        threads::pool_size()
    }

    /// A handle on the same engine (the same rings or pool) that learns on
    /// its own how a file behaves (whether `RWF_NOWAIT` works, whether the
    /// ring hands small writes to its workers): for a file that may live
    /// on another filesystem than the others'.
    pub fn for_another_file(&self) -> Engine {
        let inner = match &self.inner {
            Inner::Threads(_) => Inner::Threads(Threads::start()),
            other => other.clone(),
        };
        Engine::with(inner)
    }

    /// What carries this call's operation: a ring (this engine's own, or
    /// the calling thread's, made on first use) or the pool.
    fn exec(&self) -> std::io::Result<Exec<'_>> {
        match &self.inner {
            Inner::Ring(r) => Ok(Exec::Ring(r.clone())),
            Inner::ThreadRings => Uring::local().map(Exec::Ring),
            Inner::Threads(t) => Ok(Exec::Pool(t)),
        }
    }

    /// Reads up to `len` bytes at file `offset` into `buf` from byte `at`
    /// of the buffer on (the buffer's length is the caller's to set). A
    /// short count is not an error; 0 is the end of the file.
    pub async fn read<F: AsFd + Send + Sync + 'static>(
        &self,
        file: &Arc<F>,
        offset: u64,
        buf: PoolBuf,
        at: usize,
        len: usize,
    ) -> (PoolBuf, std::io::Result<usize>) {
        let (at, len) = within(buf.capacity(), at, len);
        match self.exec() {
            Ok(Exec::Pool(t)) => t.read(held(file), offset, buf, at, len).await,
            Ok(Exec::Ring(r)) => r.read(held(file), offset, buf, at, len).await,
            Err(e) => (buf, Err(e)),
        }
    }

    /// Reads up to `len` bytes at file `offset` and appends them to `buf`
    /// (into room reserved here, never zeroed first).
    pub async fn read_append<F: AsFd + Send + Sync + 'static>(
        &self,
        file: &Arc<F>,
        offset: u64,
        buf: Vec<u8>,
        len: usize,
    ) -> (Vec<u8>, std::io::Result<usize>) {
        let mut started = self.read_append_many(file, vec![(offset, buf, len)]).await;
        started.pop().expect("one read, one result").finish().await
    }

    /// [`Engine::read_append`] for each `(offset, buf, len)`, all started
    /// at once: with io_uring one entry into the kernel for the lot (a
    /// burst of cached reads costs one system call), with threads as many
    /// at a time as the pool has threads free.
    pub async fn read_append_many<F: AsFd + Send + Sync + 'static>(
        &self,
        file: &Arc<F>,
        reads: Vec<(u64, Vec<u8>, usize)>,
    ) -> Vec<Appending> {
        match self.exec() {
            Ok(Exec::Pool(t)) => t.read_append_many(held(file), reads),
            Ok(Exec::Ring(r)) => r.read_append_many(held(file), reads).await,
            Err(e) => reads
                .into_iter()
                .map(|(_, buf, _)| {
                    let (tx, rx) = oneshot::channel();
                    let _ = tx.send((buf, Err(std::io::Error::new(e.kind(), e.to_string()))));
                    Appending { rx }
                })
                .collect(),
        }
    }

    /// Writes `buf.io_bytes()[at..at+len]` at file `offset`; with
    /// `durable`, the data (and what is needed to read it back) is on
    /// stable storage when this completes (`RWF_DSYNC`, the FUA of NBD).
    /// A short count is not an error.
    pub async fn write<F: AsFd + Send + Sync + 'static, B: IoBuf>(
        &self,
        file: &Arc<F>,
        offset: u64,
        buf: B,
        at: usize,
        len: usize,
        durable: bool,
    ) -> Written<B> {
        let (at, len) = within(buf.io_bytes().len(), at, len);
        let small = !durable && len <= INLINE_WRITE;
        if small
            && let Some(result) = self.write_now(&**file, offset, &buf.io_bytes()[at..at + len])
        {
            return Written {
                buf,
                result,
                inline: true,
            };
        }
        match self.exec() {
            Ok(Exec::Pool(t)) => t.write(held(file), offset, buf, at, len, durable).await,
            Ok(Exec::Ring(r)) => {
                let w = r.write(held(file), offset, buf, at, len, durable).await;
                if small {
                    self.small_writes.note(w.inline);
                }
                w
            }
            Err(e) => Written {
                buf,
                result: Err(e),
                inline: false,
            },
        }
    }

    /// Writes all of `buf.io_bytes()[at..at+len]` at `offset` (retrying
    /// short writes; a device that takes nothing is `ENOSPC`).
    pub async fn write_all<F: AsFd + Send + Sync + 'static, B: IoBuf>(
        &self,
        file: &Arc<F>,
        offset: u64,
        mut buf: B,
        at: usize,
        len: usize,
        durable: bool,
    ) -> (B, std::io::Result<()>) {
        let mut done = 0;
        while done < len {
            let w = self
                .write(
                    file,
                    offset + done as u64,
                    buf,
                    at + done,
                    len - done,
                    durable,
                )
                .await;
            buf = w.buf;
            match w.result {
                Ok(0) => return (buf, Err(std::io::Error::from_raw_os_error(libc::ENOSPC))),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return (buf, Err(e)),
            }
        }
        (buf, Ok(()))
    }

    /// `fdatasync` (or `fsync`, for directories and metadata, without
    /// `data_only`).
    pub async fn sync<F: AsFd + Send + Sync + 'static>(
        &self,
        file: &Arc<F>,
        data_only: bool,
    ) -> std::io::Result<()> {
        match self.exec()? {
            Exec::Pool(t) => t.sync(held(file), data_only).await,
            Exec::Ring(r) => r.sync(held(file), data_only).await,
        }
    }

    /// `fallocate(fd, mode, offset, len)` (`FALLOC_FL_*` modes).
    pub async fn fallocate<F: AsFd + Send + Sync + 'static>(
        &self,
        file: &Arc<F>,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> std::io::Result<()> {
        match self.exec()? {
            Exec::Pool(t) => t.fallocate(held(file), mode, offset, len).await,
            Exec::Ring(r) => r.fallocate(held(file), mode, offset, len).await,
        }
    }

    /// A file's commit: `fdatasync(file)`, then (only if that succeeded)
    /// the rename of `from` to `to`, both in directory `dir`, with no
    /// thread of the caller's blocked on the disk.
    pub async fn sync_and_rename<F, D>(
        &self,
        file: &Arc<F>,
        dir: &Arc<D>,
        from: CString,
        to: CString,
    ) -> std::io::Result<()>
    where
        F: AsFd + Send + Sync + 'static,
        D: AsFd + Send + Sync + 'static,
    {
        let (synced, renamed) = match self.exec()? {
            Exec::Pool(t) => t.sync_and_rename(held(file), held(dir), from, to).await,
            Exec::Ring(r) => r.sync_and_rename(held(file), held(dir), from, to).await,
        };
        let explain = |what: &str, e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("cannot {what}: {e}"))
        };
        synced.map_err(|e| explain("sync the data to disk", e))?;
        renamed.map_err(|e| explain("rename into place", e))?;
        Ok(())
    }
}
