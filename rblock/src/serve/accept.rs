//! Taking a client: a place among the connections (or a refusal when all
//! are taken), and a task that serves it, NBD or fabric (a tcp link on
//! one of the single-threaded runtimes, wholly; an NBD connection there
//! while it is busy with small requests).

use std::sync::Arc;

use anyhow::Context;
use rfabric::endpoint::Incoming;
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};

use super::FabricGuard;
use super::buffers::Buffers;
use super::connection::{NbdTls, Serving, connection};
use super::link::serve_link;
use super::single_threaded::SingleThreaded;
use super::zero_copy::{FromCache, Load};
use crate::config::ZeroCopy;
use crate::export::Export;
use crate::socket::Stream;

pub(super) struct Accepting {
    /// What fabric clients must prove they know, and accept.
    pub(super) fabric_guard: FabricGuard,
    pub(super) exports: Arc<[Export]>,
    pub(super) shutdown: watch::Receiver<bool>,
    /// The places among the connections, and how many are taken.
    pub(super) load: Arc<Load>,
    pub(super) zero_copy_reads: ZeroCopy,
    /// What NBD clients are offered of TLS.
    pub(super) nbd_tls: NbdTls,
    /// Threads of its own for each plain NBD connection to a local export.
    pub(super) nbd_threads: usize,
    pub(super) alive: mpsc::Sender<()>,
    /// The server's spare buffers, shared by its NBD connections.
    pub(super) buffers: Buffers,
    /// Where fabric links that can move are served (with a tcp fabric
    /// listener), and NBD connections busy with small requests (with
    /// `nbd_threads`).
    pub(super) single_threaded: Option<Arc<SingleThreaded>>,
}

impl Accepting {
    /// A client of rblock's fabric protocol (`rblock connect`). A tcp one
    /// is set up and served on a single-threaded runtime; an RDMA one,
    /// whose work is on the listener's runtime already, is served there.
    pub(super) fn start_link(&self, incoming: Incoming) {
        let client = incoming.peer_name();
        let Some(place) = self.place("fabric connection", &client) else {
            // (A tcp one closes as it is dropped, before its preface.)
            if let Incoming::Ready(conn) = &incoming {
                conn.close();
            }
            return;
        };
        let on = match &self.single_threaded {
            Some(threads) if incoming.can_move() => Some(threads.next().clone()),
            _ => None,
        };
        let guard = self.fabric_guard.clone();
        let (exports, shutdown, who) = (
            Arc::clone(&self.exports),
            self.shutdown.clone(),
            client.clone(),
        );
        let served = async move {
            let conn = incoming
                .establish()
                .await
                .context("cannot set up the connection")?;
            serve_link(conn, exports, shutdown, guard, who).await
        };
        self.run("fabric connection", client, place, on, served);
    }

    pub(super) fn start(&self, stream: Stream) {
        let from_cache = match self.zero_copy_reads {
            ZeroCopy::Auto | ZeroCopy::Always => FromCache::Always,
            ZeroCopy::Never => FromCache::Never,
        };
        let client = match &stream {
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "tcp peer".into(), |a| a.to_string()),
            Stream::Unix(_) => "unix socket".into(),
        };
        let serving = Serving {
            from_cache,
            tls: self.nbd_tls.clone(),
            threads: self.nbd_threads,
            buffers: self.buffers.clone(),
        };
        let Some(place) = self.place("connection", &client) else {
            return;
        };
        let served = connection(
            stream,
            Arc::clone(&self.exports),
            self.shutdown.clone(),
            serving,
            self.single_threaded.as_ref().map(|t| t.next().clone()),
        );
        self.run("connection", client, place, None, served);
    }

    /// A place among the connections for a `what` from `client` (as the
    /// logs name it), or None (and a warning) when all are taken.
    fn place(&self, what: &'static str, client: &str) -> Option<OwnedSemaphorePermit> {
        let place = Arc::clone(&self.load.slots).try_acquire_owned().ok();
        if place.is_none() {
            tracing::warn!(client, "refusing a {what}: too many open");
        }
        place
    }

    /// Serves one `what` in a task of its own (on the runtime `on`, else
    /// this one) while it holds its `place`.
    fn run<F>(
        &self,
        what: &'static str,
        client: String,
        place: OwnedSemaphorePermit,
        on: Option<tokio::runtime::Handle>,
        served: F,
    ) where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let alive = self.alive.clone();
        let task = async move {
            if let Err(e) = served.await {
                tracing::warn!(client, "{what} ended: {e:#}");
            }
            drop(place);
            drop(alive);
        };
        match on {
            Some(runtime) => drop(runtime.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }
}
