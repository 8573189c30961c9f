//! The tcp backend against raw sockets: peers that do not speak its
//! framing, or speak it wrongly, below any link.
//!
//! Posting work requests is `unsafe` by contract (memory handed to "the
//! hardware"), hence the allowance.
#![allow(unsafe_code)]

mod common;

use std::sync::Arc;

use rfabric::link::{Incoming, Link, LinkConfig};
use rfabric::transport::tcp::{self, FrameHeader, FrameOp, HEADER_LEN, PREFACE, TcpListener};
use rfabric::transport::{Connection, TransportError, closed_reason, completions};
use rfabric::wire::Role;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Raw socket peers: below the transport's own framing.
async fn raw_server() -> (
    tokio::task::JoinHandle<Result<tcp::TcpConnection, TransportError>>,
    TcpStream,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = tokio::spawn(async move { listener.accept().await });
    let stream = TcpStream::connect(addr).await.unwrap();
    (accept, stream)
}

#[tokio::test]
async fn a_peer_without_the_preface_is_refused() {
    let (accept, mut stream) = raw_server().await;
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let err = accept.await.unwrap().unwrap_err();
    assert!(
        matches!(err, TransportError::Protocol(ref t) if t.contains("not an rfabric tcp peer")),
        "{err}"
    );
}

#[tokio::test]
async fn an_oversized_frame_header_is_refused_and_explained() {
    let (accept, mut stream) = raw_server().await;
    stream.write_all(&PREFACE).await.unwrap();
    let conn = accept.await.unwrap().unwrap();
    let header = FrameHeader {
        op: FrameOp::Send,
        len: 1 << 24,
        addr: 0,
        rkey: 0,
        note: 0,
    };
    stream.write_all(&header.encode()).await.unwrap();
    let err = closed_reason(&conn).await;
    assert!(
        matches!(err, TransportError::Protocol(ref t) if t.contains("exceeds the limit")),
        "{err}"
    );
    // The raw peer reads the preface, then an abort frame with the reason.
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.unwrap();
    assert_eq!(&buf[..8], &PREFACE);
    let abort =
        FrameHeader::decode(buf[8..8 + HEADER_LEN].try_into().unwrap(), 1 << 30, 1 << 30).unwrap();
    assert_eq!(abort.op, FrameOp::Abort);
    let text = String::from_utf8_lossy(&buf[8 + HEADER_LEN..]);
    assert!(text.contains("exceeds the limit"), "{text}");
}

#[tokio::test]
async fn a_truncated_frame_header_closes_the_connection() {
    let (accept, mut stream) = raw_server().await;
    stream.write_all(&PREFACE).await.unwrap();
    let conn = accept.await.unwrap().unwrap();
    let header = FrameHeader {
        op: FrameOp::Send,
        len: 10,
        addr: 0,
        rkey: 0,
        note: 0,
    }
    .encode();
    stream.write_all(&header[..10]).await.unwrap();
    drop(stream);
    let mut out = Vec::new();
    let err = loop {
        if let Err(e) = completions(&conn, &mut out).await {
            break e;
        }
    };
    // EOF, or a reset because the raw peer never read our preface.
    assert!(
        matches!(err, TransportError::Closed(_) | TransportError::Io(_)),
        "{err}"
    );
    assert!(out.is_empty(), "nothing was delivered: {out:?}");
}

#[tokio::test]
async fn a_send_with_no_receive_posted_fails_after_the_rnr_wait() {
    let (accept, mut stream) = raw_server().await;
    stream.write_all(&PREFACE).await.unwrap();
    let conn = accept.await.unwrap().unwrap();
    let header = FrameHeader {
        op: FrameOp::Send,
        len: 4,
        addr: 0,
        rkey: 0,
        note: 0,
    };
    stream.write_all(&header.encode()).await.unwrap();
    stream.write_all(b"ping").await.unwrap();
    let err = closed_reason(&conn).await;
    assert!(
        matches!(err, TransportError::Protocol(ref t) if t.contains("no receive was posted")),
        "{err}"
    );
}

#[tokio::test]
async fn a_silent_peer_does_not_hold_up_the_next_one() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Connects and says nothing (no preface), and stays.
    let _silent = TcpStream::connect(addr).await.unwrap();
    let real = tokio::spawn(tcp::connect(addr));
    let accepted = tokio::time::timeout(std::time::Duration::from_secs(5), listener.accept())
        .await
        .expect("the speaking peer is accepted while the silent one waits");
    assert!(accepted.is_ok(), "{accepted:?}");
    assert!(real.await.unwrap().is_ok());
}

/// A connection handed out before its preface: refused only when it is
/// set up (a peer that is not an rfabric one), and once set up on another
/// thread's runtime, carried from there (its transport's tasks run there,
/// so a link served there never crosses to the listener's threads).
#[test]
fn an_unestablished_connection_is_set_up_where_it_is_served() {
    let listening = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    listening.block_on(async {
        let listener = TcpListener::bind_unestablished("127.0.0.1:0")
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = || async {
            match listener.accept_any().await.unwrap() {
                tcp::Accepted::Unestablished(u) => u,
                tcp::Accepted::Ready(_) => panic!("set up at accept"),
            }
        };

        let mut stranger = TcpStream::connect(addr).await.unwrap();
        stranger.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let handed = accept().await;
        assert_eq!(handed.peer(), Some(stranger.local_addr().unwrap()));
        let err = handed.establish().await.unwrap_err();
        assert!(
            matches!(err, TransportError::Protocol(ref t) if t.contains("not an rfabric tcp peer")),
            "{err}"
        );

        let client = tokio::spawn(tcp::connect(addr));
        let handed = accept().await;
        let here = std::thread::current().id();
        let serving = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let conn = Arc::new(handed.establish().await.unwrap());
                let link = Link::establish(conn, LinkConfig::new(Role::Server, 2, 1024))
                    .await
                    .unwrap();
                // Echoes one message, then says goodbye after the client.
                let Some(Incoming::Message(m)) = link.recv().await.unwrap() else {
                    panic!("no message");
                };
                link.send_message(&m).await.unwrap();
                while link.recv().await.unwrap().is_some() {}
                link.finish().await.unwrap();
                std::thread::current().id()
            })
        });
        let conn = Arc::new(client.await.unwrap().unwrap());
        let link = Link::establish(conn, LinkConfig::new(Role::Client, 2, 1024))
            .await
            .unwrap();
        link.send_message(b"served elsewhere").await.unwrap();
        match link.recv().await.unwrap() {
            Some(Incoming::Message(m)) => assert_eq!(m, b"served elsewhere"),
            other => panic!("{other:?}"),
        }
        link.finish().await.unwrap();
        let served_on = tokio::task::spawn_blocking(move || serving.join().unwrap())
            .await
            .unwrap();
        assert_ne!(served_on, here);
    });
}

/// A peer that reports why it gives up and resets the connection: the
/// next send fails (the reset), yet the report, which arrived before the
/// reset, is still handed over. (Both sit in the socket before either of
/// the connection's tasks runs, and the writer goes first: it used to stop
/// the reader on the spot, which then dropped the report about half the
/// time, hence the rounds.)
#[test]
fn what_arrived_before_a_reset_is_delivered_though_a_send_failed() {
    for round in 0..8 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (accept, mut stream) = raw_server().await;
            stream.write_all(&PREFACE).await.unwrap();
            let conn = accept.await.unwrap().unwrap();
            let mut preface = [0u8; PREFACE.len()];
            stream.read_exact(&mut preface).await.unwrap();
            let memory = rfabric::memory::Memory::new(4096).unwrap();
            let region = conn
                .register(&memory, rfabric::transport::Access::LOCAL, None)
                .unwrap();
            // SAFETY: the buffer is read only after its completion.
            unsafe { conn.post_recv(1, region.segment(0, 64).unwrap()) }.unwrap();
            let report = b"your seal failed";
            let header = FrameHeader {
                op: FrameOp::Send,
                len: report.len() as u32,
                addr: 0,
                rkey: 0,
                note: 0,
            };
            // (One write: Nagle would hold a second small one back, and
            // the reset would then discard it unsent.)
            let frame = [&header.encode()[..], report].concat();
            stream.write_all(&frame).await.unwrap();
            stream.set_zero_linger().unwrap();
            drop(stream);
            // The report and the reset arrive while no task runs.
            std::thread::sleep(std::time::Duration::from_millis(100));
            // Two sends, so the writer has a batch and goes at once.
            for wr_id in [2, 3] {
                // SAFETY: the buffer is not written until the send completes.
                unsafe { conn.post_send(wr_id, &[region.segment(1024, 8).unwrap()]) }.unwrap();
            }
            let mut heard = None;
            let mut sent = None;
            loop {
                let mut out = Vec::new();
                if completions(&conn, &mut out).await.is_err() {
                    break;
                }
                for c in out {
                    match c.wr_id {
                        1 => heard = Some(c),
                        _ => sent = Some(c),
                    }
                }
            }
            let sent = sent.expect("the send completed");
            assert!(
                sent.status.is_err(),
                "round {round}: the send after a reset succeeded"
            );
            let heard = heard.expect("the receive completed");
            assert!(
                heard.status.is_ok(),
                "round {round}: the report was dropped: {heard:?}"
            );
            // SAFETY: receive 1 completed.
            let got = unsafe { region.memory().slice(0, heard.byte_len as usize) };
            assert_eq!(got, report, "round {round}");
        });
    }
}
