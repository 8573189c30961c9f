//! Entries put in place without their data: passed over (`--existing`:
//! a name not at the destination, a directory not there with all in it),
//! or linked from a `--link-dest` tree that holds them unchanged. The
//! receive loop's [`Creator`] asks here before it makes anything.

use std::sync::Arc;

use super::{Creator, Said};
use crate::archive::Xattr;
use crate::arrivals::{Action, Arrivals, Shape};
use crate::delete;
use crate::existing;
use crate::proto::{Entry, EntryKind};
use crate::resync::Decision;
use crate::tree::Base;
use rfabric::link::Chunk;

impl Creator<'_> {
    /// `--existing`: whether `e` is to be passed over as not there: in a
    /// directory passed over, or, other than a file (which the policy
    /// decides), not under its name at the destination. A directory
    /// passed over is noted, so that all in it is.
    pub(super) fn not_there(&mut self, e: &Entry) -> bool {
        self.left_out(e, |this| e.kind != EntryKind::File && this.absent(&e.path))
    }

    /// `--ignore-existing`: whether `e` is left as it is because its name
    /// is taken at the destination, whatever by (as rsync's: unless both
    /// are directories; a file is the policy's to decide, another name
    /// of one the link loop's), or because its directory was left so. A
    /// directory left is noted, so that all in it is left too. (Without
    /// it, a symlink there was made again, and a file where a directory
    /// comes made way for it.)
    pub(super) fn left_as_is(&mut self, e: &Entry) -> bool {
        self.left_out(e, |this| {
            !matches!(e.kind, EntryKind::File | EntryKind::HardLink)
                && existing::status(this.base, &e.path).is_ok_and(|st| {
                    e.kind != EntryKind::Dir
                        || rustix::fs::FileType::from_raw_mode(st.st_mode)
                            != rustix::fs::FileType::Directory
                })
        })
    }

    /// Whether `e` is left out: in a directory left out, or by `itself`
    /// (what its own name holds). A directory left out is noted, so that
    /// all in it is.
    fn left_out(&mut self, e: &Entry, itself: impl FnOnce(&Self) -> bool) -> bool {
        let (parent, _) = delete::split(&e.path);
        let left = self.not_made.contains(parent) || itself(self);
        if left && e.kind == EntryKind::Dir {
            self.not_made.insert(e.path.clone());
        }
        left
    }

    /// Whether nothing is under `path` at the destination (its directory
    /// missing too). Only that: a name that cannot be looked at is not
    /// taken for absent (what comes next fails for it, saying why).
    pub(super) fn absent(&self, path: &[u8]) -> bool {
        match existing::status(self.base, path) {
            Ok(_) => false,
            Err(e) => e
                .chain()
                .any(|c| c.downcast_ref::<rustix::io::Errno>() == Some(&rustix::io::Errno::NOENT)),
        }
    }

    /// `e` passed over, nothing (more) made of it: a file answered as
    /// skipped (its data, for the nodes after a broadcast node, passes
    /// through).
    pub(super) fn pass_over(
        &mut self,
        arrivals: &mut Arrivals<Arc<Chunk>>,
        e: &Entry,
    ) -> anyhow::Result<Vec<Action<Arc<Chunk>>>> {
        if e.kind != EntryKind::File {
            self.answers.send(e.index, Ok(()));
            return Ok(arrivals.announce(e.index, Shape::Other)?);
        }
        self.files += 1;
        self.skipped += 1;
        self.progress.file();
        self.progress.there_already(1);
        self.answer_file(e.index, Said::Nothing);
        let shape = if self.opts.passing {
            Shape::Passing {
                size: e.size,
                chunk: e.chunk,
            }
        } else {
            Shape::Other
        };
        Ok(arrivals.announce(e.index, shape)?)
    }

    /// `--link-dest`: whether `e` was linked from the first of the
    /// link-dest trees that holds it unchanged: a file by the copy's check
    /// (size and time, or size), a symlink or special file as it would be
    /// made, each with the metadata the copy would give it (rsync links
    /// all of them). A link that cannot be made (another file system)
    /// leaves it to be sent or made.
    pub(super) fn linked_from_dest(&mut self, e: &Entry, xattrs: &[Xattr]) -> bool {
        let Some((dest, checked)) = self.link_dest_holding(e, xattrs) else {
            return false;
        };
        match self.base.link_from(dest, e, checked) {
            Ok(dir) => {
                self.syncs.lock().expect("dir lock").add(dir);
                true
            }
            Err(err) => {
                tracing::debug!("{err:#}: sent instead");
                false
            }
        }
    }

    /// The first link-dest tree holding `e` as [`Self::linked_from_dest`]
    /// links it, and the one found there (device, inode: the same before
    /// and after its check, and linked only if still the same). Not a
    /// device node where this side may not make one (a daemon without
    /// `--allow-owners`): a link would make one all the same.
    pub(super) fn link_dest_holding(
        &self,
        e: &Entry,
        xattrs: &[Xattr],
    ) -> Option<(&Base, (u64, u64))> {
        let device = matches!(e.kind, EntryKind::CharDevice | EntryKind::BlockDevice);
        if device && !self.how.powers.owners {
            return None;
        }
        let id_of = |placed: &_| {
            existing::status_in(placed)
                .ok()
                .map(|st| (st.st_dev, st.st_ino))
        };
        self.base.link_dests().iter().find_map(|dest| {
            let placed = dest.place(&e.path).ok()?;
            let before = id_of(&placed)?;
            let unchanged = if e.kind == EntryKind::File {
                let Ok((found, Some(st))) = existing::look_in(&placed, e) else {
                    return None;
                };
                self.opts.policy.decide(e, found) == Decision::Skip { metadata: true }
                    && existing::metadata_right(dest, &placed, e, xattrs, self.how, &st)
                        .unwrap_or(false)
            } else {
                existing::in_place_in(placed.clone(), e, xattrs, self.how)
            };
            (unchanged && id_of(&placed) == Some(before)).then_some((dest, before))
        })
    }
}
