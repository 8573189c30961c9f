//! The serving sides: `rcp serve`, the daemon (its roots checked once, one
//! listener, at most `--max-clients` sessions at a time, the rest refused
//! with a reason the client sees), and `rcp server-once`, the far side of
//! remote-shell mode (one session on a fresh port, authenticated by a
//! one-time token).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use rfabric::endpoint::Listener;

use crate::archive::Preserve;
use crate::cli::{ServeArgs, ServerOnceArgs};
use crate::exit::Exit;
use crate::session::{self, Params, ServeConfig, Served};
use crate::tuning::{io_engine, params};
use crate::{digest, shell};
use rfabric::auth;

/// How long the far side of remote-shell mode waits for its client: the
/// client connects as soon as it has read the banner.
const SERVER_ONCE_WAIT: Duration = Duration::from_secs(60);

/// `rcp serve`: serves copies to and from the roots until killed.
pub async fn serve(a: ServeArgs) -> anyhow::Result<Exit> {
    rfabric::daemon_log::init("rcp serve");
    let secret = auth::read_secret(&a.secret_file)?;
    let roots = canonical_roots(&a.roots)?;
    let engine = io_engine(&a.tuning, "rcp serve")?;
    let config = Arc::new(ServeConfig {
        roots,
        secret,
        params: Params {
            owners_allowed: a.allow_owners,
            ..params(&a.tuning, engine, false, Preserve::default(), true)
        },
        log: true,
        sessions: Arc::default(),
        // (Confined: every file by descriptor, beneath its roots.)
        own_files: false,
    });
    let listener = Listener::bind(a.listen, a.tuning.transport)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    tracing::info!(
        io_engine = %engine,
        "listening on {} (tcp{}), {engine} storage engine",
        a.listen,
        if listener.has_rdma() { " and rdma" } else { "" },
    );
    accept_loop(&listener, &config, a.max_clients).await
}

/// The roots as absolute paths without symlinks, each an existing
/// directory: confinement compares against these.
fn canonical_roots(given: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut roots = Vec::new();
    for r in given {
        let abs = std::fs::canonicalize(r).with_context(|| format!("root {}", r.display()))?;
        if !abs.is_dir() {
            bail!("root {} is not a directory", r.display());
        }
        roots.push(abs);
    }
    Ok(roots)
}

/// Accepts for ever; a connection beyond `max_clients` sessions is told
/// why it is turned away instead of waiting. A failed accept or session is
/// logged and the daemon goes on.
async fn accept_loop(
    listener: &Listener,
    config: &Arc<ServeConfig>,
    max_clients: usize,
) -> anyhow::Result<Exit> {
    let slots = Arc::new(tokio::sync::Semaphore::new(max_clients));
    loop {
        let conn = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("accept failed: {e:#}");
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            let reason = format!("busy: {max_clients} connections already (--max-clients)");
            tracing::warn!(client = conn.peer_name(), "refusing a client: {reason}");
            let config = Arc::clone(config);
            tokio::spawn(async move { session::refuse(conn, &config, reason).await });
            continue;
        };
        let config = Arc::clone(config);
        tokio::spawn(async move {
            let client = conn.peer_name();
            match session::server(conn, &config).await {
                Ok(Served::Session(stats)) => tracing::info!(
                    client,
                    files = stats.files,
                    bytes = stats.bytes,
                    failed = stats.failed,
                    "session done: {} file(s), {} bytes{}",
                    stats.files,
                    stats.bytes,
                    if stats.failed { ", some failed" } else { "" }
                ),
                Ok(Served::Joined) => {}
                Err(e) => tracing::warn!(client, "session failed: {e:#}"),
            }
            drop(permit);
        });
    }
}

/// `rcp server-once`: listens on a fresh port, prints the banner (port and
/// one-time token) for the client at the other end of the remote shell,
/// serves that one session and its streams, and ends.
pub async fn server_once(a: ServerOnceArgs) -> anyhow::Result<Exit> {
    let engine = io_engine(&a.tuning, "rcp (remote side)")?;
    let ip = shell::listen_ip();
    let listener = Listener::bind(SocketAddr::new(ip, 0), a.tuning.transport)
        .await
        .with_context(|| format!("cannot listen on {ip}"))?;
    let token = digest::hex(&auth::nonce());
    println!("{}", shell::banner(listener.port()?, &token, ip));
    let config = ServeConfig {
        roots: vec![PathBuf::from("/")],
        secret: token.into_bytes(),
        params: params(&a.tuning, engine, false, Preserve::default(), true),
        log: true,
        sessions: Arc::default(),
        own_files: true,
    };
    let stats = session::serve_one(listener, config, SERVER_ONCE_WAIT).await?;
    Ok(if stats.failed {
        Exit::Partial
    } else {
        Exit::Complete
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_are_canonical_directories() {
        let dir = std::env::temp_dir().join(format!("rcp-daemon-roots-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("file"), b"x").unwrap();
        let roots = canonical_roots(&[dir.join("sub/../sub")]).unwrap();
        assert_eq!(roots, [std::fs::canonicalize(dir.join("sub")).unwrap()]);
        let e = canonical_roots(&[dir.join("file")]).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            format!("root {} is not a directory", dir.join("file").display())
        );
        let e = canonical_roots(&[dir.join("missing")]).unwrap_err();
        assert!(
            format!("{e:#}").starts_with(&format!("root {}: ", dir.join("missing").display())),
            "{e:#}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
