//! The receiver's answers about entries, sent by a task of their own:
//! answers of one kind that pile up while it sends go out together
//! (`EntriesWanted`, `EntriesSkipped`, `EntriesOk`), the wanted first:
//! the sender waits for those.
//!
//! Answers wait in one shared list, and the task is woken only when the
//! list was empty: an unchanged tree gives an answer an entry, and a
//! channel cost an allocation's share, atomic operations and a wake-up
//! each.

use std::sync::{Arc, Mutex};

use rfabric::link::Link;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{Itemize, print_itemized};
use crate::merge::Said;
use crate::proto::{MAX_OKS, Msg, Verdict as EntryVerdict};
use crate::resume::have_batches;

/// What the receiver says of an entry.
#[derive(Debug)]
enum Answer {
    /// In place, or why not.
    Verdict(EntryVerdict),
    /// Re-sync: send all of it.
    Wanted,
    /// Re-sync: it is there already.
    Skipped,
    /// Resume or `-c`: the digests of the chunks there.
    Have(Vec<[u8; 32]>),
    /// `--delete`: this path is gone from the destination.
    Removed(Vec<u8>),
    /// `-i`: what changes at this path.
    Itemized([u8; 11], Vec<u8>),
}

/// Where answers wait for the task that sends them.
#[derive(Debug, Default)]
struct Queue {
    pending: Mutex<Pending>,
    /// Answers came to an empty list, or the last `Answers` went.
    more: Notify,
}

#[derive(Debug, Default)]
struct Pending {
    answers: Vec<(u32, Answer)>,
    /// Every `Answers` is gone: the task sends what is left and ends.
    said_all: bool,
    /// The task ended (its link failed): answers are dropped, not kept.
    gone: bool,
}

/// A handle to say answers with (cloned for the tasks that finish files).
#[derive(Debug, Clone)]
pub(super) struct Answers(Arc<Speaker>);

/// What every `Answers` shares: dropped with the last of them, it tells
/// the task.
#[derive(Debug)]
struct Speaker(Arc<Queue>);

impl Drop for Speaker {
    fn drop(&mut self) {
        self.0.pending.lock().expect("answers lock").said_all = true;
        self.0.more.notify_one();
    }
}

/// Answers of one kind gathered for one message each.
#[derive(Default)]
struct Gathered {
    oks: Vec<u32>,
    wanted: Vec<u32>,
    skipped: Vec<u32>,
}

impl Gathered {
    fn full(&self) -> bool {
        [&self.oks, &self.wanted, &self.skipped]
            .iter()
            .any(|v| v.len() == MAX_OKS)
    }

    /// Sends what is gathered, the wanted first, and empties.
    async fn send(&mut self, link: &Link) -> anyhow::Result<()> {
        let batches = [
            (!self.wanted.is_empty()).then(|| Msg::EntriesWanted {
                indices: std::mem::take(&mut self.wanted),
            }),
            (!self.skipped.is_empty()).then(|| Msg::EntriesSkipped {
                indices: std::mem::take(&mut self.skipped),
            }),
            (!self.oks.is_empty()).then(|| Msg::EntriesOk {
                indices: std::mem::take(&mut self.oks),
            }),
        ];
        for m in batches.into_iter().flatten() {
            link.send_message(&m.encode()).await?;
        }
        Ok(())
    }
}

impl Answers {
    pub(super) fn start(link: Link, itemize: Itemize) -> (Answers, JoinHandle<anyhow::Result<()>>) {
        let queue = Arc::new(Queue::default());
        let answers = Answers(Arc::new(Speaker(Arc::clone(&queue))));
        let task = tokio::spawn(async move {
            let sent = send_answers(&queue, &link, itemize).await;
            // (Whatever ended it: nothing takes answers any more.)
            let mut pending = queue.pending.lock().expect("answers lock");
            pending.gone = true;
            pending.answers = Vec::new();
            sent
        });
        (answers, task)
    }

    pub(super) fn send(&self, index: u32, result: EntryVerdict) {
        self.say(index, Answer::Verdict(result));
    }

    /// What is needed of file `index`.
    pub(super) fn said(&self, index: u32, said: Said) {
        self.say(
            index,
            match said {
                Said::Nothing => Answer::Skipped,
                Said::All => Answer::Wanted,
                Said::Have(digests) => Answer::Have(digests),
            },
        );
    }

    pub(super) fn skipped(&self, index: u32) {
        self.say(index, Answer::Skipped);
    }

    pub(super) fn removed(&self, path: Vec<u8>) {
        self.say(0, Answer::Removed(path));
    }

    pub(super) fn itemized(&self, code: [u8; 11], path: Vec<u8>) {
        self.say(0, Answer::Itemized(code, path));
    }

    fn say(&self, index: u32, answer: Answer) {
        let first = {
            let mut pending = self.0.0.pending.lock().expect("answers lock");
            if pending.gone {
                return;
            }
            pending.answers.push((index, answer));
            pending.answers.len() == 1
        };
        if first {
            self.0.0.more.notify_one();
        }
    }
}

/// Sends the answers said to `queue` until every `Answers` is gone.
async fn send_answers(queue: &Queue, link: &Link, itemize: Itemize) -> anyhow::Result<()> {
    let mut gathered = Gathered::default();
    loop {
        let (said, open) = {
            let mut pending = queue.pending.lock().expect("answers lock");
            (std::mem::take(&mut pending.answers), !pending.said_all)
        };
        if said.is_empty() {
            if !open {
                break;
            }
            queue.more.notified().await;
            // Let the answers behind it add theirs: one turn of the
            // runtime, not a timer. (Held 1 ms, answers went by the
            // hundred, but every round trip of the sender's window waited
            // for the timer: a 100,000-entry unchanged local re-sync took
            // 1.6x the time it takes now.)
            tokio::task::yield_now().await;
            continue;
        }
        for (index, answer) in said {
            match answer {
                Answer::Verdict(Ok(())) => gathered.oks.push(index),
                Answer::Wanted => gathered.wanted.push(index),
                Answer::Skipped => gathered.skipped.push(index),
                Answer::Have(digests) => {
                    for m in have_batches(index, &digests) {
                        link.send_message(&m.encode()).await?;
                    }
                }
                Answer::Removed(path) => {
                    link.send_message(&Msg::Removed { path }.encode()).await?;
                }
                Answer::Itemized(code, path) => match itemize {
                    Itemize::Print(lines) => print_itemized(&code, &path, lines),
                    _ => {
                        let m = Msg::Itemized { code, path };
                        link.send_message(&m.encode()).await?;
                    }
                },
                Answer::Verdict(Err((kind, reason))) => {
                    let m = Msg::EntryFailed {
                        index,
                        kind,
                        reason,
                    };
                    link.send_message(&m.encode()).await?;
                }
            }
            if gathered.full() {
                gathered.send(link).await?;
            }
        }
        gathered.send(link).await?;
    }
    Ok(())
}
