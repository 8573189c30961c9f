//! The serving side of rblock over the fabric: one link per client
//! connection; the client opens an export, then sends requests (see
//! [`crate::fabric::proto`]). Requests run concurrently on the export's storage;
//! a write is answered once all its pieces are written (durably, with FUA);
//! a read's data goes out in pieces into the client's slots.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use rfabric::auth;
use rfabric::link::seal::{Before, Protection};
use rfabric::link::{Chunk, ChunkMeta, Incoming, Link};
use rfabric::memory::BufferPool;
use rfabric::transport::{Connection, Region};
use rfabric::wire::{Role, chunk_flags};
use tokio::sync::{Semaphore, watch};

use crate::backend::{Backend, Source};
use crate::execute::{Executed, Failure, carry_out};
use crate::export::Export;
use crate::fabric::proto::{Msg, VERSION, check_open_tag, max_extents, write_request};
use crate::fabric::{SLOTS, link_config};
use crate::nbd::handshake::{MAX_PAYLOAD, find_export};
use crate::nbd::transmission::{Command, Limits, Request, check};
use crate::serve::FabricGuard;
use crate::storage::Storage;

/// A client has this long to open an export.
const OPEN_TIME: Duration = Duration::from_secs(60);
/// Requests carried out at once per link.
const MAX_IN_FLIGHT: usize = 256;
/// Writes whose pieces are still coming, per link at most: a client's
/// slots bound the data in flight, this bounds the bookkeeping.
const MAX_OPEN_WRITES: usize = 4096;

/// Serves one client link from its hello to its goodbye (or failure).
pub(super) async fn serve_link(
    conn: Arc<dyn Connection>,
    exports: Arc<[Export]>,
    mut shutdown: watch::Receiver<bool>,
    guard: FabricGuard,
    client: String,
) -> anyhow::Result<()> {
    let config = link_config(Role::Server, &conn.limits());
    let link = Arc::new(
        tokio::time::timeout(OPEN_TIME, Link::establish(conn, config))
            .await
            .context("the client did not set up the link in time")?
            .context("cannot set up the link")?,
    );
    let opening = open(&link, &exports, &guard, &client);
    let Some(export) = tokio::time::timeout(OPEN_TIME, opening)
        .await
        .context("the client did not open an export in time")??
    else {
        let _ = link.finish().await;
        return Ok(());
    };
    let export = &exports[export];
    let Source::Local(storage) = &export.source else {
        bail!("export {:?} is not on this node", export.info.name);
    };
    // Read data leaves from buffers the size of the client's slots.
    let pool = BufferPool::new(SLOTS as usize, link.max_chunk())?;
    let region = link.register(pool.memory())?;
    let serving = Serving {
        link: Arc::clone(&link),
        storage: Arc::clone(storage),
        backend: Backend::Local(Arc::clone(storage)),
        limits: Limits {
            size: export.info.size,
            read_only: export.info.read_only,
            structured: true,
            allocation: true,
            // The export's own minimum: 1 for the page cache, so the
            // gateway's NBD clients may send requests at any byte.
            min_block: export.info.min_block(),
        },
        pool,
        region,
        writes: Mutex::new(HashMap::new()),
        in_flight: Semaphore::new(MAX_IN_FLIGHT),
    };
    let serving = Arc::new(serving);
    // On shutdown nothing new is taken: what is in flight finishes and is
    // answered, then the link ends. The client sends what got no answer
    // again once it has reconnected (to this server restarted, say).
    let result = loop {
        if *shutdown.borrow() {
            break Ok(());
        }
        let item = tokio::select! {
            item = link.recv() => item,
            changed = shutdown.changed() => {
                // (The sender gone means the server is going away.)
                if changed.is_err() {
                    break Ok(());
                }
                continue;
            }
        };
        let item = match item {
            Ok(Some(item)) => item,
            // The client said goodbye.
            Ok(None) => break Ok(()),
            Err(e) => break Err(anyhow::Error::new(e).context("the link failed")),
        };
        if let Err(e) = Arc::clone(&serving).take(item).await {
            link.abort(&format!("{e:#}"));
            break Err(e);
        }
    };
    let _ = serving.in_flight.acquire_many(MAX_IN_FLIGHT as u32).await;
    if result.is_ok() {
        let _ = link.finish().await;
    }
    result
}

/// The opening (PROTOCOL.md §9.2): the challenge, the client's answer and
/// its Open. The answer is checked against the secret of the export asked
/// for (`secret-file=` of its `--export`), else the server's
/// `--secret-file`; a client that fails is refused before anything is
/// opened, and an unknown export is named only to a client that passed.
/// With a secret, the Open's tag is checked too and the link is sealed
/// before the answer goes out. The export's index, or None when refused.
async fn open(
    link: &Link,
    exports: &[Export],
    guard: &FabricGuard,
    client: &str,
) -> anyhow::Result<Option<usize>> {
    let global = guard.secret.as_deref().map(Vec::as_slice);
    let nonce = auth::nonce();
    let encryption_required = guard.encrypt.wants(link.backend());
    let challenge = Msg::Challenge {
        nonce,
        required: global.is_some() || exports.iter().any(|e| e.secret.is_some()),
        encrypt: encryption_required,
    };
    link.send_message(&challenge.encode()).await?;
    let next = async || match link.recv().await.context("the opening broke off")? {
        Some(Incoming::Message(m)) => anyhow::Ok(Msg::decode(&m)?),
        _ => bail!("the client sent something other than a message during the opening"),
    };
    let answer = next().await?;
    let Msg::Auth {
        nonce: client_nonce,
        proof,
        encrypt,
    } = answer
    else {
        bail!(
            "the client sent {} before answering the challenge (an rblock connect \
             older than this server?)",
            answer.name()
        );
    };
    let opening = next().await?;
    let Msg::Open { version, name, tag } = opening else {
        bail!(
            "the client sent {} instead of an open request",
            opening.name()
        );
    };
    let refuse = |text: String| async move {
        link.send_message(&Msg::Refused { text }.encode()).await?;
        anyhow::Ok(None)
    };
    let found = find_export(exports, name.as_bytes());
    let secret = found
        .and_then(|i| exports[i].secret.as_deref().map(Vec::as_slice))
        .or(global);
    let proof = match secret {
        None => [0; 32],
        Some(s) if auth::RBLOCK.check_client(s, &nonce, &client_nonce, &proof) => {
            let keys = auth::RBLOCK.session_keys(s, &nonce, &client_nonce);
            if !check_open_tag(&keys.client_to_server, version, encrypt, &name, &tag) {
                tracing::warn!(client, export = name, "an opening was changed on the path");
                return refuse(
                    "the open request does not match the proof (changed on the path?)".into(),
                )
                .await;
            }
            if encryption_required && !encrypt {
                return refuse(
                    "this server requires encrypted sessions (rblock connect --encrypt)".into(),
                )
                .await;
            }
            // Sealed from here on: nothing unsealed is taken, and the
            // answer is the first sealed frame.
            let protection = Protection::of(encrypt);
            link.seal_incoming(protection, &keys.client_to_server, Before::CreditsOnly)?;
            link.seal_outgoing(protection, &keys.server_to_client);
            auth::RBLOCK.server_proof(s, &nonce, &client_nonce)
        }
        Some(_) => {
            tracing::warn!(client, export = name, "a client failed to authenticate");
            return refuse(
                "authentication failed: the client does not know the secret of this \
                 server or export (rblock connect --secret-file)"
                    .into(),
            )
            .await;
        }
    };
    link.send_message(&Msg::AuthOk { proof }.encode()).await?;
    if version != VERSION {
        return refuse(format!(
            "protocol version {version} is not served here (this server speaks {VERSION})"
        ))
        .await;
    }
    let Some(i) = found else {
        return refuse(format!("no export named {name:?} here")).await;
    };
    let info = &exports[i].info;
    let opened = Msg::Opened {
        size: info.size,
        flags: info.transmission_flags(),
        max_request: MAX_PAYLOAD,
    };
    link.send_message(&opened.encode()).await?;
    Ok(Some(i))
}

struct Serving {
    link: Arc<Link>,
    storage: Arc<Storage>,
    /// The same storage, for the shared executor.
    backend: Backend,
    limits: Limits,
    pool: Arc<BufferPool>,
    region: Region,
    /// Writes whose pieces are still coming or being written, by id.
    writes: Mutex<HashMap<u64, Arc<Mutex<WriteProgress>>>>,
    in_flight: Semaphore,
}

/// How far one write has come.
struct WriteProgress {
    length: u64,
    /// Bytes that arrived (pieces come in order).
    arrived: u64,
    /// Bytes on storage (or failed).
    settled: u64,
    /// Why a piece failed: the first failure answers the write.
    failed: Option<Failure>,
}

impl Serving {
    /// Takes one incoming item: a request message or a write piece.
    /// Errors are the client's breaches of the protocol.
    async fn take(self: Arc<Self>, item: Incoming) -> anyhow::Result<()> {
        let ticket = match Arc::clone(&self).in_flight_ticket().await {
            Some(t) => t,
            None => bail!("serving stopped"),
        };
        match item {
            Incoming::Message(m) => {
                let Msg::Request(req) = Msg::decode(&m)? else {
                    bail!("the client sent a message that is not a request");
                };
                let command = match check(&req, &self.limits) {
                    Ok(Command::Write { .. }) => {
                        bail!("a write announced as a message (writes come as chunks)")
                    }
                    Ok(Command::Disc) => bail!("a disconnect request over the fabric"),
                    Ok(c) => c,
                    Err(refusal) => {
                        self.reply(req.cookie, refusal.errno, refusal.message).await;
                        return Ok(());
                    }
                };
                tokio::spawn(async move {
                    self.execute(command, req).await;
                    drop(ticket);
                });
            }
            Incoming::Chunk(chunk) => {
                let h = *chunk.header();
                if h.flags & chunk_flags::DIGEST != 0 {
                    bail!("a write piece with a digest (rblock sends none)");
                }
                let req = write_request(&h.digest, h.owner)?;
                let progress = self.progress(&req, h.offset, u64::from(h.payload_len))?;
                let fua = match check(&req, &self.limits) {
                    Ok(Command::Write { fua }) => fua,
                    Ok(_) => bail!("a chunk whose header is not a write"),
                    Err(refusal) => {
                        let why = Failure::from(refusal);
                        self.settle(&req, &progress, u64::from(h.payload_len), Some(why))
                            .await;
                        return Ok(());
                    }
                };
                tokio::spawn(async move {
                    self.write_piece(&req, &progress, chunk, fua).await;
                    drop(ticket);
                });
            }
        }
        Ok(())
    }

    async fn in_flight_ticket(self: Arc<Self>) -> Option<InFlight> {
        let permit = self.in_flight.acquire().await.ok()?;
        permit.forget();
        Some(InFlight(self))
    }

    /// The progress of the write a piece belongs to (made on its first
    /// piece); the piece must come right after the ones before it.
    fn progress(
        &self,
        req: &Request,
        offset: u64,
        len: u64,
    ) -> anyhow::Result<Arc<Mutex<WriteProgress>>> {
        let mut writes = self.writes.lock().expect("writes lock");
        if writes.len() >= MAX_OPEN_WRITES && !writes.contains_key(&req.cookie) {
            bail!("more than {MAX_OPEN_WRITES} writes begun and not finished");
        }
        let p = writes.entry(req.cookie).or_insert_with(|| {
            Arc::new(Mutex::new(WriteProgress {
                length: u64::from(req.length),
                arrived: 0,
                settled: 0,
                failed: None,
            }))
        });
        let mut w = p.lock().expect("progress lock");
        if w.length != u64::from(req.length) || offset != w.arrived || offset + len > w.length {
            bail!(
                "write piece at {offset}+{len} of request {} does not follow the {} bytes before it (of {})",
                req.cookie,
                w.arrived,
                w.length
            );
        }
        if len == 0 && w.length != 0 {
            bail!("an empty write piece");
        }
        w.arrived += len;
        drop(w);
        Ok(Arc::clone(p))
    }

    async fn write_piece(
        &self,
        req: &Request,
        progress: &Arc<Mutex<WriteProgress>>,
        chunk: Chunk,
        fua: bool,
    ) {
        let at = req.offset + chunk.header().offset;
        // The piece leaves its slot at once (its credit goes back to the
        // client) and is written from memory of our own.
        let data = chunk.payload().to_vec();
        drop(chunk);
        let len = data.len();
        let (_, r) = self.storage.write(at, data, 0, len, fua).await;
        let failed = r.err().map(|e| Failure::write(&e));
        self.settle(req, progress, len as u64, failed).await;
    }

    /// Counts `len` more bytes of a write as done; the last of them
    /// answers it.
    async fn settle(
        &self,
        req: &Request,
        progress: &Arc<Mutex<WriteProgress>>,
        len: u64,
        failed: Option<Failure>,
    ) {
        let answer = {
            let mut w = progress.lock().expect("progress lock");
            w.settled += len;
            if w.failed.is_none() {
                w.failed = failed;
            }
            (w.settled == w.length).then(|| w.failed.take())
        };
        let Some(failed) = answer else {
            return;
        };
        self.writes.lock().expect("writes lock").remove(&req.cookie);
        match failed {
            None => self.reply(req.cookie, 0, "").await,
            Some(f) => self.reply(req.cookie, f.errno, &f.text).await,
        }
    }

    async fn reply(&self, id: u64, error: u32, text: &str) {
        let m = Msg::Reply {
            id,
            error,
            text: text.to_string(),
        };
        // A failed send means the link is down: the client resends then.
        let _ = self.link.send_message(&m.encode()).await;
    }

    async fn execute(&self, command: Command, req: Request) {
        let id = req.cookie;
        let executed = match command {
            Command::Read if req.length == 0 => Ok(Executed::Done),
            Command::Read => match self.read(&req).await {
                Ok(()) => return,
                Err(failed) => Err(failed),
            },
            Command::Write { .. } | Command::Disc => unreachable!("refused in take"),
            other => carry_out(other, &req, &self.backend).await,
        };
        match executed {
            Ok(Executed::Done) => self.reply(id, 0, "").await,
            Ok(Executed::Extents(mut extents)) => {
                extents.truncate(max_extents(self.link.max_message()).max(1));
                let m = Msg::Extents { id, extents };
                let _ = self.link.send_message(&m.encode()).await;
            }
            Err(f) => self.reply(id, f.errno, &f.text).await,
        }
    }

    /// Sends a read's data in pieces into the client's slots.
    async fn read(&self, req: &Request) -> Result<(), Failure> {
        let piece = self.link.max_chunk();
        let total = req.length as usize;
        let mut sent = 0;
        while sent < total {
            let len = piece.min(total - sent);
            let buf = self.pool.acquire().await;
            let (buf, r) = self
                .storage
                .read_piece(req.offset + sent as u64, buf, len)
                .await;
            if let Err(e) = r {
                return Err(Failure::read(&e));
            }
            let last = sent + len == total;
            let meta = ChunkMeta {
                owner: req.cookie,
                offset: sent as u64,
                flags: if last { chunk_flags::END_OF_STREAM } else { 0 },
                digest: [0; 32],
            };
            if self.link.send_chunk(meta, &self.region, buf).await.is_err() {
                // The link is down; the client asks again on the next one.
                return Ok(());
            }
            sent += len;
        }
        Ok(())
    }
}

/// One request being carried out; gives its place back when dropped.
struct InFlight(Arc<Serving>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.add_permits(1);
    }
}
