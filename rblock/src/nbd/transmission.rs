//! The transmission phase, sans I/O: request headers in, checked commands
//! out; replies (simple and structured) encoded.

use super::consts::{
    REQUEST_LEN, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC, cflags, chunk, cmd,
    errno,
};
use super::handshake::{ALLOCATION_CONTEXT, MAX_PAYLOAD, Negotiated};

/// A request header as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("bad request magic {0:#x}")]
    Magic(u32),
}

impl Request {
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Request, RequestError> {
        let magic = u32::from_be_bytes(b[0..4].try_into().expect("4"));
        if magic != REQUEST_MAGIC {
            return Err(RequestError::Magic(magic));
        }
        Ok(Request {
            flags: u16::from_be_bytes(b[4..6].try_into().expect("2")),
            kind: u16::from_be_bytes(b[6..8].try_into().expect("2")),
            cookie: u64::from_be_bytes(b[8..16].try_into().expect("8")),
            offset: u64::from_be_bytes(b[16..24].try_into().expect("8")),
            length: u32::from_be_bytes(b[24..28].try_into().expect("4")),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Payload bytes that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.kind == cmd::WRITE {
            self.length
        } else {
            0
        }
    }
}

/// A checked command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write { fua: bool },
    Disc,
    Flush,
    Trim { fua: bool },
    Cache,
    WriteZeroes { fua: bool, punch: bool, fast: bool },
    BlockStatus { one: bool },
}

/// What a connection's requests are checked against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub size: u64,
    pub read_only: bool,
    pub structured: bool,
    pub allocation: bool,
    /// Alignment requests must have: the export's minimum block size once
    /// the client agreed to it (1 for exports served through the page
    /// cache, and whenever the client did not ask for sizes).
    pub min_block: u32,
}

impl Limits {
    pub fn new(n: &Negotiated, size: u64, read_only: bool) -> Limits {
        Limits {
            size,
            read_only,
            structured: n.structured,
            allocation: n.allocation,
            min_block: n.min_block,
        }
    }
}

/// A refused request: the error for the wire and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub errno: u32,
    pub message: &'static str,
}

fn refuse(errno: u32, message: &'static str) -> Refusal {
    Refusal { errno, message }
}

/// Checks a request against the export and what was negotiated.
pub fn check(r: &Request, l: &Limits) -> Result<Command, Refusal> {
    let f = r.flags;
    // FUA is accepted on every command (the spec requires it).
    let only = |allowed: u16| -> Result<(), Refusal> {
        if f & !(allowed | cflags::FUA) != 0 {
            Err(refuse(errno::EINVAL, "flag not valid for this command"))
        } else {
            Ok(())
        }
    };
    let fua = f & cflags::FUA != 0;
    let end = r.offset.checked_add(u64::from(r.length));
    let beyond = end.is_none_or(|e| e > l.size);
    let aligned = |check_length: bool| {
        let m = u64::from(l.min_block.max(1));
        r.offset % m == 0 && (!check_length || u64::from(r.length) % m == 0 || end == Some(l.size))
    };
    let writes = |c: Command| -> Result<Command, Refusal> {
        if l.read_only {
            return Err(refuse(errno::EPERM, "the export is read-only"));
        }
        Ok(c)
    };
    let command = match r.kind {
        cmd::READ => {
            only(if l.structured { cflags::DF } else { 0 })?;
            if r.length > MAX_PAYLOAD {
                return Err(if f & cflags::DF != 0 {
                    refuse(errno::EOVERFLOW, "read too large for one chunk")
                } else {
                    refuse(errno::EINVAL, "read larger than the maximum payload")
                });
            }
            if beyond {
                return Err(refuse(errno::EINVAL, "read beyond the end of the export"));
            }
            Command::Read
        }
        cmd::WRITE => {
            only(0)?;
            if r.length > MAX_PAYLOAD {
                return Err(refuse(
                    errno::EINVAL,
                    "write larger than the maximum payload",
                ));
            }
            let c = writes(Command::Write { fua })?;
            if beyond {
                return Err(refuse(errno::ENOSPC, "write beyond the end of the export"));
            }
            c
        }
        cmd::DISC => {
            only(0)?;
            Command::Disc
        }
        cmd::FLUSH => {
            only(0)?;
            Command::Flush
        }
        cmd::TRIM => {
            only(0)?;
            let c = writes(Command::Trim { fua })?;
            if beyond {
                return Err(refuse(errno::EINVAL, "trim beyond the end of the export"));
            }
            c
        }
        cmd::CACHE => {
            only(0)?;
            if beyond {
                return Err(refuse(errno::EINVAL, "cache beyond the end of the export"));
            }
            Command::Cache
        }
        cmd::WRITE_ZEROES => {
            only(cflags::NO_HOLE | cflags::FAST_ZERO)?;
            let c = writes(Command::WriteZeroes {
                fua,
                punch: f & cflags::NO_HOLE == 0,
                fast: f & cflags::FAST_ZERO != 0,
            })?;
            if beyond {
                return Err(refuse(errno::ENOSPC, "zeroes beyond the end of the export"));
            }
            c
        }
        cmd::BLOCK_STATUS => {
            only(cflags::REQ_ONE)?;
            if !l.allocation {
                return Err(refuse(errno::EINVAL, "no metadata context was selected"));
            }
            if r.length == 0 {
                return Err(refuse(errno::EINVAL, "block status of nothing"));
            }
            if beyond {
                return Err(refuse(
                    errno::EINVAL,
                    "block status beyond the end of the export",
                ));
            }
            Command::BlockStatus {
                one: f & cflags::REQ_ONE != 0,
            }
        }
        _ => return Err(refuse(errno::EINVAL, "unknown command")),
    };
    let ranged = !matches!(command, Command::Disc | Command::Flush);
    if ranged && !aligned(!matches!(command, Command::BlockStatus { .. })) {
        return Err(refuse(
            errno::EINVAL,
            "request not aligned to the minimum block size",
        ));
    }
    Ok(command)
}

/// A simple reply header (16 bytes); a successful read's data follows it.
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk header (20 bytes).
pub fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// The reply to a request that failed, in whichever form the connection
/// uses (a read on a structured connection always gets a structured one).
pub fn error_reply(structured: bool, cookie: u64, errno: u32, message: &str) -> Vec<u8> {
    if !structured {
        return simple_reply(cookie, errno).to_vec();
    }
    let msg = &message.as_bytes()[..message.len().min(4096)];
    let mut b = chunk_header(cookie, chunk::FLAG_DONE, chunk::ERROR, 6 + msg.len() as u32).to_vec();
    b.extend_from_slice(&errno.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// The reply to a request other than READ that succeeded without data: a
/// simple reply even with structured replies negotiated (the spec allows
/// either). It is the shortest, and clients read it in one go, where a
/// structured one takes them two reads.
pub fn ok_reply(cookie: u64) -> Vec<u8> {
    simple_reply(cookie, 0).to_vec()
}

/// What goes before a successful read's `len` data bytes: a simple reply
/// header, or one OFFSET_DATA chunk (the last of its reply) for the whole
/// range. A read of nothing is a NONE chunk (no data follows).
pub fn read_reply_header(structured: bool, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    if !structured {
        return simple_reply(cookie, 0).to_vec();
    }
    if len == 0 {
        return chunk_header(cookie, chunk::FLAG_DONE, chunk::NONE, 0).to_vec();
    }
    let mut b = chunk_header(cookie, chunk::FLAG_DONE, chunk::OFFSET_DATA, 8 + len).to_vec();
    b.extend_from_slice(&offset.to_be_bytes());
    b
}

/// An I/O failure as the NBD error a client is told (the spec's few:
/// out of space, not permitted, out of memory, invalid; EIO for the rest).
pub fn wire_errno(e: &std::io::Error) -> u32 {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => errno::ENOSPC,
        Some(libc::EPERM | libc::EACCES | libc::EROFS) => errno::EPERM,
        Some(libc::ENOMEM) => errno::ENOMEM,
        Some(libc::EINVAL) => errno::EINVAL,
        _ => errno::EIO,
    }
}

/// A `base:allocation` extent: length and state bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length: u32,
    pub flags: u32,
}

/// The one BLOCK_STATUS chunk of a reply.
pub fn block_status_reply(cookie: u64, extents: &[Extent]) -> Vec<u8> {
    let len = 4 + 8 * extents.len() as u32;
    let mut b = chunk_header(cookie, chunk::FLAG_DONE, chunk::BLOCK_STATUS, len).to_vec();
    b.extend_from_slice(&ALLOCATION_CONTEXT.to_be_bytes());
    for e in extents {
        b.extend_from_slice(&e.length.to_be_bytes());
        b.extend_from_slice(&e.flags.to_be_bytes());
    }
    b
}

#[cfg(test)]
mod tests;
