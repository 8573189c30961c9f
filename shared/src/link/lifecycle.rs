//! A link's life from hello to goodbye, sans I/O: which frames the peer
//! may send when, when this side may still send, and whether an end is
//! orderly or a failure. The link's driver feeds it what it heard and
//! what went wrong; senders and receivers ask it what they may do.
//!
//! The rules:
//! - The first frame from the peer is its hello, from the other role, with
//!   exactly the credits a hello carries (its whole ring, no control
//!   returns); a second hello later is a violation.
//! - After the peer's goodbye it sends only standalone credit updates (it
//!   keeps returning credits for what this side still sends): a message,
//!   a chunk or a second goodbye is a violation.
//! - After this side's goodbye nothing is sent but credit updates
//!   ([`LinkError::Finished`] to a sender).
//! - Once both goodbyes are said, the connection closing (and its flushed
//!   work requests) is the orderly end, not a failure; before that, any
//!   failure is the link's error, the first one wins, and it is told to
//!   the peer unless the peer or the connection is what failed.
#![forbid(unsafe_code)]

use crate::transport::TransportError;
use crate::wire::{Body, CreditUpdate, Frame, Hello, Role};

use super::LinkError;

/// What a frame from the peer was (its error frames fail the link at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    Hello,
    Credit,
    Goodbye,
    App,
}

impl Heard {
    /// The kind of `body`; `None` for the peer's error report.
    pub fn of(body: &Body<'_>) -> Option<Heard> {
        match body {
            Body::Hello(_) => Some(Heard::Hello),
            Body::Credit => Some(Heard::Credit),
            Body::Goodbye { .. } => Some(Heard::Goodbye),
            Body::App(_) => Some(Heard::App),
            Body::Error { .. } => None,
        }
    }
}

/// Checks the peer's first frame: a hello from the other role, with the
/// credits a hello carries.
pub fn check_hello(own: Role, frame: &Frame<'_>) -> Result<Hello, LinkError> {
    let Body::Hello(hello) = &frame.body else {
        return Err(LinkError::Protocol(
            "the peer's first message was not a hello".into(),
        ));
    };
    if hello.role != own.peer() {
        return Err(LinkError::Protocol(format!("both ends are {own:?}s")));
    }
    let hello_credit = CreditUpdate {
        grant_limit: hello.ring.slot_count.into(),
        control_return: 0,
    };
    if frame.credit != hello_credit {
        return Err(LinkError::Protocol("hello carries stray credits".into()));
    }
    Ok(*hello)
}

/// One link's state between the hellos and the close.
#[derive(Debug, Default)]
pub struct Lifecycle {
    goodbye_sent: bool,
    peer_done: bool,
    error: Option<LinkError>,
}

impl Lifecycle {
    pub fn new() -> Lifecycle {
        Lifecycle::default()
    }

    /// A frame from the peer after its hello.
    pub fn heard(&mut self, frame: Heard) -> Result<(), LinkError> {
        match frame {
            Heard::Credit => Ok(()),
            _ if self.peer_done => Err(LinkError::Protocol("message after goodbye".into())),
            Heard::Hello => Err(LinkError::Protocol("second hello".into())),
            Heard::App => Ok(()),
            Heard::Goodbye => {
                self.peer_done = true;
                Ok(())
            }
        }
    }

    /// A chunk of the peer's landed.
    pub fn chunk_landed(&self) -> Result<(), LinkError> {
        if self.peer_done {
            return Err(LinkError::Protocol("chunk after goodbye".into()));
        }
        Ok(())
    }

    /// Whether a chunk or message may be sent now.
    pub fn may_send(&self) -> Result<(), LinkError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.goodbye_sent {
            return Err(LinkError::Finished);
        }
        Ok(())
    }

    /// This side's goodbye is posted.
    pub fn said_goodbye(&mut self) {
        self.goodbye_sent = true;
    }

    /// For a receiver with nothing left to take: `None` while more may
    /// come, `Some(Ok)` after the peer's goodbye, else the link's error.
    pub fn receive_end(&self) -> Option<Result<(), LinkError>> {
        if let Some(e) = &self.error {
            return Some(Err(e.clone()));
        }
        self.peer_done.then_some(Ok(()))
    }

    /// For `finish`, after this side's goodbye: `None` while it waits,
    /// `Some(Ok)` once the peer said goodbye and nothing sent is still in
    /// flight, else the link's error.
    pub fn finished(&self, nothing_in_flight: bool) -> Option<Result<(), LinkError>> {
        if let Some(e) = &self.error {
            return Some(Err(e.clone()));
        }
        (self.peer_done && nothing_in_flight).then_some(Ok(()))
    }

    /// Both goodbyes said: the connection may close without a failure.
    pub fn is_orderly(&self) -> bool {
        self.peer_done && self.goodbye_sent
    }

    /// Why the link failed, once it has.
    pub fn error(&self) -> Option<&LinkError> {
        self.error.as_ref()
    }

    pub fn is_failed(&self) -> bool {
        self.error.is_some()
    }

    /// The link fails with `error`. `None` if that changes nothing (it
    /// failed already, or both goodbyes were said); else whether the peer
    /// should be told why (not when the peer or the connection failed).
    pub fn fail(&mut self, error: LinkError) -> Option<bool> {
        if self.error.is_some() || self.is_orderly() {
            return None;
        }
        let tell_peer = !matches!(error, LinkError::Transport(_) | LinkError::Peer { .. });
        self.error = Some(error);
        Some(tell_peer)
    }

    /// The connection reported `error` (its completions end): a failure
    /// unless both goodbyes were said and nothing is in flight.
    pub fn connection_down(&mut self, error: TransportError, nothing_in_flight: bool) {
        let clean = self.is_orderly() && nothing_in_flight;
        if !clean && self.error.is_none() {
            self.error = Some(LinkError::Transport(error));
        }
    }
}

#[cfg(test)]
mod tests;
