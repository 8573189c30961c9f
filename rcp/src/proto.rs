//! rcp's control messages, carried as link application messages; sans I/O.
//!
//! Every message is a one-byte tag followed by fixed little-endian fields
//! and length-prefixed byte strings. The decoder checks every length against
//! the bytes present and against limits before it allocates, and refuses
//! trailing bytes. Layout in `docs/rcp.md`.

use thiserror::Error;

use crate::archive::Preserve;
use crate::filter::{MAX_PATTERN, MAX_RULES, RuleText};

/// Longest path or symlink target carried (Linux's PATH_MAX).
pub const MAX_PATH: usize = 4096;
/// Longest name an `Itemized` line carries: a path and the target it
/// names after ` -> ` (a symlink) or ` => ` (a hard link).
pub const MAX_ITEMIZED_NAME: usize = 2 * MAX_PATH + 4;
/// Most source operands in one pull request.
pub const MAX_SOURCES: usize = 256;
/// Longest error text.
pub const MAX_TEXT: usize = 1024;
/// Most links one session may stripe its data over.
pub const MAX_STREAMS: u32 = 16;
/// Most entries one `EntriesOk` answers.
pub const MAX_OKS: usize = 2048;

/// Request flags.
pub mod flags {
    pub const RECURSIVE: u32 = 1 << 0;
    pub const PRESERVE: u32 = 1 << 1;
    pub const RESUME: u32 = 1 << 2;
    pub const NO_VERIFY: u32 = 1 << 3;
    /// Chunks and files are hashed with BLAKE3 (else SHA-256, as rcp did
    /// before it had a choice; a peer from then refuses the flag).
    pub const BLAKE3: u32 = 1 << 4;
    /// Archive metadata (rsync's -o -g -D -X -A -H): entries carry a
    /// [`super::Meta`] tail, xattrs come ahead of their entry in `Xattr`
    /// messages, and the new kinds may appear. A peer from before them
    /// refuses the flags, so it never sees any of it.
    pub const OWNER: u32 = 1 << 5;
    pub const GROUP: u32 = 1 << 6;
    pub const DEVICES: u32 = 1 << 7;
    pub const XATTRS: u32 = 1 << 8;
    pub const ACLS: u32 = 1 << 9;
    pub const HARD_LINKS: u32 = 1 << 10;
    pub const ARCHIVE: u32 = OWNER | GROUP | DEVICES | XATTRS | ACLS | HARD_LINKS;
    /// Re-sync (see `resync`): the receiver answers every file before its
    /// data is sent (`EntriesWanted`, `EntriesSkipped` or `Have`),
    /// comparing what is there by size and time, by size alone, or by
    /// chunk digests (at most one of the three); a name that exists, or a
    /// newer file, may be left alone. None of them: every file is sent
    /// unasked, as before these flags (a peer from then refuses them).
    pub const QUICK_CHECK: u32 = 1 << 11;
    pub const SIZE_ONLY: u32 = 1 << 12;
    pub const CHECKSUM: u32 = 1 << 13;
    pub const IGNORE_EXISTING: u32 = 1 << 14;
    pub const UPDATE: u32 = 1 << 15;
    pub const CHECKS: u32 = QUICK_CHECK | SIZE_ONLY | CHECKSUM;
    pub const RESYNC: u32 = CHECKS | IGNORE_EXISTING | UPDATE | SIZE_LIMITS;
    /// `--delete`: once the whole copy succeeded, the receiver removes
    /// what the directories sent hold that the sender did not send, and
    /// names each in a `Removed`.
    pub const DELETE: u32 = 1 << 16;
    /// Filter rules (`--exclude`, `--include`) follow the request in
    /// `Rules` messages: the sender walks by them, and `--delete` leaves
    /// what they exclude.
    pub const FILTERS: u32 = 1 << 17;
    /// `-n`: the receiver decides and reports, and changes nothing (no
    /// data is sent: every file is answered as skipped).
    pub const DRY_RUN: u32 = 1 << 18;
    /// `-i`: the receiver names what changes (`Itemized`).
    pub const ITEMIZE: u32 = 1 << 19;
    /// `--files-from`: the one source is a directory and the names listed
    /// in it are sent (a pull's follow the request in `Names` messages);
    /// the destination is a directory, made if missing.
    pub const FILES_FROM: u32 = 1 << 20;
    /// A broadcast hop (see `chain`): `Chain` messages follow the request
    /// (and its rules), naming the nodes after this one; the receiver
    /// forwards everything it is sent to the first of them, and before
    /// its goodbye answers a `NodeDone` for itself and for each node
    /// beyond it.
    pub const CHAIN: u32 = 1 << 21;
    /// With `CHAIN`, when files are answered (a re-sync, `--resume`):
    /// each node answers a file once for itself and every node after it,
    /// its own answer merged with the next node's (see `merge`), and lets
    /// the data of a file it needs nothing of pass on. (A node from before
    /// it refuses the request rather than answer for itself alone.)
    pub const MERGED_ANSWERS: u32 = 1 << 22;
    /// `-x`: the walk keeps to each source operand's file system. A
    /// directory on another one (a mount point) is sent without its
    /// contents, its entry followed by an `Unlisted`: `--delete` leaves
    /// what the receiver's copy of it holds (it does not know what that
    /// is), and keeps to the file system each top-level entry's copy is
    /// on (`delete::extraneous`).
    pub const ONE_FILE_SYSTEM: u32 = 1 << 23;
    /// `-xx`, with `ONE_FILE_SYSTEM`: such directories are left out
    /// altogether.
    pub const NO_MOUNT_POINTS: u32 = 1 << 24;
    /// `-L`: the sender follows every symlink (what it points to goes in
    /// its place).
    pub const COPY_LINKS: u32 = 1 << 25;
    /// `--copy-unsafe-links`: the sender follows the symlinks that lead
    /// outside the copied tree.
    pub const COPY_UNSAFE_LINKS: u32 = 1 << 26;
    /// `--safe-links`: the sender leaves out the symlinks that lead
    /// outside the copied tree (with `COPY_UNSAFE_LINKS`, those follow).
    pub const SAFE_LINKS: u32 = 1 << 27;
    /// `--remove-source-files`: the sender removes what it sent once the
    /// receiver's last answer says it is in place (see `send::remove`).
    /// The receiver needs nothing of it; a pull's sender is told.
    pub const REMOVE_SOURCE_FILES: u32 = 1 << 28;
    /// `--min-size`, `--max-size`: a `Sizes` message follows the rules;
    /// the receiver leaves a file outside them alone (`resync::Sizes`).
    pub const SIZE_LIMITS: u32 = 1 << 29;
    /// `--link-dest`: a `LinkDests` message follows the rules (and the
    /// sizes): trees the receiver links unchanged files from
    /// (`linkdest`). Every file is answered, so that it may be linked.
    pub const LINK_DEST: u32 = 1 << 30;
    /// An `Extras` message follows the rest of the request's tail: the
    /// choices that came after the flags ran out, each a numbered item
    /// ([`super::Extras`]). A peer that does not know an item refuses the
    /// request, as one from before a flag refuses the flag.
    pub const EXTRAS: u32 = 1 << 31;
    pub const KNOWN: u32 = RECURSIVE
        | PRESERVE
        | RESUME
        | NO_VERIFY
        | BLAKE3
        | ARCHIVE
        | RESYNC
        | DELETE
        | FILTERS
        | DRY_RUN
        | ITEMIZE
        | FILES_FROM
        | CHAIN
        | MERGED_ANSWERS
        | ONE_FILE_SYSTEM
        | NO_MOUNT_POINTS
        | COPY_LINKS
        | COPY_UNSAFE_LINKS
        | SAFE_LINKS
        | REMOVE_SOURCE_FILES
        | SIZE_LIMITS
        | LINK_DEST
        | EXTRAS;
}

/// Why an entry failed, as far as the sender's exit status cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FailKind {
    /// Anything else (a name that cannot be created here, say).
    Other = 0,
    /// Reading or writing it failed on the receiver.
    Io = 1,
    /// A chunk or the file digest differed: the data arrived corrupted.
    Corrupted = 2,
    /// Gone from the source since the walk found it (a file deleted
    /// before it was opened, a name before it was looked at). As rsync,
    /// said (`file has vanished`) and not a failure: a live tree changes
    /// under a copy, and `--delete` still runs.
    Vanished = 3,
}

impl FailKind {
    /// Whether the entry failed (all but [`FailKind::Vanished`]).
    pub fn is_failure(self) -> bool {
        self != FailKind::Vanished
    }

    /// The kind of a source that could not be read for `e`: vanished
    /// where it is no longer there.
    pub fn of_unread(e: &anyhow::Error) -> FailKind {
        let gone = e.chain().any(|c| {
            c.downcast_ref::<rustix::io::Errno>() == Some(&rustix::io::Errno::NOENT)
                || c.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        });
        if gone {
            FailKind::Vanished
        } else {
            FailKind::Io
        }
    }

    fn from_wire(b: u8) -> Result<FailKind, ProtoError> {
        Ok(match b {
            0 => FailKind::Other,
            1 => FailKind::Io,
            2 => FailKind::Corrupted,
            3 => FailKind::Vanished,
            _ => return Err(ProtoError::BadField("entry_failed.kind")),
        })
    }
}

/// The receiver's verdict on one entry: in place, or why not
/// (`EntryOk`/`EntriesOk` or `EntryFailed`).
pub type Verdict = Result<(), (FailKind, String)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    /// Special files and device nodes (`-D`): no data, the device number
    /// in the entry's [`Meta`].
    Fifo = 4,
    Socket = 5,
    CharDevice = 6,
    BlockDevice = 7,
    /// Another name of a file sent earlier in the session (`-H`): `target`
    /// is that file's entry path; the receiver links it once that file is
    /// in place.
    HardLink = 8,
}

impl EntryKind {
    /// Kinds that carry no data and are created in one step.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice
        )
    }
}

/// Longest extended attribute name (Linux's XATTR_NAME_MAX).
pub const MAX_XATTR_NAME: usize = 255;
/// Largest extended attribute value (Linux's XATTR_SIZE_MAX).
pub const MAX_XATTR_VALUE: u32 = 64 * 1024;
/// Most extended attributes one entry carries.
pub const MAX_XATTRS: u16 = 1024;
/// Most bytes of extended attribute values one entry carries in all.
pub const MAX_XATTR_BYTES: usize = 1 << 20;
/// Largest piece of a value in one `Xattr` message (the sender cuts
/// smaller ones where the link's messages are smaller).
pub const MAX_XATTR_PIECE: usize = 8192;

/// An entry's archive metadata (requests with [`flags::ARCHIVE`] bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meta {
    /// Numeric owner and group, as on the sender.
    pub uid: u32,
    pub gid: u32,
    /// Device number of a device node (0 otherwise).
    pub rdev: u64,
    /// Extended attributes sent ahead in `Xattr` messages.
    pub xattrs: u16,
}

/// One thing to create on the receiving side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub index: u32,
    pub kind: EntryKind,
    /// Permission bits (and setuid/setgid/sticky).
    pub mode: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub size: u64,
    /// Relative path, `/`-separated, checked by the receiver before use.
    pub path: Vec<u8>,
    /// Symlink target (empty otherwise).
    pub target: Vec<u8>,
    /// Chunk size the sender cuts this file into (files only): chunk `k`
    /// holds bytes `k*chunk .. (k+1)*chunk`, and the file digest is the
    /// SHA-256 of the chunk digests in that order.
    pub chunk: u32,
    /// Owner, group, device number, xattr count: only in requests with
    /// archive flags (then on every entry).
    pub meta: Option<Meta>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Server → client: prove you know the secret; `encrypt`: this server
    /// requires the session encrypted.
    Challenge {
        nonce: [u8; 32],
        encrypt: bool,
    },
    /// Client → server; `encrypt`: the protection the session is sealed
    /// with from here on (mixed into its keys, so a path that flips it
    /// fails the first sealed frame).
    Auth {
        nonce: [u8; 32],
        mac: [u8; 32],
        encrypt: bool,
    },
    /// Server → client, the first sealed message: and here is proof that
    /// I know it too.
    AuthOk {
        mac: [u8; 32],
    },
    /// Client → server: I send, you receive into `dest`; the data is
    /// striped over `streams` links (this one and `streams - 1` that join).
    Push {
        flags: u32,
        streams: u32,
        sources: u32,
        dest: Vec<u8>,
    },
    /// Client → server: you send `sources`, I receive.
    Pull {
        flags: u32,
        streams: u32,
        sources: Vec<Vec<u8>>,
    },
    /// Server → client: the request is accepted; entries may come once
    /// the other streams joined `session`. Also the answer to a `Join`.
    Ready {
        dest_is_dir: bool,
        session: [u8; 16],
    },
    /// Client → server, on a further connection after authenticating: this
    /// link carries data of `session` as its stream number `stream`.
    Join {
        session: [u8; 16],
        stream: u32,
    },
    Entry(Entry),
    /// Sender → receiver: all `chunks` chunks of `index` were sent (on
    /// whichever streams; the file is complete once that many landed).
    EntryEnd {
        index: u32,
        chunks: u64,
        digest: [u8; 32],
    },
    /// Receiver → sender: `index` is in place under its final name.
    EntryOk {
        index: u32,
    },
    /// Receiver → sender: `index` failed; nothing of it is under its final
    /// name.
    EntryFailed {
        index: u32,
        kind: FailKind,
        reason: String,
    },
    /// Receiver → sender, for `--resume`: digests of the chunks of `index`
    /// already on disk, from chunk `first` on.
    Have {
        index: u32,
        first: u64,
        digests: Vec<[u8; 32]>,
    },
    /// Sender → receiver: no more entries.
    Done {
        entries: u32,
    },
    /// Either way: the whole request failed.
    Fail {
        reason: String,
    },
    /// Sender → receiver: an entry and its end in one (a file of at most
    /// one chunk, read before it is announced); its `chunks` chunks follow.
    Whole {
        entry: Entry,
        chunks: u64,
        digest: [u8; 32],
    },
    /// Receiver → sender: these entries are in place (`EntryOk` for many).
    EntriesOk {
        indices: Vec<u32>,
    },
    /// Sender → receiver, ahead of entry `index`: a piece of one of its
    /// extended attributes (`-X`, `-A`), bytes `offset..` of a value of
    /// `total` bytes; pieces of one value come in order, values one after
    /// another.
    Xattr {
        index: u32,
        name: Vec<u8>,
        total: u32,
        offset: u32,
        piece: Vec<u8>,
    },
    /// Receiver → sender, re-sync: send all of these files (nothing of
    /// them is there to keep).
    EntriesWanted {
        indices: Vec<u32>,
    },
    /// Receiver → sender, re-sync: these files are there already (their
    /// metadata applied where asked): no data, and no other answer follows.
    EntriesSkipped {
        indices: Vec<u32>,
    },
    /// Receiver → sender, `--delete`: this path (relative, as entries')
    /// was removed from the destination.
    Removed {
        path: Vec<u8>,
    },
    /// Client → server, right after a request with the `FILTERS` flag:
    /// filter rules in order; `more`: another `Rules` follows.
    Rules {
        rules: Vec<RuleText>,
        more: bool,
    },
    /// Sender → receiver: several messages (encoded, none a `Batch`) in
    /// one, in order: a tree of small files costs a message per batch, not
    /// per entry.
    Batch {
        messages: Vec<Vec<u8>>,
    },
    /// Receiver → sender, `-i`: what changes at `path` (rsync's 11-letter
    /// code, or `*deleting  `). `path` is named as rsync names it: with a
    /// `/` after a directory, and ` -> target` after a symlink or
    /// ` => first name` after another name of a file (rsync's `%n%L`).
    Itemized {
        code: [u8; 11],
        path: Vec<u8>,
    },
    /// Client → server, after a pull's request (and its rules) with the
    /// `FILES_FROM` flag: names to send from the source directory, in
    /// order; `more`: another `Names` follows.
    Names {
        names: Vec<Vec<u8>>,
        more: bool,
    },
    /// Sender → receiver, after a request with the `CHAIN` flag (and its
    /// rules): the broadcast's nodes from the receiver on, in chain order
    /// (the receiver first, under the name it reports itself by);
    /// `more`: another `Chain` follows.
    Chain {
        hops: Vec<Hop>,
        more: bool,
    },
    /// Receiver → sender, a broadcast's: how one node's copy ended (the
    /// receiver's own, then those it heard from the nodes after it).
    NodeDone(NodeResult),
    /// Sender → receiver, with `ONE_FILE_SYSTEM`, after the entry of
    /// directory `index` and before any other entry (the ends of files
    /// sent apart may come between): it is on another file system (a
    /// mount point), and none of its contents are sent.
    Unlisted {
        index: u32,
    },
    /// Sender → receiver: entry `index` could not be read at the source
    /// (a file that cannot be opened or read, a directory that cannot be
    /// listed), after `chunks` of its chunks were sent. In place of a
    /// file's `EntryEnd`; after a directory's entry and its `Unlisted`.
    /// Nothing of it is put in place: a file there stays as it was, and
    /// the receiver answers `EntryFailed` with `kind` and `reason`.
    Abandoned {
        index: u32,
        chunks: u64,
        kind: FailKind,
        reason: String,
    },
    /// Sender → receiver: what the walk found at `path` is not sent, and
    /// fails (a symlink whose referent is missing, with `-L`): the copy
    /// fails for it, and `--delete` deletes nothing. No entry index is
    /// spent on it.
    Unsent {
        path: Vec<u8>,
        kind: FailKind,
        reason: String,
    },
    /// Client → server, with `SIZE_LIMITS`, after the request's rules:
    /// `--min-size` and `--max-size` (inclusive; `min` at most `max`).
    Sizes {
        min: u64,
        max: u64,
    },
    /// Client → server, with `LINK_DEST`, after the rules and sizes: the
    /// `--link-dest` directories, as given (at most `linkdest::MOST`).
    LinkDests {
        dirs: Vec<Vec<u8>>,
    },
    /// Client → server, with `EXTRAS`, last of the request's tail: the
    /// choices beyond the flags, as [`Extras`] items (key, value).
    Extras {
        items: Vec<(u16, Vec<u8>)>,
    },
}

/// The request's choices beyond its flags, carried by `Msg::Extras` as
/// numbered items, so that a new one needs no flag: a receiver refuses an
/// item it does not know, or one whose value is not as its key says.
/// **Sans I/O.**
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Extras {
    /// `--max-delete` (key 1, u64): at most this many entries removed.
    pub max_delete: Option<u64>,
    /// `--delete-excluded` (key 2, no value): `--delete` removes what the
    /// rules exclude too.
    pub delete_excluded: bool,
    /// `--existing` (key 3, no value): nothing new is made at the
    /// destination (`resync::Policy::existing`).
    pub existing: bool,
    /// `--chmod` (key 4: the client's umask, u32, then the rules' text):
    /// the sender's walk changes the modes it sends (`crate::chmod`).
    pub chmod: Option<(u32, String)>,
    /// `--force` (key 5, no value): a directory with something in it,
    /// standing where a non-directory must go, is emptied and removed.
    pub force: bool,
    /// `--backup` (key 6: the suffix, which may be empty only with key
    /// 7): what the copy replaces or removes is renamed to a backup
    /// (`crate::backup`).
    pub backup: Option<Vec<u8>>,
    /// `--backup-dir` (key 7: the directory as given, only with key 6):
    /// backups go there, laid out as the destination.
    pub backup_dir: Option<Vec<u8>>,
    /// `-m` (key 8, no value): the sender's walk leaves out directories
    /// with nothing but directories beneath them
    /// (`tree::Walker::prune_empty_dirs`).
    pub prune_empty_dirs: bool,
    /// Key 9, no value: a pull with a list (`--files-from`, `-R`) and
    /// `--delete`, whose receiver cleans only what the sender sends with
    /// its names. The sender marks every other directory `Unlisted`; one
    /// from before it did not, and refuses the item rather than let the
    /// directories a list implies be cleaned.
    pub lists_marked: bool,
    /// Key 11 (one byte: 1 modes, 2 times), with the preserve flag: the
    /// copy keeps only that one of the two (`--perms`, `-t`; the flag
    /// alone keeps both).
    pub preserve_one: Option<PreserveOne>,
    /// `--mkpath` (key 12, no value): the receiver makes the missing
    /// directories of the destination's path first (`mkdir -p`).
    pub mkpath: bool,
    /// `--ignore-missing-args` (key 14, no value), in a pull: the
    /// sender passes over a source named that is not there.
    pub ignore_missing_args: bool,
    /// `-k` (key 15, no value), in a pull: the sender walks a symlink to a
    /// directory as that directory (a daemon refuses it).
    pub copy_dirlinks: bool,
    /// `-O` (key 13, no value): the receiver leaves directories'
    /// modification times as they are.
    pub omit_dir_times: bool,
    /// `--modify-window` (key 16, u64 seconds): modification times at
    /// most this far apart are the same (`resync::TimeMatch::Within`);
    /// without it, to the nanosecond.
    pub modify_window: Option<u64>,
    /// `--partial` (key 10, no value): the receiver keeps what arrived of
    /// a file when the copy is cut off, and takes up what an earlier copy
    /// kept when files are answered (digests of it, as with `--resume`).
    pub partial: bool,
}

/// The one of modes and times a request keeps ([`Extras::preserve_one`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreserveOne {
    Modes,
    Times,
}

impl PreserveOne {
    /// What a copy that keeps `p` says beyond the preserve flag: `None`
    /// where it keeps both or neither.
    pub fn of(p: Preserve) -> Option<PreserveOne> {
        match (p.modes, p.times) {
            (true, false) => Some(PreserveOne::Modes),
            (false, true) => Some(PreserveOne::Times),
            _ => None,
        }
    }

    pub fn preserve(self) -> Preserve {
        Preserve {
            modes: self == PreserveOne::Modes,
            times: self == PreserveOne::Times,
        }
    }
}

/// An extras item's value that is a u64: eight bytes, little-endian.
fn u64_item(value: &[u8], field: &'static str) -> Result<u64, ProtoError> {
    let n: [u8; 8] = value.try_into().map_err(|_| ProtoError::BadField(field))?;
    Ok(u64::from_le_bytes(n))
}

impl Extras {
    const MAX_DELETE: u16 = 1;
    const DELETE_EXCLUDED: u16 = 2;
    const EXISTING: u16 = 3;
    const CHMOD: u16 = 4;
    const FORCE: u16 = 5;
    const BACKUP: u16 = 6;
    const BACKUP_DIR: u16 = 7;
    const PRUNE_EMPTY_DIRS: u16 = 8;
    const LISTS_MARKED: u16 = 9;
    const PARTIAL: u16 = 10;
    const PRESERVE_ONE: u16 = 11;
    const MKPATH: u16 = 12;
    const OMIT_DIR_TIMES: u16 = 13;
    const IGNORE_MISSING_ARGS: u16 = 14;
    const COPY_DIRLINKS: u16 = 15;
    const MODIFY_WINDOW: u16 = 16;

    /// Whether there is anything to carry (else no `Extras` message).
    pub fn any(&self) -> bool {
        *self != Extras::default()
    }

    /// The items that are flags (no value), each with its field: every
    /// one is carried, read and checked alike.
    fn flags_mut(&mut self) -> [(u16, &mut bool); 10] {
        [
            (Extras::DELETE_EXCLUDED, &mut self.delete_excluded),
            (Extras::EXISTING, &mut self.existing),
            (Extras::FORCE, &mut self.force),
            (Extras::PRUNE_EMPTY_DIRS, &mut self.prune_empty_dirs),
            (Extras::LISTS_MARKED, &mut self.lists_marked),
            (Extras::PARTIAL, &mut self.partial),
            (Extras::MKPATH, &mut self.mkpath),
            (Extras::OMIT_DIR_TIMES, &mut self.omit_dir_times),
            (Extras::IGNORE_MISSING_ARGS, &mut self.ignore_missing_args),
            (Extras::COPY_DIRLINKS, &mut self.copy_dirlinks),
        ]
    }

    pub fn items(&self) -> Vec<(u16, Vec<u8>)> {
        let mut items = Vec::new();
        if let Some(n) = self.max_delete {
            items.push((Extras::MAX_DELETE, n.to_le_bytes().to_vec()));
        }
        if let Some(n) = self.modify_window {
            items.push((Extras::MODIFY_WINDOW, n.to_le_bytes().to_vec()));
        }
        let mut flags = self.clone();
        for (key, on) in flags.flags_mut() {
            if *on {
                items.push((key, Vec::new()));
            }
        }
        if let Some((umask, rules)) = &self.chmod {
            let value = [&umask.to_le_bytes()[..], rules.as_bytes()].concat();
            items.push((Extras::CHMOD, value));
        }
        if let Some(suffix) = &self.backup {
            items.push((Extras::BACKUP, suffix.clone()));
        }
        if let Some(dir) = &self.backup_dir {
            items.push((Extras::BACKUP_DIR, dir.clone()));
        }
        if let Some(one) = self.preserve_one {
            let value = match one {
                PreserveOne::Modes => 1,
                PreserveOne::Times => 2,
            };
            items.push((Extras::PRESERVE_ONE, vec![value]));
        }
        items
    }

    pub fn from_items(items: &[(u16, Vec<u8>)]) -> Result<Extras, ProtoError> {
        // (None at all comes as no message: a relay forwards the flag
        // only with items to send; and each item once.)
        let mut keys: Vec<u16> = items.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        keys.dedup();
        if items.is_empty() || keys.len() != items.len() {
            return Err(ProtoError::BadField("extras: none, or an item twice"));
        }
        let mut extras = Extras::default();
        for (key, value) in items {
            if let Some((_, on)) = extras.flags_mut().into_iter().find(|(k, _)| k == key) {
                if !value.is_empty() {
                    return Err(ProtoError::BadField("extras: a flag with a value"));
                }
                *on = true;
                continue;
            }
            match *key {
                Extras::MAX_DELETE => {
                    extras.max_delete = Some(u64_item(value, "extras.max_delete")?);
                }
                Extras::MODIFY_WINDOW => {
                    extras.modify_window = Some(u64_item(value, "extras.modify_window")?);
                }
                Extras::PRESERVE_ONE => {
                    extras.preserve_one = Some(match value.as_slice() {
                        [1] => PreserveOne::Modes,
                        [2] => PreserveOne::Times,
                        _ => return Err(ProtoError::BadField("extras.preserve_one")),
                    });
                }
                Extras::CHMOD if value.len() > 4 => {
                    let (umask, rules) = value.split_at(4);
                    let umask = u32::from_le_bytes(umask.try_into().expect("four bytes"));
                    let rules = std::str::from_utf8(rules).map_err(|_| ProtoError::BadText)?;
                    if crate::chmod::Chmod::parse(rules, umask).is_err() {
                        return Err(ProtoError::BadField("extras.chmod"));
                    }
                    extras.chmod = Some((umask, rules.to_string()));
                }
                Extras::CHMOD => return Err(ProtoError::BadField("extras.chmod")),
                Extras::BACKUP => extras.backup = Some(value.clone()),
                Extras::BACKUP_DIR if !value.is_empty() && !value.contains(&0) => {
                    extras.backup_dir = Some(value.clone());
                }
                Extras::BACKUP_DIR => return Err(ProtoError::BadField("extras.backup_dir")),
                _ => {
                    return Err(ProtoError::BadField(
                        "extras: an item this rcp does not know",
                    ));
                }
            }
        }
        // (A suffix as `--suffix` takes it; a directory only with it.)
        match &extras.backup {
            Some(suffix) => {
                crate::backup::check_suffix(suffix, extras.backup_dir.is_some())
                    .map_err(|_| ProtoError::BadField("extras.backup"))?;
            }
            None if extras.backup_dir.is_some() => {
                return Err(ProtoError::BadField("extras: a backup dir without backup"));
            }
            None => {}
        }
        Ok(extras)
    }
}

/// The most items one `Extras` message holds, and the longest value.
pub const MAX_EXTRAS: usize = 64;
pub const MAX_EXTRA: usize = 4096;

/// The most names one `Names` message holds.
pub const MAX_NAMES: usize = 4096;
/// The most hops one `Chain` message holds (each at most about 700
/// bytes: several messages carry a long chain).
pub const MAX_HOPS: usize = 16;
/// The longest one-time token a hop carries.
pub const MAX_TOKEN: usize = 256;

/// One node of a broadcast chain, as the node before it reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The node as the user named it (for the report).
    pub name: String,
    /// Where the node before it connects (resolved there).
    pub host: String,
    pub port: u16,
    /// The node's one-time token (remote-shell mode); empty: the node is
    /// a daemon holding the same shared secret as the one before it.
    pub token: Vec<u8>,
}

/// One node's end of a broadcast.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeResult {
    pub name: String,
    /// Every entry arrived there, verified.
    pub ok: bool,
    pub files: u64,
    pub bytes: u64,
    /// From the node's session start to its end.
    pub micros: u64,
    /// Entries that failed there.
    pub failed: u32,
    /// Why, in words: the first failure, or what ended the node's copy
    /// (empty when `ok`).
    pub reason: String,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtoError {
    #[error("truncated message")]
    Truncated,
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    #[error("field `{0}` out of range")]
    BadField(&'static str),
    #[error("text is not UTF-8")]
    BadText,
}

const TAGS: [&str; 32] = [
    "Challenge",
    "Auth",
    "AuthOk",
    "Push",
    "Pull",
    "Ready",
    "Entry",
    "EntryEnd",
    "EntryOk",
    "EntryFailed",
    "Have",
    "Done",
    "Fail",
    "Join",
    "Whole",
    "EntriesOk",
    "Xattr",
    "EntriesWanted",
    "EntriesSkipped",
    "Removed",
    "Rules",
    "Batch",
    "Itemized",
    "Names",
    "Chain",
    "NodeDone",
    "Unlisted",
    "Abandoned",
    "Unsent",
    "Sizes",
    "LinkDests",
    "Extras",
];

impl Msg {
    fn tag(&self) -> u8 {
        match self {
            Msg::Challenge { .. } => 1,
            Msg::Auth { .. } => 2,
            Msg::AuthOk { .. } => 3,
            Msg::Push { .. } => 4,
            Msg::Pull { .. } => 5,
            Msg::Ready { .. } => 6,
            Msg::Entry(_) => 7,
            Msg::EntryEnd { .. } => 8,
            Msg::EntryOk { .. } => 9,
            Msg::EntryFailed { .. } => 10,
            Msg::Have { .. } => 11,
            Msg::Done { .. } => 12,
            Msg::Fail { .. } => 13,
            Msg::Join { .. } => 14,
            Msg::Whole { .. } => 15,
            Msg::EntriesOk { .. } => 16,
            Msg::Xattr { .. } => 17,
            Msg::EntriesWanted { .. } => 18,
            Msg::EntriesSkipped { .. } => 19,
            Msg::Removed { .. } => 20,
            Msg::Rules { .. } => 21,
            Msg::Batch { .. } => BATCH,
            Msg::Itemized { .. } => 23,
            Msg::Names { .. } => 24,
            Msg::Chain { .. } => 25,
            Msg::NodeDone(_) => 26,
            Msg::Unlisted { .. } => 27,
            Msg::Abandoned { .. } => 28,
            Msg::Unsent { .. } => 29,
            Msg::Sizes { .. } => 30,
            Msg::LinkDests { .. } => 31,
            Msg::Extras { .. } => 32,
        }
    }

    /// `bytes` decoded, a `Batch` into the messages it holds: what
    /// `decode` gives, each message of a batch decoded in turn, with the
    /// same checks, without a copy of each message on the way (an
    /// unchanged tree's entries come a few hundred to a batch).
    pub fn decode_unbatched(bytes: &[u8]) -> Result<Vec<Msg>, ProtoError> {
        if bytes.first() != Some(&BATCH) {
            return Ok(vec![Msg::decode(bytes)?]);
        }
        let mut r = Reader(&bytes[1..]);
        let messages = r.batch()?.into_iter().map(Msg::decode).collect();
        r.end()?;
        messages
    }

    /// The message's name, for errors ("expected X, got Y").
    pub fn name(&self) -> &'static str {
        TAGS[self.tag() as usize - 1]
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64);
        self.encode_into(&mut w);
        w
    }

    /// Appends the message's bytes to `w`.
    pub fn encode_into(&self, w: &mut Vec<u8>) {
        w.push(self.tag());
        match self {
            Msg::Challenge { nonce, encrypt } => {
                w.extend_from_slice(nonce);
                w.push(u8::from(*encrypt));
            }
            Msg::Auth {
                nonce,
                mac,
                encrypt,
            } => {
                w.extend_from_slice(nonce);
                w.extend_from_slice(mac);
                w.push(u8::from(*encrypt));
            }
            Msg::AuthOk { mac } => w.extend_from_slice(mac),
            Msg::Push {
                flags,
                streams,
                sources,
                dest,
            } => {
                put_u32(w, *flags);
                put_u32(w, *streams);
                put_u32(w, *sources);
                put_bytes(w, dest);
            }
            Msg::Pull {
                flags,
                streams,
                sources,
            } => {
                put_u32(w, *flags);
                put_u32(w, *streams);
                put_u32(w, sources.len() as u32);
                for s in sources {
                    put_bytes(w, s);
                }
            }
            Msg::Ready {
                dest_is_dir,
                session,
            } => {
                w.push(u8::from(*dest_is_dir));
                w.extend_from_slice(session);
            }
            Msg::Join { session, stream } => {
                w.extend_from_slice(session);
                put_u32(w, *stream);
            }
            Msg::Entry(e) => put_entry(w, e),
            Msg::Whole {
                entry,
                chunks,
                digest,
            } => {
                put_entry(w, entry);
                w.extend_from_slice(&chunks.to_le_bytes());
                w.extend_from_slice(digest);
            }
            Msg::EntriesOk { indices }
            | Msg::EntriesWanted { indices }
            | Msg::EntriesSkipped { indices } => {
                put_u32(w, indices.len() as u32);
                for i in indices {
                    put_u32(w, *i);
                }
            }
            Msg::Xattr {
                index,
                name,
                total,
                offset,
                piece,
            } => {
                put_u32(w, *index);
                put_bytes(w, name);
                put_u32(w, *total);
                put_u32(w, *offset);
                put_bytes(w, piece);
            }
            Msg::EntryEnd {
                index,
                chunks,
                digest,
            } => {
                put_u32(w, *index);
                w.extend_from_slice(&chunks.to_le_bytes());
                w.extend_from_slice(digest);
            }
            Msg::EntryOk { index } | Msg::Unlisted { index } => put_u32(w, *index),
            Msg::EntryFailed {
                index,
                kind,
                reason,
            } => {
                put_u32(w, *index);
                w.push(*kind as u8);
                put_bytes(w, truncate(reason).as_bytes());
            }
            Msg::Abandoned {
                index,
                chunks,
                kind,
                reason,
            } => {
                put_u32(w, *index);
                w.extend_from_slice(&chunks.to_le_bytes());
                w.push(*kind as u8);
                put_bytes(w, truncate(reason).as_bytes());
            }
            Msg::Unsent { path, kind, reason } => {
                put_bytes(w, path);
                w.push(*kind as u8);
                put_bytes(w, truncate(reason).as_bytes());
            }
            Msg::Sizes { min, max } => {
                w.extend_from_slice(&min.to_le_bytes());
                w.extend_from_slice(&max.to_le_bytes());
            }
            Msg::LinkDests { dirs } => {
                w.push(dirs.len() as u8);
                for d in dirs {
                    put_bytes(w, d);
                }
            }
            Msg::Extras { items } => {
                w.push(items.len() as u8);
                for (key, value) in items {
                    w.extend_from_slice(&key.to_le_bytes());
                    put_bytes(w, value);
                }
            }
            Msg::Have {
                index,
                first,
                digests,
            } => {
                put_u32(w, *index);
                w.extend_from_slice(&first.to_le_bytes());
                put_u32(w, digests.len() as u32);
                for d in digests {
                    w.extend_from_slice(d);
                }
            }
            Msg::Done { entries } => put_u32(w, *entries),
            Msg::Fail { reason } => put_bytes(w, truncate(reason).as_bytes()),
            Msg::Removed { path } => put_bytes(w, path),
            Msg::Itemized { code, path } => {
                w.extend_from_slice(code);
                put_bytes(w, path);
            }
            Msg::Batch { messages } => {
                w.extend_from_slice(&(messages.len() as u16).to_le_bytes());
                for m in messages {
                    put_bytes(w, m);
                }
            }
            Msg::Names { names, more } => {
                w.push(u8::from(*more));
                w.extend_from_slice(&(names.len() as u16).to_le_bytes());
                for n in names {
                    put_bytes(w, n);
                }
            }
            Msg::Rules { rules, more } => {
                w.push(u8::from(*more));
                w.extend_from_slice(&(rules.len() as u16).to_le_bytes());
                for r in rules {
                    w.push(u8::from(r.include));
                    put_bytes(w, &r.pattern);
                }
            }
            Msg::Chain { hops, more } => {
                w.push(u8::from(*more));
                w.extend_from_slice(&(hops.len() as u16).to_le_bytes());
                for h in hops {
                    put_bytes(w, h.name.as_bytes());
                    put_bytes(w, h.host.as_bytes());
                    w.extend_from_slice(&h.port.to_le_bytes());
                    put_bytes(w, &h.token);
                }
            }
            Msg::NodeDone(n) => {
                put_bytes(w, n.name.as_bytes());
                w.push(u8::from(n.ok));
                w.extend_from_slice(&n.files.to_le_bytes());
                w.extend_from_slice(&n.bytes.to_le_bytes());
                w.extend_from_slice(&n.micros.to_le_bytes());
                put_u32(w, n.failed);
                put_bytes(w, truncate(&n.reason).as_bytes());
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Msg, ProtoError> {
        let mut r = Reader(bytes);
        let tag = r.u8()?;
        let msg = match tag {
            1 => Msg::Challenge {
                nonce: r.array()?,
                encrypt: r.flag("challenge.encrypt")?,
            },
            2 => Msg::Auth {
                nonce: r.array()?,
                mac: r.array()?,
                encrypt: r.flag("auth.encrypt")?,
            },
            3 => Msg::AuthOk { mac: r.array()? },
            4 => {
                let flags = r.flags()?;
                let streams = r.streams()?;
                let sources = r.u32()?;
                if sources == 0 || sources as usize > 1 << 30 {
                    return Err(ProtoError::BadField("push.sources"));
                }
                Msg::Push {
                    flags,
                    streams,
                    sources,
                    dest: r.bytes(MAX_PATH, "push.dest")?,
                }
            }
            5 => {
                let flags = r.flags()?;
                let streams = r.streams()?;
                let n = r.u32()? as usize;
                if n == 0 || n > MAX_SOURCES {
                    return Err(ProtoError::BadField("pull.sources"));
                }
                let mut sources = Vec::with_capacity(n);
                for _ in 0..n {
                    sources.push(r.bytes(MAX_PATH, "pull.source")?);
                }
                Msg::Pull {
                    flags,
                    streams,
                    sources,
                }
            }
            6 => Msg::Ready {
                dest_is_dir: r.flag("ready.dest_is_dir")?,
                session: r.array()?,
            },
            7 => Msg::Entry(r.entry(0)?),
            8 => Msg::EntryEnd {
                index: r.u32()?,
                chunks: r.u64()?,
                digest: r.array()?,
            },
            9 => Msg::EntryOk { index: r.u32()? },
            27 => Msg::Unlisted { index: r.u32()? },
            28 => Msg::Abandoned {
                index: r.u32()?,
                chunks: r.u64()?,
                kind: FailKind::from_wire(r.u8()?)?,
                reason: r.text()?,
            },
            29 => Msg::Unsent {
                path: r.bytes(MAX_PATH, "unsent.path")?,
                kind: FailKind::from_wire(r.u8()?)?,
                reason: r.text()?,
            },
            30 => {
                let (min, max) = (r.u64()?, r.u64()?);
                // (No limit at all comes as no message: a relay forwards
                // the flag only with the limits it sends.)
                if min > max || (min, max) == (0, u64::MAX) {
                    return Err(ProtoError::BadField("sizes"));
                }
                Msg::Sizes { min, max }
            }
            31 => {
                let n = r.u8()? as usize;
                if n == 0 || n > crate::linkdest::MOST {
                    return Err(ProtoError::BadField("link_dests.count"));
                }
                let mut dirs = Vec::with_capacity(n);
                for _ in 0..n {
                    let d = r.bytes(MAX_PATH, "link_dests.dir")?;
                    if d.is_empty() || d.contains(&0) {
                        return Err(ProtoError::BadField("link_dests.dir"));
                    }
                    dirs.push(d);
                }
                Msg::LinkDests { dirs }
            }
            32 => {
                let n = r.u8()? as usize;
                if n > MAX_EXTRAS {
                    return Err(ProtoError::BadField("extras.count"));
                }
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = u16::from_le_bytes(r.array()?);
                    items.push((key, r.bytes(MAX_EXTRA, "extras.value")?));
                }
                Msg::Extras { items }
            }
            10 => Msg::EntryFailed {
                index: r.u32()?,
                kind: FailKind::from_wire(r.u8()?)?,
                reason: r.text()?,
            },
            11 => {
                let index = r.u32()?;
                let first = r.u64()?;
                let n = r.u32()? as usize;
                // Bounded by the bytes present before anything is allocated.
                if n.checked_mul(32).is_none_or(|b| b > r.0.len()) {
                    return Err(ProtoError::Truncated);
                }
                let mut digests = Vec::with_capacity(n);
                for _ in 0..n {
                    digests.push(r.array()?);
                }
                Msg::Have {
                    index,
                    first,
                    digests,
                }
            }
            12 => Msg::Done { entries: r.u32()? },
            13 => Msg::Fail { reason: r.text()? },
            20 => Msg::Removed {
                path: r.bytes(MAX_PATH, "removed.path")?,
            },
            23 => {
                let code: [u8; 11] = r.array()?;
                if !code.iter().all(|c| c.is_ascii_graphic() || *c == b' ') {
                    return Err(ProtoError::BadField("itemized.code"));
                }
                Msg::Itemized {
                    code,
                    path: r.bytes(MAX_ITEMIZED_NAME, "itemized.path")?,
                }
            }
            24 => {
                let more = r.u8()? != 0;
                let n = u16::from_le_bytes(r.array()?) as usize;
                if n > MAX_NAMES {
                    return Err(ProtoError::BadField("names.count"));
                }
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push(r.bytes(MAX_PATH, "names.name")?);
                }
                Msg::Names { names, more }
            }
            BATCH => Msg::Batch {
                messages: r.batch()?.into_iter().map(<[u8]>::to_vec).collect(),
            },
            21 => {
                let more = r.u8()? != 0;
                let n = u16::from_le_bytes(r.array()?) as usize;
                if n > MAX_RULES {
                    return Err(ProtoError::BadField("rules.count"));
                }
                let mut rules = Vec::with_capacity(n);
                for _ in 0..n {
                    let include = match r.u8()? {
                        0 => false,
                        1 => true,
                        _ => return Err(ProtoError::BadField("rules.include")),
                    };
                    let pattern = r.bytes(MAX_PATTERN, "rules.pattern")?;
                    rules.push(RuleText { include, pattern });
                }
                Msg::Rules { rules, more }
            }
            15 => {
                let entry = r.entry(WHOLE_END_LEN)?;
                if entry.kind != EntryKind::File {
                    return Err(ProtoError::BadField("whole.kind"));
                }
                Msg::Whole {
                    entry,
                    chunks: r.u64()?,
                    digest: r.array()?,
                }
            }
            16 => Msg::EntriesOk {
                indices: r.indices()?,
            },
            18 => Msg::EntriesWanted {
                indices: r.indices()?,
            },
            19 => Msg::EntriesSkipped {
                indices: r.indices()?,
            },
            17 => {
                let index = r.u32()?;
                let name = r.bytes(MAX_XATTR_NAME, "xattr.name")?;
                if !xattr_name_allowed(&name) {
                    return Err(ProtoError::BadField("xattr.name"));
                }
                let total = r.u32()?;
                let offset = r.u32()?;
                let piece = r.bytes(MAX_XATTR_PIECE, "xattr.piece")?;
                let end = u64::from(offset) + piece.len() as u64;
                if total > MAX_XATTR_VALUE || end > u64::from(total) {
                    return Err(ProtoError::BadField("xattr.total"));
                }
                Msg::Xattr {
                    index,
                    name,
                    total,
                    offset,
                    piece,
                }
            }
            14 => {
                let session = r.array()?;
                let stream = r.u32()?;
                if stream == 0 || stream >= MAX_STREAMS {
                    return Err(ProtoError::BadField("join.stream"));
                }
                Msg::Join { session, stream }
            }
            25 => {
                let more = r.flag("chain.more")?;
                let n = u16::from_le_bytes(r.array()?) as usize;
                if n > MAX_HOPS {
                    return Err(ProtoError::BadField("chain.count"));
                }
                let mut hops = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = r.name("chain.name")?;
                    let host = r.name("chain.host")?;
                    let port = u16::from_le_bytes(r.array()?);
                    let token = r.bytes(MAX_TOKEN, "chain.token")?;
                    if port == 0 {
                        return Err(ProtoError::BadField("chain.port"));
                    }
                    hops.push(Hop {
                        name,
                        host,
                        port,
                        token,
                    });
                }
                Msg::Chain { hops, more }
            }
            26 => Msg::NodeDone(NodeResult {
                name: r.name("node_done.name")?,
                ok: r.flag("node_done.ok")?,
                files: r.u64()?,
                bytes: r.u64()?,
                micros: r.u64()?,
                failed: r.u32()?,
                reason: r.text()?,
            }),
            other => return Err(ProtoError::UnknownTag(other)),
        };
        r.end()?;
        Ok(msg)
    }
}

/// Bytes of an entry's archive tail.
const META_LEN: usize = 4 + 4 + 8 + 2;
/// Bytes after the entry in a `Whole`: its chunk count and file digest.
const WHOLE_END_LEN: usize = 8 + 32;

fn truncate(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn put_entry(w: &mut Vec<u8>, e: &Entry) {
    put_u32(w, e.index);
    w.push(e.kind as u8);
    put_u32(w, e.mode);
    w.extend_from_slice(&e.mtime_sec.to_le_bytes());
    put_u32(w, e.mtime_nsec);
    w.extend_from_slice(&e.size.to_le_bytes());
    put_bytes(w, &e.path);
    put_bytes(w, &e.target);
    put_u32(w, e.chunk);
    if let Some(m) = &e.meta {
        put_u32(w, m.uid);
        put_u32(w, m.gid);
        w.extend_from_slice(&m.rdev.to_le_bytes());
        w.extend_from_slice(&m.xattrs.to_le_bytes());
    }
}

/// The extended attribute names rcp carries: the `user`, `trusted` and
/// `security` namespaces and the two POSIX ACLs; never another `system`
/// attribute (those are the kernel's own views, not data).
pub fn xattr_name_allowed(name: &[u8]) -> bool {
    let namespaced = |ns: &[u8]| name.len() > ns.len() && name.starts_with(ns);
    namespaced(b"user.")
        || namespaced(b"trusted.")
        || namespaced(b"security.")
        || name == ACL_ACCESS
        || name == ACL_DEFAULT
}

/// The attributes POSIX ACLs are kept in (`-A`).
pub const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
pub const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    w.extend_from_slice(&(b.len() as u16).to_le_bytes());
    w.extend_from_slice(b);
}

/// The tag of `Batch`.
const BATCH: u8 = 22;

/// A `Batch` written as its messages come, each encoded straight into it
/// (where `Msg::Batch` holds each encoded on its own and copies it
/// again), bounded by the size of a message on the link.
#[derive(Debug)]
pub struct BatchWriter {
    /// The batch's bytes: its tag, count, then each message behind its
    /// length.
    buf: Vec<u8>,
    count: u16,
    room: usize,
    /// It holds one message too long for a batch: it goes alone.
    long: bool,
}

/// The tag and count in front of a batch's messages.
const BATCH_HEAD: usize = 3;

impl BatchWriter {
    /// An empty batch of at most `room` bytes.
    pub fn new(room: usize) -> BatchWriter {
        BatchWriter {
            buf: vec![BATCH, 0, 0],
            count: 0,
            room,
            long: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Adds `m` if it fits beside what the batch holds (one message
    /// always fits an empty batch: it may then go alone); `false` leaves
    /// the batch as it was.
    pub fn push(&mut self, m: &Msg) -> bool {
        // Encoded in place behind room for its length (taken back if it
        // does not fit: once a batch, where it is full).
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        m.encode_into(&mut self.buf);
        let len = self.buf.len() - start - 2;
        // (A message in a batch has a 16-bit length: a longer one can only
        // go alone.)
        let long = len > usize::from(u16::MAX);
        let full = self.buf.len() > self.room || self.count == u16::MAX;
        if self.count > 0 && (full || long || self.long) {
            self.buf.truncate(start);
            return false;
        }
        // (Alone, a long message goes without it: see `bytes`.)
        self.buf[start..start + 2].copy_from_slice(&(len as u16).to_le_bytes());
        self.long = long;
        self.count += 1;
        true
    }

    /// The bytes to send: one message alone as itself, several as a
    /// `Batch`.
    pub fn bytes(&mut self) -> &[u8] {
        if self.count == 1 {
            &self.buf[BATCH_HEAD + 2..]
        } else {
            self.buf[1..BATCH_HEAD].copy_from_slice(&self.count.to_le_bytes());
            &self.buf
        }
    }

    /// Empties the batch (its room is kept).
    pub fn clear(&mut self) {
        self.buf.truncate(BATCH_HEAD);
        self.count = 0;
        self.long = false;
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// Nothing may follow a message.
    fn end(&self) -> Result<(), ProtoError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ProtoError::Trailing(self.0.len()))
        }
    }
    /// A `Batch`'s messages (after its tag), each a non-empty message that
    /// is not itself a batch.
    fn batch(&mut self) -> Result<Vec<&'a [u8]>, ProtoError> {
        let n = u16::from_le_bytes(self.array()?) as usize;
        let mut messages = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let len = u16::from_le_bytes(self.array()?) as usize;
            let m = self.take(len)?;
            if m.first().is_none_or(|&tag| tag == BATCH) {
                return Err(ProtoError::BadField("batch.message"));
            }
            messages.push(m);
        }
        Ok(messages)
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.0.len() < n {
            return Err(ProtoError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    /// A byte that must be 0 or 1.
    fn flag(&mut self, field: &'static str) -> Result<bool, ProtoError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::BadField(field)),
        }
    }

    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    /// 1..=[`MAX_OKS`] entry indices (`EntriesOk` and its kin).
    fn indices(&mut self) -> Result<Vec<u32>, ProtoError> {
        let n = self.u32()? as usize;
        if n == 0 || n > MAX_OKS {
            return Err(ProtoError::BadField("entries_ok.count"));
        }
        (0..n).map(|_| self.u32()).collect()
    }
    fn flags(&mut self) -> Result<u32, ProtoError> {
        let f = self.u32()?;
        let merged_unchained = f & flags::MERGED_ANSWERS != 0 && f & flags::CHAIN == 0;
        let mounts_alone = f & flags::NO_MOUNT_POINTS != 0 && f & flags::ONE_FILE_SYSTEM == 0;
        // (Every bit is a known flag: choices that came after them go in
        // `Extras`, whose items are checked one by one.)
        const _: () = assert!(flags::KNOWN == u32::MAX);
        if (f & flags::CHECKS).count_ones() > 1 || merged_unchained || mounts_alone {
            return Err(ProtoError::BadField("flags"));
        }
        Ok(f)
    }
    /// An entry followed by `after` more bytes of its message.
    fn entry(&mut self, after: usize) -> Result<Entry, ProtoError> {
        let index = self.u32()?;
        let kind = match self.u8()? {
            1 => EntryKind::File,
            2 => EntryKind::Dir,
            3 => EntryKind::Symlink,
            4 => EntryKind::Fifo,
            5 => EntryKind::Socket,
            6 => EntryKind::CharDevice,
            7 => EntryKind::BlockDevice,
            8 => EntryKind::HardLink,
            _ => return Err(ProtoError::BadField("entry.kind")),
        };
        let mode = self.u32()?;
        if mode & !0o7777 != 0 {
            return Err(ProtoError::BadField("entry.mode"));
        }
        let mtime_sec = i64::from_le_bytes(self.array()?);
        let mtime_nsec = self.u32()?;
        if mtime_nsec >= 1_000_000_000 {
            return Err(ProtoError::BadField("entry.mtime_nsec"));
        }
        let size = self.u64()?;
        let path = self.bytes(MAX_PATH, "entry.path")?;
        let target = self.bytes(MAX_PATH, "entry.target")?;
        let chunk = self.u32()?;
        if (kind == EntryKind::File) != (chunk > 0) {
            return Err(ProtoError::BadField("entry.chunk"));
        }
        if path.is_empty() {
            return Err(ProtoError::BadField("entry.path"));
        }
        let has_target = matches!(kind, EntryKind::Symlink | EntryKind::HardLink);
        if has_target == target.is_empty() {
            return Err(ProtoError::BadField("entry.target"));
        }
        if kind != EntryKind::File && size != 0 {
            return Err(ProtoError::BadField("entry.size"));
        }
        // The archive tail, if the message is long enough for one before
        // the `after` bytes that follow the entry in it.
        let meta = if self.0.len() == META_LEN + after {
            let meta = Meta {
                uid: self.u32()?,
                gid: self.u32()?,
                rdev: self.u64()?,
                xattrs: u16::from_le_bytes(self.array()?),
            };
            if meta.xattrs > MAX_XATTRS {
                return Err(ProtoError::BadField("entry.xattrs"));
            }
            Some(meta)
        } else {
            None
        };
        if meta.is_none() && (kind.is_special() || kind == EntryKind::HardLink) {
            return Err(ProtoError::BadField("entry.meta"));
        }
        Ok(Entry {
            index,
            kind,
            mode,
            mtime_sec,
            mtime_nsec,
            size,
            path,
            target,
            chunk,
            meta,
        })
    }
    fn streams(&mut self) -> Result<u32, ProtoError> {
        let n = self.u32()?;
        if n == 0 || n > MAX_STREAMS {
            return Err(ProtoError::BadField("streams"));
        }
        Ok(n)
    }
    fn bytes(&mut self, max: usize, field: &'static str) -> Result<Vec<u8>, ProtoError> {
        let n = u16::from_le_bytes(self.array()?) as usize;
        if n > max {
            return Err(ProtoError::BadField(field));
        }
        Ok(self.take(n)?.to_vec())
    }
    fn text(&mut self) -> Result<String, ProtoError> {
        let b = self.bytes(MAX_TEXT, "text")?;
        String::from_utf8(b).map_err(|_| ProtoError::BadText)
    }
    /// A host or node name: 1..=255 bytes of UTF-8.
    fn name(&mut self, field: &'static str) -> Result<String, ProtoError> {
        let b = self.bytes(crate::hostlist::MAX_NAME, field)?;
        if b.is_empty() {
            return Err(ProtoError::BadField(field));
        }
        String::from_utf8(b).map_err(|_| ProtoError::BadText)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn samples() -> Vec<Msg> {
        vec![
            Msg::Challenge {
                nonce: [1; 32],
                encrypt: true,
            },
            Msg::Auth {
                nonce: [2; 32],
                mac: [3; 32],
                encrypt: false,
            },
            Msg::AuthOk { mac: [4; 32] },
            Msg::Push {
                flags: flags::RECURSIVE | flags::PRESERVE,
                streams: 4,
                sources: 2,
                dest: b"/data/x".to_vec(),
            },
            Msg::Pull {
                flags: 0,
                streams: 1,
                sources: vec![b"a".to_vec(), "ü b".as_bytes().to_vec()],
            },
            Msg::Ready {
                dest_is_dir: true,
                session: [3; 16],
            },
            Msg::Entry(Entry {
                index: 7,
                kind: EntryKind::File,
                mode: 0o644,
                mtime_sec: -5,
                mtime_nsec: 999_999_999,
                size: 1 << 40,
                path: b"dir/file name".to_vec(),
                target: vec![],
                chunk: 1 << 20,
                meta: None,
            }),
            Msg::Entry(Entry {
                index: 8,
                kind: EntryKind::Symlink,
                mode: 0o777,
                mtime_sec: 0,
                mtime_nsec: 0,
                size: 0,
                path: b"l".to_vec(),
                target: b"../x".to_vec(),
                chunk: 0,
                meta: None,
            }),
            Msg::EntryEnd {
                index: 7,
                chunks: 1 << 20,
                digest: [9; 32],
            },
            Msg::EntryOk { index: 7 },
            Msg::EntryFailed {
                index: 8,
                kind: FailKind::Io,
                reason: "disk full".into(),
            },
            Msg::Have {
                index: 1,
                first: 3,
                digests: vec![[5; 32], [6; 32]],
            },
            Msg::Done { entries: 9 },
            Msg::Fail {
                reason: "no such file".into(),
            },
            Msg::Join {
                session: [8; 16],
                stream: 15,
            },
            Msg::Whole {
                entry: Entry {
                    index: 9,
                    kind: EntryKind::File,
                    mode: 0o600,
                    mtime_sec: 1,
                    mtime_nsec: 2,
                    size: 4096,
                    path: b"small".to_vec(),
                    target: vec![],
                    chunk: 1 << 20,
                    meta: None,
                },
                chunks: 1,
                digest: [7; 32],
            },
            Msg::EntriesOk {
                indices: vec![1, 5, 2],
            },
            Msg::Entry(Entry {
                index: 10,
                kind: EntryKind::CharDevice,
                mode: 0o620,
                mtime_sec: 3,
                mtime_nsec: 4,
                size: 0,
                path: b"dev/tty9".to_vec(),
                target: vec![],
                chunk: 0,
                meta: Some(Meta {
                    uid: 0,
                    gid: 5,
                    rdev: (4 << 8) | 9,
                    xattrs: 0,
                }),
            }),
            Msg::Entry(Entry {
                index: 11,
                kind: EntryKind::HardLink,
                mode: 0o644,
                mtime_sec: 0,
                mtime_nsec: 0,
                size: 0,
                path: b"b/other name".to_vec(),
                target: b"dir/file name".to_vec(),
                chunk: 0,
                meta: Some(Meta::default()),
            }),
            Msg::Whole {
                entry: Entry {
                    index: 12,
                    kind: EntryKind::File,
                    mode: 0o4755,
                    mtime_sec: 1,
                    mtime_nsec: 2,
                    size: 10,
                    path: b"suid".to_vec(),
                    target: vec![],
                    chunk: 1 << 20,
                    meta: Some(Meta {
                        uid: 1000,
                        gid: 100,
                        rdev: 0,
                        xattrs: 2,
                    }),
                },
                chunks: 1,
                digest: [7; 32],
            },
            Msg::Xattr {
                index: 12,
                name: b"user.comment".to_vec(),
                total: 5000,
                offset: 100,
                piece: vec![0xab; 4900],
            },
            Msg::Xattr {
                index: 12,
                name: ACL_ACCESS.to_vec(),
                total: 0,
                offset: 0,
                piece: vec![],
            },
            Msg::EntriesWanted {
                indices: vec![3, 4],
            },
            Msg::EntriesSkipped { indices: vec![9] },
            Msg::Removed {
                path: b"top/gone".to_vec(),
            },
            Msg::Rules {
                rules: vec![
                    RuleText {
                        include: true,
                        pattern: b"*.c".to_vec(),
                    },
                    RuleText {
                        include: false,
                        pattern: b"/top/**".to_vec(),
                    },
                ],
                more: true,
            },
            Msg::Batch {
                messages: vec![
                    Msg::Done { entries: 3 }.encode(),
                    Msg::EntryOk { index: 1 }.encode(),
                ],
            },
            Msg::Itemized {
                code: *b">f.st......",
                path: b"top/f".to_vec(),
            },
            Msg::Names {
                names: vec![b"a".to_vec(), b"a/b c".to_vec()],
                more: true,
            },
            Msg::Chain {
                hops: vec![
                    Hop {
                        name: "node02".into(),
                        host: "10.0.0.2".into(),
                        port: 40_001,
                        token: b"t0k3n".to_vec(),
                    },
                    Hop {
                        name: "node03".into(),
                        host: "node03".into(),
                        port: 7470,
                        token: vec![],
                    },
                ],
                more: false,
            },
            Msg::NodeDone(NodeResult {
                name: "node02".into(),
                ok: false,
                files: 3,
                bytes: 1 << 33,
                micros: 1_234_567,
                failed: 1,
                reason: "big: No space left on device".into(),
            }),
            Msg::Unlisted { index: 41 },
            Msg::Abandoned {
                index: 42,
                chunks: 3,
                kind: FailKind::Io,
                reason: "cannot read top/f: Permission denied".into(),
            },
            Msg::Unsent {
                path: b"top/link".to_vec(),
                kind: FailKind::Io,
                reason: "symlink has no referent".into(),
            },
            Msg::Sizes {
                min: 1,
                max: 1 << 40,
            },
            Msg::LinkDests {
                dirs: vec![b"../prev".to_vec(), b"/snap/1".to_vec()],
            },
            Msg::Extras {
                items: Extras {
                    max_delete: Some(7),
                    delete_excluded: true,
                    existing: true,
                    chmod: Some((0o077, "a+rX".into())),
                    force: true,
                    backup: Some(Vec::new()),
                    backup_dir: Some(b"../bak".to_vec()),
                    prune_empty_dirs: true,
                    lists_marked: true,
                    partial: true,
                    mkpath: true,
                    omit_dir_times: true,
                    ignore_missing_args: true,
                    copy_dirlinks: true,
                    modify_window: Some(1),
                    preserve_one: Some(PreserveOne::Times),
                }
                .items(),
            },
        ]
    }

    #[test]
    fn extras_round_trip_and_an_unknown_or_malformed_item_is_refused() {
        let all = Extras {
            max_delete: Some(0),
            delete_excluded: true,
            existing: true,
            chmod: Some((0o022, "Dg+s,Fgo-w".into())),
            force: true,
            backup: Some(b".old".to_vec()),
            backup_dir: Some(b"/bak".to_vec()),
            prune_empty_dirs: true,
            lists_marked: true,
            partial: true,
            mkpath: true,
            omit_dir_times: true,
            ignore_missing_args: true,
            copy_dirlinks: true,
            modify_window: Some(0),
            preserve_one: Some(PreserveOne::Modes),
        };
        let one = Extras {
            existing: true,
            ..Extras::default()
        };
        for extras in [one, all.clone()] {
            assert_eq!(Extras::from_items(&extras.items()), Ok(extras));
        }
        assert!(!Extras::default().any() && all.any());
        assert!(
            Extras::from_items(&[(4, b"\x12\0\0\0u+z".to_vec())]).is_err(),
            "bad rules"
        );
        assert!(
            Extras::from_items(&[(2, vec![1])]).is_err(),
            "a flag has no value"
        );
        assert!(
            Extras::from_items(&[(8, vec![1])]).is_err(),
            "-m has no value"
        );
        assert!(
            Extras::from_items(&[(5, vec![0])]).is_err(),
            "--force has none"
        );
        assert!(
            Extras::from_items(&[(10, vec![0])]).is_err(),
            "--partial has none"
        );
        for bad in [vec![], vec![0], vec![3], vec![1, 2]] {
            assert!(Extras::from_items(&[(11, bad)]).is_err(), "modes or times");
        }
        for bad in [vec![], vec![1], vec![0; 9]] {
            assert!(
                Extras::from_items(&[(1, bad.clone())]).is_err(),
                "--max-delete is 8 bytes"
            );
            assert!(
                Extras::from_items(&[(16, bad)]).is_err(),
                "a window is 8 bytes"
            );
        }
        assert!(Extras::from_items(&[(999, vec![])]).is_err(), "unknown");
        assert!(Extras::from_items(&[]).is_err(), "no items");
        assert!(
            Extras::from_items(&[(2, vec![]), (2, vec![])]).is_err(),
            "twice"
        );
        assert!(Extras::from_items(&[(1, vec![1, 2])]).is_err(), "not a u64");
    }

    #[test]
    fn chain_fields_are_checked() {
        let hop = |name: &str, port: u16, token: usize| Hop {
            name: name.into(),
            host: "h".into(),
            port,
            token: vec![b'x'; token],
        };
        let chain = |hops| Msg::decode(&Msg::Chain { hops, more: false }.encode());
        assert!(chain(vec![hop("a", 1, MAX_TOKEN)]).is_ok());
        assert!(chain(vec![]).is_ok());
        assert_eq!(
            chain(vec![hop("a", 1, 0); MAX_HOPS + 1]),
            Err(ProtoError::BadField("chain.count"))
        );
        assert_eq!(
            chain(vec![hop("a", 0, 0)]),
            Err(ProtoError::BadField("chain.port"))
        );
        assert_eq!(
            chain(vec![hop("", 1, 0)]),
            Err(ProtoError::BadField("chain.name"))
        );
        assert_eq!(
            chain(vec![hop("a", 1, MAX_TOKEN + 1)]),
            Err(ProtoError::BadField("chain.token"))
        );
        let mut bad_more = Msg::Chain {
            hops: vec![hop("a", 1, 0)],
            more: false,
        }
        .encode();
        bad_more[1] = 2;
        assert_eq!(
            Msg::decode(&bad_more),
            Err(ProtoError::BadField("chain.more"))
        );
    }

    #[test]
    fn archive_fields_are_checked() {
        let xattr = |name: &[u8], total: u32, offset: u32, piece: usize| {
            Msg::decode(
                &Msg::Xattr {
                    index: 1,
                    name: name.to_vec(),
                    total,
                    offset,
                    piece: vec![1; piece],
                }
                .encode(),
            )
        };
        assert!(xattr(b"user.a", 10, 0, 10).is_ok());
        assert!(xattr(b"trusted.overlay.opaque", 1, 0, 1).is_ok());
        // The kernel's own views, a bare namespace, unknown namespaces.
        for name in [
            &b"system.sockprotoname"[..],
            b"user.",
            b"os2.x",
            b"",
            b"userx",
        ] {
            assert_eq!(
                xattr(name, 1, 0, 1),
                Err(ProtoError::BadField("xattr.name")),
                "{name:?}"
            );
        }
        // A piece beyond its value, a value beyond the kernel's limit, a
        // piece longer than a message may carry.
        assert_eq!(
            xattr(b"user.a", 10, 5, 6),
            Err(ProtoError::BadField("xattr.total"))
        );
        assert_eq!(
            xattr(b"user.a", MAX_XATTR_VALUE + 1, 0, 1),
            Err(ProtoError::BadField("xattr.total"))
        );
        assert_eq!(
            xattr(b"user.a", 4000, 0, MAX_XATTR_PIECE + 1),
            Err(ProtoError::BadField("xattr.piece"))
        );
        // Devices and hard links only with their metadata; too many xattrs.
        let Msg::Entry(dev) = samples()[17].clone() else {
            unreachable!()
        };
        let bad = |e: Entry| Msg::decode(&Msg::Entry(e).encode());
        assert_eq!(
            bad(Entry {
                meta: None,
                ..dev.clone()
            }),
            Err(ProtoError::BadField("entry.meta"))
        );
        assert_eq!(
            bad(Entry {
                meta: Some(Meta {
                    xattrs: MAX_XATTRS + 1,
                    ..Meta::default()
                }),
                ..dev.clone()
            }),
            Err(ProtoError::BadField("entry.xattrs"))
        );
        // A hard link names the file it is another name of.
        assert_eq!(
            bad(Entry {
                kind: EntryKind::HardLink,
                ..dev
            }),
            Err(ProtoError::BadField("entry.target"))
        );
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            assert_eq!(Msg::decode(&m.encode()), Ok(m.clone()), "{}", m.name());
        }
    }

    #[test]
    fn bad_input_is_refused() {
        assert_eq!(Msg::decode(&[]), Err(ProtoError::Truncated));
        assert_eq!(Msg::decode(&[99]), Err(ProtoError::UnknownTag(99)));
        let mut b = Msg::EntryOk { index: 1 }.encode();
        b.push(0);
        assert_eq!(Msg::decode(&b), Err(ProtoError::Trailing(1)));
        let push = |flags, streams| {
            Msg::Push {
                flags,
                streams,
                sources: 1,
                dest: vec![],
            }
            .encode()
        };
        // A flag from after this build.
        assert_eq!(
            Msg::decode(&push(1 << 31, 1)).map(|_| ()),
            Ok(()),
            "the last flag is EXTRAS: what comes later goes in it"
        );
        // Mount points left out only where the walk keeps to one file
        // system.
        assert_eq!(
            Msg::decode(&push(flags::NO_MOUNT_POINTS, 1)),
            Err(ProtoError::BadField("flags"))
        );
        let xx = flags::ONE_FILE_SYSTEM | flags::NO_MOUNT_POINTS;
        assert!(Msg::decode(&push(xx, 1)).is_ok());
        // Merged answers only in a chain.
        assert_eq!(
            Msg::decode(&push(flags::MERGED_ANSWERS | flags::RESUME, 1)),
            Err(ProtoError::BadField("flags"))
        );
        let chained = flags::MERGED_ANSWERS | flags::RESUME | flags::CHAIN;
        assert!(Msg::decode(&push(chained, 1)).is_ok());
        // One way of comparing files at a time.
        assert_eq!(
            Msg::decode(&push(flags::QUICK_CHECK | flags::CHECKSUM, 1)),
            Err(ProtoError::BadField("flags"))
        );
        assert!(Msg::decode(&push(flags::CHECKSUM | flags::UPDATE, 1)).is_ok());
        for streams in [0, MAX_STREAMS + 1] {
            assert_eq!(
                Msg::decode(&push(0, streams)),
                Err(ProtoError::BadField("streams"))
            );
        }
        // Stream 0 is the session's own link; it cannot join again.
        let join = |stream| Msg::Join {
            session: [0; 16],
            stream,
        };
        for stream in [0, MAX_STREAMS] {
            assert_eq!(
                Msg::decode(&join(stream).encode()),
                Err(ProtoError::BadField("join.stream"))
            );
        }
        // A declared digest count beyond the bytes present allocates nothing.
        let mut b = vec![11];
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Msg::decode(&b), Err(ProtoError::Truncated));
        // Entries: a file with a target, a symlink without one, a bad mode.
        let Msg::Entry(file) = samples()[6].clone() else {
            unreachable!()
        };
        let bad = |e: Entry| Msg::decode(&Msg::Entry(e).encode());
        assert!(
            bad(Entry {
                target: b"x".to_vec(),
                ..file.clone()
            })
            .is_err()
        );
        assert!(
            bad(Entry {
                kind: EntryKind::Symlink,
                size: 0,
                ..file.clone()
            })
            .is_err()
        );
        assert!(
            bad(Entry {
                chunk: 0,
                ..file.clone()
            })
            .is_err()
        );
        assert!(
            bad(Entry {
                mode: 0o10644,
                ..file.clone()
            })
            .is_err()
        );
        assert!(
            bad(Entry {
                path: vec![],
                ..file.clone()
            })
            .is_err()
        );
        assert!(
            bad(Entry {
                kind: EntryKind::Dir,
                chunk: 0,
                ..file
            })
            .is_err()
        );
        // A Whole is a file; EntriesOk answers 1..=MAX_OKS entries.
        let Msg::Entry(dir) = samples()[7].clone() else {
            unreachable!()
        };
        let whole = Msg::Whole {
            entry: dir,
            chunks: 0,
            digest: [0; 32],
        };
        assert_eq!(
            Msg::decode(&whole.encode()),
            Err(ProtoError::BadField("whole.kind"))
        );
        for n in [0, MAX_OKS + 1] {
            let indices = vec![1; n];
            for m in [
                Msg::EntriesOk {
                    indices: indices.clone(),
                },
                Msg::EntriesWanted {
                    indices: indices.clone(),
                },
                Msg::EntriesSkipped {
                    indices: indices.clone(),
                },
            ] {
                assert_eq!(
                    Msg::decode(&m.encode()),
                    Err(ProtoError::BadField("entries_ok.count"))
                );
            }
        }
        let mut long = vec![4];
        long.extend_from_slice(&0u32.to_le_bytes());
        long.extend_from_slice(&1u32.to_le_bytes());
        long.extend_from_slice(&1u32.to_le_bytes());
        long.extend_from_slice(&((MAX_PATH + 1) as u16).to_le_bytes());
        long.extend(vec![b'a'; MAX_PATH + 1]);
        assert_eq!(Msg::decode(&long), Err(ProtoError::BadField("push.dest")));
    }

    #[test]
    fn an_itemized_name_may_hold_a_path_and_a_target_and_no_more() {
        let line = |len: usize| Msg::Itemized {
            code: *b"cL+++++++++",
            path: vec![b'a'; len],
        };
        let longest = line(MAX_ITEMIZED_NAME);
        assert_eq!(Msg::decode(&longest.encode()), Ok(longest));
        assert_eq!(
            Msg::decode(&line(MAX_ITEMIZED_NAME + 1).encode()),
            Err(ProtoError::BadField("itemized.path"))
        );
    }

    #[test]
    fn a_batch_written_in_place_is_the_batch_message() {
        let messages: Vec<Msg> = samples()
            .into_iter()
            .filter(|m| !matches!(m, Msg::Batch { .. }))
            .collect();
        let mut w = BatchWriter::new(usize::MAX);
        for m in &messages {
            assert!(w.push(m));
        }
        let whole = Msg::Batch {
            messages: messages.iter().map(Msg::encode).collect(),
        };
        assert_eq!(w.bytes(), &whole.encode()[..]);
        assert_eq!(Msg::decode_unbatched(w.bytes()), Ok(messages.clone()));
        // Emptied, it is reused; one message goes as itself.
        w.clear();
        assert!(w.is_empty());
        assert!(w.push(&messages[0]));
        assert_eq!(w.bytes(), &messages[0].encode()[..]);
        assert_eq!(
            Msg::decode_unbatched(w.bytes()),
            Ok(vec![messages[0].clone()])
        );
    }

    #[test]
    fn a_batch_stays_within_its_room_but_one_message_always_goes() {
        let small = Msg::EntryOk { index: 7 };
        let big = Msg::Fail {
            reason: "x".repeat(200),
        };
        // Room for the head and two small messages (2 + 5 bytes each).
        let mut w = BatchWriter::new(3 + 2 * 7);
        assert!(w.push(&small));
        assert!(w.push(&small));
        assert!(!w.push(&small));
        assert_eq!(Msg::decode_unbatched(w.bytes()).map(|m| m.len()), Ok(2));
        // A message larger than the room goes alone, never with another.
        w.clear();
        assert!(w.push(&big));
        assert!(!w.push(&small));
        assert_eq!(Msg::decode_unbatched(w.bytes()), Ok(vec![big]));
        // So does one longer than a batch's 16-bit lengths, whatever the
        // room.
        let mut w = BatchWriter::new(usize::MAX);
        let huge = Msg::Have {
            index: 1,
            first: 0,
            digests: vec![[7; 32]; 3000],
        };
        assert!(huge.encode().len() > usize::from(u16::MAX));
        assert!(w.push(&small));
        assert!(!w.push(&huge));
        w.clear();
        assert!(w.push(&huge));
        assert!(!w.push(&small));
        assert_eq!(w.bytes(), &huge.encode()[..]);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(m) = Msg::decode(&bytes) {
                prop_assert_eq!(m.encode(), bytes);
            }
        }

        /// Decoding a batch in place accepts and refuses what decoding it
        /// whole then unbatching does.
        #[test]
        fn batches_decode_in_place_as_they_do_whole(
            picks in proptest::collection::vec(0usize..40, 0..6),
            cut in any::<prop::sample::Index>(),
            flip in any::<(prop::sample::Index, u8)>(),
        ) {
            let samples: Vec<Msg> = samples()
                .into_iter()
                .filter(|m| !matches!(m, Msg::Batch { .. }))
                .collect();
            let messages = picks
                .iter()
                .map(|&i| samples[i % samples.len()].encode())
                .collect();
            let good = Msg::Batch { messages }.encode();
            // The same messages, or an error both ways (which fault is
            // named first may differ: the whole decoding looks at the
            // batch's end before its messages).
            let same = |b: &[u8]| {
                let whole = Msg::decode(b).and_then(|m| match m {
                    Msg::Batch { messages } => messages.iter().map(|m| Msg::decode(m)).collect(),
                    m => Ok(vec![m]),
                });
                match (Msg::decode_unbatched(b), whole) {
                    (Ok(a), Ok(b)) => a == b,
                    (a, b) => a.is_err() && b.is_err(),
                }
            };
            prop_assert!(same(&good));
            prop_assert!(Msg::decode_unbatched(&good).is_ok());
            // Cut short, or one byte changed.
            prop_assert!(same(&good[..cut.index(good.len() + 1)]));
            let mut bent = good.clone();
            let at = flip.0.index(bent.len());
            bent[at] ^= flip.1 | 1;
            prop_assert!(same(&bent));
        }
    }
}
