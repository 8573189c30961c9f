//! Buffers an operation may own while the kernel or a pool thread works on
//! them.
#![allow(unsafe_code)]

use crate::link::Chunk;
use crate::memory::PoolBuf;

/// Memory a write may read from while it owns the value.
///
/// # Safety
/// The bytes [`IoBuf::io_bytes`] returns stay where they are and unchanged
/// while the value is alive, even when the value itself is moved (heap or
/// registered memory, never inline storage), and nobody else writes them
/// meanwhile. An engine keeps the value until its operation is done and
/// reads the bytes through a pointer taken before the move.
pub unsafe trait IoBuf: Send + 'static {
    fn io_bytes(&self) -> &[u8];
}

// SAFETY: a Vec's bytes live on the heap and do not move with the Vec;
// the operation owns it, so nobody else changes them.
unsafe impl IoBuf for Vec<u8> {
    fn io_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: a pool buffer is a fixed range of the pool's memory, which the
// buffer's `Arc` keeps alive; the lease is exclusive while it is held.
unsafe impl IoBuf for PoolBuf {
    fn io_bytes(&self) -> &[u8] {
        self.data()
    }
}

// SAFETY: a landed chunk's payload is a slot of the landing ring, which
// the chunk keeps registered and closed to peer writes until it is dropped
// (its credit goes back only then).
unsafe impl IoBuf for Chunk {
    fn io_bytes(&self) -> &[u8] {
        self.payload()
    }
}

// SAFETY: as for the chunk itself; the chunk lives while any of its `Arc`s
// does, and they only read it (a broadcast node writes it to its file
// while its next link sends it on).
unsafe impl IoBuf for std::sync::Arc<Chunk> {
    fn io_bytes(&self) -> &[u8] {
        self.payload()
    }
}
