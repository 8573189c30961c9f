use super::*;

#[test]
fn devices_are_named_by_their_index() {
    assert_eq!(index_of(Path::new("/dev/nbd0")), Some(0));
    assert_eq!(index_of(Path::new("/dev/nbd15")), Some(15));
    for not in ["/dev/nbd", "/dev/nbd1p1", "/dev/sda", "/dev/nbdx", "/"] {
        assert_eq!(index_of(Path::new(not)), None, "{not}");
    }
    // A node the kernel has not made yet is taken as named.
    assert_eq!(device_index(Path::new("/nonexistent/nbd7")).unwrap(), 7);
    let e = device_index(Path::new("/dev/null"))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "/dev/null is not an NBD device (/dev/nbdN)");
}

#[test]
fn the_report_says_which_way_and_how_many_connections() {
    assert_eq!(
        Attached::Netlink { connections: 2 }.to_string(),
        "kernel netlink, 2 connections"
    );
    assert_eq!(
        Attached::Netlink { connections: 1 }.to_string(),
        "kernel netlink, 1 connection"
    );
    let why = NetlinkError::FamilyMissing.to_string();
    assert_eq!(
        Attached::NbdClient {
            connections: 4,
            why: why.clone()
        }
        .to_string(),
        format!("nbd-client, 4 connections; {why}")
    );
}

#[test]
fn the_report_says_how_large_a_request_may_be() {
    let how = Attached::Netlink { connections: 2 };
    let raised = Attachment {
        how: how.clone(),
        request_limit_kb: Ok(8192),
    };
    assert_eq!(
        raised.to_string(),
        "(kernel netlink, 2 connections), requests up to 8192 KiB"
    );
    let kept = Attachment {
        how,
        request_limit_kb: Err("cannot read /sys/block/nbd1/queue/max_hw_sectors_kb: gone".into()),
    };
    assert_eq!(
        kept.to_string(),
        "(kernel netlink, 2 connections), requests as large as the kernel's default \
         (cannot read /sys/block/nbd1/queue/max_hw_sectors_kb: gone)"
    );
}
