//! rblock's request protocol over the fabric: whatever bytes a peer sends
//! as a message, or as a write piece's 32 application bytes, decode to a
//! message (which encodes back to the same bytes) or to an error; never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rblock::fabric::proto::{Msg, write_request};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Msg::decode(data) {
        assert_eq!(m.encode(), data, "decoding is exact: {m:?}");
    }
    if let Some(tag) = data.get(..32) {
        let tag: &[u8; 32] = tag.try_into().expect("32 bytes");
        let owner = data.get(32..40).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8")));
        if let Ok(r) = write_request(tag, owner) {
            assert_eq!(r.cookie, owner);
        }
    }
});
