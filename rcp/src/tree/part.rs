//! The file a copy receives, until it is in place: `.rcp-NAME.part`
//! beside its final name (or, for a file of one chunk, no name at all:
//! `unnamed.rs`), held by one copy at a time (`flock`), what an earlier
//! copy left of it discarded, resumed (`--resume`) or taken up
//! (`--partial`), and committed (size, durability, metadata, the rename)
//! or discarded. What the destination is otherwise made of is `tree.rs`'
//! ([`Base`]).

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use rfabric::storage::Engine;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::unnamed::{self, Linking};
use super::way::{EmptyOnly, Spot};
use super::{Base, DestDir, Durability, Fidelity, MakingWay, cstr, show, times};
use crate::archive::{self, Node, Xattr};
use crate::proto::{ACL_ACCESS, Entry, EntryKind};

impl AsFd for PartFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A file being received, under a temporary name or none.
#[derive(Debug)]
pub struct PartFile {
    pub fd: OwnedFd,
    parent: Arc<DestDir>,
    pub(super) naming: Naming,
    name: CString,
    /// Created afresh by this copy (not an earlier one's leftover):
    /// nothing beyond what is written.
    fresh: bool,
    /// An earlier copy's leftover, kept as it was ([`Leftover`]).
    taken_up: bool,
    /// The mode (all twelve bits) of the regular file this one replaces,
    /// where the copy keeps no modes ([`Base::create_file`]).
    replaces_mode: Option<u32>,
    /// Created with the entry's mode (the umask applied): no chmod needed.
    mode_right: bool,
    /// The mode it was made with, where it is known (made afresh, no
    /// default ACL): where it is already the final one, no chmod either.
    made_mode: Option<u32>,
    /// What clears a directory standing under its name ([`way`]; none:
    /// only an empty one goes).
    way: Option<Arc<dyn MakingWay>>,
}

/// What a copy makes of the temporary file of a file it receives that an
/// earlier copy left (one cut off, or killed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftover {
    /// Starts it again, empty: nothing of an earlier copy is trusted.
    Discard,
    /// `--resume`: keeps it, and where it is empty (or was not there)
    /// starts it from the file under the final name, whose chunks the
    /// sender then need not send again.
    Resume,
    /// `--partial`: keeps one with something in it (what a copy that was
    /// cut off kept); else starts afresh, as [`Leftover::Discard`].
    TakeUp,
}

/// What a file being received is called until it is in place.
#[derive(Debug)]
pub(super) enum Naming {
    /// A temporary name in its directory, renamed at the end.
    Temp(CString),
    /// None: it is linked into place at the end, so.
    Unnamed(Linking),
}

impl Base {
    /// The mode (all twelve bits) of the regular file under `e`'s name,
    /// which a file received replaces: none in a directory this copy made
    /// (nothing was there), nor where something else stands.
    pub fn replaced_mode(&self, e: &Entry) -> anyhow::Result<Option<u32>> {
        let (parent, name) = self.place(&e.path)?;
        if parent.made_here {
            return Ok(None);
        }
        Ok(
            match rustix::fs::statat(&parent, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                    Some(st.st_mode & 0o7777)
                }
                _ => None,
            },
        )
    }

    /// Opens the temporary file an entry's data goes to: `.rcp-NAME.part`
    /// next to the final name. Without `resume` it starts empty. With
    /// `resume` what an interrupted copy left there is kept, or, if nothing
    /// was left, the current file under the final name is taken as the
    /// starting point (a kernel-side copy): the sender then sends only the
    /// chunks that differ.
    ///
    /// The name is fixed (so that a copy can be resumed), so two copies to
    /// the same place meet at it: each holds an exclusive lock on its
    /// temporary file until it is renamed or removed. A file another copy
    /// holds is [`Opened::Busy`]: the caller waits and asks again. (A
    /// daemon still tearing down a session whose client was killed holds
    /// its files for a moment while the client's `--resume` already asks
    /// for them; without the lock the old session would remove or
    /// truncate the file under the new one, or both would write into it.)
    ///
    /// Without `resume`, a file of one chunk at most is made with no name
    /// at all where the filesystem allows it ([`unnamed`]): nothing of it
    /// could be resumed, and nobody else can reach it.
    ///
    /// `leftover`: what becomes of what an earlier copy left under the
    /// temporary name ([`PartFile::taken_up`] tells whether any was kept).
    /// `replaces`: the mode of the regular file there that this one
    /// replaces, where the copy keeps no modes ([`Base::replaced_mode`]):
    /// the file ends with it, as rsync's receiver gives an existing
    /// file's permissions to the file that updates it, and is no more
    /// open than it to others while it arrives (nor in a part
    /// `--partial` keeps).
    pub fn create_file(
        &self,
        e: &Entry,
        leftover: Leftover,
        replaces: Option<u32>,
    ) -> anyhow::Result<Opened> {
        let within = replaces.map(|m| m & 0o777);
        let (parent, name) = self.place(&e.path)?;
        let resume = leftover == Leftover::Resume;
        if !resume
            && e.size <= u64::from(e.chunk)
            && let Some(how) = self.unnamed_in(&parent)
        {
            let (mode, mode_right) = first_mode(e, &parent, within);
            // (Where that fails, the named file says why.)
            if let Ok(fd) = unnamed::open(&parent, mode) {
                let made_mode = parent.made_mode(mode);
                return Ok(Opened::Ready(PartFile {
                    fd,
                    parent,
                    naming: Naming::Unnamed(how),
                    name,
                    fresh: true,
                    taken_up: false,
                    replaces_mode: replaces,
                    mode_right,
                    made_mode,
                    way: Some(Arc::clone(&self.way)),
                }));
            }
        }
        let temp = part_name(&name)?;
        let shown = || format!("cannot create a temporary file for {}", show(&e.path));
        // (Made only afresh once a leftover was removed: where files do
        // not show this user as their owner, as root's on NFS with root
        // squashed, one it made itself would be removed again forever.)
        let mut afresh = !resume;
        loop {
            let Some(mut incoming) =
                open_part(&parent, &temp, e, !afresh, within).with_context(shown)?
            else {
                return Ok(Opened::Busy);
            };
            let Some(held) = still_named(&parent, &temp, &incoming.fd)? else {
                // The copy that held it renamed or removed it before this
                // one had the lock: start over with what is there now.
                continue;
            };
            if FileType::from_raw_mode(held.st_mode) != FileType::RegularFile {
                bail!(
                    "{} is in the way and not a regular file",
                    temp.to_string_lossy()
                );
            }
            // A leftover with other names (a snapshot of the directory
            // made with links) or of another owner is not this copy's to
            // write into: its name goes, and a file of this copy's own
            // takes it.
            if !incoming.fresh
                && (held.st_nlink != 1 || held.st_uid != rustix::process::geteuid().as_raw())
            {
                rustix::fs::unlinkat(&parent, temp.as_c_str(), AtFlags::empty())
                    .with_context(shown)?;
                afresh = true;
                continue;
            }
            let keep = match leftover {
                Leftover::Discard => false,
                Leftover::Resume => true,
                Leftover::TakeUp => held.st_size > 0,
            };
            if !incoming.fresh && !keep {
                rustix::fs::ftruncate(&incoming.fd, 0)?;
            }
            incoming.taken_up = !incoming.fresh && keep;
            incoming.replaces_mode = replaces;
            if let Some(within) = within
                && !incoming.fresh
            {
                let own = held.st_mode & 0o777;
                let narrower = own & (within | 0o700);
                if narrower != own {
                    rustix::fs::fchmod(&incoming.fd, Mode::from_raw_mode(narrower))?;
                }
            }
            incoming.name = name;
            incoming.way = Some(Arc::clone(&self.way));
            if resume && held.st_size == 0 {
                incoming.start_from_final()?;
            }
            return Ok(Opened::Ready(incoming));
        }
    }
}

/// What [`Base::create_file`] found.
#[derive(Debug)]
pub enum Opened {
    Ready(PartFile),
    /// Another copy holds the temporary file (see [`Base::create_file`]).
    Busy,
}

/// Opens (or creates) temporary file `temp` in `parent` and takes its lock;
/// `None` if another copy holds it. Not yet truncated: that waits for the
/// lock. (The returned file's `name` is filled in by the caller.)
/// `open_first` (a resumed copy's): what is there is opened, not made
/// anew first, so even a file made here counts as a leftover.
fn open_part(
    parent: &Arc<DestDir>,
    temp: &CString,
    e: &Entry,
    open_first: bool,
    within: Option<u32>,
) -> rustix::io::Result<Option<PartFile>> {
    let mut made = None;
    if !open_first {
        // Usually nothing is there: create it.
        let flags =
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let (mode, mode_right) = first_mode(e, parent, within);
        match rustix::fs::openat(parent, temp.as_c_str(), flags, mode) {
            Ok(fd) => made = Some((fd, mode_right, parent.made_mode(mode))),
            Err(rustix::io::Errno::EXIST) => {}
            Err(err) => return Err(err),
        }
    }
    let (fd, fresh, mode_right, made_mode) = match made {
        Some((fd, mode_right, made_mode)) => (fd, true, mode_right, made_mode),
        None => {
            let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let fd =
                rustix::fs::openat(parent, temp.as_c_str(), flags, Mode::from_raw_mode(0o600))?;
            (fd, false, false, None)
        }
    };
    match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
        Err(err) => return Err(err),
    }
    Ok(Some(PartFile {
        fd,
        parent: Arc::clone(parent),
        naming: Naming::Temp(temp.clone()),
        name: CString::default(),
        fresh,
        taken_up: false,
        replaces_mode: None,
        mode_right,
        made_mode,
        way: None,
    }))
}

/// Removes what an interrupted copy left of `name` in `parent` (its
/// temporary file), unless another copy holds it: a copy that made the
/// file unnamed ends as one that took the leftover over would have, with
/// nothing of it left. (In a directory this copy made there is none.)
fn remove_leftover(parent: &DestDir, name: &CString) -> anyhow::Result<()> {
    let temp = part_name(name)?;
    // (Looked at before it is opened: opening a device node may act.)
    match rustix::fs::statat(parent, temp.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {}
        // Nothing there, or nothing a copy left.
        _ => return Ok(()),
    }
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let Ok(fd) = rustix::fs::openat(parent, temp.as_c_str(), flags, Mode::empty()) else {
        return Ok(());
    };
    match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Ok(()),
        Err(err) => return Err(err.into()),
    }
    if let Some(st) = still_named(parent, &temp, &fd)?
        && FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
    {
        rustix::fs::unlinkat(parent, temp.as_c_str(), AtFlags::empty())
            .with_context(|| format!("cannot remove {}", temp.to_string_lossy()))?;
    }
    Ok(())
}

/// The mode a file being received is made with, and whether it is the
/// final one: the entry's (the umask applies), so that committing needs no
/// chmod. With metadata to apply, the entry's too where `parent` allows it
/// ([`DestDir::gives_final_mode`]: a chmod per file less where the copy
/// keeps modes); else only the owner has access until then (setting an
/// attribute on a read-only file is refused).
///
/// `within`: the mode of the file it replaces, where the copy keeps no
/// modes (it ends with that mode): no more open than that meanwhile, to
/// anyone but its owner.
fn first_mode(e: &Entry, parent: &DestDir, within: Option<u32>) -> (Mode, bool) {
    let mode_right = e.meta.is_none();
    let final_now = mode_right
        || e.meta
            .as_ref()
            .is_some_and(|m| parent.gives_final_mode(e.mode, m));
    let mode = if final_now { e.mode & 0o777 } else { 0o600 };
    let mode = within.map_or(mode, |w| mode & (w | 0o700));
    (Mode::from_raw_mode(mode), mode_right)
}

/// The status of the file open as `fd` if `temp` in `parent` still names
/// it (else `None`).
fn still_named(
    parent: &DestDir,
    temp: &CString,
    fd: &OwnedFd,
) -> anyhow::Result<Option<rustix::fs::Stat>> {
    let held = rustix::fs::fstat(fd)?;
    match rustix::fs::statat(parent, temp.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(((st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)).then_some(held)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

impl PartFile {
    /// Copies the file under the final name (if it is a regular file) into
    /// the temporary one.
    fn start_from_final(&self) -> anyhow::Result<()> {
        let Ok(old) = rustix::fs::openat(
            &self.parent,
            self.name.as_c_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return Ok(());
        };
        let st = rustix::fs::fstat(&old)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Ok(());
        }
        let mut left = st.st_size as u64;
        while left > 0 {
            let n = match rustix::fs::copy_file_range(
                &old,
                None,
                &self.fd,
                None,
                left.min(1 << 30) as usize,
            ) {
                Ok(n) => n as u64,
                // Filesystems (and kernels) that cannot: copied by hand
                // from where the file positions are.
                Err(
                    rustix::io::Errno::XDEV
                    | rustix::io::Errno::INVAL
                    | rustix::io::Errno::OPNOTSUPP
                    | rustix::io::Errno::NOSYS,
                ) => copy_by_hand(&old, &self.fd, left)?,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                break;
            }
            left -= n;
        }
        Ok(())
    }

    /// Whether this is an earlier copy's leftover, kept as it was
    /// ([`Leftover::TakeUp`] found something in it; always with
    /// [`Leftover::Resume`] unless made afresh).
    pub fn taken_up(&self) -> bool {
        self.taken_up
    }

    /// Digests of the whole chunks already in the temporary file, for a
    /// resumed copy of a file of `size` bytes cut into `chunk`-byte chunks.
    pub fn existing_digests(
        &self,
        size: u64,
        chunk: u32,
        alg: crate::digest::Algorithm,
    ) -> anyhow::Result<Vec<[u8; 32]>> {
        crate::existing::chunk_digests(&self.fd, size, chunk, alg)
    }

    /// Puts a complete, verified file in place: its size (trailing hole),
    /// durability, metadata (mode and times), then the rename that makes
    /// it visible. Returns the directory it was renamed in: the caller
    /// syncs each such directory once, before the copy is reported
    /// complete (a sync per file would cost a journal commit per file).
    /// `sized`: the file's last byte was written, so a fresh file has its
    /// size already (else the size is set: a hole at the end).
    pub async fn commit(
        self,
        e: &Entry,
        xattrs: &[Xattr],
        how: Fidelity,
        sized: bool,
        engine: &Engine,
    ) -> anyhow::Result<Arc<DestDir>> {
        if !(self.fresh && sized) {
            rustix::fs::ftruncate(&self.fd, e.size)?;
        }
        if let Some(meta) = &e.meta {
            // Owner first: a change of owner clears setuid bits, the mode
            // below puts them back. A file made afresh has no attributes
            // but those its directory's default ACL gives it, and the
            // owner and group of those who make files there (no chown
            // where they are the entry's: one system call a file less).
            let none: &[Xattr] = &[];
            let there = (self.fresh && !self.parent.passes_acls()).then_some(none);
            let mut keep = how.keep;
            if self.fresh
                && let Some((uid, gid)) = self.parent.made_owner
            {
                keep.owner &= meta.uid != uid;
                keep.group &= meta.gid != gid;
            }
            archive::apply(
                Node::Fd(self.fd.as_fd()),
                e.kind,
                meta,
                xattrs,
                keep,
                how.powers,
                there,
            )?;
        }
        // Without modes kept, a file that replaces one keeps the mode of
        // the one it replaces, as rsync's.
        let mode = match self.replaces_mode {
            // (As far as the powers allow: a daemon that may not set
            // owners does not make a setuid file.)
            Some(mode) if !how.preserve.modes => how.powers.mode(mode),
            _ => how.mode_of(e),
        };
        // Made with its final mode already, unless an ACL set above
        // changed it.
        let as_made = self.made_mode == Some(mode) && !xattrs.iter().any(|x| x.name == ACL_ACCESS);
        let chmod = how.preserve.modes || !self.mode_right || self.replaces_mode.is_some();
        if chmod && !as_made {
            // With -p exactly the source's bits, setuid and all, whatever
            // the umask (unless the powers say otherwise).
            rustix::fs::fchmod(&self.fd, Mode::from_raw_mode(mode))?;
        }
        if how.preserve.times {
            rustix::fs::futimens(&self.fd, &times(e))?;
        }
        let PartFile {
            fd,
            parent,
            naming,
            name,
            way,
            ..
        } = self;
        let fd = Arc::new(fd);
        let way = way.as_deref().unwrap_or(&EmptyOnly);
        let spot = Spot {
            dir: parent.as_fd(),
            name: &name,
            path: &e.path,
            kind: EntryKind::File,
        };
        let rename = |temp: &CString| {
            rustix::fs::renameat(&parent, temp.as_c_str(), &parent, name.as_c_str())
                .map_err(Into::into)
        };
        match naming {
            // A sync of its own is linked with the rename (one pair of
            // io_uring operations, one job of the threads engine).
            // (A file that cannot be put in place leaves no temporary
            // file: the next run sends it whole again.)
            Naming::Temp(temp) if matches!(parent.durability, Durability::EachFile) => {
                let placed = async {
                    way.back_up(parent.as_fd(), &name, &e.path)?;
                    let linked = engine
                        .sync_and_rename(&fd, &parent, temp.clone(), name.clone())
                        .await;
                    match linked {
                        // (Synced: only the rename is made again.)
                        Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => {
                            spot.clear(way)?;
                            rename(&temp).context("cannot rename into place")
                        }
                        r => Ok(r?),
                    }
                };
                placed.await.inspect_err(|_| {
                    let _ = rustix::fs::unlinkat(&parent, temp.as_c_str(), AtFlags::empty());
                })?;
            }
            // Otherwise nothing to hand off: renamed here once durable.
            Naming::Temp(temp) => {
                parent.durability.make(&fd, engine).await?;
                spot.put(way, || "cannot rename into place".into(), || rename(&temp))
                    .inspect_err(|_| {
                        let _ = rustix::fs::unlinkat(&parent, temp.as_c_str(), AtFlags::empty());
                    })?;
            }
            Naming::Unnamed(how) => {
                parent.durability.make(&fd, engine).await?;
                unnamed::place(&fd, how, &parent, &name, |put| {
                    spot.put(way, || "cannot link into place".into(), put)
                })?;
                if !parent.made_here {
                    remove_leftover(&parent, &name)?;
                }
            }
        }
        Ok(parent)
    }

    /// `--partial`, for a copy cut off: keeps the temporary file for a
    /// later copy to take up ([`Leftover::TakeUp`]), where it holds
    /// something; an empty one is removed ([`PartFile::discard`]), and an
    /// unnamed one goes with its descriptor.
    pub fn keep_if_any(self) {
        if rustix::fs::fstat(&self.fd).is_ok_and(|st| st.st_size > 0) {
            return;
        }
        self.discard();
    }

    /// Removes the temporary file: nothing false is left behind. (An
    /// unnamed one goes with its descriptor.)
    pub fn discard(self) {
        if let Naming::Temp(temp) = &self.naming {
            let _ = rustix::fs::unlinkat(&self.parent, temp.as_c_str(), AtFlags::empty());
        }
    }
}

/// Copies up to `len` bytes from `from` to `to` at their file positions
/// with reads and writes; the bytes copied (fewer at the end of `from`).
fn copy_by_hand(from: &OwnedFd, to: &OwnedFd, len: u64) -> anyhow::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(buf.len() as u64) as usize;
        let n = rustix::io::read(from, &mut buf[..want])?;
        if n == 0 {
            break;
        }
        let mut put = 0;
        while put < n {
            put += rustix::io::write(to, &buf[put..n])?;
        }
        done += n as u64;
    }
    Ok(done)
}

/// Where the temporary file of the file at `path` is: beside it, as
/// `.rcp-NAME.part`.
pub fn part_beside(path: &Path) -> Option<PathBuf> {
    let name = cstr(path.file_name()?.as_bytes()).ok()?;
    let part = part_name(&name).ok()?;
    Some(path.with_file_name(OsStr::from_bytes(part.as_bytes())))
}

/// The temporary name of a file being received: fixed, so that an
/// interrupted copy can be resumed.
fn part_name(name: &CString) -> anyhow::Result<CString> {
    // Keep within NAME_MAX (255) even for long names.
    let base = &name.as_bytes()[..name.as_bytes().len().min(240)];
    let mut t = b".rcp-".to_vec();
    t.extend_from_slice(base);
    t.extend_from_slice(b".part");
    cstr(&t)
}
