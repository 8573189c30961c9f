//! Small requests taken together: clients with many requests in flight
//! send them in bursts, and a burst's reads start with one system call
//! and its answers leave in one write.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::buffers::Buffers;
use super::reply::{Replies, Reply, read_buffer, read_reply, write_failed};
use super::zero_copy::cached_reply;
use crate::nbd::consts::REQUEST_LEN;
use crate::nbd::transmission::{Command, Limits, Request, check, ok_reply};
use crate::storage::{StartedRead, Storage};

/// Reads and writes at most this long are taken in bursts.
pub(super) const BURST_LEN: u32 = 256 * 1024;
/// Requests in one burst at most.
pub(super) const BURST: usize = 64;

/// What a burst leaves to do: reads to start, replies ready to go.
pub(super) struct Burst {
    pub(super) reads: Vec<(Request, OwnedSemaphorePermit)>,
    pub(super) answered: Vec<(Reply, OwnedSemaphorePermit)>,
}

/// Takes the small requests waiting whole in the input, up to the first
/// that is anything else (or that the budget has no room for). Clients
/// with many requests in flight send them in bursts: a burst's reads are
/// started with one system call, its writes that go to the page cache
/// with `pwrite` anyway are done here straight from the input, and the
/// answers leave together.
pub(super) fn take_burst<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    limits: &Limits,
    budget: &Arc<Semaphore>,
    storage: &Arc<Storage>,
    zero_copy: bool,
) -> Burst {
    let mut burst = Burst {
        reads: Vec::new(),
        answered: Vec::new(),
    };
    let input = rd.buffer();
    let mut used = 0;
    while burst.reads.len() + burst.answered.len() < BURST {
        let Some(head) = input.get(used..used + REQUEST_LEN) else {
            break;
        };
        let Ok(req) = Request::decode(head.try_into().expect("a header's length")) else {
            break;
        };
        if req.length > BURST_LEN {
            break;
        }
        match check(&req, limits) {
            Ok(Command::Read) => {
                let Ok(reserved) = Arc::clone(budget).try_acquire_many_owned(req.length) else {
                    break;
                };
                match cached_reply(storage, &req, limits.structured, zero_copy) {
                    Some(reply) => burst.answered.push((reply, reserved)),
                    None => burst.reads.push((req, reserved)),
                }
                used += REQUEST_LEN;
            }
            Ok(Command::Write { fua }) => {
                let data_at = used + REQUEST_LEN;
                let Some(data) = input.get(data_at..data_at + req.length as usize) else {
                    break;
                };
                let Some(written) = storage.write_now(req.offset, data, fua) else {
                    break;
                };
                let reply = match written {
                    Ok(()) => ok_reply(req.cookie),
                    Err(e) => write_failed(limits.structured, req.cookie, &e),
                };
                let nothing = Arc::clone(budget)
                    .try_acquire_many_owned(0)
                    .expect("an empty permit");
                burst.answered.push((reply.into(), nothing));
                used = data_at + req.length as usize;
            }
            _ => break,
        }
    }
    rd.consume(used);
    burst
}

/// Starts a burst's reads together; answers those that finished at once,
/// with the burst's other answers, in one write, and leaves the rest to
/// tasks of their own.
pub(super) async fn serve_burst(
    burst: Burst,
    storage: &Arc<Storage>,
    replies: &Arc<Replies>,
    buffers: &Buffers,
    in_flight: &Arc<Semaphore>,
    limits: &Limits,
) -> std::io::Result<()> {
    let structured = limits.structured;
    let Burst {
        reads: burst,
        mut answered,
    } = burst;
    let reads = burst
        .iter()
        .map(|(req, _)| {
            let buf = read_buffer(buffers, structured, req);
            (req.offset, buf, req.length as usize)
        })
        .collect();
    let started = storage.start_reads(reads).await;
    for ((req, reserved), read) in burst.into_iter().zip(started) {
        match read {
            StartedRead::Done(buf, r) => {
                let reply = read_reply(structured, req.cookie, buf, r, buffers);
                answered.push((reply.into(), reserved));
            }
            StartedRead::Later(read) => {
                let ticket = Arc::clone(in_flight)
                    .acquire_owned()
                    .await
                    .expect("never closed");
                let (replies, buffers) = (Arc::clone(replies), buffers.clone());
                tokio::spawn(async move {
                    let (buf, r) = read.await;
                    let reply = read_reply(structured, req.cookie, buf, r, &buffers);
                    let _ = replies.send(reply.into(), reserved).await;
                    drop(ticket);
                });
            }
        }
    }
    replies.send_all(answered).await
}
