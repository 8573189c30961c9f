//! The in-process backend: both ends of a queue pair in one process, for a
//! copy whose two sides are local (`rcp a b`).
//!
//! It is what RDMA hardware does, done by the CPU: a send is copied into
//! the peer's next posted receive, a write straight into the peer's
//! registered region (after the region's [`WriteGate`] admitted it), a read
//! straight out of it. One memory copy per payload and no system call, where
//! the tcp backend over loopback costs two copies in the kernel, a
//! `writev`, a `recvfrom` and the wake-ups between them: the reason it
//! exists (measured in `docs/rcp.md`, Local copies).
//!
//! Work is done by whoever makes it possible, inside the posting call: the
//! poster of a send, write or read, or the peer's `post_recv` that gives a
//! waiting send or notified write its receive. Operations one end posted
//! wait in the peer's inbox, in posting order, while the peer has no
//! receive posted (RC's receiver-not-ready retries; the credit engine keeps
//! receives posted, so on a healthy link nothing waits). Delivering in
//! inbox order is what gives the ordering [`super`] promises.
//!
//! Listeners are found by a number in a process-wide table, the port of
//! this "network": [`MemoryListener::bind`] and [`connect`].
#![allow(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use super::completions::Completions;
use super::regions::Regions;
use super::{
    Access, Backend, Completion, Connection, Limits, Op, Region, RemoteAddr, Segment,
    TransportError, WcError, WriteGate, sgl_len,
};
use crate::memory::Memory;

/// Limits of the in-process backend: the tcp backend's, so that links are
/// sized the same way on both.
pub const DEFAULT_LIMITS: Limits = super::tcp::DEFAULT_LIMITS;
/// Largest payload of a send, as on tcp: control messages are small.
const MAX_SEND: u64 = crate::wire::MAX_CONTROL_SIZE as u64;

/// One operation an end posted that the other end carries out.
struct Posted {
    wr_id: u64,
    op: Op,
    /// The poster's memory: what a send or write carries, where a read
    /// lands (one segment).
    sgl: Vec<Segment>,
    remote: RemoteAddr,
    note: u32,
}

/// What one end receives: its posted receives, its regions, and what the
/// peer posted that still waits for a receive.
#[derive(Default)]
struct Inbound {
    recvs: VecDeque<(u64, Segment)>,
    regions: Regions,
    inbox: VecDeque<Posted>,
}

/// One end of the pair.
#[derive(Default)]
struct End {
    inbound: Mutex<Inbound>,
    /// Its completions; it ends when this end goes down.
    completions: Completions,
}

/// The two ends of one connection.
#[derive(Default)]
struct Pair {
    ends: [End; 2],
}

/// One in-process connection: end `me` of a pair. Dropping it closes the
/// connection.
pub struct MemoryConnection {
    pair: Arc<Pair>,
    me: usize,
}

impl std::fmt::Debug for MemoryConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryConnection")
            .field("end", &self.me)
            .finish_non_exhaustive()
    }
}

/// Two connected ends.
pub fn pair() -> (MemoryConnection, MemoryConnection) {
    let pair = Arc::new(Pair::default());
    (
        MemoryConnection {
            pair: Arc::clone(&pair),
            me: 0,
        },
        MemoryConnection { pair, me: 1 },
    )
}

/// Why an operation broke the protocol: the receiving end's words.
struct Violation(String);

impl MemoryConnection {
    fn this(&self) -> &End {
        &self.pair.ends[self.me]
    }

    fn check_open(&self) -> Result<(), TransportError> {
        match self.this().completions.down_reason() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Hands an operation to end `to`: done now if nothing waits before it
    /// and it needs no receive or has one, else queued behind.
    fn post(&self, posted: Posted) -> Result<(), TransportError> {
        self.check_open()?;
        let limits = DEFAULT_LIMITS;
        if posted.sgl.len() > limits.max_sge as usize {
            return Err(TransportError::Invalid(format!(
                "{} segments, at most {}",
                posted.sgl.len(),
                limits.max_sge
            )));
        }
        let len = sgl_len(&posted.sgl) as u64;
        let max = if posted.op == Op::Send {
            MAX_SEND
        } else {
            limits.max_msg
        };
        if len > max {
            return Err(TransportError::Invalid(format!(
                "{len} bytes in one request, at most {max}"
            )));
        }
        let to = 1 - self.me;
        let mut inbound = self.pair.ends[to].inbound.lock().expect("inbound lock");
        // (Checked again under the lock: a close flushes under it.)
        self.check_open()?;
        if inbound.inbox.len() >= limits.max_send_wr as usize {
            return Err(TransportError::QueueFull {
                what: "send",
                limit: limits.max_send_wr,
            });
        }
        inbound.inbox.push_back(posted);
        self.pair.deliver(to, &mut inbound);
        Ok(())
    }
}

impl Pair {
    /// Carries out what waits in end `to`'s inbox, in order, for as long as
    /// each has what it needs. Runs with `to`'s inbound lock held, so two
    /// posters never interleave their deliveries.
    fn deliver(&self, to: usize, inbound: &mut Inbound) {
        let from = 1 - to;
        while let Some(front) = inbound.inbox.front() {
            let needs_recv = matches!(front.op, Op::Send | Op::WriteNotify);
            if needs_recv && inbound.recvs.is_empty() {
                return;
            }
            let posted = inbound.inbox.pop_front().expect("a front");
            let wr_id = posted.wr_id;
            let op = posted.op;
            let len = sgl_len(&posted.sgl);
            match self.carry_out(to, inbound, posted) {
                Ok(()) => self.ends[from].completions.complete(wr_id, op, Ok(()), len),
                Err(Violation(why)) => {
                    let status = Err(WcError::RemoteAccess(why.clone()));
                    self.ends[from].completions.complete(wr_id, op, status, 0);
                    self.fail(to, inbound, TransportError::Protocol(why));
                    return;
                }
            }
        }
    }

    /// One operation from `1 - to` carried out on end `to`.
    fn carry_out(&self, to: usize, inbound: &mut Inbound, posted: Posted) -> Result<(), Violation> {
        let end = &self.ends[to];
        let len = sgl_len(&posted.sgl);
        match posted.op {
            Op::Send => {
                let (recv_id, buf) = inbound.recvs.pop_front().expect("checked by deliver");
                if len > buf.len() {
                    let err = WcError::LocalLength {
                        len,
                        room: buf.len(),
                    };
                    end.completions
                        .complete(recv_id, Op::Recv, Err(err.clone()), 0);
                    return Err(Violation(err.to_string()));
                }
                // SAFETY: the receive was posted (unsafe post_recv) with the
                // promise that nothing touches it until it completes, just
                // below; the sender promised the same of its segments.
                unsafe { gather(&posted.sgl, buf.as_ptr()) };
                end.completions.complete(recv_id, Op::Recv, Ok(()), len);
                Ok(())
            }
            Op::Write | Op::WriteNotify => {
                let note = (posted.op == Op::WriteNotify).then_some(posted.note);
                let (region, offset) = inbound
                    .regions
                    .writable(posted.remote, len as u64, note)
                    .map_err(Violation)?;
                let recv = match note {
                    Some(_) => Some(inbound.recvs.pop_front().expect("checked by deliver")),
                    None => None,
                };
                // SAFETY: bounds were checked by `writable`; the region's
                // owner admitted this write (its gate), so nothing reads the
                // range until the completion below says the data is there.
                unsafe { gather(&posted.sgl, region.memory().as_ptr().add(offset as usize)) };
                if let Some((recv_id, _)) = recv {
                    end.completions.push(Completion {
                        wr_id: recv_id,
                        op: Op::RecvNotify,
                        status: Ok(()),
                        byte_len: len as u32,
                        note,
                        landed_at: Some(offset),
                    });
                }
                Ok(())
            }
            Op::Read => {
                let local = &posted.sgl[0];
                let source = inbound
                    .regions
                    .readable(posted.remote, local.len() as u64)
                    .map_err(Violation)?;
                // SAFETY: the reader promised (unsafe read) that nothing
                // touches `local` until the read completes; the source was
                // granted for remote reads, and a racing local write could
                // only change the bytes read, as with RDMA READ.
                unsafe {
                    std::ptr::copy_nonoverlapping(source.as_ptr(), local.as_ptr(), local.len())
                };
                Ok(())
            }
            Op::Recv | Op::RecvNotify => unreachable!("receives are posted, not sent"),
        }
    }

    /// Ends the connection on both ends: end `at` found that the peer broke
    /// the protocol (`why`), or closed. Everything outstanding completes as
    /// flushed: what end `at` holds now, what the other end holds when it
    /// next polls (its lock cannot be taken under this one).
    fn fail(&self, at: usize, inbound: &mut Inbound, why: TransportError) {
        self.go_down(at, why);
        self.flush(at, inbound);
    }

    /// Marks both ends down; `why` is end `at`'s account.
    fn go_down(&self, at: usize, why: TransportError) {
        let peer_why = match &why {
            TransportError::Protocol(text) => TransportError::PeerAbort(text.clone()),
            TransportError::Closed(_) => {
                TransportError::Closed("peer closed the connection".into())
            }
            other => other.clone(),
        };
        self.ends[at].completions.go_down(why);
        self.ends[1 - at].completions.go_down(peer_why);
    }

    /// Flushes what end `at` holds: its receives, and the peer's operations
    /// in its inbox.
    fn flush(&self, at: usize, inbound: &mut Inbound) {
        for (wr_id, _) in inbound.recvs.drain(..) {
            self.ends[at]
                .completions
                .complete(wr_id, Op::Recv, Err(WcError::Flushed), 0);
        }
        for posted in inbound.inbox.drain(..) {
            self.ends[1 - at].completions.complete(
                posted.wr_id,
                posted.op,
                Err(WcError::Flushed),
                0,
            );
        }
    }
}

/// Copies the segments one after another to `to`.
///
/// # Safety
/// Nothing may write the segments meanwhile, and `to` must be valid for
/// their total length and touched by nobody else.
unsafe fn gather(sgl: &[Segment], to: *mut u8) {
    let mut at = 0;
    for seg in sgl {
        // SAFETY: as the caller promised; `Segment` keeps its memory alive
        // and was bounds-checked when made.
        unsafe { std::ptr::copy_nonoverlapping(seg.as_ptr(), to.add(at), seg.len()) };
        at += seg.len();
    }
}

impl Drop for MemoryConnection {
    fn drop(&mut self) {
        self.close();
    }
}

impl Connection for MemoryConnection {
    fn backend(&self) -> Backend {
        Backend::InProcess
    }

    fn limits(&self) -> Limits {
        DEFAULT_LIMITS
    }

    fn register(
        &self,
        memory: &Arc<Memory>,
        access: Access,
        gate: Option<Arc<dyn WriteGate>>,
    ) -> Result<Region, TransportError> {
        self.this()
            .inbound
            .lock()
            .expect("inbound lock")
            .regions
            .add(memory, access, gate)
    }

    unsafe fn post_recv(&self, wr_id: u64, buf: Segment) -> Result<(), TransportError> {
        let mut inbound = self.this().inbound.lock().expect("inbound lock");
        // (Under the lock: a close flushes under it.)
        self.check_open()?;
        if inbound.recvs.len() >= DEFAULT_LIMITS.max_recv_wr as usize {
            return Err(TransportError::QueueFull {
                what: "receive",
                limit: DEFAULT_LIMITS.max_recv_wr,
            });
        }
        inbound.recvs.push_back((wr_id, buf));
        self.pair.deliver(self.me, &mut inbound);
        Ok(())
    }

    unsafe fn post_send(&self, wr_id: u64, sgl: &[Segment]) -> Result<(), TransportError> {
        self.post(Posted {
            wr_id,
            op: Op::Send,
            sgl: sgl.to_vec(),
            remote: RemoteAddr { addr: 0, rkey: 0 },
            note: 0,
        })
    }

    unsafe fn write_notify(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
        note: u32,
    ) -> Result<(), TransportError> {
        self.post(Posted {
            wr_id,
            op: Op::WriteNotify,
            sgl: sgl.to_vec(),
            remote,
            note,
        })
    }

    unsafe fn write(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
    ) -> Result<(), TransportError> {
        self.post(Posted {
            wr_id,
            op: Op::Write,
            sgl: sgl.to_vec(),
            remote,
            note: 0,
        })
    }

    unsafe fn read(
        &self,
        wr_id: u64,
        local: Segment,
        remote: RemoteAddr,
    ) -> Result<(), TransportError> {
        self.post(Posted {
            wr_id,
            op: Op::Read,
            sgl: vec![local],
            remote,
            note: 0,
        })
    }

    fn poll_completions(
        &self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
    ) -> Poll<Result<(), TransportError>> {
        let end = self.this();
        if end.completions.down_and_empty() {
            // Down, perhaps by the peer's hand: flush what this end still
            // holds (inbound lock first, as everywhere).
            self.pair
                .flush(self.me, &mut end.inbound.lock().expect("inbound lock"));
        }
        end.completions.poll(cx, out)
    }

    /// Closes both ends. What this end posted and the peer can take now is
    /// delivered first, as a tcp peer reads the frames written before the
    /// close; the rest is flushed.
    fn close(&self) {
        let peer = 1 - self.me;
        let mut theirs = self.pair.ends[peer].inbound.lock().expect("inbound lock");
        self.pair.deliver(peer, &mut theirs);
        self.pair
            .go_down(self.me, TransportError::Closed("closed locally".into()));
        self.pair.flush(peer, &mut theirs);
        drop(theirs);
        self.pair.flush(
            self.me,
            &mut self.this().inbound.lock().expect("inbound lock"),
        );
    }
}

/// The process-wide table of listeners, by port.
fn listeners() -> &'static Mutex<HashMap<u16, async_channel::Sender<MemoryConnection>>> {
    static TABLE: OnceLock<Mutex<HashMap<u16, async_channel::Sender<MemoryConnection>>>> =
        OnceLock::new();
    TABLE.get_or_init(Mutex::default)
}

/// Listens for in-process connections on a port of its own.
#[derive(Debug)]
pub struct MemoryListener {
    port: u16,
    incoming: async_channel::Receiver<MemoryConnection>,
}

impl MemoryListener {
    /// A listener on a port no other listener of this process holds.
    pub fn bind() -> Result<MemoryListener, TransportError> {
        static NEXT: AtomicU16 = AtomicU16::new(1);
        let mut table = listeners().lock().expect("listener table");
        for _ in 0..=u16::MAX {
            let port = NEXT.fetch_add(1, Ordering::Relaxed);
            if port != 0 && !table.contains_key(&port) {
                let (tx, incoming) = async_channel::unbounded();
                table.insert(port, tx);
                return Ok(MemoryListener { port, incoming });
            }
        }
        Err(TransportError::Invalid(
            "every in-process port is taken".into(),
        ))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub async fn accept(&self) -> Result<MemoryConnection, TransportError> {
        self.incoming
            .recv()
            .await
            .map_err(|_| TransportError::Closed("listener closed".into()))
    }
}

impl Drop for MemoryListener {
    fn drop(&mut self) {
        listeners()
            .lock()
            .expect("listener table")
            .remove(&self.port);
    }
}

/// Connects to the in-process listener on `port`.
pub fn connect(port: u16) -> Result<MemoryConnection, TransportError> {
    let table = listeners().lock().expect("listener table");
    let listener = table.get(&port).ok_or_else(|| {
        TransportError::Io(format!("nothing in this process listens on port {port}"))
    })?;
    let (ours, theirs) = pair();
    listener
        .try_send(theirs)
        .map_err(|_| TransportError::Closed("listener closed".into()))?;
    Ok(ours)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::completions;

    fn region(conn: &MemoryConnection, size: usize, access: Access) -> (Arc<Memory>, Region) {
        let memory = Memory::new(size).unwrap();
        let region = conn.register(&memory, access, None).unwrap();
        (memory, region)
    }

    fn ready(conn: &MemoryConnection) -> Vec<Completion> {
        let mut out = Vec::new();
        let waker = std::task::Waker::noop();
        let _ = conn.poll_completions(&mut Context::from_waker(waker), &mut out);
        out
    }

    #[test]
    fn a_send_waits_for_a_receive_and_keeps_its_place_before_a_notified_write() {
        let (a, b) = pair();
        let (mem_a, reg_a) = region(&a, 8192, Access::LOCAL);
        let (mem_b, reg_b) = region(&b, 8192, Access::REMOTE_WRITE);
        // SAFETY: nothing is posted on this memory yet.
        unsafe { mem_a.slice_mut(0, 8192) }.fill(7);
        // SAFETY: the segments stay untouched until their completions.
        unsafe {
            a.post_send(1, &[reg_a.segment(0, 100).unwrap()]).unwrap();
            a.write_notify(
                2,
                &[reg_a.segment(100, 300).unwrap()],
                reg_b.remote().at(4096),
                9,
            )
            .unwrap();
        }
        assert!(ready(&a).is_empty(), "nothing done without a receive");
        assert!(ready(&b).is_empty());
        // SAFETY: the receive buffer is untouched until its completion.
        unsafe { b.post_recv(10, reg_b.segment(0, 1000).unwrap()).unwrap() };
        let sender = ready(&a);
        assert_eq!(sender.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1]);
        let got = ready(&b);
        assert_eq!(
            (got[0].wr_id, got[0].op, got[0].byte_len),
            (10, Op::Recv, 100)
        );
        // SAFETY: both receives completed... the second is posted next.
        unsafe { b.post_recv(11, reg_b.segment(2000, 16).unwrap()).unwrap() };
        assert_eq!(ready(&a)[0].wr_id, 2);
        let got = ready(&b);
        assert_eq!(
            (got[0].op, got[0].note, got[0].landed_at, got[0].byte_len),
            (Op::RecvNotify, Some(9), Some(4096), 300)
        );
        // SAFETY: every request completed.
        assert!(unsafe { mem_b.slice(0, 100) }.iter().all(|&x| x == 7));
        // SAFETY: as above.
        assert!(unsafe { mem_b.slice(4096, 300) }.iter().all(|&x| x == 7));
        // SAFETY: as above.
        assert!(unsafe { mem_b.slice(100, 1900) }.iter().all(|&x| x == 0));
    }

    #[test]
    fn a_write_outside_what_was_granted_fails_both_ends_and_places_nothing() {
        let (a, b) = pair();
        let (_mem_a, reg_a) = region(&a, 4096, Access::LOCAL);
        let (mem_b, reg_b) = region(&b, 4096, Access::REMOTE_WRITE);
        // SAFETY: the segment stays untouched until its completion.
        unsafe {
            a.write(
                1,
                &[reg_a.segment(0, 200).unwrap()],
                reg_b.remote().at(4000),
            )
        }
        .unwrap();
        let done = ready(&a);
        assert!(matches!(done[0].status, Err(WcError::RemoteAccess(_))));
        let mut out = Vec::new();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(matches!(
            a.poll_completions(&mut cx, &mut out),
            Poll::Ready(Err(TransportError::PeerAbort(ref t))) if t.contains("outside region")
        ));
        assert!(matches!(
            b.poll_completions(&mut cx, &mut out),
            Poll::Ready(Err(TransportError::Protocol(_)))
        ));
        // SAFETY: the connection is down.
        assert!(unsafe { mem_b.slice(0, 4096) }.iter().all(|&x| x == 0));
        // SAFETY: the segment is valid; the post must be refused.
        let again = unsafe { a.post_send(2, &[reg_a.segment(0, 1).unwrap()]) };
        assert!(
            again.is_err(),
            "nothing is posted on a connection that is down"
        );
    }

    #[test]
    fn close_delivers_what_the_peer_can_take_and_flushes_the_rest() {
        let (a, b) = pair();
        let (_mem_a, reg_a) = region(&a, 4096, Access::LOCAL);
        let (_mem_b, reg_b) = region(&b, 4096, Access::LOCAL);
        // SAFETY: buffers untouched until their completions.
        unsafe {
            b.post_recv(20, reg_b.segment(0, 64).unwrap()).unwrap();
            b.post_recv(21, reg_b.segment(64, 64).unwrap()).unwrap();
            a.post_recv(30, reg_a.segment(1000, 64).unwrap()).unwrap();
        }
        // The first send is taken at once; close then flushes b's spare
        // receive and a's own.
        // SAFETY: as above.
        unsafe { a.post_send(1, &[reg_a.segment(0, 10).unwrap()]) }.unwrap();
        a.close();
        let mine: Vec<_> = ready(&a).into_iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(mine, [(1, Ok(())), (30, Err(WcError::Flushed))]);
        let theirs: Vec<_> = ready(&b).into_iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(theirs, [(20, Ok(())), (21, Err(WcError::Flushed))]);
        let mut out = Vec::new();
        let waker = std::task::Waker::noop();
        assert!(matches!(
            b.poll_completions(&mut Context::from_waker(waker), &mut out),
            Poll::Ready(Err(TransportError::Closed(ref t))) if t.contains("peer closed")
        ));
    }

    #[tokio::test]
    async fn listeners_are_found_by_port_and_gone_when_dropped() {
        let listener = MemoryListener::bind().unwrap();
        let port = listener.port();
        let client = connect(port).unwrap();
        let server = listener.accept().await.unwrap();
        let (_m, reg) = region(&server, 64, Access::LOCAL);
        let (_c, creg) = region(&client, 64, Access::LOCAL);
        // SAFETY: buffers untouched until their completions.
        unsafe {
            server.post_recv(1, reg.segment(0, 64).unwrap()).unwrap();
            client.post_send(2, &[creg.segment(0, 5).unwrap()]).unwrap();
        }
        let mut out = Vec::new();
        completions(&server, &mut out).await.unwrap();
        assert_eq!((out[0].wr_id, out[0].byte_len), (1, 5));
        drop(listener);
        let refused = connect(port).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("nothing in this process listens")
        );
    }
}
