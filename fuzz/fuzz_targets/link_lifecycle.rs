//! A link's hello-to-goodbye rules ([`rfabric::link::lifecycle`]) under
//! any sequence of frames heard, sends, goodbyes, failures and connection
//! losses: never a panic; nothing is sent after this side's goodbye or a
//! failure; the peer is never heard after its goodbye except for credit
//! updates; the first failure stays the link's error; a link whose both
//! goodbyes were said never fails afterwards.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rfabric::link::LinkError;
use rfabric::link::lifecycle::{Heard, Lifecycle};
use rfabric::transport::TransportError;

fuzz_target!(|data: &[u8]| {
    let mut l = Lifecycle::new();
    let mut peer_goodbye = false;
    let mut our_goodbye = false;
    let mut first_error: Option<LinkError> = None;
    for &op in data {
        // (Only a close with sends still in flight fails an orderly link.)
        let in_flight_close = op % 9 == 7 && op & 0x80 == 0;
        let orderly_before = l.is_orderly() && first_error.is_none() && !in_flight_close;
        match op % 9 {
            0..=3 => {
                let h = [Heard::Hello, Heard::Credit, Heard::Goodbye, Heard::App][op as usize % 4];
                let r = l.heard(h);
                if h != Heard::Credit && peer_goodbye {
                    assert!(r.is_err(), "{h:?} taken after the peer's goodbye");
                }
                if h == Heard::Hello {
                    assert!(r.is_err(), "a second hello taken");
                }
                if h == Heard::Goodbye && r.is_ok() {
                    peer_goodbye = true;
                }
                if let Err(e) = r {
                    if l.fail(e.clone()).is_some() {
                        first_error.get_or_insert(e);
                    }
                }
            }
            4 => {
                if l.chunk_landed().is_ok() {
                    assert!(!peer_goodbye, "a chunk taken after the peer's goodbye");
                }
            }
            5 => match l.may_send() {
                Ok(()) => {
                    assert!(!our_goodbye && first_error.is_none());
                    if op & 0x80 != 0 {
                        l.said_goodbye();
                        our_goodbye = true;
                    }
                }
                Err(LinkError::Finished) => assert!(our_goodbye && first_error.is_none()),
                Err(e) => assert_eq!(Some(&e), first_error.as_ref()),
            },
            6 => {
                let e = LinkError::Protocol(format!("local {op}"));
                if l.fail(e.clone()).is_some() {
                    assert!(first_error.is_none() && !l.is_orderly());
                    first_error = Some(e);
                }
            }
            7 => {
                let nothing = op & 0x80 != 0;
                l.connection_down(TransportError::Closed("down".into()), nothing);
                if first_error.is_none() && l.is_failed() {
                    first_error = Some(LinkError::Transport(TransportError::Closed("down".into())));
                    assert!(!(l.is_orderly() && nothing));
                }
            }
            _ => {
                if let Some(r) = l.receive_end() {
                    match r {
                        Ok(()) => assert!(peer_goodbye && first_error.is_none()),
                        Err(e) => assert_eq!(Some(e), first_error.clone()),
                    }
                }
                if let Some(Ok(())) = l.finished(true) {
                    assert!(peer_goodbye && first_error.is_none());
                }
            }
        }
        if orderly_before {
            assert!(!l.is_failed(), "an orderly link failed afterwards");
        }
    }
});
