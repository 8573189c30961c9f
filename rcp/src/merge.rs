//! A broadcast node's answers merged with those of the nodes after it,
//! sans I/O: what the node before it (in the end, the source) hears about
//! each file is what the chain as a whole needs.
//!
//! With a re-sync or `--resume`, every node answers each file: nothing
//! is needed here (skipped, or failed before its data), all of it, or the
//! digests of the chunks it has. The source sends one stream of data for
//! the whole chain, so a node waits for its own answer and the next
//! node's (which already merges everything after it) and passes on one:
//!
//! | here \ next | nothing | all | digests `b` |
//! |---|---|---|---|
//! | nothing | nothing | all | `b` |
//! | all | all | all | all |
//! | digests `a` | `a` | all | `a` and `b` where they agree |
//!
//! Digests merge chunk by chunk, over the shorter list: where the two
//! agree, the chunk is kept as told; where they differ, it is told as
//! [`DIFFERS`], a digest no chunk has, so the sender sends it. The sender
//! sends chunk `k` whenever its own digest differs from the one told, so
//! every chunk some node lacks is sent, and a node that had it writes the
//! same bytes again. A node that needs nothing lets the data pass (its
//! arrival rules know such a file as passing).
//!
//! A next node that is cut out, or whose answers end, answers nothing
//! from then on ([`Merge::next_gone`]): this node's own answers go on
//! alone.

use std::collections::HashMap;

use crate::resume::{HaveViolation, Haves};

/// A digest no chunk has (a preimage of 32 zero bytes is out of reach for
/// BLAKE3 and SHA-256): a chunk told as this is sent.
pub const DIFFERS: [u8; 32] = [0; 32];

/// A node's answer about one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// Nothing of it is needed (skipped, or failed before its data).
    Nothing,
    /// Send all of it.
    All,
    /// The digests of the chunks there: send the others.
    Have(Vec<[u8; 32]>),
}

impl Said {
    /// One answer for two nodes.
    fn with(self, other: Said) -> Said {
        match (self, other) {
            (Said::Nothing, x) | (x, Said::Nothing) => x,
            (Said::All, _) | (_, Said::All) => Said::All,
            (Said::Have(a), Said::Have(b)) => Said::Have(
                a.iter()
                    .zip(&b)
                    .map(|(x, y)| if x == y { *x } else { DIFFERS })
                    .collect(),
            ),
        }
    }
}

/// The next node's answers that break the rules (it is cut out).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeViolation {
    #[error("the next node answered entry {0} twice")]
    AnsweredTwice(u32),
    #[error("the next node answered {0} entries ahead of this one")]
    TooFarAhead(usize),
    #[error(transparent)]
    Have(#[from] HaveViolation),
}

/// How many answers of the next node may wait for this node's own: the
/// source asks a few hundred files ahead, so far more is a node that
/// answers what nobody asked.
const MAX_AHEAD: usize = 16 * 1024;

/// The answers of this node and the next one, until both are in. Only
/// answers waiting for their other half are kept (no record of files
/// answered: a tree of millions of files must not cost memory per file),
/// so a next node that answers a file again after its merged answer went
/// only adds one that waits for ever, within [`MAX_AHEAD`]; the merged
/// answers never repeat a file.
#[derive(Debug, Default)]
pub struct Merge {
    own: HashMap<u32, Said>,
    next: HashMap<u32, Said>,
    /// The next node's digests, batch by batch.
    next_haves: Haves,
    next_gone: bool,
}

impl Merge {
    pub fn new() -> Self {
        Self::default()
    }

    /// This node's answer about `index`: the merged answer, if the next
    /// node's is in (or it answers no more).
    pub fn own(&mut self, index: u32, said: Said) -> Option<(u32, Said)> {
        if self.next_gone {
            return Some((index, said));
        }
        match self.next.remove(&index) {
            Some(theirs) => Some((index, said.with(theirs))),
            None => {
                self.own.insert(index, said);
                None
            }
        }
    }

    /// The next node's answer about `index`.
    pub fn next(&mut self, index: u32, said: Said) -> Result<Option<(u32, Said)>, MergeViolation> {
        if self.next_gone {
            return Ok(None);
        }
        if self.next.contains_key(&index) {
            return Err(MergeViolation::AnsweredTwice(index));
        }
        self.next_haves.forget(index);
        match self.own.remove(&index) {
            Some(mine) => Ok(Some((index, mine.with(said)))),
            None if self.next.len() >= MAX_AHEAD => Err(MergeViolation::TooFarAhead(MAX_AHEAD)),
            None => {
                self.next.insert(index, said);
                Ok(None)
            }
        }
    }

    /// One batch of the next node's digests about `index`; the last one
    /// of them completes its answer.
    pub fn next_have(
        &mut self,
        index: u32,
        first: u64,
        digests: Vec<[u8; 32]>,
    ) -> Result<Option<(u32, Said)>, MergeViolation> {
        if self.next_gone {
            return Ok(None);
        }
        if first == 0 && !self.next_haves.is_waiting(index) {
            if self.next.contains_key(&index) {
                return Err(MergeViolation::AnsweredTwice(index));
            }
            self.next_haves.ask(index);
        }
        match self.next_haves.on_have(index, first, digests)? {
            Some(all) => self.next(index, Said::Have(all)),
            None => Ok(None),
        }
    }

    /// The next node answers no more: every answer of this node's that
    /// waited goes as it is, and so will those to come.
    pub fn next_gone(&mut self) -> Vec<(u32, Said)> {
        self.next_gone = true;
        self.next.clear();
        self.next_haves = Haves::new();
        let mut out: Vec<(u32, Said)> = self.own.drain().collect();
        out.sort_by_key(|(i, _)| *i);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Msg;
    use crate::resume::{HAVE_BATCH, have_batches};

    fn d(x: u8) -> [u8; 32] {
        [x; 32]
    }

    #[test]
    fn answers_merge_as_the_table_says() {
        let a = Said::Have(vec![d(1), d(2), d(3)]);
        let b = Said::Have(vec![d(1), d(9)]);
        let cases = [
            (Said::Nothing, Said::Nothing, Said::Nothing),
            (Said::Nothing, Said::All, Said::All),
            (Said::Nothing, b.clone(), b.clone()),
            (Said::All, Said::Nothing, Said::All),
            (Said::All, b.clone(), Said::All),
            (a.clone(), Said::Nothing, a.clone()),
            (a.clone(), Said::All, Said::All),
            // Over the shorter list; where they differ, sent.
            (a.clone(), b.clone(), Said::Have(vec![d(1), DIFFERS])),
            (b.clone(), a.clone(), Said::Have(vec![d(1), DIFFERS])),
        ];
        for (mine, theirs, want) in cases {
            // In either order of arrival.
            let mut m = Merge::new();
            assert_eq!(m.own(4, mine.clone()), None);
            assert_eq!(m.next(4, theirs.clone()), Ok(Some((4, want.clone()))));
            let mut m = Merge::new();
            assert_eq!(m.next(4, theirs.clone()), Ok(None));
            assert_eq!(m.own(4, mine.clone()), Some((4, want.clone())));
        }
    }

    #[test]
    fn the_next_nodes_digests_come_in_batches() {
        let theirs: Vec<[u8; 32]> = (0..HAVE_BATCH * 2 + 3)
            .map(|i| d((i % 200) as u8 + 1))
            .collect();
        let mut mine = theirs.clone();
        mine[HAVE_BATCH + 1] = d(250);
        let mut m = Merge::new();
        assert_eq!(m.own(7, Said::Have(mine)), None);
        let mut out = None;
        for msg in have_batches(7, &theirs) {
            let Msg::Have {
                index,
                first,
                digests,
            } = msg
            else {
                unreachable!()
            };
            assert!(out.is_none(), "a batch after the answer");
            out = m.next_have(index, first, digests).unwrap();
        }
        let mut want = theirs.clone();
        want[HAVE_BATCH + 1] = DIFFERS;
        assert_eq!(out, Some((7, Said::Have(want))));
    }

    #[test]
    fn a_next_node_that_answers_twice_or_out_of_order_is_refused() {
        let mut m = Merge::new();
        assert_eq!(m.next(1, Said::All), Ok(None));
        assert_eq!(
            m.next(1, Said::Nothing),
            Err(MergeViolation::AnsweredTwice(1))
        );
        assert_eq!(
            m.next_have(1, 0, vec![]),
            Err(MergeViolation::AnsweredTwice(1))
        );
        assert_eq!(
            m.next_have(2, 5, vec![d(1)]),
            Err(MergeViolation::Have(HaveViolation::NotAsked(2)))
        );
        // Once merged, an answer again is held, never merged a second time.
        assert_eq!(m.own(1, Said::Nothing), Some((1, Said::All)));
        assert_eq!(m.next(1, Said::Nothing), Ok(None));
        assert_eq!(m.next_gone(), vec![]);
    }

    #[test]
    fn a_next_node_far_ahead_is_refused() {
        let mut m = Merge::new();
        for i in 0..MAX_AHEAD as u32 {
            assert_eq!(m.next(i, Said::Nothing), Ok(None));
        }
        assert_eq!(
            m.next(MAX_AHEAD as u32, Said::Nothing),
            Err(MergeViolation::TooFarAhead(MAX_AHEAD))
        );
    }

    #[test]
    fn once_the_next_node_is_gone_own_answers_go_alone() {
        let mut m = Merge::new();
        assert_eq!(m.own(3, Said::Nothing), None);
        assert_eq!(m.own(1, Said::Have(vec![d(1)])), None);
        assert_eq!(m.next(2, Said::All), Ok(None));
        assert_eq!(m.next_have(5, 0, vec![d(1); HAVE_BATCH]), Ok(None));
        // Waiting own answers go in order; the next node's are dropped.
        assert_eq!(
            m.next_gone(),
            vec![(1, Said::Have(vec![d(1)])), (3, Said::Nothing)]
        );
        assert_eq!(m.own(2, Said::Nothing), Some((2, Said::Nothing)));
        assert_eq!(m.own(5, Said::All), Some((5, Said::All)));
        // Whatever it still says is not heard.
        assert_eq!(m.next(6, Said::All), Ok(None));
        assert_eq!(m.own(6, Said::Nothing), Some((6, Said::Nothing)));
    }
}
