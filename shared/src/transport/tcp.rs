//! The tcp backend: the transport's operations over one TCP stream, for
//! nodes without an RDMA NIC and for tests.
//!
//! Two tasks own the two halves of the socket. The writer takes work
//! requests in posting order and writes each as one frame (header, then the
//! registered memory itself through vectored writes: no copy, no per-chunk
//! allocation); a request completes once the kernel has taken its bytes,
//! which is when its memory may be reused, as with a verbs send completion.
//! The reader decodes each incoming header, checks it completely (rkey,
//! access, bounds, the region's write gate, a posted receive to consume)
//! and only then reads the payload straight into the target memory. Any
//! failed check ends the connection: the peer is told why in an abort frame,
//! nothing of the offending payload is placed, and every outstanding request
//! is flushed.
#![allow(unsafe_code)]

mod frame;

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::{Notify, mpsc};

pub use frame::{FrameError, FrameHeader, FrameOp, HEADER_LEN, PREFACE};

use super::completions::Completions;
use super::regions::Regions;
use super::{
    Access, Backend, Completion, Connection, Limits, Op, Region, RemoteAddr, Segment,
    TransportError, WcError, WriteGate, sgl_len,
};
use crate::memory::Memory;

/// Limits of the tcp backend: generous, but finite so that a peer's
/// declared lengths are bounded before anything is read.
pub const DEFAULT_LIMITS: Limits = Limits {
    max_send_wr: 4096,
    max_recv_wr: 4096,
    max_sge: 4,
    max_msg: 1 << 30,
    max_inline: 0,
};

/// Largest payload of a send: control messages are small by design.
const MAX_SEND: u64 = crate::wire::MAX_CONTROL_SIZE as u64;
/// Read-side buffer for frame headers and small messages. Payloads larger
/// than what is buffered are read straight into their target memory, so a
/// small buffer means less of each chunk is copied twice.
const READ_BUFFER: usize = 8 * 1024;
/// Requests the writer gathers into one vectored write.
const WRITE_BATCH: usize = 64;
/// How long an incoming send or notified write waits for a posted receive
/// before the connection fails, like verbs' receiver-not-ready retries
/// (finite here, so a peer that never posts one is noticed).
const RNR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long the reader goes on after a send failed. A peer that found
/// fault with what it received says why and closes; our next send then
/// fails (the peer reset the connection), while its report still sits in
/// our receive buffer. The reader takes it, and normally ends at the
/// reset right behind it; this bounds the wait if it does not.
const READER_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Listens for tcp-backend connections. Prefaces are exchanged off the
/// accepting path, each within [`PREFACE_TIME`]: a peer that connects and
/// says nothing delays nobody else.
#[derive(Debug)]
pub struct TcpListener {
    local: SocketAddr,
    ready: tokio::sync::Mutex<mpsc::Receiver<Result<Accepted, TransportError>>>,
    acceptor: tokio::task::JoinHandle<()>,
}

/// What a [`TcpListener`] hands out.
#[derive(Debug)]
pub enum Accepted {
    /// Its preface exchanged, its tasks running (on the listener's runtime).
    Ready(TcpConnection),
    /// Not set up yet (a listener made with
    /// [`TcpListener::bind_unestablished`]).
    Unestablished(Unestablished),
}

/// A tcp connection accepted but not set up: [`Unestablished::establish`]
/// exchanges its preface and starts the tasks that carry it on the runtime
/// it is called on. A server that serves each connection on one thread
/// sets it up there, so that none of the connection's work crosses to
/// another thread (each cross-thread wake-up costs more than a small
/// request's whole service).
#[derive(Debug)]
pub struct Unestablished {
    stream: std::net::TcpStream,
    peer: Option<SocketAddr>,
}

impl Unestablished {
    /// The peer's address, for logs.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Exchanges the preface (within [`PREFACE_TIME`]) and starts the
    /// connection's tasks on the calling runtime.
    pub async fn establish(self) -> Result<TcpConnection, TransportError> {
        let stream = TcpStream::from_std(self.stream)?;
        establish_within(stream, "no rfabric preface from the peer").await
    }
}

/// [`TcpConnection::establish`] with the default limits, given up when
/// the peer sends no preface within [`PREFACE_TIME`] (`silent` says so).
async fn establish_within(
    stream: TcpStream,
    silent: &str,
) -> Result<TcpConnection, TransportError> {
    tokio::time::timeout(
        PREFACE_TIME,
        TcpConnection::establish(stream, DEFAULT_LIMITS),
    )
    .await
    .unwrap_or_else(|_| {
        Err(TransportError::Protocol(format!(
            "{silent} within {PREFACE_TIME:?}"
        )))
    })
}

/// A connecting peer has this long to send its preface.
pub const PREFACE_TIME: std::time::Duration = std::time::Duration::from_secs(10);
/// Prefaces awaited at once; connections beyond are closed at once.
const MAX_HANDSHAKES: usize = 1024;

impl TcpListener {
    /// Hands out connections set up (preface exchanged, tasks running).
    pub async fn bind(addr: impl ToSocketAddrs) -> Result<TcpListener, TransportError> {
        TcpListener::bind_as(addr, true).await
    }

    /// Hands out connections before their preface, to be set up where they
    /// will be served ([`Unestablished`]). Nothing bounds how many are
    /// handed out: the caller bounds what it serves.
    pub async fn bind_unestablished(
        addr: impl ToSocketAddrs,
    ) -> Result<TcpListener, TransportError> {
        TcpListener::bind_as(addr, false).await
    }

    async fn bind_as(
        addr: impl ToSocketAddrs,
        establish: bool,
    ) -> Result<TcpListener, TransportError> {
        let inner = tokio::net::TcpListener::bind(addr).await?;
        let local = inner.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let acceptor = tokio::spawn(accept_loop(inner, tx, establish));
        Ok(TcpListener {
            local,
            ready: tokio::sync::Mutex::new(rx),
            acceptor,
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        Ok(self.local)
    }

    /// The next connection whose preface has been exchanged (or why one
    /// failed to get there). On a listener made with
    /// [`TcpListener::bind_unestablished`] it is set up here, in turn.
    pub async fn accept(&self) -> Result<TcpConnection, TransportError> {
        match self.accept_any().await? {
            Accepted::Ready(c) => Ok(c),
            Accepted::Unestablished(u) => u.establish().await,
        }
    }

    /// The next connection, set up or not as the listener was made.
    pub async fn accept_any(&self) -> Result<Accepted, TransportError> {
        self.ready
            .lock()
            .await
            .recv()
            .await
            .unwrap_or_else(|| Err(TransportError::Closed("the listener stopped".into())))
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// Accepts connections and exchanges each preface in a task of its own
/// (or, unless `establish`, hands each over as it comes).
async fn accept_loop(
    inner: tokio::net::TcpListener,
    ready: mpsc::Sender<Result<Accepted, TransportError>>,
    establish: bool,
) {
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    loop {
        let stream = match inner.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                if ready.send(Err(e.into())).await.is_err() {
                    return;
                }
                continue;
            }
        };
        if !establish {
            let peer = stream.peer_addr().ok();
            // (Out of this runtime's reactor: the one that sets it up
            // registers it.)
            let handed = stream
                .into_std()
                .map(|stream| Accepted::Unestablished(Unestablished { stream, peer }));
            if ready.send(handed.map_err(Into::into)).await.is_err() {
                return;
            }
            continue;
        }
        let Ok(permit) = Arc::clone(&handshakes).try_acquire_owned() else {
            // Too many peers that have not said hello yet: this one goes.
            continue;
        };
        let ready = ready.clone();
        tokio::spawn(async move {
            let r = establish_within(stream, "no rfabric preface from the peer").await;
            drop(permit);
            let _ = ready.send(r.map(Accepted::Ready)).await;
        });
    }
}

/// Connects to a [`TcpListener`]. A listener that accepts (the kernel
/// does, even for a process that is stopped) but sends no preface within
/// [`PREFACE_TIME`] is given up on.
pub async fn connect(addr: impl ToSocketAddrs) -> Result<TcpConnection, TransportError> {
    let stream = TcpStream::connect(addr).await?;
    establish_within(
        stream,
        "the peer accepted the connection but sent no rfabric preface",
    )
    .await
}

/// One tcp-backend connection. Dropping it closes the connection.
#[derive(Debug)]
pub struct TcpConnection {
    shared: Arc<Shared>,
}

enum Outgoing {
    Request {
        wr_id: u64,
        op: Op,
        header: [u8; HEADER_LEN],
        sgl: Vec<Segment>,
    },
    ReadResponse {
        header: [u8; HEADER_LEN],
        source: Segment,
    },
    Abort(String),
    Close,
}

struct PendingRead {
    wr_id: u64,
    tag: u32,
    local: Segment,
}

struct Shared {
    limits: Limits,
    peer: Option<SocketAddr>,
    regions: RwLock<Regions>,
    recvs: Mutex<VecDeque<(u64, Segment)>>,
    reads: Mutex<VecDeque<PendingRead>>,
    /// Completions; it ends once the reader and the writer have stopped.
    completions: Completions,
    outgoing: mpsc::UnboundedSender<Outgoing>,
    send_outstanding: AtomicU32,
    next_read_tag: AtomicU32,
    stop_reader: Notify,
    recv_posted: Notify,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConnection")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Flushes receives and reads: the reader is gone, nothing will fill them.
    fn flush_receive_side(&self) {
        let recvs: Vec<_> = self.recvs.lock().expect("recv lock").drain(..).collect();
        for (wr_id, _) in recvs {
            self.completions
                .complete(wr_id, Op::Recv, Err(WcError::Flushed), 0);
        }
        let reads: Vec<_> = self.reads.lock().expect("read lock").drain(..).collect();
        for read in reads {
            self.send_outstanding.fetch_sub(1, Ordering::AcqRel);
            self.completions
                .complete(read.wr_id, Op::Read, Err(WcError::Flushed), 0);
        }
    }

    /// Flushes a receive the reader took off the queue for data that never
    /// came whole (the flush at the end no longer sees it).
    fn flush_taken_recv(&self, wr_id: u64) {
        self.completions
            .complete(wr_id, Op::Recv, Err(WcError::Flushed), 0);
    }

    fn check_open(&self) -> Result<(), TransportError> {
        match self.completions.down_reason() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    fn reserve_send_slot(&self) -> Result<(), TransportError> {
        let limit = self.limits.max_send_wr;
        let prev = self.send_outstanding.fetch_add(1, Ordering::AcqRel);
        if prev >= limit {
            self.send_outstanding.fetch_sub(1, Ordering::AcqRel);
            return Err(TransportError::QueueFull {
                what: "send",
                limit,
            });
        }
        Ok(())
    }

    fn enqueue(&self, item: Outgoing) -> Result<(), TransportError> {
        self.outgoing
            .send(item)
            .map_err(|_| TransportError::Closed("connection is closed".into()))
    }
}

impl TcpConnection {
    /// Exchanges the preface on a connected stream and starts the two tasks.
    /// Must run inside a tokio runtime.
    pub async fn establish(stream: TcpStream, limits: Limits) -> Result<Self, TransportError> {
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr().ok();
        let (read_half, mut write_half) = stream.into_split();
        write_half.write_all(&PREFACE).await?;
        let mut reader = BufReader::with_capacity(READ_BUFFER, read_half);
        let mut preface = [0u8; PREFACE.len()];
        reader.read_exact(&mut preface).await.map_err(|e| {
            TransportError::Protocol(format!("no rfabric preface from the peer: {e}"))
        })?;
        if preface != PREFACE {
            return Err(TransportError::Protocol(format!(
                "peer sent preface {preface:02x?}: not an rfabric tcp peer of this version"
            )));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            peer,
            limits,
            regions: RwLock::default(),
            recvs: Mutex::new(VecDeque::new()),
            reads: Mutex::new(VecDeque::new()),
            completions: Completions::new(2),
            outgoing: tx,
            send_outstanding: AtomicU32::new(0),
            next_read_tag: AtomicU32::new(0),
            stop_reader: Notify::new(),
            recv_posted: Notify::new(),
        });
        tokio::spawn(run_writer(Arc::clone(&shared), write_half, rx));
        tokio::spawn(run_reader(Arc::clone(&shared), reader));
        Ok(TcpConnection { shared })
    }

    fn post(
        &self,
        wr_id: u64,
        op: Op,
        frame_op: FrameOp,
        sgl: &[Segment],
        remote: Option<RemoteAddr>,
        note: u32,
    ) -> Result<(), TransportError> {
        let shared = &self.shared;
        shared.check_open()?;
        if sgl.len() > shared.limits.max_sge as usize {
            return Err(TransportError::Invalid(format!(
                "{} segments, at most {}",
                sgl.len(),
                shared.limits.max_sge
            )));
        }
        let len = sgl_len(sgl) as u64;
        let max = if frame_op == FrameOp::Send {
            MAX_SEND
        } else {
            shared.limits.max_msg
        };
        if len > max {
            return Err(TransportError::Invalid(format!(
                "{len} bytes in one request, at most {max}"
            )));
        }
        shared.reserve_send_slot()?;
        let remote = remote.unwrap_or(RemoteAddr { addr: 0, rkey: 0 });
        let header = FrameHeader {
            op: frame_op,
            len: len as u32,
            addr: remote.addr,
            rkey: remote.rkey,
            note,
        }
        .encode();
        shared
            .enqueue(Outgoing::Request {
                wr_id,
                op,
                header,
                sgl: sgl.to_vec(),
            })
            .inspect_err(|_| {
                shared.send_outstanding.fetch_sub(1, Ordering::AcqRel);
            })
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        self.close();
    }
}

impl Connection for TcpConnection {
    fn backend(&self) -> Backend {
        Backend::Tcp
    }

    fn peer(&self) -> Option<SocketAddr> {
        self.shared.peer
    }

    fn limits(&self) -> Limits {
        self.shared.limits
    }

    fn register(
        &self,
        memory: &Arc<Memory>,
        access: Access,
        gate: Option<Arc<dyn WriteGate>>,
    ) -> Result<Region, TransportError> {
        self.shared
            .regions
            .write()
            .expect("region lock")
            .add(memory, access, gate)
    }

    unsafe fn post_recv(&self, wr_id: u64, buf: Segment) -> Result<(), TransportError> {
        self.shared.check_open()?;
        let mut recvs = self.shared.recvs.lock().expect("recv lock");
        if recvs.len() >= self.shared.limits.max_recv_wr as usize {
            return Err(TransportError::QueueFull {
                what: "receive",
                limit: self.shared.limits.max_recv_wr,
            });
        }
        recvs.push_back((wr_id, buf));
        self.shared.recv_posted.notify_one();
        Ok(())
    }

    unsafe fn post_send(&self, wr_id: u64, sgl: &[Segment]) -> Result<(), TransportError> {
        self.post(wr_id, Op::Send, FrameOp::Send, sgl, None, 0)
    }

    unsafe fn write_notify(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
        note: u32,
    ) -> Result<(), TransportError> {
        self.post(
            wr_id,
            Op::WriteNotify,
            FrameOp::WriteNotify,
            sgl,
            Some(remote),
            note,
        )
    }

    unsafe fn write(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
    ) -> Result<(), TransportError> {
        self.post(wr_id, Op::Write, FrameOp::Write, sgl, Some(remote), 0)
    }

    unsafe fn read(
        &self,
        wr_id: u64,
        local: Segment,
        remote: RemoteAddr,
    ) -> Result<(), TransportError> {
        let shared = &self.shared;
        shared.check_open()?;
        if local.len() as u64 > shared.limits.max_msg {
            return Err(TransportError::Invalid("read longer than max_msg".into()));
        }
        shared.reserve_send_slot()?;
        let tag = shared.next_read_tag.fetch_add(1, Ordering::Relaxed);
        let header = FrameHeader {
            op: FrameOp::ReadRequest,
            len: local.len() as u32,
            addr: remote.addr,
            rkey: remote.rkey,
            note: tag,
        }
        .encode();
        // Queue the expectation before the request can be answered.
        shared
            .reads
            .lock()
            .expect("read lock")
            .push_back(PendingRead { wr_id, tag, local });
        // The request frame itself completes nothing: the read completes
        // when its response arrives. `u64::MAX` marks it for the writer.
        shared
            .enqueue(Outgoing::Request {
                wr_id: u64::MAX,
                op: Op::Read,
                header,
                sgl: Vec::new(),
            })
            .inspect_err(|_| {
                shared.send_outstanding.fetch_sub(1, Ordering::AcqRel);
            })
    }

    fn poll_completions(
        &self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
    ) -> Poll<Result<(), TransportError>> {
        self.shared.completions.poll(cx, out)
    }

    fn close(&self) {
        self.shared
            .completions
            .go_down(TransportError::Closed("closed locally".into()));
        self.shared.stop_reader.notify_one();
        let _ = self.shared.outgoing.send(Outgoing::Close);
    }
}

async fn run_writer(
    shared: Arc<Shared>,
    mut socket: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(WRITE_BATCH);
    let failure = 'run: loop {
        batch.clear();
        match rx.recv().await {
            Some(item) => batch.push(item),
            None => break 'run None,
        }
        if rx.is_empty() {
            // Let the tasks that are running queue what they have: one
            // system call for many small frames instead of one each.
            tokio::task::yield_now().await;
        }
        while batch.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        // Frames before a Close or Abort go out; the rest is flushed.
        let stop_at = batch
            .iter()
            .position(|i| matches!(i, Outgoing::Close | Outgoing::Abort(_)));
        let frames = &batch[..stop_at.unwrap_or(batch.len())];
        if let Err(e) = write_frames(&mut socket, frames).await {
            break 'run Some(TransportError::Io(format!("send failed: {e}")));
        }
        for item in frames {
            if let Outgoing::Request { wr_id, op, sgl, .. } = item
                && *op != Op::Read
            {
                shared.send_outstanding.fetch_sub(1, Ordering::AcqRel);
                shared
                    .completions
                    .complete(*wr_id, *op, Ok(()), sgl_len(sgl));
            }
        }
        if let Some(at) = stop_at {
            if let Outgoing::Abort(reason) = &batch[at] {
                let text = &reason.as_bytes()[..reason.len().min(frame::MAX_ABORT_TEXT as usize)];
                let header = FrameHeader {
                    op: FrameOp::Abort,
                    len: text.len() as u32,
                    addr: 0,
                    rkey: 0,
                    note: 0,
                }
                .encode();
                let _ = socket.write_all(&header).await;
                let _ = socket.write_all(text).await;
            }
            // Leave whatever remains to the flush below.
            batch.drain(..=at);
            break 'run None;
        }
    };
    let _ = socket.shutdown().await;
    if let Some(why) = failure {
        shared.completions.go_down(why);
        let reader = Arc::clone(&shared);
        tokio::spawn(async move {
            tokio::time::sleep(READER_GRACE).await;
            reader.stop_reader.notify_one();
        });
    }
    // Flush whatever was never written.
    rx.close();
    let leftovers = batch
        .drain(..)
        .chain(std::iter::from_fn(|| rx.try_recv().ok()));
    for item in leftovers.collect::<Vec<_>>() {
        if let Outgoing::Request { wr_id, op, .. } = item
            && op != Op::Read
        {
            shared.send_outstanding.fetch_sub(1, Ordering::AcqRel);
            shared
                .completions
                .complete(wr_id, op, Err(WcError::Flushed), 0);
        }
    }
    shared.completions.worker_stopped();
}

/// Writes frames with vectored writes straight from registered memory.
async fn write_frames(socket: &mut OwnedWriteHalf, frames: &[Outgoing]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(frames.len() * 3);
    for item in frames {
        match item {
            Outgoing::Request { header, sgl, .. } => {
                slices.push(IoSlice::new(header));
                for seg in sgl {
                    // SAFETY: the poster promised (unsafe post) that nothing
                    // writes this memory until the request completes, which
                    // is after this write returns; the segment keeps it alive.
                    slices.push(IoSlice::new(unsafe {
                        seg.region().memory().slice(seg.offset(), seg.len())
                    }));
                }
            }
            Outgoing::ReadResponse { header, source } => {
                slices.push(IoSlice::new(header));
                // SAFETY: the peer asked to read a region it was granted
                // read access to; a racing local write could only change the
                // bytes read, which is the same guarantee RDMA READ gives.
                slices.push(IoSlice::new(unsafe {
                    source
                        .region()
                        .memory()
                        .slice(source.offset(), source.len())
                }));
            }
            Outgoing::Abort(_) | Outgoing::Close => {}
        }
    }
    let mut remaining: &mut [IoSlice<'_>] = &mut slices;
    while !remaining.is_empty() {
        let n = socket.write_vectored(remaining).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut remaining, n);
    }
    Ok(())
}

/// How the reader ended.
enum ReaderEnd {
    /// The peer closed cleanly or we were told to stop.
    Closed(TransportError),
    /// The peer broke the protocol: tell it why, then close.
    Violation(TransportError),
}

async fn run_reader(shared: Arc<Shared>, mut socket: BufReader<OwnedReadHalf>) {
    let end = tokio::select! {
        end = read_frames(&shared, &mut socket) => end,
        () = shared.stop_reader.notified() => ReaderEnd::Closed(TransportError::Closed("closed locally".into())),
    };
    match end {
        ReaderEnd::Closed(why) => {
            shared.completions.go_down(why);
            let _ = shared.outgoing.send(Outgoing::Close);
        }
        ReaderEnd::Violation(why) => {
            let _ = shared.outgoing.send(Outgoing::Abort(why.to_string()));
            shared.completions.go_down(why);
        }
    }
    shared.flush_receive_side();
    shared.completions.worker_stopped();
}

fn violation(text: impl Into<String>) -> ReaderEnd {
    ReaderEnd::Violation(TransportError::Protocol(text.into()))
}

async fn read_frames(shared: &Shared, socket: &mut BufReader<OwnedReadHalf>) -> ReaderEnd {
    let mut raw = [0u8; HEADER_LEN];
    loop {
        match socket.read_exact(&mut raw).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return ReaderEnd::Closed(TransportError::Closed(
                    "peer closed the connection".into(),
                ));
            }
            Err(e) => return ReaderEnd::Closed(TransportError::Io(e.to_string())),
        }
        let header = match FrameHeader::decode(&raw, shared.limits.max_msg, MAX_SEND) {
            Ok(h) => h,
            Err(e) => return violation(format!("bad frame header: {e}")),
        };
        let len = header.len as usize;
        let step = match header.op {
            FrameOp::Send => receive_send(shared, socket, len).await,
            FrameOp::Write | FrameOp::WriteNotify => receive_write(shared, socket, header).await,
            FrameOp::ReadRequest => serve_read(shared, header),
            FrameOp::ReadResponse => receive_read_response(shared, socket, header).await,
            FrameOp::Abort => {
                let mut text = vec![0u8; len];
                if let Err(e) = socket.read_exact(&mut text).await {
                    return ReaderEnd::Closed(TransportError::Io(e.to_string()));
                }
                let text = String::from_utf8_lossy(&text).into_owned();
                return ReaderEnd::Closed(TransportError::PeerAbort(text));
            }
        };
        if let Err(end) = step {
            return end;
        }
    }
}

fn io_end(e: std::io::Error) -> ReaderEnd {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        ReaderEnd::Closed(TransportError::Closed(
            "peer closed the connection in the middle of a frame".into(),
        ))
    } else {
        ReaderEnd::Closed(TransportError::Io(e.to_string()))
    }
}

/// The next posted receive; waits for one like an RC sender's
/// receiver-not-ready retries would.
async fn take_recv(shared: &Shared) -> Result<(u64, Segment), ReaderEnd> {
    let deadline = tokio::time::Instant::now() + RNR_TIMEOUT;
    loop {
        if let Some(recv) = shared.recvs.lock().expect("recv lock").pop_front() {
            return Ok(recv);
        }
        // `notify_one` stores a permit, so a post between the check and
        // the wait is not missed.
        if tokio::time::timeout_at(deadline, shared.recv_posted.notified())
            .await
            .is_err()
        {
            return Err(violation(WcError::ReceiverNotReady.to_string()));
        }
    }
}

async fn receive_send(
    shared: &Shared,
    socket: &mut BufReader<OwnedReadHalf>,
    len: usize,
) -> Result<(), ReaderEnd> {
    let (wr_id, buf) = take_recv(shared).await?;
    if len > buf.len() {
        let err = WcError::LocalLength {
            len,
            room: buf.len(),
        };
        shared
            .completions
            .complete(wr_id, Op::Recv, Err(err.clone()), 0);
        return Err(violation(err.to_string()));
    }
    // SAFETY: the receive was posted (unsafe post_recv) with the promise that
    // nothing touches it until it completes, which happens below.
    let target = unsafe { buf.region().memory().slice_mut(buf.offset(), len) };
    if let Err(e) = socket.read_exact(target).await {
        shared.flush_taken_recv(wr_id);
        return Err(io_end(e));
    }
    shared.completions.complete(wr_id, Op::Recv, Ok(()), len);
    Ok(())
}

async fn receive_write(
    shared: &Shared,
    socket: &mut BufReader<OwnedReadHalf>,
    header: FrameHeader,
) -> Result<(), ReaderEnd> {
    let note = (header.op == FrameOp::WriteNotify).then_some(header.note);
    let remote = RemoteAddr {
        addr: header.addr,
        rkey: header.rkey,
    };
    let (region, offset) = shared
        .regions
        .read()
        .expect("region lock")
        .writable(remote, u64::from(header.len), note)
        .map_err(violation)?;
    let recv = match note {
        Some(_) => Some(take_recv(shared).await?),
        None => None,
    };
    // SAFETY: bounds were checked above; the region's owner admitted this
    // write (gate), so no reader of this range exists until the completion
    // below tells it the data is there.
    let target = unsafe {
        region
            .memory()
            .slice_mut(offset as usize, header.len as usize)
    };
    if let Err(e) = socket.read_exact(target).await {
        if let Some((wr_id, _)) = recv {
            shared.flush_taken_recv(wr_id);
        }
        return Err(io_end(e));
    }
    if let Some((wr_id, _)) = recv {
        shared.completions.push(Completion {
            wr_id,
            op: Op::RecvNotify,
            status: Ok(()),
            byte_len: header.len,
            note,
            landed_at: Some(offset),
        });
    }
    Ok(())
}

fn serve_read(shared: &Shared, header: FrameHeader) -> Result<(), ReaderEnd> {
    let remote = RemoteAddr {
        addr: header.addr,
        rkey: header.rkey,
    };
    let source = shared
        .regions
        .read()
        .expect("region lock")
        .readable(remote, u64::from(header.len))
        .map_err(violation)?;
    let response = FrameHeader {
        op: FrameOp::ReadResponse,
        len: header.len,
        addr: 0,
        rkey: 0,
        note: header.note,
    }
    .encode();
    // If the writer is gone the connection is going down anyway.
    let _ = shared.enqueue(Outgoing::ReadResponse {
        header: response,
        source,
    });
    Ok(())
}

async fn receive_read_response(
    shared: &Shared,
    socket: &mut BufReader<OwnedReadHalf>,
    header: FrameHeader,
) -> Result<(), ReaderEnd> {
    let read = shared
        .reads
        .lock()
        .expect("read lock")
        .pop_front()
        .ok_or_else(|| violation("read response nobody asked for"))?;
    // Whatever happens, the read completes: with its data or flushed.
    let flush = |end: ReaderEnd| {
        shared.send_outstanding.fetch_sub(1, Ordering::AcqRel);
        shared
            .completions
            .complete(read.wr_id, Op::Read, Err(WcError::Flushed), 0);
        end
    };
    if read.tag != header.note || read.local.len() != header.len as usize {
        return Err(flush(violation(format!(
            "read response (tag {}, {} bytes) does not match the request (tag {}, {} bytes)",
            header.note,
            header.len,
            read.tag,
            read.local.len()
        ))));
    }
    // SAFETY: posted with the promise that nothing touches `local` until the
    // read completes, just below.
    let target = unsafe {
        read.local
            .region()
            .memory()
            .slice_mut(read.local.offset(), read.local.len())
    };
    if let Err(e) = socket.read_exact(target).await {
        return Err(flush(io_end(e)));
    }
    shared.send_outstanding.fetch_sub(1, Ordering::AcqRel);
    shared
        .completions
        .complete(read.wr_id, Op::Read, Ok(()), header.len as usize);
    Ok(())
}
