//! The request protocol between `rblock connect` and `rblock serve` over an
//! rfabric link, sans I/O: messages encoded and decoded, checked field by
//! field. `docs/PROTOCOL.md` has it byte by byte.
//!
//! A request is an NBD request header, reused verbatim (so the server
//! checks it with the same code as NBD over TCP), under an id the client
//! chooses per link instead of the NBD cookie:
//!
//! * READ, FLUSH, TRIM, WRITE_ZEROES, BLOCK_STATUS, CACHE travel as a
//!   [`Msg::Request`] message.
//! * A WRITE travels as chunks into the server's landing slots (one
//!   notified write each: header and data together). Each chunk's `owner`
//!   is the id, its `offset` where its bytes start within the request, and
//!   its 32 application bytes carry the request header ([`write_tag`]).
//! * A READ's data comes back as chunks into the client's slots, the same
//!   way (`owner` = id, `offset` within the request). All bytes there
//!   means it worked; a [`Msg::Reply`] with an error means it did not.
//! * Everything else is answered with [`Msg::Reply`] (or [`Msg::Extents`]
//!   for BLOCK_STATUS).

use crate::nbd::consts::REQUEST_LEN;
use crate::nbd::transmission::{Extent, Request};

/// Version of this protocol, sent in [`Msg::Open`]. 2: the server's
/// [`Msg::Challenge`] comes first. 3: the opening binds the session's seal
/// (the `encrypt` choices, the Open's tag).
pub const VERSION: u16 = 3;

mod tag {
    pub const OPEN: u8 = 1;
    pub const OPENED: u8 = 2;
    pub const REFUSED: u8 = 3;
    pub const REQUEST: u8 = 4;
    pub const REPLY: u8 = 5;
    pub const EXTENTS: u8 = 6;
    pub const CHALLENGE: u8 = 7;
    pub const AUTH: u8 = 8;
    pub const AUTH_OK: u8 = 9;
}

/// Longest export name.
pub const MAX_NAME: usize = 4096;

/// One message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Server, first: prove you know the secret (`rfabric::auth`, domain
    /// `RBLOCK`). `required` is false on a server without one (loopback,
    /// or `--no-auth`), which then proves nothing either. `encrypt`: this
    /// server requires the session encrypted.
    Challenge {
        nonce: [u8; 32],
        required: bool,
        encrypt: bool,
    },
    /// Client, the answer: its nonce and proof (zeros without a secret);
    /// `encrypt`: the protection the session is sealed with, mixed into
    /// its keys.
    Auth {
        nonce: [u8; 32],
        proof: [u8; 32],
        encrypt: bool,
    },
    /// Server: the proof is good; its own proof (zeros without a secret).
    /// A bad proof gets [`Msg::Refused`] instead, and the link closes.
    AuthOk { proof: [u8; 32] },
    /// Client, after its `Auth`: which export. `tag` binds it to the
    /// session ([`open_tag`]; zeros without a secret): the server knows
    /// which secret to check the proof with only from the name, so the
    /// name comes before anything is sealed, and a path that changes it
    /// fails this tag.
    Open {
        version: u16,
        name: String,
        tag: [u8; 32],
    },
    /// Server: the export is open on this link. `flags` are the NBD
    /// transmission flags the server would give an NBD client;
    /// `max_request` the longest request it takes.
    Opened {
        size: u64,
        flags: u16,
        max_request: u32,
    },
    /// Server: no (unknown export, other version); the link then closes.
    Refused { text: String },
    /// Client: a request other than WRITE (the header's cookie is the id).
    Request(Request),
    /// Server: the request `id` is done; `error` is an NBD error number
    /// (0: it worked), `text` says why for people.
    Reply { id: u64, error: u32, text: String },
    /// Server: the answer to a BLOCK_STATUS.
    Extents { id: u64, extents: Vec<Extent> },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("empty message")]
    Empty,
    #[error("unknown message tag {0}")]
    Tag(u8),
    #[error("message {what} of {len} bytes, expected {expected}")]
    Length {
        what: &'static str,
        len: usize,
        expected: usize,
    },
    #[error("{0} is not UTF-8")]
    Text(&'static str),
    #[error("bad request header: {0}")]
    Header(String),
    #[error("bad field {0}")]
    Field(&'static str),
}

impl Msg {
    /// The message's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Challenge { .. } => "Challenge",
            Msg::Auth { .. } => "Auth",
            Msg::AuthOk { .. } => "AuthOk",
            Msg::Open { .. } => "Open",
            Msg::Opened { .. } => "Opened",
            Msg::Refused { .. } => "Refused",
            Msg::Request(_) => "Request",
            Msg::Reply { .. } => "Reply",
            Msg::Extents { .. } => "Extents",
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Msg::Challenge {
                nonce,
                required,
                encrypt,
            } => {
                b.push(tag::CHALLENGE);
                b.extend_from_slice(nonce);
                b.push(u8::from(*required));
                b.push(u8::from(*encrypt));
            }
            Msg::Auth {
                nonce,
                proof,
                encrypt,
            } => {
                b.push(tag::AUTH);
                b.extend_from_slice(nonce);
                b.extend_from_slice(proof);
                b.push(u8::from(*encrypt));
            }
            Msg::AuthOk { proof } => {
                b.push(tag::AUTH_OK);
                b.extend_from_slice(proof);
            }
            Msg::Open { version, name, tag } => {
                b.push(tag::OPEN);
                b.extend_from_slice(&version.to_le_bytes());
                b.extend_from_slice(tag);
                b.extend_from_slice(name.as_bytes());
            }
            Msg::Opened {
                size,
                flags,
                max_request,
            } => {
                b.push(tag::OPENED);
                b.extend_from_slice(&size.to_le_bytes());
                b.extend_from_slice(&flags.to_le_bytes());
                b.extend_from_slice(&max_request.to_le_bytes());
            }
            Msg::Refused { text } => {
                b.push(tag::REFUSED);
                b.extend_from_slice(text.as_bytes());
            }
            Msg::Request(r) => {
                b.push(tag::REQUEST);
                b.extend_from_slice(&r.encode());
            }
            Msg::Reply { id, error, text } => {
                b.push(tag::REPLY);
                b.extend_from_slice(&id.to_le_bytes());
                b.extend_from_slice(&error.to_le_bytes());
                b.extend_from_slice(text.as_bytes());
            }
            Msg::Extents { id, extents } => {
                b.push(tag::EXTENTS);
                b.extend_from_slice(&id.to_le_bytes());
                for e in extents {
                    b.extend_from_slice(&e.length.to_le_bytes());
                    b.extend_from_slice(&e.flags.to_le_bytes());
                }
            }
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Msg, ProtoError> {
        let (&t, body) = b.split_first().ok_or(ProtoError::Empty)?;
        // The body's length where `expected` bytes were due.
        let wrong = |what, expected| ProtoError::Length {
            what,
            len: body.len(),
            expected,
        };
        let exact = |what, expected| {
            (body.len() == expected)
                .then_some(())
                .ok_or_else(|| wrong(what, expected))
        };
        let at_least = |what, expected| {
            (body.len() >= expected)
                .then_some(())
                .ok_or_else(|| wrong(what, expected))
        };
        let text = |what, bytes: &[u8]| {
            String::from_utf8(bytes.to_vec()).map_err(|_| ProtoError::Text(what))
        };
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8"));
        let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().expect("4"));
        let bytes32 = |i: usize| -> [u8; 32] { body[i..i + 32].try_into().expect("32") };
        Ok(match t {
            tag::CHALLENGE => {
                exact("challenge", 34)?;
                Msg::Challenge {
                    nonce: bytes32(0),
                    required: flag(body[32], "challenge.required")?,
                    encrypt: flag(body[33], "challenge.encrypt")?,
                }
            }
            tag::AUTH => {
                exact("auth", 65)?;
                Msg::Auth {
                    nonce: bytes32(0),
                    proof: bytes32(32),
                    encrypt: flag(body[64], "auth.encrypt")?,
                }
            }
            tag::AUTH_OK => {
                exact("auth ok", 32)?;
                Msg::AuthOk { proof: bytes32(0) }
            }
            tag::OPEN => {
                at_least("open", 34)?;
                if body.len() - 34 > MAX_NAME {
                    return Err(wrong("open", 34 + MAX_NAME));
                }
                Msg::Open {
                    version: u16::from_le_bytes([body[0], body[1]]),
                    tag: bytes32(2),
                    name: text("the export name", &body[34..])?,
                }
            }
            tag::OPENED => {
                exact("opened", 14)?;
                Msg::Opened {
                    size: u64_at(0),
                    flags: u16::from_le_bytes([body[8], body[9]]),
                    max_request: u32_at(10),
                }
            }
            tag::REFUSED => Msg::Refused {
                text: text("the refusal", body)?,
            },
            tag::REQUEST => {
                exact("request", REQUEST_LEN)?;
                let head: &[u8; REQUEST_LEN] = body.try_into().expect("checked length");
                Msg::Request(Request::decode(head).map_err(|e| ProtoError::Header(e.to_string()))?)
            }
            tag::REPLY => {
                at_least("reply", 12)?;
                Msg::Reply {
                    id: u64_at(0),
                    error: u32_at(8),
                    text: text("the reply text", &body[12..])?,
                }
            }
            tag::EXTENTS => {
                at_least("extents", 8)?;
                if (body.len() - 8) % 8 != 0 {
                    return Err(wrong("extents", 8 + (body.len() - 8) / 8 * 8));
                }
                Msg::Extents {
                    id: u64_at(0),
                    extents: body[8..]
                        .chunks_exact(8)
                        .map(|e| Extent {
                            length: u32::from_le_bytes(e[..4].try_into().expect("4")),
                            flags: u32::from_le_bytes(e[4..].try_into().expect("4")),
                        })
                        .collect(),
                }
            }
            other => return Err(ProtoError::Tag(other)),
        })
    }
}

/// A byte that must be 0 or 1.
fn flag(byte: u8, field: &'static str) -> Result<bool, ProtoError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(ProtoError::Field(field)),
    }
}

/// The tag of an [`Msg::Open`]: `HMAC-SHA256(client-to-server session key,
/// "rblock open" | version | encrypt | name)`, so that the export asked
/// for, the version and the protection are what the client sent.
pub fn open_tag(key: &[u8; 32], version: u16, encrypt: bool, name: &str) -> [u8; 32] {
    let v = version.to_le_bytes();
    rfabric::auth::tag(key, &open_fields(&v, &[u8::from(encrypt)], name))
}

/// Constant-time check of an [`open_tag`].
pub fn check_open_tag(
    key: &[u8; 32],
    version: u16,
    encrypt: bool,
    name: &str,
    tag: &[u8; 32],
) -> bool {
    let v = version.to_le_bytes();
    rfabric::auth::check_tag(key, &open_fields(&v, &[u8::from(encrypt)], name), tag)
}

fn open_fields<'a>(version: &'a [u8], encrypt: &'a [u8], name: &'a str) -> [&'a [u8]; 4] {
    [b"rblock open", version, encrypt, name.as_bytes()]
}

/// Extents that fit one message of `max_message` bytes.
pub fn max_extents(max_message: usize) -> usize {
    max_message.saturating_sub(9) / 8
}

/// A WRITE's request header as a chunk's 32 application bytes.
pub fn write_tag(r: &Request) -> [u8; 32] {
    let mut tag = [0u8; 32];
    tag[..REQUEST_LEN].copy_from_slice(&r.encode());
    tag
}

/// The request header a write chunk carries; its cookie must be the
/// chunk's owner (the id).
pub fn write_request(tag: &[u8; 32], owner: u64) -> Result<Request, ProtoError> {
    if tag[REQUEST_LEN..].iter().any(|&b| b != 0) {
        return Err(ProtoError::Header(
            "nonzero padding after the header".into(),
        ));
    }
    let head: &[u8; REQUEST_LEN] = tag[..REQUEST_LEN].try_into().expect("28 bytes");
    let r = Request::decode(head).map_err(|e| ProtoError::Header(e.to_string()))?;
    if r.cookie != owner {
        return Err(ProtoError::Header(format!(
            "write chunk of request {owner} carries the header of {}",
            r.cookie
        )));
    }
    Ok(r)
}

#[cfg(test)]
mod tests;
