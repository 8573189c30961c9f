//! A client's NBD socket (TCP or unix), and the two ways data crosses it
//! without being copied into this process: read replies sent straight
//! from the page cache (`sendfile`), and large write data moved from the
//! socket into a pipe (`splice`), from where the storage writes it. Each
//! saves one of the two copies a byte otherwise costs the server.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpStream, UnixStream, tcp, unix};

/// An accepted client connection.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// The receiving and the sending half, each usable on its own.
    pub fn split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
        }
    }
}

/// A connection after STARTTLS: the socket under TLS.
/// (The halves joined into one stream, for the rest of the handshake.)
pub type Tls = tokio::io::Join<rfabric::tls::TlsReader, rfabric::tls::TlsWriter>;

impl Stream {
    /// The socket itself, for a TLS session to take over (it leaves the
    /// runtime's reactor: the session watches it anew).
    pub fn into_fd(self) -> io::Result<OwnedFd> {
        Ok(match self {
            Stream::Tcp(s) => s.into_std()?.into(),
            Stream::Unix(s) => s.into_std()?.into(),
        })
    }
}

impl Stream {
    /// A socket given back to the runtime (the way back from
    /// [`Stream::into_fd`]): made non-blocking and watched again, a TCP
    /// or a unix stream as it is.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Stream> {
        let domain = rustix::net::sockopt::socket_domain(&fd)?;
        rustix::io::ioctl_fionbio(&fd, true)?;
        Ok(if domain == rustix::net::AddressFamily::UNIX {
            Stream::Unix(UnixStream::from_std(std::os::unix::net::UnixStream::from(
                fd,
            ))?)
        } else {
            Stream::Tcp(TcpStream::from_std(std::net::TcpStream::from(fd))?)
        })
    }
}

/// The socket under two halves split from one connection, taken off the
/// runtime (their owned halves put together again); under TLS, the
/// session's halves as they are. Refused for halves of two connections.
pub fn unsplit(rd: ReadHalf, wr: WriteHalf) -> io::Result<Unsplit> {
    let mismatch = || io::Error::other("the halves of two connections");
    Ok(match (rd, wr) {
        (ReadHalf::Tcp(r), WriteHalf::Tcp(w)) => {
            Unsplit::Plain(r.reunite(w).map_err(|_| mismatch())?.into_std()?.into())
        }
        (ReadHalf::Unix(r), WriteHalf::Unix(w)) => {
            Unsplit::Plain(r.reunite(w).map_err(|_| mismatch())?.into_std()?.into())
        }
        (ReadHalf::Tls(r), WriteHalf::Tls(w)) => Unsplit::Tls(r, w),
        _ => return Err(mismatch()),
    })
}

/// What [`unsplit`] gives.
#[derive(Debug)]
pub enum Unsplit {
    Plain(OwnedFd),
    Tls(rfabric::tls::TlsReader, rfabric::tls::TlsWriter),
}

/// Splits a TLS connection into halves usable on their own (without a
/// lock between them: GnuTLS sends and receives on one session at once).
pub fn split_tls(tls: Tls) -> (ReadHalf, WriteHalf) {
    let (r, w) = tls.into_inner();
    (ReadHalf::Tls(r), WriteHalf::Tls(w))
}

/// What the client sends.
#[derive(Debug)]
pub enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
    /// Under TLS: no splicing (the bytes must be decrypted here).
    Tls(rfabric::tls::TlsReader),
}

/// What the client is sent.
#[derive(Debug)]
pub enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
    /// Under TLS: no sendfile.
    Tls(rfabric::tls::TlsWriter),
}

impl ReadHalf {
    /// Moves up to `max` bytes of what the client sends into `pipe` (its
    /// write end), waiting until some are there; 0 when the client has
    /// closed. The pipe must have room (see [`Pipe`]).
    pub async fn splice_into(&self, pipe: &Pipe, max: usize) -> io::Result<usize> {
        let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
        let moved = |sock: BorrowedFd<'_>| {
            Ok(rustix::pipe::splice(
                sock,
                None,
                &pipe.write,
                None,
                max,
                flags,
            )?)
        };
        match self {
            ReadHalf::Tcp(h) => when_ready(h.as_ref(), Interest::READABLE, moved).await,
            ReadHalf::Unix(h) => when_ready(h.as_ref(), Interest::READABLE, moved).await,
            ReadHalf::Tls(_) => Err(io::Error::other("no splicing under TLS")),
        }
    }

    /// Whether bytes can move from the socket without passing through
    /// here (not under TLS).
    pub fn can_splice(&self) -> bool {
        !matches!(self, ReadHalf::Tls(_))
    }
}

impl WriteHalf {
    /// Whether replies can go straight from the page cache (not under
    /// TLS: the bytes must be encrypted here).
    pub fn can_send_file(&self) -> bool {
        !matches!(self, WriteHalf::Tls(..))
    }

    /// Sends `len` bytes of `file` from `offset` straight from the page
    /// cache; fewer only where the file ends first.
    pub async fn send_file(
        &self,
        file: BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> io::Result<usize> {
        let mut sent = 0;
        while sent < len {
            let mut at = offset + sent as u64;
            let send = |sock: BorrowedFd<'_>| {
                Ok(rustix::fs::sendfile(sock, file, Some(&mut at), len - sent)?)
            };
            let n = self.when_writable(send).await?;
            if n == 0 {
                break;
            }
            sent += n;
        }
        Ok(sent)
    }

    /// Sends `bytes` (already flushed replies before them) marked as
    /// having more right behind, so that TCP sends them with what follows
    /// (a read's header with its data) instead of on their own.
    pub async fn send_before_more(&self, bytes: &[u8]) -> io::Result<()> {
        let flags = rustix::net::SendFlags::MORE | rustix::net::SendFlags::NOSIGNAL;
        let mut sent = 0;
        while sent < bytes.len() {
            let send = |sock: BorrowedFd<'_>| Ok(rustix::net::send(sock, &bytes[sent..], flags)?);
            sent += self.when_writable(send).await?;
        }
        Ok(())
    }

    /// Runs `op` on the socket once it can take more (see [`when_ready`]).
    async fn when_writable<R>(
        &self,
        op: impl FnMut(BorrowedFd<'_>) -> io::Result<R>,
    ) -> io::Result<R> {
        match self {
            WriteHalf::Tcp(h) => when_ready(h.as_ref(), Interest::WRITABLE, op).await,
            WriteHalf::Unix(h) => when_ready(h.as_ref(), Interest::WRITABLE, op).await,
            WriteHalf::Tls(..) => Err(io::Error::other("no direct sends under TLS")),
        }
    }

    /// Ends the connection both ways at once: after a reply that could
    /// not be finished, nothing more on it can be trusted.
    pub fn cut(&self) {
        let sock = match self {
            WriteHalf::Tcp(h) => h.as_ref().as_fd(),
            WriteHalf::Unix(h) => h.as_ref().as_fd(),
            WriteHalf::Tls(w) => w.get_ref().as_fd(),
        };
        let _ = rustix::net::shutdown(sock, rustix::net::Shutdown::Both);
    }
}

/// A socket tokio watches, whose readiness a system call of ours uses.
trait Watched: AsFd {
    async fn ready_for(&self, interest: Interest) -> io::Result<()>;
    fn try_with<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}

impl Watched for TcpStream {
    async fn ready_for(&self, interest: Interest) -> io::Result<()> {
        self.ready(interest).await.map(drop)
    }
    fn try_with<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.try_io(interest, f)
    }
}

impl Watched for UnixStream {
    async fn ready_for(&self, interest: Interest) -> io::Result<()> {
        self.ready(interest).await.map(drop)
    }
    fn try_with<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.try_io(interest, f)
    }
}

/// Runs `op` on the socket once it is ready, again after each time it
/// would have blocked (tokio then waits for the next readiness).
async fn when_ready<S: Watched, R>(
    sock: &S,
    interest: Interest,
    mut op: impl FnMut(BorrowedFd<'_>) -> io::Result<R>,
) -> io::Result<R> {
    loop {
        sock.ready_for(interest).await?;
        match sock.try_with(interest, || op(sock.as_fd())) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// A connection's pipe for write data on its way from the socket to the
/// storage. It is empty between uses.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

/// The pipe size asked for: a MiB write crosses in one go.
const PIPE_SIZE: usize = 1 << 20;
/// Smaller pipes are not used.
const MIN_PIPE_SIZE: usize = 64 * 1024;

impl Pipe {
    pub fn new() -> io::Result<Pipe> {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        // Where the system allows less, the pipe keeps the size it has;
        // past the user's pipe allowance (pipe-user-pages-soft) that can
        // be a page or two, too little to be worth it.
        let capacity = rustix::pipe::fcntl_setpipe_size(&write, PIPE_SIZE)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))?;
        if capacity < MIN_PIPE_SIZE {
            return Err(io::Error::other(format!(
                "the system allows pipes of {capacity} bytes only"
            )));
        }
        Ok(Pipe {
            read,
            write,
            capacity,
        })
    }

    /// Bytes it holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The end the storage takes data from.
    pub fn output(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// Throws away what it holds (after the storage refused it).
    pub fn empty(&self) -> io::Result<()> {
        let mut scratch = vec![0u8; 64 * 1024];
        loop {
            match rustix::io::read(&self.read, &mut scratch) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(h) => Pin::new(h).poll_read(cx, buf),
            ReadHalf::Unix(h) => Pin::new(h).poll_read(cx, buf),
            ReadHalf::Tls(h) => Pin::new(h).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(h) => Pin::new(h).poll_write(cx, buf),
            WriteHalf::Unix(h) => Pin::new(h).poll_write(cx, buf),
            WriteHalf::Tls(h) => Pin::new(h).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(h) => Pin::new(h).poll_write_vectored(cx, bufs),
            WriteHalf::Unix(h) => Pin::new(h).poll_write_vectored(cx, bufs),
            WriteHalf::Tls(h) => Pin::new(h).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        !matches!(self, WriteHalf::Tls(..))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(h) => Pin::new(h).poll_flush(cx),
            WriteHalf::Unix(h) => Pin::new(h).poll_flush(cx),
            WriteHalf::Tls(h) => Pin::new(h).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(h) => Pin::new(h).poll_shutdown(cx),
            WriteHalf::Unix(h) => Pin::new(h).poll_shutdown(cx),
            WriteHalf::Tls(h) => Pin::new(h).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Storage;
    use rfabric::storage::{Engine, Kind};
    use test_support::{Scratch, pattern};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pair() -> (Stream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Stream::Unix(a), b)
    }

    #[tokio::test]
    async fn data_spliced_from_the_socket_lands_in_the_file_whole() {
        let t = Scratch::new("splice");
        let path = t.path("file");
        std::fs::write(&path, vec![0u8; 4 << 20]).unwrap();
        let engine = Engine::start(Kind::Threads, None).unwrap();
        let storage = Storage::open(&path, false, &engine).unwrap();
        let (server, mut client) = pair();
        let (inbound, _outbound) = server.split();
        let pipe = Pipe::new().unwrap();
        let data = pattern(3 << 20, 7);
        let sent = data.clone();
        let writer = tokio::spawn(async move { client.write_all(&sent).await.unwrap() });
        let mut done = 0;
        while done < data.len() {
            let want = (data.len() - done).min(pipe.capacity());
            let n = inbound.splice_into(&pipe, want).await.unwrap();
            assert!(n > 0 && n <= want);
            storage
                .write_from_pipe(pipe.output(), 4096 + done as u64, n)
                .unwrap();
            done += n;
        }
        writer.await.unwrap();
        let file = std::fs::read(&path).unwrap();
        assert_eq!(&file[4096..4096 + data.len()], &data[..]);
        assert!(file[..4096].iter().all(|&b| b == 0));
    }

    #[tokio::test]
    async fn a_closed_client_splices_nothing() {
        let (server, client) = pair();
        let (inbound, _outbound) = server.split();
        drop(client);
        let pipe = Pipe::new().unwrap();
        assert_eq!(inbound.splice_into(&pipe, 4096).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_file_range_is_sent_as_it_is_and_stops_at_the_end() {
        let t = Scratch::new("sendfile");
        let path = t.path("file");
        let data = pattern(2 << 20, 3);
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let (server, mut client) = pair();
        let (_inbound, outbound) = server.split();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        let n = outbound
            .send_file(file.as_fd(), 12345, 1 << 20)
            .await
            .unwrap();
        assert_eq!(n, 1 << 20);
        // Asked past the end: what there is.
        let n = outbound
            .send_file(file.as_fd(), (2 << 20) - 100, 4096)
            .await
            .unwrap();
        assert_eq!(n, 100);
        drop(outbound);
        let got = reader.await.unwrap();
        assert_eq!(&got[..1 << 20], &data[12345..12345 + (1 << 20)]);
        assert_eq!(&got[1 << 20..], &data[(2 << 20) - 100..]);
    }
}
