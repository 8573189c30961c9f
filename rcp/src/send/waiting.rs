//! The files a sender announced ahead of their data, waiting for the
//! receiver's answers, sans I/O.
//!
//! Files are asked about in the order of their indices (the walk numbers
//! entries in one rising sequence) and their data is planned in that
//! order; answers come in any order, by index, several to a message. So
//! the files waiting are a queue ordered by index: an answer finds its
//! file by binary search, and the feeder takes the queue's front once it
//! is answered. Each file cost a hash-map entry and a one-shot channel
//! before (an allocation, a hash and a wake-up a file, of which an
//! unchanged tree has a hundred thousand); the queue wakes the feeder once
//! per message of answers.

use std::collections::VecDeque;

use super::Wanted;
use crate::resume::{self, HaveViolation};

/// The files announced and not yet taken by the feeder.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    /// The receiver may answer with the digests of what it has
    /// (`--resume`, `-c`): only then are `Have` messages expected.
    digests: bool,
    haves: resume::Haves,
    /// Files asked about, by rising index, with their answers once given.
    asked: VecDeque<(u32, Option<Wanted>)>,
    /// No answer comes any more (the receiver said goodbye or gave up):
    /// every file waiting, and every file asked about from now on, is
    /// answered with nothing at once, not never.
    closed: bool,
}

/// An answer that names no file waiting for one.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct NotWaiting;

impl Waiting {
    /// `digests`: answers may be digests of what the receiver has.
    pub(super) fn new(digests: bool) -> Waiting {
        Waiting {
            digests,
            ..Waiting::default()
        }
    }

    /// File `index` is announced: its answer will come. Indices rise
    /// from one call to the next.
    pub(super) fn ask(&mut self, index: u32) {
        if self.closed {
            return;
        }
        debug_assert!(self.asked.back().is_none_or(|(last, _)| *last < index));
        if self.digests {
            self.haves.ask(index);
        }
        self.asked.push_back((index, None));
    }

    /// The answer to file `index`; an error if no file of that index
    /// waits for one (never asked, or answered already).
    pub(super) fn answer(&mut self, index: u32, wanted: Wanted) -> Result<(), NotWaiting> {
        if self.digests {
            self.haves.forget(index);
        }
        match self.asked.binary_search_by_key(&index, |(i, _)| *i) {
            Ok(at) if self.asked[at].1.is_none() => {
                self.asked[at].1 = Some(wanted);
                Ok(())
            }
            _ => Err(NotWaiting),
        }
    }

    /// One `Have` message: once the last of a file's digests is in, the
    /// file is answered with them.
    pub(super) fn on_have(
        &mut self,
        index: u32,
        first: u64,
        digests: Vec<[u8; 32]>,
    ) -> Result<(), HaveViolation> {
        if !self.digests {
            return Err(HaveViolation::NotAsked(index));
        }
        if let Some(all) = self.haves.on_have(index, first, digests)? {
            // (Asked, so waiting: its digests were still coming.)
            let _ = self.answer(index, Wanted::Except(all));
        }
        Ok(())
    }

    /// The answer to the first file still waiting, `index`, once it has
    /// come (after the receiver stopped: nothing).
    pub(super) fn take(&mut self, index: u32) -> Option<Wanted> {
        if self.closed {
            return Some(Wanted::Nothing);
        }
        match self.asked.front() {
            Some((first, Some(_))) if *first == index => {
                self.asked.pop_front().and_then(|(_, wanted)| wanted)
            }
            Some((first, _)) if *first == index => None,
            // Taken out of order or never asked: a fault of this side;
            // nothing is sent for it rather than a wait forever.
            _ => {
                debug_assert!(false, "file {index} taken out of order");
                Some(Wanted::Nothing)
            }
        }
    }

    /// No answer comes any more.
    pub(super) fn close(&mut self) {
        self.asked.clear();
        self.closed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nothing(w: Option<Wanted>) -> bool {
        matches!(w, Some(Wanted::Nothing))
    }

    #[test]
    fn answers_in_any_order_are_taken_in_the_order_asked() {
        let mut w = Waiting::new(false);
        for index in [3, 5, 9, 10] {
            w.ask(index);
        }
        assert_eq!(w.answer(9, Wanted::All), Ok(()));
        assert_eq!(w.answer(5, Wanted::Nothing), Ok(()));
        // The first asked is not answered yet: nothing to take.
        assert!(w.take(3).is_none());
        assert_eq!(w.answer(3, Wanted::Nothing), Ok(()));
        assert!(nothing(w.take(3)));
        assert!(nothing(w.take(5)));
        assert!(matches!(w.take(9), Some(Wanted::All)));
        assert!(w.take(10).is_none());
    }

    #[test]
    fn an_answer_to_a_file_not_waiting_is_refused() {
        let mut w = Waiting::new(false);
        w.ask(2);
        w.ask(4);
        // Never asked (a directory's index, or made up).
        assert_eq!(w.answer(3, Wanted::All), Err(NotWaiting));
        assert_eq!(w.answer(7, Wanted::All), Err(NotWaiting));
        // Answered twice.
        assert_eq!(w.answer(4, Wanted::All), Ok(()));
        assert_eq!(w.answer(4, Wanted::Nothing), Err(NotWaiting));
        // Taken already.
        assert_eq!(w.answer(2, Wanted::All), Ok(()));
        assert!(matches!(w.take(2), Some(Wanted::All)));
        assert_eq!(w.answer(2, Wanted::All), Err(NotWaiting));
    }

    #[test]
    fn digests_are_answers_only_where_they_were_asked_for() {
        let mut w = Waiting::new(false);
        w.ask(1);
        assert_eq!(
            w.on_have(1, 0, vec![[7; 32]]),
            Err(HaveViolation::NotAsked(1))
        );
        let mut w = Waiting::new(true);
        w.ask(1);
        w.ask(2);
        // One short batch is the last: file 1 is answered with it.
        assert_eq!(w.on_have(1, 0, vec![[7; 32]]), Ok(()));
        assert!(matches!(w.take(1), Some(Wanted::Except(d)) if d == vec![[7; 32]]));
        // A file answered otherwise gets no digests after.
        assert_eq!(w.answer(2, Wanted::All), Ok(()));
        assert_eq!(
            w.on_have(2, 0, vec![[7; 32]]),
            Err(HaveViolation::NotAsked(2))
        );
    }

    #[test]
    fn once_closed_every_file_gets_nothing_at_once() {
        let mut w = Waiting::new(true);
        w.ask(1);
        w.ask(2);
        w.close();
        assert!(nothing(w.take(1)));
        w.ask(3);
        assert!(nothing(w.take(3)));
        assert_eq!(w.answer(2, Wanted::All), Err(NotWaiting));
    }

    /// A seeded run: files asked in rising order, answered in a shuffled
    /// order in batches, taken in order as their answers come: every file
    /// gets exactly its own answer.
    #[test]
    fn a_seeded_run_gives_every_file_its_own_answer() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut w = Waiting::new(false);
        let mut index = 0u32;
        let mut unanswered: Vec<u32> = Vec::new();
        let mut in_order: VecDeque<u32> = VecDeque::new();
        let mut taken = 0;
        for _ in 0..20_000 {
            match next(3) {
                0 if in_order.len() < 64 => {
                    index += 1 + next(3) as u32;
                    w.ask(index);
                    unanswered.push(index);
                    in_order.push_back(index);
                }
                1 if !unanswered.is_empty() => {
                    let i = unanswered.swap_remove(next(unanswered.len() as u64) as usize);
                    // Odd files are wanted, even ones are there.
                    let wanted = if i % 2 == 1 {
                        Wanted::All
                    } else {
                        Wanted::Nothing
                    };
                    assert_eq!(w.answer(i, wanted), Ok(()));
                }
                _ => {
                    if let Some(&first) = in_order.front() {
                        match w.take(first) {
                            Some(Wanted::All) => assert_eq!(first % 2, 1),
                            Some(Wanted::Nothing) => assert_eq!(first % 2, 0),
                            Some(Wanted::Except(_)) => panic!("no digests were asked for"),
                            None => {
                                assert!(unanswered.contains(&first));
                                continue;
                            }
                        }
                        in_order.pop_front();
                        taken += 1;
                    }
                }
            }
        }
        assert!(taken > 1000, "{taken}");
    }
}
