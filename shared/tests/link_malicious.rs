//! A peer that breaks the link's rules, on the backend under test (see
//! `common`): every case ends in an error that names the breach and a closed
//! connection.
//!
//! On tcp a refused write never touches the landing ring. Verbs hardware
//! places data before software sees it, so there the refusal comes when the
//! note is polled; writes the receiver is never told about (plain writes,
//! notes aimed at the wrong slot) cannot be seen on verbs at all, which is
//! why those cases are tcp guarantees only.
//!
//! The misbehaving peer drives the raw transport, whose posting calls are
//! `unsafe` by contract (memory handed to "the hardware").
#![allow(unsafe_code)]
mod common;

use std::sync::Arc;
use std::time::Duration;

use rfabric::link::{Link, LinkConfig, LinkError};
use rfabric::memory::Memory;
use rfabric::transport::{
    Access, Completion, Connection, Op, RemoteAddr, TransportError, completions,
};
use rfabric::wire::{self, Body, CreditUpdate, Frame, Hello, RingDescriptor, Role};

const SLOTS: u32 = 4;
const SLOT: u32 = 1024 + 64;

/// A hand-driven client that speaks the hello correctly, then does what
/// each test tells it to.
struct RawPeer {
    conn: Arc<dyn Connection>,
    recv: rfabric::transport::Region,
    data: rfabric::transport::Region,
    server_hello: Hello,
}

async fn completions_until(conn: &dyn Connection, op: Op) -> Completion {
    loop {
        let mut out = Vec::new();
        completions(conn, &mut out).await.unwrap();
        if let Some(c) = out.into_iter().find(|c| c.op == op) {
            return c;
        }
    }
}

fn encode(frame: &Frame<'_>) -> Vec<u8> {
    let mut bytes = vec![0u8; frame.encoded_len()];
    frame.encode(&mut bytes);
    bytes
}

fn client_hello(version_override: Option<u16>) -> Vec<u8> {
    let hello = Hello {
        version: wire::VERSION,
        role: Role::Client,
        features: 0,
        ring: RingDescriptor::default(),
        control_depth: 8,
        control_size: 4096,
    };
    let mut bytes = encode(&Frame {
        credit: CreditUpdate::default(),
        body: Body::Hello(hello),
    });
    if let Some(v) = version_override {
        bytes[24..26].copy_from_slice(&v.to_le_bytes());
    }
    bytes
}

/// Server link and raw client, with hellos exchanged.
async fn setup() -> (Link, RawPeer) {
    setup_with(LinkConfig::new(Role::Server, SLOTS, SLOT - 64)).await
}

/// The same with the server's link set up as `config` says.
async fn setup_with(config: LinkConfig) -> (Link, RawPeer) {
    let (server, conn) = common::connected().await;
    let link = tokio::spawn(Link::establish(server, config));
    let recv_mem = Memory::new(16 * 4096).unwrap();
    let recv = conn.register(&recv_mem, Access::LOCAL, None).unwrap();
    for i in 0..16 {
        // SAFETY: the buffers are only read after their completions.
        unsafe {
            conn.post_recv(i, recv.segment(i as usize * 4096, 4096).unwrap())
                .unwrap()
        };
    }
    let data_mem = Memory::new(1 << 20).unwrap();
    let data = conn.register(&data_mem, Access::LOCAL, None).unwrap();
    let hello = client_hello(None);
    // SAFETY: the data buffer is not touched until the send completes.
    unsafe {
        data.memory()
            .slice_mut(0, hello.len())
            .copy_from_slice(&hello);
        conn.post_send(1000, &[data.segment(0, hello.len()).unwrap()])
            .unwrap();
    }
    let got = completions_until(&*conn, Op::Recv).await;
    // SAFETY: receive 0 completed.
    let bytes = unsafe { recv.memory().slice(0, got.byte_len as usize) };
    let Body::Hello(server_hello) = Frame::decode(bytes).unwrap().body else {
        panic!("no hello");
    };
    let link = link.await.unwrap().unwrap();
    (
        link,
        RawPeer {
            conn,
            recv,
            data,
            server_hello,
        },
    )
}

impl RawPeer {
    /// Writes `len` bytes of 0xEE from the client's data buffer to `addr`.
    fn write(&self, addr: u64, rkey: u32, len: usize, note: Option<u32>) {
        // SAFETY: the data buffer is only written here, before posting.
        unsafe {
            self.data.memory().slice_mut(0, len).fill(0xEE);
            let sgl = [self.data.segment(0, len).unwrap()];
            let remote = RemoteAddr { addr, rkey };
            match note {
                Some(n) => self.conn.write_notify(7, &sgl, remote, n).unwrap(),
                None => self.conn.write(7, &sgl, remote).unwrap(),
            }
        }
    }

    fn slot(&self, index: u32) -> u64 {
        self.server_hello.ring.addr + u64::from(index) * u64::from(SLOT)
    }

    fn rkey(&self) -> u32 {
        self.server_hello.ring.rkey
    }

    /// Waits until the connection is down and returns why.
    async fn closed_reason(&self) -> TransportError {
        rfabric::transport::closed_reason(&*self.conn).await
    }
}

fn ring_untouched(link: &Link) -> bool {
    let ring = link.ring_memory();
    // SAFETY: the connection is down; nothing writes the ring any more.
    unsafe { ring.slice(0, ring.len()) }.iter().all(|&b| b == 0)
}

/// Whether the backend checks a write before placing it (tcp, in-process)
/// rather than after, as verbs hardware does.
fn checked_before_placing() -> bool {
    matches!(common::backend(), "tcp" | "memory")
}

/// Runs one misbehaviour and checks the outcome on both sides: the server's
/// link fails saying `server_says`; on tcp and in-process the peer hears the
/// same in an abort and the ring is untouched, on verbs the peer's connection goes down.
async fn expect_refusal(misbehave: impl FnOnce(&RawPeer), server_says: &str) {
    let (link, peer) = setup().await;
    misbehave(&peer);
    let err = tokio::time::timeout(Duration::from_secs(10), link.recv())
        .await
        .expect("the server noticed")
        .expect_err("the server refused");
    assert!(err.to_string().contains(server_says), "server said: {err}");
    let peer_heard = tokio::time::timeout(Duration::from_secs(10), peer.closed_reason())
        .await
        .expect("the peer's connection went down");
    if checked_before_placing() {
        assert!(
            matches!(peer_heard, TransportError::PeerAbort(ref t) if t.contains(server_says)),
            "peer heard: {peer_heard}"
        );
        assert!(ring_untouched(&link), "the refused write reached the ring");
    }
}

#[tokio::test]
async fn a_note_for_a_slot_without_credit_is_refused() {
    // Slots 0..4 are granted; chunk 4 would reuse slot 0 before it is free.
    expect_refusal(
        |p| p.write(p.slot(0), p.rkey(), 100, Some(SLOTS)),
        "names no slot",
    )
    .await;
}

#[tokio::test]
async fn a_chunk_with_a_garbage_header_fails_the_link() {
    let (link, peer) = setup().await;
    // Admitted by the credit gate (slot 0, note 0), but 0xEE bytes are no
    // chunk header.
    peer.write(peer.slot(0), peer.rkey(), wire::CHUNK_HEADER_LEN, Some(0));
    let err = link.recv().await.unwrap_err();
    assert!(
        matches!(err, LinkError::Wire(wire::WireError::BadMagic(_))),
        "{err}"
    );
    // The link tells the peer why in an error message, then closes.
    let frames = frames_until_closed(&*peer.conn, &peer.recv).await;
    let last = Frame::decode(frames.last().expect("an error frame")).unwrap();
    match last.body {
        Body::Error { code, text } => {
            assert_eq!(code, wire::ErrorCode::Protocol);
            assert!(text.contains("bad magic"), "{text}");
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
}

/// Every message received until the connection closed.
async fn frames_until_closed(
    conn: &dyn Connection,
    recv: &rfabric::transport::Region,
) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    loop {
        let mut out = Vec::new();
        if completions(conn, &mut out).await.is_err() {
            return frames;
        }
        for c in out
            .into_iter()
            .filter(|c| c.op == Op::Recv && c.status.is_ok())
        {
            // SAFETY: a completed receive is no longer written by the backend.
            let b = unsafe {
                recv.memory()
                    .slice(c.wr_id as usize * 4096, c.byte_len as usize)
            };
            frames.push(b.to_vec());
        }
    }
}

#[tokio::test]
async fn a_write_to_an_unknown_rkey_is_refused() {
    if !checked_before_placing() {
        return refused_by_the_nic(|p| p.write(p.slot(0), p.rkey() + 99, 100, Some(0))).await;
    }
    expect_refusal(
        |p| p.write(p.slot(0), p.rkey() + 99, 100, Some(0)),
        "unknown rkey",
    )
    .await;
}

#[tokio::test]
async fn a_write_outside_the_region_is_refused() {
    if !checked_before_placing() {
        return refused_by_the_nic(|p| p.write(p.slot(SLOTS) - 10, p.rkey(), 100, Some(0))).await;
    }
    expect_refusal(
        |p| p.write(p.slot(SLOTS) - 10, p.rkey(), 100, Some(0)),
        "outside region",
    )
    .await;
    expect_refusal(
        |p| p.write(p.slot(0) - 1, p.rkey(), 10, Some(0)),
        "outside region",
    )
    .await;
}

#[tokio::test]
async fn a_write_into_the_wrong_slot_is_refused() {
    // Verbs does not report where a notified write landed (module docs).
    if !checked_before_placing() {
        return;
    }
    expect_refusal(
        |p| p.write(p.slot(1), p.rkey(), 100, Some(0)),
        "is not the slot of chunk 0",
    )
    .await;
    expect_refusal(
        |p| p.write(p.slot(0) + 8, p.rkey(), 100, Some(0)),
        "is not the slot of chunk 0",
    )
    .await;
}

#[tokio::test]
async fn a_plain_write_into_the_ring_is_refused() {
    // Verbs does not tell the receiver about plain writes (module docs).
    if !checked_before_placing() {
        return;
    }
    expect_refusal(|p| p.write(p.slot(0), p.rkey(), 100, None), "plain writes").await;
}

#[tokio::test]
async fn a_wrong_version_hello_is_refused_with_a_version_error() {
    let (server, conn) = common::connected().await;
    let link = tokio::spawn(Link::establish(
        server,
        LinkConfig::new(Role::Server, 2, 100),
    ));
    let recv_mem = Memory::new(4 * 4096).unwrap();
    let recv = conn.register(&recv_mem, Access::LOCAL, None).unwrap();
    for i in 0..4 {
        // SAFETY: only read after completion.
        unsafe {
            conn.post_recv(i, recv.segment(i as usize * 4096, 4096).unwrap())
                .unwrap()
        };
    }
    let mem = Memory::new(4096).unwrap();
    let data = conn.register(&mem, Access::LOCAL, None).unwrap();
    let hello = client_hello(Some(9));
    // SAFETY: not touched until the send completes.
    unsafe {
        data.memory()
            .slice_mut(0, hello.len())
            .copy_from_slice(&hello);
        conn.post_send(1, &[data.segment(0, hello.len()).unwrap()])
            .unwrap();
    }
    let err = link.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        LinkError::Wire(wire::WireError::Version {
            got: 9,
            supported: wire::VERSION
        })
    );
    // The client gets the server's hello, then an error frame saying why.
    let frames = frames_until_closed(&*conn, &recv).await;
    let last = Frame::decode(frames.last().expect("an error frame")).unwrap();
    match last.body {
        Body::Error { code, text } => {
            assert_eq!(code, wire::ErrorCode::Version);
            assert!(text.contains("unsupported protocol version 9"), "{text}");
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
}

/// Verbs: an access the NIC refuses (bad rkey, out of bounds) fails the
/// writer's request with a remote access error and takes the connection
/// down on both sides; the server's link fails instead of hanging.
async fn refused_by_the_nic(misbehave: impl FnOnce(&RawPeer)) {
    let (link, peer) = setup().await;
    misbehave(&peer);
    let heard = tokio::time::timeout(Duration::from_secs(10), peer.closed_reason())
        .await
        .expect("the writer's connection went down");
    assert!(
        heard.to_string().contains("remote access"),
        "writer saw: {heard}"
    );
    let err = tokio::time::timeout(Duration::from_secs(10), link.recv())
        .await
        .expect("the server noticed");
    assert!(err.is_err(), "the server's link kept going: {err:?}");
}

#[tokio::test]
async fn a_peer_that_falls_silent_hears_heartbeats_then_the_link_fails() {
    let config = LinkConfig {
        silence: Some(Duration::from_secs(3)),
        ..LinkConfig::new(Role::Server, SLOTS, SLOT - 64)
    };
    // (The silence is counted from the peer's hello, inside the set-up:
    // so the clock here starts before it.)
    let started = tokio::time::Instant::now();
    let (link, peer) = setup_with(config).await;
    // The raw peer says nothing after its hello; the link beats while it
    // waits (Credit frames), then gives the peer up.
    let err = tokio::time::timeout(Duration::from_secs(10), link.recv())
        .await
        .expect("the silence was noticed")
        .expect_err("the link failed");
    assert_eq!(err, LinkError::Silent(Duration::from_secs(3)), "{err}");
    assert!(started.elapsed() >= Duration::from_secs(3));
    let mut beats = 0;
    let mut heard = Vec::new();
    // (What arrived before the connection went down: its completions.)
    while let Ok(Ok(())) =
        tokio::time::timeout(Duration::from_secs(1), completions(&*peer.conn, &mut heard)).await
    {
    }
    for c in heard
        .iter()
        .filter(|c| c.op == Op::Recv && c.status.is_ok())
    {
        // SAFETY: these receives completed; nothing writes them now.
        let bytes = unsafe {
            peer.recv
                .memory()
                .slice(c.wr_id as usize * 4096, c.byte_len as usize)
        };
        if matches!(Frame::decode(bytes).map(|f| f.body), Ok(Body::Credit)) {
            beats += 1;
        }
    }
    assert!(beats >= 2, "{beats} heartbeats before the link gave up");
}
