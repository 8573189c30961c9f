//! A thread's own working directory, for the calls that take a path but
//! no directory descriptor.
//!
//! The extended-attribute calls (`llistxattr`, `lgetxattr`, `lsetxattr`,
//! `lremovexattr`) have no `*at` form on the kernels the tools serve
//! (`getxattrat` and its kin came with Linux 6.13). Reaching a name in
//! an open directory without following anything outside it then takes a
//! path through `/proc/self/fd/N/NAME`, and the kernel's walk of that
//! path (procfs' `self`, `fd` and the descriptor's magic link) costs as
//! much again as the call itself: measured with `scan-floor` on 100,000
//! entries, 0.50-0.55 s against 0.28-0.31 s a side.
//!
//! [`in_dir`] instead gives the calling thread a working directory of its
//! own (`unshare(CLONE_FS)`, once per thread), moves it into the
//! directory (`fchdir`), runs the call on the bare name (one component,
//! looked up in that directory as the `*at` calls would), and moves it
//! back to the process's working directory. A relative path keeps its
//! meaning on the moved thread, which is home again whenever its call is
//! done (the walker of a user's own copy reads the operands as typed,
//! relative ones too, on the thread it moves). Other threads never see
//! the move, with one exception the kernel makes: a thread started *from*
//! a moved thread (a runtime's blocking threads may be) shares its working
//! directory until it calls [`in_dir`] itself, so it would see a move if
//! it resolved a relative path during one. What such threads do in the
//! tools goes by descriptors and absolute paths.
//!
//! Where the kernel refuses `unshare` (a container's seccomp profile may)
//! or the directory cannot be entered, [`in_dir`] answers `None` and the
//! caller takes its `/proc/self/fd` path as before.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use rustix::fs::{Mode, OFlags};

/// Whether this thread has a working directory of its own.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Own {
    Untried,
    Yes,
    /// Refused, or the way back failed once (the thread stays where it
    /// is and is never moved again), or a call is under way (a nested
    /// [`in_dir`] takes the fallback).
    No,
}

thread_local! {
    static OWN: Cell<Own> = const { Cell::new(Own::Untried) };
}

/// The process's working directory, opened at the first [`in_dir`] of any
/// thread: before it no thread was ever moved, so `.` is the process's.
fn home() -> Option<&'static OwnedFd> {
    static HOME: OnceLock<Option<OwnedFd>> = OnceLock::new();
    HOME.get_or_init(|| {
        rustix::fs::open(
            c".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()
    })
    .as_ref()
}

/// Gives this thread a working directory of its own.
fn unshare() -> bool {
    // SAFETY: CLONE_FS alone gives the calling thread its own copy of
    // the working directory, root and umask; the descriptor table and the
    // memory stay shared, so no descriptor or pointer of another thread
    // changes meaning (the hazard `unshare_unsafe` warns of is
    // CLONE_FILES).
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FS) }.is_ok()
}

/// Whether [`in_dir`] can move this thread (it gives the thread its own
/// working directory if it has none yet): callers that would open a node
/// only to reach its attributes without a path walk need not.
pub fn available() -> bool {
    if home().is_none() {
        return false;
    }
    if OWN.get() == Own::Untried {
        OWN.set(if unshare() { Own::Yes } else { Own::No });
    }
    OWN.get() == Own::Yes
}

/// This thread is never moved: [`in_dir`] answers `None` on it from now
/// on (for tests of the callers' other way; as a kernel that refuses
/// `unshare` would make it).
pub fn forgo() {
    OWN.set(Own::No);
}

/// Runs `call` with this thread's working directory at `dir`, so that a
/// relative one-component name in it names an entry of `dir`; `None`
/// (nothing run) where this thread cannot be moved there.
pub fn in_dir<R>(dir: BorrowedFd<'_>, call: impl FnOnce() -> R) -> Option<R> {
    if !available() {
        return None;
    }
    let home = home()?;
    OWN.set(Own::No);
    if rustix::process::fchdir(dir).is_err() {
        OWN.set(Own::Yes);
        return None;
    }
    let result = call();
    if rustix::process::fchdir(home).is_ok() {
        OWN.set(Own::Yes);
    }
    Some(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn dir(path: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn a_bare_name_is_looked_up_in_the_directory_and_the_thread_comes_back() {
        let scratch = test_support::Scratch::new("thread-dir");
        std::fs::create_dir(scratch.path("d")).unwrap();
        std::fs::write(scratch.path("d/only-here"), b"x").unwrap();
        let before = std::env::current_dir().unwrap();
        let d = dir(&scratch.path("d"));
        let seen = in_dir(d.as_fd(), || std::fs::metadata("only-here").is_ok());
        assert_eq!(seen, Some(true));
        assert_eq!(std::env::current_dir().unwrap(), before);
        assert!(std::fs::metadata("only-here").is_err());
    }

    #[test]
    fn other_threads_never_see_the_move() {
        let scratch = test_support::Scratch::new("thread-dir-others");
        std::fs::create_dir(scratch.path("d")).unwrap();
        let before = std::env::current_dir().unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                let mut looks = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    assert_eq!(std::env::current_dir().unwrap(), before);
                    looks += 1;
                }
                looks
            });
            let d = dir(&scratch.path("d"));
            for _ in 0..2_000 {
                assert!(in_dir(d.as_fd(), || ()).is_some());
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(watcher.join().unwrap() > 0);
        });
    }

    #[test]
    fn a_nested_call_takes_the_fallback() {
        let scratch = test_support::Scratch::new("thread-dir-nested");
        let d = dir(scratch.dir());
        let nested = in_dir(d.as_fd(), || in_dir(d.as_fd(), || ()));
        assert_eq!(nested, Some(None));
        // And the thread is usable again afterwards.
        assert_eq!(in_dir(d.as_fd(), || 7), Some(7));
    }
}
