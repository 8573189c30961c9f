//! rblock over the fabric: `rblock serve --listen` takes requests over
//! rfabric links (RDMA queue pairs, or tcp), `rblock connect` forwards a
//! local NBD client's requests over them. [`proto`] is the request
//! protocol (sans I/O), [`client`] the forwarding side with its
//! reconnects (its rules in [`requests`], the table of requests in flight
//! on a link, and its timing in [`redial`], both sans I/O; a read's data
//! held in the slots it landed in, [`landed`]), [`link_config`] the shape
//! of a link both sides agree on.
//! The serving side is one of the server's front ends, beside NBD over
//! TCP: `serve/link.rs` (it carries requests out on local storage, a
//! layer above this one, which `rblock connect`'s backend stands on).

pub mod client;
pub mod landed;
pub mod proto;
pub mod redial;
pub mod requests;

use rfabric::endpoint::fitted_link_config;
use rfabric::link::LinkConfig;
use rfabric::transport::Limits;
use rfabric::wire::Role;

/// Landing slots per side of a link: the data of this many request pieces
/// in flight each way.
pub const SLOTS: u32 = 32;
/// Bytes a slot carries; longer requests travel in pieces of this size.
pub const PIECE: usize = 256 * 1024;
/// Control messages in flight each way (requests, replies).
const CONTROL_DEPTH: u32 = 128;
/// Largest control message: room for a block status answer.
const CONTROL_SIZE: u32 = 16 * 1024;

/// The shape of an rblock link on this connection.
pub fn link_config(role: Role, limits: &Limits) -> LinkConfig {
    fitted_link_config(role, SLOTS, PIECE, CONTROL_DEPTH, CONTROL_SIZE, limits)
}
