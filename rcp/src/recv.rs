//! The receiving side of a copy: entries are created under temporary names;
//! each landed chunk is hashed (worker thread) and checked against the
//! sender's digest, written in place by the storage engine straight from
//! its landing slot, and its slot credited back once the write completed
//! (the write owns the chunk: a cancelled copy cannot free a slot the
//! kernel still reads). When a file's last chunk is in, its digest is
//! checked, the data synced, and only then is it renamed into place: an
//! interrupted or corrupted copy never shows up under the final name.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use rfabric::link::{Chunk, Incoming as LinkIncoming, Link};
use rfabric::wire::chunk_flags;
use tokio::task::JoinHandle;

use crate::archive::{Keep, Powers, Preserve, Xattr, XattrInbox};
use crate::arrivals::{Action, Arrivals, Place, Shape};
use crate::backup::Backups;
use crate::chain::{Merging, Relay};
use crate::delete;
use crate::digest::{self, Algorithm};
use crate::existing;
use crate::exit::{Corrupted, Exit, PeerLost};
use crate::filter::Filter;
use crate::idmap::Owners;
use crate::merge::Said;
use crate::proto::{Entry, EntryKind, FailKind, Msg};
use crate::report::{Failure, Progress, Stats};
use crate::resync::{self, Decision, Found, Kept, Policy, There};
use crate::streams::Merged;
use crate::tree::{self, Base, DirSyncs, Fidelity, Leftover, Opened, PartFile};
use rfabric::storage::{Engine, Kind};

mod answers;
mod precheck;
mod without_data;
use answers::Answers;
use precheck::{Checking, Cleared, FileId, Prechecks};

/// Batches of entries being checked at most, the one the loop handles
/// next included ([`precheck`]): while more batches have come, the loop
/// takes them and starts their checks before it handles the oldest. (32
/// did no better over ssh than 8: 1.01x the time, 10 paired runs.)
const CHECKED_AHEAD: usize = 8;

/// Files of several names found unchanged that a receiver keeps the
/// device and inode of, for their other names ([`Creator::create`]).
/// In a destination made with `cp -al` from an older copy (rsnapshot's
/// way) every file there has several names, whatever the source's: past
/// this many (about 30 MiB of paths), other names go the way of those
/// not checked ahead (looked at once every file is in place).
const MOST_UNCHANGED_LINKED: usize = 1 << 18;

#[derive(Debug, Clone, Copy)]
pub struct RecvOptions {
    /// `-p`, `--perms`, `-t`.
    pub preserve: Preserve,
    /// Archive metadata to apply (`-o -g -D -X -A -H`).
    pub keep: Keep,
    /// The operator lets this session set owners and make device nodes
    /// (when the process is root): a daemon's `--allow-owners`, always
    /// for the user's own copies.
    pub owners_allowed: bool,
    pub verify: bool,
    /// What chunks and files are hashed with.
    pub digest: Algorithm,
    /// Keep what an interrupted copy left, tell the sender what is there.
    pub resume: bool,
    /// Which files are sent again: the receiver answers each by it.
    pub policy: Policy,
    /// `--delete`: once all arrived, remove what the sender did not send.
    pub delete: bool,
    /// `-x`: directories may come unlisted (`Unlisted`: `--delete` leaves
    /// what they hold), and `--delete` keeps to each top-level entry's
    /// file system (see [`delete::extraneous`]).
    pub one_file_system: bool,
    /// `--safe-links`: a symlink that leads outside the copied tree is not
    /// made (its name stays, as rsync's receiver keeps it).
    pub safe_links: bool,
    /// `--files-from`: entry paths start below the copied tree's top
    /// ([`tree::leads_outside`]).
    pub files_from: bool,
    /// `-n`: decide and report, change nothing.
    pub dry_run: bool,
    /// `-i`: name what changes.
    pub itemize: Itemize,
    /// The storage engine that writes the files.
    pub engine: Kind,
    /// How long a file another copy is writing is waited for (the
    /// session's `--timeout`: within it a copy whose peer died lets go);
    /// `None` waits as long as it takes.
    pub busy_wait: Option<std::time::Duration>,
    /// A broadcast node whose chain merges answers: a file it needs
    /// nothing of may still carry data for the nodes after it, which
    /// passes through.
    pub passing: bool,
    /// `--remove-source-files`: the sender removes what this side holds
    /// once its last answer is in, so before it the destination's file
    /// system is synced whole (`syncfs`): besides the files written and
    /// their directories, the symlinks, special files and directories
    /// made, and files found there unchanged whose data may not be on
    /// disk yet.
    pub sync_all: bool,
    /// `--bwlimit` of the side the user started, when it receives (a
    /// pull): each chunk waits its turn before it lands, so its slot and
    /// the sender's credit come back no faster (see [`crate::pace`]).
    pub bwlimit: Option<u64>,
    /// `--max-delete`: at most this many entries removed (see
    /// [`delete::Budget`]).
    pub max_delete: Option<u64>,
    /// `--delete-excluded`: what the rules exclude is removed too.
    pub delete_excluded: bool,
    /// `--force`: a directory with something in it, standing where a
    /// non-directory must go, is emptied and removed (as with `--delete`;
    /// see `tree/way.rs`).
    pub force: bool,
    /// `-O`: directories' modification times are left as they are.
    pub omit_dir_times: bool,
    /// `--partial`: what arrived of a file stays under its temporary name
    /// when the copy is cut off, and a file answered takes up what an
    /// earlier copy kept so (the sender is told its digests, as with
    /// `resume`).
    pub partial: bool,
}

/// Where `-i`'s lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Itemize {
    Off,
    /// On stdout here, so: this side is the client.
    Print(Lines),
    /// To the sender (`Itemized`), the client.
    Tell,
}

/// How the client shows each change the receiver names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lines {
    /// `-i`: rsync's 11-letter code, then the name.
    #[default]
    Codes,
    /// `-v`: the name of what is sent, made, linked or removed
    /// (`deleting NAME`), and of a directory whose attributes change, as
    /// rsync's `-v` prints them; another entry whose attributes alone
    /// change is not shown.
    Names,
}

/// The line `lines` shows for a change named with `code` (rsync's `-i`
/// code) and `name` (as `-i` names it), if any. **Sans I/O.**
pub fn itemized_line(code: &[u8; 11], name: &[u8], lines: Lines) -> Option<String> {
    let name = tree::show(name);
    match lines {
        Lines::Codes => Some(format!("{} {name}", String::from_utf8_lossy(code))),
        Lines::Names if code.starts_with(b"*deleting") => Some(format!("deleting {name}")),
        // (rsync's `-v` shows what was transferred or made here, the
        // codes that start with `<`, `>`, `c` and `h`, and directories
        // whatever changed of them.)
        Lines::Names if code[0] == b'.' && code[1] != b'd' => None,
        Lines::Names => Some(name),
    }
}

/// One `-i` (or `-v`) line on stdout, as rsync prints it (a closed
/// stdout, as when piped into `head`, is no error of the copy's).
pub fn print_itemized(code: &[u8; 11], path: &[u8], lines: Lines) {
    use std::io::Write;
    if let Some(line) = itemized_line(code, path, lines) {
        let _ = writeln!(std::io::stdout().lock(), "{line}");
    }
}

/// Entry `e` named as rsync's `-i` names it (`%n%L`): a directory with a
/// `/` after it, a symlink with ` -> ` and its target, another name of a
/// file with ` => ` and the name it links to.
fn itemized_name(e: &Entry) -> Vec<u8> {
    let mut name = e.path.clone();
    match e.kind {
        EntryKind::Dir => name.push(b'/'),
        EntryKind::Symlink => name.extend([&b" -> "[..], &e.target].concat()),
        EntryKind::HardLink => name.extend([&b" => "[..], &e.target].concat()),
        _ => {}
    }
    name
}

/// How often a file another copy holds is asked for again.
const BUSY_POLL: std::time::Duration = std::time::Duration::from_millis(10);

type ChunkResult = anyhow::Result<(u64, [u8; 32])>;

struct File {
    entry: Entry,
    /// Its extended attributes, applied when it is committed.
    xattrs: Vec<Xattr>,
    out: Arc<PartFile>,
    writes: Vec<Started<ChunkResult>>,
    /// Digests of chunks already on disk (resume): those the sender skips.
    known: Vec<Option<[u8; 32]>>,
    /// The file digest the sender gave with the file's end.
    digest: Option<[u8; 32]>,
    /// `--checksum`: the file there, which `known` describes: the chunks
    /// not sent are copied from it, or it stays if none was sent.
    basis: Option<OwnedFd>,
    /// `-i` of a file compared: what was there, named when finished.
    itemize: Option<(Option<There>, Kept)>,
}

/// What arrived.
#[derive(Debug, Default)]
pub struct Received {
    pub stats: Stats,
    /// Digests of the files that arrived verified, by path.
    pub digests: Vec<(String, [u8; 32])>,
    /// Entries that failed.
    pub failed: Vec<Failure>,
}

/// A finished file: its digest (verified copies), and whether it was
/// there already (a comparison that found every chunk equal).
struct Finished {
    digest: Option<(String, [u8; 32])>,
    unchanged: bool,
}

/// A finished file, or what went wrong.
type Verdict = Result<Finished, Failure>;

/// What kind of failure `e` is, from the types in it.
fn kind_of(e: &anyhow::Error) -> FailKind {
    match Exit::of_error(e) {
        Exit::Corrupted => FailKind::Corrupted,
        Exit::Io => FailKind::Io,
        _ => FailKind::Other,
    }
}

/// `e` as an answer to the sender.
fn failed(e: &anyhow::Error) -> (FailKind, String) {
    (kind_of(e), format!("{e:#}"))
}

/// Receives entries into `base` until the sender's `Done` and the last
/// file is complete, answering each. `links[0]` carries the messages; data
/// arrives on all of them, in any order across links.
pub async fn receive(
    links: &[Link],
    base: Base,
    opts: RecvOptions,
    filter: &Filter,
    owners: Option<&Owners>,
    progress: &Progress,
    mut relay: Option<&mut Relay>,
) -> anyhow::Result<Received> {
    let link = &links[0];
    let engine = Engine::start(opts.engine, None)
        .with_context(|| format!("cannot start the {} storage engine", opts.engine))?;
    // Read the umask before any file is created here.
    tree::umask();
    // A directory standing where a non-directory must go is cleared by
    // the copy's rules (`tree/way.rs`).
    let mut base = base;
    let way = Arc::new(delete::InTheWay::new(
        opts.delete || opts.force,
        opts.dry_run,
        opts.one_file_system,
        (!opts.delete_excluded).then(|| filter.clone()),
        opts.max_delete,
        base.take_backups(),
    ));
    // (`-O`; and `--backup` without `--backup-dir` implies it, as
    // rsync's.)
    let dir_times = !opts.omit_dir_times && !way.backups().is_some_and(Backups::beside_their_files);
    base.making_way(Arc::clone(&way) as Arc<dyn tree::MakingWay>);
    let base = Arc::new(base);
    let mut files: HashMap<u32, File> = HashMap::new();
    let mut finals = Finals::default();
    // Files being finished at once: the sender's window of announced
    // files, which is sized to the limit on open files the same way.
    let finishing_most = crate::send::ask_ahead();
    // Directories held open for their sync: a quarter of that.
    let dirs_to_sync = Arc::new(std::sync::Mutex::new(DirSyncs::new(
        engine.clone(),
        finishing_most / 4,
    )));
    let mut pace = opts.bwlimit.map(crate::pace::Pace::new);
    let mut stats = Stats {
        stream_bytes: vec![0; links.len()],
        ..Stats::default()
    };
    let mut incoming = Merged::new(links);
    // The rules of what may arrive when (and the chunks that overtook
    // their entry's announcement on another stream: they hold their
    // slots, so the window bounds them).
    let mut arrivals: Arrivals<Arc<Chunk>> = Arrivals::new();
    let (answers, answerer) = Answers::start(link.clone(), opts.itemize);
    // A broadcast node's own answers meet the next node's; the merged ones
    // go to the node before it with the rest of its answers.
    let (merging, merged) = match relay.as_deref_mut().and_then(Relay::take_merging) {
        Some((m, rx)) => (Some(m), Some(rx)),
        None => (None, None),
    };
    let merged_out = merged.map(|mut rx| {
        let answers = answers.clone();
        tokio::spawn(async move {
            while let Some((index, said)) = rx.recv().await {
                answers.said(index, said);
            }
        })
    });
    let how = Fidelity {
        preserve: opts.preserve,
        window: opts.policy.times,
        keep: opts.keep,
        powers: Powers::here(opts.owners_allowed),
    };
    let mut new = Creator {
        base: &base,
        syncs: Arc::clone(&dirs_to_sync),
        opts,
        owners,
        how,
        answers: &answers,
        merging,
        failed_here: Vec::new(),
        files: 0,
        skipped: 0,
        progress,
        sent: opts.delete.then(delete::Sent::default),
        dirs: Vec::new(),
        unlisted: delete::Unlisted::default(),
        hard_links: Vec::new(),
        unchanged_linked: HashMap::new(),
        other_names_linked: 0,
        unread: HashSet::new(),
        unread_paths: HashSet::new(),
        left_out: HashSet::new(),
        not_made: HashSet::new(),
        last_dir: None,
        xattrs: XattrInbox::default(),
        dir_times,
    };
    // Entries found unchanged on threads of their own, where a batch's
    // entries are compared with what is there (and nothing else is asked
    // of them: no dry run, no resume; `-i` and `-v` name nothing of an
    // entry found unchanged).
    let prechecks = (opts.policy.asks() && !opts.dry_run && !opts.resume)
        .then(|| {
            let rules = precheck::Rules {
                policy: opts.policy,
                how,
            };
            Prechecks::start(Arc::clone(&base), rules)
        })
        .flatten();
    let result = async {
        let gone = || PeerLost("the sender went away before it was done".into());
        // Batches of entries whose files are being checked, oldest first,
        // each handled once its checks are done; and an item taken that
        // waits for them (a chunk, or a link's end).
        let mut checking: VecDeque<Checking> = VecDeque::new();
        let mut held = None;
        // Entries the sender abandoned, until they are dropped: why, and a
        // directory's path.
        let mut abandoned: HashMap<u32, Abandoned> = HashMap::new();
        // (Without checks, each batch is handled before the next item is
        // taken, as it comes.)
        let ahead = if prechecks.is_some() {
            CHECKED_AHEAD
        } else {
            1
        };
        // (Once the copy is over, an item held is not looked at: nothing
        // after `Done` was ever read.)
        while !(arrivals.is_over() && checking.is_empty()) {
            if held.is_none() {
                held = if checking.is_empty() {
                    Some(incoming.next().await.ok_or_else(gone)?)
                } else if checking.len() < ahead {
                    incoming.try_next()
                } else {
                    None
                };
            }
            // A broadcast node hands everything on before it works on it:
            // the next node is a chunk behind, not a file. (A chunk is
            // shared: the onward link may send it from its slot while it
            // is written here; its credit goes back when both are done.)
            let actions = match held.take() {
                Some((stream, Ok(Some(item)))) => match item {
                    LinkIncoming::Message(bytes) if stream == 0 => {
                        if let Some(relay) = relay.as_deref_mut() {
                            relay.forward_message(&bytes).await;
                        }
                        let batch = new.read(Msg::decode_unbatched(&bytes)?)?;
                        checking.push_back(match &prechecks {
                            Some(checks) => checks.check(batch),
                            None => Checking::unchecked(batch),
                        });
                        continue;
                    }
                    LinkIncoming::Message(_) => {
                        bail!("a message arrived on data stream {stream}")
                    }
                    // A chunk need not wait for the batches being checked:
                    // where files are checked, each is answered before its
                    // data comes, so its entry was handled; and `Arrivals`
                    // holds a chunk that overtakes its entry anyway.
                    LinkIncoming::Chunk(chunk) => {
                        let chunk = Arc::new(chunk);
                        if let Some(relay) = relay.as_deref_mut() {
                            relay.forward_chunk(&chunk).await;
                        }
                        let h = chunk.header();
                        stats.stream_bytes[stream as usize] += u64::from(h.payload_len);
                        if let Some(pace) = &mut pace {
                            let wait = pace.take(u64::from(h.payload_len), Instant::now());
                            if !wait.is_zero() {
                                tokio::time::sleep(wait).await;
                            }
                        }
                        let place = Place {
                            entry: h.owner,
                            offset: h.offset,
                            len: h.payload_len,
                        };
                        arrivals.chunk(place, chunk)?
                    }
                },
                // A link's end or failure, once the batches before it are
                // handled.
                Some((_, end)) if checking.is_empty() => {
                    end?;
                    return Err(gone().into());
                }
                // The oldest batch, in turn (before the item held, if any).
                other => {
                    held = other;
                    let oldest = checking.pop_front().expect("a batch being checked");
                    let (batch, cleared) = oldest.done().await;
                    let mut actions = Vec::new();
                    for (at, next) in batch.into_iter().enumerate() {
                        actions.extend(match next {
                            Next::Create(ready) => {
                                let cleared = cleared.get(at).copied().unwrap_or_default();
                                match new.create(&mut arrivals, *ready, cleared)? {
                                    Created::Done(actions) => actions,
                                    Created::Open(file) => new.open(&mut files, file).await?,
                                }
                            }
                            Next::End {
                                index,
                                chunks,
                                digest,
                            } => {
                                let finish = arrivals.end(index, chunks)?;
                                // (A file passing through is no file here.)
                                if let Some(file) = files.get_mut(&index) {
                                    file.digest = Some(digest);
                                }
                                finish.into_iter().collect()
                            }
                            Next::Abandoned {
                                index,
                                chunks,
                                why,
                                path,
                            } => {
                                abandoned.insert(index, Abandoned { why, path });
                                arrivals.abandon(index, chunks)?.into_iter().collect()
                            }
                            Next::Done => {
                                arrivals.done()?;
                                Vec::new()
                            }
                        });
                    }
                    actions
                }
            };
            for action in actions {
                match action {
                    Action::Land { entry, k, chunk } => {
                        let file = files.get_mut(&entry).expect("an open file");
                        land(file, chunk, k, &engine, opts, &mut stats, progress);
                    }
                    Action::Drop { entry } => {
                        let Abandoned {
                            why: (kind, reason),
                            path,
                        } = abandoned.remove(&entry).expect("a reason it was abandoned");
                        let path = match files.remove(&entry) {
                            // What arrived of it goes; what is there stays.
                            Some(file) => {
                                for w in file.writes {
                                    let _ = w.wait().await;
                                }
                                if let Ok(out) = Arc::try_unwrap(file.out) {
                                    out.discard();
                                }
                                Some(file.entry.path)
                            }
                            None => path,
                        };
                        new.unread.insert(entry);
                        let shown = path
                            .as_ref()
                            .map_or_else(|| format!("entry {entry}"), |p| tree::show(p));
                        new.unread_paths.extend(path);
                        answers.send(entry, Err((kind, reason.clone())));
                        new.failed_here.push(Failure {
                            path: shown,
                            kind,
                            reason,
                        });
                    }
                    Action::Finish { entry } => {
                        let file = files.remove(&entry).expect("an open file");
                        finals.room(finishing_most).await;
                        finals.spawn(finish_file(
                            answers.clone(),
                            engine.clone(),
                            file,
                            opts,
                            how,
                            Arc::clone(&dirs_to_sync),
                        ));
                    }
                }
            }
        }
        anyhow::Ok(())
    }
    .await;
    // Every file was answered by the sender's Done (or the copy failed):
    // no merged answer is still to go.
    if let Some(task) = merged_out {
        task.abort();
    }
    drop(incoming);
    drop(arrivals);
    if let Some(checks) = &prechecks {
        checks.other_names_linked(new.other_names_linked);
    }
    let mut ok = result.is_ok();
    let Finals {
        digests,
        mut failed,
        unchanged,
        ..
    } = finals.all().await;
    new.skipped += unchanged;
    progress.there_already(unchanged);
    failed.append(&mut new.failed_here);
    // (What vanished from the source is said, and fails nothing.)
    ok &= !failed.iter().any(|f| f.kind.is_failure());
    // Files still open were never finished: nothing of them stays under
    // a final name, and without `--partial` nothing at all.
    for (_, file) in files.drain() {
        for w in file.writes {
            let _ = w.wait().await;
        }
        // (A file compared with the one there holds only what differed:
        // the next `-c` compares again, and nothing else could use it.)
        if let Ok(out) = Arc::try_unwrap(file.out) {
            match opts.partial && file.basis.is_none() {
                true => out.keep_if_any(),
                false => out.discard(),
            }
        }
    }
    result?;
    stats.files = new.files;
    stats.skipped = new.skipped;
    // Other names of files once all files are in place (`-H`). (Not to
    // a file that failed here: what is under its name is not it. Its
    // shown name is compared: two names shown alike refuse both, never
    // link wrong.)
    let failed_files: HashSet<String> = match new.hard_links.is_empty() {
        true => HashSet::new(),
        false => failed.iter().map(|f| f.path.clone()).collect(),
    };
    for e in &new.hard_links {
        // (A name of a file the sender could not read is not linked: to
        // nothing new, or to what was there before.)
        let target = tree::show(&e.target);
        let unlinkable = if new.unread_paths.contains(&e.target) {
            Some("could not be read at the source")
        } else if failed_files.contains(&target) {
            Some("failed")
        } else {
            None
        };
        if let Some(why) = unlinkable {
            let reason = format!("not linked: {target} {why}");
            answers.send(e.index, Err((FailKind::Io, reason.clone())));
            failed.push(Failure {
                path: tree::show(&e.path),
                kind: FailKind::Io,
                reason,
            });
            ok = false;
            continue;
        }
        // (`--existing`: the first name was not there, so it was not
        // made, and this one is left as it is.)
        if opts.policy.existing && existing::status(&base, &e.target).is_err() {
            answers.send(e.index, Ok(()));
            continue;
        }
        // (Into nothing, the names are most likely free.)
        match base.make_hard_link(e, opts.policy.check == resync::Check::Never) {
            Ok(dir) => {
                dirs_to_sync.lock().expect("dir lock").add(dir);
                answers.send(e.index, Ok(()));
            }
            Err(err) => {
                let (kind, reason) = self::failed(&err);
                answers.send(e.index, Err((kind, reason.clone())));
                failed.push(Failure {
                    path: tree::show(&e.path),
                    kind,
                    reason,
                });
                ok = false;
            }
        }
    }
    // What went to make way for an entry, and what is left of
    // `--max-delete`'s budget for what follows.
    let (cleared, budget) = way.finish();
    stats.deleted = cleared.len() as u64;
    for (path, is_dir) in cleared {
        tell_removed(&answers, opts.itemize, path, is_dir);
    }
    // What the destination has that the source does not, once all of the
    // copy succeeded (and before directory times are set: removing
    // changes them).
    if let Some(sent) = new.sent.as_ref().filter(|_| ok) {
        let dirs = new
            .dirs
            .iter()
            .filter(|(d, _)| !new.unlisted.holds(d.index))
            .map(|(d, _)| (d.index, d.path.clone()));
        // What the rules exclude is not the copy's to delete (unless
        // `--delete-excluded`), nor what `--backup` made beside its files.
        let keep = |path: &[u8], is_dir| way.keeps(path, is_dir);
        let deleted = delete::extraneous(
            &base,
            sent,
            dirs,
            delete::Clean {
                keep: &keep,
                dry: opts.dry_run,
                one_file_system: opts.one_file_system,
                budget,
                backups: way.backups(),
            },
        );
        stats.deleted += deleted.removed.len() as u64;
        for (path, is_dir) in deleted.removed {
            tell_removed(&answers, opts.itemize, path, is_dir);
        }
        for (index, path, e) in deleted.failed {
            let (kind, reason) = self::failed(&e);
            answers.send(index, Err((kind, reason.clone())));
            failed.push(Failure {
                path: tree::show(&path),
                kind,
                reason,
            });
            ok = false;
        }
        // `--max-delete`: the rest stays, and the copy says so and fails
        // (as rsync, whose status is then 25). (A second answer for the
        // directory where it stopped: the sender counts the failure.)
        if let Some((index, path)) = deleted.stopped_in {
            let reason = format!(
                "deletions stopped due to --max-delete limit ({} skipped)",
                deleted.held_back
            );
            answers.send(index, Err((FailKind::Other, reason.clone())));
            failed.push(Failure {
                path: tree::show(&path),
                kind: FailKind::Other,
                reason,
            });
            ok = false;
        }
    }
    // Directory metadata, modes and times last (deepest first), so that
    // writing into them was possible, their times are not bumped
    // afterwards, and a default ACL does not pass on to what arrived. (A
    // dry run made none.)
    let finishing = if opts.dry_run { &[][..] } else { &new.dirs[..] };
    for (d, xattrs) in finishing.iter().rev() {
        // (One the sender could not list failed already: its metadata is
        // set where it can be, and not said failed twice.)
        if let Err(e) = base.finish_dir(d, xattrs, how, dir_times)
            && !new.unread.contains(&d.index)
        {
            let (kind, reason) = self::failed(&e);
            // (A second answer for it: the sender counts the failure.)
            answers.send(d.index, Err((kind, reason.clone())));
            failed.push(Failure {
                path: tree::show(&d.path),
                kind,
                reason,
            });
            ok = false;
        }
    }
    // Every rename is durable before the sender can report success.
    let synced = dirs_to_sync.lock().expect("dir lock").all_synced();
    synced.await?;
    if opts.sync_all && !opts.dry_run {
        let base = Arc::clone(&base);
        tokio::task::spawn_blocking(move || base.sync_file_system())
            .await?
            .context("cannot sync the destination before the sources are removed")?;
    }
    drop(answers);
    answerer.await??;
    if !ok {
        stats.failed = true;
    }
    Ok(Received {
        stats,
        digests,
        failed,
    })
}

/// Tells the sender (and `-i`) that entry `path` was removed.
fn tell_removed(answers: &Answers, itemize: Itemize, path: Vec<u8>, is_dir: bool) {
    if itemize != Itemize::Off {
        // (A directory with a `/` after it, as rsync names it.)
        let mut name = path.clone();
        if is_dir {
            name.push(b'/');
        }
        answers.itemized(*b"*deleting  ", name);
    }
    answers.removed(path);
}

/// The files being finished (digest check, commit), and what the finished
/// ones came to: reaped as they end, so that a tree of a million files
/// holds only the few in flight.
#[derive(Default)]
struct Finals {
    running: tokio::task::JoinSet<Verdict>,
    /// Digests of verified files: the first two (a summary shows the
    /// digest only of a copy of one file).
    digests: Vec<(String, [u8; 32])>,
    failed: Vec<Failure>,
    /// Files a comparison found unchanged.
    unchanged: u64,
}

impl Finals {
    /// Waits while `most` files are being finished for one of them to end.
    /// Each keeps its descriptor open until it is committed, and nothing
    /// else bounds them: slots are credited back once written, before the
    /// commit. Into XFS with a sync per file, a local 100,000-entry copy
    /// held so many that the sending side's next `open` failed with
    /// `EMFILE` under a limit of 20,000 files. Waiting here holds up the
    /// stream, and with it the sender; a finish never waits for this loop
    /// (its answer goes out through an unbounded queue).
    async fn room(&mut self, most: usize) {
        while self.running.len() >= most {
            match self.running.join_next().await {
                Some(done) => self.take(done),
                None => break,
            }
        }
    }

    fn spawn(&mut self, finish: impl Future<Output = Verdict> + Send + 'static) {
        match poll_here(finish) {
            Ok(verdict) => self.take(Ok(verdict)),
            Err(finish) => {
                self.running.spawn(finish);
            }
        }
        while let Some(done) = self.running.try_join_next() {
            self.take(done);
        }
    }

    async fn all(mut self) -> Finals {
        while let Some(done) = self.running.join_next().await {
            self.take(done);
        }
        self
    }

    fn take(&mut self, done: Result<Verdict, tokio::task::JoinError>) {
        match done {
            Ok(Ok(f)) => {
                if self.digests.len() < 2 {
                    self.digests.extend(f.digest);
                }
                self.unchanged += u64::from(f.unchanged);
            }
            Ok(Err(why)) => self.failed.push(why),
            Err(e) => self.failed.push(Failure {
                path: "?".into(),
                kind: FailKind::Other,
                reason: e.to_string(),
            }),
        }
    }
}

/// A task begun right here: run to its end already if it needed no wait
/// (a small chunk's write into the page cache, a file's finish without a
/// sync), else running on the runtime. On a runtime of one thread, where
/// a task spawned would run on this thread anyway, only later, the first
/// poll is made here: a fresh copy of 91,000 small files spawned and
/// joined two tasks a file on the receiving thread, its busiest.
enum Started<T> {
    Done(T),
    Running(JoinHandle<T>),
}

impl<T: Send + 'static> Started<T> {
    fn start(task: impl Future<Output = T> + Send + 'static) -> Started<T> {
        match poll_here(task) {
            Ok(done) => Started::Done(done),
            Err(task) => Started::Running(tokio::spawn(task)),
        }
    }

    async fn wait(self) -> Result<T, tokio::task::JoinError> {
        match self {
            Started::Done(done) => Ok(done),
            Started::Running(task) => task.await,
        }
    }
}

/// `task` run to its end if it needs no wait and the runtime has one
/// thread ([`Started`]); else `task`, to be spawned. (Polled once without
/// a waker to wake: a task that waits is spawned, and the runtime's poll
/// gives it the waker it keeps.)
fn poll_here<F: Future>(task: F) -> Result<F::Output, std::pin::Pin<Box<F>>> {
    let mut task = Box::pin(task);
    if tokio::runtime::Handle::current().metrics().num_workers() == 1 {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if let std::task::Poll::Ready(done) = task.as_mut().poll(&mut cx) {
            return Ok(done);
        }
    }
    Err(task)
}

/// An announced entry as it is to be created: checked against the
/// request, its owners mapped, with its extended attributes and, for a
/// file sent unasked, where its data ended.
struct Ready {
    entry: Entry,
    xattrs: Vec<Xattr>,
    end: Option<(u64, [u8; 32])>,
}

/// What [`Creator::create`] made of an entry: all of it (what to do
/// next), or all but a file's temporary file, which the caller opens
/// ([`Creator::open`]).
enum Created {
    Done(Vec<Action<Arc<Chunk>>>),
    Open(Box<ToOpen>),
}

/// A file to receive whose temporary file is still to open, and what
/// [`Creator::create`] found of it.
struct ToOpen {
    e: Entry,
    xattrs: Vec<Xattr>,
    end: Option<(u64, [u8; 32])>,
    /// What `-c` compares with (the file there), if it can be read.
    basis: Option<OwnedFd>,
    /// The sender waits for an answer.
    asks: bool,
    /// `-i`: what was there, for a file named once it is known to differ.
    there_itemized: Option<Option<There>>,
    actions: Vec<Action<Arc<Chunk>>>,
}

/// A batch's message once read: what the loop does with it, in order.
enum Next {
    /// (Boxed: a batch's entries are moved several times on their way
    /// through the loop, a pointer each rather than 200 bytes.)
    Create(Box<Ready>),
    End {
        index: u32,
        chunks: u64,
        digest: [u8; 32],
    },
    /// The sender could not read entry `index` (`Msg::Abandoned`); its
    /// path where it is a directory (a file's is its open file's).
    Abandoned {
        index: u32,
        chunks: u64,
        why: (FailKind, String),
        path: Option<Vec<u8>>,
    },
    Done,
}

/// Why the sender abandoned an entry, and a directory's path: kept until
/// the entry is dropped.
struct Abandoned {
    why: (FailKind, String),
    path: Option<Vec<u8>>,
}

/// What creates the entries the rules accepted, and what it created.
struct Creator<'a> {
    base: &'a Base,
    /// Directories a name was linked into (`--link-dest`), synced with the
    /// rest before the last answer.
    syncs: Arc<std::sync::Mutex<DirSyncs>>,
    opts: RecvOptions,
    /// A pull's `--usermap`, `--groupmap`: what arrives is mapped here.
    owners: Option<&'a Owners>,
    how: Fidelity,
    answers: &'a Answers,
    /// A broadcast node's: where its answers about files meet the next
    /// node's.
    merging: Option<Arc<Merging>>,
    /// Whether directory times are set (not with `--backup` without
    /// `--backup-dir`).
    dir_times: bool,
    /// Failures of this side's own: each also answered, unless a
    /// broadcast node's (an `EntryFailed` before the data would keep it
    /// from the nodes after this one).
    failed_here: Vec<Failure>,
    /// Files received (or found there already).
    files: u64,
    /// Files there already: nothing of them was sent.
    skipped: u64,
    /// Counts files as they are announced and answered.
    progress: &'a Progress,
    /// `--delete`: every name the sender sent.
    sent: Option<delete::Sent>,
    /// Directories created, in order, with their extended attributes
    /// (their metadata, modes and times come last).
    dirs: Vec<(Entry, Vec<Xattr>)>,
    /// `-x`: directories whose contents the sender did not list (on
    /// another file system there): `--delete` leaves what they hold.
    unlisted: delete::Unlisted,
    /// Other names of files, linked once every file is in place.
    hard_links: Vec<Entry>,
    /// With `-H`, files of several names there, found unchanged by the
    /// checks: by path, their device and inode (at most
    /// [`MOST_UNCHANGED_LINKED`]). An other name of one that the checks
    /// found to be that file is left as it is.
    unchanged_linked: HashMap<Vec<u8>, FileId>,
    /// Other names left as they are by that rule.
    other_names_linked: u64,
    /// What the sender could not read (`Abandoned`, `Unsent`): entries by
    /// index (a directory's metadata failing too is not said again) and
    /// paths (no other name is linked to one, there or from before).
    unread: HashSet<u32>,
    unread_paths: HashSet<Vec<u8>>,
    /// Files left out by their size (`--min-size`, `--max-size`), by path:
    /// their other names are left out too.
    left_out: HashSet<Vec<u8>>,
    /// `--existing`: directories not there, passed over with all in them.
    not_made: HashSet<Vec<u8>>,
    /// The directory read last, by index and path: the one an
    /// `Abandoned` with nothing open names.
    last_dir: Option<(u32, Vec<u8>)>,
    /// Extended attributes arriving ahead of their entry.
    xattrs: XattrInbox,
}

impl Creator<'_> {
    /// Reads a batch's messages: each entry checked against the request,
    /// its owners mapped and its extended attributes (which come ahead of
    /// it) gathered. Nothing is done to the destination yet.
    fn read(&mut self, messages: Vec<Msg>) -> anyhow::Result<Vec<Next>> {
        let keep = self.opts.keep;
        let mut batch = Vec::with_capacity(messages.len());
        for m in messages {
            match m {
                Msg::Entry(e) => batch.push(Next::Create(Box::new(self.ready(e, None)?))),
                Msg::Whole {
                    entry,
                    chunks,
                    digest,
                } => batch.push(Next::Create(Box::new(
                    self.ready(entry, Some((chunks, digest)))?,
                ))),
                // (`-x`'s mount points, and directories the sender could
                // not list.)
                Msg::Unlisted { index } => self.unlisted.unlisted(index)?,
                // (Said by the side the user started: here in a pull.)
                Msg::Unsent { path, kind, reason } => {
                    self.failed_here.push(Failure {
                        path: tree::show(&path),
                        kind,
                        reason,
                    });
                    self.unread_paths.insert(path);
                }
                Msg::Abandoned {
                    index,
                    chunks,
                    kind,
                    reason,
                } => {
                    // (A directory's comes right after its entry; a
                    // file's path is its open file's.)
                    let path = self
                        .last_dir
                        .as_ref()
                        .filter(|(i, _)| *i == index)
                        .map(|(_, p)| p.clone());
                    batch.push(Next::Abandoned {
                        index,
                        chunks,
                        why: (kind, reason),
                        path,
                    });
                }
                Msg::Xattr {
                    index,
                    name,
                    total,
                    offset,
                    piece,
                } if keep.xattrs || keep.acls => {
                    self.xattrs.piece(index, name, total, offset, piece)?;
                }
                Msg::EntryEnd {
                    index,
                    chunks,
                    digest,
                } => batch.push(Next::End {
                    index,
                    chunks,
                    digest,
                }),
                Msg::Done { .. } => batch.push(Next::Done),
                Msg::Fail { reason } => bail!("the sender gave up: {reason}"),
                other => bail!("unexpected {} from the sender", other.name()),
            }
        }
        Ok(batch)
    }

    /// Entry `e` checked against the request, with its owners mapped and
    /// its extended attributes.
    fn ready(&mut self, mut e: Entry, end: Option<(u64, [u8; 32])>) -> anyhow::Result<Ready> {
        if e.meta.is_some() != self.opts.keep.any() {
            bail!("entry {} does not match the request's metadata", e.index);
        }
        if let (Some(owners), Some(meta)) = (self.owners, &mut e.meta) {
            owners.apply(meta);
        }
        let not_asked = match e.kind {
            EntryKind::HardLink => !self.opts.keep.hard_links,
            k if k.is_special() => !self.opts.keep.devices,
            _ => false,
        };
        if not_asked {
            bail!("entry {} is of a kind the request did not ask for", e.index);
        }
        let xattrs = self.xattrs.take(e.index, e.meta.map_or(0, |m| m.xattrs))?;
        self.unlisted.entry(e.index, e.kind == EntryKind::Dir);
        if e.kind == EntryKind::Dir {
            self.last_dir = Some((e.index, e.path.clone()));
        }
        Ok(Ready {
            entry: e,
            xattrs,
            end,
        })
    }

    /// Creates an announced entry: a directory or symlink in place, or a
    /// file to receive decided (its temporary file is opened by
    /// [`Creator::open`], with resume telling the sender what is there
    /// already). `cleared`: what the checks found ([`precheck`]): the
    /// entry (a file, symlink or special file) there as it would be
    /// made, or what is under another name of a file. Returns what the
    /// rules say to do next (land the file's early chunks, finish it).
    ///
    /// Not `async`: its one step that waits, a file's temporary file
    /// opened, is left to the caller ([`Created::Open`], then
    /// [`Creator::open`]). Awaited once an entry, its future (1,296 bytes)
    /// was built and moved for every entry, where most need no wait.
    fn create(
        &mut self,
        arrivals: &mut Arrivals<Arc<Chunk>>,
        ready: Ready,
        cleared: Cleared,
    ) -> anyhow::Result<Created> {
        let Ready {
            entry: e,
            xattrs,
            end,
        } = ready;
        let unchanged = matches!(cleared, Cleared::Unchanged { .. });
        if let Some(sent) = &mut self.sent {
            sent.entry(&e.path);
        }
        let asks = self
            .opts
            .policy
            .answered(self.opts.resume, self.opts.dry_run);
        if asks && end.is_some() {
            bail!(
                "entry {} came with its data before it was answered",
                e.index
            );
        }
        // `--existing`: nothing new is made. A name that is not there is
        // passed over (a file by the policy, below), and a directory that
        // is not there with all in it.
        if self.opts.policy.existing && self.not_there(&e) {
            return self.pass_over(arrivals, &e).map(Created::Done);
        }
        if self.opts.policy.ignore_existing && self.left_as_is(&e) {
            return self.pass_over(arrivals, &e).map(Created::Done);
        }
        // `--min-size`, `--max-size`: a file outside them is left alone
        // (the policy skips it), and so are its other names (`-H`): nothing
        // is made of them, and what is there stays.
        let sizes = self.opts.policy.sizes;
        if sizes.limit() {
            if e.kind == EntryKind::File && !sizes.admit(e.size) {
                self.left_out.insert(e.path.clone());
            }
            if e.kind == EntryKind::HardLink && self.left_out.contains(&e.target) {
                self.answers.send(e.index, Ok(()));
                return Ok(Created::Done(arrivals.announce(e.index, Shape::Other)?));
            }
        }
        if e.kind == EntryKind::Symlink
            && self.opts.safe_links
            && tree::leads_outside(&e.path, &e.target, !self.opts.files_from)
        {
            // `--safe-links`, as rsync's receiver ("ignoring unsafe
            // symlink"): nothing is made, and what is there under its name
            // stays (the name was noted for `--delete` above).
            self.answers.send(e.index, Ok(()));
            return Ok(Created::Done(arrivals.announce(e.index, Shape::Other)?));
        }
        if self.opts.dry_run {
            return self.dry(arrivals, e, &xattrs).map(Created::Done);
        }
        if self.opts.itemize != Itemize::Off && e.kind != EntryKind::File {
            let there = existing::there(self.base, &e);
            self.item(&e, there.as_ref(), false);
        }
        // What to do with a file whose name is there already (re-sync).
        let (decision, there) = match e.kind {
            // (Skipped as a file whose metadata was found right.)
            EntryKind::File if unchanged => {
                if let Cleared::Unchanged { id: Some(id) } = cleared
                    && self.opts.keep.hard_links
                    && self.unchanged_linked.len() < MOST_UNCHANGED_LINKED
                {
                    self.unchanged_linked.insert(e.path.clone(), id);
                }
                (Decision::Skip { metadata: false }, None)
            }
            EntryKind::File if self.opts.policy.asks() => {
                let (found, st) = existing::look(self.base, &e)?;
                let decision = match (self.opts.policy.decide(&e, found), &st) {
                    // With `--link-dest`, a file there of several names may
                    // be an older snapshot's too: its metadata is not
                    // changed in place (the snapshot's would change), it
                    // is sent again (rsync changes it).
                    (Decision::Skip { metadata: true }, Some(st))
                        if st.st_nlink > 1
                            && !self.base.link_dests().is_empty()
                            && !self.base.place(&e.path).is_ok_and(|placed| {
                                existing::metadata_right(
                                    self.base, &placed, &e, &xattrs, self.how, st,
                                )
                                .unwrap_or(false)
                            }) =>
                    {
                        Decision::Send
                    }
                    (decision, _) => decision,
                };
                (decision, st)
            }
            _ => (Decision::Send, None),
        };
        // `--link-dest`: a file to send that a tree there holds unchanged,
        // metadata and all, is linked from it instead.
        if e.kind == EntryKind::File
            && matches!(decision, Decision::Send | Decision::Compare)
            && self.linked_from_dest(&e, &xattrs)
        {
            return self.pass_over(arrivals, &e).map(Created::Done);
        }
        // A file compared chunk by chunk is named once it is known to
        // differ (when it is finished).
        let mut there_itemized = None;
        if self.opts.itemize != Itemize::Off && e.kind == EntryKind::File {
            let there = existing::there(self.base, &e);
            match decision {
                Decision::Compare => there_itemized = Some(there),
                Decision::Skip { metadata: false } => {}
                d => self.item(&e, there.as_ref(), d == Decision::Send),
            }
        }
        let shape = match (e.kind, decision) {
            (EntryKind::File, Decision::Send | Decision::Compare) => Shape::File {
                size: e.size,
                chunk: e.chunk,
                sent: end.map(|(sent, _)| sent),
            },
            (EntryKind::File, Decision::Skip { .. }) if self.opts.passing => Shape::Passing {
                size: e.size,
                chunk: e.chunk,
            },
            _ => Shape::Other,
        };
        let actions = arrivals.announce(e.index, shape)?;
        match e.kind {
            EntryKind::File => {
                self.files += 1;
                self.progress.file();
                if let Decision::Skip { metadata } = decision {
                    let r = match &there {
                        Some(st) if metadata => {
                            existing::refresh(self.base, &e, &xattrs, self.how, st)
                        }
                        _ => Ok(()),
                    };
                    match r {
                        Ok(()) => {
                            self.skipped += 1;
                            self.progress.there_already(1);
                            self.answer_file(e.index, Said::Nothing);
                        }
                        Err(err) if self.opts.passing => {
                            let (kind, reason) = failed(&err);
                            let path = tree::show(&e.path);
                            self.failed_here.push(Failure { path, kind, reason });
                            self.answer_file(e.index, Said::Nothing);
                        }
                        Err(err) => self.entry_failed(&e, &err),
                    }
                    return Ok(Created::Done(actions));
                }
                // A basis that cannot be read is no basis: all is sent.
                let basis = match decision {
                    Decision::Compare if !self.opts.resume => {
                        existing::open_regular(self.base, &e).ok()
                    }
                    _ => None,
                };
                return Ok(Created::Open(Box::new(ToOpen {
                    e,
                    xattrs,
                    end,
                    basis,
                    asks,
                    there_itemized,
                    actions,
                })));
            }
            EntryKind::Dir => {
                let r = self.base.make_dir(&e).map_err(|err| failed(&err));
                let failed = r.is_err();
                self.answers.send(e.index, r);
                if failed {
                    bail!("cannot create directory {}", tree::show(&e.path));
                }
                self.dirs.push((e, xattrs));
            }
            // A re-sync leaves what is there as it would be made.
            EntryKind::Symlink
            | EntryKind::Fifo
            | EntryKind::Socket
            | EntryKind::CharDevice
            | EntryKind::BlockDevice
                if unchanged || existing::in_place(self.base, &e, &xattrs, self.how) =>
            {
                self.answers.send(e.index, Ok(()));
            }
            EntryKind::Symlink
            | EntryKind::Fifo
            | EntryKind::Socket
            | EntryKind::CharDevice
            | EntryKind::BlockDevice
                if !self.base.link_dests().is_empty()
                    && !existing::in_place(self.base, &e, &xattrs, self.how)
                    && self.linked_from_dest(&e, &xattrs) =>
            {
                self.answers.send(e.index, Ok(()));
            }
            EntryKind::Symlink => match self.base.make_symlink(&e, &xattrs, self.how) {
                Ok(()) => self.answers.send(e.index, Ok(())),
                Err(err) => self.entry_failed(&e, &err),
            },
            // (`--ignore-existing`: another name there is left as it is,
            // not linked again to what its file's first name is there.)
            EntryKind::HardLink if self.opts.policy.ignore_existing && !self.absent(&e.path) => {
                self.answers.send(e.index, Ok(()));
            }
            // Linked there already to its first name's file, which was
            // found unchanged (and so stays): as it would be linked.
            EntryKind::HardLink
                if matches!(cleared, Cleared::OtherName(id)
                    if self.unchanged_linked.get(&e.target) == Some(&id)) =>
            {
                self.other_names_linked += 1;
                self.answers.send(e.index, Ok(()));
            }
            EntryKind::HardLink => self.hard_links.push(e),
            _ => match self.base.make_special(&e, &xattrs, self.how) {
                Ok(()) => self.answers.send(e.index, Ok(())),
                Err(err) => self.entry_failed(&e, &err),
            },
        }
        Ok(Created::Done(actions))
    }

    /// The temporary file of a file [`Creator::create`] left to open; the
    /// actions it had found.
    async fn open(
        &mut self,
        files: &mut HashMap<u32, File>,
        o: Box<ToOpen>,
    ) -> anyhow::Result<Vec<Action<Arc<Chunk>>>> {
        let mut file = self
            .open_file(o.e, o.xattrs, o.end, o.basis, o.asks)
            .await?;
        file.itemize = o.there_itemized.map(|there| (there, self.kept()));
        files.insert(file.entry.index, file);
        Ok(o.actions)
    }
}

impl Creator<'_> {
    /// Entry `e` failed here: the sender is told, and so is whoever reads
    /// this side's failures (the user, in a pull; a broadcast's report).
    /// (Without the second, a symlink that could not be made in a pull
    /// was said nowhere, and the copy ended with status 0.)
    fn entry_failed(&mut self, e: &Entry, err: &anyhow::Error) {
        let (kind, reason) = failed(err);
        self.answers.send(e.index, Err((kind, reason.clone())));
        self.failed_here.push(Failure {
            path: tree::show(&e.path),
            kind,
            reason,
        });
    }

    /// What this node needs of file `index`: to the sender, or, in a
    /// chain that merges answers, to be merged with the next node's.
    fn answer_file(&self, index: u32, said: Said) {
        match &self.merging {
            Some(m) => m.own(index, said),
            None => self.answers.said(index, said),
        }
    }

    /// What `-i` compares.
    fn kept(&self) -> Kept {
        Kept {
            times: self.opts.preserve.times,
            window: self.opts.policy.times,
            perms: self.opts.preserve.modes,
            owner: self.opts.keep.owner,
            group: self.opts.keep.group,
        }
    }

    /// `-i`: names entry `e` if something changes (`sent`: its data).
    fn item(&self, e: &Entry, there: Option<&There>, sent: bool) {
        if self.opts.itemize == Itemize::Off {
            return;
        }
        let mut kept = self.kept();
        // (Times not set are not differences.)
        kept.times &= e.kind != EntryKind::Dir || self.dir_times;
        if let Some(code) = resync::itemize(e, there, sent, kept) {
            self.answers.itemized(code, itemized_name(e));
        }
    }

    /// `-n`: what would be done with `e`, reported, and nothing done: a
    /// file is answered as skipped (no data comes), anything else as in
    /// place; directories are kept to list what `--delete` would remove.
    fn dry(
        &mut self,
        arrivals: &mut Arrivals<Arc<Chunk>>,
        e: Entry,
        xattrs: &[Xattr],
    ) -> anyhow::Result<Vec<Action<Arc<Chunk>>>> {
        let actions = arrivals.announce(e.index, Shape::Other)?;
        let there = existing::there(self.base, &e);
        // What a run would remove to make way for an entry it makes is
        // named; where it could not, a run would fail the entry, and so
        // does this one (a file is said not to make way, and is counted
        // skipped, as all files of a dry run).
        let in_the_way =
            e.kind != EntryKind::Dir && there.as_ref().is_some_and(|t| t.kind == EntryKind::Dir);
        let make_way = |this: &Self| match in_the_way {
            true => this.base.would_make_way(&e),
            false => Ok(()),
        };
        // (What a run would link from a `--link-dest` is named by none.)
        let linked =
            |this: &Self| e.kind != EntryKind::Dir && this.link_dest_holding(&e, xattrs).is_some();
        match e.kind {
            EntryKind::File => {
                self.files += 1;
                self.skipped += 1;
                self.progress.file();
                let found = match &there {
                    None => Found::Nothing,
                    Some(t) if t.kind == EntryKind::File => Found::File {
                        size: t.size,
                        mtime: t.mtime,
                    },
                    Some(_) => Found::Other,
                };
                match self.opts.policy.decide(&e, found) {
                    Decision::Skip { metadata: false } => {}
                    Decision::Skip { metadata: true } => self.item(&e, there.as_ref(), false),
                    Decision::Send | Decision::Compare if linked(self) => {}
                    Decision::Send | Decision::Compare => match make_way(self) {
                        Ok(()) => self.item(&e, there.as_ref(), true),
                        Err(err) => eprintln!("rcp: {}: {err:#}", tree::show(&e.path)),
                    },
                }
                self.answers.skipped(e.index);
            }
            kind => {
                // (Where nothing could be linked, nothing more is looked at.)
                let linked = linked(self);
                if let Err(err) = make_way(self) {
                    self.entry_failed(&e, &err);
                    return Ok(actions);
                }
                if !linked || existing::in_place(self.base, &e, xattrs, self.how) {
                    self.item(&e, there.as_ref(), false);
                }
                self.answers.send(e.index, Ok(()));
                if kind == EntryKind::Dir {
                    self.dirs.push((e, Vec::new()));
                }
            }
        }
        Ok(actions)
    }

    /// The temporary file of `e`, once no other copy holds it; without
    /// modes kept, of the mode of the file it replaces
    /// ([`Base::create_file`]).
    async fn part_file(&self, e: &Entry, leftover: Leftover) -> anyhow::Result<PartFile> {
        let replaces = match self.opts.preserve.modes {
            true => None,
            false => self.base.replaced_mode(e)?,
        };
        let since = tokio::time::Instant::now();
        loop {
            match self.base.create_file(e, leftover, replaces)? {
                Opened::Ready(out) => return Ok(out),
                Opened::Busy => {
                    if let Some(limit) = self.opts.busy_wait
                        && since.elapsed() >= limit
                    {
                        bail!(
                            "another copy is still writing to its temporary file after {} s",
                            limit.as_secs()
                        );
                    }
                    tokio::time::sleep(BUSY_POLL).await;
                }
            }
        }
    }

    /// The temporary file of entry `e`; with resume, what `--partial`
    /// kept of it, or a `basis` to compare with, the sender is told the
    /// digests of what is there (else, where it `asks`, that all of it is
    /// wanted).
    async fn open_file(
        &mut self,
        e: Entry,
        xattrs: Vec<Xattr>,
        end: Option<(u64, [u8; 32])>,
        basis: Option<OwnedFd>,
        asks: bool,
    ) -> anyhow::Result<File> {
        // (What `--partial` kept is taken up only where the sender waits
        // for an answer, the whole file coming otherwise; and not where
        // `-c` compares with the file there, which stays if equal.)
        let take_up = self.opts.partial && asks && basis.is_none();
        let leftover = match (self.opts.resume, take_up) {
            (true, _) => Leftover::Resume,
            (false, true) => Leftover::TakeUp,
            (false, false) => Leftover::Discard,
        };
        let out = match self.part_file(&e, leftover).await {
            Ok(out) => Arc::new(out),
            Err(err) => {
                self.answers.send(e.index, Err(failed(&err)));
                bail!("{}: {err:#}", tree::show(&e.path));
            }
        };
        let alg = self.opts.digest;
        let (size, chunk) = (e.size, e.chunk);
        let (basis, digests) = if self.opts.resume || out.taken_up() {
            let o = Arc::clone(&out);
            let d = tokio::task::spawn_blocking(move || o.existing_digests(size, chunk, alg));
            (None, Some(d.await??))
        } else if let Some(fd) = basis {
            let d = tokio::task::spawn_blocking(move || {
                existing::chunk_digests(&fd, size, chunk, alg).map(|d| (fd, d))
            });
            let (fd, d) = d.await??;
            (Some(fd), Some(d))
        } else {
            (None, None)
        };
        let known = match digests {
            Some(digests) => {
                let known = digests.iter().copied().map(Some).collect();
                self.answer_file(e.index, Said::Have(digests));
                known
            }
            None => {
                if asks {
                    self.answer_file(e.index, Said::All);
                }
                Vec::new()
            }
        };
        Ok(File {
            entry: e,
            xattrs,
            out,
            writes: Vec::new(),
            known,
            digest: end.map(|(_, digest)| digest),
            basis,
            itemize: None,
        })
    }
}

/// Starts the hash and write of a landed chunk, chunk `k` of `file`.
fn land(
    file: &mut File,
    chunk: Arc<Chunk>,
    k: u64,
    engine: &Engine,
    opts: RecvOptions,
    stats: &mut Stats,
    progress: &Progress,
) {
    let len = u64::from(chunk.header().payload_len);
    stats.bytes += len;
    progress.add(len);
    let verify = opts.verify.then_some(opts.digest);
    let task = write_chunk(engine.clone(), Arc::clone(&file.out), chunk, k, verify);
    file.writes.push(Started::start(task));
}

async fn write_chunk(
    engine: Engine,
    out: Arc<PartFile>,
    chunk: Arc<Chunk>,
    k: u64,
    verify: Option<Algorithm>,
) -> ChunkResult {
    let h = *chunk.header();
    let (chunk, digest) = if let Some(alg) = verify {
        let (chunk, digest) = if chunk.payload().len() <= crate::tuning::hash_in_place() {
            let d = alg.chunk(chunk.payload());
            (chunk, d)
        } else {
            // Hash off the I/O path; the chunk (and its slot) moves along.
            tokio::task::spawn_blocking(move || {
                let d = alg.chunk(chunk.payload());
                (chunk, d)
            })
            .await?
        };
        // The link checked the header's seal (the digest with it): what is
        // left to check is that the payload is what the digest says.
        if h.flags & chunk_flags::DIGEST == 0 || digest != h.digest {
            return Err(Corrupted(format!(
                "chunk at offset {} arrived corrupted (digest mismatch)",
                h.offset
            ))
            .into());
        }
        (chunk, digest)
    } else {
        (chunk, [0; 32])
    };
    // The write owns the chunk: its slot (and credit) is released only
    // once the write is done, even if this task is cancelled.
    let len = chunk.payload().len();
    let (chunk, written) = engine.write_all(&out, h.offset, chunk, 0, len, false).await;
    drop(chunk);
    written.with_context(|| format!("writing at offset {}", h.offset))?;
    Ok((k, digest))
}

/// Waits for a file's writes, checks its digest, commits it, answers.
async fn finish_file(
    answers: Answers,
    engine: Engine,
    file: File,
    opts: RecvOptions,
    how: Fidelity,
    syncs: Arc<std::sync::Mutex<DirSyncs>>,
) -> Verdict {
    let File {
        entry,
        xattrs,
        out,
        writes,
        known,
        digest,
        basis,
        itemize,
    } = file;
    let digest = digest.expect("finished files have ended");
    let from_basis = known.len();
    let mut chunks = known;
    let mut received = Vec::new();
    let mut error: Option<(FailKind, String)> = None;
    for w in writes {
        match w.wait().await {
            Ok(Ok((k, d))) => {
                received.push(k);
                if chunks.len() <= k as usize {
                    chunks.resize(k as usize + 1, None);
                }
                chunks[k as usize] = Some(d);
            }
            Ok(Err(e)) => {
                error.get_or_insert(failed(&e));
            }
            Err(e) => {
                error.get_or_insert((FailKind::Other, e.to_string()));
            }
        }
    }
    let out = Arc::try_unwrap(out).expect("all writes done");
    if error.is_none() && opts.verify {
        let mine = opts.digest.file_digest(entry.size, entry.chunk, &chunks);
        if mine != digest {
            error = Some((
                FailKind::Corrupted,
                format!(
                    "file digest mismatch (sender {}, received {})",
                    digest::hex(&digest),
                    digest::hex(&mine)
                ),
            ));
        }
    }
    let count = entry.size.div_ceil(u64::from(entry.chunk.max(1)));
    let mut unchanged = false;
    let result = match (error, basis) {
        (Some(e), _) => {
            out.discard();
            Err(e)
        }
        (None, Some(basis)) => {
            // Compared chunk by chunk: the old file stays if nothing was
            // sent and nothing was missing; else the new one is the old
            // one's equal chunks and the chunks sent.
            let same = received.is_empty()
                && from_basis as u64 == count
                && rustix::fs::fstat(&basis).is_ok_and(|st| st.st_size as u64 == entry.size);
            if let Some((there, kept)) = &itemize {
                let code = resync::itemize(&entry, there.as_ref(), !same, *kept);
                if let Some(code) = code {
                    answers.itemized(code, entry.path.clone());
                }
            }
            if same {
                out.discard();
                unchanged = true;
                existing::refresh_fd(&basis, &entry, &xattrs, how).map_err(|e| failed(&e))
            } else {
                received.sort_unstable();
                let keep: Vec<u64> = (0..from_basis as u64)
                    .filter(|k| received.binary_search(k).is_err())
                    .collect();
                let filled = existing::fill_from(&basis, &out, &keep, entry.size, entry.chunk);
                match filled {
                    Ok(()) => out
                        .commit(&entry, &xattrs, how, false, &engine)
                        .await
                        .map(|dir| syncs.lock().expect("dir lock").add(dir))
                        .map_err(|e| failed(&e)),
                    Err(e) => {
                        out.discard();
                        Err(failed(&e))
                    }
                }
            }
        }
        (None, None) => {
            // (A file `-c` would have compared, with no file there it
            // could read: named as sent.)
            if let Some((there, kept)) = &itemize
                && let Some(code) = resync::itemize(&entry, there.as_ref(), true, *kept)
            {
                answers.itemized(code, entry.path.clone());
            }
            // Whether the last chunk was written (then the file ends where it
            // should; else its tail is a hole still to be sized).
            let sized = count == 0 || chunks.get(count as usize - 1).is_some_and(Option::is_some);
            out.commit(&entry, &xattrs, how, sized, &engine)
                .await
                // One open fd per distinct directory, not per file.
                .map(|dir| syncs.lock().expect("dir lock").add(dir))
                .map_err(|e| failed(&e))
        }
    };
    match result {
        Ok(()) => {
            answers.send(entry.index, Ok(()));
            Ok(Finished {
                digest: opts.verify.then(|| (tree::show(&entry.path), digest)),
                unchanged,
            })
        }
        Err((kind, reason)) => {
            answers.send(entry.index, Err((kind, reason.clone())));
            Err(Failure {
                path: tree::show(&entry.path),
                kind,
                reason,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_lines_name_what_rsyncs_verbose_names() {
        let line = |code: &str, name: &str, lines| {
            itemized_line(code.as_bytes().try_into().unwrap(), name.as_bytes(), lines)
        };
        let v = Lines::Names;
        assert_eq!(line(">f+++++++++", "a/new", v).as_deref(), Some("a/new"));
        assert_eq!(
            line(">f.st......", "a/changed", v).as_deref(),
            Some("a/changed")
        );
        assert_eq!(line("cd+++++++++", "a/dir/", v).as_deref(), Some("a/dir/"));
        assert_eq!(line("cL+++++++++", "l -> t", v).as_deref(), Some("l -> t"));
        assert_eq!(line("hf+++++++++", "b => a", v).as_deref(), Some("b => a"));
        assert_eq!(
            line("*deleting  ", "gone/", v).as_deref(),
            Some("deleting gone/")
        );
        assert_eq!(line(".d..t......", "a/", v).as_deref(), Some("a/"));
        assert_eq!(line(".f...p.....", "a/mode-only", v), None);
        assert_eq!(line(".L..t......", "l -> t", v), None);
        assert_eq!(
            line(".f...p.....", "a/mode-only", Lines::Codes).as_deref(),
            Some(".f...p..... a/mode-only")
        );
    }

    #[test]
    fn on_one_thread_a_task_without_a_wait_ends_here_and_one_that_waits_runs_on() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(matches!(Started::start(async { 7 }), Started::Done(7)));
            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            let waiting = Started::start(async move { rx.await.unwrap() + 1 });
            assert!(matches!(waiting, Started::Running(_)));
            // The waker it was first polled with wakes nobody: the
            // runtime's must reach it.
            tx.send(41).unwrap();
            assert_eq!(waiting.wait().await.unwrap(), 42);
        });
    }

    #[test]
    fn on_several_threads_every_task_is_spawned() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(async {
            let started = Started::start(async { 7 });
            assert!(matches!(started, Started::Running(_)));
            assert_eq!(started.wait().await.unwrap(), 7);
        });
    }
}
