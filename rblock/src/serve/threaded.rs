//! The transmission phase on threads of the connection's own (`rblock
//! serve --nbd-threads N`, 16 by default), the way nbdkit serves: each of
//! N threads takes the next request from the socket in turn, waiting for
//! it in a blocking call, carries it out and writes its reply.
//!
//! Why not the runtime: where a request's answer waits for a wake-up
//! across cores, the kernel decides the latency of a lone request. A
//! thread that sleeps on the socket itself is woken by the client's send
//! and moved to the client's core; the runtime's threads (asleep in epoll)
//! stay where they were. Measured on 2 virtual cores (4 KiB reads at
//! iodepth 1, fio's nbd engine, p50): the runtime 55-65 µs, one blocking
//! thread 52-58 µs (the thread that answers is the one that waits next,
//! and stays), 16 threads taking turns 20-28 µs, nbdkit 17-21 µs.
//!
//! Why it is not slower with many requests in flight: a client that has
//! many sends them in bursts, and the thread that takes a small request
//! takes the others waiting whole behind it too (`Conn::take_buffered`),
//! serves them and answers them in one write, and stays the reader while
//! the connection is that busy. So a busy connection is served as on the
//! runtime, by one thread going round, and the others are not woken.
//! Large requests are handed on at once and overlap on the cores.
//!
//! A lone small request that can be answered without the disk (a write
//! into the page cache, a cached read) is answered before the input is
//! handed on, and the input goes to the thread that waited longest
//! (`Conn::answer_at_once`, `Conn::input`): the next thread's wake-up
//! then comes after the reply, not before it.
//!
//! Connections to local exports go this way, plain or TLS (the session
//! taken off the runtime: `blocking_wire.rs`); a remote export's requests
//! are the fabric link's. On a plain socket large cached reads go from
//! the page cache as on the runtime (`--zero-copy-reads`); write data is
//! read into memory, never spliced (`Conn::write_as_taken` says why);
//! under TLS every byte passes through.
//!
//! Once a connection is busy with small requests, or reads large ones
//! (`pace.rs`), its threads stop taking requests, answer those taken, and
//! give the connection to a runtime, whose one worker going round costs
//! fewer wake-ups: a single-threaded one for requests of at most 64 KiB,
//! the shared one for longer (`pace::runtime_for`).
//!
//! A stop: requests taken before it finish and are answered, any taken
//! after it are answered ESHUTDOWN, and the connection closes once none
//! is in flight (the waiting thread's `read` times out every [`LOOK`]).

use std::io::{BufRead, BufReader, Chain, Cursor, IoSlice, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::watch;

use super::blocking_wire::{Sink, Source, Wire};
use super::buffers::Buffers;
use super::burst::{BURST, BURST_LEN};
use super::input::{Payload, unread_bytes};
use super::pace::{Mode, Pace, Rules, Runtime, Stay, Took, large_read, runtime_for};
use super::reply::{Reply, read_buffer, read_in_place, read_reply, write_failed};
use super::request::{Data, execute};
use super::transmission::payload_len;
use super::zero_copy::{FromCache, send_from_cache};
use crate::backend::Backend;
use crate::nbd::consts::{REQUEST_LEN, errno};
use crate::nbd::transmission::{Command, Limits, Refusal, Request, check, error_reply, ok_reply};
use crate::storage::Storage;

/// How a local export's connection is served on threads.
#[derive(Debug)]
pub(super) struct Threads {
    /// Threads a connection (`--nbd-threads`).
    pub(super) count: usize,
    pub(super) from_cache: FromCache,
    /// When it moves to the runtime and back.
    pub(super) moves: Rules,
    /// The server's spare buffers.
    pub(super) buffers: Buffers,
}

/// Whether `e` is the socket's receive timeout (or a signal): a wait to
/// go on with.
fn waited(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{Interrupted, TimedOut, WouldBlock};
    matches!(e.kind(), WouldBlock | TimedOut | Interrupted)
}

/// The connection's input buffer. What of a large write's data comes in
/// with its header is copied once more, out of this buffer into the
/// write's own, while the socket is held; 64 KiB bounds that copy and
/// still holds a burst of 15 writes of 4 KiB, or 2,340 read requests. 1
/// MiB writes at iodepth 8 against 256 KiB: 1.04x the throughput
/// (0.82-1.34, 20 paired rounds), 0.95x the server's CPU per GB; the
/// 4 KiB rows at 0.98-1.03x (`docs/rblock.md`).
const INPUT_BUFFER: usize = 64 * 1024;

/// How often a thread waiting for a request looks whether the server is
/// stopping.
const LOOK: Duration = Duration::from_millis(200);

/// Serves a connection's requests (`pending`: what came before, from the
/// handshake or the runtime) on `threads` threads until the client
/// leaves, or after a stop until nothing is in flight (`Stay::Over`), or
/// until it is busy (`Stay::Moves`: what is left to read, the socket, and
/// the runtime it goes to).
pub(super) async fn transmission_on_threads(
    pending: Vec<u8>,
    wire: Wire,
    limits: Limits,
    storage: Arc<Storage>,
    mut shutdown: watch::Receiver<bool>,
    threads: &Threads,
) -> anyhow::Result<Stay<Leaving>> {
    let Threads {
        count: threads,
        from_cache,
        moves: rules,
        ref buffers,
    } = *threads;
    let (input, output) = wire.split()?;
    let socket = output.socket();
    rustix::io::ioctl_fionbio(socket, false)?;
    // A thread waiting in `read` looks at the stop this often.
    rustix::net::sockopt::set_socket_timeout(
        socket,
        rustix::net::sockopt::Timeout::Recv,
        Some(LOOK),
    )?;
    let conn = Arc::new(Conn {
        input: parking_lot::Mutex::new(BufReader::with_capacity(
            INPUT_BUFFER,
            Cursor::new(pending).chain(input),
        )),
        output: Mutex::new(output),
        pace: Mutex::new(Pace::new(rules, Mode::Threads, Instant::now())),
        stopping: AtomicBool::new(*shutdown.borrow()),
        ended: AtomicBool::new(false),
        leaving: OnceLock::new(),
        in_flight: AtomicUsize::new(0),
        buffers: buffers.clone(),
        limits,
        from_cache,
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
    // (Awaited, so that it lets go of the connection.)
    let _ = watcher.await;
    let served = served.context("the connection's threads")?;
    let conn = Arc::into_inner(conn).context("the connection's threads let go of it")?;
    let ended = conn.ended.load(Ordering::Acquire);
    let mut output = conn.output.into_inner().unwrap_or_else(|e| e.into_inner());
    if let (true, Some(&to), false) = (served.is_ok(), conn.leaving.get(), ended) {
        let input = conn.input.into_inner();
        let (pending, source) = unread(input);
        return Ok(Stay::Moves {
            pending,
            wire: Leaving {
                wire: Wire::join(source, output)?,
                to,
            },
        });
    }
    // (Under TLS, the goodbye: best effort, the client may be gone.)
    let _ = output.close();
    served.map(|()| Stay::Over)
}

/// A connection leaving its threads for a runtime.
pub(super) struct Leaving {
    pub(super) wire: Wire,
    pub(super) to: Runtime,
}

type Input = BufReader<Chain<Cursor<Vec<u8>>, Source>>;

/// What `input` holds unread, and the socket behind it.
fn unread(input: Input) -> (Vec<u8>, Source) {
    let buffered = input.buffer().to_vec();
    let (ahead, source) = input.into_inner().into_inner();
    (unread_bytes(buffered, &ahead), source)
}

/// One connection, shared by its threads.
struct Conn {
    /// Held by the thread reading the next request. After a lone request
    /// answered at once it is handed on fairly (`unlock_fair`: straight to
    /// the thread that waited longest). A plain unlock lets its holder take
    /// it back at once, which after a quick answer it nearly always did:
    /// the thread woken for it lost the race, spun (5% of the server's
    /// samples at iodepth 1) and slept again, and the same thread stayed
    /// the reader, the case the threads are there to avoid.
    input: parking_lot::Mutex<Input>,
    /// Told of each request taken (by the thread holding the input).
    pace: Mutex<Pace>,
    /// Held by the thread writing a reply.
    output: Mutex<Sink>,
    stopping: AtomicBool,
    /// The client left, asked to, or broke the protocol: no more requests
    /// are taken.
    ended: AtomicBool,
    /// Set once the connection is busy: no more requests are taken here,
    /// and the runtime it names takes it on once those taken are answered.
    leaving: OnceLock<Runtime>,
    /// Requests taken whose replies have not begun to go out. (Counted
    /// down before the reply is written: a client that waits for each
    /// answer before it asks again then always finds it at 0.)
    in_flight: AtomicUsize,
    buffers: Buffers,
    limits: Limits,
    from_cache: FromCache,
    backend: Backend,
    /// Where the storage's work runs (its futures are driven from here).
    runtime: tokio::runtime::Handle,
}

/// Writes `replies` to the client in order: those made here in as few
/// system calls as it takes, those from the page cache with `sendfile`.
fn write_all(out: &mut Sink, replies: &[Reply]) -> std::io::Result<()> {
    let mut rest = replies;
    while !rest.is_empty() {
        let made = rest
            .iter()
            .take_while(|r| matches!(r, Reply::Bytes(_)))
            .count();
        write_made(out, &rest[..made])?;
        rest = &rest[made..];
        let Some((reply, after)) = rest.split_first() else {
            break;
        };
        match reply {
            Reply::File {
                head,
                storage,
                offset,
                len,
            } => match out.plain() {
                Some(socket) => send_from_file(socket, head, storage, *offset, *len)?,
                // (Never made: under TLS nothing goes from the cache.)
                None => return Err(std::io::Error::other("a page-cache reply under TLS")),
            },
            Reply::Bytes(_) | Reply::Landed { .. } | Reply::ReadAtSend { .. } => {
                unreachable!(
                    "made replies are written above; nothing lands on a local export, and \
                     a copied read is made on this thread before its reply"
                )
            }
        }
        rest = after;
    }
    Ok(())
}

/// Replies made here, in as few system calls as it takes.
fn write_made(out: &mut Sink, replies: &[Reply]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = replies
        .iter()
        .filter_map(|r| match r {
            Reply::Bytes(b) => Some(IoSlice::new(b)),
            _ => None,
        })
        .collect();
    let mut left = &mut slices[..];
    while !left.is_empty() {
        match out.write_vectored(left) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut left, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A read's header, then its data straight from the page cache. A send
/// that fails halfway ends the connection both ways: the client could not
/// tell where the next reply starts.
fn send_from_file(
    out: &mut std::fs::File,
    head: &[u8],
    storage: &Storage,
    offset: u64,
    len: usize,
) -> std::io::Result<()> {
    use rustix::net::SendFlags;
    let mut sent = 0;
    while sent < head.len() {
        // (Marked as having more behind: TCP sends it with the data.)
        match rustix::net::send(&*out, &head[sent..], SendFlags::MORE | SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut at = offset;
    let end = offset + len as u64;
    while at < end {
        let left = (end - at) as usize;
        match rustix::fs::sendfile(&*out, storage.file(), Some(&mut at), left) {
            // The file shrank under us: what is gone reads as zeros.
            Ok(0) => return out.write_all(&vec![0; left]),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                let _ = rustix::net::shutdown(&*out, rustix::net::Shutdown::Both);
                return Err(e.into());
            }
        }
    }
    Ok(())
}

/// A request taken from the socket, with its data.
struct Taken {
    req: Request,
    checked: Result<Command, Refusal>,
    payload: Option<Vec<u8>>,
    /// Its reply, where it was carried out while the input was held (a
    /// small write from the input buffer, a lone small read from the page
    /// cache).
    answered: Option<Vec<u8>>,
    /// Whether another request of the connection was unanswered when it
    /// came in.
    behind_others: bool,
}

impl Conn {
    /// One thread's work: requests in turn until the connection ends.
    ///
    /// A thread that took a burst stays the reader while it serves it and
    /// takes the next one itself: a busy connection is served like the
    /// runtime serves it, one thread going round, and the others sleep
    /// without being woken. A lone request (or a large one) hands the
    /// input on before it is carried out, so the next thread already
    /// waits in `read` (the lone request's latency) or takes the next
    /// large request at once (two served on two cores).
    fn serve(&self) -> anyhow::Result<()> {
        let mut taken = Vec::with_capacity(BURST);
        let mut replies = Vec::with_capacity(BURST);
        let mut kept = None;
        loop {
            let mut input = match kept.take() {
                Some(input) => input,
                None => self.input.lock(),
            };
            if self.leaving.get().is_some() {
                return Ok(());
            }
            match self.take(&mut input) {
                Ok(Some(t)) => taken.push(t),
                Ok(None) => {
                    self.end();
                    return Ok(());
                }
                Err(e) => {
                    self.end();
                    return Err(e);
                }
            }
            self.take_buffered(&mut input, &mut taken);
            let leaving = self.busy(&taken);
            // (A lone request answered at once keeps the input until its
            // reply is out: `answer_at_once` says why.)
            let mut held = None;
            if taken.len() > 1 && !leaving {
                kept = Some(input);
            } else if !leaving && taken.len() == 1 && self.answer_at_once(&mut taken[0]) {
                held = Some(input);
            } else {
                // (Handed on before the work, the input is let go as any
                // lock is: handed fairly there, the lone request's latency
                // was worse, 1.27 of nbdkit's mean against 1.10.)
                drop(input);
            }
            replies.extend(taken.drain(..).map(|t| self.carry_out(t)));
            self.in_flight.fetch_sub(replies.len(), Ordering::AcqRel);
            let written = {
                let mut out = self.output.lock().unwrap_or_else(|e| e.into_inner());
                write_all(&mut out, &replies)
            };
            if let Some(input) = held {
                parking_lot::MutexGuard::unlock_fair(input);
            }
            for reply in replies.drain(..) {
                if let Reply::Bytes(b) = reply {
                    self.buffers.give(b);
                }
            }
            if let Err(e) = written {
                self.end();
                return Err(e).context("cannot send a reply");
            }
        }
    }

    /// Tells the pace of the requests just taken (the input held): true
    /// when that makes the connection busy, and it is to leave for the
    /// runtime (not during a stop: that ends where it is).
    fn busy(&self, taken: &[Taken]) -> bool {
        let Some(first) = taken.first() else {
            return false;
        };
        let took = Took {
            requests: taken.len() as u32,
            small: taken.iter().all(|t| t.req.length <= BURST_LEN),
            large_read: taken.iter().any(|t| large_read(&t.req)),
            behind_others: first.behind_others,
        };
        let mut pace = self.pace.lock().unwrap_or_else(|e| e.into_inner());
        if !pace.took(Instant::now(), took) || self.stopping.load(Ordering::Acquire) {
            return false;
        }
        let longest = taken.iter().map(|t| t.req.length).max().unwrap_or(0);
        let to = runtime_for(longest);
        let which = match to {
            Runtime::Single => "single-threaded",
            Runtime::Shared => "shared",
        };
        tracing::debug!("a busy connection: serving it on the runtime ({which})");
        let _ = self.leaving.set(to);
        true
    }

    /// After a small request, the small reads and writes that wait whole
    /// in the input behind it: a client with many requests in flight sends
    /// them in bursts, and one thread serving a burst and answering it in
    /// one write costs less than handing each request to another thread
    /// (a wake-up and a reply's system call apiece). Anything else, or a
    /// request not all there yet, is left to the next thread's turn.
    fn take_buffered(&self, input: &mut Input, taken: &mut Vec<Taken>) {
        if taken.last().is_none_or(|t| t.req.length > BURST_LEN) {
            return;
        }
        while taken.len() < BURST {
            let buffered = input.buffer();
            let Some(head) = buffered.get(..REQUEST_LEN) else {
                return;
            };
            let Ok(req) = Request::decode(head.try_into().expect("a header's length")) else {
                return;
            };
            if req.length > BURST_LEN {
                return;
            }
            let checked = check(&req, &self.limits);
            let (mut payload, mut answered) = (None, None);
            let mut used = REQUEST_LEN;
            match checked {
                Ok(Command::Read) => {}
                Ok(Command::Write { fua }) => {
                    let Some(data) = buffered.get(used..used + req.length as usize) else {
                        return;
                    };
                    used += data.len();
                    answered = self.write_from_input(&req, fua, data);
                    if answered.is_none() {
                        let mut copy = self.buffers.take(data.len());
                        copy.extend_from_slice(data);
                        payload = Some(copy);
                    }
                }
                _ => return,
            }
            input.consume(used);
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            taken.push(Taken {
                req,
                checked,
                payload,
                answered,
                behind_others: true,
            });
        }
    }

    /// Ends the connection: no thread takes another request, and one
    /// waiting for one wakes (what is in flight is still answered).
    fn end(&self) {
        self.ended.store(true, Ordering::Release);
        let out = self.output.lock().unwrap_or_else(|e| e.into_inner());
        let _ = rustix::net::shutdown(out.socket(), rustix::net::Shutdown::Read);
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
        let behind_others = self.in_flight.load(Ordering::Acquire) > 0;
        let payload_len = payload_len(&req)?;
        let checked = check(&req, &self.limits);
        if matches!(checked, Ok(Command::Disc)) {
            return Ok(None);
        }
        let written = match checked {
            Ok(Command::Write { fua }) => self.write_as_taken(input, &req, fua, payload_len),
            _ => None,
        };
        if let Some(reply) = written {
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            return Ok(Some(Taken {
                req,
                checked,
                payload: None,
                answered: Some(reply),
                behind_others,
            }));
        }
        let payload = match payload_len {
            0 => None,
            len => {
                let mut data = self.buffers.take_to_fill(len);
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
            answered: None,
            behind_others,
        }))
    }

    /// Whether a lone request is answered at once, while the input is
    /// held: a small write made from the input as it was taken, or a small
    /// read the page cache holds (read here; `t.answered` gets its reply).
    /// Its reply then goes out before the input is handed on, and the
    /// input goes to the thread that waited longest ([`Conn::input`]).
    ///
    /// Why: handing the input on wakes the next thread, and that wake-up,
    /// made before the reply, stood between the request and its answer;
    /// made after it, it costs a lone request nothing (the next thread is
    /// in `read` before the client, woken by the reply, sends again). What
    /// may wait for the disk is still handed on first, so that the next
    /// request does not wait for it. 4 KiB reads at iodepth 1, 10
    /// alternating rounds of 3 s (`docs/rblock.md`), over nbdkit's, by
    /// round, median: p50 0.55 and mean 0.87 this way; 1.12 and 1.10
    /// handed on first with the standard lock; 1.08 and 1.27 handed on
    /// first, fairly.
    fn answer_at_once(&self, t: &mut Taken) -> bool {
        if t.answered.is_some() {
            return true;
        }
        let (Ok(Command::Read), Backend::Local(local)) = (&t.checked, &self.backend) else {
            return false;
        };
        if !local.may_read_now(t.req.length as usize) || self.stopping.load(Ordering::Acquire) {
            return false;
        }
        let structured = self.limits.structured;
        let mut buf = read_buffer(&self.buffers, structured, &t.req);
        match local.read_now(t.req.offset, &mut buf, t.req.length as usize) {
            Some(read) => {
                t.answered = Some(read_reply(
                    structured,
                    t.req.cookie,
                    buf,
                    read,
                    &self.buffers,
                ));
                true
            }
            None => {
                self.buffers.give(buf);
                false
            }
        }
    }

    /// A small write whose data is all in the input already, carried out
    /// from there as it is taken, while the input is held: its reply; None
    /// where its data is to be read as any other's.
    ///
    /// A large write is read into memory and carried out once the input
    /// is handed on, so that its copy into the file overlaps the next
    /// request, as nbdkit does. Moved through a pipe instead (`splice`,
    /// one copy fewer, as the runtime does), the input stayed held until
    /// the data was in the file: 1 MiB writes at 0.72-0.96x nbdkit's
    /// throughput by round, against 0.98-1.05x read into memory, for the
    /// same CPU per GB within the noise (5 rounds, `docs/rblock.md`).
    fn write_as_taken(
        &self,
        input: &mut Input,
        req: &Request,
        fua: bool,
        len: usize,
    ) -> Option<Vec<u8>> {
        let data = input.buffer().get(..len)?;
        let reply = self.write_from_input(req, fua, data)?;
        input.consume(len);
        Some(reply)
    }

    /// A small write carried out straight from the input buffer (`data`,
    /// the request's whole data), while the input is held: no copy out
    /// of it, and the page cache takes it at once. Its reply; None where
    /// it goes the usual way (a FUA write, a large one, a remote export,
    /// a stop under way).
    fn write_from_input(&self, req: &Request, fua: bool, data: &[u8]) -> Option<Vec<u8>> {
        let Backend::Local(local) = &self.backend else {
            return None;
        };
        if fua || req.length > BURST_LEN || self.stopping.load(Ordering::Acquire) {
            return None;
        }
        Some(match local.write_here(req.offset, data) {
            Ok(()) => ok_reply(req.cookie),
            Err(e) => write_failed(self.limits.structured, req.cookie, &e),
        })
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

    /// Carries out one request; its reply.
    fn carry_out(&self, t: Taken) -> Reply {
        if let Some(reply) = t.answered {
            return reply.into();
        }
        let structured = self.limits.structured;
        let cookie = t.req.cookie;
        if self.stopping.load(Ordering::Acquire) {
            if let Some(data) = t.payload {
                self.buffers.give(data);
            }
            return error_reply(structured, cookie, errno::ESHUTDOWN, "server shutting down")
                .into();
        }
        let command = match t.checked {
            Ok(c) => c,
            Err(refusal) => {
                if let Some(data) = t.payload {
                    self.buffers.give(data);
                }
                return error_reply(structured, cookie, refusal.errno, refusal.message).into();
            }
        };
        let offset = t.req.offset;
        // The common requests on this thread, the way they go fastest.
        match (command, &self.backend) {
            // This thread is there to wait: reads of any length are made
            // here, with no hand-off to the storage engine.
            (Command::Read, Backend::Local(local)) => {
                let zero_copy = self.from_cache.allows();
                if let Some(reply) = send_from_cache(local, &t.req, structured, zero_copy) {
                    return reply;
                }
                return read_in_place(&self.buffers, local, structured, &t.req).into();
            }
            (Command::Write { fua: false }, Backend::Local(local)) => {
                let data = t.payload.unwrap_or_default();
                let written = local.write_here(offset, &data);
                self.buffers.give(data);
                return match written {
                    Ok(()) => ok_reply(cookie).into(),
                    Err(e) => write_failed(structured, cookie, &e).into(),
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
        self.runtime
            .block_on(execute(command, &t.req, data, &self.backend, structured))
    }
}
