//! The sending side of a copy: walk the sources, read each file with the
//! storage engine into registered buffers with read-ahead, hash every chunk on a
//! worker thread, and write it into the receiver's landing slots as soon as
//! a credit is free. Entries of many small files follow one another in the
//! same pipeline: nothing waits for the receiver's answer to a file before
//! sending the next; the answers are collected as they come.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use rfabric::link::{Incoming, Link, LinkError};
use rfabric::memory::{BufferPool, PoolBuf};
use rustix::fs::SeekFrom;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::archive::{self, Keep};
use crate::digest::Algorithm;
use crate::proto::{BatchWriter, Entry, EntryKind, FailKind, Msg, NodeResult};
use crate::report::{Failure, Progress, Stats};
use crate::resync::{Check, Policy};
use crate::tree::{self, Item};
use rfabric::storage::{Engine, Kind};

mod data;
mod remove;
mod waiting;
mod walk;
use data::{ChunkAt, ChunkRead, DataSender, DataStep, StreamsGone, stripe, why_streams_failed};
pub use remove::{Origins, SameName, one_name_each};
use waiting::Waiting;
pub use walk::Walk;

/// A source operand: `name` inside the directory `parent`, arriving as
/// `top` on the other side.
#[derive(Debug)]
pub struct Source {
    pub parent: OwnedFd,
    pub name: Vec<u8>,
    pub top: Vec<u8>,
    /// The operand's path, where its attributes may be read by path (see
    /// [`tree::Walker::by_path`]); `None` in a daemon.
    pub disk: Option<Vec<u8>>,
}

/// What the walk lists.
#[derive(Debug)]
pub enum Sources {
    /// The operands, each under its own name.
    Operands(Vec<Source>),
    /// `--files-from`: names inside one directory (see [`crate::listed`]).
    Listed {
        base: OwnedFd,
        names: Arc<Vec<Vec<u8>>>,
        /// The directory's path, as [`Source::disk`].
        disk: Option<Vec<u8>>,
    },
}

#[derive(Debug, Clone, Copy)]
pub struct SendOptions {
    pub recursive: bool,
    /// Archive metadata to carry (`-o -g -D -X -A -H`).
    pub keep: Keep,
    pub verify: bool,
    /// What chunks and files are hashed with.
    pub digest: Algorithm,
    /// Ask the receiver what it has of each file; send only what differs.
    pub resume: bool,
    /// `--partial`: the receiver may answer a file with the digests of
    /// what an earlier copy kept of it, as with `resume`.
    pub partial: bool,
    /// Which files are sent again (the receiver decides by it).
    pub policy: Policy,
    /// `-n`: the receiver answers every file, and sends for none.
    pub dry_run: bool,
    /// `--remove-source-files` (see [`remove`]).
    pub remove_sources: bool,
    /// `--bwlimit`, bytes a second (see [`crate::pace`]).
    pub bwlimit: Option<u64>,
    pub chunk: usize,
    /// Buffers read ahead.
    pub buffers: usize,
    /// The storage engine that reads the files.
    pub engine: Kind,
    /// How the changes a receiver names (`Itemized`) are shown here.
    pub lines: crate::recv::Lines,
}

/// Steps queued for the sending loop. What it finds queued goes out in
/// one message, so this bounds the entries per message; the memory of
/// chunks read ahead is bounded by the buffer pool, not by this.
const STEPS_QUEUED: usize = 256;

/// What the sending loop does next, in the order of the wire's message
/// stream. With re-sync it sends only messages: the data of the files
/// the receiver asked for goes from a loop of its own
/// ([`data`](self::data)).
enum Step {
    Msg(Msg),
    /// Messages in a row (the entries of a walked batch).
    Msgs(Vec<Msg>),
    /// A file of one chunk, announced with its end (`Whole`) once the
    /// chunk is read and hashed, then the chunk.
    Whole {
        entry: Entry,
        at: ChunkAt,
        read: ChunkRead,
    },
    /// The data of a file sent unasked, behind its entry.
    Data(DataStep),
    /// The feeder could not send a wanted file's data (the receiver waits
    /// for it): the copy stops with this error.
    Failed(anyhow::Error),
    /// The receiver's answers ended in an error (it gave up, the link
    /// failed): the copy stops with it, at once.
    ReceiverStopped,
}

/// The receiver's answer to a file announced ahead of its data.
#[derive(Debug)]
enum Wanted {
    /// Every chunk.
    All,
    /// The chunks that differ from these (chunk `k`'s digest at `k`).
    Except(Vec<[u8; 32]>),
    /// Nothing: it is there already, or it failed there.
    Nothing,
}

/// Files announced whose answer the sender may wait for at once, at most:
/// their open files and the receiver's temporary files are bounded by it,
/// so the window is an eighth of the soft limit on open files (raised to
/// the hard one at start, [`crate::tuning::raise_open_file_limit`]), at
/// least [`ASK_AHEAD_LEAST`]. In a tree of one file a directory each
/// file holds two descriptors on either side (its directory too), the
/// receiver has a window of files arriving and one being finished, and
/// a local copy is both sides in one process: under a quarter, a local
/// copy of 3,000 such directories ran out at a limit of 1,024 (300
/// source directories, 300 destination directories, 300 temporary
/// files open).
/// Each answer is a round trip through the receiver, so the window is what
/// keeps a re-sync of small files from waiting on it: on a 100,000-entry
/// unchanged local re-sync, 1024 took 0.91x the time of 256 (median of 7
/// paired runs; 256 took 0.96x the time of 64).
pub const ASK_AHEAD: usize = 2048;
/// The window under a soft limit too low for anything more.
pub const ASK_AHEAD_LEAST: usize = 32;

/// The window of files announced ahead of their answers (see
/// [`ASK_AHEAD`]), for this process's limit on open files.
pub fn ask_ahead() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .map_or(ASK_AHEAD as u64, |n| n / 8);
    (soft as usize).clamp(ASK_AHEAD_LEAST, ASK_AHEAD)
}

/// What the receiver said about each entry.
#[derive(Debug, Default)]
pub struct Outcome {
    pub failed: Vec<Failure>,
    /// `--remove-source-files`: sources that could not be removed, after
    /// the receiver was done (only this side knows of them).
    pub not_removed: Vec<Failure>,
    /// File digests (verified copies), by entry path.
    pub digests: Vec<(String, [u8; 32])>,
    /// A broadcast's: how each node's copy ended, as the chain told it.
    pub nodes: Vec<NodeResult>,
}

/// Sends `sources` over the session's `links` (the first carries the
/// messages, all carry data) and waits for the receiver's verdict on every
/// entry.
pub async fn send(
    links: &[Link],
    walk: Walk,
    opts: SendOptions,
    progress: &Progress,
) -> anyhow::Result<(Stats, Outcome)> {
    let link = &links[0];
    let chunk = links
        .iter()
        .map(Link::max_chunk)
        .fold(opts.chunk, usize::min);
    if chunk == 0 {
        bail!("the receiver offers no landing ring");
    }
    let pool = BufferPool::new(opts.buffers, chunk)?;
    let engine = Engine::start(opts.engine, Some(&pool))
        .with_context(|| format!("cannot start the {} storage engine", opts.engine))?;
    let (data, stripers) = stripe(links, &pool)?;

    // The walk goes on as far ahead as the session allows.
    walk.settle();
    let Walk {
        items: mut walked,
        thread: walker,
        with_data,
        origins,
    } = walk;
    // `--remove-source-files`: what went, and where it came from.
    let removals = origins
        .filter(|_| opts.remove_sources)
        .map(|o| (Arc::new(remove::Removals::new(opts.policy)), o));
    let window = ask_ahead();

    // Plan steps in order, starting reads as buffers allow.
    let (steps_tx, mut steps) = mpsc::channel::<Step>(STEPS_QUEUED);
    let asks = opts.policy.answered(opts.resume, opts.dry_run);
    // (One bucket for both data loops: the limit is the copy's.)
    let pace = opts
        .bwlimit
        .map(|rate| Arc::new(std::sync::Mutex::new(crate::pace::Pace::new(rate))));
    let data_sender = || {
        DataSender::new(
            opts,
            link.clone(),
            data.clone(),
            progress.clone(),
            pace.clone(),
        )
    };
    // Where the files' data goes: behind their entries in the sending
    // loop when they are sent unasked; when the receiver answers each
    // first, a loop of its own (`send/data.rs`), so that entries never
    // wait behind data. That loop's failure reaches the sending loop
    // ahead of any step, and the sending loop ends after it (it holds
    // the loop's steps until it ends).
    let (data_queue, asked_data, mut asked_failed) = if asks {
        let (queue, mut asked) = mpsc::channel::<DataStep>(STEPS_QUEUED);
        let (failed, asked_failed) = mpsc::channel::<anyhow::Error>(1);
        let mut sender = data_sender();
        let hold = steps_tx.clone();
        let task = tokio::spawn(async move {
            let _hold = hold;
            while let Some(step) = asked.recv().await {
                if let Err(e) = sender.take(step).await {
                    let _ = failed.send(e).await;
                    break;
                }
            }
            sender.finish()
        });
        (DataQueue::Apart(queue), Some(task), Some(asked_failed))
    } else {
        (DataQueue::Inline(steps_tx.clone()), None, None)
    };
    // An xattr piece and its message's other fields fit one message.
    let xattr_piece = link.max_message().saturating_sub(300);
    let planner = Planner {
        chunk,
        xattr_piece,
        opts,
        pool: Arc::clone(&pool),
        engine: engine.clone(),
        steps: steps_tx,
        data: data_queue,
        with_data: Arc::clone(&with_data),
        skipped: Arc::default(),
        progress: progress.clone(),
    };
    let skipped = Arc::clone(&planner.skipped);
    let digests = opts.resume || opts.partial || opts.policy.check == Check::Checksum;
    let asking = Asking::new(Waiting::new(digests));
    let steps_for_answers = planner.steps.downgrade();
    let lines = opts.lines;
    // Files announced ahead of their data, waiting for their answers.
    let (ahead_tx, mut ahead) = mpsc::channel::<FileToSend>(window);
    let feeder = {
        let planner = planner.clone();
        let asking = asking.clone();
        tokio::spawn(async move {
            while let Some(file) = ahead.recv().await {
                let wanted = asking.answer_to(file.index).await;
                if let Err(e) = planner.data(file, wanted).await {
                    // (Told through the sending loop's steps, behind the
                    // entries queued: it ends on it, and nothing else would
                    // wake it.)
                    let _ = planner.steps.send(Step::Failed(e)).await;
                    break;
                }
            }
            anyhow::Ok(())
        })
    };
    let planner = {
        let asking = asking.clone();
        tokio::spawn(async move {
            while let Some(mut batch) = walked.next().await {
                if !asks {
                    for item in batch {
                        planner.plan(item?).await?;
                    }
                    continue;
                }
                // A batch's entries go as one step, its files to the
                // feeder after them, in parts of at most a window (the
                // most room there is to reserve: asked for more,
                // `reserve_many` fails as if the feeder had stopped).
                while !batch.is_empty() {
                    let rest = batch.split_off(batch.len().min(window));
                    let part = std::mem::replace(&mut batch, rest);
                    let files = part
                        .iter()
                        .filter(|i| i.as_ref().is_ok_and(|i| i.file.is_some()))
                        .count();
                    // Room for its files first: the window bounds the files
                    // announced and not yet answered.
                    let Ok(mut room) = ahead_tx.reserve_many(files).await else {
                        // The feeder stopped, saying why in the steps.
                        return Ok(());
                    };
                    let mut messages = Vec::with_capacity(part.len());
                    let mut announced = Vec::with_capacity(files);
                    let mut failed = None;
                    for item in part {
                        let item = match item {
                            Ok(item) => item,
                            Err(e) => {
                                failed = Some(e);
                                break;
                            }
                        };
                        // Waited for before the entry goes: the answer may
                        // come right after.
                        if item.file.is_some() {
                            asking.ask(item.entry.index);
                        }
                        announced.extend(planner.announce(item, &mut messages));
                    }
                    if !messages.is_empty() {
                        let _ = planner.steps.send(Step::Msgs(messages)).await;
                    }
                    for (file, permit) in announced.into_iter().zip(&mut room) {
                        permit.send(file);
                    }
                    if let Some(e) = failed {
                        return Err(e);
                    }
                }
            }
            anyhow::Ok(())
        })
    };

    // Left running after an error, the asked files' data loop would go on
    // writing on the link after the session said the copy failed.
    let _stop_on_error = AbortOnDrop(
        [planner.abort_handle(), feeder.abort_handle()]
            .into_iter()
            .chain(asked_data.as_ref().map(JoinHandle::abort_handle))
            .collect(),
    );
    let mut ledger = Ledger {
        verify: opts.verify,
        progress: progress.clone(),
        removals: removals.as_ref().map(|(r, _)| Arc::clone(r)),
        ..Ledger::default()
    };
    // Answers from the receiver, concurrently.
    let mut answers = {
        let link = link.clone();
        let asking = asking.clone();
        let names = Arc::clone(&ledger.names);
        let removals = ledger.removals.clone();
        // (Weak: the sending loop ends when the planner's steps end.)
        let steps = steps_for_answers;
        tokio::spawn(async move {
            let r = collect_answers(&link, &asking, &names, removals.as_deref(), lines).await;
            // No answer comes any more: nothing waits for one.
            asking.close();
            if let (Err(_), Some(steps)) = (&r, steps.upgrade()) {
                // The sending loop stops on it rather than sending on.
                let _ = steps.send(Step::ReceiverStopped).await;
            }
            r
        })
    };

    // The data of files sent unasked, each behind its entry.
    let mut inline = data_sender();
    // A step taken from the queue that did not go into a batch.
    let mut next: Option<Step> = None;
    // Messages that go out as one (`Batch`), up to the link's message
    // size.
    let mut batch = BatchWriter::new(link.max_message());
    let sent: anyhow::Result<()> = async {
        loop {
            let step = match next.take() {
                Some(step) => step,
                None => tokio::select! {
                    biased;
                    Some(e) = failed(&mut asked_failed) => return Err(e),
                    step = steps.recv() => match step {
                        Some(step) => step,
                        None => break,
                    },
                },
            };
            match step {
                step @ (Step::Msg(_) | Step::Msgs(_)) => {
                    // The messages queued behind it go in the same one.
                    let mut step = Some(step);
                    while let Some(s) = step.take() {
                        match s {
                            Step::Msg(m) => put(&mut batch, &mut ledger, link, m).await?,
                            Step::Msgs(ms) => {
                                for m in ms {
                                    put(&mut batch, &mut ledger, link, m).await?;
                                }
                            }
                            other => {
                                next = Some(other);
                                break;
                            }
                        }
                        step = steps.try_recv().ok();
                    }
                    if !batch.is_empty() {
                        link.send_message(batch.bytes()).await?;
                        batch.clear();
                    }
                }
                Step::Failed(e) => return Err(e),
                Step::ReceiverStopped => {
                    return match (&mut answers).await? {
                        Err(e) => Err(e),
                        Ok(_) => Err(anyhow::anyhow!("the receiver stopped answering")),
                    };
                }
                Step::Whole { entry, at, read } => {
                    let (buf, digest) = match read.await? {
                        Ok(read) => read,
                        // Announced, and abandoned at once.
                        Err(why) => {
                            let index = entry.index;
                            put(&mut batch, &mut ledger, link, Msg::Entry(entry)).await?;
                            link.send_message(batch.bytes()).await?;
                            batch.clear();
                            inline.take(DataStep::Abandon { index, why }).await?;
                            continue;
                        }
                    };
                    let file = if opts.verify {
                        // The one data chunk is chunk `k`: a sparse file's
                        // may be any (the others are holes).
                        let mut chunks = vec![None; at.k as usize];
                        chunks.push(Some(digest));
                        opts.digest.file_digest(entry.size, entry.chunk, &chunks)
                    } else {
                        [0; 32]
                    };
                    let m = Msg::Whole {
                        entry,
                        chunks: 1,
                        digest: file,
                    };
                    // (Noted before it goes: its answer may come at once.)
                    let bytes = m.encode();
                    ledger.note(m);
                    link.send_message(&bytes).await?;
                    inline.hand(at, buf, digest).await?;
                }
                Step::Data(step) => inline.take(step).await?,
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = sent {
        return Err(why_stopped(e, stripers).await);
    }
    planner.await??;
    feeder.await??;
    walker.await?;
    // (Ended already: the sending loop ended after it.)
    let asked = match asked_data {
        Some(task) => Some(task.await?),
        None => None,
    };
    for sent in std::iter::once(inline.finish()).chain(asked) {
        ledger.stats.bytes += sent.bytes;
        ledger.stats.skipped += sent.skipped;
        for (path, digest) in sent.digests {
            ledger.file_digest(&path, digest);
        }
    }
    ledger.stats.skipped += skipped.load(Ordering::Relaxed);
    let done = Msg::Done {
        entries: ledger.entries,
    };
    link.send_message(&done.encode()).await?;
    drop(data);
    let Ledger {
        mut stats,
        mut outcome,
        ..
    } = ledger;
    for s in stripers {
        stats.stream_bytes.push(s.await??);
    }
    let (failed, removed, nodes) = answers.await??;
    stats.deleted = removed.len() as u64;
    outcome.failed.extend(failed);
    outcome.nodes = nodes;
    // The receiver's last answer came once every file was in place and
    // its directory synced: what it has may go from here.
    if let Some((removals, origins)) = removals {
        let dry_run = opts.dry_run;
        outcome.not_removed =
            tokio::task::spawn_blocking(move || remove::remove(&removals, &origins, dry_run))
                .await?;
        stats.failed |= !outcome.not_removed.is_empty();
    }
    Ok((stats, outcome))
}

/// Adds `m` to `batch`, sending what the batch holds first where `m`
/// does not fit beside it, and notes it in `ledger`.
async fn put(
    batch: &mut BatchWriter,
    ledger: &mut Ledger,
    link: &Link,
    m: Msg,
) -> anyhow::Result<()> {
    if !batch.push(&m) {
        link.send_message(batch.bytes()).await?;
        batch.clear();
        batch.push(&m);
    }
    // (Noted before it goes: its answer may come at once.)
    ledger.note(m);
    Ok(())
}

/// The names of the entries announced and not yet answered (the
/// receiver's verdicts come by index), and whether each is a directory
/// (whose name stays: its metadata, set last, may still fail). Answered
/// names go, so that a tree of a million files holds only those in flight.
type Names = Arc<std::sync::Mutex<HashMap<u32, (Vec<u8>, bool), OwnIndices>>>;

/// Hashes this side's own entry indices (a multiply, where the default
/// hasher costs a SipHash a lookup). Only for maps whose keys this side
/// chose: a peer can look an index up, never make two collide.
type OwnIndices = std::hash::BuildHasherDefault<IndexHasher>;

#[derive(Default)]
struct IndexHasher(u64);

impl std::hash::Hasher for IndexHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// What the sender keeps of the entries it announced: their count, their
/// names until answered, the totals, and the digests of verified files
/// (the first two: a summary shows the digest only of a copy of one file).
#[derive(Default)]
struct Ledger {
    verify: bool,
    /// Counts the files announced.
    progress: Progress,
    entries: u32,
    names: Names,
    stats: Stats,
    outcome: Outcome,
    /// `--remove-source-files`: each entry announced is noted.
    removals: Option<Arc<remove::Removals>>,
}

impl Ledger {
    /// A message about to go (its entry's name is kept).
    fn note(&mut self, m: Msg) {
        match m {
            Msg::Whole { entry, digest, .. } => self.whole_file(entry, digest),
            Msg::Entry(e) => self.announce(e),
            // (No entry, so no answer: it fails here.)
            Msg::Unsent { path, kind, reason } => self.outcome.failed.push(Failure {
                path: tree::show(&path),
                kind,
                reason,
            }),
            _ => {}
        }
    }

    fn announce(&mut self, e: Entry) {
        if let Some(r) = &self.removals {
            r.announced(&e);
        }
        self.entries += 1;
        if e.kind == EntryKind::File {
            self.stats.files += 1;
            self.progress.file();
        }
        let is_dir = e.kind == EntryKind::Dir;
        let mut names = self.names.lock().expect("names lock");
        names.insert(e.index, (e.path, is_dir));
    }

    /// A file announced together with its end (`Whole`).
    fn whole_file(&mut self, e: Entry, digest: [u8; 32]) {
        self.file_digest(&e.path, digest);
        self.announce(e);
    }

    fn file_digest(&mut self, path: &[u8], digest: [u8; 32]) {
        if self.verify && self.outcome.digests.len() < 2 {
            self.outcome.digests.push((tree::show(path), digest));
        }
    }
}

/// Stops the tasks it holds when dropped (ended ones are not touched).
struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The asked files' data loop's failure, once it fails (never, while
/// it runs well or where there is none).
async fn failed(asked: &mut Option<mpsc::Receiver<anyhow::Error>>) -> Option<anyhow::Error> {
    match asked {
        Some(failed) => failed.recv().await,
        None => std::future::pending().await,
    }
}

/// Why the sending loop stopped: what the stripers say where the error
/// came from them, or where they have stopped (a striper that fails
/// aborts every link, so the loop's own send may fail first, with less
/// to say than a striper that found tampering).
async fn why_stopped(
    e: anyhow::Error,
    stripers: Vec<JoinHandle<anyhow::Result<u64>>>,
) -> anyhow::Error {
    let streams = e.is::<StreamsGone>()
        || e.is::<LinkError>() && stripers.iter().any(JoinHandle::is_finished);
    if streams {
        why_streams_failed(stripers).await
    } else {
        e
    }
}

/// What plans the steps of walked items.
#[derive(Clone)]
struct Planner {
    chunk: usize,
    /// An xattr piece and its message's other fields fit one message.
    xattr_piece: usize,
    opts: SendOptions,
    pool: Arc<BufferPool>,
    engine: Engine,
    steps: mpsc::Sender<Step>,
    /// Where the data of the files it plans goes.
    data: DataQueue,
    /// Files whose data is read (see [`walk::BatchSize`]).
    with_data: Arc<AtomicU64>,
    /// Files the receiver has already: none of their data is sent.
    skipped: Arc<AtomicU64>,
    progress: Progress,
}

/// An item's entry, added to `out`; for a directory whose contents are
/// not listed (`-x`, or it could not be listed) the `Unlisted` that
/// follows it; for one the walk could not read, the `Abandoned` that says
/// why.
fn entry_messages(item: Item, out: &mut Vec<Msg>) {
    if item.unsent {
        let (kind, reason) = item.failed.unwrap_or((FailKind::Io, String::new()));
        out.push(Msg::Unsent {
            path: item.entry.path,
            kind,
            reason,
        });
        return;
    }
    let index = item.entry.index;
    out.push(Msg::Entry(item.entry));
    if item.unlisted {
        out.push(Msg::Unlisted { index });
    }
    if let Some((kind, reason)) = item.failed {
        out.push(Msg::Abandoned {
            index,
            chunks: 0,
            kind,
            reason,
        });
    }
}

/// Where a planner's data steps go.
#[derive(Clone)]
enum DataQueue {
    /// The sending loop's own steps: files sent unasked, their data
    /// behind their entry.
    Inline(mpsc::Sender<Step>),
    /// The loop of the files the receiver asked for.
    Apart(mpsc::Sender<DataStep>),
}

impl DataQueue {
    /// Queues `step`; false when its loop has stopped.
    async fn send(&self, step: DataStep) -> bool {
        match self {
            DataQueue::Inline(steps) => steps.send(Step::Data(step)).await.is_ok(),
            DataQueue::Apart(steps) => steps.send(step).await.is_ok(),
        }
    }
}

/// A file announced, its data still to be planned.
struct FileToSend {
    index: u32,
    size: u64,
    path: Vec<u8>,
    file: tree::FileAt,
    dense: bool,
}

/// A file whose data is being read.
struct OpenFile {
    index: u32,
    size: u64,
    path: Vec<u8>,
    fd: OwnedFd,
}

impl Planner {
    /// Steps for one walked item, sent unasked: its extended attributes,
    /// its entry, reads of its data chunks (holes are skipped: sparse files
    /// stay sparse), its end. A file of at most one chunk goes as one
    /// message (`Whole`) and its chunk.
    async fn plan(&self, mut item: Item) -> anyhow::Result<()> {
        self.send_xattrs(&item).await;
        let Some(at) = item.file.take() else {
            let mut messages = Vec::with_capacity(1);
            entry_messages(item, &mut messages);
            let _ = self.steps.send(Step::Msgs(messages)).await;
            return Ok(());
        };
        let mut entry = item.entry;
        entry.chunk = self.chunk as u32;
        let chunk = self.chunk as u64;
        let (fd, chunks) = match open_with_chunks(at, entry.size, chunk, item.dense) {
            Ok(both) => both,
            // Announced, and abandoned at once: the copy goes on without it.
            Err(why) => {
                let index = entry.index;
                let _ = self.steps.send(Step::Msg(Msg::Entry(entry))).await;
                let _ = self.data.send(DataStep::Abandon { index, why }).await;
                return Ok(());
            }
        };
        let file = OpenFile {
            index: entry.index,
            size: entry.size,
            path: entry.path.clone(),
            fd,
        };
        match chunks.len() {
            0 => {
                let digest = if self.opts.verify {
                    self.opts.digest.file_digest(entry.size, entry.chunk, &[])
                } else {
                    [0; 32]
                };
                let m = Msg::Whole {
                    entry,
                    chunks: 0,
                    digest,
                };
                let _ = self.steps.send(Step::Msg(m)).await;
                Ok(())
            }
            1 => {
                self.with_data.fetch_add(1, Ordering::Relaxed);
                let k = chunks[0];
                let fd = Arc::new(file.fd);
                let read = self.read(&fd, entry.size, k, self.hashes(false)).await;
                let at = ChunkAt {
                    index: entry.index,
                    k,
                    offset: k * chunk,
                    there: None,
                };
                let _ = self.steps.send(Step::Whole { entry, at, read }).await;
                Ok(())
            }
            _ => {
                let _ = self.steps.send(Step::Msg(Msg::Entry(entry))).await;
                self.reads(file, chunks, None).await
            }
        }
    }

    /// An item's extended attributes and entry, to be answered by the
    /// receiver before any data, added to `messages`: the file, if it is
    /// one.
    fn announce(&self, mut item: Item, messages: &mut Vec<Msg>) -> Option<FileToSend> {
        let index = item.entry.index;
        messages.extend(archive::xattr_messages(
            index,
            &item.xattrs,
            self.xattr_piece,
        ));
        if item.file.is_some() {
            item.entry.chunk = self.chunk as u32;
        }
        let file = item.file.take().map(|file| FileToSend {
            index,
            size: item.entry.size,
            path: item.entry.path.clone(),
            file,
            dense: item.dense,
        });
        entry_messages(item, messages);
        file
    }

    /// Extended attributes go ahead of their entry.
    async fn send_xattrs(&self, item: &Item) {
        let index = item.entry.index;
        for m in archive::xattr_messages(index, &item.xattrs, self.xattr_piece) {
            let _ = self.steps.send(Step::Msg(m)).await;
        }
    }

    /// The data of an announced file, as the receiver wants it.
    async fn data(&self, file: FileToSend, wanted: Wanted) -> anyhow::Result<()> {
        let chunk = self.chunk as u64;
        let there = match wanted {
            Wanted::Nothing => {
                // (Only counted, not a step: an unchanged tree's answers
                // would otherwise come between its entries.)
                self.skipped.fetch_add(1, Ordering::Relaxed);
                self.progress.there_already(1);
                return Ok(());
            }
            Wanted::All => None,
            Wanted::Except(digests) => Some(digests),
        };
        let FileToSend {
            index,
            size,
            path,
            file,
            dense,
        } = file;
        // Comparing means every chunk (a hole here may be data there).
        let (fd, chunks) = match open_with_chunks(file, size, chunk, there.is_some() || dense) {
            Ok(both) => both,
            // The copy goes on without it.
            Err(why) => {
                let _ = self.data.send(DataStep::Abandon { index, why }).await;
                return Ok(());
            }
        };
        let file = OpenFile {
            index,
            size,
            path,
            fd,
        };
        self.reads(file, chunks, there).await
    }

    /// Whether chunks are hashed: for verifying, or comparing with the
    /// receiver's.
    fn hashes(&self, compared: bool) -> bool {
        self.opts.verify || self.opts.resume || compared
    }

    /// Reads (and hashes) `chunks` of `file`, then its end. `there`: the
    /// receiver's digests of the chunks it has.
    async fn reads(
        &self,
        file: OpenFile,
        chunks: Vec<u64>,
        there: Option<Vec<[u8; 32]>>,
    ) -> anyhow::Result<()> {
        let OpenFile {
            index,
            size,
            path,
            fd,
        } = file;
        self.with_data.fetch_add(1, Ordering::Relaxed);
        let compared = there.is_some();
        let hash = self.hashes(compared);
        let file = Arc::new(fd);
        let chunk = self.chunk as u64;
        for k in chunks {
            let read = self.read(&file, size, k, hash).await;
            let at = ChunkAt {
                index,
                k,
                offset: k * chunk,
                there: there.as_ref().and_then(|d| d.get(k as usize).copied()),
            };
            if !self.data.send(DataStep::Chunk { at, read }).await {
                return Ok(());
            }
        }
        let end = DataStep::End {
            index,
            size,
            chunk: self.chunk as u32,
            path,
            compared,
        };
        let _ = self.data.send(end).await;
        Ok(())
    }

    /// Starts reading (and hashing, if `hash`) chunk `k` of `file`, once
    /// a buffer is free.
    async fn read(&self, file: &Arc<OwnedFd>, size: u64, k: u64, hash: bool) -> ChunkRead {
        let chunk = self.chunk as u64;
        let offset = k * chunk;
        let len = (size - offset).min(chunk) as usize;
        let buf = self.pool.acquire().await;
        let (file, engine) = (Arc::clone(file), self.engine.clone());
        let alg = self.opts.digest;
        let fails = read_fails_here();
        tokio::spawn(async move {
            let buf = if fails {
                Err(std::io::Error::from_raw_os_error(libc::EIO).into())
            } else {
                read_full(&engine, &file, offset, len, buf).await
            }
            .with_context(|| format!("cannot read it at offset {offset}"))?;
            let digest = if hash && buf.len() <= crate::tuning::hash_in_place() {
                let d = alg.chunk(buf.data());
                (buf, d)
            } else if hash {
                tokio::task::spawn_blocking(move || {
                    let d = alg.chunk(buf.data());
                    (buf, d)
                })
                .await?
            } else {
                (buf, [0; 32])
            };
            Ok(digest)
        })
    }
}

/// Fault injection for the integration tests: `RCP_TEST_FAIL_READ=N`
/// makes the Nth chunk read of this process (from 0) fail with `EIO`, as
/// a bad sector would, so that the file is abandoned part way. Only in
/// builds with the `test-hooks` feature: a shipping binary reads no such
/// variable.
#[cfg(feature = "test-hooks")]
fn read_fails_here() -> bool {
    use std::sync::atomic::AtomicU64;
    static READS: AtomicU64 = AtomicU64::new(0);
    static FAIL_AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let fail_at = *FAIL_AT.get_or_init(|| {
        std::env::var("RCP_TEST_FAIL_READ")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    fail_at.is_some_and(|n| READS.fetch_add(1, Ordering::Relaxed) == n)
}

#[cfg(not(feature = "test-hooks"))]
fn read_fails_here() -> bool {
    false
}

/// Reads exactly `len` bytes at `offset` (a file that shrank meanwhile is
/// an error, not a short copy).
async fn read_full(
    engine: &Engine,
    file: &Arc<OwnedFd>,
    offset: u64,
    len: usize,
    mut buf: PoolBuf,
) -> anyhow::Result<PoolBuf> {
    let mut got = 0usize;
    while got < len {
        let (b, r) = engine
            .read(file, offset + got as u64, buf, got, len - got)
            .await;
        buf = b;
        match r? {
            0 => bail!("the file shrank while it was being copied"),
            n => got += n,
        }
    }
    buf.set_len(len);
    Ok(buf)
}

/// `file` opened, and the indices of its chunks to read: every one with
/// `every`, else those holding data ([`data_chunks`]).
fn open_with_chunks(
    file: tree::FileAt,
    size: u64,
    chunk: u64,
    every: bool,
) -> anyhow::Result<(OwnedFd, Vec<u64>)> {
    let fd = file.open()?;
    let chunks = if every {
        (0..size.div_ceil(chunk)).collect()
    } else {
        data_chunks(&fd, size, chunk)?
    };
    Ok((fd, chunks))
}

/// Indices of the chunks of `[0, size)` that hold data (SEEK_DATA/SEEK_HOLE);
/// every chunk when the filesystem cannot tell.
fn data_chunks(file: &OwnedFd, size: u64, chunk: u64) -> anyhow::Result<Vec<u64>> {
    let count = size.div_ceil(chunk);
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let start = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break,
            Err(_) => return Ok((0..count).collect()),
        };
        let end = match rustix::fs::seek(file, SeekFrom::Hole(start)) {
            Ok(e) => e.min(size),
            Err(_) => size,
        };
        let first = start / chunk;
        let last = end.saturating_sub(1) / chunk;
        for k in first..=last {
            if out.last() != Some(&k) {
                out.push(k);
            }
        }
        pos = end.max(start + 1);
    }
    Ok(out)
}

/// The files announced ahead of their data ([`Waiting`]), shared by the
/// planner (which asks), the task collecting answers and the feeder
/// (which waits for each file's answer in turn).
#[derive(Clone)]
struct Asking {
    waiting: Arc<std::sync::Mutex<Waiting>>,
    /// Answers came (or none will): the feeder looks again.
    answered: Arc<tokio::sync::Notify>,
}

impl Asking {
    fn new(waiting: Waiting) -> Asking {
        Asking {
            waiting: Arc::new(std::sync::Mutex::new(waiting)),
            answered: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().expect("asking lock")
    }

    fn ask(&self, index: u32) {
        self.lock().ask(index);
    }

    /// The answer to file `index`, the first still waiting.
    async fn answer_to(&self, index: u32) -> Wanted {
        loop {
            if let Some(wanted) = self.lock().take(index) {
                return wanted;
            }
            // (A wake-up between the look and this wait is kept.)
            self.answered.notified().await;
        }
    }

    /// Answers were given: wakes the feeder.
    fn given(&self) {
        self.answered.notify_one();
    }

    fn close(&self) {
        self.lock().close();
        self.given();
    }
}

/// What the receiver said: the entries that failed, what it removed
/// from the destination (`--delete`), and a broadcast's node results.
type Said = (Vec<Failure>, Vec<Vec<u8>>, Vec<NodeResult>);

/// Reads the receiver's answers until it says goodbye; every entry gets
/// one. An entry answered in place is forgotten.
async fn collect_answers(
    link: &Link,
    asking: &Asking,
    names: &Names,
    removals: Option<&remove::Removals>,
    lines: crate::recv::Lines,
) -> anyhow::Result<Said> {
    let mut failed = Vec::new();
    let mut removed = Vec::new();
    let mut nodes = Vec::new();
    // (One lock a message: a message answers up to 2,048 entries.)
    let done = |indices: &[u32]| {
        let mut names = names.lock().expect("names lock");
        for &index in indices {
            if let std::collections::hash_map::Entry::Occupied(name) = names.entry(index)
                && !name.get().1
            {
                name.remove();
            }
        }
    };
    while let Some(item) = link.recv().await? {
        let Incoming::Message(bytes) = item else {
            bail!("the receiver sent data during a push");
        };
        match Msg::decode(&bytes)? {
            Msg::Have {
                index,
                first,
                digests,
            } => {
                asking.lock().on_have(index, first, digests)?;
                asking.given();
            }
            Msg::EntriesWanted { indices } => {
                let mut a = asking.lock();
                for index in indices {
                    if a.answer(index, Wanted::All).is_err() {
                        bail!("the receiver wants entry {index}, which is not waiting");
                    }
                }
                drop(a);
                asking.given();
            }
            Msg::EntriesSkipped { indices } => {
                let mut a = asking.lock();
                for &index in &indices {
                    if a.answer(index, Wanted::Nothing).is_err() {
                        bail!("the receiver skipped entry {index}, which is not waiting");
                    }
                }
                drop(a);
                asking.given();
                done(&indices);
                if let Some(r) = removals {
                    r.skipped(&indices);
                }
            }
            Msg::Removed { path } => removed.push(path),
            Msg::NodeDone(r) if nodes.len() < crate::hostlist::MAX_HOSTS => nodes.push(r),
            // `-i` from a receiver that is not the client: printed here.
            Msg::Itemized { code, path } => {
                crate::recv::print_itemized(&code, &path, lines);
            }
            Msg::EntryOk { index } => {
                done(&[index]);
                if let Some(r) = removals {
                    r.in_place(&[index]);
                }
            }
            Msg::EntriesOk { indices } => {
                done(&indices);
                if let Some(r) = removals {
                    r.in_place(&indices);
                }
            }
            Msg::EntryFailed {
                index,
                kind,
                reason,
            } => {
                if let Some(r) = removals {
                    r.failed(index);
                }
                // A file that failed before its data: none is sent.
                let _ = asking.lock().answer(index, Wanted::Nothing);
                asking.given();
                let names = names.lock().expect("names lock");
                let path = names
                    .get(&index)
                    .map(|(p, _)| tree::show(p))
                    .unwrap_or_default();
                failed.push(Failure { path, kind, reason });
            }
            Msg::Fail { reason } => bail!("the receiver gave up: {reason}"),
            other => bail!("unexpected {} from the receiver", other.name()),
        }
    }
    Ok((failed, removed, nodes))
}
