//! A broadcast node's onward hop: the [`Relay`] a receiver in a chain
//! forwards everything it is sent through, in order, to the next node.
//!
//! The source writes each chunk once, to the first node. Each node hands
//! every message and chunk on before it works on it itself, so the data
//! moves down the chain a chunk behind the node before; its landing slot
//! is credited back upstream only once both its own write and the
//! forward are done: a slow node downstream holds the credits of every
//! node before it, and the chain runs at the pace of its slowest hop,
//! with no unbounded queue anywhere.
//!
//! The forward is a one-sided write straight from the landing slot (the
//! landing ring registered with the onward link too; the onward link
//! holds the chunk until its write completes), where the onward link's
//! seal leaves payloads alone: over RDMA, and wherever the chunk's digest
//! vouches for it and the link authenticates without encrypting. Where
//! the onward link encrypts, the payload is copied into a buffer of the
//! onward link and sealed there: the slot holds the plaintext this node
//! is still hashing and writing.
//!
//! Every node checks every chunk and file digest itself (the digests are
//! the source's, carried on), and answers a [`NodeResult`] before its
//! goodbye: its own, then those it heard from the nodes after it. A next
//! node that fails or goes silent is cut out: this node stops forwarding,
//! finishes its own copy, and reports that node with the reason. The
//! nodes beyond it report nothing; the source runs them again as a chain
//! of their own ([`crate::broadcast`]).
//!
//! When files are answered (a re-sync, `--resume`), a node answers each
//! once for itself and every node after it: its own answer merged with
//! the next node's ([`crate::merge`], through a [`Merging`]), so the
//! source sends one stream of what any node lacks.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use rfabric::endpoint::Transport;
use rfabric::link::{Chunk, ChunkMeta, Incoming, Link};
use rfabric::memory::BufferPool;
use rfabric::transport::{Backend, Region};

use crate::merge::{Merge, MergeViolation, Said};
use crate::proto::{Hop, Msg, NodeResult, flags};
use crate::recv::Received;
use crate::session::{self, Params, Target};

/// This node's answers and the next node's, merged: each merged answer
/// goes out on `out` (to the node before, once the receiver runs).
#[derive(Debug)]
pub struct Merging {
    merge: std::sync::Mutex<Merge>,
    out: tokio::sync::mpsc::UnboundedSender<(u32, Said)>,
}

/// Where a node's merged answers come out.
pub type MergedAnswers = tokio::sync::mpsc::UnboundedReceiver<(u32, Said)>;

impl Merging {
    fn new() -> (Arc<Merging>, MergedAnswers) {
        let (out, rx) = tokio::sync::mpsc::unbounded_channel();
        let m = Merging {
            merge: std::sync::Mutex::new(Merge::new()),
            out,
        };
        (Arc::new(m), rx)
    }

    fn emit(&self, merged: impl IntoIterator<Item = (u32, Said)>) {
        for m in merged {
            // (Nobody listens once the receiver is over: nothing is asked
            // then.)
            let _ = self.out.send(m);
        }
    }

    /// This node's own answer about entry `index`.
    pub fn own(&self, index: u32, said: Said) {
        let merged = self.merge.lock().expect("merge lock").own(index, said);
        self.emit(merged);
    }

    /// One of the next node's answers (a message it sent).
    fn next(&self, msg: Msg) -> Result<(), MergeViolation> {
        let mut merge = self.merge.lock().expect("merge lock");
        let merged = match msg {
            Msg::Have {
                index,
                first,
                digests,
            } => vec![merge.next_have(index, first, digests)?],
            Msg::EntriesWanted { indices } => indices
                .into_iter()
                .map(|i| merge.next(i, Said::All))
                .collect::<Result<_, _>>()?,
            Msg::EntriesSkipped { indices } => indices
                .into_iter()
                .map(|i| merge.next(i, Said::Nothing))
                .collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        drop(merge);
        self.emit(merged.into_iter().flatten());
        Ok(())
    }

    /// The next node answers no more.
    fn gone(&self) {
        let merged = self.merge.lock().expect("merge lock").next_gone();
        self.emit(merged);
    }
}

/// Buffers the payloads of forwarded chunks wait in until their writes
/// completed: the onward link's window bounds how many are in flight.
fn forward_buffers(params: &Params) -> usize {
    (params.window as usize).clamp(2, 64)
}

/// The request a node sends on, as it received it (the chain after it).
#[derive(Debug, Clone)]
pub struct Onward {
    pub flags: u32,
    pub sources: u32,
    pub dest: Vec<u8>,
}

/// This node's link to the next node, while it carries the broadcast.
struct Next {
    link: Link,
    pool: Arc<BufferPool>,
    region: Region,
    /// The landing ring chunks arrive in, registered with this link (at
    /// the first chunk forwarded from its slot).
    landed: Option<Region>,
    /// The next nodes' answers, read as they come: their results.
    answers: tokio::task::JoinHandle<Heard>,
    /// With merged answers: where the next node's answers meet this
    /// node's, and where the merged ones come out (until the receiver
    /// takes them).
    merging: Option<(Arc<Merging>, Option<MergedAnswers>)>,
}

/// What the next node said before its goodbye (or before it was lost).
#[derive(Debug, Default)]
struct Heard {
    results: Vec<NodeResult>,
    /// Why its answers ended other than by a goodbye.
    lost: Option<String>,
}

/// The onward hop of a node in a chain.
pub struct Relay {
    /// The next node.
    hop: Hop,
    next: Option<Next>,
    /// Why forwarding stopped (set once).
    broken: Option<String>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("next", &self.hop.name)
            .field("forwarding", &self.next.is_some())
            .field("broken", &self.broken)
            .finish()
    }
}

impl Relay {
    /// The onward hop of the node first in `hops` (the chain from it on),
    /// reached over `backend` as its own link came: none for the last node.
    pub async fn onward(
        hops: &[Hop],
        onward: Onward,
        params: &Params,
        backend: Backend,
        own_secret: &[u8],
    ) -> Option<Relay> {
        let next = hops.get(1..).filter(|rest| !rest.is_empty())?;
        Some(Relay::open(next, onward, params, Transport::of(backend), own_secret).await)
    }

    /// Reaches `hops[0]` and asks it to receive what this node receives,
    /// as the head of the chain `hops` (itself first). A next node that
    /// cannot be reached gives a relay that forwards nothing and reports
    /// why.
    async fn open(
        hops: &[Hop],
        onward: Onward,
        params: &Params,
        target_transport: Transport,
        own_secret: &[u8],
    ) -> Relay {
        let hop = hops.first().expect("a relay has a next node").clone();
        let secret = if hop.token.is_empty() {
            own_secret.to_vec()
        } else {
            hop.token.clone()
        };
        let opened = async {
            let addr = rfabric::endpoint::resolve(&hop.host, hop.port)?;
            let target = Target {
                addr,
                transport: target_transport,
            };
            let link = target.open(&secret, params).await?;
            let request = Msg::Push {
                flags: onward.flags | flags::CHAIN,
                streams: 1,
                sources: onward.sources,
                dest: onward.dest.clone(),
            };
            let asked = async {
                link.send_message(&request.encode()).await?;
                session::send_tail(&link, params).await?;
                session::send_hops(&link, hops).await?;
                session::expect_ready(&link).await
            };
            if let Err(e) = asked.await {
                link.abort("the chain could not be set up");
                return Err(e);
            }
            let pool = BufferPool::new(forward_buffers(params), link.max_chunk().max(1))?;
            let region = link.register(pool.memory())?;
            let merging = (onward.flags & flags::MERGED_ANSWERS != 0).then(Merging::new);
            let answers = tokio::spawn(listen(
                link.clone(),
                merging.as_ref().map(|(m, _)| Arc::clone(m)),
            ));
            anyhow::Ok(Next {
                link,
                pool,
                region,
                landed: None,
                answers,
                merging: merging.map(|(m, rx)| (m, Some(rx))),
            })
        };
        match opened.await {
            Ok(next) => Relay {
                hop,
                next: Some(next),
                broken: None,
            },
            Err(e) => Relay {
                broken: Some(format!("cannot reach it: {e:#}")),
                hop,
                next: None,
            },
        }
    }

    /// Sends a message on to the next node, as it came. A failure cuts
    /// the next node out (the copy here goes on).
    pub async fn forward_message(&mut self, bytes: &[u8]) {
        let Some(next) = &self.next else {
            return;
        };
        if let Err(e) = next.link.send_message(bytes).await {
            self.cut(format!("forwarding to it failed: {e}"));
        }
    }

    /// Sends a landed chunk on to the next node, as it came: from its
    /// landing slot where the onward seal leaves the payload alone, else
    /// from a copy. A failure cuts the next node out (the copy here goes
    /// on).
    pub async fn forward_chunk(&mut self, chunk: &Arc<Chunk>) {
        let Some(next) = &mut self.next else {
            return;
        };
        let h = chunk.header();
        let meta = ChunkMeta {
            owner: h.owner,
            offset: h.offset,
            flags: h.flags,
            digest: h.digest,
        };
        let payload = chunk.payload();
        if payload.len() > next.link.max_chunk().min(next.pool.buffer_size()) {
            let why = format!(
                "its landing slots hold {} bytes, this chain's chunks {} \
                 (its --chunk-size is smaller)",
                next.link.max_chunk(),
                payload.len()
            );
            self.cut(why);
            return;
        }
        let sent = if next.link.seals_payload(h.flags) {
            let mut buf = next.pool.acquire().await;
            buf.fill_from(payload);
            next.link.send_chunk(meta, &next.region, buf).await
        } else {
            let region = match &next.landed {
                Some(r) if Arc::ptr_eq(r.memory(), chunk.memory()) => Ok(r.clone()),
                _ => next.link.register(chunk.memory()),
            };
            match region {
                Ok(region) => {
                    let sent = next
                        .link
                        .send_landed(meta, &region, Arc::clone(chunk))
                        .await;
                    next.landed = Some(region);
                    sent
                }
                Err(e) => Err(e),
            }
        };
        if let Err(e) = sent {
            self.cut(format!("forwarding to it failed: {e}"));
        }
    }

    /// Where this node's own answers go to be merged with the next
    /// node's, and where the merged ones come out (once): none when the
    /// chain does not merge answers or no next node is reached (its own
    /// then go as they are).
    pub fn take_merging(&mut self) -> Option<(Arc<Merging>, MergedAnswers)> {
        let (m, rx) = self.next.as_mut()?.merging.as_mut()?;
        Some((Arc::clone(m), rx.take()?))
    }

    /// Stops forwarding: the next node is out of this chain.
    fn cut(&mut self, why: String) {
        if let Some(next) = self.next.take() {
            next.link.abort("cut out of the chain");
            next.answers.abort();
            if let Some((m, _)) = &next.merging {
                m.gone();
            }
        }
        self.broken.get_or_insert(why);
    }

    /// The copy here is over (this node's own copy succeeded or failed):
    /// waits for the next nodes' results and says goodbye to the next
    /// node. The next node is reported whatever happened to it; the nodes
    /// beyond it only as they reported themselves.
    pub async fn finish(mut self) -> Vec<NodeResult> {
        let mut heard = Heard::default();
        if let Some(next) = self.next.take() {
            heard = next.answers.await.unwrap_or_else(|e| Heard {
                results: Vec::new(),
                lost: Some(e.to_string()),
            });
            if heard.lost.is_none() {
                if let Err(e) = next.link.finish().await {
                    heard.lost = Some(format!("no orderly goodbye: {e}"));
                }
            } else {
                next.link.abort("its answers ended in an error");
            }
        }
        let why = self.broken.take().or(heard.lost);
        if !heard.results.iter().any(|r| r.name == self.hop.name) {
            let reason = why.unwrap_or_else(|| "ended without a result".into());
            heard.results.insert(0, lost_node(&self.hop.name, reason));
        }
        heard.results
    }

    /// Ends the onward hop now: this node's session failed.
    pub fn abort(mut self) {
        self.cut("the node before it failed".into());
    }
}

/// Answers the node before this one how the broadcast ended here and
/// beyond (`hops[0]` is this node): this node's result, then the next
/// nodes' as `relay` heard them.
pub async fn answer(
    link: &Link,
    hops: &[Hop],
    got: &Received,
    started: Instant,
    relay: Option<Relay>,
) -> anyhow::Result<()> {
    let name = &hops
        .first()
        .context("the broadcast's chain does not name this node")?
        .name;
    let mut results = vec![own_result(name, got, started)];
    if let Some(relay) = relay {
        results.extend(relay.finish().await);
    }
    for r in results {
        link.send_message(&Msg::NodeDone(r).encode()).await?;
    }
    Ok(())
}

/// How this node's own part of a broadcast ended.
fn own_result(name: &str, got: &Received, started: Instant) -> NodeResult {
    let failures = || got.failed.iter().filter(|f| f.kind.is_failure());
    let reason = match failures().next() {
        Some(f) => format!("{}: {}", f.path, f.reason),
        None if got.stats.failed => "an entry failed".into(),
        None => String::new(),
    };
    NodeResult {
        name: name.to_string(),
        ok: reason.is_empty(),
        files: got.stats.files,
        bytes: got.stats.bytes,
        micros: started.elapsed().as_micros() as u64,
        failed: failures().count() as u32,
        reason,
    }
}

/// A node that reported nothing of its own, with why.
pub fn lost_node(name: &str, reason: String) -> NodeResult {
    NodeResult {
        name: name.to_string(),
        ok: false,
        files: 0,
        bytes: 0,
        micros: 0,
        failed: 0,
        reason,
    }
}

/// Reads the next node's answers until its goodbye: its results and
/// those of the nodes after it, and with merged answers what it needs of
/// each file (verdicts about single entries are its own business: it
/// reports its failures in its result). However they end, this node's
/// own answers then go alone.
async fn listen(link: Link, merging: Option<Arc<Merging>>) -> Heard {
    let heard = listen_until_goodbye(&link, merging.as_deref()).await;
    if let Some(m) = merging {
        m.gone();
    }
    heard
}

async fn listen_until_goodbye(link: &Link, merging: Option<&Merging>) -> Heard {
    let mut heard = Heard::default();
    let ended = async {
        while let Some(item) = link.recv().await? {
            let Incoming::Message(bytes) = item else {
                bail!("the next node sent data");
            };
            match Msg::decode(&bytes)? {
                Msg::NodeDone(r) => {
                    if heard.results.len() >= crate::hostlist::MAX_HOSTS {
                        bail!("more node results than a chain has nodes");
                    }
                    heard.results.push(r);
                }
                Msg::Fail { reason } => bail!("it gave up: {reason}"),
                m @ (Msg::Have { .. } | Msg::EntriesWanted { .. } | Msg::EntriesSkipped { .. })
                    if merging.is_some() =>
                {
                    merging.expect("merging").next(m)?;
                }
                Msg::EntryOk { .. }
                | Msg::EntriesOk { .. }
                | Msg::EntryFailed { .. }
                | Msg::Itemized { .. }
                | Msg::Removed { .. } => {}
                other => bail!("unexpected {} from the next node", other.name()),
            }
        }
        anyhow::Ok(())
    }
    .await
    .context("lost");
    if let Err(e) = ended {
        heard.lost = Some(format!("{e:#}"));
    }
    heard
}
