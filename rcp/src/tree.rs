//! The filesystem side of a copy, confined: every path a peer names is
//! resolved component by component with `openat(O_NOFOLLOW)` beneath a
//! directory opened once, so neither `..` nor a symlink (planted before or
//! during the copy) can lead outside it.
//!
//! * [`relative`] checks a peer-supplied relative path.
//! * [`Walker`] lists what to send (files, directories, symlinks as symlinks).
//! * [`Base`] is where received entries are created: under temporary names,
//!   renamed into place only when complete (files of one chunk at most:
//!   under none, linked into place, [`unnamed`]).
//! * What is there already (re-sync) is [`crate::existing`]'s.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use rfabric::storage::Engine;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};

use crate::archive::{self, Keep, Node, Powers, Preserve, Xattr};
use crate::chmod::Chmod;
use crate::digest;
use crate::filter::Filter;
use crate::idmap::Owners;
use crate::listed;
use crate::proto::{Entry, EntryKind, FailKind, Meta};
use crate::resync::TimeMatch;
use crate::staying::{Job, Staying};

mod part;
mod symlinks;
mod together;
mod unnamed;
mod way;

pub use part::{Leftover, Opened, PartFile, part_beside};
pub use symlinks::{Symlinks, leads_outside};
use together::Together;
use unnamed::Linking;
use way::{EmptyOnly, Remade, Spot};
pub use way::{MakingWay, say_not_empty};

/// Splits a peer's relative path into checked components: not empty, not
/// absolute, no `.` or `..`, no NUL, no empty component.
pub fn relative(path: &[u8]) -> anyhow::Result<Vec<&[u8]>> {
    check_relative(path)?;
    Ok(path.split(|&b| b == b'/').collect())
}

/// [`relative`]'s checks, without collecting the components.
fn check_relative(path: &[u8]) -> Result<(), Unreachable> {
    if path.is_empty() || path[0] == b'/' {
        return Err(Unreachable::NotRelative(show(path)));
    }
    let forbidden = |p: &[u8]| p.is_empty() || p == b"." || p == b".." || p.contains(&0);
    if path.split(|&b| b == b'/').any(forbidden) {
        return Err(Unreachable::Forbidden(show(path)));
    }
    Ok(())
}

/// Why a directory beneath a base cannot be reached, or a path names
/// none. A plain error, not an `anyhow` one: the receiver's checks and a
/// dry run ask for the places of entries whose directories are not there
/// yet, one question an entry, and an `anyhow::Error` captures a backtrace
/// where `RUST_BACKTRACE` is set (with it, a dry run of 100,000 entries
/// into a new directory took 0.91-0.97 s that way, 0.37-0.52 s now).
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    #[error("path {0:?} is not relative")]
    NotRelative(String),
    #[error("path {0:?} has a forbidden component")]
    Forbidden(String),
    #[error("cannot open directory {name:?} ({could_be})")]
    Dir {
        name: String,
        could_be: &'static str,
        #[source]
        errno: rustix::io::Errno,
    },
    /// (The system's error stays in the chain, where the exit status and
    /// a failure's kind look for it.)
    #[error("cannot reach the directory")]
    Io(#[from] rustix::io::Errno),
}

impl Unreachable {
    /// The system's answer where a directory could not be opened.
    pub fn errno(&self) -> Option<rustix::io::Errno> {
        match self {
            Unreachable::Dir { errno, .. } | Unreachable::Io(errno) => Some(*errno),
            _ => None,
        }
    }
}

fn cstr(name: &[u8]) -> anyhow::Result<CString> {
    CString::new(name).context("name contains NUL")
}

/// Opens directory `dir` (already confined) then each component beneath it,
/// never following symlinks.
pub fn open_dir_beneath(dir: impl AsFd, parts: &[&[u8]]) -> Result<OwnedFd, Unreachable> {
    open_dirs(dir, parts, false)
}

/// [`open_dir_beneath`], or with `follow` following symlinks on the way
/// (a user's own copy's: see [`Walker::follow_listed_dirlinks`]).
fn open_dirs(dir: impl AsFd, parts: &[&[u8]], follow: bool) -> Result<OwnedFd, Unreachable> {
    let (nofollow, could_be) = match follow {
        true => (OFlags::empty(), "missing, or not a directory"),
        false => (OFlags::NOFOLLOW, "missing, not a directory, or a symlink"),
    };
    let mut cur = rustix::io::dup(dir)?;
    for p in parts {
        let name = CString::new(*p).map_err(|_| Unreachable::Forbidden(show(p)))?;
        cur = rustix::fs::openat(
            &cur,
            name.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | nofollow | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| Unreachable::Dir {
            name: String::from_utf8_lossy(p).into_owned(),
            could_be,
            errno,
        })?;
    }
    Ok(cur)
}

/// [`open_dir_beneath`], making each component that is missing (mode
/// 0777 under the umask, as `mkdir -p`): `--mkpath`. A symlink on the way
/// is refused, as there.
pub fn make_dirs_beneath(dir: impl AsFd, parts: &[&[u8]]) -> anyhow::Result<OwnedFd> {
    let mut cur = rustix::io::dup(dir)?;
    for p in parts {
        let name = cstr(p)?;
        let open = |at: &OwnedFd| {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            rustix::fs::openat(at, name.as_c_str(), flags, Mode::empty())
        };
        cur = match open(&cur) {
            Err(rustix::io::Errno::NOENT) => {
                match rustix::fs::mkdirat(&cur, name.as_c_str(), Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("cannot make {:?}", String::from_utf8_lossy(p))
                        });
                    }
                }
                open(&cur)
            }
            r => r,
        }
        .with_context(|| {
            format!(
                "cannot open directory {:?} (not a directory, or a symlink)",
                String::from_utf8_lossy(p)
            )
        })?;
    }
    Ok(cur)
}

/// Whether a destination as written names a directory: it ends in `/`
/// (`/` alone is one anyway). A file copied there goes into it, made if
/// missing, as rsync's; without the `/` a missing name becomes the copy.
pub fn names_a_directory(dest: &[u8]) -> bool {
    dest.len() > 1 && dest.ends_with(b"/")
}

/// An absolute path split into a root (one of `roots`, longest match) and
/// the checked components below it. `roots` are absolute, normalized.
pub fn under_roots<'a>(
    path: &'a Path,
    roots: &'a [PathBuf],
) -> anyhow::Result<(&'a PathBuf, Vec<&'a [u8]>)> {
    if !path.is_absolute() {
        bail!("{} is not an absolute path", path.display());
    }
    if path
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        bail!("{} contains `..` or `.`", path.display());
    }
    let root = roots
        .iter()
        .filter(|r| path.starts_with(r))
        .max_by_key(|r| r.as_os_str().len())
        .with_context(|| format!("{} is outside the served roots", path.display()))?;
    let rest = path.strip_prefix(root).expect("prefix checked");
    let parts = rest
        .components()
        .map(|c| c.as_os_str().as_bytes())
        .collect();
    Ok((root, parts))
}

/// Opens a root directory (trusted: given by the operator or the local user).
pub fn open_root(path: &Path) -> anyhow::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("cannot open directory {}", path.display()))
}

/// Something to send, in order: a directory comes before what it holds.
#[derive(Debug)]
pub struct Item {
    pub entry: Entry,
    /// Where the file is (files only), opened once its data is wanted.
    pub file: Option<FileAt>,
    /// Every byte of the file has storage: it has no holes to look for.
    pub dense: bool,
    /// Extended attributes carried (`-X`, `-A`), sent ahead of the entry.
    pub xattrs: Vec<Xattr>,
    /// A directory sent without its names: on another file system than
    /// its operand's, walked with `-x` (see [`Walker::one_file_system`]);
    /// one that could not be listed; one a list (`--files-from`, `-R`)
    /// names without its contents, or implies. `--delete` leaves what
    /// the receiver's copy of it holds.
    pub unlisted: bool,
    /// Why the walk could not read it (a directory that could not be
    /// listed): it goes, and fails (or, gone since it was looked at, is
    /// said to have vanished).
    pub failed: Option<(FailKind, String)>,
    /// Not sent at all, only its failure (`failed`): a name that cannot
    /// be looked at or whose attributes cannot be read, and with `-L` a
    /// symlink with no referent, one that loops, or one whose referent
    /// cannot be opened or read through it. It takes no entry number,
    /// and with `-m` brings no directory above it (rsync leaves such
    /// directories out too).
    pub unsent: bool,
}

impl Item {
    /// An item not sent, named `path`, failed for `why` (of its entry
    /// only the path is read).
    fn unsent(path: Vec<u8>, why: String) -> Item {
        Item::not_sent(path, FailKind::Io, why)
    }

    /// A name gone since its directory was listed: not sent, and said to
    /// have vanished, as rsync says it (not a failure).
    fn vanished(path: Vec<u8>, e: rustix::io::Errno) -> Item {
        Item::not_sent(path, FailKind::Vanished, e.to_string())
    }

    fn not_sent(path: Vec<u8>, kind: FailKind, why: String) -> Item {
        let entry = Entry {
            index: 0,
            kind: EntryKind::Symlink,
            mode: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
            size: 0,
            path,
            target: Vec::new(),
            chunk: 0,
            meta: None,
        };
        Item {
            entry,
            file: None,
            dense: true,
            xattrs: Vec::new(),
            unlisted: false,
            failed: Some((kind, why)),
            unsent: true,
        }
    }
}

/// What a walk's entries carry other than what it finds
/// ([`Walker::change`]): the owners mapped (`--usermap`, `--groupmap`,
/// `--chown` of the side the user started), the modes changed
/// (`--chmod`).
#[derive(Debug, Clone, Default)]
pub struct Changes {
    pub owners: Option<Arc<Owners>>,
    pub chmod: Option<Arc<Chmod>>,
}

/// How far a walk goes: `-x`'s file systems ([`Walker::one_file_system`])
/// and the symlinks it follows ([`Symlinks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    pub one_file_system: u8,
    pub symlinks: Symlinks,
    /// `-m` ([`Walker::prune_empty_dirs`]).
    pub prune_empty_dirs: bool,
    /// `--ignore-missing-args` ([`Walker::ignore_missing_args`]).
    pub ignore_missing_args: bool,
    /// `-k` ([`Walker::copy_dirlinks`]).
    pub copy_dirlinks: bool,
}

/// A walked file, by its directory and name: opened when its data is
/// wanted (a re-sync of an unchanged tree opens none, unless its
/// attributes were read), and then only if it is still the file that was
/// walked.
#[derive(Debug)]
pub struct FileAt {
    dir: Arc<OwnedFd>,
    name: CString,
    /// Device and inode when walked.
    id: (u64, u64),
    /// Open already (its attributes were read through it).
    open: Option<OwnedFd>,
}

impl FileAt {
    /// Whether it holds a descriptor of the file already.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    pub fn open(self) -> anyhow::Result<OwnedFd> {
        if let Some(fd) = self.open {
            return Ok(fd);
        }
        let shown = || self.name.to_string_lossy().into_owned();
        vanish_here(&self.dir, &self.name, false);
        let fd = rustix::fs::openat(
            &*self.dir,
            self.name.as_c_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("cannot open {}", shown()))?;
        let st = rustix::fs::fstat(&fd)?;
        if (st.st_dev, st.st_ino) != self.id {
            bail!("{} was replaced while it was being copied", shown());
        }
        Ok(fd)
    }
}

/// Fault injection for the integration tests: `RCP_TEST_VANISH=NAME`
/// removes the file (or empty directory) named NAME just before the
/// sender opens it, as another program deleting it between the walk and
/// the read would. Only in builds with the `test-hooks` feature: a
/// shipping binary reads no such variable.
#[cfg(feature = "test-hooks")]
fn vanish_here(dir: impl AsFd, name: &CStr, is_dir: bool) {
    static NAME: std::sync::OnceLock<Option<std::ffi::OsString>> = std::sync::OnceLock::new();
    let doomed = NAME.get_or_init(|| std::env::var_os("RCP_TEST_VANISH"));
    if doomed
        .as_ref()
        .is_some_and(|d| d.as_bytes() == name.to_bytes())
    {
        let how = if is_dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        let _ = rustix::fs::unlinkat(dir, name, how);
    }
}

#[cfg(not(feature = "test-hooks"))]
fn vanish_here(_: impl AsFd, _: &CStr, _: bool) {}

/// The entry for what `stat` describes, or `None` for what is not copied
/// (device nodes, FIFOs and sockets without `-D`).
fn entry_for(
    stat: &rustix::fs::Stat,
    keep: Keep,
    index: u32,
    path: Vec<u8>,
    target: Vec<u8>,
) -> Option<Entry> {
    let kind = match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        FileType::Fifo if keep.devices => EntryKind::Fifo,
        FileType::Socket if keep.devices => EntryKind::Socket,
        FileType::CharacterDevice if keep.devices => EntryKind::CharDevice,
        FileType::BlockDevice if keep.devices => EntryKind::BlockDevice,
        _ => return None,
    };
    let device = matches!(kind, EntryKind::CharDevice | EntryKind::BlockDevice);
    Some(Entry {
        index,
        kind,
        mode: stat.st_mode & 0o7777,
        mtime_sec: stat.st_mtime,
        mtime_nsec: stat.st_mtime_nsec as u32,
        size: if kind == EntryKind::File {
            stat.st_size as u64
        } else {
            0
        },
        path,
        target,
        chunk: 0,
        meta: keep.any().then_some(Meta {
            uid: stat.st_uid,
            gid: stat.st_gid,
            rdev: if device { stat.st_rdev } else { 0 },
            xattrs: 0,
        }),
    })
}

/// Lists what to send, without following symlinks, numbering the entries
/// of every source in one sequence; with `-H` it keeps the first name of
/// every file that has several (device and inode to entry path), so that
/// the others go as hard links to it.
#[derive(Debug)]
pub struct Walker {
    recursive: bool,
    keep: Keep,
    /// What is left out (and not descended into, for a directory).
    filter: Arc<Filter>,
    /// The number of the next entry sent.
    next_index: u32,
    /// `-m`: see [`Walker::prune_empty_dirs`].
    prune: bool,
    /// See [`Walker::ignore_missing_args`].
    ignore_missing: bool,
    /// See [`Walker::copy_dirlinks`].
    copy_dirlinks: bool,
    /// See [`Walker::follow_listed_dirlinks`].
    follow_listed_dirlinks: bool,
    /// With `-m`, the directories walked into and not yet sent, outermost
    /// first: each goes once something beneath it does, and is dropped
    /// once the walk is past it with nothing sent beneath.
    waiting_dirs: Vec<Item>,
    first_names: std::collections::HashMap<(u64, u64), Vec<u8>>,
    /// Where entries are on disk by path: `prefix` followed by an entry
    /// path without its first `skip` bytes.
    by_path: Option<(Vec<u8>, usize)>,
    /// `--usermap`, `--groupmap` of a copy this side's user started.
    owners: Option<Arc<Owners>>,
    /// `--chmod`: the modes sent are changed by it.
    chmod: Option<Arc<Chmod>>,
    /// Whether a helper thread may look up names too.
    may_help: bool,
    /// `-x` (1) and `-xx` (2): see [`Walker::one_file_system`].
    one_file_system: u8,
    /// `-L`, `--copy-unsafe-links`, `--safe-links`: see [`Symlinks`].
    symlinks: Symlinks,
    /// The directories being walked, from the operand down (device and
    /// inode): a symlink followed to one of them is a loop.
    walking: Vec<(u64, u64)>,
    /// Entry paths start with the operand's name (not in a `--files-from`
    /// walk): see [`leads_outside`].
    under_top: bool,
    /// The thread that looks up the second half of a large directory's
    /// names (of each block of them) while the walk does the first
    /// (started at the first such directory; `None` until then, or where
    /// it could not start).
    helper: Option<Staying>,
}

/// Directories of at least this many names are looked up by two threads.
const LOOK_AHEAD_FROM: usize = 64;

/// Large directories are looked up in blocks of this many names, the
/// helper taking the second half of each.
const LOOK_AHEAD_BLOCK: usize = 1024;

/// What the walk's helper looked up of a name ([`Walker::look_ahead`]).
struct Looked {
    stat: rustix::io::Result<rustix::fs::Stat>,
    more: LookedMore,
}

/// What [`Walker::visit`] takes of a name looked up ahead, beside its
/// status.
struct LookedMore {
    /// A symlink's target.
    target: Option<rustix::io::Result<CString>>,
    /// Attributes of anything but a directory, read by name in the
    /// directory (where the helper can be moved there).
    xattrs: Option<anyhow::Result<Vec<Xattr>>>,
}

impl Looked {
    /// Looks up `name` in `dir` as [`Walker::visit`] would.
    fn up(dir: &Arc<OwnedFd>, name: &CStr, keep: Keep) -> Looked {
        let stat = rustix::fs::statat(&**dir, name, AtFlags::SYMLINK_NOFOLLOW);
        let kind = stat
            .as_ref()
            .ok()
            .map(|st| FileType::from_raw_mode(st.st_mode));
        let target = (kind == Some(FileType::Symlink))
            .then(|| rustix::fs::readlinkat(&**dir, name, Vec::new()));
        let by_name = kind.is_some_and(|k| k != FileType::Directory)
            && (keep.xattrs || keep.acls)
            && rfabric::thread_dir::available();
        let xattrs = by_name.then(|| {
            let held: rfabric::thread_dir::HeldDir = dir.clone();
            archive::read_xattrs(Node::Held(&held, name), keep)
        });
        Looked {
            stat,
            more: LookedMore { target, xattrs },
        }
    }
}

impl Walker {
    pub fn new(recursive: bool, keep: Keep, filter: Arc<Filter>) -> Walker {
        Walker {
            recursive,
            keep,
            filter,
            next_index: 0,
            prune: false,
            ignore_missing: false,
            copy_dirlinks: false,
            follow_listed_dirlinks: false,
            waiting_dirs: Vec::new(),
            first_names: Default::default(),
            by_path: None,
            owners: None,
            chmod: None,
            may_help: false,
            helper: None,
            one_file_system: 0,
            symlinks: Symlinks::Keep,
            walking: Vec::new(),
            under_top: true,
        }
    }

    /// What the walk does with symlinks ([`Symlinks`]).
    pub fn symlinks(&mut self, rule: Symlinks) {
        self.symlinks = rule;
    }

    /// `-x` (`level` 1): the walk keeps to each operand's file system (a
    /// listed name's, with `--files-from`). A directory on another one, a
    /// mount point, is walked as an empty directory (`Item::unlisted`),
    /// with the metadata of the file system mounted there. `-xx` (2):
    /// such directories are left out. Only directories: a file on another
    /// file system (a bind mount of one file) is copied, as rsync does.
    pub fn one_file_system(&mut self, level: u8) {
        self.one_file_system = level;
    }

    /// `-m` (rsync's `--prune-empty-dirs`): a directory goes only with
    /// something beneath it that is not a directory (a file, a symlink or
    /// a special file, sent; a name that fails here brings none).
    /// Judged after the filter rules, so a directory whose files are all
    /// excluded goes neither. A directory that cannot be listed, or a
    /// mount point with `-x`, always goes: the receiver must know to
    /// leave what it holds there. An operand may go this way too; the
    /// destination directory itself is the receiver's.
    pub fn prune_empty_dirs(&mut self, on: bool) {
        self.prune = on;
    }

    /// A source the user named (an operand, a name in a `--files-from`
    /// list or of `-R`) that is not there fails alone, as rsync's (the
    /// others are copied; the copy ends with status 1 and `--delete`
    /// deletes nothing); with `--ignore-missing-args` (`on`) it is passed
    /// over without a word, as rsync's.
    pub fn ignore_missing_args(&mut self, on: bool) {
        self.ignore_missing = on;
    }

    /// Whether listed `name` is there to walk: `NOENT` where it, or a
    /// directory on its way, is not, and `NOTDIR` where something on its
    /// way is not a directory (in a user's own walk: a server's, which
    /// follows no symlink, says so of a symlink too, and its walk tells
    /// why). Anything else is left to the walk to say.
    fn look_listed(&self, base: &OwnedFd, name: &[u8]) -> Result<(), rustix::io::Errno> {
        let follow = self.follow_listed_dirlinks;
        let Ok(parts) = relative(name) else {
            return Ok(());
        };
        let Some((last, dirs)) = parts.split_last() else {
            return Ok(());
        };
        let said = |e: &rustix::io::Errno| {
            *e == rustix::io::Errno::NOENT || (follow && *e == rustix::io::Errno::NOTDIR)
        };
        let parent = match open_dirs(base, dirs, follow) {
            Ok(parent) => parent,
            Err(e) => return e.errno().filter(said).map_or(Ok(()), Err),
        };
        let Ok(last) = cstr(last) else {
            return Ok(());
        };
        match rustix::fs::statat(&parent, last.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Err(e) if said(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// A source the user named could not be looked at (`e`): what
    /// [`Walker::ignore_missing_args`] says is done with it.
    fn named_but_missing(
        &mut self,
        path: &[u8],
        e: rustix::io::Errno,
        emit: &mut dyn FnMut(Item) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        if self.ignore_missing && e == rustix::io::Errno::NOENT {
            return Ok(());
        }
        let why = format!("cannot look at it: {e}");
        self.put(emit, Item::unsent(path.to_vec(), why))
    }

    /// `-k` (rsync's `--copy-dirlinks`): a symlink to a directory is
    /// walked as that directory, under the symlink's name, as `-L` does
    /// (a loop, a symlink to a directory it is in, fails alone); other
    /// symlinks stay symlinks. Only in a user's own walk: a server's
    /// follows no symlink.
    pub fn copy_dirlinks(&mut self, on: bool) {
        self.copy_dirlinks = on;
    }

    /// `--files-from`, `-R` in a user's own copy: a symlink to a
    /// directory among the directories a listed name implies, or a name
    /// listed with a trailing `/`, is followed and arrives as that
    /// directory, as rsync's implied directories do (`-R /lib/modules`
    /// where `/lib` leads to `usr/lib`). A server's walk follows none: a
    /// symlink could lead outside its roots.
    pub fn follow_listed_dirlinks(&mut self, on: bool) {
        self.follow_listed_dirlinks = on;
    }

    /// Sends `item`, numbered, and with `-m` the directories waiting
    /// above it first. Directories that wait and are not above `item` are
    /// behind the walk with nothing sent beneath: dropped. (Their numbers
    /// were never given: the entries sent stay numbered without a gap.)
    fn put(
        &mut self,
        emit: &mut dyn FnMut(Item) -> anyhow::Result<()>,
        item: Item,
    ) -> anyhow::Result<()> {
        self.put_or_hold(emit, item, false)
    }

    /// [`Walker::put`], where a directory that `may_wait` (one `-m` may
    /// leave out) waits instead, with `-m`, for something beneath it.
    fn put_or_hold(
        &mut self,
        emit: &mut dyn FnMut(Item) -> anyhow::Result<()>,
        mut item: Item,
        may_wait: bool,
    ) -> anyhow::Result<()> {
        if self.prune {
            while let Some(dir) = self.waiting_dirs.last()
                && !listed::beneath(&item.entry.path, &dir.entry.path)
            {
                self.waiting_dirs.pop();
            }
            if may_wait {
                self.waiting_dirs.push(item);
                return Ok(());
            }
            // (Only its failure goes: the receiver needs no directory
            // for that.)
            if item.unsent {
                return emit(item);
            }
            for mut dir in std::mem::take(&mut self.waiting_dirs) {
                dir.entry.index = self.next_index;
                self.next_index += 1;
                emit(dir)?;
            }
        }
        if !item.unsent {
            item.entry.index = self.next_index;
            self.next_index += 1;
        }
        emit(item)
    }

    /// Lets a helper thread look up the second half of each large
    /// directory's names while the walk does the first: where the cores
    /// are not all busy with the other end of the copy, and where each
    /// call is a round trip (a network filesystem).
    pub fn with_helper(&mut self, on: bool) {
        self.may_help = on;
    }

    /// Has the helper look up `names` in `dir`, in order: what it found
    /// comes back on the channel, all at once. `None` where there is no
    /// helper (the walk looks them up itself).
    fn look_ahead(
        &mut self,
        dir: &Arc<OwnedFd>,
        names: &[CString],
    ) -> Option<std::sync::mpsc::Receiver<Vec<Looked>>> {
        if self.helper.is_none() {
            self.helper = Staying::start("rcp-walk", 1).ok();
            // (Where no thread can start, the walk goes on alone.)
            self.may_help &= self.helper.is_some();
        }
        let helper = self.helper.as_ref()?;
        let (dir, names, keep) = (Arc::clone(dir), names.to_vec(), self.keep);
        let (tx, rx) = std::sync::mpsc::channel();
        let job: Job = Box::new(move || {
            let looked = names.iter().map(|n| Looked::up(&dir, n, keep)).collect();
            let _ = tx.send(looked);
        });
        helper.run(0, job).then_some(rx)
    }

    /// What the entries walked from now on carry other than what is
    /// found: their owners and groups mapped, their modes changed.
    pub fn change(&mut self, changes: Changes) {
        self.owners = changes.owners;
        self.chmod = changes.chmod;
    }

    /// Lets the next walk read the attributes of files by path, as rsync
    /// does, rather than by opening each file (a third of the system calls
    /// a file costs when its data does not travel, an unchanged re-sync),
    /// where this thread cannot read them by name in the directory
    /// (`rfabric::thread_dir`, cheaper than either). `disk` is where the
    /// walk's top (`top` in the entry paths) is, as this process reaches
    /// it; `None` keeps to descriptors, as a daemon must: a path is
    /// resolved anew at each call, so a directory swapped for a symlink
    /// meanwhile would lead it out of its roots. (A user's own copy runs
    /// as that user, who may read wherever such a symlink leads.)
    pub fn by_path(&mut self, disk: Option<&[u8]>, top: &[u8]) {
        self.by_path = disk.map(|d| (d.to_vec(), top.len()));
    }

    /// Where the file of entry path `path` is, by path, when the walk may
    /// reach it so.
    fn disk_path(&self, path: &[u8]) -> Option<CString> {
        let (prefix, skip) = self.by_path.as_ref()?;
        let rest = path.get(*skip..)?;
        CString::new([&prefix[..], rest].concat()).ok()
    }

    /// Lists `name` inside `parent` (recursively with `recursive`),
    /// calling `emit` in order. `top` is the name the copy gets on the
    /// other side.
    pub fn walk(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        top: &[u8],
        emit: &mut dyn FnMut(Item) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let shown = || String::from_utf8_lossy(name).into_owned();
        self.under_top = true;
        let stat =
            match rustix::fs::statat(parent, cstr(name)?.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(e) => return self.named_but_missing(top, e, emit),
            };
        let parent = Arc::new(rustix::io::dup(parent)?);
        let how = Visit {
            depth: Depth::All,
            filtered: true,
            device: None,
            through_dirlink: false,
        };
        let walked = self.visit(
            &parent,
            &cstr(name)?,
            top.to_vec(),
            &stat,
            emit,
            &shown,
            how,
            None,
        );
        // (`-m`: what still waits has nothing beneath it.)
        self.waiting_dirs.clear();
        walked
    }

    /// `--files-from`: lists `names` (checked, sorted and deduplicated by
    /// [`listed::parse`]) inside directory `base`, each under its own
    /// name. The directories a name implies come first, once each, with
    /// their metadata and without their other contents; a listed
    /// directory brings its contents only with `-r` (and a name beneath a
    /// directory walked so is not listed twice), or, listed with a
    /// trailing `/`, the names in it (as rsync's `--dirs`: directories
    /// among them without their contents).
    pub fn walk_listed(
        &mut self,
        base: &OwnedFd,
        names: &[Vec<u8>],
        emit: &mut dyn FnMut(Item) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.under_top = false;
        let mut made: std::collections::HashSet<Vec<u8>> = Default::default();
        let mut walked: Option<&[u8]> = None;
        for listed in names {
            let contents = listed.ends_with(b"/");
            let name = listed::bare(listed);
            if walked.is_some_and(|dir| listed::beneath(name, dir)) || made.contains(name) {
                continue;
            }
            // (A name not there, or beneath something that is not a
            // directory, fails alone before the directories it implies
            // are made, as rsync's. Looked at first only where it implies
            // one not made yet: else the walk of it says so, and a long
            // list of names in a few directories pays no second look.)
            let implies_new = listed::implied_dirs(name).any(|d| !made.contains(d));
            if implies_new && let Err(e) = self.look_listed(base, name) {
                self.named_but_missing(name, e, emit)?;
                continue;
            }
            for dir in listed::implied_dirs(name) {
                if made.insert(dir.to_vec()) {
                    let how = Visit {
                        depth: Depth::Itself,
                        filtered: false,
                        device: None,
                        through_dirlink: self.follow_listed_dirlinks,
                    };
                    self.visit_at(base, dir, emit, how)?;
                }
            }
            let depth = match (self.recursive, contents) {
                (true, _) => Depth::All,
                (false, true) => Depth::Contents,
                (false, false) => Depth::Itself,
            };
            let how = Visit {
                depth,
                filtered: true,
                device: None,
                // (`name/` asks for a directory: through a symlink too.)
                through_dirlink: self.follow_listed_dirlinks && contents,
            };
            if self.visit_at(base, name, emit, how)? {
                made.insert(name.to_vec());
                if self.recursive {
                    walked = Some(name);
                }
            }
        }
        self.waiting_dirs.clear();
        Ok(())
    }

    /// Visits `path` (relative, checked) beneath `base`; whether it is a
    /// directory.
    fn visit_at(
        &mut self,
        base: &OwnedFd,
        path: &[u8],
        emit: &mut dyn FnMut(Item) -> anyhow::Result<()>,
        how: Visit,
    ) -> anyhow::Result<bool> {
        let shown = || String::from_utf8_lossy(path).into_owned();
        let parts = relative(path)?;
        let (name, dirs) = parts.split_last().expect("relative paths have a part");
        let opened = open_dirs(base, dirs, self.follow_listed_dirlinks);
        let parent = Arc::new(opened.with_context(|| {
            let server = match self.follow_listed_dirlinks {
                true => "",
                false => "; a server follows no symlink above it",
            };
            format!(
                "cannot reach {} (named by --files-from or -R{server})",
                shown()
            )
        })?);
        let stat =
            match rustix::fs::statat(&*parent, cstr(name)?.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(e) => {
                    self.named_but_missing(path, e, emit)?;
                    return Ok(false);
                }
            };
        self.visit(
            &parent,
            &cstr(name)?,
            path.to_vec(),
            &stat,
            emit,
            &shown,
            how,
            None,
        )?;
        Ok(FileType::from_raw_mode(stat.st_mode) == FileType::Directory)
    }

    #[allow(clippy::too_many_arguments)]
    fn visit(
        &mut self,
        parent: &Arc<OwnedFd>,
        cname: &CStr,
        path: Vec<u8>,
        stat: &rustix::fs::Stat,
        emit: &mut dyn FnMut(Item) -> anyhow::Result<()>,
        // The name in messages: made only for one (a walk meets every
        // name once, and almost never has anything to say about it).
        shown: &dyn Fn() -> String,
        how: Visit,
        // What the helper looked up of it already.
        looked: Option<LookedMore>,
    ) -> anyhow::Result<()> {
        let (target, mut xattrs_looked) = match looked {
            Some(looked) => (looked.target, looked.xattrs),
            None => (None, None),
        };
        let mut target = if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
            target
                .unwrap_or_else(|| rustix::fs::readlinkat(parent, cname, Vec::new()))
                .with_context(|| format!("cannot read symlink {}", shown()))?
                .into_bytes()
        } else {
            Vec::new()
        };
        // `-L`, `--copy-unsafe-links`: a symlink followed is its referent
        // under its name, from here on.
        // (`--safe-links` is the receiver's: it keeps the name.)
        let is_symlink = FileType::from_raw_mode(stat.st_mode) == FileType::Symlink;
        // (A symlink to a directory above a listed name: what it leads to,
        // looked at once.)
        let through = (is_symlink && (how.through_dirlink || self.copy_dirlinks))
            .then(|| rustix::fs::statat(&**parent, cname, AtFlags::empty()).ok())
            .flatten()
            .filter(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory);
        let followed = match self.symlinks {
            _ if !is_symlink => false,
            _ if through.is_some() => true,
            Symlinks::Keep | Symlinks::SkipUnsafe => false,
            Symlinks::Follow => true,
            Symlinks::FollowUnsafe => leads_outside(&path, &target, self.under_top),
        };
        let referent;
        let stat = match (followed, through) {
            (false, _) => stat,
            (true, Some(st)) => {
                referent = st;
                &referent
            }
            (true, None) => match rustix::fs::statat(&**parent, cname, AtFlags::empty()) {
                Ok(st) => {
                    referent = st;
                    &referent
                }
                // (Unless the rules leave it out, as rsync's do.)
                Err(_) if how.filtered && self.filter.excludes(&path, false) => return Ok(()),
                Err(e) => {
                    return self.put(
                        emit,
                        Item::unsent(path, format!("symlink has no referent: {e}")),
                    );
                }
            },
        };
        let is_dir = FileType::from_raw_mode(stat.st_mode) == FileType::Directory;
        if how.filtered && self.filter.excludes(&path, is_dir) {
            return Ok(());
        }
        if followed {
            // (What the helper read by name was the symlink's.)
            target = Vec::new();
            xattrs_looked = None;
            let kind = FileType::from_raw_mode(stat.st_mode);
            if kind == FileType::Directory && self.walking.contains(&(stat.st_dev, stat.st_ino)) {
                let why = "symlink loop: it leads to a directory this one is in".to_string();
                return self.put(emit, Item::unsent(path, why));
            }
            let special = !matches!(kind, FileType::RegularFile | FileType::Directory);
            if special && (self.keep.xattrs || self.keep.acls) {
                let why = "symlink to a special file: its attributes cannot be read through \
                           the link"
                    .to_string();
                return self.put(emit, Item::unsent(path, why));
            }
        }
        let mount_point =
            is_dir && self.one_file_system > 0 && how.device.is_some_and(|dev| dev != stat.st_dev);
        if mount_point && self.one_file_system > 1 {
            return Ok(());
        }
        // (Numbered as it goes out: [`Walker::put`].)
        let Some(mut entry) = entry_for(stat, self.keep, 0, path, target) else {
            eprintln!(
                "rcp: skipping {}: not a regular file, directory or symlink (-D copies \
                 devices, FIFOs and sockets)",
                shown()
            );
            return Ok(());
        };
        if let (Some(owners), Some(meta)) = (&self.owners, &mut entry.meta) {
            owners.apply(meta);
        }
        // (A symlink's own mode means nothing on Linux.)
        if let Some(chmod) = &self.chmod
            && entry.kind != EntryKind::Symlink
        {
            entry.mode = chmod.apply(entry.mode, entry.kind == EntryKind::Dir) & 0o7777;
        }
        if entry.kind == EntryKind::Dir && how.depth == Depth::All && !self.recursive {
            bail!("{} is a directory (use -r to copy directories)", shown());
        }
        if entry.kind == EntryKind::File && self.keep.hard_links && stat.st_nlink > 1 {
            let id = (stat.st_dev, stat.st_ino);
            if let Some(first) = self.first_names.get(&id) {
                // Another name of a file sent already: a link to it.
                entry.kind = EntryKind::HardLink;
                entry.size = 0;
                entry.target = first.clone();
                return self.put(
                    emit,
                    Item {
                        entry,
                        file: None,
                        dense: true,
                        xattrs: Vec::new(),
                        unlisted: false,
                        failed: None,
                        unsent: false,
                    },
                );
            }
            self.first_names.insert(id, entry.path.clone());
        }
        let attributes = self.keep.xattrs || self.keep.acls;
        // Attributes are read by name with the thread in the directory
        // (`rfabric::thread_dir`; the walk stays in each directory while
        // it reads the names in it), else by path where the walk may,
        // else through the file opened already (no path walk).
        let by_name = rfabric::thread_dir::available();
        let disk = match entry.kind {
            EntryKind::File if attributes && !by_name && !followed => self.disk_path(&entry.path),
            _ => None,
        };
        // (A symlink followed is opened through it, and read through the
        // file opened: the calls by name act on the symlink.)
        let nofollow = if followed {
            OFlags::empty()
        } else {
            OFlags::NOFOLLOW
        };
        // (A directory that cannot be opened is sent without its
        // contents, and fails: below.)
        let mut unopened = None;
        if entry.kind == EntryKind::Dir {
            vanish_here(&**parent, cname, true);
        }
        let open = match entry.kind {
            EntryKind::Dir => match rustix::fs::openat(
                &**parent,
                cname,
                OFlags::RDONLY | OFlags::DIRECTORY | nofollow | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                // (A directory followed: the one it was when looked at, as
                // the loop check saw it.)
                Ok(fd)
                    if followed
                        && rustix::fs::fstat(&fd).is_ok_and(|st| {
                            (st.st_dev, st.st_ino) != (stat.st_dev, stat.st_ino)
                        }) =>
                {
                    let why = "replaced while it was being walked".to_string();
                    return self.put(emit, Item::unsent(entry.path, why));
                }
                Ok(fd) => Some(fd),
                // (A directory followed is read through its descriptor:
                // without one, none of it goes.)
                Err(e) if followed => {
                    let why = format!("cannot list the directory: {e}");
                    return self.put(emit, Item::unsent(entry.path, why));
                }
                Err(e) => {
                    unopened = Some(e);
                    None
                }
            },
            EntryKind::File if followed => {
                // (The one it is now: a file swapped in since is not
                // read.) One that cannot be opened fails alone.
                let opened = rustix::fs::openat(
                    &**parent,
                    cname,
                    OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| format!("cannot open it through the symlink: {e}"))
                .and_then(|fd| match rustix::fs::fstat(&fd) {
                    Ok(st) if (st.st_dev, st.st_ino) == (stat.st_dev, stat.st_ino) => Ok(fd),
                    Ok(_) => Err("replaced while it was being walked".to_string()),
                    Err(e) => Err(format!("cannot open it through the symlink: {e}")),
                });
                match opened {
                    Ok(fd) => Some(fd),
                    Err(why) => return self.put(emit, Item::unsent(entry.path, why)),
                }
            }
            EntryKind::File if attributes && disk.is_none() && !by_name => rustix::fs::openat(
                &**parent,
                cname,
                OFlags::RDONLY
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::NOCTTY
                    | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok(),
            _ => None,
        };
        // (Held only where it is used: a reference more per entry otherwise.)
        let held: rfabric::thread_dir::HeldDir;
        let xattrs = match (&open, &disk, xattrs_looked) {
            (Some(fd), _, _) => archive::read_xattrs(Node::Fd(fd.as_fd()), self.keep),
            (None, Some(disk), _) => archive::read_xattrs(Node::Path(disk.as_c_str()), self.keep),
            // (Read by name in the directory, as here.)
            (None, None, Some(looked)) => looked,
            (None, None, None) => {
                held = parent.clone();
                archive::read_xattrs(Node::Held(&held, cname), self.keep)
            }
        };
        // Attributes that cannot be read (a file of mode 000 with `user.`
        // ones): sent without them, it would lose them there, so it is
        // not sent, and fails.
        let xattrs = match xattrs {
            Ok(xattrs) => xattrs,
            Err(e) => return self.put(emit, Item::unsent(entry.path, format!("{e:#}"))),
        };
        if let Some(meta) = &mut entry.meta {
            meta.xattrs = xattrs.len() as u16;
        }
        match entry.kind {
            EntryKind::File => {
                let dense = stat.st_blocks as u64 * 512 >= entry.size;
                let file = FileAt {
                    dir: Arc::clone(parent),
                    name: cname.to_owned(),
                    id: (stat.st_dev, stat.st_ino),
                    open,
                };
                self.put(
                    emit,
                    Item {
                        entry,
                        file: Some(file),
                        dense,
                        xattrs,
                        unlisted: false,
                        failed: None,
                        unsent: false,
                    },
                )
            }
            EntryKind::Dir => {
                let path = entry.path.clone();
                let inside = match how.depth {
                    _ if mount_point => None,
                    Depth::Itself => None,
                    Depth::Contents => Some(Depth::Itself),
                    Depth::All => Some(Depth::All),
                };
                // Its names are read before its entry goes: one that
                // cannot be opened or listed (no permission) goes without
                // its contents, which the receiver's copy keeps (`--delete`
                // leaves them, as a mount point's with `-x`), and fails,
                // saying why; the walk goes on.
                let listed = match (inside, open) {
                    (None, _) => Ok(None),
                    (Some(_), Some(fd)) => {
                        let dir = Arc::new(fd);
                        names_in(&dir).map(|names| Some((dir, names)))
                    }
                    (Some(_), None) => Err(unopened.expect("why it did not open")),
                };
                let (listed, failed) = match listed {
                    Ok(listed) => (listed, None),
                    // (Gone since it was looked at: vanished.)
                    Err(e) if e == rustix::io::Errno::NOENT => {
                        (None, Some((FailKind::Vanished, e.to_string())))
                    }
                    Err(e) => (
                        None,
                        Some((FailKind::Io, format!("cannot list the directory: {e}"))),
                    ),
                };
                // (`-m`: one the receiver must know of goes.)
                let may_wait = !mount_point && failed.is_none();
                // (Its entry goes before its contents, named beneath it.)
                self.put_or_hold(
                    emit,
                    Item {
                        entry,
                        file: None,
                        dense: true,
                        xattrs,
                        unlisted: inside.is_none() || failed.is_some(),
                        failed,
                        unsent: false,
                    },
                    may_wait,
                )?;
                let (Some(inside), Some((dir, names))) = (inside, listed) else {
                    return Ok(());
                };
                let how = Visit {
                    depth: inside,
                    // (Kept to where the walk went in: an operand's own
                    // file system, with `-x`.)
                    device: Some(how.device.unwrap_or(stat.st_dev)),
                    through_dirlink: false,
                    ..how
                };
                // In a large directory the helper looks up the second half
                // of each block of names while this thread does the first.
                // (The system calls are most of a walk of unchanged files,
                // and on a network filesystem each is a round trip. In
                // blocks, so that what the helper found of a directory of
                // millions of names is held a block at a time.)
                self.walking.push((stat.st_dev, stat.st_ino));
                for block in names.chunks(LOOK_AHEAD_BLOCK) {
                    let half = block.len() / 2;
                    let mut ahead = (self.may_help && block.len() >= LOOK_AHEAD_FROM)
                        .then(|| self.look_ahead(&dir, &block[half..]))
                        .flatten();
                    let mut looked_ahead = Vec::new().into_iter();
                    for (i, n) in block.iter().enumerate() {
                        let named = || format!("{}/{}", shown(), n.to_string_lossy());
                        if i == half
                            && let Some(found) = ahead.take()
                        {
                            // (A helper gone answers nothing: the rest is
                            // looked up here.)
                            looked_ahead = found.recv().unwrap_or_default().into_iter();
                        }
                        let (st, more) = match looked_ahead.next() {
                            Some(Looked { stat, more }) => (stat, Some(more)),
                            None => (
                                rustix::fs::statat(&*dir, n, AtFlags::SYMLINK_NOFOLLOW),
                                None,
                            ),
                        };
                        let mut child = Vec::with_capacity(path.len() + 1 + n.as_bytes().len());
                        child.extend_from_slice(&path);
                        child.push(b'/');
                        child.extend_from_slice(n.as_bytes());
                        let st = match st {
                            Ok(st) => st,
                            // Gone since the directory was read: as rsync,
                            // said (by the side the user started) and
                            // passed over.
                            Err(e @ rustix::io::Errno::NOENT) => {
                                self.put(emit, Item::vanished(child, e))?;
                                continue;
                            }
                            // (A name in a directory that can be listed and
                            // not searched: each fails alone.)
                            Err(e) => {
                                self.put(
                                    emit,
                                    Item::unsent(child, format!("cannot look at it: {e}")),
                                )?;
                                continue;
                            }
                        };
                        self.visit(&dir, n, child, &st, emit, &named, how, more)?;
                    }
                }
                self.walking.pop();
                Ok(())
            }
            _ => self.put(
                emit,
                Item {
                    entry,
                    file: None,
                    dense: true,
                    xattrs,
                    unlisted: false,
                    failed: None,
                    unsent: false,
                },
            ),
        }
    }
}

/// The names in directory `dir` (not `.` and `..`), sorted: a stable
/// order, so the same tree gets the same entry numbers. (Names in a
/// directory are unique: no order among equals to keep.) Read in blocks
/// into one buffer (`RawDir`): each name is copied out once, where
/// `Dir` gave each its own allocation first.
///
/// Read through a descriptor of its own opened from `dir` (as `Dir` reads
/// one), which takes the search permission: a directory that can be read
/// and not searched is then named as one that cannot be listed, as rsync
/// names it ("opendir failed"), rather than each name in it failing.
fn names_in(dir: &OwnedFd) -> rustix::io::Result<Vec<CString>> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let listing = rustix::fs::openat(dir, c".", flags, Mode::empty())?;
    let mut buf = Vec::with_capacity(DIR_READ);
    let mut read = rustix::fs::RawDir::new(&listing, buf.spare_capacity_mut());
    let mut names: Vec<CString> = Vec::new();
    while let Some(d) = read.next() {
        let d = d?;
        let n = d.file_name();
        if !matches!(n.to_bytes(), b"." | b"..") {
            names.push(n.to_owned());
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// Bytes of directory entries asked of the kernel a call: about a
/// thousand short names.
const DIR_READ: usize = 32 << 10;

/// How [`Walker::visit`] treats one name.
#[derive(Debug, Clone, Copy)]
struct Visit {
    /// How far into a directory.
    depth: Depth,
    /// By the filter rules (the directories a listed name implies are
    /// not: they are there for the name's sake).
    filtered: bool,
    /// The file system the walk keeps to with `-x` (`None` at an operand
    /// or a listed name: its own).
    device: Option<u64>,
    /// A symlink to a directory is followed here: it arrives as the
    /// directory ([`Walker::follow_listed_dirlinks`]).
    through_dirlink: bool,
}

/// How far [`Walker::visit`] goes into a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Depth {
    /// Only its entry: `--files-from` without `-r`, and the directories a
    /// listed name implies.
    Itself,
    /// Its entry and those of the names in it (`--files-from` without
    /// `-r`, listed with a trailing `/`).
    Contents,
    /// Everything beneath it (`-r`).
    All,
}

/// Where received entries go: a directory opened once, and how the first
/// path component maps (onto a new name when the destination is not an
/// existing directory).
#[derive(Debug)]
pub struct Base {
    dir: OwnedFd,
    /// `Some(name)`: the entry tree's top component becomes `name`.
    rename_top: Option<Vec<u8>>,
    /// The directories entries went into lately, by their paths as the
    /// peer names them, so that most entries reuse one instead of opening
    /// every component again.
    recent: std::sync::Mutex<RecentDirs>,
    /// The destination's path, where a file's attributes may be compared
    /// by path (see [`Walker::by_path`]).
    disk: Option<Vec<u8>>,
    /// The directories this copy made (device and inode): nothing was in
    /// them before it, so a file received there has nothing to compare with.
    made: std::sync::Mutex<std::collections::HashSet<(u64, u64)>>,
    /// By device: whether files can be made unnamed there, and how they
    /// are linked into place (probed once, [`unnamed::probe`]).
    unnamed: std::sync::Mutex<std::collections::HashMap<u64, Option<Linking>>>,
    /// By device, where files are made durable together: its rounds.
    together: std::sync::Mutex<std::collections::HashMap<u64, Arc<Together>>>,
    /// `--link-dest`: trees laid out as this one, files are linked from
    /// ([`crate::linkdest`]).
    link_dests: Vec<Base>,
    /// What clears a directory standing where a non-directory must go
    /// ([`way`]).
    way: Arc<dyn MakingWay>,
    /// `--backup`: where what is replaced or removed goes, until the
    /// receiver takes it for its rules ([`Base::take_backups`]).
    backups: Option<crate::backup::Backups>,
}

/// The directories entries went into lately, the latest first. Entries of
/// a tree arrive directory by directory, so the first is nearly always the
/// one; the other names of hard links, made last, alternate between the
/// directory of the name and that of the file it links to, anywhere in the
/// tree. With one directory kept, each of those opened both again
/// (`dup`, an `openat` a component, `fstatfs`, `fstat`): on the bench's
/// 100,000-entry tree, 8,200 times in an unchanged re-sync.
///
/// At most 64 are kept, fewer under a low limit on open files (a
/// sixteenth of the sender's window, [`crate::send::ask_ahead`], which is
/// an eighth of the limit): the receiver's other open files, and in a
/// local copy the sender's, need the rest.
#[derive(Debug)]
struct RecentDirs {
    dirs: Vec<Arc<DestDir>>,
    most: usize,
}

impl Default for RecentDirs {
    fn default() -> RecentDirs {
        RecentDirs {
            dirs: Vec::new(),
            most: (crate::send::ask_ahead() / 16).clamp(2, 64),
        }
    }
}

impl RecentDirs {
    /// The directory at `dirs` (as the peer names them), if kept (then it
    /// becomes the latest).
    fn find(&mut self, dirs: &[u8]) -> Option<Arc<DestDir>> {
        let at = self.dirs.iter().position(|d| d.at == dirs)?;
        self.dirs[..=at].rotate_right(1);
        Some(Arc::clone(&self.dirs[0]))
    }

    fn add(&mut self, dir: Arc<DestDir>) {
        self.dirs.insert(0, dir);
        self.dirs.truncate(self.most);
    }
}

/// How a received file's data is made durable before it gets its name.
#[derive(Debug)]
enum Durability {
    /// tmpfs or ramfs: no disk behind it, so there is nothing to sync and
    /// a rename cannot wait for I/O.
    InMemory,
    /// In rounds of one `syncfs` for many files ([`together`]).
    Together(Arc<Together>),
    /// An `fdatasync` of each file.
    EachFile,
}

impl Durability {
    /// Makes `fd`'s data durable: nothing in memory; in a round of its
    /// filesystem's, then its own writeback errors asked; by its own
    /// `fdatasync` where the filesystem has no rounds or its round failed.
    async fn make(&self, fd: &Arc<OwnedFd>, engine: &Engine) -> anyhow::Result<()> {
        let own_sync = match self {
            Durability::InMemory => return Ok(()),
            Durability::Together(rounds) => !rounds.durable().await,
            Durability::EachFile => true,
        };
        if own_sync {
            engine
                .sync(fd, true)
                .await
                .context("cannot sync the data to disk")
        } else {
            rfabric::storage::writeback_errors(&**fd).context("cannot write the data to disk")
        }
    }
}

/// A directory files are received into.
#[derive(Debug)]
pub struct DestDir {
    fd: OwnedFd,
    /// Its path beneath the base as the peer names it (before a renamed
    /// top), the key it is found by among the recent ones.
    at: Vec<u8>,
    /// How files placed in it are made durable first.
    durability: Durability,
    /// Device and inode: which directory it is, whatever fd shows it.
    id: (u64, u64),
    /// Whether it has a default ACL, which files made in it inherit
    /// (asked once, when first wanted).
    passes_acls: std::sync::OnceLock<bool>,
    /// Made by this copy: a file's name in it was free when the copy
    /// began (see [`DestDir::made_here`]).
    made_here: bool,
    /// The owner and group a file made in it gets, where the kernel gives
    /// them by the local rule (this process's; the directory's group if
    /// it is setgid): on tmpfs, ext4, XFS and btrfs. Unknown elsewhere
    /// (NFS maps root to nobody, FUSE decides for itself).
    made_owner: Option<(u32, u32)>,
    /// Whether files can be made unnamed in it, and how they are linked
    /// into place (its device's answer, asked when first wanted).
    unnamed: std::sync::OnceLock<Option<Linking>>,
}

impl DestDir {
    /// Whether this copy made the directory. A received file's name in it
    /// was then free when the copy began, so looking whether something is
    /// there already (a system call per file, all of them answered
    /// "nothing" on a fresh copy) can be left out. Something put there
    /// meanwhile by another process is replaced, as it would be had it come
    /// just after the look: the answer "nothing" only ever sends the file.
    pub(crate) fn made_here(&self) -> bool {
        self.made_here
    }

    fn new(
        fd: OwnedFd,
        at: Vec<u8>,
        made: &std::collections::HashSet<(u64, u64)>,
        together: &mut std::collections::HashMap<u64, Arc<Together>>,
    ) -> rustix::io::Result<DestDir> {
        const TMPFS_MAGIC: u64 = 0x0102_1994;
        const RAMFS_MAGIC: u64 = 0x8584_58f6;
        let st = rustix::fs::fstat(&fd)?;
        let id = (st.st_dev, st.st_ino);
        let f_type = rustix::fs::fstatfs(&fd).map(|s| s.f_type as u64);
        let made_owner = match f_type {
            Ok(t) if t == TMPFS_MAGIC || t == RAMFS_MAGIC || together::syncs_whole(t) => {
                let uid = rustix::process::geteuid().as_raw();
                let gid = if st.st_mode & 0o2000 != 0 {
                    st.st_gid
                } else {
                    rustix::process::getegid().as_raw()
                };
                Some((uid, gid))
            }
            _ => None,
        };
        let durability = match f_type {
            Ok(TMPFS_MAGIC | RAMFS_MAGIC) => Durability::InMemory,
            Ok(f_type)
                if together::syncs_whole(f_type)
                    && together::test_hook() != Some(together::Hook::EachFile) =>
            {
                match together.get(&st.st_dev) {
                    Some(rounds) => Durability::Together(Arc::clone(rounds)),
                    None => {
                        let rounds = Arc::new(Together::new(rustix::io::dup(&fd)?));
                        together.insert(st.st_dev, Arc::clone(&rounds));
                        Durability::Together(rounds)
                    }
                }
            }
            _ => Durability::EachFile,
        };
        Ok(DestDir {
            fd,
            at,
            durability,
            id,
            passes_acls: std::sync::OnceLock::new(),
            made_here: made.contains(&id),
            made_owner,
            unnamed: std::sync::OnceLock::new(),
        })
    }

    /// Whether a file with `mode` and owners `meta` may be made in it with
    /// its final mode at once: nobody but those it is for may reach it
    /// meanwhile (it gets their owner and group here, so no chown
    /// follows), nothing in it waits for its owner's write access (the
    /// attributes set before the mode), no special bits (a chown would
    /// clear them), and no default ACL changes it.
    fn gives_final_mode(&self, mode: u32, meta: &Meta) -> bool {
        mode & 0o7200 == 0o200
            && self.made_owner == Some((meta.uid, meta.gid))
            && !self.passes_acls()
    }

    /// The mode a file made in it with `mode` has (the umask applied),
    /// where nothing else decides it (no default ACL).
    fn made_mode(&self, mode: Mode) -> Option<u32> {
        (!self.passes_acls()).then(|| mode.as_raw_mode() & !umask())
    }

    /// Whether files made in it get an ACL of their own from its default
    /// ACL (an error reading it counts as yes: the attributes are then
    /// read, not assumed).
    fn passes_acls(&self) -> bool {
        *self.passes_acls.get_or_init(|| {
            let name = c"system.posix_acl_default";
            match rustix::fs::fgetxattr_query(&self.fd, name) {
                Ok(n) => n > 0,
                Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => false,
                Err(_) => true,
            }
        })
    }
}

impl AsFd for DestDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Base {
    /// `dir` is opened (confined) already; `rename_top` as above.
    pub fn new(dir: OwnedFd, rename_top: Option<Vec<u8>>) -> Base {
        Base {
            dir,
            rename_top,
            recent: std::sync::Mutex::default(),
            disk: None,
            made: std::sync::Mutex::default(),
            unnamed: std::sync::Mutex::default(),
            together: std::sync::Mutex::default(),
            link_dests: Vec::new(),
            way: Arc::new(EmptyOnly),
            backups: None,
        }
    }

    /// `--backup`: what is replaced or removed here goes to `backups`.
    pub fn backing_up(&mut self, backups: crate::backup::Backups) {
        self.backups = Some(backups);
    }

    pub fn take_backups(&mut self) -> Option<crate::backup::Backups> {
        self.backups.take()
    }

    /// How a directory standing where a non-directory must go is cleared
    /// (by default only an empty one is: see [`way`]), and what is
    /// replaced kept (`--backup`).
    pub fn making_way(&mut self, way: Arc<dyn MakingWay>) {
        self.way = way;
    }

    /// A new descriptor of the directory entry paths start in, and the
    /// name its top takes for a copy under a new name (`--backup-dir`
    /// lays its tree out as the destination's).
    pub fn root(&self) -> anyhow::Result<(OwnedFd, Option<Vec<u8>>)> {
        Ok((rustix::io::dup(&self.dir)?, self.rename_top.clone()))
    }

    /// Whether the entry tree's top takes the destination's own name (a
    /// copy under a new name).
    pub fn renamed(&self) -> bool {
        self.rename_top.is_some()
    }

    /// `--link-dest`: files may be linked from `dests` ([`Base::link_from`]).
    pub fn linking_from(&mut self, dests: Vec<Base>) {
        self.link_dests = dests;
    }

    pub fn link_dests(&self) -> &[Base] {
        &self.link_dests
    }

    /// Lets attributes of files there be compared by path where the
    /// receiving thread cannot compare them by name in the directory:
    /// `dest` is the destination as this process reaches it (the path the
    /// base was opened for). Only for a user's own copy, as
    /// [`Walker::by_path`].
    pub fn by_path(&mut self, dest: Option<Vec<u8>>) {
        self.disk = dest;
    }

    /// Where the entry of `path` is, by path, when it may be reached so.
    pub(crate) fn disk_path(&self, path: &[u8]) -> Option<CString> {
        let mut disk = self.disk.clone()?;
        let parts = relative(path).ok()?;
        // (Renamed, the top is the destination itself.)
        let skip = usize::from(self.rename_top.is_some());
        for part in parts.iter().skip(skip) {
            disk.push(b'/');
            disk.extend_from_slice(part);
        }
        CString::new(disk).ok()
    }

    /// Whether files can be made unnamed in `dir` (see [`unnamed`]), and
    /// how they are linked: its device is probed the first time.
    fn unnamed_in(&self, dir: &DestDir) -> Option<Linking> {
        *dir.unnamed.get_or_init(|| {
            let mut known = self.unnamed.lock().expect("unnamed lock");
            let device = dir.id.0;
            *known.entry(device).or_insert_with(|| unnamed::probe(dir))
        })
    }

    /// Every change to the destination's file system so far on disk
    /// (`syncfs`).
    pub fn sync_file_system(&self) -> rustix::io::Result<()> {
        rustix::fs::syncfs(&self.dir)
    }

    /// Parent directory fd and final name for a peer's entry path. The
    /// directory is looked up among those reached lately by the path's
    /// directories as the peer names them (the base's `rename_top` is
    /// the same for every path): where it is one of them (the usual
    /// case), nothing is allocated but the name.
    pub(crate) fn place(&self, path: &[u8]) -> Result<(Arc<DestDir>, CString), Unreachable> {
        check_relative(path)?;
        let (dirs, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(at) => (&path[..at], &path[at + 1..]),
            None => (&b""[..], path),
        };
        let name = match (&self.rename_top, dirs.is_empty()) {
            (Some(top), true) => top,
            _ => name,
        };
        // (No NUL in the path: checked above. A renamed top with one
        // fails here, or where its directory is opened.)
        let name = CString::new(name).map_err(|_| Unreachable::Forbidden(show(name)))?;
        let mut recent = self.recent.lock().expect("dir cache lock");
        if let Some(dir) = recent.find(dirs) {
            return Ok((dir, name));
        }
        let mut parts: Vec<&[u8]> = match dirs.is_empty() {
            true => Vec::new(),
            false => dirs.split(|&b| b == b'/').collect(),
        };
        if let (Some(top), Some(first)) = (&self.rename_top, parts.first_mut()) {
            *first = top;
        }
        let made = self.made.lock().expect("made dirs lock");
        let mut together = self.together.lock().expect("together lock");
        let fd = open_dir_beneath(&self.dir, &parts)?;
        let dir = DestDir::new(fd, dirs.to_vec(), &made, &mut together)?;
        let dir = Arc::new(dir);
        recent.add(Arc::clone(&dir));
        Ok((dir, name))
    }

    /// A dry run's look at a directory standing where non-directory `e`
    /// would go: what clearing it would remove is named, and nothing is
    /// removed ([`way`]).
    pub fn would_make_way(&self, e: &Entry) -> anyhow::Result<()> {
        let (parent, name) = self.place(&e.path)?;
        let spot = Spot {
            dir: parent.as_fd(),
            name: &name,
            path: &e.path,
            kind: e.kind,
        };
        spot.clear(&*self.way)
    }

    pub fn make_dir(&self, e: &Entry) -> anyhow::Result<()> {
        let (parent, name) = self.place(&e.path)?;
        let made = match rustix::fs::mkdirat(&parent, name.as_c_str(), Mode::from_raw_mode(0o700)) {
            // Something else than a directory has its name (a file, or a
            // symlink, to a directory or not): it goes, as rsync makes way
            // for a directory. Not the destination itself, named as the
            // copy's new name (rsync: "cannot overwrite non-directory with
            // a directory"; `rcp -r dir /dev/null` as root would remove
            // it), which fails below.
            Err(rustix::io::Errno::EXIST)
                if (self.rename_top.is_none() || e.path.contains(&b'/'))
                    && rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| {
                            FileType::from_raw_mode(st.st_mode) != FileType::Directory
                        }) =>
            {
                // (`--backup`: kept under its backup name instead.)
                self.way.back_up(parent.as_fd(), &name, &e.path)?;
                match rustix::fs::unlinkat(&parent, name.as_c_str(), AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
                    Err(e) => Err(e),
                }
                .and_then(|()| {
                    rustix::fs::mkdirat(&parent, name.as_c_str(), Mode::from_raw_mode(0o700))
                })
                .with_context(|| {
                    format!("could not make way for new directory {}", show(&e.path))
                })?;
                Ok(())
            }
            r => r,
        };
        match made {
            Ok(()) => {
                // (Known by its inode: a name can be swapped, not that.)
                if let Ok(st) =
                    rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
                {
                    let mut made = self.made.lock().expect("made dirs lock");
                    made.insert((st.st_dev, st.st_ino));
                }
                Ok(())
            }
            Err(rustix::io::Errno::EXIST) => {
                // Fine if it is a directory (not a symlink to one), even
                // one this user may not open (a copy of a directory of
                // mode 000, say): what goes inside opens it, and fails
                // there if it must.
                let st = rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .with_context(|| format!("cannot create directory {}", show(&e.path)))?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                    bail!(
                        "cannot create directory {}: something else has its name",
                        show(&e.path)
                    );
                }
                Ok(())
            }
            Err(err) => {
                Err(err).with_context(|| format!("cannot create directory {}", show(&e.path)))
            }
        }
    }

    /// Applies a directory's metadata, mode and times, after its contents
    /// arrived: each only where it differs (a re-sync of an unchanged
    /// tree changes no directory).
    /// (`times`: whether its times are set; not with `--backup` without
    /// `--backup-dir`, as rsync's.)
    pub fn finish_dir(
        &self,
        e: &Entry,
        xattrs: &[Xattr],
        how: Fidelity,
        times: bool,
    ) -> anyhow::Result<()> {
        let (parent, name) = self.place(&e.path)?;
        let dir = open_dir_beneath(&parent, &[name.as_bytes()])?;
        let st = rustix::fs::fstat(&dir)?;
        let mut owner_set = false;
        if let Some(meta) = &e.meta {
            let owner_wrong = how.owner_differs(e, &st);
            let attributes_wrong = (how.keep.xattrs || how.keep.acls)
                && how
                    .attributes_differ(Node::Fd(dir.as_fd()), e.kind, xattrs)
                    .unwrap_or(true);
            if owner_wrong || attributes_wrong {
                archive::apply(
                    Node::Fd(dir.as_fd()),
                    e.kind,
                    meta,
                    xattrs,
                    how.keep,
                    how.powers,
                    None,
                )?;
                owner_set = owner_wrong;
            }
        }
        // Without -p, as rsync: a directory this copy made gets the
        // source's mode (after --chmod) less the umask, with the setgid
        // bit it took from its parent; one that was there keeps its own.
        // (Each was 0755 less the umask: a private directory's copy, or
        // one there already, was opened to all.)
        let made_here = || {
            let made = self.made.lock().expect("made dirs lock");
            made.contains(&(st.st_dev, st.st_ino))
        };
        let mode = if how.preserve.modes {
            Some(how.powers.mode(e.mode))
        } else if made_here() {
            Some((e.mode & 0o777 & !umask()) | (st.st_mode & 0o2000))
        } else {
            None
        };
        // (A change of owner may clear setgid: the mode goes after it.)
        if let Some(mode) = mode
            && (owner_set || st.st_mode & 0o7777 != mode)
        {
            rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode))?;
        }
        if times && how.time_differs(e, &st) {
            rustix::fs::futimens(&dir, &self::times(e))?;
        }
        Ok(())
    }

    pub fn make_symlink(&self, e: &Entry, xattrs: &[Xattr], how: Fidelity) -> anyhow::Result<()> {
        let (parent, name) = self.place(&e.path)?;
        let temp = temp_name(&name)?;
        rustix::fs::symlinkat(cstr(&e.target)?.as_c_str(), &parent, temp.as_c_str())
            .with_context(|| format!("cannot create symlink {}", show(&e.path)))?;
        let finish = || {
            if let Some(meta) = &e.meta {
                let node = Node::At(parent.as_fd(), temp.as_c_str());
                archive::apply(node, e.kind, meta, xattrs, how.keep, how.powers, None)?;
            }
            if how.preserve.times {
                rustix::fs::utimensat(
                    &parent,
                    temp.as_c_str(),
                    &times(e),
                    AtFlags::SYMLINK_NOFOLLOW,
                )?;
            }
            Ok(())
        };
        // (The same link there is remade for its metadata, not backed up.)
        let same = self.way.backs_up()
            && rustix::fs::readlinkat(&*parent, name.as_c_str(), Vec::new())
                .is_ok_and(|t| t.as_bytes() == e.target);
        put_in_place(
            &parent,
            &temp,
            &name,
            (&*self.way, &e.path, e.kind, same),
            finish,
            || format!("cannot put symlink {} in place", show(&e.path)),
        )
    }

    /// A FIFO, socket or device node (`-D`), made under a temporary name
    /// and renamed into place with its metadata.
    pub fn make_special(&self, e: &Entry, xattrs: &[Xattr], how: Fidelity) -> anyhow::Result<()> {
        let meta = e
            .meta
            .as_ref()
            .context("a special file without its metadata")?;
        let (file_type, device) = match e.kind {
            EntryKind::Fifo => (FileType::Fifo, false),
            EntryKind::Socket => (FileType::Socket, false),
            EntryKind::CharDevice => (FileType::CharacterDevice, true),
            EntryKind::BlockDevice => (FileType::BlockDevice, true),
            _ => bail!("not a special file"),
        };
        if device && !how.powers.owners {
            bail!(
                "device node {} not created: that needs root (and for rcp serve, --allow-owners)",
                show(&e.path)
            );
        }
        let (parent, name) = self.place(&e.path)?;
        let temp = temp_name(&name)?;
        let rdev = if device { meta.rdev } else { 0 };
        rustix::fs::mknodat(
            &parent,
            temp.as_c_str(),
            file_type,
            Mode::from_raw_mode(0o600),
            rdev,
        )
        .with_context(|| format!("cannot create {}", show(&e.path)))?;
        let finish = || {
            let node = Node::At(parent.as_fd(), temp.as_c_str());
            archive::apply(node, e.kind, meta, xattrs, how.keep, how.powers, None)?;
            rustix::fs::chmodat(
                &parent,
                temp.as_c_str(),
                Mode::from_raw_mode(how.mode_of(e)),
                AtFlags::empty(),
            )?;
            if how.preserve.times {
                rustix::fs::utimensat(
                    &parent,
                    temp.as_c_str(),
                    &times(e),
                    AtFlags::SYMLINK_NOFOLLOW,
                )?;
            }
            Ok(())
        };
        // (The same node there is remade for its metadata, not backed up.)
        let same = self.way.backs_up()
            && rustix::fs::statat(&*parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok_and(
                |st| FileType::from_raw_mode(st.st_mode) == file_type && st.st_rdev == rdev,
            );
        put_in_place(
            &parent,
            &temp,
            &name,
            (&*self.way, &e.path, e.kind, same),
            finish,
            || format!("cannot put {} in place", show(&e.path)),
        )
    }

    /// Another name (`-H`) for the file received as `e.target`, which is in
    /// place already. Returns the directory the name went into (to sync).
    pub fn make_hard_link(&self, e: &Entry, likely_free: bool) -> anyhow::Result<Arc<DestDir>> {
        let (first_dir, first) = self.place(&e.target)?;
        let shown = || format!("cannot link {} to {}", show(&e.path), show(&e.target));
        self.link_in_place(
            &first_dir,
            &first,
            &e.path,
            likely_free,
            Linked::OtherName,
            shown,
        )
    }

    /// `--link-dest`: what is under `e`'s name in `other` (a tree laid out
    /// as this one: a file, a symlink, a special file) linked under `e`'s
    /// name here, in place of what is there; only the one `checked` (its
    /// device and inode, as it was found unchanged): one put there since
    /// is not linked.
    pub fn link_from(
        &self,
        other: &Base,
        e: &Entry,
        checked: (u64, u64),
    ) -> anyhow::Result<Arc<DestDir>> {
        let (from_dir, from) = other.place(&e.path)?;
        let shown = || format!("cannot link {} from a --link-dest", show(&e.path));
        let how = Linked::Checked(checked);
        self.link_in_place(&from_dir, &from, &e.path, false, how, shown)
    }

    /// `first` in `first_dir` (never a directory) linked as `path` here (a
    /// link never replaces what is under its name: a temporary name's link
    /// is renamed over it).
    fn link_in_place(
        &self,
        first_dir: &DestDir,
        first: &CString,
        path: &[u8],
        likely_free: bool,
        how: Linked,
        shown: impl Fn() -> String + Copy,
    ) -> anyhow::Result<Arc<DestDir>> {
        let (parent, name) = self.place(path)?;
        let first_stat = rustix::fs::statat(first_dir, first.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            .with_context(shown)?;
        let kind = FileType::from_raw_mode(first_stat.st_mode);
        if kind == FileType::Directory || how == Linked::OtherName && kind != FileType::RegularFile
        {
            bail!("{}: not a regular file", shown());
        }
        let id = |st: &rustix::fs::Stat| (st.st_dev, st.st_ino);
        if let Linked::Checked(checked) = how
            && id(&first_stat) != checked
        {
            bail!("{}: it changed since it was found unchanged", shown());
        }
        // (A link never replaces what is under its name.)
        let link_as = |to: &CStr| {
            rustix::fs::linkat(first_dir, first.as_c_str(), &parent, to, AtFlags::empty())
        };
        if likely_free {
            // A copy into nothing: linked under its name at once, where
            // the way below costs three more calls a link (the look at the
            // name, a temporary name's random part, the rename).
            match link_as(&name) {
                Ok(()) => return Ok(parent),
                Err(rustix::io::Errno::EXIST) => {}
                Err(err) => return Err(err).with_context(shown),
            }
        }
        if let Ok(st) = rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            && (st.st_dev, st.st_ino) == (first_stat.st_dev, first_stat.st_ino)
        {
            // Linked already (a rename onto the same file would do nothing).
            return Ok(parent);
        }
        let temp = temp_name(&name)?;
        link_as(&temp).with_context(shown)?;
        // (What the temporary name holds is what was checked, or it goes.)
        let still = || match how {
            Linked::Checked(checked) => {
                let st = rustix::fs::statat(&parent, temp.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?;
                if id(&st) != checked {
                    bail!("it changed since it was found unchanged");
                }
                Ok(())
            }
            Linked::OtherName => Ok(()),
        };
        let kind = match kind {
            FileType::RegularFile => EntryKind::File,
            FileType::Symlink => EntryKind::Symlink,
            FileType::CharacterDevice | FileType::BlockDevice => EntryKind::CharDevice,
            _ => EntryKind::Fifo,
        };
        let spot = (&*self.way, path, kind, false);
        put_in_place(&parent, &temp, &name, spot, still, shown)?;
        Ok(parent)
    }
}

/// What the receiver applies to each entry beyond its contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fidelity {
    /// `-p`, `--perms`, `-t`: modes exactly, modification times.
    pub preserve: Preserve,
    /// How a time there compares with the entry's (`--modify-window`):
    /// one within the window is left as it is, as rsync leaves it.
    pub window: TimeMatch,
    /// `-o -g -D -X -A -H`.
    pub keep: Keep,
    /// What this process may do of it.
    pub powers: Powers,
}

impl Fidelity {
    /// The mode a received entry gets: the source's exactly with `-p` or
    /// `--perms` (as far as the powers allow), else its permission bits
    /// under the umask.
    pub(crate) fn mode_of(&self, e: &Entry) -> u32 {
        if self.preserve.modes {
            self.powers.mode(e.mode)
        } else {
            e.mode & 0o777 & !umask()
        }
    }

    /// Whether the owner or group there (`st`) is not what `e` asks and
    /// this process may set.
    pub(crate) fn owner_differs(&self, e: &Entry, st: &rustix::fs::Stat) -> bool {
        e.meta.is_some_and(|m| {
            (self.keep.owner && self.powers.owners && st.st_uid != m.uid)
                || (self.keep.group && st.st_gid != m.gid)
        })
    }

    /// Whether the modification time there (`st`) is not `e`'s, when
    /// `-p` or `-t` keeps it.
    pub(crate) fn time_differs(&self, e: &Entry, st: &rustix::fs::Stat) -> bool {
        let there = (st.st_mtime, st.st_mtime_nsec as u32);
        self.preserve.times && !self.window.same(there, mtime(e))
    }

    /// Whether the attributes of `node` are not `xattrs`, as far as they
    /// are kept and may be set.
    pub(crate) fn attributes_differ(
        &self,
        node: Node<'_>,
        kind: EntryKind,
        xattrs: &[Xattr],
    ) -> anyhow::Result<bool> {
        let there = archive::read_xattrs(node, self.keep)?;
        Ok(!archive::same_xattrs(
            &there,
            xattrs,
            kind,
            self.keep,
            self.powers,
        ))
    }
}

/// Finishes `temp`, made in `parent` already, with `finish`, then renames
/// it to `name`; on any failure the temporary name goes, and the error
/// says `what`.
///
/// What is under `name` is backed up first (`--backup`), unless
/// `remade` (the same symlink or node made again for its metadata), and
/// a directory there cleared by `way` ([`way`]; `path` and `kind` say
/// what the entry is).
fn put_in_place(
    parent: &DestDir,
    temp: &CString,
    name: &CString,
    (way, path, kind, remade): (&dyn MakingWay, &[u8], EntryKind, bool),
    finish: impl FnOnce() -> anyhow::Result<()>,
    what: impl Fn() -> String,
) -> anyhow::Result<()> {
    let as_it_was = Remade(way);
    let way: &dyn MakingWay = if remade { &as_it_was } else { way };
    let placed = match finish() {
        Err(e) => Err(e.context(what())),
        Ok(()) => {
            let spot = Spot {
                dir: parent.as_fd(),
                name,
                path,
                kind,
            };
            spot.put(way, &what, || {
                rustix::fs::renameat(parent, temp.as_c_str(), parent, name.as_c_str())
                    .map_err(Into::into)
            })
        }
    };
    if placed.is_err() {
        let _ = rustix::fs::unlinkat(parent, temp.as_c_str(), AtFlags::empty());
    }
    placed
}

/// What [`Base::link_in_place`] links: another name of a file received
/// (`-H`: a regular file), or what a `--link-dest` tree holds, the one
/// found unchanged (device, inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Linked {
    OtherName,
    Checked((u64, u64)),
}

pub(crate) fn temp_name(name: &CStr) -> anyhow::Result<CString> {
    let mut r = [0u8; 6];
    getrandom::fill(&mut r).expect("OS random source");
    let tag = digest::hex(&r);
    // Keep within NAME_MAX (255) even for long names.
    let name = name.to_bytes();
    let base = &name[..name.len().min(200)];
    let mut t = b".rcp-".to_vec();
    t.extend_from_slice(base);
    t.extend_from_slice(format!(".{tag}.part").as_bytes());
    cstr(&t)
}

/// An entry's modification time, as a stat shows it.
pub(crate) fn mtime(e: &Entry) -> (i64, u32) {
    (e.mtime_sec, e.mtime_nsec)
}

pub(crate) fn times(e: &Entry) -> Timestamps {
    let t = Timespec {
        tv_sec: e.mtime_sec,
        tv_nsec: e.mtime_nsec.into(),
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// The process umask, read once (reading it means setting and restoring
/// it, which must not race with file creation on other threads later on).
pub fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        let old = rustix::process::umask(Mode::from_raw_mode(0o022));
        rustix::process::umask(old);
        old.bits()
    })
}

pub fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// The last component of a local path, as bytes.
pub fn file_name(path: &Path) -> anyhow::Result<Vec<u8>> {
    path.file_name()
        .map(|n| n.as_bytes().to_vec())
        .with_context(|| format!("{} has no file name", path.display()))
}

pub fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// Directories whose entries changed, each synced before the copy
/// reports success, so that every rename survives a crash.
///
/// A directory is kept open until its sync, and a tree may have more
/// directories than the process may open files: a local copy of 3,000
/// directories under a limit of 1,024 open files failed with `EMFILE`
/// when each stayed open to the end. So at most
/// [`DirSyncs::new`]'s `most` wait at once; past that they are synced
/// there and then, on a task of their own, and let go (a directory that
/// gets another entry afterwards waits again). Directories in memory
/// (tmpfs, ramfs) have nothing to sync and are not kept.
#[derive(Debug)]
pub struct DirSyncs {
    engine: Engine,
    most: usize,
    waiting: std::collections::HashMap<(u64, u64), Arc<DestDir>>,
    /// Syncs started early: their outcomes count at the end.
    started: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl DirSyncs {
    /// Keeps at most `most` directories open (at least one), synced on
    /// `engine`.
    pub fn new(engine: Engine, most: usize) -> DirSyncs {
        DirSyncs {
            engine,
            most: most.max(1),
            waiting: Default::default(),
            started: Vec::new(),
        }
    }

    /// A directory an entry was placed in. (Called on a runtime: the
    /// syncs started early are tasks.)
    pub fn add(&mut self, dir: Arc<DestDir>) {
        if matches!(dir.durability, Durability::InMemory) {
            return;
        }
        self.waiting.entry(dir.id).or_insert(dir);
        if self.waiting.len() >= self.most {
            let dirs = std::mem::take(&mut self.waiting);
            self.started
                .push(tokio::spawn(sync_dirs(self.engine.clone(), dirs)));
        }
    }

    /// Every directory added so far is synced: the ones still waiting,
    /// started now all at once, and those started early. (Taken out
    /// under the caller's lock; awaited after it.)
    pub fn all_synced(&mut self) -> impl Future<Output = anyhow::Result<()>> + use<> {
        let mut started = std::mem::take(&mut self.started);
        let waiting = std::mem::take(&mut self.waiting);
        started.push(tokio::spawn(sync_dirs(self.engine.clone(), waiting)));
        async move {
            for sync in started {
                sync.await??;
            }
            Ok(())
        }
    }
}

/// `fsync` of each of `dirs`, all in flight at once on `engine`.
async fn sync_dirs(
    engine: Engine,
    dirs: std::collections::HashMap<(u64, u64), Arc<DestDir>>,
) -> anyhow::Result<()> {
    let syncs: Vec<_> = dirs
        .into_values()
        .map(|dir| {
            let engine = engine.clone();
            tokio::spawn(async move { engine.sync(&dir, false).await })
        })
        .collect();
    for sync in syncs {
        sync.await?.context("cannot sync a directory")?;
    }
    Ok(())
}

/// Commits `out` (entry `e`, written whole, no metadata kept) on a threads
/// engine and a runtime of its own: for tests that make files by hand.
#[cfg(test)]
pub(crate) fn commit_whole(out: PartFile, e: &Entry) -> anyhow::Result<()> {
    let engine = Engine::start(rfabric::storage::Kind::Threads, None)?;
    let how = Fidelity {
        preserve: Preserve::default(),
        window: TimeMatch::Exact,
        keep: Keep::default(),
        powers: Powers::here(false),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(out.commit(e, &[], how, true, &engine))
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk's helper looks up the second half of each block of a large
    /// directory's names: the walk gives the same entries, in the same
    /// order, with the same metadata and attributes, with it as without.
    #[test]
    fn a_walk_with_its_helper_gives_what_it_gives_alone() {
        let scratch = test_support::Scratch::new("rcp-walk-helper");
        let top = scratch.path("top");
        std::fs::create_dir_all(top.join("sub")).unwrap();
        for i in 0..150 {
            let p = top.join(format!("f{i:03}"));
            std::fs::write(&p, vec![b'x'; i]).unwrap();
            if i % 4 == 0 {
                let name = format!("user.n{i}");
                rustix::fs::lsetxattr(&p, name.as_str(), b"v", rustix::fs::XattrFlags::empty())
                    .unwrap();
            }
            if i % 10 == 0 {
                std::os::unix::fs::symlink(format!("f{i:03}"), top.join(format!("l{i:03}")))
                    .unwrap();
            }
            if i % 25 == 0 {
                std::fs::hard_link(&p, top.join(format!("h{i:03}"))).unwrap();
            }
        }
        // (More than a block of names: the helper takes part of each.)
        for i in 0..LOOK_AHEAD_BLOCK + 76 {
            std::fs::write(top.join(format!("sub/g{i}")), b"y").unwrap();
        }
        // And a directory walked while the helper still looks up the
        // second half of its parent's names (its own wait behind them).
        std::fs::create_dir(top.join("a-sub")).unwrap();
        for i in 0..100 {
            std::fs::write(top.join(format!("a-sub/k{i}")), b"z").unwrap();
        }
        let keep = Keep {
            xattrs: true,
            hard_links: true,
            owner: true,
            group: true,
            ..Keep::default()
        };
        let walk = |helper: bool| {
            let mut walker = Walker::new(true, keep, Arc::default());
            walker.with_helper(helper);
            let parent = open_root(scratch.dir()).unwrap();
            let mut seen = Vec::new();
            walker
                .walk(&parent, b"top", b"top", &mut |item| {
                    seen.push((format!("{:?}", item.entry), item.xattrs));
                    Ok(())
                })
                .unwrap();
            (seen, walker.helper.is_some())
        };
        let (alone, no_helper) = walk(false);
        let (helped, had_helper) = walk(true);
        assert!(!no_helper && had_helper, "the helper ran only when allowed");
        assert_eq!(
            alone.len(),
            1 + 150 + 15 + 6 + 2 + LOOK_AHEAD_BLOCK + 76 + 100
        );
        assert_eq!(alone.iter().filter(|(_, x)| !x.is_empty()).count(), 38);
        assert_eq!(helped, alone);
    }

    /// `-m`: a directory goes only with a non-directory beneath it, before
    /// it, and the entries sent are numbered without a gap where
    /// directories were left out; a hard link's first name is one sent.
    #[test]
    fn pruning_leaves_out_directories_with_only_directories_beneath() {
        let scratch = test_support::Scratch::new("rcp-prune-walk");
        let top = scratch.path("top");
        for d in ["a/empty/deeper", "a/full", "b/c/d", "e", "g"] {
            std::fs::create_dir_all(top.join(d)).unwrap();
        }
        std::fs::write(top.join("a/full/f"), b"x").unwrap();
        std::fs::write(top.join("e/f"), b"y").unwrap();
        std::fs::hard_link(top.join("e/f"), top.join("e/g")).unwrap();
        std::os::unix::fs::symlink("nowhere", top.join("g/l")).unwrap();
        let walk = |prune: bool, top_name: &str| {
            let keep = Keep {
                hard_links: true,
                ..Keep::default()
            };
            let mut walker = Walker::new(true, keep, Arc::default());
            walker.prune_empty_dirs(prune);
            let parent = open_root(scratch.dir()).unwrap();
            let mut seen = Vec::new();
            walker
                .walk(
                    &parent,
                    top_name.as_bytes(),
                    top_name.as_bytes(),
                    &mut |item| {
                        seen.push((
                            item.entry.index,
                            String::from_utf8(item.entry.path).unwrap(),
                            item.entry.kind,
                        ));
                        Ok(())
                    },
                )
                .unwrap();
            seen
        };
        let paths = |seen: &[(u32, String, EntryKind)]| -> Vec<String> {
            seen.iter().map(|(_, p, _)| p.clone()).collect()
        };
        let pruned = walk(true, "top");
        assert_eq!(
            paths(&pruned),
            [
                "top",
                "top/a",
                "top/a/full",
                "top/a/full/f",
                "top/e",
                "top/e/f",
                "top/e/g",
                "top/g",
                "top/g/l"
            ]
        );
        assert!(
            pruned
                .iter()
                .any(|(_, p, k)| p == "top/e/g" && *k == EntryKind::HardLink),
            "another name of a file sent"
        );
        let numbers: Vec<u32> = pruned.iter().map(|(i, _, _)| *i).collect();
        assert_eq!(numbers, (0..9).collect::<Vec<u32>>(), "no gap");
        assert_eq!(walk(false, "top").len(), 14, "everything without -m");
        // An operand with nothing but directories in it goes neither.
        assert!(walk(true, "top/b").is_empty());
    }

    #[test]
    fn entries_are_found_by_path_where_the_base_allows_it() {
        let dest = || open_root(Path::new("/")).unwrap();
        let mut into = Base::new(dest(), None);
        assert_eq!(into.disk_path(b"top/a/f"), None, "descriptors only");
        into.by_path(Some(b"/data/dest".to_vec()));
        assert_eq!(
            into.disk_path(b"top/a/f").unwrap().as_bytes(),
            b"/data/dest/top/a/f"
        );
        // Renamed: the top is the destination itself.
        let mut renamed = Base::new(dest(), Some(b"copy".to_vec()));
        renamed.by_path(Some(b"/data/copy".to_vec()));
        assert_eq!(renamed.disk_path(b"top").unwrap().as_bytes(), b"/data/copy");
        assert_eq!(
            renamed.disk_path(b"top/a/f").unwrap().as_bytes(),
            b"/data/copy/a/f"
        );
        assert_eq!(
            renamed.disk_path(b"top/../x"),
            None,
            "checked as every entry path"
        );
        // The walk's side: the operand's path and the entry path past its top.
        let mut walk = Walker::new(true, Keep::default(), Arc::default());
        assert_eq!(walk.disk_path(b"src/a"), None);
        walk.by_path(Some(b"../from/src"), b"src");
        assert_eq!(
            walk.disk_path(b"src/a/f").unwrap().as_bytes(),
            b"../from/src/a/f"
        );
        assert_eq!(walk.disk_path(b"src").unwrap().as_bytes(), b"../from/src");
    }

    /// A place is found through the directories as the peer names them,
    /// renamed top or not; a directory not there is a plain error, which
    /// says which component and why, as before.
    #[test]
    fn places_are_found_beneath_the_base_and_unreachable_ones_said() {
        let scratch = test_support::Scratch::new("rcp-place");
        std::fs::create_dir_all(scratch.path("top/a/b")).unwrap();
        std::fs::create_dir_all(scratch.path("copy/a")).unwrap();
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let in_dir = |base: &Base, path: &str| {
            let (dir, name) = base.place(path.as_bytes()).unwrap();
            let made = rustix::fs::openat(
                &*dir,
                name.as_c_str(),
                OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            );
            drop(made.unwrap());
            dir
        };
        let first = in_dir(&base, "top/a/b/f");
        let second = in_dir(&base, "top/a/b/g");
        assert!(Arc::ptr_eq(&first, &second), "the directory reached once");
        in_dir(&base, "top/a/h");
        in_dir(&base, "top2");
        for made in ["top/a/b/f", "top/a/b/g", "top/a/h", "top2"] {
            assert!(scratch.path(made).is_file(), "{made}");
        }
        // Renamed: the top is `copy`, whatever the peer calls it.
        let renamed = Base::new(open_root(scratch.dir()).unwrap(), Some(b"copy".to_vec()));
        in_dir(&renamed, "top/a/f");
        assert!(scratch.path("copy/a/f").is_file());
        assert_eq!(renamed.place(b"top").unwrap().1.as_bytes(), b"copy");
        // Not there, and not allowed.
        let err = base.place(b"top/gone/deeper/f").unwrap_err();
        assert_eq!(err.errno(), Some(rustix::io::Errno::NOENT));
        assert_eq!(
            err.to_string(),
            "cannot open directory \"gone\" (missing, not a directory, or a symlink)"
        );
        // The system's error stays in the chain, for the exit status (5,
        // local I/O) and a failure's kind, as when these were `anyhow`'s.
        let io = |e: Unreachable| crate::exit::Exit::of_error(&anyhow::Error::from(e));
        assert_eq!(io(err), crate::exit::Exit::Io);
        let no_descriptors = || Unreachable::from(rustix::io::Errno::MFILE);
        assert!(
            format!("{:#}", anyhow::Error::from(no_descriptors()))
                .starts_with("cannot reach the directory: "),
        );
        assert_eq!(io(no_descriptors()), crate::exit::Exit::Io);
        std::os::unix::fs::symlink("a", scratch.path("top/link")).unwrap();
        let err = base.place(b"top/link/f").unwrap_err();
        // (`O_DIRECTORY | O_NOFOLLOW` on a symlink: not a directory.)
        assert_eq!(
            err.errno(),
            Some(rustix::io::Errno::NOTDIR),
            "never through a symlink"
        );
        assert!(
            std::fs::read_dir(scratch.path("top/link")).is_ok(),
            "where it leads is one"
        );
        for bad in ["top/../x", "/top/f", "top//f", "top/./f", ""] {
            let err = base.place(bad.as_bytes()).unwrap_err();
            assert!(err.errno().is_none(), "{bad:?}: {err}");
            assert!(err.to_string().starts_with("path "), "{bad:?}: {err}");
        }
    }

    /// A file received into a directory this copy made is not looked for
    /// (nothing was there when the copy began); in a directory that was
    /// there already, and for any other copy, it is.
    /// Another name of a file goes in whether or not the copy expects
    /// its name to be free: linked there, what was under it replaced, a
    /// link already there kept, and never to anything but a file.
    #[test]
    fn hard_links_go_in_whatever_is_under_their_name() {
        use std::os::unix::fs::MetadataExt;
        let scratch = test_support::Scratch::new("rcp-hard-links");
        let entry = |kind, path: &str, target: &str| Entry {
            index: 0,
            kind,
            mode: 0o644,
            mtime_sec: 0,
            mtime_nsec: 0,
            size: 0,
            path: path.as_bytes().to_vec(),
            target: target.as_bytes().to_vec(),
            chunk: 4096,
            meta: None,
        };
        std::fs::write(scratch.path("first"), b"data").unwrap();
        std::fs::write(scratch.path("taken"), b"other").unwrap();
        std::fs::create_dir(scratch.path("dir")).unwrap();
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let ino = |name: &str| std::fs::symlink_metadata(scratch.path(name)).unwrap().ino();
        for likely_free in [true, false] {
            for name in ["free", "taken"] {
                base.make_hard_link(&entry(EntryKind::HardLink, name, "first"), likely_free)
                    .unwrap();
                assert_eq!(ino(name), ino("first"), "{name}, {likely_free}");
                assert_eq!(std::fs::read(scratch.path(name)).unwrap(), b"data");
            }
            // Linked already: kept.
            base.make_hard_link(&entry(EntryKind::HardLink, "free", "first"), likely_free)
                .unwrap();
            assert_eq!(ino("free"), ino("first"));
            // (Unlinked first: a write through the link would reach the
            // first name too.)
            std::fs::remove_file(scratch.path("free")).unwrap();
            std::fs::remove_file(scratch.path("taken")).unwrap();
            std::fs::write(scratch.path("taken"), b"other").unwrap();
            // Never a link to a directory, nor a name left behind.
            let e = entry(EntryKind::HardLink, "to-dir", "dir");
            assert!(base.make_hard_link(&e, likely_free).is_err());
            assert!(!scratch.path("to-dir").exists());
        }
        let names: Vec<_> = std::fs::read_dir(scratch.dir())
            .unwrap()
            .map(|d| d.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(names.is_empty(), "temporary names left: {names:?}");
    }

    #[test]
    fn files_in_directories_this_copy_made_are_not_looked_for() {
        use crate::existing::look;
        use crate::resync::Found;
        let scratch = test_support::Scratch::new("rcp-made-dirs");
        std::fs::create_dir(scratch.path("old")).unwrap();
        let entry = |kind, path: &str| Entry {
            index: 0,
            kind,
            mode: 0o755,
            mtime_sec: 0,
            mtime_nsec: 0,
            size: 0,
            path: path.as_bytes().to_vec(),
            target: Vec::new(),
            chunk: 4096,
            meta: None,
        };
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        base.make_dir(&entry(EntryKind::Dir, "old")).unwrap();
        base.make_dir(&entry(EntryKind::Dir, "new")).unwrap();
        base.make_dir(&entry(EntryKind::Dir, "new/sub")).unwrap();
        // Files put there behind the copy's back.
        for f in ["old/f", "new/f", "new/sub/f"] {
            std::fs::write(scratch.path(f), b"abc").unwrap();
        }
        let found = |base: &Base, path| look(base, &entry(EntryKind::File, path)).unwrap().0;
        assert!(matches!(found(&base, "old/f"), Found::File { size: 3, .. }));
        assert_eq!(found(&base, "new/f"), Found::Nothing, "made by this copy");
        assert_eq!(found(&base, "new/sub/f"), Found::Nothing);
        // Another copy did not make them: it looks.
        let other = Base::new(open_root(scratch.dir()).unwrap(), None);
        assert!(matches!(
            found(&other, "new/f"),
            Found::File { size: 3, .. }
        ));
    }

    /// The other names of hard links, made last, alternate between two
    /// directories anywhere in the tree: each is opened once while it is
    /// among the latest kept, and no more than that many stay open.
    #[test]
    fn recent_directories_are_reused_and_bounded() {
        let scratch = test_support::Scratch::new("rcp-recent-dirs");
        let most = RecentDirs::default().most;
        let count = most + 8;
        for i in 0..count {
            std::fs::create_dir_all(scratch.path(&format!("top/d{i}"))).unwrap();
        }
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let place = |i: usize| base.place(format!("top/d{i}/f").as_bytes()).unwrap().0;
        // A link in d1 to a file in d7, and back: the same two directories.
        let (first, target) = (place(1), place(7));
        for _ in 0..3 {
            assert!(Arc::ptr_eq(&first, &place(1)));
            assert!(Arc::ptr_eq(&target, &place(7)));
        }
        // Every directory once: the earliest fall out, the latest stay.
        for i in 0..count {
            place(i);
        }
        assert_eq!(base.recent.lock().unwrap().dirs.len(), most);
        let latest = place(count - 1);
        assert!(Arc::ptr_eq(&latest, &place(count - 1)));
        assert!(!Arc::ptr_eq(&first, &place(1)), "opened again");
    }

    /// A file of `size` bytes (5 to 8) named `name`, in chunks of 4: two
    /// of them (a file of one is made unnamed, see unnamed.rs).
    fn file_of_two_chunks(name: &str, size: u64) -> Entry {
        Entry {
            index: 0,
            kind: EntryKind::File,
            mode: 0o644,
            mtime_sec: 0,
            mtime_nsec: 0,
            size,
            path: name.as_bytes().to_vec(),
            target: Vec::new(),
            chunk: 4,
            meta: None,
        }
    }

    /// What an earlier copy left under the temporary name: `--partial`
    /// keeps it when it holds something, and says so; otherwise, and
    /// without `--partial` or `--resume`, the file starts empty.
    #[test]
    fn a_leftover_is_taken_up_only_with_something_in_it() {
        let scratch = test_support::Scratch::new("rcp-take-up");
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let e = file_of_two_chunks("f", 8);
        let temp = scratch.path(".rcp-f.part");
        let open = |leftover| match base.create_file(&e, leftover, None).unwrap() {
            Opened::Ready(p) => p,
            Opened::Busy => panic!("held by another copy"),
        };
        // Nothing left: made afresh, nothing taken up.
        let out = open(Leftover::TakeUp);
        assert!(!out.taken_up());
        rustix::io::pwrite(&out.fd, b"half", 0).unwrap();
        drop(out);
        // Something left: kept as it is.
        let out = open(Leftover::TakeUp);
        assert!(out.taken_up());
        assert_eq!(std::fs::read(&temp).unwrap(), b"half");
        drop(out);
        // Without --partial it starts empty.
        let out = open(Leftover::Discard);
        assert!(!out.taken_up());
        assert_eq!(std::fs::read(&temp).unwrap(), b"");
        drop(out);
        // An empty leftover is no leftover.
        let out = open(Leftover::TakeUp);
        assert!(!out.taken_up());
        drop(out);
        // One with another name too (a snapshot made with links) is not
        // written into, whatever the choice: its other name keeps it.
        std::fs::write(&temp, b"half").unwrap();
        let other = scratch.path("snapshot-of-part");
        std::fs::hard_link(&temp, &other).unwrap();
        for leftover in [Leftover::TakeUp, Leftover::Resume, Leftover::Discard] {
            let out = open(leftover);
            // (A resumed file is one to fill whatever it holds.)
            assert!(leftover == Leftover::Resume || !out.taken_up());
            assert!(std::fs::read(&temp).unwrap().is_empty(), "{leftover:?}");
            rustix::io::pwrite(&out.fd, b"new", 0).unwrap();
            assert_eq!(std::fs::read(&other).unwrap(), b"half", "{leftover:?}");
            out.discard();
            std::fs::hard_link(&other, &temp).unwrap();
        }
        std::fs::remove_file(&temp).unwrap();
        assert!(!temp.exists());
    }

    /// Two copies to one place (a daemon still ending the session of a
    /// killed client while the client's `--resume` starts the next): the
    /// second waits for the temporary file, and neither removes, truncates
    /// or writes into the other's.
    #[test]
    fn a_temporary_file_belongs_to_one_copy_at_a_time() {
        use std::os::unix::fs::FileTypeExt;
        let scratch = test_support::Scratch::new("rcp-part-lock");
        let base = || Base::new(open_root(scratch.dir()).unwrap(), None);
        let (old, new) = (base(), base());
        let e = file_of_two_chunks("f", 5);
        let ready = |o: Opened| match o {
            Opened::Ready(p) => p,
            Opened::Busy => panic!("held by another copy"),
        };
        let busy = |o: Opened| matches!(o, Opened::Busy);
        let temp = scratch.path(".rcp-f.part");

        // The old copy writes; the new one, resuming or not, waits.
        let held = ready(old.create_file(&e, Leftover::Discard, None).unwrap());
        rustix::io::pwrite(&held.fd, b"old", 0).unwrap();
        assert!(busy(new.create_file(&e, Leftover::Resume, None).unwrap()));
        assert!(busy(new.create_file(&e, Leftover::Discard, None).unwrap()));
        assert_eq!(std::fs::read(&temp).unwrap(), b"old", "not truncated");

        // The old copy removes its file: the new one gets a file of its own.
        held.discard();
        let mine = ready(new.create_file(&e, Leftover::Resume, None).unwrap());
        rustix::io::pwrite(&mine.fd, b"new", 0).unwrap();
        assert!(busy(old.create_file(&e, Leftover::Resume, None).unwrap()));
        assert_eq!(std::fs::read(&temp).unwrap(), b"new");

        // A copy that finishes renames its file while another waits for
        // it: the waiter starts over from what is there under the final
        // name, and its rename works.
        rustix::io::pwrite(&mine.fd, b"new!!", 0).unwrap();
        commit_whole(mine, &e).unwrap();
        assert_eq!(std::fs::read(scratch.path("f")).unwrap(), b"new!!");
        let after = ready(old.create_file(&e, Leftover::Resume, None).unwrap());
        assert_eq!(
            std::fs::read(&temp).unwrap(),
            b"new!!",
            "resumed from the final file"
        );
        rustix::io::pwrite(&after.fd, b"again", 0).unwrap();
        commit_whole(after, &e).unwrap();
        assert_eq!(std::fs::read(scratch.path("f")).unwrap(), b"again");
        assert!(!temp.exists());

        // Something else under the temporary name is named, and left.
        let fifo = scratch.path(".rcp-f.part");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        for leftover in [Leftover::Discard, Leftover::Resume, Leftover::TakeUp] {
            let err = old.create_file(&e, leftover, None).unwrap_err().to_string();
            assert!(
                err.contains("is in the way and not a regular file"),
                "{err}"
            );
        }
        assert!(
            std::fs::symlink_metadata(&fifo)
                .unwrap()
                .file_type()
                .is_fifo()
        );
    }

    #[test]
    fn relative_paths_are_checked() {
        assert_eq!(relative("a/b c/ü".as_bytes()).unwrap().len(), 3);
        for bad in [
            &b""[..],
            b"/a",
            b"a/../b",
            b"..",
            b"a//b",
            b"./a",
            b"a/",
            b"a\0b",
        ] {
            assert!(relative(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn roots_confine_absolute_paths() {
        let roots = vec![PathBuf::from("/srv/a"), PathBuf::from("/srv/a/deep")];
        let (r, parts) = under_roots(Path::new("/srv/a/deep/x/y"), &roots).unwrap();
        assert_eq!(r, &roots[1]);
        assert_eq!(parts, vec![&b"x"[..], b"y"]);
        assert!(under_roots(Path::new("/srv/b/x"), &roots).is_err());
        assert!(under_roots(Path::new("/srv/a/../b"), &roots).is_err());
        assert!(under_roots(Path::new("srv/a/x"), &roots).is_err());
        assert!(under_roots(Path::new("/srv/ab"), &roots).is_err());
    }
}
