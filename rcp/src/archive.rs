//! Archive metadata, rsync's `-o -g -D -X -A -H`: what a copy keeps
//! beyond contents, modes and times. Read on the sender while it walks,
//! carried in the entries (`Meta`) and in `Xattr` messages ahead of them,
//! applied on the receiver before a name is put in place.
//!
//! * Owners and groups travel as numbers (rsync's `--numeric-ids`); they
//!   are set where the receiver may ([`Powers`]): root, and for a daemon
//!   `rcp serve --allow-owners`; a user's process sets groups of theirs.
//! * Extended attributes: `user.*` always, `trusted.*` and `security.*`
//!   with the powers of owners; POSIX ACLs are the two
//!   `system.posix_acl_*` attributes, carried with `-A`. No other
//!   `system.*` attribute is ever read or set. XFS shows root its ACLs a
//!   second time, under their on-disk names `trusted.SGI_ACL_FILE` and
//!   `trusted.SGI_ACL_DEFAULT` ([`acl_alias`]): those are never read, set
//!   or removed as attributes of their own. Removing one removes the ACL:
//!   the receiver's cleanup of attributes the source lacks once took the
//!   ACLs off what it copied into XFS.
//! * Device nodes need the powers of owners; FIFOs and sockets do not.
//! * Hard links: the sender keeps a map of the files it sent with more
//!   than one name; the receiver links the other names once every file
//!   of the session is in place.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd};

use rfabric::thread_dir::HeldDir;

use anyhow::{Context, bail};
use rustix::fs::{AtFlags, XattrFlags};
use rustix::io::Errno;

use crate::proto::{
    ACL_ACCESS, ACL_DEFAULT, EntryKind, MAX_XATTR_BYTES, MAX_XATTR_PIECE, MAX_XATTRS, Meta, Msg,
    flags, xattr_name_allowed,
};

/// Which of an entry's mode and modification time the copy keeps: `-p`
/// both (as scp's), `--perms` and `-t` one each (as rsync's `-p` and
/// `-t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Preserve {
    /// The mode exactly (else the permission bits under the umask).
    pub modes: bool,
    /// The modification time, to the nanosecond.
    pub times: bool,
}

impl Preserve {
    pub const BOTH: Preserve = Preserve {
        modes: true,
        times: true,
    };

    pub fn any(self) -> bool {
        self.modes || self.times
    }
}

/// What a copy keeps beyond contents, modes and times (the client's
/// choice, carried in the request's flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    /// `-o`: owners.
    pub owner: bool,
    /// `-g`: groups.
    pub group: bool,
    /// `-D`: device nodes, FIFOs and sockets.
    pub devices: bool,
    /// `-X`: extended attributes.
    pub xattrs: bool,
    /// `-A`: POSIX ACLs.
    pub acls: bool,
    /// `-H`: hard links as hard links.
    pub hard_links: bool,
}

impl Keep {
    /// Whether entries carry [`Meta`] at all.
    pub fn any(self) -> bool {
        self != Keep::default()
    }

    pub fn flags(self) -> u32 {
        [
            (self.owner, flags::OWNER),
            (self.group, flags::GROUP),
            (self.devices, flags::DEVICES),
            (self.xattrs, flags::XATTRS),
            (self.acls, flags::ACLS),
            (self.hard_links, flags::HARD_LINKS),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |f, (_, bit)| f | bit)
    }

    pub fn from_flags(f: u32) -> Keep {
        Keep {
            owner: f & flags::OWNER != 0,
            group: f & flags::GROUP != 0,
            devices: f & flags::DEVICES != 0,
            xattrs: f & flags::XATTRS != 0,
            acls: f & flags::ACLS != 0,
            hard_links: f & flags::HARD_LINKS != 0,
        }
    }

    /// Whether attribute `name` is carried under these choices.
    fn carries(self, name: &[u8]) -> bool {
        if !xattr_name_allowed(name) || acl_alias(name) {
            return false;
        }
        if name == ACL_ACCESS || name == ACL_DEFAULT {
            self.acls
        } else {
            self.xattrs
        }
    }
}

/// Whether `name` is XFS's second name for a POSIX ACL (its on-disk
/// name, listed to root as a `trusted.*` attribute): the ACL itself,
/// carried as `system.posix_acl_*` with `-A`.
pub fn acl_alias(name: &[u8]) -> bool {
    name == b"trusted.SGI_ACL_FILE" || name == b"trusted.SGI_ACL_DEFAULT"
}

/// What the receiving process may do. A root process that is not allowed
/// to set owners (a daemon without `--allow-owners`) does nothing a peer
/// could turn into a privilege: no owners or groups, no device nodes, no
/// `trusted.*` or `security.*` attributes (file capabilities live there),
/// and no setuid or setgid bits on what it now owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Powers {
    /// Give files to any owner and group, make device nodes, set
    /// `trusted.*` and `security.*`: root, and allowed.
    pub owners: bool,
    /// Give files to the groups the process is in (the kernel checks):
    /// a process that is not root.
    pub own_groups: bool,
    /// Clear setuid and setgid bits: root, not allowed.
    pub strip_setid: bool,
}

impl Powers {
    /// This process's powers; `owners_allowed`: the operator lets peers
    /// set owners (always for the user's own copies).
    pub fn here(owners_allowed: bool) -> Powers {
        let root = rustix::process::geteuid().is_root();
        Powers {
            owners: root && owners_allowed,
            own_groups: !root,
            strip_setid: root && !owners_allowed,
        }
    }

    /// The mode to give a received entry of mode `mode`.
    pub fn mode(self, mode: u32) -> u32 {
        if self.strip_setid {
            mode & !0o6000
        } else {
            mode
        }
    }
}

/// One extended attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// A name in a directory, addressed through `/proc/self/fd` so that the
/// `l*xattr` calls act on it without following it (a symlink, a FIFO that
/// must not be opened) and without leaving the confined directory: the
/// way when this thread cannot enter the directory
/// ([`rfabric::thread_dir`]).
fn proc_path(dir: BorrowedFd<'_>, name: &CStr) -> CString {
    let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    p.extend_from_slice(name.to_bytes());
    CString::new(p).expect("a C name has no NUL")
}

/// How attributes of a node are reached: through its descriptor, or by
/// a name, never following a symlink at its end.
enum Reach<'a> {
    Fd(BorrowedFd<'a>),
    Named(Name<'a>),
}

/// A node by name.
#[derive(Clone, Copy)]
enum Name<'a> {
    /// A name in a directory: the bare name with the thread in the
    /// directory (one lookup, as an `*at` call would make), else its
    /// `/proc/self/fd` path (a walk through procfs that cost as much again
    /// as the call).
    At(BorrowedFd<'a>, &'a CStr),
    /// The same, on a thread that may stay in the directory
    /// ([`rfabric::thread_dir::stay`]).
    Held(&'a HeldDir, &'a CStr),
    Path(&'a CStr),
}

impl Name<'_> {
    /// `call` on the path that names the node.
    fn call<R>(self, mut call: impl FnMut(&CStr) -> R) -> R {
        match self {
            Name::At(dir, name) => match rfabric::thread_dir::in_dir(dir, || call(name)) {
                Some(done) => done,
                None => call(&proc_path(dir, name)),
            },
            Name::Held(dir, name) => match rfabric::thread_dir::in_held(dir, || call(name)) {
                Some(done) => done,
                None => call(&proc_path(dir.as_ref().as_fd(), name)),
            },
            Name::Path(p) => call(p),
        }
    }
}

impl Reach<'_> {
    fn of(node: Node<'_>) -> Reach<'_> {
        match node {
            Node::Fd(fd) => Reach::Fd(fd),
            Node::At(dir, name) => Reach::Named(Name::At(dir, name)),
            Node::Held(dir, name) => Reach::Named(Name::Held(dir, name)),
            Node::Path(path) => Reach::Named(Name::Path(path)),
        }
    }

    fn set(&self, name: &CStr, value: &[u8]) -> rustix::io::Result<()> {
        let flags = XattrFlags::empty();
        match self {
            Reach::Fd(fd) => rustix::fs::fsetxattr(fd, name, value, flags),
            Reach::Named(n) => n.call(|p| rustix::fs::lsetxattr(p, name, value, flags)),
        }
    }

    fn remove(&self, name: &CStr) -> rustix::io::Result<()> {
        match self {
            Reach::Fd(fd) => rustix::fs::fremovexattr(fd, name),
            Reach::Named(n) => n.call(|p| rustix::fs::lremovexattr(p, name)),
        }
    }

    fn list_query(&self) -> rustix::io::Result<usize> {
        match self {
            Reach::Fd(fd) => rustix::fs::flistxattr_query(fd),
            Reach::Named(n) => n.call(|p| rustix::fs::llistxattr_query(p)),
        }
    }

    fn list(&self, b: &mut [u8]) -> rustix::io::Result<usize> {
        match self {
            Reach::Fd(fd) => rustix::fs::flistxattr(fd, b),
            Reach::Named(n) => n.call(|p| rustix::fs::llistxattr(p, &mut *b)),
        }
    }

    fn get_query(&self, name: &CStr) -> rustix::io::Result<usize> {
        match self {
            Reach::Fd(fd) => rustix::fs::fgetxattr_query(fd, name),
            Reach::Named(n) => n.call(|p| rustix::fs::lgetxattr_query(p, name)),
        }
    }

    fn get(&self, name: &CStr, b: &mut [u8]) -> rustix::io::Result<usize> {
        match self {
            Reach::Fd(fd) => rustix::fs::fgetxattr(fd, name, b),
            Reach::Named(n) => n.call(|p| rustix::fs::lgetxattr(p, name, &mut *b)),
        }
    }
}

/// Room of the first try at a list or value: most are empty or short.
const FIRST_TRY: usize = 1024;

/// Calls `get` with room for a short answer first, which spares most files
/// and attributes the size query (a system call each, on both sides of a
/// re-sync); then with a buffer of the size `query` says it needs (sizes
/// can grow between the two: tried again on ERANGE).
fn sized(
    query: impl Fn() -> rustix::io::Result<usize>,
    mut get: impl FnMut(&mut [u8]) -> rustix::io::Result<usize>,
) -> rustix::io::Result<Vec<u8>> {
    let mut first = [0u8; FIRST_TRY];
    match get(&mut first) {
        Ok(n) => return Ok(first[..n].to_vec()),
        Err(Errno::RANGE) => {}
        Err(e) => return Err(e),
    }
    loop {
        let want = query()?;
        if want == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; want];
        match get(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(Errno::RANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The attributes of `node` that `keep` carries, never following a
/// symlink (a node by name is reached through `/proc/self/fd`; one that is
/// open costs no path walk). A filesystem without attributes has none.
pub fn read_xattrs(node: Node<'_>, keep: Keep) -> anyhow::Result<Vec<Xattr>> {
    if !(keep.xattrs || keep.acls) {
        return Ok(Vec::new());
    }
    let reach = Reach::of(node);
    let shown = || match node {
        Node::At(_, name) | Node::Held(_, name) | Node::Path(name) => {
            name.to_string_lossy().into_owned()
        }
        Node::Fd(_) => "the file".to_string(),
    };
    let list = match sized(|| reach.list_query(), |b| reach.list(b)) {
        Ok(l) => l,
        Err(Errno::NOTSUP) => return Ok(Vec::new()),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot list extended attributes of {}", shown()));
        }
    };
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for attr in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if !keep.carries(attr) {
            continue;
        }
        let attr_c = CString::new(attr).expect("split at NUL");
        let value = match sized(|| reach.get_query(&attr_c), |b| reach.get(&attr_c, b)) {
            Ok(v) => v,
            // Removed since the listing.
            Err(Errno::NODATA) => continue,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot read extended attribute {} of {}",
                        String::from_utf8_lossy(attr),
                        shown()
                    )
                });
            }
        };
        bytes += value.len();
        out.push(Xattr {
            name: attr.to_vec(),
            value,
        });
        if out.len() > usize::from(MAX_XATTRS) || bytes > MAX_XATTR_BYTES {
            bail!(
                "{} has more extended attributes than rcp carries ({MAX_XATTRS} attributes, \
                 {MAX_XATTR_BYTES} bytes)",
                shown()
            );
        }
    }
    Ok(out)
}

/// The `Xattr` messages that carry `xattrs` ahead of entry `index`, in
/// pieces of at most `piece` bytes (a value of none takes one message).
pub fn xattr_messages(index: u32, xattrs: &[Xattr], piece: usize) -> Vec<Msg> {
    let piece = piece.clamp(1, MAX_XATTR_PIECE);
    let mut out = Vec::new();
    for x in xattrs {
        let total = x.value.len() as u32;
        let mut offset = 0usize;
        loop {
            let end = (offset + piece).min(x.value.len());
            out.push(Msg::Xattr {
                index,
                name: x.name.clone(),
                total,
                offset: offset as u32,
                piece: x.value[offset..end].to_vec(),
            });
            offset = end;
            if offset >= x.value.len() {
                break;
            }
        }
    }
    out
}

/// Why a peer's `Xattr` messages cannot be taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum XattrError {
    #[error("extended attributes of entry {0} were not followed by that entry")]
    Orphaned(u32),
    #[error("a piece of extended attribute {0} out of order")]
    OutOfOrder(String),
    #[error("extended attribute {0} sent twice for one entry")]
    Twice(String),
    #[error("more extended attributes for one entry than rcp carries")]
    TooMany,
    #[error("entry {index} announced {said} extended attributes, {got} arrived")]
    Count { index: u32, said: u16, got: usize },
}

/// The receiver's assembly of `Xattr` messages into the attributes of the
/// entry they come ahead of; sans I/O. Holds one entry's at most (bounded
/// by [`MAX_XATTRS`] and [`MAX_XATTR_BYTES`]).
#[derive(Debug, Default)]
pub struct XattrInbox {
    index: Option<u32>,
    done: Vec<Xattr>,
    /// The value being assembled and its full length.
    current: Option<(Xattr, u32)>,
    bytes: usize,
}

impl XattrInbox {
    /// Takes one `Xattr` message.
    pub fn piece(
        &mut self,
        index: u32,
        name: Vec<u8>,
        total: u32,
        offset: u32,
        piece: Vec<u8>,
    ) -> Result<(), XattrError> {
        let shown = || String::from_utf8_lossy(&name).into_owned();
        match self.index {
            Some(i) if i != index => return Err(XattrError::Orphaned(i)),
            _ => self.index = Some(index),
        }
        self.settle();
        self.bytes += piece.len();
        if self.bytes > MAX_XATTR_BYTES {
            return Err(XattrError::TooMany);
        }
        match &mut self.current {
            Some((x, _)) if x.name == name && offset as usize == x.value.len() => {
                x.value.extend_from_slice(&piece);
            }
            Some(_) => return Err(XattrError::OutOfOrder(shown())),
            None => {
                if offset != 0 {
                    return Err(XattrError::OutOfOrder(shown()));
                }
                if self.done.iter().any(|x| x.name == name) {
                    return Err(XattrError::Twice(shown()));
                }
                if self.done.len() >= usize::from(MAX_XATTRS) {
                    return Err(XattrError::TooMany);
                }
                self.current = Some((Xattr { name, value: piece }, total));
            }
        }
        self.settle();
        Ok(())
    }

    /// Moves a complete value to the finished ones.
    fn settle(&mut self) {
        if let Some((x, total)) = &self.current
            && x.value.len() == *total as usize
        {
            let (x, _) = self.current.take().expect("checked");
            self.done.push(x);
        }
    }

    /// The attributes of entry `index`, which said it has `said` of them;
    /// the inbox is empty again after.
    pub fn take(&mut self, index: u32, said: u16) -> Result<Vec<Xattr>, XattrError> {
        if let Some(i) = self.index
            && i != index
        {
            return Err(XattrError::Orphaned(i));
        }
        let incomplete = self.current.is_some();
        let got = std::mem::take(&mut self.done);
        *self = XattrInbox::default();
        if incomplete || got.len() != usize::from(said) {
            return Err(XattrError::Count {
                index,
                said,
                got: got.len() + usize::from(incomplete),
            });
        }
        Ok(got)
    }
}

/// Where metadata is read or goes: an open file or directory, a name in a
/// directory (a symlink or special file, never opened), or a path (a
/// file of the user's own copy, see [`crate::tree::Walker::by_path`];
/// never a daemon's).
#[derive(Debug, Clone, Copy)]
pub enum Node<'a> {
    Fd(BorrowedFd<'a>),
    At(BorrowedFd<'a>, &'a CStr),
    /// A name in a directory held for a thread that may stay there
    /// between calls (a walk's, [`rfabric::thread_dir::stay`]).
    Held(&'a HeldDir, &'a CStr),
    Path(&'a CStr),
}

/// Applies what `keep` carries from `meta` and `xattrs` to `node`, as far
/// as `powers` allow; everything but the mode and times, which come after
/// (a change of owner clears setuid bits; the mode restores them).
/// `there`: the attributes the node has, when the caller knows them (a
/// file just made, in a directory that passes on no ACL, has none); else
/// they are read, for what must go.
pub fn apply(
    node: Node<'_>,
    kind: EntryKind,
    meta: &Meta,
    xattrs: &[Xattr],
    keep: Keep,
    powers: Powers,
    there: Option<&[Xattr]>,
) -> anyhow::Result<()> {
    set_owner(node, meta, keep, powers)?;
    for x in xattrs {
        let privileged = x.name.starts_with(b"trusted.") || x.name.starts_with(b"security.");
        // (An alias comes only from a sender before acl_alias.)
        if (privileged && !powers.owners) || acl_alias(&x.name) {
            continue;
        }
        set_xattr(node, &x.name, Some(&x.value)).with_context(|| {
            format!(
                "cannot set extended attribute {}",
                String::from_utf8_lossy(&x.name)
            )
        })?;
    }
    if !(keep.xattrs || keep.acls) {
        return Ok(());
    }
    let read;
    let there = match there {
        Some(there) => there,
        None => {
            read = read_xattrs(node, keep)?;
            &read[..]
        }
    };
    if keep.xattrs {
        // Attributes the source does not have (left by an earlier copy, or
        // set there since) go, as rsync's do.
        for t in there {
            if removable(&t.name, powers) && !xattrs.iter().any(|x| x.name == t.name) {
                set_xattr(node, &t.name, None).with_context(|| {
                    format!(
                        "cannot remove extended attribute {}",
                        String::from_utf8_lossy(&t.name)
                    )
                })?;
            }
        }
    }
    if keep.acls && kind != EntryKind::Symlink {
        // An ACL the source does not have (inherited from a default ACL
        // here, or left by an earlier copy) goes.
        let has = |n: &[u8]| xattrs.iter().any(|x| x.name == n);
        let present = |n: &[u8]| there.iter().any(|x| x.name == n);
        let mut absent = vec![];
        if !has(ACL_ACCESS) && present(ACL_ACCESS) {
            absent.push(ACL_ACCESS);
        }
        if kind == EntryKind::Dir && !has(ACL_DEFAULT) && present(ACL_DEFAULT) {
            absent.push(ACL_DEFAULT);
        }
        for name in absent {
            set_xattr(node, name, None).context("cannot remove an inherited ACL")?;
        }
    }
    Ok(())
}

/// Whether an attribute found where the source has none is removed:
/// `user.*`; as root with owners allowed, `trusted.*` and file
/// capabilities (a capability the source lost must not stay). Other
/// `security.*` names are labels the system's policy sets (SELinux's), and
/// ACLs have rules of their own.
fn removable(name: &[u8], powers: Powers) -> bool {
    name.starts_with(b"user.")
        || (powers.owners && (name.starts_with(b"trusted.") || name == b"security.capability"))
}

/// Whether a node with attributes `there` has what [`apply`] would give it
/// from `wanted` (then applying can be skipped: a re-sync of unchanged
/// files touches nothing).
pub fn same_xattrs(
    there: &[Xattr],
    wanted: &[Xattr],
    kind: EntryKind,
    keep: Keep,
    powers: Powers,
) -> bool {
    let applied = |x: &&Xattr| {
        let privileged = x.name.starts_with(b"trusted.") || x.name.starts_with(b"security.");
        !privileged || powers.owners
    };
    let value_there = |name: &[u8]| there.iter().find(|t| t.name == name).map(|t| &t.value);
    let all_there = wanted
        .iter()
        .filter(applied)
        .all(|w| value_there(&w.name) == Some(&w.value));
    // The ACLs apply removes when the source has none.
    let has = |n: &[u8]| wanted.iter().any(|x| x.name == n);
    let no_extra_acl = !keep.acls
        || kind == EntryKind::Symlink
        || ((has(ACL_ACCESS) || value_there(ACL_ACCESS).is_none())
            && (kind != EntryKind::Dir || has(ACL_DEFAULT) || value_there(ACL_DEFAULT).is_none()));
    let no_extra = there
        .iter()
        .all(|t| !removable(&t.name, powers) || wanted.iter().any(|w| w.name == t.name));
    all_there && no_extra && no_extra_acl
}

fn set_owner(node: Node<'_>, meta: &Meta, keep: Keep, powers: Powers) -> anyhow::Result<()> {
    let uid = (keep.owner && powers.owners).then(|| rustix::fs::Uid::from_raw(meta.uid));
    let gid = (keep.group && (powers.owners || powers.own_groups))
        .then(|| rustix::fs::Gid::from_raw(meta.gid));
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    let r = match node {
        Node::Fd(fd) => rustix::fs::fchown(fd, uid, gid),
        Node::At(dir, name) => rustix::fs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW),
        Node::Held(dir, name) => {
            rustix::fs::chownat(dir.as_ref(), name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
        }
        Node::Path(path) => {
            rustix::fs::chownat(rustix::fs::CWD, path, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
        }
    };
    match r {
        Ok(()) => Ok(()),
        // A user may give a file only to their own groups: others are
        // left as created, as rsync does.
        Err(Errno::PERM) if !powers.owners => Ok(()),
        Err(e) => Err(e).context("cannot set owner and group"),
    }
}

/// Sets (`Some`) or removes (`None`) one attribute; removing one that is
/// not there is done already.
fn set_xattr(node: Node<'_>, name: &[u8], value: Option<&[u8]>) -> rustix::io::Result<()> {
    let name = CString::new(name).expect("checked names have no NUL");
    let reach = Reach::of(node);
    let r = match value {
        Some(v) => reach.set(name.as_c_str(), v),
        None => reach.remove(name.as_c_str()),
    };
    match r {
        Err(Errno::NODATA) if value.is_none() => Ok(()),
        // A filesystem without ACLs has none to remove.
        Err(Errno::NOTSUP) if value.is_none() => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn an_attribute_the_source_has_not_makes_a_difference_where_it_is_removed() {
        let x = |n: &str, v: &str| Xattr {
            name: n.as_bytes().to_vec(),
            value: v.as_bytes().to_vec(),
        };
        let keep = Keep {
            xattrs: true,
            ..Keep::default()
        };
        let root = Powers {
            owners: true,
            own_groups: true,
            strip_setid: false,
        };
        let user = Powers {
            owners: false,
            ..root
        };
        let wanted = [x("user.a", "1")];
        let same =
            |there: &[Xattr], powers| same_xattrs(there, &wanted, EntryKind::File, keep, powers);
        assert!(same(&[x("user.a", "1")], user));
        assert!(!same(&[x("user.a", "2")], user), "a value changed");
        assert!(
            !same(&[x("user.a", "1"), x("user.b", "")], user),
            "an extra"
        );
        // Privileged names count only where this side would remove them,
        // and an SELinux label never.
        let trusted = [x("user.a", "1"), x("trusted.t", "")];
        assert!(same(&trusted, user));
        assert!(!same(&trusted, root));
        let capability = [x("user.a", "1"), x("security.capability", "c")];
        assert!(!same(&capability, root));
        let label = [x("user.a", "1"), x("security.selinux", "l")];
        assert!(same(&label, root));
    }

    #[test]
    fn lists_and_values_of_any_size_are_read_whole() {
        for len in [0, 1, FIRST_TRY - 1, FIRST_TRY, FIRST_TRY + 1, 65_536] {
            let value: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let queries = std::cell::Cell::new(0);
            let query = || {
                queries.set(queries.get() + 1);
                Ok(value.len())
            };
            let get = |b: &mut [u8]| {
                if b.len() < value.len() {
                    return Err(Errno::RANGE);
                }
                b[..value.len()].copy_from_slice(&value);
                Ok(value.len())
            };
            assert_eq!(sized(query, get).unwrap(), value, "{len} bytes");
            let asked = usize::from(len > FIRST_TRY);
            assert_eq!(queries.get(), asked, "size queries for {len} bytes");
        }
    }

    fn x(name: &str, len: usize) -> Xattr {
        Xattr {
            name: name.as_bytes().to_vec(),
            value: (0..len).map(|i| i as u8).collect(),
        }
    }

    fn feed(inbox: &mut XattrInbox, msgs: Vec<Msg>) -> Result<(), XattrError> {
        for m in msgs {
            let Msg::Xattr {
                index,
                name,
                total,
                offset,
                piece,
            } = m
            else {
                unreachable!()
            };
            inbox.piece(index, name, total, offset, piece)?;
        }
        Ok(())
    }

    #[test]
    fn keep_round_trips_through_flags() {
        for bits in 0..64u32 {
            let f = bits << 5;
            assert_eq!(Keep::from_flags(f).flags(), f);
        }
        assert!(!Keep::from_flags(flags::RECURSIVE | flags::PRESERVE).any());
    }

    #[test]
    fn values_of_any_size_are_cut_and_put_back_together() {
        let attrs = vec![x("user.empty", 0), x("user.big", 20_000), x("user.a", 3)];
        for piece in [1, 7, 4096, MAX_XATTR_PIECE, usize::MAX] {
            let msgs = xattr_messages(4, &attrs, piece);
            let mut inbox = XattrInbox::default();
            feed(&mut inbox, msgs).unwrap();
            assert_eq!(inbox.take(4, 3).unwrap(), attrs, "piece {piece}");
            // Empty again: the next entry has none.
            assert_eq!(inbox.take(5, 0).unwrap(), vec![]);
        }
    }

    #[test]
    fn a_peer_cannot_bend_the_assembly() {
        let big = vec![x("user.big", 10_000)];
        // A count that does not match, a value cut short.
        let mut inbox = XattrInbox::default();
        feed(&mut inbox, xattr_messages(1, &big, 4096)).unwrap();
        assert!(matches!(inbox.take(1, 2), Err(XattrError::Count { .. })));
        let mut msgs = xattr_messages(1, &big, 4096);
        msgs.pop();
        feed(&mut inbox, msgs).unwrap();
        assert!(matches!(inbox.take(1, 1), Err(XattrError::Count { .. })));
        // Pieces out of order, a value twice, another entry's.
        let mut msgs = xattr_messages(1, &big, 4096);
        msgs.swap(0, 1);
        assert!(matches!(
            feed(&mut XattrInbox::default(), msgs),
            Err(XattrError::OutOfOrder(_))
        ));
        let twice = vec![x("user.a", 1), x("user.a", 1)];
        assert!(matches!(
            feed(&mut XattrInbox::default(), xattr_messages(1, &twice, 10)),
            Err(XattrError::Twice(_))
        ));
        let mut inbox = XattrInbox::default();
        feed(&mut inbox, xattr_messages(1, &[x("user.a", 1)], 10)).unwrap();
        assert_eq!(
            feed(&mut inbox, xattr_messages(2, &[x("user.b", 1)], 10)),
            Err(XattrError::Orphaned(1))
        );
        assert_eq!(inbox.take(2, 1), Err(XattrError::Orphaned(1)));
        // No more than MAX_XATTR_BYTES held for one entry.
        let many: Vec<Xattr> = (0..20).map(|i| x(&format!("user.{i}"), 65_536)).collect();
        assert_eq!(
            feed(&mut XattrInbox::default(), xattr_messages(1, &many, 8192)),
            Err(XattrError::TooMany)
        );
    }

    #[test]
    fn attributes_round_trip_through_a_file_and_acls_are_kept_apart() {
        round_trip("moved");
        assert!(
            rfabric::thread_dir::available(),
            "names in a directory were reached with the thread in it"
        );
    }

    #[test]
    fn attributes_round_trip_through_proc_where_the_thread_cannot_move() {
        std::thread::spawn(|| {
            rfabric::thread_dir::forgo();
            round_trip("proc");
            assert!(!rfabric::thread_dir::available());
        })
        .join()
        .unwrap();
    }

    /// Attributes read, applied and removed through a descriptor, a name
    /// in a directory and a path.
    fn round_trip(tag: &str) {
        let dir = std::env::temp_dir().join(format!("rcp-archive-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        let d = crate::tree::open_root(&dir).unwrap();
        let f = std::fs::File::options().write(true).open(&file).unwrap();
        let fd = f.as_fd();
        let set = set_xattr(Node::Fd(fd), b"user.rcp-test", Some(b"value"));
        if set == Err(Errno::NOTSUP) {
            eprintln!("skipped: {} has no user xattrs", dir.display());
            return;
        }
        set.unwrap();
        let name = c"f";
        let only_acls = Keep {
            acls: true,
            ..Keep::default()
        };
        let xattrs = Keep {
            xattrs: true,
            ..Keep::default()
        };
        assert_eq!(
            read_xattrs(Node::At(d.as_fd(), name), only_acls).unwrap(),
            vec![]
        );
        let got = read_xattrs(Node::At(d.as_fd(), name), xattrs).unwrap();
        assert_eq!(
            got,
            vec![Xattr {
                name: b"user.rcp-test".to_vec(),
                value: b"value".to_vec()
            }]
        );
        // Applied through the directory to another file, then removed.
        std::fs::write(dir.join("g"), b"y").unwrap();
        let meta = Meta::default();
        let powers = Powers {
            owners: false,
            own_groups: true,
            strip_setid: false,
        };
        let apply_to =
            |node| apply(node, EntryKind::File, &meta, &got, xattrs, powers, None).unwrap();
        apply_to(Node::At(d.as_fd(), c"g"));
        assert_eq!(read_xattrs(Node::At(d.as_fd(), c"g"), xattrs).unwrap(), got);
        set_xattr(Node::At(d.as_fd(), c"g"), b"user.rcp-test", None).unwrap();
        set_xattr(Node::At(d.as_fd(), c"g"), b"user.rcp-test", None).unwrap();
        assert_eq!(
            read_xattrs(Node::At(d.as_fd(), c"g"), xattrs).unwrap(),
            vec![]
        );
        // By path, the same attributes are read, set and removed.
        let path =
            |n: &str| CString::new(dir.join(n).into_os_string().into_encoded_bytes()).unwrap();
        let (f, g) = (path("f"), path("g"));
        assert_eq!(read_xattrs(Node::Path(&f), xattrs).unwrap(), got);
        apply_to(Node::Path(&g));
        assert_eq!(read_xattrs(Node::At(d.as_fd(), c"g"), xattrs).unwrap(), got);
        set_xattr(Node::Path(&g), b"user.rcp-test", None).unwrap();
        assert_eq!(read_xattrs(Node::Path(&g), xattrs).unwrap(), vec![]);
        // And a symlink's end is never followed.
        std::os::unix::fs::symlink("f", dir.join("l")).unwrap();
        assert_eq!(read_xattrs(Node::Path(&path("l")), xattrs).unwrap(), vec![]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
