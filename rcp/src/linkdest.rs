//! `--link-dest=DIR`, as rsync's: a file the copy would send is linked
//! instead from DIR, a tree laid out as the destination (an earlier
//! snapshot), where the file there is unchanged by the copy's check (size
//! and modification time, or size alone with `--size-only`) and its
//! metadata is what the copy would give it (mode, owner, group, extended
//! attributes and ACLs, as far as they are kept). Snapshots of a tree then
//! share the files that did not change.
//!
//! A relative DIR is relative to the destination directory (for a copy
//! under a new name, to that name), as rsync's; so `--link-dest=../prev`
//! next to the new snapshot. Up to [`MOST`] of them, looked in in the order
//! given. One that cannot be opened is said and not used. Where a link
//! cannot be made (another file system), the file is sent.
//!
//! The receiver's: a push names them to the server (`Msg::LinkDests`),
//! which opens each beneath its roots.

use std::os::fd::OwnedFd;

use crate::tree::{self, Base};

/// The most link-dest directories a copy may name (rsync's limit).
pub const MOST: usize = 20;

/// `dir` as the receiver reaches it: as given where absolute, else beneath
/// the destination `dest` (the directory, or a new name), `.` and `..`
/// taken out by their text (a `..` past the start of a relative path
/// stays).
pub fn resolve(dir: &[u8], dest: &[u8]) -> Vec<u8> {
    let joined = if dir.starts_with(b"/") {
        dir.to_vec()
    } else {
        [dest, b"/", dir].concat()
    };
    let absolute = joined.starts_with(b"/");
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in joined.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." if parts.last().is_some_and(|p| *p != b"..") => {
                parts.pop();
            }
            // (Above the root is the root.)
            b".." if absolute => {}
            _ => parts.push(part),
        }
    }
    let mut out = if absolute { b"/".to_vec() } else { Vec::new() };
    out.extend_from_slice(&parts.join(&b'/'));
    if out.is_empty() {
        out.push(b'.');
    }
    out
}

/// The trees `dirs` name, each opened by `open` and laid out as the
/// destination `dest` is: for a copy under a new name (`renamed`), its top
/// is the directory itself. `confined`: a daemon's, whose `open` keeps
/// beneath its roots and follows no symlink, so a relative DIR's `..` are
/// taken out by their text ([`resolve`]); the user's own side first lets
/// the kernel follow the path as given, symlinks and all, as rsync does
/// (then by its text: a destination made by this copy is not there yet
/// for a `..` to climb out of). One that cannot be opened is said on
/// stderr (a daemon's log) and left out.
pub fn bases(
    dirs: &[Vec<u8>],
    dest: &[u8],
    renamed: bool,
    confined: bool,
    open: impl Fn(&[u8]) -> anyhow::Result<OwnedFd>,
) -> Vec<Base> {
    let mut out = Vec::new();
    for dir in dirs {
        let by_text = resolve(dir, dest);
        let as_given = match dir.starts_with(b"/") {
            true => dir.clone(),
            false => [dest, b"/", dir].concat(),
        };
        let opened = match confined {
            true => open(&by_text),
            false => open(&as_given).or_else(|_| open(&by_text)),
        };
        // (Its contents stand where the copy's top goes: the top is the
        // directory itself, `.`.)
        let top = renamed.then(|| b".".to_vec());
        match opened {
            Ok(fd) => out.push(Base::new(fd, top)),
            Err(e) => eprintln!("rcp: --link-dest {}: {e:#}; not used", tree::show(&by_text)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_dir_is_beneath_the_destination_and_dots_are_taken_out() {
        let r = |dir: &str, dest: &str| {
            String::from_utf8(resolve(dir.as_bytes(), dest.as_bytes())).unwrap()
        };
        assert_eq!(r("../prev", "/backups/new"), "/backups/prev");
        assert_eq!(r("/snap/a/./b/", "/x"), "/snap/a/b");
        assert_eq!(r("../../..", "/a"), "/");
        assert_eq!(r("../prev", "backups/new"), "backups/prev");
        assert_eq!(r("../../prev", "new"), "../prev");
        assert_eq!(r("..", "."), "..");
        assert_eq!(r(".", "new"), "new");
        assert_eq!(r("../new", "new"), "new");
        assert_eq!(r("..", "new"), ".");
    }
}
