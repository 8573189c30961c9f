//! The link conformance suite: the same tests on every backend (see
//! `common`: tcp on loopback by default; verbs over Soft-RoCE in the VM
//! tier). Real connections, real tasks, every byte compared.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use common::{link_pair, pattern};
use rfabric::link::seal::{Before, Protection, SealError};
use rfabric::link::{ChunkMeta, Incoming, Link, LinkConfig, LinkError};
use rfabric::memory::{BufferPool, Memory};
use rfabric::transport::{
    Access, Backend, Completion, Connection, Limits, Region, RemoteAddr, Segment, TransportError,
    WriteGate,
};
use rfabric::wire::Role;

const RING: u32 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_chunks_through_a_full_window_arrive_intact_and_in_order() {
    let chunk = 64 * 1024;
    let (server, client) = link_pair(
        LinkConfig::new(Role::Server, RING, chunk),
        LinkConfig::new(Role::Client, 0, chunk),
    )
    .await;
    assert_eq!(client.max_chunk(), chunk as usize);
    assert_eq!(server.max_chunk(), 0, "the client has no ring");
    let pool = BufferPool::new(16, chunk as usize).unwrap();
    let region = client.register(pool.memory()).unwrap();
    // Soft-RoCE under emulation moves about 20 MB/s: a few MiB there.
    let chunks: u64 = if matches!(common::backend(), "tcp" | "memory") {
        3000
    } else {
        150
    };

    let sender = {
        let client = client.clone();
        tokio::spawn(async move {
            for i in 0..chunks {
                let mut buf = pool.acquire().await;
                // Sizes from 1 byte to a full slot.
                let len = 1 + (i as usize * 7919) % chunk as usize;
                buf.fill_from(&pattern(i % 5, i, len));
                let meta = ChunkMeta {
                    owner: i % 5,
                    offset: i,
                    ..ChunkMeta::default()
                };
                client.send_chunk(meta, &region, buf).await.unwrap();
                if i % 500 == 0 {
                    client
                        .send_message(format!("progress {i}").as_bytes())
                        .await
                        .unwrap();
                }
            }
            client.finish().await.unwrap();
        })
    };

    // The receiver first holds a full window and checks that the sender
    // cannot go beyond it, then consumes, keeping a few chunks a while so
    // that slots are freed out of order.
    let mut held = Vec::new();
    let mut next = 0u64;
    let mut messages = Vec::new();
    let mut bytes = 0usize;
    while let Some(item) = server.recv().await.unwrap() {
        match item {
            Incoming::Message(m) => messages.push(String::from_utf8(m).unwrap()),
            Incoming::Chunk(c) => {
                let h = *c.header();
                assert_eq!(h.offset, next, "chunks arrive in order");
                assert_eq!(h.owner, next % 5);
                let expected = pattern(h.owner, h.offset, h.payload_len as usize);
                assert!(
                    c.payload() == expected.as_slice(),
                    "payload of chunk {next} differs"
                );
                bytes += c.payload().len();
                next += 1;
                held.push(c);
                if next == u64::from(RING) {
                    let early =
                        tokio::time::timeout(Duration::from_millis(200), server.recv()).await;
                    assert!(
                        early.is_err(),
                        "a chunk beyond the window arrived: {early:?}"
                    );
                }
                if next >= u64::from(RING) && (held.len() == RING as usize || next % 3 == 0) {
                    // Release the newest first: out of order.
                    while held.len() > 2 {
                        held.pop();
                    }
                    if next % 2 == 0 {
                        held.clear();
                    }
                }
            }
        }
    }
    drop(held);
    server.finish().await.unwrap();
    sender.await.unwrap();
    assert_eq!(next, chunks);
    // Sizes cycle through 1..=64 KiB: about half a chunk each on average.
    assert!(bytes as u64 > chunks * u64::from(chunk) / 3, "{bytes}");
    assert_eq!(
        messages,
        (0..chunks)
            .step_by(500)
            .map(|i| format!("progress {i}"))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_flow_both_ways_and_a_slow_reader_only_slows_the_sender() {
    let (server, client) = link_pair(
        LinkConfig::new(Role::Server, 2, 1024),
        LinkConfig::new(Role::Client, 2, 1024),
    )
    .await;
    let n = 200;
    let send_all = |link: rfabric::link::Link, tag: &'static str| {
        tokio::spawn(async move {
            for i in 0..n {
                link.send_message(format!("{tag} {i}").as_bytes())
                    .await
                    .unwrap();
            }
        })
    };
    let a = send_all(server.clone(), "s");
    let b = send_all(client.clone(), "c");
    // Neither side reads for a while: both senders must stall on credits,
    // not fail and not lose anything.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !a.is_finished() && !b.is_finished(),
        "senders ran past the control depth"
    );
    let read_all = |link: rfabric::link::Link, tag: &'static str| {
        tokio::spawn(async move {
            for i in 0..n {
                match link.recv().await.unwrap() {
                    Some(Incoming::Message(m)) => assert_eq!(m, format!("{tag} {i}").into_bytes()),
                    other => panic!("unexpected {other:?}"),
                }
            }
        })
    };
    let ra = read_all(server.clone(), "c");
    let rb = read_all(client.clone(), "s");
    for t in [a, b, ra, rb] {
        t.await.unwrap();
    }
    let (x, y) = tokio::join!(server.finish(), client.finish());
    x.unwrap();
    y.unwrap();
}

#[tokio::test]
async fn oversized_chunks_and_messages_are_refused_locally() {
    let (server, client) = link_pair(
        LinkConfig::new(Role::Server, 2, 1000),
        LinkConfig::new(Role::Client, 0, 1000),
    )
    .await;
    let pool = BufferPool::new(1, 4096).unwrap();
    let region = client.register(pool.memory()).unwrap();
    let mut buf = pool.try_acquire().unwrap();
    buf.set_len(1001);
    let err = client
        .send_chunk(ChunkMeta::default(), &region, buf)
        .await
        .unwrap_err();
    assert!(matches!(err, LinkError::Config(_)), "{err}");
    let big = vec![1u8; client.max_message() + 1];
    assert!(matches!(
        client.send_message(&big).await,
        Err(LinkError::Config(_))
    ));
    // Refused locally: the link still works.
    client.send_message(b"still here").await.unwrap();
    match server.recv().await.unwrap() {
        Some(Incoming::Message(m)) => assert_eq!(m, b"still here"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn two_clients_refuse_each_other() {
    let (a, b) = common::connected().await;
    let (x, y) = tokio::join!(
        rfabric::link::Link::establish(a, LinkConfig::new(Role::Client, 1, 100)),
        rfabric::link::Link::establish(b, LinkConfig::new(Role::Client, 1, 100))
    );
    let x = x.unwrap_err().to_string();
    let y = y.unwrap_err().to_string();
    assert!(x.contains("both ends are Clients"), "{x}");
    assert!(
        y.contains("both ends are Clients") || y.contains("closed"),
        "{y}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_finishes_early_still_returns_credits() {
    let chunk = 1024;
    let (server, client) = link_pair(
        LinkConfig::new(Role::Server, 4, chunk),
        LinkConfig::new(Role::Client, 0, chunk),
    )
    .await;
    let pool = BufferPool::new(4, chunk as usize).unwrap();
    let region = client.register(pool.memory()).unwrap();
    let sender = tokio::spawn(async move {
        for i in 0..200u64 {
            let mut buf = pool.acquire().await;
            buf.fill_from(&pattern(0, i, 100));
            let meta = ChunkMeta {
                offset: i,
                ..ChunkMeta::default()
            };
            client.send_chunk(meta, &region, buf).await.unwrap();
        }
        client.finish().await.unwrap();
    });
    for _ in 0..10 {
        match server.recv().await.unwrap() {
            Some(Incoming::Chunk(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    // Goodbye after 10 chunks: the rest is drained and dropped, and the
    // credit updates that keep the sender going are still accepted.
    server.finish().await.unwrap();
    sender.await.unwrap();
}

/// Seals a pair as an authenticated session would: each side's incoming
/// half before anything sealed can reach it, then the outgoing halves.
fn seal_pair(server: &Link, client: &Link, protection: Protection, server_rx: [u8; 32]) {
    let (c2s, s2c) = ([0x5a; 32], [0xa5; 32]);
    client
        .seal_incoming(protection, &s2c, Before::Anything)
        .unwrap();
    server
        .seal_incoming(protection, &server_rx, Before::CreditsOnly)
        .unwrap();
    server.seal_outgoing(protection, &s2c);
    client.seal_outgoing(protection, &c2s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_links_carry_chunks_and_messages_intact_under_both_protections() {
    for protection in [Protection::Authenticate, Protection::Encrypt] {
        let chunk = 16 * 1024;
        let (server, client) = link_pair(
            LinkConfig::new(Role::Server, RING, chunk),
            LinkConfig::new(Role::Client, 0, chunk),
        )
        .await;
        seal_pair(&server, &client, protection, [0x5a; 32]);
        assert_eq!(client.protection(), Some(protection));
        let pool = BufferPool::new(8, chunk as usize).unwrap();
        let region = client.register(pool.memory()).unwrap();
        let chunks = 300u64;
        let sender = {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0..chunks {
                    let mut buf = pool.acquire().await;
                    let len = 1 + (i as usize * 7919) % chunk as usize;
                    buf.fill_from(&pattern(1, i, len));
                    // Every other chunk says it carries a digest: the seal
                    // then covers its header only, and must still hand the
                    // payload over as sent.
                    let flags = if i % 2 == 0 {
                        rfabric::wire::chunk_flags::DIGEST
                    } else {
                        0
                    };
                    let meta = ChunkMeta {
                        owner: 1,
                        offset: i,
                        flags,
                        digest: [i as u8; 32],
                    };
                    client.send_chunk(meta, &region, buf).await.unwrap();
                    if i % 50 == 0 {
                        client.send_message(&i.to_le_bytes()).await.unwrap();
                    }
                }
                let echo = client.recv().await.unwrap();
                assert!(matches!(echo, Some(Incoming::Message(m)) if m == b"all here"));
                client.finish().await.unwrap();
            })
        };
        let (mut next, mut messages) = (0u64, 0);
        while next < chunks {
            match server.recv().await.unwrap().expect("more to come") {
                Incoming::Message(m) => {
                    assert_eq!(m, (next - 1).to_le_bytes(), "message after its chunk");
                    messages += 1;
                }
                Incoming::Chunk(c) => {
                    let h = *c.header();
                    assert_eq!((h.offset, h.digest), (next, [next as u8; 32]));
                    let expected = pattern(1, next, h.payload_len as usize);
                    assert!(c.payload() == expected.as_slice(), "chunk {next} differs");
                    next += 1;
                }
            }
        }
        assert_eq!(messages, 6);
        server.send_message(b"all here").await.unwrap();
        server.finish().await.unwrap();
        sender.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_sealing_with_another_key_fails_the_first_frame() {
    let (server, client) = link_pair(
        LinkConfig::new(Role::Server, RING, 4096),
        LinkConfig::new(Role::Client, 0, 4096),
    )
    .await;
    seal_pair(&server, &client, Protection::Encrypt, [0x77; 32]);
    client.send_message(b"hello").await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), server.recv())
        .await
        .expect("the server noticed")
        .expect_err("a frame under the wrong key is refused");
    assert!(
        matches!(err, LinkError::Seal(SealError::BadTag { .. })),
        "{err}"
    );
    // The client hears why (sealed with the server's own key, which the
    // client does hold).
    let heard = tokio::time::timeout(Duration::from_secs(10), client.recv())
        .await
        .expect("the client heard")
        .expect_err("the link failed");
    assert!(heard.to_string().contains("session check"), "{heard}");
}

/// A connection whose posts fail once `broken` is set, as a reset
/// connection's do, while what the peer sent before still arrives.
struct BreakableSends {
    inner: Arc<dyn Connection>,
    broken: AtomicBool,
}

impl BreakableSends {
    fn check(&self) -> Result<(), TransportError> {
        if self.broken.load(Ordering::Acquire) {
            return Err(TransportError::Io("send failed: Broken pipe".into()));
        }
        Ok(())
    }
}

// (Each call is passed on with the caller's own promises.)
#[allow(unsafe_code)]
impl Connection for BreakableSends {
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    fn limits(&self) -> Limits {
        self.inner.limits()
    }
    fn register(
        &self,
        memory: &Arc<Memory>,
        access: Access,
        gate: Option<Arc<dyn WriteGate>>,
    ) -> Result<Region, TransportError> {
        self.inner.register(memory, access, gate)
    }
    unsafe fn post_recv(&self, wr_id: u64, buf: Segment) -> Result<(), TransportError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.inner.post_recv(wr_id, buf) }
    }
    unsafe fn post_send(&self, wr_id: u64, sgl: &[Segment]) -> Result<(), TransportError> {
        self.check()?;
        // SAFETY: the caller's promise, passed on.
        unsafe { self.inner.post_send(wr_id, sgl) }
    }
    unsafe fn write_notify(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
        note: u32,
    ) -> Result<(), TransportError> {
        self.check()?;
        // SAFETY: the caller's promise, passed on.
        unsafe { self.inner.write_notify(wr_id, sgl, remote, note) }
    }
    unsafe fn write(
        &self,
        wr_id: u64,
        sgl: &[Segment],
        remote: RemoteAddr,
    ) -> Result<(), TransportError> {
        self.check()?;
        // SAFETY: the caller's promise, passed on.
        unsafe { self.inner.write(wr_id, sgl, remote) }
    }
    unsafe fn read(
        &self,
        wr_id: u64,
        local: Segment,
        remote: RemoteAddr,
    ) -> Result<(), TransportError> {
        self.check()?;
        // SAFETY: the caller's promise, passed on.
        unsafe { self.inner.read(wr_id, local, remote) }
    }
    fn poll_completions(
        &self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
    ) -> Poll<Result<(), TransportError>> {
        self.inner.poll_completions(cx, out)
    }
    fn close(&self) {
        self.inner.close();
    }
}

/// A (server, client) link pair whose client's posts can be made to fail.
async fn link_pair_with_breakable_sends() -> (Link, Link, Arc<BreakableSends>) {
    let (a, b) = common::connected().await;
    let cut = Arc::new(BreakableSends {
        inner: b,
        broken: AtomicBool::new(false),
    });
    let (server, client) = tokio::join!(
        Link::establish(a, LinkConfig::new(Role::Server, RING, 4096)),
        Link::establish(
            Arc::clone(&cut) as Arc<dyn Connection>,
            LinkConfig::new(Role::Client, 0, 4096)
        ),
    );
    (server.unwrap(), client.unwrap(), cut)
}

/// A peer that gives up says why and closes; this side's next send then
/// fails (the connection is reset) before the report is read. The sender
/// must hear the report, not the broken pipe it led to: a tampered path
/// is told apart from a lost connection by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_cut_off_hears_why_the_peer_gave_up() {
    for sends_chunk in [false, true] {
        let (server, client, cut) = link_pair_with_breakable_sends().await;
        let pool = BufferPool::new(1, 4096).unwrap();
        let region = client.register(pool.memory()).unwrap();
        let mut buf = pool.acquire().await;
        buf.fill_from(b"after the reset");
        cut.broken.store(true, Ordering::Release);
        let sending = tokio::spawn(async move {
            if sends_chunk {
                client.send_chunk(ChunkMeta::default(), &region, buf).await
            } else {
                client.send_message(b"after the reset").await
            }
        });
        // The post fails at once; the sender waits for the cause.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !sending.is_finished(),
            "chunk {sends_chunk}: the sender gave up before the peer's report could arrive: {:?}",
            sending.await
        );
        server.abort("your seal failed");
        let err = tokio::time::timeout(Duration::from_secs(10), sending)
            .await
            .expect("the sender ended")
            .unwrap()
            .expect_err("the send failed");
        assert!(
            matches!(err, LinkError::Peer { ref text, .. } if text.contains("your seal failed")),
            "chunk {sends_chunk}: {err}"
        );
    }
}

/// The same cut-off sender when the peer just goes, with no report: it
/// hears the lost connection as soon as the connection is down, not after
/// the whole wait for a report that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_cut_off_by_a_peer_that_just_went_hears_so_at_once() {
    let (server, client, cut) = link_pair_with_breakable_sends().await;
    cut.broken.store(true, Ordering::Release);
    let started = std::time::Instant::now();
    let sending = tokio::spawn(async move { client.send_message(b"after the reset").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The peer's connection closes, no Error frame first.
    server.connection().close();
    let err = tokio::time::timeout(Duration::from_secs(10), sending)
        .await
        .expect("the sender ended")
        .unwrap()
        .expect_err("the send failed");
    assert!(matches!(err, LinkError::Transport(_)), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the sender waited {:?} for a report that never came",
        started.elapsed()
    );
}

/// A broadcast node's hop: chunks that land on one link are sent on by
/// another straight from their landing slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landed_chunks_are_sent_on_from_their_slots_intact() {
    use rfabric::wire::chunk_flags::DIGEST;
    for sealed in [None, Some(Protection::Authenticate)] {
        let chunk = 32 * 1024;
        // source -> (hop_in | hop_out) -> sink; the hop's ring is small, so
        // the source gets its credits back only as forwards complete.
        let (hop_in, source) = link_pair(
            LinkConfig::new(Role::Server, 4, chunk),
            LinkConfig::new(Role::Client, 0, chunk),
        )
        .await;
        let (sink, hop_out) = link_pair(
            LinkConfig::new(Role::Server, RING, chunk),
            LinkConfig::new(Role::Client, 0, chunk),
        )
        .await;
        if let Some(p) = sealed {
            seal_pair(&hop_in, &source, p, [0x5a; 32]);
            seal_pair(&sink, &hop_out, p, [0x5a; 32]);
        }
        // Under Authenticate a chunk without a digest has its payload
        // encrypted: it cannot go from a slot others read.
        assert_eq!(hop_out.seals_payload(0), sealed.is_some());
        assert!(!hop_out.seals_payload(DIGEST));
        let chunks = 200u64;
        let pool = BufferPool::new(4, chunk as usize).unwrap();
        let region = source.register(pool.memory()).unwrap();
        let sender = {
            let source = source.clone();
            tokio::spawn(async move {
                for i in 0..chunks {
                    let mut buf = pool.acquire().await;
                    let len = 1 + (i as usize * 7919) % chunk as usize;
                    buf.fill_from(&pattern(2, i, len));
                    let meta = ChunkMeta {
                        owner: 2,
                        offset: i,
                        flags: DIGEST,
                        digest: [i as u8; 32],
                    };
                    source.send_chunk(meta, &region, buf).await.unwrap();
                }
                source.finish().await.unwrap();
            })
        };
        let hop = {
            let hop_out = hop_out.clone();
            tokio::spawn(async move {
                let mut landed = None;
                while let Some(item) = hop_in.recv().await.unwrap() {
                    let Incoming::Chunk(c) = item else {
                        panic!("only chunks were sent")
                    };
                    let c = std::sync::Arc::new(c);
                    let region = landed
                        .get_or_insert_with(|| hop_out.register(c.memory()).unwrap())
                        .clone();
                    let h = *c.header();
                    let meta = ChunkMeta {
                        owner: h.owner,
                        offset: h.offset,
                        flags: h.flags,
                        digest: h.digest,
                    };
                    // The wrong region, and a payload the seal would change,
                    // are refused before anything is posted.
                    if h.offset == 0 {
                        let other = BufferPool::new(1, 64).unwrap();
                        let wrong = hop_out.register(other.memory()).unwrap();
                        let e = hop_out
                            .send_landed(meta, &wrong, std::sync::Arc::clone(&c))
                            .await
                            .unwrap_err();
                        assert!(matches!(e, LinkError::Config(_)), "{e}");
                        if sealed.is_some() {
                            let plain = ChunkMeta { flags: 0, ..meta };
                            let e = hop_out
                                .send_landed(plain, &region, std::sync::Arc::clone(&c))
                                .await
                                .unwrap_err();
                            assert!(e.to_string().contains("changes payloads"), "{e}");
                        }
                    }
                    // Sent on from the slot; this side is done with it at
                    // once, the link keeps it until its write completed.
                    hop_out.send_landed(meta, &region, c).await.unwrap();
                }
                hop_in.finish().await.unwrap();
                hop_out.finish().await.unwrap();
            })
        };
        let mut next = 0u64;
        while let Some(item) = sink.recv().await.unwrap() {
            let Incoming::Chunk(c) = item else {
                panic!("only chunks were sent")
            };
            let h = *c.header();
            assert_eq!(
                (h.offset, h.digest, h.flags),
                (next, [next as u8; 32], DIGEST)
            );
            let expected = pattern(2, next, h.payload_len as usize);
            assert!(
                c.payload() == expected.as_slice(),
                "chunk {next} differs ({sealed:?})"
            );
            next += 1;
        }
        assert_eq!(next, chunks, "{sealed:?}");
        sink.finish().await.unwrap();
        sender.await.unwrap();
        hop.await.unwrap();
    }
}

/// A buffer sent while its owner keeps it (rblock's gateway, which must be
/// able to send a write again on the next link): the data arrives, stays
/// in the buffer unchanged, and goes out again on a second link; the pool
/// gets the buffer back only once both the owner and the write let go. A
/// seal that would encrypt the payload in place is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_buffers_stay_intact_and_go_out_again_on_another_link() {
    use std::sync::Arc;
    let chunk = 16 * 1024;
    let config = || {
        (
            LinkConfig::new(Role::Server, RING, chunk),
            LinkConfig::new(Role::Client, 0, chunk),
        )
    };
    let (first_in, first_out) = {
        let (s, c) = config();
        link_pair(s, c).await
    };
    let (second_in, second_out) = {
        let (s, c) = config();
        link_pair(s, c).await
    };
    let pool = BufferPool::new(4, chunk as usize).unwrap();
    let on_first = first_out.register(pool.memory()).unwrap();
    let on_second = second_out.register(pool.memory()).unwrap();
    let bufs: Vec<Arc<_>> = (0..3u64)
        .map(|i| {
            let mut b = pool.try_acquire().unwrap();
            b.fill_from(&pattern(7, i, 1000 + i as usize * 5000));
            Arc::new(b)
        })
        .collect();
    // All or nothing: one buffer is left, two are not there.
    assert!(pool.try_acquire_many(2).is_none());
    assert_eq!(pool.available(), 1);
    for (out, region, sink) in [
        (&first_out, &on_first, &first_in),
        (&second_out, &on_second, &second_in),
    ] {
        for (i, b) in bufs.iter().enumerate() {
            let meta = ChunkMeta {
                owner: 7,
                offset: i as u64,
                ..ChunkMeta::default()
            };
            out.send_kept(meta, region, Arc::clone(b)).await.unwrap();
        }
        for (i, b) in bufs.iter().enumerate() {
            let Some(Incoming::Chunk(c)) = sink.recv().await.unwrap() else {
                panic!("a chunk was sent")
            };
            assert_eq!(c.header().offset, i as u64);
            assert!(c.payload() == b.data(), "chunk {i} arrived as sent");
            assert!(
                b.data() == pattern(7, i as u64, b.len()).as_slice(),
                "and stays in the buffer as it was"
            );
        }
    }
    drop(bufs);
    // The writes complete (the peer has answered with its credits by the
    // time the goodbye is through), and then the pool has them all back.
    for (out, sink) in [(&first_out, &first_in), (&second_out, &second_in)] {
        let finish = tokio::spawn({
            let out = out.clone();
            async move { out.finish().await }
        });
        assert!(sink.recv().await.unwrap().is_none());
        sink.finish().await.unwrap();
        finish.await.unwrap().unwrap();
    }
    assert_eq!(pool.available(), 4);
    let all = pool.try_acquire_many(4).expect("all four are free");
    assert_eq!(all.len(), 4);
    let mut indices: Vec<u32> = all.iter().map(|b| b.index()).collect();
    indices.sort_unstable();
    assert_eq!(indices, [0, 1, 2, 3], "four distinct buffers");

    // Under encryption the payload would be sealed in place: refused.
    let (s, c) = config();
    let (server, client) = link_pair(s, c).await;
    seal_pair(&server, &client, Protection::Encrypt, [0x31; 32]);
    let region = client.register(pool.memory()).unwrap();
    drop(all);
    let mut b = pool.try_acquire().unwrap();
    b.fill_from(b"plaintext");
    let e = client
        .send_kept(ChunkMeta::default(), &region, Arc::new(b))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("changes payloads"), "{e}");
}
