//! Files' data on its way out: each chunk's read awaited in turn, handed
//! to the stripers (one task a link) unless the receiver has it already,
//! and each file's end with its digest.
//!
//! Where files are sent unasked (a copy into nothing), the sending loop
//! runs one of these between its messages: a file's data follows its
//! entry. Where the receiver answers each file first (a re-sync), one
//! runs in a loop of its own for the files asked for: a file's chunks and
//! end may come in any order after its entry, so entries need not wait
//! behind earlier files' reads and hand-offs to the stripers (over ssh
//! those waits were 7-30 ms and 30-49 ms a copy of 949 changed files,
//! the entries queued behind them and with them the receiver's checks).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rfabric::link::{ChunkMeta, Link, LinkError};
use rfabric::memory::{BufferPool, PoolBuf};
use rfabric::wire::chunk_flags;
use tokio::task::JoinHandle;

use super::SendOptions;
use crate::exit::PeerLost;
use crate::pace::Pace;
use crate::proto::{FailKind, Msg};
use crate::report::Progress;

/// A chunk's read (and hash) under way.
pub(super) type ChunkRead = JoinHandle<anyhow::Result<(PoolBuf, [u8; 32])>>;

/// Where a chunk belongs.
pub(super) struct ChunkAt {
    pub index: u32,
    pub k: u64,
    pub offset: u64,
    /// The receiver has a chunk with this digest there: an equal one is
    /// not sent.
    pub there: Option<[u8; 32]>,
}

/// What a data loop does next, in a file's order: its chunks, then its
/// end.
pub(super) enum DataStep {
    Chunk {
        at: ChunkAt,
        read: ChunkRead,
    },
    End {
        index: u32,
        size: u64,
        chunk: u32,
        path: Vec<u8>,
        /// Its chunks were compared with the receiver's: none sent means
        /// it was there already.
        compared: bool,
    },
    /// The file could not be opened or read (`why`): it is abandoned, with
    /// the chunks sent of it so far.
    Abandon {
        index: u32,
        why: anyhow::Error,
    },
}

/// A data loop's error where no stream takes data any more: the
/// stripers say why ([`why_streams_failed`]).
#[derive(Debug)]
pub(super) struct StreamsGone;

impl std::fmt::Display for StreamsGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("every data stream has stopped")
    }
}

impl std::error::Error for StreamsGone {}

/// What a data loop sent, added to the session's totals at the end.
#[derive(Debug, Default)]
pub(super) struct Sent {
    pub bytes: u64,
    /// Files compared chunk by chunk of which no chunk was sent.
    pub skipped: u64,
    /// The first two files' paths and digests (verified copies; a
    /// summary shows the digest only of a copy of one file).
    pub digests: Vec<(Vec<u8>, [u8; 32])>,
}

/// One data loop's state: the file whose chunks come now and their
/// digests.
pub(super) struct DataSender {
    opts: SendOptions,
    link: Link,
    stripers: async_channel::Sender<Outgoing>,
    /// `--bwlimit`: the copy's bucket, shared by its data loops.
    pace: Option<Arc<Mutex<Pace>>>,
    /// Chunks hashed so far (for [`tamper_hook`]).
    chunks_sent: u64,
    tamper: Option<u64>,
    progress: Progress,
    current: Option<u32>,
    digests: Vec<Option<[u8; 32]>>,
    /// The current file's chunks handed to the stripers.
    file_chunks: u64,
    /// A file abandoned (its source could not be read): its steps still
    /// queued are passed over.
    abandoned: Option<u32>,
    sent: Sent,
}

impl DataSender {
    pub fn new(
        opts: SendOptions,
        link: Link,
        stripers: async_channel::Sender<Outgoing>,
        progress: Progress,
        pace: Option<Arc<Mutex<Pace>>>,
    ) -> DataSender {
        DataSender {
            pace,
            opts,
            link,
            stripers,
            chunks_sent: 0,
            tamper: tamper_hook(),
            progress,
            current: None,
            digests: Vec::new(),
            file_chunks: 0,
            abandoned: None,
            sent: Sent::default(),
        }
    }

    /// What it sent; its hold on the stripers goes with it (they end when
    /// every holder is gone).
    pub fn finish(self) -> Sent {
        self.sent
    }

    /// Takes a file's next step. A read that failed abandons the file
    /// (its source could not be read): the copy goes on without it.
    pub async fn take(&mut self, step: DataStep) -> anyhow::Result<()> {
        match step {
            DataStep::Chunk { at, read } => {
                let read = read.await?;
                if self.abandoned == Some(at.index) {
                    // (Read ahead before the file failed: its buffer goes
                    // back.)
                    return Ok(());
                }
                match read {
                    Ok((buf, digest)) => self.hand(at, buf, digest).await,
                    Err(why) => self.abandon(at.index, why).await,
                }
            }
            DataStep::End { index, .. } if self.abandoned == Some(index) => Ok(()),
            DataStep::End {
                index,
                size,
                chunk,
                path,
                compared,
            } => self.end(index, size, chunk, &path, compared).await,
            DataStep::Abandon { index, why } => self.abandon(index, why).await,
        }
    }

    /// Tells the receiver that file `index` could not be read, with how
    /// many of its chunks went before: nothing of it is put in place.
    async fn abandon(&mut self, index: u32, why: anyhow::Error) -> anyhow::Result<()> {
        self.switch_to(index);
        self.abandoned = Some(index);
        let m = Msg::Abandoned {
            index,
            chunks: self.file_chunks,
            kind: FailKind::of_unread(&why),
            reason: format!("{why:#}"),
        };
        self.link.send_message(&m.encode()).await?;
        Ok(())
    }

    fn switch_to(&mut self, index: u32) {
        if self.current != Some(index) {
            self.current = Some(index);
            self.digests.clear();
            self.file_chunks = 0;
        }
    }

    /// Hands a chunk that was read and hashed to the stripers, unless the
    /// receiver has it already.
    pub async fn hand(
        &mut self,
        at: ChunkAt,
        mut buf: PoolBuf,
        digest: [u8; 32],
    ) -> anyhow::Result<()> {
        self.switch_to(at.index);
        let len = buf.len() as u64;
        let flags = if self.opts.verify {
            chunk_flags::DIGEST
        } else {
            0
        };
        let nth = self.chunks_sent;
        self.chunks_sent += 1;
        if self.tamper == Some(nth) && len > 0 {
            // Test hook: damage the bytes after they were hashed, as a
            // fault between storage and the wire would.
            buf.spare()[0] ^= 0xff;
        }
        let k = at.k as usize;
        if self.digests.len() <= k {
            self.digests.resize(k + 1, None);
        }
        self.digests[k] = Some(digest);
        if at.there == Some(digest) {
            // Already there: nothing to send.
            return Ok(());
        }
        let meta = ChunkMeta {
            owner: u64::from(at.index),
            offset: at.offset,
            flags,
            digest,
        };
        if self.stripers.send((meta, buf)).await.is_err() {
            return Err(StreamsGone.into());
        }
        // `--bwlimit`: the next chunk waits for what this one owes.
        let wait = match &self.pace {
            Some(pace) => pace.lock().expect("pace lock").take(len, Instant::now()),
            None => Duration::ZERO,
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        self.file_chunks += 1;
        self.sent.bytes += len;
        self.progress.add(len);
        Ok(())
    }

    /// A file's end: how many of its chunks were sent, and its digest.
    async fn end(
        &mut self,
        index: u32,
        size: u64,
        chunk: u32,
        path: &[u8],
        compared: bool,
    ) -> anyhow::Result<()> {
        // (No chunk of it may have been read: empty, or all holes.)
        self.switch_to(index);
        if compared && self.file_chunks == 0 {
            self.sent.skipped += 1;
            self.progress.there_already(1);
        }
        let digest = if self.opts.verify {
            self.opts.digest.file_digest(size, chunk, &self.digests)
        } else {
            [0; 32]
        };
        if self.opts.verify && self.sent.digests.len() < 2 {
            self.sent.digests.push((path.to_vec(), digest));
        }
        let end = Msg::EntryEnd {
            index,
            chunks: self.file_chunks,
            digest,
        };
        self.link.send_message(&end.encode()).await?;
        Ok(())
    }
}

/// Fault injection for the integration tests: `RCP_TEST_CORRUPT_CHUNK=N`
/// flips a byte of the Nth chunk sent after it was hashed, so that the
/// receiver must catch it. (An attacker on the path is played by a real
/// proxy in the tests, not by a hook.) Only in builds with the
/// `test-hooks` feature (rcp's own tests turn it on): a shipping binary
/// reads no such variable.
#[cfg(feature = "test-hooks")]
fn tamper_hook() -> Option<u64> {
    std::env::var("RCP_TEST_CORRUPT_CHUNK")
        .ok()
        .and_then(|v| v.parse().ok())
}

#[cfg(not(feature = "test-hooks"))]
fn tamper_hook() -> Option<u64> {
    None
}

/// A chunk ready to go out: where it belongs, and its bytes.
pub(super) type Outgoing = (ChunkMeta, PoolBuf);

/// Where chunks are handed to the stripers, and the stripers (each ends
/// with the bytes it sent).
pub(super) type Stripers = (
    async_channel::Sender<Outgoing>,
    Vec<JoinHandle<anyhow::Result<u64>>>,
);

/// Why no stream takes data any more: the first striper's error, one
/// that found tampering before any other (a stream aborted because
/// another failed says less).
pub(super) async fn why_streams_failed(
    stripers: Vec<JoinHandle<anyhow::Result<u64>>>,
) -> anyhow::Error {
    let mut errors = Vec::new();
    for s in stripers {
        match s.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.into()),
        }
    }
    let tampering = errors.iter().position(|e| {
        e.downcast_ref::<LinkError>()
            .is_some_and(LinkError::is_tampering)
    });
    match tampering.or((!errors.is_empty()).then_some(0)) {
        Some(i) => errors.swap_remove(i),
        None => PeerLost("every stream failed".into()).into(),
    }
}

/// One task per link that takes the next chunk as soon as its link has
/// posted the previous one, so chunks flow to whichever stream has credit.
/// A striper that fails fails every link, so that nothing waits on it.
/// Each returns the bytes it sent.
pub(super) fn stripe(links: &[Link], pool: &Arc<BufferPool>) -> anyhow::Result<Stripers> {
    let (tx, rx) = async_channel::bounded::<Outgoing>(links.len());
    let mut tasks = Vec::with_capacity(links.len());
    for link in links {
        // Each connection has its own registration of the pool.
        let region = link.register(pool.memory())?;
        let (link, rx, all) = (link.clone(), rx.clone(), links.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut bytes = 0u64;
            while let Ok((meta, buf)) = rx.recv().await {
                let len = buf.len() as u64;
                if let Err(e) = link.send_chunk(meta, &region, buf).await {
                    crate::streams::abort_all(&all, "a data stream failed");
                    return Err(e.into());
                }
                bytes += len;
            }
            Ok(bytes)
        }));
    }
    Ok((tx, tasks))
}
