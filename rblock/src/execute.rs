//! One checked request carried out on a backend, the same whichever way
//! it came to [`crate::serve`]: NBD over TCP or a unix socket, or the
//! fabric. Each way encodes the outcome its own way (an NBD reply, a
//! fabric `Reply` message), but the storage call, the error number and
//! the text are made here once, so that a client is told the same about
//! the same failure.
//!
//! Reads and writes move their data differently on each way (buffers and
//! the page cache on a socket, pieces in landing slots on the fabric), so
//! each way carries them out itself; they share only how they fail
//! ([`Failure::read`], [`Failure::write`]).

use crate::backend::Backend;
use crate::nbd::consts::errno;
use crate::nbd::transmission::{Command, Extent, Refusal, Request, wire_errno};

/// A request that failed: the NBD error, and the text that explains it
/// (structured replies and the fabric carry it; simple replies drop it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub errno: u32,
    pub text: String,
}

impl Failure {
    /// `what` ("flush failed") failed with `e`.
    pub fn io(what: &str, e: &std::io::Error) -> Failure {
        Failure {
            errno: wire_errno(e),
            text: format!("{what}: {e}"),
        }
    }

    pub fn read(e: &std::io::Error) -> Failure {
        Failure::io("read failed", e)
    }

    pub fn write(e: &std::io::Error) -> Failure {
        Failure::io("write failed", e)
    }
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Failure {
        Failure {
            errno: r.errno,
            text: r.message.to_string(),
        }
    }
}

/// What a request that worked answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Executed {
    /// Success, nothing more.
    Done,
    /// BLOCK_STATUS: the extents.
    Extents(Vec<Extent>),
}

/// Carries out one of the checked requests that move no data: FLUSH,
/// TRIM, CACHE, WRITE_ZEROES, BLOCK_STATUS.
pub async fn carry_out(
    command: Command,
    req: &Request,
    backend: &Backend,
) -> Result<Executed, Failure> {
    let (offset, len) = (req.offset, req.length);
    let failed = |what: &'static str| move |e: std::io::Error| Failure::io(what, &e);
    match command {
        Command::Flush => backend.flush().await.map_err(failed("flush failed"))?,
        Command::Trim { fua } => backend
            .trim(offset, len, fua)
            .await
            .map_err(failed("trim failed"))?,
        Command::Cache => backend.cache(offset, len).await,
        Command::WriteZeroes { fua, punch, fast } => {
            match backend.zero(offset, len, punch, fast, fua).await {
                Ok(()) => {}
                Err(e) if e == errno::ENOTSUP => {
                    return Err(Failure {
                        errno: e,
                        text: "no fast way to zero here".into(),
                    });
                }
                Err(e) => {
                    return Err(Failure {
                        errno: e,
                        text: "zeroing failed".into(),
                    });
                }
            }
        }
        Command::BlockStatus { one } => {
            let extents = backend
                .block_status(offset, len, one)
                .await
                .map_err(failed("block status failed"))?;
            return Ok(Executed::Extents(extents));
        }
        Command::Read | Command::Write { .. } | Command::Disc => {
            unreachable!("{command:?}: carried out by the way it came")
        }
    }
    Ok(Executed::Done)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rfabric::storage::{Engine, Kind};
    use test_support::Scratch;

    use super::*;
    use crate::nbd::consts::{STATE_HOLE, STATE_ZERO};
    use crate::storage::Storage;

    fn request(offset: u64, length: u32) -> Request {
        Request {
            flags: 0,
            kind: 0,
            cookie: 7,
            offset,
            length,
        }
    }

    /// A 2 MiB file with data in its first MiB only, as a local backend.
    fn backend(t: &Scratch, read_only: bool) -> Backend {
        let path = t.path("file");
        std::fs::write(&path, vec![1u8; 1 << 20]).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(2 << 20)
            .unwrap();
        let engine = Engine::start(Kind::Threads, None).unwrap();
        Backend::Local(Arc::new(Storage::open(&path, read_only, &engine).unwrap()))
    }

    #[tokio::test]
    async fn block_status_tells_data_from_holes_in_nbd_states() {
        let t = Scratch::new("execute-status");
        let b = backend(&t, false);
        let all = Command::BlockStatus { one: false };
        let got = carry_out(all, &request(0, 2 << 20), &b).await;
        let Ok(Executed::Extents(extents)) = got else {
            panic!("{got:?}");
        };
        // Filesystems may report more data than was written, never less.
        assert_eq!(extents[0].flags, 0);
        assert!(extents[0].length >= 1 << 20);
        assert_eq!(extents.iter().map(|e| e.length).sum::<u32>(), 2 << 20);
        if let Some(last) = extents.get(1) {
            assert_eq!(last.flags, STATE_HOLE | STATE_ZERO);
        }
        let done = Executed::Done;
        let flush = carry_out(Command::Flush, &request(0, 0), &b).await;
        assert_eq!(flush, Ok(done.clone()));
        let cache = carry_out(Command::Cache, &request(0, 4096), &b).await;
        assert_eq!(cache, Ok(done));
    }

    #[tokio::test]
    async fn failures_keep_their_errno_and_text() {
        let t = Scratch::new("execute-fail");
        // Read-only: the file is open for reading only, so changing it
        // fails in the kernel (the NBD check would refuse it first).
        let b = backend(&t, true);
        let zero = Command::WriteZeroes {
            fua: false,
            punch: false,
            fast: false,
        };
        let got = carry_out(zero, &request(0, 4096), &b).await.unwrap_err();
        assert_eq!(got.text, "zeroing failed");
        assert_ne!(got.errno, 0);
        let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let f = Failure::write(&e);
        assert_eq!(f.errno, errno::ENOSPC);
        assert!(f.text.starts_with("write failed: "), "{}", f.text);
        assert!(Failure::read(&e).text.starts_with("read failed: "));
    }
}
