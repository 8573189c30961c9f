//! The transmission phase on threads of the connection's own (`rblock
//! serve --nbd-threads N`), the way nbdkit serves: each of N threads takes
//! the next request from the socket in turn, waiting for it in a blocking
//! call, carries it out and writes its reply.
//!
//! Why a second way: where a request's answer waits for a wake-up across
//! cores, the kernel decides the latency of a lone request. A thread that
//! sleeps on the socket itself is woken by the client's send and moved to
//! the client's core; the runtime's threads (asleep in epoll) stay where
//! they were. Measured on 2 virtual cores (4 KiB reads at iodepth 1, fio's
//! nbd engine, p50): the runtime 55-58 µs, one blocking thread 52-58 µs
//! (the thread that answers is the one that waits next, and stays), 4
//! threads taking turns 9-13 µs, nbdkit 18-20 µs. At iodepth 32 the
//! threads hand the socket to one another: 0.87-0.93x the runtime's IOPS
//! (1.07-1.15x nbdkit's), so it is a choice, not the default.
//!
//! Only plain connections to local exports go this way: under TLS the
//! session is the runtime's, and a remote export's requests are the
//! fabric link's. Large reads are copied (no `sendfile` here).
//!
//! A stop: requests taken before it finish and are answered, any taken
//! after it are answered ESHUTDOWN, and the connection closes once none
//! is in flight (the waiting thread's `read` times out every [`LOOK`]).

use std::io::{BufRead, BufReader, Chain, Cursor, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

use super::buffers::Buffers;
use super::input::Payload;
use super::reply::{Reply, read_buffer, read_reply, write_failed};
use super::request::{Data, execute};
use super::transmission::payload_len;
use crate::backend::Backend;
use crate::nbd::consts::{REQUEST_LEN, errno};
use crate::nbd::transmission::{Command, Limits, Refusal, Request, check, error_reply, ok_reply};
use crate::storage::Storage;

/// Whether `e` is the socket's receive timeout (or a signal): a wait to
/// go on with.
fn waited(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{Interrupted, TimedOut, WouldBlock};
    matches!(e.kind(), WouldBlock | TimedOut | Interrupted)
}

/// How often a thread waiting for a request looks whether the server is
/// stopping.
const LOOK: Duration = Duration::from_millis(200);

/// Serves a connection's requests (`pending`: what the handshake read
/// ahead) on `threads` threads until the client leaves or, after a stop,
/// until nothing is in flight.
pub(super) async fn transmission_on_threads(
    pending: Vec<u8>,
    socket: OwnedFd,
    limits: Limits,
    storage: Arc<Storage>,
    mut shutdown: watch::Receiver<bool>,
    threads: usize,
) -> anyhow::Result<()> {
    rustix::io::ioctl_fionbio(&socket, false)?;
    // A thread waiting in `read` looks at the stop this often.
    rustix::net::sockopt::set_socket_timeout(
        &socket,
        rustix::net::sockopt::Timeout::Recv,
        Some(LOOK),
    )?;
    let output = std::fs::File::from(socket);
    let input = output.try_clone()?;
    let conn = Arc::new(Conn {
        input: Mutex::new(BufReader::with_capacity(
            256 * 1024,
            Cursor::new(pending).chain(input),
        )),
        output: Mutex::new(output),
        stopping: AtomicBool::new(*shutdown.borrow()),
        ended: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        buffers: Buffers::default(),
        limits,
        backend: Backend::Local(storage),
        runtime: tokio::runtime::Handle::current(),
    });
    let watcher = {
        let conn = Arc::clone(&conn);
        tokio::spawn(async move {
            if shutdown.wait_for(|s| *s).await.is_ok() {
                conn.stopping.store(true, Ordering::Release);
            }
        })
    };
    let serving = Arc::clone(&conn);
    let served = tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| {
            let others: Vec<_> = (1..threads.max(1))
                .map(|_| {
                    std::thread::Builder::new()
                        .name("rblock-nbd".into())
                        .spawn_scoped(s, || serving.serve())
                })
                .collect();
            let mut result = serving.serve();
            for other in others {
                let r = match other {
                    Ok(t) => t
                        .join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a thread panicked"))),
                    Err(e) => {
                        serving.end();
                        Err(e.into())
                    }
                };
                if result.is_ok() {
                    result = r;
                }
            }
            result
        })
    })
    .await;
    watcher.abort();
    served.context("the connection's threads")?
}

type Input = BufReader<Chain<Cursor<Vec<u8>>, std::fs::File>>;

/// One connection, shared by its threads.
struct Conn {
    /// Held by the thread reading the next request.
    input: Mutex<Input>,
    /// Held by the thread writing a reply.
    output: Mutex<std::fs::File>,
    stopping: AtomicBool,
    /// The client left, asked to, or broke the protocol: no more requests
    /// are taken.
    ended: AtomicBool,
    /// Requests taken and not yet answered.
    in_flight: AtomicUsize,
    buffers: Buffers,
    limits: Limits,
    backend: Backend,
    /// Where the storage's work runs (its futures are driven from here).
    runtime: tokio::runtime::Handle,
}

/// A request taken from the socket, with its data.
struct Taken {
    req: Request,
    checked: Result<Command, Refusal>,
    payload: Option<Vec<u8>>,
}

impl Conn {
    /// One thread's work: requests in turn until the connection ends.
    fn serve(&self) -> anyhow::Result<()> {
        loop {
            let taken = {
                let mut input = self.input.lock().unwrap_or_else(|e| e.into_inner());
                match self.take(&mut input) {
                    Ok(Some(t)) => t,
                    Ok(None) => {
                        self.end();
                        return Ok(());
                    }
                    Err(e) => {
                        self.end();
                        return Err(e);
                    }
                }
            };
            let reply = self.carry_out(taken);
            let written = {
                let mut out = self.output.lock().unwrap_or_else(|e| e.into_inner());
                out.write_all(&reply)
            };
            self.buffers.give(reply);
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            if let Err(e) = written {
                self.end();
                return Err(e).context("cannot send a reply");
            }
        }
    }

    /// Ends the connection: no thread takes another request, and one
    /// waiting for one wakes (what is in flight is still answered).
    fn end(&self) {
        self.ended.store(true, Ordering::Release);
        let out = self.output.lock().unwrap_or_else(|e| e.into_inner());
        let _ = rustix::net::shutdown(out.as_fd(), rustix::net::Shutdown::Read);
    }

    /// The next request and its data; `None` once the connection is over
    /// (the client left or asked to, or a stop with nothing in flight).
    fn take(&self, input: &mut Input) -> anyhow::Result<Option<Taken>> {
        if !self.wait_for_input(input)? {
            return Ok(None);
        }
        let mut head = [0u8; REQUEST_LEN];
        self.read_fully(input, &mut head)
            .context("the client closed in the middle of a request")?;
        let req = Request::decode(&head)?;
        let payload_len = payload_len(&req)?;
        let checked = check(&req, &self.limits);
        if matches!(checked, Ok(Command::Disc)) {
            return Ok(None);
        }
        let payload = match payload_len {
            0 => None,
            len => {
                let mut data = self.buffers.take(len);
                data.resize(len, 0);
                self.read_fully(input, &mut data)
                    .context("the client closed in the middle of a write")?;
                Some(data)
            }
        };
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(Some(Taken {
            req,
            checked,
            payload,
        }))
    }

    /// Waits until bytes are there to read: true, or false when the
    /// connection is over. (A thread asleep in `read` itself, rather than
    /// in `poll`, is the one the kernel moves to the client's core.)
    fn wait_for_input(&self, input: &mut Input) -> anyhow::Result<bool> {
        loop {
            if self.ended.load(Ordering::Acquire) {
                return Ok(false);
            }
            let (pending, _) = input.get_ref().get_ref();
            let buffered = !input.buffer().is_empty()
                || (pending.position() as usize) < pending.get_ref().len();
            if !buffered
                && self.stopping.load(Ordering::Acquire)
                && self.in_flight.load(Ordering::Acquire) == 0
            {
                return Ok(false);
            }
            match input.fill_buf() {
                // Empty: the client hung up.
                Ok(bytes) => return Ok(!bytes.is_empty()),
                Err(e) if waited(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Fills `buf` from the client, however long it takes between the
    /// pieces (unless the connection ends meanwhile).
    fn read_fully(&self, input: &mut Input, mut buf: &mut [u8]) -> std::io::Result<()> {
        while !buf.is_empty() {
            match input.read(buf) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if waited(&e) && !self.ended.load(Ordering::Acquire) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Carries out one request; its whole reply.
    fn carry_out(&self, t: Taken) -> Vec<u8> {
        let structured = self.limits.structured;
        let cookie = t.req.cookie;
        if self.stopping.load(Ordering::Acquire) {
            if let Some(data) = t.payload {
                self.buffers.give(data);
            }
            return error_reply(structured, cookie, errno::ESHUTDOWN, "server shutting down");
        }
        let command = match t.checked {
            Ok(c) => c,
            Err(refusal) => {
                if let Some(data) = t.payload {
                    self.buffers.give(data);
                }
                return error_reply(structured, cookie, refusal.errno, refusal.message);
            }
        };
        let (offset, len) = (t.req.offset, t.req.length as usize);
        // The common requests on this thread, the way they go fastest.
        match (command, &self.backend) {
            (Command::Read, Backend::Local(local)) => {
                let mut buf = read_buffer(&self.buffers, structured, &t.req);
                if let Some(r) = local.read_now(offset, &mut buf, len) {
                    return read_reply(structured, cookie, buf, r, &self.buffers);
                }
                self.buffers.give(buf);
            }
            (Command::Write { fua: false }, Backend::Local(local)) => {
                let data = t.payload.unwrap_or_default();
                let written = local.write_here(offset, &data);
                self.buffers.give(data);
                return match written {
                    Ok(()) => ok_reply(cookie),
                    Err(e) => write_failed(structured, cookie, &e),
                };
            }
            _ => {}
        }
        let data = Data {
            payload: t.payload.map(Payload::Bytes),
            buffers: &self.buffers,
            // (Replies are written here, whole.)
            zero_copy: false,
        };
        let reply =
            self.runtime
                .block_on(execute(command, &t.req, data, &self.backend, structured));
        match reply {
            Reply::Bytes(b) => b,
            Reply::File { .. } | Reply::Landed { .. } => {
                unreachable!("a local export's reply without zero copy is made here")
            }
        }
    }
}
