//! One NBD client from its greeting to the end of the handshake (with
//! STARTTLS, the TLS session taking over the socket in its middle), which
//! hands the connection to the transmission phase: a local export's on
//! the connection's threads and the runtime in turn, as its pace asks
//! (`pace.rs`), anything else on the runtime.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::blocking_wire::Wire;
use super::pace::{Rules, Stay};
use super::threaded::{Threads, transmission_on_threads};
use super::transmission::transmission;
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

/// One client, from greeting to close.
pub(super) async fn connection(
    stream: Stream,
    exports: Arc<[Export]>,
    shutdown: watch::Receiver<bool>,
    from_cache: FromCache,
    tls: NbdTls,
    threads: usize,
) -> anyhow::Result<()> {
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
        };
        return served_in_turn(buf, wire, limits, storage, shutdown, threads).await;
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
    transmission(buf, halves, limits, backend, shutdown, from_cache, None).await?;
    Ok(())
}

/// A local export's connection, on its threads while it is quiet and on
/// the runtime while it is busy, until it is over.
async fn served_in_turn(
    mut pending: Vec<u8>,
    mut wire: Wire,
    limits: Limits,
    storage: Arc<Storage>,
    shutdown: watch::Receiver<bool>,
    threads: Threads,
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
            wire: w,
        } = on_threads.await?
        else {
            return Ok(());
        };
        let halves = w.into_runtime().context("moving to the runtime")?;
        let backend = Backend::Local(Arc::clone(&storage));
        let on_runtime = transmission(
            p,
            halves,
            limits,
            backend,
            shutdown.clone(),
            threads.from_cache,
            Some(threads.moves),
        );
        let Stay::Moves {
            pending: p,
            wire: (rd, wr),
        } = on_runtime.await?
        else {
            return Ok(());
        };
        wire = Wire::from_runtime(rd, wr).context("moving to the threads")?;
        pending = p;
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
