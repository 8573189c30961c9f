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
//! done (but see [`stay`]). Other threads never see
//! the move, with one exception the kernel makes: a thread started *from*
//! a moved thread (a runtime's blocking threads may be) shares its working
//! directory until it calls [`in_dir`] itself, so it would see a move if
//! it resolved a relative path during one. What such threads do in the
//! tools goes by descriptors and absolute paths.
//!
//! Where the kernel refuses `unshare` (a container's seccomp profile may)
//! or the directory cannot be entered, [`in_dir`] answers `None` and the
//! caller takes its `/proc/self/fd` path as before.
//!
//! A walk asks several things of every name in one directory before it
//! goes on to the next, so the two moves of each call are most of what
//! [`in_dir`] adds. A thread that resolves no relative path for a while
//! (nor does any thread started from it meanwhile) may say so with
//! [`stay`]: until the guard drops, [`in_held`] leaves it in the
//! directory of its last call, and a call in the same directory moves
//! nothing. The directory is known by the [`HeldDir`] it came in, which
//! the thread keeps a reference to while it is there: its descriptor
//! cannot close and its number cannot come back as another directory.
//! Measured with a scan of 100,000 entries a side (status, attribute
//! names, each attribute): staying in each directory took 0.87x the time
//! of reaching every name by its path from `/`.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, OnceLock};

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
    /// Guards of [`stay`] alive on this thread.
    static STAYING: Cell<u32> = const { Cell::new(0) };
    /// Where a staying thread is, when not at home.
    static HERE: RefCell<Option<HeldDir>> = const { RefCell::new(None) };
}

/// A directory that [`in_held`] may leave the thread in: shared, so the
/// thread can keep it open while it is there.
pub type HeldDir = Arc<dyn Directory>;

/// What a [`HeldDir`] holds: anything that shows a directory's descriptor.
pub trait Directory: AsFd + Send + Sync + std::fmt::Debug {}

impl<T: AsFd + Send + Sync + std::fmt::Debug> Directory for T {}

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
/// (nothing run) where this thread cannot be moved there. The thread is
/// home again after the call, staying or not.
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
    HERE.take();
    let result = call();
    if rustix::process::fchdir(home).is_ok() {
        OWN.set(Own::Yes);
    }
    Some(result)
}

/// [`in_dir`] for a held directory: on a thread that [`stay`]s, the
/// thread is left there after the call (and not moved at all when it is
/// there already); on any other, it is home again as with [`in_dir`].
pub fn in_held<R>(dir: &HeldDir, call: impl FnOnce() -> R) -> Option<R> {
    if STAYING.get() == 0 {
        return in_dir(dir.as_ref().as_fd(), call);
    }
    if !available() {
        return None;
    }
    let there = HERE.with_borrow(|here| here.as_ref().is_some_and(|h| same(h, dir)));
    OWN.set(Own::No);
    if !there {
        if rustix::process::fchdir(dir.as_ref().as_fd()).is_err() {
            // (Still where it was: a failed fchdir moves nothing.)
            OWN.set(Own::Yes);
            return None;
        }
        HERE.set(Some(Arc::clone(dir)));
    }
    let result = call();
    OWN.set(Own::Yes);
    Some(result)
}

/// Whether two held directories are one (the same allocation; the data
/// pointer alone, as a trait object's table may be duplicated).
fn same(a: &HeldDir, b: &HeldDir) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
}

/// Lets [`in_held`] leave this thread where it moved it, until the guard
/// drops (then the thread goes home). Only for a stretch in which this
/// thread, and any thread started from it, resolves no relative path:
/// what it reaches goes by descriptors and absolute paths.
pub fn stay() -> Stay {
    STAYING.set(STAYING.get() + 1);
    Stay {
        _this_thread: std::marker::PhantomData,
    }
}

/// The guard of [`stay`]; it belongs to the thread that made it.
#[derive(Debug)]
pub struct Stay {
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Stay {
    fn drop(&mut self) {
        STAYING.set(STAYING.get() - 1);
        if STAYING.get() == 0 && HERE.take().is_some() {
            match home() {
                Some(home) if rustix::process::fchdir(home).is_ok() => {}
                // Left away from home: never moved again (as `in_dir`
                // after a failed way back).
                _ => OWN.set(Own::No),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};

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
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let scratch = test_support::Scratch::new("thread-dir-others");
        std::fs::create_dir(scratch.path("d")).unwrap();
        let before = std::env::current_dir().unwrap();
        let stop = AtomicBool::new(false);
        let looks = AtomicU64::new(0);
        std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(std::env::current_dir().unwrap(), before);
                    looks.fetch_add(1, Ordering::Relaxed);
                }
            });
            // Moves (plain, and staying in a held directory) until the
            // other thread has looked many times while they went on.
            let d = held(&scratch.path("d"));
            let mut moves = 0;
            while moves < 2_000 || looks.load(Ordering::Relaxed) < 200 {
                assert!(in_dir(d.as_ref().as_fd(), || ()).is_some());
                let _stay = stay();
                assert!(in_held(&d, || ()).is_some());
                moves += 1;
            }
            stop.store(true, Ordering::Relaxed);
            watcher.join().unwrap();
        });
    }

    fn held(path: &std::path::Path) -> HeldDir {
        Arc::new(dir(path))
    }

    /// Directories `a` and `b`, each with a file of its own (`in-a`,
    /// `in-b`): which one a bare name is looked up in shows.
    fn two_dirs(tag: &str) -> test_support::Scratch {
        let scratch = test_support::Scratch::new(tag);
        for d in ["a", "b"] {
            std::fs::create_dir(scratch.path(d)).unwrap();
            std::fs::write(scratch.path(&format!("{d}/in-{d}")), b"x").unwrap();
        }
        scratch
    }

    #[test]
    fn a_staying_thread_stays_until_the_guard_drops_and_each_dir_is_its_own() {
        let scratch = two_dirs("thread-dir-stay");
        let before = std::env::current_dir().unwrap();
        let (a, b) = (held(&scratch.path("a")), held(&scratch.path("b")));
        let sees = |d: &HeldDir, name: &str| in_held(d, || std::fs::metadata(name).is_ok());
        {
            let _stay = stay();
            assert_eq!(sees(&a, "in-a"), Some(true));
            assert_eq!(std::env::current_dir().unwrap(), scratch.path("a"));
            assert_eq!(sees(&a, "in-b"), Some(false));
            assert_eq!(sees(&b, "in-b"), Some(true));
            assert_eq!(sees(&b, "in-a"), Some(false));
            assert_eq!(sees(&a, "in-a"), Some(true));
            // A plain call goes home after it, and the next held one
            // moves again.
            assert_eq!(
                in_dir(b.as_ref().as_fd(), || std::fs::metadata("in-b").is_ok()),
                Some(true)
            );
            assert_eq!(std::env::current_dir().unwrap(), before);
            assert_eq!(sees(&a, "in-a"), Some(true));
        }
        assert_eq!(std::env::current_dir().unwrap(), before);
        // Not staying: home after every call.
        assert_eq!(sees(&b, "in-b"), Some(true));
        assert_eq!(std::env::current_dir().unwrap(), before);
    }

    #[test]
    fn a_staying_thread_is_never_fooled_by_a_reused_descriptor() {
        let scratch = two_dirs("thread-dir-reuse");
        let _stay = stay();
        let a = held(&scratch.path("a"));
        let number = a.as_ref().as_fd().as_raw_fd();
        assert_eq!(
            in_held(&a, || std::fs::metadata("in-a").is_ok()),
            Some(true)
        );
        // The caller lets go of `a`; the thread still holds it, so its
        // number is not free for `b`.
        drop(a);
        let b = held(&scratch.path("b"));
        assert_ne!(b.as_ref().as_fd().as_raw_fd(), number);
        assert_eq!(
            in_held(&b, || std::fs::metadata("in-b").is_ok()),
            Some(true)
        );
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
