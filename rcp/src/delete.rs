//! `--delete`: what the destination has that the source does not is
//! removed, after the copy and only if all of it succeeded (rsync's
//! `--delete-after`: a failed copy deletes nothing).
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
use std::hash::{BuildHasher, RandomState};
use std::os::fd::{AsFd, OwnedFd};

use anyhow::Context;
use rustix::fs::{AtFlags, FileType};

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

fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// What `--delete` did: the paths removed, and the directories (by entry
/// index) it could not clean, with why.
#[derive(Debug, Default)]
pub struct Deleted {
    pub removed: Vec<Vec<u8>>,
    pub failed: Vec<(u32, Vec<u8>, anyhow::Error)>,
}

/// Removes, from each directory the sender sent (`dirs`: entry index and
/// path), the entries it did not send, unless `keep` (the filter rules)
/// protects them (given the path and whether it is a directory). `dry`
/// (`-n`): only says what it would remove. `one_file_system` (`-x`), as
/// rsync: a directory on another file system than the destination is
/// not cleaned, and a directory removed is not entered where it holds
/// another file system (a mount point): that one stays, and so does the
/// directory, with a warning.
pub fn extraneous(
    base: &Base,
    sent: &Sent,
    dirs: impl Iterator<Item = (u32, Vec<u8>)>,
    keep: &dyn Fn(&[u8], bool) -> bool,
    dry: bool,
    one_file_system: bool,
) -> Deleted {
    let mut done = Deleted::default();
    let how = Clean {
        keep,
        dry,
        // (An open directory's status: it does not fail.)
        device: one_file_system.then(|| base.device().ok()).flatten(),
    };
    for (index, dir_path) in dirs {
        if let Err(e) = clean(base, sent, &dir_path, &how, &mut done.removed) {
            done.failed.push((index, dir_path, e));
        }
    }
    done
}

/// How [`clean`] removes.
struct Clean<'a> {
    keep: &'a dyn Fn(&[u8], bool) -> bool,
    dry: bool,
    /// `-x`: the destination's file system, the one cleaning keeps to.
    device: Option<u64>,
}

fn clean(
    base: &Base,
    sent: &Sent,
    dir_path: &[u8],
    how: &Clean<'_>,
    removed: &mut Vec<Vec<u8>>,
) -> anyhow::Result<()> {
    let dry = how.dry;
    let opened = base
        .place(dir_path)
        .and_then(|(parent, name)| tree::open_dir_beneath(&parent, &[name.as_bytes()]));
    let dir = match opened {
        Ok(dir) => dir,
        // A dry run made no directory: nothing in it to remove.
        Err(_) if dry => return Ok(()),
        Err(e) => return Err(e),
    };
    if let Some(device) = how.device
        && rustix::fs::fstat(&dir)?.st_dev != device
    {
        return Ok(());
    }
    for (name, is_dir) in names(&dir)? {
        if sent.has(dir_path, &name) {
            continue;
        }
        let mut path = dir_path.to_vec();
        path.push(b'/');
        path.extend_from_slice(&name);
        if (how.keep)(&path, is_dir) {
            continue;
        }
        if !dry {
            let gone = remove(&dir, &name, is_dir, how.device.is_some())
                .with_context(|| format!("cannot delete {}", tree::show(&path)))?;
            if !gone {
                eprintln!(
                    "rcp: cannot delete non-empty directory: {} (it holds another file \
                     system, left with -x)",
                    tree::show(&path)
                );
                continue;
            }
        }
        removed.push(path);
    }
    Ok(())
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

/// Removes `name` in `dir`, a directory with everything in it; whether
/// it is gone. With `one_file_system`, a directory on another file
/// system than `dir` is not entered: it stays, and so do the
/// directories above it.
fn remove(dir: &OwnedFd, name: &[u8], is_dir: bool, one_file_system: bool) -> anyhow::Result<bool> {
    let cname = std::ffi::CString::new(name)?;
    if !is_dir {
        rustix::fs::unlinkat(dir, cname.as_c_str(), AtFlags::empty())?;
        return Ok(true);
    }
    let inner = tree::open_dir_beneath(dir.as_fd(), &[name])?;
    if one_file_system && rustix::fs::fstat(&inner)?.st_dev != rustix::fs::fstat(dir)?.st_dev {
        return Ok(false);
    }
    let mut all = true;
    for (n, d) in names(&inner)? {
        all &= remove(&inner, &n, d, one_file_system)?;
    }
    if all {
        rustix::fs::unlinkat(dir, cname.as_c_str(), AtFlags::REMOVEDIR)?;
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

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
