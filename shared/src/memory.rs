//! Memory that something other than Rust code writes: the NIC (verbs), the
//! tcp backend's reader, the kernel (io_uring). It is allocated once,
//! page-aligned (what O_DIRECT, io_uring fixed buffers and memory
//! registration all like), never moves, and lives as long as any region or
//! buffer refers to it.
//!
//! Rust references to it exist only while the owner of a piece holds it
//! exclusively: a [`PoolBuf`] lease, or a landed slot whose credit has not
//! been returned. Everything else goes through raw pointers.
#![allow(unsafe_code)]

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use thiserror::Error;
use tokio::sync::Notify;

/// Alignment of every allocation: a page.
pub const ALIGN: usize = 4096;

#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("cannot allocate {0} bytes of aligned memory")]
    Alloc(usize),
    #[error("a buffer pool needs at least one buffer of at least one byte")]
    Empty,
}

/// One page-aligned, zero-initialised allocation: an anonymous mapping of
/// its own, so its pages are zero without being written (a landing ring
/// or pool that a copy never fills costs nothing: a tiny copy spent most
/// of its start writing zeros into 40 MiB) and go back to the system when
/// it is dropped.
pub struct Memory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Memory` is a plain heap allocation; all access to its bytes goes
// through raw pointers whose users uphold exclusivity (see the module docs).
unsafe impl Send for Memory {}
// SAFETY: as above; `&Memory` hands out only raw pointers.
unsafe impl Sync for Memory {}

impl Memory {
    pub fn new(len: usize) -> Result<Arc<Memory>, MemoryError> {
        if len == 0 {
            return Err(MemoryError::Empty);
        }
        // Whole pages, as a mapping is (the length users see stays `len`).
        let mapped = len
            .checked_next_multiple_of(ALIGN)
            .ok_or(MemoryError::Alloc(len))?;
        // SAFETY: a new private anonymous mapping aliases nothing; the
        // kernel picks the (page-aligned) address.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                mapped,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }
        .map_err(|_| MemoryError::Alloc(len))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(MemoryError::Alloc(len))?;
        Ok(Arc::new(Memory { ptr, len }))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Start of the allocation, for registration and for the backends.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether `offset..offset+len` lies inside.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.len() as u64)
    }

    /// # Safety
    /// The range must be inside, and nothing may write it while the slice
    /// lives.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        debug_assert!(self.contains(offset as u64, len as u64));
        // SAFETY: in bounds and not written concurrently, per the contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }

    /// # Safety
    /// The range must be inside, and nothing else may read or write it
    /// while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        debug_assert!(self.contains(offset as u64, len as u64));
        // SAFETY: in bounds and exclusive, per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        let mapped = self.len.next_multiple_of(ALIGN);
        // SAFETY: mapped in `new` with this length; nothing refers to the
        // memory any more (every region and lease holds an `Arc` of it).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), mapped) };
    }
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("ptr", &self.ptr)
            .field("len", &self.len())
            .finish()
    }
}

/// `count` buffers of `size` bytes carved from one [`Memory`], so that one
/// registration covers them all: one memory region for the transport, one
/// fixed-buffer table for io_uring (buffer `i` is fixed buffer `i`).
pub struct BufferPool {
    memory: Arc<Memory>,
    size: usize,
    count: usize,
    free: Mutex<Vec<u32>>,
    returned: Notify,
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("size", &self.size)
            .field("count", &self.count)
            .finish()
    }
}

impl BufferPool {
    /// `size` is rounded up to a page so that every buffer is page-aligned.
    pub fn new(count: usize, size: usize) -> Result<Arc<BufferPool>, MemoryError> {
        if count == 0 || size == 0 || count > u32::MAX as usize {
            return Err(MemoryError::Empty);
        }
        let size = size.next_multiple_of(ALIGN);
        let total = count
            .checked_mul(size)
            .ok_or(MemoryError::Alloc(usize::MAX))?;
        let memory = Memory::new(total)?;
        Ok(Arc::new(BufferPool {
            memory,
            size,
            count,
            free: Mutex::new((0..count as u32).rev().collect()),
            returned: Notify::new(),
        }))
    }

    pub fn memory(&self) -> &Arc<Memory> {
        &self.memory
    }

    pub fn buffer_size(&self) -> usize {
        self.size
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// The iovec table to hand to `io_uring`'s `register_buffers`.
    pub fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.count)
            .map(|i| libc::iovec {
                // SAFETY: `i * size` is inside the allocation.
                iov_base: unsafe { self.memory.as_ptr().add(i * self.size) }.cast(),
                iov_len: self.size,
            })
            .collect()
    }

    pub fn try_acquire(self: &Arc<Self>) -> Option<PoolBuf> {
        let index = self.free.lock().expect("pool lock").pop()?;
        Some(PoolBuf {
            pool: Arc::clone(self),
            index,
            len: 0,
        })
    }

    /// `n` buffers at once, or none if fewer are free: a caller that
    /// holds buffers while it fills them never waits for more with some
    /// already in hand (two such callers could each hold half).
    pub fn try_acquire_many(self: &Arc<Self>, n: usize) -> Option<Vec<PoolBuf>> {
        let mut free = self.free.lock().expect("pool lock");
        if free.len() < n {
            return None;
        }
        let at = free.len() - n;
        Some(
            free.drain(at..)
                .rev()
                .map(|index| PoolBuf {
                    pool: Arc::clone(self),
                    index,
                    len: 0,
                })
                .collect(),
        )
    }

    /// Waits for a free buffer.
    pub async fn acquire(self: &Arc<Self>) -> PoolBuf {
        loop {
            let returned = self.returned.notified();
            if let Some(buf) = self.try_acquire() {
                return buf;
            }
            returned.await;
        }
    }

    pub fn available(&self) -> usize {
        self.free.lock().expect("pool lock").len()
    }
}

/// Exclusive use of one pool buffer until dropped. `len` is how much of it
/// holds data: what a send or write will carry.
pub struct PoolBuf {
    pool: Arc<BufferPool>,
    index: u32,
    len: usize,
}

impl fmt::Debug for PoolBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuf")
            .field("index", &self.index)
            .field("len", &self.len)
            .finish()
    }
}

impl PoolBuf {
    /// The io_uring fixed-buffer index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Offset of this buffer inside the pool's memory (and its region).
    pub fn offset(&self) -> usize {
        self.index as usize * self.pool.size
    }

    pub fn capacity(&self) -> usize {
        self.pool.size
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets how many bytes hold data (after an io_uring read, say).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "length beyond the buffer");
        self.len = len;
    }

    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// Raw start, for io_uring.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: the offset is inside the allocation.
        unsafe { self.pool.memory.as_ptr().add(self.offset()) }
    }

    /// The whole buffer, for filling it.
    pub fn spare(&mut self) -> &mut [u8] {
        // SAFETY: the lease is exclusive: no other lease covers this range and
        // no operation is in flight on it while we hold `&mut self`.
        unsafe { self.pool.memory.slice_mut(self.offset(), self.capacity()) }
    }

    /// The data part.
    pub fn data(&self) -> &[u8] {
        // SAFETY: exclusive lease, as in `spare`.
        unsafe { self.pool.memory.slice(self.offset(), self.len) }
    }

    /// The data part, to change in place (a sealed link encrypts it).
    pub fn data_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.spare()[..len]
    }

    /// Copies `bytes` in and sets the length.
    pub fn fill_from(&mut self, bytes: &[u8]) {
        self.spare()[..bytes.len()].copy_from_slice(bytes);
        self.set_len(bytes.len());
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        self.pool.free.lock().expect("pool lock").push(self.index);
        self.pool.returned.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_and_disjoint() {
        let pool = BufferPool::new(3, 5000).unwrap();
        assert_eq!(pool.buffer_size(), 8192);
        let mut a = pool.try_acquire().unwrap();
        let mut b = pool.try_acquire().unwrap();
        assert_eq!(a.as_mut_ptr() as usize % ALIGN, 0);
        assert_ne!(a.offset(), b.offset());
        a.fill_from(b"aaaa");
        b.fill_from(b"bb");
        assert_eq!(a.data(), b"aaaa");
        assert_eq!(b.data(), b"bb");
    }

    #[test]
    fn a_dropped_lease_wakes_a_waiter() {
        let pool = BufferPool::new(1, 16).unwrap();
        let held = pool.try_acquire().unwrap();
        assert!(pool.try_acquire().is_none());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let waiter = {
                let pool = Arc::clone(&pool);
                tokio::spawn(async move { pool.acquire().await.index() })
            };
            tokio::task::yield_now().await;
            drop(held);
            assert_eq!(waiter.await.unwrap(), 0);
        });
        assert_eq!(pool.available(), 1);
    }

    #[test]
    fn empty_pools_are_refused() {
        assert!(BufferPool::new(0, 10).is_err());
        assert!(BufferPool::new(1, 0).is_err());
        assert!(Memory::new(0).is_err());
    }
}
