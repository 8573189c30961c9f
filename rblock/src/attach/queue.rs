//! The kernel's request queue of an attached device, set up for the
//! fabric behind it.
//!
//! The nbd driver accepts requests of up to `max_hw_sectors_kb` (32 MiB
//! on the kernels we know), but the block layer caps what it builds at
//! `max_sectors_kb`, which an nbd device has far lower (128 KiB on the
//! VM tier's Debian 6.1 kernel; at most 1280 KiB anywhere): a 4 MiB
//! direct write reaches `connect` as 32 requests, each a round trip of
//! its own across the fabric. A lane carries one request's data
//! in pieces with all of its landing window in flight at once, so the
//! cap is raised to that window (or the hardware limit, if lower).
//!
//! The block size (4096) and one kernel connection per lane are set in
//! the `NBD_CMD_CONNECT` itself; this is what only sysfs can set.

use std::path::{Path, PathBuf};

/// The largest request, in KiB, to let the kernel build: the fabric's
/// `fabric_bytes` within the hardware limit `hw_kb`, in whole 4 KiB
/// blocks, and never below one block.
pub fn request_limit_kb(hw_kb: u32, fabric_bytes: u32) -> u32 {
    let block_kb = super::BLOCK_SIZE / 1024;
    let kb = hw_kb.min(fabric_bytes / 1024);
    (kb / block_kb * block_kb).max(block_kb)
}

/// Raises `/sys/block/nbd<index>/queue/max_sectors_kb` to what
/// [`request_limit_kb`] allows; returns the value the kernel then holds.
pub fn raise_request_limit(index: u32, fabric_bytes: u32) -> Result<u32, String> {
    raise_request_limit_in(&queue_dir(index), fabric_bytes)
}

fn queue_dir(index: u32) -> PathBuf {
    PathBuf::from(format!("/sys/block/nbd{index}/queue"))
}

/// [`raise_request_limit`] on the queue directory `dir` (a test's own).
fn raise_request_limit_in(dir: &Path, fabric_bytes: u32) -> Result<u32, String> {
    let hw_kb = read_kb(&dir.join("max_hw_sectors_kb"))?;
    let want = request_limit_kb(hw_kb, fabric_bytes);
    let file = dir.join("max_sectors_kb");
    std::fs::write(&file, format!("{want}\n"))
        .map_err(|e| format!("cannot write {want} to {}: {e}", file.display()))?;
    // The kernel may hold less than it was given (a limit of its own).
    read_kb(&file)
}

fn read_kb(file: &Path) -> Result<u32, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{} holds {:?}, not a number", file.display(), text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_fabric_window_within_the_hardware_limit() {
        // 32 slots of 256 KiB under nbd's 32 MiB hardware limit.
        assert_eq!(request_limit_kb(32768, 8 << 20), 8192);
        // A hardware limit below the window wins.
        assert_eq!(request_limit_kb(1024, 8 << 20), 1024);
        // Whole blocks only, and one block at least.
        assert_eq!(request_limit_kb(32768, 10_002 * 1024 + 77), 10_000);
        assert_eq!(request_limit_kb(32768, 1000), 4);
        assert_eq!(request_limit_kb(2, 8 << 20), 4);
    }

    #[test]
    fn the_queue_is_written_and_read_back() {
        let dir = test_support::Scratch::new("rblock-queue");
        std::fs::write(dir.dir().join("max_hw_sectors_kb"), "32767\n").unwrap();
        std::fs::write(dir.dir().join("max_sectors_kb"), "1280\n").unwrap();
        assert_eq!(raise_request_limit_in(dir.dir(), 8 << 20), Ok(8192));
        let held = std::fs::read_to_string(dir.dir().join("max_sectors_kb")).unwrap();
        assert_eq!(held, "8192\n");
        // The hardware limit, rounded down to whole blocks.
        assert_eq!(raise_request_limit_in(dir.dir(), 64 << 20), Ok(32764));
    }

    #[test]
    fn a_queue_that_cannot_be_read_says_which_file() {
        let dir = test_support::Scratch::new("rblock-queue");
        let e = raise_request_limit_in(dir.dir(), 8 << 20).unwrap_err();
        assert!(
            e.starts_with("cannot read ") && e.contains("max_hw_sectors_kb"),
            "{e}"
        );
        std::fs::write(dir.dir().join("max_hw_sectors_kb"), "lots\n").unwrap();
        let e = raise_request_limit_in(dir.dir(), 8 << 20).unwrap_err();
        assert!(e.ends_with("holds \"lots\", not a number"), "{e}");
    }
}
