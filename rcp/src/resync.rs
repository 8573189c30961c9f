//! Incremental re-sync, sans I/O: what the receiver does with a file the
//! sender announces, given what is under its name already (rsync's quick
//! check and its variants). The receiver answers each file at once, so the
//! sender, which announces files a window ahead of their data, reads and
//! sends only what is wanted:
//!
//! - [`Decision::Skip`]: nothing to send; `metadata` says whether the
//!   file's metadata (mode, owner, xattrs, times) is still applied to the
//!   file that is there (a quick-check match), or the file is left as it is
//!   (`--ignore-existing`, `--update` with a newer file there). The answer
//!   is `EntriesSkipped`.
//! - [`Decision::Send`]: every chunk (`EntriesWanted`).
//! - [`Decision::Compare`]: the receiver sends the digests of the chunks of
//!   the file there (`Have`, as `--resume` does) and the sender sends only
//!   the chunks that differ; the others are copied from the old file into
//!   the new one, which replaces it. A file whose chunks all match is left
//!   in place (its metadata applied).

use crate::proto::{Entry, EntryKind, flags};

/// Which files are sent again, from the command line (and the request's
/// flags on the other side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    pub check: Check,
    /// `--ignore-existing`: a name that exists is left alone.
    pub ignore_existing: bool,
    /// `-u/--update`: a file newer at the destination is left alone.
    pub update: bool,
    /// `--min-size`, `--max-size`: a file outside them is left alone,
    /// there or not (its name stays, so `--delete` keeps what is there).
    pub sizes: Sizes,
    /// `--existing`: a name that is not there is not made (a file, and
    /// the receiver leaves out directories too, and all in them). It
    /// travels in the request's `Extras`.
    pub existing: bool,
    /// `--modify-window`: how modification times compare, for the quick
    /// check, `--update` and whether a time left as it is differs. It
    /// travels in the request's `Extras`.
    pub times: TimeMatch,
}

/// How two modification times compare (`--modify-window`).
///
/// rcp's default is to the nanosecond, which rsync does only with a
/// negative window; rsync's default, whole seconds, is a window of 0, and
/// a window of N takes times at most N seconds apart for the same (a FAT
/// file system keeps times to 2 seconds, so 1 is the usual choice there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeMatch {
    /// Equal to the nanosecond.
    #[default]
    Exact,
    /// The whole seconds at most this many apart; nanoseconds aside.
    Within(u64),
}

impl TimeMatch {
    /// `--modify-window N`: negative is to the nanosecond.
    pub fn window(n: i64) -> TimeMatch {
        u64::try_from(n).map_or(TimeMatch::Exact, TimeMatch::Within)
    }

    /// What travels in a request's extras: nothing for the default.
    pub fn seconds(self) -> Option<u64> {
        match self {
            TimeMatch::Exact => None,
            TimeMatch::Within(n) => Some(n),
        }
    }

    /// Whether times `a` and `b` (seconds, nanoseconds) are the same.
    pub fn same(self, a: (i64, u32), b: (i64, u32)) -> bool {
        match self {
            TimeMatch::Exact => a == b,
            TimeMatch::Within(n) => a.0.abs_diff(b.0) <= n,
        }
    }

    /// Whether a file there of time `there` is newer than the source's
    /// of time `source`, for `-u`: to the nanosecond, later; with a
    /// window of N, not older by N seconds or more. (That is rsync's
    /// rule: its source must be N seconds newer to be sent, so with a
    /// window of 1 a file there of the same second is left alone even
    /// where its size differs. rsync applies the same sum to a negative
    /// window, which leaves a file there one second newer to be
    /// overwritten; rcp's default is plainly "later".)
    pub fn newer(self, there: (i64, u32), source: (i64, u32)) -> bool {
        match self {
            TimeMatch::Exact => there > source,
            TimeMatch::Within(n) => i128::from(source.0) - i128::from(there.0) < i128::from(n),
        }
    }
}

/// The sizes of the files a copy sends (`--min-size`, `--max-size`, both
/// bounds inclusive, as rsync's). They travel after the request's rules
/// (`Msg::Sizes`), as the receiver decides by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub min: u64,
    pub max: u64,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes {
            min: 0,
            max: u64::MAX,
        }
    }
}

impl Sizes {
    /// Whether a file of `size` bytes is sent.
    pub fn admit(&self, size: u64) -> bool {
        (self.min..=self.max).contains(&size)
    }

    /// Whether any file is left out by its size.
    pub fn limit(&self) -> bool {
        *self != Sizes::default()
    }
}

/// How a file that exists is compared with the source's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Check {
    /// Size and modification time (to the nanosecond, or as
    /// `--modify-window` says): equal is unchanged.
    #[default]
    Quick,
    /// `--size-only`: equal size is unchanged.
    SizeOnly,
    /// `-c/--checksum`: chunk digests decide, chunk by chunk.
    Checksum,
    /// `-I/--ignore-times`: every file is sent whole (and the sender does
    /// not wait for the receiver's answer before sending).
    Never,
}

/// What is under the entry's name at the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Nothing,
    /// A regular file of `size` bytes, modified at `mtime`.
    File {
        size: u64,
        mtime: (i64, u32),
    },
    /// Something else (a directory, a symlink): replaced, or the rename
    /// fails and says why.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Skip { metadata: bool },
    Send,
    Compare,
}

impl Policy {
    /// The policy of a copy into a destination that holds nothing yet
    /// (a first copy): every file is sent whole and unasked, as with `-I`.
    /// Whatever the policy, a file that is not there is sent whole, so
    /// the receiver's answers could say nothing else; without them the
    /// sender reads each file as soon as it is walked. (A fresh local copy
    /// of 100,000 small files took 0.92x the time unasked.)
    pub fn into_nothing_there(self) -> Policy {
        Policy {
            check: Check::Never,
            ignore_existing: false,
            update: false,
            // (A file of a size left out is left out there too, and with
            // `--existing` every file: the receiver still answers each.)
            sizes: self.sizes,
            existing: self.existing,
            times: self.times,
        }
    }

    /// Whether the receiver answers every file before its data is sent.
    pub fn asks(&self) -> bool {
        self.flags() != 0 || self.existing
    }

    /// Whether a copy under this policy has every file answered before
    /// its data: the policy asks, or `--resume` (digests of what is
    /// there) or a dry run (every file answered, none sent) does. Sender,
    /// receiver and a broadcast's request all go by this one rule.
    pub fn answered(&self, resume: bool, dry_run: bool) -> bool {
        self.asks() || resume || dry_run
    }

    /// The policy as request flags.
    pub fn flags(&self) -> u32 {
        let mut f = match self.check {
            Check::Quick => flags::QUICK_CHECK,
            Check::SizeOnly => flags::SIZE_ONLY,
            Check::Checksum => flags::CHECKSUM,
            Check::Never => 0,
        };
        if self.ignore_existing {
            f |= flags::IGNORE_EXISTING;
        }
        if self.update {
            f |= flags::UPDATE;
        }
        if self.sizes.limit() {
            f |= flags::SIZE_LIMITS;
        }
        f
    }

    /// The policy of a request's flags (at most one check among them: the
    /// decoder refuses more), with the sizes of `SIZE_LIMITS` (which
    /// follow the request) as `sizes`.
    pub fn from_flags(f: u32, sizes: Sizes) -> Policy {
        let check = if f & flags::SIZE_ONLY != 0 {
            Check::SizeOnly
        } else if f & flags::CHECKSUM != 0 {
            Check::Checksum
        } else if f & flags::QUICK_CHECK != 0 {
            Check::Quick
        } else {
            Check::Never
        };
        Policy {
            check,
            ignore_existing: f & flags::IGNORE_EXISTING != 0,
            update: f & flags::UPDATE != 0,
            sizes,
            existing: false,
            times: TimeMatch::Exact,
        }
    }

    /// What to do with file `e` given what is there.
    pub fn decide(&self, e: &Entry, found: Found) -> Decision {
        if !self.sizes.admit(e.size) {
            return Decision::Skip { metadata: false };
        }
        let (size, mtime) = match found {
            Found::Nothing if self.existing => return Decision::Skip { metadata: false },
            Found::Nothing => return Decision::Send,
            _ if self.ignore_existing => return Decision::Skip { metadata: false },
            Found::Other => return Decision::Send,
            Found::File { size, mtime } => (size, mtime),
        };
        let theirs = (e.mtime_sec, e.mtime_nsec);
        if self.update && self.times.newer(mtime, theirs) {
            return Decision::Skip { metadata: false };
        }
        match self.check {
            Check::Never => Decision::Send,
            Check::Quick if size == e.size && self.times.same(mtime, theirs) => {
                Decision::Skip { metadata: true }
            }
            Check::SizeOnly if size == e.size => Decision::Skip { metadata: true },
            Check::Quick | Check::SizeOnly => Decision::Send,
            Check::Checksum => Decision::Compare,
        }
    }
}

/// What is under an entry's name, as `-i` compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct There {
    pub kind: EntryKind,
    pub size: u64,
    pub mtime: (i64, u32),
    /// Permission bits (and setuid, setgid, sticky).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// A symlink there points where the entry's does (true for all
    /// else).
    pub same_target: bool,
}

/// What a copy keeps, as far as `-i` reports differences of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    pub times: bool,
    /// How the times compare (`--modify-window`).
    pub window: TimeMatch,
    pub perms: bool,
    pub owner: bool,
    pub group: bool,
}

/// rsync's `--itemize-changes` code of entry `e`: `YXcstpoguax`, where Y
/// is `>` (data is sent), `c` (created here, not a file), `h` (a hard
/// link), `.` (only metadata); X the kind (`f d L D S`); then one letter a
/// difference (`+` each for a new entry), `.` for none. `None`: nothing
/// changes, no line (as rsync's single `-i`). The `c`, `u`, `a` and `x`
/// letters are not reported (always `.`).
pub fn itemize(e: &Entry, there: Option<&There>, sent: bool, kept: Kept) -> Option<[u8; 11]> {
    let x = match e.kind {
        EntryKind::File | EntryKind::HardLink => b'f',
        EntryKind::Dir => b'd',
        EntryKind::Symlink => b'L',
        EntryKind::CharDevice | EntryKind::BlockDevice => b'D',
        EntryKind::Fifo | EntryKind::Socket => b'S',
    };
    let y = match e.kind {
        EntryKind::HardLink => b'h',
        EntryKind::File if sent => b'>',
        _ => b'c',
    };
    let same_kind = |t: &There| {
        t.kind == e.kind || (e.kind == EntryKind::HardLink && t.kind == EntryKind::File)
    };
    let Some(t) = there.filter(|t| same_kind(t)) else {
        let mut code = [b'+'; 11];
        code[0] = y;
        code[1] = x;
        return Some(code);
    };
    if e.kind == EntryKind::HardLink {
        // Linked already or not: rcp does not tell (no line).
        return None;
    }
    let differs = |yes: bool, letter: u8| if yes { letter } else { b'.' };
    let mut code = [b'.'; 11];
    code[0] = if sent { b'>' } else { b'.' };
    code[1] = x;
    // (A symlink made again to point elsewhere: rsync's `cLc`.)
    if !t.same_target {
        code[0] = b'c';
        code[2] = b'c';
    }
    code[3] = differs(e.kind == EntryKind::File && t.size != e.size, b's');
    let same_time = kept.window.same(t.mtime, (e.mtime_sec, e.mtime_nsec));
    code[4] = differs(kept.times && !same_time, b't');
    code[5] = differs(kept.perms && t.mode & 0o7777 != e.mode, b'p');
    let meta = e.meta.as_ref();
    code[6] = differs(kept.owner && meta.is_some_and(|m| m.uid != t.uid), b'o');
    code[7] = differs(kept.group && meta.is_some_and(|m| m.gid != t.gid), b'g');
    (code[0] != b'.' || code[2..].iter().any(|&c| c != b'.')).then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file(size: u64, mtime: (i64, u32)) -> Entry {
        Entry {
            index: 1,
            kind: EntryKind::File,
            mode: 0o644,
            mtime_sec: mtime.0,
            mtime_nsec: mtime.1,
            size,
            path: b"f".to_vec(),
            target: Vec::new(),
            chunk: 1 << 20,
            meta: None,
        }
    }

    fn policy(check: Check) -> Policy {
        Policy {
            check,
            ..Policy::default()
        }
    }

    const T: (i64, u32) = (1_500_000_000, 123_456_789);

    proptest! {
        /// Into nothing, every policy sends every file: the policy that
        /// does not ask decides the same.
        #[test]
        fn into_nothing_every_policy_decides_as_the_one_that_does_not_ask(
            check in prop_oneof![
                Just(Check::Quick),
                Just(Check::SizeOnly),
                Just(Check::Checksum),
                Just(Check::Never),
            ],
            ignore_existing: bool,
            update: bool,
            size in 0u64..1 << 40,
        ) {
            let p = Policy { check, ignore_existing, update, sizes: Sizes::default(), existing: false, times: TimeMatch::Exact };
            let q = p.into_nothing_there();
            prop_assert!(!q.asks());
            let e = file(size, T);
            prop_assert_eq!(p.decide(&e, Found::Nothing), Decision::Send);
            prop_assert_eq!(q.decide(&e, Found::Nothing), Decision::Send);
        }
    }

    #[test]
    fn the_quick_check_skips_same_size_and_time_to_the_nanosecond() {
        let p = Policy::default();
        let there = |size, mtime| p.decide(&file(10, T), Found::File { size, mtime });
        assert_eq!(there(10, T), Decision::Skip { metadata: true });
        assert_eq!(there(11, T), Decision::Send);
        assert_eq!(there(10, (T.0, T.1 + 1)), Decision::Send);
        assert_eq!(there(10, (T.0 - 1, T.1)), Decision::Send);
        assert_eq!(p.decide(&file(10, T), Found::Nothing), Decision::Send);
        assert_eq!(p.decide(&file(10, T), Found::Other), Decision::Send);
    }

    #[test]
    fn a_modify_window_takes_times_that_near_for_the_same() {
        let seconds = Policy {
            times: TimeMatch::window(0),
            ..Policy::default()
        };
        let fat = Policy {
            times: TimeMatch::window(1),
            ..Policy::default()
        };
        let there = |p: &Policy, mtime| p.decide(&file(10, T), Found::File { size: 10, mtime });
        let skip = Decision::Skip { metadata: true };
        // Whole seconds: the nanoseconds aside, as rsync's default.
        assert_eq!(there(&seconds, (T.0, 0)), skip);
        assert_eq!(there(&seconds, (T.0 + 1, T.1)), Decision::Send);
        // Within one second either way, as on FAT; not two.
        for near in [(T.0 - 1, 0), (T.0 + 1, 999_999_999), (T.0, 7)] {
            assert_eq!(there(&fat, near), skip, "{near:?}");
        }
        for far in [(T.0 - 2, T.1), (T.0 + 2, T.1)] {
            assert_eq!(there(&fat, far), Decision::Send, "{far:?}");
        }
        // A size that differs is sent, whatever the times.
        let bigger = Found::File { size: 11, mtime: T };
        assert_eq!(fat.decide(&file(10, T), bigger), Decision::Send);
        // A negative window is the default: to the nanosecond.
        assert_eq!(TimeMatch::window(-1), TimeMatch::Exact);
        assert_eq!(TimeMatch::window(-1).seconds(), None);
        assert_eq!(TimeMatch::window(3).seconds(), Some(3));
    }

    #[test]
    fn update_leaves_a_file_there_not_older_by_the_window() {
        let update = |times| Policy {
            update: true,
            times,
            ..Policy::default()
        };
        let decide = |times, there| {
            update(times).decide(
                &file(10, T),
                Found::File {
                    size: 3,
                    mtime: there,
                },
            )
        };
        let left = Decision::Skip { metadata: false };
        // Later in the same second: newer to the nanosecond, not in whole
        // seconds, where the other size sends it.
        assert_eq!(decide(TimeMatch::Exact, (T.0, T.1 + 1)), left);
        assert_eq!(decide(TimeMatch::Within(0), (T.0, T.1 + 1)), Decision::Send);
        assert_eq!(decide(TimeMatch::Within(0), (T.0 + 1, 0)), left);
        // With a window of 2, a file there not 2 seconds older counts as
        // newer (rsync's rule: the source must be 2 seconds newer).
        assert_eq!(decide(TimeMatch::Within(2), (T.0 - 1, 0)), left);
        assert_eq!(decide(TimeMatch::Within(2), (T.0 - 2, T.1)), Decision::Send);
        assert_eq!(decide(TimeMatch::Within(2), (i64::MIN, 0)), Decision::Send);
        assert_eq!(decide(TimeMatch::Within(u64::MAX), (i64::MIN, 0)), left);
    }

    #[test]
    fn size_only_checksum_and_ignore_times() {
        let later = Found::File {
            size: 10,
            mtime: (T.0 + 5, 0),
        };
        assert_eq!(
            policy(Check::SizeOnly).decide(&file(10, T), later),
            Decision::Skip { metadata: true }
        );
        assert_eq!(
            policy(Check::SizeOnly).decide(&file(9, T), later),
            Decision::Send
        );
        // Checksum compares whatever the size and time say, and nothing
        // with nothing there.
        let same = Found::File { size: 10, mtime: T };
        assert_eq!(
            policy(Check::Checksum).decide(&file(10, T), same),
            Decision::Compare
        );
        assert_eq!(
            policy(Check::Checksum).decide(&file(10, T), Found::Nothing),
            Decision::Send
        );
        assert_eq!(
            policy(Check::Never).decide(&file(10, T), same),
            Decision::Send
        );
    }

    #[test]
    fn ignore_existing_and_update_leave_the_file_as_it_is() {
        let ignore = Policy {
            ignore_existing: true,
            ..Policy::default()
        };
        for found in [Found::Other, Found::File { size: 1, mtime: T }] {
            assert_eq!(
                ignore.decide(&file(10, T), found),
                Decision::Skip { metadata: false }
            );
        }
        assert_eq!(ignore.decide(&file(10, T), Found::Nothing), Decision::Send);
        let update = Policy {
            update: true,
            ..Policy::default()
        };
        let at = |mtime| Found::File { size: 3, mtime };
        assert_eq!(
            update.decide(&file(10, T), at((T.0, T.1 + 1))),
            Decision::Skip { metadata: false }
        );
        // Older, or equal with another size: sent, as rsync does.
        assert_eq!(
            update.decide(&file(10, T), at((T.0 - 1, 0))),
            Decision::Send
        );
        assert_eq!(update.decide(&file(10, T), at(T)), Decision::Send);
    }

    #[test]
    fn only_ignore_times_alone_lets_the_sender_go_ahead_unasked() {
        assert!(Policy::default().asks());
        assert!(!policy(Check::Never).asks());
        assert!(
            Policy {
                update: true,
                ..policy(Check::Never)
            }
            .asks()
        );
        // Unasked files are answered all the same under --resume or -n.
        let never = policy(Check::Never);
        assert!(!never.answered(false, false));
        assert!(never.answered(true, false) && never.answered(false, true));
        assert!(Policy::default().answered(false, false));
    }

    #[test]
    fn itemized_codes_are_rsyncs() {
        let kept = Kept {
            times: true,
            window: TimeMatch::Exact,
            perms: true,
            owner: true,
            group: true,
        };
        let e = file(10, T);
        let shown = |there: Option<There>, sent| {
            itemize(&e, there.as_ref(), sent, kept).map(|c| String::from_utf8(c.to_vec()).unwrap())
        };
        assert_eq!(shown(None, true).as_deref(), Some(">f+++++++++"));
        let same = There {
            kind: EntryKind::File,
            size: 10,
            mtime: T,
            mode: 0o644,
            uid: 0,
            gid: 0,
            same_target: true,
        };
        assert_eq!(shown(Some(same), false), None, "nothing changes: no line");
        let changed = There {
            size: 11,
            mtime: (1, 0),
            ..same
        };
        assert_eq!(shown(Some(changed), true).as_deref(), Some(">f.st......"));
        let perms = There {
            mode: 0o600,
            ..same
        };
        assert_eq!(shown(Some(perms), false).as_deref(), Some(".f...p....."));
        // Something else there is replaced: new.
        let dir = There {
            kind: EntryKind::Dir,
            ..same
        };
        assert_eq!(shown(Some(dir), true).as_deref(), Some(">f+++++++++"));
        let d = Entry {
            kind: EntryKind::Dir,
            chunk: 0,
            size: 0,
            ..file(0, T)
        };
        let code = itemize(&d, None, false, kept).unwrap();
        assert_eq!(&code, b"cd+++++++++");
        let later = There {
            kind: EntryKind::Dir,
            mtime: (T.0 + 1, 0),
            ..same
        };
        assert_eq!(
            &itemize(&d, Some(&later), false, kept).unwrap(),
            b".d..t......"
        );
        let link = Entry {
            kind: EntryKind::Symlink,
            target: b"new".to_vec(),
            ..d.clone()
        };
        let elsewhere = There {
            kind: EntryKind::Symlink,
            mode: link.mode,
            same_target: false,
            ..same
        };
        assert_eq!(
            &itemize(&link, Some(&elsewhere), false, kept).unwrap(),
            b"cLc........"
        );
        // Without -p, neither times nor modes are differences.
        let plain = Kept {
            times: false,
            perms: false,
            ..kept
        };
        assert_eq!(itemize(&d, Some(&later), false, plain), None);
        // A time within --modify-window is no difference.
        let within = Kept {
            window: TimeMatch::Within(1),
            ..kept
        };
        assert_eq!(itemize(&d, Some(&later), false, within), None);
    }

    proptest! {
        #[test]
        fn flags_round_trip(
            check in 0..4u8,
            ignore_existing: bool,
            update: bool,
            min in prop_oneof![Just(0u64), 1u64..1 << 40],
            max in prop_oneof![Just(u64::MAX), 0u64..1 << 40],
        ) {
            let check = [Check::Quick, Check::SizeOnly, Check::Checksum, Check::Never][check as usize];
            let sizes = Sizes { min, max };
            let p = Policy { check, ignore_existing, update, sizes, existing: false, times: TimeMatch::Exact };
            prop_assert_eq!(Policy::from_flags(p.flags(), sizes), p);
            prop_assert_eq!(p.flags() & flags::SIZE_LIMITS != 0, sizes.limit());
            prop_assert_eq!(p.into_nothing_there().asks(), sizes.limit());
        }

        /// Out of `--min-size`..=`--max-size`, a file is left alone
        /// whatever is there and whatever the other choices; inside, the
        /// sizes change nothing.
        #[test]
        fn sizes_leave_out_only_and_exactly_the_files_outside_them(
            check in 0..4u8,
            ignore_existing: bool,
            update: bool,
            min in 0u64..100,
            max in 0u64..100,
            size in 0u64..100,
            there in 0u8..3,
        ) {
            let check = [Check::Quick, Check::SizeOnly, Check::Checksum, Check::Never][check as usize];
            let free = Policy { check, ignore_existing, update, sizes: Sizes::default(), existing: false, times: TimeMatch::Exact };
            let limited = Policy { sizes: Sizes { min, max }, ..free };
            let found = match there {
                0 => Found::Nothing,
                1 => Found::Other,
                _ => Found::File { size: 50, mtime: T },
            };
            let e = file(size, T);
            let expected = if (min..=max).contains(&size) {
                free.decide(&e, found)
            } else {
                Decision::Skip { metadata: false }
            };
            prop_assert_eq!(limited.decide(&e, found), expected);
        }
    }
}
