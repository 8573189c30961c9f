//! One buffer pool serves io_uring (as fixed buffers) and the transport (as
//! a registered region): a file read with `READ_FIXED` goes out as chunks
//! and arrives intact.
#![allow(unsafe_code)]

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;

use io_uring::{IoUring, opcode, types};
use rfabric::link::{ChunkMeta, Incoming, LinkConfig};
use rfabric::memory::BufferPool;
use rfabric::wire::Role;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_read_into_fixed_buffers_is_sent_from_them() {
    let chunk = 64 * 1024;
    let content = common::pattern(1, 2, 5 * chunk + 123);
    let path = std::env::temp_dir().join(format!("rfabric-io-uring-{}", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&content)
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();

    let pool = BufferPool::new(4, chunk).unwrap();
    let mut ring = IoUring::new(8).expect("io_uring is available");
    // SAFETY: the pool's memory outlives the ring (both live to the end of
    // this test, the ring is dropped first), and buffers are only used by
    // io_uring while a lease is held and a read is in flight.
    unsafe { ring.submitter().register_buffers(&pool.iovecs()).unwrap() };

    let (server, client) = common::link_pair(
        LinkConfig::new(Role::Server, 2, chunk as u32),
        LinkConfig::new(Role::Client, 0, chunk as u32),
    )
    .await;
    let region = client.register(pool.memory()).unwrap();
    let receiver = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(item) = server.recv().await.unwrap() {
            if let Incoming::Chunk(c) = item {
                assert_eq!(c.header().offset, got.len() as u64);
                got.extend_from_slice(c.payload());
            }
        }
        server.finish().await.unwrap();
        got
    });

    let mut offset = 0u64;
    while offset < content.len() as u64 {
        let mut buf = pool.acquire().await;
        let read = opcode::ReadFixed::new(
            types::Fd(file.as_raw_fd()),
            buf.as_mut_ptr(),
            buf.capacity() as u32,
            buf.index() as u16,
        )
        .offset(offset)
        .build()
        .user_data(offset);
        // SAFETY: the buffer is leased to us and nothing else touches it until
        // the completion is reaped just below.
        unsafe { ring.submission().push(&read).unwrap() };
        ring.submit_and_wait(1).unwrap();
        let cqe = ring.completion().next().unwrap();
        assert!(cqe.result() > 0, "read failed: {}", cqe.result());
        buf.set_len(cqe.result() as usize);
        let meta = ChunkMeta {
            offset,
            ..ChunkMeta::default()
        };
        offset += cqe.result() as u64;
        client.send_chunk(meta, &region, buf).await.unwrap();
    }
    client.finish().await.unwrap();
    let got = receiver.await.unwrap();
    drop(ring);
    std::fs::remove_file(&path).unwrap();
    assert!(got == content, "received file differs");
}
