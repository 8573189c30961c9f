//! A link: one connection, one landing ring per side, the credit engine and
//! the wire messages, put together into the API rcp and rblock use.
//!
//! * [`Link::send_chunk`] waits for a slot credit, then writes the chunk
//!   header and the payload (straight from a pool buffer) into the peer's
//!   slot with one notified write. The buffer is owned by the link until the
//!   write completes, which is how the transport's "don't touch posted
//!   memory" contract is kept without `unsafe` in callers.
//!   [`Link::send_landed`] does the same for a chunk that landed on another
//!   link, straight from its landing slot (a broadcast node forwarding it):
//!   the link holds the [`Chunk`], and with it the slot and its credit,
//!   until the write completes.
//! * [`Link::recv`] yields landed chunks (read in place; dropping the
//!   [`Chunk`] returns its slot credit) and application messages, in the
//!   order the peer sent them.
//! * [`Link::send_message`] sends a small application message.
//! * [`Link::finish`] says goodbye and waits for the peer's.
//!
//! A driver task polls the connection's completions, applies piggybacked
//! credits, validates every chunk header and message, reposts receives and
//! sends standalone credit updates when the engine asks for one. Any breach
//! of the protocol fails the link: the peer gets an error message when one
//! can still be sent, the connection closes, and every waiter sees why.
//! The rules from hello to goodbye are a machine of their own, without
//! I/O: [`lifecycle`].
//!
//! Once the application has authenticated the peer, [`Link::seal_incoming`]
//! and [`Link::seal_outgoing`] bind everything after to that session
//! ([`seal`]: a tag on every frame and chunk, encryption if chosen).
#![allow(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use thiserror::Error;
use tokio::sync::Notify;

use crate::credit::{CreditError, Inbound, Outbound, SPARE_RECEIVES};
use crate::memory::{Memory, MemoryError, PoolBuf};
use crate::transport::{
    Access, Backend, Completion, Connection, Op, Region, RemoteAddr, Segment, TransportError,
    WcError, WriteGate, closed_reason, completions,
};
use crate::wire::{
    self, Body, CHUNK_HEADER_LEN, CHUNK_HEADER_SEALED_LEN, ChunkHeader, CreditUpdate, ErrorCode,
    FRAME_HEADER_LEN, Frame, Hello, RingDescriptor, Role, WireError, chunk_flags,
};
use heartbeat::Heartbeat;
use lifecycle::{Heard, Lifecycle, check_hello};
use seal::{Before, Opened, Opener, Protection, SealError, Sealer, TAG_LEN};

pub mod heartbeat;
pub mod lifecycle;
pub mod seal;

/// How long a sender whose post the connection refused waits for the
/// driver to settle why the link ended (see [`Link::why_post_failed`]).
/// Longer than the tcp backend's reader grace, so the peer's report, if
/// it sent one, is read first.
const SETTLE_AFTER_POST_FAILED: std::time::Duration = std::time::Duration::from_secs(5);

/// How one side of a link is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkConfig {
    pub role: Role,
    /// Slots in this side's landing ring (0: this side receives no chunks).
    pub slot_count: u32,
    /// Bytes per slot, chunk header included.
    pub slot_size: u32,
    /// Control receives kept posted: the peer's control credits.
    pub control_depth: u32,
    /// Size of each control receive (and send) buffer.
    pub control_size: u32,
    pub features: u32,
    /// How long the peer may send nothing at all (not even its heartbeat)
    /// before the link fails as lost; `None`: wait for ever.
    pub silence: Option<std::time::Duration>,
}

impl LinkConfig {
    /// A ring of `slot_count` slots carrying up to `chunk` payload bytes each.
    pub fn new(role: Role, slot_count: u32, chunk: u32) -> LinkConfig {
        LinkConfig {
            role,
            slot_count,
            slot_size: chunk + CHUNK_HEADER_LEN as u32,
            control_depth: 16,
            control_size: 4096,
            features: 0,
            silence: Some(heartbeat::DEFAULT_SILENCE),
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LinkError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("malformed message from peer: {0}")]
    Wire(#[from] WireError),
    #[error("peer broke the credit rules: {0}")]
    Credit(#[from] CreditError),
    #[error("peer broke the protocol: {0}")]
    Protocol(String),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("peer reported an error ({code:?}): {text}")]
    Peer { code: ErrorCode, text: String },
    #[error("invalid link configuration: {0}")]
    Config(String),
    #[error("the link is finished")]
    Finished,
    #[error("the peer sent nothing for {} s: it stopped, or the path to it is gone", .0.as_secs())]
    Silent(std::time::Duration),
}

impl From<MemoryError> for LinkError {
    fn from(e: MemoryError) -> Self {
        LinkError::Config(e.to_string())
    }
}

impl LinkError {
    fn code(&self) -> ErrorCode {
        match self {
            LinkError::Wire(WireError::Version { .. }) => ErrorCode::Version,
            LinkError::Config(_) | LinkError::Finished => ErrorCode::Internal,
            LinkError::Seal(_) => ErrorCode::Tampered,
            _ => ErrorCode::Protocol,
        }
    }

    /// Whether the link ended because something failed its session check,
    /// here or at the peer: tampering on the path (or a peer with other
    /// keys), not a mere loss of the connection.
    pub fn is_tampering(&self) -> bool {
        matches!(
            self,
            LinkError::Seal(_)
                | LinkError::Peer {
                    code: ErrorCode::Tampered,
                    ..
                }
        )
    }
}

/// What the peer sent, in order.
#[derive(Debug)]
pub enum Incoming {
    Chunk(Chunk),
    Message(Vec<u8>),
}

impl Incoming {
    /// What it is, in words.
    fn what(&self) -> &'static str {
        match self {
            Incoming::Chunk(_) => "chunk",
            Incoming::Message(_) => "message",
        }
    }
}

/// Caller-supplied fields of a chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkMeta {
    /// What the chunk is part of (the header's `owner`).
    pub owner: u64,
    pub offset: u64,
    pub flags: u32,
    pub digest: [u8; 32],
}

/// A chunk that landed in this side's ring. Its slot is credited back to
/// the peer when this is dropped, so keep it only as long as its bytes are
/// needed.
pub struct Chunk {
    inner: Arc<Inner>,
    seq: u64,
    index: u32,
    header: ChunkHeader,
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("seq", &self.seq)
            .field("header", &self.header)
            .finish()
    }
}

impl Chunk {
    pub fn header(&self) -> &ChunkHeader {
        &self.header
    }

    /// The slot sequence number (the chunk's place in the peer's stream of
    /// chunks on this link).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The landing ring the chunk lies in: register it with another link
    /// to send the chunk on from there ([`Link::send_landed`]).
    pub fn memory(&self) -> &Arc<Memory> {
        self.inner.ring.memory()
    }

    /// Where the payload starts in [`Chunk::memory`].
    fn payload_offset(&self) -> usize {
        self.index as usize * self.inner.config.slot_size as usize + CHUNK_HEADER_LEN
    }

    pub fn payload(&self) -> &[u8] {
        let start = self.payload_offset();
        // SAFETY: the slot is in state Landed until this chunk is dropped; the
        // ring's write gate refuses every peer write into it meanwhile (on
        // verbs the NIC cannot be stopped, but a peer that writes there breaks
        // the credit rules and fails the link on its next note). The range
        // was checked against the slot when the header was decoded.
        unsafe {
            self.inner
                .ring
                .memory()
                .slice(start, self.header.payload_len as usize)
        }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let due = {
            let mut inbound = self.inner.inbound.lock().expect("inbound lock");
            inbound.on_consumed(self.seq);
            inbound.wants_standalone()
        };
        if due {
            self.inner.credit_due.notify_one();
        }
    }
}

/// The ring's gate: the credit engine decides whether a peer write lands.
struct RingGate(Arc<Mutex<Inbound>>);

impl WriteGate for RingGate {
    fn admit(&self, offset: Option<u64>, len: u64, note: Option<u32>) -> Result<(), String> {
        let Some(note) = note else {
            return Err("plain writes into the landing ring are not allowed".into());
        };
        let mut inbound = self.0.lock().expect("inbound lock");
        inbound
            .on_landed(note, offset, len)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// What an outstanding send-side request holds on to.
enum InFlight {
    Chunk { _payload: Payload, header: u32 },
    Control { buf: u32 },
}

/// What a chunk's payload is sent from; held until its write completes.
enum Payload {
    /// A buffer of the sender's pool (sealing may encrypt it in place).
    Pool(PoolBuf),
    /// A chunk that landed on another link, sent on as it is (never
    /// changed: it is only sent where sealing leaves payloads alone).
    Landed(Arc<Chunk>),
    /// A pool buffer the caller keeps too (never changed, as `Landed`).
    Kept(Arc<PoolBuf>),
}

impl Payload {
    fn memory(&self) -> &Arc<Memory> {
        match self {
            Payload::Pool(buf) => buf.pool().memory(),
            Payload::Landed(chunk) => chunk.memory(),
            Payload::Kept(buf) => buf.pool().memory(),
        }
    }

    /// Offset and length in [`Payload::memory`].
    fn range(&self) -> (usize, usize) {
        match self {
            Payload::Pool(buf) => (buf.offset(), buf.len()),
            Payload::Landed(chunk) => (chunk.payload_offset(), chunk.payload().len()),
            Payload::Kept(buf) => (buf.offset(), buf.len()),
        }
    }
}

struct State {
    outbound: Outbound,
    free_send_bufs: Vec<u32>,
    header_busy: Vec<bool>,
    in_flight: HashMap<u64, InFlight>,
    next_wr: u64,
    /// What the peer sent, each with whether it came sealed.
    incoming: VecDeque<(Incoming, bool)>,
    /// Set by [`Link::seal_incoming`] with [`Before::CreditsOnly`]: from
    /// then on nothing unsealed is queued, whenever it was opened.
    strict: bool,
    /// Hello to goodbye: what may be sent and heard, how the link ended.
    life: Lifecycle,
    /// Seals what this side sends, once [`Link::seal_outgoing`] was called.
    sealer: Option<Sealer>,
    /// Control frames posted so far (the heartbeat's count).
    frames_posted: u64,
}

struct Inner {
    conn: Arc<dyn Connection>,
    config: LinkConfig,
    peer: Hello,
    ring: Region,
    recv_bufs: Region,
    send_bufs: Region,
    headers: Region,
    inbound: Arc<Mutex<Inbound>>,
    state: Mutex<State>,
    /// Checks what the peer sends, once [`Link::seal_incoming`] was called
    /// (only the driver opens; the lock is for installing it).
    opener: Mutex<Option<Opener>>,
    /// Wakes senders and receivers when state changed.
    changed: Notify,
    /// Wakes the driver when a credit update may be due.
    credit_due: Notify,
}

/// One established link. Cheap to clone; all clones share it.
#[derive(Clone)]
pub struct Link {
    inner: Arc<Inner>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("backend", &self.inner.conn.backend())
            .field("config", &self.inner.config)
            .field("peer", &self.inner.peer)
            .finish()
    }
}

fn validate(config: &LinkConfig) -> Result<(), LinkError> {
    let bad = |what: &str| Err(LinkError::Config(what.to_string()));
    if !(wire::MIN_CONTROL_DEPTH..=wire::MAX_CONTROL_DEPTH).contains(&config.control_depth) {
        return bad("control depth out of range");
    }
    if !(wire::MIN_CONTROL_SIZE..=wire::MAX_CONTROL_SIZE).contains(&config.control_size) {
        return bad("control size out of range");
    }
    if config.slot_count > wire::MAX_SLOTS {
        return bad("too many slots");
    }
    if config.slot_count > 0
        && !(CHUNK_HEADER_LEN as u32 + 1..=wire::MAX_SLOT_SIZE).contains(&config.slot_size)
    {
        return bad("slot size out of range");
    }
    Ok(())
}

/// Memory of `count` pieces of `size`, never empty (a zero-slot ring still
/// gets a page so that registration has something to register).
fn pieces(count: u32, size: u32) -> Result<Arc<Memory>, LinkError> {
    let len = (count as usize)
        .checked_mul(size as usize)
        .ok_or_else(|| LinkError::Config("ring too large".into()))?;
    Ok(Memory::new(len.max(1))?)
}

impl Link {
    /// Sets up this side of a link on a fresh connection and exchanges
    /// hellos. Both sides call it; it returns once the peer's hello has been
    /// received and checked.
    pub async fn establish(
        conn: Arc<dyn Connection>,
        config: LinkConfig,
    ) -> Result<Link, LinkError> {
        validate(&config)?;
        let limits = conn.limits();
        let recv_count = config.slot_count + config.control_depth + SPARE_RECEIVES;
        if recv_count > limits.max_recv_wr {
            return Err(LinkError::Config(format!(
                "{recv_count} receives needed, the connection allows {}",
                limits.max_recv_wr
            )));
        }
        let inbound = Arc::new(Mutex::new(Inbound::new(
            config.slot_count,
            config.slot_size,
            config.control_depth,
        )));
        let ring = conn.register(
            &pieces(config.slot_count, config.slot_size)?,
            Access::REMOTE_WRITE,
            Some(Arc::new(RingGate(Arc::clone(&inbound)))),
        )?;
        let recv_bufs = conn.register(
            &pieces(recv_count, config.control_size)?,
            Access::LOCAL,
            None,
        )?;
        let send_bufs = conn.register(
            &pieces(config.control_depth, config.control_size)?,
            Access::LOCAL,
            None,
        )?;
        for i in 0..recv_count {
            // SAFETY: a fresh region: no receive is posted in it yet.
            unsafe { post_recv(&*conn, &recv_bufs, config.control_size, i)? };
        }
        let hello = Hello {
            version: wire::VERSION,
            role: config.role,
            features: config.features,
            ring: RingDescriptor {
                addr: ring.remote().addr,
                rkey: ring.remote().rkey,
                slot_count: config.slot_count,
                slot_size: config.slot_size,
            },
            control_depth: config.control_depth,
            control_size: config.control_size,
        };
        let hello_frame = Frame {
            credit: CreditUpdate {
                grant_limit: config.slot_count.into(),
                control_return: 0,
            },
            body: Body::Hello(hello),
        };
        // Send buffer 0 carries the hello; its completion frees it later.
        // SAFETY: a fresh region: no send is posted from it yet.
        let len = hello_frame.encode(unsafe { send_slice(&send_bufs, config.control_size, 0) });
        let hello_wr = 0;
        // SAFETY: send buffer 0 is not touched again until this send's
        // completion returns it to the free list.
        unsafe {
            conn.post_send(
                hello_wr,
                &[send_segment(&send_bufs, config.control_size, 0, len)],
            )?
        };

        let mut backlog = Vec::new();
        let peer = loop {
            let mut batch = Vec::new();
            completions(&*conn, &mut batch).await?;
            let mut found = None;
            for c in batch {
                if found.is_none() && matches!(c.op, Op::Recv | Op::RecvNotify) {
                    found = Some(c);
                } else {
                    backlog.push(c);
                }
            }
            if let Some(first) = found {
                if first.status == Err(WcError::Flushed) {
                    // The connection went down before any hello: its own
                    // reason (a refusal from the peer, say) says more.
                    return Err(LinkError::Transport(closed_reason(&*conn).await));
                }
                match read_peer_hello(&recv_bufs, &config, &first) {
                    Ok(h) => break h,
                    Err(e) => {
                        // Tell the peer why, if the connection still carries
                        // it, in a frame that fits the smallest receive
                        // buffer any peer may have posted.
                        let text = e.to_string();
                        let frame_size = config.control_size.min(wire::MIN_CONTROL_SIZE);
                        let frame = Frame {
                            credit: CreditUpdate::default(),
                            body: Body::Error {
                                code: e.code(),
                                text: wire::fit_error_text(&text, frame_size as usize),
                            },
                        };
                        // SAFETY: only buffer 0 (the hello) may be posted.
                        let buf = unsafe { send_slice(&send_bufs, config.control_size, 1) };
                        let len = frame.encode(buf);
                        // SAFETY: buffer 1 is unused; the connection is
                        // closed right after, which flushes this send.
                        let _ = unsafe {
                            conn.post_send(
                                1,
                                &[send_segment(&send_bufs, config.control_size, 1, len)],
                            )
                        };
                        conn.close();
                        return Err(e);
                    }
                }
            }
        };
        // The hello came in receive 0 (the first posted); it is decoded, so
        // the buffer goes back into service.
        // SAFETY: receive 0 completed and its contents were decoded.
        unsafe { post_recv(&*conn, &recv_bufs, config.control_size, 0)? };

        let headers = conn.register(
            &pieces(peer.ring.slot_count.max(1), CHUNK_HEADER_LEN as u32)?,
            Access::LOCAL,
            None,
        )?;
        let mut in_flight = HashMap::new();
        in_flight.insert(hello_wr, InFlight::Control { buf: 0 });
        let state = State {
            outbound: Outbound::new(peer.ring.slot_count, peer.control_depth),
            free_send_bufs: (1..config.control_depth).rev().collect(),
            header_busy: vec![false; peer.ring.slot_count as usize],
            in_flight,
            next_wr: 1,
            incoming: VecDeque::new(),
            strict: false,
            life: Lifecycle::new(),
            sealer: None,
            frames_posted: 0,
        };
        let inner = Arc::new(Inner {
            conn,
            config,
            peer,
            ring,
            recv_bufs,
            send_bufs,
            headers,
            inbound,
            state: Mutex::new(state),
            opener: Mutex::new(None),
            changed: Notify::new(),
            credit_due: Notify::new(),
        });
        tokio::spawn(drive(Arc::clone(&inner), backlog));
        Ok(Link { inner })
    }

    /// The transport backend in use ("tcp", "rdma").
    pub fn backend(&self) -> Backend {
        self.inner.conn.backend()
    }

    /// The peer's hello.
    pub fn peer(&self) -> &Hello {
        &self.inner.peer
    }

    /// Largest chunk payload the peer's ring takes (0: it takes none).
    pub fn max_chunk(&self) -> usize {
        self.inner.peer.ring.max_payload()
    }

    /// Slots of this side's landing ring: chunks the peer may have in
    /// flight to it at once. Their credits return in order, so one chunk
    /// kept holds back every slot after it.
    pub fn ring_slots(&self) -> u32 {
        self.inner.config.slot_count
    }

    /// Largest application message either side's buffers take (room for
    /// a seal's tag is always kept).
    pub fn max_message(&self) -> usize {
        self.inner
            .config
            .control_size
            .min(self.inner.peer.control_size) as usize
            - FRAME_HEADER_LEN
            - TAG_LEN
    }

    /// From now on, every chunk from the peer must be sealed with `key`
    /// (the peer's direction's session key) under `protection`, and every
    /// frame from its first sealed one on; `before` says which unsealed
    /// frames pass until then. Call it before the peer can have sealed
    /// anything: the side that proves itself first (the client) before its
    /// proof goes out, with [`Before::Anything`]; the other side on checking
    /// that proof, before it answers, with [`Before::CreditsOnly`].
    ///
    /// With [`Before::CreditsOnly`], anything already queued and not yet
    /// taken came after the proof the caller just took, unsealed: the link
    /// fails on it (so does anything the driver opened before this call and
    /// queues after it).
    pub fn seal_incoming(
        &self,
        protection: Protection,
        key: &[u8; 32],
        before: Before,
    ) -> Result<(), LinkError> {
        let mut st = self.state();
        if before == Before::CreditsOnly {
            if let Some((item, _)) = st.incoming.iter().find(|(_, sealed)| !sealed) {
                let what = item.what();
                drop(st);
                let e = LinkError::Seal(SealError::AfterProof { what });
                fail(&self.inner, e.clone());
                return Err(e);
            }
            st.strict = true;
        }
        *self.inner.opener.lock().expect("opener lock") =
            Some(Opener::new(protection, key, before));
        Ok(())
    }

    /// From now on, every frame and chunk this side sends is sealed with
    /// `key` (this direction's session key) under `protection`.
    pub fn seal_outgoing(&self, protection: Protection, key: &[u8; 32]) {
        self.state().sealer = Some(Sealer::new(protection, key));
    }

    /// How this side's sending half is sealed, if it is.
    pub fn protection(&self) -> Option<Protection> {
        self.state().sealer.as_ref().map(Sealer::protection)
    }

    /// Registers memory (a buffer pool's) for chunks sent on this link.
    pub fn register(&self, memory: &Arc<Memory>) -> Result<Region, LinkError> {
        Ok(self.inner.conn.register(memory, Access::LOCAL, None)?)
    }

    /// This side's landing ring memory, for tests that check a refused
    /// write left it untouched.
    #[doc(hidden)]
    pub fn ring_memory(&self) -> &Arc<Memory> {
        self.inner.ring.memory()
    }

    /// The transport connection, for tests that misbehave on purpose.
    #[doc(hidden)]
    pub fn connection(&self) -> &Arc<dyn Connection> {
        &self.inner.conn
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().expect("state lock")
    }

    /// Sends `buf` (its `len()` bytes) as one chunk. `region` is the
    /// registration of the pool `buf` came from. Waits for a slot credit;
    /// returns once the write is posted. The buffer goes back to its pool
    /// when the write completes.
    pub async fn send_chunk(
        &self,
        meta: ChunkMeta,
        region: &Region,
        buf: PoolBuf,
    ) -> Result<(), LinkError> {
        self.post_chunk(meta, region, Payload::Pool(buf)).await
    }

    /// Whether this link's seal would change the payload of a chunk sent
    /// with `flags` (encrypt it): such a chunk cannot go by
    /// [`Link::send_landed`].
    pub fn seals_payload(&self, flags: u32) -> bool {
        let digest_inside = flags & chunk_flags::DIGEST != 0;
        self.state()
            .sealer
            .as_ref()
            .is_some_and(|s| s.covers_payload(digest_inside))
    }

    /// Sends `chunk`, which landed on another link, on as it is: the
    /// write reads its payload straight from that link's landing slot.
    /// `region` is that landing ring ([`Chunk::memory`]) registered with
    /// this link. The link holds the chunk (its slot, and the credit its
    /// sender waits for) until the write completes. Refused where this
    /// link's seal would change the payload ([`Link::seals_payload`]).
    pub async fn send_landed(
        &self,
        meta: ChunkMeta,
        region: &Region,
        chunk: Arc<Chunk>,
    ) -> Result<(), LinkError> {
        self.post_unchanged(meta, region, Payload::Landed(chunk), "a landed chunk")
            .await
    }

    /// Sends `buf` as one chunk while the caller keeps it too: the data
    /// stays as it is, to be sent again on another link if this one fails
    /// before the peer answers. `region` is the registration of its pool.
    /// Refused where this link's seal would change the payload
    /// ([`Link::seals_payload`]), which would leave the caller ciphertext.
    pub async fn send_kept(
        &self,
        meta: ChunkMeta,
        region: &Region,
        buf: Arc<PoolBuf>,
    ) -> Result<(), LinkError> {
        self.post_unchanged(meta, region, Payload::Kept(buf), "a kept buffer")
            .await
    }

    /// Posts a payload others read meanwhile, which must not change:
    /// refused where the seal would encrypt it in place.
    async fn post_unchanged(
        &self,
        meta: ChunkMeta,
        region: &Region,
        payload: Payload,
        what: &str,
    ) -> Result<(), LinkError> {
        if self.seals_payload(meta.flags) {
            return Err(LinkError::Config(format!(
                "this link's seal changes payloads: {what} cannot be sent as it is"
            )));
        }
        self.post_chunk(meta, region, payload).await
    }

    async fn post_chunk(
        &self,
        meta: ChunkMeta,
        region: &Region,
        mut payload: Payload,
    ) -> Result<(), LinkError> {
        if !Arc::ptr_eq(region.memory(), payload.memory()) {
            return Err(LinkError::Config(
                "payload is not in the given region".into(),
            ));
        }
        let (offset, len) = payload.range();
        if len > self.max_chunk() {
            return Err(LinkError::Config(format!(
                "chunk of {} bytes exceeds the peer's slot payload of {}",
                len,
                self.max_chunk()
            )));
        }
        if meta.flags & !wire::chunk_flags::KNOWN != 0 {
            return Err(LinkError::Config("unknown chunk flags".into()));
        }
        let inner = &self.inner;
        loop {
            let changed = inner.changed.notified();
            let refused = {
                let mut st = self.state();
                st.life.may_send()?;
                let next_header =
                    (st.outbound.sent() % u64::from(inner.peer.ring.slot_count.max(1))) as usize;
                // Two send-queue entries per chunk at most (write, then note
                // send, on devices without write-with-immediate).
                let queue_room = st.in_flight.len() + 2 <= inner.conn.limits().max_send_wr as usize;
                if queue_room && st.outbound.slots_available() > 0 && !st.header_busy[next_header] {
                    let ticket = st.outbound.try_slot().expect("credit checked");
                    let mut header = ChunkHeader {
                        payload_len: len as u32,
                        owner: meta.owner,
                        offset: meta.offset,
                        flags: meta.flags,
                        note: ticket.note,
                        digest: meta.digest,
                        tag: [0; TAG_LEN],
                    };
                    if let Some(sealer) = &st.sealer {
                        let covered = header.encode();
                        let digest_inside = meta.flags & chunk_flags::DIGEST != 0;
                        let body = match &mut payload {
                            Payload::Pool(buf) => buf.data_mut(),
                            // (Checked on entry: the seal covers the header
                            // alone, and the sealer is set once.)
                            Payload::Landed(_) | Payload::Kept(_) => {
                                debug_assert!(!sealer.covers_payload(digest_inside));
                                &mut []
                            }
                        };
                        header.tag = sealer.seal_chunk(
                            ticket.seq,
                            &covered[..CHUNK_HEADER_SEALED_LEN],
                            body,
                            digest_inside,
                        );
                    }
                    let hoff = ticket.index as usize * CHUNK_HEADER_LEN;
                    // SAFETY: header slot `index` is not busy (checked above),
                    // so no posted write reads it; the state lock serialises
                    // senders.
                    unsafe { inner.headers.memory().slice_mut(hoff, CHUNK_HEADER_LEN) }
                        .copy_from_slice(&header.encode());
                    let sgl = [
                        inner
                            .headers
                            .segment(hoff, CHUNK_HEADER_LEN)
                            .expect("header in range"),
                        region.segment(offset, len).expect("payload in its region"),
                    ];
                    let remote = slot_addr(&inner.peer.ring, ticket.index);
                    let wr = st.next_wr;
                    st.next_wr += 1;
                    // SAFETY: the header slot and the payload stay untouched
                    // until the completion: the header slot is marked busy,
                    // and the payload is owned by `in_flight`: a pool
                    // buffer's lease; a kept buffer, shared through an
                    // `Arc`, which gives its data out to read only (writing
                    // needs `&mut`, which no holder gets while this one
                    // lives); or a landed chunk, whose slot its ring keeps
                    // closed to peer writes while it lives (and which
                    // nobody writes locally: a chunk gives its payload out
                    // to read only).
                    match unsafe { inner.conn.write_notify(wr, &sgl, remote, ticket.note) } {
                        Ok(()) => {
                            st.header_busy[ticket.index as usize] = true;
                            st.in_flight.insert(
                                wr,
                                InFlight::Chunk {
                                    _payload: payload,
                                    header: ticket.index,
                                },
                            );
                            return Ok(());
                        }
                        Err(e) => Some(e),
                    }
                } else {
                    None
                }
            };
            if let Some(e) = refused {
                return Err(self.why_post_failed(e).await);
            }
            changed.await;
        }
    }

    /// Sends one application message of at most [`Link::max_message`] bytes.
    pub async fn send_message(&self, payload: &[u8]) -> Result<(), LinkError> {
        if payload.is_empty() || payload.len() > self.max_message() {
            return Err(LinkError::Config(format!(
                "message of {} bytes: must be 1..={}",
                payload.len(),
                self.max_message()
            )));
        }
        self.send_control(Body::App(payload)).await
    }

    async fn send_control(&self, body: Body<'_>) -> Result<(), LinkError> {
        loop {
            let changed = self.inner.changed.notified();
            let refused = {
                let mut st = self.state();
                st.life.may_send()?;
                match try_post_control(&self.inner, &mut st, &body) {
                    Ok(true) => {
                        if matches!(body, Body::Goodbye { .. }) {
                            st.life.said_goodbye();
                        }
                        return Ok(());
                    }
                    Ok(false) => None,
                    Err(LinkError::Transport(e)) => Some(e),
                    Err(e) => return Err(e),
                }
            };
            if let Some(e) = refused {
                return Err(self.why_post_failed(e).await);
            }
            changed.await;
        }
    }

    /// Why a post that the connection refused failed. A connection that
    /// went down may still hand over what arrived before: the peer's
    /// report of why it gave up (a seal it refused, say) comes behind our
    /// failed send. That report, settled by the driver as the link's
    /// error, is the cause a user must see, not the broken pipe it led
    /// to; so this waits a while for the driver to settle it.
    async fn why_post_failed(&self, error: TransportError) -> LinkError {
        if !matches!(
            error,
            TransportError::Closed(_) | TransportError::Io(_) | TransportError::PeerAbort(_)
        ) {
            return LinkError::Transport(error);
        }
        let settled = async {
            loop {
                let changed = self.inner.changed.notified();
                let settled = self.state().life.error().cloned();
                if let Some(e) = settled {
                    return e;
                }
                changed.await;
            }
        };
        tokio::time::timeout(SETTLE_AFTER_POST_FAILED, settled)
            .await
            .unwrap_or(LinkError::Transport(error))
    }

    /// The next chunk or message from the peer, in the order it was sent;
    /// `None` once the peer said goodbye.
    pub async fn recv(&self) -> Result<Option<Incoming>, LinkError> {
        loop {
            let changed = self.inner.changed.notified();
            {
                let mut st = self.state();
                if let Some(item) = self.take_incoming(&mut st) {
                    return Ok(Some(item));
                }
                if let Some(end) = st.life.receive_end() {
                    return end.map(|()| None);
                }
            }
            changed.await;
        }
    }

    /// Takes the next incoming item; a message's control credit becomes
    /// owed to the peer as it is handed out.
    fn take_incoming(&self, st: &mut State) -> Option<Incoming> {
        let (item, _) = st.incoming.pop_front()?;
        if matches!(item, Incoming::Message(_)) {
            let due = {
                let mut inbound = self.inner.inbound.lock().expect("inbound lock");
                inbound.on_control_consumed();
                inbound.wants_standalone()
            };
            if due {
                self.inner.credit_due.notify_one();
            }
        }
        Some(item)
    }

    /// Says goodbye, waits until everything sent has completed and the peer
    /// said goodbye too (draining and dropping whatever it still sends),
    /// then closes the connection.
    pub async fn finish(&self) -> Result<(), LinkError> {
        self.send_control(Body::Goodbye { reason: 0 }).await?;
        loop {
            let changed = self.inner.changed.notified();
            {
                let st = self.state();
                if let Some(end) = st.life.finished(st.in_flight.is_empty()) {
                    end?;
                    break;
                }
            }
            // Drain the peer's last chunks and messages so its credits flow.
            let drained = self.take_incoming(&mut self.state());
            if drained.is_some() {
                continue;
            }
            changed.await;
        }
        self.inner.conn.close();
        Ok(())
    }

    /// Fails the link now: tells the peer `text` and closes.
    pub fn abort(&self, text: &str) {
        fail(
            &self.inner,
            LinkError::Protocol(format!("aborted locally: {text}")),
        );
    }
}

/// Remote address of slot `index` of the peer's ring.
fn slot_addr(ring: &RingDescriptor, index: u32) -> RemoteAddr {
    RemoteAddr {
        addr: ring.addr + u64::from(index) * u64::from(ring.slot_size),
        rkey: ring.rkey,
    }
}

/// Send buffer `index`, to fill.
///
/// # Safety
/// No posted send reads buffer `index` (the caller took it off the free
/// list, or, during the hello, it was never handed out), and nobody else
/// holds it while the slice lives.
#[allow(clippy::mut_from_ref)]
unsafe fn send_slice(bufs: &Region, size: u32, index: u32) -> &mut [u8] {
    // SAFETY: passed on from the caller.
    unsafe {
        bufs.memory()
            .slice_mut(index as usize * size as usize, size as usize)
    }
}

fn send_segment(bufs: &Region, size: u32, index: u32, len: usize) -> Segment {
    bufs.segment(index as usize * size as usize, len)
        .expect("send buffer in range")
}

/// Posts receive buffer `index`.
///
/// # Safety
/// Buffer `index` is not posted already, and what it held was copied out:
/// it is read again only after this receive's completion.
unsafe fn post_recv(
    conn: &dyn Connection,
    bufs: &Region,
    size: u32,
    index: u32,
) -> Result<(), TransportError> {
    let seg = bufs
        .segment(index as usize * size as usize, size as usize)
        .expect("receive buffer in range");
    // SAFETY: passed on from the caller.
    unsafe { conn.post_recv(u64::from(index), seg) }
}

fn read_peer_hello(
    recv_bufs: &Region,
    config: &LinkConfig,
    first: &Completion,
) -> Result<Hello, LinkError> {
    first
        .status
        .clone()
        .map_err(|e| LinkError::Protocol(format!("receive failed: {e}")))?;
    if first.op != Op::Recv || first.wr_id != 0 {
        return Err(LinkError::Protocol(
            "the peer's first message was not a hello".into(),
        ));
    }
    let size = config.control_size as usize;
    // SAFETY: receive 0 completed; nothing else touches it until reposted.
    let bytes = unsafe {
        recv_bufs
            .memory()
            .slice(0, (first.byte_len as usize).min(size))
    };
    check_hello(config.role, &Frame::decode(bytes)?)
}

/// Posts a control message if a send buffer and (except for a standalone
/// credit update, which costs none) a control credit allow; `Ok(false)` if it
/// must wait.
fn try_post_control(inner: &Inner, st: &mut State, body: &Body<'_>) -> Result<bool, LinkError> {
    let needs_credit = !matches!(body, Body::Credit);
    if st.free_send_bufs.is_empty() || (needs_credit && !st.outbound.try_control()) {
        return Ok(false);
    }
    let buf = st.free_send_bufs.pop().expect("checked");
    let credit = inner.inbound.lock().expect("inbound lock").take_update();
    let frame = Frame {
        credit,
        body: body.clone(),
    };
    let size = inner.config.control_size;
    // SAFETY: `buf` came off the free list: no posted send reads it.
    let out = unsafe { send_slice(&inner.send_bufs, size, buf) };
    let mut len = frame.encode(out);
    if let Some(sealer) = &mut st.sealer {
        len = sealer.seal_frame(out, len);
    }
    let wr = st.next_wr;
    st.next_wr += 1;
    // SAFETY: `buf` came off the free list and returns to it on completion.
    unsafe {
        inner
            .conn
            .post_send(wr, &[send_segment(&inner.send_bufs, size, buf, len)])?
    };
    st.in_flight.insert(wr, InFlight::Control { buf });
    st.frames_posted += 1;
    Ok(true)
}

fn fail(inner: &Inner, error: LinkError) {
    let mut st = inner.state.lock().expect("state lock");
    // (After both goodbyes, the flushes of the closing connection are no
    // failure.)
    let Some(tell_peer) = st.life.fail(error.clone()) else {
        return;
    };
    if tell_peer {
        let text = error.to_string();
        let frame_size = inner.config.control_size.min(inner.peer.control_size) as usize - TAG_LEN;
        let _ = try_post_control(
            inner,
            &mut st,
            &Body::Error {
                code: error.code(),
                text: wire::fit_error_text(&text, frame_size),
            },
        );
    }
    drop(st);
    inner.conn.close();
    inner.changed.notify_waiters();
}

async fn drive(inner: Arc<Inner>, backlog: Vec<Completion>) {
    let mut batch = backlog;
    let mut heartbeat = Heartbeat::new(inner.config.silence);
    let mut beats = tokio::time::interval_at(
        tokio::time::Instant::now() + heartbeat::BEAT,
        heartbeat::BEAT,
    );
    // (A driver held up, its process stopped, say, ticks once when it runs
    // again: the silence counts beats it saw, not time that passed.)
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = 0u64;
    loop {
        let mut breached = false;
        for c in batch.drain(..) {
            let received = matches!(c.op, Op::Recv | Op::RecvNotify);
            if received {
                // Nothing the peer sent after a breach is handed out (the
                // rest of the batch's receives are dropped, later ones
                // ignored in `handle`): what came behind an injected frame
                // must not complete a file.
                if breached {
                    continue;
                }
                heard += 1;
            }
            // (Finished sends are still handled: what they held goes back,
            // and a landed chunk sent on holds its own link's credit.)
            if let Err(e) = handle(&inner, c) {
                fail(&inner, e);
                breached = true;
            }
        }
        send_standalone_credit(&inner);
        inner.changed.notify_waiters();
        tokio::select! {
            r = completions(&*inner.conn, &mut batch) => {
                if let Err(e) = r {
                    let mut st = inner.state.lock().expect("state lock");
                    let nothing_in_flight = st.in_flight.is_empty();
                    st.life.connection_down(e, nothing_in_flight);
                    drop(st);
                    inner.changed.notify_waiters();
                    return;
                }
            }
            () = inner.credit_due.notified() => {}
            _ = beats.tick() => beat(&inner, &mut heartbeat, heard),
        }
    }
}

/// One heartbeat tick (see [`heartbeat`]): a standalone credit update if
/// this side sent nothing for a beat, the link's failure if the peer sent
/// nothing for the silence limit.
fn beat(inner: &Inner, heartbeat: &mut Heartbeat, heard: u64) {
    let mut st = inner.state.lock().expect("state lock");
    if st.life.is_failed() {
        return;
    }
    let tick = heartbeat.tick(st.frames_posted, heard);
    if let Some(silent) = tick.silent {
        drop(st);
        fail(inner, LinkError::Silent(silent));
        return;
    }
    if tick.beat {
        // (No free buffer: frames are in flight, and they will do. A
        // connection that is down says so through its completions.)
        match try_post_control(inner, &mut st, &Body::Credit) {
            Ok(true) => heartbeat.beat_posted(),
            Ok(false) | Err(LinkError::Transport(_)) => {}
            Err(e) => {
                drop(st);
                fail(inner, e);
            }
        }
    }
}

fn send_standalone_credit(inner: &Inner) {
    let mut st = inner.state.lock().expect("state lock");
    if st.life.is_failed() {
        return;
    }
    let due = inner
        .inbound
        .lock()
        .expect("inbound lock")
        .wants_standalone();
    if due {
        // If no buffer is free now, a completion will bring one and the
        // driver checks again. If the connection is down, its completions
        // (perhaps the peer's goodbye among them) tell the driver whether
        // that was an orderly end; deciding here would race them.
        match try_post_control(inner, &mut st, &Body::Credit) {
            Ok(_) | Err(LinkError::Transport(_)) => {}
            Err(e) => {
                drop(st);
                fail(inner, e);
            }
        }
    }
}

/// `Ok(true)` for a successful completion, `Ok(false)` for a flushed one:
/// the connection is going down and `poll_completions` will report the real
/// reason once the flushes are delivered.
fn completion_ok(c: &Completion) -> Result<bool, LinkError> {
    match &c.status {
        Ok(()) => Ok(true),
        Err(WcError::Flushed) => Ok(false),
        Err(e) => Err(LinkError::Transport(TransportError::Closed(e.to_string()))),
    }
}

fn handle(inner: &Arc<Inner>, c: Completion) -> Result<(), LinkError> {
    match c.op {
        Op::Send | Op::WriteNotify | Op::Write | Op::Read => {
            let mut st = inner.state.lock().expect("state lock");
            let done = st.in_flight.remove(&c.wr_id);
            match done {
                Some(InFlight::Chunk { header, .. }) => st.header_busy[header as usize] = false,
                Some(InFlight::Control { buf }) => st.free_send_bufs.push(buf),
                None => {}
            }
            drop(st);
            completion_ok(&c).map(|_| ())
        }
        Op::Recv | Op::RecvNotify if failed(inner) => Ok(()),
        Op::Recv => {
            if !completion_ok(&c)? {
                return Ok(());
            }
            let index =
                u32::try_from(c.wr_id).map_err(|_| LinkError::Protocol("bad receive id".into()))?;
            let size = inner.config.control_size;
            // SAFETY: this receive completed; its buffer is ours until reposted
            // below, after the bytes were copied out.
            let bytes = unsafe {
                inner.recv_bufs.memory().slice(
                    index as usize * size as usize,
                    (c.byte_len as usize).min(size as usize),
                )
            };
            let result = handle_frame(inner, bytes);
            // SAFETY: this receive completed and `handle_frame` decoded (copied
            // out) what it held.
            unsafe { repost(inner, index) };
            result
        }
        Op::RecvNotify => {
            if !completion_ok(&c)? {
                return Ok(());
            }
            let note = c
                .note
                .ok_or_else(|| LinkError::Protocol("notified write without note".into()))?;
            let (chunk, sealed) = landed_chunk(inner, note, c.byte_len as usize)?;
            let index =
                u32::try_from(c.wr_id).map_err(|_| LinkError::Protocol("bad receive id".into()))?;
            // SAFETY: this receive completed, and nothing in its buffer is
            // read any more (the note came with the completion, the data is
            // in the landing slot).
            unsafe { repost(inner, index) };
            let mut st = inner.state.lock().expect("state lock");
            st.life.chunk_landed()?;
            queue(&mut st, Incoming::Chunk(chunk), sealed)
        }
    }
}

/// Whether the link has failed: what still arrives is not handed out.
fn failed(inner: &Inner) -> bool {
    inner.state.lock().expect("state lock").life.is_failed()
}

/// Puts a receive buffer back into service. A connection that is down
/// refuses it; that is no failure of its own: the connection's completions
/// say how it ended (an orderly goodbye may still be among them).
///
/// # Safety
/// As for [`post_recv`]: receive `index` completed and was copied out.
unsafe fn repost(inner: &Inner, index: u32) {
    // SAFETY: passed on from the caller.
    let _ = unsafe {
        post_recv(
            &*inner.conn,
            &inner.recv_bufs,
            inner.config.control_size,
            index,
        )
    };
}

/// The chunk that landed with `note`, its seal checked (and whether it had
/// one to check).
fn landed_chunk(inner: &Arc<Inner>, note: u32, landed: usize) -> Result<(Chunk, bool), LinkError> {
    let slot_size = inner.config.slot_size as usize;
    let seq = inner
        .inbound
        .lock()
        .expect("inbound lock")
        .landed_seq(note)
        .ok_or_else(|| LinkError::Protocol(format!("note {note} names no landed slot")))?;
    let index = (seq % u64::from(inner.config.slot_count)) as u32;
    // SAFETY: the slot is Landed: the gate admitted exactly this write and
    // refuses any other until the chunk is consumed.
    let slot = unsafe {
        inner
            .ring
            .memory()
            .slice(index as usize * slot_size, slot_size)
    };
    let header = ChunkHeader::decode(slot, landed, slot_size - CHUNK_HEADER_LEN, note)?;
    let opener = inner.opener.lock().expect("opener lock");
    let sealed = opener.is_some();
    if let Some(opener) = &*opener {
        let covered = header.encode();
        // SAFETY: as above; and no `Chunk` for this slot exists yet, so
        // nothing else reads it while it is decrypted in place.
        let payload = unsafe {
            inner.ring.memory().slice_mut(
                index as usize * slot_size + CHUNK_HEADER_LEN,
                header.payload_len as usize,
            )
        };
        opener.open_chunk(
            seq,
            &covered[..CHUNK_HEADER_SEALED_LEN],
            payload,
            header.flags & chunk_flags::DIGEST != 0,
            &header.tag,
        )?;
    }
    drop(opener);
    let chunk = Chunk {
        inner: Arc::clone(inner),
        seq,
        index,
        header,
    };
    Ok((chunk, sealed))
}

fn handle_frame(inner: &Inner, bytes: &[u8]) -> Result<(), LinkError> {
    let opened = match &mut *inner.opener.lock().expect("opener lock") {
        Some(opener) => opener.open_frame(bytes)?,
        None if bytes.get(3).is_some_and(|f| f & seal::SEALED != 0) => {
            return Err(SealError::Early.into());
        }
        None => Opened::Plain,
    };
    let frame = match &opened {
        Opened::Sealed(plain) => Frame::decode(plain)?,
        Opened::Plain => Frame::decode(bytes)?,
    };
    // A peer's error is reported as it is, whatever its credits say: it may
    // come from a peer that gave up before its credit state meant anything.
    if let Body::Error { code, text } = frame.body {
        return Err(LinkError::Peer {
            code,
            text: text.to_string(),
        });
    }
    // Standalone credit updates cost the peer no credit (see `credit`);
    // everything else is counted, and all but application messages are
    // consumed right here.
    if !matches!(frame.body, Body::Credit) {
        let mut inbound = inner.inbound.lock().expect("inbound lock");
        inbound.on_control_received()?;
        if !matches!(frame.body, Body::App(_)) {
            inbound.on_control_consumed();
        }
    }
    let mut st = inner.state.lock().expect("state lock");
    st.outbound.on_update(frame.credit)?;
    if let Some(heard) = Heard::of(&frame.body) {
        st.life.heard(heard)?;
    }
    if let Body::App(payload) = frame.body {
        let sealed = matches!(opened, Opened::Sealed(_));
        queue(&mut st, Incoming::Message(payload.to_vec()), sealed)?;
    }
    Ok(())
}

/// Queues what the peer sent for the application; under a strict seal
/// nothing unsealed is, even what was opened before the seal was set up.
fn queue(st: &mut State, item: Incoming, sealed: bool) -> Result<(), LinkError> {
    if st.strict && !sealed {
        let what = item.what();
        return Err(SealError::AfterProof { what }.into());
    }
    st.incoming.push_back((item, sealed));
    Ok(())
}
