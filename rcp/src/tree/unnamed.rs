//! Files received without a name until they are whole (`O_TMPFILE`), then
//! linked into place.
//!
//! A file of at most one chunk gains nothing from a temporary name: a copy
//! interrupted in it has nothing `--resume` could keep (its one chunk comes
//! again whole). Made unnamed, it costs less: no name to create and later
//! rename away, no lock against another copy (nobody else can reach it),
//! no check that the name still shows it. On a fresh copy of 20,000 small
//! files into tmpfs those are four of a file's dozen system calls on the
//! receiving side, the busier one. And a killed receiver leaves nothing of
//! such files behind: the kernel frees an unnamed file with its last
//! descriptor.
//!
//! Not every filesystem makes unnamed files (NFS, most cluster
//! filesystems: `EOPNOTSUPP`), and linking one into place needs either the
//! right to link by descriptor (`AT_EMPTY_PATH`, root's
//! `CAP_DAC_READ_SEARCH` on the kernels of RHEL 8 to 10) or `/proc` (the
//! descriptor's magic link). So each device is tried once, with a probe
//! file linked under a temporary name and removed; where either step
//! fails, files there get temporary names as larger files do.

use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::{DestDir, temp_name};

/// How an unnamed file is given a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Linking {
    /// `linkat(fd, "", …, AT_EMPTY_PATH)`.
    ByDescriptor,
    /// `linkat(AT_FDCWD, "/proc/self/fd/N", …, AT_SYMLINK_FOLLOW)`.
    ThroughProc,
}

/// An unnamed regular file in `dir`, with `mode` (under the umask and the
/// directory's default ACL, as a named one).
pub(crate) fn open(dir: &DestDir, mode: Mode) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        c".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        mode,
    )
}

/// Gives unnamed file `fd` the name `name` in `dir` (`EEXIST` if taken).
pub(crate) fn link(
    fd: &OwnedFd,
    how: Linking,
    dir: &DestDir,
    name: &CStr,
) -> rustix::io::Result<()> {
    match how {
        Linking::ByDescriptor => rustix::fs::linkat(fd, c"", dir, name, AtFlags::EMPTY_PATH),
        Linking::ThroughProc => {
            let magic = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd));
            let magic = CString::new(magic).expect("no NUL in a number");
            rustix::fs::linkat(
                rustix::fs::CWD,
                magic.as_c_str(),
                dir,
                name,
                AtFlags::SYMLINK_FOLLOW,
            )
        }
    }
}

/// Puts unnamed file `fd` in place as `name` in `dir`: linked there if the
/// name is free, else linked under a temporary name and renamed over what
/// is there (as a named temporary file would be), the rename run by
/// `renaming` (which makes way for it: [`super::way`]).
pub(crate) fn place(
    fd: &OwnedFd,
    how: Linking,
    dir: &DestDir,
    name: &CString,
    renaming: impl FnOnce(&mut dyn FnMut() -> std::io::Result<()>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    match link(fd, how, dir, name) {
        Ok(()) => return Ok(()),
        Err(Errno::EXIST) => {}
        Err(e) => return Err(anyhow::Error::from(e).context("cannot link into place")),
    }
    let temp = loop {
        let temp = temp_name(name)?;
        match link(fd, how, dir, &temp) {
            Ok(()) => break temp,
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(anyhow::Error::from(e).context("cannot link into place")),
        }
    };
    renaming(&mut || {
        rustix::fs::renameat(dir, temp.as_c_str(), dir, name.as_c_str()).map_err(Into::into)
    })
    .inspect_err(|_| {
        let _ = rustix::fs::unlinkat(dir, temp.as_c_str(), AtFlags::empty());
    })
}

/// Whether files in `dir` can be made unnamed and linked into place, and
/// how: a probe file is made, linked under a temporary name, and removed.
pub(crate) fn probe(dir: &DestDir) -> Option<Linking> {
    let fd = open(dir, Mode::from_raw_mode(0o600)).ok()?;
    let name = temp_name(c"probe").ok()?;
    let how = [Linking::ByDescriptor, Linking::ThroughProc]
        .into_iter()
        .find(|&how| link(&fd, how, dir, &name).is_ok())?;
    let _ = rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty());
    Some(how)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Entry, EntryKind};
    use crate::tree::{Base, Leftover, Opened, PartFile, commit_whole, open_root};

    fn file(path: &str, size: u64, chunk: u32) -> Entry {
        Entry {
            index: 0,
            kind: EntryKind::File,
            mode: 0o640,
            mtime_sec: 0,
            mtime_nsec: 0,
            size,
            path: path.as_bytes().to_vec(),
            target: Vec::new(),
            chunk,
            meta: None,
        }
    }

    fn ready(o: Opened) -> PartFile {
        match o {
            Opened::Ready(p) => p,
            Opened::Busy => panic!("held by another copy"),
        }
    }

    /// The names in `dir`, sorted.
    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_file_of_one_chunk_has_no_name_until_it_is_in_place() {
        let scratch = test_support::Scratch::new("rcp-unnamed-new");
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let e = file("f", 3, 4096);
        let out = ready(base.create_file(&e, Leftover::Discard, None).unwrap());
        assert!(matches!(out.naming, crate::tree::part::Naming::Unnamed(_)));
        rustix::io::pwrite(&out.fd, b"abc", 0).unwrap();
        assert!(
            names(scratch.dir()).is_empty(),
            "no name while it is written"
        );
        commit_whole(out, &e).unwrap();
        assert_eq!(names(scratch.dir()), ["f"]);
        assert_eq!(std::fs::read(scratch.path("f")).unwrap(), b"abc");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(scratch.path("f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640 & !crate::tree::umask());
    }

    #[test]
    fn an_unnamed_file_replaces_what_has_its_name_and_leaves_no_other_name() {
        let scratch = test_support::Scratch::new("rcp-unnamed-replace");
        std::fs::write(scratch.path("f"), b"old contents").unwrap();
        // Another name of the old file: a rename replaces the name, it
        // never writes into the file the name showed.
        std::fs::hard_link(scratch.path("f"), scratch.path("g")).unwrap();
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let e = file("f", 3, 4096);
        let out = ready(base.create_file(&e, Leftover::Discard, None).unwrap());
        rustix::io::pwrite(&out.fd, b"new", 0).unwrap();
        commit_whole(out, &e).unwrap();
        assert_eq!(names(scratch.dir()), ["f", "g"]);
        assert_eq!(std::fs::read(scratch.path("f")).unwrap(), b"new");
        assert_eq!(std::fs::read(scratch.path("g")).unwrap(), b"old contents");
    }

    /// What an interrupted copy left goes, as it did when such a file was
    /// taken over and renamed; what another copy is writing stays.
    #[test]
    fn a_leftover_goes_unless_another_copy_holds_it() {
        let scratch = test_support::Scratch::new("rcp-unnamed-leftover");
        std::fs::write(scratch.path(".rcp-f.part"), b"left by a killed copy").unwrap();
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let e = file("f", 3, 4096);
        let out = ready(base.create_file(&e, Leftover::Discard, None).unwrap());
        rustix::io::pwrite(&out.fd, b"abc", 0).unwrap();
        commit_whole(out, &e).unwrap();
        assert_eq!(names(scratch.dir()), ["f"]);

        let other = Base::new(open_root(scratch.dir()).unwrap(), None);
        let held = ready(
            other
                .create_file(&file("f", 5000, 4096), Leftover::Discard, None)
                .unwrap(),
        );
        let out = ready(base.create_file(&e, Leftover::Discard, None).unwrap());
        rustix::io::pwrite(&out.fd, b"xyz", 0).unwrap();
        commit_whole(out, &e).unwrap();
        assert_eq!(names(scratch.dir()), [".rcp-f.part", "f"]);
        assert_eq!(std::fs::read(scratch.path("f")).unwrap(), b"xyz");
        held.discard();
    }

    #[test]
    fn a_discarded_unnamed_file_leaves_nothing() {
        let scratch = test_support::Scratch::new("rcp-unnamed-discard");
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let out = ready(
            base.create_file(&file("f", 3, 4096), Leftover::Discard, None)
                .unwrap(),
        );
        rustix::io::pwrite(&out.fd, b"abc", 0).unwrap();
        out.discard();
        assert!(names(scratch.dir()).is_empty());
    }

    /// A file `--resume` could keep a part of, or any file of a resumed
    /// copy, has the fixed temporary name an interrupted copy leaves.
    #[test]
    fn larger_files_and_resumed_copies_keep_the_temporary_name() {
        let scratch = test_support::Scratch::new("rcp-unnamed-named");
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let two_chunks = ready(
            base.create_file(&file("big", 5000, 4096), Leftover::Discard, None)
                .unwrap(),
        );
        let resumed = ready(
            base.create_file(&file("small", 3, 4096), Leftover::Resume, None)
                .unwrap(),
        );
        assert_eq!(names(scratch.dir()), [".rcp-big.part", ".rcp-small.part"]);
        two_chunks.discard();
        resumed.discard();
        assert!(names(scratch.dir()).is_empty());
    }

    /// Both ways of naming an unnamed file work where they are allowed:
    /// through `/proc` always, by descriptor with root's capability.
    #[test]
    fn both_ways_of_linking_name_the_file() {
        let scratch = test_support::Scratch::new("rcp-unnamed-link");
        let base = Base::new(open_root(scratch.dir()).unwrap(), None);
        let (dir, _) = base.place(b"x").unwrap();
        let mut ways = vec![(Linking::ThroughProc, c"by-proc")];
        if rustix::process::geteuid().is_root() {
            ways.push((Linking::ByDescriptor, c"by-fd"));
        }
        for (how, name) in ways {
            let fd = open(&dir, Mode::from_raw_mode(0o600)).unwrap();
            rustix::io::pwrite(&fd, b"data", 0).unwrap();
            link(&fd, how, &dir, name).unwrap();
            assert_eq!(
                link(&fd, how, &dir, name),
                Err(Errno::EXIST),
                "{how:?}: a taken name is not replaced by a link"
            );
            let path = scratch.path(name.to_str().unwrap());
            assert_eq!(std::fs::read(path).unwrap(), b"data", "{how:?}");
        }
        assert!(probe(&dir).is_some());
        assert!(names(scratch.dir()).iter().all(|n| !n.contains("probe")));
    }
}
