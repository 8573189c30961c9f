//! The NBD engine against arbitrary client bytes: the handshake, fed in
//! pieces whose sizes the input chooses, then request headers checked
//! against what was negotiated. Nothing may panic, the handshake must never
//! claim more bytes than it was given, and a request it accepts must
//! re-encode to the same bytes. The step byte's top bits pick what the
//! server offers of TLS; a STARTTLS it accepts is taken as if the TLS
//! handshake had passed, and nothing may be served in clear before it
//! when TLS is required.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rblock::nbd::consts::REQUEST_LEN;
use rblock::nbd::handshake::{ExportInfo, Handshake, Outcome, Tls};
use rblock::nbd::transmission::{Limits, Request, check};

fuzz_target!(|data: &[u8]| {
    let Some((&step, data)) = data.split_first() else {
        return;
    };
    let tls = match step >> 6 {
        0 => Tls::Off,
        1 => Tls::On,
        _ => Tls::Require,
    };
    let step = usize::from((step & 0x3f).max(1));
    let exports = vec![
        ExportInfo {
            name: "disk".into(),
            description: "d".into(),
            size: 1 << 30,
            read_only: false,
            can_trim: true,
        },
        ExportInfo {
            name: "ro".into(),
            description: String::new(),
            size: 4096,
            read_only: true,
            can_trim: false,
        },
    ];
    let sizes: Vec<(u64, bool)> = exports.iter().map(|e| (e.size, e.read_only)).collect();
    let mut h = Handshake::with_tls(exports, tls);
    let mut in_tls = false;
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0;
    let mut negotiated = None;
    while fed < data.len() && negotiated.is_none() {
        let end = (fed + step).min(data.len());
        buf.extend_from_slice(&data[fed..end]);
        fed = end;
        match h.advance(&buf) {
            Ok((used, outcome)) => {
                assert!(used <= buf.len());
                buf.drain(..used);
                let _ = h.take_output();
                match outcome {
                    Some(Outcome::Transmission(n)) => {
                        assert!(in_tls || tls != Tls::Require, "served in clear");
                        negotiated = Some(n);
                    }
                    Some(Outcome::StartTls) => {
                        assert!(tls != Tls::Off && !in_tls);
                        in_tls = true;
                        h.tls_started();
                    }
                    Some(Outcome::Close) => return,
                    None => {}
                }
            }
            Err(_) => return,
        }
    }
    let Some(n) = negotiated else { return };
    buf.extend_from_slice(&data[fed..]);
    let (size, read_only) = sizes[n.export];
    let limits = Limits::new(&n, size, read_only);
    for raw in buf.chunks_exact(REQUEST_LEN) {
        let raw: &[u8; REQUEST_LEN] = raw.try_into().unwrap();
        if let Ok(r) = Request::decode(raw) {
            assert_eq!(&r.encode(), raw);
            let _ = check(&r, &limits);
        }
    }
});
