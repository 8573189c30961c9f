//! Seeded simulations of a link's life from hello to goodbye
//! ([`rfabric::link::lifecycle`]), two ends over one connection.
//!
//! Each end sends a random number of messages and chunks (only while its
//! lifecycle lets it), sprinkles standalone credit updates (also after its
//! goodbye, as the driver does), says goodbye when it has sent everything,
//! and closes the connection once `finished` says so. Each direction is
//! one FIFO channel with random latency; a send is in flight until it is
//! delivered; closing the connection drops (flushes) whatever is still in
//! flight either way, and both ends then see the connection go down.
//!
//! An honest schedule must end with both ends finished without error,
//! every message and chunk delivered, and nothing but credit updates
//! flushed. With one planted fault (a message, chunk or second goodbye
//! after an end's goodbye, a second hello, a local abort, the connection
//! failing mid-way) the other end must fail, unless the bad frame was
//! flushed unseen (then nothing it could harm remains), and a connection
//! failure must fail exactly the ends whose goodbyes were not both said.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rfabric::link::LinkError;
use rfabric::link::lifecycle::{Heard, Lifecycle};
use rfabric::transport::TransportError;

const SCHEDULES: u64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Wire {
    App,
    Chunk,
    Credit,
    Goodbye,
    Hello,
    /// The error frame a failing end tells its peer.
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Deliver { to: usize, what: Wire, bad: bool },
    Act { node: usize },
    Crash,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    AppAfterGoodbye,
    ChunkAfterGoodbye,
    SecondGoodbye,
    SecondHello,
    LocalAbort,
    Crash,
}

const FAULTS: [Fault; 7] = [
    Fault::None,
    Fault::AppAfterGoodbye,
    Fault::ChunkAfterGoodbye,
    Fault::SecondGoodbye,
    Fault::SecondHello,
    Fault::LocalAbort,
    Fault::Crash,
];

#[derive(Debug, Default)]
struct Node {
    life: Lifecycle,
    apps: u32,
    chunks: u32,
    in_flight: u32,
    heard_apps: u32,
    heard_chunks: u32,
    finished: bool,
    /// The planted fault is still to be done by this end.
    fault_pending: bool,
}

struct Sim {
    rng: SmallRng,
    now: u64,
    tiebreak: u64,
    queue: BinaryHeap<Reverse<(u64, u64, Event)>>,
    last_delivery: [u64; 2],
    nodes: [Node; 2],
    closed: bool,
    flushed_non_credit: bool,
    bad_frame_seen: bool,
    /// The bad frame came when its receiver had said goodbye too.
    bad_frame_after_both_goodbyes: bool,
    /// Whether each end was orderly when the connection went down.
    orderly_at_close: Option<[bool; 2]>,
}

impl Sim {
    fn at(&mut self, delay: u64, e: Event) {
        self.tiebreak += 1;
        self.queue
            .push(Reverse((self.now + delay, self.tiebreak, e)));
    }

    fn send(&mut self, from: usize, what: Wire, bad: bool) {
        let latency = self.rng.random_range(0..=20);
        let when = (self.now + latency).max(self.last_delivery[from]);
        self.last_delivery[from] = when;
        self.nodes[from].in_flight += 1;
        self.tiebreak += 1;
        self.queue.push(Reverse((
            when,
            self.tiebreak,
            Event::Deliver {
                to: 1 - from,
                what,
                bad,
            },
        )));
    }

    /// One end closes (finished, or failed): everything in flight is
    /// flushed and both ends see the connection down.
    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        // Nothing more happens on this connection.
        while let Some(Reverse((_, _, e))) = self.queue.pop() {
            if let Event::Deliver { what, .. } = e {
                if what != Wire::Credit {
                    self.flushed_non_credit = true;
                }
            }
        }
        self.orderly_at_close = Some([
            self.nodes[0].life.is_orderly(),
            self.nodes[1].life.is_orderly(),
        ]);
        for n in &mut self.nodes {
            n.in_flight = 0;
            n.life
                .connection_down(TransportError::Closed("closed".into()), true);
        }
    }

    fn fail(&mut self, node: usize, e: LinkError) {
        if let Some(tell) = self.nodes[node].life.fail(e) {
            if tell {
                self.send(node, Wire::Error, false);
            }
            self.close();
        }
    }

    fn deliver(&mut self, to: usize, what: Wire, bad: bool) {
        let from = 1 - to;
        self.nodes[from].in_flight -= 1;
        if bad {
            self.bad_frame_seen = true;
            self.bad_frame_after_both_goodbyes = self.nodes[to].life.is_orderly();
        }
        let n = &mut self.nodes[to];
        let r = match what {
            Wire::Chunk => n.life.chunk_landed().map(|()| n.heard_chunks += 1),
            Wire::Error => Err(LinkError::Peer {
                code: rfabric::wire::ErrorCode::Protocol,
                text: "told".into(),
            }),
            Wire::App => n.life.heard(Heard::App).map(|()| n.heard_apps += 1),
            Wire::Credit => n.life.heard(Heard::Credit),
            Wire::Goodbye => n.life.heard(Heard::Goodbye),
            Wire::Hello => n.life.heard(Heard::Hello),
        };
        if let Err(e) = r {
            self.fail(to, e);
        }
    }

    fn act(&mut self, node: usize, fault: Fault) {
        if self.closed || self.nodes[node].life.is_failed() {
            return;
        }
        let n = &self.nodes[node];
        if n.fault_pending {
            let after_goodbye = n.life.may_send() == Err(LinkError::Finished);
            let planted = match fault {
                Fault::AppAfterGoodbye if after_goodbye => Some(Wire::App),
                Fault::ChunkAfterGoodbye if after_goodbye => Some(Wire::Chunk),
                Fault::SecondGoodbye if after_goodbye => Some(Wire::Goodbye),
                Fault::SecondHello if self.rng.random_bool(0.2) => Some(Wire::Hello),
                _ => None,
            };
            if let Some(w) = planted {
                self.nodes[node].fault_pending = false;
                self.send(node, w, true);
            } else if fault == Fault::LocalAbort && self.rng.random_bool(0.1) {
                self.nodes[node].fault_pending = false;
                self.fail(node, LinkError::Protocol("aborted locally".into()));
                return;
            }
        }
        let n = &self.nodes[node];
        if n.life.may_send().is_ok() {
            let left = n.apps + n.chunks;
            if left > 0 {
                let app = self.rng.random_range(0..left) < n.apps;
                if app {
                    self.nodes[node].apps -= 1;
                    self.send(node, Wire::App, false);
                } else {
                    self.nodes[node].chunks -= 1;
                    self.send(node, Wire::Chunk, false);
                }
            } else {
                self.nodes[node].life.said_goodbye();
                self.send(node, Wire::Goodbye, false);
            }
        }
        if self.rng.random_bool(0.3) {
            self.send(node, Wire::Credit, false);
        }
        let n = &self.nodes[node];
        match n.life.finished(n.in_flight == 0) {
            Some(Ok(())) => {
                self.nodes[node].finished = true;
                self.close();
            }
            Some(Err(_)) => {}
            None => {
                let d = self.rng.random_range(1..=15);
                self.at(d, Event::Act { node });
            }
        }
    }
}

#[test]
fn links_end_orderly_when_honest_and_fail_when_a_rule_is_broken() {
    let mut seen = [0u32; FAULTS.len()];
    for seed in 0..SCHEDULES {
        let fault = FAULTS[seed as usize % FAULTS.len()];
        let mut rng = SmallRng::seed_from_u64(seed);
        let bad = rng.random_range(0..2);
        let mut nodes = [Node::default(), Node::default()];
        let mut sent = [(0, 0); 2];
        for (i, n) in nodes.iter_mut().enumerate() {
            n.apps = rng.random_range(0..20);
            n.chunks = rng.random_range(0..20);
            sent[i] = (n.apps, n.chunks);
            n.fault_pending = i == bad && fault != Fault::None && fault != Fault::Crash;
        }
        let mut sim = Sim {
            rng,
            now: 0,
            tiebreak: 0,
            queue: BinaryHeap::new(),
            last_delivery: [0; 2],
            nodes,
            closed: false,
            flushed_non_credit: false,
            bad_frame_seen: false,
            bad_frame_after_both_goodbyes: false,
            orderly_at_close: None,
        };
        sim.at(0, Event::Act { node: 0 });
        sim.at(0, Event::Act { node: 1 });
        if fault == Fault::Crash {
            let t = sim.rng.random_range(0..200);
            sim.at(t, Event::Crash);
        }
        let mut steps = 0;
        while let Some(Reverse((t, _, e))) = sim.queue.pop() {
            steps += 1;
            assert!(steps < 100_000, "seed {seed}: no end");
            sim.now = t;
            match e {
                Event::Deliver { to, what, bad } => sim.deliver(to, what, bad),
                Event::Act { node } => sim.act(node, fault),
                Event::Crash => sim.close(),
            }
        }
        assert!(sim.closed, "seed {seed}: the connection never closed");
        let good = 1 - bad;
        match fault {
            Fault::None => {
                for i in 0..2 {
                    let n = &sim.nodes[i];
                    assert!(!n.life.is_failed(), "seed {seed}: end {i} failed");
                    assert!(
                        n.finished || n.life.finished(true) == Some(Ok(())),
                        "seed {seed}"
                    );
                    assert_eq!(n.life.receive_end(), Some(Ok(())), "seed {seed}");
                    assert_eq!((n.heard_apps, n.heard_chunks), sent[1 - i], "seed {seed}");
                }
                assert!(!sim.flushed_non_credit, "seed {seed}: data flushed");
            }
            Fault::Crash => {
                let orderly = sim.orderly_at_close.expect("closed");
                for (i, (n, orderly)) in sim.nodes.iter().zip(orderly).enumerate() {
                    assert_eq!(
                        n.life.is_failed(),
                        !orderly,
                        "seed {seed}: end {i} after a connection failure"
                    );
                }
            }
            Fault::LocalAbort => {
                // (An abort after both goodbyes changes nothing.)
                if sim.nodes[bad].life.is_failed() {
                    assert!(
                        sim.nodes[good].life.is_failed() || sim.nodes[good].life.is_orderly(),
                        "seed {seed}: the peer of an abort ended well mid-way"
                    );
                }
            }
            _ if sim.bad_frame_after_both_goodbyes => {
                // The link has ended orderly: what comes now is not taken.
                let n = &sim.nodes[good];
                assert_eq!((n.heard_apps, n.heard_chunks), sent[bad], "seed {seed}");
            }
            _ => {
                if sim.bad_frame_seen {
                    assert!(
                        sim.nodes[good].life.is_failed(),
                        "seed {seed}: {fault:?} went unnoticed"
                    );
                    assert!(matches!(
                        sim.nodes[good].life.receive_end(),
                        Some(Err(LinkError::Protocol(_)))
                    ));
                }
            }
        }
        if sim.bad_frame_seen || fault == Fault::None || fault == Fault::Crash {
            seen[seed as usize % FAULTS.len()] += 1;
        }
    }
    for (f, n) in FAULTS.iter().zip(seen) {
        if !matches!(f, Fault::LocalAbort) {
            assert!(n > 200, "{f:?} exercised only {n} times");
        }
    }
}
