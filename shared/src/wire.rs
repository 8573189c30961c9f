//! The link's wire messages: control frames carried by SENDs and the chunk
//! header that leads every data slot.
//!
//! Everything is fixed-size little-endian, and every field a peer controls is
//! checked here, before anything else looks at it: a decoder that returns
//! `Ok` hands out values that are in range. Lengths are checked against the
//! bytes actually received and against hard limits before anything is sized
//! from them. The layout is written down byte by byte in `docs/PROTOCOL.md`.

use thiserror::Error;

/// The protocol version this build speaks. A hello with any other version is
/// refused: both tools are shipped together, so there is nothing to
/// negotiate down to. Version 2 added sealing (the frame flag and the
/// chunk header's tag, see [`crate::link::seal`]).
pub const VERSION: u16 = 2;

/// `"RF"` as the first two bytes of every control frame.
pub const FRAME_MAGIC: u16 = u16::from_le_bytes(*b"RF");
/// Bytes of the control frame header.
pub const FRAME_HEADER_LEN: usize = 24;
/// Largest control message (header + body) any peer may announce or send.
pub const MAX_CONTROL_SIZE: u32 = 64 * 1024;
/// Smallest control receive buffer a peer may announce: room for a hello.
pub const MIN_CONTROL_SIZE: u32 = 128;
/// Control receive depth limits announced in a hello. The lower bound keeps
/// the credit-return rules free of livelock (see `credit`).
pub const MIN_CONTROL_DEPTH: u32 = 4;
pub const MAX_CONTROL_DEPTH: u32 = 4096;
/// Landing ring limits announced in a hello.
pub const MAX_SLOTS: u32 = 65_536;
pub const MAX_SLOT_SIZE: u32 = 1 << 30;
/// Longest text an error frame may carry.
pub const MAX_ERROR_TEXT: usize = 1024;

/// `"CHNK"`: first bytes of every chunk header.
pub const CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"CHNK");
/// Bytes of the chunk header at the start of each landing slot.
pub const CHUNK_HEADER_LEN: usize = 80;
/// The part of a chunk header a seal covers: all but its tag.
pub const CHUNK_HEADER_SEALED_LEN: usize = CHUNK_HEADER_LEN - 16;

const HELLO_BODY_LEN: usize = 40;
const GOODBYE_BODY_LEN: usize = 8;
const ERROR_FIXED_LEN: usize = 8;

/// Why bytes from a peer were refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    #[error("truncated: need {need} bytes, got {got}")]
    Truncated { need: usize, got: usize },
    #[error("declared length {declared} does not match the {actual} bytes received")]
    LengthMismatch { declared: usize, actual: usize },
    #[error("length {len} exceeds the limit {max}")]
    Oversized { len: usize, max: usize },
    #[error("bad magic {0:#x}")]
    BadMagic(u32),
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("unsupported protocol version {got} (this build speaks {supported})")]
    Version { got: u16, supported: u16 },
    #[error("field `{field}` has invalid value {value}")]
    BadField { field: &'static str, value: u64 },
    #[error("error text is not UTF-8")]
    BadText,
}

/// Which end of a link a peer is. Links are symmetric on the wire; the role
/// only stops two clients (or two servers) from talking to each other by
/// mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client = 1,
    Server = 2,
}

impl Role {
    pub fn peer(self) -> Role {
        match self {
            Role::Client => Role::Server,
            Role::Server => Role::Client,
        }
    }
}

/// Where a peer may land chunks: `slot_count` slots of `slot_size` bytes from
/// `addr`, reachable with `rkey`. A peer that receives no chunks announces
/// zero slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingDescriptor {
    pub addr: u64,
    pub rkey: u32,
    pub slot_count: u32,
    pub slot_size: u32,
}

impl RingDescriptor {
    /// Largest payload one slot carries.
    pub fn max_payload(&self) -> usize {
        if self.slot_count == 0 {
            return 0;
        }
        (self.slot_size as usize).saturating_sub(CHUNK_HEADER_LEN)
    }
}

/// The first message each side sends on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub role: Role,
    /// Feature bits this side offers; a link uses the intersection.
    pub features: u32,
    pub ring: RingDescriptor,
    /// Receives this side keeps posted for control messages: the peer's
    /// initial control credits.
    pub control_depth: u32,
    /// Size of each of those receive buffers: the largest control message
    /// the peer may send.
    pub control_size: u32,
}

/// Error codes carried by an error frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    Protocol = 1,
    Version = 2,
    Refused = 3,
    Internal = 4,
    /// A sealed frame or chunk failed its session check.
    Tampered = 5,
}

impl ErrorCode {
    fn from_u32(v: u32) -> Result<Self, WireError> {
        Ok(match v {
            1 => ErrorCode::Protocol,
            2 => ErrorCode::Version,
            3 => ErrorCode::Refused,
            4 => ErrorCode::Internal,
            5 => ErrorCode::Tampered,
            _ => {
                return Err(WireError::BadField {
                    field: "error.code",
                    value: v.into(),
                });
            }
        })
    }
}

/// Credits piggybacked on every control frame (see `credit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreditUpdate {
    /// Cumulative: the peer may write slot sequence numbers below this.
    pub grant_limit: u64,
    /// Increment: control messages of the peer that were consumed since the
    /// last update.
    pub control_return: u32,
}

/// A decoded control message. `App` borrows its payload from the receive
/// buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body<'a> {
    Hello(Hello),
    Credit,
    Error { code: ErrorCode, text: &'a str },
    Goodbye { reason: u32 },
    App(&'a [u8]),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    pub credit: CreditUpdate,
    pub body: Body<'a>,
}

/// The kind byte of an error frame (a sealed link takes these unsealed).
pub const KIND_ERROR: u8 = Kind::Error as u8;
/// The kind byte of a standalone credit update.
pub const KIND_CREDIT: u8 = Kind::Credit as u8;
/// The kind byte of an application message.
pub const KIND_APP: u8 = Kind::App as u8;

#[repr(u8)]
enum Kind {
    Hello = 1,
    Credit = 2,
    Error = 3,
    Goodbye = 4,
    App = 5,
}

/// Little-endian reader over a slice whose length was checked up front.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().expect("2 bytes"))
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
}

fn zero(field: &'static str, value: u64) -> Result<(), WireError> {
    if value == 0 {
        Ok(())
    } else {
        Err(WireError::BadField { field, value })
    }
}

fn in_range(field: &'static str, value: u32, lo: u32, hi: u32) -> Result<(), WireError> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(WireError::BadField {
            field,
            value: value.into(),
        })
    }
}

impl<'a> Frame<'a> {
    /// Decodes one control frame: `buf` is exactly the bytes one SEND
    /// delivered.
    pub fn decode(buf: &'a [u8]) -> Result<Frame<'a>, WireError> {
        if buf.len() < FRAME_HEADER_LEN {
            return Err(WireError::Truncated {
                need: FRAME_HEADER_LEN,
                got: buf.len(),
            });
        }
        if buf.len() > MAX_CONTROL_SIZE as usize {
            return Err(WireError::Oversized {
                len: buf.len(),
                max: MAX_CONTROL_SIZE as usize,
            });
        }
        let mut f = Fields(buf);
        let magic = f.u16();
        if magic != FRAME_MAGIC {
            return Err(WireError::BadMagic(magic.into()));
        }
        let kind = f.u8();
        let flags = f.u8();
        let body_len = f.u32() as usize;
        let credit = CreditUpdate {
            grant_limit: f.u64(),
            control_return: f.u32(),
        };
        let reserved = f.u32();
        zero("frame.flags", flags.into())?;
        zero("frame.reserved", reserved.into())?;
        if body_len != f.0.len() {
            return Err(WireError::LengthMismatch {
                declared: body_len,
                actual: f.0.len(),
            });
        }
        let fixed_len = |need: usize| {
            if body_len == need {
                Ok(())
            } else {
                Err(WireError::LengthMismatch {
                    declared: body_len,
                    actual: need,
                })
            }
        };
        let body = match kind {
            k if k == Kind::Hello as u8 => {
                // The version comes first so that a hello of another version,
                // whatever its length, is reported as such.
                if body_len >= 2 {
                    let version = u16::from_le_bytes([f.0[0], f.0[1]]);
                    if version != VERSION {
                        return Err(WireError::Version {
                            got: version,
                            supported: VERSION,
                        });
                    }
                }
                fixed_len(HELLO_BODY_LEN)?;
                Body::Hello(decode_hello(&mut f)?)
            }
            k if k == Kind::Credit as u8 => {
                fixed_len(0)?;
                Body::Credit
            }
            k if k == Kind::Error as u8 => {
                if body_len < ERROR_FIXED_LEN {
                    return Err(WireError::Truncated {
                        need: ERROR_FIXED_LEN,
                        got: body_len,
                    });
                }
                let code = ErrorCode::from_u32(f.u32())?;
                let text_len = f.u16() as usize;
                zero("error.reserved", f.u16().into())?;
                if text_len > MAX_ERROR_TEXT {
                    return Err(WireError::Oversized {
                        len: text_len,
                        max: MAX_ERROR_TEXT,
                    });
                }
                fixed_len(ERROR_FIXED_LEN + text_len)?;
                let text = std::str::from_utf8(f.take(text_len)).map_err(|_| WireError::BadText)?;
                Body::Error { code, text }
            }
            k if k == Kind::Goodbye as u8 => {
                fixed_len(GOODBYE_BODY_LEN)?;
                let reason = f.u32();
                zero("goodbye.reserved", f.u32().into())?;
                Body::Goodbye { reason }
            }
            k if k == Kind::App as u8 => {
                if body_len == 0 {
                    return Err(WireError::Truncated { need: 1, got: 0 });
                }
                Body::App(f.take(body_len))
            }
            other => return Err(WireError::UnknownKind(other)),
        };
        Ok(Frame { credit, body })
    }

    /// Bytes this frame occupies on the wire.
    pub fn encoded_len(&self) -> usize {
        FRAME_HEADER_LEN
            + match &self.body {
                Body::Hello(_) => HELLO_BODY_LEN,
                Body::Credit => 0,
                Body::Error { text, .. } => ERROR_FIXED_LEN + text.len().min(MAX_ERROR_TEXT),
                Body::Goodbye { .. } => GOODBYE_BODY_LEN,
                Body::App(p) => p.len(),
            }
    }

    /// Encodes into the front of `out` and returns the length written.
    /// Panics if `out` is shorter than [`Frame::encoded_len`]: callers size
    /// their send buffers from the negotiated control size, so a short buffer
    /// is a bug, not a peer's doing. Error text longer than the limit is cut
    /// at a character boundary.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        let len = self.encoded_len();
        let out = &mut out[..len];
        let (kind, body_len) = match &self.body {
            Body::Hello(_) => (Kind::Hello, HELLO_BODY_LEN),
            Body::Credit => (Kind::Credit, 0),
            Body::Error { .. } => (Kind::Error, len - FRAME_HEADER_LEN),
            Body::Goodbye { .. } => (Kind::Goodbye, GOODBYE_BODY_LEN),
            Body::App(p) => (Kind::App, p.len()),
        };
        let mut w = Writer(out);
        w.put(&FRAME_MAGIC.to_le_bytes());
        w.put(&[kind as u8, 0]);
        w.put(&(body_len as u32).to_le_bytes());
        w.put(&self.credit.grant_limit.to_le_bytes());
        w.put(&self.credit.control_return.to_le_bytes());
        w.put(&0u32.to_le_bytes());
        match &self.body {
            Body::Hello(h) => {
                w.put(&h.version.to_le_bytes());
                w.put(&[h.role as u8, 0]);
                w.put(&h.features.to_le_bytes());
                w.put(&h.ring.addr.to_le_bytes());
                w.put(&h.ring.rkey.to_le_bytes());
                w.put(&h.ring.slot_count.to_le_bytes());
                w.put(&h.ring.slot_size.to_le_bytes());
                w.put(&h.control_depth.to_le_bytes());
                w.put(&h.control_size.to_le_bytes());
                w.put(&0u32.to_le_bytes());
            }
            Body::Credit => {}
            Body::Error { code, text } => {
                let text = truncate_text(text);
                w.put(&(*code as u32).to_le_bytes());
                w.put(&(text.len() as u16).to_le_bytes());
                w.put(&0u16.to_le_bytes());
                w.put(text.as_bytes());
            }
            Body::Goodbye { reason } => {
                w.put(&reason.to_le_bytes());
                w.put(&0u32.to_le_bytes());
            }
            Body::App(p) => w.put(p),
        }
        len
    }
}

fn truncate_text(text: &str) -> &str {
    fit_error_text(text, usize::MAX)
}

/// `text`, cut at a character boundary so that an error frame carrying it
/// fits in `frame_size` bytes (and within [`MAX_ERROR_TEXT`]).
pub fn fit_error_text(text: &str, frame_size: usize) -> &str {
    let room = frame_size
        .saturating_sub(FRAME_HEADER_LEN + ERROR_FIXED_LEN)
        .min(MAX_ERROR_TEXT);
    if text.len() <= room {
        return text;
    }
    let mut end = room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn decode_hello(f: &mut Fields<'_>) -> Result<Hello, WireError> {
    let version = f.u16();
    if version != VERSION {
        return Err(WireError::Version {
            got: version,
            supported: VERSION,
        });
    }
    let role = match f.u8() {
        1 => Role::Client,
        2 => Role::Server,
        other => {
            return Err(WireError::BadField {
                field: "hello.role",
                value: other.into(),
            });
        }
    };
    zero("hello.reserved", f.u8().into())?;
    let features = f.u32();
    let ring = RingDescriptor {
        addr: f.u64(),
        rkey: f.u32(),
        slot_count: f.u32(),
        slot_size: f.u32(),
    };
    let control_depth = f.u32();
    let control_size = f.u32();
    zero("hello.reserved2", f.u32().into())?;
    in_range("hello.slot_count", ring.slot_count, 0, MAX_SLOTS)?;
    if ring.slot_count > 0 {
        in_range(
            "hello.slot_size",
            ring.slot_size,
            CHUNK_HEADER_LEN as u32 + 1,
            MAX_SLOT_SIZE,
        )?;
        let span = u64::from(ring.slot_count) * u64::from(ring.slot_size);
        if ring.addr.checked_add(span).is_none() {
            return Err(WireError::BadField {
                field: "hello.ring_addr",
                value: ring.addr,
            });
        }
    }
    in_range(
        "hello.control_depth",
        control_depth,
        MIN_CONTROL_DEPTH,
        MAX_CONTROL_DEPTH,
    )?;
    in_range(
        "hello.control_size",
        control_size,
        MIN_CONTROL_SIZE,
        MAX_CONTROL_SIZE,
    )?;
    Ok(Hello {
        version,
        role,
        features,
        ring,
        control_depth,
        control_size,
    })
}

struct Writer<'a>(&'a mut [u8]);

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let (head, rest) = std::mem::take(&mut self.0).split_at_mut(bytes.len());
        head.copy_from_slice(bytes);
        self.0 = rest;
    }
}

/// Flags of a chunk header.
pub mod chunk_flags {
    /// `digest` holds the SHA-256 of the payload.
    pub const DIGEST: u32 = 1 << 0;
    /// The last chunk of its stream.
    pub const END_OF_STREAM: u32 = 1 << 1;
    pub const KNOWN: u32 = DIGEST | END_OF_STREAM;
}

/// The 64 bytes at the start of every landing slot, written in the same
/// one-sided write as the payload that follows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkHeader {
    pub payload_len: u32,
    /// Application-defined: what the chunk is part of (an rcp entry's
    /// index, an rblock request's id).
    pub owner: u64,
    /// Application-defined: where in its owner the payload belongs.
    pub offset: u64,
    pub flags: u32,
    /// The note (slot sequence number) the chunk was written with; the
    /// receiver checks it against the note it was told, so a stale slot is
    /// never taken for a fresh one.
    pub note: u32,
    pub digest: [u8; 32],
    /// A sealed link's tag over the rest of the header (and the payload,
    /// see [`crate::link::seal`]); zero on a link that is not sealed.
    pub tag: [u8; 16],
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut out = [0u8; CHUNK_HEADER_LEN];
        let mut w = Writer(&mut out);
        w.put(&CHUNK_MAGIC.to_le_bytes());
        w.put(&self.payload_len.to_le_bytes());
        w.put(&self.owner.to_le_bytes());
        w.put(&self.offset.to_le_bytes());
        w.put(&self.flags.to_le_bytes());
        w.put(&self.note.to_le_bytes());
        w.put(&self.digest);
        w.put(&self.tag);
        out
    }

    /// Decodes the header of a landed slot. `landed` is how many bytes the
    /// peer's write placed (header and payload), `max_payload` what the slot
    /// holds after its header, `note` what the completion said.
    pub fn decode(
        slot: &[u8],
        landed: usize,
        max_payload: usize,
        note: u32,
    ) -> Result<ChunkHeader, WireError> {
        if landed < CHUNK_HEADER_LEN || slot.len() < CHUNK_HEADER_LEN {
            return Err(WireError::Truncated {
                need: CHUNK_HEADER_LEN,
                got: landed.min(slot.len()),
            });
        }
        let mut f = Fields(&slot[..CHUNK_HEADER_LEN]);
        let magic = f.u32();
        if magic != CHUNK_MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let payload_len = f.u32();
        if payload_len as usize > max_payload {
            return Err(WireError::Oversized {
                len: payload_len as usize,
                max: max_payload,
            });
        }
        if CHUNK_HEADER_LEN + payload_len as usize != landed {
            return Err(WireError::LengthMismatch {
                declared: CHUNK_HEADER_LEN + payload_len as usize,
                actual: landed,
            });
        }
        let header = ChunkHeader {
            payload_len,
            owner: f.u64(),
            offset: f.u64(),
            flags: f.u32(),
            note: f.u32(),
            digest: f.take(32).try_into().expect("32 bytes"),
            tag: f.take(16).try_into().expect("16 bytes"),
        };
        if header.flags & !chunk_flags::KNOWN != 0 {
            return Err(WireError::BadField {
                field: "chunk.flags",
                value: header.flags.into(),
            });
        }
        if header.note != note {
            return Err(WireError::BadField {
                field: "chunk.note",
                value: header.note.into(),
            });
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests;
