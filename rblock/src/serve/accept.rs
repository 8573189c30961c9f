//! Taking a client: a place among the connections (or a refusal when all
//! are taken), and a task that serves it, NBD or fabric.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::FabricGuard;
use super::connection::{NbdTls, connection};
use super::link::serve_link;
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
    pub(super) alive: mpsc::Sender<()>,
}

impl Accepting {
    /// A client of rblock's fabric protocol (`rblock connect`).
    pub(super) fn start_link(&self, conn: Arc<dyn rfabric::transport::Connection>) {
        let closer = Arc::clone(&conn);
        let client = conn.peer_name();
        let guard = self.fabric_guard.clone();
        let who = client.clone();
        let admitted = self.admit("fabric connection", client, move |exports, shutdown| {
            serve_link(conn, exports, shutdown, guard, who)
        });
        if !admitted {
            closer.close();
        }
    }

    pub(super) fn start(&self, stream: Stream) {
        let from_cache = match self.zero_copy_reads {
            ZeroCopy::Always => FromCache::Always,
            ZeroCopy::Never => FromCache::Never,
            ZeroCopy::Auto if !stream.is_local() => FromCache::Always,
            ZeroCopy::Auto => FromCache::WhenBusy(Arc::clone(&self.load)),
        };
        let client = match &stream {
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "tcp peer".into(), |a| a.to_string()),
            Stream::Unix(_) => "unix socket".into(),
        };
        let tls = self.nbd_tls.clone();
        self.admit("connection", client, move |exports, shutdown| {
            connection(stream, exports, shutdown, from_cache, tls)
        });
    }

    /// Serves one `what` (made by `serve`) from `client` (as the logs name
    /// it) in a task of its own while it holds a place among the
    /// connections; false when all are taken.
    fn admit<F>(
        &self,
        what: &'static str,
        client: String,
        serve: impl FnOnce(Arc<[Export]>, watch::Receiver<bool>) -> F,
    ) -> bool
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let Ok(permit) = Arc::clone(&self.load.slots).try_acquire_owned() else {
            tracing::warn!(client, "refusing a {what}: too many open");
            return false;
        };
        let served = serve(Arc::clone(&self.exports), self.shutdown.clone());
        let alive = self.alive.clone();
        tokio::spawn(async move {
            if let Err(e) = served.await {
                tracing::warn!(client, "{what} ended: {e:#}");
            }
            drop(permit);
            drop(alive);
        });
        true
    }
}
