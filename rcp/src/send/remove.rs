//! `--remove-source-files`: the sender removes what it copied, once the
//! copy is over and the receiver's copy of it is verified and durable.
//!
//! Which entries: every non-directory (files, symlinks, special files,
//! other names of a file with `-H`) that the receiver put in place, or
//! found there unchanged by the copy's check, as rsync removes them.
//! Directories stay, as with rsync. Not removed:
//!
//! - what failed, at any point (an entry answered in place and failed
//!   later, as a skipped file whose metadata could not be set, stays too);
//! - a file skipped under `--ignore-existing` or `--update`: the receiver's
//!   answer does not say whether the file there is equal or only there
//!   (rsync removes the equal ones; rcp keeps both);
//! - what changed since it was sent: another type, another size or
//!   modification time (rsync's check), said and left in place;
//! - a symlink followed (`-L`): what it points to was sent, not it;
//! - a file outside `--min-size`..`--max-size`, and its other names;
//! - everything, after a dry run, or a copy that stopped.
//!
//! When: after the receiver's last answer, which it gives only once every
//! file is renamed into place and, with this option, its file system
//! synced whole (`recv::RecvOptions::sync_all`): a source is never gone
//! before its copy would survive a crash. Not as each file arrives, as
//! rsync does: the receiver syncs at the end. So the names of what is to
//! go are kept until then (its path and about 70 bytes an entry, as the
//! hard-link map keeps its names). Where any entry is left unanswered,
//! nothing goes.
//!
//! Which source an entry came from is told by its first component, the
//! operand's name on the other side; two operands arriving under one
//! name are refused ([`SameName`]), and so is a local copy onto a source
//! itself (`app::onto_itself`).
//!
//! How: beneath the operand it came from, by descriptor, one directory at
//! a time and never through a symlink (`tree::open_dir_beneath`), so that
//! a directory replaced by a symlink since the walk leads nowhere else.
//! The bookkeeping ([`Removals`]) is sans I/O; [`remove`] does the I/O.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::Mutex;

use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;

use crate::proto::{Entry, EntryKind, FailKind};
use crate::report::Failure;
use crate::resync::{Policy, Sizes};
use crate::tree;

use super::Sources;

/// What an entry was when it was sent, to tell whether it changed since.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    path: Vec<u8>,
    kind: EntryKind,
    /// A file's (another name of one, `-H`, has none in its entry).
    size: Option<u64>,
    mtime: (i64, u32),
}

/// The entries to remove once the copy is over: announced, then answered
/// in place (or failed), in the order they were announced.
#[derive(Debug, Default)]
pub(super) struct Removals {
    state: Mutex<State>,
    /// Whether a file the receiver skipped was found equal: not under
    /// `--ignore-existing` or `--update`, whose skips may be files that
    /// differ.
    skipped_are_equal: bool,
    /// `--min-size`, `--max-size`: a file outside them is left alone
    /// there, and stays here.
    sizes: Sizes,
}

#[derive(Debug, Default)]
struct State {
    /// Announced and not yet answered.
    pending: HashMap<u32, Sent>,
    /// Answered in place, by entry index (in order of announcement).
    in_place: Vec<(u32, Sent)>,
    /// Failed after an answer in place.
    failed: HashSet<u32>,
    /// Files left out by their size: their other names (`-H`) stay too.
    left_out: HashSet<Vec<u8>>,
}

impl Removals {
    pub(super) fn new(policy: Policy) -> Removals {
        Removals {
            state: Mutex::default(),
            skipped_are_equal: !policy.ignore_existing && !policy.update,
            sizes: policy.sizes,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("removals lock")
    }

    /// An entry about to be sent.
    pub(super) fn announced(&self, e: &Entry) {
        let mut st = self.state();
        match e.kind {
            EntryKind::Dir => return,
            EntryKind::File if !self.sizes.admit(e.size) => {
                st.left_out.insert(e.path.clone());
                return;
            }
            EntryKind::HardLink if st.left_out.contains(&e.target) => return,
            _ => {}
        }
        let sent = Sent {
            path: e.path.clone(),
            kind: e.kind,
            size: (e.kind == EntryKind::File).then_some(e.size),
            mtime: (e.mtime_sec, e.mtime_nsec),
        };
        st.pending.insert(e.index, sent);
    }

    /// The receiver put these in place.
    pub(super) fn in_place(&self, indices: &[u32]) {
        let mut st = self.state();
        for index in indices {
            if let Some(sent) = st.pending.remove(index) {
                st.in_place.push((*index, sent));
            }
        }
    }

    /// The receiver skipped these: there already.
    pub(super) fn skipped(&self, indices: &[u32]) {
        if self.skipped_are_equal {
            self.in_place(indices);
        } else {
            let mut st = self.state();
            for index in indices {
                st.pending.remove(index);
            }
        }
    }

    /// The receiver failed this one (it may have been answered before).
    pub(super) fn failed(&self, index: u32) {
        let mut st = self.state();
        if st.pending.remove(&index).is_none() {
            st.failed.insert(index);
        }
    }

    /// What is to be removed, in the order it was sent (taken: once);
    /// or, where the receiver left entries unanswered (every entry gets
    /// one answer: something went wrong), how many, and nothing.
    fn to_remove(&self) -> Result<Vec<Sent>, usize> {
        let st = std::mem::take(&mut *self.state());
        if !st.pending.is_empty() {
            return Err(st.pending.len());
        }
        Ok(st
            .in_place
            .into_iter()
            .filter(|(index, _)| !st.failed.contains(index))
            .map(|(_, sent)| sent)
            .collect())
    }
}

/// Where the sent entries are on disk: each operand's directory, its name
/// there and its name on the other side; or `--files-from`'s directory.
#[derive(Debug)]
pub struct Origins {
    operands: Vec<(OwnedFd, Vec<u8>, Vec<u8>)>,
    listed: Option<OwnedFd>,
}

/// Two sources arrive under one name: one would replace the other at
/// the destination (or, a directory and a file, make way for it), and
/// which of them an entry came from cannot be told (so neither could be
/// removed by `--remove-source-files`).
#[derive(Debug, thiserror::Error)]
#[error(
    "two sources arrive as {0:?}: one would replace the other; copy them apart, or into \
     destinations of their own"
)]
pub struct SameName(pub String);

/// Refuses `sources` where two operands arrive under one name.
pub fn one_name_each(sources: &Sources) -> Result<(), SameName> {
    if let Sources::Operands(ops) = sources {
        let mut tops = HashSet::new();
        if let Some(s) = ops.iter().find(|s| !tops.insert(&s.top)) {
            return Err(SameName(tree::show(&s.top)));
        }
    }
    Ok(())
}

impl Origins {
    /// The directories of `sources`, held apart from the walk's; refused
    /// where two operands arrive under one name.
    pub fn of(sources: &Sources) -> anyhow::Result<Origins> {
        Ok(match sources {
            Sources::Operands(ops) => {
                one_name_each(sources)?;
                Origins {
                    operands: ops
                        .iter()
                        .map(|s| Ok((rustix::io::dup(&s.parent)?, s.name.clone(), s.top.clone())))
                        .collect::<rustix::io::Result<_>>()?,
                    listed: None,
                }
            }
            Sources::Listed { base, .. } => Origins {
                operands: Vec::new(),
                listed: Some(rustix::io::dup(base)?),
            },
        })
    }

    /// The operand entry path `path` came from (by its place among them),
    /// its directory, and the path's components beneath that. (Names on
    /// the other side are one component, and no two alike: one matches.)
    fn locate<'a>(&'a self, path: &'a [u8]) -> Option<(usize, &'a OwnedFd, Vec<&'a [u8]>)> {
        let parts = |p: &'a [u8]| p.split(|&b| b == b'/').filter(|c| !c.is_empty());
        if let Some(base) = &self.listed {
            return Some((0, base, parts(path).collect()));
        }
        self.operands
            .iter()
            .enumerate()
            .find_map(|(k, (dir, name, top))| {
                let rest = path.strip_prefix(&top[..])?;
                if !(rest.is_empty() || rest.starts_with(b"/")) {
                    return None;
                }
                Some((
                    k,
                    dir,
                    std::iter::once(&name[..]).chain(parts(rest)).collect(),
                ))
            })
    }
}

/// Removes what `removals` holds, each where `origins` says it is, once
/// checked unchanged; `dry_run` removes nothing. What changed is said on
/// stderr and left; what could not be removed is returned, failed.
pub(super) fn remove(removals: &Removals, origins: &Origins, dry_run: bool) -> Vec<Failure> {
    let mut failed = Vec::new();
    if dry_run {
        return failed;
    }
    // (Entries come in walk order: the directory of the one before is
    // most often the next one's too.)
    let to_remove = match removals.to_remove() {
        Ok(to_remove) => to_remove,
        Err(unanswered) => {
            failed.push(Failure {
                path: "--remove-source-files".into(),
                kind: FailKind::Other,
                reason: format!(
                    "the receiver did not answer {unanswered} entries: no source was removed"
                ),
            });
            return failed;
        }
    };
    let mut last: Option<((usize, Vec<u8>), OwnedFd)> = None;
    for sent in to_remove {
        let shown = tree::show(&sent.path);
        let Some((operand, root, parts)) = origins.locate(&sent.path) else {
            continue;
        };
        let Some((name, dirs)) = parts.split_last() else {
            continue;
        };
        let dir_key = (operand, dirs.join(&b'/'));
        let dir = match &last {
            Some((key, fd)) if *key == dir_key => fd,
            _ => match tree::open_dir_beneath(root, dirs) {
                Ok(fd) => &last.insert((dir_key, fd)).1,
                // A directory on the way is a symlink (one followed with
                // `-L`, or one put there since) or gone: nothing beneath
                // it is the source that was sent.
                Err(e)
                    if e.errno().is_some_and(|e| {
                        [Errno::LOOP, Errno::NOENT, Errno::NOTDIR].contains(&e)
                    }) =>
                {
                    continue;
                }
                Err(e) => {
                    failed.push(cannot_remove(shown, format!("{e:#}")));
                    continue;
                }
            },
        };
        let Ok(cname) = CString::new(*name) else {
            continue;
        };
        let st = match rustix::fs::statat(dir, &cname, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // (Gone already: nothing to remove.)
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => {
                failed.push(cannot_remove(shown, e.to_string()));
                continue;
            }
        };
        // (A symlink sent as what it points to, `-L`: the symlink stays.)
        let followed = FileType::from_raw_mode(st.st_mode) == FileType::Symlink
            && sent.kind != EntryKind::Symlink;
        if followed {
            continue;
        }
        if !unchanged(&sent, &st) {
            eprintln!("rcp: {shown} changed since it was sent: not removed from the source");
            continue;
        }
        if let Err(e) = rustix::fs::unlinkat(dir, &cname, AtFlags::empty()) {
            failed.push(cannot_remove(shown, e.to_string()));
        }
    }
    failed
}

fn cannot_remove(path: String, why: String) -> Failure {
    Failure {
        path,
        kind: FailKind::Io,
        reason: format!("cannot remove it from the source: {why}"),
    }
}

/// Whether what is there now is what was sent: the same type, size and
/// modification time (rsync's check before it removes a source file).
fn unchanged(sent: &Sent, st: &rustix::fs::Stat) -> bool {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Symlink => EntryKind::Symlink,
        FileType::Fifo => EntryKind::Fifo,
        FileType::Socket => EntryKind::Socket,
        FileType::CharacterDevice => EntryKind::CharDevice,
        FileType::BlockDevice => EntryKind::BlockDevice,
        _ => return false,
    };
    let same_kind =
        kind == sent.kind || sent.kind == EntryKind::HardLink && kind == EntryKind::File;
    let same_size = sent.size.is_none_or(|size| size == st.st_size as u64);
    same_kind && same_size && (st.st_mtime, st.st_mtime_nsec as u32) == sent.mtime
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, kind: EntryKind, path: &str) -> Entry {
        Entry {
            index,
            kind,
            mode: 0o644,
            mtime_sec: 1_700_000_000,
            mtime_nsec: 5,
            size: 10,
            path: path.into(),
            target: Vec::new(),
            chunk: 0,
            meta: None,
        }
    }

    fn paths(r: &Removals) -> Vec<String> {
        r.to_remove()
            .unwrap()
            .into_iter()
            .map(|s| String::from_utf8(s.path).unwrap())
            .collect()
    }

    #[test]
    fn only_what_was_answered_in_place_and_never_failed_goes_and_no_directory() {
        let r = Removals::new(Policy::default());
        for (i, kind, p) in [
            (0, EntryKind::Dir, "d"),
            (1, EntryKind::File, "d/a"),
            (2, EntryKind::File, "d/b"),
            (3, EntryKind::Symlink, "d/l"),
            (4, EntryKind::File, "d/c"),
            (5, EntryKind::HardLink, "d/h"),
        ] {
            r.announced(&entry(i, kind, p));
        }
        r.in_place(&[0, 1, 3]);
        r.failed(2);
        r.skipped(&[4, 5]);
        // (Answered in place, then failed: a skipped file's metadata.)
        r.failed(4);
        assert_eq!(paths(&r), ["d/a", "d/l", "d/h"]);
        assert!(paths(&r).is_empty(), "taken once");
    }

    #[test]
    fn nothing_goes_where_an_entry_was_never_answered() {
        let r = Removals::new(Policy::default());
        r.announced(&entry(0, EntryKind::File, "a"));
        r.announced(&entry(1, EntryKind::File, "never-answered"));
        r.in_place(&[0]);
        assert_eq!(r.to_remove(), Err(1));
    }

    #[test]
    fn files_left_out_by_their_size_stay_with_their_other_names() {
        let r = Removals::new(Policy {
            sizes: Sizes { min: 0, max: 9 },
            ..Policy::default()
        });
        let mut other_name = entry(1, EntryKind::HardLink, "other-name");
        other_name.target = b"big".to_vec();
        r.announced(&entry(0, EntryKind::File, "big"));
        r.announced(&other_name);
        let mut small = entry(2, EntryKind::File, "small");
        small.size = 9;
        r.announced(&small);
        r.skipped(&[0, 2]);
        r.in_place(&[1]);
        assert_eq!(paths(&r), ["small"]);
    }

    #[test]
    fn files_skipped_under_ignore_existing_or_update_stay() {
        for policy in [
            Policy {
                ignore_existing: true,
                ..Policy::default()
            },
            Policy {
                update: true,
                ..Policy::default()
            },
        ] {
            let r = Removals::new(policy);
            r.announced(&entry(0, EntryKind::File, "a"));
            r.announced(&entry(1, EntryKind::File, "b"));
            r.skipped(&[0]);
            r.in_place(&[1]);
            assert_eq!(paths(&r), ["b"], "{policy:?}");
        }
    }

    #[test]
    fn an_entry_path_is_found_beneath_its_operand_by_its_name_there() {
        let dir = || rustix::fs::open("/", rustix::fs::OFlags::RDONLY, 0.into()).unwrap();
        let o = Origins {
            operands: vec![
                (dir(), b"src".to_vec(), b"renamed".to_vec()),
                (dir(), b"file".to_vec(), b"file".to_vec()),
            ],
            listed: None,
        };
        let at = |p: &[u8]| o.locate(p).map(|(k, _, parts)| (k, parts.join(&b'/')));
        assert_eq!(at(b"renamed/x/y"), Some((0, b"src/x/y".to_vec())));
        assert_eq!(at(b"file"), Some((1, b"file".to_vec())));
        assert_eq!(
            at(b"renamedx/y"),
            None,
            "a longer name is another operand's"
        );
        assert_eq!(at(b"other"), None);
        let listed = Origins {
            operands: Vec::new(),
            listed: Some(dir()),
        };
        let at = |p: &[u8]| listed.locate(p).map(|(_, _, parts)| parts.join(&b'/'));
        assert_eq!(at(b"x/y"), Some(b"x/y".to_vec()));
    }

    #[test]
    fn a_source_that_changed_since_it_was_sent_is_not_unchanged() {
        let t = test_support::Scratch::new("rcp-remove-unchanged");
        let f = t.path("f");
        std::fs::write(&f, b"0123456789").unwrap();
        let st = rustix::fs::lstat(&f).unwrap();
        let mut sent = Sent {
            path: b"f".to_vec(),
            kind: EntryKind::File,
            size: Some(10),
            mtime: (st.st_mtime, st.st_mtime_nsec as u32),
        };
        assert!(unchanged(&sent, &st));
        sent.kind = EntryKind::HardLink;
        sent.size = None;
        assert!(unchanged(&sent, &st), "another name: the mtime alone");
        sent.kind = EntryKind::Symlink;
        assert!(!unchanged(&sent, &st), "another type");
        sent.kind = EntryKind::File;
        sent.size = Some(11);
        assert!(!unchanged(&sent, &st), "another size");
        sent.size = Some(10);
        sent.mtime.1 = sent.mtime.1.wrapping_add(1);
        assert!(!unchanged(&sent, &st), "another time");
    }
}
