//! io_uring for the tools' storage side: reads into registered pool
//! buffers (fixed buffers) or any memory, writes (optionally durable), data
//! syncs, renames, fallocate; many in flight.
//!
//! Submission happens on the calling task: it pushes the entry, enters the
//! kernel without waiting, and reaps whatever completed. Reads and writes of
//! cached data complete right there, so the caller's answer is ready before
//! it awaits it and no thread is woken. What the kernel finishes later (disk
//! I/O, syncs and renames, which it runs on its own workers) is announced on
//! an eventfd that a reaper task watches. The eventfd stays quiet while a
//! submitter reaps (`IORING_CQ_EVENTFD_DISABLED`), so inline completions
//! cost no wake-up either.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, Weak};

use io_uring::{IoUring, opcode, squeue, types};

use crate::memory::{BufferPool, PoolBuf};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Semaphore, oneshot};

/// Operations in flight at most (the completion queue holds twice this, so
/// it never overflows).
const DEPTH: u32 = 64;

/// What an operation on an owned buffer hands back.
#[derive(Debug)]
pub struct Finished {
    pub buf: Vec<u8>,
    pub result: std::io::Result<usize>,
    /// It completed while it was being submitted: no kernel worker thread
    /// was involved.
    pub inline: bool,
}

/// A read started by [`Uring::read_append_many`]; cached data has usually
/// been copied by the time it is handed out.
#[derive(Debug)]
pub struct Appending {
    /// The buffer's length before the read.
    start: usize,
    rx: oneshot::Receiver<(Vec<u8>, std::io::Result<usize>)>,
}

impl Appending {
    /// The buffer and the bytes read, if the read has completed.
    pub fn try_finish(&mut self) -> Option<(Vec<u8>, std::io::Result<usize>)> {
        let done = self.rx.try_recv().ok()?;
        Some(self.appended(done))
    }

    /// The buffer and the bytes read, once the read has completed.
    pub async fn finish(mut self) -> (Vec<u8>, std::io::Result<usize>) {
        let done = (&mut self.rx).await.expect("every operation is answered");
        self.appended(done)
    }

    fn appended(
        &self,
        (mut buf, result): (Vec<u8>, std::io::Result<usize>),
    ) -> (Vec<u8>, std::io::Result<usize>) {
        if let Ok(n) = result {
            // SAFETY: the kernel wrote `n` bytes (at most the length asked
            // for) right after `start`, into capacity reserved for them.
            unsafe { buf.set_len(self.start + n) };
        }
        (buf, result)
    }
}

/// Handle to one ring; clone freely. Needs a tokio runtime to start.
#[derive(Clone, Debug)]
pub struct Uring {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// One permit per operation that may still go in flight.
    room: Semaphore,
    /// Signalled by the kernel for completions nobody reaped inline.
    eventfd: OwnedFd,
}

struct State {
    ring: IoUring,
    waiting: Vec<Option<Waiting>>,
    free: Vec<usize>,
    in_flight: usize,
    /// The fixed buffers' memory stays registered as long as the ring.
    _pool: Option<Arc<BufferPool>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

enum Waiting {
    Read(PoolBuf, oneshot::Sender<(PoolBuf, std::io::Result<usize>)>),
    /// Memory the operation owns until it is done.
    Owned(Vec<u8>, oneshot::Sender<(Vec<u8>, std::io::Result<usize>)>),
    Done(oneshot::Sender<std::io::Result<usize>>),
}

impl Uring {
    /// Sets up a ring; `pool`'s buffers become its fixed buffers.
    pub fn start(pool: Option<&Arc<BufferPool>>) -> std::io::Result<Uring> {
        let ring = IoUring::new(DEPTH)?;
        if let Some(pool) = pool {
            // SAFETY: the pool's memory lives as long as the ring (the state
            // holds the `Arc`), and buffers are handed to the kernel only
            // with an exclusive lease kept until completion.
            unsafe { ring.submitter().register_buffers(&pool.iovecs())? };
        }
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
                _pool: pool.cloned(),
            }),
            room: Semaphore::new(DEPTH as usize),
            eventfd,
        });
        tokio::spawn(reap_announced(watch, Arc::downgrade(&shared)));
        Ok(Uring { shared })
    }

    /// This thread's own ring, made on first use (inside a tokio runtime).
    /// The kernel runs cached reads and writes inline while submitting,
    /// under the ring's lock: tasks on different threads that each use
    /// their thread's ring never wait for each other's copies.
    pub fn local() -> std::io::Result<Uring> {
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

    /// Reads up to `len` bytes at file `offset` into `buf` (a buffer of the
    /// pool given at start) from byte `at` of the buffer on. The caller keeps
    /// `fd` open until this returns.
    pub async fn read(
        &self,
        fd: RawFd,
        offset: u64,
        at: usize,
        len: usize,
        buf: PoolBuf,
    ) -> (PoolBuf, std::io::Result<usize>) {
        self.read_pool(fd, offset, at, len, buf, true).await
    }

    /// [`Uring::read`] into a buffer of any pool (not one registered with
    /// this ring).
    pub async fn read_any_pool(
        &self,
        fd: RawFd,
        offset: u64,
        at: usize,
        len: usize,
        buf: PoolBuf,
    ) -> (PoolBuf, std::io::Result<usize>) {
        self.read_pool(fd, offset, at, len, buf, false).await
    }

    async fn read_pool(
        &self,
        fd: RawFd,
        offset: u64,
        at: usize,
        len: usize,
        mut buf: PoolBuf,
        fixed: bool,
    ) -> (PoolBuf, std::io::Result<usize>) {
        let sqe = {
            let at = at.min(buf.capacity());
            let len = len.min(buf.capacity() - at) as u32;
            // SAFETY: `at` is within the buffer (clamped above).
            let dst = unsafe { buf.as_mut_ptr().add(at) };
            if fixed {
                opcode::ReadFixed::new(types::Fd(fd), dst, len, buf.index() as u16)
                    .offset(offset)
                    .build()
            } else {
                opcode::Read::new(types::Fd(fd), dst, len)
                    .offset(offset)
                    .build()
            }
        };
        let (reply, rx) = oneshot::channel();
        // SAFETY: the buffer is leased to the ring (kept in `waiting`) until
        // its completion is reaped.
        unsafe { self.submit_one(sqe, Waiting::Read(buf, reply)) }.await;
        rx.await.expect("every operation is answered")
    }

    /// Writes `len` bytes from `ptr` at `offset`.
    ///
    /// # Safety
    /// `ptr..ptr+len` stays valid and unchanged until the returned future
    /// completes (or is dropped and the write has finished: keep the memory
    /// until then), and `fd` stays open.
    pub unsafe fn write(
        &self,
        fd: RawFd,
        offset: u64,
        ptr: *const u8,
        len: usize,
    ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + '_ {
        // SAFETY: passed on from the caller.
        unsafe { self.write_durable(fd, offset, ptr, len, false) }
    }

    /// Writes `len` bytes from `ptr` at `offset`; with `durable`, the data
    /// (and what is needed to read it back) is on stable storage when this
    /// completes (`RWF_DSYNC`).
    ///
    /// # Safety
    /// As for [`Uring::write`].
    pub unsafe fn write_durable(
        &self,
        fd: RawFd,
        offset: u64,
        ptr: *const u8,
        len: usize,
        durable: bool,
    ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + '_ {
        let flags = if durable { libc::RWF_DSYNC } else { 0 };
        let sqe = opcode::Write::new(types::Fd(fd), ptr, len as u32)
            .offset(offset)
            .rw_flags(flags)
            .build();
        self.one(sqe)
    }

    /// Reads up to `len` bytes at `offset` into `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr+len` stays valid, and is neither read nor written by
    /// anyone else, until the returned future completes (or is dropped and
    /// the read has finished); `fd` stays open.
    pub unsafe fn read_into(
        &self,
        fd: RawFd,
        offset: u64,
        ptr: *mut u8,
        len: usize,
    ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + '_ {
        let sqe = opcode::Read::new(types::Fd(fd), ptr, len as u32)
            .offset(offset)
            .build();
        self.one(sqe)
    }

    /// Reads up to `len` bytes at file `offset` and appends them to `buf`
    /// (into room reserved here, never zeroed first); the buffer travels
    /// with the operation.
    pub async fn read_append(
        &self,
        fd: RawFd,
        offset: u64,
        buf: Vec<u8>,
        len: usize,
    ) -> (Vec<u8>, std::io::Result<usize>) {
        let mut started = self.read_append_many(vec![(fd, offset, buf, len)]).await;
        started.pop().expect("one read, one result").finish().await
    }

    /// [`Uring::read_append`] for each `(fd, offset, buf, len)`, entering
    /// the kernel once for all of them (once per ring's depth): a burst of
    /// cached reads costs one system call. The caller keeps each `fd` open
    /// until its read is finished.
    pub async fn read_append_many(
        &self,
        reads: Vec<(RawFd, u64, Vec<u8>, usize)>,
    ) -> Vec<Appending> {
        let mut started = Vec::with_capacity(reads.len());
        let mut reads = reads.into_iter().peekable();
        while reads.peek().is_some() {
            let mut ops = Vec::new();
            for (fd, offset, mut buf, len) in reads.by_ref().take(DEPTH as usize) {
                let len = len.min(u32::MAX as usize);
                buf.reserve(len);
                let start = buf.len();
                let ptr = buf.spare_capacity_mut().as_mut_ptr().cast::<u8>();
                let sqe = opcode::Read::new(types::Fd(fd), ptr, len as u32)
                    .offset(offset)
                    .build();
                let (reply, rx) = oneshot::channel();
                ops.push((sqe, Waiting::Owned(buf, reply)));
                started.push(Appending { start, rx });
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
            // buffer it travels with, which the ring owns (kept in
            // `waiting`; a Vec's heap memory does not move with it) until
            // the completion is reaped.
            unsafe { self.shared.submit(ops) };
        }
        started
    }

    /// Writes `buf[at..at+len]` at file `offset` (durable as in
    /// [`Uring::write_durable`]); the buffer travels with the operation.
    pub async fn write_vec(
        &self,
        fd: RawFd,
        offset: u64,
        buf: Vec<u8>,
        at: usize,
        len: usize,
        durable: bool,
    ) -> Finished {
        let at = at.min(buf.len());
        let len = len.min(buf.len() - at) as u32;
        let flags = if durable { libc::RWF_DSYNC } else { 0 };
        // SAFETY: `at` is within the buffer (clamped above).
        let ptr = unsafe { buf.as_ptr().add(at) };
        let sqe = opcode::Write::new(types::Fd(fd), ptr, len)
            .offset(offset)
            .rw_flags(flags)
            .build();
        self.owned(sqe, buf).await
    }

    async fn owned(&self, sqe: squeue::Entry, buf: Vec<u8>) -> Finished {
        let (reply, rx) = oneshot::channel();
        // SAFETY: the entry points into `buf`, which the ring owns (kept in
        // `waiting`; a Vec's heap memory does not move with it) until the
        // completion is reaped.
        let inline = unsafe { self.submit_one(sqe, Waiting::Owned(buf, reply)) }.await;
        let (buf, result) = rx.await.expect("every operation is answered");
        Finished {
            buf,
            result,
            inline,
        }
    }

    /// `fdatasync(fd)` (or `fsync` without `data_only`).
    pub async fn sync(&self, fd: RawFd, data_only: bool) -> std::io::Result<()> {
        let flags = if data_only {
            types::FsyncFlags::DATASYNC
        } else {
            types::FsyncFlags::empty()
        };
        let sqe = opcode::Fsync::new(types::Fd(fd)).flags(flags).build();
        self.one(sqe).await.map(drop)
    }

    /// `fallocate(fd, mode, offset, len)`.
    pub async fn fallocate(
        &self,
        fd: RawFd,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> std::io::Result<()> {
        let sqe = opcode::Fallocate::new(types::Fd(fd), len)
            .offset(offset)
            .mode(mode)
            .build();
        self.one(sqe).await.map(drop)
    }

    /// `fdatasync(fd)`, then (only if that succeeded) renames `from` to
    /// `to`, both in directory `dir`: a file's commit, with no thread of
    /// ours blocked on the disk. `fd` and `dir` stay open until this returns.
    pub async fn sync_and_rename(
        &self,
        fd: RawFd,
        dir: RawFd,
        from: &CString,
        to: &CString,
    ) -> std::io::Result<()> {
        let sync = opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .flags(squeue::Flags::IO_LINK);
        let rename =
            opcode::RenameAt::new(types::Fd(dir), from.as_ptr(), types::Fd(dir), to.as_ptr())
                .build();
        let (tx1, rx1) = oneshot::channel();
        let (tx2, rx2) = oneshot::channel();
        let permits = self
            .shared
            .room
            .acquire_many(2)
            .await
            .expect("never closed");
        permits.forget();
        // SAFETY: the kernel copies both names while the entries are
        // submitted (inside `submit`, before anything is awaited); the fds
        // are the caller's to keep open.
        unsafe {
            self.shared.submit(vec![
                (sync, Waiting::Done(tx1)),
                (rename, Waiting::Done(tx2)),
            ])
        };
        let synced = rx1.await.expect("every operation is answered");
        let renamed = rx2.await.expect("every operation is answered");
        let explain = |what: &str, e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("cannot {what}: {e}"))
        };
        synced.map_err(|e| explain("sync the data to disk", e))?;
        renamed.map_err(|e| explain("rename into place", e))?;
        Ok(())
    }

    /// Waits for room in the ring, then submits `sqe`; true if it completed
    /// during its submission.
    ///
    /// # Safety
    /// As for [`Shared::submit`].
    async unsafe fn submit_one(&self, sqe: squeue::Entry, waiting: Waiting) -> bool {
        let permit = self.shared.room.acquire().await.expect("never closed");
        // Given back by the reaper when the completion comes.
        permit.forget();
        // SAFETY: passed on from the caller.
        unsafe { self.shared.submit(vec![(sqe, waiting)]) }
    }

    async fn one(&self, sqe: squeue::Entry) -> std::io::Result<usize> {
        let (reply, rx) = oneshot::channel();
        // SAFETY: the caller of the public operation vouched for the memory
        // the entry points at.
        unsafe { self.submit_one(sqe, Waiting::Done(reply)) }.await;
        rx.await.expect("every operation is answered")
    }
}

impl Shared {
    /// Pushes `ops` (a permit each taken already), enters the kernel, reaps;
    /// true if all of them completed within this call (none went to the
    /// kernel's worker threads or waits for a device).
    ///
    /// # Safety
    /// Whatever the entries point at stays valid until their completions
    /// are reaped.
    unsafe fn submit(&self, ops: Vec<(squeue::Entry, Waiting)>) -> bool {
        let mut st = self.state.lock().expect("ring lock");
        let st = &mut *st;
        // Completions posted while we reap ourselves need no signal.
        st.ring.completion().disable_eventfd();
        let mut slots = Vec::with_capacity(ops.len());
        for (sqe, waiting) in ops {
            let slot = st.free.pop().unwrap_or_else(|| {
                st.waiting.push(None);
                st.waiting.len() - 1
            });
            st.waiting[slot] = Some(waiting);
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
            match self.waiting[slot].take() {
                Some(Waiting::Read(buf, reply)) => drop(reply.send((buf, result))),
                Some(Waiting::Owned(buf, reply)) => drop(reply.send((buf, result))),
                Some(Waiting::Done(reply)) => drop(reply.send(result)),
                None => {}
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
        // Operations whose futures were dropped may still be running: their
        // memory (leased buffers) is released only once they are done.
        let st = self.state.get_mut().expect("ring lock");
        while st.in_flight > 0 {
            if st.ring.submit_and_wait(1).is_err() {
                break;
            }
            st.reap(&self.room);
        }
        // Wake the reaper so that it sees the ring gone and ends.
        let _ = rustix::io::write(&self.eventfd, &1u64.to_ne_bytes());
    }
}
