//! Challenge-response authentication with a shared secret that never
//! crosses the wire.
//!
//! The server sends a fresh random nonce; the client answers with its own
//! nonce and `HMAC-SHA256(secret, "rcp client" | server nonce | client
//! nonce)`; the server checks it in constant time and proves itself with
//! `HMAC-SHA256(secret, "rcp server" | client nonce | server nonce)`. Fresh
//! nonces on both sides make a recorded exchange useless for a replay, and
//! the labels keep the two directions from being mirrored.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Least secret length accepted: 16 bytes of key material.
pub const MIN_SECRET: usize = 16;

pub fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).expect("the OS random source works");
    n
}

fn mac(secret: &[u8], label: &[u8], first: &[u8; 32], second: &[u8; 32]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(label);
    m.update(first);
    m.update(second);
    m
}

pub fn client_proof(secret: &[u8], server_nonce: &[u8; 32], client_nonce: &[u8; 32]) -> [u8; 32] {
    mac(secret, b"rcp client", server_nonce, client_nonce)
        .finalize()
        .into_bytes()
        .into()
}

pub fn server_proof(secret: &[u8], server_nonce: &[u8; 32], client_nonce: &[u8; 32]) -> [u8; 32] {
    mac(secret, b"rcp server", client_nonce, server_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a client's proof.
pub fn check_client(
    secret: &[u8],
    server_nonce: &[u8; 32],
    client_nonce: &[u8; 32],
    proof: &[u8; 32],
) -> bool {
    mac(secret, b"rcp client", server_nonce, client_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// Constant-time check of the server's proof.
pub fn check_server(
    secret: &[u8],
    server_nonce: &[u8; 32],
    client_nonce: &[u8; 32],
    proof: &[u8; 32],
) -> bool {
    mac(secret, b"rcp server", client_nonce, server_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// Reads a secret file: its bytes with surrounding whitespace trimmed.
/// Refuses files that others can read, and secrets too short to be one.
pub fn read_secret(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("cannot read secret file {}: {e}", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        anyhow::bail!(
            "secret file {} is readable by others (mode {:o}); chmod 600 it",
            path.display(),
            meta.mode() & 0o777
        );
    }
    let raw = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read secret file {}: {e}", path.display()))?;
    let secret = raw.trim_ascii().to_vec();
    if secret.len() < MIN_SECRET {
        anyhow::bail!(
            "secret in {} is {} bytes; use at least {MIN_SECRET} (e.g. `head -c 32 /dev/urandom | base64`)",
            path.display(),
            secret.len()
        );
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_check_only_with_the_right_secret_and_nonces() {
        let (s, c) = (nonce(), nonce());
        assert_ne!(s, c);
        let proof = client_proof(b"secret-secret-secret", &s, &c);
        assert!(check_client(b"secret-secret-secret", &s, &c, &proof));
        assert!(!check_client(b"secret-secret-secreT", &s, &c, &proof));
        // Replayed against a fresh challenge: refused.
        assert!(!check_client(b"secret-secret-secret", &nonce(), &c, &proof));
        // A client proof is no server proof (no reflection).
        assert!(!check_server(b"secret-secret-secret", &s, &c, &proof));
        let sp = server_proof(b"secret-secret-secret", &s, &c);
        assert!(check_server(b"secret-secret-secret", &s, &c, &sp));
    }
}
