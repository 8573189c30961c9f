//! Choosing and opening the transport: verbs when an RDMA device routes to
//! the peer, else tcp (`auto`), or exactly the one asked for; and listening
//! on both at one address.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::credit::SPARE_RECEIVES;
use crate::link::LinkConfig;
use crate::transport::memory::{self, MemoryListener};
use crate::transport::tcp::{self, TcpListener};
use crate::transport::verbs::{self, VerbsListener, VerbsOptions};
use crate::transport::{Connection, Limits, TransportError};
use crate::wire::{CHUNK_HEADER_LEN, Role};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Transport {
    /// RDMA when a device routes to the peer, else tcp.
    Auto,
    /// RDMA only (rdma_cm; InfiniBand, RoCE, iWARP).
    Rdma,
    /// TCP only.
    Tcp,
    /// Both ends in this process (rcp's local copy); never typed by users.
    #[cfg_attr(feature = "clap", value(skip))]
    InProcess,
}

impl Transport {
    /// The transport that insists on what `backend` is (a further link to
    /// the same or the next peer goes the way the first one went).
    pub fn of(backend: crate::transport::Backend) -> Transport {
        match backend {
            crate::transport::Backend::Tcp => Transport::Tcp,
            crate::transport::Backend::Rdma => Transport::Rdma,
            crate::transport::Backend::InProcess => Transport::InProcess,
        }
    }

    /// The name users type.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
            Transport::InProcess => "in-process",
        }
    }
}

/// Resolves `host:port` to one address (`host` may be bracketed IPv6).
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, TransportError> {
    use std::net::ToSocketAddrs;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map_err(|e| TransportError::Io(format!("cannot resolve {host}: {e}")))?
        .next()
        .ok_or_else(|| TransportError::Io(format!("{host} has no address")))
}

/// Connects to `addr` over the chosen transport (in-process: to the
/// listener on `addr`'s port, see [`Listener::in_process`]).
pub async fn connect(
    addr: SocketAddr,
    transport: Transport,
) -> Result<Arc<dyn Connection>, TransportError> {
    if transport == Transport::InProcess {
        return Ok(Arc::new(memory::connect(addr.port())?));
    }
    if transport != Transport::Tcp {
        match verbs::connect(addr, VerbsOptions::default()).await {
            Ok(c) => return Ok(Arc::new(c)),
            // No RDMA stack or no device with a route: tcp, as asked.
            Err(TransportError::Unavailable(_)) if transport == Transport::Auto => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Arc::new(tcp::connect(addr).await?))
}

/// Listens on tcp and, where an RDMA device has the address, rdma_cm too;
/// or in this process only.
pub struct Listener {
    tcp: Option<TcpListener>,
    rdma: Option<VerbsListener>,
    memory: Option<MemoryListener>,
    /// The port both listen on.
    port: u16,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("tcp", &self.tcp.is_some())
            .field("rdma", &self.rdma.is_some())
            .field("in_process", &self.memory.is_some())
            .finish()
    }
}

impl Listener {
    pub async fn bind(addr: SocketAddr, transport: Transport) -> Result<Listener, TransportError> {
        Listener::bind_as(addr, transport, true).await
    }

    /// As [`Listener::bind`], but tcp connections come out of
    /// [`Listener::accept_incoming`] before their preface, to be set up on
    /// the runtime that serves them ([`tcp::Unestablished`]).
    pub async fn bind_unestablished(
        addr: SocketAddr,
        transport: Transport,
    ) -> Result<Listener, TransportError> {
        Listener::bind_as(addr, transport, false).await
    }

    async fn bind_as(
        addr: SocketAddr,
        transport: Transport,
        establish: bool,
    ) -> Result<Listener, TransportError> {
        let tcp = match (transport, establish) {
            (Transport::Rdma, _) => None,
            (_, true) => Some(TcpListener::bind(addr).await?),
            (_, false) => Some(TcpListener::bind_unestablished(addr).await?),
        };
        // RDMA on the same port as tcp, so that one address serves both.
        // RDMA alone on any port: one the kernel gives tcp now (rdma_cm
        // would pick its own, and cannot say which).
        let port = match &tcp {
            Some(t) => t.local_addr()?.port(),
            None if addr.port() == 0 => std::net::TcpListener::bind(addr)?.local_addr()?.port(),
            None => addr.port(),
        };
        let raddr = SocketAddr::new(addr.ip(), port);
        let rdma = match VerbsListener::bind(raddr, VerbsOptions::default()) {
            Ok(l) => Some(l),
            Err(e) if transport == Transport::Rdma => return Err(e),
            Err(_) => None,
        };
        Ok(Listener {
            tcp,
            rdma,
            memory: None,
            port,
        })
    }

    /// A listener only this process reaches, through
    /// [`connect`]`(127.0.0.1:port, Transport::InProcess)`: both ends of a
    /// local copy, with no socket between them.
    pub fn in_process() -> Result<Listener, TransportError> {
        let memory = MemoryListener::bind()?;
        Ok(Listener {
            tcp: None,
            rdma: None,
            port: memory.port(),
            memory: Some(memory),
        })
    }

    /// The port listened on (tcp's, which rdma_cm shares).
    pub fn port(&self) -> Result<u16, TransportError> {
        Ok(self.port)
    }

    pub fn has_rdma(&self) -> bool {
        self.rdma.is_some()
    }

    pub fn has_tcp(&self) -> bool {
        self.tcp.is_some()
    }

    /// The next connection, set up (on a listener made with
    /// [`Listener::bind_unestablished`], here and in turn).
    pub async fn accept(&self) -> Result<Arc<dyn Connection>, TransportError> {
        self.accept_incoming().await?.establish().await
    }

    /// The next connection, as the listener hands it out.
    pub async fn accept_incoming(&self) -> Result<Incoming, TransportError> {
        let tcp = |a: tcp::Accepted| match a {
            tcp::Accepted::Ready(c) => Incoming::Ready(Arc::new(c)),
            tcp::Accepted::Unestablished(u) => Incoming::Tcp(u),
        };
        if let Some(m) = &self.memory {
            return Ok(Incoming::Ready(Arc::new(m.accept().await?)));
        }
        Ok(match (&self.tcp, &self.rdma) {
            (Some(t), Some(r)) => tokio::select! {
                c = t.accept_any() => tcp(c?),
                c = r.accept() => Incoming::Ready(Arc::new(c?)),
            },
            (Some(t), None) => tcp(t.accept_any().await?),
            (None, Some(r)) => Incoming::Ready(Arc::new(r.accept().await?)),
            (None, None) => return Err(TransportError::Invalid("nothing to listen on".into())),
        })
    }
}

/// A connection a [`Listener`] accepted.
pub enum Incoming {
    /// Set up, its work on the listener's runtime (rdma_cm, and tcp from
    /// [`Listener::bind`]).
    Ready(Arc<dyn Connection>),
    /// To be set up where it will be served.
    Tcp(tcp::Unestablished),
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Incoming::Ready(c) => write!(f, "Ready({})", c.peer_name()),
            Incoming::Tcp(u) => f.debug_tuple("Tcp").field(u).finish(),
        }
    }
}

impl Incoming {
    /// Whether setting it up on another runtime moves its work there.
    pub fn can_move(&self) -> bool {
        matches!(self, Incoming::Tcp(_))
    }

    /// How logs name the peer.
    pub fn peer_name(&self) -> String {
        match self {
            Incoming::Ready(c) => c.peer_name(),
            Incoming::Tcp(u) => u
                .peer()
                .map_or_else(|| "tcp peer".into(), |a| a.to_string()),
        }
    }

    /// The connection, set up on the calling runtime if it was not.
    pub async fn establish(self) -> Result<Arc<dyn Connection>, TransportError> {
        match self {
            Incoming::Ready(c) => Ok(c),
            Incoming::Tcp(u) => Ok(Arc::new(u.establish().await?)),
        }
    }
}

/// A link's shape cut down to what the connection's device allows: at most
/// one receive per slot besides the control ones, and no transfer larger
/// than the device's largest message.
pub fn fitted_link_config(
    role: Role,
    window: u32,
    chunk: usize,
    control_depth: u32,
    control_size: u32,
    limits: &Limits,
) -> LinkConfig {
    let spare = control_depth + SPARE_RECEIVES;
    let window = window.min(limits.max_recv_wr.saturating_sub(spare)).max(1);
    let max_chunk = (limits.max_msg as usize).saturating_sub(CHUNK_HEADER_LEN);
    let mut c = LinkConfig::new(role, window, chunk.min(max_chunk) as u32);
    c.control_size = control_size;
    c.control_depth = control_depth;
    c
}
