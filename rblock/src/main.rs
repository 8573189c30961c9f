//! The `rblock` command.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use rblock::export::ExportSpec;
use rblock::nbd::handshake::ExportInfo;
use rblock::serve::{self, Export, Listen};
use rblock::storage::Storage;

/// Export block devices and files to NBD clients (the kernel's nbd-client,
/// qemu, libnbd's tools).
#[derive(Parser, Debug)]
#[command(name = "rblock", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve exports over NBD (TCP or a unix socket) until SIGTERM.
    Serve(ServeArgs),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// An export: NAME=PATH, or NAME=PATH,ro for read-only. PATH is a
    /// regular file or a block device; its size is the export's size.
    /// Repeat for more; the first one is also the default export (the
    /// empty name).
    #[arg(long = "export", required = true, value_name = "NAME=PATH[,ro]")]
    exports: Vec<ExportSpec>,
    /// Where NBD clients connect: ADDR:PORT or unix:PATH. Repeat for more.
    #[arg(
        long = "nbd-listen",
        value_name = "ADDR:PORT|unix:PATH",
        default_value = "127.0.0.1:10809"
    )]
    listen: Vec<Listen>,
    /// Connections served at once; more are refused.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rblock: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        tokio::spawn(async move {
            match cli.command {
                Cmd::Serve(a) => serve_cmd(a).await,
            }
        })
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

async fn serve_cmd(a: ServeArgs) -> anyhow::Result<()> {
    // Fail now, clearly, where io_uring is missing or forbidden.
    rfabric::uring::Uring::local().context("cannot start io_uring")?;
    let mut exports = Vec::new();
    for spec in &a.exports {
        if exports.iter().any(|e: &Export| e.info.name == spec.name) {
            anyhow::bail!("export {:?} is named twice", spec.name);
        }
        let storage = Storage::open(&spec.path, spec.read_only)?;
        eprintln!(
            "rblock serve: export {:?}: {} ({} bytes{})",
            spec.name,
            spec.path.display(),
            storage.size(),
            if spec.read_only { ", read-only" } else { "" }
        );
        exports.push(Export {
            info: ExportInfo {
                name: spec.name.clone(),
                description: spec.path.display().to_string(),
                size: storage.size(),
                read_only: storage.read_only(),
                can_trim: storage.can_trim(),
            },
            storage: Arc::new(storage),
        });
    }
    serve::run(
        exports,
        &a.listen,
        a.max_connections,
        stop_signal(),
        Duration::from_secs(30),
    )
    .await
}

/// SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
