use super::*;
use crate::nbd::consts::{STRUCTURED_REPLY_MAGIC, chunk};
use crate::nbd::handshake::PAGE_CACHE_MIN_BLOCK;

/// A connection to a writable export served through the page cache, whose
/// client asked for block sizes.
fn limits() -> Limits {
    let n = Negotiated {
        export: 0,
        structured: true,
        allocation: true,
        min_block: PAGE_CACHE_MIN_BLOCK,
    };
    Limits::new(&n, 1 << 20, false)
}

fn req(kind: u16, flags: u16, offset: u64, length: u32) -> Request {
    Request {
        flags,
        kind,
        cookie: 7,
        offset,
        length,
    }
}

fn errno_of(r: Result<Command, Refusal>) -> u32 {
    r.expect_err("refused").errno
}

#[test]
fn headers_round_trip_and_bad_magic_is_caught() {
    let r = req(cmd::WRITE, cflags::FUA, 4096, 512);
    assert_eq!(Request::decode(&r.encode()), Ok(r));
    assert_eq!(r.payload_len(), 512);
    assert_eq!(req(cmd::READ, 0, 0, 512).payload_len(), 0);
    let mut b = r.encode();
    b[0] = 0;
    assert!(Request::decode(&b).is_err());
}

#[test]
fn good_requests_become_commands() {
    let l = limits();
    assert_eq!(
        check(&req(cmd::READ, cflags::DF, 0, 4096), &l),
        Ok(Command::Read)
    );
    assert_eq!(
        check(&req(cmd::WRITE, cflags::FUA, 512, 512), &l),
        Ok(Command::Write { fua: true })
    );
    assert_eq!(
        check(
            &req(
                cmd::WRITE_ZEROES,
                cflags::NO_HOLE | cflags::FAST_ZERO,
                0,
                1 << 20
            ),
            &l
        ),
        Ok(Command::WriteZeroes {
            fua: false,
            punch: false,
            fast: true
        })
    );
    assert_eq!(
        check(&req(cmd::BLOCK_STATUS, cflags::REQ_ONE, 0, 512), &l),
        Ok(Command::BlockStatus { one: true })
    );
    // FUA is accepted on every command.
    assert_eq!(
        check(&req(cmd::FLUSH, cflags::FUA, 0, 0), &l),
        Ok(Command::Flush)
    );
    assert_eq!(
        check(&req(cmd::CACHE, cflags::FUA, 0, 512), &l),
        Ok(Command::Cache)
    );
    assert_eq!(check(&req(cmd::DISC, 0, 0, 0), &l), Ok(Command::Disc));
    // Trim and zero ranges are not bound by the payload limit.
    let big = Limits { size: 1 << 40, ..l };
    assert!(check(&req(cmd::TRIM, 0, 0, u32::MAX - 511), &big).is_ok());
}

#[test]
fn the_spec_errors_for_bad_requests() {
    let l = limits();
    let end = 1 << 20;
    assert_eq!(
        errno_of(check(&req(cmd::READ, 0, end, 512), &l)),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(check(&req(cmd::WRITE, 0, end - 512, 1024), &l)),
        errno::ENOSPC
    );
    assert_eq!(
        errno_of(check(&req(cmd::WRITE_ZEROES, 0, end, 512), &l)),
        errno::ENOSPC
    );
    assert_eq!(
        errno_of(check(&req(cmd::TRIM, 0, end, 512), &l)),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(check(&req(cmd::BLOCK_STATUS, 0, end, 512), &l)),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(check(&req(cmd::READ, 0, u64::MAX, 512), &l)),
        errno::EINVAL
    );
    // Flags not valid for the command, unknown commands.
    assert_eq!(
        errno_of(check(&req(cmd::WRITE, cflags::NO_HOLE, 0, 512), &l)),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(check(&req(cmd::READ, cflags::REQ_ONE, 0, 512), &l)),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(check(&req(cmd::READ, 1 << 9, 0, 512), &l)),
        errno::EINVAL
    );
    assert_eq!(errno_of(check(&req(42, 0, 0, 512), &l)), errno::EINVAL);
    // DF needs structured replies.
    let simple = Limits {
        structured: false,
        ..l
    };
    assert_eq!(
        errno_of(check(&req(cmd::READ, cflags::DF, 0, 512), &simple)),
        errno::EINVAL
    );
    // Too large: EOVERFLOW only for a read with DF.
    let huge = Limits { size: 1 << 40, ..l };
    let over = MAX_PAYLOAD + 512;
    assert_eq!(
        errno_of(check(&req(cmd::READ, cflags::DF, 0, over), &huge)),
        errno::EOVERFLOW
    );
    assert_eq!(
        errno_of(check(&req(cmd::READ, 0, 0, over), &huge)),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(check(&req(cmd::WRITE, 0, 0, over), &huge)),
        errno::EINVAL
    );
    // Read-only exports refuse every kind of write.
    let ro = Limits {
        read_only: true,
        ..l
    };
    for k in [cmd::WRITE, cmd::TRIM, cmd::WRITE_ZEROES] {
        assert_eq!(errno_of(check(&req(k, 0, 0, 512), &ro)), errno::EPERM);
    }
    assert!(check(&req(cmd::READ, 0, 0, 512), &ro).is_ok());
    // Block status without a context.
    let none = Limits {
        allocation: false,
        ..l
    };
    assert_eq!(
        errno_of(check(&req(cmd::BLOCK_STATUS, 0, 0, 512), &none)),
        errno::EINVAL
    );
}

#[test]
fn the_page_cache_takes_requests_at_any_byte() {
    let l = limits();
    assert_eq!(l.min_block, 1);
    let end = 1 << 20;
    // 70,000 bytes at 12,345, as libnbd sends them with strict mode off.
    for (kind, flags) in [
        (cmd::READ, 0),
        (cmd::READ, cflags::DF),
        (cmd::WRITE, cflags::FUA),
        (cmd::TRIM, 0),
        (cmd::WRITE_ZEROES, 0),
        (cmd::WRITE_ZEROES, cflags::NO_HOLE | cflags::FAST_ZERO),
        (cmd::CACHE, 0),
        (cmd::BLOCK_STATUS, 0),
        (cmd::BLOCK_STATUS, cflags::REQ_ONE),
    ] {
        for (offset, length) in [(12_345, 70_000), (1, 1), (511, 2), (end - 3, 3)] {
            assert!(
                check(&req(kind, flags, offset, length), &l).is_ok(),
                "command {kind} flags {flags:#x} at {offset}+{length}"
            );
        }
        // The end of the export still counts, to the byte.
        assert!(check(&req(kind, flags, end - 3, 4), &l).is_err());
    }
}

#[test]
fn a_minimum_the_client_agreed_to_binds_it() {
    // An export whose backend needs alignment (none does today: O_DIRECT
    // would) and a client that asked for block sizes.
    let n = Negotiated {
        export: 0,
        structured: true,
        allocation: true,
        min_block: 512,
    };
    let l = Limits::new(&n, 1 << 20, false);
    assert_eq!(l.min_block, 512);
    assert_eq!(
        errno_of(check(&req(cmd::READ, 0, 1, 512), &l)),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(check(&req(cmd::WRITE, 0, 0, 100), &l)),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(check(&req(cmd::TRIM, 0, 512, 100), &l)),
        errno::EINVAL
    );
    assert_eq!(
        errno_of(check(&req(cmd::CACHE, 0, 100, 512), &l)),
        errno::EINVAL
    );
    assert!(check(&req(cmd::WRITE, 0, 512, 1024), &l).is_ok());
    // A short last block up to the end, and block status of any length.
    assert!(check(&req(cmd::READ, 0, (1 << 20) - 512, 512), &l).is_ok());
    let odd = Limits { size: 1000, ..l };
    assert!(check(&req(cmd::READ, 0, 512, 488), &odd).is_ok());
    assert!(check(&req(cmd::BLOCK_STATUS, 0, 512, 100), &l).is_ok());
    assert_eq!(
        errno_of(check(&req(cmd::BLOCK_STATUS, 0, 100, 512), &l)),
        errno::EINVAL
    );
    // The same export to a client that did not ask: no alignment.
    let loose = Limits::new(&Negotiated { min_block: 1, ..n }, 1 << 20, false);
    assert!(check(&req(cmd::WRITE, 0, 1, 100), &loose).is_ok());
}

#[test]
fn replies_are_laid_out_as_the_spec_says() {
    let s = simple_reply(0x1122, 22);
    assert_eq!(&s[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&s[4..8], &22u32.to_be_bytes());
    assert_eq!(&s[8..], &0x1122u64.to_be_bytes());

    // Success without data is a simple reply, structured or not.
    assert_eq!(ok_reply(0x1122), simple_reply(0x1122, 0));

    let e = error_reply(true, 9, errno::EPERM, "read-only");
    assert_eq!(&e[..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
    assert_eq!(u16::from_be_bytes([e[4], e[5]]), chunk::FLAG_DONE);
    assert_eq!(u16::from_be_bytes([e[6], e[7]]), chunk::ERROR);
    assert_eq!(
        u32::from_be_bytes(e[16..20].try_into().unwrap()) as usize,
        e.len() - 20
    );
    assert_eq!(
        u32::from_be_bytes(e[20..24].try_into().unwrap()),
        errno::EPERM
    );
    assert_eq!(&e[26..], b"read-only");

    let d = read_reply_header(true, 5, 4096, 100);
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), chunk::OFFSET_DATA);
    assert_eq!(u32::from_be_bytes(d[16..20].try_into().unwrap()), 108);
    assert_eq!(u64::from_be_bytes(d[20..28].try_into().unwrap()), 4096);
    assert_eq!(read_reply_header(false, 5, 0, 100).len(), 16);
    // A read of nothing ends with a NONE chunk.
    let n = read_reply_header(true, 5, 0, 0);
    assert_eq!(u16::from_be_bytes([n[6], n[7]]), chunk::NONE);

    let b = block_status_reply(
        3,
        &[
            Extent {
                length: 512,
                flags: 0,
            },
            Extent {
                length: 1024,
                flags: 3,
            },
        ],
    );
    assert_eq!(u16::from_be_bytes([b[6], b[7]]), chunk::BLOCK_STATUS);
    assert_eq!(u32::from_be_bytes(b[16..20].try_into().unwrap()), 4 + 16);
    assert_eq!(
        u32::from_be_bytes(b[20..24].try_into().unwrap()),
        ALLOCATION_CONTEXT
    );
    assert_eq!(u32::from_be_bytes(b[32..36].try_into().unwrap()), 1024);
}

proptest::proptest! {
    #[test]
    fn any_header_is_checked_without_panic(b in proptest::array::uniform28(proptest::prelude::any::<u8>())) {
        if let Ok(r) = Request::decode(&b) {
            let _ = check(&r, &limits());
            let _ = check(&r, &Limits { structured: false, read_only: true, ..limits() });
            let _ = check(&r, &Limits { min_block: 512, ..limits() });
        }
    }
}

#[test]
fn io_failures_become_the_spec_errors() {
    let e = |n| wire_errno(&std::io::Error::from_raw_os_error(n));
    for (os, wire) in [
        (libc::ENOSPC, errno::ENOSPC),
        (libc::EDQUOT, errno::ENOSPC),
        (libc::EFBIG, errno::ENOSPC),
        (libc::EPERM, errno::EPERM),
        (libc::EACCES, errno::EPERM),
        (libc::EROFS, errno::EPERM),
        (libc::ENOMEM, errno::ENOMEM),
        (libc::EINVAL, errno::EINVAL),
        (libc::EIO, errno::EIO),
        (libc::ENXIO, errno::EIO),
    ] {
        assert_eq!(e(os), wire, "{os}");
    }
    assert_eq!(wire_errno(&std::io::Error::other("no number")), errno::EIO);
}
