//! NBD over TCP and unix sockets: accepting, the handshake on the socket,
//! then the transmission phase with many requests in flight and replies
//! sent as they complete. Shutdown (SIGTERM): no new connections; each
//! connection finishes what is in flight, answers anything newer with
//! ESHUTDOWN, then closes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use std::io::Cursor;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter, Chain,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use crate::backend::Backend;
use crate::config::{Listen, ZeroCopy};
use crate::execute::{Executed, Failure, carry_out};
use crate::export::Export;
use crate::nbd::consts::{REQUEST_LEN, errno};
use crate::nbd::handshake::{Handshake, MAX_PAYLOAD, Outcome};
use crate::nbd::transmission::{
    Command, Limits, Request, block_status_reply, check, error_reply, ok_reply, read_reply_header,
};
use crate::socket::{Inbound, Outbound, Stream};
use crate::storage::{StartedRead, Storage};

mod zero_copy;
use zero_copy::{
    FromCache, Load, Spare, can_splice, send_from_cache, send_from_file, splice_write,
};

/// Requests in flight per connection at most.
const MAX_IN_FLIGHT: usize = 128;
/// Payload bytes (write data read, read data not yet sent) per connection.
const MAX_BUFFERED: usize = 128 << 20;
/// A client has this long to finish the handshake.
const HANDSHAKE_TIME: Duration = Duration::from_secs(60);

/// How and where to serve.
#[derive(Debug)]
pub struct Plan {
    /// Who speaks in messages ("rblock serve").
    pub who: &'static str,
    /// NBD listeners.
    pub listen: Vec<Listen>,
    /// rblock's own protocol over RDMA or tcp (`rblock connect`).
    pub fabric: Option<rfabric::endpoint::Listener>,
    /// Connections (NBD and fabric) served at once; more are refused.
    pub max_connections: usize,
    /// How long connections may take to finish after the stop.
    pub grace: Duration,
    /// When large reads go from the page cache without a copy.
    pub zero_copy_reads: ZeroCopy,
}

/// Serves `exports` as `plan` says until `stop` resolves, then lets the
/// connections finish. `stop` is first polled once every listener is up.
pub async fn run(
    exports: Vec<Export>,
    plan: Plan,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let Plan {
        who,
        listen,
        fabric,
        max_connections,
        grace,
        zero_copy_reads,
    } = plan;
    let exports: Arc<[Export]> = exports.into();
    let (shutdown_tx, shutdown) = watch::channel(false);
    let load = Arc::new(Load {
        slots: Arc::new(Semaphore::new(max_connections)),
        max: max_connections,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    });
    let (conn_tx, mut conn_rx) = mpsc::channel::<()>(1);
    let mut acceptors = Vec::new();
    let accepting = || Accepting {
        who,
        exports: Arc::clone(&exports),
        shutdown: shutdown.clone(),
        load: Arc::clone(&load),
        zero_copy_reads,
        alive: conn_tx.clone(),
    };
    for l in &listen {
        let ctx = accepting();
        match l {
            Listen::Tcp(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr}"))?;
                eprintln!("{who}: listening on {}", listener.local_addr()?);
                acceptors.push(tokio::spawn(async move {
                    loop {
                        match listener.accept().await {
                            Ok((s, _)) => {
                                let _ = s.set_nodelay(true);
                                ctx.start(Stream::Tcp(s));
                            }
                            Err(e) => eprintln!("{who}: accept failed: {e}"),
                        }
                    }
                }));
            }
            Listen::Unix(path) => {
                remove_stale_socket(path)?;
                let listener = tokio::net::UnixListener::bind(path)
                    .with_context(|| format!("cannot listen on {}", path.display()))?;
                eprintln!("{who}: listening on unix:{}", path.display());
                acceptors.push(tokio::spawn(async move {
                    loop {
                        match listener.accept().await {
                            Ok((s, _)) => ctx.start(Stream::Unix(s)),
                            Err(e) => eprintln!("{who}: accept failed: {e}"),
                        }
                    }
                }));
            }
        }
    }
    if let Some(fabric) = fabric {
        let ctx = accepting();
        acceptors.push(tokio::spawn(async move {
            loop {
                match fabric.accept().await {
                    Ok(conn) => ctx.start_link(conn),
                    Err(e) => eprintln!("{who}: fabric accept failed: {e}"),
                }
            }
        }));
    }
    drop(conn_tx);
    stop.await;
    eprintln!("{who}: shutting down");
    for a in &acceptors {
        a.abort();
    }
    let _ = shutdown_tx.send(true);
    drop(acceptors);
    // Every connection holds a sender: all gone means all closed.
    if tokio::time::timeout(grace, conn_rx.recv()).await.is_err() {
        eprintln!("{who}: connections still open after {grace:?}; closing them");
    }
    for l in &listen {
        if let Listen::Unix(p) = l {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(())
}

/// A leftover socket file from an earlier run is replaced; anything else
/// at that path is an error.
fn remove_stale_socket(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the old socket {}", path.display())),
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(_) => Ok(()),
    }
}

struct Accepting {
    who: &'static str,
    exports: Arc<[Export]>,
    shutdown: watch::Receiver<bool>,
    /// The places among the connections, and how many are taken.
    load: Arc<Load>,
    zero_copy_reads: ZeroCopy,
    alive: mpsc::Sender<()>,
}

impl Accepting {
    /// A client of rblock's fabric protocol (`rblock connect`).
    fn start_link(&self, conn: Arc<dyn rfabric::transport::Connection>) {
        let closer = Arc::clone(&conn);
        let admitted = self.admit("fabric connection", move |exports, shutdown| {
            crate::fabric::server::serve_link(conn, exports, shutdown)
        });
        if !admitted {
            closer.close();
        }
    }

    fn start(&self, stream: Stream) {
        let from_cache = match self.zero_copy_reads {
            ZeroCopy::Always => FromCache::Always,
            ZeroCopy::Never => FromCache::Never,
            ZeroCopy::Auto if !stream.is_local() => FromCache::Always,
            ZeroCopy::Auto => FromCache::WhenBusy(Arc::clone(&self.load)),
        };
        self.admit("connection", move |exports, shutdown| {
            connection(stream, exports, shutdown, from_cache)
        });
    }

    /// Serves one `what` (made by `serve`) in a task of its own while it
    /// holds a place among the connections; false when all are taken.
    fn admit<F>(
        &self,
        what: &'static str,
        serve: impl FnOnce(Arc<[Export]>, watch::Receiver<bool>) -> F,
    ) -> bool
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let who = self.who;
        let Ok(permit) = Arc::clone(&self.load.slots).try_acquire_owned() else {
            eprintln!("{who}: refusing a {what}: too many open");
            return false;
        };
        let served = serve(Arc::clone(&self.exports), self.shutdown.clone());
        let alive = self.alive.clone();
        tokio::spawn(async move {
            if let Err(e) = served.await {
                eprintln!("{who}: {what} ended: {e:#}");
            }
            drop(permit);
            drop(alive);
        });
        true
    }
}

/// One client, from greeting to close.
async fn connection(
    stream: Stream,
    exports: Arc<[Export]>,
    shutdown: watch::Receiver<bool>,
    from_cache: FromCache,
) -> anyhow::Result<()> {
    let (mut rd, mut wr) = stream.split();
    let infos = exports.iter().map(|e| e.info.clone()).collect();
    let mut hs = Handshake::new(infos);
    let mut buf = Vec::new();
    let mut stop = shutdown.clone();
    let handshake = tokio::time::timeout(HANDSHAKE_TIME, async {
        // The greeting first; then each round takes all the input it can.
        wr.write_all(&hs.take_output()).await?;
        loop {
            let (used, outcome) = hs.advance(&buf)?;
            buf.drain(..used);
            let out = hs.take_output();
            if !out.is_empty() {
                wr.write_all(&out).await?;
            }
            match outcome {
                Some(Outcome::Transmission(n)) => return anyhow::Ok(Some(n)),
                Some(Outcome::Close) => return Ok(None),
                None => {}
            }
            let mut tmp = [0u8; 8192];
            let n = rd.read(&mut tmp).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&tmp[..n]);
        }
    });
    // A shutdown ends handshakes still going on: nothing was promised yet.
    let negotiated = tokio::select! {
        r = handshake => r.context("the handshake took too long")??,
        _ = stop.wait_for(|s| *s) => None,
    };
    let Some(negotiated) = negotiated else {
        let _ = wr.shutdown().await;
        return Ok(());
    };
    let export = &exports[negotiated.export];
    let limits = Limits::new(&negotiated, export.info.size, export.info.read_only);
    let backend = export.source.backend();
    transmission(buf, (rd, wr), limits, backend, shutdown, from_cache).await
}

/// Big buffers kept for reuse, per connection at most this many bytes.
const KEEP_BUFFERS: usize = 64 << 20;

/// A connection's spare buffers: reads and writes of a MiB reuse memory
/// instead of mapping fresh pages (which the kernel zeroes) every time.
#[derive(Debug, Clone, Default)]
struct Buffers(Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

impl Buffers {
    /// An empty buffer with room for `len` bytes.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut spare = self.0.lock().expect("buffers lock");
        // The most recently given back first: its memory is likely still
        // in the CPU's cache.
        match spare.iter().rposition(|b| b.capacity() >= len) {
            Some(i) => spare.swap_remove(i),
            None => Vec::with_capacity(len),
        }
    }

    fn give(&self, mut b: Vec<u8>) {
        if b.capacity() < 64 * 1024 {
            return;
        }
        let mut spare = self.0.lock().expect("buffers lock");
        let kept: usize = spare.iter().map(Vec::capacity).sum();
        if kept + b.capacity() <= KEEP_BUFFERS {
            b.clear();
            spare.push(b);
        }
    }
}

/// What the reader reads: what the handshake read ahead, then the socket.
type Input = BufReader<Chain<Cursor<Vec<u8>>, Inbound>>;

async fn transmission(
    pending: Vec<u8>,
    (rd, wr): (Inbound, Outbound),
    limits: Limits,
    backend: Backend,
    mut shutdown: watch::Receiver<bool>,
    from_cache: FromCache,
) -> anyhow::Result<()> {
    let buffers = Buffers::default();
    let replies = Arc::new(Replies {
        out: tokio::sync::Mutex::new(BufWriter::with_capacity(256 * 1024, wr)),
        queued: AtomicUsize::new(0),
        buffers: buffers.clone(),
    });
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let budget = Arc::new(Semaphore::new(MAX_BUFFERED));
    let mut stopping = *shutdown.borrow();
    // What the handshake read ahead comes first.
    let mut rd: Input = BufReader::with_capacity(256 * 1024, Cursor::new(pending).chain(rd));
    // Made at the first large write.
    let mut pipe = Spare::Untried;
    let result = async {
        loop {
            // The next header, or (once stopping) the moment nothing is in
            // flight any more.
            // (Waiting for bytes is cancel-safe; reading them is not, so it
            // happens outside the select.)
            let more = tokio::select! {
                buf = rd.fill_buf() => !buf?.is_empty(),
                _ = shutdown.changed(), if !stopping => {
                    stopping = true;
                    continue;
                }
                _ = idle(&in_flight), if stopping => break,
            };
            if !more {
                // The client hung up.
                break;
            }
            if let (false, Backend::Local(storage)) = (stopping, &backend) {
                let zero_copy = from_cache.now();
                let burst = take_burst(&mut rd, &limits, &budget, storage, zero_copy);
                if !(burst.reads.is_empty() && burst.answered.is_empty()) {
                    let replies = &replies;
                    serve_burst(burst, storage, replies, &buffers, &in_flight, &limits).await?;
                    continue;
                }
            }
            let mut head = [0u8; REQUEST_LEN];
            rd.read_exact(&mut head)
                .await
                .context("the client closed in the middle of a request")?;
            let req = Request::decode(&head)?;
            let payload_len = req.payload_len() as usize;
            if payload_len > MAX_PAYLOAD as usize {
                bail!("a write of {payload_len} bytes: more than the {MAX_PAYLOAD} allowed");
            }
            let checked = check(&req, &limits);
            let cost = match checked {
                Ok(Command::Read) => req.length as usize,
                _ => payload_len,
            };
            let money = Arc::clone(&budget)
                .acquire_many_owned(cost.min(MAX_BUFFERED) as u32)
                .await
                .expect("never closed");
            if let (Ok(Command::Write { fua: false }), Backend::Local(storage), false) =
                (&checked, &backend, stopping)
                && can_splice(&rd, &req)
                && let Some(pipe) = pipe.get()
            {
                let reply = splice_write(&mut rd, pipe, storage, &req, limits.structured).await?;
                replies.send(reply.into(), money).await?;
                continue;
            }
            let payload = if payload_len > 0 {
                Some(read_payload(&mut rd, buffers.take(payload_len), payload_len).await?)
            } else {
                None
            };
            let structured = limits.structured;
            if stopping {
                let m = error_reply(
                    structured,
                    req.cookie,
                    errno::ESHUTDOWN,
                    "server shutting down",
                );
                replies.send(m.into(), money).await?;
                continue;
            }
            let command = match checked {
                Ok(c) => c,
                Err(refusal) => {
                    let m = error_reply(structured, req.cookie, refusal.errno, refusal.message);
                    replies.send(m.into(), money).await?;
                    continue;
                }
            };
            if command == Command::Disc {
                break;
            }
            let ticket = Arc::clone(&in_flight)
                .acquire_owned()
                .await
                .expect("never closed");
            let (backend, replies, buffers) =
                (backend.clone(), Arc::clone(&replies), buffers.clone());
            let zero_copy = from_cache.now();
            tokio::spawn(async move {
                let data = Data {
                    payload,
                    buffers: &buffers,
                    zero_copy,
                };
                let reply = execute(command, &req, data, &backend, structured).await;
                // A failed send shows up in the reader too (the client is
                // gone); the request is done either way.
                let _ = replies.send(reply, money).await;
                drop(ticket);
            });
        }
        anyhow::Ok(())
    }
    .await;
    // Whatever is in flight finishes and is answered before the close.
    idle(&in_flight).await;
    let mut out = replies.out.lock().await;
    let flushed = out.flush().await;
    let _ = out.shutdown().await;
    result?;
    flushed?;
    Ok(())
}

/// Where replies go: the socket, written by whichever task has a reply
/// ready (no hand-off to a writer task). Replies that find it busy wait
/// their turn; the last of them flushes, so replies that pile up leave in
/// one system call.
struct Replies {
    out: tokio::sync::Mutex<BufWriter<Outbound>>,
    /// Replies waiting for or holding the socket.
    queued: AtomicUsize,
    buffers: Buffers,
}

impl Replies {
    async fn send(&self, reply: Reply, budget: OwnedSemaphorePermit) -> std::io::Result<()> {
        self.send_all([(reply, budget)]).await
    }

    /// Replies that leave together (each with the budget it held).
    async fn send_all(
        &self,
        replies: impl IntoIterator<Item = (Reply, OwnedSemaphorePermit)>,
    ) -> std::io::Result<()> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let mut out = self.out.lock().await;
        let mut result = Ok(());
        for (reply, budget) in replies {
            if result.is_ok() {
                result = match &reply {
                    Reply::Bytes(b) => out.write_all(b).await,
                    Reply::File {
                        head,
                        storage,
                        offset,
                        len,
                    } => send_from_file(&mut out, head, storage, *offset, *len).await,
                };
            }
            if let Reply::Bytes(b) = reply {
                self.buffers.give(b);
            }
            drop(budget);
        }
        let last = self.queued.fetch_sub(1, Ordering::AcqRel) == 1;
        if result.is_ok() && last {
            result = out.flush().await;
        }
        result
    }
}

/// Reads and writes at most this long are taken in bursts.
const BURST_LEN: u32 = 256 * 1024;
/// Requests in one burst at most.
const BURST: usize = 64;

/// What a burst leaves to do: reads to start, replies ready to go.
struct Burst {
    reads: Vec<(Request, OwnedSemaphorePermit)>,
    answered: Vec<(Reply, OwnedSemaphorePermit)>,
}

/// Takes the small requests waiting whole in the input, up to the first
/// that is anything else (or that the budget has no room for). Clients
/// with many requests in flight send them in bursts: a burst's reads are
/// started with one system call, its writes that go to the page cache
/// with `pwrite` anyway are done here straight from the input, and the
/// answers leave together.
fn take_burst<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    limits: &Limits,
    budget: &Arc<Semaphore>,
    storage: &Arc<Storage>,
    zero_copy: bool,
) -> Burst {
    let mut burst = Burst {
        reads: Vec::new(),
        answered: Vec::new(),
    };
    let input = rd.buffer();
    let mut used = 0;
    while burst.reads.len() + burst.answered.len() < BURST {
        let Some(head) = input.get(used..used + REQUEST_LEN) else {
            break;
        };
        let Ok(req) = Request::decode(head.try_into().expect("a header's length")) else {
            break;
        };
        if req.length > BURST_LEN {
            break;
        }
        match check(&req, limits) {
            Ok(Command::Read) => {
                let Ok(money) = Arc::clone(budget).try_acquire_many_owned(req.length) else {
                    break;
                };
                match send_from_cache(storage, &req, limits.structured, zero_copy) {
                    Some(reply) => burst.answered.push((reply, money)),
                    None => burst.reads.push((req, money)),
                }
                used += REQUEST_LEN;
            }
            Ok(Command::Write { fua }) => {
                let data_at = used + REQUEST_LEN;
                let Some(data) = input.get(data_at..data_at + req.length as usize) else {
                    break;
                };
                let Some(written) = storage.write_now(req.offset, data, fua) else {
                    break;
                };
                let reply = match written {
                    Ok(()) => ok_reply(req.cookie),
                    Err(e) => write_failed(limits.structured, req.cookie, &e),
                };
                let nothing = Arc::clone(budget)
                    .try_acquire_many_owned(0)
                    .expect("an empty permit");
                burst.answered.push((reply.into(), nothing));
                used = data_at + req.length as usize;
            }
            _ => break,
        }
    }
    rd.consume(used);
    burst
}

/// Starts a burst's reads together; answers those that finished at once,
/// with the burst's other answers, in one write, and leaves the rest to
/// tasks of their own.
async fn serve_burst(
    burst: Burst,
    storage: &Arc<Storage>,
    replies: &Arc<Replies>,
    buffers: &Buffers,
    in_flight: &Arc<Semaphore>,
    limits: &Limits,
) -> std::io::Result<()> {
    let structured = limits.structured;
    let Burst {
        reads: burst,
        mut answered,
    } = burst;
    let reads = burst
        .iter()
        .map(|(req, _)| {
            let head = read_reply_header(structured, req.cookie, req.offset, req.length);
            let mut buf = buffers.take(head.len() + req.length as usize);
            buf.extend_from_slice(&head);
            (req.offset, buf, req.length as usize)
        })
        .collect();
    let started = storage.start_reads(reads).await;
    for ((req, money), read) in burst.into_iter().zip(started) {
        match read {
            StartedRead::Done(buf, r) => {
                let reply = read_reply(structured, req.cookie, buf, r, buffers);
                answered.push((reply.into(), money));
            }
            StartedRead::Later(read) => {
                let ticket = Arc::clone(in_flight)
                    .acquire_owned()
                    .await
                    .expect("never closed");
                let (replies, buffers) = (Arc::clone(replies), buffers.clone());
                tokio::spawn(async move {
                    let (buf, r) = read.await;
                    let reply = read_reply(structured, req.cookie, buf, r, &buffers);
                    let _ = replies.send(reply.into(), money).await;
                    drop(ticket);
                });
            }
        }
    }
    replies.send_all(answered).await
}

/// The reply to a request that failed.
fn failed(structured: bool, cookie: u64, f: &Failure) -> Vec<u8> {
    error_reply(structured, cookie, f.errno, &f.text)
}

fn write_failed(structured: bool, cookie: u64, e: &std::io::Error) -> Vec<u8> {
    failed(structured, cookie, &Failure::write(e))
}

/// A read's reply: `buf` (header and data) if it worked.
fn read_reply(
    structured: bool,
    cookie: u64,
    buf: Vec<u8>,
    result: std::io::Result<()>,
    buffers: &Buffers,
) -> Vec<u8> {
    match result {
        Ok(()) => buf,
        Err(e) => {
            buffers.give(buf);
            failed(structured, cookie, &Failure::read(&e))
        }
    }
}

/// Resolves once no request is in flight.
async fn idle(in_flight: &Arc<Semaphore>) {
    let _all = in_flight
        .acquire_many(MAX_IN_FLIGHT as u32)
        .await
        .expect("never closed");
}

/// A write's data, read into a buffer of its size (not zeroed first):
/// what the input buffer holds already, then the rest straight from the
/// socket, so that large writes are not copied twice.
async fn read_payload<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    mut p: Vec<u8>,
    len: usize,
) -> anyhow::Result<Vec<u8>> {
    p.reserve_exact(len);
    let held = rd.buffer().len().min(len);
    p.extend_from_slice(&rd.buffer()[..held]);
    rd.consume(held);
    while p.len() < len {
        let want = (len - p.len()) as u64;
        // A short rest goes through the input buffer, which picks up the
        // next requests with it.
        let got = if want >= DIRECT_READ {
            rd.get_mut().take(want).read_buf(&mut p).await?
        } else {
            (&mut *rd).take(want).read_buf(&mut p).await?
        };
        if got == 0 {
            bail!("the client closed in the middle of a write");
        }
    }
    Ok(p)
}

/// Rests of write data at least this long skip the input buffer.
const DIRECT_READ: u64 = 64 * 1024;

/// A request's data, and where the reply's comes from.
struct Data<'a> {
    /// A write's.
    payload: Option<Vec<u8>>,
    /// Where a read's buffer comes from.
    buffers: &'a Buffers,
    /// Whether a large read may be sent from the page cache.
    zero_copy: bool,
}

/// Carries out one checked request; returns the whole reply.
async fn execute(
    command: Command,
    req: &Request,
    data: Data<'_>,
    storage: &Backend,
    structured: bool,
) -> Reply {
    if let (Command::Read, Backend::Local(local)) = (command, storage)
        && let Some(reply) = send_from_cache(local, req, structured, data.zero_copy)
    {
        return reply;
    }
    execute_here(
        command,
        req,
        data.payload,
        storage,
        structured,
        data.buffers,
    )
    .await
    .into()
}

/// Carries out one checked request with the data passing through here.
async fn execute_here(
    command: Command,
    req: &Request,
    payload: Option<Vec<u8>>,
    storage: &Backend,
    structured: bool,
    buffers: &Buffers,
) -> Vec<u8> {
    let (cookie, offset, len) = (req.cookie, req.offset, req.length);
    match command {
        Command::Read => {
            let head = read_reply_header(structured, cookie, offset, len);
            let mut buf = buffers.take(head.len() + len as usize);
            buf.extend_from_slice(&head);
            let (buf, r) = storage.read(offset, buf, len as usize).await;
            read_reply(structured, cookie, buf, r, buffers)
        }
        Command::Write { fua } => {
            let data = payload.unwrap_or_default();
            let (data, r) = storage.write(offset, data, 0, len as usize, fua).await;
            buffers.give(data);
            match r {
                Ok(()) => ok_reply(cookie),
                Err(e) => write_failed(structured, cookie, &e),
            }
        }
        Command::Disc => unreachable!("handled by the reader"),
        other => match carry_out(other, req, storage).await {
            Ok(Executed::Done) => ok_reply(cookie),
            Ok(Executed::Extents(extents)) => block_status_reply(cookie, &extents),
            Err(f) => failed(structured, cookie, &f),
        },
    }
}

/// One reply to the client.
enum Reply {
    /// Made here.
    Bytes(Vec<u8>),
    /// A read's header, and its data sent straight from the page cache.
    File {
        head: Vec<u8>,
        storage: Arc<Storage>,
        offset: u64,
        len: usize,
    },
}

impl From<Vec<u8>> for Reply {
    fn from(b: Vec<u8>) -> Reply {
        Reply::Bytes(b)
    }
}
