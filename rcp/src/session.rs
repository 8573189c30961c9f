//! One copy session over a link: authentication, the request, then the
//! sender and receiver pipelines, for the client and the server side.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use rfabric::link::{Incoming, Link};
use rfabric::transport::{Backend, Connection};
use rfabric::wire::Role;

use crate::archive::{Keep, Preserve};
use crate::backup;
use crate::chain::{self, Onward, Relay};
use crate::connect::link_config;
use crate::digest::Algorithm;
use crate::exit::{PeerLost, Refused};
use crate::filter::{Filter, MAX_RULES, RuleText};
use crate::idmap::Owners;
use crate::linkdest;
use crate::listed;
use crate::proto::{Extras, Hop, MAX_HOPS, MAX_NAMES, Msg, flags};
use crate::recv::{self, Itemize, Lines, RecvOptions};
use crate::report::{Progress, Report, Stats};
use crate::resync::{Policy, Sizes, TimeMatch};
use crate::send::{self, SendOptions, Source, Sources};
use crate::streams::{self, Sessions};
use crate::tree::{self, Base, Scope, Symlinks};
use rfabric::auth;
use rfabric::endpoint::{self, Listener, Transport};
use rfabric::link::seal::{Before, EncryptChoice, Protection};
use rfabric::storage::Kind;

/// How to copy.
#[derive(Debug, Clone)]
pub struct Params {
    pub recursive: bool,
    /// `-p`, `--perms`, `-t` (the client's choice).
    pub preserve: Preserve,
    /// Archive metadata kept (the client's choice).
    pub keep: Keep,
    /// A server's: sessions may set owners and make device nodes (when
    /// it runs as root).
    pub owners_allowed: bool,
    pub verify: bool,
    pub resume: bool,
    /// Which files are sent again (the client's choice).
    pub policy: Policy,
    /// `--delete` (the client's choice).
    pub delete: bool,
    /// `-x` (1), `-xx` (2): the walk keeps to each operand's file system
    /// (the client's choice; see [`crate::tree::Walker::one_file_system`]).
    pub one_file_system: u8,
    /// `-L`, `--copy-unsafe-links`, `--safe-links` (the client's choice;
    /// see [`crate::tree::Symlinks`]).
    pub symlinks: Symlinks,
    /// `--remove-source-files` (the client's choice; the sender's to do).
    pub remove_sources: bool,
    /// `--bwlimit`, bytes a second: the client's alone (it paces what it
    /// sends or takes in; nothing of it travels).
    pub bwlimit: Option<u64>,
    /// `--link-dest` directories as given (the client's choice; the
    /// receiver's to open, see [`crate::linkdest`]).
    pub link_dests: Arc<Vec<Vec<u8>>>,
    /// The choices beyond the flags (`--max-delete`; the client's).
    pub extras: Extras,
    /// `-n`, `-i` (the client's choice; `-v` asks for `-i`'s changes
    /// too, shown by name).
    pub dry_run: bool,
    pub itemize: bool,
    /// How the client shows the changes (`-i` or `-v`; its own).
    pub lines: Lines,
    /// `--exclude`, `--include` (the client's, sent after the request).
    pub filter: Arc<Filter>,
    /// `--files-from`: the names to send from the one source directory
    /// (a pull's travel after the request; a server receiving a push
    /// holds an empty list: it only needs to know).
    pub listed: Option<Arc<Vec<Vec<u8>>>>,
    pub chunk: usize,
    /// Landing slots per stream.
    pub window: u32,
    /// Links the data is striped over (the client's choice).
    pub streams: u32,
    /// This side's storage engine (each side chooses its own).
    pub io_engine: Kind,
    /// What the data is hashed with (the client's choice).
    pub digest: Algorithm,
    /// A client's: when it asks for encryption; a server's: when it
    /// requires it.
    pub encrypt: EncryptChoice,
    /// How long the peer may be silent (`--timeout`; each side its own).
    pub silence: Option<std::time::Duration>,
    /// `--usermap`, `--groupmap`, `--chown`: only the side the user
    /// started has them (it maps what it sends, or what arrives in a
    /// pull); a server's are `None`.
    pub owners: Option<Arc<Owners>>,
    /// Whether a walk of this side's files looks names up on a helper
    /// thread as well ([`crate::tree::Walker::with_helper`]): not where
    /// both ends of the copy are this process, whose cores are busy with
    /// the receiving end.
    pub walk_helper: bool,
}

/// Which end of a copy the server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Sender,
    Receiver,
}

impl Params {
    /// What a request asks of a server that is `side`: the choices only
    /// the client's own end acts on are left out (a server from before
    /// one would refuse it for nothing): `--chmod`, `-m` and a list's
    /// marks in a push (the client walks), `--max-delete`,
    /// `--delete-excluded`, `--force`, the backups, `--link-dest`,
    /// `--mkpath`, `-O`, `--modify-window` and which of modes and times
    /// are kept in a pull (the client receives).
    /// `--existing` goes both ways: a sender waits for the answers it
    /// makes the receiver give; so does `--partial`, whose answers may be
    /// digests.
    fn asked_of(&self, side: Side) -> Params {
        let mut asked = self.clone();
        match side {
            Side::Receiver => {
                asked.extras.chmod = None;
                asked.extras.prune_empty_dirs = false;
                asked.extras.ignore_missing_args = false;
                asked.extras.copy_dirlinks = false;
                asked.extras.lists_marked = false;
            }
            Side::Sender => {
                asked.extras.max_delete = None;
                asked.extras.delete_excluded = false;
                asked.extras.force = false;
                (asked.extras.backup, asked.extras.backup_dir) = (None, None);
                asked.extras.preserve_one = None;
                asked.extras.mkpath = false;
                asked.extras.omit_dir_times = false;
                asked.extras.modify_window = None;
                asked.link_dests = Arc::default();
            }
        }
        asked
    }

    fn flags(&self) -> u32 {
        let mut f = 0;
        if self.recursive {
            f |= flags::RECURSIVE;
        }
        if self.preserve.any() {
            f |= flags::PRESERVE;
        }
        if !self.verify {
            f |= flags::NO_VERIFY;
        }
        if self.resume {
            f |= flags::RESUME;
        }
        if self.digest == Algorithm::Blake3 {
            f |= flags::BLAKE3;
        }
        if self.delete {
            f |= flags::DELETE;
        }
        if !self.filter.is_empty() {
            f |= flags::FILTERS;
        }
        if self.dry_run {
            f |= flags::DRY_RUN;
        }
        if self.itemize {
            f |= flags::ITEMIZE;
        }
        if self.listed.is_some() {
            f |= flags::FILES_FROM;
        }
        if self.one_file_system > 0 {
            f |= flags::ONE_FILE_SYSTEM;
        }
        if self.one_file_system > 1 {
            f |= flags::NO_MOUNT_POINTS;
        }
        if self.remove_sources {
            f |= flags::REMOVE_SOURCE_FILES;
        }
        if !self.link_dests.is_empty() {
            f |= flags::LINK_DEST;
        }
        if self.extras.any() {
            f |= flags::EXTRAS;
        }
        f |= match self.symlinks {
            Symlinks::Keep => 0,
            Symlinks::Follow => flags::COPY_LINKS,
            Symlinks::FollowUnsafe => flags::COPY_UNSAFE_LINKS,
            Symlinks::SkipUnsafe => flags::SAFE_LINKS,
        };
        f | self.keep.flags() | self.policy.flags()
    }

    /// The client's choices as the server applies them.
    /// (A FIPS-mode host refuses a request for BLAKE3.)
    fn with_request(&self, f: u32, streams: u32, tail: Tail) -> anyhow::Result<Params> {
        if f & flags::BLAKE3 != 0 && crate::digest::fips_mode() {
            return Err(crate::digest::FipsRefusesBlake3.into());
        }
        Ok(Params {
            recursive: f & flags::RECURSIVE != 0,
            preserve: match (f & flags::PRESERVE != 0, tail.extras.preserve_one) {
                (false, None) => Preserve::default(),
                (true, None) => Preserve::BOTH,
                (true, Some(one)) => one.preserve(),
                (false, Some(_)) => bail!("the request keeps modes or times without preserve"),
            },
            keep: Keep::from_flags(f),
            verify: f & flags::NO_VERIFY == 0,
            resume: f & flags::RESUME != 0,
            policy: Policy {
                existing: tail.extras.existing,
                times: tail
                    .extras
                    .modify_window
                    .map_or(TimeMatch::Exact, TimeMatch::Within),
                ..Policy::from_flags(f, tail.sizes)
            },
            delete: f & flags::DELETE != 0,
            one_file_system: match (
                f & flags::ONE_FILE_SYSTEM != 0,
                f & flags::NO_MOUNT_POINTS != 0,
            ) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            },
            symlinks: if f & flags::COPY_LINKS != 0 {
                Symlinks::Follow
            } else if f & flags::COPY_UNSAFE_LINKS != 0 {
                Symlinks::FollowUnsafe
            } else if f & flags::SAFE_LINKS != 0 {
                Symlinks::SkipUnsafe
            } else {
                Symlinks::Keep
            },
            remove_sources: f & flags::REMOVE_SOURCE_FILES != 0,
            dry_run: f & flags::DRY_RUN != 0,
            itemize: f & flags::ITEMIZE != 0,
            digest: if f & flags::BLAKE3 != 0 {
                Algorithm::Blake3
            } else {
                Algorithm::Sha256
            },
            streams,
            filter: tail.filter,
            link_dests: tail.link_dests,
            extras: tail.extras,
            listed: (f & flags::FILES_FROM != 0).then(Arc::default),
            ..self.clone()
        })
    }

    /// What the receiver may make of the destination's path.
    fn making(&self) -> Making {
        Making {
            mkpath: self.extras.mkpath,
            dry_run: self.dry_run,
        }
    }

    /// The sender's options.
    fn send_options(&self) -> SendOptions {
        SendOptions {
            recursive: self.recursive,
            keep: self.keep,
            verify: self.verify,
            digest: self.digest,
            resume: self.resume,
            partial: self.extras.partial,
            policy: self.policy,
            dry_run: self.dry_run,
            remove_sources: self.remove_sources,
            bwlimit: self.bwlimit,
            chunk: self.chunk,
            buffers: (self.window as usize * self.streams as usize).clamp(4, 64),
            engine: self.io_engine,
            lines: self.lines,
        }
    }

    /// The receiver's options; `client`: this side is the one the user
    /// started (it prints `-i`'s lines; a server tells them).
    fn recv_options(&self, client: bool) -> RecvOptions {
        RecvOptions {
            preserve: self.preserve,
            keep: self.keep,
            owners_allowed: self.owners_allowed,
            verify: self.verify,
            digest: self.digest,
            resume: self.resume,
            policy: self.policy,
            delete: self.delete,
            one_file_system: self.one_file_system > 0,
            safe_links: self.symlinks == Symlinks::SkipUnsafe,
            files_from: self.listed.is_some(),
            dry_run: self.dry_run,
            itemize: match (self.itemize, client) {
                (false, _) => Itemize::Off,
                (true, true) => Itemize::Print(self.lines),
                (true, false) => Itemize::Tell,
            },
            engine: self.io_engine,
            busy_wait: self.silence,
            passing: false,
            sync_all: self.remove_sources,
            bwlimit: self.bwlimit.filter(|_| client),
            max_delete: self.extras.max_delete,
            delete_excluded: self.extras.delete_excluded,
            force: self.extras.force,
            partial: self.extras.partial,
            omit_dir_times: self.extras.omit_dir_times,
        }
    }
}

/// What the client asks for.
#[derive(Debug, Clone)]
pub enum Request {
    /// Local `sources` into the server's `dest`; `chain`: a broadcast's
    /// nodes from the server on, the server first (see [`crate::chain`]).
    Push {
        sources: Vec<PathBuf>,
        dest: Vec<u8>,
        chain: Option<Vec<Hop>>,
    },
    /// The server's `sources` into local `dest`.
    Pull {
        sources: Vec<Vec<u8>>,
        dest: PathBuf,
    },
}

/// The server's `Fail`, as the error it is.
fn refused(reason: &str) -> anyhow::Error {
    Refused(format!("refused by the server: {reason}")).into()
}

async fn next_msg(link: &Link) -> anyhow::Result<Msg> {
    match link.recv().await? {
        Some(Incoming::Message(b)) => Ok(Msg::decode(&b)?),
        Some(Incoming::Chunk(_)) => bail!("data where a message was expected"),
        None => Err(PeerLost("the peer closed the session".into()).into()),
    }
}

/// A client has this long for each step before its session begins (link
/// set-up, the answer to the challenge, the request): one that stalls
/// does not hold a place among `--max-clients` for ever.
const SETUP_TIME: std::time::Duration = std::time::Duration::from_secs(30);

/// The next message of the set-up, within [`SETUP_TIME`].
async fn setup_msg(link: &Link) -> anyhow::Result<Msg> {
    tokio::time::timeout(SETUP_TIME, next_msg(link))
        .await
        .with_context(|| format!("the client said nothing for {SETUP_TIME:?}"))?
}

/// Where the client connects.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub addr: SocketAddr,
    pub transport: Transport,
}

impl Target {
    /// A link to the server, authenticated and sealed (see [`sealing`]).
    pub(crate) async fn open(&self, secret: &[u8], params: &Params) -> anyhow::Result<Link> {
        // (A server that accepted but does not answer, stopped or hung, is
        // silent before any heartbeat can tell.)
        let set_up = async {
            let conn = endpoint::connect(self.addr, self.transport)
                .await
                .with_context(|| format!("cannot connect to {}", self.addr))?;
            let config = link_config(
                Role::Client,
                params.window,
                params.chunk,
                params.silence,
                &conn.limits(),
            );
            Link::establish(conn, config)
                .await
                .context("cannot set up the session")
        };
        let link = match params.silence {
            Some(limit) => tokio::time::timeout(limit, set_up).await.map_err(|_| {
                PeerLost(format!(
                    "{} did not set up a session within {} s",
                    self.addr,
                    limit.as_secs()
                ))
            })??,
            None => set_up.await?,
        };
        match authenticate(&link, secret, params.encrypt).await {
            Ok(()) => Ok(link),
            Err(e) => {
                link.abort("client gave up");
                Err(e)
            }
        }
    }
}

/// The client side: connect, authenticate, ask, copy.
///
/// `early`: a push's walk of its sources, started before the session was
/// (see [`walk_sources`]); without it the walk starts once the server
/// is ready.
pub async fn client(
    target: Target,
    secret: &[u8],
    request: Request,
    params: Params,
    progress: &Progress,
    early: Option<send::Walk>,
) -> anyhow::Result<Report> {
    let first = target.open(secret, &params).await?;
    let transport = first.backend().name();
    let protection = first.protection();
    let mut links = vec![first];
    let (io_engine, algorithm) = (params.io_engine, params.verify.then_some(params.digest));
    let (received, dry_run) = (matches!(request, Request::Pull { .. }), params.dry_run);
    let result = client_session(target, &mut links, secret, request, params, progress, early).await;
    if result.is_err() {
        streams::abort_all(&links, "client gave up");
    }
    let (stats, mut outcome, seconds) = result?;
    outcome.failed.append(&mut outcome.not_removed);
    let streams = links.len();
    let nodes = outcome.nodes;
    let digest = match outcome.digests.as_slice() {
        [(_, d)] if stats.files == 1 => Some(*d),
        _ => None,
    };
    Ok(Report {
        stats,
        seconds,
        transport,
        protection,
        io_engine,
        streams,
        algorithm,
        digest,
        failed: outcome.failed,
        nodes,
        rounds: Vec::new(),
        received,
        dry_run,
    })
}

/// How a session's link is sealed once both ends proved the secret: as
/// `encrypt` says, except that the link between the two ends of a local
/// copy (in-process: one process's memory, which no path crosses and
/// nothing outside the process reaches) is sealed only when encryption
/// was asked for (`--encrypt always`). Sealing it would guard against
/// nothing and cost every byte: with `--no-verify`, AES-GCM over all the
/// data twice (44% of a 2 GiB local copy's CPU), and otherwise an HMAC of
/// every message (a re-sync's entries). Both ends see the same backend,
/// so they agree.
fn sealing(encrypt: bool, backend: Backend) -> Option<Protection> {
    (encrypt || backend != Backend::InProcess).then(|| Protection::of(encrypt))
}

/// Proves the secret to the server, checks the server's proof and seals
/// the link: encrypted if `encrypt` or the server asks for it.
async fn authenticate(link: &Link, secret: &[u8], encrypt: EncryptChoice) -> anyhow::Result<()> {
    let (server_nonce, required) = match next_msg(link).await? {
        Msg::Challenge { nonce, encrypt } => (nonce, encrypt),
        Msg::Fail { reason } => return Err(refused(&reason)),
        _ => bail!("the server did not start with a challenge"),
    };
    let nonce = auth::nonce();
    let mac = auth::RCP.client_proof(secret, &server_nonce, &nonce);
    let encrypt = encrypt.wants(link.backend()) || required;
    let sealed = sealing(encrypt, link.backend());
    let keys = auth::RCP.session_keys(secret, &server_nonce, &nonce);
    // Everything the server sends after reading this proof is sealed
    // (unless the link is a local copy's, see `sealing`).
    if let Some(protection) = sealed {
        link.seal_incoming(protection, &keys.server_to_client, Before::Anything)?;
    }
    link.send_message(
        &Msg::Auth {
            nonce,
            mac,
            encrypt,
        }
        .encode(),
    )
    .await?;
    match next_msg(link).await? {
        Msg::AuthOk { mac } if auth::RCP.check_server(secret, &server_nonce, &nonce, &mac) => {
            if let Some(protection) = sealed {
                link.seal_outgoing(protection, &keys.client_to_server);
            }
            Ok(())
        }
        Msg::AuthOk { .. } => {
            Err(Refused("the server could not prove it knows the secret".into()).into())
        }
        Msg::Fail { reason } => Err(refused(&reason)),
        other => bail!("unexpected {} during authentication", other.name()),
    }
}

/// Opens the session's further streams (the first is `links[0]`).
async fn join_streams(
    target: Target,
    links: &mut Vec<Link>,
    secret: &[u8],
    session: [u8; 16],
    params: Params,
) -> anyhow::Result<()> {
    // Every stream over the transport the first one got.
    let target = Target {
        transport: Transport::of(links[0].backend()),
        ..target
    };
    let opening: Vec<_> = (1..params.streams)
        .map(|stream| {
            let secret = secret.to_vec();
            let params = params.clone();
            tokio::spawn(async move {
                let link = target.open(&secret, &params).await?;
                let join = Msg::Join { session, stream };
                link.send_message(&join.encode()).await?;
                expect_ready(&link)
                    .await
                    .with_context(|| format!("stream {stream} could not join"))?;
                anyhow::Ok(link)
            })
        })
        .collect();
    let mut first_error = None;
    for o in opening {
        match o.await? {
            Ok(link) => links.push(link),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

async fn client_session(
    target: Target,
    links: &mut Vec<Link>,
    secret: &[u8],
    request: Request,
    params: Params,
    progress: &Progress,
    early: Option<send::Walk>,
) -> anyhow::Result<(Stats, send::Outcome, f64)> {
    let started = Instant::now();
    let control = links[0].clone();
    let (stats, outcome) = match request {
        Request::Push {
            sources,
            dest,
            chain,
        } => {
            let walk = match early {
                Some(walk) => walk,
                None => walk_sources(&sources, &params)?,
            };
            // A chain whose files are answered merges the nodes' answers.
            let chained = match &chain {
                None => 0,
                Some(_) if params.policy.answered(params.resume, params.dry_run) => {
                    flags::CHAIN | flags::MERGED_ANSWERS
                }
                Some(_) => flags::CHAIN,
            };
            let asked = params.asked_of(Side::Receiver);
            let push = Msg::Push {
                flags: asked.flags() | chained,
                streams: params.streams,
                sources: sources.len() as u32,
                dest,
            };
            control.send_message(&push.encode()).await?;
            send_tail(&control, &asked).await?;
            if let Some(hops) = &chain {
                send_hops(&control, hops).await?;
            }
            let session = expect_ready(&control).await?;
            join_streams(target, links, secret, session, params.clone()).await?;
            let (stats, outcome) = send::send(links, walk, params.send_options(), progress).await?;
            streams::finish_all(links).await?;
            (stats, outcome)
        }
        Request::Pull { sources, dest } => {
            let mut base = local_base(
                &dest,
                sources.len(),
                params.listed.is_some(),
                params.making(),
            )?;
            base.by_path(Some(dest.as_os_str().as_encoded_bytes().to_vec()));
            if !params.link_dests.is_empty() {
                let at = dest.as_os_str().as_encoded_bytes();
                let renamed = base.renamed();
                let open = |p: &[u8]| tree::open_root(Path::new(tree::os(p)));
                base.linking_from(linkdest::bases(
                    &params.link_dests,
                    at,
                    renamed,
                    false,
                    open,
                ));
            }
            if let Some(suffix) = &params.extras.backup {
                let at = dest.as_os_str().as_encoded_bytes();
                let dir = params.extras.backup_dir.as_deref();
                let make = |p: &[u8]| backup::make_as_given(Path::new(tree::os(p)));
                let backups = backup::open(suffix, dir, at, &base, false, make)?;
                base.backing_up(backups);
            }
            let asked = params.asked_of(Side::Sender);
            let pull = Msg::Pull {
                flags: asked.flags(),
                streams: params.streams,
                sources,
            };
            control.send_message(&pull.encode()).await?;
            send_tail(&control, &asked).await?;
            if let Some(names) = &params.listed {
                send_names(&control, names).await?;
            }
            let session = expect_ready(&control).await?;
            join_streams(target, links, secret, session, params.clone()).await?;
            let got = recv::receive(
                links,
                base,
                params.recv_options(true),
                &params.filter,
                params.owners.as_deref(),
                progress,
                None,
            )
            .await?;
            streams::finish_all(links).await?;
            let outcome = send::Outcome {
                digests: got.digests,
                failed: got.failed,
                ..send::Outcome::default()
            };
            (got.stats, outcome)
        }
    };
    Ok((stats, outcome, started.elapsed().as_secs_f64()))
}

/// `items` in runs that each fit one message of `room` bytes (`size`:
/// an item's encoded length) and hold at most `most` items, in order; an
/// item alone too big for `room` still gets a run of its own.
fn fitting<T>(
    items: impl IntoIterator<Item = T>,
    room: usize,
    most: usize,
    size: impl Fn(&T) -> usize,
) -> Vec<Vec<T>> {
    let mut runs: Vec<Vec<T>> = Vec::new();
    let mut used = 0;
    for item in items {
        let len = size(&item);
        match runs.last_mut() {
            Some(run) if used + len <= room && run.len() < most => run.push(item),
            _ => {
                runs.push(vec![item]);
                used = 0;
            }
        }
        used += len;
    }
    runs
}

/// `items` as messages that fit the link's, in order: `message(run,
/// more)` for each run of at most `most` (`size`: an item's encoded
/// length); `more` on all but the last. `at_least_one`: an empty list is
/// one empty message (the receiver waits for it).
async fn send_in_runs<T: Clone>(
    link: &Link,
    items: &[T],
    most: usize,
    size: impl Fn(&T) -> usize,
    at_least_one: bool,
    message: impl Fn(Vec<T>, bool) -> Msg,
) -> anyhow::Result<()> {
    let room = link.max_message().saturating_sub(16);
    let mut runs = fitting(items.iter().cloned(), room, most, size);
    if runs.is_empty() && at_least_one {
        runs.push(Vec::new());
    }
    let last = runs.len().saturating_sub(1);
    for (i, run) in runs.into_iter().enumerate() {
        link.send_message(&message(run, i < last).encode()).await?;
    }
    Ok(())
}

/// What follows a request, as its flags announce: the filter rules, as
/// `Rules` messages (none when there are none); `--min-size` and
/// `--max-size` (`Sizes`); the `--link-dest` directories (`LinkDests`).
pub(crate) async fn send_tail(link: &Link, params: &Params) -> anyhow::Result<()> {
    let size = |t: &RuleText| t.pattern.len() + 3;
    let message = |rules, more| Msg::Rules { rules, more };
    send_in_runs(link, params.filter.texts(), MAX_RULES, size, false, message).await?;
    let Sizes { min, max } = params.policy.sizes;
    if params.policy.sizes.limit() {
        link.send_message(&Msg::Sizes { min, max }.encode()).await?;
    }
    if !params.link_dests.is_empty() {
        let dirs = params.link_dests.to_vec();
        link.send_message(&Msg::LinkDests { dirs }.encode()).await?;
    }
    if params.extras.any() {
        let items = params.extras.items();
        link.send_message(&Msg::Extras { items }.encode()).await?;
    }
    Ok(())
}

/// A pull's `--files-from` names, as `Names` messages (one, empty, for
/// an empty list).
async fn send_names(link: &Link, names: &[Vec<u8>]) -> anyhow::Result<()> {
    let size = |n: &Vec<u8>| n.len() + 2;
    let message = |names, more| Msg::Names { names, more };
    send_in_runs(link, names, MAX_NAMES, size, true, message).await
}

/// A broadcast's chain from the receiver on, after its request, as
/// `Chain` messages.
pub(crate) async fn send_hops(link: &Link, hops: &[Hop]) -> anyhow::Result<()> {
    let size = |h: &Hop| h.name.len() + h.host.len() + h.token.len() + 8;
    let message = |hops, more| Msg::Chain { hops, more };
    send_in_runs(link, hops, MAX_HOPS, size, true, message).await
}

/// The items of the messages that follow a request (`Rules`, `Names`,
/// `Chain`), in order: `take` gives a message's items and its `more`, or
/// `None` for any other message (`missing` says what did not follow);
/// more than `most` items in all are refused (`too_many`).
async fn receive_in_runs<T>(
    link: &Link,
    most: usize,
    missing: &str,
    too_many: &str,
    take: impl Fn(Msg) -> Option<(Vec<T>, bool)>,
) -> anyhow::Result<Vec<T>> {
    let mut all = Vec::new();
    loop {
        let Some((items, more)) = take(setup_msg(link).await?) else {
            bail!("{missing}");
        };
        all.extend(items);
        if all.len() > most {
            bail!("{too_many}");
        }
        if !more {
            return Ok(all);
        }
    }
}

/// The chain from this node on (this node first) that follows a request
/// with the `CHAIN` flag.
async fn receive_hops(link: &Link) -> anyhow::Result<Vec<Hop>> {
    let most = crate::hostlist::MAX_HOSTS;
    let missing = "the broadcast's chain did not follow its request";
    let too_many = format!("a chain of more than {most} nodes");
    receive_in_runs(link, most, missing, &too_many, |m| match m {
        Msg::Chain { hops, more } => Some((hops, more)),
        _ => None,
    })
    .await
}

/// The names that follow a pull with the `FILES_FROM` flag, checked and
/// in the walk's order.
async fn receive_names(link: &Link) -> anyhow::Result<Arc<Vec<Vec<u8>>>> {
    let most = listed::MAX_LISTED;
    let missing = "the request's --files-from names did not follow it";
    let too_many = format!("more than {most} --files-from names");
    let mut all = receive_in_runs(link, most, missing, &too_many, |m| match m {
        Msg::Names { names, more } => Some((names, more)),
        _ => None,
    })
    .await?;
    for n in &all {
        tree::relative(listed::bare(n))?;
    }
    listed::sort(&mut all);
    Ok(Arc::new(all))
}

/// What follows a request ([`send_tail`]).
struct Tail {
    filter: Arc<Filter>,
    sizes: Sizes,
    link_dests: Arc<Vec<Vec<u8>>>,
    extras: Extras,
}

/// What follows a request with these flags: the rules (`FILTERS`), the
/// sizes (`SIZE_LIMITS`), the link-dest directories (`LINK_DEST`).
async fn receive_tail(link: &Link, flags: u32) -> anyhow::Result<Tail> {
    let texts = if flags & flags::FILTERS != 0 {
        let missing = "the request's filter rules did not follow it";
        let too_many = format!("more than {MAX_RULES} filter rules");
        receive_in_runs(link, MAX_RULES, missing, &too_many, |m| match m {
            Msg::Rules { rules, more } => Some((rules, more)),
            _ => None,
        })
        .await?
    } else {
        Vec::new()
    };
    let filter = Arc::new(Filter::new(texts).map_err(|e| refused(&e.to_string()))?);
    let sizes = if flags & flags::SIZE_LIMITS != 0 {
        match next_msg(link).await? {
            Msg::Sizes { min, max } => Sizes { min, max },
            other => bail!("{} where the request's sizes were due", other.name()),
        }
    } else {
        Sizes::default()
    };
    let link_dests = if flags & flags::LINK_DEST != 0 {
        match next_msg(link).await? {
            Msg::LinkDests { dirs } => dirs,
            other => bail!(
                "{} where the request's link-dest directories were due",
                other.name()
            ),
        }
    } else {
        Vec::new()
    };
    let extras = if flags & flags::EXTRAS != 0 {
        match next_msg(link).await? {
            Msg::Extras { items } => {
                Extras::from_items(&items).map_err(|e| refused(&e.to_string()))?
            }
            other => bail!("{} where the request's extras were due", other.name()),
        }
    } else {
        Extras::default()
    };
    Ok(Tail {
        filter,
        sizes,
        link_dests: Arc::new(link_dests),
        extras,
    })
}

/// Waits for the server's `Ready`; returns the session id in it.
pub(crate) async fn expect_ready(link: &Link) -> anyhow::Result<[u8; 16]> {
    match next_msg(link).await? {
        Msg::Ready { session, .. } => Ok(session),
        Msg::Fail { reason } => Err(Refused(reason).into()),
        other => bail!(
            "unexpected {} instead of an answer to the request",
            other.name()
        ),
    }
}

/// Starts the walk of a push's local `sources` (the operands, or with
/// `--files-from` the names listed in the one directory), as `params`
/// ask: a remote-shell copy calls it before the far side logs in, so
/// that the walk runs while the login waits ([`send::Walk`]).
pub fn walk_sources(sources: &[PathBuf], params: &Params) -> anyhow::Result<send::Walk> {
    let local = match &params.listed {
        Some(names) => Sources::Listed {
            base: listed_base(sources)?,
            names: Arc::clone(names),
            disk: Some(sources[0].as_os_str().as_encoded_bytes().to_vec()),
        },
        None => Sources::Operands(local_sources(sources)?),
    };
    start_walk(local, params)
}

/// Starts walking `local` as `params` ask (a server's `params` map no
/// owners: the side the user started does; `--chmod` is the request's).
fn start_walk(local: Sources, params: &Params) -> anyhow::Result<send::Walk> {
    let options = params.send_options();
    let chmod = match &params.extras.chmod {
        Some((umask, rules)) => Some(Arc::new(crate::chmod::Chmod::parse(rules, *umask)?)),
        None => None,
    };
    let changes = tree::Changes {
        owners: params.owners.clone(),
        chmod,
    };
    send::one_name_each(&local)?;
    let origins = match params.remove_sources {
        true => Some(send::Origins::of(&local)?),
        false => None,
    };
    let walk = send::Walk::start(
        local,
        options.recursive,
        options.keep,
        &params.filter,
        changes,
        Scope {
            one_file_system: params.one_file_system,
            symlinks: params.symlinks,
            prune_empty_dirs: params.extras.prune_empty_dirs,
            ignore_missing_args: params.extras.ignore_missing_args,
            copy_dirlinks: params.extras.copy_dirlinks,
        },
        params.walk_helper,
    );
    Ok(match origins {
        Some(origins) => walk.removing(origins),
        None => walk,
    })
}

/// Local source operands.
pub fn local_sources(paths: &[PathBuf]) -> anyhow::Result<Vec<Source>> {
    let parent_of = |p: &Path| match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    paths
        .iter()
        .map(|p| {
            let parent = parent_of(p);
            let name = tree::file_name(p)?;
            let opened = match tree::open_root(&parent) {
                Ok(opened) => opened,
                // (A directory on the way that is not there: the deepest
                // one that is, and the first name missing in it.)
                Err(e) if is_missing(&e) => {
                    let mut missing = parent;
                    loop {
                        let up = parent_of(&missing);
                        match tree::open_root(&up) {
                            Ok(deepest) => {
                                let gone = tree::file_name(&missing)?;
                                return Ok(missing_on_the_way(deepest, &gone, &name));
                            }
                            Err(e) if is_missing(&e) && up != missing => missing = up,
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(e) => return Err(e),
            };
            Ok(Source {
                parent: opened,
                top: name.clone(),
                name,
                disk: Some(p.as_os_str().as_encoded_bytes().to_vec()),
            })
        })
        .collect()
}

/// `--files-from`'s one source: the directory the names are in.
fn listed_base(sources: &[PathBuf]) -> anyhow::Result<OwnedFd> {
    let [dir] = sources else {
        bail!("--files-from takes one source: the directory the names are in");
    };
    tree::open_root(dir).with_context(|| format!("cannot open {}", dir.display()))
}

/// Where a local destination puts what arrives: into `dest` if it is a
/// directory, else as `dest` itself (one source only). `make`
/// (`--files-from`), or a `dest` that ends in `/`: a directory, made if
/// missing (a list's even in a dry run, as before; a `/`'s not). `how`:
/// `--mkpath` makes the directories on the way first (not in a dry run).
pub fn local_base(dest: &Path, sources: usize, make: bool, how: Making) -> anyhow::Result<Base> {
    let slash = tree::names_a_directory(dest.as_os_str().as_encoded_bytes());
    let as_dir = make || slash;
    if how.mkpath && !how.dry_run {
        let path = if as_dir { Some(dest) } else { dest.parent() };
        if let Some(path) = path.filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(path)
                .with_context(|| format!("cannot make {}", path.display()))?;
        }
    }
    // (Made meanwhile by another copy is as good; a file there is said
    // below.)
    if make || (slash && !how.dry_run) {
        match std::fs::create_dir(dest) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(e).with_context(|| format!("cannot make {}", dest.display()));
            }
            _ => {}
        }
    }
    if dest.is_dir() {
        return Ok(Base::new(tree::open_root(dest)?, None));
    }
    // (A dry run makes nothing: a directory not there yet is looked at
    // as a name in its parent.)
    let not_made = how.dry_run && slash && std::fs::symlink_metadata(dest).is_err();
    if as_dir && !not_made {
        let why = if make {
            " (--files-from needs one)"
        } else {
            ""
        };
        bail!("{} is not a directory{why}", dest.display());
    }
    if not_made && sources > 1 {
        bail!(
            "{} is not there yet, and a dry run makes nothing: several sources need it",
            dest.display()
        );
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

/// What a receiver may make of its destination's path: `--mkpath`'s
/// directories, and not even a `/`'s directory in a dry run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Making {
    pub mkpath: bool,
    pub dry_run: bool,
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
    /// Sessions waiting for their further streams.
    pub sessions: Arc<Sessions>,
    /// The server runs as its one user, for that user alone (a local
    /// copy's, remote-shell mode's): it may reach files' attributes by
    /// path ([`tree::Walker::by_path`]), and the paths the user gave are
    /// the system's to resolve, symlinks and `..` and all, as scp's and
    /// rsync's (a daemon's stay beneath its roots, never through a
    /// symlink). Never a daemon's.
    pub own_files: bool,
}

/// What one accepted connection turned out to be.
#[derive(Debug)]
pub enum Served {
    /// A whole session, copied.
    Session(Stats),
    /// A further stream, handed to its session.
    Joined,
}

/// The server side of one connection: a session, or a stream joining one.
pub async fn server(conn: Arc<dyn Connection>, config: &ServeConfig) -> anyhow::Result<Served> {
    let p = &config.params;
    let shape = link_config(Role::Server, p.window, p.chunk, p.silence, &conn.limits());
    let link = tokio::time::timeout(SETUP_TIME, Link::establish(conn, shape))
        .await
        .with_context(|| format!("no session set-up within {SETUP_TIME:?}"))?
        .context("session set-up failed")?;
    let mut links = vec![link.clone()];
    let result = server_session(&mut links, config).await;
    if let Err(e) = &result {
        let why = Msg::Fail {
            reason: format!("{e:#}"),
        };
        let _ = link.send_message(&why.encode()).await;
        let said_goodbye =
            tokio::time::timeout(std::time::Duration::from_secs(5), link.finish()).await;
        if !matches!(said_goodbye, Ok(Ok(()))) {
            // A client that does not say goodbye does not keep the
            // connection (and its link's task) open.
            link.abort("no goodbye after the refusal");
        }
        streams::abort_all(links.get(1..).unwrap_or_default(), "the session failed");
    }
    result
}

/// Turns a connection away with `reason` (the client sees it), within a
/// few seconds whatever the client does.
pub async fn refuse(conn: Arc<dyn Connection>, config: &ServeConfig, reason: String) {
    let p = &config.params;
    let shape = link_config(Role::Server, p.window, p.chunk, p.silence, &conn.limits());
    let within = std::time::Duration::from_secs(5);
    let Ok(Ok(link)) = tokio::time::timeout(within, Link::establish(conn, shape)).await else {
        return;
    };
    let refused = tokio::time::timeout(within, async {
        link.send_message(&Msg::Fail { reason }.encode()).await?;
        link.finish().await
    })
    .await;
    if !matches!(refused, Ok(Ok(()))) {
        link.abort("no goodbye after the refusal");
    }
}

async fn server_session(links: &mut Vec<Link>, config: &ServeConfig) -> anyhow::Result<Served> {
    let link = links[0].clone();
    let nonce = auth::nonce();
    let required = config.params.encrypt.wants(link.backend());
    let challenge = Msg::Challenge {
        nonce,
        encrypt: required,
    };
    link.send_message(&challenge.encode()).await?;
    let Msg::Auth {
        nonce: client_nonce,
        mac,
        encrypt,
    } = setup_msg(&link).await?
    else {
        bail!("authentication failed: no answer to the challenge");
    };
    if !auth::RCP.check_client(&config.secret, &nonce, &client_nonce, &mac) {
        bail!("authentication failed");
    }
    if required && !encrypt {
        bail!("this server requires encrypted sessions (its --encrypt)");
    }
    // From here on everything on this link is sealed, the proof included
    // (unless the link is a local copy's, see `sealing`).
    if let Some(protection) = sealing(encrypt, link.backend()) {
        let keys = auth::RCP.session_keys(&config.secret, &nonce, &client_nonce);
        link.seal_incoming(protection, &keys.client_to_server, Before::CreditsOnly)?;
        link.seal_outgoing(protection, &keys.server_to_client);
    }
    let proof = auth::RCP.server_proof(&config.secret, &nonce, &client_nonce);
    link.send_message(&Msg::AuthOk { mac: proof }.encode())
        .await?;
    let progress = Progress::hidden();
    let stats = match setup_msg(&link).await? {
        Msg::Push {
            flags,
            streams,
            sources,
            dest,
        } => {
            let started = Instant::now();
            let tail = receive_tail(&link, flags).await?;
            let chain = if flags & flags::CHAIN != 0 {
                Some(receive_hops(&link).await?)
            } else {
                None
            };
            let params = config.params.with_request(flags, streams, tail)?;
            if chain.is_some() && streams != 1 {
                bail!("a broadcast hop is one stream, not {streams}");
            }
            let (count, make) = (sources as usize, params.listed.is_some());
            let how = params.making();
            let mut base = match config.own_files {
                true => local_base(&requested_path(&dest)?, count, make, how)?,
                false => confined_base(&config.roots, &dest, count, make, how)?,
            };
            if config.own_files {
                base.by_path(Some(
                    requested_path(&dest)?.into_os_string().into_encoded_bytes(),
                ));
            }
            if !params.link_dests.is_empty() {
                // (Each beneath the roots, as the destination.)
                let at = requested_path(&dest)?.into_os_string().into_encoded_bytes();
                let (renamed, confined) = (base.renamed(), !config.own_files);
                let open = |p: &[u8]| match confined {
                    true => confined_dir(&config.roots, p),
                    false => tree::open_root(Path::new(tree::os(p))),
                };
                let dests = linkdest::bases(&params.link_dests, &at, renamed, confined, open);
                base.linking_from(dests);
            }
            if let Some(suffix) = &params.extras.backup {
                // (Beneath the roots, as the destination.)
                let at = requested_path(&dest)?.into_os_string().into_encoded_bytes();
                let dir = params.extras.backup_dir.as_deref();
                let confined = !config.own_files;
                let roots = config.roots.clone();
                let make = move |p: &[u8]| match confined {
                    true => {
                        let path = requested_path(p)?;
                        let (root, parts) = tree::under_roots(&path, &roots)?;
                        backup::make_beneath(tree::open_root(root)?, &parts)
                    }
                    false => backup::make_as_given(Path::new(tree::os(p))),
                };
                let backups = backup::open(suffix, dir, &at, &base, confined, make)?;
                base.backing_up(backups);
            }
            let mut relay = match &chain {
                Some(hops) => {
                    let onward = Onward {
                        flags,
                        sources,
                        dest,
                    };
                    Relay::onward(hops, onward, &params, link.backend(), &config.secret).await
                }
                None => None,
            };
            *links = ready(&link, config, true, streams).await?;
            let opts = RecvOptions {
                passing: flags & flags::MERGED_ANSWERS != 0,
                ..params.recv_options(false)
            };
            let got = recv::receive(
                links,
                base,
                opts,
                &params.filter,
                None,
                &progress,
                relay.as_mut(),
            )
            .await;
            let got = match got {
                Ok(got) => got,
                Err(e) => {
                    if let Some(relay) = relay {
                        relay.abort();
                    }
                    return Err(e);
                }
            };
            if config.log {
                for f in &got.failed {
                    tracing::warn!(path = f.path, kind = ?f.kind, "{}: {}", f.path, f.reason);
                }
            }
            if let Some(hops) = &chain {
                chain::answer(&link, hops, &got, started, relay).await?;
            }
            streams::finish_all(links).await?;
            got.stats
        }
        Msg::Pull {
            flags,
            streams,
            sources,
        } => {
            let tail = receive_tail(&link, flags).await?;
            let params = config.params.with_request(flags, streams, tail)?;
            // A symlink followed could lead anywhere: a daemon keeps to
            // its roots. (A remote shell's server is the user's own.)
            if !config.own_files
                && (matches!(params.symlinks, Symlinks::Follow | Symlinks::FollowUnsafe)
                    || params.extras.copy_dirlinks)
            {
                bail!(
                    "rcp serve follows no symlinks (-L, --copy-unsafe-links, -k): one could \
                     lead outside its roots"
                );
            }
            // (A daemon serves its files; it does not give them away.)
            if !config.own_files && params.remove_sources {
                bail!("rcp serve removes nothing it serves (--remove-source-files)");
            }
            let local = if params.listed.is_some() {
                let names = receive_names(&link).await?;
                let [dir] = &sources[..] else {
                    bail!("--files-from takes one source: the directory the names are in");
                };
                Sources::Listed {
                    base: match config.own_files {
                        true => listed_base(&[requested_path(dir)?])?,
                        false => confined_dir(&config.roots, dir)?,
                    },
                    names,
                    disk: config.own_files.then(|| dir.clone()),
                }
            } else if config.own_files {
                let paths = sources
                    .iter()
                    .map(|s| requested_path(s))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Sources::Operands(local_sources(&paths)?)
            } else {
                Sources::Operands(
                    sources
                        .iter()
                        .map(|s| confined_source(&config.roots, s))
                        .collect::<anyhow::Result<Vec<_>>>()?,
                )
            };
            *links = ready(&link, config, false, streams).await?;
            let walk = start_walk(local, &params)?;
            let (stats, outcome) =
                send::send(links, walk, params.send_options(), &progress).await?;
            // (Found after the client was told all: only said here, on a
            // remote shell's stderr, and in the exit status.)
            for f in &outcome.not_removed {
                eprintln!("rcp: {}: {}", f.path, f.reason);
            }
            streams::finish_all(links).await?;
            stats
        }
        Msg::Join { session, stream } => {
            // Acknowledge before handing over: from then on the session
            // may send data on this link.
            let ack = Msg::Ready {
                dest_is_dir: false,
                session,
            };
            link.send_message(&ack.encode()).await?;
            config.sessions.join(&session, stream, link)?;
            links.clear();
            return Ok(Served::Joined);
        }
        other => bail!("expected a request, got {}", other.name()),
    };
    Ok(Served::Session(stats))
}

/// Accepts the request: tells the client the session id, waits for the
/// session's further streams; returns all its links.
async fn ready(
    link: &Link,
    config: &ServeConfig,
    dest_is_dir: bool,
    streams: u32,
) -> anyhow::Result<Vec<Link>> {
    let waiting = config.sessions.open(streams);
    let msg = Msg::Ready {
        dest_is_dir,
        session: waiting.id(),
    };
    link.send_message(&msg.encode()).await?;
    waiting.gather(link.clone()).await
}

/// Serves one session on `listener` and the streams that join it: the far
/// side of remote-shell mode, and the in-process server of a local copy.
/// The first connection must arrive within `first_within`.
pub async fn serve_one(
    listener: Listener,
    config: ServeConfig,
    first_within: std::time::Duration,
) -> anyhow::Result<Stats> {
    let conn = tokio::time::timeout(first_within, listener.accept())
        .await
        .with_context(|| format!("no client connected within {first_within:?}"))??;
    let config = Arc::new(config);
    let main = {
        let config = Arc::clone(&config);
        tokio::spawn(async move { server(conn, &config).await })
    };
    tokio::pin!(main);
    let mut joins = 0;
    loop {
        tokio::select! {
            served = &mut main => {
                return match served?? {
                    Served::Session(stats) => Ok(stats),
                    Served::Joined => bail!("the first connection joined no session"),
                };
            }
            conn = listener.accept(), if joins < crate::proto::MAX_STREAMS => {
                joins += 1;
                let config = Arc::clone(&config);
                let conn = conn?;
                tokio::spawn(async move { server(conn, &config).await });
            }
        }
    }
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

/// A client's destination, confined beneath the roots; `make`
/// (`--files-from`), or a path that ends in `/`: a directory, made if
/// missing. `mkpath`: the directories on its way are made first.
fn confined_base(
    roots: &[PathBuf],
    dest: &[u8],
    sources: usize,
    make: bool,
    how: Making,
) -> anyhow::Result<Base> {
    let path = requested_path(dest)?;
    // (A dry run makes nothing but a list's directory, as before: one a
    // `/` names is looked at as a name in its parent.)
    let make = make || (tree::names_a_directory(dest) && !how.dry_run);
    let (root, parts) = tree::under_roots(&path, roots)?;
    let root = tree::open_root(root)?;
    if how.mkpath && !how.dry_run {
        let on_the_way = match make {
            true => &parts[..],
            false => &parts[..parts.len().saturating_sub(1)],
        };
        tree::make_dirs_beneath(&root, on_the_way)
            .with_context(|| format!("--mkpath: cannot make {}", path.display()))?;
    }
    if let Ok(dir) = tree::open_dir_beneath(&root, &parts) {
        return Ok(Base::new(dir, None));
    }
    if make {
        let (last, dirs) = parts
            .split_last()
            .with_context(|| format!("{} is not a directory", path.display()))?;
        let parent = tree::open_dir_beneath(&root, dirs)?;
        // (Made meanwhile by another copy is as good; anything else
        // there fails to open as a directory.)
        match rustix::fs::mkdirat(
            &parent,
            tree::os(last),
            rustix::fs::Mode::from_raw_mode(0o777),
        ) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e).with_context(|| format!("cannot make {}", path.display())),
        }
        return Ok(Base::new(tree::open_dir_beneath(&parent, &[last])?, None));
    }
    if sources > 1 {
        let why = match how.dry_run && tree::names_a_directory(dest) {
            true => "is not there yet, and a dry run makes nothing: several sources need it",
            false => "is not a directory; several sources need one",
        };
        bail!("{} {why}", path.display());
    }
    let (last, dirs) = parts
        .split_last()
        .with_context(|| format!("{} is not a directory", path.display()))?;
    Ok(Base::new(
        tree::open_dir_beneath(&root, dirs)?,
        Some(last.to_vec()),
    ))
}

/// A client's source directory (`--files-from`), confined beneath the
/// roots (a root itself allowed).
fn confined_dir(roots: &[PathBuf], raw: &[u8]) -> anyhow::Result<OwnedFd> {
    let path = requested_path(raw)?;
    let (root, parts) = tree::under_roots(&path, roots)?;
    Ok(tree::open_dir_beneath(tree::open_root(root)?, &parts)?)
}

/// A client's source, confined beneath the roots.
fn confined_source(roots: &[PathBuf], raw: &[u8]) -> anyhow::Result<Source> {
    let path = requested_path(raw)?;
    let (root, parts) = tree::under_roots(&path, roots)?;
    let root = tree::open_root(root)?;
    let (last, dirs) = parts
        .split_last()
        .with_context(|| format!("{} names a root, not something in it", path.display()))?;
    // (A directory on the way that is not there: see `missing_on_the_way`.)
    let mut parent = root;
    for dir in dirs {
        match tree::open_dir_beneath(&parent, &[dir]) {
            Ok(next) => parent = next,
            Err(e) if e.errno() == Some(rustix::io::Errno::NOENT) => {
                return Ok(missing_on_the_way(parent, dir, last));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Source {
        parent,
        name: last.to_vec(),
        top: last.to_vec(),
        disk: None,
    })
}

/// Whether `e` (of `tree::open_root`) says a name is not there.
fn is_missing(e: &anyhow::Error) -> bool {
    e.root_cause().downcast_ref::<rustix::io::Errno>() == Some(&rustix::io::Errno::NOENT)
}

/// An operand one of whose directories, `missing` in `deepest`, is not
/// there (`gone/x`): a source whose walk finds nothing under that name,
/// so that it fails alone (or, with `--ignore-missing-args`, is passed
/// over) as an operand that is not there does
/// ([`tree::Walker::ignore_missing_args`]), rather than end the copy.
fn missing_on_the_way(deepest: OwnedFd, missing: &[u8], top: &[u8]) -> Source {
    Source {
        parent: deepest,
        name: missing.to_vec(),
        top: top.to_vec(),
        disk: None,
    }
}

#[cfg(test)]
mod tests {
    use super::{Backend, Protection, fitting, sealing};

    #[test]
    fn only_a_local_copys_link_goes_unsealed_and_only_unless_encryption_is_asked() {
        use Backend::{InProcess, Rdma, Tcp};
        assert_eq!(sealing(false, InProcess), None);
        assert_eq!(sealing(true, InProcess), Some(Protection::Encrypt));
        for backend in [Tcp, Rdma] {
            assert_eq!(sealing(false, backend), Some(Protection::Authenticate));
            assert_eq!(sealing(true, backend), Some(Protection::Encrypt));
        }
    }

    #[test]
    fn runs_fit_the_room_and_the_count_in_order() {
        let items = [3usize, 3, 3, 9, 1, 1, 1, 1];
        let runs = fitting(items, 7, 3, |n| *n);
        assert_eq!(runs, [vec![3, 3], vec![3], vec![9], vec![1, 1, 1], vec![1]]);
        assert!(fitting(Vec::<usize>::new(), 7, 3, |n| *n).is_empty());
    }
}
