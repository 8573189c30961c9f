//! The forwarding side's table of requests in flight on one link, sans
//! I/O: requests enlisted under fresh ids, the server's read data and
//! answers matched to them, and, when the link fails, every request still
//! waiting handed back to be asked again on the next link.
//!
//! The rules a server must keep:
//! - An answer or read data names a request in flight; each request is
//!   answered once.
//! - Read data comes in order, piece after piece, never beyond what was
//!   asked; a read is answered by its last byte of data, or by a reply
//!   that carries an error (a reply of success before all the data is a
//!   violation, after it there is no request left to name).
//! - Extents answer only a BLOCK_STATUS (here: anything but a read).
//!
//! Every waiter enlisted comes back exactly once: in the outcome of its
//! answer, or from [`Requests::fail_all`] (a refused event leaves the table
//! as it was). `W` is the caller's waiter (a
//! buffer and a reply channel in `rblock connect`, a plain number in the
//! simulations).

use std::collections::HashMap;

use crate::nbd::transmission::Extent;

/// What a request expects back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A read of `len` bytes: data, then nothing more (or an error).
    Read { len: u64 },
    /// A reply (or, for BLOCK_STATUS, extents).
    Reply,
}

/// What the server said in a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// Done; an NBD error number (0: it worked).
    Reply {
        error: u32,
    },
    Extents(Vec<Extent>),
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A read's data is all in (the caller appended it as it came).
    Data,
    /// Done; an NBD error number (0: it worked).
    Done {
        error: u32,
    },
    Extents(Vec<Extent>),
}

/// A server that broke the rules: the link is given up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("an answer to request {0}, which is not in flight")]
    NotInFlight(u64),
    #[error("read data for request {0}, which is no read in flight")]
    NotARead(u64),
    #[error(
        "read data for request {id} at {offset}+{len} does not follow the {got} bytes before it \
         (of {want})"
    )]
    OutOfPlace {
        id: u64,
        offset: u64,
        len: u64,
        got: u64,
        want: u64,
    },
    #[error("request {0}: a read answered done before all its data came")]
    DoneBeforeData(u64),
    #[error("request {0}: extents in answer to a read")]
    ExtentsForRead(u64),
}

#[derive(Debug)]
struct InFlight<W> {
    waiter: W,
    /// A read's length and the data bytes in so far.
    read: Option<(u64, u64)>,
}

/// The requests in flight on one link.
#[derive(Debug)]
pub struct Requests<W> {
    /// None once the link failed: nothing more is enlisted on it.
    live: Option<HashMap<u64, InFlight<W>>>,
    next_id: u64,
}

impl<W> Default for Requests<W> {
    fn default() -> Self {
        Requests {
            live: Some(HashMap::new()),
            next_id: 1,
        }
    }
}

impl<W> Requests<W> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a request under a fresh id; the waiter back if the link
    /// has failed already.
    pub fn enlist(&mut self, expect: Expect, waiter: W) -> Result<u64, W> {
        let Some(live) = self.live.as_mut() else {
            return Err(waiter);
        };
        let id = self.next_id;
        self.next_id += 1;
        let read = match expect {
            Expect::Read { len } => Some((len, 0)),
            Expect::Reply => None,
        };
        live.insert(id, InFlight { waiter, read });
        Ok(id)
    }

    /// Read data for request `id`, bytes `offset..offset + len` of the
    /// read: after the checks, `append` hands the waiter to the caller to
    /// take the bytes. The waiter, once its last byte is in.
    pub fn data(
        &mut self,
        id: u64,
        offset: u64,
        len: u64,
        append: impl FnOnce(&mut W),
    ) -> Result<Option<W>, Violation> {
        let live = self.live.as_mut().ok_or(Violation::NotARead(id))?;
        let Some(InFlight {
            waiter,
            read: Some((want, got)),
        }) = live.get_mut(&id)
        else {
            return Err(Violation::NotARead(id));
        };
        if offset != *got || len > *want - *got {
            return Err(Violation::OutOfPlace {
                id,
                offset,
                len,
                got: *got,
                want: *want,
            });
        }
        append(waiter);
        *got += len;
        if got == want {
            return Ok(live.remove(&id).map(|f| f.waiter));
        }
        Ok(None)
    }

    /// The server answered request `id`: its waiter and how it ended. A
    /// refused answer leaves the request in the table (for `fail_all`).
    pub fn answer(&mut self, id: u64, said: Said) -> Result<(W, Outcome), Violation> {
        let live = self.live.as_mut().ok_or(Violation::NotInFlight(id))?;
        let f = live.get(&id).ok_or(Violation::NotInFlight(id))?;
        let outcome = match (f.read, said) {
            // A read that worked is answered by its data; a reply of
            // success only answers one that asked for no bytes.
            (Some((want, got)), Said::Reply { error: 0 }) => {
                if got != want {
                    return Err(Violation::DoneBeforeData(id));
                }
                Outcome::Data
            }
            (_, Said::Reply { error }) => Outcome::Done { error },
            (Some(_), Said::Extents(_)) => return Err(Violation::ExtentsForRead(id)),
            (None, Said::Extents(e)) => Outcome::Extents(e),
        };
        let f = live.remove(&id).expect("looked up above");
        Ok((f.waiter, outcome))
    }

    /// The link is gone: every request still waiting, to be asked again on
    /// the next link. Nothing more is enlisted here.
    pub fn fail_all(&mut self) -> Vec<W> {
        self.live
            .take()
            .into_iter()
            .flatten()
            .map(|(_, f)| f.waiter)
            .collect()
    }

    /// The waiters of the requests in flight.
    pub fn waiters_mut(&mut self) -> impl Iterator<Item = &mut W> {
        self.live.iter_mut().flatten().map(|(_, f)| &mut f.waiter)
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.live.as_ref().map_or(0, HashMap::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
