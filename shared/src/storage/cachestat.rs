//! How much of a file range is in the page cache: rblock sends a large
//! read straight from the cache only when all of it is there, so that
//! sending can never wait for the disk.
//!
//! `cachestat` (Linux 6.5) answers in one call. RHEL 8 and 9 kernels do
//! not have it (`ENOSYS`), and they are where rblock runs most: there the
//! range is mapped for a moment, read-only and never touched, and
//! `mincore` tells which of its pages are resident (for a shared file
//! mapping, whether the page cache holds them). Three calls instead of
//! one, a few microseconds against the copy of 64 KiB or more they save.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// The system call's number (not wrapped by rustix or libc yet; the same
/// on every architecture).
const SYS_CACHESTAT: libc::c_long = 451;

/// Whether `cachestat` was refused once, with `ENOSYS` (a kernel before
/// 6.5) or `EPERM` (a seccomp filter, or a kernel that answers only a
/// file's writers): then it is not asked again, in this process, and
/// `mincore` answers for every file.
static NO_CACHESTAT: AtomicBool = AtomicBool::new(false);

/// Pages of `[offset, offset+len)` of `file` in the page cache:
/// `cachestat` where the kernel has it, else `mincore` over a mapping.
pub fn cached_pages(file: impl AsFd, offset: u64, len: u64) -> std::io::Result<u64> {
    let file = file.as_fd();
    if !NO_CACHESTAT.load(Ordering::Relaxed) {
        match by_cachestat(file, offset, len) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                NO_CACHESTAT.store(true, Ordering::Relaxed);
            }
            answer => return answer,
        }
    }
    by_mincore(file, offset, len)
}

fn by_cachestat(file: BorrowedFd<'_>, offset: u64, len: u64) -> std::io::Result<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off: offset, len };
    let mut stat = Stat::default();
    // SAFETY: FFI; both pointers are to live values of the layouts the
    // kernel's uapi declares (struct cachestat_range, struct cachestat),
    // and the call only reads `range` and writes `stat` before returning.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat.nr_cache)
}

/// The pages of the range the page cache holds, through a read-only
/// shared mapping of them that nothing reads (so nothing is faulted in
/// and nothing can fault: a page past the end of the file is simply not
/// resident). Pages beyond the end count as not cached.
fn by_mincore(file: BorrowedFd<'_>, offset: u64, len: u64) -> std::io::Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    let overflow = || std::io::Error::from_raw_os_error(libc::EOVERFLOW);
    let page = rustix::param::page_size() as u64;
    let start = offset / page * page;
    let end = offset.checked_add(len).ok_or_else(overflow)?.div_ceil(page) * page;
    let map_len = usize::try_from(end - start).map_err(|_| overflow())?;
    let map_offset = libc::off_t::try_from(start).map_err(|_| overflow())?;
    // SAFETY: FFI; a fresh mapping at an address the kernel chooses, so it
    // replaces nothing of ours; it is only handed to mincore and unmapped
    // below, never read or written through.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            map_offset,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let mut resident = vec![0u8; map_len / page as usize];
    // SAFETY: FFI; `at` is the start of a live mapping of `map_len` bytes
    // (page-aligned, as mmap returned it) and `resident` has one byte for
    // each of its pages, as mincore writes.
    let r = unsafe { libc::mincore(at, map_len, resident.as_mut_ptr()) };
    let answer = if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(resident.iter().filter(|&&p| p & 1 == 1).count() as u64)
    };
    // SAFETY: FFI; unmaps exactly the mapping made above, which no
    // reference points into.
    unsafe { libc::munmap(at, map_len) };
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// The fallback answers as `cachestat` does, on any kernel: pages
    /// just written are cached, a hole nobody read is not, pages past the
    /// end are not, unaligned ends count the pages they touch.
    #[test]
    fn mincore_tells_cached_pages_from_untouched_ones() {
        let t = test_support::Scratch::new("mincore");
        // (Readable: a mapping needs it, and an export is always.)
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(t.path("file"))
            .unwrap();
        let page = rustix::param::page_size() as u64;
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&vec![7u8; 1 << 20], 0).unwrap();
        let pages = (1u64 << 20) / page;
        assert_eq!(by_mincore(f.as_fd(), 0, 1 << 20).unwrap(), pages);
        assert_eq!(by_mincore(f.as_fd(), 100, 5000).unwrap(), 2);
        assert_eq!(by_mincore(f.as_fd(), 32 << 20, 1 << 20).unwrap(), 0);
        assert_eq!(
            by_mincore(f.as_fd(), (1 << 20) - page, 2 * page).unwrap(),
            1
        );
        assert_eq!(
            by_mincore(f.as_fd(), (64 << 20) - page, 4 * page).unwrap(),
            0
        );
        assert_eq!(by_mincore(f.as_fd(), 0, 0).unwrap(), 0);
        assert!(by_mincore(f.as_fd(), u64::MAX - 10, 100).is_err());
        // Where the kernel has cachestat, both ways agree.
        if let Ok(n) = by_cachestat(f.as_fd(), 0, 1 << 20) {
            assert_eq!(n, pages);
            assert_eq!(by_cachestat(f.as_fd(), 32 << 20, 1 << 20).unwrap(), 0);
        }
    }
}
