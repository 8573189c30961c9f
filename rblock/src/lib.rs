//! # rblock: block devices and files exported over NBD
//!
//! `rblock serve` exports files and block devices to NBD clients (the
//! kernel's NBD driver, qemu, libnbd tools). The RDMA path (`rblock
//! connect`, requests over queue pairs) builds on the same engine.
//!
//! Rooms, each layer using only those below it (`cargo` has no check
//! for that; the module graph is kept free of cycles):
//!
//! - [`app`]: what each command does (the binary only parses and maps the
//!   outcome to an exit status); [`cli`]: the command line, as clap sees it.
//! - [`serve`]: the server's front ends: NBD over TCP and unix sockets
//!   (listeners, connections, in-flight requests, shutdown; large requests
//!   without a copy), and links of the fabric protocol (`rblock connect`).
//! - [`execute`]: a checked request carried out on a backend, the same for
//!   NBD and the fabric; [`export`]: what is exported, from the command
//!   line and as served; [`config`]: listen and fabric addresses, remote
//!   exports, the zero-copy policy.
//! - [`backend`]: local storage or a remote export, in NBD's terms.
//! - [`fabric`]: rblock's own protocol over RDMA or tcp (the codec, and
//!   the forwarding side a remote export stands on); [`storage`]: one
//!   export's file or device, on rfabric's storage engine (io_uring or
//!   threads), knowing nothing of NBD; [`socket`]: a client's socket, and
//!   sending from a file or splicing into a pipe through it.
//! - [`nbd`]: the protocol engine, sans I/O (handshake, request checks,
//!   reply encoding, errors); [`attach`]: a kernel block device through the
//!   NBD netlink family (with nbd's client handshake), nbd-client as
//!   fallback.
#![forbid(unsafe_code)]

pub mod app;
pub mod attach;
pub mod backend;
pub mod cli;
pub mod config;
pub mod execute;
pub mod exit;
pub mod export;
pub mod fabric;
pub mod nbd;
pub mod serve;
pub mod socket;
pub mod storage;
