//! # rfabric: the fabric layer of rcp and rblock
//!
//! Both tools move data the same way: a sender writes chunks one-sidedly
//! into a landing ring the receiver registered once, announces each with a
//! 32-bit note, and may write only into slots it holds credits for; small
//! control messages travel as sends. This crate owns that machinery, in
//! layers that depend only downwards:
//!
//! * [`memory`]: page-aligned memory and buffer pools that the NIC, the tcp
//!   backend and io_uring (fixed buffers) can all use.
//! * [`transport`]: a trait shaped like an RC queue pair (register, post
//!   receive/send, notified and plain one-sided writes, reads, asynchronous
//!   completions) and its backends: [`transport::verbs`] (rdma-core through
//!   rdma_cm: InfiniBand, RoCE, iWARP) and [`transport::tcp`]. Nothing above
//!   this layer knows which backend it runs on.
//! * [`credit`]: the credit-based flow-control engine, sans I/O: events in,
//!   decisions out, no sockets, no clock, no runtime.
//! * [`wire`]: the link's messages (hello, credit update, error, goodbye,
//!   application messages, the chunk header), fixed-size little-endian and
//!   checked field by field; `docs/PROTOCOL.md` has them byte by byte.
//! * [`link`]: the glue: a connection plus a landing ring plus the credit
//!   engine, giving `send_chunk`/`recv`/`send_message` with the transport's
//!   safety contract kept by ownership.
//! * [`endpoint`]: picking the backend (`auto`, `rdma`, `tcp`), dialing and
//!   listening on both at one address.
//! * [`storage`]: the storage engine of both tools: file and device I/O
//!   with owned buffers (the same pool memory the transport sends from,
//!   landed chunks), on io_uring where the kernel allows it and on a
//!   bounded thread pool of plain system calls everywhere else (RHEL 8,
//!   and 9.3+/10 where io_uring is refused by default).
//! * [`auth`]: challenge-response over a shared secret, for both tools'
//!   sessions (sans I/O).
//! * [`thread_dir`]: a thread's own working directory, so that the
//!   calls with no `*at` form (extended attributes) reach a name in an
//!   open directory without a walk through `/proc/self/fd`.
//! * [`size`]: sizes as typed on command lines (`64K`, `1M`).
//! * [`daemon_log`] (feature `daemon-log`): how the tools' daemons log,
//!   as terminal lines or journal entries with fields.
#![deny(unsafe_code)]

pub mod auth;
pub mod credit;
#[cfg(feature = "daemon-log")]
pub mod daemon_log;
pub mod endpoint;
pub mod link;
pub mod memory;
pub mod size;
pub mod storage;
pub mod thread_dir;
#[cfg(feature = "tls")]
pub mod tls;
pub mod transport;
pub mod wire;
