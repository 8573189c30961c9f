//! TLS for NBD's STARTTLS, server side, through the system's GnuTLS
//! loaded at run time (feature `tls`).
//!
//! Why GnuTLS, and why loaded rather than linked:
//! * It is what every NBD client here speaks TLS with (libnbd, qemu,
//!   nbdkit, nbd-client), with both credentials NBD uses: X.509
//!   certificates and pre-shared keys in psktool's `username:hexkey` file.
//!   rustls has no external PSK (rustls issue 174, open since 2018).
//! * `libgnutls.so.30` is the same soname on RHEL 8, 9 and 10 (GnuTLS 3.6
//!   to 3.8) and part of every install, so one binary serves them all,
//!   honouring the system's crypto policy and, on a FIPS host, its
//!   validated module. (OpenSSL changed its soname between RHEL 8 and 9.)
//! * Loaded with `dlopen`, as rdma-core is: a node without it still runs
//!   rblock, and `--tls` says why it cannot.
//!
//! [`TlsServer`] holds the credentials; [`TlsServer::accept`] runs the
//! handshake on a connected socket and gives the session's two halves,
//! [`TlsReader`] (`AsyncRead`) and [`TlsWriter`] (`AsyncWrite`), over the
//! socket made non-blocking and watched by the runtime. [`into_blocking`]
//! takes both off the runtime for threads that block on the socket
//! ([`BlockingTlsReader`] is `Read`, [`BlockingTlsWriter`] `Write`), and
//! [`into_async`] puts them back (rblock moves a connection between its
//! threads and the runtime as its pace changes).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use thiserror::Error;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const GNUTLS_SERVER: c_uint = 1;
const GNUTLS_NONBLOCK: c_uint = 1 << 3;
const GNUTLS_NO_SIGNAL: c_uint = 1 << 6;
const GNUTLS_CRD_CERTIFICATE: c_int = 1;
const GNUTLS_CRD_PSK: c_int = 4;
const GNUTLS_X509_FMT_PEM: c_int = 1;
const GNUTLS_SHUT_WR: c_int = 1;
const GNUTLS_E_AGAIN: isize = -28;
const GNUTLS_E_INTERRUPTED: isize = -52;
const GNUTLS_E_PREMATURE_TERMINATION: isize = -110;
/// Handshake time limit, in milliseconds.
const HANDSHAKE_MS: c_uint = 30_000;

type Session = *mut c_void;
type Cred = *mut c_void;

/// The GnuTLS calls used, looked up once.
struct Lib {
    init: unsafe extern "C" fn(*mut Session, c_uint) -> c_int,
    deinit: unsafe extern "C" fn(Session),
    set_default_priority: unsafe extern "C" fn(Session) -> c_int,
    set_default_priority_append:
        unsafe extern "C" fn(Session, *const c_char, *mut *const c_char, c_uint) -> c_int,
    credentials_set: unsafe extern "C" fn(Session, c_int, Cred) -> c_int,
    transport_set_int2: unsafe extern "C" fn(Session, c_int, c_int),
    handshake_set_timeout: unsafe extern "C" fn(Session, c_uint),
    handshake: unsafe extern "C" fn(Session) -> c_int,
    record_get_direction: unsafe extern "C" fn(Session) -> c_int,
    record_recv: unsafe extern "C" fn(Session, *mut c_void, usize) -> isize,
    record_send: unsafe extern "C" fn(Session, *const c_void, usize) -> isize,
    bye: unsafe extern "C" fn(Session, c_int) -> c_int,
    strerror: unsafe extern "C" fn(c_int) -> *const c_char,
    certificate_allocate_credentials: unsafe extern "C" fn(*mut Cred) -> c_int,
    certificate_free_credentials: unsafe extern "C" fn(Cred),
    certificate_set_x509_key_file:
        unsafe extern "C" fn(Cred, *const c_char, *const c_char, c_int) -> c_int,
    psk_allocate_server_credentials: unsafe extern "C" fn(*mut Cred) -> c_int,
    psk_free_server_credentials: unsafe extern "C" fn(Cred),
    psk_set_server_credentials_file: unsafe extern "C" fn(Cred, *const c_char) -> c_int,
}

/// Looks up `name` in `handle` as a function of type `T`.
///
/// # Safety
/// `T` must be the C function pointer type of that symbol.
unsafe fn symbol<T: Copy>(handle: *mut c_void, name: &str) -> Result<T, TlsError> {
    let c = CString::new(name).expect("symbol names have no NUL");
    // SAFETY: `handle` came from dlopen and is never closed.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if p.is_null() {
        return Err(TlsError::Unavailable(format!(
            "libgnutls.so.30 has no {name} (GnuTLS 3.6.3 or newer is needed)"
        )));
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: a function pointer is pointer-sized (checked), and the
    // caller names the symbol's C type.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

impl Lib {
    fn load() -> Result<Lib, TlsError> {
        let name = CString::new("libgnutls.so.30").expect("no NUL");
        // SAFETY: a plain dlopen of a system library; never closed, so the
        // symbols stay valid for the life of the process.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(TlsError::Unavailable(
                "libgnutls.so.30 could not be loaded (install gnutls)".into(),
            ));
        }
        // SAFETY: each type below is the symbol's prototype in gnutls.h.
        unsafe {
            Ok(Lib {
                init: symbol(h, "gnutls_init")?,
                deinit: symbol(h, "gnutls_deinit")?,
                set_default_priority: symbol(h, "gnutls_set_default_priority")?,
                set_default_priority_append: symbol(h, "gnutls_set_default_priority_append")?,
                credentials_set: symbol(h, "gnutls_credentials_set")?,
                transport_set_int2: symbol(h, "gnutls_transport_set_int2")?,
                handshake_set_timeout: symbol(h, "gnutls_handshake_set_timeout")?,
                handshake: symbol(h, "gnutls_handshake")?,
                record_get_direction: symbol(h, "gnutls_record_get_direction")?,
                record_recv: symbol(h, "gnutls_record_recv")?,
                record_send: symbol(h, "gnutls_record_send")?,
                bye: symbol(h, "gnutls_bye")?,
                strerror: symbol(h, "gnutls_strerror")?,
                certificate_allocate_credentials: symbol(
                    h,
                    "gnutls_certificate_allocate_credentials",
                )?,
                certificate_free_credentials: symbol(h, "gnutls_certificate_free_credentials")?,
                certificate_set_x509_key_file: symbol(h, "gnutls_certificate_set_x509_key_file")?,
                psk_allocate_server_credentials: symbol(
                    h,
                    "gnutls_psk_allocate_server_credentials",
                )?,
                psk_free_server_credentials: symbol(h, "gnutls_psk_free_server_credentials")?,
                psk_set_server_credentials_file: symbol(
                    h,
                    "gnutls_psk_set_server_credentials_file",
                )?,
            })
        }
    }

    fn get() -> Result<&'static Lib, TlsError> {
        static LIB: OnceLock<Result<Lib, TlsError>> = OnceLock::new();
        LIB.get_or_init(Lib::load).as_ref().map_err(Clone::clone)
    }

    fn error(&self, code: isize) -> String {
        // SAFETY: gnutls_strerror takes any code and returns a static
        // string (or NULL for none).
        let p = unsafe { (self.strerror)(code as c_int) };
        if p.is_null() {
            return format!("GnuTLS error {code}");
        }
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[derive(Debug, Error, Clone)]
pub enum TlsError {
    #[error("TLS is not available: {0}")]
    Unavailable(String),
    #[error("{what}: {why}")]
    Credentials { what: String, why: String },
    #[error("TLS handshake failed: {0}")]
    Handshake(String),
}

/// What the server proves itself with, and what clients prove.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// `server-cert.pem` and `server-key.pem` in a directory (the layout
    /// nbdkit and qemu use; `ca-cert.pem` there is for clients).
    X509 { dir: std::path::PathBuf },
    /// psktool's file of `username:hexkey` lines: a client must know one.
    Psk { file: std::path::PathBuf },
}

/// Loaded credentials, shared by every connection.
pub struct TlsServer {
    lib: &'static Lib,
    /// `GNUTLS_CRD_CERTIFICATE` or `GNUTLS_CRD_PSK`.
    kind: c_int,
    cred: Cred,
}

impl TlsServer {
    /// Pre-shared keys, not certificates.
    fn psk(&self) -> bool {
        self.kind == GNUTLS_CRD_PSK
    }
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer")
            .field("psk", &self.psk())
            .finish_non_exhaustive()
    }
}

// SAFETY: GnuTLS credentials are read-only once loaded and documented as
// shareable between sessions on any thread.
unsafe impl Send for TlsServer {}
// SAFETY: as above.
unsafe impl Sync for TlsServer {}

fn c_path(p: &Path) -> Result<CString, TlsError> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| TlsError::Credentials {
        what: p.display().to_string(),
        why: "a path with a NUL byte".into(),
    })
}

impl TlsServer {
    /// Loads `creds` (the files are read now: a bad one is an error at
    /// start, not at the first client).
    pub fn new(creds: &Credentials) -> Result<Arc<TlsServer>, TlsError> {
        let lib = Lib::get()?;
        let mut cred: Cred = std::ptr::null_mut();
        let fail = |what: &Path, code: c_int| TlsError::Credentials {
            what: what.display().to_string(),
            why: lib.error(code as isize),
        };
        match creds {
            Credentials::X509 { dir } => {
                let (cert, key) = (dir.join("server-cert.pem"), dir.join("server-key.pem"));
                // SAFETY: an out-pointer for a fresh credentials object.
                let r = unsafe { (lib.certificate_allocate_credentials)(&mut cred) };
                if r < 0 {
                    return Err(fail(dir, r));
                }
                let server = TlsServer {
                    lib,
                    kind: GNUTLS_CRD_CERTIFICATE,
                    cred,
                };
                let (c, k) = (c_path(&cert)?, c_path(&key)?);
                // SAFETY: a live credentials object, NUL-terminated paths.
                let r = unsafe {
                    (lib.certificate_set_x509_key_file)(
                        cred,
                        c.as_ptr(),
                        k.as_ptr(),
                        GNUTLS_X509_FMT_PEM,
                    )
                };
                if r < 0 {
                    return Err(fail(&cert, r));
                }
                Ok(Arc::new(server))
            }
            Credentials::Psk { file } => {
                // SAFETY: an out-pointer for a fresh credentials object.
                let r = unsafe { (lib.psk_allocate_server_credentials)(&mut cred) };
                if r < 0 {
                    return Err(fail(file, r));
                }
                let server = TlsServer {
                    lib,
                    kind: GNUTLS_CRD_PSK,
                    cred,
                };
                // GnuTLS reads the file at each handshake: check now that
                // it is there and readable.
                std::fs::read(file).map_err(|e| TlsError::Credentials {
                    what: file.display().to_string(),
                    why: e.to_string(),
                })?;
                let f = c_path(file)?;
                // SAFETY: a live credentials object, a NUL-terminated path.
                let r = unsafe { (lib.psk_set_server_credentials_file)(cred, f.as_ptr()) };
                if r < 0 {
                    return Err(fail(file, r));
                }
                Ok(Arc::new(server))
            }
        }
    }

    /// Runs the server's handshake on `io` (a connected socket; it is made
    /// non-blocking). The client must not have sent anything after its
    /// STARTTLS but its hello.
    pub async fn accept(self: &Arc<Self>, io: OwnedFd) -> Result<(TlsReader, TlsWriter), TlsError> {
        let live = self.session(io)?;
        live.handshake().await?;
        let live = Arc::new(live);
        let writer = TlsWriter {
            live: Arc::clone(&live),
            shut: false,
        };
        Ok((TlsReader(live), writer))
    }

    /// A server session over `io`, set up for the handshake.
    fn session(self: &Arc<Self>, io: OwnedFd) -> Result<Live, TlsError> {
        let lib = self.lib;
        set_nonblocking(io.as_raw_fd()).map_err(|e| TlsError::Handshake(e.to_string()))?;
        let fd = io.as_raw_fd();
        // SAFETY: the descriptor is owned (moved in), so nothing else
        // closes it while it is registered.
        let io =
            unsafe { AsyncFd::register(io) }.map_err(|e| TlsError::Handshake(e.to_string()))?;
        let mut session: Session = std::ptr::null_mut();
        let flags = GNUTLS_SERVER | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL;
        // SAFETY: an out-pointer for a fresh session.
        let r = unsafe { (lib.init)(&mut session, flags) };
        if r < 0 {
            return Err(TlsError::Handshake(lib.error(r as isize)));
        }
        // Owned from here on: deinit on every way out.
        let live = Live {
            tls: Owned {
                server: Arc::clone(self),
                session,
            },
            io,
        };
        // The system's priorities (RHEL's crypto policy), plus the PSK key
        // exchanges when the credentials are keys.
        let psk = CString::new("+ECDHE-PSK:+DHE-PSK:+PSK").expect("no NUL");
        let mut err_pos: *const c_char = std::ptr::null();
        // SAFETY: a live session; the strings live through the calls; the
        // credentials outlive the session (it holds an Arc to them).
        unsafe {
            let r = if self.psk() {
                (lib.set_default_priority_append)(session, psk.as_ptr(), &mut err_pos, 0)
            } else {
                (lib.set_default_priority)(session)
            };
            if r < 0 {
                return Err(TlsError::Handshake(lib.error(r as isize)));
            }
            let r = (lib.credentials_set)(session, self.kind, self.cred);
            if r < 0 {
                return Err(TlsError::Handshake(lib.error(r as isize)));
            }
            (lib.transport_set_int2)(session, fd, fd);
            (lib.handshake_set_timeout)(session, HANDSHAKE_MS);
        }
        Ok(live)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        // SAFETY: every session holds an Arc to this, so none is left.
        unsafe {
            if self.psk() {
                (self.lib.psk_free_server_credentials)(self.cred)
            } else {
                (self.lib.certificate_free_credentials)(self.cred)
            }
        }
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    set_blocking_mode(fd, false)
}

/// Makes `fd` blocking (`true`) or non-blocking.
fn set_blocking_mode(fd: RawFd, blocking: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if blocking {
        flags & !libc::O_NONBLOCK
    } else {
        flags | libc::O_NONBLOCK
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A GnuTLS session, ended (`gnutls_deinit`) when dropped, with the
/// credentials it uses kept alive as long.
struct Owned {
    server: Arc<TlsServer>,
    session: Session,
}

// SAFETY: a GnuTLS session may move between threads, and GnuTLS allows
// one thread to send while another receives on it (its manual, "Thread
// safety"); the halves that share one keep to that: only a reader calls
// `record_recv`, only a writer `record_send` and `bye`, and each half is
// used by one caller at a time (`&mut self`).
unsafe impl Send for Owned {}
// SAFETY: as above.
unsafe impl Sync for Owned {}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the session is ours and used no more (the last half is
        // gone).
        unsafe { (self.server.lib.deinit)(self.session) };
    }
}

impl Owned {
    fn io_error(&self, r: isize) -> io::Error {
        io::Error::other(format!("TLS: {}", self.server.lib.error(r)))
    }
}

/// A live session and its socket, shared by the halves of a split stream.
struct Live {
    tls: Owned,
    io: AsyncFd<OwnedFd>,
}

fn again(r: isize) -> bool {
    r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED
}

/// After a call that would block: waits for the socket's write or read
/// readiness. A readiness that turns out stale is cleared and the call
/// tried again (`Ready(Ok(()))`); `Pending` once the runtime watches the
/// socket for the next event.
fn wait(io: &AsyncFd<OwnedFd>, cx: &mut Context<'_>, write: bool) -> Poll<io::Result<()>> {
    let guard = if write {
        ready!(io.poll_write_ready(cx))
    } else {
        ready!(io.poll_read_ready(cx))
    };
    guard?.clear_ready();
    Poll::Ready(Ok(()))
}

impl Live {
    fn io_error(&self, r: isize) -> io::Error {
        self.tls.io_error(r)
    }

    async fn handshake(&self) -> Result<(), TlsError> {
        let lib = self.tls.server.lib;
        loop {
            // SAFETY: a live session, not yet shared.
            let r = unsafe { (lib.handshake)(self.tls.session) } as isize;
            if r >= 0 {
                return Ok(());
            }
            if !again(r) {
                return Err(TlsError::Handshake(lib.error(r)));
            }
            // SAFETY: as above.
            let writing = unsafe { (lib.record_get_direction)(self.tls.session) } == 1;
            let ready = if writing {
                self.io.writable().await
            } else {
                self.io.readable().await
            };
            ready
                .map_err(|e| TlsError::Handshake(e.to_string()))?
                .clear_ready();
        }
    }

    /// The receiving side (one caller at a time).
    fn recv(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let lib = self.tls.server.lib;
        loop {
            // Tried first: GnuTLS may hold records read from the socket
            // already, which no readiness would announce.
            // The room is not zeroed first: GnuTLS only writes it, and
            // zeroing it cost more than the copy (a 256 KiB payload read a
            // 16 KiB record at a time had all of its unfilled rest zeroed
            // again for every record: 6% of a TLS server's CPU).
            // SAFETY: the room is only written through, never read, and
            // the bytes `record_recv` says it wrote are marked as
            // initialised below, no more.
            let room = unsafe { buf.unfilled_mut() };
            // SAFETY: a live session, received on by this caller only;
            // `room` is writable for its length.
            let r = unsafe {
                (lib.record_recv)(self.tls.session, room.as_mut_ptr().cast(), room.len())
            };
            if r >= 0 {
                let n = (r as usize).min(room.len());
                // SAFETY: GnuTLS wrote these `n` bytes (it never says more
                // than the room it was given).
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            if r == GNUTLS_E_PREMATURE_TERMINATION {
                // The peer closed without a close_notify: an end all the same.
                return Poll::Ready(Ok(()));
            }
            if !again(r) {
                return Poll::Ready(Err(self.io_error(r)));
            }
            ready!(wait(&self.io, cx, false))?;
        }
    }

    /// The sending side (one caller at a time).
    fn send(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let lib = self.tls.server.lib;
        loop {
            // SAFETY: a live session, sent on by this caller only; `data`
            // is readable for its length. (After E_AGAIN GnuTLS wants the
            // same data again, which is what a caller polling again passes.)
            let r =
                unsafe { (lib.record_send)(self.tls.session, data.as_ptr().cast(), data.len()) };
            if r >= 0 {
                return Poll::Ready(Ok(r as usize));
            }
            if !again(r) {
                return Poll::Ready(Err(self.io_error(r)));
            }
            ready!(wait(&self.io, cx, true))?;
        }
    }

    /// Says goodbye (close_notify), then shuts the socket's sending side.
    fn bye(&self, cx: &mut Context<'_>, shut: &mut bool) -> Poll<io::Result<()>> {
        let lib = self.tls.server.lib;
        while !*shut {
            // SAFETY: a live session, sent on by this caller only.
            let r = unsafe { (lib.bye)(self.tls.session, GNUTLS_SHUT_WR) } as isize;
            if r >= 0 {
                *shut = true;
                // SAFETY: shutting down the write side of our own socket.
                unsafe { libc::shutdown(self.io.get_ref().as_raw_fd(), libc::SHUT_WR) };
            } else if again(r) {
                ready!(wait(&self.io, cx, true))?;
            } else {
                return Poll::Ready(Err(self.io_error(r)));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// The receiving half of a TLS session over a socket (the NBD connection
/// after STARTTLS). It runs at once with the sending half, without a lock
/// between them (GnuTLS allows one thread to send while another
/// receives); `tokio::io::join` makes one stream of the two where one is
/// wanted.
pub struct TlsReader(Arc<Live>);

/// The sending half of a TLS session.
pub struct TlsWriter {
    live: Arc<Live>,
    shut: bool,
}

impl std::fmt::Debug for TlsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsReader").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for TlsWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsWriter").finish_non_exhaustive()
    }
}

impl TlsWriter {
    /// The socket under the session.
    pub fn get_ref(&self) -> &OwnedFd {
        self.live.io.get_ref()
    }
}

impl AsyncRead for TlsReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.recv(cx, buf)
    }
}

impl AsyncWrite for TlsWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.live.send(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Every record is handed to the socket as it is sent.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.live.bye(cx, &mut this.shut)
    }
}

/// The most plaintext one TLS record carries.
const RECORD: usize = 16 * 1024;

/// A session taken off the runtime, its socket blocking, shared by the
/// two blocking halves.
struct Held {
    // (Dropped first: the session ends before its socket closes.)
    tls: Owned,
    fd: OwnedFd,
}

/// The receiving half of a session on a blocking socket (`Read`), for a
/// thread that waits in the call, as rblock's connection threads do. A
/// receive timeout on the socket (`SO_RCVTIMEO`) comes back as
/// `WouldBlock`, and the next call goes on where this one stopped.
pub struct BlockingTlsReader(Arc<Held>);

/// The sending half of a session on a blocking socket (`Write`).
pub struct BlockingTlsWriter {
    held: Arc<Held>,
    /// Where small pieces are gathered into one record.
    record: Vec<u8>,
    shut: bool,
}

impl std::fmt::Debug for BlockingTlsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingTlsReader").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for BlockingTlsWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingTlsWriter").finish_non_exhaustive()
    }
}

/// Takes the two halves of one session off the runtime: the socket is
/// made blocking and no longer watched, and the halves become `Read` and
/// `Write` for threads that block on it. Refused for halves of two
/// sessions, or a session already said goodbye to.
pub fn into_blocking(
    reader: TlsReader,
    writer: TlsWriter,
) -> io::Result<(BlockingTlsReader, BlockingTlsWriter)> {
    let TlsWriter { live, shut } = writer;
    let Live { tls, io } = rejoin(reader.0, live, shut)?;
    let fd = io.into_inner();
    set_blocking_mode(fd.as_raw_fd(), true)?;
    let held = Arc::new(Held { tls, fd });
    let writer = BlockingTlsWriter {
        held: Arc::clone(&held),
        record: Vec::new(),
        shut: false,
    };
    Ok((BlockingTlsReader(held), writer))
}

/// The session a reader and a writer share, taken back from them (`shut`:
/// the writer said goodbye). Refused for a session said goodbye to, the
/// halves of two sessions, or one with a half still in use elsewhere.
fn rejoin<T>(reader: Arc<T>, writer: Arc<T>, shut: bool) -> io::Result<T> {
    if shut {
        return Err(io::Error::other("TLS: the session is closed"));
    }
    if !Arc::ptr_eq(&reader, &writer) {
        return Err(io::Error::other("TLS: the halves of two sessions"));
    }
    drop(reader);
    Arc::try_unwrap(writer)
        .map_err(|_| io::Error::other("TLS: the session is still in use elsewhere"))
}

/// Puts the two blocking halves of one session back on the runtime (the
/// way back from [`into_blocking`]): the socket is made non-blocking and
/// watched again, and records GnuTLS holds already are read first, as
/// ever. Refused for halves of two sessions, a session said goodbye to,
/// or one with a half still in use elsewhere.
pub fn into_async(
    reader: BlockingTlsReader,
    writer: BlockingTlsWriter,
) -> io::Result<(TlsReader, TlsWriter)> {
    let BlockingTlsWriter { held, shut, .. } = writer;
    let Held { tls, fd } = rejoin(reader.0, held, shut)?;
    set_nonblocking(fd.as_raw_fd())?;
    // SAFETY: the descriptor is owned (moved in), so nothing else closes
    // it while it is registered.
    let io = unsafe { AsyncFd::register(fd) }?;
    let live = Arc::new(Live { tls, io });
    let writer = TlsWriter {
        live: Arc::clone(&live),
        shut: false,
    };
    Ok((TlsReader(live), writer))
}

impl io::Read for BlockingTlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let tls = &self.0.tls;
        // SAFETY: a live session, received on by this half only (`&mut
        // self`); `buf` is writable for its length.
        let r = unsafe {
            (tls.server.lib.record_recv)(tls.session, buf.as_mut_ptr().cast(), buf.len())
        };
        match r {
            r if r >= 0 => Ok((r as usize).min(buf.len())),
            // The peer closed without a close_notify: an end all the same.
            GNUTLS_E_PREMATURE_TERMINATION => Ok(0),
            // The socket's receive timeout (the record, if begun, is
            // kept for the next call).
            GNUTLS_E_AGAIN => Err(io::ErrorKind::WouldBlock.into()),
            GNUTLS_E_INTERRUPTED => Err(io::ErrorKind::Interrupted.into()),
            r => Err(tls.io_error(r)),
        }
    }
}

impl BlockingTlsWriter {
    /// The socket under the session.
    pub fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.held.fd)
    }

    /// Says goodbye (close_notify), then shuts the socket's sending side.
    /// A send timeout on the socket (`SO_SNDTIMEO`) bounds the wait for a
    /// client that reads nothing: `WouldBlock` then.
    pub fn bye(&mut self) -> io::Result<()> {
        let tls = &self.held.tls;
        while !self.shut {
            // SAFETY: a live session, sent on by this half only.
            let r = unsafe { (tls.server.lib.bye)(tls.session, GNUTLS_SHUT_WR) } as isize;
            match r {
                r if r >= 0 => {
                    self.shut = true;
                    // SAFETY: shutting down the write side of our own socket.
                    unsafe { libc::shutdown(self.held.fd.as_raw_fd(), libc::SHUT_WR) };
                }
                GNUTLS_E_INTERRUPTED => {}
                GNUTLS_E_AGAIN => return Err(io::ErrorKind::WouldBlock.into()),
                r => return Err(tls.io_error(r)),
            }
        }
        Ok(())
    }
}

impl io::Write for BlockingTlsWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let tls = &self.held.tls;
        loop {
            // SAFETY: a live session, sent on by this half only (`&mut
            // self`); `data` is readable for its length. (After
            // E_INTERRUPTED GnuTLS wants the same data again: the loop
            // passes it.)
            let r = unsafe {
                (tls.server.lib.record_send)(tls.session, data.as_ptr().cast(), data.len())
            };
            match r {
                r if r >= 0 => return Ok(r as usize),
                GNUTLS_E_INTERRUPTED => {}
                // (Only with a send timeout on the socket.)
                GNUTLS_E_AGAIN => return Err(io::ErrorKind::WouldBlock.into()),
                r => return Err(tls.io_error(r)),
            }
        }
    }

    /// Small pieces (a reply's header, a burst of small replies) are
    /// gathered into full records: each sent alone would be a record of
    /// its own, with its overhead and cipher call, and a packet of its own.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let Some(first) = bufs.iter().find(|b| !b.is_empty()) else {
            return Ok(0);
        };
        if first.len() >= RECORD {
            return self.write(first);
        }
        let mut record = std::mem::take(&mut self.record);
        record.clear();
        for b in bufs {
            let take = (RECORD - record.len()).min(b.len());
            record.extend_from_slice(&b[..take]);
            if record.len() == RECORD {
                break;
            }
        }
        // All of the gathered bytes, or an error: the count says they went.
        let sent = self.write_all(&record).map(|()| record.len());
        self.record = record;
        sent
    }

    fn flush(&mut self) -> io::Result<()> {
        // Every record is handed to the socket as it is sent.
        Ok(())
    }
}
