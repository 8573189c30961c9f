use super::*;
use crate::wire::{ErrorCode, RingDescriptor};

fn hello(role: Role, slots: u32) -> Hello {
    Hello {
        version: crate::wire::VERSION,
        role,
        features: 0,
        ring: RingDescriptor {
            addr: 0x1000,
            rkey: 7,
            slot_count: slots,
            slot_size: 4096,
        },
        control_depth: 16,
        control_size: 4096,
    }
}

fn frame(body: Body<'_>, grant_limit: u64, control_return: u32) -> Frame<'_> {
    Frame {
        credit: CreditUpdate {
            grant_limit,
            control_return,
        },
        body,
    }
}

#[test]
fn a_hello_from_the_other_role_with_its_ring_as_credit_is_taken() {
    let h = hello(Role::Server, 8);
    assert_eq!(
        check_hello(Role::Client, &frame(Body::Hello(h), 8, 0)),
        Ok(h)
    );
}

#[test]
fn a_wrong_first_frame_is_refused() {
    let text = |r: Result<Hello, LinkError>| r.unwrap_err().to_string();
    assert!(text(check_hello(Role::Client, &frame(Body::Credit, 0, 0))).contains("not a hello"));
    assert!(
        text(check_hello(
            Role::Client,
            &frame(Body::Hello(hello(Role::Client, 8)), 8, 0)
        ))
        .contains("both ends are Clients")
    );
    for (grant, ret) in [(9, 0), (8, 1), (0, 0)] {
        assert!(
            text(check_hello(
                Role::Server,
                &frame(Body::Hello(hello(Role::Client, 8)), grant, ret)
            ))
            .contains("stray credits"),
            "{grant}/{ret}"
        );
    }
}

#[test]
fn after_the_peers_goodbye_only_credit_updates_may_come() {
    let mut l = Lifecycle::new();
    l.heard(Heard::App).unwrap();
    l.chunk_landed().unwrap();
    assert_eq!(l.receive_end(), None);
    l.heard(Heard::Goodbye).unwrap();
    assert_eq!(l.receive_end(), Some(Ok(())));
    l.heard(Heard::Credit).unwrap();
    for h in [Heard::App, Heard::Goodbye, Heard::Hello] {
        assert!(l.heard(h).is_err(), "{h:?}");
    }
    assert!(l.chunk_landed().is_err());
    assert!(
        l.may_send().is_ok(),
        "this side still sends until its own goodbye"
    );
}

#[test]
fn a_second_hello_is_refused() {
    let mut l = Lifecycle::new();
    assert_eq!(
        l.heard(Heard::Hello),
        Err(LinkError::Protocol("second hello".into()))
    );
}

#[test]
fn nothing_is_sent_after_this_sides_goodbye() {
    let mut l = Lifecycle::new();
    l.said_goodbye();
    assert_eq!(l.may_send(), Err(LinkError::Finished));
    assert_eq!(
        l.finished(true),
        None,
        "the peer's goodbye is still to come"
    );
    l.heard(Heard::Goodbye).unwrap();
    assert_eq!(l.finished(false), None, "a send is still in flight");
    assert_eq!(l.finished(true), Some(Ok(())));
}

#[test]
fn the_first_failure_wins_and_is_told_unless_the_peer_or_connection_failed() {
    let mut l = Lifecycle::new();
    let e = LinkError::Protocol("x".into());
    assert_eq!(l.fail(e.clone()), Some(true));
    assert_eq!(l.fail(LinkError::Protocol("y".into())), None);
    assert_eq!(l.may_send(), Err(e.clone()));
    assert_eq!(l.receive_end(), Some(Err(e.clone())));
    assert_eq!(l.finished(true), Some(Err(e)));

    let mut l = Lifecycle::new();
    let peer = LinkError::Peer {
        code: ErrorCode::Protocol,
        text: "no".into(),
    };
    assert_eq!(l.fail(peer), Some(false));
    let mut l = Lifecycle::new();
    assert_eq!(
        l.fail(LinkError::Transport(TransportError::Closed("x".into()))),
        Some(false)
    );
}

#[test]
fn the_connection_closing_after_both_goodbyes_is_no_failure() {
    let closed = || TransportError::Closed("flushed".into());
    let mut l = Lifecycle::new();
    l.said_goodbye();
    l.heard(Heard::Goodbye).unwrap();
    assert_eq!(l.fail(LinkError::Protocol("late".into())), None);
    l.connection_down(closed(), true);
    assert!(!l.is_failed());

    let mut l = Lifecycle::new();
    l.said_goodbye();
    l.heard(Heard::Goodbye).unwrap();
    l.connection_down(closed(), false);
    assert!(l.is_failed(), "sends were still in flight");

    let mut l = Lifecycle::new();
    l.said_goodbye();
    l.connection_down(closed(), true);
    assert!(l.is_failed(), "the peer never said goodbye");
}
