//! Digests: every chunk is hashed on both sides with the copy's algorithm
//! (BLAKE3 by default, SHA-256 on request or on a FIPS-mode host); a
//! file's digest is the same algorithm over its chunk digests in order,
//! chunk `k` being bytes `k*C .. min((k+1)*C, size)` for the copy's chunk
//! size `C`. A chunk that was never sent (a hole) counts as that many zero
//! bytes.

use sha2::{Digest, Sha256};

/// The hash a copy checks its data with (both sides use the client's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Algorithm {
    /// BLAKE3: several times SHA-256's speed per core.
    Blake3,
    /// SHA-256: FIPS-approved.
    Sha256,
}

/// What `--digest` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Choice {
    /// blake3, or sha256 on a FIPS-mode host.
    Auto,
    Blake3,
    Sha256,
}

/// A `--digest` that cannot be had here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this host runs in FIPS mode (/proc/sys/crypto/fips_enabled is 1): BLAKE3 is not an \
     approved algorithm here; use --digest sha256 (the default in FIPS mode)"
)]
pub struct FipsRefusesBlake3;

impl Choice {
    /// The algorithm this choice gives on a host in FIPS mode or not.
    pub fn resolve(self, fips: bool) -> Result<Algorithm, FipsRefusesBlake3> {
        match (self, fips) {
            (Choice::Auto, false) | (Choice::Blake3, false) => Ok(Algorithm::Blake3),
            (Choice::Auto, true) | (Choice::Sha256, _) => Ok(Algorithm::Sha256),
            (Choice::Blake3, true) => Err(FipsRefusesBlake3),
        }
    }
}

/// Whether the kernel runs in FIPS mode (then only approved algorithms).
pub fn fips_mode() -> bool {
    std::fs::read_to_string(fips_flag_file()).is_ok_and(|s| s.trim() == "1")
}

#[cfg(not(feature = "test-hooks"))]
fn fips_flag_file() -> std::path::PathBuf {
    "/proc/sys/crypto/fips_enabled".into()
}

/// Test hook: `RCP_TEST_FIPS_FILE` stands in for the kernel's flag file.
#[cfg(feature = "test-hooks")]
fn fips_flag_file() -> std::path::PathBuf {
    std::env::var_os("RCP_TEST_FIPS_FILE")
        .map_or_else(|| "/proc/sys/crypto/fips_enabled".into(), Into::into)
}

/// An incremental hash of either algorithm.
enum Hasher {
    Blake3(Box<blake3::Hasher>),
    Sha256(Sha256),
}

impl Hasher {
    fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Blake3(h) => {
                h.update(data);
            }
            Hasher::Sha256(h) => h.update(data),
        }
    }

    fn finalize(self) -> [u8; 32] {
        match self {
            Hasher::Blake3(h) => *h.finalize().as_bytes(),
            Hasher::Sha256(h) => h.finalize().into(),
        }
    }
}

impl Algorithm {
    /// The name users see (`--digest`, the summary, `--json`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Blake3 => "blake3",
            Algorithm::Sha256 => "sha256",
        }
    }

    /// The digest of one chunk.
    pub fn chunk(self, data: &[u8]) -> [u8; 32] {
        match self {
            Algorithm::Blake3 => *blake3::hash(data).as_bytes(),
            Algorithm::Sha256 => Sha256::digest(data).into(),
        }
    }

    fn hasher(self) -> Hasher {
        match self {
            Algorithm::Blake3 => Hasher::Blake3(Box::default()),
            Algorithm::Sha256 => Hasher::Sha256(Sha256::new()),
        }
    }

    /// The digest of a file from its chunk digests (`None`: a hole).
    pub fn file_digest(self, size: u64, chunk: u32, chunks: &[Option<[u8; 32]>]) -> [u8; 32] {
        let chunk = u64::from(chunk.max(1));
        let count = size.div_ceil(chunk);
        let mut h = self.hasher();
        let mut zero_cache: Option<(u64, [u8; 32])> = None;
        for k in 0..count {
            match chunks.get(k as usize).copied().flatten() {
                Some(d) => h.update(&d),
                None => {
                    let len = (size - k * chunk).min(chunk);
                    let d = match zero_cache {
                        Some((l, d)) if l == len => d,
                        _ => {
                            let d = self.zeros_digest(len);
                            zero_cache = Some((len, d));
                            d
                        }
                    };
                    h.update(&d);
                }
            }
        }
        h.finalize()
    }

    fn zeros_digest(self, len: u64) -> [u8; 32] {
        let block = [0u8; 64 * 1024];
        let mut h = self.hasher();
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            h.update(&block[..n]);
            left -= n as u64;
        }
        h.finalize()
    }
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

    fn b3(b: &[u8]) -> [u8; 32] {
        *blake3::hash(b).as_bytes()
    }

    #[test]
    fn holes_count_as_zeros_in_both_algorithms() {
        for (alg, h) in [
            (Algorithm::Sha256, sha as fn(&[u8]) -> [u8; 32]),
            (Algorithm::Blake3, b3),
        ] {
            let data = [b"abcd".as_slice(), &[0; 4], b"ef"].concat();
            let all: Vec<_> = data.chunks(4).map(|c| Some(alg.chunk(c))).collect();
            let holey = vec![all[0], None, all[2]];
            assert_eq!(alg.file_digest(10, 4, &all), alg.file_digest(10, 4, &holey));
            let expected = h(&[h(b"abcd"), h(&[0; 4]), h(b"ef")].concat());
            assert_eq!(alg.file_digest(10, 4, &all), expected, "{alg:?}");
            assert_eq!(alg.file_digest(0, 4, &[]), h(b""));
            assert_ne!(alg.file_digest(10, 4, &all), alg.file_digest(10, 5, &all));
        }
        let all: Vec<_> = [b"ab".as_slice()].iter().map(|c| Some(sha(c))).collect();
        assert_ne!(
            Algorithm::Sha256.file_digest(2, 4, &all),
            Algorithm::Blake3.file_digest(2, 4, &all),
            "the algorithms differ"
        );
    }

    #[test]
    fn fips_mode_chooses_sha256_and_refuses_blake3() {
        assert_eq!(Choice::Auto.resolve(false), Ok(Algorithm::Blake3));
        assert_eq!(Choice::Auto.resolve(true), Ok(Algorithm::Sha256));
        assert_eq!(Choice::Sha256.resolve(false), Ok(Algorithm::Sha256));
        assert_eq!(Choice::Blake3.resolve(true), Err(FipsRefusesBlake3));
    }

    #[test]
    fn hex_is_two_lower_case_digits_a_byte() {
        assert_eq!(hex(&[]), "");
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
