//! Striping one session over several links (`--streams N`).
//!
//! The session's first link (stream 0) carries the control messages and
//! data; each further link is a connection of its own that authenticates
//! like the first and then names the session and its stream number with a
//! `Join`. The server keeps the sessions that still wait for streams in a
//! registry; a session starts copying once all of its streams are there.
//! Data chunks go out on whichever stream has a free credit; the receiver
//! takes them in any order (each chunk header names its file and offset).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use rfabric::link::{Incoming, Link};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How long a session waits for its further streams to join.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A stream arriving for its session: its number, its link.
type Arrival = (u32, Link);

/// Server side: sessions waiting for their streams, by session id.
#[derive(Debug, Default)]
pub struct Sessions {
    waiting: Mutex<HashMap<[u8; 16], mpsc::Sender<Arrival>>>,
}

/// A session's claim on its id while its streams join; the id is freed
/// when this is dropped.
#[derive(Debug)]
pub struct Waiting {
    id: [u8; 16],
    streams: u32,
    arrivals: mpsc::Receiver<Arrival>,
    registry: Arc<Sessions>,
}

impl Sessions {
    /// Opens a session that will have `streams` links in all.
    pub fn open(self: &Arc<Self>, streams: u32) -> Waiting {
        let (tx, rx) = mpsc::channel(streams.max(1) as usize);
        let mut map = self.waiting.lock().expect("sessions lock");
        let id = loop {
            let id: [u8; 16] = rfabric::auth::nonce()[..16].try_into().expect("16 bytes");
            if !map.contains_key(&id) {
                break id;
            }
        };
        if streams > 1 {
            map.insert(id, tx);
        }
        Waiting {
            id,
            streams,
            arrivals: rx,
            registry: Arc::clone(self),
        }
    }

    /// Hands `link` to the waiting session `id` as stream `stream`.
    pub fn join(&self, id: &[u8; 16], stream: u32, link: Link) -> anyhow::Result<()> {
        let tx = self
            .waiting
            .lock()
            .expect("sessions lock")
            .get(id)
            .cloned()
            .context("no session waits for a stream with that id")?;
        tx.try_send((stream, link))
            .map_err(|_| anyhow::anyhow!("the session takes no more streams"))
    }
}

impl Waiting {
    pub fn id(&self) -> [u8; 16] {
        self.id
    }

    /// Waits until every stream joined; returns the links in stream order,
    /// `first` (stream 0) at the front.
    pub async fn gather(mut self, first: Link) -> anyhow::Result<Vec<Link>> {
        let mut links: Vec<Option<Link>> = vec![None; self.streams as usize];
        links[0] = Some(first);
        let mut missing = self.streams - 1;
        let deadline = tokio::time::Instant::now() + JOIN_TIMEOUT;
        while missing > 0 {
            let (stream, link) = tokio::time::timeout_at(deadline, self.arrivals.recv())
                .await
                .with_context(|| {
                    format!("{missing} of the session's streams did not join in time")
                })?
                .expect("the registry holds a sender while this waits");
            match links.get_mut(stream as usize) {
                Some(slot @ None) => *slot = Some(link),
                _ => {
                    link.abort("stream number out of range or taken");
                    bail!("stream {stream} joined twice or is out of range");
                }
            }
            missing -= 1;
        }
        Ok(links.into_iter().map(|l| l.expect("all joined")).collect())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.registry
            .waiting
            .lock()
            .expect("sessions lock")
            .remove(&self.id);
    }
}

/// Says goodbye on every link at once (each waits for the peer's goodbye
/// on that link, so an order could stall).
pub async fn finish_all(links: &[Link]) -> anyhow::Result<()> {
    let tasks: Vec<JoinHandle<_>> = links
        .iter()
        .map(|l| {
            let l = l.clone();
            tokio::spawn(async move { l.finish().await })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Fails every link (the peer sees `why`).
pub fn abort_all(links: &[Link], why: &str) {
    for l in links {
        l.abort(why);
    }
}

/// Everything arriving on a session's links, merged: `(stream, item)` in
/// each link's own order; `None` items when a link's peer said goodbye.
pub struct Merged {
    rx: mpsc::Receiver<(u32, anyhow::Result<Option<Incoming>>)>,
    readers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Merged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merged")
            .field("links", &self.readers.len())
            .finish()
    }
}

impl Merged {
    /// Starts one reader per link. The channel is bounded, so a receiver
    /// that falls behind stops taking items and credits stop flowing.
    pub fn new(links: &[Link]) -> Merged {
        let (tx, rx) = mpsc::channel(64);
        let readers = links
            .iter()
            .enumerate()
            .map(|(i, link)| {
                let (link, tx) = (link.clone(), tx.clone());
                tokio::spawn(async move {
                    loop {
                        let item = link.recv().await.map_err(anyhow::Error::from);
                        let last = !matches!(item, Ok(Some(_)));
                        if tx.send((i as u32, item)).await.is_err() || last {
                            return;
                        }
                    }
                })
            })
            .collect();
        Merged { rx, readers }
    }

    /// The next item from any link; `None` once every link ended.
    pub async fn next(&mut self) -> Option<(u32, anyhow::Result<Option<Incoming>>)> {
        self.rx.recv().await
    }

    /// The next item if one is there already, without waiting.
    pub fn try_next(&mut self) -> Option<(u32, anyhow::Result<Option<Incoming>>)> {
        self.rx.try_recv().ok()
    }
}

impl Drop for Merged {
    fn drop(&mut self) {
        for r in &self.readers {
            r.abort();
        }
    }
}
