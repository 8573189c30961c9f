//! Memory reused between the requests of a connection.

use std::sync::Arc;

/// Big buffers kept for reuse, per connection at most this many bytes.
const KEEP_BUFFERS: usize = 64 << 20;

/// A connection's spare buffers: reads and writes of a MiB reuse memory
/// instead of mapping fresh pages (which the kernel zeroes) every time.
#[derive(Debug, Clone, Default)]
pub(super) struct Buffers(Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

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
        let mut spare = self.0.lock().expect("buffers lock");
        // The most recently given back first: its memory is likely still
        // in the CPU's cache.
        match spare.iter().rposition(|b| b.capacity() >= len) {
            Some(i) => spare.swap_remove(i),
            None => Vec::with_capacity(len),
        }
    }

    /// Keeps `b` for reuse (as it is: [`Buffers::take`] empties it,
    /// [`Buffers::take_to_fill`] overwrites it).
    pub(super) fn give(&self, b: Vec<u8>) {
        if b.capacity() < 64 * 1024 {
            return;
        }
        let mut spare = self.0.lock().expect("buffers lock");
        let kept: usize = spare.iter().map(Vec::capacity).sum();
        if kept + b.capacity() <= KEEP_BUFFERS {
            spare.push(b);
        }
    }
}
