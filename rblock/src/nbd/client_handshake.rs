//! The client side of the fixed newstyle handshake, sans I/O: bytes from
//! the server go in, bytes for the server come out, and at the end the
//! export's size and transmission flags.
//!
//! It asks for one export by name with `NBD_OPT_GO` (and for
//! `NBD_INFO_BLOCK_SIZE`), and never for structured replies: it prepares a
//! socket for the kernel's NBD driver, which speaks simple replies only and
//! takes the socket over in the transmission phase.

use super::consts::{
    IHAVEOPT, NBDMAGIC, REPLY_MAGIC, client_flags, handshake_flags, info, opt, rep,
};

/// Longest option reply taken: a GO is answered with a few INFO items and
/// perhaps an error text; anything longer is not a server worth waiting for.
pub const MAX_REPLY: u32 = 64 * 1024;

/// Longest export name the protocol allows.
pub const MAX_NAME: usize = 4096;

/// Length of the greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
const GREETING_LEN: usize = 18;
/// Length of an option reply's header: magic, option, type, length.
const REPLY_HEADER_LEN: usize = 20;

/// What the server said about the export in its GO reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Export {
    pub size: u64,
    /// Transmission flags (`NBD_FLAG_*`), as the kernel takes them.
    pub flags: u16,
    /// The server's block sizes, when it told them.
    pub block_sizes: Option<BlockSizes>,
}

/// `NBD_INFO_BLOCK_SIZE`: the alignment the server needs, the one it
/// prefers, and its largest payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    pub minimum: u32,
    pub preferred: u32,
    pub maximum: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClientHandshakeError {
    #[error("an export name is at most {MAX_NAME} bytes, {0:?} is longer")]
    NameTooLong(String),
    #[error("not an NBD server: it greeted with {0:#018x}, not NBDMAGIC")]
    Magic(u64),
    #[error("the server speaks oldstyle NBD (its greeting has {0:#018x}, not IHAVEOPT)")]
    NotNewstyle(u64),
    #[error("the server does not speak fixed newstyle NBD (handshake flags {0:#06x})")]
    NotFixedNewstyle(u16),
    #[error("bad option reply magic {0:#018x}")]
    ReplyMagic(u64),
    #[error("the server answered option {got} to option {}", opt::GO)]
    WrongOption { got: u32 },
    #[error("the server sent an option reply of {0} bytes (at most {MAX_REPLY} are taken)")]
    ReplyTooLong(u32),
    #[error("the server refused export {export:?}: {}{}", describe(.kind), message(.text))]
    Refused {
        export: String,
        kind: u32,
        text: String,
    },
    #[error("the server sent a malformed {what} for export {export:?}")]
    Malformed { export: String, what: &'static str },
    #[error("the server answered GO for export {export:?} with reply type {kind:#x}")]
    UnexpectedReply { export: String, kind: u32 },
    #[error("the server acknowledged export {0:?} without telling its size")]
    NoExportInfo(String),
    #[error("the server closed the connection during the handshake ({0})")]
    Truncated(&'static str),
}

/// Words for an `NBD_REP_ERR_*` (NetworkBlockDevice/nbd `doc/proto.md`).
fn describe(kind: &u32) -> String {
    // Errors the server side never sends, so consts.rs has no names for them.
    const ERR_PLATFORM: u32 = (1 << 31) | 4;
    const ERR_TLS_REQD: u32 = (1 << 31) | 5;
    const ERR_BLOCK_SIZE_REQD: u32 = (1 << 31) | 8;
    match *kind {
        rep::ERR_UNKNOWN => "no such export".into(),
        rep::ERR_UNSUP => "the server does not support NBD_OPT_GO".into(),
        rep::ERR_POLICY => "refused by the server's policy".into(),
        rep::ERR_INVALID => "the server found the request invalid".into(),
        rep::ERR_SHUTDOWN => "the server is shutting down".into(),
        rep::ERR_TOO_BIG => "the request was too big for the server".into(),
        ERR_PLATFORM => "not supported on the server's platform".into(),
        ERR_TLS_REQD => "the server requires TLS".into(),
        ERR_BLOCK_SIZE_REQD => "the server requires block sizes".into(),
        k => format!("error {k:#x}"),
    }
}

fn message(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(" ({text})")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Greeting,
    Replies,
    Done,
}

/// The client's side of one handshake.
#[derive(Debug)]
pub struct ClientHandshake {
    name: String,
    state: State,
    out: Vec<u8>,
    size_and_flags: Option<(u64, u16)>,
    block_sizes: Option<BlockSizes>,
}

impl ClientHandshake {
    /// Starts a handshake for export `name` (the empty name is the
    /// server's default export). Nothing is sent before the greeting.
    pub fn new(name: &str) -> Result<ClientHandshake, ClientHandshakeError> {
        if name.len() > MAX_NAME {
            return Err(ClientHandshakeError::NameTooLong(name.into()));
        }
        Ok(ClientHandshake {
            name: name.into(),
            state: State::Greeting,
            out: Vec::new(),
            size_and_flags: None,
            block_sizes: None,
        })
    }

    /// Bytes to send to the server now.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Takes what it can of `input`: returns how many bytes it consumed
    /// and, once the server has acknowledged the GO, the export. Call again
    /// with the rest (plus whatever arrives) until then. Bytes after the
    /// acknowledgement are left unconsumed: they belong to the transmission
    /// phase.
    pub fn advance(
        &mut self,
        input: &[u8],
    ) -> Result<(usize, Option<Export>), ClientHandshakeError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.state {
                State::Done => return Ok((used, None)),
                State::Greeting => {
                    let Some(g) = rest.get(..GREETING_LEN) else {
                        return Ok((used, None));
                    };
                    let magic = u64::from_be_bytes(g[..8].try_into().expect("8 bytes"));
                    if magic != NBDMAGIC {
                        return Err(ClientHandshakeError::Magic(magic));
                    }
                    let style = u64::from_be_bytes(g[8..16].try_into().expect("8 bytes"));
                    if style != IHAVEOPT {
                        return Err(ClientHandshakeError::NotNewstyle(style));
                    }
                    let flags = u16::from_be_bytes(g[16..18].try_into().expect("2 bytes"));
                    // Without fixed newstyle a server may hang up on an
                    // option it does not know instead of answering: GO
                    // needs it.
                    if flags & handshake_flags::FIXED_NEWSTYLE == 0 {
                        return Err(ClientHandshakeError::NotFixedNewstyle(flags));
                    }
                    used += GREETING_LEN;
                    self.send_flags_and_go(flags);
                    self.state = State::Replies;
                }
                State::Replies => {
                    let Some(head) = rest.get(..REPLY_HEADER_LEN) else {
                        return Ok((used, None));
                    };
                    let magic = u64::from_be_bytes(head[..8].try_into().expect("8 bytes"));
                    if magic != REPLY_MAGIC {
                        return Err(ClientHandshakeError::ReplyMagic(magic));
                    }
                    let option = u32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
                    if option != opt::GO {
                        return Err(ClientHandshakeError::WrongOption { got: option });
                    }
                    let kind = u32::from_be_bytes(head[12..16].try_into().expect("4 bytes"));
                    let len = u32::from_be_bytes(head[16..20].try_into().expect("4 bytes"));
                    if len > MAX_REPLY {
                        return Err(ClientHandshakeError::ReplyTooLong(len));
                    }
                    let end = REPLY_HEADER_LEN + len as usize;
                    let Some(data) = rest.get(REPLY_HEADER_LEN..end) else {
                        return Ok((used, None));
                    };
                    used += end;
                    if let Some(export) = self.reply(kind, data)? {
                        self.state = State::Done;
                        return Ok((used, Some(export)));
                    }
                }
            }
        }
    }

    /// The error for a connection that ended here: what the handshake was
    /// waiting for.
    pub fn closed(&self) -> ClientHandshakeError {
        ClientHandshakeError::Truncated(match self.state {
            State::Greeting => "no complete greeting",
            State::Replies => "no complete answer to NBD_OPT_GO",
            State::Done => "after it was over",
        })
    }

    fn send_flags_and_go(&mut self, server_flags: u16) {
        let mut flags = client_flags::FIXED_NEWSTYLE;
        if server_flags & handshake_flags::NO_ZEROES != 0 {
            flags |= client_flags::NO_ZEROES;
        }
        self.out.extend_from_slice(&flags.to_be_bytes());
        let name = self.name.as_bytes();
        let requests = [info::BLOCK_SIZE];
        let len = 4 + name.len() + 2 + 2 * requests.len();
        self.out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        self.out.extend_from_slice(&opt::GO.to_be_bytes());
        self.out.extend_from_slice(&(len as u32).to_be_bytes());
        self.out
            .extend_from_slice(&(name.len() as u32).to_be_bytes());
        self.out.extend_from_slice(name);
        self.out
            .extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for r in requests {
            self.out.extend_from_slice(&r.to_be_bytes());
        }
    }

    /// One reply to the GO; the export once it is acknowledged.
    fn reply(&mut self, kind: u32, data: &[u8]) -> Result<Option<Export>, ClientHandshakeError> {
        let malformed = |what| ClientHandshakeError::Malformed {
            export: self.name.clone(),
            what,
        };
        match kind {
            rep::INFO => {
                let Some(item) = data.get(..2) else {
                    return Err(malformed("NBD_REP_INFO"));
                };
                let item = u16::from_be_bytes(item.try_into().expect("2 bytes"));
                let body = &data[2..];
                match item {
                    info::EXPORT => {
                        if body.len() != 10 {
                            return Err(malformed("NBD_INFO_EXPORT"));
                        }
                        let size = u64::from_be_bytes(body[..8].try_into().expect("8 bytes"));
                        let flags = u16::from_be_bytes(body[8..].try_into().expect("2 bytes"));
                        self.size_and_flags = Some((size, flags));
                    }
                    info::BLOCK_SIZE => {
                        if body.len() != 12 {
                            return Err(malformed("NBD_INFO_BLOCK_SIZE"));
                        }
                        let at = |i: usize| {
                            u32::from_be_bytes(body[i..i + 4].try_into().expect("4 bytes"))
                        };
                        self.block_sizes = Some(BlockSizes {
                            minimum: at(0),
                            preferred: at(4),
                            maximum: at(8),
                        });
                    }
                    // Names, descriptions and items added later say nothing
                    // the kernel needs.
                    _ => {}
                }
                Ok(None)
            }
            rep::ACK => {
                if !data.is_empty() {
                    return Err(malformed("NBD_REP_ACK"));
                }
                let Some((size, flags)) = self.size_and_flags else {
                    return Err(ClientHandshakeError::NoExportInfo(self.name.clone()));
                };
                Ok(Some(Export {
                    size,
                    flags,
                    block_sizes: self.block_sizes,
                }))
            }
            k if k & (1 << 31) != 0 => Err(ClientHandshakeError::Refused {
                export: self.name.clone(),
                kind: k,
                // The spec's error text is for humans, UTF-8 by its rules;
                // a server that breaks them still gets heard.
                text: String::from_utf8_lossy(data).trim().to_string(),
            }),
            k => Err(ClientHandshakeError::UnexpectedReply {
                export: self.name.clone(),
                kind: k,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
