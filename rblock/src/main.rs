//! The `rblock` command: parses the command line and hands it to the
//! library ([`rblock::app::run`]); what is left here is the process: the
//! runtime, the error message and the exit status (0: done; 1: the command
//! failed or could not start; 2: bad usage, from clap).

use std::process::ExitCode;

use clap::Parser;
use rblock::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match rblock::app::runtime(&cli.command) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rblock: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The work runs as a task, not in `block_on` itself: on a runtime with
    // workers, a future polled by `block_on` is woken across threads at
    // every step.
    let result = rt.block_on(async {
        tokio::spawn(rblock::app::run(cli))
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("internal error: {e}")))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rblock: {e:#}");
            ExitCode::FAILURE
        }
    }
}
