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

use crate::proto::{Entry, flags};

/// Which files are sent again, from the command line (and the request's
/// flags on the other side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    pub check: Check,
    /// `--ignore-existing`: a name that exists is left alone.
    pub ignore_existing: bool,
    /// `-u/--update`: a file newer at the destination is left alone.
    pub update: bool,
}

/// How a file that exists is compared with the source's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Check {
    /// Size and modification time (to the nanosecond): equal is unchanged.
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
    /// Whether the receiver answers every file before its data is sent.
    pub fn asks(&self) -> bool {
        self.flags() != 0
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
        f
    }

    /// The policy of a request's flags (at most one check among them: the
    /// decoder refuses more).
    pub fn from_flags(f: u32) -> Policy {
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
        }
    }

    /// What to do with file `e` given what is there.
    pub fn decide(&self, e: &Entry, found: Found) -> Decision {
        let (size, mtime) = match found {
            Found::Nothing => return Decision::Send,
            _ if self.ignore_existing => return Decision::Skip { metadata: false },
            Found::Other => return Decision::Send,
            Found::File { size, mtime } => (size, mtime),
        };
        if self.update && mtime > (e.mtime_sec, e.mtime_nsec) {
            return Decision::Skip { metadata: false };
        }
        match self.check {
            Check::Never => Decision::Send,
            Check::Quick if size == e.size && mtime == (e.mtime_sec, e.mtime_nsec) => {
                Decision::Skip { metadata: true }
            }
            Check::SizeOnly if size == e.size => Decision::Skip { metadata: true },
            Check::Quick | Check::SizeOnly => Decision::Send,
            Check::Checksum => Decision::Compare,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::EntryKind;
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
    }

    proptest! {
        #[test]
        fn flags_round_trip(check in 0..4u8, ignore_existing: bool, update: bool) {
            let check = [Check::Quick, Check::SizeOnly, Check::Checksum, Check::Never][check as usize];
            let p = Policy { check, ignore_existing, update };
            prop_assert_eq!(Policy::from_flags(p.flags()), p);
        }
    }
}
