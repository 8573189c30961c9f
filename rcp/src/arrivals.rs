//! The receiver's rules for what a sender may send, as a machine without
//! I/O: events in (an entry announced, a chunk landed, a file's end, the
//! sender's `Done`), actions out (land this chunk as chunk `k` of that
//! file, finish that file), or a [`Violation`] that ends the copy.
//!
//! The rules:
//! - Entries are announced on the message stream with growing indices.
//! - A chunk names its entry. Data streams are not ordered against the
//!   message stream, so a chunk may overtake its entry's announcement: it
//!   is held (it keeps its landing slot, so the credit window bounds what
//!   is held) until the entry is announced, and then landed. A chunk for an
//!   entry announced already that is no open file is stray.
//! - A chunk lies inside its file, on a chunk boundary, at most one chunk
//!   long.
//! - A file ends once (`EntryEnd`, or `Whole` at its announcement) with the
//!   count of chunks sent; it is finished when that many have landed, and
//!   more than that is a violation.
//! - Or the sender abandons it (`Abandoned`: the source could not be
//!   read), with the count of chunks it sent before: once that many have
//!   landed it is dropped, not finished (a passing file without a word).
//!   An entry that holds no data (a directory that could not be listed)
//!   may be abandoned only right after its announcement, and once: it is
//!   dropped at once.
//! - Nothing but data for open files follows `Done`; the copy is over when
//!   `Done` came, every file is finished and no held chunk is left.
//! - A broadcast node may let a file pass: one it needs nothing of while a
//!   node after it does ([`Shape::Passing`]). Its chunks are held to the
//!   same rules and dropped once forwarded; if no node needed any of it,
//!   no data and no end come, and `Done` closes it.
//!
//! `C` is whatever the caller carries with a chunk (a landed [`Chunk`] in
//! rcp's receiver, a plain number in the simulations): the machine holds
//! early ones and hands each back in the [`Action::Land`] that places it.
//!
//! [`Chunk`]: rfabric::link::Chunk

use std::collections::{BTreeMap, HashMap};

/// Where a chunk says it belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The entry index the chunk header carries (a 64-bit field: an index
    /// beyond 32 bits is a violation).
    pub entry: u64,
    pub offset: u64,
    pub len: u32,
}

/// What an announcement says of its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A file of `size` bytes cut into `chunk`-byte chunks; `sent` is the
    /// count of chunks the sender sends when the announcement also ends
    /// the file (`Whole`).
    File {
        size: u64,
        chunk: u32,
        sent: Option<u64>,
    },
    /// A file this node needs nothing of, whose data may still pass
    /// through to the nodes after it (a broadcast): its chunks are
    /// checked and counted like a file's, and dropped.
    Passing { size: u64, chunk: u32 },
    /// A directory or symlink: no data.
    Other,
}

/// What the caller does next, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Action<C> {
    /// Write `chunk` as chunk `k` of file `entry` (hash, check, write).
    Land { entry: u32, k: u64, chunk: C },
    /// Every chunk the sender sent of file `entry` has landed: once the
    /// writes are done, check the file's digest and commit it.
    Finish { entry: u32 },
    /// The sender abandoned `entry` and every chunk it sent of it has
    /// landed: once the writes are done, throw away what arrived (nothing
    /// of it goes in place) and say why it failed.
    Drop { entry: u32 },
}

/// A sender that broke the rules: the copy cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("entry {index} announced out of order (after entry {after})")]
    OutOfOrder { index: u32, after: u32 },
    #[error("data for unknown entry {0}")]
    StrayData(u64),
    #[error("chunk at offset {offset} of entry {entry} lies outside the file")]
    Outside { entry: u32, offset: u64 },
    #[error("end of unknown entry {0}")]
    EndOfUnknown(u32),
    #[error("entry {0} ended twice")]
    EndedTwice(u32),
    #[error("entry {entry}: more chunks arrived than the {sent} sent")]
    TooManyChunks { entry: u32, sent: u64 },
    #[error("{what} after the sender's Done")]
    AfterDone { what: &'static str },
    #[error("entry {0}: data passing through without its end before the sender's Done")]
    PassingUnended(u32),
}

#[derive(Debug)]
struct OpenFile {
    size: u64,
    chunk: u32,
    landed: u64,
    sent: Option<u64>,
    /// Passing through: chunks are dropped, and nothing is finished.
    passing: bool,
    /// The sender could not read it: dropped, not finished, once its
    /// chunks sent have landed.
    abandoned: bool,
}

impl OpenFile {
    /// The chunk number of `p` within this file, if it lies inside.
    fn place(&self, entry: u32, p: &Place) -> Result<u64, Violation> {
        let c = u64::from(self.chunk);
        let end = p.offset.checked_add(u64::from(p.len));
        if c == 0
            || p.offset % c != 0
            || end.is_none_or(|end| end > self.size)
            || u64::from(p.len) > c
        {
            return Err(Violation::Outside {
                entry,
                offset: p.offset,
            });
        }
        Ok(p.offset / c)
    }

    /// `Some(true)` once every chunk sent has landed; a violation if more
    /// did.
    fn complete(&self, entry: u32) -> Result<bool, Violation> {
        match self.sent {
            None => Ok(false),
            Some(sent) if self.landed > sent => Err(Violation::TooManyChunks { entry, sent }),
            Some(sent) => Ok(self.landed == sent),
        }
    }
}

/// The receiver's view of a copy in progress.
#[derive(Debug)]
pub struct Arrivals<C> {
    /// The highest index announced.
    announced: Option<u32>,
    open: HashMap<u32, OpenFile>,
    /// Chunks that overtook their entry's announcement, by entry.
    early: BTreeMap<u64, Vec<(Place, C)>>,
    done: bool,
    /// The last entry abandoned with nothing open (a directory).
    dropped: Option<u32>,
    /// The entry announced last holds no data (a directory, a symlink): it
    /// may be abandoned with nothing open. (A file announced whole may
    /// have finished at once: nothing is open of it either, and it may
    /// not.)
    last_holds_no_data: bool,
}

impl<C> Default for Arrivals<C> {
    fn default() -> Self {
        Arrivals {
            announced: None,
            open: HashMap::new(),
            early: BTreeMap::new(),
            done: false,
            dropped: None,
            last_holds_no_data: false,
        }
    }
}

impl<C> Arrivals<C> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Entry `index` was announced. For a file, the caller creates it
    /// before carrying out the actions (the chunks that came early, and
    /// its finish if it is already complete).
    pub fn announce(&mut self, index: u32, shape: Shape) -> Result<Vec<Action<C>>, Violation> {
        if self.done {
            return Err(Violation::AfterDone { what: "an entry" });
        }
        if let Some(after) = self.announced.filter(|&a| index <= a) {
            return Err(Violation::OutOfOrder { index, after });
        }
        self.announced = Some(index);
        self.last_holds_no_data = shape == Shape::Other;
        let mut actions = Vec::new();
        let file = match shape {
            Shape::File { size, chunk, sent } => Some((size, chunk, sent, false)),
            Shape::Passing { size, chunk } => Some((size, chunk, None, true)),
            Shape::Other => None,
        };
        if let Some((size, chunk, sent, passing)) = file {
            self.open.insert(
                index,
                OpenFile {
                    size,
                    chunk,
                    landed: 0,
                    sent,
                    passing,
                    abandoned: false,
                },
            );
            for (place, c) in self.early.remove(&u64::from(index)).unwrap_or_default() {
                actions.extend(self.land(index, place, c)?);
            }
            if self.open.contains_key(&index) {
                actions.extend(self.finish_if_complete(index)?);
            }
        }
        // Whatever is still held for an entry announced by now belongs to
        // nothing.
        if let Some((&stray, _)) = self.early.range(..=u64::from(index)).next() {
            return Err(Violation::StrayData(stray));
        }
        Ok(actions)
    }

    /// A chunk landed, saying it belongs at `place`.
    pub fn chunk(&mut self, place: Place, c: C) -> Result<Vec<Action<C>>, Violation> {
        let Ok(entry) = u32::try_from(place.entry) else {
            return Err(Violation::StrayData(place.entry));
        };
        if self.announced.is_none_or(|a| entry > a) {
            if self.done {
                return Err(Violation::AfterDone {
                    what: "data for an entry never announced",
                });
            }
            self.early.entry(place.entry).or_default().push((place, c));
            return Ok(Vec::new());
        }
        self.land(entry, place, c)
    }

    /// The sender ended file `index` after sending `sent` chunks of it.
    pub fn end(&mut self, index: u32, sent: u64) -> Result<Option<Action<C>>, Violation> {
        if self.done {
            return Err(Violation::AfterDone {
                what: "an entry's end",
            });
        }
        let file = self
            .open
            .get_mut(&index)
            .ok_or(Violation::EndOfUnknown(index))?;
        if file.sent.is_some() {
            return Err(Violation::EndedTwice(index));
        }
        file.sent = Some(sent);
        self.finish_if_complete(index)
    }

    /// The sender abandoned entry `index` (it could not be read) after
    /// sending `sent` chunks of it: a file is dropped once they have
    /// landed; anything else announced has nothing open and is dropped
    /// now.
    pub fn abandon(&mut self, index: u32, sent: u64) -> Result<Option<Action<C>>, Violation> {
        if self.done {
            return Err(Violation::AfterDone {
                what: "an entry's end",
            });
        }
        let Some(file) = self.open.get_mut(&index) else {
            // (Nothing open: only the entry announced last, one that
            // holds no data, once.)
            if self.announced != Some(index) || !self.last_holds_no_data {
                return Err(Violation::EndOfUnknown(index));
            }
            if self.dropped == Some(index) {
                return Err(Violation::EndedTwice(index));
            }
            if sent != 0 {
                return Err(Violation::TooManyChunks {
                    entry: index,
                    sent: 0,
                });
            }
            self.dropped = Some(index);
            return Ok(Some(Action::Drop { entry: index }));
        };
        if file.sent.is_some() {
            return Err(Violation::EndedTwice(index));
        }
        file.sent = Some(sent);
        file.abandoned = true;
        self.finish_if_complete(index)
    }

    /// The sender's `Done`: it announces nothing more.
    pub fn done(&mut self) -> Result<(), Violation> {
        if self.done {
            return Err(Violation::AfterDone {
                what: "a second Done",
            });
        }
        self.done = true;
        // A passing file no node wanted anything of gets no end.
        let mut unended = Vec::new();
        self.open.retain(|&index, f| {
            let closed = f.passing && f.sent.is_none();
            if closed && f.landed > 0 {
                unended.push(index);
            }
            !closed
        });
        if let Some(&index) = unended.iter().min() {
            return Err(Violation::PassingUnended(index));
        }
        self.check_held()
    }

    /// Whether the copy is over: `Done` came and every file is finished.
    pub fn is_over(&self) -> bool {
        self.done && self.open.is_empty()
    }

    /// Files announced and not finished (for the caller's clean-up).
    pub fn unfinished(&self) -> impl Iterator<Item = u32> + '_ {
        self.open.keys().copied()
    }

    /// After `Done` nothing more is announced: a held chunk is stray.
    fn check_held(&self) -> Result<(), Violation> {
        match self.early.keys().next() {
            Some(&stray) if self.done => Err(Violation::StrayData(stray)),
            _ => Ok(()),
        }
    }

    fn land(&mut self, entry: u32, place: Place, c: C) -> Result<Vec<Action<C>>, Violation> {
        // (A file finishes with its last chunk: one more is stray.)
        let Some(file) = self.open.get_mut(&entry) else {
            return Err(Violation::StrayData(entry.into()));
        };
        let k = file.place(entry, &place)?;
        file.landed += 1;
        // (A passing chunk was forwarded already: dropping it frees its
        // slot.)
        let mut actions = Vec::new();
        if !file.passing {
            actions.push(Action::Land { entry, k, chunk: c });
        }
        actions.extend(self.finish_if_complete(entry)?);
        Ok(actions)
    }

    fn finish_if_complete(&mut self, entry: u32) -> Result<Option<Action<C>>, Violation> {
        let file = self.open.get(&entry).expect("an open file");
        if file.complete(entry)? {
            let (passing, abandoned) = (file.passing, file.abandoned);
            self.open.remove(&entry);
            // (A file passing through that the sender abandoned is
            // dropped without a word: this node has it already, and the
            // nodes that wanted it say it failed.)
            return Ok(match (abandoned, passing) {
                (_, true) => None,
                (true, false) => Some(Action::Drop { entry }),
                (false, false) => Some(Action::Finish { entry }),
            });
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests;
