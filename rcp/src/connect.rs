//! Choosing and opening the transport: verbs when an RDMA device routes to
//! the peer, else tcp (`--transport auto`), or exactly the one asked for.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use rfabric::credit::SPARE_RECEIVES;
use rfabric::link::LinkConfig;
use rfabric::transport::tcp::{self, TcpListener};
use rfabric::transport::verbs::{self, VerbsListener, VerbsOptions};
use rfabric::transport::{Connection, Limits, TransportError};
use rfabric::wire::CHUNK_HEADER_LEN;
use rfabric::wire::Role;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// RDMA when a device routes to the peer, else tcp.
    Auto,
    /// RDMA only (rdma_cm; InfiniBand, RoCE, iWARP).
    Rdma,
    /// TCP only.
    Tcp,
}

/// Resolves `host:port` to one address.
pub fn resolve(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {host}"))?
        .next()
        .with_context(|| format!("{host} has no address"))
}

/// Connects to `addr` over the chosen transport.
pub async fn connect(
    addr: SocketAddr,
    transport: Transport,
) -> anyhow::Result<Arc<dyn Connection>> {
    if transport != Transport::Tcp {
        match verbs::connect(addr, VerbsOptions::default()).await {
            Ok(c) => return Ok(Arc::new(c)),
            Err(TransportError::Unavailable(why)) if transport == Transport::Auto => {
                let _ = why;
            }
            Err(e) if transport == Transport::Rdma => {
                bail!("cannot connect to {addr} over RDMA: {e}")
            }
            Err(e) => bail!("cannot connect to {addr} over RDMA: {e}"),
        }
    }
    let c = tcp::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    Ok(Arc::new(c))
}

/// Listens on tcp and, where an RDMA device has the address, rdma_cm too.
pub struct Listener {
    tcp: Option<TcpListener>,
    rdma: Option<VerbsListener>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("tcp", &self.tcp.is_some())
            .field("rdma", &self.rdma.is_some())
            .finish()
    }
}

impl Listener {
    pub async fn bind(addr: SocketAddr, transport: Transport) -> anyhow::Result<Listener> {
        let tcp = if transport == Transport::Rdma {
            None
        } else {
            Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr}"))?,
            )
        };
        // RDMA on the same port as tcp, so that one address serves both.
        let port = match &tcp {
            Some(t) => t.local_addr()?.port(),
            None => addr.port(),
        };
        let raddr = SocketAddr::new(addr.ip(), port);
        let rdma = match VerbsListener::bind(raddr, VerbsOptions::default()) {
            Ok(l) => Some(l),
            Err(e) if transport == Transport::Rdma => {
                bail!("cannot listen on {raddr} over RDMA: {e}")
            }
            Err(_) => None,
        };
        Ok(Listener { tcp, rdma })
    }

    pub fn port(&self) -> anyhow::Result<u16> {
        match &self.tcp {
            Some(t) => Ok(t.local_addr()?.port()),
            None => bail!("no tcp listener"),
        }
    }

    pub fn has_rdma(&self) -> bool {
        self.rdma.is_some()
    }

    pub async fn accept(&self) -> anyhow::Result<Arc<dyn Connection>> {
        let c: Arc<dyn Connection> = match (&self.tcp, &self.rdma) {
            (Some(t), Some(r)) => tokio::select! {
                c = t.accept() => Arc::new(c?),
                c = r.accept() => Arc::new(c?),
            },
            (Some(t), None) => Arc::new(t.accept().await?),
            (None, Some(r)) => Arc::new(r.accept().await?),
            (None, None) => bail!("nothing to listen on"),
        };
        Ok(c)
    }
}

/// Control receives of an rcp link.
const CONTROL_DEPTH: u32 = 32;

/// The link shape of an rcp session: a landing ring of `window` slots of
/// `chunk` bytes each way, control messages big enough for any path; both
/// cut down to what the connection's device allows (one receive per slot
/// besides the control ones, one transfer within the largest message).
pub fn link_config(role: Role, window: u32, chunk: usize, limits: &Limits) -> LinkConfig {
    let spare = CONTROL_DEPTH + SPARE_RECEIVES;
    let window = window.min(limits.max_recv_wr.saturating_sub(spare)).max(1);
    let max_chunk = (limits.max_msg as usize).saturating_sub(CHUNK_HEADER_LEN);
    let mut c = LinkConfig::new(role, window, chunk.min(max_chunk) as u32);
    c.control_size = 16 * 1024;
    c.control_depth = CONTROL_DEPTH;
    c
}
