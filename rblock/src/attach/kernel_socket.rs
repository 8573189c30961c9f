//! One socket for the kernel: a connection to our own NBD socket, taken
//! through the handshake so that the kernel finds it in the transmission
//! phase.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::nbd::client_handshake::{ClientHandshake, Export};

/// How long the handshake with our own server may take; it answers at
/// once unless something is badly wrong.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects to `sock` and negotiates export `name`: a blocking socket for
/// the kernel, and what the server said about the export.
pub async fn open(sock: &Path, name: &str) -> anyhow::Result<(UnixStream, Export)> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, negotiate(sock, name))
        .await
        .with_context(|| {
            format!(
                "no NBD handshake on {} within {HANDSHAKE_TIMEOUT:?}",
                sock.display()
            )
        })?
        .with_context(|| format!("NBD handshake on {}", sock.display()))
}

async fn negotiate(sock: &Path, name: &str) -> anyhow::Result<(UnixStream, Export)> {
    let mut s = tokio::net::UnixStream::connect(sock)
        .await
        .context("cannot connect")?;
    let mut hs = ClientHandshake::new(name)?;
    let mut input = Vec::new();
    let mut chunk = [0u8; 4096];
    let export = loop {
        let out = hs.take_output();
        if !out.is_empty() {
            s.write_all(&out).await?;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(hs.closed().into());
        }
        input.extend_from_slice(&chunk[..n]);
        let (used, done) = hs.advance(&input)?;
        input.drain(..used);
        if let Some(export) = done {
            break export;
        }
    };
    // The kernel reads the transmission phase from the first byte on: a
    // byte already read here would be lost to it.
    if !input.is_empty() {
        bail!(
            "the server sent {} bytes after the handshake, before any request",
            input.len()
        );
    }
    let s = s.into_std()?;
    // The kernel does its own waiting; leave the socket as a plain one.
    s.set_nonblocking(false)?;
    Ok((s, export))
}

#[cfg(test)]
mod tests;
