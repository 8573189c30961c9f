use super::*;
use crate::nbd::consts::cmd;
use proptest::prelude::*;

fn request(kind: u16, cookie: u64) -> Request {
    Request {
        flags: 1,
        kind,
        cookie,
        offset: 4096,
        length: 512,
    }
}

fn any_msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        (any::<u16>(), "[a-z0-9/._-]{0,40}", any::<[u8; 32]>())
            .prop_map(|(version, name, tag)| Msg::Open { version, name, tag }),
        (any::<u64>(), any::<u16>(), any::<u32>()).prop_map(|(size, flags, max_request)| {
            Msg::Opened {
                size,
                flags,
                max_request,
            }
        }),
        ".{0,60}".prop_map(|text| Msg::Refused { text }),
        (any::<[u8; 32]>(), any::<bool>(), any::<bool>()).prop_map(|(nonce, required, encrypt)| {
            Msg::Challenge {
                nonce,
                required,
                encrypt,
            }
        }),
        (any::<[u8; 32]>(), any::<[u8; 32]>(), any::<bool>()).prop_map(
            |(nonce, proof, encrypt)| Msg::Auth {
                nonce,
                proof,
                encrypt
            }
        ),
        any::<[u8; 32]>().prop_map(|proof| Msg::AuthOk { proof }),
        (
            any::<u16>(),
            any::<u16>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(
                |(flags, kind, cookie, offset, length)| Msg::Request(Request {
                    flags,
                    kind,
                    cookie,
                    offset,
                    length
                })
            ),
        (any::<u64>(), any::<u32>(), ".{0,60}").prop_map(|(id, error, text)| Msg::Reply {
            id,
            error,
            text
        }),
        (
            any::<u64>(),
            prop::collection::vec((any::<u32>(), any::<u32>()), 0..20)
        )
            .prop_map(|(id, e)| Msg::Extents {
                id,
                extents: e
                    .into_iter()
                    .map(|(length, flags)| Extent { length, flags })
                    .collect(),
            }),
    ]
}

proptest! {
    #[test]
    fn every_message_survives_a_round_trip(m in any_msg()) {
        prop_assert_eq!(Msg::decode(&m.encode()), Ok(m));
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = Msg::decode(&b);
    }

    #[test]
    fn a_cut_message_is_refused(m in any_msg(), cut in 1usize..8) {
        let b = m.encode();
        // Only fixed-length messages must notice a missing byte; the others
        // end with free text, which may be cut anywhere but in UTF-8.
        if matches!(
            m,
            Msg::Opened { .. } | Msg::Request(_) | Msg::Challenge { .. } | Msg::Auth { .. } | Msg::AuthOk { .. }
        ) {
            let short = &b[..b.len() - cut.min(b.len() - 1)];
            prop_assert!(Msg::decode(short).is_err());
        }
    }
}

#[test]
fn malformed_messages_say_what_is_wrong() {
    assert_eq!(Msg::decode(&[]), Err(ProtoError::Empty));
    assert_eq!(Msg::decode(&[99]), Err(ProtoError::Tag(99)));
    let mut opened = Msg::Opened {
        size: 1,
        flags: 0,
        max_request: 1,
    }
    .encode();
    opened.push(0);
    assert!(matches!(
        Msg::decode(&opened),
        Err(ProtoError::Length { what: "opened", .. })
    ));
    // A request whose header has the wrong magic.
    let mut req = Msg::Request(request(cmd::READ, 7)).encode();
    req[1] ^= 0xff;
    assert!(matches!(Msg::decode(&req), Err(ProtoError::Header(_))));
    // Extents must come in whole pairs.
    let mut ext = Msg::Extents {
        id: 1,
        extents: vec![Extent {
            length: 4096,
            flags: 0,
        }],
    }
    .encode();
    ext.pop();
    assert!(matches!(
        Msg::decode(&ext),
        Err(ProtoError::Length {
            what: "extents",
            ..
        })
    ));
    // A name that is not UTF-8.
    let mut bad_name = vec![1, 1, 0];
    bad_name.extend_from_slice(&[0; 32]);
    bad_name.extend_from_slice(&[0xff, 0xfe]);
    assert_eq!(
        Msg::decode(&bad_name),
        Err(ProtoError::Text("the export name"))
    );
    let long = Msg::Open {
        version: VERSION,
        name: "x".repeat(MAX_NAME + 1),
        tag: [0; 32],
    };
    assert!(matches!(
        Msg::decode(&long.encode()),
        Err(ProtoError::Length { what: "open", .. })
    ));
}

#[test]
fn an_open_tag_binds_version_protection_and_name_to_the_key() {
    let key = [3u8; 32];
    let t = open_tag(&key, VERSION, true, "disk");
    assert!(check_open_tag(&key, VERSION, true, "disk", &t));
    assert!(!check_open_tag(&key, VERSION, true, "disk2", &t));
    assert!(!check_open_tag(&key, VERSION, false, "disk", &t));
    assert!(!check_open_tag(&key, VERSION - 1, true, "disk", &t));
    assert!(!check_open_tag(&[4; 32], VERSION, true, "disk", &t));
}

#[test]
fn a_write_tag_carries_its_request_and_must_match_the_chunk() {
    let r = request(cmd::WRITE, 42);
    let tag = write_tag(&r);
    assert_eq!(write_request(&tag, 42), Ok(r));
    assert!(write_request(&tag, 43).is_err());
    let mut padded = tag;
    padded[31] = 1;
    assert!(write_request(&padded, 42).is_err());
    assert!(write_request(&[0u8; 32], 0).is_err());
}

#[test]
fn extents_fit_the_message_size() {
    let n = max_extents(16 * 1024);
    let m = Msg::Extents {
        id: u64::MAX,
        extents: vec![
            Extent {
                length: 1,
                flags: 0
            };
            n
        ],
    };
    assert!(m.encode().len() <= 16 * 1024);
    let one_more = Msg::Extents {
        id: 0,
        extents: vec![
            Extent {
                length: 1,
                flags: 0
            };
            n + 1
        ],
    };
    assert!(one_more.encode().len() > 16 * 1024);
}
