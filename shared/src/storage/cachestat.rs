//! How much of a file range is in the page cache (`cachestat`, Linux 6.5):
//! rblock sends a large read straight from the cache only when all of it
//! is there, so that sending can never wait for the disk. Not in any
//! RHEL kernel: there it is `ENOSYS`, and the caller copies instead.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd};

/// The system call's number (not wrapped by rustix or libc yet; the same
/// on every architecture).
const SYS_CACHESTAT: libc::c_long = 451;

/// Pages of `[offset, offset+len)` of `file` in the page cache.
pub fn cached_pages(file: impl AsFd, offset: u64, len: u64) -> std::io::Result<u64> {
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
            file.as_fd().as_raw_fd(),
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
