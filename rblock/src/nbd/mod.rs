//! The NBD protocol engine, free of I/O: [`handshake`] turns the client's
//! option bytes into replies and a negotiated transmission phase;
//! [`transmission`] checks requests and encodes replies. Numbers in
//! [`consts`]. Reference: NetworkBlockDevice/nbd `doc/proto.md`.

pub mod consts;
pub mod handshake;
pub mod transmission;
