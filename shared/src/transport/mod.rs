//! The transport: a small trait shaped like an RC queue pair, nothing more.
//!
//! It is the intersection of what real verbs (through rdma_cm) and a TCP
//! stream can both do with the same semantics, so that everything above it
//! (links, rcp, rblock) runs unchanged on either backend:
//!
//! * **Memory regions.** [`Connection::register`] makes a [`Memory`] usable
//!   for local operations and, if asked, reachable by the peer through a
//!   [`RemoteRegion`] `{addr, len, rkey}` that can be sent to it.
//! * **Work requests** are posted and complete later, each identified by a
//!   caller-chosen `wr_id`: `post_recv`, `post_send` (a small message into
//!   the peer's next posted receive), `write_notify` (a one-sided write the
//!   peer learns about through a 32-bit note, consuming one of its posted
//!   receives: RDMA WRITE WITH IMM), `write` and `read` (one-sided, silent on
//!   the peer's side).
//! * **Completions** arrive through [`Connection::poll_completions`], one
//!   per work request, in the order RC gives: sends, writes and reads
//!   complete in posting order; receives in arrival order; a peer's
//!   operations arrive in the order it posted them, and a notified write's
//!   data is in place before its completion is seen.
//! * **Failure** is final, as for a queue pair in the error state: every
//!   outstanding request completes with [`WcError::Flushed`] (or the error
//!   that caused it), then `poll_completions` reports why the connection
//!   ended.
//!
//! Posting hands memory to "the hardware", which reads or writes it behind
//! Rust's back until the completion arrives. That is why the post methods
//! are `unsafe`: the caller promises not to touch the memory meanwhile. The
//! `link` module wraps them in an API that keeps that promise by ownership.
//!
//! A region may carry a [`WriteGate`]: the owner's check of every peer write
//! into it. The tcp backend calls it before a single byte of the write is
//! placed, so a refused write never touches memory; verbs hardware places
//! data before software sees it, so the verbs backend calls it when the
//! completion is polled. Either way a refusal is a protocol error that closes
//! the connection.
#![allow(unsafe_code)]

mod completions;
pub mod memory;
mod regions;
pub mod tcp;
pub mod verbs;

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use thiserror::Error;

use crate::memory::Memory;

/// What a peer needs to reach a registered region: the verbs triple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteRegion {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl RemoteRegion {
    /// The remote address `offset` bytes into the region.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr + offset,
            rkey: self.rkey,
        }
    }
}

/// A place in a peer's region: where a write lands or a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr {
    pub addr: u64,
    pub rkey: u32,
}

/// What the peer may do to a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    pub remote_write: bool,
    pub remote_read: bool,
}

impl Access {
    pub const LOCAL: Access = Access {
        remote_write: false,
        remote_read: false,
    };
    pub const REMOTE_WRITE: Access = Access {
        remote_write: true,
        remote_read: false,
    };
    pub const REMOTE_READ: Access = Access {
        remote_write: false,
        remote_read: true,
    };
}

/// The owner's say over peer writes into a region. `offset` is relative to
/// the region's start, `None` where the backend cannot know it (verbs
/// reports where a notified write landed only through its note); `note` is
/// `None` for a plain write.
pub trait WriteGate: Send + Sync {
    fn admit(&self, offset: Option<u64>, len: u64, note: Option<u32>) -> Result<(), String>;
}

/// A registered memory region.
#[derive(Clone)]
pub struct Region {
    memory: Arc<Memory>,
    lkey: u32,
    remote: RemoteRegion,
    access: Access,
    gate: Option<Arc<dyn WriteGate>>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("lkey", &self.lkey)
            .field("remote", &self.remote)
            .field("access", &self.access)
            .field("gated", &self.gate.is_some())
            .finish()
    }
}

impl Region {
    /// For backends: bundle what registration produced.
    pub fn new(
        memory: Arc<Memory>,
        lkey: u32,
        remote: RemoteRegion,
        access: Access,
        gate: Option<Arc<dyn WriteGate>>,
    ) -> Region {
        Region {
            memory,
            lkey,
            remote,
            access,
            gate,
        }
    }

    pub fn memory(&self) -> &Arc<Memory> {
        &self.memory
    }

    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The descriptor to send to the peer.
    pub fn remote(&self) -> RemoteRegion {
        self.remote
    }

    pub fn access(&self) -> Access {
        self.access
    }

    pub fn gate(&self) -> Option<&Arc<dyn WriteGate>> {
        self.gate.as_ref()
    }

    /// A piece of the region for a work request; `None` if out of bounds.
    pub fn segment(&self, offset: usize, len: usize) -> Option<Segment> {
        self.memory
            .contains(offset as u64, len as u64)
            .then(|| Segment {
                region: self.clone(),
                offset,
                len,
            })
    }
}

/// A scatter/gather element: `len` bytes at `offset` in a registered region.
/// Holding the region keeps the memory alive while the request is in flight.
#[derive(Debug, Clone)]
pub struct Segment {
    region: Region,
    offset: usize,
    len: usize,
}

impl Segment {
    pub fn region(&self) -> &Region {
        &self.region
    }
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_ptr(&self) -> *mut u8 {
        // SAFETY: `Region::segment` checked the range is inside the memory.
        unsafe { self.region.memory.as_ptr().add(self.offset) }
    }
}

/// Total length of a scatter/gather list.
pub fn sgl_len(sgl: &[Segment]) -> usize {
    sgl.iter().map(Segment::len).sum()
}

/// The limits a connection was set up with; callers size windows and chunks
/// from these, never from what some NIC happens to allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Send-queue work requests (sends, writes, reads) outstanding at once.
    pub max_send_wr: u32,
    /// Receives posted at once.
    pub max_recv_wr: u32,
    /// Scatter/gather elements per request.
    pub max_sge: u32,
    /// Largest single message or one-sided transfer.
    pub max_msg: u64,
    /// Bytes a send may carry inline (0: none).
    pub max_inline: u32,
}

/// Which operation a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Send,
    Write,
    WriteNotify,
    Read,
    /// A posted receive that took a peer's send.
    Recv,
    /// A posted receive that took a peer's notified write: the note and the
    /// written length come with it.
    RecvNotify,
}

/// Why a work request failed, as a work completion's status says it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WcError {
    #[error("flushed: the connection went down before this request completed")]
    Flushed,
    #[error("message of {len} bytes does not fit the posted receive of {room}")]
    LocalLength { len: usize, room: usize },
    #[error("remote access error: {0}")]
    RemoteAccess(String),
    /// A notified write the receiving side's gate refused (outside what
    /// was granted): the peer broke the protocol.
    #[error("remote access error: note refused: {0}")]
    NoteRefused(String),
    #[error("no receive was posted for an incoming message (receiver not ready)")]
    ReceiverNotReady,
    #[error("{0}")]
    Fatal(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub op: Op,
    pub status: Result<(), WcError>,
    /// Bytes received (receives) or transferred.
    pub byte_len: u32,
    /// The note of a `RecvNotify`.
    pub note: Option<u32>,
    /// Where a `RecvNotify` landed: region offset, so the receiver does not
    /// have to trust the note alone. Verbs does not report it; the link
    /// derives it from the note there.
    pub landed_at: Option<u64>,
}

/// Why a connection (or a request to post) failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TransportError {
    #[error("connection closed: {0}")]
    Closed(String),
    #[error("peer broke the protocol: {0}")]
    Protocol(String),
    #[error("peer reported: {0}")]
    PeerAbort(String),
    #[error("I/O error: {0}")]
    Io(String),
    #[error("{what} queue full ({limit} outstanding)")]
    QueueFull { what: &'static str, limit: u32 },
    #[error("invalid request: {0}")]
    Invalid(String),
    /// No usable RDMA stack or device for this peer: the signal for
    /// `--transport auto` to fall back to tcp.
    #[error("RDMA unavailable: {0}")]
    Unavailable(String),
}

impl From<std::io::Error> for TransportError {
    fn from(e: std::io::Error) -> Self {
        TransportError::Io(e.to_string())
    }
}

/// Which backend carries a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Verbs through rdma_cm (InfiniBand, RoCE, iWARP).
    Rdma,
    Tcp,
    /// Both ends in this process (a local copy): memory copies, no socket.
    InProcess,
}

impl Backend {
    /// The name users see ("rdma", "tcp", "in-process"), as in `--json`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Rdma => "rdma",
            Backend::Tcp => "tcp",
            Backend::InProcess => "in-process",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One reliable, connected queue pair.
pub trait Connection: Send + Sync + 'static {
    fn backend(&self) -> Backend;

    /// The peer's address, where the backend knows it (for logs).
    fn peer(&self) -> Option<std::net::SocketAddr> {
        None
    }

    /// How logs name the peer: its address, or "rdma peer" (and the like)
    /// where the backend does not know it.
    fn peer_name(&self) -> String {
        self.peer().map_or_else(
            || format!("{} peer", self.backend().name()),
            |a| a.to_string(),
        )
    }

    fn limits(&self) -> Limits;

    /// Registers `memory`; with `gate`, every peer write into it is checked
    /// (see the module docs).
    fn register(
        &self,
        memory: &Arc<Memory>,
        access: Access,
        gate: Option<Arc<dyn WriteGate>>,
    ) -> Result<Region, TransportError>;

    /// # Safety
    /// Nothing may read or write `buf` until this request completes.
    unsafe fn post_recv(&self, wr_id: u64, buf: Segment) -> Result<(), TransportError>;

    /// # Safety
    /// Nothing may write the segments until this request completes.
    unsafe fn post_send(&self, wr_id: u64, sgl: &[Segment]) -> Result<(), TransportError>;

    /// # Safety
    /// Nothing may write the segments until this request completes.
    unsafe fn write_notify(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
        note: u32,
    ) -> Result<(), TransportError>;

    /// # Safety
    /// Nothing may write the segments until this request completes.
    unsafe fn write(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
    ) -> Result<(), TransportError>;

    /// # Safety
    /// Nothing may read or write `local` until this request completes.
    unsafe fn read(
        &self,
        wr_id: u64,
        local: Segment,
        remote: RemoteAddr,
    ) -> Result<(), TransportError>;

    /// Moves ready completions into `out`. `Ready(Ok)` when at least one
    /// was added; `Ready(Err)` once the connection is down and every
    /// completion has been delivered.
    fn poll_completions(
        &self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
    ) -> Poll<Result<(), TransportError>>;

    /// Tears the connection down: outstanding requests are flushed.
    fn close(&self);
}

/// Drains a connection that is going down (every remaining completion is
/// dropped) and returns why it went.
pub async fn closed_reason(conn: &dyn Connection) -> TransportError {
    let mut sink = Vec::new();
    loop {
        if let Err(e) = completions(conn, &mut sink).await {
            return e;
        }
        sink.clear();
    }
}

/// Waits for completions (see [`Connection::poll_completions`]).
pub async fn completions(
    conn: &dyn Connection,
    out: &mut Vec<Completion>,
) -> Result<(), TransportError> {
    std::future::poll_fn(|cx| conn.poll_completions(cx, out)).await
}
