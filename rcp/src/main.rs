//! The `rcp` command: parses the command line, picks the mode, prints the
//! summary, maps failures to exit codes (0: every file arrived and verified;
//! 1: something failed; 2: bad usage).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use rcp::cli::{Cli, Cmd, CopyArgs, ServeArgs, ServerOnceArgs, Tuning};
use rcp::operand::Operand;
use rcp::report::Progress;
use rcp::session::{self, Params, Report, Request, ServeConfig, Served, Target};
use rcp::{auth, digest, shell};
use rfabric::endpoint::{self, Listener, Transport};
use rfabric::storage::{self, Kind};

/// The storage engine `--io-engine` asks for, probed once; when `auto`
/// cannot have io_uring it says so, once, on stderr.
fn io_engine(t: &Tuning, tool: &str) -> anyhow::Result<Kind> {
    let chosen = storage::select(t.io_engine)?;
    if let Some(notice) = chosen.notice(tool) {
        eprintln!("{notice}");
    }
    Ok(chosen.kind)
}

fn params(t: &Tuning, io_engine: Kind, recursive: bool, preserve: bool, verify: bool) -> Params {
    Params {
        recursive,
        preserve,
        verify,
        resume: false,
        chunk: t.chunk_size,
        window: t.window,
        streams: 1,
        io_engine,
    }
}

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
        tokio::spawn(async move {
            match cli.command {
                Some(Cmd::Serve(a)) => serve(a).await,
                Some(Cmd::ServerOnce(a)) => server_once(a).await,
                None => copy(cli.copy).await,
            }
        })
        .await
        .unwrap_or_else(|e| Err(anyhow::anyhow!("internal error: {e}")))
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rcp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn copy(a: CopyArgs) -> anyhow::Result<ExitCode> {
    let operands = a
        .operands
        .iter()
        .map(|s| Operand::parse(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (dest, sources) = operands.split_last().expect("clap asks for two or more");
    let engine = io_engine(&a.tuning, "rcp")?;
    let p = Params {
        resume: a.resume,
        streams: a.streams,
        ..params(&a.tuning, engine, a.recursive, a.preserve, !a.no_verify)
    };
    let progress = Progress::new(!a.quiet && !a.json);
    let remote_sources = sources.iter().filter(|s| !s.is_local()).count();
    let report = match (dest, remote_sources) {
        (Operand::Local(dest), 0) => local_copy(sources, dest, p, &progress).await?,
        (Operand::Local(dest), n) if n == sources.len() => {
            let first = &sources[0];
            if sources.iter().any(|s| !same_remote(s, first)) {
                bail!("all remote sources must be on the same host");
            }
            let paths = sources.iter().map(remote_path).collect();
            let request = Request::Pull {
                sources: paths,
                dest: dest.clone(),
            };
            remote_copy(first, request, &a, p, &progress).await?
        }
        (remote, 0) => {
            let paths = sources
                .iter()
                .map(|s| match s {
                    Operand::Local(p) => p.clone(),
                    _ => unreachable!("all local"),
                })
                .collect();
            let request = Request::Push {
                sources: paths,
                dest: remote_path(remote),
            };
            remote_copy(remote, request, &a, p, &progress).await?
        }
        _ => bail!("copies between two remote places are not supported: one side must be local"),
    };
    progress.finish();
    Ok(summarize(&report, a.json, a.quiet))
}

fn same_remote(a: &Operand, b: &Operand) -> bool {
    match (a, b) {
        (Operand::Shell { login: x, .. }, Operand::Shell { login: y, .. }) => x == y,
        (
            Operand::Daemon {
                host: h1, port: p1, ..
            },
            Operand::Daemon {
                host: h2, port: p2, ..
            },
        ) => h1 == h2 && p1 == p2,
        _ => false,
    }
}

fn remote_path(o: &Operand) -> Vec<u8> {
    match o {
        Operand::Shell { path, .. } | Operand::Daemon { path, .. } => path.as_bytes().to_vec(),
        Operand::Local(_) => unreachable!("remote operand"),
    }
}

async fn remote_copy(
    remote: &Operand,
    request: Request,
    a: &CopyArgs,
    p: Params,
    progress: &Progress,
) -> anyhow::Result<Report> {
    match remote {
        Operand::Daemon { host, port, .. } => {
            let secret_file = a
                .secret_file
                .as_ref()
                .context("rcp:// operands need --secret-file (the daemon's shared secret)")?;
            let secret = auth::read_secret(secret_file)?;
            let target = Target {
                addr: endpoint::resolve(host, *port)?,
                transport: a.tuning.transport,
            };
            session::client(target, &secret, request, p, progress).await
        }
        Operand::Shell { login, host, .. } => {
            let mut remote = shell::start(&a.rsh, login, &a.tuning).await?;
            let target = Target {
                addr: endpoint::resolve(host, remote.port)?,
                transport: a.tuning.transport,
            };
            let report = session::client(target, &remote.token, request, p, progress).await;
            let status = remote.child.wait().await?;
            let report = report?;
            if !status.success() && report.failed.is_empty() {
                bail!("the remote side failed ({status})");
            }
            Ok(report)
        }
        Operand::Local(_) => unreachable!("remote operand"),
    }
}

/// Both operands local: the same pipeline, through an in-process server on
/// loopback.
async fn local_copy(
    sources: &[Operand],
    dest: &std::path::Path,
    p: Params,
    progress: &Progress,
) -> anyhow::Result<Report> {
    let paths: Vec<PathBuf> = sources
        .iter()
        .map(|s| match s {
            Operand::Local(p) => p.clone(),
            _ => unreachable!("all local"),
        })
        .collect();
    let dest = std::path::absolute(dest)?;
    let listener = Listener::bind("127.0.0.1:0".parse()?, Transport::Tcp).await?;
    let addr: SocketAddr = format!("127.0.0.1:{}", listener.port()?).parse()?;
    let secret = auth::nonce().to_vec();
    let config = ServeConfig {
        roots: vec![PathBuf::from("/")],
        secret: secret.clone(),
        params: p,
        log: false,
        sessions: Arc::default(),
    };
    let server = tokio::spawn(session::serve_one(
        listener,
        config,
        std::time::Duration::from_secs(10),
    ));
    let target = Target {
        addr,
        transport: Transport::Tcp,
    };
    let request = Request::Push {
        sources: paths,
        dest: dest.as_os_str().as_encoded_bytes().to_vec(),
    };
    let report = session::client(target, &secret, request, p, progress).await;
    let served = server.await?;
    let report = report?;
    served?;
    Ok(report)
}

fn summarize(r: &Report, json: bool, quiet: bool) -> ExitCode {
    let failed = !r.failed.is_empty() || r.stats.failed;
    for (name, why) in &r.failed {
        eprintln!("rcp: {name}: {why}");
    }
    let rate = r.stats.bytes as f64 / r.seconds.max(1e-9);
    if json {
        let mut v = serde_json::json!({
            "bytes": r.stats.bytes,
            "files": r.stats.files,
            "seconds": r.seconds,
            "bytes_per_second": rate,
            "transport": r.transport,
            "io_engine": r.io_engine.name(),
            "streams": r.streams,
            "stream_bytes": r.stats.stream_bytes,
            "ok": !failed,
        });
        if let (Some(d), false) = (&r.digest, failed) {
            v["sha256"] = serde_json::Value::String(digest::hex(d));
        }
        println!("{v}");
    } else if !quiet {
        let mut line = format!(
            "{} file(s), {} bytes in {:.2} s ({:.1} MB/s) over {}",
            r.stats.files,
            r.stats.bytes,
            r.seconds,
            rate / 1e6,
            r.transport
        );
        match (&r.digest, failed) {
            (_, true) => line = format!("FAILED: {line}; see the errors above"),
            (Some(d), false) => line += &format!(", verified, sha256 {}", digest::hex(d)),
            (None, false) => {}
        }
        eprintln!("{line}");
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

async fn serve(a: ServeArgs) -> anyhow::Result<ExitCode> {
    let secret = auth::read_secret(&a.secret_file)?;
    let mut roots = Vec::new();
    for r in &a.roots {
        let abs = std::fs::canonicalize(r).with_context(|| format!("root {}", r.display()))?;
        if !abs.is_dir() {
            bail!("root {} is not a directory", r.display());
        }
        roots.push(abs);
    }
    let engine = io_engine(&a.tuning, "rcp serve")?;
    let config = Arc::new(ServeConfig {
        roots,
        secret,
        params: params(&a.tuning, engine, false, false, true),
        log: true,
        sessions: Arc::default(),
    });
    let listener = Listener::bind(a.listen, a.tuning.transport)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    eprintln!(
        "rcp serve: listening on {} (tcp{}), {} storage engine",
        a.listen,
        if listener.has_rdma() { " and rdma" } else { "" },
        engine
    );
    let slots = Arc::new(tokio::sync::Semaphore::new(a.max_clients));
    loop {
        let conn = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("rcp serve: accept failed: {e:#}");
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            let reason = format!(
                "busy: {} connections already (--max-clients)",
                a.max_clients
            );
            eprintln!("rcp serve: refusing a client: {reason}");
            let config = Arc::clone(&config);
            tokio::spawn(async move { session::refuse(conn, &config, reason).await });
            continue;
        };
        let config = Arc::clone(&config);
        tokio::spawn(async move {
            match session::server(conn, &config).await {
                Ok(Served::Session(_) | Served::Joined) => {}
                Err(e) => eprintln!("rcp serve: session failed: {e:#}"),
            }
            drop(permit);
        });
    }
}

async fn server_once(a: ServerOnceArgs) -> anyhow::Result<ExitCode> {
    let engine = io_engine(&a.tuning, "rcp (remote side)")?;
    let ip = shell::listen_ip();
    let listener = Listener::bind(SocketAddr::new(ip, 0), a.tuning.transport)
        .await
        .with_context(|| format!("cannot listen on {ip}"))?;
    let mut token = String::new();
    for b in auth::nonce() {
        token += &format!("{b:02x}");
    }
    println!("{}", shell::banner(listener.port()?, &token));
    let config = ServeConfig {
        roots: vec![PathBuf::from("/")],
        secret: token.into_bytes(),
        params: params(&a.tuning, engine, false, false, true),
        log: true,
        sessions: Arc::default(),
    };
    let stats = session::serve_one(listener, config, std::time::Duration::from_secs(60)).await?;
    Ok(if stats.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
