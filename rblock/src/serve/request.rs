//! One request of a socket connection carried out: a large read from the
//! page cache when it may, a read or write with its data passing through
//! here (a remote read's left in the slots it landed in), anything else
//! through the shared executor.

use super::buffers::Buffers;
use super::input::Payload;
use super::reply::{Reply, failed, read_buffer, read_reply, write_failed};
use super::zero_copy::cached_reply;
use crate::backend::Backend;
use crate::execute::{Executed, Failure, carry_out};
use crate::nbd::transmission::{Command, Request, block_status_reply, ok_reply, read_reply_header};

/// A request's data, and where the reply's comes from.
pub(super) struct Data<'a> {
    /// A write's.
    pub(super) payload: Option<Payload>,
    /// Where a read's buffer comes from.
    pub(super) buffers: &'a Buffers,
    /// Whether a large read may be sent from the page cache.
    pub(super) zero_copy: bool,
}

/// Carries out one checked request; returns the whole reply.
pub(super) async fn execute(
    command: Command,
    req: &Request,
    data: Data<'_>,
    storage: &Backend,
    structured: bool,
) -> Reply {
    if let (Command::Read, Backend::Local(local)) = (command, storage)
        && let Some(reply) = cached_reply(local, req, structured, data.zero_copy)
    {
        return reply;
    }
    execute_here(
        command,
        req,
        data.payload,
        storage,
        structured,
        data.buffers,
    )
    .await
}

/// Carries out one checked request with the data passing through here.
async fn execute_here(
    command: Command,
    req: &Request,
    payload: Option<Payload>,
    storage: &Backend,
    structured: bool,
    buffers: &Buffers,
) -> Reply {
    let (cookie, offset, len) = (req.cookie, req.offset, req.length);
    let done = match command {
        Command::Read => {
            return match storage {
                Backend::Local(local) => {
                    let buf = read_buffer(buffers, structured, req);
                    let (buf, r) = local.read(offset, buf, len as usize).await;
                    read_reply(structured, cookie, buf, r, buffers).into()
                }
                Backend::Remote(remote, lane) => {
                    match remote.read(*lane, offset, len as usize).await {
                        Ok(data) => Reply::Landed {
                            head: read_reply_header(structured, cookie, offset, len),
                            data,
                        },
                        Err(e) => failed(structured, cookie, &Failure::read(&e)).into(),
                    }
                }
            };
        }
        Command::Write { fua } => {
            let r = match payload {
                Some(Payload::Staged(staged)) => storage.write_staged(offset, &staged, fua).await,
                bytes => {
                    let data = match bytes {
                        Some(Payload::Bytes(b)) => b,
                        _ => Vec::new(),
                    };
                    let (data, r) = storage.write(offset, data, 0, len as usize, fua).await;
                    buffers.give(data);
                    r
                }
            };
            match r {
                Ok(()) => ok_reply(cookie),
                Err(e) => write_failed(structured, cookie, &e),
            }
        }
        Command::Disc => unreachable!("handled by the reader"),
        other => match carry_out(other, req, storage).await {
            Ok(Executed::Done) => ok_reply(cookie),
            Ok(Executed::Extents(extents)) => block_status_reply(cookie, &extents),
            Err(f) => failed(structured, cookie, &f),
        },
    };
    done.into()
}
