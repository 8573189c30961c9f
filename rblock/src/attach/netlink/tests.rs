// Netlink is in the host's byte order; the bytes below are written out for
// a little-endian host, as the kernel lays them out there.
#![cfg(target_endian = "little")]

use std::io::Cursor;

use neli::FromBytesWithInput;

use super::*;

#[test]
fn connect_has_every_attribute_and_a_nest_of_socket_nests() {
    let c = Connect {
        index: 1,
        size_bytes: 64 << 20,
        block_size_bytes: 4096,
        server_flags: 0x0135,
        timeout: 150,
        dead_conn_timeout: 150,
        sockets: vec![7, 8],
    };
    #[rustfmt::skip]
    let want: &[u8] = &[
        // nla_len, nla_type, payload
        8, 0, 1, 0,       1, 0, 0, 0,                   // INDEX 1 (u32)
        12, 0, 2, 0,      0, 0, 0, 4, 0, 0, 0, 0,       // SIZE_BYTES 64 MiB (u64)
        12, 0, 3, 0,      0, 0x10, 0, 0, 0, 0, 0, 0,    // BLOCK_SIZE_BYTES 4096
        12, 0, 5, 0,      0x35, 1, 0, 0, 0, 0, 0, 0,    // SERVER_FLAGS
        12, 0, 4, 0,      150, 0, 0, 0, 0, 0, 0, 0,     // TIMEOUT
        12, 0, 8, 0,      150, 0, 0, 0, 0, 0, 0, 0,     // DEAD_CONN_TIMEOUT
        28, 0, 7, 0x80,                                 // SOCKETS, NLA_F_NESTED
            12, 0, 1, 0x80,                             //   SOCK_ITEM, NLA_F_NESTED
                8, 0, 1, 0,   7, 0, 0, 0,               //     SOCK_FD 7 (u32)
            12, 0, 1, 0x80,                             //   SOCK_ITEM
                8, 0, 1, 0,   8, 0, 0, 0,               //     SOCK_FD 8
    ];
    assert_eq!(connect_attrs(&c), want);
}

#[test]
fn disconnect_and_status_name_the_device_only() {
    assert_eq!(index_attrs(3), [8, 0, 1, 0, 3, 0, 0, 0]);
    // struct genlmsghdr: cmd, version, reserved u16.
    assert_eq!(
        genl_payload(cmd::DISCONNECT, &index_attrs(3)),
        [2, 1, 0, 0, 8, 0, 1, 0, 3, 0, 0, 0]
    );
    assert_eq!(genl_payload(cmd::STATUS, &[])[..2], [5, 1]);
}

#[test]
fn attributes_are_padded_to_four_bytes_and_nla_len_excludes_the_padding() {
    let mut out = Vec::new();
    put(&mut out, 2, &[1]);
    put(&mut out, 3, &[]);
    put(&mut out, 4, &[1, 2, 3, 4, 5, 6]);
    #[rustfmt::skip]
    let want: &[u8] = &[
        5, 0, 2, 0, 1, 0, 0, 0,
        4, 0, 3, 0,
        10, 0, 4, 0, 1, 2, 3, 4, 5, 6, 0, 0,
    ];
    assert_eq!(out, want);
}

/// A status reply as drivers/block/nbd.c `nbd_genl_status` builds it:
/// nests without NLA_F_NESTED, `connected` a u8 padded to four bytes.
fn status_reply(devices: &[(u32, u8)]) -> Genlmsghdr<u8, u16> {
    let mut list = Vec::new();
    for &(index, connected) in devices {
        list.extend_from_slice(&[20, 0, 1, 0]); // DEVICE_ITEM
        list.extend_from_slice(&[8, 0, 1, 0]); // DEVICE_INDEX
        list.extend_from_slice(&index.to_le_bytes());
        list.extend_from_slice(&[5, 0, 2, 0, connected, 0, 0, 0]); // DEVICE_CONNECTED
    }
    let mut bytes = vec![cmd::STATUS, 1, 0, 0];
    bytes.extend_from_slice(&(4 + list.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&[9, 0]); // DEVICE_LIST
    bytes.extend_from_slice(&list);
    let len = bytes.len();
    Genlmsghdr::from_bytes_with_input(&mut Cursor::new(bytes), len).expect("parses")
}

#[test]
fn status_replies_say_which_device_is_connected() {
    let r = status_reply(&[(0, 0), (1, 1)]);
    assert_eq!(connected_in(&r, 1), Ok(true));
    assert_eq!(connected_in(&r, 0), Ok(false));
    // Not created yet: not listed.
    assert_eq!(connected_in(&r, 7), Ok(false));
    assert_eq!(connected_in(&status_reply(&[]), 0), Ok(false));
}

#[test]
fn a_status_item_without_its_flag_is_an_error() {
    let mut bytes = vec![cmd::STATUS, 1, 0, 0];
    #[rustfmt::skip]
    bytes.extend_from_slice(&[
        16, 0, 9, 0,            // DEVICE_LIST
            12, 0, 1, 0,        //   DEVICE_ITEM
                8, 0, 1, 0,  4, 0, 0, 0, // DEVICE_INDEX 4, no DEVICE_CONNECTED
    ]);
    let len = bytes.len();
    let r = Genlmsghdr::from_bytes_with_input(&mut Cursor::new(bytes), len).unwrap();
    assert!(connected_in(&r, 4).is_err());
    assert_eq!(connected_in(&r, 3), Ok(false));
}

#[test]
fn kernel_errors_read_as_the_device_and_the_cause() {
    assert_eq!(
        refused(Failure::Errno(libc::EBUSY), "NBD_CMD_CONNECT", 0).to_string(),
        "/dev/nbd0 is in use"
    );
    assert!(matches!(
        refused(Failure::Errno(libc::EPERM), "NBD_CMD_CONNECT", 0),
        NetlinkError::NotPermitted
    ));
    let e = refused(Failure::Errno(libc::EINVAL), "NBD_CMD_CONNECT", 2).to_string();
    assert!(
        e.starts_with("the kernel refused NBD_CMD_CONNECT for /dev/nbd2: Invalid argument"),
        "{e}"
    );
}

#[test]
fn opening_the_family_finds_it_or_says_it_is_missing() {
    // Needs no privileges: the generic netlink controller answers anyone.
    // Here the answer goes through neli both ways: an id, or the
    // controller's ENOENT error reply.
    match Family::open() {
        Ok(_) | Err(NetlinkError::FamilyMissing) => {}
        Err(e) => panic!("{e}"),
    }
}
