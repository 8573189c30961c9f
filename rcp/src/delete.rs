//! `--delete`: what the destination has that the source does not is
//! removed, after the copy and only if all of it succeeded (rsync's
//! `--delete-after`: a failed copy deletes nothing extraneous).
//!
//! The same removal clears a directory in the way of an entry of another
//! kind as the entry is put in place ([`InTheWay`], with `--delete` or
//! `--force`): that is the entry's own making, not a deletion of what the
//! source lacks, and happens during the copy, as rsync's.
//!
//! Only directories the copy sent are cleaned, and only their entries the
//! sender did not name. Removal works on directory descriptors opened
//! beneath the destination without following symlinks, and names read from
//! those directories: a symlink is removed, never followed, so nothing
//! outside the destination tree can go.
//!
//! Memory: the names seen are kept as 64-bit keyed hashes per directory
//! (8 bytes an entry). Two names with one hash would keep an extraneous
//! entry, never remove a wanted one; the key is random, so nobody can
//! make two names collide on purpose.

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::hash::{BuildHasher, RandomState};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;

use anyhow::{Context, bail};
use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;

use crate::backup::Backups;
use crate::filter::Filter;
use crate::tree::{self, Base};

/// The names the sender sent, by directory.
#[derive(Debug, Default)]
pub struct Sent {
    key: RandomState,
    by_dir: HashMap<Vec<u8>, HashSet<u64>>,
}

impl Sent {
    /// Entry `path` (relative, `/`-separated, checked) arrived.
    pub fn entry(&mut self, path: &[u8]) {
        let (dir, name) = split(path);
        let h = self.key.hash_one(name);
        self.by_dir.entry(dir.to_vec()).or_default().insert(h);
    }

    /// Whether `name` in the directory at `dir` was sent.
    fn has(&self, dir: &[u8], name: &[u8]) -> bool {
        let h = self.key.hash_one(name);
        self.by_dir.get(dir).is_some_and(|names| names.contains(&h))
    }
}

/// An entry path's directory (empty at the top) and name.
pub(crate) fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// `-x`: the directories whose contents the sender did not list (they
/// are on another file system there), which `--delete` leaves as they
/// are. An `Unlisted` names the entry read last, a directory: the
/// sender sends it right after the entry, but the ends of files whose
/// data goes apart (a re-sync's) may come between. **Sans I/O.**
#[derive(Debug, Default)]
pub struct Unlisted {
    /// The entry read last: its index, and whether it is a directory.
    last: Option<(u32, bool)>,
    dirs: HashSet<u32>,
}

impl Unlisted {
    /// Entry `index` was read.
    pub fn entry(&mut self, index: u32, is_dir: bool) {
        self.last = Some((index, is_dir));
    }

    /// The sender says directory `index`'s contents are not listed.
    pub fn unlisted(&mut self, index: u32) -> anyhow::Result<()> {
        if self.last != Some((index, true)) {
            anyhow::bail!("Unlisted for entry {index}, which is not the directory announced last");
        }
        self.dirs.insert(index);
        Ok(())
    }

    /// Whether `--delete` leaves directory `index` as it is.
    pub fn holds(&self, index: u32) -> bool {
        self.dirs.contains(&index)
    }
}

/// What `--delete` did: the paths removed, and the directories (by entry
/// index) it could not clean, with why.
#[derive(Debug, Default)]
pub struct Deleted {
    /// Every entry removed, as rsync names them (see [`rsync_order`]), and
    /// whether each is a directory.
    pub removed: Vec<(Vec<u8>, bool)>,
    pub failed: Vec<(u32, Vec<u8>, anyhow::Error)>,
    /// `--max-delete`: the entries left that would have gone, and the
    /// first directory (entry index and path) where the limit stopped
    /// them.
    pub held_back: u64,
    pub stopped_in: Option<(u32, Vec<u8>)>,
}

/// `--max-delete`: how many more entries may go (`None`: no limit), and
/// how many were kept back by it. **Sans I/O.**
#[derive(Debug, Default)]
pub struct Budget {
    left: Option<u64>,
    held_back: u64,
}

impl Budget {
    pub fn new(most: Option<u64>) -> Budget {
        Budget {
            left: most,
            held_back: 0,
        }
    }

    /// Whether one more entry may go (nothing spent).
    fn allows(&self) -> bool {
        self.left != Some(0)
    }

    /// Whether one more entry may go (it is spent), else counted kept.
    fn spend(&mut self) -> bool {
        match &mut self.left {
            None => true,
            Some(0) => {
                self.held_back += 1;
                false
            }
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }
}

/// Entries removed, in the order removed, each with whether it is a
/// directory.
pub type Removed = Vec<(Vec<u8>, bool)>;

/// The receiver's rules for a directory standing where a file, symlink
/// or special file must go ([`tree::MakingWay`]; see `tree/way.rs`), as
/// rsync's: an empty one goes; one with something in it only with
/// `--delete` or `--force` (`force`), and then each entry in it is
/// removed as `--delete` removes (named, counted by `--max-delete`, in
/// rsync's order), except what the rules protect, which stays with the
/// directory. The directory itself is not named, as rsync does not name
/// it. A dry run removes nothing and names what a run would.
#[derive(Debug)]
pub struct InTheWay {
    force: bool,
    dry: bool,
    one_file_system: bool,
    /// What the rules exclude stays (none with `--delete-excluded`).
    filter: Option<Filter>,
    /// `--backup`: what goes is renamed to its backup.
    backups: Option<Backups>,
    /// What was removed so far, and `--max-delete`'s budget, which the
    /// deletions after the copy go on spending ([`InTheWay::finish`]).
    done: Mutex<(Removed, Budget)>,
}

impl InTheWay {
    pub fn new(
        force: bool,
        dry: bool,
        one_file_system: bool,
        filter: Option<Filter>,
        max_delete: Option<u64>,
        backups: Option<Backups>,
    ) -> InTheWay {
        InTheWay {
            force,
            dry,
            one_file_system,
            filter,
            backups,
            done: Mutex::new((Vec::new(), Budget::new(max_delete))),
        }
    }

    /// `--backup`'s, where backups are made.
    pub fn backups(&self) -> Option<&Backups> {
        self.backups.as_ref()
    }

    /// Whether entry `path` (a directory if `is_dir`) is not the copy's
    /// to remove, neither to make way nor by `--delete`: what the rules
    /// exclude, and what `--backup` made beside its files (rsync's `P
    /// *~`); nothing with `--delete-excluded` (no filter).
    pub fn keeps(&self, path: &[u8], is_dir: bool) -> bool {
        self.filter.as_ref().is_some_and(|f| {
            f.excludes(path, is_dir) || self.backups.as_ref().is_some_and(|b| b.protects(path))
        })
    }

    /// The entries removed (and whether each is a directory), and what is
    /// left of `--max-delete`'s budget.
    pub fn finish(&self) -> (Removed, Budget) {
        std::mem::take(&mut *self.done.lock().expect("in the way lock"))
    }
}

impl tree::MakingWay for InTheWay {
    fn clear(&self, dir: BorrowedFd<'_>, name: &CStr, path: &[u8]) -> anyhow::Result<()> {
        let empty = match self.dry {
            // (A dry run looks whether a run would find it empty.)
            true => {
                let inner = tree::open_dir_beneath(dir, &[name.to_bytes()])?;
                names(&inner)?.is_empty()
            }
            false => match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
                Ok(()) => true,
                Err(Errno::NOTEMPTY | Errno::EXIST) => false,
                Err(e) => return Err(e.into()),
            },
        };
        if empty {
            return Ok(());
        }
        if !self.force {
            tree::say_not_empty(path);
            bail!("the directory there is not empty (--delete or --force would remove it)");
        }
        let keep = |path: &[u8], is_dir| self.keeps(path, is_dir);
        let dir = dir.try_clone_to_owned()?;
        let mut done = self.done.lock().expect("in the way lock");
        let (removed, budget) = &mut *done;
        let mut how = Clean {
            keep: &keep,
            dry: self.dry,
            one_file_system: self.one_file_system,
            budget: std::mem::take(budget),
            backups: self.backups.as_ref(),
        };
        let held_before = how.budget.held_back;
        // (The directory itself is neither counted nor named, as rsync's;
        // what goes from inside it is both.)
        let gone = remove(
            &dir,
            name.to_bytes(),
            path,
            Removal::InTheWay,
            &mut how,
            removed,
        );
        let held = how.budget.held_back > held_before;
        *budget = how.budget;
        match gone? {
            Gone::Yes => Ok(()),
            _ if held => {
                bail!("the directory there holds what --max-delete left")
            }
            _ => bail!("the directory there holds what may not go"),
        }
    }

    fn backs_up(&self) -> bool {
        self.backups.is_some() && !self.dry
    }

    fn back_up(&self, dir: BorrowedFd<'_>, name: &CStr, path: &[u8]) -> anyhow::Result<()> {
        match &self.backups {
            Some(b) if !self.dry => b.back_up(dir, name, path),
            _ => Ok(()),
        }
    }
}

/// The order rsync removes a directory's entries in, and names them with
/// `-i`: its directories (each one's contents first) before its other
/// entries, each kind in reverse byte order of their names, a directory's
/// name compared as if a `/` ended it (`conf` goes before `conf.d`). With
/// `--max-delete` this order says which entries go before the limit.
/// **Sans I/O.**
fn rsync_order(names: &mut [(Vec<u8>, bool)]) {
    let key = |(name, is_dir): &(Vec<u8>, bool)| {
        let mut k = name.clone();
        if *is_dir {
            k.push(b'/');
        }
        (*is_dir, k)
    };
    names.sort_by_cached_key(|n| std::cmp::Reverse(key(n)));
}

/// Removes, from each directory the sender sent (`dirs`: entry index and
/// path), the entries it did not send, unless `how.keep` (the filter
/// rules) protects them (given the path and whether it is a directory).
/// `how.dry` (`-n`): only says what it would remove.
///
/// `one_file_system` (`-x`), as rsync's: each top-level entry's file
/// system at the destination is the one its subtree's cleaning keeps to.
/// A directory on another one is not cleaned, and a directory removed is
/// not entered where another file system is mounted in it: that stays,
/// and so does every directory above it, each with rsync's warning
/// ("cannot delete non-empty directory"); what went from inside them is
/// named as removed. A mount point itself stays without a word, as with
/// rsync. A dry run looks the same way and says the same.
pub fn extraneous(
    base: &Base,
    sent: &Sent,
    dirs: impl Iterator<Item = (u32, Vec<u8>)>,
    mut how: Clean<'_>,
) -> Deleted {
    let mut done = Deleted::default();
    // The file system of each top-level entry at the destination.
    let mut tops: HashMap<Vec<u8>, u64> = HashMap::new();
    for (index, dir_path) in dirs {
        let held_before = how.budget.held_back;
        if let Err(e) = clean(
            base,
            sent,
            &dir_path,
            &mut how,
            &mut tops,
            &mut done.removed,
        ) {
            done.failed.push((index, dir_path.clone(), e));
        }
        if how.budget.held_back > held_before && done.stopped_in.is_none() {
            done.stopped_in = Some((index, dir_path));
        }
    }
    done.held_back = how.budget.held_back;
    done
}

/// How [`extraneous`] removes.
pub struct Clean<'a> {
    /// What stays: the filter rules (given a path and whether it is a
    /// directory).
    pub keep: &'a dyn Fn(&[u8], bool) -> bool,
    pub dry: bool,
    /// `-x` (see [`extraneous`]).
    pub one_file_system: bool,
    pub budget: Budget,
    /// `--backup`: a non-directory is renamed to its backup.
    pub backups: Option<&'a Backups>,
}

impl std::fmt::Debug for Clean<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clean")
            .field("dry", &self.dry)
            .field("one_file_system", &self.one_file_system)
            .field("budget", &self.budget)
            .field("backups", &self.backups)
            .finish_non_exhaustive()
    }
}

/// Whether an entry [`remove`] was given went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    Yes,
    /// A directory with another file system mounted inside it (`-x`).
    MountInside,
    /// A directory that still holds something: what the rules exclude, or
    /// what `--max-delete` kept (rsync's "cannot delete non-empty
    /// directory").
    NotEmpty,
    /// `--max-delete` kept it (counted).
    HeldBack,
}

fn clean(
    base: &Base,
    sent: &Sent,
    dir_path: &[u8],
    how: &mut Clean<'_>,
    tops: &mut HashMap<Vec<u8>, u64>,
    removed: &mut Vec<(Vec<u8>, bool)>,
) -> anyhow::Result<()> {
    let open = |path: &[u8]| {
        base.place(path)
            .and_then(|(parent, name)| tree::open_dir_beneath(&parent, &[name.as_bytes()]))
    };
    let dir = match open(dir_path) {
        Ok(dir) => dir,
        // A dry run made no directory: nothing in it to remove.
        Err(_) if how.dry => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if how.one_file_system {
        let top = split_top(dir_path);
        let reference = match tops.get(top) {
            Some(&device) => device,
            None => {
                let device = rustix::fs::fstat(&open(top)?)?.st_dev;
                tops.insert(top.to_vec(), device);
                device
            }
        };
        if rustix::fs::fstat(&dir)?.st_dev != reference {
            return Ok(());
        }
    }
    let mut names = names(&dir)?;
    rsync_order(&mut names);
    for (name, is_dir) in names {
        if sent.has(dir_path, &name) {
            continue;
        }
        let mut path = dir_path.to_vec();
        path.push(b'/');
        path.extend_from_slice(&name);
        if (how.keep)(&path, is_dir) {
            continue;
        }
        // (A backup beside it would take the name of an entry the copy
        // sent, `NAME~`, and replace it: it stays, and says so.)
        if let Some(b) = how.backups.filter(|b| b.beside_their_files())
            && !is_dir
            && sent.has(dir_path, &b.name_of(&name))
        {
            eprintln!(
                "rcp: not deleting {}: its backup would replace {}, which the copy sent",
                tree::show(&path),
                tree::show(&b.name_of(&path)),
            );
            continue;
        }
        remove(&dir, &name, &path, Removal::of(is_dir), how, removed)
            .with_context(|| format!("cannot delete {}", tree::show(&path)))?;
    }
    Ok(())
}

/// The first component of an entry path: its top-level entry.
fn split_top(path: &[u8]) -> &[u8] {
    match path.iter().position(|&b| b == b'/') {
        Some(i) => &path[..i],
        None => path,
    }
}

/// The names in `dir` (not `.` and `..`), and which are directories (not
/// symlinks to one).
fn names(dir: &OwnedFd) -> anyhow::Result<Vec<(Vec<u8>, bool)>> {
    let mut out = Vec::new();
    for d in rustix::fs::Dir::read_from(dir)? {
        let d = d?;
        let name = d.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let st = rustix::fs::statat(dir, d.file_name(), AtFlags::SYMLINK_NOFOLLOW)?;
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        out.push((name.to_vec(), is_dir));
    }
    Ok(out)
}

/// Removes `name` (entry path `path`) in `dir`, a directory with
/// everything in it, adding each entry removed to `removed` in rsync's
/// order ([`rsync_order`]: a directory's contents before it). A dry run
/// removes nothing and names what the run would. Whether it is gone:
/// with `-x` a directory on another file system than `dir` is not
/// entered and stays, and so does each directory that holds one, each
/// saying so; `--max-delete` keeps what is past its limit, and each
/// directory holding some of it.
fn remove(
    dir: &OwnedFd,
    name: &[u8],
    path: &[u8],
    what: Removal,
    how: &mut Clean<'_>,
    removed: &mut Vec<(Vec<u8>, bool)>,
) -> anyhow::Result<Gone> {
    let cname = std::ffi::CString::new(name)?;
    if what == Removal::NotDir {
        if !how.budget.spend() {
            return Ok(Gone::HeldBack);
        }
        match how.backups {
            _ if how.dry => {}
            Some(b) => b.move_away(dir.as_fd(), cname.as_c_str(), path)?,
            None => rustix::fs::unlinkat(dir, cname.as_c_str(), AtFlags::empty())?,
        }
        removed.push((path.to_vec(), false));
        return Ok(Gone::Yes);
    }
    let inner = tree::open_dir_beneath(dir.as_fd(), &[name])?;
    if how.one_file_system && rustix::fs::fstat(&inner)?.st_dev != rustix::fs::fstat(dir)?.st_dev {
        return Ok(Gone::MountInside);
    }
    let mut inside = names(&inner)?;
    rsync_order(&mut inside);
    let mut stays = Gone::Yes;
    for (n, d) in inside {
        let mut child = path.to_vec();
        child.push(b'/');
        child.extend_from_slice(&n);
        // (What the rules exclude stays inside a directory removed too,
        // and the directory with it, as with rsync.)
        let gone = if (how.keep)(&child, d) {
            Gone::NotEmpty
        } else {
            remove(&inner, &n, &child, Removal::of(d), how, removed)?
        };
        stays = match (stays, gone) {
            (_, Gone::MountInside) | (Gone::MountInside, _) => Gone::MountInside,
            (_, Gone::NotEmpty | Gone::HeldBack) | (Gone::NotEmpty, _) => Gone::NotEmpty,
            _ => Gone::Yes,
        };
    }
    match stays {
        Gone::MountInside => {
            eprintln!(
                "rcp: cannot delete non-empty directory: {} (another file system is mounted \
                 inside it; -x does not go there)",
                tree::show(path)
            );
            return Ok(Gone::MountInside);
        }
        // (Not counted by `--max-delete`, as rsync counts: it was never
        // up for removal.)
        Gone::NotEmpty | Gone::HeldBack => {
            tree::say_not_empty(path);
            return Ok(Gone::NotEmpty);
        }
        Gone::Yes => {}
    }
    // (Spent once it went: one that stays holding backups is no
    // deletion.)
    let counted = what == Removal::Dir;
    if counted && !how.budget.allows() {
        how.budget.spend();
        return Ok(Gone::HeldBack);
    }
    if !how.dry {
        match rustix::fs::unlinkat(dir, cname.as_c_str(), AtFlags::REMOVEDIR) {
            // (`--backup` without `--backup-dir`: the backups of what it
            // held are in it, as rsync leaves them.)
            Err(Errno::NOTEMPTY) if how.backups.is_some_and(Backups::beside_their_files) => {
                tree::say_not_empty(path);
                return Ok(Gone::NotEmpty);
            }
            r => r?,
        }
    }
    if counted {
        how.budget.spend();
        removed.push((path.to_vec(), true));
    }
    Ok(Gone::Yes)
}

/// What [`remove`] removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    NotDir,
    Dir,
    /// A directory in the way of an entry ([`InTheWay`]): what it holds
    /// is removed as a directory's, counted and named; it is neither.
    InTheWay,
}

impl Removal {
    fn of(is_dir: bool) -> Removal {
        match is_dir {
            true => Removal::Dir,
            false => Removal::NotDir,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlisted_names_the_directory_read_last_whatever_came_between() {
        let mut u = Unlisted::default();
        u.entry(3, true);
        // (An end of a file sent apart may come between: nothing here
        // sees it.)
        u.unlisted(3).unwrap();
        assert!(u.holds(3));
        u.entry(4, false);
        assert!(u.unlisted(4).is_err(), "a file is not a directory");
        assert!(u.unlisted(3).is_err(), "not the entry read last");
        u.entry(5, true);
        assert!(u.unlisted(6).is_err(), "an entry not read yet");
        assert!(!u.holds(5) && !u.holds(4));
        assert!(Unlisted::default().unlisted(0).is_err(), "before any entry");
    }

    #[test]
    fn entries_go_in_rsyncs_order_directories_first_each_kind_in_reverse() {
        let mut names: Vec<(Vec<u8>, bool)> = [
            ("b", false),
            ("a", true),
            ("B", false),
            ("d", false),
            ("c", true),
            ("a.txt", false),
        ]
        .iter()
        .map(|(n, d)| (n.as_bytes().to_vec(), *d))
        .collect();
        rsync_order(&mut names);
        let order: Vec<&[u8]> = names.iter().map(|(n, _)| &n[..]).collect();
        assert_eq!(order, [&b"c"[..], b"a", b"d", b"b", b"a.txt", b"B"]);
        // A directory's name as if a `/` ended it: `conf/` after `conf.d/`.
        let mut dirs: Vec<(Vec<u8>, bool)> =
            vec![(b"conf.d".to_vec(), true), (b"conf".to_vec(), true)];
        rsync_order(&mut dirs);
        assert_eq!(dirs[0].0, b"conf");
    }

    #[test]
    fn a_budget_spends_to_its_limit_and_counts_what_it_keeps() {
        let mut none = Budget::new(None);
        assert!((0..1000).all(|_| none.spend()) && none.held_back == 0);
        let mut two = Budget::new(Some(2));
        let spent: Vec<bool> = (0..5).map(|_| two.spend()).collect();
        assert_eq!(spent, [true, true, false, false, false]);
        assert_eq!(two.held_back, 3);
        let mut zero = Budget::new(Some(0));
        assert!(!zero.spend() && zero.held_back == 1, "0 only warns");
    }

    #[test]
    fn a_top_level_entry_is_its_own_first_component() {
        assert_eq!(split_top(b"top/a/b"), b"top");
        assert_eq!(split_top(b"top"), b"top");
    }

    #[test]
    fn names_are_kept_by_their_directory() {
        let mut s = Sent::default();
        s.entry(b"top");
        s.entry(b"top/a");
        s.entry(b"top/sub/b");
        assert!(s.has(b"", b"top"));
        assert!(s.has(b"top", b"a"));
        assert!(s.has(b"top/sub", b"b"));
        assert!(!s.has(b"top", b"b"), "another directory's name");
        assert!(!s.has(b"top/sub", b"a"));
        assert!(!s.has(b"elsewhere", b"a"));
    }
}
