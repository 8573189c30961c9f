//! A sealed link's receiving half against anything a path can send: it
//! must never panic, and must never accept a frame or chunk that was not
//! sealed with its key. The input's first byte picks the protection; the
//! rest is offered as frames (split at every 0xff byte) and, whole, as a
//! chunk.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rfabric::link::seal::{Before, Opened, Opener, Protection, Sealer, TAG_LEN};

const KEY: [u8; 32] = [0x42; 32];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let protection = Protection::of(pick & 1 == 1);
    let before = if pick & 2 == 2 { Before::Anything } else { Before::CreditsOnly };
    let mut opener = Opener::new(protection, &KEY, before);
    for piece in rest.split(|&b| b == 0xff) {
        if let Ok(Opened::Sealed(_)) = opener.open_frame(piece) {
            panic!("a frame nobody sealed was accepted");
        }
    }
    // The honest first frame still opens after the garbage: nothing of it
    // was counted.
    let mut sealer = Sealer::new(protection, &KEY);
    let mut honest = vec![0u8; 24 + 4 + TAG_LEN];
    honest[..2].copy_from_slice(b"RF");
    honest[2] = 5;
    honest[4] = 4;
    let len = sealer.seal_frame(&mut honest, 28);
    assert!(matches!(opener.open_frame(&honest[..len]), Ok(Opened::Sealed(_))));
    if rest.len() >= 64 + TAG_LEN {
        let (header, body) = rest.split_at(64);
        let (tag, payload) = body.split_at(TAG_LEN);
        let mut payload = payload.to_vec();
        let tag: &[u8; TAG_LEN] = tag.try_into().unwrap();
        assert!(
            opener.open_chunk(0, header, &mut payload, pick & 4 == 4, tag).is_err(),
            "a chunk nobody sealed was accepted"
        );
    }
});
