//! The tcp backend's framing: how verbs operations travel over one TCP
//! stream. Sans I/O, so the decoder is unit-tested and fuzzed on its own.
//! Byte layout: `docs/PROTOCOL.md`, "tcp backend".

use thiserror::Error;

/// Sent by both sides first: who we are and which framing version.
pub const PREFACE: [u8; 8] = *b"rfabric\x01";
pub const HEADER_LEN: usize = 24;
/// Longest abort reason.
pub const MAX_ABORT_TEXT: u32 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameOp {
    Send = 1,
    Write = 2,
    WriteNotify = 3,
    ReadRequest = 4,
    ReadResponse = 5,
    Abort = 6,
}

/// One frame header; the payload (if any) follows it on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub op: FrameOp,
    /// Payload length; for a read request, the length asked for.
    pub len: u32,
    /// Remote address (writes, read requests).
    pub addr: u64,
    pub rkey: u32,
    /// The note of a notified write, or the tag pairing a read request with
    /// its response.
    pub note: u32,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    #[error("unknown frame op {0}")]
    UnknownOp(u8),
    #[error("reserved frame bits set")]
    Reserved,
    #[error("frame length {len} exceeds the limit {max}")]
    Oversized { len: u32, max: u64 },
    #[error("field `{0}` must be zero for this op")]
    StrayField(&'static str),
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = self.op as u8;
        out[4..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..16].copy_from_slice(&self.addr.to_le_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        out[20..24].copy_from_slice(&self.note.to_le_bytes());
        out
    }

    /// Decodes and checks a header. `max_msg` bounds one-sided transfers,
    /// `max_send` the payload of a send.
    pub fn decode(b: &[u8; HEADER_LEN], max_msg: u64, max_send: u64) -> Result<Self, FrameError> {
        let op = match b[0] {
            1 => FrameOp::Send,
            2 => FrameOp::Write,
            3 => FrameOp::WriteNotify,
            4 => FrameOp::ReadRequest,
            5 => FrameOp::ReadResponse,
            6 => FrameOp::Abort,
            other => return Err(FrameError::UnknownOp(other)),
        };
        if b[1..4] != [0, 0, 0] {
            return Err(FrameError::Reserved);
        }
        let h = FrameHeader {
            op,
            len: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            addr: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            rkey: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
            note: u32::from_le_bytes(b[20..24].try_into().expect("4 bytes")),
        };
        let max = match op {
            FrameOp::Send => max_send,
            FrameOp::Abort => MAX_ABORT_TEXT.into(),
            _ => max_msg,
        };
        if u64::from(h.len) > max {
            return Err(FrameError::Oversized { len: h.len, max });
        }
        let (addressed, noted) = match op {
            FrameOp::Send | FrameOp::Abort => (false, false),
            FrameOp::Write => (true, false),
            FrameOp::WriteNotify => (true, true),
            FrameOp::ReadRequest => (true, true),
            FrameOp::ReadResponse => (false, true),
        };
        if !addressed && (h.addr != 0 || h.rkey != 0) {
            return Err(FrameError::StrayField("addr/rkey"));
        }
        if !noted && h.note != 0 {
            return Err(FrameError::StrayField("note"));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(op: FrameOp) -> FrameHeader {
        FrameHeader {
            op,
            len: 10,
            addr: 0,
            rkey: 0,
            note: 0,
        }
    }

    #[test]
    fn round_trip() {
        let h = FrameHeader {
            op: FrameOp::WriteNotify,
            len: 4096,
            addr: 0x7f00_0000_1000,
            rkey: 77,
            note: 0xdead_beef,
        };
        assert_eq!(FrameHeader::decode(&h.encode(), 1 << 20, 64), Ok(h));
    }

    #[test]
    fn rejections() {
        let mut b = header(FrameOp::Send).encode();
        b[0] = 9;
        assert_eq!(
            FrameHeader::decode(&b, 100, 100),
            Err(FrameError::UnknownOp(9))
        );
        let mut b = header(FrameOp::Send).encode();
        b[2] = 1;
        assert_eq!(FrameHeader::decode(&b, 100, 100), Err(FrameError::Reserved));
        let b = header(FrameOp::Send).encode();
        assert_eq!(
            FrameHeader::decode(&b, 100, 9),
            Err(FrameError::Oversized { len: 10, max: 9 })
        );
        let b = header(FrameOp::Write).encode();
        assert_eq!(
            FrameHeader::decode(&b, 9, 100),
            Err(FrameError::Oversized { len: 10, max: 9 })
        );
        let mut h = header(FrameOp::Abort);
        h.len = MAX_ABORT_TEXT + 1;
        assert!(matches!(
            FrameHeader::decode(&h.encode(), 1 << 30, 1 << 30),
            Err(FrameError::Oversized { .. })
        ));
        let mut h = header(FrameOp::Send);
        h.rkey = 1;
        assert_eq!(
            FrameHeader::decode(&h.encode(), 100, 100),
            Err(FrameError::StrayField("addr/rkey"))
        );
        let mut h = header(FrameOp::Write);
        h.note = 1;
        assert_eq!(
            FrameHeader::decode(&h.encode(), 100, 100),
            Err(FrameError::StrayField("note"))
        );
    }
}
