//! The NBD protocol engine, free of I/O: [`handshake`] turns the client's
//! option bytes into replies and a negotiated transmission phase;
//! [`transmission`] checks requests and encodes replies;
//! [`client_handshake`] is the other side of the handshake, for handing a
//! negotiated socket to the kernel's NBD driver. Numbers in [`consts`].
//! Reference: NetworkBlockDevice/nbd `doc/proto.md`.

pub mod client_handshake;
pub mod consts;
pub mod handshake;
pub mod transmission;
