//! Every decoder that reads a peer's bytes: link control frames, chunk
//! headers and tcp backend frame headers. They must never panic, and what
//! they accept must re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rfabric::transport::tcp::{FrameHeader, HEADER_LEN};
use rfabric::wire::{CHUNK_HEADER_LEN, ChunkHeader, Frame};

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = Frame::decode(data) {
        let mut out = vec![0u8; frame.encoded_len()];
        frame.encode(&mut out);
        assert_eq!(out, data, "accepted frame does not re-encode identically");
    }
    if data.len() >= 4 {
        let note = u32::from_le_bytes(data[..4].try_into().unwrap());
        let slot = &data[4..];
        if let Ok(h) = ChunkHeader::decode(slot, slot.len(), 1 << 20, note) {
            assert_eq!(&h.encode()[..], &slot[..CHUNK_HEADER_LEN]);
        }
    }
    if let Some(raw) = data.get(..HEADER_LEN) {
        let raw: &[u8; HEADER_LEN] = raw.try_into().unwrap();
        if let Ok(h) = FrameHeader::decode(raw, 1 << 30, 1 << 16) {
            assert_eq!(&h.encode(), raw);
        }
    }
});
