//! The server side of the fixed newstyle handshake, sans I/O: bytes from
//! the client go in, bytes for the client come out, and at the end the
//! export and the choices made for the transmission phase.

use super::consts::{
    BASE_ALLOCATION, IHAVEOPT, NBDMAGIC, REPLY_MAGIC, client_flags, handshake_flags, info, opt,
    rep, tflags,
};

/// Longest option the server reads (names and queries are at most 4096
/// bytes each); longer ones are skipped and refused.
pub const MAX_OPTION: u32 = 64 * 1024;

/// The context id `base:allocation` gets.
pub const ALLOCATION_CONTEXT: u32 = 1;

/// The minimum block size of an export served through the page cache
/// (every file and block device today): requests may start and end at any
/// byte, and the kernel reads in what a partial page needs, as with
/// nbdkit's file plugin, qemu-nbd and nbd-server. A backend that truly
/// needs alignment (O_DIRECT: the device's logical block size) would give
/// its own through [`ExportInfo::min_block`].
pub const PAGE_CACHE_MIN_BLOCK: u32 = 1;
/// The block size the server prefers: a page, so that no write has to
/// read in the rest of one first.
pub const PREFERRED_BLOCK: u32 = 4096;
/// The largest read or write.
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// What the server offers under one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
    pub size: u64,
    pub read_only: bool,
    /// Holes can be punched (TRIM frees space, WRITE_ZEROES may).
    pub can_trim: bool,
}

impl ExportInfo {
    /// The smallest block this export takes requests in (a power of two,
    /// at most [`PREFERRED_BLOCK`]): what `NBD_INFO_BLOCK_SIZE` announces,
    /// and what binds a client that asked for block sizes. Every export is
    /// served through the page cache today, so any byte will do.
    pub fn min_block(&self) -> u32 {
        PAGE_CACHE_MIN_BLOCK
    }

    /// The transmission flags the client is told.
    pub fn transmission_flags(&self) -> u16 {
        let mut f = tflags::HAS_FLAGS
            | tflags::SEND_FLUSH
            | tflags::SEND_FUA
            | tflags::SEND_DF
            | tflags::CAN_MULTI_CONN
            | tflags::SEND_CACHE;
        if self.read_only {
            f |= tflags::READ_ONLY;
        } else {
            f |= tflags::SEND_WRITE_ZEROES | tflags::SEND_FAST_ZERO;
            if self.can_trim {
                f |= tflags::SEND_TRIM;
            }
        }
        f
    }
}

impl AsRef<ExportInfo> for ExportInfo {
    fn as_ref(&self) -> &ExportInfo {
        self
    }
}

/// The export a client's name means, as an index into `exports`: the
/// empty name is the default export, the first one. The one lookup for
/// every way a client names an export (the NBD handshake, the fabric's
/// open).
pub fn find_export<E: AsRef<ExportInfo>>(exports: &[E], name: &[u8]) -> Option<usize> {
    if name.is_empty() {
        return (!exports.is_empty()).then_some(0);
    }
    exports
        .iter()
        .position(|e| e.as_ref().name.as_bytes() == name)
}

/// What the handshake settled for the transmission phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Index into the export list.
    pub export: usize,
    pub structured: bool,
    /// `base:allocation` was selected (its id is [`ALLOCATION_CONTEXT`]).
    pub allocation: bool,
    /// The alignment the client promised: the export's minimum block size
    /// when it asked for block sizes, 1 when it did not.
    pub min_block: u32,
}

/// What the server offers of TLS (`rblock serve --tls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tls {
    /// STARTTLS is refused as not offered.
    #[default]
    Off,
    /// Clients may start TLS, or go on without it.
    On,
    /// Until a client has started TLS, every option but STARTTLS and
    /// ABORT is answered `NBD_REP_ERR_TLS_REQD`, and nothing is served.
    Require,
}

/// How the handshake ended, or paused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Transmission(Negotiated),
    /// STARTTLS was accepted (its ACK is queued): send it, run the TLS
    /// handshake, call [`Handshake::tls_started`] and go on with the bytes
    /// that arrive under TLS. Nothing the client sent after STARTTLS may
    /// be left over (it must wait for the ACK).
    StartTls,
    /// The client aborted or the server must hang up; send what is queued,
    /// then close.
    Close,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandshakeError {
    #[error("the client sent unknown flags {0:#x}")]
    ClientFlags(u32),
    #[error("bad option magic {0:#x}")]
    OptionMagic(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    ClientFlags,
    Options,
    /// Discarding the rest of an oversized option.
    Skipping(u64),
    Ended,
}

/// The server's side of one handshake.
#[derive(Debug)]
pub struct Handshake {
    exports: Vec<ExportInfo>,
    state: State,
    out: Vec<u8>,
    no_zeroes: bool,
    structured: bool,
    /// The export the last SET_META_CONTEXT was for, and whether it
    /// selected `base:allocation`.
    meta: Option<(String, bool)>,
    tls: Tls,
    in_tls: bool,
}

impl Handshake {
    /// Starts a handshake without TLS; the greeting is queued already.
    pub fn new(exports: Vec<ExportInfo>) -> Handshake {
        Handshake::with_tls(exports, Tls::Off)
    }

    /// Starts a handshake offering `tls`.
    pub fn with_tls(exports: Vec<ExportInfo>, tls: Tls) -> Handshake {
        let mut out = Vec::with_capacity(18);
        out.extend_from_slice(&NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(
            &(handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES).to_be_bytes(),
        );
        Handshake {
            exports,
            state: State::ClientFlags,
            out,
            no_zeroes: false,
            structured: false,
            meta: None,
            tls,
            in_tls: false,
        }
    }

    /// The TLS handshake after [`Outcome::StartTls`] succeeded: options go
    /// on under TLS, and what was negotiated before is forgotten (the
    /// spec's rule: nothing said in clear may carry over).
    pub fn tls_started(&mut self) {
        self.in_tls = true;
        self.structured = false;
        self.meta = None;
    }

    /// Whether the client must still start TLS before anything is served.
    fn tls_required(&self) -> bool {
        self.tls == Tls::Require && !self.in_tls
    }

    /// Bytes to send to the client now.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Takes what it can of `input`: returns how many bytes it consumed and,
    /// once the handshake is over, how it ended. Call again with the rest
    /// (plus whatever arrives) while it consumes something.
    pub fn advance(&mut self, input: &[u8]) -> Result<(usize, Option<Outcome>), HandshakeError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.state {
                State::Ended => return Ok((used, None)),
                State::ClientFlags => {
                    let Some(b) = rest.get(..4) else {
                        return Ok((used, None));
                    };
                    let flags = u32::from_be_bytes(b.try_into().expect("4 bytes"));
                    used += 4;
                    // Unknown flags end the session (the spec's rule); a client
                    // without the fixed-newstyle flag is served the same way
                    // (the spec allows it).
                    if flags & !client_flags::KNOWN != 0 {
                        return Err(HandshakeError::ClientFlags(flags));
                    }
                    self.no_zeroes = flags & client_flags::NO_ZEROES != 0;
                    self.state = State::Options;
                }
                State::Skipping(left) => {
                    let n = (rest.len() as u64).min(left);
                    used += n as usize;
                    if n == left {
                        self.state = State::Options;
                    } else {
                        self.state = State::Skipping(left - n);
                        return Ok((used, None));
                    }
                }
                State::Options => {
                    let Some(head) = rest.get(..16) else {
                        return Ok((used, None));
                    };
                    let magic = u64::from_be_bytes(head[..8].try_into().expect("8 bytes"));
                    if magic != IHAVEOPT {
                        return Err(HandshakeError::OptionMagic(magic));
                    }
                    let option = u32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
                    let len = u32::from_be_bytes(head[12..16].try_into().expect("4 bytes"));
                    if len > MAX_OPTION {
                        used += 16;
                        self.reply(option, rep::ERR_TOO_BIG, b"option too long");
                        self.state = State::Skipping(u64::from(len));
                        continue;
                    }
                    let Some(data) = rest.get(16..16 + len as usize) else {
                        return Ok((used, None));
                    };
                    used += 16 + len as usize;
                    if let Some(outcome) = self.option(option, data) {
                        if outcome != Outcome::StartTls {
                            self.state = State::Ended;
                        }
                        return Ok((used, Some(outcome)));
                    }
                }
            }
        }
    }

    fn reply(&mut self, option: u32, kind: u32, data: &[u8]) {
        self.out.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
        self.out.extend_from_slice(&option.to_be_bytes());
        self.out.extend_from_slice(&kind.to_be_bytes());
        self.out
            .extend_from_slice(&(data.len() as u32).to_be_bytes());
        self.out.extend_from_slice(data);
    }

    /// The export a client's name means (see [`find_export`]).
    fn find(&self, name: &[u8]) -> Option<usize> {
        find_export(&self.exports, name)
    }

    fn option(&mut self, option: u32, data: &[u8]) -> Option<Outcome> {
        if self.tls_required() && option != opt::STARTTLS && option != opt::ABORT {
            if option == opt::EXPORT_NAME {
                // No error reply exists for it: the spec's answer is to
                // hang up.
                return Some(Outcome::Close);
            }
            self.reply(
                option,
                rep::ERR_TLS_REQD,
                b"this server requires TLS: STARTTLS first",
            );
            return None;
        }
        match option {
            opt::EXPORT_NAME => {
                let Some(i) = self.find(data) else {
                    // No way to say why: the spec's answer is to hang up.
                    return Some(Outcome::Close);
                };
                let e = &self.exports[i];
                let mut reply = Vec::with_capacity(134);
                reply.extend_from_slice(&e.size.to_be_bytes());
                reply.extend_from_slice(&e.transmission_flags().to_be_bytes());
                if !self.no_zeroes {
                    reply.extend_from_slice(&[0; 124]);
                }
                self.out.extend_from_slice(&reply);
                Some(Outcome::Transmission(self.negotiated(i, false)))
            }
            opt::ABORT => {
                self.reply(option, rep::ACK, &[]);
                Some(Outcome::Close)
            }
            opt::LIST => {
                if !data.is_empty() {
                    self.reply(option, rep::ERR_INVALID, b"LIST takes no data");
                    return None;
                }
                let servers: Vec<Vec<u8>> = self
                    .exports
                    .iter()
                    .map(|e| {
                        let mut d = (e.name.len() as u32).to_be_bytes().to_vec();
                        d.extend_from_slice(e.name.as_bytes());
                        d.extend_from_slice(e.description.as_bytes());
                        d
                    })
                    .collect();
                for d in servers {
                    self.reply(option, rep::SERVER, &d);
                }
                self.reply(option, rep::ACK, &[]);
                None
            }
            opt::INFO | opt::GO => self.info_or_go(option, data),
            opt::STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.reply(option, rep::ERR_INVALID, b"STRUCTURED_REPLY takes no data");
                } else if self.structured {
                    self.reply(option, rep::ERR_INVALID, b"structured replies already on");
                } else {
                    self.structured = true;
                    self.reply(option, rep::ACK, &[]);
                }
                None
            }
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                self.meta_context(option, data);
                None
            }
            opt::STARTTLS if self.tls == Tls::Off => {
                self.reply(option, rep::ERR_UNSUP, b"TLS is not offered");
                None
            }
            opt::STARTTLS if self.in_tls => {
                self.reply(option, rep::ERR_INVALID, b"TLS is already on");
                None
            }
            opt::STARTTLS if !data.is_empty() => {
                self.reply(option, rep::ERR_INVALID, b"STARTTLS takes no data");
                None
            }
            opt::STARTTLS => {
                self.reply(option, rep::ACK, &[]);
                Some(Outcome::StartTls)
            }
            _ => {
                self.reply(option, rep::ERR_UNSUP, b"unknown option");
                None
            }
        }
    }

    fn negotiated(&self, export: usize, block_sizes: bool) -> Negotiated {
        let name = &self.exports[export].name;
        let allocation = self.structured
            && self.meta.as_ref().is_some_and(|(n, on)| {
                *on && (n == name || self.find(n.as_bytes()) == Some(export))
            });
        Negotiated {
            export,
            structured: self.structured,
            allocation,
            min_block: if block_sizes {
                self.exports[export].min_block()
            } else {
                1
            },
        }
    }

    fn info_or_go(&mut self, option: u32, data: &[u8]) -> Option<Outcome> {
        let mut r = Reader(data);
        let parsed = (|| {
            let name = r.string()?;
            let n = r.u16()?;
            let mut wanted = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                wanted.push(r.u16()?);
            }
            r.end()?;
            Some((name, wanted))
        })();
        let Some((name, wanted)) = parsed else {
            self.reply(option, rep::ERR_INVALID, b"malformed request");
            return None;
        };
        let Some(i) = self.find(name) else {
            let text = format!("no export named {:?}", String::from_utf8_lossy(name));
            self.reply(option, rep::ERR_UNKNOWN, text.as_bytes());
            return None;
        };
        let e = self.exports[i].clone();
        let mut export = info::EXPORT.to_be_bytes().to_vec();
        export.extend_from_slice(&e.size.to_be_bytes());
        export.extend_from_slice(&e.transmission_flags().to_be_bytes());
        self.reply(option, rep::INFO, &export);
        if wanted.contains(&info::NAME) {
            let mut d = info::NAME.to_be_bytes().to_vec();
            d.extend_from_slice(e.name.as_bytes());
            self.reply(option, rep::INFO, &d);
        }
        if wanted.contains(&info::DESCRIPTION) && !e.description.is_empty() {
            let mut d = info::DESCRIPTION.to_be_bytes().to_vec();
            d.extend_from_slice(e.description.as_bytes());
            self.reply(option, rep::INFO, &d);
        }
        // Block sizes are always told; they bind only a client that asked.
        let mut d = info::BLOCK_SIZE.to_be_bytes().to_vec();
        let min = e.min_block();
        for v in [min, PREFERRED_BLOCK.max(min), MAX_PAYLOAD] {
            d.extend_from_slice(&v.to_be_bytes());
        }
        self.reply(option, rep::INFO, &d);
        self.reply(option, rep::ACK, &[]);
        (option == opt::GO)
            .then(|| Outcome::Transmission(self.negotiated(i, wanted.contains(&info::BLOCK_SIZE))))
    }

    fn meta_context(&mut self, option: u32, data: &[u8]) {
        let mut r = Reader(data);
        let parsed = (|| {
            let name = r.string()?;
            let n = r.u32()?;
            let mut queries = Vec::new();
            for _ in 0..n {
                queries.push(r.string()?);
            }
            r.end()?;
            Some((name, queries))
        })();
        let Some((name, queries)) = parsed else {
            if option == opt::SET_META_CONTEXT {
                self.meta = None;
            }
            self.reply(option, rep::ERR_INVALID, b"malformed request");
            return;
        };
        let set = option == opt::SET_META_CONTEXT;
        if set {
            // A SET replaces the selection, even one that fails.
            self.meta = None;
        }
        if set && !self.structured {
            self.reply(option, rep::ERR_INVALID, b"structured replies first");
            return;
        }
        if self.find(name).is_none() {
            let text = format!("no export named {:?}", String::from_utf8_lossy(name));
            self.reply(option, rep::ERR_UNKNOWN, text.as_bytes());
            return;
        }
        let matches = |q: &[u8]| q == BASE_ALLOCATION.as_bytes() || (!set && q == b"base:");
        let selected = if queries.is_empty() {
            // LIST with no query lists everything; SET with none selects none.
            !set
        } else {
            queries.iter().any(|q| matches(q))
        };
        if selected {
            // Ids in a LIST are placeholders (zero); a SET assigns the real one.
            let id = if set { ALLOCATION_CONTEXT } else { 0 };
            let mut d = id.to_be_bytes().to_vec();
            d.extend_from_slice(BASE_ALLOCATION.as_bytes());
            self.reply(option, rep::META_CONTEXT, &d);
        }
        if set {
            self.meta = Some((String::from_utf8_lossy(name).into_owned(), selected));
        }
        self.reply(option, rep::ACK, &[]);
    }
}

/// Reads an option's fields; `None` when they do not add up.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    /// A u32 length and that many bytes, at most 4096 (the spec's limit).
    fn string(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > 4096 {
            return None;
        }
        self.take(n)
    }
    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

#[cfg(test)]
mod tests;
