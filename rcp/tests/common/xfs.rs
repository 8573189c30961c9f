//! An XFS filesystem of the test's own: a sparse image in the test's
//! scratch directory, loop-mounted (as root), unmounted on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

use test_support::Scratch;

use super::trees::is_root;

pub struct Xfs {
    mnt: PathBuf,
}

impl Xfs {
    /// Makes and mounts a 512 MiB image in `t`; `None` (having said why
    /// the test is skipped) when not root or where this kernel mounts no
    /// XFS image. A missing mkfs.xfs fails: scripts/setup installs it.
    pub fn mount(t: &Scratch) -> Option<Xfs> {
        if !is_root() {
            eprintln!("skipped: needs root (a loop mount)");
            return None;
        }
        let (image, mnt) = (t.path("xfs.img"), t.path("mnt"));
        std::fs::File::create(&image)
            .unwrap()
            .set_len(512 << 20)
            .unwrap();
        std::fs::create_dir(&mnt).unwrap();
        let made = Command::new("mkfs.xfs").arg("-q").arg(&image).status();
        assert!(
            made.is_ok_and(|s| s.success()),
            "mkfs.xfs (xfsprogs, scripts/setup)"
        );
        let mounted = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt)
            .status()
            .unwrap();
        if !mounted.success() {
            eprintln!("skipped: this kernel mounts no XFS image");
            return None;
        }
        Some(Xfs { mnt })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}
