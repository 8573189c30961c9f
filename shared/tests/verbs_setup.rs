//! Setting up verbs connections, and the errors a user sees when it cannot
//! be done. The first test runs everywhere (a machine without RDMA says so);
//! the others need a device and run in the VM tier
//! (`RFABRIC_TEST_TRANSPORT=rdma`).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use rfabric::transport::verbs::{self, VerbsListener, VerbsOptions};
use rfabric::transport::{TransportError, closed_reason};

fn on_rdma() -> bool {
    common::backend() != "tcp"
}

fn rdma_addr(port: u16) -> SocketAddr {
    let ip = std::env::var("RFABRIC_TEST_RDMA_ADDR").unwrap_or_else(|_| "10.77.0.1".into());
    format!("{ip}:{port}").parse().unwrap()
}

#[tokio::test]
async fn an_address_no_rdma_device_routes_to_is_unavailable() {
    // Loopback has no RDMA device here nor in the VM (rxe sits on dummy0);
    // on a machine without an RDMA stack at all the answer is the same.
    let err = verbs::connect("127.0.0.1:7471".parse().unwrap(), VerbsOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, TransportError::Unavailable(_)), "{err}");
    assert!(err.to_string().starts_with("RDMA unavailable"), "{err}");
}

#[tokio::test]
async fn nobody_listening_is_a_clear_refusal() {
    if !on_rdma() {
        return;
    }
    let options = VerbsOptions {
        timeout: Duration::from_secs(5),
        ..VerbsOptions::default()
    };
    let err = verbs::connect(rdma_addr(7), options).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("rejected") || text.contains("unreachable"),
        "{text}"
    );
}

#[tokio::test]
async fn limits_come_from_the_device() {
    if !on_rdma() {
        return;
    }
    let (server, client) = common::connected().await;
    for conn in [&server, &client] {
        let l = conn.limits();
        assert!(
            l.max_send_wr >= 16 && l.max_send_wr <= VerbsOptions::default().send_wr,
            "{l:?}"
        );
        assert!(
            l.max_recv_wr >= 16 && l.max_recv_wr <= VerbsOptions::default().recv_wr,
            "{l:?}"
        );
        assert!(l.max_sge >= 1 && l.max_sge <= 4, "{l:?}");
        assert!(l.max_msg >= 1 << 20, "{l:?}");
    }
}

#[tokio::test]
async fn a_peer_that_disconnects_ends_the_connection_with_a_reason() {
    if !on_rdma() {
        return;
    }
    let (server, client) = common::connected().await;
    drop(server);
    let err = tokio::time::timeout(Duration::from_secs(10), closed_reason(&*client))
        .await
        .expect("the disconnect was noticed");
    assert!(err.to_string().contains("peer disconnected"), "{err}");
}

#[tokio::test]
async fn a_second_listener_on_the_same_port_is_refused() {
    if !on_rdma() {
        return;
    }
    let addr = rdma_addr(7472);
    let _first = VerbsListener::bind(addr, VerbsOptions::default()).unwrap();
    let err = VerbsListener::bind(addr, VerbsOptions::default()).unwrap_err();
    assert!(err.to_string().contains("cannot bind"), "{err}");
}
