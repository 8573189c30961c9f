//! The transport's one-sided operations on the backend under test (see
//! `common`): plain writes and reads against a region the peer granted
//! access to, compared byte for byte, and their completions.
#![allow(unsafe_code)]

mod common;

use rfabric::memory::Memory;
use rfabric::transport::{Access, Completion, Connection, Op, completions};

async fn next(conn: &dyn Connection, op: Op) -> Completion {
    loop {
        let mut out = Vec::new();
        completions(conn, &mut out).await.expect("connection up");
        if let Some(c) = out.into_iter().find(|c| c.op == op) {
            return c;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_writes_and_reads_move_the_bytes_they_name() {
    let (server, client) = common::connected().await;
    let size = 1 << 20;
    // The server's region: writable and readable by the peer, no gate.
    let target = Memory::new(size).unwrap();
    let region = server
        .register(
            &target,
            Access {
                remote_write: true,
                remote_read: true,
            },
            None,
        )
        .unwrap();
    let remote = region.remote();
    // The client's buffers.
    let local = Memory::new(2 * size).unwrap();
    let mine = client.register(&local, Access::LOCAL, None).unwrap();
    let data = common::pattern(7, 7, 300_000);
    // SAFETY: nothing is posted on this memory yet.
    unsafe { local.slice_mut(0, data.len()) }.copy_from_slice(&data);

    // Write at an odd offset, from two segments.
    let split = 123_457;
    let sgl = [
        mine.segment(0, split).unwrap(),
        mine.segment(split, data.len() - split).unwrap(),
    ];
    // SAFETY: the source stays untouched until the completion below.
    unsafe { client.write(11, &sgl, remote.at(4099)).unwrap() };
    let c = next(&*client, Op::Write).await;
    assert_eq!((c.wr_id, c.status.clone()), (11, Ok(())));
    assert_eq!(c.byte_len as usize, data.len());

    // Read it back into the second half of the client's memory.
    let back = mine.segment(size, data.len()).unwrap();
    // SAFETY: the destination is untouched until the completion below.
    unsafe { client.read(12, back, remote.at(4099)).unwrap() };
    let c = next(&*client, Op::Read).await;
    assert_eq!((c.wr_id, c.status.clone()), (12, Ok(())));
    // SAFETY: the read completed.
    assert!(unsafe { local.slice(size, data.len()) } == data.as_slice());
    // And the server's memory holds the bytes where they were aimed.
    // SAFETY: no operation on it is outstanding.
    let placed = unsafe { target.slice(4099, data.len()) };
    assert!(placed == data.as_slice());
    // SAFETY: as above.
    let before = unsafe { target.slice(0, 4099) };
    assert!(before.iter().all(|&b| b == 0));
    drop(server);
}
