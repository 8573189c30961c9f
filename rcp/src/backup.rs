//! `--backup` (`-b`), `--backup-dir DIR`, `--suffix SUFFIX`, as rsync's:
//! what the copy replaces or removes at the destination is renamed
//! instead of lost.
//!
//! * A file, symlink or special file replaced by what the copy sends (new
//!   data, or an entry of another kind) is linked under its backup's name
//!   just before the new one is renamed over it: the name never goes
//!   missing ([`Backups::back_up`]; rsync renames it away first).
//! * One `--delete` removes (or a directory in the way is cleared of,
//!   see `tree/way.rs`) is renamed to its backup instead. Directories are
//!   not backed up: what they hold is, and they go once empty.
//! * The backup of `d/name` is `d/name~` (the suffix, `~` by default), or
//!   with `--backup-dir DIR` it is `DIR/d/name` plus the suffix (none by
//!   default), in directories made as needed with the modes of the
//!   destination's. A relative DIR is relative to the destination, as
//!   `--link-dest`'s, opened (and made) at the first backup. An earlier
//!   backup of that name is replaced.
//! * Without `--backup-dir`, `--delete` leaves the names that end in the
//!   suffix (rsync adds the rule `P *~`), and directory times are not
//!   set (rsync forces `--omit-dir-times`: each backup made in a
//!   directory dates it).
//!
//! Links and renames only: a backup is never a copy, so it costs a call
//! or two a file, and `--backup-dir` must be on the destination's file
//! system (a file whose backup cannot be made there fails, and stays as
//! it was). Only the entry itself moves: a name is linked or renamed,
//! never followed.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::tree;

/// Why a suffix cannot be used. **Sans I/O.**
pub fn check_suffix(suffix: &[u8], with_dir: bool) -> Result<(), &'static str> {
    if suffix.contains(&b'/') || suffix.contains(&0) {
        return Err("--suffix may not hold a '/'");
    }
    if suffix.is_empty() && !with_dir {
        return Err("--suffix may be empty only with --backup-dir");
    }
    Ok(())
}

/// The backup name of `name` with `suffix`. **Sans I/O.**
pub fn backup_name(name: &[u8], suffix: &[u8]) -> Vec<u8> {
    [name, suffix].concat()
}

/// Where and how a copy's backups are made.
#[derive(Debug)]
pub struct Backups {
    suffix: Vec<u8>,
    dir: Option<BackupDir>,
}

/// Opens the backup directory, given whether the copy's top is a file
/// under a new name (then a relative DIR is relative to the directory
/// that file is in, as rsync's): made where missing.
pub type OpenDir = Box<dyn Fn(bool) -> anyhow::Result<OwnedFd> + Send + Sync>;

/// `--backup-dir`: a tree laid out as the destination.
struct BackupDir {
    /// Opened at the first backup: a dry run, or a run that replaces
    /// nothing, makes no directory.
    open: OpenDir,
    root: std::sync::OnceLock<Result<OwnedFd, String>>,
    /// The destination's base (whose directories' modes the ones made in
    /// the backup tree take).
    dest: OwnedFd,
    /// A copy under a new name: the entry tree's top is the destination
    /// itself, so the backup directory itself in the backup tree; else
    /// the top is a name in both.
    top: Option<Vec<u8>>,
    /// The backup directory reached last, by the entry path's
    /// directories: backups come a directory at a time.
    last: Mutex<Option<(Vec<u8>, Arc<OwnedFd>)>>,
}

impl std::fmt::Debug for BackupDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupDir")
            .field("root", &self.root)
            .field("top", &self.top)
            .finish_non_exhaustive()
    }
}

/// Where a backup goes: a directory, and the name in it.
enum Target {
    /// Beside the file, in its own directory.
    Beside(CString),
    In(Arc<OwnedFd>, CString),
}

impl Backups {
    /// Backups beside what they back up, `suffix` (checked) added.
    pub fn beside(suffix: Vec<u8>) -> Backups {
        Backups { suffix, dir: None }
    }

    /// Backups in the directory `open` opens, laid out as the destination
    /// whose base is `dest` (see `tree::Base`; `top`, the name of a copy
    /// under a new name, which the backup directory itself stands for).
    pub fn into_dir(
        suffix: Vec<u8>,
        open: OpenDir,
        dest: OwnedFd,
        top: Option<Vec<u8>>,
    ) -> Backups {
        let dir = BackupDir {
            open,
            root: std::sync::OnceLock::new(),
            dest,
            top,
            last: Mutex::new(None),
        };
        Backups {
            suffix,
            dir: Some(dir),
        }
    }

    /// Whether `--delete` leaves entry `path`: a backup made beside what
    /// it backs up (rsync's `P *~`).
    pub fn protects(&self, path: &[u8]) -> bool {
        let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        self.dir.is_none() && name.ends_with(&self.suffix)
    }

    /// Whether backups stay in their files' directories (no
    /// `--backup-dir`): then directory times are left as they are, and a
    /// directory `--delete` empties stays, holding them.
    pub fn beside_their_files(&self) -> bool {
        self.dir.is_none()
    }

    /// Keeps what stands under `name` in `dir` (entry path `path`), unless
    /// nothing or a directory stands there, as its backup, before an
    /// entry is renamed over it: linked under a temporary name beside
    /// the backup and renamed onto it (an earlier backup of it replaced
    /// at once, and kept if anything fails), so that the name holds the
    /// old entry until the new one replaces it, and still holds it if
    /// that fails. (Where it cannot be linked, as a file of another owner
    /// under `protected_hardlinks`, or on a file system without links, it
    /// is renamed.)
    pub fn back_up(&self, dir: BorrowedFd<'_>, name: &CStr, path: &[u8]) -> anyhow::Result<()> {
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Directory => {}
            Ok(_) | Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let shown = || format!("cannot back up {}", tree::show(path));
        let target = self.target(dir, name, path).with_context(shown)?;
        let (into, to) = target.at(dir);
        let temp = loop {
            let temp = tree::temp_name(to)?;
            match rustix::fs::linkat(dir, name, into, temp.as_c_str(), AtFlags::empty()) {
                Ok(()) => break temp,
                Err(Errno::EXIST) => continue,
                Err(Errno::PERM | Errno::MLINK | Errno::OPNOTSUPP | Errno::NOSYS) => {
                    return self.rename_onto(dir, name, into, to).with_context(shown);
                }
                Err(e) => return Err(on_another_fs(e)).with_context(shown),
            }
        };
        self.rename_onto(into, &temp, into, to)
            .inspect_err(|_| {
                let _ = rustix::fs::unlinkat(into, temp.as_c_str(), AtFlags::empty());
            })
            .with_context(shown)
    }

    /// Renames non-directory `name` in `dir` (entry path `path`) to its
    /// backup, as `--delete` removes it (an earlier backup of it
    /// replaced). A backup beside its file is not backed up again, as
    /// rsync's: it goes (`--delete-excluded`, a directory cleared).
    pub fn move_away(&self, dir: BorrowedFd<'_>, name: &CStr, path: &[u8]) -> anyhow::Result<()> {
        let shown = || format!("cannot back up {}", tree::show(path));
        if self.protects(path) {
            return rustix::fs::unlinkat(dir, name, AtFlags::empty()).with_context(shown);
        }
        let target = self.target(dir, name, path).with_context(shown)?;
        let (into, to) = target.at(dir);
        self.rename_onto(dir, name, into, to).with_context(shown)
    }

    /// The name the backup of `name` takes.
    pub fn name_of(&self, name: &[u8]) -> Vec<u8> {
        backup_name(name, &self.suffix)
    }

    /// Renames `name` in `dir` onto `to` in `into`, replacing what is
    /// there at once: a non-directory, or in a `--backup-dir` an empty
    /// directory (rsync's); another name of the same file is not
    /// replaced by a rename (it would do nothing), so `name` goes.
    fn rename_onto(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        into: BorrowedFd<'_>,
        to: &CStr,
    ) -> anyhow::Result<()> {
        let id = |d: BorrowedFd<'_>, n: &CStr| {
            rustix::fs::statat(d, n, AtFlags::SYMLINK_NOFOLLOW).map(|st| (st.st_dev, st.st_ino))
        };
        if let Ok(there) = id(into, to)
            && id(dir, name).is_ok_and(|here| here == there)
        {
            return Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?);
        }
        match rustix::fs::renameat(dir, name, into, to) {
            Err(Errno::ISDIR) if self.dir.is_some() => {
                rustix::fs::unlinkat(into, to, AtFlags::REMOVEDIR)
                    .context("a directory with something in it stands where the backup goes")?;
                Ok(rustix::fs::renameat(dir, name, into, to).map_err(on_another_fs)?)
            }
            Err(Errno::ISDIR) => bail!("a directory stands where the backup goes"),
            r => Ok(r.map_err(on_another_fs)?),
        }
    }

    /// Where the backup of `name` in `dir` (entry path `path`) goes:
    /// never onto `name` itself (a `--backup-dir` that is the entry's own
    /// directory, without a suffix: a rename there would do nothing, and
    /// the entry after it would replace the file with no backup left).
    fn target(&self, dir: BorrowedFd<'_>, name: &CStr, path: &[u8]) -> anyhow::Result<Target> {
        let to = CString::new(backup_name(name.to_bytes(), &self.suffix))?;
        let Some(b) = &self.dir else {
            return Ok(Target::Beside(to));
        };
        let into = b.dir_for(path)?;
        let id = |fd: BorrowedFd<'_>| rustix::fs::fstat(fd).map(|st| (st.st_dev, st.st_ino));
        if to.as_bytes() == name.to_bytes() && id(into.as_fd())? == id(dir)? {
            bail!(
                "--backup-dir is the directory {} is in, and without --suffix its backup would \
                 be itself",
                tree::show(path)
            );
        }
        Ok(Target::In(into, to))
    }
}

impl Target {
    fn at<'a>(&'a self, dir: BorrowedFd<'a>) -> (BorrowedFd<'a>, &'a CStr) {
        match self {
            Target::Beside(to) => (dir, to),
            Target::In(into, to) => (into.as_fd(), to),
        }
    }
}

fn on_another_fs(e: Errno) -> anyhow::Error {
    match e {
        Errno::XDEV => {
            anyhow::anyhow!("--backup-dir is on another file system than the destination")
        }
        e => e.into(),
    }
}

impl BackupDir {
    /// The backup tree's directory for entry `path`'s, made as needed
    /// with the destination's directories' modes. (Something else than a
    /// directory in the way there fails the backup: it may be no backup,
    /// where DIR holds more than backups.)
    fn dir_for(&self, path: &[u8]) -> anyhow::Result<Arc<OwnedFd>> {
        let mut parts = tree::relative(path)?;
        parts.pop();
        // (A top-level entry under a new name is the copy's one file.)
        let file_top = self.top.is_some() && parts.is_empty();
        let root = self
            .root
            .get_or_init(|| (self.open)(file_top).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let key = parts.join(&b'/');
        let mut last = self.last.lock().expect("backup dir lock");
        if let Some((k, fd)) = &*last
            && *k == key
        {
            return Ok(Arc::clone(fd));
        }
        let mut here = rustix::io::dup(root)?;
        let mut there = rustix::io::dup(&self.dest)?;
        for (i, part) in parts.iter().enumerate() {
            // (Under a new name, the top is the destination itself: the
            // backup directory itself in the backup tree.)
            let (in_dest, in_backup): (&[u8], Option<&[u8]>) = match (&self.top, i) {
                (Some(top), 0) => (top, None),
                _ => (part, Some(part)),
            };
            there = tree::open_dir_beneath(&there, &[in_dest])?;
            let Some(name) = in_backup else { continue };
            let (fd, made) = open_or_make(&here, name, 0o700)
                .with_context(|| format!("cannot make {} in --backup-dir", tree::show(name)))?;
            if made {
                // (The mode of the directory it stands for.)
                let mode = rustix::fs::fstat(&there)?.st_mode & 0o7777;
                let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode));
            }
            here = fd;
        }
        let fd = Arc::new(here);
        *last = Some((key, Arc::clone(&fd)));
        Ok(fd)
    }
}

/// The backups of a copy into `dest` (its path as given, the receiver's
/// `base` opened for it): beside their files with `suffix`, or in `dir`,
/// relative to the destination directory where it is not absolute, as
/// `--link-dest`'s (`crate::linkdest::resolve`): `dest`, or, for one file
/// copied under a new name, the directory it is in. `make` opens it (made
/// where missing) at the first backup. `confined` (a daemon's): the
/// directory is reached by the text of its path, beneath the daemon's
/// roots.
pub fn open(
    suffix: &[u8],
    dir: Option<&[u8]>,
    dest: &[u8],
    base: &tree::Base,
    confined: bool,
    make: impl Fn(&[u8]) -> anyhow::Result<OwnedFd> + Send + Sync + 'static,
) -> anyhow::Result<Backups> {
    let Some(dir) = dir else {
        return Ok(Backups::beside(suffix.to_vec()));
    };
    let (dir, dest) = (dir.to_vec(), dest.to_vec());
    let open: OpenDir = Box::new(move |file_top| {
        let at: &[u8] = match (file_top, dest.iter().rposition(|&b| b == b'/')) {
            (false, _) => &dest,
            (true, Some(0)) => b"/",
            (true, Some(k)) => &dest[..k],
            (true, None) => b".",
        };
        let by_text = crate::linkdest::resolve(&dir, at);
        let as_given = match dir.starts_with(b"/") {
            true => dir.clone(),
            false => [at, b"/", &dir].concat(),
        };
        match confined {
            true => make(&by_text),
            false => make(&as_given),
        }
        .with_context(|| format!("cannot open --backup-dir {}", tree::show(&by_text)))
    });
    let (root, top) = base.root()?;
    Ok(Backups::into_dir(suffix.to_vec(), open, root, top))
}

/// Opens directory `path` as given, made with what leads to it where
/// missing: a `--backup-dir` of the user's own side.
pub fn make_as_given(path: &std::path::Path) -> anyhow::Result<OwnedFd> {
    std::fs::create_dir_all(path)?;
    tree::open_root(path)
}

/// Opens (making it and what leads to it where missing) directory `path`
/// beneath `root`, following no symlink: a `--backup-dir` of `rcp serve`.
pub fn make_beneath(root: impl AsFd, parts: &[&[u8]]) -> anyhow::Result<OwnedFd> {
    let mut cur = rustix::io::dup(root)?;
    for part in parts {
        cur = open_or_make(&cur, part, 0o777)
            .with_context(|| {
                format!(
                    "cannot open {} (not a directory, or a symlink)",
                    tree::show(part)
                )
            })?
            .0;
    }
    Ok(cur)
}

/// Opens directory `name` in `dir`, following no symlink, made with
/// `mode` (the umask applies) where missing; and whether it was made.
fn open_or_make(dir: impl AsFd, name: &[u8], mode: u32) -> anyhow::Result<(OwnedFd, bool)> {
    let name = CString::new(name)?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let open = || rustix::fs::openat(&dir, name.as_c_str(), flags, Mode::empty());
    match open() {
        Ok(fd) => Ok((fd, false)),
        Err(Errno::NOENT) => {
            let made = match rustix::fs::mkdirat(&dir, name.as_c_str(), Mode::from_raw_mode(mode)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => return Err(e.into()),
            };
            Ok((open()?, made))
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_checked_as_rsync_checks_them() {
        assert!(check_suffix(b"~", false).is_ok());
        assert!(check_suffix(b"", true).is_ok());
        assert!(
            check_suffix(b"", false).is_err(),
            "a backup would be the file"
        );
        assert!(check_suffix(b"a/b", true).is_err());
        assert_eq!(backup_name(b"f", b".bak"), b"f.bak");
    }

    #[test]
    fn only_backups_beside_their_files_are_protected_from_delete() {
        let beside = Backups::beside(b"~".to_vec());
        assert!(beside.protects(b"src/d/f~") && !beside.protects(b"src/d/f"));
        assert!(!beside.protects(b"src/d~/f"), "the name, not a directory's");
        assert!(beside.beside_their_files());
    }
}
