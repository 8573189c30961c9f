//! Memory reused between requests: the server's spare buffers, one set
//! for all of its connections.
//!
//! Why the whole server's, not each connection's: a connection's own
//! spares went with it, and the allocator handed the next connection
//! fresh pages, which the kernel zeroes at their first touch (whole 2 MiB
//! pages where transparent huge pages are on). nbdcopy opens four
//! connections a copy, each a quarter of a second long: with spares per
//! connection, zeroing fresh pages was 8% of the server's CPU on copied
//! reads (`--zero-copy-reads never`; `docs/rblock.md`).
//!
//! Only large buffers are kept (at least [`KEEP_FROM`]); smaller ones
//! are made and freed by the allocator, without the lock, as its own
//! caches do that well. A kept buffer's old bytes are never sent:
//! [`Buffers::take`] empties it, and what [`Buffers::take_to_fill`] gives
//! is overwritten whole (a request's data read in) or dropped with its
//! connection.

use std::sync::{Arc, Mutex};

/// Big buffers kept for reuse, at most this many bytes in all.
const KEEP_BUFFERS: usize = 64 << 20;
/// Buffers at least this long are kept; shorter ones never wait for the
/// lock.
const KEEP_FROM: usize = 64 * 1024;

/// The server's spare buffers (cloned, the same set).
#[derive(Debug, Clone, Default)]
pub(super) struct Buffers(Arc<Mutex<Vec<Vec<u8>>>>);

impl Buffers {
    /// An empty buffer with room for `len` bytes.
    pub(super) fn take(&self, len: usize) -> Vec<u8> {
        let mut b = self.spare(len);
        b.clear();
        b
    }

    /// A buffer of `len` bytes to be overwritten whole (a request's data
    /// read in): what it held before is left there rather than zeroed
    /// again (6% of a server's CPU under TLS, where no write is moved
    /// straight from the socket). Only the bytes it never held are zeroed.
    pub(super) fn take_to_fill(&self, len: usize) -> Vec<u8> {
        let mut b = self.spare(len);
        if b.len() >= len {
            b.truncate(len);
        } else {
            b.resize(len, 0);
        }
        b
    }

    /// A kept buffer with room for `len` bytes (its bytes as they were
    /// left), or a new one.
    fn spare(&self, len: usize) -> Vec<u8> {
        if len < KEEP_FROM {
            return Vec::with_capacity(len);
        }
        let mut spare = self.0.lock().expect("buffers lock");
        // The most recently given back first: its memory is likely still
        // in the CPU's cache.
        match spare.iter().rposition(|b| b.capacity() >= len) {
            Some(i) => spare.swap_remove(i),
            None => Vec::with_capacity(len),
        }
    }

    /// Keeps `b` for reuse (as it is: [`Buffers::take`] empties it,
    /// [`Buffers::take_to_fill`] overwrites it), while the spares are
    /// under [`KEEP_BUFFERS`].
    pub(super) fn give(&self, b: Vec<u8>) {
        if b.capacity() < KEEP_FROM {
            return;
        }
        let mut spare = self.0.lock().expect("buffers lock");
        let kept: usize = spare.iter().map(Vec::capacity).sum();
        if kept + b.capacity() <= KEEP_BUFFERS {
            spare.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_buffer_given_back_is_taken_again_by_any_clone() {
        let server = Buffers::default();
        let one = server.clone();
        let other = server.clone();
        let b = one.take(256 * 1024);
        let at = b.as_ptr();
        one.give(b);
        let again = other.take(200 * 1024);
        assert_eq!(again.as_ptr(), at);
        assert!(again.is_empty());
    }

    #[test]
    fn small_buffers_are_not_kept() {
        let server = Buffers::default();
        server.give(Vec::with_capacity(KEEP_FROM - 1));
        assert!(server.0.lock().unwrap().is_empty());
    }

    #[test]
    fn a_buffer_to_fill_has_the_length_asked_whatever_it_held() {
        let server = Buffers::default();
        server.give(vec![7u8; 512 * 1024]);
        let b = server.take_to_fill(300 * 1024);
        assert_eq!(b.len(), 300 * 1024);
        server.give(b);
        let b = server.take_to_fill(400 * 1024);
        assert_eq!(b.len(), 400 * 1024);
    }

    #[test]
    fn the_spares_stay_under_their_bound() {
        let server = Buffers::default();
        for _ in 0..(KEEP_BUFFERS / (1 << 20)) + 8 {
            server.give(Vec::with_capacity(1 << 20));
        }
        let kept: usize = server.0.lock().unwrap().iter().map(Vec::capacity).sum();
        assert!(kept <= KEEP_BUFFERS);
        assert!(kept > KEEP_BUFFERS - (1 << 20) * 2);
    }
}
