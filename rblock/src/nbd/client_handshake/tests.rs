use super::*;
use crate::nbd::consts::tflags;
use crate::nbd::handshake::{ExportInfo, Handshake, Outcome};

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
            size: 4096 * 3,
            read_only: true,
            can_trim: false,
        },
    ]
}

/// Runs the client against our server, handing bytes over `step` at a
/// time: the client's result and how the server's side ended.
fn converse(name: &str, step: usize) -> (Result<Export, ClientHandshakeError>, Option<Outcome>) {
    let mut client = ClientHandshake::new(name).unwrap();
    let mut server = Handshake::new(exports());
    let (mut to_client, mut to_server) = (Vec::new(), Vec::new());
    let mut pending_client = Vec::new();
    let mut outcome = None;
    for _ in 0..10_000 {
        pending_client.extend(server.take_output());
        let n = step.min(pending_client.len());
        to_client.extend(pending_client.drain(..n));
        match client.advance(&to_client) {
            Err(e) => return (Err(e), outcome),
            Ok((used, done)) => {
                to_client.drain(..used);
                if let Some(e) = done {
                    assert!(to_client.is_empty() && pending_client.is_empty());
                    return (Ok(e), outcome);
                }
            }
        }
        to_server.extend(client.take_output());
        let (used, o) = server.advance(&to_server).expect("the server takes it");
        to_server.drain(..used);
        outcome = outcome.or(o);
    }
    panic!("the handshake never ended");
}

#[test]
fn go_against_our_server_yields_size_and_flags() {
    for step in [usize::MAX, 1, 7] {
        let (got, outcome) = converse("disk", step);
        let e = got.unwrap();
        assert_eq!(e.size, 1 << 20);
        assert_eq!(e.flags, exports()[0].transmission_flags());
        assert_ne!(e.flags & tflags::CAN_MULTI_CONN, 0);
        assert_eq!(e.flags & tflags::READ_ONLY, 0);
        let bs = e.block_sizes.expect("block sizes told");
        assert!(bs.minimum <= 4096 && bs.preferred == 4096, "{bs:?}");
        // Simple replies only: the kernel speaks nothing else.
        assert!(
            matches!(
                outcome,
                Some(Outcome::Transmission(ref n)) if n.export == 0 && !n.structured
            ),
            "{outcome:?}"
        );
    }
}

#[test]
fn a_read_only_export_says_so() {
    let (got, _) = converse("ro", usize::MAX);
    let e = got.unwrap();
    assert_eq!(e.size, 4096 * 3);
    assert_ne!(e.flags & tflags::READ_ONLY, 0);
}

#[test]
fn the_empty_name_is_the_default_export() {
    let (got, _) = converse("", usize::MAX);
    assert_eq!(got.unwrap().size, 1 << 20);
}

#[test]
fn an_unknown_export_is_an_error_naming_it() {
    let (got, outcome) = converse("nope", usize::MAX);
    let err = got.unwrap_err();
    assert!(
        matches!(&err, ClientHandshakeError::Refused { export, kind, .. }
            if export == "nope" && *kind == rep::ERR_UNKNOWN),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("\"nope\"") && text.contains("no such export"),
        "{text}"
    );
    assert_eq!(outcome, None);
}

#[test]
fn the_go_request_is_byte_for_byte_the_spec() {
    let mut c = ClientHandshake::new("disk").unwrap();
    assert!(c.take_output().is_empty(), "nothing before the greeting");
    let mut greeting = b"NBDMAGICIHAVEOPT".to_vec();
    greeting.extend_from_slice(&[0, 3]);
    assert_eq!(c.advance(&greeting), Ok((18, None)));
    let mut want = vec![0, 0, 0, 3]; // fixed newstyle, no zeroes
    want.extend_from_slice(b"IHAVEOPT");
    want.extend_from_slice(&[0, 0, 0, 7]); // NBD_OPT_GO
    want.extend_from_slice(&[0, 0, 0, 12]); // 4 + 4 + 2 + 2
    want.extend_from_slice(&[0, 0, 0, 4]);
    want.extend_from_slice(b"disk");
    want.extend_from_slice(&[0, 1, 0, 3]); // one request: NBD_INFO_BLOCK_SIZE
    assert_eq!(c.take_output(), want);

    // A server without NO_ZEROES is not asked for it.
    let mut c = ClientHandshake::new("").unwrap();
    let mut greeting = b"NBDMAGICIHAVEOPT".to_vec();
    greeting.extend_from_slice(&[0, 1]);
    c.advance(&greeting).unwrap();
    assert_eq!(c.take_output()[..4], [0, 0, 0, 1]);
}

/// A client past the greeting.
fn greeted() -> ClientHandshake {
    let mut c = ClientHandshake::new("disk").unwrap();
    let mut greeting = b"NBDMAGICIHAVEOPT".to_vec();
    greeting.extend_from_slice(&[0, 3]);
    c.advance(&greeting).unwrap();
    c.take_output();
    c
}

fn reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut b = REPLY_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

fn export_info(size: u64, flags: u16) -> Vec<u8> {
    let mut d = info::EXPORT.to_be_bytes().to_vec();
    d.extend_from_slice(&size.to_be_bytes());
    d.extend_from_slice(&flags.to_be_bytes());
    d
}

#[test]
fn bad_greetings_are_errors() {
    let mut c = ClientHandshake::new("disk").unwrap();
    let mut g = b"NBDMAGIXIHAVEOPT\x00\x03".to_vec();
    assert!(matches!(c.advance(&g), Err(ClientHandshakeError::Magic(_))));
    // Oldstyle: the size follows where newstyle has IHAVEOPT.
    let mut c = ClientHandshake::new("disk").unwrap();
    g = b"NBDMAGIC".to_vec();
    g.extend_from_slice(&0x0000_4202_8186_1253_u64.to_be_bytes());
    g.extend_from_slice(&[0, 0]);
    assert_eq!(
        c.advance(&g),
        Err(ClientHandshakeError::NotNewstyle(0x0000_4202_8186_1253))
    );
    let mut c = ClientHandshake::new("disk").unwrap();
    assert_eq!(
        c.advance(b"NBDMAGICIHAVEOPT\x00\x02"),
        Err(ClientHandshakeError::NotFixedNewstyle(2))
    );
}

#[test]
fn bad_replies_are_errors() {
    let mut bad_magic = reply(opt::GO, rep::ACK, &[]);
    bad_magic[0] ^= 1;
    assert!(matches!(
        greeted().advance(&bad_magic),
        Err(ClientHandshakeError::ReplyMagic(_))
    ));
    assert_eq!(
        greeted().advance(&reply(opt::INFO, rep::ACK, &[])),
        Err(ClientHandshakeError::WrongOption { got: opt::INFO })
    );
    assert_eq!(
        greeted().advance(&reply(opt::GO, rep::ACK, &[])),
        Err(ClientHandshakeError::NoExportInfo("disk".into()))
    );
    assert!(matches!(
        greeted().advance(&reply(opt::GO, rep::INFO, &export_info(1, 1)[..11])),
        Err(ClientHandshakeError::Malformed {
            what: "NBD_INFO_EXPORT",
            ..
        })
    ));
    assert_eq!(
        greeted().advance(&reply(opt::GO, rep::SERVER, &[0; 4])),
        Err(ClientHandshakeError::UnexpectedReply {
            export: "disk".into(),
            kind: rep::SERVER
        })
    );
    // The length alone is refused: nothing that long is waited for.
    let mut huge = reply(opt::GO, rep::INFO, &[]);
    huge[16..20].copy_from_slice(&(MAX_REPLY + 1).to_be_bytes());
    assert_eq!(
        greeted().advance(&huge),
        Err(ClientHandshakeError::ReplyTooLong(MAX_REPLY + 1))
    );
    let err = greeted()
        .advance(&reply(opt::GO, rep::ERR_POLICY, b"go away"))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the server refused export \"disk\": refused by the server's policy (go away)"
    );
}

#[test]
fn truncated_input_waits_and_then_says_what_was_missing() {
    let mut c = ClientHandshake::new("disk").unwrap();
    assert_eq!(c.advance(b"NBDMAGICIHAVE"), Ok((0, None)));
    assert_eq!(
        c.closed().to_string(),
        "the server closed the connection during the handshake (no complete greeting)"
    );
    let mut c = greeted();
    let mut input = reply(opt::GO, rep::INFO, &export_info(8192, 1));
    let whole = input.len();
    input.extend(reply(opt::GO, rep::ACK, &[]));
    // The first reply whole, the ACK's header cut short.
    assert_eq!(c.advance(&input[..whole + 10]), Ok((whole, None)));
    assert!(c.closed().to_string().contains("NBD_OPT_GO"));
    // Given the rest it finishes, and leaves what follows alone.
    let mut rest = input[whole..].to_vec();
    rest.extend_from_slice(b"transmission");
    assert_eq!(
        c.advance(&rest),
        Ok((
            20,
            Some(Export {
                size: 8192,
                flags: 1,
                block_sizes: None
            })
        ))
    );
    assert_eq!(c.advance(b"more"), Ok((0, None)));
}

#[test]
fn unknown_info_items_are_skipped() {
    let mut c = greeted();
    let mut input = reply(opt::GO, rep::INFO, &[0, 42, 1, 2, 3]);
    input.extend(reply(opt::GO, rep::INFO, &export_info(4096, 3)));
    input.extend(reply(opt::GO, rep::ACK, &[]));
    let (used, got) = c.advance(&input).unwrap();
    assert_eq!(used, input.len());
    assert_eq!(got.unwrap().size, 4096);
}

#[test]
fn names_longer_than_the_spec_allows_are_refused() {
    assert!(ClientHandshake::new(&"x".repeat(MAX_NAME)).is_ok());
    assert!(matches!(
        ClientHandshake::new(&"x".repeat(MAX_NAME + 1)),
        Err(ClientHandshakeError::NameTooLong(_))
    ));
}
