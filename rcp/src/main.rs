//! The `rcp` command: parses the command line and hands it to the library
//! ([`rcp::app::run`]); what is left here is the process: the runtime, the
//! error message and the exit status (0: every file arrived and verified;
//! 1: something failed or the copy could not run; 2: bad usage, from clap).

use std::process::ExitCode;

use clap::Parser;
use rcp::cli::Cli;
use rcp::report::Outcome;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rcp: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The work runs as a task on the workers, not on this thread: a future
    // polled by `block_on` is woken across threads at every step.
    let result = rt.block_on(async {
        tokio::spawn(rcp::app::run(cli))
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("internal error: {e}")))
    });
    match result {
        Ok(Outcome::Complete) => ExitCode::SUCCESS,
        Ok(Outcome::Failed) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rcp: {e:#}");
            ExitCode::FAILURE
        }
    }
}
