//! Making way: what stands under a name where an entry of another kind
//! must go, as rsync's receiver makes way.
//!
//! * A directory must go where a file, symlink or special file stands:
//!   that goes (`unlink`), whatever the options. ([`Base::make_dir`])
//! * A file, symlink or special file must go where a directory stands:
//!   an empty directory goes; one with something in it goes only with
//!   `--delete` or `--force`, and then only if all in it may go (what the
//!   rules exclude stays, and the directory with it). Else the entry fails,
//!   "could not make way for new regular file", as rsync's does.
//!
//! The second is found where it costs nothing: a rename (or link) onto a
//! directory fails with `EISDIR`, and only then is the directory cleared
//! and the rename made again. A copy where nothing is in the way makes no
//! call more. Clearing takes the receiver's rules (`--delete`, `--force`,
//! the filter, `--max-delete`), which this module does not know: it asks
//! them through [`MakingWay`] (`crate::delete::InTheWay`).
//!
//! The same rules keep what is replaced, with `--backup`: a non-directory
//! under the name is linked under its backup's name just before the new
//! entry is renamed there ([`MakingWay::back_up`], `crate::backup`).
//!
//! [`Base::make_dir`]: super::Base::make_dir

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd};

use anyhow::{Context, bail};
use rustix::fs::AtFlags;
use rustix::io::Errno;

use crate::proto::EntryKind;

use super::show;

/// What the receiver's rules do with what stands where an entry goes.
pub trait MakingWay: Send + Sync + std::fmt::Debug {
    /// Removes directory `name` in `dir` (entry path `path`), all in it
    /// first, where the receiver's rules let it; else an error saying why
    /// (it has said what it could not remove).
    fn clear(&self, dir: BorrowedFd<'_>, name: &CStr, path: &[u8]) -> anyhow::Result<()>;

    /// `--backup`: keeps a non-directory under `name` in `dir` (entry
    /// path `path`) as its backup, before an entry is put in its place
    /// (or, for a directory, before it is removed: `Base::make_dir`).
    fn back_up(&self, _dir: BorrowedFd<'_>, _name: &CStr, _path: &[u8]) -> anyhow::Result<()> {
        Ok(())
    }

    /// Whether [`MakingWay::back_up`] keeps anything (`--backup`).
    fn backs_up(&self) -> bool {
        false
    }
}

/// Says, as rsync does, that directory `path` stays because something
/// is left in it.
pub fn say_not_empty(path: &[u8]) {
    eprintln!("rcp: cannot delete non-empty directory: {}", show(path));
}

/// Without rules to clear by, only an empty directory goes.
#[derive(Debug)]
pub(crate) struct EmptyOnly;

impl MakingWay for EmptyOnly {
    fn clear(&self, dir: BorrowedFd<'_>, name: &CStr, path: &[u8]) -> anyhow::Result<()> {
        match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
            Ok(()) => Ok(()),
            Err(Errno::NOTEMPTY | Errno::EXIST) => {
                say_not_empty(path);
                bail!("the directory there is not empty")
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The rules of `.0`, for an entry made again as it was (a symlink to
/// the same target, a special file of the same kind and device, whose
/// metadata alone changes): nothing of what it replaces is lost, so
/// nothing is backed up (rsync changes such an entry in place).
#[derive(Debug)]
pub(crate) struct Remade<'a>(pub &'a dyn MakingWay);

impl MakingWay for Remade<'_> {
    fn clear(&self, dir: BorrowedFd<'_>, name: &CStr, path: &[u8]) -> anyhow::Result<()> {
        self.0.clear(dir, name, path)
    }
}

/// What rsync calls an entry of `kind` when it cannot make way for it.
fn called(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::File | EntryKind::HardLink => "regular file",
        EntryKind::Symlink => "symlink",
        EntryKind::CharDevice | EntryKind::BlockDevice => "device",
        EntryKind::Fifo | EntryKind::Socket => "special file",
        EntryKind::Dir => "directory",
    }
}

/// Where a non-directory goes in place: the directory it goes into, its
/// name there, and what the entry is (its path, its kind), for clearing a
/// directory that stands there.
pub(crate) struct Spot<'a> {
    pub dir: BorrowedFd<'a>,
    pub name: &'a CStr,
    pub path: &'a [u8],
    pub kind: EntryKind,
}

impl Spot<'_> {
    /// Runs `put` (a rename or link onto the name), what is there backed
    /// up first (`--backup`); where a directory stands there (`EISDIR`),
    /// clears it by `way` and runs `put` once more. An error of `put`'s
    /// says `what` failed (made only then: this is every entry's way).
    pub(crate) fn put<T>(
        &self,
        way: &dyn MakingWay,
        what: impl Fn() -> String,
        mut put: impl FnMut() -> std::io::Result<T>,
    ) -> anyhow::Result<T> {
        way.back_up(self.dir, self.name, self.path)?;
        match put() {
            Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => {
                self.clear(way)?;
                put().with_context(what)
            }
            r => r.with_context(what),
        }
    }

    /// Clears the directory under the name, or fails as rsync does.
    pub(crate) fn clear(&self, way: &dyn MakingWay) -> anyhow::Result<()> {
        way.clear(self.dir.as_fd(), self.name, self.path)
            .map_err(|e| anyhow::anyhow!("could not make way for new {}: {e}", called(self.kind)))
    }
}
