//! `rblock connect`: the lanes to the remote export, the local NBD
//! listeners in front of them, and with `--device` the kernel device
//! attached once they are up and detached on the way out.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use rfabric::endpoint;
use rfabric::link::seal::EncryptChoice;

use super::signal::stop_signal;
use crate::backend::Source;
use crate::cli::ConnectArgs;
use crate::config::{Listen, ZeroCopy};
use crate::exit::Usage;
use crate::export::Export;
use crate::fabric::client::{Opened, Remote, Target};
use crate::nbd::consts::tflags;
use crate::nbd::handshake::ExportInfo;
use crate::serve::{self as server, Plan};

/// Serves the remote export `a.target` to local NBD clients until SIGTERM
/// or SIGINT (or until attaching the device fails).
pub async fn connect(a: ConnectArgs) -> anyhow::Result<()> {
    let name = a.target.name.clone();
    let addr = endpoint::resolve(&a.target.host, a.target.port)?;
    let secret = match &a.secret_file {
        Some(f) => Some(Arc::new(rfabric::auth::read_secret(f)?)),
        None => None,
    };
    if secret.is_none() && a.encrypt == EncryptChoice::Always {
        return Err(Usage(
            "--encrypt always needs --secret-file: the keys come from the secret".into(),
        )
        .into());
    }
    let target = Target {
        addr,
        name: name.clone(),
        transport: a.transport,
        secret,
        encrypt: a.encrypt,
    };
    let give_up = Duration::from_secs(a.give_up_after);
    rfabric::daemon_log::init("rblock connect");
    let remote = Remote::connect(target, usize::from(a.connections), give_up).await?;
    let o = remote.opened;
    tracing::info!(
        server = %addr,
        export = name,
        "{addr}/{name}: {} bytes{}, {} lane(s) over {}, {}",
        o.size,
        if read_only(&o) { ", read-only" } else { "" },
        remote.lanes(),
        remote.backend(),
        remote.protection()
    );
    let info = ExportInfo {
        name: name.clone(),
        description: format!("{name} on {addr}, over {}", remote.backend()),
        size: o.size,
        read_only: read_only(&o),
        can_trim: o.flags & tflags::SEND_TRIM != 0,
    };
    let exports = vec![Export {
        info,
        source: Source::Remote(Arc::clone(&remote)),
        secret: None,
    }];
    let mut listen = a.listen.clone();
    // nbd-client reaches us on a socket of our own.
    let private = match &a.device {
        Some(_) => {
            let dir = private_dir()?;
            let sock = dir.join("nbd.sock");
            listen.push(Listen::Unix(sock.clone()));
            Some((dir, sock))
        }
        None => None,
    };
    if listen.is_empty() {
        listen.push(Listen::Tcp(SocketAddr::from(([127, 0, 0, 1], 10809))));
    }
    let attach_error = Arc::new(Mutex::new(None));
    let stop = {
        let device = a.device.clone();
        let sock = private.as_ref().map(|(_, s)| s.clone());
        let lanes = a.connections;
        let request_bytes = remote.request_in_one_go();
        let name = name.clone();
        let attach_error = Arc::clone(&attach_error);
        async move {
            let (Some(device), Some(sock)) = (device, sock) else {
                stop_signal().await;
                return;
            };
            let timeout = a.give_up_after + 30;
            let attached =
                crate::attach::attach(&device, &sock, &name, lanes, timeout, request_bytes);
            match attached.await {
                Ok(how) => tracing::info!(
                    device = %device.display(),
                    "attached as {} {how}",
                    device.display()
                ),
                Err(e) => {
                    *attach_error.lock().expect("lock") = Some(e);
                    return;
                }
            }
            stop_signal().await;
            if let Err(e) = crate::attach::detach(&device).await {
                tracing::error!("{e:#}");
            }
        }
    };
    let plan = Plan {
        listen,
        fabric: None,
        fabric_guard: server::FabricGuard::default(),
        max_connections: a.max_connections,
        grace: Duration::from_secs(30),
        // Its data comes across the fabric, never from a local file.
        zero_copy_reads: ZeroCopy::Never,
        // Its NBD clients are local (a private socket by default).
        nbd_tls: server::NbdTls::default(),
        // Its exports are remote: their requests are the fabric lanes'.
        nbd_threads: 0,
    };
    let served = server::run(exports, plan, stop).await;
    remote.close().await;
    if let Some((dir, _)) = private {
        let _ = std::fs::remove_dir_all(dir);
    }
    if let Some(e) = attach_error.lock().expect("lock").take() {
        return Err(e);
    }
    served
}

/// The export is read-only, as the server said when it was opened.
fn read_only(o: &Opened) -> bool {
    o.flags & tflags::READ_ONLY != 0
}

/// A fresh directory of our own for the socket nbd-client uses: under
/// systemd's RuntimeDirectory, else /run (a tmpfs, where sockets work even
/// when /tmp is a network filesystem), else the temporary directory.
fn private_dir() -> anyhow::Result<PathBuf> {
    let leaf = format!("rblock-connect-{}", std::process::id());
    let bases = std::env::var_os("RUNTIME_DIRECTORY")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/run"), std::env::temp_dir()]);
    let mut last = None;
    for base in bases {
        let dir = base.join(&leaf);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => last = Some((dir, e)),
        }
    }
    let (dir, e) = last.expect("at least one place tried");
    Err(e).with_context(|| format!("cannot create {}", dir.display()))
}
