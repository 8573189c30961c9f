//! What each command does, once parsed: the binary hands the command line
//! to [`run`] on the runtime [`runtime`] builds, and maps the outcome to an
//! exit status. [`serve`] assembles the exports and the listeners for
//! [`crate::serve::run`]; [`connect`] reaches a remote export and serves it
//! to local NBD clients, attaching the kernel device around that;
//! [`detach`] clears what a killed `connect --device` left attached.

mod connect;
mod serve;
mod signal;

pub use self::connect::connect;
pub use self::serve::serve;

use crate::cli::{Cli, Cmd, DetachArgs};

/// Carries out the command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Serve(a) => serve(a).await,
        Cmd::Connect(a) => connect(a).await,
        Cmd::Detach(a) => detach(a).await,
    }
}

/// The shared runtime `command` runs on: one thread for `connect`, a
/// thread per core for the others; `RBLOCK_THREADS=1` makes it one thread
/// for every command, any other value a thread per core (documented in
/// the commands' `--help`). (`serve` adds runtimes of one thread each:
/// `serve/single_threaded.rs`.)
pub fn runtime(command: &Cmd) -> std::io::Result<tokio::runtime::Runtime> {
    // The gateway only forwards: on one thread, a request crosses it
    // without waking another (each wake-up costs more than the forwarding).
    let mut builder = match (command, std::env::var_os("RBLOCK_THREADS")) {
        (_, Some(v)) if v == "1" => tokio::runtime::Builder::new_current_thread(),
        (Cmd::Connect(_), None) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build()
}

/// `rblock detach DEVICE`: detaches the kernel NBD device if attached;
/// nothing to do is not an error.
pub async fn detach(a: DetachArgs) -> anyhow::Result<()> {
    if crate::attach::detach_if_attached(&a.device).await? {
        eprintln!("rblock detach: {} detached", a.device.display());
    } else {
        eprintln!("rblock detach: {} was not attached", a.device.display());
    }
    Ok(())
}
