//! Resume's `Have` exchange, sans I/O: the receiver tells the sender the
//! digests of the whole chunks an interrupted copy left of a file, in
//! batches of [`HAVE_BATCH`]; a shorter batch (perhaps empty) is the last.
//! The sender asks for them by announcing the file and collects them with
//! a [`Haves`] before it reads a chunk of it, so it sends only what differs.

use std::collections::HashMap;

use crate::proto::Msg;

/// Digests per `Have` message; a shorter one is the last for its entry.
pub const HAVE_BATCH: usize = 256;

/// The `Have` messages that tell the sender `digests` of entry `index`.
pub fn have_batches(index: u32, digests: &[[u8; 32]]) -> impl Iterator<Item = Msg> + '_ {
    // Whole batches, then the short last one (empty when the count is a
    // multiple of the batch size).
    let whole = digests.len() / HAVE_BATCH;
    (0..=whole).map(move |b| {
        let first = b * HAVE_BATCH;
        let part = &digests[first..(first + HAVE_BATCH).min(digests.len())];
        Msg::Have {
            index,
            first: first as u64,
            digests: part.to_vec(),
        }
    })
}

/// A receiver whose `Have` messages break the rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HaveViolation {
    #[error("the receiver sent digests for entry {0}, which nobody asked about")]
    NotAsked(u32),
    #[error("the receiver's digests for entry {index} are out of order ({first} after {got})")]
    OutOfOrder { index: u32, first: u64, got: u64 },
    #[error("the receiver sent {count} digests in one batch for entry {index}")]
    Oversized { index: u32, count: usize },
}

/// The sender's collection of the digests it asked for.
#[derive(Debug, Default)]
pub struct Haves {
    asked: HashMap<u32, Vec<[u8; 32]>>,
}

impl Haves {
    pub fn new() -> Self {
        Self::default()
    }

    /// The sender announced file `index` for resume: its digests will come.
    pub fn ask(&mut self, index: u32) {
        self.asked.insert(index, Vec::new());
    }

    /// Entry `index` was answered otherwise: no digests come for it.
    pub fn forget(&mut self, index: u32) {
        self.asked.remove(&index);
    }

    /// Whether entry `index` was asked about and its digests are not all in.
    pub fn is_waiting(&self, index: u32) -> bool {
        self.asked.contains_key(&index)
    }

    /// One `Have` batch came; once the last of an entry's is in, all its
    /// digests (chunk `k`'s at `k`).
    pub fn on_have(
        &mut self,
        index: u32,
        first: u64,
        digests: Vec<[u8; 32]>,
    ) -> Result<Option<Vec<[u8; 32]>>, HaveViolation> {
        let got = self
            .asked
            .get_mut(&index)
            .ok_or(HaveViolation::NotAsked(index))?;
        if first != got.len() as u64 {
            return Err(HaveViolation::OutOfOrder {
                index,
                first,
                got: got.len() as u64,
            });
        }
        if digests.len() > HAVE_BATCH {
            return Err(HaveViolation::Oversized {
                index,
                count: digests.len(),
            });
        }
        let last = digests.len() < HAVE_BATCH;
        got.extend(digests);
        Ok(if last {
            self.asked.remove(&index)
        } else {
            None
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digests(n: usize) -> Vec<[u8; 32]> {
        (0..n).map(|i| [(i % 251) as u8; 32]).collect()
    }

    fn unpack(m: Msg) -> (u32, u64, Vec<[u8; 32]>) {
        match m {
            Msg::Have {
                index,
                first,
                digests,
            } => (index, first, digests),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn batches_are_full_but_the_last_which_may_be_empty() {
        for (n, sizes) in [
            (0, vec![0]),
            (1, vec![1]),
            (HAVE_BATCH - 1, vec![HAVE_BATCH - 1]),
            (HAVE_BATCH, vec![HAVE_BATCH, 0]),
            (2 * HAVE_BATCH + 3, vec![HAVE_BATCH, HAVE_BATCH, 3]),
        ] {
            let d = digests(n);
            let got: Vec<usize> = have_batches(7, &d).map(|m| unpack(m).2.len()).collect();
            assert_eq!(got, sizes, "{n} digests");
        }
    }

    #[test]
    fn collected_batches_give_back_what_was_batched() {
        let d = digests(HAVE_BATCH * 2 + 5);
        let mut h = Haves::new();
        h.ask(3);
        let mut out = None;
        for m in have_batches(3, &d) {
            assert!(out.is_none(), "a batch after the last");
            let (i, first, part) = unpack(m);
            out = h.on_have(i, first, part).unwrap();
        }
        assert_eq!(out, Some(d));
        assert!(!h.is_waiting(3));
    }

    #[test]
    fn unasked_out_of_order_and_oversized_batches_are_refused() {
        let mut h = Haves::new();
        assert_eq!(h.on_have(1, 0, vec![]), Err(HaveViolation::NotAsked(1)));
        h.ask(1);
        assert_eq!(
            h.on_have(1, 5, vec![]),
            Err(HaveViolation::OutOfOrder {
                index: 1,
                first: 5,
                got: 0
            })
        );
        assert_eq!(
            h.on_have(1, 0, digests(HAVE_BATCH + 1)),
            Err(HaveViolation::Oversized {
                index: 1,
                count: HAVE_BATCH + 1
            })
        );
        assert_eq!(h.on_have(1, 0, vec![]), Ok(Some(vec![])));
        assert_eq!(
            h.on_have(1, 0, vec![]),
            Err(HaveViolation::NotAsked(1)),
            "the entry's digests are all in"
        );
    }
}
