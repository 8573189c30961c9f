//! The link shape of an rcp session.

use std::time::Duration;

use rfabric::endpoint::fitted_link_config;
use rfabric::link::LinkConfig;
use rfabric::transport::Limits;
use rfabric::wire::Role;

/// Control receives of an rcp link.
const CONTROL_DEPTH: u32 = 32;

/// The link shape of an rcp session: a landing ring of `window` slots of
/// `chunk` bytes each way, control messages big enough for any path; both
/// cut down to what the connection's device allows. The peer may be
/// silent for `silence` (`--timeout`).
pub fn link_config(
    role: Role,
    window: u32,
    chunk: usize,
    silence: Option<Duration>,
    limits: &Limits,
) -> LinkConfig {
    LinkConfig {
        silence,
        ..fitted_link_config(role, window, chunk, CONTROL_DEPTH, 16 * 1024, limits)
    }
}
