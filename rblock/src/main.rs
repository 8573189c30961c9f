//! The `rblock` command: parses the command line and hands it to the
//! library ([`rblock::app::run`]); what is left here is the process: the
//! runtime, the error message and the exit status ([`rblock::exit`]: 0
//! done; 1 failed; 2 bad usage; 3 refused; 5 local I/O error; 6 the server
//! unreachable).

use std::process::ExitCode;

/// mimalloc rather than glibc's malloc, as rcp: a busy server allocates
/// and frees a request's buffers and tasks across its threads, where
/// glibc's `malloc`, `free` and `realloc` took 6% of the server's samples
/// (4 KiB random reads, two fio jobs at iodepth 32). With mimalloc that
/// row ran at 1.02-1.05x the IOPS (4 paired rounds), 4 KiB reads at 40k
/// IOPS cost 0.98x the CPU, and the 1 MiB rows moved within their noise.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use rblock::cli::Cli;
use rblock::exit::Exit;

/// How long the runtime's threads get to end once the work is done.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match rblock::app::runtime(&cli.command) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rblock: cannot start: {e}");
            return ExitCode::from(Exit::Io.code());
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
    // The work is over (a server's stop has had its grace): a thread still
    // blocked, such as a connection thread writing to a client that reads
    // nothing, must not keep the process alive.
    rt.shutdown_timeout(SHUTDOWN_WAIT);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rblock: {e:#}");
            ExitCode::from(Exit::of_error(&e).code())
        }
    }
}
