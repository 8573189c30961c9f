use super::*;
use crate::nbd::consts::{client_flags, info, opt, rep};

fn exports() -> Vec<ExportInfo> {
    vec![
        ExportInfo {
            name: "disk".into(),
            description: "a disk".into(),
            size: 1 << 20,
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
    ]
}

fn option(o: u32, data: &[u8]) -> Vec<u8> {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&o.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// Option replies in `out`: (option, type, data).
fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut v = Vec::new();
    while !out.is_empty() {
        assert_eq!(
            u64::from_be_bytes(out[..8].try_into().unwrap()),
            REPLY_MAGIC
        );
        let o = u32::from_be_bytes(out[8..12].try_into().unwrap());
        let t = u32::from_be_bytes(out[12..16].try_into().unwrap());
        let n = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        v.push((o, t, out[20..20 + n].to_vec()));
        out = &out[20 + n..];
    }
    v
}

/// A handshake past the greeting and the client flags.
fn started(flags: u32) -> Handshake {
    let mut h = Handshake::new(exports());
    let greeting = h.take_output();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    assert_eq!(&greeting[8..16], b"IHAVEOPT");
    assert_eq!(greeting[16..18], [0, 3]);
    assert_eq!(h.advance(&flags.to_be_bytes()), Ok((4, None)));
    h
}

/// The (minimum, preferred, maximum) block sizes an INFO or GO reply told.
fn block_sizes(r: &[(u32, u32, Vec<u8>)]) -> (u32, u32, u32) {
    let bs = r
        .iter()
        .find(|x| x.1 == rep::INFO && x.2[..2] == info::BLOCK_SIZE.to_be_bytes())
        .expect("a block size item");
    assert_eq!(bs.2.len(), 14);
    let at = |i: usize| u32::from_be_bytes(bs.2[i..i + 4].try_into().unwrap());
    (at(2), at(6), at(10))
}

#[test]
fn go_with_block_sizes_reports_the_export_and_binds_its_minimum() {
    let mut h = started(client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES);
    let msg = option(opt::GO, &go_data("disk", &[info::BLOCK_SIZE, info::NAME]));
    let (used, outcome) = h.advance(&msg).unwrap();
    assert_eq!(used, msg.len());
    assert_eq!(
        outcome,
        Some(Outcome::Transmission(Negotiated {
            export: 0,
            structured: false,
            allocation: false,
            // The page cache takes any byte: the minimum bound is 1.
            min_block: 1,
        }))
    );
    let r = replies(&h.take_output());
    assert_eq!(r.last().unwrap().1, rep::ACK);
    let export = r
        .iter()
        .find(|x| x.2[..2] == info::EXPORT.to_be_bytes())
        .unwrap();
    assert_eq!(export.1, rep::INFO);
    assert_eq!(
        u64::from_be_bytes(export.2[2..10].try_into().unwrap()),
        1 << 20
    );
    let flags = u16::from_be_bytes(export.2[10..12].try_into().unwrap());
    assert_ne!(flags & tflags::SEND_TRIM, 0);
    assert_ne!(flags & tflags::CAN_MULTI_CONN, 0);
    assert!(
        r.iter()
            .any(|x| x.2[..2] == info::NAME.to_be_bytes() && &x.2[2..] == b"disk")
    );
    // Minimum 1 (as nbdkit's file plugin, qemu-nbd and nbd-server), a
    // page preferred, the largest payload as the maximum.
    assert_eq!(block_sizes(&r), (1, PREFERRED_BLOCK, MAX_PAYLOAD));
    assert_eq!(
        (PAGE_CACHE_MIN_BLOCK, PREFERRED_BLOCK, MAX_PAYLOAD),
        (1, 4096, 32 << 20)
    );
}

#[test]
fn every_export_tells_its_block_sizes_even_unasked() {
    for name in ["disk", "ro", ""] {
        let mut h = started(client_flags::FIXED_NEWSTYLE);
        let (_, o) = h.advance(&option(opt::INFO, &go_data(name, &[]))).unwrap();
        assert_eq!(o, None);
        let r = replies(&h.take_output());
        assert_eq!(block_sizes(&r), (1, 4096, 32 << 20), "export {name:?}");
        let (_, o) = h.advance(&option(opt::GO, &go_data(name, &[]))).unwrap();
        assert!(matches!(
            o,
            Some(Outcome::Transmission(Negotiated { min_block: 1, .. }))
        ));
        assert_eq!(block_sizes(&replies(&h.take_output())).0, 1);
    }
}

#[test]
fn input_may_arrive_a_byte_at_a_time() {
    let mut h = started(client_flags::FIXED_NEWSTYLE);
    let msg = option(opt::GO, &go_data("", &[]));
    let mut buf = Vec::new();
    let mut outcome = None;
    for b in msg {
        buf.push(b);
        let (used, o) = h.advance(&buf).unwrap();
        buf.drain(..used);
        if o.is_some() {
            outcome = o;
        }
    }
    // The empty name is the default export, the first; no block size asked.
    assert!(matches!(
        outcome,
        Some(Outcome::Transmission(Negotiated {
            export: 0,
            min_block: 1,
            ..
        }))
    ));
}

#[test]
fn unknown_and_malformed_options_are_answered_and_the_handshake_goes_on() {
    let mut h = started(client_flags::FIXED_NEWSTYLE);
    let mut input = option(99, b"whatever");
    input.extend(option(opt::LIST, b"x"));
    input.extend(option(opt::GO, &go_data("nope", &[])));
    input.extend(option(opt::GO, b"\x00\x00\x00\x09ab"));
    input.extend(option(opt::STARTTLS, &[]));
    input.extend(option(opt::INFO, &go_data("ro", &[info::DESCRIPTION])));
    let (used, outcome) = h.advance(&input).unwrap();
    assert_eq!((used, outcome), (input.len(), None));
    let kinds: Vec<u32> = replies(&h.take_output()).iter().map(|r| r.1).collect();
    assert_eq!(
        kinds,
        [
            rep::ERR_UNSUP,
            rep::ERR_INVALID,
            rep::ERR_UNKNOWN,
            rep::ERR_INVALID,
            rep::ERR_UNSUP,
            rep::INFO,
            rep::INFO,
            rep::ACK
        ]
    );
}

#[test]
fn list_names_every_export() {
    let mut h = started(client_flags::FIXED_NEWSTYLE);
    h.advance(&option(opt::LIST, &[])).unwrap();
    let r = replies(&h.take_output());
    let names: Vec<&[u8]> = r
        .iter()
        .filter(|x| x.1 == rep::SERVER)
        .map(|x| &x.2[4..4 + u32::from_be_bytes(x.2[..4].try_into().unwrap()) as usize])
        .collect();
    assert_eq!(names, [b"disk".as_slice(), b"ro"]);
    assert_eq!(r.last().unwrap().1, rep::ACK);
}

#[test]
fn meta_contexts_need_structured_replies_and_follow_the_export() {
    let mut h = started(client_flags::FIXED_NEWSTYLE);
    h.advance(&option(
        opt::SET_META_CONTEXT,
        &meta_data("disk", &["base:allocation"]),
    ))
    .unwrap();
    assert_eq!(replies(&h.take_output())[0].1, rep::ERR_INVALID);
    h.advance(&option(opt::STRUCTURED_REPLY, &[])).unwrap();
    h.advance(&option(opt::STRUCTURED_REPLY, &[])).unwrap();
    let kinds: Vec<u32> = replies(&h.take_output()).iter().map(|r| r.1).collect();
    assert_eq!(kinds, [rep::ACK, rep::ERR_INVALID]);
    // LIST: "base:" is a wildcard there, the id a placeholder.
    h.advance(&option(
        opt::LIST_META_CONTEXT,
        &meta_data("disk", &["base:"]),
    ))
    .unwrap();
    let r = replies(&h.take_output());
    assert_eq!(r[0].1, rep::META_CONTEXT);
    assert_eq!(&r[0].2[..4], &[0, 0, 0, 0]);
    assert_eq!(&r[0].2[4..], b"base:allocation");
    // SET ignores bare "base:" and unknown contexts; it selects the real one.
    h.advance(&option(
        opt::SET_META_CONTEXT,
        &meta_data("disk", &["base:", "x:y"]),
    ))
    .unwrap();
    let kinds: Vec<u32> = replies(&h.take_output()).iter().map(|r| r.1).collect();
    assert_eq!(kinds, [rep::ACK]);
    h.advance(&option(
        opt::SET_META_CONTEXT,
        &meta_data("disk", &["base:allocation"]),
    ))
    .unwrap();
    let r = replies(&h.take_output());
    assert_eq!(r[0].1, rep::META_CONTEXT);
    assert_eq!(
        u32::from_be_bytes(r[0].2[..4].try_into().unwrap()),
        ALLOCATION_CONTEXT
    );
    // Going to another export than the one the context was set for: none.
    let (_, o) = h.advance(&option(opt::GO, &go_data("ro", &[]))).unwrap();
    assert!(matches!(
        o,
        Some(Outcome::Transmission(Negotiated {
            export: 1,
            structured: true,
            allocation: false,
            ..
        }))
    ));
}

#[test]
fn export_name_replies_with_or_without_zeroes_and_hangs_up_on_unknown() {
    for (flags, len) in [
        (client_flags::FIXED_NEWSTYLE, 134),
        (client_flags::KNOWN, 10),
    ] {
        let mut h = started(flags);
        let (_, o) = h.advance(&option(opt::EXPORT_NAME, b"ro")).unwrap();
        assert!(matches!(
            o,
            Some(Outcome::Transmission(Negotiated { export: 1, .. }))
        ));
        let out = h.take_output();
        assert_eq!(out.len(), len);
        assert_eq!(u64::from_be_bytes(out[..8].try_into().unwrap()), 4096);
        let tf = u16::from_be_bytes(out[8..10].try_into().unwrap());
        assert_ne!(tf & tflags::READ_ONLY, 0);
        assert_eq!(tf & tflags::SEND_WRITE_ZEROES, 0);
    }
    let mut h = started(client_flags::FIXED_NEWSTYLE);
    let (_, o) = h.advance(&option(opt::EXPORT_NAME, b"missing")).unwrap();
    assert_eq!(o, Some(Outcome::Close));
}

#[test]
fn abort_is_acknowledged_and_ends() {
    let mut h = started(client_flags::FIXED_NEWSTYLE);
    let (_, o) = h.advance(&option(opt::ABORT, b"ignored")).unwrap();
    assert_eq!(o, Some(Outcome::Close));
    assert_eq!(replies(&h.take_output())[0].1, rep::ACK);
}

#[test]
fn bad_client_flags_and_bad_magic_end_the_session() {
    let mut h = Handshake::new(exports());
    assert_eq!(
        h.advance(&8u32.to_be_bytes()),
        Err(HandshakeError::ClientFlags(8))
    );
    let mut h = started(client_flags::FIXED_NEWSTYLE);
    let mut bad = option(opt::LIST, &[]);
    bad[0] ^= 1;
    assert!(matches!(
        h.advance(&bad),
        Err(HandshakeError::OptionMagic(_))
    ));
}

#[test]
fn oversized_options_are_refused_and_skipped_without_being_held() {
    let mut h = started(client_flags::FIXED_NEWSTYLE);
    let mut head = IHAVEOPT.to_be_bytes().to_vec();
    head.extend_from_slice(&opt::GO.to_be_bytes());
    head.extend_from_slice(&(MAX_OPTION + 10).to_be_bytes());
    assert_eq!(h.advance(&head).unwrap(), (16, None));
    assert_eq!(replies(&h.take_output())[0].1, rep::ERR_TOO_BIG);
    // The body is consumed as it comes, then the next option is read.
    let body = vec![0u8; (MAX_OPTION + 10) as usize];
    let (used, _) = h.advance(&body[..1000]).unwrap();
    assert_eq!(used, 1000);
    let mut rest = body[1000..].to_vec();
    rest.extend(option(opt::ABORT, &[]));
    let (used, o) = h.advance(&rest).unwrap();
    assert_eq!((used, o), (rest.len(), Some(Outcome::Close)));
}

proptest::proptest! {
    #[test]
    fn arbitrary_input_never_panics(chunks in proptest::collection::vec(
        proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), 0..16)) {
        let mut h = started(client_flags::FIXED_NEWSTYLE);
        let mut buf = Vec::new();
        for c in chunks {
            buf.extend(c);
            match h.advance(&buf) {
                Ok((used, _)) => { buf.drain(..used); }
                Err(_) => break,
            }
            let _ = h.take_output();
        }
    }
}

#[test]
fn the_empty_name_means_the_first_export_and_other_names_their_own() {
    let e = exports();
    assert_eq!(find_export(&e, b""), Some(0));
    assert_eq!(find_export(&e, b"disk"), Some(0));
    assert_eq!(find_export(&e, b"ro"), Some(1));
    assert_eq!(find_export(&e, b"RO"), None);
    assert_eq!(find_export(&e, b"nosuch"), None);
    assert_eq!(find_export::<ExportInfo>(&[], b""), None);
}

fn started_with(tls: Tls) -> Handshake {
    let mut h = Handshake::with_tls(exports(), tls);
    h.take_output();
    let (used, _) = h
        .advance(&client_flags::FIXED_NEWSTYLE.to_be_bytes())
        .unwrap();
    assert_eq!(used, 4);
    h
}

#[test]
fn tls_required_refuses_everything_but_starttls_and_abort_until_it_is_on() {
    let mut h = started_with(Tls::Require);
    let mut input = option(opt::LIST, &[]);
    input.extend(option(opt::GO, &go_data("", &[])));
    input.extend(option(opt::STRUCTURED_REPLY, &[]));
    let (used, outcome) = h.advance(&input).unwrap();
    assert_eq!((used, outcome), (input.len(), None));
    let kinds: Vec<u32> = replies(&h.take_output()).iter().map(|r| r.1).collect();
    assert_eq!(kinds, [rep::ERR_TLS_REQD; 3], "nothing served in clear");
    // The old-style EXPORT_NAME cannot be answered with an error: hang up.
    let mut old = started_with(Tls::Require);
    let (_, outcome) = old.advance(&option(opt::EXPORT_NAME, b"")).unwrap();
    assert_eq!(outcome, Some(Outcome::Close));
    assert!(old.take_output().is_empty(), "no export was described");
    // STARTTLS pauses the handshake with its ACK queued.
    let start = option(opt::STARTTLS, &[]);
    let (used, outcome) = h.advance(&start).unwrap();
    assert_eq!((used, outcome), (start.len(), Some(Outcome::StartTls)));
    assert_eq!(replies(&h.take_output())[0].1, rep::ACK);
    h.tls_started();
    let go = option(opt::GO, &go_data("", &[]));
    let (_, outcome) = h.advance(&go).unwrap();
    assert!(matches!(outcome, Some(Outcome::Transmission(_))));
}

#[test]
fn starttls_is_refused_when_off_twice_or_with_data_and_forgets_what_came_before() {
    let mut off = started_with(Tls::Off);
    off.advance(&option(opt::STARTTLS, &[])).unwrap();
    assert_eq!(replies(&off.take_output())[0].1, rep::ERR_UNSUP);
    let mut h = started_with(Tls::On);
    let (_, outcome) = h.advance(&option(opt::STARTTLS, b"x")).unwrap();
    assert_eq!(outcome, None);
    assert_eq!(replies(&h.take_output())[0].1, rep::ERR_INVALID);
    // Structured replies asked for in clear do not survive STARTTLS.
    h.advance(&option(opt::STRUCTURED_REPLY, &[])).unwrap();
    let (_, outcome) = h.advance(&option(opt::STARTTLS, &[])).unwrap();
    assert_eq!(outcome, Some(Outcome::StartTls));
    h.tls_started();
    h.take_output();
    h.advance(&option(opt::STARTTLS, &[])).unwrap();
    assert_eq!(
        replies(&h.take_output())[0].1,
        rep::ERR_INVALID,
        "TLS twice"
    );
    let (_, outcome) = h.advance(&option(opt::GO, &go_data("", &[]))).unwrap();
    let Some(Outcome::Transmission(n)) = outcome else {
        panic!("no transmission: {outcome:?}");
    };
    assert!(!n.structured, "negotiated in clear, forgotten under TLS");
    // Without TLS required, a client may also go on in clear.
    let mut clear = started_with(Tls::On);
    let (_, outcome) = clear.advance(&option(opt::GO, &go_data("", &[]))).unwrap();
    assert!(matches!(outcome, Some(Outcome::Transmission(_))));
}
