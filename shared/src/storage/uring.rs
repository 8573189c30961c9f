//! The io_uring engine: reads into registered pool buffers (fixed buffers)
//! or owned vectors, writes from any owned buffer (optionally durable),
//! data syncs, renames, fallocate; many in flight.
//!
//! Submission happens on the calling task: it pushes the entry, enters the
//! kernel without waiting, and reaps whatever completed. Reads and writes of
//! cached data complete right there, so the caller's answer is ready before
//! it awaits it and no thread is woken. What the kernel finishes later (disk
//! I/O, syncs and renames, which it runs on its own workers) is announced on
//! an eventfd that a reaper task watches. The eventfd stays quiet while a
//! submitter reaps (`IORING_CQ_EVENTFD_DISABLED`), so inline completions
//! cost no wake-up either.
//!
//! Every entry travels with a completion that owns what the entry points
//! at (the buffer, the file, the names): the ring keeps it until the kernel
//! has answered, so a caller that stops waiting releases nothing early.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use io_uring::{IoUring, opcode, squeue, types};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Semaphore, oneshot};

use super::{Appending, Held, IoBuf, Written};
use crate::memory::{BufferPool, PoolBuf};

/// Operations in flight at most (the completion queue holds twice this, so
/// it never overflows).
const DEPTH: u32 = 64;

/// Called with the kernel's answer once the operation is done; owns
/// whatever the entry points at until then.
type Completion = Box<dyn FnOnce(std::io::Result<usize>) + Send>;

/// Handle to one ring; clone freely. Needs a tokio runtime to start.
#[derive(Clone, Debug)]
pub(crate) struct Uring {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// One permit per operation that may still go in flight.
    room: Semaphore,
    /// Signalled by the kernel for completions nobody reaped inline.
    eventfd: OwnedFd,
    /// The pool whose buffers become this ring's fixed buffers once
    /// enough was read into them ([`REGISTER_AFTER`]).
    pool: Option<Arc<BufferPool>>,
    /// Once registration was tried: whether the kernel took the pool
    /// (not where `RLIMIT_MEMLOCK` is below it).
    fixed: OnceLock<bool>,
    /// Bytes read into the pool's buffers while they were not fixed.
    read_unfixed: AtomicU64,
}

/// The pool is registered once this many times its size was read into it.
///
/// Registering pins every page of the pool, and so first faults in the
/// pages no read touched yet: a 16 MiB pool cost 10 ms of a core at the
/// start of every copy (`perf`), before its session could send a byte. A
/// re-sync that sends little or nothing reads into the same few buffers
/// (the pool hands back the last one freed), through unregistered reads
/// as correct as fixed ones (the kernel pins a read's own pages). So the
/// pool is registered once a copy's data has shown itself large enough
/// for fixed reads to pay.
const REGISTER_AFTER: u64 = 2;

struct State {
    ring: IoUring,
    waiting: Vec<Option<Completion>>,
    free: Vec<usize>,
    in_flight: usize,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

/// The file as the kernel names it, and the handle that keeps it open.
fn fd_of(file: &Held) -> types::Fd {
    types::Fd(file.as_fd().as_raw_fd())
}

impl Uring {
    /// Sets up a ring; `pool`'s buffers become its fixed buffers once
    /// enough was read into them ([`REGISTER_AFTER`]), where the kernel
    /// takes them.
    ///
    /// Fixed buffers are pinned, and the pages are counted against the
    /// user's `RLIMIT_MEMLOCK` unless the process has `CAP_IPC_LOCK`: an
    /// unprivileged user's limit (8 MiB on Debian 12, 64 KiB on RHEL 8
    /// and 9) is below a copy's pool (up to 64 MiB), and the kernel says
    /// `ENOMEM`. Reads into an unregistered buffer are as correct (the
    /// kernel pins the pages of each read for its length instead), so the
    /// ring then runs without them rather than fail the copy.
    pub(crate) fn start(pool: Option<&Arc<BufferPool>>) -> std::io::Result<Uring> {
        let ring = IoUring::new(DEPTH)?;
        let eventfd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        // SAFETY: the registered fd is an `OwnedFd` the AsyncFd owns: it
        // stays open and unchanged while registered.
        let watch = unsafe {
            AsyncFd::register_with_interest(rustix::io::dup(&eventfd)?, Interest::READABLE)
        }?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                ring,
                waiting: Vec::new(),
                free: Vec::new(),
                in_flight: 0,
            }),
            room: Semaphore::new(DEPTH as usize),
            eventfd,
            pool: pool.cloned(),
            fixed: OnceLock::new(),
            read_unfixed: AtomicU64::new(0),
        });
        tokio::spawn(reap_announced(watch, Arc::downgrade(&shared)));
        Ok(Uring { shared })
    }

    /// This thread's own ring, made on first use (inside a tokio runtime).
    /// The kernel runs cached reads and writes inline while submitting,
    /// under the ring's lock: tasks on different threads that each use
    /// their thread's ring never wait for each other's copies.
    pub(crate) fn local() -> std::io::Result<Uring> {
        thread_local! {
            static LOCAL: std::cell::OnceCell<Uring> = const { std::cell::OnceCell::new() };
        }
        LOCAL.with(|cell| {
            if let Some(u) = cell.get() {
                return Ok(u.clone());
            }
            let u = Uring::start(None)?;
            let _ = cell.set(u.clone());
            Ok(u)
        })
    }

    /// Reads up to `len` bytes at file `offset` into `buf` from byte `at`
    /// of the buffer on (a fixed-buffer read when `buf` is of the ring's
    /// pool). The range is within the buffer: [`super::Engine`] cuts it.
    pub(crate) async fn read(
        &self,
        file: Held,
        offset: u64,
        mut buf: PoolBuf,
        at: usize,
        len: usize,
    ) -> (PoolBuf, std::io::Result<usize>) {
        let len = len.min(u32::MAX as usize) as u32;
        // A registered buffer by its index (which io_uring counts in 16
        // bits: any beyond that is read like another pool's).
        let fixed = self
            .is_fixed(&buf, len)
            .then(|| u16::try_from(buf.index()).ok())
            .flatten();
        // SAFETY: `at` is within the buffer (the engine's caller cut the
        // range to it).
        let dst = unsafe { buf.as_mut_ptr().add(at) };
        let sqe = if let Some(index) = fixed {
            opcode::ReadFixed::new(fd_of(&file), dst, len, index)
                .offset(offset)
                .build()
        } else {
            opcode::Read::new(fd_of(&file), dst, len)
                .offset(offset)
                .build()
        };
        let (reply, rx) = oneshot::channel();
        let done: Completion = Box::new(move |result| {
            drop(file);
            let _ = reply.send((buf, result));
        });
        // SAFETY: the buffer and the file travel with the completion, which
        // the ring keeps until the kernel has answered.
        unsafe { self.submit_one(sqe, done) }.await;
        rx.await.expect("every operation is answered")
    }

    /// Whether `buf`, about to take a read of `len` bytes, is one of the
    /// ring's fixed buffers; the pool is registered here, once, when
    /// enough was read into it ([`REGISTER_AFTER`]).
    fn is_fixed(&self, buf: &PoolBuf, len: u32) -> bool {
        let shared = &*self.shared;
        let Some(pool) = shared.pool.as_ref().filter(|p| Arc::ptr_eq(p, buf.pool())) else {
            return false;
        };
        if let Some(&fixed) = shared.fixed.get() {
            return fixed;
        }
        let read = shared
            .read_unfixed
            .fetch_add(u64::from(len), Ordering::Relaxed);
        let size = (pool.count() * pool.buffer_size()) as u64;
        if read < size.saturating_mul(REGISTER_AFTER) {
            return false;
        }
        // (Other reads that get here meanwhile wait for this answer.)
        *shared.fixed.get_or_init(|| {
            let state = shared.state.lock().expect("ring lock");
            // SAFETY: the pool's memory lives as long as the ring (`pool`
            // holds the `Arc`), and buffers are handed to the kernel only
            // with an exclusive lease kept until completion.
            let registered = unsafe { state.ring.submitter().register_buffers(&pool.iovecs()) };
            registered
                .inspect_err(|e| {
                    tracing::debug!(
                        "io_uring: fixed buffers refused ({e}); reading into unregistered ones"
                    );
                })
                .is_ok()
        })
    }

    /// Reads appended to vectors (see [`super::Engine::read_append_many`]),
    /// entering the kernel once per ring's depth.
    pub(crate) async fn read_append_many(
        &self,
        file: Held,
        reads: Vec<(u64, Vec<u8>, usize)>,
    ) -> Vec<Appending> {
        let mut started = Vec::with_capacity(reads.len());
        let mut reads = reads.into_iter().peekable();
        while reads.peek().is_some() {
            let mut ops = Vec::new();
            for (offset, mut buf, len) in reads.by_ref().take(DEPTH as usize) {
                let len = len.min(u32::MAX as usize);
                buf.reserve(len);
                let start = buf.len();
                let ptr = buf.spare_capacity_mut().as_mut_ptr().cast::<u8>();
                let sqe = opcode::Read::new(fd_of(&file), ptr, len as u32)
                    .offset(offset)
                    .build();
                let (reply, rx) = oneshot::channel();
                let file = Arc::clone(&file);
                let done: Completion = Box::new(move |result| {
                    drop(file);
                    if let Ok(n) = result {
                        // SAFETY: the kernel wrote `n` bytes (at most the
                        // length asked for) right after `start`, into
                        // capacity reserved for them.
                        unsafe { buf.set_len(start + n) };
                    }
                    let _ = reply.send((buf, result));
                });
                ops.push((sqe, done));
                started.push(Appending { rx });
            }
            let permits = self
                .shared
                .room
                .acquire_many(ops.len() as u32)
                .await
                .expect("never closed");
            // Given back by the reaper as the completions come.
            permits.forget();
            // SAFETY: each entry points into the spare capacity of the
            // buffer its completion owns (a Vec's heap memory does not move
            // with it), and the completion keeps the file open.
            unsafe { self.shared.submit(ops) };
        }
        started
    }

    /// Writes `buf.io_bytes()[at..at+len]` (within the buffer:
    /// [`super::Engine`] cuts the range) at file `offset`; with `durable`,
    /// on stable storage when it completes (`RWF_DSYNC`).
    pub(crate) async fn write<B: IoBuf>(
        &self,
        file: Held,
        offset: u64,
        buf: B,
        at: usize,
        len: usize,
        durable: bool,
    ) -> Written<B> {
        let bytes = buf.io_bytes();
        let len = len.min(u32::MAX as usize) as u32;
        let flags = if durable { libc::RWF_DSYNC } else { 0 };
        let sqe = opcode::Write::new(fd_of(&file), bytes[at..].as_ptr(), len)
            .offset(offset)
            .rw_flags(flags)
            .build();
        let (reply, rx) = oneshot::channel();
        let done: Completion = Box::new(move |result| {
            drop(file);
            let _ = reply.send((buf, result));
        });
        // SAFETY: the bytes belong to `buf` (an `IoBuf`: they stay put when
        // it moves), which the completion owns with the file.
        let inline = unsafe { self.submit_one(sqe, done) }.await;
        let (buf, result) = rx.await.expect("every operation is answered");
        Written {
            buf,
            result,
            inline,
        }
    }

    /// `fdatasync` (or `fsync` without `data_only`).
    pub(crate) async fn sync(&self, file: Held, data_only: bool) -> std::io::Result<()> {
        let flags = if data_only {
            types::FsyncFlags::DATASYNC
        } else {
            types::FsyncFlags::empty()
        };
        let sqe = opcode::Fsync::new(fd_of(&file)).flags(flags).build();
        self.keeping(sqe, file).await.map(drop)
    }

    /// `fallocate(fd, mode, offset, len)`.
    pub(crate) async fn fallocate(
        &self,
        file: Held,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> std::io::Result<()> {
        let sqe = opcode::Fallocate::new(fd_of(&file), len)
            .offset(offset)
            .mode(mode)
            .build();
        self.keeping(sqe, file).await.map(drop)
    }

    /// `fdatasync`, then (only if that succeeded, a linked entry) the
    /// rename of `from` to `to` in `dir`.
    pub(crate) async fn sync_and_rename(
        &self,
        file: Held,
        dir: Held,
        from: CString,
        to: CString,
    ) -> (std::io::Result<()>, std::io::Result<()>) {
        let sync = opcode::Fsync::new(fd_of(&file))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .flags(squeue::Flags::IO_LINK);
        let rename =
            opcode::RenameAt::new(fd_of(&dir), from.as_ptr(), fd_of(&dir), to.as_ptr()).build();
        let (tx1, rx1) = oneshot::channel();
        let (tx2, rx2) = oneshot::channel();
        let synced: Completion = Box::new(move |r| {
            drop(file);
            let _ = tx1.send(r);
        });
        let renamed: Completion = Box::new(move |r| {
            drop((dir, from, to));
            let _ = tx2.send(r);
        });
        let permits = self
            .shared
            .room
            .acquire_many(2)
            .await
            .expect("never closed");
        permits.forget();
        // SAFETY: the names (heap memory that does not move with the
        // CStrings) and both files travel with the completions.
        unsafe { self.shared.submit(vec![(sync, synced), (rename, renamed)]) };
        let synced = rx1.await.expect("every operation is answered");
        let renamed = rx2.await.expect("every operation is answered");
        (synced.map(drop), renamed.map(drop))
    }

    /// An entry that points at nothing but the file, which it keeps open.
    async fn keeping(&self, sqe: squeue::Entry, file: Held) -> std::io::Result<usize> {
        let (reply, rx) = oneshot::channel();
        let done: Completion = Box::new(move |result| {
            drop(file);
            let _ = reply.send(result);
        });
        // SAFETY: the entry points at no memory; the completion keeps the
        // file open.
        unsafe { self.submit_one(sqe, done) }.await;
        rx.await.expect("every operation is answered")
    }

    /// Waits for room in the ring, then submits `sqe`; true if it completed
    /// during its submission.
    ///
    /// # Safety
    /// As for [`Shared::submit`].
    async unsafe fn submit_one(&self, sqe: squeue::Entry, done: Completion) -> bool {
        let permit = self.shared.room.acquire().await.expect("never closed");
        // Given back by the reaper when the completion comes.
        permit.forget();
        // SAFETY: passed on from the caller.
        unsafe { self.shared.submit(vec![(sqe, done)]) }
    }
}

impl Shared {
    /// Pushes `ops` (a permit each taken already), enters the kernel, reaps;
    /// true if all of them completed within this call (none went to the
    /// kernel's worker threads or waits for a device).
    ///
    /// # Safety
    /// Whatever an entry points at stays valid until its completion is
    /// called (the completion owns it).
    unsafe fn submit(&self, ops: Vec<(squeue::Entry, Completion)>) -> bool {
        let mut st = self.state.lock().expect("ring lock");
        let st = &mut *st;
        // Completions posted while we reap ourselves need no signal.
        st.ring.completion().disable_eventfd();
        let mut slots = Vec::with_capacity(ops.len());
        for (sqe, done) in ops {
            let slot = st.free.pop().unwrap_or_else(|| {
                st.waiting.push(None);
                st.waiting.len() - 1
            });
            st.waiting[slot] = Some(done);
            slots.push(slot);
            // SAFETY: the caller keeps the entry's memory valid until its
            // completion; at most DEPTH are in flight (permits), so the queue
            // has room.
            unsafe {
                st.ring
                    .submission()
                    .push(&sqe.user_data(slot as u64))
                    .expect("queue has room: in flight <= depth");
            }
            st.in_flight += 1;
        }
        loop {
            match st.ring.submit() {
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) =>
                {
                    // Out of kernel resources for a moment: make room, retry.
                    st.reap(&self.room);
                    std::thread::yield_now();
                }
                // The entries are in the shared queue and may be consumed by
                // any later entry into the kernel: nothing they point at may
                // be released, so there is no way to go on.
                Err(e) => panic!("io_uring_enter failed: {e}; the ring cannot be trusted"),
            }
        }
        st.reap(&self.room);
        // (Slots freed by that reap are not reused within this call.)
        let inline = slots.iter().all(|&s| st.waiting[s].is_none());
        st.ring.completion().enable_eventfd();
        // Anything completed between the reap and re-enabling sent no signal.
        st.reap(&self.room);
        inline
    }
}

impl State {
    fn reap(&mut self, room: &Semaphore) {
        let mut done = 0;
        for cqe in self.ring.completion() {
            let slot = cqe.user_data() as usize;
            let res = cqe.result();
            let result = if res < 0 {
                Err(std::io::Error::from_raw_os_error(-res))
            } else {
                Ok(res as usize)
            };
            if let Some(complete) = self.waiting[slot].take() {
                complete(result);
            }
            self.free.push(slot);
            done += 1;
        }
        self.in_flight -= done;
        room.add_permits(done);
    }
}

/// Reaps completions the kernel announces on the eventfd, until the ring
/// is gone.
async fn reap_announced(watch: AsyncFd<OwnedFd>, shared: Weak<Shared>) {
    loop {
        let Ok(mut ready) = watch.readable().await else {
            return;
        };
        let mut count = [0u8; 8];
        while rustix::io::read(watch.get_ref(), &mut count).is_ok() {}
        ready.clear_ready();
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.state.lock().expect("ring lock").reap(&shared.room);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Operations whose futures were dropped may still be running: what
        // they own is released only once they are done.
        let st = self.state.get_mut().expect("ring lock");
        while st.in_flight > 0 {
            if st.ring.submit_and_wait(1).is_err() {
                // The kernel may still use what they own: never free it.
                std::mem::forget(std::mem::take(&mut st.waiting));
                break;
            }
            st.reap(&self.room);
        }
        // Wake the reaper so that it sees the ring gone and ends.
        let _ = rustix::io::write(&self.eventfd, &1u64.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool's buffers become the ring's fixed buffers only once the
    /// reads into them add up to [`REGISTER_AFTER`] times the pool's size;
    /// every read lands the file's bytes, before and after.
    #[tokio::test]
    async fn the_pool_is_registered_once_enough_was_read_into_it() {
        if let Err(e) = crate::storage::probe::uring_usable() {
            eprintln!("not run: {e}");
            return;
        }
        let size = 4096;
        let pool = BufferPool::new(2, size).unwrap();
        let content: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let path = std::env::temp_dir().join(format!("rfabric-uring-fixed-{}", std::process::id()));
        std::fs::write(&path, &content).unwrap();
        let file: Held = Arc::new(std::fs::File::open(&path).unwrap());
        let ring = Uring::start(Some(&pool)).unwrap();
        let registered = || ring.shared.fixed.get() == Some(&true);
        // (Two buffers of 4 KiB: registered at the fifth read, once four
        // were read.)
        let reads_before = REGISTER_AFTER as usize * 2;
        for read in 0..reads_before + 2 {
            let registered = registered();
            let (mut buf, n) = ring
                .read(Arc::clone(&file), 0, pool.acquire().await, 0, size)
                .await;
            buf.set_len(n.unwrap());
            assert_eq!(buf.data(), &content[..], "read {read}");
            assert_eq!(registered, read > reads_before, "read {read}: registered");
        }
        // A fixed read from a byte inside the buffer on lands there.
        let mut buf = pool.acquire().await;
        buf.spare().fill(0xee);
        let (mut buf, n) = ring.read(Arc::clone(&file), 100, buf, 10, size - 10).await;
        let n = n.unwrap();
        assert_eq!(n, size - 100);
        buf.set_len(10 + n);
        assert_eq!(&buf.data()[..10], &[0xee; 10]);
        assert_eq!(&buf.data()[10..], &content[100..]);
        // A buffer of another pool is never read as a fixed one.
        let other = BufferPool::new(1, size).unwrap();
        let (mut buf, n) = ring
            .read(Arc::clone(&file), 0, other.acquire().await, 0, size)
            .await;
        buf.set_len(n.unwrap());
        assert_eq!(buf.data(), &content[..]);
        std::fs::remove_file(&path).unwrap();
    }
}
