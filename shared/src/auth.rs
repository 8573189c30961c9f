//! Challenge-response authentication with a shared secret that never
//! crosses the wire, for both tools' sessions (rcp's daemon and
//! remote-shell sessions, rblock's fabric), sans I/O.
//!
//! The server sends a fresh random nonce; the client answers with its own
//! nonce and `HMAC-SHA256(secret, LABEL client | server nonce | client
//! nonce)`; the server checks it in constant time and proves itself with
//! `HMAC-SHA256(secret, LABEL server | client nonce | server nonce)`.
//! - Fresh nonces on both sides make a recorded exchange useless for a
//!   replay.
//! - The labels keep the two directions from being mirrored, and each
//!   tool has its own ([`Domain`]), so a proof made for rcp never passes
//!   for rblock even where both use one secret.
#![forbid(unsafe_code)]

use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Least secret length accepted: 16 bytes of key material.
pub const MIN_SECRET: usize = 16;

/// Whose sessions a proof is for: the labels of its two directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Domain {
    client: &'static [u8],
    server: &'static [u8],
}

/// rcp's sessions (the labels rcp has always used).
pub const RCP: Domain = Domain {
    client: b"rcp client",
    server: b"rcp server",
};

/// rblock's fabric sessions (`rblock connect` to `rblock serve --listen`).
pub const RBLOCK: Domain = Domain {
    client: b"rblock client",
    server: b"rblock server",
};

/// A fresh random nonce (also what rcp's one-time tokens and session ids
/// are made of).
pub fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).expect("the OS random source works");
    n
}

/// `HMAC-SHA256(key, parts...)`, not yet finished.
fn hmac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m
}

impl Domain {
    pub fn client_proof(
        &self,
        secret: &[u8],
        server_nonce: &[u8; 32],
        client_nonce: &[u8; 32],
    ) -> [u8; 32] {
        tag(secret, &[self.client, server_nonce, client_nonce])
    }

    pub fn server_proof(
        &self,
        secret: &[u8],
        server_nonce: &[u8; 32],
        client_nonce: &[u8; 32],
    ) -> [u8; 32] {
        tag(secret, &[self.server, client_nonce, server_nonce])
    }

    /// Constant-time check of a client's proof.
    pub fn check_client(
        &self,
        secret: &[u8],
        server_nonce: &[u8; 32],
        client_nonce: &[u8; 32],
        proof: &[u8; 32],
    ) -> bool {
        check_tag(secret, &[self.client, server_nonce, client_nonce], proof)
    }

    /// Constant-time check of the server's proof.
    pub fn check_server(
        &self,
        secret: &[u8],
        server_nonce: &[u8; 32],
        client_nonce: &[u8; 32],
        proof: &[u8; 32],
    ) -> bool {
        check_tag(secret, &[self.server, client_nonce, server_nonce], proof)
    }

    /// `HMAC-SHA256(secret, LABEL client|server " key" | server nonce |
    /// client nonce)` for each direction.
    pub fn session_keys(
        &self,
        secret: &[u8],
        server_nonce: &[u8; 32],
        client_nonce: &[u8; 32],
    ) -> SessionKeys {
        let key = |label: &[u8]| tag(secret, &[label, b" key", server_nonce, client_nonce]);
        SessionKeys {
            client_to_server: key(self.client),
            server_to_client: key(self.server),
        }
    }
}

/// The keys of one authenticated session, one per direction, derived
/// from the secret and both nonces: known to the two ends and to nobody
/// who only saw the exchange.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SessionKeys {
    pub client_to_server: [u8; 32],
    pub server_to_client: [u8; 32],
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

/// `HMAC-SHA256(key, parts...)`: a proof, a session key, or the tag that
/// binds data to a session.
pub fn tag(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    hmac(key, parts).finalize().into_bytes().into()
}

/// Constant-time check of a [`tag`].
pub fn check_tag(key: &[u8], parts: &[&[u8]], tag: &[u8; 32]) -> bool {
    hmac(key, parts).verify_slice(tag).is_ok()
}

/// Constant-time check of the first `tag.len()` bytes of a [`tag`] (a
/// sealed link's 16-byte tags).
pub fn check_tag_prefix(key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    hmac(key, parts).verify_truncated_left(tag).is_ok()
}

/// A secret file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read secret file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("secret file {path} is readable by others (mode {mode:o}); chmod 600 it")]
    Exposed { path: String, mode: u32 },
    #[error(
        "secret in {path} is {len} bytes; use at least {MIN_SECRET} \
         (e.g. `head -c 32 /dev/urandom | base64`)"
    )]
    Short { path: String, len: usize },
}

/// Reads a secret file: its bytes with surrounding whitespace trimmed.
/// Refuses files that others can read, and secrets too short to be one.
pub fn read_secret(path: &Path) -> Result<Vec<u8>, SecretError> {
    use std::os::unix::fs::MetadataExt;
    let shown = || path.display().to_string();
    let read = |source| SecretError::Read {
        path: shown(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    if meta.mode() & 0o077 != 0 {
        return Err(SecretError::Exposed {
            path: shown(),
            mode: meta.mode() & 0o777,
        });
    }
    let raw = std::fs::read(path).map_err(read)?;
    let secret = raw.trim_ascii().to_vec();
    if secret.len() < MIN_SECRET {
        return Err(SecretError::Short {
            path: shown(),
            len: secret.len(),
        });
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &[u8] = b"secret-secret-secret";

    #[test]
    fn proofs_check_only_with_the_right_secret_and_nonces() {
        let (s, c) = (nonce(), nonce());
        assert_ne!(s, c);
        let proof = RCP.client_proof(S, &s, &c);
        assert!(RCP.check_client(S, &s, &c, &proof));
        assert!(!RCP.check_client(b"secret-secret-secreT", &s, &c, &proof));
        // Replayed against a fresh challenge: refused.
        assert!(!RCP.check_client(S, &nonce(), &c, &proof));
        // A client proof is no server proof (no reflection).
        assert!(!RCP.check_server(S, &s, &c, &proof));
        let sp = RCP.server_proof(S, &s, &c);
        assert!(RCP.check_server(S, &s, &c, &sp));
    }

    #[test]
    fn a_proof_for_one_tool_is_none_for_the_other() {
        let (s, c) = (nonce(), nonce());
        let proof = RCP.client_proof(S, &s, &c);
        assert!(!RBLOCK.check_client(S, &s, &c, &proof));
        let proof = RBLOCK.server_proof(S, &s, &c);
        assert!(!RCP.check_server(S, &s, &c, &proof));
        assert!(RBLOCK.check_server(S, &s, &c, &proof));
    }

    #[test]
    fn session_keys_differ_by_direction_session_and_tool() {
        let (s, c) = (nonce(), nonce());
        let k = RCP.session_keys(S, &s, &c);
        assert_ne!(k.client_to_server, k.server_to_client);
        assert_eq!(k, RCP.session_keys(S, &s, &c), "both ends derive the same");
        assert_ne!(
            k,
            RCP.session_keys(S, &nonce(), &c),
            "a fresh session, fresh keys"
        );
        assert_ne!(k, RBLOCK.session_keys(S, &s, &c));
        assert_ne!(k, RCP.session_keys(b"another-secret-here", &s, &c));
        let t = tag(&k.client_to_server, &[b"a", b"b"]);
        assert!(check_tag(&k.client_to_server, &[b"a", b"b"], &t));
        assert!(!check_tag(&k.client_to_server, &[b"a", b"c"], &t));
        assert!(!check_tag(&k.server_to_client, &[b"a", b"b"], &t));
    }

    #[test]
    fn rcp_proofs_are_what_they_always_were() {
        // HMAC-SHA256(secret, "rcp client" | server nonce | client nonce),
        // computed independently of `mac`.
        let (s, c) = ([1u8; 32], [2u8; 32]);
        let mut m = HmacSha256::new_from_slice(S).unwrap();
        m.update(b"rcp client");
        m.update(&s);
        m.update(&c);
        let want: [u8; 32] = m.finalize().into_bytes().into();
        assert_eq!(RCP.client_proof(S, &s, &c), want);
    }

    #[test]
    fn secret_files_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rfabric-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("s");
        std::fs::write(&f, b"  0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret(&f).unwrap(), b"0123456789abcdef");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            read_secret(&f),
            Err(SecretError::Exposed { mode: 0o640, .. })
        ));
        std::fs::write(&f, b"short").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            read_secret(&f),
            Err(SecretError::Short { len: 5, .. })
        ));
        assert!(matches!(
            read_secret(&dir.join("none")),
            Err(SecretError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
