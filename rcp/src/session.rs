//! One copy session over a link: authentication, the request, then the
//! sender and receiver pipelines, for the client and the server side.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use rfabric::link::{Incoming, Link};
use rfabric::transport::Connection;
use rfabric::wire::Role;

use crate::auth;
use crate::connect::link_config;
use crate::proto::{Msg, flags};
use crate::recv::{self, RecvOptions};
use crate::report::{Progress, Stats};
use crate::send::{self, SendOptions, Source};
use crate::tree::{self, Base};

/// How to copy.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub recursive: bool,
    pub preserve: bool,
    pub verify: bool,
    pub resume: bool,
    pub chunk: usize,
    pub window: u32,
}

impl Params {
    fn flags(&self) -> u32 {
        let mut f = 0;
        if self.recursive {
            f |= flags::RECURSIVE;
        }
        if self.preserve {
            f |= flags::PRESERVE;
        }
        if !self.verify {
            f |= flags::NO_VERIFY;
        }
        if self.resume {
            f |= flags::RESUME;
        }
        f
    }

    /// The client's choices as the server applies them.
    fn with_flags(self, f: u32) -> Params {
        Params {
            recursive: f & flags::RECURSIVE != 0,
            preserve: f & flags::PRESERVE != 0,
            verify: f & flags::NO_VERIFY == 0,
            resume: f & flags::RESUME != 0,
            ..self
        }
    }

    fn send_options(&self) -> SendOptions {
        SendOptions {
            recursive: self.recursive,
            verify: self.verify,
            resume: self.resume,
            chunk: self.chunk,
            buffers: (self.window as usize).clamp(4, 64),
        }
    }

    fn recv_options(&self) -> RecvOptions {
        RecvOptions {
            preserve: self.preserve,
            verify: self.verify,
            resume: self.resume,
        }
    }
}

/// What the client asks for.
#[derive(Debug, Clone)]
pub enum Request {
    /// Local `sources` into the server's `dest`.
    Push {
        sources: Vec<PathBuf>,
        dest: Vec<u8>,
    },
    /// The server's `sources` into local `dest`.
    Pull {
        sources: Vec<Vec<u8>>,
        dest: PathBuf,
    },
}

/// The result of a copy, for the summary.
#[derive(Debug)]
pub struct Report {
    pub stats: Stats,
    pub seconds: f64,
    pub transport: &'static str,
    /// Digest of the one file copied, when exactly one was and it was
    /// verified.
    pub digest: Option<[u8; 32]>,
    /// Entries that failed, with the reason.
    pub failed: Vec<(String, String)>,
}

async fn next_msg(link: &Link) -> anyhow::Result<Msg> {
    match link.recv().await? {
        Some(Incoming::Message(b)) => Ok(Msg::decode(&b)?),
        Some(Incoming::Chunk(_)) => bail!("data where a message was expected"),
        None => bail!("the peer closed the session"),
    }
}

/// The client side: authenticate, ask, copy.
pub async fn client(
    conn: Arc<dyn Connection>,
    secret: &[u8],
    request: Request,
    params: Params,
    progress: &Progress,
) -> anyhow::Result<Report> {
    let transport = conn.backend();
    let config = link_config(Role::Client, params.window, params.chunk, &conn.limits());
    let link = Link::establish(conn, config)
        .await
        .context("cannot set up the session")?;
    let result = client_session(&link, secret, request, params, progress).await;
    if result.is_err() {
        link.abort("client gave up");
    }
    let (stats, outcome, seconds) = result?;
    let digest = match outcome.digests.as_slice() {
        [(_, d)] if stats.files == 1 => Some(*d),
        _ => None,
    };
    Ok(Report {
        stats,
        seconds,
        transport,
        digest,
        failed: outcome.failed,
    })
}

async fn client_session(
    link: &Link,
    secret: &[u8],
    request: Request,
    params: Params,
    progress: &Progress,
) -> anyhow::Result<(Stats, send::Outcome, f64)> {
    let Msg::Challenge {
        nonce: server_nonce,
    } = next_msg(link).await?
    else {
        bail!("the server did not start with a challenge");
    };
    let nonce = auth::nonce();
    let mac = auth::client_proof(secret, &server_nonce, &nonce);
    link.send_message(&Msg::Auth { nonce, mac }.encode())
        .await?;
    match next_msg(link).await? {
        Msg::AuthOk { mac } if auth::check_server(secret, &server_nonce, &nonce, &mac) => {}
        Msg::AuthOk { .. } => bail!("the server could not prove it knows the secret"),
        Msg::Fail { reason } => bail!("refused by the server: {reason}"),
        other => bail!("unexpected {} during authentication", other.name()),
    }
    let started = Instant::now();
    let (stats, outcome) = match request {
        Request::Push { sources, dest } => {
            let local = local_sources(&sources)?;
            let push = Msg::Push {
                flags: params.flags(),
                sources: sources.len() as u32,
                dest,
            };
            link.send_message(&push.encode()).await?;
            expect_ready(link).await?;
            let (stats, outcome) = send::send(link, local, params.send_options(), progress).await?;
            link.finish().await?;
            (stats, outcome)
        }
        Request::Pull { sources, dest } => {
            let base = local_base(&dest, sources.len())?;
            let pull = Msg::Pull {
                flags: params.flags(),
                sources,
            };
            link.send_message(&pull.encode()).await?;
            expect_ready(link).await?;
            let got = recv::receive(link, base, params.recv_options(), progress).await?;
            link.finish().await?;
            let outcome = send::Outcome {
                digests: got.digests,
                failed: got.failed,
            };
            let stats = got.stats;
            (stats, outcome)
        }
    };
    Ok((stats, outcome, started.elapsed().as_secs_f64()))
}

async fn expect_ready(link: &Link) -> anyhow::Result<()> {
    match next_msg(link).await? {
        Msg::Ready { .. } => Ok(()),
        Msg::Fail { reason } => bail!("{reason}"),
        other => bail!(
            "unexpected {} instead of an answer to the request",
            other.name()
        ),
    }
}

/// Local source operands.
pub fn local_sources(paths: &[PathBuf]) -> anyhow::Result<Vec<Source>> {
    paths
        .iter()
        .map(|p| {
            let parent = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            let name = tree::file_name(p)?;
            Ok(Source {
                parent: tree::open_root(parent)?,
                top: name.clone(),
                name,
            })
        })
        .collect()
}

/// Where a local destination puts what arrives: into `dest` if it is a
/// directory, else as `dest` itself (one source only).
pub fn local_base(dest: &Path, sources: usize) -> anyhow::Result<Base> {
    if dest.is_dir() {
        return Ok(Base::new(tree::open_root(dest)?, None));
    }
    if sources > 1 {
        bail!(
            "{} is not a directory; several sources need one",
            dest.display()
        );
    }
    let parent = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Ok(Base::new(
        tree::open_root(parent)?,
        Some(tree::file_name(dest)?),
    ))
}

/// The server side's configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Absolute, normalized directories the server may touch.
    pub roots: Vec<PathBuf>,
    pub secret: Vec<u8>,
    pub params: Params,
    /// Report failed entries on stderr (a daemon's log); off when the
    /// client shares the process and reports them itself.
    pub log: bool,
}

/// The server side of one session.
pub async fn server(conn: Arc<dyn Connection>, config: &ServeConfig) -> anyhow::Result<Stats> {
    let p = config.params;
    let shape = link_config(Role::Server, p.window, p.chunk, &conn.limits());
    let link = Link::establish(conn, shape)
        .await
        .context("session set-up failed")?;
    let result = server_session(&link, config).await;
    if let Err(e) = &result {
        let _ = link
            .send_message(
                &Msg::Fail {
                    reason: format!("{e:#}"),
                }
                .encode(),
            )
            .await;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), link.finish()).await;
    }
    result
}

async fn server_session(link: &Link, config: &ServeConfig) -> anyhow::Result<Stats> {
    let nonce = auth::nonce();
    link.send_message(&Msg::Challenge { nonce }.encode())
        .await?;
    let Msg::Auth {
        nonce: client_nonce,
        mac,
    } = next_msg(link).await?
    else {
        bail!("authentication failed: no answer to the challenge");
    };
    if !auth::check_client(&config.secret, &nonce, &client_nonce, &mac) {
        bail!("authentication failed");
    }
    let proof = auth::server_proof(&config.secret, &nonce, &client_nonce);
    link.send_message(&Msg::AuthOk { mac: proof }.encode())
        .await?;
    let progress = Progress::hidden();
    let stats = match next_msg(link).await? {
        Msg::Push {
            flags,
            sources,
            dest,
        } => {
            let params = config.params.with_flags(flags);
            let base = confined_base(&config.roots, &dest, sources as usize)?;
            link.send_message(&Msg::Ready { dest_is_dir: true }.encode())
                .await?;
            let got = recv::receive(link, base, params.recv_options(), &progress).await?;
            if config.log {
                for (name, why) in &got.failed {
                    eprintln!("rcp serve: {name}: {why}");
                }
            }
            let stats = got.stats;
            link.finish().await?;
            stats
        }
        Msg::Pull { flags, sources } => {
            let params = config.params.with_flags(flags);
            let local = sources
                .iter()
                .map(|s| confined_source(&config.roots, s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            link.send_message(&Msg::Ready { dest_is_dir: false }.encode())
                .await?;
            let (stats, _) = send::send(link, local, params.send_options(), &progress).await?;
            link.finish().await?;
            stats
        }
        other => bail!("expected a request, got {}", other.name()),
    };
    Ok(stats)
}

fn requested_path(raw: &[u8]) -> anyhow::Result<PathBuf> {
    let p = PathBuf::from(tree::os(raw));
    if p.is_absolute() {
        Ok(p)
    } else {
        // Relative to where the server runs (remote-shell mode: the user's
        // home, as with scp).
        Ok(std::env::current_dir()?.join(p))
    }
}

/// A client's destination, confined beneath the roots.
fn confined_base(roots: &[PathBuf], dest: &[u8], sources: usize) -> anyhow::Result<Base> {
    let path = requested_path(dest)?;
    let (root, parts) = tree::under_roots(&path, roots)?;
    let root = tree::open_root(root)?;
    if let Ok(dir) = tree::open_dir_beneath(&root, &parts) {
        return Ok(Base::new(dir, None));
    }
    if sources > 1 {
        bail!(
            "{} is not a directory; several sources need one",
            path.display()
        );
    }
    let (last, dirs) = parts
        .split_last()
        .with_context(|| format!("{} is not a directory", path.display()))?;
    Ok(Base::new(
        tree::open_dir_beneath(&root, dirs)?,
        Some(last.to_vec()),
    ))
}

/// A client's source, confined beneath the roots.
fn confined_source(roots: &[PathBuf], raw: &[u8]) -> anyhow::Result<Source> {
    let path = requested_path(raw)?;
    let (root, parts) = tree::under_roots(&path, roots)?;
    let root = tree::open_root(root)?;
    let (last, dirs) = parts
        .split_last()
        .with_context(|| format!("{} names a root, not something in it", path.display()))?;
    Ok(Source {
        parent: tree::open_dir_beneath(&root, dirs)?,
        name: last.to_vec(),
        top: last.to_vec(),
    })
}
