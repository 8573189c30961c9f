//! The verbs backend: RC queue pairs set up through rdma_cm, on `sideway`
//! (rdma-core loaded at run time, so binaries start on nodes without it and
//! report [`TransportError::Unavailable`]).
//!
//! * Connection set-up is rdma_cm only (IP:port addressing on IB, RoCE and
//!   iWARP alike). The queue pair is ours, not rdma_cm's: each state change
//!   takes rdma_cm's attributes and adds what it leaves out (remote access
//!   on the initiator's side, a short receiver-not-ready timer).
//! * Work requests go through the classic `ibv_post_send`/`ibv_post_recv`.
//!   Every request gets a slot in a table so a completion can be mapped back
//!   to the caller's `wr_id` and operation.
//! * Completions come from a basic CQ (the extended one is broken on
//!   rdma-core 44's rxe) whose completion channel fd sits in tokio's
//!   `AsyncFd`: poll, arm, poll again, then wait for the fd; every event is
//!   acknowledged at once.
//! * `write_notify` is RDMA WRITE WITH IMM, the note as the immediate in
//!   network byte order. With [`NotifyMode::WriteThenSend`] (devices without
//!   write-with-immediate, such as iWARP, or forced for tests) it is an
//!   unsignalled RDMA WRITE followed by a 16-byte SEND carrying the note,
//!   which RC delivers after the write is placed. A receiver understands both
//!   whatever its own mode.
//! * Limits come from the device and port (max WRs, SGEs, message size,
//!   inline data, MTU), never from assumptions.
//! * Failure: a completion in error, a refused note, or a DISCONNECTED event
//!   moves the QP to the error state, so every outstanding request is
//!   flushed; then `poll_completions` reports why.
#![allow(unsafe_code)]

mod cm;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rdma_mummy_sys::{ibv_ack_cq_events, ibv_cq, ibv_get_cq_event, ibv_req_notify_cq, ibv_sge};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionChannel, CompletionQueue, PollCompletionQueueError,
    WorkCompletionOperationType as WcOp, WorkCompletionStatus as WcStatus,
};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, QueuePairType,
    SetInlineData, SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::rdmacm::communication_manager::{
    ConnectionParameter, EventType, Identifier, PortSpace,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use self::cm::{CmChannel, CmEvent, event_error, expect, unavailable};
use super::{
    Access, Backend, Completion, Connection, Limits, Op, Region, RemoteAddr, RemoteRegion, Segment,
    TransportError, WcError, WriteGate, sgl_len,
};
use crate::memory::Memory;

/// How `write_notify` travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NotifyMode {
    /// RDMA WRITE WITH IMM.
    #[default]
    WriteWithImm,
    /// RDMA WRITE, then a SEND carrying the note.
    WriteThenSend,
}

/// Set-up choices of a verbs connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerbsOptions {
    pub notify: NotifyMode,
    /// Upper bounds asked for; the device may grant less.
    pub send_wr: u32,
    pub recv_wr: u32,
    pub timeout: Duration,
}

impl Default for VerbsOptions {
    fn default() -> Self {
        VerbsOptions {
            notify: NotifyMode::WriteWithImm,
            send_wr: 1024,
            recv_wr: 4096,
            timeout: Duration::from_secs(5),
        }
    }
}

/// `"NOTE"`: first bytes of the SEND that carries a note in
/// [`NotifyMode::WriteThenSend`].
const NOTE_MAGIC: u32 = u32::from_le_bytes(*b"NOTE");
const NOTE_LEN: usize = 16;
/// Scatter/gather elements asked for.
const MAX_SGE: u32 = 4;
/// Inline bytes asked for (the note SEND needs 16).
const INLINE: u32 = 64;
/// RNR NAK timer code 12: 0.64 ms, instead of rdma_cm's 0 (655 ms).
const MIN_RNR_TIMER: u8 = 12;
/// How long `close` waits for the send queue to drain: 500 ms in steps.
const LINGER_STEPS: u32 = 100;
const LINGER_STEP: Duration = Duration::from_millis(5);

/// Listens for verbs connections on an IP address of an RDMA device.
pub struct VerbsListener {
    cm: Arc<CmChannel>,
    _id: Arc<Identifier>,
    requests: tokio::sync::Mutex<mpsc::UnboundedReceiver<CmEvent>>,
    options: VerbsOptions,
}

impl std::fmt::Debug for VerbsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsListener")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl VerbsListener {
    pub fn bind(addr: SocketAddr, options: VerbsOptions) -> Result<VerbsListener, TransportError> {
        let cm = CmChannel::open()?;
        let id = cm
            .channel()
            .create_id(PortSpace::Tcp)
            .map_err(|e| unavailable("rdma_cm id", e))?;
        id.bind_addr(addr)
            .map_err(|e| TransportError::Io(format!("cannot bind {addr} for RDMA: {e}")))?;
        id.listen(64)
            .map_err(|e| TransportError::Io(format!("cannot listen on {addr} for RDMA: {e}")))?;
        let requests = tokio::sync::Mutex::new(cm.listen());
        Ok(VerbsListener {
            cm,
            _id: id,
            requests,
            options,
        })
    }

    /// Accepts the next connection.
    pub async fn accept(&self) -> Result<VerbsConnection, TransportError> {
        let request = self
            .requests
            .lock()
            .await
            .recv()
            .await
            .ok_or_else(|| TransportError::Closed("listener closed".into()))?;
        let id = request
            .id
            .ok_or_else(|| TransportError::Closed("connection request without an id".into()))?;
        let mut events = self.cm.watch(&id);
        let resources = Resources::new(&id, &self.options)?;
        let qp_number = {
            let mut qp = resources.qp.lock().expect("qp lock");
            to_state(&id, &mut qp, QueuePairState::Init)?;
            to_state(&id, &mut qp, QueuePairState::ReadyToReceive)?;
            to_state(&id, &mut qp, QueuePairState::ReadyToSend)?;
            qp.qp_number()
        };
        // `ConnectionParameter` is not `Send`: keep it out of the await's
        // reach.
        accept(&id, qp_number)?;
        expect(
            &mut events,
            EventType::Established,
            "accept",
            self.options.timeout,
        )
        .await?;
        VerbsConnection::start(Arc::clone(&self.cm), id, events, resources, self.options)
    }
}

/// Connects to a [`VerbsListener`] at `addr`.
pub async fn connect(
    addr: SocketAddr,
    options: VerbsOptions,
) -> Result<VerbsConnection, TransportError> {
    let cm = CmChannel::open()?;
    let id = cm
        .channel()
        .create_id(PortSpace::Tcp)
        .map_err(|e| unavailable("rdma_cm id", e))?;
    let mut events = cm.watch(&id);
    let t = options.timeout;
    id.resolve_addr(None, addr, t)
        .map_err(|e| unavailable(&format!("no RDMA device routes to {addr}"), e))?;
    let ev = expect(
        &mut events,
        EventType::AddressResolved,
        "resolving address",
        t,
    )
    .await;
    ev.map_err(|e| TransportError::Unavailable(e.to_string()))?;
    id.resolve_route(t)
        .map_err(|e| TransportError::Unavailable(format!("no RDMA route to {addr}: {e}")))?;
    expect(&mut events, EventType::RouteResolved, "resolving route", t).await?;
    let resources = Resources::new(&id, &options)?;
    let qp_number = {
        let mut qp = resources.qp.lock().expect("qp lock");
        to_state(&id, &mut qp, QueuePairState::Init)?;
        qp.qp_number()
    };
    request(&id, qp_number)?;
    expect(
        &mut events,
        EventType::ConnectResponse,
        &format!("connecting to {addr}"),
        t,
    )
    .await?;
    {
        let mut qp = resources.qp.lock().expect("qp lock");
        to_state(&id, &mut qp, QueuePairState::ReadyToReceive)?;
        to_state(&id, &mut qp, QueuePairState::ReadyToSend)?;
    }
    id.establish()
        .map_err(|e| TransportError::Io(format!("rdma_cm establish: {e}")))?;
    VerbsConnection::start(cm, id, events, resources, options)
}

/// rdma_cm's connection parameters with rdma_cm's defaults (retry and RNR
/// retry 7) and our QP number.
fn params(qp_number: u32) -> ConnectionParameter {
    let mut param = ConnectionParameter::default();
    param.setup_qp_number(qp_number);
    param
}

fn accept(id: &Identifier, qp_number: u32) -> Result<(), TransportError> {
    id.accept(params(qp_number))
        .map_err(|e| TransportError::Io(format!("rdma_cm accept: {e}")))
}

fn request(id: &Identifier, qp_number: u32) -> Result<(), TransportError> {
    id.connect(params(qp_number))
        .map_err(|e| TransportError::Io(format!("rdma_cm connect: {e}")))
}

/// Moves the QP to `state` with rdma_cm's attributes plus what they lack.
fn to_state(
    id: &Identifier,
    qp: &mut BasicQueuePair,
    state: QueuePairState,
) -> Result<(), TransportError> {
    let mut attr = id
        .get_qp_attr(state)
        .map_err(|e| TransportError::Io(format!("QP attributes for {state:?}: {e}")))?;
    match state {
        // rdma_cm leaves the initiator's QP without remote access.
        QueuePairState::Init => {
            attr.setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead,
            );
        }
        QueuePairState::ReadyToReceive => {
            attr.setup_min_rnr_timer(MIN_RNR_TIMER);
        }
        _ => {}
    }
    qp.modify(&attr)
        .map_err(|e| TransportError::Io(format!("QP to {state:?}: {e}")))
}

/// The verbs objects of one connection.
struct Resources {
    pd: Arc<ProtectionDomain>,
    channel: Arc<CompletionChannel>,
    cq: Arc<BasicCompletionQueue>,
    qp: Mutex<BasicQueuePair>,
    limits: Limits,
}

impl Resources {
    fn new(id: &Identifier, options: &VerbsOptions) -> Result<Resources, TransportError> {
        let ctx = id
            .get_device_context()
            .ok_or_else(|| TransportError::Unavailable("rdma_cm id has no device".into()))?;
        let dev = ctx
            .query_device()
            .map_err(|e| TransportError::Io(format!("query device: {e}")))?;
        let port = ctx
            .query_port(id.port())
            .map_err(|e| TransportError::Io(format!("query port: {e}")))?;
        let max_wr = u32::try_from(dev.max_qp_wr()).unwrap_or(0);
        let max_cqe = u32::try_from(dev.max_cqe()).unwrap_or(0);
        let send_wr = options.send_wr.min(max_wr);
        let recv_wr = options.recv_wr.min(max_wr);
        let cqe = (send_wr + recv_wr).min(max_cqe);
        let sge = MAX_SGE.min(u32::try_from(dev.max_sge()).unwrap_or(1));
        let pd = ctx
            .alloc_pd()
            .map_err(|e| TransportError::Io(format!("allocate protection domain: {e}")))?;
        let channel = ctx
            .create_comp_channel()
            .map_err(|e| TransportError::Io(format!("completion channel: {e}")))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| TransportError::Io(format!("completion channel: {e}")))?;
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(cqe)
            .setup_comp_channel(&channel, 0)
            .build()
            .map_err(|e| TransportError::Io(format!("completion queue of {cqe}: {e}")))?;
        let build = |inline: u32| {
            pd.create_qp_builder()
                .setup_qp_type(QueuePairType::ReliableConnection)
                .setup_max_send_wr(send_wr)
                .setup_max_recv_wr(recv_wr)
                .setup_max_send_sge(sge)
                .setup_max_recv_sge(1)
                .setup_max_inline_data(inline)
                .setup_send_cq(Arc::clone(&cq))
                .setup_recv_cq(Arc::clone(&cq))
                .build()
        };
        let (qp, inline) = match build(INLINE) {
            Ok(qp) => (qp, INLINE),
            Err(_) => (
                build(0).map_err(|e| TransportError::Io(format!("queue pair: {e}")))?,
                0,
            ),
        };
        let limits = Limits {
            max_send_wr: send_wr,
            max_recv_wr: recv_wr,
            max_sge: sge,
            max_msg: u64::from(port.attr.max_msg_sz),
            max_inline: inline,
        };
        Ok(Resources {
            pd,
            channel,
            cq,
            qp: Mutex::new(qp),
            limits,
        })
    }
}

/// What a posted request becomes when it completes.
#[derive(Debug, Clone, Copy)]
struct Pending {
    wr_id: u64,
    op: Op,
    len: u32,
    /// Start of a receive's buffer, to read a note SEND from.
    buf: usize,
    /// Send-queue entries the request holds (a fallback notified write
    /// holds two).
    sq: u32,
}

/// Posted requests by table index (the wr_id given to the NIC).
#[derive(Default)]
struct Table {
    slots: Vec<Option<Pending>>,
    free: Vec<usize>,
    live: usize,
}

impl Table {
    fn insert(&mut self, p: Pending) -> u64 {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(p);
                i as u64
            }
            None => {
                self.slots.push(Some(p));
                (self.slots.len() - 1) as u64
            }
        }
    }

    fn take(&mut self, index: u64) -> Option<Pending> {
        let p = self.slots.get_mut(index as usize)?.take()?;
        self.free.push(index as usize);
        self.live -= 1;
        Some(p)
    }
}

struct State {
    table: Table,
    sends: u32,
    recvs: u32,
    down: Option<TransportError>,
    /// `close` was called: nothing new is posted; down once the send queue
    /// drained or the linger ran out.
    closing: bool,
    waker: Option<Waker>,
}

struct Registration {
    _memory: Arc<Memory>,
    _mr: Arc<MemoryRegion>,
}

struct Inner {
    res: Resources,
    options: VerbsOptions,
    state: Mutex<State>,
    registrations: Mutex<Vec<Registration>>,
    gate: Mutex<Option<Arc<dyn WriteGate>>>,
    cq_fd: AsyncFd<ChannelFd<CompletionChannel>>,
    cm_id: Arc<Identifier>,
    _cm: Arc<CmChannel>,
}

/// A channel's fd for tokio (completion channel, rdma_cm event channel):
/// holding the channel keeps the fd open for as long as it is registered.
struct ChannelFd<T>(Arc<T>);

impl<T: AsRawFd> AsRawFd for ChannelFd<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// One verbs connection. Dropping it disconnects.
pub struct VerbsConnection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for VerbsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsConnection")
            .field("limits", &self.inner.res.limits)
            .field("notify", &self.inner.options.notify)
            .finish()
    }
}

impl VerbsConnection {
    fn start(
        cm: Arc<CmChannel>,
        id: Arc<Identifier>,
        events: mpsc::UnboundedReceiver<CmEvent>,
        res: Resources,
        options: VerbsOptions,
    ) -> Result<VerbsConnection, TransportError> {
        // SAFETY: `ChannelFd` owns a reference to the channel, so the fd
        // stays open and unchanged while registered.
        let cq_fd = unsafe {
            AsyncFd::register_with_interest(ChannelFd(Arc::clone(&res.channel)), Interest::READABLE)
        }
        .map_err(|e| TransportError::Io(format!("completion channel: {e}")))?;
        let inner = Arc::new(Inner {
            res,
            options,
            state: Mutex::new(State {
                table: Table::default(),
                sends: 0,
                recvs: 0,
                down: None,
                closing: false,
                waker: None,
            }),
            registrations: Mutex::new(Vec::new()),
            gate: Mutex::new(None),
            cq_fd,
            cm_id: id,
            _cm: cm,
        });
        tokio::spawn(watch_cm(Arc::downgrade(&inner), events));
        Ok(VerbsConnection { inner })
    }

    /// The limits and notification mode in force, for users and benchmarks.
    pub fn describe(&self) -> String {
        let l = self.inner.res.limits;
        format!(
            "send_wr {} recv_wr {} sge {} max_msg {} inline {} notify {:?}",
            l.max_send_wr,
            l.max_recv_wr,
            l.max_sge,
            l.max_msg,
            l.max_inline,
            self.inner.options.notify
        )
    }
}

impl Drop for VerbsConnection {
    fn drop(&mut self) {
        // No linger: nothing can poll this connection any more.
        self.inner
            .go_down(TransportError::Closed("connection dropped".into()));
    }
}

impl Inner {
    /// Ends the connection: the QP goes to the error state, which flushes
    /// everything outstanding; the first reason is kept.
    fn go_down(&self, why: TransportError) {
        let mut st = self.state.lock().expect("state lock");
        if st.down.is_some() {
            return;
        }
        st.down = Some(why);
        let waker = st.waker.take();
        drop(st);
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        let _ = self.res.qp.lock().expect("qp lock").modify(&attr);
        let _ = self.cm_id.disconnect();
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn check_open(&self) -> Result<(), TransportError> {
        let st = self.state.lock().expect("state lock");
        match &st.down {
            Some(why) => Err(why.clone()),
            None if st.closing => Err(TransportError::Closed("closing".into())),
            None => Ok(()),
        }
    }

    fn sges(sgl: &[Segment]) -> Vec<ibv_sge> {
        sgl.iter()
            .map(|s| ibv_sge {
                addr: s.as_ptr() as u64,
                length: s.len() as u32,
                lkey: s.region().lkey(),
            })
            .collect()
    }

    /// Drains the CQ into `out`; returns how many were added.
    fn drain(&self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        let mut failed = None;
        {
            let mut st = self.state.lock().expect("state lock");
            match self.res.cq.start_poll() {
                Ok(poller) => {
                    // Iterate to the end: a dropped poller loses what it
                    // had dequeued.
                    for wc in poller {
                        let Some(p) = st.table.take(wc.wr_id()) else {
                            // An unsignalled request (the write of a
                            // write-then-send) completes only when it fails:
                            // its status is the reason the QP went down.
                            if wc.status() != WcStatus::Success as u32 && failed.is_none() {
                                failed = Some(wc_error(wc.status(), wc.byte_len(), 0));
                            }
                            continue;
                        };
                        match p.op {
                            Op::Recv | Op::RecvNotify => st.recvs -= 1,
                            _ => st.sends -= p.sq,
                        }
                        let c = self.convert(
                            &p,
                            wc.status(),
                            wc.opcode(),
                            wc.byte_len(),
                            wc.imm_data(),
                        );
                        // Any failed request means the QP is in the error
                        // state (a flush without a known cause included):
                        // the first one says why.
                        if let Err(e) = &c.status
                            && failed.is_none()
                        {
                            failed = Some(e.clone());
                        }
                        out.push(c);
                    }
                }
                Err(PollCompletionQueueError::CompletionQueueEmpty) => {}
                Err(e) => failed = Some(WcError::Fatal(format!("poll CQ: {e}"))),
            }
        }
        if let Some(e) = failed {
            self.go_down(match e {
                WcError::NoteRefused(why) => {
                    TransportError::Protocol(format!("note refused: {why}"))
                }
                WcError::Flushed => TransportError::Closed(
                    "the queue pair went into the error state (peer gone or access refused)".into(),
                ),
                other => TransportError::Closed(other.to_string()),
            });
        }
        out.len() - before
    }

    /// One work completion as the transport reports it.
    fn convert(
        &self,
        p: &Pending,
        status: u32,
        opcode: u32,
        byte_len: u32,
        imm: u32,
    ) -> Completion {
        let mut c = Completion {
            wr_id: p.wr_id,
            op: p.op,
            status: Ok(()),
            byte_len,
            note: None,
            landed_at: None,
        };
        if status != WcStatus::Success as u32 {
            c.status = Err(wc_error(status, byte_len, p.len));
            return c;
        }
        match p.op {
            Op::Recv | Op::RecvNotify => {
                if opcode == WcOp::ReceiveWithImmediate as u32 {
                    self.notified(&mut c, u32::from_be(imm), byte_len);
                } else if let Some((note, len)) = self.note_message(p, byte_len) {
                    self.notified(&mut c, note, len);
                } else {
                    c.op = Op::Recv;
                }
            }
            Op::Send | Op::Write | Op::WriteNotify | Op::Read => c.byte_len = p.len,
        }
        c
    }

    /// A receive that took a notified write: the gate decides.
    fn notified(&self, c: &mut Completion, note: u32, len: u32) {
        c.op = Op::RecvNotify;
        c.note = Some(note);
        c.byte_len = len;
        let gate = self.gate.lock().expect("gate lock").clone();
        if let Some(gate) = gate
            && let Err(why) = gate.admit(None, u64::from(len), Some(note))
        {
            c.status = Err(WcError::NoteRefused(why));
        }
    }

    /// The note SEND of [`NotifyMode::WriteThenSend`], if this receive got
    /// one: `(note, bytes written)`.
    fn note_message(&self, p: &Pending, byte_len: u32) -> Option<(u32, u32)> {
        if byte_len as usize != NOTE_LEN || p.len < NOTE_LEN as u32 {
            return None;
        }
        // SAFETY: the receive completed with 16 bytes in its buffer, which
        // the registration keeps alive and nobody writes until the
        // completion is handed out.
        let msg = unsafe { std::slice::from_raw_parts(p.buf as *const u8, NOTE_LEN) };
        let word = |i: usize| u32::from_le_bytes(msg[i..i + 4].try_into().expect("4 bytes"));
        (word(0) == NOTE_MAGIC && word(12) == 0).then(|| (word(4), word(8)))
    }
}

fn wc_error(status: u32, byte_len: u32, room: u32) -> WcError {
    let s = |x: WcStatus| x as u32;
    match status {
        x if x == s(WcStatus::WorkRequestFlushedError) => WcError::Flushed,
        x if x == s(WcStatus::LocalLengthError) => WcError::LocalLength {
            len: byte_len as usize,
            room: room as usize,
        },
        x if x == s(WcStatus::RemoteAccessError) => WcError::RemoteAccess(
            "the peer refused the access (rkey, bounds or permissions)".into(),
        ),
        x if x == s(WcStatus::ResponderNotReadyRetryCounterExceededError) => {
            WcError::ReceiverNotReady
        }
        x if x == s(WcStatus::RetryCounterExceededError) => {
            WcError::Fatal("transport retry counter exceeded: peer unreachable or gone".into())
        }
        other => {
            // SAFETY: ibv_wc_status_str returns a static string for any value.
            let text =
                unsafe { std::ffi::CStr::from_ptr(rdma_mummy_sys::ibv_wc_status_str(other)) };
            WcError::Fatal(format!("work completion error: {}", text.to_string_lossy()))
        }
    }
}

async fn watch_cm(inner: std::sync::Weak<Inner>, mut events: mpsc::UnboundedReceiver<CmEvent>) {
    while let Some(event) = events.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        match event.kind {
            EventType::Disconnected | EventType::DeviceRemoval | EventType::TimewaitExit => {
                inner.go_down(if event.kind == EventType::Disconnected {
                    TransportError::Closed("peer disconnected".into())
                } else {
                    event_error("connection", &event)
                });
            }
            _ => {}
        }
    }
}

impl Connection for VerbsConnection {
    fn backend(&self) -> Backend {
        Backend::Rdma
    }

    fn limits(&self) -> Limits {
        self.inner.res.limits
    }

    fn register(
        &self,
        memory: &Arc<Memory>,
        access: Access,
        gate: Option<Arc<dyn WriteGate>>,
    ) -> Result<Region, TransportError> {
        let mut flags = AccessFlags::LocalWrite;
        if access.remote_write {
            flags |= AccessFlags::RemoteWrite;
        }
        if access.remote_read {
            flags |= AccessFlags::RemoteRead;
        }
        if let Some(g) = &gate {
            // Completions do not say which region a notified write hit, so
            // only one region per connection can be gated.
            let mut slot = self.inner.gate.lock().expect("gate lock");
            if slot.is_some() {
                return Err(TransportError::Invalid(
                    "only one gated region per verbs connection".into(),
                ));
            }
            *slot = Some(Arc::clone(g));
        }
        // SAFETY: the memory stays allocated and unmoved for as long as the
        // registration (both are kept together below, for the connection's
        // lifetime).
        let mr = unsafe {
            self.inner
                .res
                .pd
                .reg_mr(memory.as_ptr() as usize, memory.len(), flags)
        }
        .map_err(|e| {
            TransportError::Io(format!(
                "cannot register {} bytes with the NIC: {e} (is the locked-memory limit, \
                 ulimit -l / LimitMEMLOCK, large enough?)",
                memory.len()
            ))
        })?;
        let remote = RemoteRegion {
            addr: memory.as_ptr() as u64,
            len: memory.len() as u64,
            rkey: mr.rkey(),
        };
        let region = Region::new(Arc::clone(memory), mr.lkey(), remote, access, gate);
        self.inner
            .registrations
            .lock()
            .expect("registration lock")
            .push(Registration {
                _memory: Arc::clone(memory),
                _mr: mr,
            });
        Ok(region)
    }

    unsafe fn post_recv(&self, wr_id: u64, buf: Segment) -> Result<(), TransportError> {
        let inner = &self.inner;
        inner.check_open()?;
        let mut st = inner.state.lock().expect("state lock");
        if st.recvs >= inner.res.limits.max_recv_wr {
            return Err(TransportError::QueueFull {
                what: "receive",
                limit: inner.res.limits.max_recv_wr,
            });
        }
        let index = st.table.insert(Pending {
            wr_id,
            op: Op::Recv,
            len: buf.len() as u32,
            buf: buf.as_ptr() as usize,
            sq: 0,
        });
        let mut qp = inner.res.qp.lock().expect("qp lock");
        let mut guard = qp.start_post_recv();
        let wr = guard.construct_wr(index);
        // SAFETY: the caller keeps the buffer untouched until completion; the
        // registration keeps it alive.
        unsafe { wr.setup_sge(buf.region().lkey(), buf.as_ptr() as u64, buf.len() as u32) };
        match guard.post() {
            Ok(()) => {
                st.recvs += 1;
                Ok(())
            }
            Err(e) => {
                st.table.take(index);
                Err(TransportError::Io(format!("post receive: {e}")))
            }
        }
    }

    unsafe fn post_send(&self, wr_id: u64, sgl: &[Segment]) -> Result<(), TransportError> {
        // SAFETY: forwarded contract.
        unsafe { self.post(wr_id, Op::Send, sgl, None, None) }
    }

    unsafe fn write_notify(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
        note: u32,
    ) -> Result<(), TransportError> {
        // SAFETY: forwarded contract.
        unsafe { self.post(wr_id, Op::WriteNotify, sgl, Some(remote), Some(note)) }
    }

    unsafe fn write(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
    ) -> Result<(), TransportError> {
        // SAFETY: forwarded contract.
        unsafe { self.post(wr_id, Op::Write, sgl, Some(remote), None) }
    }

    unsafe fn read(
        &self,
        wr_id: u64,
        local: Segment,
        remote: RemoteAddr,
    ) -> Result<(), TransportError> {
        // SAFETY: forwarded contract.
        unsafe { self.post(wr_id, Op::Read, &[local], Some(remote), None) }
    }

    fn poll_completions(
        &self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
    ) -> Poll<Result<(), TransportError>> {
        let inner = &self.inner;
        loop {
            if inner.drain(out) > 0 {
                return Poll::Ready(Ok(()));
            }
            {
                let mut st = inner.state.lock().expect("state lock");
                if let Some(why) = &st.down
                    && st.table.live == 0
                {
                    return Poll::Ready(Err(why.clone()));
                }
                st.waker = Some(cx.waker().clone());
            }
            // Arm, then poll once more: a completion that arrived before
            // arming raises no event.
            // SAFETY: the CQ lives as long as `inner`.
            unsafe { ibv_req_notify_cq(inner.res.cq.cq().as_ptr(), 0) };
            if inner.drain(out) > 0 {
                return Poll::Ready(Ok(()));
            }
            match inner.cq_fd.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err(TransportError::Io(format!(
                        "completion channel: {e}"
                    ))));
                }
                Poll::Ready(Ok(mut guard)) => {
                    ack_events(&inner.res);
                    guard.clear_ready();
                }
            }
        }
    }

    fn close(&self) {
        let inner = &self.inner;
        {
            let mut st = inner.state.lock().expect("state lock");
            if st.down.is_some() || st.closing {
                return;
            }
            st.closing = true;
        }
        // Let what was posted last (a goodbye, an error message telling the
        // peer why) leave before the QP is flushed, as a tcp close would; a
        // short linger, then down regardless.
        let linger = Arc::downgrade(inner);
        let go = move || {
            if let Some(inner) = linger.upgrade() {
                inner.go_down(TransportError::Closed("closed locally".into()));
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let weak = Arc::downgrade(inner);
                rt.spawn(async move {
                    for _ in 0..LINGER_STEPS {
                        let drained = weak
                            .upgrade()
                            .is_none_or(|i| i.state.lock().expect("state lock").sends == 0);
                        if drained {
                            break;
                        }
                        tokio::time::sleep(LINGER_STEP).await;
                    }
                    go();
                });
            }
            Err(_) => go(),
        }
    }
}

/// Takes every pending CQ event off the channel and acknowledges them (an
/// unacknowledged event makes CQ destruction fail).
fn ack_events(res: &Resources) {
    let mut n = 0;
    loop {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the channel is valid and non-blocking; out-pointers are ours.
        let rc =
            unsafe { ibv_get_cq_event(res.channel.comp_channel().as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 {
            break;
        }
        n += 1;
    }
    if n > 0 {
        // SAFETY: acknowledges exactly the events taken above on our CQ.
        unsafe { ibv_ack_cq_events(res.cq.cq().as_ptr(), n) };
    }
}

impl VerbsConnection {
    /// Posts a send-queue request; a notified write in
    /// [`NotifyMode::WriteThenSend`] becomes two.
    ///
    /// # Safety
    /// As the trait's post methods: the segments stay untouched until the
    /// completion.
    unsafe fn post(
        &self,
        wr_id: u64,
        op: Op,
        sgl: &[Segment],
        remote: Option<RemoteAddr>,
        note: Option<u32>,
    ) -> Result<(), TransportError> {
        let inner = &self.inner;
        inner.check_open()?;
        let limits = inner.res.limits;
        if sgl.is_empty() || sgl.len() > limits.max_sge as usize {
            return Err(TransportError::Invalid(format!(
                "{} segments: must be 1..={}",
                sgl.len(),
                limits.max_sge
            )));
        }
        let len = sgl_len(sgl);
        if len as u64 > limits.max_msg {
            return Err(TransportError::Invalid(format!(
                "{len} bytes in one request, at most {}",
                limits.max_msg
            )));
        }
        let fallback = op == Op::WriteNotify && inner.options.notify == NotifyMode::WriteThenSend;
        let needed = if fallback { 2 } else { 1 };
        let mut st = inner.state.lock().expect("state lock");
        if st.sends + needed > limits.max_send_wr {
            return Err(TransportError::QueueFull {
                what: "send",
                limit: limits.max_send_wr,
            });
        }
        let index = st.table.insert(Pending {
            wr_id,
            op,
            len: len as u32,
            buf: 0,
            sq: needed,
        });
        let sges = Inner::sges(sgl);
        let mut qp = inner.res.qp.lock().expect("qp lock");
        let mut guard = qp.start_post_send();
        let remote = remote.unwrap_or(RemoteAddr { addr: 0, rkey: 0 });
        if fallback {
            let note = note.expect("notified write has a note");
            let mut msg = [0u8; NOTE_LEN];
            msg[..4].copy_from_slice(&NOTE_MAGIC.to_le_bytes());
            msg[4..8].copy_from_slice(&note.to_le_bytes());
            msg[8..12].copy_from_slice(&(len as u32).to_le_bytes());
            // The write itself raises no completion; the send after it
            // completes for both (RC completes in order).
            let wr = guard
                .construct_wr(u64::MAX, WorkRequestFlags::none())
                .setup_write(remote.rkey, remote.addr);
            // SAFETY: the segments stay untouched until the completion.
            unsafe { wr.setup_sge_list(&sges) };
            guard
                .construct_wr(index, WorkRequestFlags::Signaled)
                .setup_send()
                .setup_inline_data(&msg);
        } else {
            let handle = guard.construct_wr(index, WorkRequestFlags::Signaled);
            let wr = match (op, note) {
                (Op::Send, _) => handle.setup_send(),
                (Op::WriteNotify, Some(n)) => {
                    handle.setup_write_imm(remote.rkey, remote.addr, n.to_be())
                }
                (Op::Write, _) => handle.setup_write(remote.rkey, remote.addr),
                (Op::Read, _) => handle.setup_read(remote.rkey, remote.addr),
                _ => unreachable!("only send-queue operations are posted here"),
            };
            // SAFETY: the segments stay untouched (reads: unread) until the
            // completion; the registrations keep them alive.
            unsafe { wr.setup_sge_list(&sges) };
        }
        match guard.post() {
            Ok(()) => {
                st.sends += needed;
                Ok(())
            }
            Err(e) => {
                st.table.take(index);
                drop(qp);
                drop(st);
                // Some requests of the chain may have been posted: the
                // connection cannot be trusted any more.
                let err = TransportError::Io(format!("post send: {e}"));
                inner.go_down(err.clone());
                Err(err)
            }
        }
    }
}
