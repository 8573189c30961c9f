use proptest::prelude::*;

use super::*;

fn hello() -> Hello {
    Hello {
        version: VERSION,
        role: Role::Client,
        features: 0b101,
        ring: RingDescriptor {
            addr: 0x7f12_3456_0000,
            rkey: 0x1234,
            slot_count: 16,
            slot_size: 1 << 20,
        },
        control_depth: 16,
        control_size: 4096,
    }
}

fn encode(frame: &Frame<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; frame.encoded_len()];
    assert_eq!(frame.encode(&mut buf), buf.len());
    buf
}

fn credit() -> CreditUpdate {
    CreditUpdate {
        grant_limit: 1 << 40,
        control_return: 3,
    }
}

#[test]
fn every_body_round_trips() {
    let bodies = [
        Body::Hello(hello()),
        Body::Credit,
        Body::Error {
            code: ErrorCode::Refused,
            text: "no such export — sorry",
        },
        Body::Goodbye { reason: 7 },
        Body::App(b"hello app"),
    ];
    for body in bodies {
        let frame = Frame {
            credit: credit(),
            body,
        };
        let bytes = encode(&frame);
        assert_eq!(Frame::decode(&bytes), Ok(frame));
    }
}

#[test]
fn header_layout_is_little_endian_as_documented() {
    let bytes = encode(&Frame {
        credit: CreditUpdate {
            grant_limit: 0x0102_0304_0506_0708,
            control_return: 0x0a0b_0c0d,
        },
        body: Body::Goodbye { reason: 0x11 },
    });
    assert_eq!(
        bytes,
        [
            b'R', b'F', 4, 0, 8, 0, 0, 0, // magic, kind, flags, body_len
            8, 7, 6, 5, 4, 3, 2, 1, // grant_limit
            0x0d, 0x0c, 0x0b, 0x0a, 0, 0, 0, 0, // control_return, reserved
            0x11, 0, 0, 0, 0, 0, 0, 0, // reason, reserved
        ]
    );
}

fn decode_err(bytes: &[u8]) -> WireError {
    Frame::decode(bytes).expect_err("must be refused")
}

fn hello_bytes(edit: impl FnOnce(&mut Hello)) -> Vec<u8> {
    let mut h = hello();
    edit(&mut h);
    encode(&Frame {
        credit: CreditUpdate::default(),
        body: Body::Hello(h),
    })
}

#[test]
fn truncated_and_oversized_frames_are_refused() {
    let good = hello_bytes(|_| {});
    assert_eq!(
        decode_err(&good[..10]),
        WireError::Truncated { need: 24, got: 10 }
    );
    assert_eq!(
        decode_err(&good[..good.len() - 1]),
        WireError::LengthMismatch {
            declared: 40,
            actual: 39
        }
    );
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(
        decode_err(&long),
        WireError::LengthMismatch { .. }
    ));
    let huge = vec![0u8; MAX_CONTROL_SIZE as usize + 1];
    assert!(matches!(decode_err(&huge), WireError::Oversized { .. }));
}

#[test]
fn header_fields_are_checked() {
    let good = encode(&Frame {
        credit: credit(),
        body: Body::Credit,
    });
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(decode_err(&b), WireError::BadMagic(_)));
    let mut b = good.clone();
    b[2] = 99;
    assert_eq!(decode_err(&b), WireError::UnknownKind(99));
    let mut b = good.clone();
    b[3] = 1;
    assert!(matches!(
        decode_err(&b),
        WireError::BadField {
            field: "frame.flags",
            ..
        }
    ));
    let mut b = good.clone();
    b[23] = 1;
    assert!(matches!(
        decode_err(&b),
        WireError::BadField {
            field: "frame.reserved",
            ..
        }
    ));
    let mut b = good;
    b[4] = 1; // credit with a body
    b.push(0);
    assert!(matches!(decode_err(&b), WireError::LengthMismatch { .. }));
}

#[test]
fn wrong_version_is_named_even_with_another_length() {
    let mut b = hello_bytes(|h| h.version = 3);
    assert_eq!(
        decode_err(&b),
        WireError::Version {
            got: 3,
            supported: 2
        }
    );
    // A future hello may be longer: still a version error, not a length one.
    b.extend_from_slice(&[0; 8]);
    b[4] += 8;
    assert_eq!(
        decode_err(&b),
        WireError::Version {
            got: 3,
            supported: 2
        }
    );
}

#[test]
fn hello_fields_are_range_checked() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "hello.slot_count",
            hello_bytes(|h| h.ring.slot_count = MAX_SLOTS + 1),
        ),
        (
            "hello.slot_size",
            hello_bytes(|h| h.ring.slot_size = CHUNK_HEADER_LEN as u32),
        ),
        (
            "hello.slot_size",
            hello_bytes(|h| h.ring.slot_size = MAX_SLOT_SIZE + 1),
        ),
        (
            "hello.ring_addr",
            hello_bytes(|h| h.ring.addr = u64::MAX - 10),
        ),
        (
            "hello.control_depth",
            hello_bytes(|h| h.control_depth = MIN_CONTROL_DEPTH - 1),
        ),
        (
            "hello.control_depth",
            hello_bytes(|h| h.control_depth = MAX_CONTROL_DEPTH + 1),
        ),
        (
            "hello.control_size",
            hello_bytes(|h| h.control_size = MIN_CONTROL_SIZE - 1),
        ),
        (
            "hello.control_size",
            hello_bytes(|h| h.control_size = MAX_CONTROL_SIZE + 1),
        ),
    ];
    for (field, bytes) in cases {
        match decode_err(&bytes) {
            WireError::BadField { field: f, .. } => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    let mut b = hello_bytes(|_| {});
    b[24 + 2] = 3;
    assert!(matches!(
        decode_err(&b),
        WireError::BadField {
            field: "hello.role",
            ..
        }
    ));
    let mut b = hello_bytes(|_| {});
    b[24 + 36] = 1;
    assert!(matches!(
        decode_err(&b),
        WireError::BadField {
            field: "hello.reserved2",
            ..
        }
    ));
    // A receiver of no chunks may leave the rest of the ring zero.
    let none = hello_bytes(|h| h.ring = RingDescriptor::default());
    assert!(Frame::decode(&none).is_ok());
}

#[test]
fn error_and_goodbye_and_app_bodies_are_checked() {
    let err = encode(&Frame {
        credit: CreditUpdate::default(),
        body: Body::Error {
            code: ErrorCode::Protocol,
            text: "x",
        },
    });
    let mut b = err.clone();
    b[24] = 42;
    assert!(matches!(
        decode_err(&b),
        WireError::BadField {
            field: "error.code",
            ..
        }
    ));
    let mut b = err.clone();
    b[32] = 0xff; // not UTF-8
    assert_eq!(decode_err(&b), WireError::BadText);
    let mut b = err.clone();
    b[28] = 2; // text length beyond the body
    assert!(matches!(decode_err(&b), WireError::LengthMismatch { .. }));
    let mut b = err;
    b[28..30].copy_from_slice(&(MAX_ERROR_TEXT as u16 + 1).to_le_bytes());
    assert!(matches!(decode_err(&b), WireError::Oversized { .. }));

    let mut bye = encode(&Frame {
        credit: CreditUpdate::default(),
        body: Body::Goodbye { reason: 0 },
    });
    bye[30] = 1;
    assert!(matches!(
        decode_err(&bye),
        WireError::BadField {
            field: "goodbye.reserved",
            ..
        }
    ));

    let empty_app = encode(&Frame {
        credit: CreditUpdate::default(),
        body: Body::App(b"x"),
    });
    let mut b = empty_app[..24].to_vec();
    b[4] = 0;
    assert_eq!(decode_err(&b), WireError::Truncated { need: 1, got: 0 });
}

#[test]
fn long_error_text_is_cut_at_a_char_boundary() {
    let text = "é".repeat(MAX_ERROR_TEXT);
    let bytes = encode(&Frame {
        credit: CreditUpdate::default(),
        body: Body::Error {
            code: ErrorCode::Internal,
            text: &text,
        },
    });
    let Body::Error { text: got, .. } = Frame::decode(&bytes).unwrap().body else {
        panic!("not an error");
    };
    assert_eq!(got.len(), MAX_ERROR_TEXT);
    assert!(text.starts_with(got));
}

fn chunk() -> ChunkHeader {
    ChunkHeader {
        payload_len: 100,
        owner: 3,
        offset: 1 << 33,
        flags: chunk_flags::DIGEST | chunk_flags::END_OF_STREAM,
        note: 77,
        digest: [0xab; 32],
        tag: [0xcd; 16],
    }
}

#[test]
fn chunk_header_round_trips_and_is_checked() {
    let h = chunk();
    let mut slot = vec![0u8; 256];
    slot[..CHUNK_HEADER_LEN].copy_from_slice(&h.encode());
    assert_eq!(ChunkHeader::decode(&slot, 180, 192, 77), Ok(h));
    assert!(matches!(
        ChunkHeader::decode(&slot, 180, 99, 77),
        Err(WireError::Oversized { len: 100, max: 99 })
    ));
    assert!(matches!(
        ChunkHeader::decode(&slot, 181, 192, 77),
        Err(WireError::LengthMismatch { .. })
    ));
    assert!(matches!(
        ChunkHeader::decode(&slot, 180, 192, 78),
        Err(WireError::BadField {
            field: "chunk.note",
            ..
        })
    ));
    assert!(matches!(
        ChunkHeader::decode(&slot, 10, 192, 77),
        Err(WireError::Truncated { .. })
    ));
    let mut bad = slot.clone();
    bad[0] = 0;
    assert!(matches!(
        ChunkHeader::decode(&bad, 180, 192, 77),
        Err(WireError::BadMagic(_))
    ));
    let mut bad = slot;
    bad[24] = 0x80;
    assert!(matches!(
        ChunkHeader::decode(&bad, 180, 192, 77),
        Err(WireError::BadField {
            field: "chunk.flags",
            ..
        })
    ));
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Frame::decode(&bytes);
        let _ = ChunkHeader::decode(&bytes, bytes.len(), 1 << 20, 0);
    }

    #[test]
    fn app_frames_round_trip(payload in proptest::collection::vec(any::<u8>(), 1..500),
                             grant_limit: u64, control_return: u32) {
        let frame = Frame { credit: CreditUpdate { grant_limit, control_return }, body: Body::App(&payload) };
        let bytes = encode(&frame);
        prop_assert_eq!(Frame::decode(&bytes), Ok(frame));
    }

    #[test]
    fn mutated_frames_decode_to_valid_values_or_errors(seed in proptest::collection::vec(any::<(u16, u8)>(), 1..6)) {
        let mut bytes = hello_bytes(|_| {});
        for (pos, val) in seed {
            let pos = pos as usize % bytes.len();
            bytes[pos] = val;
        }
        if let Ok(frame) = Frame::decode(&bytes) {
            // Anything accepted re-encodes to exactly the same bytes.
            prop_assert_eq!(encode(&frame), bytes);
        }
    }
}

#[test]
fn error_text_is_fitted_to_a_frame_size() {
    let text = "ä".repeat(100);
    let fitted = fit_error_text(&text, MIN_CONTROL_SIZE as usize);
    assert!(fitted.len() <= MIN_CONTROL_SIZE as usize - FRAME_HEADER_LEN - 8);
    assert!(text.starts_with(fitted) && !fitted.is_empty());
    let frame = Frame {
        credit: CreditUpdate::default(),
        body: Body::Error {
            code: ErrorCode::Protocol,
            text: fitted,
        },
    };
    assert!(frame.encoded_len() <= MIN_CONTROL_SIZE as usize);
    assert_eq!(fit_error_text("short", 1 << 20), "short");
}
