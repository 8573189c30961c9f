use proptest::prelude::*;

use super::*;
use crate::wire::{Body, CHUNK_HEADER_SEALED_LEN, ChunkHeader, CreditUpdate, Frame, chunk_flags};

const KEY: [u8; 32] = [7; 32];
const BOTH: [Protection; 2] = [Protection::Authenticate, Protection::Encrypt];

/// An encoded frame with room for a tag.
fn frame(body: Body<'_>, grant: u64) -> (Vec<u8>, usize) {
    let frame = Frame {
        credit: CreditUpdate {
            grant_limit: grant,
            control_return: 1,
        },
        body,
    };
    let mut buf = vec![0u8; frame.encoded_len() + TAG_LEN];
    let len = frame.encode(&mut buf);
    (buf, len)
}

fn sealed(sealer: &mut Sealer, body: Body<'_>) -> Vec<u8> {
    let (mut buf, len) = frame(body, 9);
    let len = sealer.seal_frame(&mut buf, len);
    buf.truncate(len);
    buf
}

#[test]
fn a_sealed_frame_opens_to_the_frame_that_was_sealed() {
    for p in BOTH {
        let mut sealer = Sealer::new(p, &KEY);
        let mut opener = Opener::new(p, &KEY, Before::CreditsOnly);
        for i in 0..3u8 {
            let msg = [i; 40];
            let wire_bytes = sealed(&mut sealer, Body::App(&msg));
            let hidden = !wire_bytes.windows(msg.len()).any(|w| w == msg);
            assert_eq!(hidden, p == Protection::Encrypt, "{p:?}");
            let Opened::Sealed(plain) = opener.open_frame(&wire_bytes).unwrap() else {
                panic!("a sealed frame opened as plain");
            };
            let f = Frame::decode(&plain).unwrap();
            assert_eq!(f.body, Body::App(&msg));
            assert_eq!(f.credit.grant_limit, 9);
        }
    }
}

#[test]
fn replayed_reordered_or_dropped_frames_fail() {
    for p in BOTH {
        let mut sealer = Sealer::new(p, &KEY);
        let frames: Vec<_> = (0..3u8)
            .map(|i| sealed(&mut sealer, Body::App(&[i; 8])))
            .collect();
        // Replay.
        let mut opener = Opener::new(p, &KEY, Before::CreditsOnly);
        opener.open_frame(&frames[0]).unwrap();
        assert!(matches!(
            opener.open_frame(&frames[0]),
            Err(SealError::BadTag { .. })
        ));
        // Reorder.
        let mut opener = Opener::new(p, &KEY, Before::CreditsOnly);
        assert!(opener.open_frame(&frames[1]).is_err());
        // Drop the middle one.
        let mut opener = Opener::new(p, &KEY, Before::CreditsOnly);
        opener.open_frame(&frames[0]).unwrap();
        assert!(opener.open_frame(&frames[2]).is_err());
    }
}

#[test]
fn another_key_or_protection_fails_the_first_frame() {
    let mut sealer = Sealer::new(Protection::Encrypt, &KEY);
    let f = sealed(&mut sealer, Body::App(b"hello"));
    assert!(
        Opener::new(Protection::Encrypt, &[8; 32], Before::CreditsOnly)
            .open_frame(&f)
            .is_err()
    );
    assert!(
        Opener::new(Protection::Authenticate, &KEY, Before::CreditsOnly)
            .open_frame(&f)
            .is_err(),
        "a downgrade on the path is a different key"
    );
}

#[test]
fn unsealed_frames_pass_only_as_early_credits_or_errors() {
    let mut sealer = Sealer::new(Protection::Authenticate, &KEY);
    let mut opener = Opener::new(Protection::Authenticate, &KEY, Before::CreditsOnly);
    let (credit, len) = frame(Body::Credit, 3);
    assert_eq!(opener.open_frame(&credit[..len]), Ok(Opened::Plain));
    let (app, len) = frame(Body::App(b"forged"), 3);
    assert_eq!(
        opener.open_frame(&app[..len]),
        Err(SealError::Unsealed {
            kind: crate::wire::KIND_APP
        })
    );
    opener
        .open_frame(&sealed(&mut sealer, Body::App(b"real")))
        .unwrap();
    let (credit, len) = frame(Body::Credit, 4);
    assert!(matches!(
        opener.open_frame(&credit[..len]),
        Err(SealError::Unsealed { .. })
    ));
    let (error, len) = frame(
        Body::Error {
            code: crate::wire::ErrorCode::Protocol,
            text: "gave up",
        },
        0,
    );
    assert_eq!(opener.open_frame(&error[..len]), Ok(Opened::Plain));
}

#[test]
fn the_side_that_proved_first_hears_an_unsealed_refusal_but_nothing_after_the_first_seal() {
    let mut sealer = Sealer::new(Protection::Encrypt, &KEY);
    let mut opener = Opener::new(Protection::Encrypt, &KEY, Before::Anything);
    let (fail, len) = frame(Body::App(b"refused: wrong secret"), 0);
    assert_eq!(opener.open_frame(&fail[..len]), Ok(Opened::Plain));
    opener
        .open_frame(&sealed(&mut sealer, Body::App(b"proof")))
        .unwrap();
    assert!(matches!(
        opener.open_frame(&fail[..len]),
        Err(SealError::Unsealed { .. })
    ));
}

#[test]
fn a_frame_too_short_for_its_tag_is_refused() {
    let mut opener = Opener::new(Protection::Encrypt, &KEY, Before::CreditsOnly);
    let (mut buf, len) = frame(Body::Credit, 0);
    buf[3] |= SEALED;
    assert_eq!(
        opener.open_frame(&buf[..len]),
        Err(SealError::Short { len })
    );
}

fn chunk_header(flags: u32) -> ChunkHeader {
    ChunkHeader {
        payload_len: 100,
        owner: 3,
        offset: 4096,
        flags,
        note: 5,
        digest: [1; 32],
        tag: [0; TAG_LEN],
    }
}

#[test]
fn chunks_open_with_their_sequence_number_only() {
    for p in BOTH {
        for flags in [0, chunk_flags::DIGEST] {
            let sealer = Sealer::new(p, &KEY);
            let opener = Opener::new(p, &KEY, Before::CreditsOnly);
            let h = chunk_header(flags).encode();
            let covered = &h[..CHUNK_HEADER_SEALED_LEN];
            let digest_inside = flags != 0;
            let plain = vec![0xabu8; 100];
            let mut payload = plain.clone();
            let tag = sealer.seal_chunk(5, covered, &mut payload, digest_inside);
            // Only a payload a digest vouches for stays in clear under
            // Authenticate; every other is covered (and so encrypted) by GCM.
            let in_clear = p == Protection::Authenticate && digest_inside;
            assert_eq!(payload == plain, in_clear);
            let mut other_seq = payload.clone();
            assert!(
                opener
                    .open_chunk(6, covered, &mut other_seq, digest_inside, &tag)
                    .is_err()
            );
            opener
                .open_chunk(5, covered, &mut payload, digest_inside, &tag)
                .unwrap();
            assert_eq!(payload, plain);
        }
    }
}

#[test]
fn a_chunk_payload_is_covered_unless_a_digest_vouches_for_it() {
    for p in BOTH {
        for digest_inside in [false, true] {
            let sealer = Sealer::new(p, &KEY);
            let opener = Opener::new(p, &KEY, Before::CreditsOnly);
            let h = chunk_header(0).encode();
            let covered = &h[..CHUNK_HEADER_SEALED_LEN];
            let mut payload = vec![0x11u8; 100];
            let tag = sealer.seal_chunk(1, covered, &mut payload, digest_inside);
            payload[50] ^= 1;
            let caught = opener
                .open_chunk(1, covered, &mut payload, digest_inside, &tag)
                .is_err();
            // Under Authenticate with a digest inside, the receiver's digest
            // check is what catches it (rcp's, before anything is written).
            let expected = !(digest_inside && p == Protection::Authenticate);
            assert_eq!(caught, expected, "{p:?} digest_inside={digest_inside}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any single bit flipped anywhere in a sealed frame, header, body or
    /// tag, fails its check.
    #[test]
    fn any_flipped_bit_fails(
        body in proptest::collection::vec(any::<u8>(), 1..200),
        bit in any::<usize>(),
        encrypt in any::<bool>(),
    ) {
        let p = if encrypt { Protection::Encrypt } else { Protection::Authenticate };
        let mut sealer = Sealer::new(p, &KEY);
        let mut f = sealed(&mut sealer, Body::App(&body));
        let bit = bit % (f.len() * 8);
        f[bit / 8] ^= 1 << (bit % 8);
        let mut opener = Opener::new(p, &KEY, Before::CreditsOnly);
        prop_assert!(!matches!(opener.open_frame(&f), Ok(Opened::Sealed(_))));
    }

    /// Any bit flipped in a chunk's covered header or its tag fails.
    #[test]
    fn any_flipped_header_bit_fails(bit in 0..(CHUNK_HEADER_SEALED_LEN + TAG_LEN) * 8) {
        let sealer = Sealer::new(Protection::Authenticate, &KEY);
        let opener = Opener::new(Protection::Authenticate, &KEY, Before::CreditsOnly);
        let mut h = chunk_header(chunk_flags::DIGEST).encode()[..CHUNK_HEADER_SEALED_LEN].to_vec();
        let mut payload = vec![0u8; 100];
        let mut tag = sealer.seal_chunk(9, &h, &mut payload, true);
        if bit < CHUNK_HEADER_SEALED_LEN * 8 {
            h[bit / 8] ^= 1 << (bit % 8);
        } else {
            let b = bit - CHUNK_HEADER_SEALED_LEN * 8;
            tag[b / 8] ^= 1 << (b % 8);
        }
        prop_assert!(opener.open_chunk(9, &h, &mut payload, true, &tag).is_err());
    }
}
