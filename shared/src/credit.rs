//! Credit-based flow control, sans I/O.
//!
//! One link direction has two resources the receiver owns:
//!
//! * **Landing slots.** The receiver registers a ring of `N` slots once. The
//!   sender numbers its chunks with a sequence number `seq` (0, 1, 2, …) and
//!   writes chunk `seq` into slot `seq % N`, announcing it with the 32-bit
//!   note `seq as u32`. It may write only below the receiver's cumulative
//!   *grant limit*; the receiver raises the limit to `base + N`, where `base`
//!   is the first chunk it has not finished consuming. Chunks may be consumed
//!   in any order; a slot is granted again only when every chunk before it is
//!   consumed, so a slot is never written while it is in use and at most `N`
//!   chunks are ever in flight.
//! * **Control receives.** The receiver keeps `depth` receive buffers posted
//!   for control messages (SENDs). The sender starts with `depth` control
//!   credits (one already spent on the hello), spends one per message and gets
//!   them back, as an increment, once the receiver has consumed the message.
//!   Notes of data chunks also consume a receive, but those are covered by
//!   the slot credits: the receiver keeps `N + depth` receives posted.
//!
//! Credit updates ride on every control message. When nothing else is going
//! out, a *standalone* credit message carries them: when half a ring of
//! slots can be granted, when half the control credits are owed, or when the
//! peer has provably run out of control credits and some are owed.
//! Standalone credit messages spend no control credit and are not counted
//! as control messages: they are consumed by the link itself as soon as they
//! arrive, land in [`SPARE_RECEIVES`] extra receives the receiver keeps
//! posted, and, should more be in flight than that, wait in the transport
//! (RC's receiver-not-ready retry on verbs, which the tcp backend mirrors)
//! for the receive that the link reposts at once. Because they cost no
//! credit, an update can always be sent, so a full data window never
//! deadlocks the credit return; and because they earn no credit back, two
//! peers never answer each other's updates with updates, so the exchange
//! cannot loop.
//!
//! The deterministic simulation in `tests/credit_simulation.rs` checks
//! these claims over many seeded schedules.

use thiserror::Error;

use crate::wire::CreditUpdate;

/// Receives a side keeps posted beyond its slots and control depth, for
/// standalone credit messages.
pub const SPARE_RECEIVES: u32 = 8;

/// A peer broke the credit rules.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CreditError {
    #[error("note {note} names no slot the peer holds a credit for (window {base}..{limit})")]
    NoCredit { note: u32, base: u64, limit: u64 },
    #[error("slot for chunk {seq} was written again before it was consumed")]
    SlotBusy { seq: u64 },
    #[error("write to offset {offset} (len {len}) is not the slot of chunk {seq}")]
    WrongPlace { seq: u64, offset: u64, len: u64 },
    #[error("grant limit moved backwards from {old} to {new}")]
    GrantBackwards { old: u64, new: u64 },
    #[error("grant limit {limit} lies beyond what was sent ({sent}) plus the ring ({ring})")]
    GrantTooFar { limit: u64, sent: u64, ring: u32 },
    #[error("{returned} control credits returned but only {outstanding} were outstanding")]
    ControlOverReturn { returned: u32, outstanding: u32 },
    #[error("control message beyond the {depth} credits granted")]
    ControlOverrun { depth: u32 },
}

/// A slot the sender may write now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotTicket {
    pub seq: u64,
    /// `seq % N`: where in the peer's ring to write.
    pub index: u32,
    /// The 32-bit note (immediate) that announces the write.
    pub note: u32,
}

/// The sending half: what this side may still send to its peer.
#[derive(Debug, Clone)]
pub struct Outbound {
    ring: u32,
    next_seq: u64,
    limit: u64,
    control_depth: u32,
    control_available: u32,
}

impl Outbound {
    /// `ring` and `control_depth` come from the peer's hello; the hello this
    /// side sent has already spent one control credit.
    pub fn new(ring: u32, control_depth: u32) -> Self {
        assert!(control_depth > 1, "control depth too small");
        Outbound {
            ring,
            next_seq: 0,
            limit: u64::from(ring),
            control_depth,
            control_available: control_depth - 1,
        }
    }

    /// Takes the next slot if a credit for it is held.
    pub fn try_slot(&mut self) -> Option<SlotTicket> {
        if self.next_seq >= self.limit {
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        Some(SlotTicket {
            seq,
            index: (seq % u64::from(self.ring)) as u32,
            note: seq as u32,
        })
    }

    /// Slot credits held right now.
    pub fn slots_available(&self) -> u64 {
        self.limit - self.next_seq
    }

    /// Chunks sent so far.
    pub fn sent(&self) -> u64 {
        self.next_seq
    }

    /// Spends a control credit, if one is held.
    pub fn try_control(&mut self) -> bool {
        if self.control_available > 0 {
            self.control_available -= 1;
            true
        } else {
            false
        }
    }

    pub fn control_available(&self) -> u32 {
        self.control_available
    }

    /// Applies an update the peer sent. A peer cannot grant more than a
    /// ring beyond what was sent (it cannot have consumed what it never
    /// got), nor return more control credits than are out.
    pub fn on_update(&mut self, update: CreditUpdate) -> Result<(), CreditError> {
        if update.grant_limit < self.limit {
            return Err(CreditError::GrantBackwards {
                old: self.limit,
                new: update.grant_limit,
            });
        }
        if update.grant_limit > self.next_seq + u64::from(self.ring) {
            return Err(CreditError::GrantTooFar {
                limit: update.grant_limit,
                sent: self.next_seq,
                ring: self.ring,
            });
        }
        let outstanding = self.control_depth - self.control_available;
        if update.control_return > outstanding {
            return Err(CreditError::ControlOverReturn {
                returned: update.control_return,
                outstanding,
            });
        }
        self.limit = update.grant_limit;
        self.control_available += update.control_return;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Not granted: the peer may not write it.
    Closed,
    /// Granted and empty: the peer may write it once.
    Open,
    /// Written; its contents are being consumed.
    Landed,
    /// Consumed, waiting for every earlier chunk to be consumed too.
    Consumed,
}

/// A chunk that landed in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landing {
    pub seq: u64,
    pub index: u32,
}

/// The receiving half: this side's landing ring and control receives.
#[derive(Debug, Clone)]
pub struct Inbound {
    slots: Vec<Slot>,
    slot_size: u64,
    base: u64,
    granted: u64,
    control_depth: u32,
    /// Control messages received and not yet consumed.
    control_held: u32,
    /// Control messages consumed and not yet returned.
    control_owed: u32,
}

impl Inbound {
    /// A ring of `slot_count` slots of `slot_size` bytes, all granted by the
    /// hello; `control_depth` receives posted. The peer's hello has been
    /// received and consumed, so one control credit is owed from the start.
    pub fn new(slot_count: u32, slot_size: u32, control_depth: u32) -> Self {
        assert!(control_depth > 1, "control depth too small");
        Inbound {
            slots: vec![Slot::Open; slot_count as usize],
            slot_size: u64::from(slot_size),
            base: 0,
            granted: u64::from(slot_count),
            control_depth,
            control_held: 0,
            control_owed: 1,
        }
    }

    fn ring(&self) -> u64 {
        self.slots.len() as u64
    }

    /// The sequence number a 32-bit note stands for: the first at or after
    /// `base` with those low bits (the window is far below 2^32).
    fn seq_of(&self, note: u32) -> u64 {
        self.base + u64::from(note.wrapping_sub(self.base as u32))
    }

    fn index(&self, seq: u64) -> usize {
        (seq % self.ring()) as usize
    }

    /// Checks a peer's write into the ring before it is used (on tcp: before
    /// a byte of it is placed) and marks the slot landed. `offset` and `len`
    /// are where the write went, relative to the ring's start; verbs
    /// hardware does not report the offset, so there it is `None` and the
    /// slot is taken from the note alone.
    pub fn on_landed(
        &mut self,
        note: u32,
        offset: Option<u64>,
        len: u64,
    ) -> Result<Landing, CreditError> {
        let seq = self.seq_of(note);
        if self.slots.is_empty() || seq >= self.granted {
            return Err(CreditError::NoCredit {
                note,
                base: self.base,
                limit: self.granted,
            });
        }
        let index = self.index(seq);
        let slot_start = index as u64 * self.slot_size;
        if offset.is_some_and(|o| o != slot_start) || len > self.slot_size {
            return Err(CreditError::WrongPlace {
                seq,
                offset: offset.unwrap_or(slot_start),
                len,
            });
        }
        match self.slots[index] {
            Slot::Open => {
                self.slots[index] = Slot::Landed;
                Ok(Landing {
                    seq,
                    index: index as u32,
                })
            }
            _ => Err(CreditError::SlotBusy { seq }),
        }
    }

    /// The sequence number of the landed chunk that `note` announced.
    pub fn landed_seq(&self, note: u32) -> Option<u64> {
        let seq = self.seq_of(note);
        (seq < self.granted && self.slots[self.index(seq)] == Slot::Landed).then_some(seq)
    }

    /// The application is done with chunk `seq`. Panics if it never landed
    /// or was consumed already: that is a local bug, not a peer's doing.
    pub fn on_consumed(&mut self, seq: u64) {
        assert!(
            seq >= self.base && seq < self.granted,
            "chunk {seq} is not in the window"
        );
        let index = self.index(seq);
        assert_eq!(
            self.slots[index],
            Slot::Landed,
            "chunk {seq} consumed twice"
        );
        self.slots[index] = Slot::Consumed;
        while self.base < self.granted {
            let index = self.index(self.base);
            if self.slots[index] != Slot::Consumed {
                break;
            }
            self.slots[index] = Slot::Closed;
            self.base += 1;
        }
    }

    /// A control message (not a standalone credit update) arrived. Fails if
    /// the peer had no credit for it.
    pub fn on_control_received(&mut self) -> Result<(), CreditError> {
        if self.control_held + self.control_owed >= self.control_depth {
            return Err(CreditError::ControlOverrun {
                depth: self.control_depth,
            });
        }
        self.control_held += 1;
        Ok(())
    }

    /// A received control message was consumed; its credit is owed back.
    pub fn on_control_consumed(&mut self) {
        assert!(self.control_held > 0, "no control message held");
        self.control_held -= 1;
        self.control_owed += 1;
    }

    /// The grant limit that could be announced now.
    fn grantable(&self) -> u64 {
        self.base + self.ring()
    }

    /// Whether a standalone credit message is due (see the module docs).
    pub fn wants_standalone(&self) -> bool {
        let grant_batch = (self.ring() / 2).max(1);
        let slots_due = !self.slots.is_empty() && self.grantable() - self.granted >= grant_batch;
        let control_due = self.control_owed >= self.control_depth / 2;
        // What the peer can still spend, at most: messages in flight to us
        // are not counted yet, so this may overstate but never understate.
        let peer_ceiling = self.control_depth - self.control_held - self.control_owed;
        let peer_starved = peer_ceiling == 0 && self.control_owed > 0;
        slots_due || control_due || peer_starved
    }

    /// Takes everything that can be returned now, to put on an outgoing
    /// control message.
    pub fn take_update(&mut self) -> CreditUpdate {
        let limit = self.grantable();
        for seq in self.granted..limit {
            let index = self.index(seq);
            debug_assert_eq!(self.slots[index], Slot::Closed);
            self.slots[index] = Slot::Open;
        }
        self.granted = limit;
        let control_return = std::mem::take(&mut self.control_owed);
        CreditUpdate {
            grant_limit: limit,
            control_return,
        }
    }

    /// First chunk not yet consumed.
    pub fn base(&self) -> u64 {
        self.base
    }
}

#[cfg(test)]
mod tests;
