//! Shared set-up for the integration tests.
//!
//! The link conformance tests run on whichever backend
//! `RFABRIC_TEST_TRANSPORT` names: `tcp` (the default, on 127.0.0.1),
//! `memory` (the in-process backend), `rdma` (verbs with
//! write-with-immediate) or `rdma-send` (verbs with the write-then-send
//! fallback), the latter two on `RFABRIC_TEST_RDMA_ADDR`
//! (default 10.77.0.1, the address the VM harness gives its Soft-RoCE
//! device).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use rfabric::link::{Link, LinkConfig};
use rfabric::transport::Connection;
use rfabric::transport::tcp::{self, TcpConnection, TcpListener};
use rfabric::transport::verbs::{self, NotifyMode, VerbsListener, VerbsOptions};

/// Two connected tcp-backend connections on 127.0.0.1.
pub async fn connected_pair() -> (TcpConnection, TcpConnection) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (server, client) = tokio::join!(listener.accept(), tcp::connect(addr));
    (server.unwrap(), client.unwrap())
}

/// The backend under test, from the environment.
pub fn backend() -> &'static str {
    match std::env::var("RFABRIC_TEST_TRANSPORT").as_deref() {
        Ok("rdma") => "rdma",
        Ok("rdma-send") => "rdma-send",
        Ok("memory") => "memory",
        Ok("tcp") | Err(_) => "tcp",
        Ok(other) => {
            panic!("RFABRIC_TEST_TRANSPORT={other}: expected tcp, memory, rdma or rdma-send")
        }
    }
}

/// A fresh port for each rdma_cm listener (its bound port cannot be read
/// back through sideway).
fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 20_000) as u16;
    base + NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A connected (server, client) pair on the backend under test.
pub async fn connected() -> (Arc<dyn Connection>, Arc<dyn Connection>) {
    let notify = match backend() {
        "tcp" => {
            let (a, b) = connected_pair().await;
            return (Arc::new(a), Arc::new(b));
        }
        "memory" => {
            let (a, b) = rfabric::transport::memory::pair();
            return (Arc::new(a), Arc::new(b));
        }
        "rdma" => NotifyMode::WriteWithImm,
        _ => NotifyMode::WriteThenSend,
    };
    let ip = std::env::var("RFABRIC_TEST_RDMA_ADDR").unwrap_or_else(|_| "10.77.0.1".into());
    let addr: SocketAddr = format!("{ip}:{}", next_port()).parse().unwrap();
    let options = VerbsOptions {
        notify,
        ..VerbsOptions::default()
    };
    let listener = VerbsListener::bind(addr, options).unwrap();
    let (server, client) = tokio::join!(listener.accept(), verbs::connect(addr, options));
    let (server, client) = (server.unwrap(), client.unwrap());
    assert_eq!(server.backend(), rfabric::transport::Backend::Rdma);
    (Arc::new(server), Arc::new(client))
}

/// An established link pair: (server, client).
pub async fn link_pair(server: LinkConfig, client: LinkConfig) -> (Link, Link) {
    let (a, b) = connected().await;
    let (s, c) = tokio::join!(Link::establish(a, server), Link::establish(b, client));
    (s.unwrap(), c.unwrap())
}

/// Deterministic bytes for chunk `stream`/`offset`, so the receiver can
/// check every byte without a copy of the sender's data.
pub fn pattern(owner: u64, offset: u64, len: usize) -> Vec<u8> {
    test_support::pattern(
        len,
        owner.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ offset.wrapping_add(1),
    )
}
