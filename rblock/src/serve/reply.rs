//! Replies: made from how a request went, and written to the socket by
//! whichever task has one ready; a read's data may come straight from the
//! file (see `zero_copy`), or from the fabric's landing slots.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::sync::OwnedSemaphorePermit;

use super::buffers::Buffers;
use crate::execute::Failure;
use crate::fabric::landed::ReadData;
use crate::nbd::transmission::{Request, error_reply, read_reply_header};
use crate::socket::WriteHalf;
use crate::storage::Storage;

/// One reply to the client.
pub(super) enum Reply {
    /// Made here.
    Bytes(Vec<u8>),
    /// A read's header, and its data sent straight from the page cache.
    File {
        head: Vec<u8>,
        storage: Arc<Storage>,
        offset: u64,
        len: usize,
    },
    /// A read of cached data to be copied (`--zero-copy-reads never`, and
    /// under TLS), read from the page cache only once the socket is this
    /// reply's, so that its data is still in the CPU's cache when it is
    /// written (see [`super::zero_copy::cached_reply`]). Read so, it
    /// holds the socket while the page cache is read: data evicted since
    /// it was found there is read from the disk meanwhile, as `sendfile`
    /// would. A read that fails is answered with its error (nothing of
    /// its reply has gone out yet).
    ReadAtSend {
        storage: Arc<Storage>,
        req: Request,
        structured: bool,
    },
    /// A read's header, and its data from where it landed over the fabric
    /// (`rblock connect`; its slots are let go once it is sent).
    Landed { head: Vec<u8>, data: ReadData },
}

impl From<Vec<u8>> for Reply {
    fn from(b: Vec<u8>) -> Reply {
        Reply::Bytes(b)
    }
}

/// Where replies go: the socket, written by whichever task has a reply
/// ready (no hand-off to a writer task). Replies that find it busy wait
/// their turn; the last of them flushes, so replies that pile up leave in
/// one system call.
pub(super) struct Replies {
    pub(super) out: tokio::sync::Mutex<BufWriter<WriteHalf>>,
    /// Replies waiting for or holding the socket.
    pub(super) queued: AtomicUsize,
    /// Replies that have begun to go out, ever (counted before the bytes
    /// can reach the client: `pace.rs` tells by it whether a request came
    /// while others were unanswered).
    pub(super) begun: AtomicU64,
    pub(super) buffers: Buffers,
    /// Whether the last reply lets the tasks ready to run write theirs
    /// before it flushes: for a remote export (`rblock connect`), whose
    /// answers arrive together from the lane and wake a task each, which
    /// otherwise find the socket free one after another and flush one by
    /// one (one `sendto` per 4 KiB read at iodepth 32; with the wait, one
    /// per 30). Not for a local export: its bursts are answered
    /// together already (`send_all`), and the wait cost its 4 KiB reads
    /// at iodepth 32 a tenth of their IOPS.
    pub(super) gather: bool,
}

impl Replies {
    pub(super) async fn send(
        &self,
        reply: Reply,
        budget: OwnedSemaphorePermit,
    ) -> std::io::Result<()> {
        self.send_all([(reply, budget)]).await
    }

    /// Replies that leave together (each with the budget it held).
    pub(super) async fn send_all(
        &self,
        replies: impl IntoIterator<Item = (Reply, OwnedSemaphorePermit)>,
    ) -> std::io::Result<()> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let mut out = self.out.lock().await;
        let mut result = Ok(());
        for (reply, budget) in replies {
            self.begun.fetch_add(1, Ordering::AcqRel);
            if result.is_ok() {
                result = match &reply {
                    Reply::Bytes(b) => out.write_all(b).await,
                    Reply::File {
                        head,
                        storage,
                        offset,
                        len,
                    } => send_from_file(&mut out, head, storage, *offset, *len).await,
                    Reply::ReadAtSend {
                        storage,
                        req,
                        structured,
                    } => {
                        let buf = read_in_place(&self.buffers, storage, *structured, req);
                        let sent = out.write_all(&buf).await;
                        self.buffers.give(buf);
                        sent
                    }
                    Reply::Landed { head, data } => {
                        let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + data.slices().count());
                        parts.push(head);
                        parts.extend(data.slices());
                        write_all_vectored(&mut out, &parts).await
                    }
                };
            }
            if let Reply::Bytes(b) = reply {
                self.buffers.give(b);
            }
            drop(budget);
        }
        let last = self.queued.fetch_sub(1, Ordering::AcqRel) == 1;
        if result.is_err() || !last {
            return result;
        }
        if !self.gather {
            return out.flush().await;
        }
        drop(out);
        // The other requests answered by the same burst of the lane have
        // their tasks woken and about to run, each with a reply: they
        // write theirs first, and the lot leaves in one system call.
        tokio::task::yield_now().await;
        if self.queued.load(Ordering::Acquire) == 0 {
            return self.out.lock().await.flush().await;
        }
        Ok(())
    }
}

/// Sends a read's header, then its data from the file. A file that fails
/// to send after the header went out cuts the connection: the header
/// promised data that cannot come.
async fn send_from_file(
    out: &mut BufWriter<WriteHalf>,
    head: &[u8],
    storage: &Storage,
    offset: u64,
    len: usize,
) -> std::io::Result<()> {
    out.flush().await?;
    out.get_ref().send_before_more(head).await?;
    let sent = match out.get_ref().send_file(storage.file(), offset, len).await {
        Ok(n) => n,
        Err(e) => {
            out.get_ref().cut();
            return Err(e);
        }
    };
    if sent < len {
        // The file shrank under us: what is gone reads as zeros.
        out.write_all(&vec![0; len - sent]).await?;
    }
    Ok(())
}

/// Writes `parts` in order: through the buffer where they fit in it,
/// straight to the socket in as few system calls as it takes where they
/// do not (the writer flushes what it holds first).
async fn write_all_vectored(
    out: &mut BufWriter<WriteHalf>,
    parts: &[&[u8]],
) -> std::io::Result<()> {
    let mut slices: Vec<std::io::IoSlice<'_>> =
        parts.iter().map(|p| std::io::IoSlice::new(p)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = out.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// The reply to a request that failed.
pub(super) fn failed(structured: bool, cookie: u64, f: &Failure) -> Vec<u8> {
    error_reply(structured, cookie, f.errno, &f.text)
}

pub(super) fn write_failed(structured: bool, cookie: u64, e: &std::io::Error) -> Vec<u8> {
    failed(structured, cookie, &Failure::write(e))
}

/// A buffer (from `buffers`) holding the reply header of read `req`, with
/// room for its data after it.
pub(super) fn read_buffer(buffers: &Buffers, structured: bool, req: &Request) -> Vec<u8> {
    let head = read_reply_header(structured, req.cookie, req.offset, req.length);
    let mut buf = buffers.take(head.len() + req.length as usize);
    buf.extend_from_slice(&head);
    buf
}

/// Read `req` made right here, whole, however long the disk takes
/// (`pread`): its reply, with its data or its error.
pub(super) fn read_in_place(
    buffers: &Buffers,
    storage: &Storage,
    structured: bool,
    req: &Request,
) -> Vec<u8> {
    let mut buf = read_buffer(buffers, structured, req);
    let read = storage.read_here(req.offset, &mut buf, req.length as usize);
    read_reply(structured, req.cookie, buf, read, buffers)
}

/// A read's reply: `buf` (header and data) if it worked.
pub(super) fn read_reply(
    structured: bool,
    cookie: u64,
    buf: Vec<u8>,
    result: std::io::Result<()>,
    buffers: &Buffers,
) -> Vec<u8> {
    match result {
        Ok(()) => buf,
        Err(e) => {
            buffers.give(buf);
            failed(structured, cookie, &Failure::read(&e))
        }
    }
}
