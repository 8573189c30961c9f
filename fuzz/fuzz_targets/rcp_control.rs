//! rcp's control messages (hello, auth, requests, entries, ends, answers):
//! whatever a peer sends decodes to a message or to an error, never a
//! panic, and a message that decodes encodes back to something that
//! decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rcp::proto::Msg;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Msg::decode(data) {
        let again = Msg::decode(&m.encode()).expect("an encoded message decodes");
        assert_eq!(again, m);
    }
});
