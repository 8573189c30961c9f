//! `rblock serve`: the storage engine, the exports opened on it, the
//! fabric listener, then [`crate::serve::run`] until SIGTERM or SIGINT.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rfabric::auth;
use rfabric::endpoint::Listener;
use rfabric::storage::{self, Engine, Kind};

use super::signal::stop_signal;
use crate::backend::Source;
use crate::cli::ServeArgs;
use crate::config::TlsMode;
use crate::exit::Usage;
use crate::export::Export;
use crate::nbd::handshake::ExportInfo;
use crate::serve::{self as server, Plan};
use crate::storage::Storage;

/// Serves `a.exports` until SIGTERM or SIGINT.
pub async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    rfabric::daemon_log::init("rblock serve");
    let chosen = storage::select(a.io_engine)?;
    if let Some(note) = chosen.fallback_note() {
        tracing::warn!("{note}");
    }
    let engine = Engine::per_thread(chosen.kind)
        .with_context(|| format!("cannot start the {} storage engine", chosen.kind))?;
    match chosen.kind {
        Kind::Threads => tracing::info!(
            io_engine = "threads",
            "threads storage engine ({} threads)",
            Engine::pool_threads()
        ),
        Kind::IoUring => tracing::info!(io_engine = "io_uring", "io_uring storage engine"),
    }
    let mut exports = Vec::new();
    for spec in &a.exports {
        if exports.iter().any(|e: &Export| e.info.name == spec.name) {
            anyhow::bail!("export {:?} is named twice", spec.name);
        }
        let storage = Storage::open(&spec.path, spec.read_only, &engine)?;
        tracing::info!(
            export = spec.name,
            "export {:?}: {} ({} bytes{})",
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
            source: Source::Local(Arc::new(storage)),
            secret: match &spec.secret_file {
                Some(f) => Some(Arc::new(auth::read_secret(f)?)),
                None => None,
            },
        });
    }
    let secret = match &a.secret_file {
        Some(f) => Some(Arc::new(auth::read_secret(f)?)),
        None => None,
    };
    let fabric = match a.fabric {
        None => None,
        Some(at) => {
            let addr = at.0;
            let every_export_has_one = exports.iter().all(|e| e.secret.is_some());
            if secret.is_none() && !every_export_has_one && !addr.ip().is_loopback() {
                if !a.no_auth {
                    return Err(Usage(format!(
                        "refusing to serve --listen {addr} without a secret: anyone who \
                         reaches it could read and write every export. Give --secret-file \
                         FILE (and the same file to rblock connect), or --no-auth to serve \
                         it open"
                    ))
                    .into());
                }
                tracing::warn!(
                    "--no-auth: serving rblock connect on {addr} without a secret: anyone \
                     who reaches it can read and write every export"
                );
            }
            // (Tcp connections set up on the thread that serves them.)
            let l = Listener::bind_unestablished(addr, a.transport)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            let over = match (l.has_rdma(), l.has_tcp()) {
                (true, true) => "rdma and tcp",
                (true, false) => "rdma",
                _ => "tcp",
            };
            tracing::info!("serving rblock connect on {addr} over {over}");
            Some(l)
        }
    };
    let nbd_tls = nbd_tls(&a)?;
    let plan = Plan {
        listen: a.listen,
        fabric,
        fabric_guard: server::FabricGuard {
            secret,
            encrypt: a.encrypt,
        },
        max_connections: a.max_connections,
        grace: Duration::from_secs(a.stop_grace),
        zero_copy_reads: a.zero_copy_reads,
        nbd_tls,
        nbd_threads: usize::from(a.nbd_threads),
    };
    server::run(exports, plan, stop_signal()).await
}

/// The TLS `--tls` asks for, with its credentials loaded now (a bad file
/// stops the start, not the first client).
fn nbd_tls(a: &ServeArgs) -> anyhow::Result<server::NbdTls> {
    use rfabric::tls::{Credentials, TlsServer};
    let creds = match (&a.tls_certificates, &a.tls_psk) {
        (Some(dir), None) => Some(Credentials::X509 { dir: dir.clone() }),
        (None, Some(file)) => Some(Credentials::Psk { file: file.clone() }),
        (None, None) => None,
        (Some(_), Some(_)) => unreachable!("clap refuses both"),
    };
    let server = match (a.tls, creds) {
        (TlsMode::Off, None) => None,
        (TlsMode::Off, Some(_)) => {
            return Err(Usage(
                "--tls-certificates and --tls-psk need --tls on or --tls require".into(),
            )
            .into());
        }
        (_, None) => {
            return Err(Usage(
                "--tls on and --tls require need --tls-certificates DIR or --tls-psk FILE".into(),
            )
            .into());
        }
        (_, Some(c)) => Some(TlsServer::new(&c).map_err(|e| Usage(format!("--tls: {e}")))?),
    };
    Ok(server::NbdTls {
        mode: a.tls.handshake(),
        server,
    })
}
