//! Shared set-up for the loopback tests.
#![allow(dead_code)]

use std::sync::Arc;

use rfabric::link::{Link, LinkConfig};
use rfabric::transport::Connection;
use rfabric::transport::tcp::{self, TcpConnection, TcpListener};

/// Two connected tcp-backend connections on 127.0.0.1.
pub async fn connected_pair() -> (TcpConnection, TcpConnection) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (server, client) = tokio::join!(listener.accept(), tcp::connect(addr));
    (server.unwrap(), client.unwrap())
}

/// An established link pair: (server, client).
pub async fn link_pair(server: LinkConfig, client: LinkConfig) -> (Link, Link) {
    let (a, b) = connected_pair().await;
    let a: Arc<dyn Connection> = Arc::new(a);
    let b: Arc<dyn Connection> = Arc::new(b);
    let (s, c) = tokio::join!(Link::establish(a, server), Link::establish(b, client));
    (s.unwrap(), c.unwrap())
}

/// Deterministic bytes for chunk `stream`/`offset`, so the receiver can
/// check every byte without a copy of the sender's data.
pub fn pattern(stream: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut x = stream.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ offset.wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
