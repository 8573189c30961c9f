//! Where one NBD connection's requests are carried out: the export's
//! storage on this node (`rblock serve`), or a remote export across the
//! fabric (`rblock connect`), through the lane the connection is bound to.
//! Here local storage meets NBD: a zeroing it refuses becomes an NBD
//! error, its stretches of data and holes `base:allocation` extents.
//!
//! Reads are not here: their data ends up in different places (a local
//! read's in a buffer after the reply header, a remote one's in the
//! fabric's landing slots, `fabric::landed`), so the request layer reads
//! from each in its own way.

use std::sync::Arc;

use crate::fabric::client::{Remote, Staged};
use crate::nbd::consts::{STATE_HOLE, STATE_ZERO, cflags, errno};
use crate::nbd::transmission::{Extent, wire_errno};
use crate::storage::{Allocation, Storage, Stretch, ZeroError};

/// What an export is served from.
#[derive(Debug, Clone)]
pub enum Source {
    Local(Arc<Storage>),
    Remote(Arc<Remote>),
}

impl Source {
    /// The backend of one new connection (remote ones take turns on the
    /// lanes).
    pub fn backend(&self) -> Backend {
        match self {
            Source::Local(s) => Backend::Local(Arc::clone(s)),
            Source::Remote(r) => Backend::Remote(Arc::clone(r), r.next_lane()),
        }
    }
}

/// One connection's way to its export.
#[derive(Debug, Clone)]
pub enum Backend {
    Local(Arc<Storage>),
    /// The remote export and this connection's lane.
    Remote(Arc<Remote>, usize),
}

impl Backend {
    /// Writes `buf[at..at+len]` at `offset`; durable before it returns with
    /// `fua`.
    pub async fn write(
        &self,
        offset: u64,
        buf: Vec<u8>,
        at: usize,
        len: usize,
        fua: bool,
    ) -> (Vec<u8>, std::io::Result<()>) {
        match self {
            Backend::Local(s) => s.write(offset, buf, at, len, fua).await,
            Backend::Remote(r, lane) => {
                let result = r.write(*lane, offset, &buf[at..at + len], fua).await;
                (buf, result)
            }
        }
    }

    /// Buffers to receive a write's `len` bytes of data straight into,
    /// where the export is remote and they are free ([`Remote::stage`]);
    /// None: read the data into memory.
    pub fn stage(&self, len: usize) -> Option<Staged> {
        match self {
            Backend::Local(_) => None,
            Backend::Remote(r, lane) => r.stage(*lane, len),
        }
    }

    /// Writes the data `staged` holds at `offset`; durable before it
    /// returns with `fua`.
    pub async fn write_staged(
        &self,
        offset: u64,
        staged: &Staged,
        fua: bool,
    ) -> std::io::Result<()> {
        match self {
            Backend::Remote(r, lane) => r.write_staged(*lane, offset, staged, fua).await,
            // (Nothing stages for local storage; were it given such data,
            // it is written all the same.)
            Backend::Local(s) => {
                let data = staged.gather();
                let len = data.len();
                s.write(offset, data, 0, len, fua).await.1
            }
        }
    }

    pub async fn flush(&self) -> std::io::Result<()> {
        match self {
            Backend::Local(s) => s.flush().await,
            Backend::Remote(r, lane) => r.flush(*lane).await,
        }
    }

    pub async fn trim(&self, offset: u64, len: u32, fua: bool) -> std::io::Result<()> {
        match self {
            Backend::Local(s) => s.trim(offset, u64::from(len), fua).await,
            Backend::Remote(r, lane) => r.trim(*lane, offset, len, fua).await,
        }
    }

    pub async fn cache(&self, offset: u64, len: u32) {
        match self {
            Backend::Local(s) => s.cache(offset, u64::from(len)),
            // Only a hint: a failure changes nothing for the client.
            Backend::Remote(r, lane) => drop(r.cache(*lane, offset, len).await),
        }
    }

    /// WRITE_ZEROES (see [`Storage::zero`]); `Err` is an NBD error number.
    pub async fn zero(
        &self,
        offset: u64,
        len: u32,
        punch: bool,
        fast: bool,
        fua: bool,
    ) -> Result<(), u32> {
        match self {
            Backend::Local(s) => s
                .zero(offset, u64::from(len), punch, fast, fua)
                .await
                .map_err(|e| match e {
                    ZeroError::NoFastWay => errno::ENOTSUP,
                    ZeroError::Io(e) => wire_errno(&e),
                }),
            Backend::Remote(r, lane) => {
                let flags = [
                    (fua, cflags::FUA),
                    (!punch, cflags::NO_HOLE),
                    (fast, cflags::FAST_ZERO),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .fold(0, |f, (_, bit)| f | bit);
                r.zero(*lane, offset, len, flags).await
            }
        }
    }

    pub async fn block_status(
        &self,
        offset: u64,
        len: u32,
        one: bool,
    ) -> std::io::Result<Vec<Extent>> {
        match self {
            Backend::Local(s) => Ok(s
                .block_status(offset, len, one)
                .into_iter()
                .map(extent)
                .collect()),
            Backend::Remote(r, lane) => {
                let flags = if one { cflags::REQ_ONE } else { 0 };
                r.block_status(*lane, offset, len, flags).await
            }
        }
    }
}

/// A stretch of local storage as a `base:allocation` extent.
fn extent(s: Stretch) -> Extent {
    let flags = match s.allocation {
        Allocation::Data => 0,
        Allocation::Hole => STATE_HOLE | STATE_ZERO,
    };
    Extent {
        length: s.length,
        flags,
    }
}
