//! The forwarding side of rblock over the fabric: an export on a remote
//! `rblock serve`, reached over N lanes (one link each: a queue pair, or a
//! tcp connection). Each local NBD connection is bound to one lane.
//!
//! A lane that fails (server restarted, network fault) is dialled again
//! with backoff, and every request that got no answer on the old link is
//! sent again on the new one: reads and writes of NBD are idempotent, and
//! an answer is given to the local client only for what the server
//! answered, so a write is never acknowledged that the server did not
//! acknowledge. After `give_up` without a link, requests fail with EIO.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rfabric::auth;
use rfabric::endpoint::{self, Transport};
use rfabric::link::seal::{Before, EncryptChoice, Protection};
use rfabric::link::{ChunkMeta, Incoming, Link};
use rfabric::memory::{BufferPool, PoolBuf};
use rfabric::transport::Region;
use rfabric::wire::{Role, chunk_flags};
use tokio::sync::{oneshot, watch};

use super::landed::{ReadData, Window, keep_moving};
use super::proto::{Msg, VERSION, open_tag, write_tag};
use super::redial::{LaneClock, Wait};
use super::requests::{Expect, Outcome, Requests, Said};
use super::{SLOTS, link_config};
use crate::exit::Refused;
use crate::nbd::consts::{cflags, cmd, errno};
use crate::nbd::transmission::{Extent, Request};

/// What the server said about the export when it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub size: u64,
    /// NBD transmission flags.
    pub flags: u16,
    pub max_request: u32,
}

/// Where the export is and how to reach it.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub name: String,
    pub transport: Transport,
    /// The server's secret, to prove (None: a server that asks is refused).
    pub secret: Option<Arc<Vec<u8>>>,
    /// When the links are encrypted (with a secret; without one nothing
    /// is sealed).
    pub encrypt: EncryptChoice,
}

/// How long the server has to send its challenge.
const CHALLENGE_TIME: Duration = Duration::from_secs(30);

/// A remote export behind its lanes.
#[derive(Debug)]
pub struct Remote {
    target: Target,
    pub opened: Opened,
    /// Bytes of one request's data a lane carries at once: its landing
    /// window (the slots times their size, as the first link set them).
    window: u32,
    lanes: Vec<Lane>,
    next_lane: AtomicUsize,
    /// Set by `close`: no more dialling.
    closed: AtomicBool,
}

#[derive(Debug)]
struct Lane {
    /// The live session, or None while the lane is being dialled again.
    current: watch::Sender<Option<Arc<Session>>>,
    /// Its outage and redial timing.
    clock: Mutex<LaneClock>,
}

/// How a request ended.
#[derive(Debug)]
enum Answer {
    /// A read's data.
    Data(ReadData),
    /// Done; `error` is an NBD error number (0: it worked).
    Done {
        error: u32,
    },
    Extents(Vec<Extent>),
    /// The link went down first: ask again.
    Lost,
}

/// Who waits for a request's answer (the request table keeps it).
#[derive(Debug)]
enum Pending {
    /// A read: its data is gathered as it comes.
    Read {
        data: ReadData,
        reply: oneshot::Sender<Answer>,
    },
    Other(oneshot::Sender<Answer>),
}

impl Pending {
    /// Tells the waiter how its request ended.
    fn answer(self, outcome: Outcome) {
        let (reply, answer) = match (self, outcome) {
            (Pending::Read { data, reply }, Outcome::Data) => (reply, Answer::Data(data)),
            (Pending::Read { reply, .. } | Pending::Other(reply), Outcome::Done { error }) => {
                (reply, Answer::Done { error })
            }
            (Pending::Read { reply, .. } | Pending::Other(reply), Outcome::Extents(e)) => {
                (reply, Answer::Extents(e))
            }
            // (Never: the table answers with data only a read.)
            (Pending::Other(reply), Outcome::Data) => (reply, Answer::Done { error: errno::EIO }),
        };
        let _ = reply.send(answer);
    }

    fn lose(self) {
        let (Pending::Read { reply, .. } | Pending::Other(reply)) = self;
        let _ = reply.send(Answer::Lost);
    }
}

/// What a request carries to the server.
#[derive(Clone, Copy)]
enum Carry<'a> {
    Nothing,
    /// A write's data, copied into the link's buffers to go.
    Bytes(&'a [u8]),
    /// A write's data already in a link's buffers ([`Remote::stage`]).
    Staged(&'a Staged),
}

/// A write's data received straight into the buffers of a lane's link
/// (registered with it), to be sent from there: [`Remote::stage`].
#[derive(Debug)]
pub struct Staged {
    session: Arc<Session>,
    /// Whole pieces of the link's chunk size, the last one shorter; kept
    /// until the server answers, to be sent again if the link fails.
    pieces: Vec<Arc<PoolBuf>>,
}

impl Staged {
    /// The pieces, to fill in order (each exactly as long as its share).
    /// Only before the write is sent.
    pub fn pieces_mut(&mut self) -> impl Iterator<Item = &mut [u8]> {
        self.pieces.iter_mut().map(|p| {
            Arc::get_mut(p)
                .expect("a staged write is filled before it is sent")
                .data_mut()
        })
    }

    fn len(&self) -> usize {
        self.pieces.iter().map(|p| p.len()).sum()
    }

    /// The data in one buffer (to send it again on another link: rare).
    pub fn gather(&self) -> Vec<u8> {
        self.pieces.iter().flat_map(|p| p.data()).copied().collect()
    }
}

/// Writes at least this long are received straight into a link's
/// buffers: below it the copy costs less than a pool buffer held until
/// the server answers.
const STAGE_AT: usize = 64 * 1024;

/// One link of a lane and the requests in flight on it.
struct Session {
    link: Arc<Link>,
    /// The requests in flight (none once the link has failed), and the
    /// landing slots the reads among them hold.
    pending: Mutex<InFlight>,
    /// Write data leaves from these buffers (registered with the link).
    pool: Arc<BufferPool>,
    region: Region,
}

struct InFlight {
    requests: Requests<Pending>,
    window: Window,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("link", &self.link).finish()
    }
}

impl Remote {
    /// Opens the export on `lanes` links. Fails if the first one cannot be
    /// set up (nothing listening, export unknown); the others are dialled
    /// in the background if they fail.
    pub async fn connect(
        target: Target,
        lanes: usize,
        give_up: Duration,
    ) -> anyhow::Result<Arc<Remote>> {
        let (first, opened) = open_session(&target)
            .await
            .with_context(|| format!("cannot open {}/{}", target.addr, target.name))?;
        let window = u32::try_from(first.link.max_chunk())
            .unwrap_or(u32::MAX)
            .saturating_mul(SLOTS);
        let mut all = Vec::with_capacity(lanes);
        all.push(Lane::up(Arc::clone(&first), give_up));
        for _ in 1..lanes.max(1) {
            all.push(match open_session(&target).await {
                Ok((s, o)) if o == opened => Lane::up(s, give_up),
                _ => Lane::down(give_up),
            });
        }
        let remote = Arc::new(Remote {
            target,
            opened,
            window,
            lanes: all,
            next_lane: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        });
        for i in 0..remote.lanes.len() {
            if let Some(s) = remote.lanes[i].current.borrow().clone() {
                tokio::spawn(receive(Arc::clone(&remote), i, s));
            }
            tokio::spawn(redial(Arc::downgrade(&remote), i));
        }
        Ok(remote)
    }

    /// The backend of the links ("rdma", "tcp"), as the first lane found.
    pub fn backend(&self) -> &'static str {
        self.lanes[0]
            .current
            .borrow()
            .as_ref()
            .map_or("a link being set up", |s| s.link.backend().name())
    }

    /// How the lanes are sealed: "encrypted", "authenticated", or
    /// "unauthenticated" (no secret).
    pub fn protection(&self) -> &'static str {
        self.lanes[0]
            .current
            .borrow()
            .as_ref()
            .map_or("not yet", |s| {
                s.link
                    .protection()
                    .map_or("unauthenticated", Protection::name)
            })
    }

    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// The largest request whose data a lane carries in one go: its
    /// window, within what the server accepts.
    pub fn request_in_one_go(&self) -> u32 {
        self.window.min(self.opened.max_request)
    }

    /// Says goodbye on every lane (the server then sees a clean end).
    pub async fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        for l in &self.lanes {
            let s = l.current.send_replace(None);
            if let Some(s) = s {
                let _ = tokio::time::timeout(Duration::from_secs(5), s.link.finish()).await;
            }
        }
    }

    /// The lane for the next local connection (round robin).
    pub fn next_lane(&self) -> usize {
        self.next_lane.fetch_add(1, Ordering::Relaxed) % self.lanes.len()
    }

    /// Reads `len` bytes at `offset`: the data as it landed (see
    /// [`ReadData`]).
    pub async fn read(&self, lane: usize, offset: u64, len: usize) -> std::io::Result<ReadData> {
        match self
            .call(lane, cmd::READ, 0, offset, len as u32, Carry::Nothing)
            .await?
        {
            Answer::Data(data) => Ok(data),
            Answer::Done { error } => Err(as_io(error)),
            other => Err(confused(&other)),
        }
    }

    /// Writes `data` at `offset`; durable before it returns with `fua`.
    pub async fn write(
        &self,
        lane: usize,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> std::io::Result<()> {
        self.write_carried(lane, offset, Carry::Bytes(data), data.len(), fua)
            .await
    }

    /// Buffers of lane `lane`'s link to receive a write of `len` bytes
    /// into, if it is worth it and they are free: a write of at least
    /// [`STAGE_AT`] on a link whose seal leaves payloads as they are (no
    /// seal: a sealed link encrypts payloads in place, and a write must be
    /// kept as it is, to be sent again after a reconnect). All of them or
    /// none, never waiting: the caller fills them from its socket, and
    /// two writes each holding half of the buffers must not wait for the
    /// other half.
    pub fn stage(&self, lane: usize, len: usize) -> Option<Staged> {
        let s = self.lanes[lane].current.borrow().clone()?;
        if len < STAGE_AT || s.link.seals_payload(chunk_flags::END_OF_STREAM) {
            return None;
        }
        let piece = s.link.max_chunk();
        let mut bufs = s.pool.try_acquire_many(len.div_ceil(piece))?;
        for (i, b) in bufs.iter_mut().enumerate() {
            b.set_len(piece.min(len - i * piece));
        }
        let pieces = bufs.into_iter().map(Arc::new).collect();
        Some(Staged { session: s, pieces })
    }

    /// Writes the data `staged` holds at `offset`, sent from those
    /// buffers; durable before it returns with `fua`.
    pub async fn write_staged(
        &self,
        lane: usize,
        offset: u64,
        staged: &Staged,
        fua: bool,
    ) -> std::io::Result<()> {
        self.write_carried(lane, offset, Carry::Staged(staged), staged.len(), fua)
            .await
    }

    async fn write_carried(
        &self,
        lane: usize,
        offset: u64,
        data: Carry<'_>,
        len: usize,
        fua: bool,
    ) -> std::io::Result<()> {
        if len == 0 {
            // Nothing to carry (and no piece to carry it in): only the
            // durability asked for.
            return if fua { self.flush(lane).await } else { Ok(()) };
        }
        let flags = if fua { cflags::FUA } else { 0 };
        self.simple(lane, cmd::WRITE, flags, offset, len as u32, data)
            .await
            .map_err(as_io)
    }

    /// A request (a WRITE carries data, the others none); its answer,
    /// asked again on the next link until one comes.
    async fn call(
        &self,
        lane: usize,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        data: Carry<'_>,
    ) -> std::io::Result<Answer> {
        let expect = if kind == cmd::READ {
            Expect::Read {
                len: u64::from(length),
            }
        } else {
            Expect::Reply
        };
        loop {
            let s = self.session(lane).await?;
            let Some((id, rx)) = s.enlist(expect) else {
                self.lost(lane, &s);
                continue;
            };
            let req = Request {
                flags,
                kind,
                cookie: id,
                offset,
                length,
            };
            // A failed send means the link is down: the answer says so.
            match data {
                Carry::Nothing => {
                    let _ = s.link.send_message(&Msg::Request(req).encode()).await;
                }
                Carry::Bytes(bytes) => s.send_write(&req, bytes).await,
                Carry::Staged(st) if Arc::ptr_eq(&st.session, &s) => {
                    s.send_staged(&req, st).await;
                }
                // Staged for a link that has failed since.
                Carry::Staged(st) => s.send_write(&req, &st.gather()).await,
            }
            match rx.await {
                Ok(Answer::Lost) => self.lost(lane, &s),
                Ok(answer) => return Ok(answer),
                Err(_) => return Err(dropped()),
            }
        }
    }

    /// A request that is answered with success or an error.
    async fn simple(
        &self,
        lane: usize,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        data: Carry<'_>,
    ) -> Result<(), u32> {
        match self.call(lane, kind, flags, offset, length, data).await {
            Ok(Answer::Done { error: 0, .. }) => Ok(()),
            Ok(Answer::Done { error, .. }) => Err(error),
            Ok(_) | Err(_) => Err(errno::EIO),
        }
    }

    pub async fn flush(&self, lane: usize) -> std::io::Result<()> {
        self.simple(lane, cmd::FLUSH, 0, 0, 0, Carry::Nothing)
            .await
            .map_err(as_io)
    }

    pub async fn trim(&self, lane: usize, offset: u64, len: u32, fua: bool) -> std::io::Result<()> {
        let flags = if fua { cflags::FUA } else { 0 };
        self.simple(lane, cmd::TRIM, flags, offset, len, Carry::Nothing)
            .await
            .map_err(as_io)
    }

    pub async fn cache(&self, lane: usize, offset: u64, len: u32) -> std::io::Result<()> {
        self.simple(lane, cmd::CACHE, 0, offset, len, Carry::Nothing)
            .await
            .map_err(as_io)
    }

    /// WRITE_ZEROES; `Err` carries the NBD error number.
    pub async fn zero(&self, lane: usize, offset: u64, len: u32, flags: u16) -> Result<(), u32> {
        self.simple(lane, cmd::WRITE_ZEROES, flags, offset, len, Carry::Nothing)
            .await
    }

    pub async fn block_status(
        &self,
        lane: usize,
        offset: u64,
        len: u32,
        flags: u16,
    ) -> std::io::Result<Vec<Extent>> {
        match self
            .call(lane, cmd::BLOCK_STATUS, flags, offset, len, Carry::Nothing)
            .await?
        {
            Answer::Extents(e) => Ok(e),
            Answer::Done { error } => Err(as_io(error)),
            other => Err(confused(&other)),
        }
    }

    /// The lane's live session, waiting for a redial; an error once the
    /// lane has been down for longer than `give_up`.
    async fn session(&self, lane: usize) -> std::io::Result<Arc<Session>> {
        let l = &self.lanes[lane];
        let mut rx = l.current.subscribe();
        loop {
            if let Some(s) = rx.borrow_and_update().clone() {
                return Ok(s);
            }
            let (wait, give_up) = {
                let clock = l.clock.lock().expect("lane lock");
                (clock.wait(Instant::now()), clock.give_up())
            };
            let until = match wait {
                Wait::Until(deadline) => deadline,
                // Connected, and the session is about to be published.
                Wait::Up => Instant::now() + give_up,
                Wait::GiveUp => {
                    return Err(std::io::Error::other(format!(
                        "no link to {} for {give_up:?}",
                        self.target.addr
                    )));
                }
            };
            let _ = tokio::time::timeout_at(until.into(), rx.changed()).await;
        }
    }

    /// `s` failed under a request: the lane is down (once) and redialled.
    fn lost(&self, lane: usize, s: &Arc<Session>) {
        self.lanes[lane].lose(s);
    }
}

impl Lane {
    fn up(s: Arc<Session>, give_up: Duration) -> Lane {
        Lane {
            current: watch::Sender::new(Some(s)),
            clock: Mutex::new(LaneClock::up(give_up)),
        }
    }

    fn down(give_up: Duration) -> Lane {
        Lane {
            current: watch::Sender::new(None),
            clock: Mutex::new(LaneClock::down(give_up, Instant::now())),
        }
    }

    /// Takes `s` out of service if it is still the lane's session.
    fn lose(&self, s: &Arc<Session>) {
        let taken = self.current.send_if_modified(|cur| match cur {
            Some(c) if Arc::ptr_eq(c, s) => {
                *cur = None;
                true
            }
            _ => false,
        });
        if taken {
            self.clock.lock().expect("lane lock").lost(Instant::now());
            s.link.abort("the client gave this link up");
        }
    }
}

impl Session {
    /// Registers a request under a fresh id; None if the link has failed
    /// already.
    fn enlist(&self, expect: Expect) -> Option<(u64, oneshot::Receiver<Answer>)> {
        let (reply, rx) = oneshot::channel();
        let pending = match expect {
            Expect::Read { .. } => Pending::Read {
                data: ReadData::default(),
                reply,
            },
            Expect::Reply => Pending::Other(reply),
        };
        let mut table = self.pending.lock().expect("pending lock");
        table
            .requests
            .enlist(expect, pending)
            .ok()
            .map(|id| (id, rx))
    }

    /// Sends a write's data in pieces into the server's slots, each
    /// carrying the request; stops at the first failed send (the link is
    /// down then).
    async fn send_write(&self, req: &Request, data: &[u8]) {
        let tag = write_tag(req);
        let piece = self.link.max_chunk();
        for (i, part) in data.chunks(piece).enumerate() {
            let mut buf = self.pool.acquire().await;
            buf.fill_from(part);
            let meta = write_piece(req.cookie, tag, i * piece, (i + 1) * piece >= data.len());
            if self.link.send_chunk(meta, &self.region, buf).await.is_err() {
                return;
            }
        }
    }

    /// Sends a write's data from the buffers it was staged in (this
    /// link's), as [`Session::send_write`] does from a copy.
    async fn send_staged(&self, req: &Request, staged: &Staged) {
        let tag = write_tag(req);
        let piece = self.link.max_chunk();
        let last = staged.pieces.len() - 1;
        for (i, buf) in staged.pieces.iter().enumerate() {
            let meta = write_piece(req.cookie, tag, i * piece, i == last);
            let sent = self.link.send_kept(meta, &self.region, Arc::clone(buf));
            if sent.await.is_err() {
                return;
            }
        }
    }

    /// Hands an incoming item to the request it answers.
    fn deliver(&self, item: Incoming) -> anyhow::Result<()> {
        let mut table = self.pending.lock().expect("pending lock");
        let InFlight { requests, window } = &mut *table;
        match item {
            Incoming::Chunk(c) => {
                let (h, seq) = (*c.header(), c.seq());
                let len = u64::from(h.payload_len);
                let append = |p: &mut Pending| {
                    if let Pending::Read { data, .. } = p {
                        data.push(c);
                    }
                };
                match requests.data(h.owner, h.offset, len, append)? {
                    Some(p) => p.answer(Outcome::Data),
                    None => window.held(seq),
                }
                let waiting = requests.waiters_mut().filter_map(|p| match p {
                    Pending::Read { data, .. } => Some(data),
                    Pending::Other(_) => None,
                });
                keep_moving(window, seq, waiting);
            }
            Incoming::Message(m) => {
                let (id, said) = match Msg::decode(&m)? {
                    // (The server's text is for its own log; NBD gets the number.)
                    Msg::Reply { id, error, .. } => (id, Said::Reply { error }),
                    Msg::Extents { id, extents } => (id, Said::Extents(extents)),
                    other => bail!("unexpected message from the server: {other:?}"),
                };
                let (p, outcome) = requests.answer(id, said)?;
                p.answer(outcome);
            }
        }
        Ok(())
    }

    /// The link is gone: every request still waiting is sent again on the
    /// next one. How many there were.
    fn fail_all(&self) -> usize {
        let lost = self
            .pending
            .lock()
            .expect("pending lock")
            .requests
            .fail_all();
        let count = lost.len();
        for p in lost {
            p.lose();
        }
        count
    }
}

/// Takes what the server sends on a session until its link ends.
async fn receive(remote: Arc<Remote>, lane: usize, s: Arc<Session>) {
    loop {
        let item = match s.link.recv().await {
            Ok(Some(item)) => item,
            _ if remote.closed.load(Ordering::Relaxed) => break,
            Ok(None) => {
                tracing::warn!(lane, "the server closed the link; dialling again");
                break;
            }
            Err(e) => {
                tracing::warn!(lane, "link failed ({e}); dialling again");
                break;
            }
        };
        if let Err(e) = s.deliver(item) {
            tracing::error!(lane, "the server broke the protocol: {e:#}");
            s.link.abort(&format!("{e:#}"));
            break;
        }
    }
    remote.lanes[lane].lose(&s);
    let unanswered = s.fail_all();
    if unanswered > 0 {
        tracing::warn!(
            lane,
            unanswered,
            "{unanswered} request(s) got no answer; they go again once connected"
        );
    }
}

/// Keeps lane `lane` dialled: whenever it is down, dials with backoff
/// until a session is up again. Ends with the remote.
async fn redial(remote: std::sync::Weak<Remote>, lane: usize) {
    let mut rx = match remote.upgrade() {
        Some(r) => r.lanes[lane].current.subscribe(),
        None => return,
    };
    loop {
        // Wait until the lane is down.
        while rx.borrow_and_update().is_some() {
            if rx.changed().await.is_err() {
                return;
            }
        }
        let mut said = None::<String>;
        loop {
            let Some(r) = remote.upgrade() else { return };
            if r.closed.load(Ordering::Relaxed) {
                return;
            }
            match open_session(&r.target).await {
                Ok((s, opened)) if opened == r.opened => {
                    tracing::info!(lane, "connected again");
                    r.lanes[lane].clock.lock().expect("lane lock").connected();
                    tokio::spawn(receive(Arc::clone(&r), lane, Arc::clone(&s)));
                    r.lanes[lane].current.send_replace(Some(s));
                    break;
                }
                Ok((s, opened)) => {
                    s.link.abort("the export changed");
                    let why = format!(
                        "the export changed (was {:?}, now {opened:?}); not using it",
                        r.opened
                    );
                    if said.as_ref() != Some(&why) {
                        tracing::warn!(lane, "{why}");
                        said = Some(why);
                    }
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    if said.as_ref() != Some(&why) {
                        tracing::warn!(lane, "{why}; retrying");
                        said = Some(why);
                    }
                }
            }
            let next = r.lanes[lane]
                .clock
                .lock()
                .expect("lane lock")
                .dial_failed(Instant::now());
            drop(r);
            tokio::time::sleep_until(next.into()).await;
        }
    }
}

/// Dials the server, sets up a link and opens the export on it.
async fn open_session(t: &Target) -> anyhow::Result<(Arc<Session>, Opened)> {
    let conn = endpoint::connect(t.addr, t.transport)
        .await
        .with_context(|| format!("cannot connect to {}", t.addr))?;
    let config = link_config(Role::Client, &conn.limits());
    let link = Link::establish(conn, config)
        .await
        .context("cannot set up the link")?;
    let next = || async {
        match link.recv().await? {
            Some(Incoming::Message(m)) => anyhow::Ok(Msg::decode(&m)?),
            _ => bail!("the server closed the link during the opening"),
        }
    };
    // The server's challenge first (a server older than this client
    // waits for an Open instead: then nothing comes).
    let challenge = tokio::time::timeout(CHALLENGE_TIME, next())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the server sent no challenge within {CHALLENGE_TIME:?} (an rblock serve \
                 older than this client?)"
            )
        })??;
    let Msg::Challenge {
        nonce,
        required,
        encrypt: encryption_required,
    } = challenge
    else {
        bail!(
            "the server started with {} instead of a challenge",
            challenge.name()
        );
    };
    let client_nonce = auth::nonce();
    let secret = match (&t.secret, required) {
        (Some(s), true) => Some(s),
        (None, false) => None,
        // The export asked for may need none: the server decides, and
        // refuses what needs one.
        (None, true) => None,
        // (The server waits for an answer: the link is ended, not
        // finished, which would wait for the server's goodbye.)
        (Some(_), false) => {
            link.abort("this client refuses a server that does not authenticate");
            return Err(Refused(
                "the server does not authenticate (it runs without --secret-file), and \
                 this client was given a secret: refusing to use it"
                    .into(),
            )
            .into());
        }
    };
    // With a secret, the session is sealed: everything the server sends
    // after reading the proof, everything this side sends after the
    // server's proof (PROTOCOL.md §9.2).
    let encrypt = secret.is_some() && (t.encrypt.wants(link.backend()) || encryption_required);
    let protection = Protection::of(encrypt);
    let (proof, keys) = match secret {
        Some(s) => (
            auth::RBLOCK.client_proof(s, &nonce, &client_nonce),
            Some(auth::RBLOCK.session_keys(s, &nonce, &client_nonce)),
        ),
        None => ([0; 32], None),
    };
    if let Some(k) = &keys {
        link.seal_incoming(protection, &k.server_to_client, Before::Anything)?;
    }
    link.send_message(
        &Msg::Auth {
            nonce: client_nonce,
            proof,
            encrypt,
        }
        .encode(),
    )
    .await?;
    let open = Msg::Open {
        version: VERSION,
        name: t.name.clone(),
        tag: keys.as_ref().map_or([0; 32], |k| {
            open_tag(&k.client_to_server, VERSION, encrypt, &t.name)
        }),
    };
    link.send_message(&open.encode()).await?;
    match next().await? {
        Msg::AuthOk { proof } => {
            if let (Some(s), Some(k)) = (secret, &keys) {
                if !auth::RBLOCK.check_server(s, &nonce, &client_nonce, &proof) {
                    link.abort("the server could not prove it knows the secret");
                    return Err(
                        Refused("the server could not prove it knows the secret".into()).into(),
                    );
                }
                link.seal_outgoing(protection, &k.client_to_server);
            }
        }
        Msg::Refused { text } => {
            let _ = link.finish().await;
            return Err(Refused(format!("the server refused: {text}")).into());
        }
        other => bail!("unexpected answer to the challenge: {}", other.name()),
    }
    let answer = next().await?;
    let opened = match answer {
        Msg::Opened {
            size,
            flags,
            max_request,
        } => Opened {
            size,
            flags,
            max_request,
        },
        Msg::Refused { text } => {
            let _ = link.finish().await;
            return Err(Refused(format!("the server refused: {text}")).into());
        }
        other => bail!("unexpected answer to the open request: {other:?}"),
    };
    // Twice the slots: writes staged in buffers hold them until the
    // server answers, and copied writes still find some free.
    let pool = BufferPool::new(2 * SLOTS as usize, link.max_chunk())?;
    let region = link.register(pool.memory())?;
    let table = InFlight {
        requests: Requests::new(),
        window: Window::new(link.ring_slots()),
    };
    let s = Session {
        link: Arc::new(link),
        pending: Mutex::new(table),
        pool,
        region,
    };
    Ok((Arc::new(s), opened))
}

/// The chunk fields of the piece of request `id`'s write data at `at`:
/// the request header rides in the digest bytes (`tag`, [`write_tag`]),
/// and the last piece ends the stream.
fn write_piece(id: u64, tag: [u8; 32], at: usize, last: bool) -> ChunkMeta {
    ChunkMeta {
        owner: id,
        offset: at as u64,
        flags: if last { chunk_flags::END_OF_STREAM } else { 0 },
        digest: tag,
    }
}

/// An NBD error number as an I/O error (they are Linux's numbers).
fn as_io(error: u32) -> std::io::Error {
    std::io::Error::from_raw_os_error(error as i32)
}

/// A request whose answer can no longer come (every pending request is
/// answered or handed back when its link ends, so this means a bug).
fn dropped() -> std::io::Error {
    std::io::Error::other("the request was dropped without an answer")
}

fn confused(a: &Answer) -> std::io::Error {
    std::io::Error::other(format!("unexpected answer from the server: {a:?}"))
}
