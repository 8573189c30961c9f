//! io_uring on a thread of its own: reads into registered pool buffers
//! (fixed buffers) and writes from landed slots, with many in flight.
//!
//! Async callers submit jobs over a channel and get the buffer (and the
//! result) back over a oneshot. The thread blocks on the channel only when
//! nothing is in flight; otherwise it takes new jobs between completions.
#![allow(unsafe_code)]

use std::os::fd::RawFd;
use std::sync::{Arc, mpsc};

use io_uring::{IoUring, opcode, types};
use rfabric::memory::{BufferPool, PoolBuf};
use tokio::sync::oneshot;

enum Job {
    Read {
        fd: RawFd,
        offset: u64,
        at: usize,
        len: u32,
        buf: PoolBuf,
        reply: oneshot::Sender<(PoolBuf, std::io::Result<usize>)>,
    },
    Write {
        fd: RawFd,
        offset: u64,
        ptr: usize,
        len: u32,
        reply: oneshot::Sender<std::io::Result<usize>>,
    },
}

/// Handle to the I/O thread; clone freely.
#[derive(Clone, Debug)]
pub struct Uring {
    jobs: mpsc::Sender<Job>,
}

const DEPTH: u32 = 64;

impl Uring {
    /// Starts the thread; `pool`'s buffers become its fixed buffers.
    pub fn start(pool: Option<&Arc<BufferPool>>) -> std::io::Result<Uring> {
        let ring = IoUring::new(DEPTH)?;
        if let Some(pool) = pool {
            // SAFETY: the pool's memory lives as long as the thread holds the
            // `Arc` below, and buffers are handed to the kernel only with an
            // exclusive lease that the thread keeps until completion.
            unsafe { ring.submitter().register_buffers(&pool.iovecs())? };
        }
        let keep = pool.cloned();
        let (jobs, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("rcp-uring".into())
            .spawn(move || run(ring, rx, keep))?;
        Ok(Uring { jobs })
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
        let (reply, rx) = oneshot::channel();
        let at = at.min(buf.capacity());
        let len = len.min(buf.capacity() - at) as u32;
        if let Err(mpsc::SendError(Job::Read { buf, .. })) = self.jobs.send(Job::Read {
            fd,
            offset,
            at,
            len,
            buf,
            reply,
        }) {
            return (buf, Err(std::io::Error::other("I/O thread gone")));
        }
        rx.await.expect("the I/O thread answers every job")
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
    ) -> impl std::future::Future<Output = std::io::Result<usize>> + Send + use<> {
        let (reply, rx) = oneshot::channel();
        let sent = self.jobs.send(Job::Write {
            fd,
            offset,
            ptr: ptr as usize,
            len: len as u32,
            reply,
        });
        async move {
            sent.map_err(|_| std::io::Error::other("I/O thread gone"))?;
            rx.await.expect("the I/O thread answers every job")
        }
    }
}

enum Waiting {
    Read(PoolBuf, oneshot::Sender<(PoolBuf, std::io::Result<usize>)>),
    Write(oneshot::Sender<std::io::Result<usize>>),
}

fn run(mut ring: IoUring, rx: mpsc::Receiver<Job>, _pool: Option<Arc<BufferPool>>) {
    let mut waiting: Vec<Option<Waiting>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut in_flight = 0usize;
    let mut open = true;
    while open || in_flight > 0 {
        // Take jobs: block only when idle.
        let mut next = if in_flight == 0 {
            match rx.recv() {
                Ok(j) => Some(j),
                Err(_) => break,
            }
        } else {
            None
        };
        loop {
            let job = match next.take() {
                Some(j) => j,
                None if in_flight < DEPTH as usize => match rx.try_recv() {
                    Ok(j) => j,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                },
                None => break,
            };
            let slot = free.pop().unwrap_or_else(|| {
                waiting.push(None);
                waiting.len() - 1
            });
            let sqe = match job {
                Job::Read {
                    fd,
                    offset,
                    at,
                    len,
                    mut buf,
                    reply,
                } => {
                    // SAFETY: `at` is within the buffer (clamped by `read`).
                    let dst = unsafe { buf.as_mut_ptr().add(at) };
                    let e = opcode::ReadFixed::new(types::Fd(fd), dst, len, buf.index() as u16)
                        .offset(offset)
                        .build();
                    waiting[slot] = Some(Waiting::Read(buf, reply));
                    e
                }
                Job::Write {
                    fd,
                    offset,
                    ptr,
                    len,
                    reply,
                } => {
                    let e = opcode::Write::new(types::Fd(fd), ptr as *const u8, len)
                        .offset(offset)
                        .build();
                    waiting[slot] = Some(Waiting::Write(reply));
                    e
                }
            };
            // SAFETY: the buffer behind the entry is kept alive (owned lease
            // in `waiting`, or the caller's promise for writes) until its
            // completion is reaped below.
            unsafe {
                ring.submission()
                    .push(&sqe.user_data(slot as u64))
                    .expect("queue has room: in flight < depth");
            }
            in_flight += 1;
        }
        if in_flight == 0 {
            continue;
        }
        if let Err(e) = ring.submit_and_wait(1)
            && e.raw_os_error() != Some(libc::EINTR)
        {
            // Fail everything in flight: the ring is unusable.
            for w in waiting.iter_mut().filter_map(Option::take) {
                let err = || std::io::Error::new(e.kind(), e.to_string());
                match w {
                    Waiting::Read(buf, reply) => drop(reply.send((buf, Err(err())))),
                    Waiting::Write(reply) => drop(reply.send(Err(err()))),
                }
            }
            return;
        }
        for cqe in ring.completion() {
            let slot = cqe.user_data() as usize;
            let res = cqe.result();
            let result = if res < 0 {
                Err(std::io::Error::from_raw_os_error(-res))
            } else {
                Ok(res as usize)
            };
            match waiting[slot].take() {
                Some(Waiting::Read(buf, reply)) => drop(reply.send((buf, result))),
                Some(Waiting::Write(reply)) => drop(reply.send(result)),
                None => {}
            }
            free.push(slot);
            in_flight -= 1;
        }
    }
}
