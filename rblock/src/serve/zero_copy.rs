//! Large requests whose data never passes through the server's memory:
//! reads sent from the page cache (chosen here, sent with `sendfile` by
//! the reply writer), and writes moved from the socket into the file
//! through a pipe (`splice`). What each saves, and
//! when a read is better copied after all, is in `docs/rblock.md`.

use std::sync::Arc;

use anyhow::bail;
use tokio::io::AsyncBufReadExt;
use tokio::sync::Semaphore;

use super::burst::BURST_LEN;
use super::input::{DIRECT_READ, Input};
use super::reply::{Reply, write_failed};
use crate::nbd::transmission::{Request, ok_reply, read_reply_header};
use crate::socket::Pipe;
use crate::storage::Storage;

/// Reads at least this long are sent from the page cache when all of
/// their data is there: below it, the copy costs less than the system
/// calls saved.
const ZERO_COPY_READ: usize = 64 * 1024;

/// The reply to a read that can be sent from the page cache, if it can
/// (and `zero_copy` allows).
pub(super) fn send_from_cache(
    storage: &Arc<Storage>,
    req: &Request,
    structured: bool,
    zero_copy: bool,
) -> Option<Reply> {
    let len = req.length as usize;
    (zero_copy && len >= ZERO_COPY_READ && storage.cached(req.offset, len)).then(|| Reply::File {
        head: read_reply_header(structured, req.cookie, req.offset, req.length),
        storage: Arc::clone(storage),
        offset: req.offset,
        len,
    })
}

/// The reply to a large read on the runtime whose data is all in the
/// page cache, if it is: sent from there where `zero_copy` allows; else,
/// up to [`BURST_LEN`], read from there only as the reply goes out
/// ([`Reply::ReadAtSend`]).
///
/// Why read so late: read when taken, a burst's reads (up to
/// [`super::burst::BURST`] of 256 KiB, all read before the first is
/// answered) had left the CPU's cache by the time each was copied into
/// the socket, and that copy cost twice nbdkit's, which reads and sends
/// on one thread (nbdcopy's 256 KiB reads; with the server's spare
/// buffers, the server's CPU went from 1.2x nbdkit's to parity,
/// `docs/rblock.md`). Longer reads are still read when taken: read as
/// they go out, the read and the send of one connection's 1 MiB reads no
/// longer overlapped, and one fio stream lost up to a tenth of its
/// throughput. So is data not in the cache, whose disk waits overlap.
pub(super) fn cached_reply(
    storage: &Arc<Storage>,
    req: &Request,
    structured: bool,
    zero_copy: bool,
) -> Option<Reply> {
    if zero_copy {
        return send_from_cache(storage, req, structured, true);
    }
    let len = req.length as usize;
    let at_send = (ZERO_COPY_READ..=BURST_LEN as usize).contains(&len);
    (at_send && storage.cached(req.offset, len)).then(|| Reply::ReadAtSend {
        storage: Arc::clone(storage),
        req: *req,
        structured,
    })
}

/// When a large read's data is sent straight from the page cache.
#[derive(Debug, Clone, Copy)]
pub(super) enum FromCache {
    /// Whenever all of it is there (`--zero-copy-reads auto`, the
    /// default, and `always`), for clients across the network, whose
    /// network card takes the pages, and for clients on this machine
    /// alike. A local client copies the data out of the page cache pages
    /// itself, which costs it more than out of a buffer the server has
    /// just written, but the server's two copies (file to buffer, buffer
    /// to socket) are gone: one fio stream of 1 MiB reads went 1.4 times
    /// as fast, on threads and on the runtime alike, with 0.67 times the
    /// server's CPU per GB and 0.8 times the two processes' together.
    /// (Held to a fixed 1 GB/s the two together spend 1.08 times what
    /// they spend with the server copying: the client's colder copy
    /// weighs more there. `docs/rblock.md` has the numbers.)
    Always,
    /// Every read is copied (`never`; and under TLS, where every byte is
    /// encrypted in the server).
    Never,
}

/// The server's places among the connections: one for the whole server.
#[derive(Debug)]
pub(super) struct Load {
    /// Places among the connections (free ones are permits).
    pub(super) slots: Arc<Semaphore>,
    /// The machine's, counted once at the start.
    pub(super) cores: usize,
}

impl FromCache {
    /// Whether a large cached read may be sent from the page cache.
    pub(super) fn allows(&self) -> bool {
        matches!(self, FromCache::Always)
    }
}

/// A connection's pipe for large writes, made when first needed.
pub(super) enum Spare {
    Untried,
    Made(Pipe),
    /// The system gave none: large writes are read into memory.
    Refused,
}

impl Spare {
    pub(super) fn get(&mut self) -> Option<&Pipe> {
        if let Spare::Untried = self {
            *self = match Pipe::new() {
                Ok(p) => Spare::Made(p),
                Err(e) => {
                    tracing::warn!("no pipe for moving write data ({e}); copying it");
                    Spare::Refused
                }
            };
        }
        match self {
            Spare::Made(p) => Some(p),
            _ => None,
        }
    }
}

/// Whether a write's data can go from the socket to the file without
/// passing through here: a large write of whole pages (a partial page
/// could have to be read from the disk first, holding up the reader),
/// with nothing of the handshake's input left in front of it.
pub(super) fn can_splice(rd: &Input, req: &Request) -> bool {
    let (ahead, socket) = rd.get_ref().get_ref();
    let page = rustix::param::page_size() as u64;
    let rest = (req.length as usize).saturating_sub(rd.buffer().len());
    socket.can_splice()
        && rest as u64 >= DIRECT_READ
        && req.offset % page == 0
        && u64::from(req.length) % page == 0
        && ahead.position() == ahead.get_ref().len() as u64
}

/// Carries out a large write whose data goes from the socket through
/// `pipe` into the file (one copy, in the kernel); what the input buffer
/// already holds is written from there. Returns the reply. The client
/// closing in the middle ends the connection; a failed write still takes
/// in all of the data, so that the next request is found.
pub(super) async fn splice_write(
    rd: &mut Input,
    pipe: &Pipe,
    storage: &Storage,
    req: &Request,
    structured: bool,
) -> anyhow::Result<Vec<u8>> {
    let mut write = PipedWrite::start(storage, req, rd.buffer());
    rd.consume(write.done);
    while write.left() > 0 {
        let n = rd
            .get_ref()
            .get_ref()
            .1
            .splice_into(pipe, write.left().min(pipe.capacity()))
            .await?;
        write.moved(pipe, n)?;
    }
    Ok(write.reply(structured))
}

/// A large write on its way through a pipe: the part the input buffer
/// held is written first, then what each move brings into the pipe. Once
/// the storage refuses a part, the rest is still taken in (and thrown
/// away), so that the next request is found.
struct PipedWrite<'a> {
    storage: &'a Storage,
    req: &'a Request,
    /// Bytes of its data taken in.
    done: usize,
    failed: Option<std::io::Error>,
}

impl<'a> PipedWrite<'a> {
    /// Writes what of the data `buffered` holds (the caller consumes
    /// `done` bytes of it).
    fn start(storage: &'a Storage, req: &'a Request, buffered: &[u8]) -> Self {
        let held = buffered.len().min(req.length as usize);
        PipedWrite {
            storage,
            req,
            done: held,
            failed: storage.write_here(req.offset, &buffered[..held]).err(),
        }
    }

    /// Bytes still to take in.
    fn left(&self) -> usize {
        self.req.length as usize - self.done
    }

    /// `n` more bytes are in `pipe` (0: the client closed).
    fn moved(&mut self, pipe: &Pipe, n: usize) -> anyhow::Result<()> {
        if n == 0 {
            bail!("the client closed in the middle of a write");
        }
        if self.failed.is_none() {
            let at = self.req.offset + self.done as u64;
            self.failed = self.storage.write_from_pipe(pipe.output(), at, n).err();
        }
        if self.failed.is_some() {
            pipe.empty()?;
        }
        self.done += n;
        Ok(())
    }

    fn reply(self, structured: bool) -> Vec<u8> {
        match self.failed {
            None => ok_reply(self.req.cookie),
            Some(e) => write_failed(structured, self.req.cookie, &e),
        }
    }
}
