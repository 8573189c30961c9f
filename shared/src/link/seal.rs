//! Binding a link's traffic to the session that authenticated it, sans I/O.
//!
//! Authentication ([`crate::auth`]) leaves both ends with two keys, one per
//! direction, that nobody who only watched the exchange knows. From the
//! moment a side seals its sending half, every control frame it sends
//! carries a 16-byte tag after its body (flag [`SEALED`] in the frame
//! header) and every chunk header carries one in its `tag` field. The
//! receiving half checks each before anything of it is used.
//!
//! Two protections, chosen per session and mixed into the keys (a peer or
//! a path that disagrees about the choice fails the first check):
//! * [`Protection::Authenticate`]: the tag is the first 16 bytes of
//!   `HMAC-SHA256(key, kind | sequence number | header | body)`; a chunk's
//!   payload, where it must be covered, under AES-256-GCM as below.
//! * [`Protection::Encrypt`]: AES-256-GCM with the nonce `kind | sequence
//!   number`, the frame or chunk header as associated data, the body or
//!   payload encrypted in place (on RDMA: in the sender's registered buffer
//!   before the write, in the landing slot after it).
//!
//! Sequence numbers make every tag single-use: frames are counted from the
//! first sealed one in each direction, chunks use their slot sequence
//! number (the credit engine's, known to both ends). So a frame or chunk
//! that is injected, altered, replayed, reordered or taken from another
//! session or link fails its check, and a dropped frame makes the next one
//! fail. Nonces never repeat under one key: the kinds keep the two counters
//! apart, the counters only grow, and every link has its own keys.
//!
//! Under `Authenticate`, a chunk that carries a digest of its payload
//! (flag `DIGEST`) is tagged over its header only, digest included, which
//! keeps the payload to one pass; its receiver must check the digest
//! before using the payload (rcp does, before anything is written). A
//! chunk without a digest (rblock's data, rcp `--no-verify`) has its
//! payload covered by AES-256-GCM, which encrypts it as a side effect: no
//! cheaper MAC over bulk data is at hand (GCM runs at several times
//! HMAC-SHA256's speed).
#![forbid(unsafe_code)]

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use thiserror::Error;

use crate::auth;

/// Bytes of every tag.
pub const TAG_LEN: usize = 16;
/// Bit of a frame header's flags byte: a tag follows the body.
pub const SEALED: u8 = 1 << 0;
/// Where the flags byte sits in a frame header.
const FLAGS_AT: usize = 3;
/// Where the kind byte sits in a frame header.
const KIND_AT: usize = 2;

/// What a sealed link protects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Integrity, order and origin; contents readable on the path.
    Authenticate,
    /// The same, and contents hidden.
    Encrypt,
}

impl Protection {
    fn label(self) -> &'static [u8] {
        match self {
            Protection::Authenticate => b"rfabric seal authenticate",
            Protection::Encrypt => b"rfabric seal encrypt",
        }
    }
}

/// When a session is encrypted (`--encrypt` of both tools).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum EncryptChoice {
    /// Authenticated only: contents readable on the path.
    Never,
    /// Encrypted on TCP paths, which cross ordinary networks; RDMA
    /// fabrics are usually closed ones, and encryption costs CPU there.
    #[default]
    Tcp,
    /// Encrypted on RDMA too.
    Always,
}

impl EncryptChoice {
    /// Whether a session over `backend` is encrypted by this choice.
    pub fn wants(self, backend: crate::transport::Backend) -> bool {
        match self {
            EncryptChoice::Never => false,
            EncryptChoice::Tcp => backend == crate::transport::Backend::Tcp,
            EncryptChoice::Always => true,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EncryptChoice::Never => "never",
            EncryptChoice::Tcp => "tcp",
            EncryptChoice::Always => "always",
        }
    }
}

impl Protection {
    /// The protection of a session that is encrypted or not.
    pub fn of(encrypt: bool) -> Protection {
        if encrypt {
            Protection::Encrypt
        } else {
            Protection::Authenticate
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Protection::Authenticate => "authenticated",
            Protection::Encrypt => "encrypted",
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SealError {
    #[error(
        "{what} failed its session check: altered, injected, replayed or out of order on the path"
    )]
    BadTag { what: String },
    #[error(
        "an unsealed frame of kind {kind} after the session was sealed (injected on the path?)"
    )]
    Unsealed { kind: u8 },
    #[error("a sealed frame before this side of the link was sealed")]
    Early,
    #[error("an unsealed {what} came after the peer's proof (injected on the path?)")]
    AfterProof { what: &'static str },
    #[error("a sealed frame of {len} bytes is too short for its tag")]
    Short { len: usize },
}

/// The two kinds of sealed things: their counters never share a nonce.
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
enum Kind {
    Frame = 1,
    Chunk = 2,
}

/// What a tag covers, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cover {
    /// HMAC over the header and the body (a frame under Authenticate), or
    /// the header alone (a chunk whose digest vouches for its payload).
    Mac { body: bool },
    /// AES-256-GCM: the header as associated data, the body encrypted.
    /// Also what covers a chunk's payload under Authenticate: no cheaper
    /// MAC over bulk data is at hand (GCM runs at several times HMAC's
    /// speed), so such a payload is encrypted as a side effect.
    Aead,
}

struct Cipher {
    mac: [u8; 32],
    aead: LessSafeKey,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys are never printed.
        f.write_str("Cipher(..)")
    }
}

impl Cipher {
    fn new(protection: Protection, key: &[u8; 32]) -> Cipher {
        let derive = |what: &[u8]| auth::tag(key, &[protection.label(), what]);
        Cipher {
            mac: derive(b" mac"),
            aead: LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, &derive(b" aead")).expect("a 32-byte AES-256 key"),
            ),
        }
    }

    fn nonce(kind: Kind, seq: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[0] = kind as u8;
        n[4..].copy_from_slice(&seq.to_le_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Tags `header` and `body` as `cover` says (under `Aead` the body is
    /// encrypted in place).
    fn seal(
        &self,
        kind: Kind,
        seq: u64,
        header: &[u8],
        body: &mut [u8],
        cover: Cover,
    ) -> [u8; TAG_LEN] {
        match cover {
            Cover::Mac { body: with_body } => {
                let body: &[u8] = if with_body { body } else { &[] };
                let full = auth::tag(
                    &self.mac,
                    &[&[kind as u8], &seq.to_le_bytes(), header, body],
                );
                full[..TAG_LEN].try_into().expect("16 of 32 bytes")
            }
            Cover::Aead => {
                let tag = self
                    .aead
                    .seal_in_place_separate_tag(Cipher::nonce(kind, seq), Aad::from(header), body)
                    .expect("AES-GCM seals any length a link carries");
                tag.as_ref().try_into().expect("a 16-byte GCM tag")
            }
        }
    }

    /// Checks a tag made by [`Cipher::seal`]; under `Aead` decrypts `body`
    /// in place (and leaves it unusable when the check fails).
    fn open(
        &self,
        kind: Kind,
        seq: u64,
        header: &[u8],
        body: &mut [u8],
        cover: Cover,
        tag: &[u8; TAG_LEN],
    ) -> bool {
        match cover {
            Cover::Mac { body: with_body } => {
                let body: &[u8] = if with_body { body } else { &[] };
                auth::check_tag_prefix(
                    &self.mac,
                    &[&[kind as u8], &seq.to_le_bytes(), header, body],
                    tag,
                )
            }
            Cover::Aead => self
                .aead
                .open_in_place_separate_tag(Cipher::nonce(kind, seq), Aad::from(header), tag, body)
                .is_ok(),
        }
    }
}

/// How a frame is covered under `protection`.
fn frame_cover(protection: Protection) -> Cover {
    match protection {
        Protection::Authenticate => Cover::Mac { body: true },
        Protection::Encrypt => Cover::Aead,
    }
}

/// How a chunk is covered under `protection`.
fn chunk_cover(protection: Protection, digest_inside: bool) -> Cover {
    match protection {
        Protection::Authenticate if digest_inside => Cover::Mac { body: false },
        _ => Cover::Aead,
    }
}

/// The sending half's seal: tags (and perhaps encrypts) what it sends.
#[derive(Debug)]
pub struct Sealer {
    cipher: Cipher,
    protection: Protection,
    frames: u64,
}

impl Sealer {
    /// Seals with this direction's session key.
    pub fn new(protection: Protection, key: &[u8; 32]) -> Sealer {
        Sealer {
            cipher: Cipher::new(protection, key),
            protection,
            frames: 0,
        }
    }

    pub fn protection(&self) -> Protection {
        self.protection
    }

    /// Seals the encoded frame in `buf[..len]`: marks it sealed, encrypts
    /// its body if so chosen and appends the tag. Returns the new length.
    /// `buf` must have [`TAG_LEN`] bytes of room after `len`.
    pub fn seal_frame(&mut self, buf: &mut [u8], len: usize) -> usize {
        buf[FLAGS_AT] |= SEALED;
        let (header, rest) = buf.split_at_mut(crate::wire::FRAME_HEADER_LEN);
        let (body, tail) = rest.split_at_mut(len - header.len());
        let cover = frame_cover(self.protection);
        let tag = self
            .cipher
            .seal(Kind::Frame, self.frames, header, body, cover);
        self.frames += 1;
        tail[..TAG_LEN].copy_from_slice(&tag);
        len + TAG_LEN
    }

    /// Whether sealing a chunk changes its payload (encrypts it): always
    /// under Encrypt, and under Authenticate when no digest in the header
    /// vouches for it (`digest_inside`). Only a chunk whose payload is left
    /// alone may be sent from memory that others read meanwhile.
    pub fn covers_payload(&self, digest_inside: bool) -> bool {
        chunk_cover(self.protection, digest_inside) == Cover::Aead
    }

    /// The tag for the chunk with slot sequence number `seq`, whose header
    /// (all but its tag field) is `header`; encrypts `payload` in place if
    /// so chosen. `digest_inside`: the header carries the payload's digest.
    pub fn seal_chunk(
        &self,
        seq: u64,
        header: &[u8],
        payload: &mut [u8],
        digest_inside: bool,
    ) -> [u8; TAG_LEN] {
        let cover = chunk_cover(self.protection, digest_inside);
        self.cipher.seal(Kind::Chunk, seq, header, payload, cover)
    }
}

/// Which unsealed frames a receiving half still takes before the peer's
/// first sealed one (after it: only error reports, on which the link ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    /// Credit updates only: for the side that sealed on checking the
    /// peer's proof, so that nothing injected after the proof is acted on.
    CreditsOnly,
    /// Anything: for the side that sealed on sending its proof, which must
    /// still hear an unsealed refusal; it acts on nothing until the
    /// answer's proof checks out, and the answer is the peer's first
    /// sealed frame (strip its seal and the next one fails).
    Anything,
}

/// The receiving half's seal: checks (and perhaps decrypts) what arrives.
#[derive(Debug)]
pub struct Opener {
    cipher: Cipher,
    protection: Protection,
    before: Before,
    frames: u64,
}

/// What [`Opener::open_frame`] made of a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// A sealed frame that passed: its plain bytes, flag cleared, tag gone.
    Sealed(Vec<u8>),
    /// An unsealed frame that may still pass unsealed: an error report
    /// (the link ends on it anyway), or a frame sent before the peer sealed
    /// its half that [`Before`] lets through.
    Plain,
}

impl Opener {
    /// Opens with the peer's direction's session key.
    pub fn new(protection: Protection, key: &[u8; 32], before: Before) -> Opener {
        Opener {
            cipher: Cipher::new(protection, key),
            protection,
            before,
            frames: 0,
        }
    }

    pub fn protection(&self) -> Protection {
        self.protection
    }

    /// Checks one received frame (exactly the bytes its send delivered).
    pub fn open_frame(&mut self, bytes: &[u8]) -> Result<Opened, SealError> {
        let header_len = crate::wire::FRAME_HEADER_LEN;
        if bytes.len() < header_len {
            // Too short for a header: the frame decoder says why.
            return Ok(Opened::Plain);
        }
        if bytes[FLAGS_AT] & SEALED == 0 {
            let kind = bytes[KIND_AT];
            let error = kind == crate::wire::KIND_ERROR;
            let early = self.frames == 0
                && (self.before == Before::Anything || kind == crate::wire::KIND_CREDIT);
            return if error || early {
                Ok(Opened::Plain)
            } else {
                Err(SealError::Unsealed { kind })
            };
        }
        if bytes.len() < header_len + TAG_LEN {
            return Err(SealError::Short { len: bytes.len() });
        }
        let (framed, tag) = bytes.split_at(bytes.len() - TAG_LEN);
        let tag: &[u8; TAG_LEN] = tag.try_into().expect("16 bytes");
        let mut plain = framed.to_vec();
        let (header, body) = plain.split_at_mut(header_len);
        let seq = self.frames;
        let cover = frame_cover(self.protection);
        if !self.cipher.open(Kind::Frame, seq, header, body, cover, tag) {
            return Err(SealError::BadTag {
                what: format!("control frame {seq}"),
            });
        }
        self.frames += 1;
        plain[FLAGS_AT] &= !SEALED;
        Ok(Opened::Sealed(plain))
    }

    /// Checks the chunk with slot sequence number `seq` (see
    /// [`Sealer::seal_chunk`]); decrypts `payload` in place if so chosen.
    pub fn open_chunk(
        &self,
        seq: u64,
        header: &[u8],
        payload: &mut [u8],
        digest_inside: bool,
        tag: &[u8; TAG_LEN],
    ) -> Result<(), SealError> {
        let cover = chunk_cover(self.protection, digest_inside);
        if self
            .cipher
            .open(Kind::Chunk, seq, header, payload, cover, tag)
        {
            Ok(())
        } else {
            Err(SealError::BadTag {
                what: format!("chunk {seq}"),
            })
        }
    }
}

#[cfg(test)]
mod tests;
