//! # rblock: block devices and files exported over NBD
//!
//! `rblock serve` exports files and block devices to NBD clients (the
//! kernel's NBD driver, qemu, libnbd tools). The RDMA path (`rblock
//! connect`, requests over queue pairs) builds on the same engine.
//!
//! Rooms: [`app`] (what each command does; the binary only parses and
//! maps the outcome to an exit status), [`cli`] (the command line, as clap
//! sees it), [`config`] (listen and fabric addresses, remote exports, the
//! zero-copy policy: plain values both the command line and the server
//! use), [`nbd`] (the protocol engine, sans I/O: handshake, request
//! checks, reply encoding), [`export`] (what is exported, from the command
//! line), [`storage`] (one export's file or device, on rfabric's storage
//! engine: io_uring or threads), [`serve`]
//! (NBD over TCP and unix sockets: connections, in-flight requests,
//! shutdown; large requests without a copy), [`socket`] (a client's
//! socket, and sending from a file or splicing into a pipe through it),
//! [`fabric`] (rblock's own protocol over RDMA: `rblock connect`),
//! [`backend`] (local storage or a remote export), [`attach`] (a kernel
//! block device through the NBD netlink family, nbd-client as fallback).
#![forbid(unsafe_code)]

pub mod app;
pub mod attach;
pub mod backend;
pub mod cli;
pub mod config;
pub mod export;
pub mod fabric;
pub mod nbd;
pub mod serve;
pub mod socket;
pub mod storage;
