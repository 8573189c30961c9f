//! One NBD client from its greeting to the end of the handshake, which
//! hands the socket to the transmission phase.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::transmission::transmission;
use super::zero_copy::FromCache;
use crate::export::Export;
use crate::nbd::handshake::{Handshake, Outcome};
use crate::nbd::transmission::Limits;
use crate::socket::Stream;

/// A client has this long to finish the handshake.
const HANDSHAKE_TIME: Duration = Duration::from_secs(60);

/// One client, from greeting to close.
pub(super) async fn connection(
    stream: Stream,
    exports: Arc<[Export]>,
    shutdown: watch::Receiver<bool>,
    from_cache: FromCache,
) -> anyhow::Result<()> {
    let (mut rd, mut wr) = stream.split();
    let infos = exports.iter().map(|e| e.info.clone()).collect();
    let mut hs = Handshake::new(infos);
    let mut buf = Vec::new();
    let mut stop = shutdown.clone();
    let handshake = tokio::time::timeout(HANDSHAKE_TIME, async {
        // The greeting first; then each round takes all the input it can.
        wr.write_all(&hs.take_output()).await?;
        loop {
            let (used, outcome) = hs.advance(&buf)?;
            buf.drain(..used);
            let out = hs.take_output();
            if !out.is_empty() {
                wr.write_all(&out).await?;
            }
            match outcome {
                Some(Outcome::Transmission(n)) => return anyhow::Ok(Some(n)),
                Some(Outcome::Close) => return Ok(None),
                None => {}
            }
            let mut tmp = [0u8; 8192];
            let n = rd.read(&mut tmp).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&tmp[..n]);
        }
    });
    // A shutdown ends handshakes still going on: nothing was promised yet.
    let negotiated = tokio::select! {
        r = handshake => r.context("the handshake took too long")??,
        _ = stop.wait_for(|s| *s) => None,
    };
    let Some(negotiated) = negotiated else {
        let _ = wr.shutdown().await;
        return Ok(());
    };
    let export = &exports[negotiated.export];
    let limits = Limits::new(&negotiated, export.info.size, export.info.read_only);
    let backend = export.source.backend();
    transmission(buf, (rd, wr), limits, backend, shutdown, from_cache).await
}
