//! Digests: every chunk is hashed with SHA-256 on both sides; a file's
//! digest is the SHA-256 of its chunk digests in order, chunk `k` being
//! bytes `k*C .. min((k+1)*C, size)` for the copy's chunk size `C`. A chunk
//! that was never sent (a hole) counts as that many zero bytes.

use sha2::{Digest, Sha256};

/// The digest of a file from its chunk digests (`None`: a hole).
pub fn file_digest(size: u64, chunk: u32, chunks: &[Option<[u8; 32]>]) -> [u8; 32] {
    let chunk = u64::from(chunk.max(1));
    let count = size.div_ceil(chunk);
    let mut h = Sha256::new();
    let mut zero_cache: Option<(u64, [u8; 32])> = None;
    for k in 0..count {
        match chunks.get(k as usize).copied().flatten() {
            Some(d) => h.update(d),
            None => {
                let len = (size - k * chunk).min(chunk);
                let d = match zero_cache {
                    Some((l, d)) if l == len => d,
                    _ => {
                        let d = zeros_digest(len);
                        zero_cache = Some((len, d));
                        d
                    }
                };
                h.update(d);
            }
        }
    }
    h.finalize().into()
}

fn zeros_digest(len: u64) -> [u8; 32] {
    let block = [0u8; 64 * 1024];
    let mut h = Sha256::new();
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        h.update(&block[..n]);
        left -= n as u64;
    }
    h.finalize().into()
}

/// Lower-case hex, two digits a byte: digests as `sha256sum` prints them,
/// and the crate's one encoder for the other bytes shown as text (the
/// remote-shell token, temporary-name tags).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        write!(s, "{b:02x}").expect("writing to a String cannot fail");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(b: &[u8]) -> [u8; 32] {
        Sha256::digest(b).into()
    }

    #[test]
    fn holes_count_as_zeros() {
        let data = [b"abcd".as_slice(), &[0; 4], b"ef"].concat();
        let all: Vec<_> = data.chunks(4).map(|c| Some(sha(c))).collect();
        let holey = vec![all[0], None, all[2]];
        assert_eq!(file_digest(10, 4, &all), file_digest(10, 4, &holey));
        let expected = sha(&[sha(b"abcd"), sha(&[0; 4]), sha(b"ef")].concat());
        assert_eq!(file_digest(10, 4, &all), expected);
        assert_eq!(file_digest(0, 4, &[]), sha(b""));
        assert_ne!(file_digest(10, 4, &all), file_digest(10, 5, &all));
    }

    #[test]
    fn hex_is_two_lower_case_digits_a_byte() {
        assert_eq!(hex(&[]), "");
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
