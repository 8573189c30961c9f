//! One export's storage: a regular file or a block device, read and
//! written at offsets through the storage engine (io_uring, or the threads
//! engine where the kernel refuses io_uring). Every connection to the
//! export shares this one open file, so a flush on any of them covers the
//! writes completed on all (what `CAN_MULTI_CONN` promises).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use rfabric::memory::PoolBuf;
use rfabric::storage::{Engine, Kind, cached_pages};
use rustix::fs::{FileType, Mode, OFlags, SeekFrom};
use rustix::io::ReadWriteFlags;
use rustix::pipe::SpliceFlags;

/// Stretches one `block_status` describes at most (one reply's worth).
const MAX_EXTENTS: usize = 1024;

/// Reads up to this size may be done on the calling thread when the page
/// cache holds them (see [`Storage::read_now`]); larger ones go through
/// the engine, whose buffers need no zeroing first.
const NOWAIT_READ: usize = 64 * 1024;

/// Largest piece of zeroes written by hand when the filesystem cannot zero
/// a range itself.
const ZERO_PIECE: usize = 1 << 20;

/// What a stretch of the export holds, as `SEEK_DATA`/`SEEK_HOLE` tell
/// (the NBD layer turns it into `base:allocation` states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    Data,
    /// Nothing allocated: reads as zeros.
    Hole,
}

/// `length` bytes in one state, from where the stretch before ended (see
/// [`Storage::block_status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stretch {
    pub length: u32,
    pub allocation: Allocation,
}

/// Why a range could not be zeroed (see [`Storage::zero`]).
#[derive(Debug, thiserror::Error)]
pub enum ZeroError {
    /// Only the quick ways were allowed, and none works here: nothing
    /// changed.
    #[error("no fast way to zero here")]
    NoFastWay,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A read of a burst (see [`Storage::start_reads`]).
pub enum StartedRead {
    Done(Vec<u8>, std::io::Result<()>),
    Later(ReadLater),
}

/// The rest of a read of a burst: the buffer and how it went.
pub type ReadLater = std::pin::Pin<Box<dyn Future<Output = (Vec<u8>, std::io::Result<()>)> + Send>>;

impl std::fmt::Debug for StartedRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartedRead::Done(_, r) => write!(f, "Done({r:?})"),
            StartedRead::Later(_) => f.write_str("Later"),
        }
    }
}

#[derive(Debug)]
pub struct Storage {
    /// Shared with the operations in flight, which keep it open.
    fd: Arc<OwnedFd>,
    engine: Engine,
    size: u64,
    read_only: bool,
    block_device: bool,
    /// Punching holes works here (cleared on the first refusal).
    can_punch: AtomicBool,
    /// Zeroing a range without writing works here.
    can_zero_range: AtomicBool,
    /// The engine's switch of small writes to this thread was reported.
    said_small_writes: AtomicBool,
    /// Asking which pages are in the page cache works here (cleared on
    /// the first failure; [`cached_pages`]).
    can_probe_cache: AtomicBool,
    /// Reads that must not wait (`RWF_NOWAIT`) work here.
    can_read_nowait: AtomicBool,
    /// The path, for messages.
    shown: String,
}

impl Storage {
    /// Opens `path` (a regular file or a block device), to be read and
    /// written with `engine`.
    pub fn open(path: &Path, read_only: bool, engine: &Engine) -> anyhow::Result<Storage> {
        let access = if read_only {
            OFlags::RDONLY
        } else {
            OFlags::RDWR
        };
        let fd = rustix::fs::open(path, access | OFlags::CLOEXEC, Mode::empty())
            .with_context(|| format!("cannot open {}", path.display()))?;
        let st = rustix::fs::fstat(&fd)?;
        let (size, block_device) = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => (st.st_size as u64, false),
            FileType::BlockDevice => (
                rustix::fs::seek(&fd, SeekFrom::End(0))
                    .with_context(|| format!("cannot size {}", path.display()))?,
                true,
            ),
            _ => bail!(
                "{} is neither a regular file nor a block device",
                path.display()
            ),
        };
        Ok(Storage {
            fd: Arc::new(fd),
            // Exports may be on different filesystems.
            engine: engine.for_another_file(),
            size,
            read_only,
            block_device,
            can_punch: AtomicBool::new(true),
            can_zero_range: AtomicBool::new(true),
            said_small_writes: AtomicBool::new(false),
            can_probe_cache: AtomicBool::new(true),
            can_read_nowait: AtomicBool::new(true),
            shown: path.display().to_string(),
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Punching holes is worth offering (files; devices discard).
    pub fn can_trim(&self) -> bool {
        !self.read_only
    }

    /// The open file, for sending from it.
    pub fn file(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The engine it is read and written with.
    pub fn engine(&self) -> Kind {
        self.engine.kind()
    }

    /// Reads `len` bytes at `offset`, appended to `buf`, whole.
    pub async fn read(
        &self,
        offset: u64,
        mut buf: Vec<u8>,
        len: usize,
    ) -> (Vec<u8>, std::io::Result<()>) {
        let target = buf.len() + len;
        buf.reserve_exact(len);
        while buf.len() < target {
            let left = target - buf.len();
            let done = len - left;
            let (b, r) = self
                .engine
                .read_append(&self.fd, offset + done as u64, buf, left)
                .await;
            buf = b;
            match r {
                Ok(0) => {
                    // The file shrank under us: what is gone reads as zeros.
                    buf.resize(target, 0);
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return (buf, Err(e)),
            }
        }
        (buf, Ok(()))
    }

    /// Reads `len` bytes at `offset` into `buf` (from its start; any pool),
    /// whole, and sets its length. What of a small piece the page cache
    /// holds is read right here, as [`Storage::read_now`] reads: through
    /// `rblock connect`, a 4 KiB read at iodepth 32 otherwise took one
    /// entry into the ring and a completion to wait for each.
    pub async fn read_piece(
        &self,
        offset: u64,
        mut buf: PoolBuf,
        len: usize,
    ) -> (PoolBuf, std::io::Result<()>) {
        let len = len.min(buf.capacity());
        // (Not all cached: the engine reads it all. Short at the end of
        // the file: the loop below finds the end and fills in zeros.)
        let mut done = match self.read_cached(offset, &mut buf.spare()[..len]) {
            Some(Ok(n)) => n,
            Some(Err(e)) => return (buf, Err(e)),
            None => 0,
        };
        while done < len {
            let (b, r) = self
                .engine
                .read(&self.fd, offset + done as u64, buf, done, len - done)
                .await;
            buf = b;
            match r {
                Ok(0) => {
                    // The file shrank under us: what is gone reads as zeros.
                    buf.spare()[done..len].fill(0);
                    done = len;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return (buf, Err(e)),
            }
        }
        buf.set_len(len);
        (buf, Ok(()))
    }

    /// Starts a burst of reads with one entry into the kernel: each
    /// `(offset, buf, len)` appends `len` bytes at `offset` to `buf`, as
    /// [`Storage::read`] does. Reads of cached data come back finished;
    /// the others (and short reads) finish in the returned futures.
    pub async fn start_reads(
        self: &Arc<Self>,
        reads: Vec<(u64, Vec<u8>, usize)>,
    ) -> Vec<StartedRead> {
        // Reads of cached data are done right here, each with one system
        // call (cheaper than a place in the ring); the rest go to the ring
        // together. The threads engine makes the same try itself, into
        // room it does not zero first: trying here as well would cost a
        // second system call for every read the cache lacks.
        if self.engine.kind() == Kind::Threads {
            return self.start_in_engine(reads).await;
        }
        let mut done: Vec<Option<StartedRead>> = Vec::with_capacity(reads.len());
        let mut rest = Vec::new();
        for (offset, mut buf, len) in reads {
            match self.read_now(offset, &mut buf, len) {
                Some(r) => done.push(Some(StartedRead::Done(buf, r))),
                None => {
                    done.push(None);
                    rest.push((offset, buf, len));
                }
            }
        }
        if rest.is_empty() {
            return done.into_iter().flatten().collect();
        }
        let mut later = self.start_in_engine(rest).await.into_iter();
        done.into_iter()
            .map(|d| d.unwrap_or_else(|| later.next().expect("one per read left")))
            .collect()
    }

    /// Starts `reads` (as in [`Storage::start_reads`]) in the engine.
    async fn start_in_engine(
        self: &Arc<Self>,
        reads: Vec<(u64, Vec<u8>, usize)>,
    ) -> Vec<StartedRead> {
        let wanted: Vec<(u64, usize, usize)> = reads
            .iter()
            .map(|(offset, buf, len)| (*offset, buf.len() + len, *len))
            .collect();
        let started = self.engine.read_append_many(&self.fd, reads).await;
        started
            .into_iter()
            .zip(wanted)
            .map(|(read, (offset, target, len))| {
                let storage = Arc::clone(self);
                // Short or interrupted: the rest the usual way.
                let rest = move |buf: Vec<u8>, r: std::io::Result<usize>| async move {
                    match r {
                        Err(e) if e.kind() != std::io::ErrorKind::Interrupted => (buf, Err(e)),
                        _ => {
                            let left = target - buf.len();
                            let done = len - left;
                            storage.read(offset + done as u64, buf, left).await
                        }
                    }
                };
                match read.try_finish() {
                    Ok((buf, Ok(_))) if buf.len() == target => StartedRead::Done(buf, Ok(())),
                    Ok((buf, r)) => StartedRead::Later(Box::pin(rest(buf, r))),
                    Err(read) => StartedRead::Later(Box::pin(async move {
                        let (buf, r) = read.finish().await;
                        rest(buf, r).await
                    })),
                }
            })
            .collect()
    }

    /// Writes `buf[at..at+len]` at `offset`, durable before it returns with
    /// `fua`.
    pub async fn write(
        &self,
        offset: u64,
        mut buf: Vec<u8>,
        at: usize,
        len: usize,
        fua: bool,
    ) -> (Vec<u8>, std::io::Result<()>) {
        // (The engine does a small buffered write on this thread itself
        // where that is its way: see `write_now`.)
        let small_here = self.engine.writes_small_here();
        let mut done = 0;
        while done < len {
            let finished = self
                .engine
                .write(
                    &self.fd,
                    offset + done as u64,
                    buf,
                    at + done,
                    len - done,
                    fua,
                )
                .await;
            buf = finished.buf;
            if !small_here && self.engine.writes_small_here() {
                self.say_small_writes_here();
            }
            match finished.result {
                Ok(0) => {
                    return (buf, Err(std::io::Error::from_raw_os_error(libc::ENOSPC)));
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return (buf, Err(e)),
            }
        }
        (buf, Ok(()))
    }

    /// Says once that io_uring's small buffered writes to this export went
    /// to kernel worker threads again and again (a filesystem that cannot
    /// write without blocking), so that the engine now does them itself.
    fn say_small_writes_here(&self) {
        if self.engine.kind() == Kind::IoUring
            && !self.said_small_writes.swap(true, Ordering::Relaxed)
        {
            tracing::info!(
                file = %self.shown,
                "buffered writes to {} go to kernel worker threads; \
                 small ones are now written directly",
                self.shown
            );
        }
    }

    /// Writes `data` at `offset` right here, whole, if this is a write the
    /// engine does on the calling thread anyway (small and buffered, see
    /// [`Engine::write_now`]); None if it has to go the usual way.
    pub fn write_now(&self, offset: u64, data: &[u8], fua: bool) -> Option<std::io::Result<()>> {
        if fua {
            return None;
        }
        match self.engine.write_now(&*self.fd, offset, data)? {
            Ok(n) if n == data.len() => Some(Ok(())),
            // Short: the rest the plain way, here as well.
            Ok(n) => Some(self.write_here(offset + n as u64, &data[n..])),
            Err(e) => Some(Err(e)),
        }
    }

    /// A buffered write on this thread (`pwrite`), whole.
    pub fn write_here(&self, offset: u64, mut data: &[u8]) -> std::io::Result<()> {
        let mut at = offset;
        while !data.is_empty() {
            match rustix::io::pwrite(&self.fd, data, at) {
                Ok(0) => return Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
                Ok(n) => {
                    data = &data[n..];
                    at += n as u64;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset`, appended to `buf`, right here if
    /// they are all in the page cache; None, with `buf` as it was, if some
    /// are not. (`preadv2` with `RWF_NOWAIT` never waits for the disk; it
    /// may start reading ahead, as io_uring's first try at a read does.)
    pub fn read_now(
        &self,
        offset: u64,
        buf: &mut Vec<u8>,
        len: usize,
    ) -> Option<std::io::Result<()>> {
        if !self.may_read_now(len) {
            return None;
        }
        let start = buf.len();
        buf.resize(start + len, 0);
        // (Short at the end of the file: what is gone reads as zeros,
        // already there.)
        let read = self.read_cached(offset, &mut buf[start..]);
        if !matches!(read, Some(Ok(_))) {
            buf.truncate(start);
        }
        read.map(|r| r.map(drop))
    }

    /// Whether a read of `len` bytes may be tried right here
    /// ([`Storage::read_now`]): small enough, on a file that allows it.
    /// (Asked first by a caller that would otherwise make a buffer for
    /// nothing.)
    pub fn may_read_now(&self, len: usize) -> bool {
        len <= NOWAIT_READ && self.can_read_nowait.load(Ordering::Relaxed)
    }

    /// Fills `dst` from the file at `offset` if all of it is in the page
    /// cache (`preadv2` with `RWF_NOWAIT`): the bytes read, fewer only at
    /// the end of the file; None if some are not cached, the piece is
    /// larger than [`NOWAIT_READ`], or the file cannot be read so (then
    /// `dst` may hold part of the data, to be read again).
    fn read_cached(&self, offset: u64, dst: &mut [u8]) -> Option<std::io::Result<usize>> {
        if !self.may_read_now(dst.len()) {
            return None;
        }
        let mut done = 0;
        while done < dst.len() {
            let at = offset + done as u64;
            let mut slice = [std::io::IoSliceMut::new(&mut dst[done..])];
            match rustix::io::preadv2(&self.fd, &mut slice, at, ReadWriteFlags::NOWAIT) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => return None,
                Err(rustix::io::Errno::OPNOTSUPP) => {
                    self.can_read_nowait.store(false, Ordering::Relaxed);
                    return None;
                }
                Err(e) => return Some(Err(e.into())),
            }
        }
        Some(Ok(done))
    }

    /// Reads `len` bytes at `offset`, appended to `buf`, whole, on this
    /// thread however long the disk takes (`pread`): for threads that are
    /// there to wait, such as a connection's own.
    pub fn read_here(&self, offset: u64, buf: &mut Vec<u8>, len: usize) -> std::io::Result<()> {
        let start = buf.len();
        let target = start + len;
        while buf.len() < target {
            let at = offset + (buf.len() - start) as u64;
            match rfabric::storage::pread_append(&self.fd, at, buf, target - buf.len()) {
                // The file shrank under us: what is gone reads as zeros.
                Ok(0) => buf.resize(target, 0),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    buf.truncate(start);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Writes `len` bytes waiting in `pipe` (its read end) at `offset`,
    /// whole: the one copy they cost, from the pipe into the page cache.
    pub fn write_from_pipe(
        &self,
        pipe: BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> std::io::Result<()> {
        let mut at = offset;
        let end = offset + len as u64;
        while at < end {
            let left = (end - at) as usize;
            match rustix::pipe::splice(
                pipe,
                None,
                &self.fd,
                Some(&mut at),
                left,
                SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
            ) {
                Ok(0) => return Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Whether every page of the range is in the page cache, so that
    /// sending it from there cannot wait for the disk (`cachestat` from
    /// Linux 6.5, `mincore` over a mapping before it, as on RHEL 8 and 9;
    /// false where neither works for this file).
    pub fn cached(&self, offset: u64, len: usize) -> bool {
        if len == 0 || !self.can_probe_cache.load(Ordering::Relaxed) {
            return false;
        }
        let page = rustix::param::page_size() as u64;
        let pages = (offset + len as u64).div_ceil(page) - offset / page;
        match cached_pages(&*self.fd, offset, len as u64) {
            Ok(cached) => cached >= pages,
            Err(_) => {
                self.can_probe_cache.store(false, Ordering::Relaxed);
                false
            }
        }
    }

    /// Every write completed so far reaches stable storage.
    pub async fn flush(&self) -> std::io::Result<()> {
        self.engine.sync(&self.fd, true).await
    }

    /// Frees the range if the storage can (a hint: refusal is not an error).
    pub async fn trim(&self, offset: u64, len: u64, fua: bool) -> std::io::Result<()> {
        let (offset, len) = self.whole_blocks(offset, len);
        if len > 0 && self.can_punch.load(Ordering::Relaxed) {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            match self.engine.fallocate(&self.fd, mode, offset, len).await {
                Ok(()) => {}
                Err(e) if unsupported(&e) => self.can_punch.store(false, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        if fua { self.flush().await } else { Ok(()) }
    }

    /// Makes the range read back as zeros: by punching a hole when `punch`
    /// allows, by zeroing in place, or by writing zeros (unless `fast`, when
    /// only the quick ways count: [`ZeroError::NoFastWay`] then, nothing
    /// changed).
    pub async fn zero(
        &self,
        offset: u64,
        len: u64,
        punch: bool,
        fast: bool,
        fua: bool,
    ) -> Result<(), ZeroError> {
        let io = ZeroError::Io;
        if len == 0 {
            return Ok(());
        }
        let mut done = false;
        // Only a range the kernel can zero itself (see `whole_blocks`);
        // the rest is written.
        let itself = self.whole_blocks(offset, len) == (offset, len);
        if itself && punch && self.can_punch.load(Ordering::Relaxed) {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            match self.engine.fallocate(&self.fd, mode, offset, len).await {
                Ok(()) => done = true,
                Err(e) if unsupported(&e) => self.can_punch.store(false, Ordering::Relaxed),
                Err(e) => return Err(io(e)),
            }
        }
        if itself && !done && self.can_zero_range.load(Ordering::Relaxed) {
            let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
            match self.engine.fallocate(&self.fd, mode, offset, len).await {
                Ok(()) => done = true,
                Err(e) if unsupported(&e) => self.can_zero_range.store(false, Ordering::Relaxed),
                Err(e) => return Err(io(e)),
            }
        }
        if !done {
            if fast {
                return Err(ZeroError::NoFastWay);
            }
            let mut at = 0u64;
            let mut zeros = vec![0u8; (len.min(ZERO_PIECE as u64)) as usize];
            while at < len {
                let n = (len - at).min(zeros.len() as u64) as usize;
                let (b, r) = self.write(offset + at, zeros, 0, n, false).await;
                zeros = b;
                r.map_err(io)?;
                at += n as u64;
            }
        }
        if fua {
            self.flush().await.map_err(io)?;
        }
        Ok(())
    }

    /// The part of `[offset, offset+len)` the kernel can discard or zero
    /// itself (`fallocate`): all of it in a file, its whole logical blocks
    /// in a block device (anything else is EINVAL there, which must not be
    /// taken for "unsupported").
    fn whole_blocks(&self, offset: u64, len: u64) -> (u64, u64) {
        if !self.block_device {
            return (offset, len);
        }
        let block = rustix::fs::ioctl_blksszget(&self.fd).map_or(512, |b| u64::from(b.max(1)));
        let start = offset.next_multiple_of(block);
        let end = (offset + len) / block * block;
        (start, end.saturating_sub(start))
    }

    /// Asks the kernel to read the range ahead (advisory).
    pub fn cache(&self, offset: u64, len: u64) {
        let len = std::num::NonZeroU64::new(len);
        let _ = rustix::fs::fadvise(&self.fd, offset, len, rustix::fs::Advice::WillNeed);
    }

    /// `base:allocation` of `[offset, offset+len)`: data and holes (holes
    /// read as zeros). One stretch only with `one`.
    pub fn block_status(&self, offset: u64, len: u32, one: bool) -> Vec<Stretch> {
        let end = offset + u64::from(len);
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < end && out.len() < MAX_EXTENTS {
            let (state, next) = self.extent_at(pos, end);
            let length = (next.min(end) - pos) as u32;
            match out.last_mut() {
                Some(Stretch {
                    length: l,
                    allocation,
                }) if *allocation == state => *l += length,
                _ => out.push(Stretch {
                    length,
                    allocation: state,
                }),
            }
            if one {
                break;
            }
            pos = next.min(end);
        }
        out
    }

    /// The state at `pos` and where it changes (at most `end`).
    fn extent_at(&self, pos: u64, end: u64) -> (Allocation, u64) {
        if self.block_device {
            return (Allocation::Data, end);
        }
        match rustix::fs::seek(&self.fd, SeekFrom::Data(pos)) {
            Ok(data) if data == pos => {
                let hole = rustix::fs::seek(&self.fd, SeekFrom::Hole(pos)).unwrap_or(end);
                (Allocation::Data, hole.max(pos + 1))
            }
            Ok(data) => (Allocation::Hole, data),
            // No data from here to the end of the file.
            Err(rustix::io::Errno::NXIO) => (Allocation::Hole, end),
            Err(_) => (Allocation::Data, end),
        }
    }
}

fn unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL | libc::ENODEV)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_support::Scratch;

    /// A 64 MiB sparse file whose first bytes are `data` (just written,
    /// so in the page cache), and its storage.
    fn file_starting_with(t: &Scratch, data: &[u8]) -> (std::fs::File, Storage) {
        use std::os::unix::fs::FileExt;
        let path = t.path("file");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(data, 0).unwrap();
        let engine = Engine::start(Kind::Threads, None).unwrap();
        let storage = Storage::open(&path, false, &engine).unwrap();
        (f, storage)
    }

    /// On every kernel (`cachestat`, or `mincore` where it is missing, as
    /// under the rhel8 kernel profile).
    #[test]
    fn the_page_cache_probe_tells_cached_pages_from_untouched_ones() {
        let t = Scratch::new("cachestat");
        let (_f, storage) = file_starting_with(&t, &vec![1u8; 1 << 20]);
        // Just written: in the cache, unaligned ends too.
        assert!(storage.cached(0, 1 << 20));
        assert!(storage.cached(100, 5000));
        // A hole nobody read: not in the cache, not even partly.
        assert!(!storage.cached(32 << 20, 1 << 20));
        assert!(!storage.cached((1 << 20) - 4096, 8192));
        assert!(!storage.cached(0, 0));
        // Past the end: not cached.
        assert!(!storage.cached((64 << 20) - 4096, 1 << 20));
    }

    #[test]
    fn reads_done_here_are_whole_or_not_done_at_all() {
        let t = Scratch::new("read-now");
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let (f, storage) = file_starting_with(&t, &data);
        // Cached: done, appended to what the buffer held.
        let mut buf = b"head".to_vec();
        let r = storage
            .read_now(1000, &mut buf, 5000)
            .expect("cached data is read here");
        r.unwrap();
        assert_eq!(&buf[..4], b"head");
        assert_eq!(&buf[4..], &data[1000..6000]);
        // A hole reads as zeros without the disk.
        let mut buf = Vec::new();
        let r = storage.read_now(32 << 20, &mut buf, 4096).expect("a hole");
        r.unwrap();
        assert_eq!(buf, vec![0; 4096]);
        // Data on the disk only: either left (buffer as it was) or, if
        // the disk was quick enough, read whole.
        f.sync_all().unwrap();
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        let mut buf = b"head".to_vec();
        match storage.read_now(8192, &mut buf, 8192) {
            None => assert_eq!(buf, b"head"),
            Some(r) => {
                r.unwrap();
                assert_eq!(&buf[4..], &data[8192..16384]);
            }
        }
        // Too large to be done here.
        let mut buf = Vec::new();
        assert!(storage.read_now(0, &mut buf, 1 << 20).is_none());
        assert!(buf.is_empty());
    }

    /// A burst's reads come back whole on either engine, also when the file
    /// shrank under the export (what is gone reads as zeros) and a read
    /// first comes back short.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_reads_whole_on_both_engines_even_past_a_shrunk_end() {
        let t = Scratch::new("burst-engines");
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 253) as u8).collect();
        let mut kinds = vec![Kind::Threads];
        if rfabric::storage::select(rfabric::storage::EngineChoice::IoUring).is_ok() {
            kinds.push(Kind::IoUring);
        }
        for kind in kinds {
            let path = t.path(&format!("file-{kind}"));
            std::fs::write(&path, &data).unwrap();
            let engine = Engine::per_thread(kind).unwrap();
            let storage = Arc::new(Storage::open(&path, false, &engine).unwrap());
            assert_eq!(storage.engine(), kind);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(600_000)
                .unwrap();
            let reads = vec![
                (1000, b"a".to_vec(), 4096),
                (100_000, b"b".to_vec(), 300_000),
                (590_000, b"c".to_vec(), 200_000),
            ];
            let mut got = Vec::new();
            for r in storage.start_reads(reads).await {
                got.push(match r {
                    StartedRead::Done(buf, r) => (buf, r),
                    StartedRead::Later(f) => f.await,
                });
            }
            let (a, b, c) = (&got[0], &got[1], &got[2]);
            assert!(a.1.is_ok() && b.1.is_ok() && c.1.is_ok(), "{kind}");
            assert_eq!(&a.0[1..], &data[1000..5096], "{kind}");
            assert_eq!(&b.0[1..], &data[100_000..400_000], "{kind}");
            assert_eq!(c.0.len(), 200_001, "{kind}");
            assert_eq!(&c.0[1..10_001], &data[590_000..600_000], "{kind}");
            assert!(
                c.0[10_001..].iter().all(|&x| x == 0),
                "{kind}: zeros past the end"
            );
        }
    }
}
