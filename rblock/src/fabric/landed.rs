//! A read's data as it came over the fabric, for `rblock connect`: kept in
//! the landing slots it arrived in until the reply has gone out on the NBD
//! socket, so read data is not copied on its way through the gateway (the
//! socket write is its one copy, out of the slot). Sans I/O.
//!
//! Holding a slot holds back the server, and more than that one slot: a
//! link's credits go back in order, so a slot kept stops the credit of
//! every slot after it (`rfabric::credit`). A read that has all its data
//! lets go once its reply is written, whatever the fabric does. A read
//! still waiting for data may be waiting for chunks the server cannot send
//! until its own slots are let go: two reads whose chunks interleave, each
//! holding the other's credits, would wait for ever. So [`Window`] watches
//! how far behind the newest chunk the oldest slot held by a waiting read
//! is; at half the ring, the reads holding such old slots copy their data
//! out and let go ([`keep_moving`]). Reads of one piece, the most common,
//! are whole when they land and never need it.

use rfabric::link::Chunk;

#[derive(Debug)]
enum Piece {
    /// Still in its landing slot.
    Held(Chunk),
    /// Copied out (the slot let go).
    Copied(Vec<u8>),
}

/// A read's data, in order, as pieces that are either still in their
/// landing slots or copied out.
#[derive(Debug, Default)]
pub struct ReadData {
    pieces: Vec<Piece>,
    len: usize,
}

impl ReadData {
    /// Adds the next piece of data, held in its slot.
    pub fn push(&mut self, chunk: Chunk) {
        self.len += chunk.payload().len();
        self.pieces.push(Piece::Held(chunk));
    }

    /// Bytes of data.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The data, piece by piece in order.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        self.pieces.iter().map(|p| match p {
            Piece::Held(c) => c.payload(),
            Piece::Copied(v) => v.as_slice(),
        })
    }

    /// How many of its pieces are still in their slots.
    pub fn held(&self) -> usize {
        self.pieces
            .iter()
            .filter(|p| matches!(p, Piece::Held(_)))
            .count()
    }

    /// The link sequence number of the oldest slot it holds.
    fn oldest_held(&self) -> Option<u64> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Held(c) => Some(c.seq()),
                Piece::Copied(_) => None,
            })
            .min()
    }

    /// Copies everything out into one piece and lets every slot go.
    fn let_go(&mut self) {
        let mut all = Vec::with_capacity(self.len);
        for s in self.slices() {
            all.extend_from_slice(s);
        }
        self.pieces = vec![Piece::Copied(all)];
    }
}

/// One link's landing window as reads still waiting for data hold it.
#[derive(Debug)]
pub struct Window {
    /// Slots of the ring.
    slots: u64,
    /// At or before the oldest slot a waiting read holds (None: none is
    /// held); exact after each [`keep_moving`] pass.
    oldest: Option<u64>,
}

impl Window {
    pub fn new(slots: u32) -> Window {
        Window {
            slots: u64::from(slots.max(1)),
            oldest: None,
        }
    }

    /// A read that is still waiting for more now holds chunk `seq`.
    pub fn held(&mut self, seq: u64) {
        self.oldest = Some(self.oldest.map_or(seq, |o| o.min(seq)));
    }

    /// How far behind the newest chunk a held one may lie.
    fn reach(&self) -> u64 {
        (self.slots / 2).max(1)
    }
}

/// Chunk `seq` has just landed: if a waiting read holds a slot half the
/// ring behind it, every waiting read that holds one that old copies its
/// data out and lets its slots go. `reads` are the reads still waiting.
/// Returns how many let go.
pub fn keep_moving<'a>(
    window: &mut Window,
    seq: u64,
    reads: impl Iterator<Item = &'a mut ReadData>,
) -> usize {
    let reach = window.reach();
    if window.oldest.is_none_or(|o| seq.saturating_sub(o) < reach) {
        return 0;
    }
    let (mut let_go, mut oldest) = (0, None::<u64>);
    for read in reads {
        match read.oldest_held() {
            Some(o) if seq.saturating_sub(o) >= reach => {
                read.let_go();
                let_go += 1;
            }
            Some(o) => oldest = Some(oldest.map_or(o, |m| m.min(o))),
            None => {}
        }
    }
    window.oldest = oldest;
    let_go
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

    use rfabric::link::{ChunkMeta, Incoming, Link, LinkConfig};
    use rfabric::memory::BufferPool;
    use rfabric::transport::memory;
    use rfabric::wire::Role;

    use super::*;

    /// An in-process link whose server side has `slots` landing slots of
    /// `size` bytes: (the server, which receives, and the client).
    async fn links(slots: u32, size: u32) -> (Link, Link) {
        let (a, b) = memory::pair();
        let (s, c) = tokio::join!(
            Link::establish(Arc::new(a), LinkConfig::new(Role::Server, slots, size)),
            Link::establish(Arc::new(b), LinkConfig::new(Role::Client, 0, size)),
        );
        (s.unwrap(), c.unwrap())
    }

    /// The bytes of read `owner` at `at`.
    fn byte(owner: u64, at: usize) -> u8 {
        (owner as usize * 31 + at * 7 % 251) as u8
    }

    /// Sends, from `client`, chunks of `size` bytes for `(owner, piece)`
    /// in the order given.
    async fn send(client: Link, order: Vec<(u64, usize)>, size: usize) {
        let pool = BufferPool::new(8, size).unwrap();
        let region = client.register(pool.memory()).unwrap();
        for (owner, piece) in order {
            let mut b = pool.acquire().await;
            let at = piece * size;
            let bytes: Vec<u8> = (at..at + size).map(|i| byte(owner, i)).collect();
            b.fill_from(&bytes);
            let meta = ChunkMeta {
                owner,
                offset: at as u64,
                ..ChunkMeta::default()
            };
            client.send_chunk(meta, &region, b).await.unwrap();
        }
    }

    #[tokio::test]
    async fn data_held_and_copied_reads_back_in_order() {
        let (server, client) = links(8, 1024).await;
        tokio::spawn(send(client, (0..6).map(|p| (3, p)).collect(), 1024));
        let mut data = ReadData::default();
        for _ in 0..6 {
            let Some(Incoming::Chunk(c)) = server.recv().await.unwrap() else {
                panic!("a chunk was sent")
            };
            data.push(c);
            if data.held() == 3 && data.len() == 3 * 1024 {
                data.let_go();
            }
        }
        assert_eq!((data.len(), data.held()), (6 * 1024, 3));
        let all: Vec<u8> = data.slices().flatten().copied().collect();
        assert!(all == (0..6 * 1024).map(|i| byte(3, i)).collect::<Vec<_>>());
    }

    /// One long read (owner 1) whose pieces come far apart, with short
    /// reads of two pieces each between them, sent back as soon as they
    /// are whole: the long read's first slot would hold back every credit
    /// after it, and its later pieces could never come. The window rule
    /// lets it go in time; without it the sender stalls (checked too).
    #[tokio::test]
    async fn a_read_waiting_for_late_pieces_lets_go_before_the_sender_stalls() {
        let (slots, size) = (4u32, 512usize);
        for rule in [true, false] {
            let (server, client) = links(slots, size as u32).await;
            let mut order = vec![];
            for long in 0..4 {
                order.push((1, long));
                for short in 0..3 {
                    let owner = 10 + long as u64 * 3 + short;
                    order.extend([(owner, 0), (owner, 1)]);
                }
            }
            let count = order.len();
            let sender = tokio::spawn(send(client, order, size));
            let mut window = Window::new(slots);
            let mut reads: HashMap<u64, ReadData> = HashMap::new();
            let mut long_read = None;
            let mut let_go = 0;
            let mut stalled = false;
            for _ in 0..count {
                let Ok(got) = tokio::time::timeout(Duration::from_secs(2), server.recv()).await
                else {
                    stalled = true;
                    break;
                };
                let Some(Incoming::Chunk(c)) = got.unwrap() else {
                    panic!("a chunk was sent")
                };
                let (owner, seq) = (c.header().owner, c.seq());
                let read = reads.entry(owner).or_default();
                read.push(c);
                let whole = read.len() == if owner == 1 { 4 * size } else { 2 * size };
                if whole {
                    // Sent to the client at once: its slots are let go.
                    let done = reads.remove(&owner).unwrap();
                    if owner == 1 {
                        long_read = Some(done.slices().flatten().copied().collect::<Vec<_>>());
                    }
                } else {
                    window.held(seq);
                }
                if rule {
                    let_go += keep_moving(&mut window, seq, reads.values_mut());
                }
            }
            if !rule {
                assert!(stalled, "without the rule the sender stalls");
                sender.abort();
                continue;
            }
            assert!(!stalled, "the sender never stalls");
            sender.await.unwrap();
            assert!(let_go > 0, "the long read let go of its slots");
            let long = long_read.expect("the long read is whole");
            assert!(long == (0..4 * size).map(|i| byte(1, i)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_window_lets_go_only_reads_holding_slots_half_the_ring_behind() {
        let mut w = Window::new(8);
        let mut none: Vec<ReadData> = vec![];
        // Nothing held: nothing to do, whatever the sequence number.
        assert_eq!(keep_moving(&mut w, 100, none.iter_mut()), 0);
        w.held(10);
        w.held(7);
        assert_eq!(w.oldest, Some(7));
        // Under half the ring behind: no pass at all.
        assert_eq!(keep_moving(&mut w, 10, none.iter_mut()), 0);
        assert_eq!(w.oldest, Some(7));
        // At half the ring a pass; the reads that held those slots are
        // gone (answered), so nothing lets go and nothing is held.
        assert_eq!(keep_moving(&mut w, 11, none.iter_mut()), 0);
        assert_eq!(w.oldest, None);
    }
}
