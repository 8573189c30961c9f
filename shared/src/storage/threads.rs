//! The threads engine: one bounded, process-wide pool of threads doing the
//! plain system calls (`pread`, `pwrite`/`pwritev2(RWF_DSYNC)`,
//! `fdatasync`/`fsync`, `fallocate`, `renameat`), every one of them in
//! Linux 4.18 (RHEL 8) already. It is what most RHEL nodes run, so it
//! keeps pipelines as full as the ring does:
//!
//! * Operations are independent jobs: the many reads of one burst, or the
//!   chunks of one file, run on as many threads at once as are free.
//! * A read first tries `preadv2(RWF_NOWAIT)` on the calling thread: data
//!   in the page cache (most of it, in a pipeline that reads ahead) is
//!   copied right there, as the ring does inline, without a hand-off (each
//!   costs two wake-ups, the pool thread's and the waiting task's, which
//!   on a virtual machine are dearer than copying a megabyte). Only what
//!   would wait for the device goes to the pool.
//! * The pool is sized to the cores this process may use (cgroup quota and
//!   affinity, as `available_parallelism` reads them), four threads each:
//!   a thread blocked on the device uses no core, and a few per core keep a
//!   device's queue busy without letting the threads outnumber what the
//!   machine can schedule. Bounded either way (8 to 128).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use rustix::fs::FallocateFlags;
use rustix::io::{Errno, ReadWriteFlags};
use tokio::sync::oneshot;

use super::{Appending, Held, IoBuf, Written};
use crate::memory::PoolBuf;

type Job = Box<dyn FnOnce() + Send>;

/// The process's pool: a queue of jobs and the threads taking them.
struct Pool {
    jobs: async_channel::Sender<Job>,
    size: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let size = (cores * 4).clamp(8, 128);
        let (jobs, queue) = async_channel::unbounded::<Job>();
        for i in 0..size {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("rfabric-io-{i}"))
                .spawn(move || {
                    while let Ok(job) = queue.recv_blocking() {
                        // A job that panics loses its answer (the waiter
                        // sees that), not the thread.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .expect("cannot start the storage threads");
        }
        Pool { jobs, size }
    })
}

/// Threads in the pool (starting it).
pub(crate) fn pool_size() -> usize {
    pool().size
}

/// Runs `job` on the pool; its answer comes on the receiver.
fn run<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> oneshot::Receiver<T> {
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(job());
    });
    pool()
        .jobs
        .try_send(job)
        .unwrap_or_else(|_| unreachable!("the queue is unbounded and never closed"));
    rx
}

async fn answer<T>(rx: oneshot::Receiver<T>) -> T {
    rx.await.expect("every operation is answered")
}

/// Reads up to `len` bytes at `offset` with one `pread` on this thread,
/// appended to `buf` (which grows to hold them; its spare room is not
/// zeroed first): the bytes read, 0 at the end of the file.
pub fn pread_append(
    file: impl AsFd,
    offset: u64,
    buf: &mut Vec<u8>,
    len: usize,
) -> std::io::Result<usize> {
    buf.reserve(len);
    let start = buf.len();
    let spare = &mut buf.spare_capacity_mut()[..len];
    let got = rustix::io::pread(file, spare, offset)?.0.len();
    // SAFETY: `pread` initialized the first `got` bytes of the spare
    // capacity, which start right after `start`.
    unsafe { buf.set_len(start + got) };
    Ok(got)
}

fn io(e: Errno) -> std::io::Error {
    e.into()
}

/// An engine handle: the shared pool, and what this engine learnt of the
/// files it serves.
#[derive(Debug, Clone)]
pub(crate) struct Threads {
    /// `RWF_NOWAIT` reads work (cleared on the first `EOPNOTSUPP`: a
    /// filesystem without them).
    nowait: Arc<AtomicBool>,
    /// `RWF_NOWAIT` buffered writes work (cleared on the first refusal).
    nowait_writes: Arc<AtomicBool>,
}

impl Threads {
    pub(crate) fn start() -> Threads {
        pool();
        Threads {
            nowait: Arc::new(AtomicBool::new(true)),
            nowait_writes: Arc::new(AtomicBool::new(true)),
        }
    }

    pub(crate) async fn read(
        &self,
        file: Held,
        offset: u64,
        mut buf: PoolBuf,
        at: usize,
        len: usize,
    ) -> (PoolBuf, std::io::Result<usize>) {
        if len > 0 && self.nowait.load(Ordering::Relaxed) {
            let mut slice = [IoSliceMut::new(&mut buf.spare()[at..at + len])];
            match rustix::io::preadv2(file.as_fd(), &mut slice, offset, ReadWriteFlags::NOWAIT) {
                Ok(n) => return (buf, Ok(n)),
                Err(Errno::AGAIN | Errno::INTR) => {}
                Err(Errno::OPNOTSUPP) => self.nowait.store(false, Ordering::Relaxed),
                Err(e) => return (buf, Err(io(e))),
            }
        }
        answer(run(move || {
            let r = rustix::io::pread(file.as_fd(), &mut buf.spare()[at..at + len], offset);
            drop(file);
            (buf, r.map_err(io))
        }))
        .await
    }

    pub(crate) fn read_append_many(
        &self,
        file: Held,
        reads: Vec<(u64, Vec<u8>, usize)>,
    ) -> Vec<Appending> {
        reads
            .into_iter()
            .map(|(offset, mut buf, len)| {
                buf.reserve(len);
                if let Some(done) = self.append_now(&file, offset, &mut buf, len) {
                    let (tx, rx) = oneshot::channel();
                    let _ = tx.send((buf, done));
                    return Appending { rx };
                }
                let file = Arc::clone(&file);
                let rx = run(move || {
                    let r = pread_append(file.as_fd(), offset, &mut buf, len);
                    drop(file);
                    (buf, r)
                });
                Appending { rx }
            })
            .collect()
    }

    /// Appends up to `len` bytes at `offset` to `buf` (its capacity
    /// reserved already) right here if the page cache has them; None, with
    /// `buf` as it was, if the read would wait for the device.
    fn append_now(
        &self,
        file: &Held,
        offset: u64,
        buf: &mut Vec<u8>,
        len: usize,
    ) -> Option<std::io::Result<usize>> {
        if len == 0 || !self.nowait.load(Ordering::Relaxed) {
            return None;
        }
        let spare = &mut buf.spare_capacity_mut()[..len];
        let iov = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: len,
        };
        // SAFETY: FFI; the one iovec covers `len` bytes of the vector's
        // reserved capacity, which nothing else touches during the call;
        // the kernel only writes there (never reads), and the fd is open
        // (`file` holds it).
        let n = unsafe {
            libc::preadv2(
                file.as_fd().as_raw_fd(),
                &iov,
                1,
                offset as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => None,
                Some(libc::EOPNOTSUPP) => {
                    self.nowait.store(false, Ordering::Relaxed);
                    None
                }
                _ => Some(Err(e)),
            };
        }
        let start = buf.len();
        // SAFETY: the kernel wrote `n` bytes (at most `len`) right after
        // `start`, into capacity reserved for them.
        unsafe { buf.set_len(start + n as usize) };
        Some(Ok(n as usize))
    }

    /// A small buffered write of `data` at `offset` right here (the
    /// engine asks for it, see [`super::Engine::write_now`]): a copy into
    /// the page cache, as the ring does inline, without the two wake-ups of
    /// a hand-off (for a tree of small files those wake-ups were a third of
    /// the copy's time). With `RWF_NOWAIT` where the kernel and filesystem
    /// have it, so the write is refused rather than kept waiting (None: it
    /// goes to the pool); elsewhere (Linux before 5.x, tmpfs) a plain
    /// `pwrite`, which can wait only while the page cache throttles dirty
    /// pages.
    pub(crate) fn write_here(
        &self,
        file: BorrowedFd<'_>,
        data: &[u8],
        offset: u64,
    ) -> Option<std::io::Result<usize>> {
        if self.nowait_writes.load(Ordering::Relaxed) {
            let slice = [IoSlice::new(data)];
            match rustix::io::pwritev2(file, &slice, offset, ReadWriteFlags::NOWAIT) {
                Ok(n) => return Some(Ok(n)),
                Err(Errno::AGAIN | Errno::INTR) => return None,
                // Kernels before 5.x refuse non-blocking buffered writes
                // (4.18: EINVAL), some filesystems still do (EOPNOTSUPP).
                Err(Errno::INVAL | Errno::OPNOTSUPP) => {
                    self.nowait_writes.store(false, Ordering::Relaxed);
                }
                Err(e) => return Some(Err(io(e))),
            }
        }
        match rustix::io::pwrite(file, data, offset) {
            Err(Errno::INTR) => None,
            r => Some(r.map_err(io)),
        }
    }

    pub(crate) async fn write<B: IoBuf>(
        &self,
        file: Held,
        offset: u64,
        buf: B,
        at: usize,
        len: usize,
        durable: bool,
    ) -> Written<B> {
        let (buf, result) = answer(run(move || {
            let data = &buf.io_bytes()[at..at + len];
            let r = if durable {
                rustix::io::pwritev2(
                    file.as_fd(),
                    &[IoSlice::new(data)],
                    offset,
                    ReadWriteFlags::DSYNC,
                )
            } else {
                rustix::io::pwrite(file.as_fd(), data, offset)
            };
            drop(file);
            (buf, r.map_err(io))
        }))
        .await;
        Written {
            buf,
            result,
            inline: false,
        }
    }

    pub(crate) async fn sync(&self, file: Held, data_only: bool) -> std::io::Result<()> {
        answer(run(move || {
            if data_only {
                rustix::fs::fdatasync(file.as_fd())
            } else {
                rustix::fs::fsync(file.as_fd())
            }
            .map_err(io)
        }))
        .await
    }

    pub(crate) async fn fallocate(
        &self,
        file: Held,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> std::io::Result<()> {
        let flags = FallocateFlags::from_bits_retain(mode as u32);
        answer(run(move || {
            rustix::fs::fallocate(file.as_fd(), flags, offset, len).map_err(io)
        }))
        .await
    }

    pub(crate) async fn sync_and_rename(
        &self,
        file: Held,
        dir: Held,
        from: CString,
        to: CString,
    ) -> (std::io::Result<()>, std::io::Result<()>) {
        answer(run(move || {
            let synced = rustix::fs::fdatasync(file.as_fd()).map_err(io);
            let renamed = match &synced {
                Ok(()) => rustix::fs::renameat(dir.as_fd(), &from, dir.as_fd(), &to).map_err(io),
                // As the ring's linked entry: not renamed when not synced.
                Err(_) => Err(std::io::Error::from_raw_os_error(libc::ECANCELED)),
            };
            (synced, renamed)
        }))
        .await
    }
}
