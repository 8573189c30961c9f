//! The transmission phase on a socket: request headers and write data
//! read in turn, small requests taken in bursts, the others carried out
//! in tasks of their own with replies sent as they complete; on shutdown,
//! what is in flight finishes and anything newer gets ESHUTDOWN. A
//! connection that came from its threads because it was busy goes back
//! to them once it is quiet again (`pace.rs`).

use std::io::Cursor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{Semaphore, watch};

use super::buffers::Buffers;
use super::burst::{BURST_LEN, serve_burst, take_burst};
use super::input::{Input, Payload, read_payload, read_write_data, unread};
use super::pace::{Mode, Pace, Rules, Stay, Took, large_read};
use super::reply::Replies;
use super::request::{Data, execute};
use super::zero_copy::{FromCache, Spare, can_splice, splice_write};
use crate::backend::Backend;
use crate::nbd::consts::{REQUEST_LEN, errno};
use crate::nbd::handshake::MAX_PAYLOAD;
use crate::nbd::transmission::{Command, Limits, Request, check, error_reply};
use crate::socket::{ReadHalf, WriteHalf};

/// Requests in flight per connection at most.
pub(super) const MAX_IN_FLIGHT: usize = 128;
/// Payload bytes (write data read, read data not yet sent) per connection.
const MAX_BUFFERED: usize = 128 << 20;

/// How a connection is served on the runtime.
pub(super) struct OnRuntime {
    pub(super) from_cache: FromCache,
    /// When it goes back to its threads (None: it stays to the end).
    pub(super) moves: Option<Rules>,
    /// The server's spare buffers.
    pub(super) buffers: Buffers,
}

/// Serves a connection's requests once its handshake is over (`pending`:
/// what came before, from the handshake or the connection's threads)
/// until the client leaves, or after a shutdown until nothing is in
/// flight (`Stay::Over`), or, where `how.moves` says when, until it is
/// quiet (`Stay::Moves`: what is left to read, and the halves).
pub(super) async fn transmission(
    pending: Vec<u8>,
    (rd, wr): (ReadHalf, WriteHalf),
    limits: Limits,
    backend: Backend,
    mut shutdown: watch::Receiver<bool>,
    how: OnRuntime,
) -> anyhow::Result<Stay<(ReadHalf, WriteHalf)>> {
    let OnRuntime {
        from_cache,
        moves,
        buffers,
    } = how;
    let replies = Arc::new(Replies {
        out: tokio::sync::Mutex::new(BufWriter::with_capacity(256 * 1024, wr)),
        queued: AtomicUsize::new(0),
        begun: AtomicU64::new(0),
        buffers: buffers.clone(),
        gather: matches!(backend, Backend::Remote(..)),
    });
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let budget = Arc::new(Semaphore::new(MAX_BUFFERED));
    let mut stopping = *shutdown.borrow();
    // What the handshake read ahead comes first.
    let mut rd: Input = BufReader::with_capacity(256 * 1024, Cursor::new(pending).chain(rd));
    // Made at the first large write.
    let mut pipe = Spare::Untried;
    let mut pace = moves.map(|rules| Pace::new(rules, Mode::Runtime, Instant::now()));
    // Requests taken, ever (against `replies.begun`), and whether the
    // connection goes back to its threads once those are answered.
    let mut taken = 0u64;
    let mut leaving = false;
    let result = async {
        loop {
            if leaving {
                break;
            }
            // The next header, or (once stopping) the moment nothing is in
            // flight any more.
            // (Waiting for bytes is cancel-safe; reading them is not, so it
            // happens outside the select.)
            let more = tokio::select! {
                buf = rd.fill_buf() => !buf?.is_empty(),
                _ = shutdown.changed(), if !stopping => {
                    stopping = true;
                    continue;
                }
                _ = idle(&in_flight), if stopping => break,
            };
            if !more {
                // The client hung up.
                break;
            }
            if let (false, Backend::Local(storage)) = (stopping, &backend) {
                let zero_copy = from_cache.allows();
                let burst = take_burst(&mut rd, &limits, &budget, storage, zero_copy);
                let requests = burst.reads.len() + burst.answered.len();
                if requests > 0 {
                    let behind_others = taken > replies.begun.load(Ordering::Acquire);
                    taken += requests as u64;
                    let took = Took {
                        requests: requests as u32,
                        small: true,
                        large_read: false,
                        behind_others,
                    };
                    leaving = quiet(&mut pace, took);
                    let replies = &replies;
                    serve_burst(burst, storage, replies, &buffers, &in_flight, &limits).await?;
                    continue;
                }
            }
            let mut head = [0u8; REQUEST_LEN];
            rd.read_exact(&mut head)
                .await
                .context("the client closed in the middle of a request")?;
            let req = Request::decode(&head)?;
            let took = Took {
                requests: 1,
                small: req.length <= BURST_LEN,
                large_read: large_read(&req),
                behind_others: taken > replies.begun.load(Ordering::Acquire),
            };
            taken += 1;
            leaving = !stopping && quiet(&mut pace, took);
            let payload_len = payload_len(&req)?;
            let checked = check(&req, &limits);
            let cost = match checked {
                Ok(Command::Read) => req.length as usize,
                _ => payload_len,
            };
            let reserved = Arc::clone(&budget)
                .acquire_many_owned(cost.min(MAX_BUFFERED) as u32)
                .await
                .expect("never closed");
            if let (Ok(Command::Write { fua: false }), Backend::Local(storage), false) =
                (&checked, &backend, stopping)
                && can_splice(&rd, &req)
                && let Some(pipe) = pipe.get()
            {
                let reply = splice_write(&mut rd, pipe, storage, &req, limits.structured).await?;
                replies.send(reply.into(), reserved).await?;
                continue;
            }
            let spare = || buffers.take(payload_len);
            let payload = match (payload_len, &checked, stopping) {
                (0, _, _) => None,
                // Data that goes on to the backend.
                (_, Ok(Command::Write { .. }), false) => {
                    Some(read_write_data(&mut rd, &backend, payload_len, spare).await?)
                }
                // Data only taken in, to find the next request.
                _ => Some(Payload::Bytes(
                    read_payload(&mut rd, spare(), payload_len).await?,
                )),
            };
            let structured = limits.structured;
            if stopping {
                let m = error_reply(
                    structured,
                    req.cookie,
                    errno::ESHUTDOWN,
                    "server shutting down",
                );
                replies.send(m.into(), reserved).await?;
                continue;
            }
            let command = match checked {
                Ok(c) => c,
                Err(refusal) => {
                    let m = error_reply(structured, req.cookie, refusal.errno, refusal.message);
                    replies.send(m.into(), reserved).await?;
                    continue;
                }
            };
            if command == Command::Disc {
                // (Over, wherever it was to go next.)
                leaving = false;
                break;
            }
            let ticket = Arc::clone(&in_flight)
                .acquire_owned()
                .await
                .expect("never closed");
            let (backend, replies, buffers) =
                (backend.clone(), Arc::clone(&replies), buffers.clone());
            let zero_copy = from_cache.allows();
            tokio::spawn(async move {
                let data = Data {
                    payload,
                    buffers: &buffers,
                    zero_copy,
                };
                let reply = execute(command, &req, data, &backend, structured).await;
                // A failed send shows up in the reader too (the client is
                // gone); the request is done either way.
                let _ = replies.send(reply, reserved).await;
                drop(ticket);
            });
        }
        anyhow::Ok(())
    }
    .await;
    // Whatever is in flight finishes and is answered before the close.
    idle(&in_flight).await;
    if leaving && result.is_ok() {
        // (A task that answered may not have let go of the replies yet.)
        let mut replies = replies;
        let replies = loop {
            match Arc::try_unwrap(replies) {
                Ok(r) => break r,
                Err(still) => replies = still,
            }
            tokio::task::yield_now().await;
        };
        let mut out = replies.out.into_inner();
        out.flush().await?;
        let (pending, rd) = unread(rd);
        return Ok(Stay::Moves {
            pending,
            wire: (rd, out.into_inner()),
        });
    }
    let mut out = replies.out.lock().await;
    let flushed = out.flush().await;
    let _ = out.shutdown().await;
    result?;
    flushed?;
    Ok(Stay::Over)
}

/// Tells `pace` (where the connection may move) of requests taken: true
/// when the connection is quiet again, and goes back to its threads.
fn quiet(pace: &mut Option<Pace>, took: Took) -> bool {
    let Some(pace) = pace else {
        return false;
    };
    if !pace.took(Instant::now(), took) {
        return false;
    }
    tracing::debug!("a quiet connection: serving it on its threads");
    true
}

/// The length of `req`'s data; beyond what a connection takes in, an
/// error that ends the connection (the requests after it can no longer
/// be found).
pub(super) fn payload_len(req: &Request) -> anyhow::Result<usize> {
    let len = req.payload_len() as usize;
    if len > MAX_PAYLOAD as usize {
        bail!("a write of {len} bytes: more than the {MAX_PAYLOAD} allowed");
    }
    Ok(len)
}

/// Resolves once no request is in flight.
pub(super) async fn idle(in_flight: &Arc<Semaphore>) {
    let _all = in_flight
        .acquire_many(MAX_IN_FLIGHT as u32)
        .await
        .expect("never closed");
}
