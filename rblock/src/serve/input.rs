//! What the request loop reads from, and reading a write's data out of it:
//! into memory, or into the buffers of the fabric link it leaves on.

use std::io::Cursor;

use anyhow::bail;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader, Chain};

use crate::backend::Backend;
use crate::fabric::client::Staged;
use crate::socket::ReadHalf;

/// What the reader reads: what the handshake read ahead, then the socket.
pub(super) type Input = BufReader<Chain<Cursor<Vec<u8>>, ReadHalf>>;

/// What `rd` holds unread, and the socket's half behind it.
pub(super) fn unread(rd: Input) -> (Vec<u8>, ReadHalf) {
    let buffered = rd.buffer().to_vec();
    let (ahead, half) = rd.into_inner().into_inner();
    (unread_bytes(buffered, &ahead), half)
}

/// The bytes a reader over `ahead` (what came before the socket), then
/// the socket, holds unread: its buffer's (`buffered`), then what is left
/// of `ahead`. (The loops on threads and on the runtime read alike.)
pub(super) fn unread_bytes(mut buffered: Vec<u8>, ahead: &Cursor<Vec<u8>>) -> Vec<u8> {
    let at = (ahead.position() as usize).min(ahead.get_ref().len());
    buffered.extend_from_slice(&ahead.get_ref()[at..]);
    buffered
}

/// A write's data, read into a buffer of its size (not zeroed first):
/// what the input buffer holds already, then the rest straight from the
/// socket, so that large writes are not copied twice.
pub(super) async fn read_payload<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    mut p: Vec<u8>,
    len: usize,
) -> anyhow::Result<Vec<u8>> {
    p.reserve_exact(len);
    let held = rd.buffer().len().min(len);
    p.extend_from_slice(&rd.buffer()[..held]);
    rd.consume(held);
    while p.len() < len {
        let want = (len - p.len()) as u64;
        // A short rest goes through the input buffer, which picks up the
        // next requests with it.
        let got = if want >= DIRECT_READ {
            rd.get_mut().take(want).read_buf(&mut p).await?
        } else {
            (&mut *rd).take(want).read_buf(&mut p).await?
        };
        if got == 0 {
            bail!("the client closed in the middle of a write");
        }
    }
    Ok(p)
}

/// A write's data as read from the client.
pub(super) enum Payload {
    Bytes(Vec<u8>),
    /// In the buffers of the fabric link it goes out on (`rblock
    /// connect`): not copied again on its way.
    Staged(Staged),
}

/// A write's `len` bytes of data: staged in the backend's own buffers
/// where it has them free, read into `spare` (a reused buffer) if not.
pub(super) async fn read_write_data<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    backend: &Backend,
    len: usize,
    spare: impl FnOnce() -> Vec<u8>,
) -> anyhow::Result<Payload> {
    let Some(mut staged) = backend.stage(len) else {
        return Ok(Payload::Bytes(read_payload(rd, spare(), len).await?));
    };
    for piece in staged.pieces_mut() {
        read_exactly(rd, piece).await?;
    }
    Ok(Payload::Staged(staged))
}

/// Fills `out` with the next bytes of write data: what the input buffer
/// holds first, a long rest straight from the socket.
async fn read_exactly<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    out: &mut [u8],
) -> anyhow::Result<()> {
    let held = rd.buffer().len().min(out.len());
    out[..held].copy_from_slice(&rd.buffer()[..held]);
    rd.consume(held);
    let rest = &mut out[held..];
    // (With a rest to read, the input buffer is empty now: reading past
    // it skips nothing.)
    let read = if rest.len() as u64 >= DIRECT_READ {
        rd.get_mut().read_exact(rest).await
    } else {
        rd.read_exact(rest).await
    };
    match read {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            bail!("the client closed in the middle of a write")
        }
        Err(e) => Err(e.into()),
    }
}

/// Rests of write data at least this long skip the input buffer.
pub(super) const DIRECT_READ: u64 = 64 * 1024;
