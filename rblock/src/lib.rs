//! # rblock: block devices and files exported over NBD
//!
//! `rblock serve` exports files and block devices to NBD clients (the
//! kernel's `nbd-client`, qemu, libnbd tools). The RDMA path (`rblock
//! connect`, requests over queue pairs) builds on the same engine.
//!
//! Rooms: [`nbd`] (the protocol engine, sans I/O: handshake, request
//! checks, reply encoding), [`export`] (what is exported, from the command
//! line), [`storage`] (the io_uring backend of one export), [`serve`]
//! (NBD over TCP and unix sockets: connections, in-flight requests,
//! shutdown; large requests without a copy), [`socket`] (a client's
//! socket, and sending from a file or splicing into a pipe through it),
//! [`fabric`] (rblock's own protocol over RDMA: `rblock connect`),
//! [`backend`] (local storage or a remote export), [`attach`] (the kernel's
//! nbd-client).
#![deny(unsafe_code)]

pub mod attach;
pub mod backend;
pub mod cli;
pub mod export;
pub mod fabric;
pub mod nbd;
pub mod serve;
pub mod socket;
pub mod storage;
