//! One NBD client from its greeting to the end of the handshake (with
//! STARTTLS, the TLS session taking over the socket in its middle), which
//! hands the connection to the transmission phase: a local export's on
//! the connection's threads and a runtime in turn, as its pace asks
//! (`pace.rs`), anything else on the shared runtime.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::blocking_wire::Wire;
use super::buffers::Buffers;
use super::pace::{Rules, Runtime, Stay};
use super::threaded::{Leaving, Threads, transmission_on_threads};
use super::transmission::{OnRuntime, transmission};
use super::zero_copy::FromCache;
use crate::backend::Backend;
use crate::export::Export;
use crate::nbd::handshake::{Handshake, Outcome, Tls};
use crate::nbd::transmission::Limits;
use crate::socket::{Stream, split_tls};
use crate::storage::Storage;

/// A client has this long to finish the handshake.
const HANDSHAKE_TIME: Duration = Duration::from_secs(60);

/// What the NBD listeners offer of TLS.
#[derive(Debug, Clone, Default)]
pub struct NbdTls {
    pub mode: Tls,
    /// The credentials (there whenever `mode` is not off).
    pub server: Option<Arc<rfabric::tls::TlsServer>>,
}

/// How the server serves its NBD connections: the same for each.
pub(super) struct Serving {
    pub(super) from_cache: FromCache,
    /// What clients are offered of TLS.
    pub(super) tls: NbdTls,
    /// Threads of its own for a plain or TLS connection to a local export
    /// (`--nbd-threads`; 0: it is served on the runtime).
    pub(super) threads: usize,
    /// The server's spare buffers.
    pub(super) buffers: Buffers,
}

/// One client, from greeting to close (`single`: the single-threaded
/// runtime it goes to when busy with small requests).
pub(super) async fn connection(
    stream: Stream,
    exports: Arc<[Export]>,
    shutdown: watch::Receiver<bool>,
    serving: Serving,
    single: Option<tokio::runtime::Handle>,
) -> anyhow::Result<()> {
    let Serving {
        from_cache,
        tls,
        threads,
        buffers,
    } = serving;
    let infos = exports.iter().map(|e| e.info.clone()).collect();
    let mut hs = Handshake::with_tls(infos, tls.mode);
    let mut buf = Vec::new();
    let mut stop = shutdown.clone();
    let mut stream = Some(stream);
    let handshake = tokio::time::timeout(HANDSHAKE_TIME, async {
        let plain = stream.as_mut().expect("the socket");
        match drive(&mut hs, plain, &mut buf).await? {
            Some(Outcome::StartTls) => {}
            other => return anyhow::Ok((other, None)),
        }
        if !buf.is_empty() {
            bail!("the client sent more after STARTTLS before the TLS handshake");
        }
        let server = tls
            .server
            .as_ref()
            .context("STARTTLS without credentials")?;
        let fd = stream.take().expect("the socket").into_fd()?;
        let (reader, writer) = server.accept(fd).await?;
        let mut session = tokio::io::join(reader, writer);
        hs.tls_started();
        let outcome = drive(&mut hs, &mut session, &mut buf).await?;
        Ok((outcome, Some(session)))
    });
    // A shutdown ends handshakes still going on: nothing was promised yet.
    let (negotiated, session) = tokio::select! {
        r = handshake => r.context("the handshake took too long")??,
        _ = stop.wait_for(|s| *s) => (None, None),
    };
    // A connection to a local export, on threads of its own while it is
    // quiet; under TLS its session goes with it, off the runtime.
    if let (Some(Outcome::Transmission(n)), true) = (&negotiated, threads > 0)
        && let Backend::Local(storage) = exports[n.export].source.backend()
    {
        let export = &exports[n.export];
        let limits = Limits::new(n, export.info.size, export.info.read_only);
        let (wire, from_cache) = match (session, stream) {
            (Some(session), _) => {
                let (reader, writer) = session.into_inner();
                let (reader, writer) = rfabric::tls::into_blocking(reader, writer)?;
                // Under TLS every byte is encrypted here: none goes from
                // the cache.
                (Wire::Tls(reader, writer), FromCache::Never)
            }
            (None, Some(stream)) => (Wire::Plain(stream.into_fd()?), from_cache),
            (None, None) => return Ok(()),
        };
        let threads = Threads {
            count: threads,
            from_cache,
            moves: Rules::default(),
            buffers,
        };
        return served_in_turn(buf, wire, limits, storage, shutdown, threads, single).await;
    }
    let halves = match (session, stream) {
        (Some(s), _) => split_tls(s),
        (None, Some(s)) => s.split(),
        (None, None) => return Ok(()),
    };
    let Some(Outcome::Transmission(negotiated)) = negotiated else {
        let (_, mut wr) = halves;
        let _ = wr.shutdown().await;
        return Ok(());
    };
    // Under TLS every byte is encrypted here: none goes from the cache.
    let from_cache = if halves.1.can_send_file() {
        from_cache
    } else {
        FromCache::Never
    };
    let export = &exports[negotiated.export];
    let limits = Limits::new(&negotiated, export.info.size, export.info.read_only);
    let backend = export.source.backend();
    let how = OnRuntime {
        from_cache,
        moves: None,
        buffers,
    };
    transmission(buf, halves, limits, backend, shutdown, how).await?;
    Ok(())
}

/// A local export's connection, on its threads while it is quiet and on
/// a runtime while it is busy (`single`: the single-threaded one it goes
/// to when busy with small requests; without one, the shared one), until
/// it is over.
async fn served_in_turn(
    mut pending: Vec<u8>,
    mut wire: Wire,
    limits: Limits,
    storage: Arc<Storage>,
    shutdown: watch::Receiver<bool>,
    threads: Threads,
    single: Option<tokio::runtime::Handle>,
) -> anyhow::Result<()> {
    loop {
        let on_threads = transmission_on_threads(
            pending,
            wire,
            limits,
            Arc::clone(&storage),
            shutdown.clone(),
            &threads,
        );
        let Stay::Moves {
            pending: p,
            wire: Leaving { wire: w, to },
        } = on_threads.await?
        else {
            return Ok(());
        };
        let on_runtime = served_on_runtime(
            p,
            w,
            limits,
            Arc::clone(&storage),
            shutdown.clone(),
            &threads,
        );
        let back = match (to, &single) {
            (Runtime::Single, Some(runtime)) => runtime
                .spawn(on_runtime)
                .await
                .context("the connection's runtime")??,
            _ => on_runtime.await?,
        };
        let Some((p, w)) = back else {
            return Ok(());
        };
        (pending, wire) = (p, w);
    }
}

/// A stay on the runtime this runs on (the socket is registered with
/// it): None when the connection is over, else what it left unread and
/// the socket, back to its threads.
fn served_on_runtime(
    pending: Vec<u8>,
    wire: Wire,
    limits: Limits,
    storage: Arc<Storage>,
    shutdown: watch::Receiver<bool>,
    threads: &Threads,
) -> impl Future<Output = anyhow::Result<Option<(Vec<u8>, Wire)>>> + Send + 'static {
    let how = OnRuntime {
        from_cache: threads.from_cache,
        moves: Some(threads.moves),
        buffers: threads.buffers.clone(),
    };
    async move {
        let halves = wire.into_runtime().context("moving to the runtime")?;
        let backend = Backend::Local(storage);
        let stay = transmission(pending, halves, limits, backend, shutdown, how);
        let Stay::Moves {
            pending,
            wire: (rd, wr),
        } = stay.await?
        else {
            return Ok(None);
        };
        let wire = Wire::from_runtime(rd, wr).context("moving to the threads")?;
        Ok(Some((pending, wire)))
    }
}

/// Runs the handshake over `io` until it ends or pauses for STARTTLS:
/// its output goes out as it comes, the client's bytes into `buf` (what
/// is left there after the end belongs to the transmission phase).
async fn drive<S: AsyncRead + AsyncWrite + Unpin>(
    hs: &mut Handshake,
    io: &mut S,
    buf: &mut Vec<u8>,
) -> anyhow::Result<Option<Outcome>> {
    // The greeting first (or nothing, under TLS); then each round takes
    // all the input it can.
    io.write_all(&hs.take_output()).await?;
    loop {
        let (used, outcome) = hs.advance(buf)?;
        buf.drain(..used);
        let out = hs.take_output();
        if !out.is_empty() {
            io.write_all(&out).await?;
        }
        if outcome.is_some() {
            io.flush().await?;
            return Ok(outcome);
        }
        let mut tmp = [0u8; 8192];
        let n = io.read(&mut tmp).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}
