//! From the command line's [`Tuning`] to a session's [`Params`]: the
//! storage engine is chosen here, once per process, and a fallback is said
//! once on stderr (each of `rcp`, `rcp serve` and the remote side chooses
//! its own).

use rfabric::storage::{self, Kind};

use crate::cli::Tuning;
use crate::session::Params;

/// The storage engine `--io-engine` asks for, probed once; when `auto`
/// cannot have io_uring it says so, once, on stderr, naming `tool`.
pub fn io_engine(t: &Tuning, tool: &str) -> anyhow::Result<Kind> {
    let chosen = storage::select(t.io_engine)?;
    if let Some(notice) = chosen.notice(tool) {
        eprintln!("{notice}");
    }
    Ok(chosen.kind)
}

/// A session's parameters from the tuning flags. `resume` starts off and
/// `streams` at one: only the copying client sets them; a server takes the
/// client's choice from its request.
pub fn params(
    t: &Tuning,
    io_engine: Kind,
    recursive: bool,
    preserve: bool,
    verify: bool,
) -> Params {
    Params {
        recursive,
        preserve,
        verify,
        resume: false,
        chunk: t.chunk_size,
        window: t.window,
        streams: 1,
        io_engine,
        encrypt: t.encrypt,
        // A server takes the client's; a client sets its own.
        digest: crate::digest::Algorithm::Sha256,
    }
}
