//! What the request loop reads from, and reading a write's data out of it.

use std::io::Cursor;

use anyhow::bail;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader, Chain};

use crate::socket::ReadHalf;

/// What the reader reads: what the handshake read ahead, then the socket.
pub(super) type Input = BufReader<Chain<Cursor<Vec<u8>>, ReadHalf>>;

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

/// Rests of write data at least this long skip the input buffer.
pub(super) const DIRECT_READ: u64 = 64 * 1024;
