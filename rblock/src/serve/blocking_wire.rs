//! The two ends of a connection's socket as its threads use them
//! (`threaded.rs`): plain, or a TLS session taken off the runtime. Both
//! block; a receive timeout on the socket comes back as `WouldBlock`.
//!
//! Only a plain socket can send bytes without passing through here
//! (`sendfile` from the page cache): under TLS every byte is encrypted
//! here, so that path asks [`Sink::plain`] first. (Large writes are read
//! into memory on the threads, not spliced: see `threaded.rs`.)

use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rfabric::tls::{BlockingTlsReader, BlockingTlsWriter};

use crate::socket::{ReadHalf, Stream, Unsplit, WriteHalf, unsplit};

/// How long the TLS goodbye may wait to be sent.
const BYE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A connection's socket as its threads get it.
pub(super) enum Wire {
    Plain(OwnedFd),
    /// A session after STARTTLS, its halves already blocking.
    Tls(BlockingTlsReader, BlockingTlsWriter),
}

impl Wire {
    /// The receiving and sending ends.
    pub(super) fn split(self) -> std::io::Result<(Source, Sink)> {
        Ok(match self {
            Wire::Plain(fd) => {
                let output = std::fs::File::from(fd);
                let input = output.try_clone()?;
                (Source::Plain(input), Sink::Plain(output))
            }
            Wire::Tls(r, w) => (Source::Tls(r), Sink::Tls(w)),
        })
    }
}

impl Wire {
    /// A connection's halves taken off the runtime (`pace.rs`: it is
    /// quiet again), the socket blocking.
    pub(super) fn from_runtime(rd: ReadHalf, wr: WriteHalf) -> std::io::Result<Wire> {
        Ok(match unsplit(rd, wr)? {
            Unsplit::Plain(fd) => {
                rustix::io::ioctl_fionbio(&fd, false)?;
                Wire::Plain(fd)
            }
            Unsplit::Tls(r, w) => {
                let (r, w) = rfabric::tls::into_blocking(r, w)?;
                Wire::Tls(r, w)
            }
        })
    }

    /// The connection given to the runtime (`pace.rs`: it is busy).
    pub(super) fn into_runtime(self) -> std::io::Result<(ReadHalf, WriteHalf)> {
        use rustix::net::sockopt::{Timeout, set_socket_timeout};
        Ok(match self {
            Wire::Plain(fd) => {
                set_socket_timeout(&fd, Timeout::Recv, None)?;
                Stream::from_fd(fd)?.split()
            }
            Wire::Tls(r, w) => {
                set_socket_timeout(w.socket(), Timeout::Recv, None)?;
                let (r, w) = rfabric::tls::into_async(r, w)?;
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        })
    }

    /// The two ends [`Wire::split`] gave, put together again.
    pub(super) fn join(source: Source, sink: Sink) -> std::io::Result<Wire> {
        Ok(match (source, sink) {
            // (The receiving end is the sending end's duplicate.)
            (Source::Plain(_), Sink::Plain(f)) => Wire::Plain(f.into()),
            (Source::Tls(r), Sink::Tls(w)) => Wire::Tls(r, w),
            _ => return Err(std::io::Error::other("the ends of two connections")),
        })
    }
}

/// What the client sends.
pub(super) enum Source {
    Plain(std::fs::File),
    Tls(BlockingTlsReader),
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Plain(f) => f.read(buf),
            Source::Tls(r) => r.read(buf),
        }
    }
}

/// What the client is sent.
pub(super) enum Sink {
    Plain(std::fs::File),
    Tls(BlockingTlsWriter),
}

impl Sink {
    /// The socket, where bytes may be sent to it without passing through
    /// here.
    pub(super) fn plain(&mut self) -> Option<&mut std::fs::File> {
        match self {
            Sink::Plain(f) => Some(f),
            Sink::Tls(_) => None,
        }
    }

    /// The socket itself (to shut it down).
    pub(super) fn socket(&self) -> BorrowedFd<'_> {
        match self {
            Sink::Plain(f) => f.as_fd(),
            Sink::Tls(w) => w.socket(),
        }
    }

    /// The end of the connection: under TLS, the goodbye (close_notify)
    /// a client may wait for, given at most [`BYE_WAIT`] to go out (a
    /// client that reads nothing does not hold the connection open).
    pub(super) fn close(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Plain(_) => Ok(()),
            Sink::Tls(w) => {
                rustix::net::sockopt::set_socket_timeout(
                    w.socket(),
                    rustix::net::sockopt::Timeout::Send,
                    Some(BYE_WAIT),
                )?;
                w.bye()
            }
        }
    }
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::Plain(f) => f.write(data),
            Sink::Tls(w) => w.write(data),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Sink::Plain(f) => f.write_vectored(bufs),
            Sink::Tls(w) => w.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
