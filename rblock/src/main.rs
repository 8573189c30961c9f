//! The `rblock` command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use rblock::backend::Source;
use rblock::cli::{Cli, Cmd, ConnectArgs, DetachArgs, FABRIC_PORT, ServeArgs, ZeroCopy};
use rblock::fabric::client::{Remote, Target};
use rblock::nbd::consts::tflags;
use rblock::nbd::handshake::ExportInfo;
use rblock::serve::{self, Export, Listen, Plan};
use rblock::storage::Storage;
use rfabric::endpoint::{self, Listener};
use rfabric::storage::{self, Engine};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The gateway only forwards: on one thread, a request crosses it
    // without waking another (each wake-up costs more than the forwarding).
    let mut builder = match (&cli.command, std::env::var_os("RBLOCK_THREADS")) {
        (_, Some(v)) if v == "1" => tokio::runtime::Builder::new_current_thread(),
        (Cmd::Connect(_), None) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let rt = match builder.enable_all().build() {
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
                Cmd::Connect(a) => connect_cmd(a).await,
                Cmd::Detach(a) => detach_cmd(a).await,
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
    let chosen = storage::select(a.io_engine)?;
    if let Some(notice) = chosen.notice("rblock serve") {
        eprintln!("{notice}");
    }
    let engine = Engine::per_thread(chosen.kind)
        .with_context(|| format!("cannot start the {} storage engine", chosen.kind))?;
    eprintln!("rblock serve: {} storage engine", chosen.kind);
    let mut exports = Vec::new();
    for spec in &a.exports {
        if exports.iter().any(|e: &Export| e.info.name == spec.name) {
            anyhow::bail!("export {:?} is named twice", spec.name);
        }
        let storage = Storage::open(&spec.path, spec.read_only, &engine)?;
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
            source: Source::Local(Arc::new(storage)),
        });
    }
    let fabric = match &a.fabric {
        None => None,
        Some(at) => {
            let addr = fabric_addr(at)?;
            let l = Listener::bind(addr, a.transport)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            let over = match (l.has_rdma(), l.has_tcp()) {
                (true, true) => "rdma and tcp",
                (true, false) => "rdma",
                _ => "tcp",
            };
            eprintln!("rblock serve: serving rblock connect on {addr} over {over}");
            Some(l)
        }
    };
    let plan = Plan {
        who: "rblock serve",
        listen: a.listen,
        fabric,
        max_connections: a.max_connections,
        grace: Duration::from_secs(30),
        zero_copy_reads: a.zero_copy_reads,
    };
    serve::run(exports, plan, stop_signal()).await
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

/// ADDR or ADDR:PORT (a bracketed IPv6 address with a port).
fn fabric_addr(at: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = at.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip: std::net::IpAddr = at
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .with_context(|| format!("{at:?}: expected ADDR or ADDR:PORT"))?;
    Ok(SocketAddr::new(ip, FABRIC_PORT))
}

/// HOST[:PORT]/NAME split up.
fn parse_target(s: &str) -> anyhow::Result<(String, u16, String)> {
    let (place, name) = s
        .split_once('/')
        .with_context(|| format!("{s:?}: expected HOST[:PORT]/NAME"))?;
    if place.is_empty() {
        bail!("{s:?}: the host is missing (HOST[:PORT]/NAME)");
    }
    let (host, port) = match place.rsplit_once(':') {
        // A bare IPv6 address has colons but no brackets: no port then.
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => (
            h,
            p.parse()
                .with_context(|| format!("{s:?}: {p:?} is not a port"))?,
        ),
        _ => (place, FABRIC_PORT),
    };
    Ok((host.to_string(), port, name.to_string()))
}

async fn detach_cmd(a: DetachArgs) -> anyhow::Result<()> {
    if rblock::attach::detach_if_attached(&a.device).await? {
        eprintln!("rblock detach: {} detached", a.device.display());
    } else {
        eprintln!("rblock detach: {} was not attached", a.device.display());
    }
    Ok(())
}

async fn connect_cmd(a: ConnectArgs) -> anyhow::Result<()> {
    let (host, port, name) = parse_target(&a.target)?;
    let addr = endpoint::resolve(&host, port)?;
    let target = Target {
        addr,
        name: name.clone(),
        transport: a.transport,
    };
    let give_up = Duration::from_secs(a.give_up_after);
    let remote = Remote::connect(target, usize::from(a.connections), give_up).await?;
    let o = remote.opened;
    eprintln!(
        "rblock connect: {addr}/{name}: {} bytes{}, {} lane(s) over {}",
        o.size,
        if o.flags & tflags::READ_ONLY != 0 {
            ", read-only"
        } else {
            ""
        },
        remote.lanes(),
        remote.backend()
    );
    let info = ExportInfo {
        name: name.clone(),
        description: format!("{name} on {addr}, over {}", remote.backend()),
        size: o.size,
        read_only: o.flags & tflags::READ_ONLY != 0,
        can_trim: o.flags & tflags::SEND_TRIM != 0,
    };
    let exports = vec![Export {
        info,
        source: Source::Remote(Arc::clone(&remote)),
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
        let name = name.clone();
        let attach_error = Arc::clone(&attach_error);
        async move {
            let (Some(device), Some(sock)) = (device, sock) else {
                stop_signal().await;
                return;
            };
            let timeout = a.give_up_after + 30;
            match rblock::attach::attach(&device, &sock, &name, lanes, timeout).await {
                Ok(how) => eprintln!("rblock connect: attached as {} ({how})", device.display()),
                Err(e) => {
                    *attach_error.lock().expect("lock") = Some(e);
                    return;
                }
            }
            stop_signal().await;
            if let Err(e) = rblock::attach::detach(&device).await {
                eprintln!("rblock connect: {e:#}");
            }
        }
    };
    let plan = Plan {
        who: "rblock connect",
        listen,
        fabric: None,
        max_connections: a.max_connections,
        grace: Duration::from_secs(30),
        // Its data comes across the fabric, never from a local file.
        zero_copy_reads: ZeroCopy::Never,
    };
    let served = serve::run(exports, plan, stop).await;
    remote.close().await;
    if let Some((dir, _)) = private {
        let _ = std::fs::remove_dir_all(dir);
    }
    if let Some(e) = attach_error.lock().expect("lock").take() {
        return Err(e);
    }
    served
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
