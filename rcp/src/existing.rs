//! What a re-sync finds at the destination, confined as the rest of
//! [`crate::tree`]: the file under an entry's name (looked at without
//! following a symlink), its metadata brought up to date when its data is
//! unchanged, and the old file as the basis of a chunk-by-chunk comparison
//! (`--checksum`): the digests of its chunks, and the chunks that matched
//! copied into the new file.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use anyhow::{Context, bail};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};

use rfabric::thread_dir::HeldDir;

use crate::archive::{self, Node};
use crate::digest::Algorithm;
use crate::proto::Entry;
use crate::proto::EntryKind;
use crate::resync::{Found, There};
use crate::tree::{self, Base, DestDir, Fidelity, PartFile};

/// The status of what is under `path` at the destination (not following
/// a symlink), its directory reached on the way.
pub fn status(base: &Base, path: &[u8]) -> anyhow::Result<Stat> {
    Ok(status_in(&base.place(path)?)?)
}

/// [`status`] with the directory reached already (`Base::place`).
pub fn status_in((parent, name): &(Arc<DestDir>, CString)) -> rustix::io::Result<Stat> {
    rustix::fs::statat(parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
}

/// What is under `e`'s name, and its status when it is a regular file.
pub fn look(base: &Base, e: &Entry) -> anyhow::Result<(Found, Option<Stat>)> {
    look_in(&base.place(&e.path)?, e)
}

/// [`look`] with `e`'s directory reached already (`Base::place`).
pub fn look_in(
    (parent, name): &(Arc<DestDir>, CString),
    e: &Entry,
) -> anyhow::Result<(Found, Option<Stat>)> {
    if parent.made_here() {
        return Ok((Found::Nothing, None));
    }
    match rustix::fs::statat(parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
            let mtime = (st.st_mtime, st.st_mtime_nsec as u32);
            let size = st.st_size as u64;
            Ok((Found::File { size, mtime }, Some(st)))
        }
        Ok(_) => Ok((Found::Other, None)),
        Err(rustix::io::Errno::NOENT) => Ok((Found::Nothing, None)),
        Err(err) => Err(err).with_context(|| format!("cannot look at {}", tree::show(&e.path))),
    }
}

/// What is under `e`'s name, for `-i` (nothing when it cannot be looked
/// at: a directory not made, in a dry run).
pub fn there(base: &Base, e: &Entry) -> Option<There> {
    let (parent, name) = base.place(&e.path).ok()?;
    let st = rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        FileType::Fifo => EntryKind::Fifo,
        FileType::Socket => EntryKind::Socket,
        FileType::CharacterDevice => EntryKind::CharDevice,
        FileType::BlockDevice => EntryKind::BlockDevice,
        FileType::Unknown => return None,
    };
    Some(There {
        kind,
        size: st.st_size as u64,
        mtime: (st.st_mtime, st.st_mtime_nsec as u32),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        same_target: kind != EntryKind::Symlink
            || e.kind != EntryKind::Symlink
            || rustix::fs::readlinkat(&*parent, name.as_c_str(), Vec::new())
                .is_ok_and(|t| t.as_bytes() == e.target),
    })
}

/// Brings the metadata of the file there (`st`, unchanged data) to what
/// `e` says, as far as `how` asks: nothing is touched when it is right
/// already (the usual case, and then the file is not even opened).
pub fn refresh(
    base: &Base,
    e: &Entry,
    xattrs: &[archive::Xattr],
    how: Fidelity,
    st: &Stat,
) -> anyhow::Result<()> {
    if metadata_right(base, &base.place(&e.path)?, e, xattrs, how, st)? {
        return Ok(());
    }
    // (A time within `--modify-window` stays as it is, as rsync leaves it.)
    let times = how.time_differs(e, st);
    set_all(&open_regular(base, e)?, e, xattrs, how, times)
}

/// Whether the metadata of the file there (`st`, in the directory
/// `placed`) is what `e` says, as far as `how` asks. It only reads, so the
/// receiver's checks may run it on several threads at once
/// ([`crate::recv`]).
pub fn metadata_right(
    base: &Base,
    placed: &(Arc<DestDir>, CString),
    e: &Entry,
    xattrs: &[archive::Xattr],
    how: Fidelity,
    st: &Stat,
) -> anyhow::Result<bool> {
    let mode_wrong = how.preserve.modes && st.st_mode & 0o7777 != how.mode_of(e);
    if mode_wrong || how.time_differs(e, st) || how.owner_differs(e, st) {
        return Ok(false);
    }
    if e.meta.is_none() || !(how.keep.xattrs || how.keep.acls) {
        return Ok(true);
    }
    // Attributes are compared by name with the thread in the directory
    // where it can be (`rfabric::thread_dir`), else by path where the
    // base allows it, else through the file opened (no path walk).
    let differ = if rfabric::thread_dir::available() {
        let (parent, name) = placed;
        let held: HeldDir = parent.clone();
        how.attributes_differ(Node::Held(&held, name.as_c_str()), e.kind, xattrs)?
    } else if let Some(disk) = base.disk_path(&e.path) {
        how.attributes_differ(Node::Path(&disk), e.kind, xattrs)?
    } else {
        let fd = open_regular(base, e)?;
        how.attributes_differ(Node::Fd(fd.as_fd()), e.kind, xattrs)?
    };
    Ok(!differ)
}

/// Whether a symlink or special file `e` is there as it would be made:
/// the same kind, target (a symlink's) or device number, and the
/// metadata `how` keeps (mode, times, owner, group, attributes). Then a
/// re-sync leaves it alone, as rsync does; otherwise it is made again.
pub fn in_place(base: &Base, e: &Entry, xattrs: &[archive::Xattr], how: Fidelity) -> bool {
    base.place(&e.path)
        .is_ok_and(|placed| in_place_in(placed, e, xattrs, how))
}

/// [`in_place`] with `e`'s directory reached already (`Base::place`).
pub fn in_place_in(
    (parent, name): (Arc<DestDir>, CString),
    e: &Entry,
    xattrs: &[archive::Xattr],
    how: Fidelity,
) -> bool {
    let Ok(st) = rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) else {
        return false;
    };
    let kind = FileType::from_raw_mode(st.st_mode);
    let same_thing = match e.kind {
        EntryKind::Symlink => {
            kind == FileType::Symlink
                && rustix::fs::readlinkat(&parent, name.as_c_str(), Vec::new())
                    .is_ok_and(|t| t.as_bytes() == e.target.as_slice())
        }
        EntryKind::Fifo => kind == FileType::Fifo,
        EntryKind::Socket => kind == FileType::Socket,
        EntryKind::CharDevice | EntryKind::BlockDevice => {
            let want = if e.kind == EntryKind::CharDevice {
                FileType::CharacterDevice
            } else {
                FileType::BlockDevice
            };
            kind == want && e.meta.is_some_and(|m| m.rdev == st.st_rdev)
        }
        _ => false,
    };
    if !same_thing {
        return false;
    }
    // (A symlink's own mode means nothing on Linux.)
    let mode_right = e.kind == EntryKind::Symlink
        || !how.preserve.modes
        || st.st_mode & 0o7777 == how.mode_of(e);
    if !mode_right || how.time_differs(e, &st) || how.owner_differs(e, &st) {
        return false;
    }
    e.meta.is_none() || !(how.keep.xattrs || how.keep.acls) || {
        let held: HeldDir = parent;
        how.attributes_differ(Node::Held(&held, name.as_c_str()), e.kind, xattrs)
            .is_ok_and(|differ| !differ)
    }
}

/// [`refresh`] for the file open as `fd` (the basis of a comparison that
/// found it unchanged).
pub fn refresh_fd(
    fd: &OwnedFd,
    e: &Entry,
    xattrs: &[archive::Xattr],
    how: Fidelity,
) -> anyhow::Result<()> {
    if how.preserve.any() || e.meta.is_some() {
        // (Its contents compared equal: the source's time exactly, as
        // after a copy.)
        set_all(fd, e, xattrs, how, how.preserve.times)?;
    }
    Ok(())
}

/// Sets everything `how` asks of `e` on `fd`, the time if `times`.
fn set_all(
    fd: &OwnedFd,
    e: &Entry,
    xattrs: &[archive::Xattr],
    how: Fidelity,
    times: bool,
) -> anyhow::Result<()> {
    if let Some(meta) = &e.meta {
        let node = Node::Fd(fd.as_fd());
        archive::apply(node, e.kind, meta, xattrs, how.keep, how.powers, None)?;
    }
    if how.preserve.modes {
        // (After the owner: a change of owner clears setuid bits.)
        rustix::fs::fchmod(fd, Mode::from_raw_mode(how.mode_of(e)))?;
    }
    if times {
        rustix::fs::futimens(fd, &tree::times(e))?;
    }
    Ok(())
}

/// The file there, opened to read: the basis of a comparison.
pub fn open_regular(base: &Base, e: &Entry) -> anyhow::Result<OwnedFd> {
    let (parent, name) = base.place(&e.path)?;
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&parent, name.as_c_str(), flags, Mode::empty())
        .with_context(|| format!("cannot open {}", tree::show(&e.path)))?;
    if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != FileType::RegularFile {
        bail!("{} is no longer a regular file", tree::show(&e.path));
    }
    Ok(fd)
}

/// Digests of the whole chunks of `fd` that a file of `size` bytes cut
/// into `chunk`-byte chunks has there (the last one may be short, as the
/// file's last chunk is), from its start.
pub fn chunk_digests(
    fd: &OwnedFd,
    size: u64,
    chunk: u32,
    alg: Algorithm,
) -> anyhow::Result<Vec<[u8; 32]>> {
    let have = (rustix::fs::fstat(fd)?.st_size as u64).min(size);
    let chunk = u64::from(chunk);
    let mut out = Vec::new();
    let mut buf = vec![0u8; chunk as usize];
    let mut k = 0u64;
    loop {
        let start = k * chunk;
        let len = (size - start.min(size)).min(chunk);
        if len == 0 || start + len > have {
            break;
        }
        let b = &mut buf[..len as usize];
        let mut got = 0;
        while got < b.len() {
            let n = rustix::io::pread(fd, &mut b[got..], start + got as u64)?;
            if n == 0 {
                bail!("the file shrank while it was read");
            }
            got += n;
        }
        out.push(alg.chunk(b));
        k += 1;
    }
    Ok(out)
}

/// Copies the chunks `keep` of the basis into the new file at the same
/// offsets (a kernel-side copy where the filesystem can): the chunks the
/// comparison found equal, which were not sent.
pub fn fill_from(
    basis: &OwnedFd,
    out: &PartFile,
    keep: &[u64],
    size: u64,
    chunk: u32,
) -> anyhow::Result<()> {
    let chunk = u64::from(chunk);
    for &k in keep {
        let start = k * chunk;
        let len = (size - start.min(size)).min(chunk);
        copy_range(basis, &out.fd, start, len)
            .with_context(|| format!("copying the unchanged chunk at offset {start}"))?;
    }
    Ok(())
}

fn copy_range(from: &OwnedFd, to: &OwnedFd, start: u64, len: u64) -> anyhow::Result<()> {
    let (mut off_in, mut off_out) = (start, start);
    let end = start + len;
    while off_in < end {
        let want = (end - off_in) as usize;
        match rustix::fs::copy_file_range(from, Some(&mut off_in), to, Some(&mut off_out), want) {
            Ok(0) => bail!("the old file shrank while it was copied"),
            Ok(_) => {}
            // Filesystems (and kernels) that cannot: by hand.
            Err(
                rustix::io::Errno::XDEV
                | rustix::io::Errno::INVAL
                | rustix::io::Errno::OPNOTSUPP
                | rustix::io::Errno::NOSYS,
            ) => {
                let mut buf = vec![0u8; (end - off_in).min(1 << 20) as usize];
                let n = rustix::io::pread(from, &mut buf, off_in)?;
                if n == 0 {
                    bail!("the old file shrank while it was copied");
                }
                let mut put = 0;
                while put < n {
                    put += rustix::io::pwrite(to, &buf[put..n], off_out + put as u64)?;
                }
                off_in += n as u64;
                off_out += n as u64;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
