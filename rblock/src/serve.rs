//! NBD over TCP and unix sockets, and the fabric listener: the listeners
//! are set up here and run until the stop; then no new connections, and
//! each connection finishes what is in flight, answers anything newer with
//! ESHUTDOWN, then closes.
//!
//! Rooms by job, each using only those listed after it: `accept` (a
//! place among the connections, a task per client), `link` (a client of
//! the fabric protocol, `rblock connect`: its requests, carried out),
//! `single_threaded` (the runtimes of one thread each that tcp links and
//! busy NBD connections are served on, each on one),
//! `connection` (the NBD handshake on the socket), `transmission` (the request loop: headers,
//! write data, bursts, shutdown), `burst` (small requests taken together),
//! `request` (one request carried out), `zero_copy` (large requests
//! without a copy), `reply` (replies made and written to the socket),
//! `input` (what the request loop reads from), `buffers` (memory reused
//! between requests).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::sync::{Semaphore, mpsc, watch};

use crate::config::{Listen, ZeroCopy};
use crate::export::Export;
use crate::socket::Stream;

mod accept;
mod blocking_wire;
mod buffers;
mod burst;
mod connection;
mod input;
mod link;
mod pace;
mod reply;
mod request;
mod single_threaded;
mod threaded;
mod transmission;
mod zero_copy;

use accept::Accepting;
use buffers::Buffers;
pub use connection::NbdTls;
use zero_copy::Load;

/// What fabric clients must prove they know, and accept.
#[derive(Debug, Clone, Default)]
pub struct FabricGuard {
    /// The secret to prove (None: no proof asked, unless an export has
    /// its own).
    pub secret: Option<Arc<Vec<u8>>>,
    /// Which sessions must be encrypted (those with a secret: without
    /// one there are no keys).
    pub encrypt: rfabric::link::seal::EncryptChoice,
}

/// How and where to serve.
#[derive(Debug)]
pub struct Plan {
    /// NBD listeners.
    pub listen: Vec<Listen>,
    /// rblock's own protocol over RDMA or tcp (`rblock connect`).
    pub fabric: Option<rfabric::endpoint::Listener>,
    /// What its clients must prove and accept.
    pub fabric_guard: FabricGuard,
    /// Connections (NBD and fabric) served at once; more are refused.
    pub max_connections: usize,
    /// How long connections may take to finish after the stop.
    pub grace: Duration,
    /// When large reads go from the page cache without a copy.
    pub zero_copy_reads: ZeroCopy,
    /// What NBD clients are offered of TLS.
    pub nbd_tls: NbdTls,
    /// Threads of its own for each plain NBD connection to a local export
    /// (0: served on the runtime).
    pub nbd_threads: usize,
}

/// Serves `exports` as `plan` says until `stop` resolves, then lets the
/// connections finish. `stop` is first polled once every listener is up.
pub async fn run(
    exports: Vec<Export>,
    plan: Plan,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let Plan {
        listen,
        fabric,
        fabric_guard,
        max_connections,
        grace,
        zero_copy_reads,
        nbd_tls,
        nbd_threads,
    } = plan;
    let exports: Arc<[Export]> = exports.into();
    let (shutdown_tx, shutdown) = watch::channel(false);
    let load = Arc::new(Load {
        slots: Arc::new(Semaphore::new(max_connections)),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    });
    let (conn_tx, mut conn_rx) = mpsc::channel::<()>(1);
    // (Tcp links go there; NBD connections too, when they move.)
    let tcp_links = fabric.as_ref().is_some_and(|f| f.has_tcp());
    let single_threaded = if tcp_links || nbd_threads > 0 {
        Some(Arc::new(
            single_threaded::SingleThreaded::start(load.cores)
                .context("cannot start the single-threaded runtimes")?,
        ))
    } else {
        None
    };
    let buffers = Buffers::default();
    let mut acceptors = Vec::new();
    let accepting = || Accepting {
        fabric_guard: fabric_guard.clone(),
        exports: Arc::clone(&exports),
        shutdown: shutdown.clone(),
        load: Arc::clone(&load),
        zero_copy_reads,
        nbd_tls: nbd_tls.clone(),
        nbd_threads,
        alive: conn_tx.clone(),
        buffers: buffers.clone(),
        single_threaded: single_threaded.clone(),
    };
    for l in &listen {
        let ctx = accepting();
        match l {
            Listen::Tcp(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr}"))?;
                tracing::info!("listening on {}", listener.local_addr()?);
                acceptors.push(tokio::spawn(async move {
                    loop {
                        match listener.accept().await {
                            Ok((s, _)) => {
                                let _ = s.set_nodelay(true);
                                ctx.start(Stream::Tcp(s));
                            }
                            Err(e) => tracing::warn!("accept failed: {e}"),
                        }
                    }
                }));
            }
            Listen::Unix(path) => {
                remove_stale_socket(path)?;
                let listener = tokio::net::UnixListener::bind(path)
                    .with_context(|| format!("cannot listen on {}", path.display()))?;
                tracing::info!("listening on unix:{}", path.display());
                acceptors.push(tokio::spawn(async move {
                    loop {
                        match listener.accept().await {
                            Ok((s, _)) => ctx.start(Stream::Unix(s)),
                            Err(e) => tracing::warn!("accept failed: {e}"),
                        }
                    }
                }));
            }
        }
    }
    if let Some(fabric) = fabric {
        let ctx = accepting();
        acceptors.push(tokio::spawn(async move {
            loop {
                match fabric.accept_incoming().await {
                    Ok(incoming) => ctx.start_link(incoming),
                    Err(e) => tracing::warn!("fabric accept failed: {e}"),
                }
            }
        }));
    }
    drop(conn_tx);
    stop.await;
    tracing::info!("shutting down");
    for a in &acceptors {
        a.abort();
    }
    let _ = shutdown_tx.send(true);
    drop(acceptors);
    // Every connection holds a sender: all gone means all closed.
    if tokio::time::timeout(grace, conn_rx.recv()).await.is_err() {
        tracing::warn!("connections still open after {grace:?}; closing them");
    }
    for l in &listen {
        if let Listen::Unix(p) = l {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(())
}

/// A leftover socket file from an earlier run is replaced; anything else
/// at that path is an error.
fn remove_stale_socket(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the old socket {}", path.display())),
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(_) => Ok(()),
    }
}
